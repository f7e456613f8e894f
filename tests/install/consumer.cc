// Uses the installed public headers only: a directory store, an
// authenticated envelope, a trainer layout, one version published by a
// SyncPublisher and received by a SyncReceiver over the store, and a
// trainer rank's encoder and publisher with a direct coordinator.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "refit/auth.h"
#include "refit/layout.h"
#include "refit/publisher.h"
#include "refit/receiver.h"
#include "refit/store.h"
#include "refit/trainer.h"

namespace {

int Fail(const std::string& what, const refit::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

// A one-tensor safetensors file: "w", F32, the given values, of shape
// `shape` (empty: one dimension).
bool WriteCheckpoint(const std::string& path, const std::vector<float>& w,
                     std::vector<uint64_t> shape = {}) {
  if (shape.empty()) shape = {w.size()};
  std::string dims;
  for (uint64_t d : shape) {
    if (!dims.empty()) dims += ',';
    dims += std::to_string(d);
  }
  const uint64_t bytes = w.size() * sizeof(float);
  const std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[" + dims +
                             "],\"data_offsets\":[0," + std::to_string(bytes) +
                             "]}}";
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) {
    length[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  }
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(length), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(w.data()),
            static_cast<std::streamsize>(bytes));
  return static_cast<bool>(out);
}

// Two data-parallel ranks that both hold all of "w": ownership splits it
// between them, and the split covers every element once.
int CheckLayout() {
  const std::string json = R"({"format": "refit-layout", "version": 1,
    "canonical": [{"name": "w", "dtype": "F32", "shape": [64, 256]}],
    "ranks": [
      {"rank": 0, "tensors": [{"name": "w", "dtype": "F32", "shape": [64, 256],
        "pieces": [{"canonical": "w", "rows": 64, "cols": 256,
                    "local": [0, 256, 1], "canon": [0, 256, 1]}]}]},
      {"rank": 1, "tensors": [{"name": "w", "dtype": "F32", "shape": [64, 256],
        "pieces": [{"canonical": "w", "rows": 64, "cols": 256,
                    "local": [0, 256, 1], "canon": [0, 256, 1]}]}]}]})";
  auto layout = refit::layout::ParseLayout(json);
  if (!layout.ok()) return Fail("parse layout", layout.status());
  refit::layout::OwnershipOptions options;
  options.min_split_bytes = 4096;
  auto owned = refit::layout::AssignOwnership(*layout, options);
  if (!owned.ok()) return Fail("ownership", owned.status());
  if (owned->size() != 2 || (*owned)[0].empty() || (*owned)[1].empty()) {
    std::fprintf(stderr, "ownership: both replicas should own a part\n");
    return 1;
  }
  refit::Status covered = refit::layout::CheckCoverage(*layout, *owned);
  if (!covered.ok()) return Fail("coverage", covered);
  // One rank that maps only half of "w" leaves a gap: refused.
  layout->ranks.pop_back();
  layout->ranks[0].tensors[0].pieces[0].rows = 32;
  if (refit::layout::ValidateLayout(*layout).code() !=
      refit::StatusCode::kInvalidArgument) {
    std::fprintf(stderr, "a layout with a gap was accepted\n");
    return 1;
  }
  return 0;
}

// One trainer rank that holds all of "w" (F32 [4, 256]): its encoder emits
// a chunk for a changed element, and the version it publishes through
// `store` is decided by a direct coordinator (no receiver votes: the
// deadline passes and the version aborts, keeping the rank's baseline).
int CheckTrainer(const std::string& dir) {
  auto opened = refit::OpenObjectStore(dir + "/ranks");
  if (!opened.ok()) return Fail("open store", opened.status());
  refit::ObjectStore* store = opened->get();
  const std::string json = R"({"format": "refit-layout", "version": 1,
    "canonical": [{"name": "w", "dtype": "F32", "shape": [4, 256]}],
    "ranks": [{"rank": 0, "tensors": [{"name": "w", "dtype": "F32", "shape": [4, 256],
      "pieces": [{"canonical": "w", "rows": 4, "cols": 256,
                  "local": [0, 256, 1], "canon": [0, 256, 1]}]}]}]})";
  auto layout = refit::layout::ParseLayout(json);
  if (!layout.ok()) return Fail("parse layout", layout.status());
  auto encoder = refit::RankEncoder::Create(*layout, 0);
  if (!encoder.ok()) return Fail("rank encoder", encoder.status());
  std::vector<float> w(1024, 1.0f);
  const std::string initial = dir + "/initial.safetensors";
  if (!WriteCheckpoint(initial, w, {4, 256})) {
    std::fprintf(stderr, "cannot write %s\n", initial.c_str());
    return 1;
  }
  const refit::TensorView local{"w", "F32", 4, {4, 256},
                                reinterpret_cast<const uint8_t*>(w.data())};
  if (auto st = (*encoder)->SetBaselineFromLocal({local}); !st.ok()) {
    return Fail("baseline", st);
  }
  w[300] = 2.0f;
  uint64_t changed = 0;
  auto encoded = (*encoder)->Encode(1, 0, {local}, [&](const refit::RankChunk& c) {
    changed += c.changed;
    return refit::Status();
  });
  if (!encoded.ok()) return Fail("encode", encoded.status());
  if (changed != 1 || encoded->chunks == 0) {
    std::fprintf(stderr, "encode: %llu changed elements in the chunks, want 1\n",
                 static_cast<unsigned long long>(changed));
    return 1;
  }
  (*encoder)->Abort();

  auto rank = refit::RankPublisher::Open(store, nullptr, encoder->get(), std::nullopt);
  if (!rank.ok()) return Fail("rank publisher", rank.status());
  auto part = (*rank)->Publish(1, {local});
  if (!part.ok()) return Fail("publish part", part.status());
  refit::DirectCoordinatorOptions options;
  options.ranks = {0};
  options.members = {"absent"};
  options.vote_timeout_ms = 200;
  options.initial_checkpoint = initial;
  auto coordinator = refit::DirectCoordinator::Open(store, std::move(options));
  if (!coordinator.ok()) return Fail("coordinator", coordinator.status());
  auto decided = (*coordinator)->Publish(1);
  if (!decided.ok()) return Fail("coordinate", decided.status());
  auto committed = (*rank)->AwaitDecision(30000);
  if (!committed.ok()) return Fail("await decision", committed.status());
  if (decided->committed || *committed || (*rank)->committed_version() != 0) {
    std::fprintf(stderr, "a version without votes was committed\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  auto store = refit::OpenObjectStore(dir + "/store");
  if (!store.ok()) return Fail("open store", store.status());
  const std::vector<uint8_t> hello = {'h', 'i'};
  if (!(*store)->Put("hello", hello).ok() || *(*store)->Get("hello") != hello) {
    std::fprintf(stderr, "store round trip failed\n");
    return 1;
  }
  refit::Authenticator auth = refit::Authenticator::None();
  const std::vector<uint8_t> sealed = auth.Seal(hello);
  auto opened = auth.Open(sealed);
  if (!opened.ok() ||
      std::vector<uint8_t>(opened->begin(), opened->end()) != hello) {
    std::fprintf(stderr, "envelope round trip failed\n");
    return 1;
  }
  if (int rc = CheckLayout(); rc != 0) return rc;
  if (int rc = CheckTrainer(dir); rc != 0) return rc;

  // Version 0 is the baseline file; version 1 changes three of its weights.
  std::vector<float> v0(1024);
  for (size_t i = 0; i < v0.size(); ++i) v0[i] = static_cast<float>(i) * 0.5f;
  std::vector<float> v1 = v0;
  v1[3] = -1.0f;
  v1[500] = 7.25f;
  v1[1023] = 0.0f;
  const std::string baseline = dir + "/baseline.safetensors";
  if (!WriteCheckpoint(baseline, v0)) {
    std::fprintf(stderr, "cannot write %s\n", baseline.c_str());
    return 1;
  }
  refit::SyncPublisherOptions publisher_options;
  publisher_options.members = {"consumer"};
  publisher_options.auth = auth;
  publisher_options.vote_timeout_ms = 30000;
  auto publisher = refit::SyncPublisher::Open(store->get(), baseline,
                                              std::move(publisher_options));
  if (!publisher.ok()) return Fail("open publisher", publisher.status());

  // The receiver keeps its own copy of the weights, in memory.
  std::vector<float> weights = v0;
  refit::SyncReceiverOptions options;
  options.member = "consumer";
  options.auth = auth;
  options.tensors.push_back({"w", "F32", 4, {weights.size()},
                             reinterpret_cast<uint8_t*>(weights.data())});
  options.state_dir = dir + "/state";
  std::filesystem::create_directories(options.state_dir);
  auto receiver = refit::SyncReceiver::Open(store->get(), std::move(options));
  if (!receiver.ok()) return Fail("open receiver", receiver.status());
  auto step = (*receiver)->Step();
  if (!step.ok() || step->outcome != refit::SyncStep::Outcome::kIdle) {
    std::fprintf(stderr, "first step: %s\n",
                 step.ok() ? refit::SyncOutcomeName(step->outcome).c_str()
                           : step.status().ToString().c_str());
    return 1;
  }

  // Publish waits for the receiver's vote: it runs beside the receiver.
  refit::Result<refit::SyncPublishReport> report =
      refit::Status(refit::StatusCode::kUnknown, "not run");
  std::thread trainer([&] {
    const refit::TensorView target{
        "w", "F32", 4, {v1.size()}, reinterpret_cast<const uint8_t*>(v1.data())};
    report = (*publisher)->Publish(1, {target});
  });
  auto synced = (*receiver)->SyncTo(1, 30000);
  trainer.join();
  if (!report.ok()) return Fail("publish", report.status());
  if (!synced.ok()) return Fail("receive", synced.status());
  if (!report->committed || report->version != 1 ||
      (*publisher)->committed_version() != 1) {
    std::fprintf(stderr, "version 1 not committed: %s\n",
                 report->reason.c_str());
    return 1;
  }
  if (synced->outcome != refit::SyncStep::Outcome::kCommitted ||
      (*receiver)->active_version() != 1 ||
      synced->changed_tensors != std::vector<std::string>{"w"}) {
    std::fprintf(stderr, "receiver: %s at version %llu\n",
                 refit::SyncOutcomeName(synced->outcome).c_str(),
                 static_cast<unsigned long long>((*receiver)->active_version()));
    return 1;
  }
  if (std::memcmp(weights.data(), v1.data(), v1.size() * sizeof(float)) != 0) {
    std::fprintf(stderr, "the received weights differ from version 1\n");
    return 1;
  }
  std::printf("consumer: ok, version %llu published (%llu changed elements) "
              "and received\n",
              static_cast<unsigned long long>((*receiver)->active_version()),
              static_cast<unsigned long long>(report->diff.changed_elements));
  return 0;
}
