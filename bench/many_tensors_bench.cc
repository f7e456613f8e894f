// Per-tensor costs of a version (docs/benchmarks.md, "Many tensors"): one
// publisher and one in-memory receiver sync the same bytes held as N small
// tensors and as 100 large ones, in the same run (version 2 of 2, the
// steady state); reports time per tensor, the stored objects (chunk packs,
// PublisherOptions::pack_bytes) and the bytes that are not entropy-coded
// payload (chunk framing, announcement, manifest, decision) per tensor.
//   build/release/bench/refit_many_tensors_bench --tensors 100000 --size-mib 64
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_model.h"
#include "format/safetensors.h"
#include "refit/status.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "transport/object_store.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

using bench::Model;
using bench::SplitMix;

// `count` tensors splitting `bytes` (even element counts), names as a
// checkpoint spells them.
Model Generate(uint64_t bytes, uint64_t count) {
  Model m;
  SplitMix rng{7};
  const uint64_t elements = bytes / 2;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t n = elements / count + (i < elements % count ? 1 : 0);
    m.names.push_back(fmt::format("model.layers.{}.mlp.experts.{}.down_proj.weight",
                                  i / 1000, i % 1000));
    std::vector<uint8_t> d(n * 2);
    for (uint64_t j = 0; j < d.size(); j += 8) {
      const uint64_t x = rng.Next();
      std::memcpy(d.data() + j, &x, std::min<size_t>(8, d.size() - j));
    }
    m.data.push_back(std::move(d));
  }
  return m;
}

// Flips the low 1-3 bits of about `rate` of the elements.
void Evolve(Model* m, double rate, uint64_t seed) {
  SplitMix rng{seed};
  const uint64_t threshold = static_cast<uint64_t>(rate * 18446744073709551615.0);
  for (auto& d : m->data) {
    for (size_t i = 0; i < d.size(); i += 2) {
      if (rng.Next() < threshold) d[i] ^= static_cast<uint8_t>((2u << (rng.Next() % 3)) - 1);
    }
  }
}

struct Row {
  uint64_t tensors = 0;
  uint64_t pack_bytes = 0;
  double open_s = 0, publish_s = 0, receive_s = 0;
  uint64_t payload = 0, uploaded = 0, chunks = 0, objects = 0;
};

// Stored objects under `dir` (the directory store's files).
uint64_t CountFiles(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file()) ++n;
  }
  return n;
}

// Publishes versions 1 and 2 (each changing `rate` of the elements) to
// one receiver; reports version 2, whose publisher and receiver check it
// against version 1's manifest (the steady state).
Result<Row> Measure(const std::string& dir, uint64_t bytes, uint64_t count, double rate,
                    uint64_t pack_bytes) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir + "/member");
  Model trainer = Generate(bytes, count);
  {
    std::vector<SafetensorsTensorView> views;
    for (size_t i = 0; i < trainer.names.size(); ++i) {
      views.push_back({trainer.names[i], "BF16", {trainer.data[i].size() / 2}, trainer.data[i]});
    }
    REFIT_RETURN_IF_ERROR(WriteSafetensors(dir + "/baseline.safetensors", {}, views));
  }
  Model member = trainer;
  REFIT_ASSIGN_OR_RETURN(auto store, OpenObjectStore(dir + "/store"));
  Row row;
  row.tensors = count;
  row.pack_bytes = pack_bytes;
  auto t0 = Clock::now();
  PublisherOptions po;
  po.members = {"member"};
  po.poll_ms = 2;
  po.pack_bytes = pack_bytes;
  REFIT_ASSIGN_OR_RETURN(auto pub, Publisher::Open(store.get(), dir + "/baseline.safetensors", po));
  ReceiverOptions ro;
  ro.member = "member";
  ro.state_dir = dir + "/member";
  for (size_t i = 0; i < member.names.size(); ++i) {
    ro.tensors.push_back({member.names[i], "BF16", 2, {member.data[i].size() / 2},
                          member.data[i].data()});
  }
  REFIT_ASSIGN_OR_RETURN(auto rcv, Receiver::Open(store.get(), ro));
  row.open_s = Since(t0);
  for (uint64_t version = 1; version <= 2; ++version) {
    Evolve(&trainer, rate, 10 + version);
    const uint64_t objects_before = CountFiles(dir + "/store");
    Status follow;
    Clock::time_point done;
    auto t1 = Clock::now();
    std::thread t([&] {
      follow = rcv->SyncTo(version, 600000).status();
      done = Clock::now();
    });
    auto report = pub->Publish(version, trainer.Views());
    t.join();
    REFIT_RETURN_IF_ERROR(report.status());
    REFIT_RETURN_IF_ERROR(follow);
    if (!report->committed) return InternalError("not committed: " + report->reason);
    row.publish_s = report->seconds;
    row.receive_s = std::chrono::duration<double>(done - t1).count();
    row.payload = report->diff.payload_bytes;
    row.uploaded = report->bytes_uploaded;
    row.chunks = report->diff.chunks;
    row.objects = CountFiles(dir + "/store") - objects_before;
    for (size_t i = 0; i < member.data.size(); ++i) {
      if (member.data[i] != trainer.data[i]) return InternalError("receiver differs");
    }
  }
  std::filesystem::remove_all(dir, ec);
  return row;
}

int Main(int argc, char** argv) {
  uint64_t tensors = 100000, size_mib = 64, pack_bytes = 1 << 20;
  double rate = 0.03;
  bool unpacked = false;
  std::string dir = "/tmp/refit-many-tensors";
  CLI::App app{"per-tensor costs: N small tensors against 100 large ones, same bytes"};
  app.add_option("--tensors", tensors, "small tensors")->capture_default_str();
  app.add_option("--size-mib", size_mib, "total BF16 bytes")->capture_default_str();
  app.add_option("--rate", rate, "fraction of elements changed")->capture_default_str();
  app.add_option("--pack-bytes", pack_bytes,
                 "PublisherOptions::pack_bytes (0: one object per chunk)")
      ->capture_default_str();
  app.add_flag("--unpacked", unpacked,
               "also run the small tensors with one object per chunk (slow: two fsyncs each)");
  app.add_option("--dir", dir, "scratch directory (emptied)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  fmt::print("{} MiB BF16, rate {}: {} tensors against 100, one publisher, one in-memory "
             "receiver, directory store; version 2 of 2\n",
             size_mib, rate, tensors);
  fmt::print("| tensors | bytes/tensor | pack bytes | open s | publish s | receive s | chunks | "
             "objects | payload | uploaded | non-payload bytes/tensor | publish us/tensor |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::pair<uint64_t, uint64_t>> runs = {{100, pack_bytes}};
  if (unpacked && pack_bytes != 0) runs.push_back({tensors, 0});
  runs.push_back({tensors, pack_bytes});
  for (auto [count, pack] : runs) {
    auto r = Measure(dir, size_mib << 20, count, rate, pack);
    if (!r.ok()) {
      fmt::print(stderr, "error: {}\n", r.status().ToString());
      return 1;
    }
    const double n = static_cast<double>(count);
    fmt::print("| {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {} | {} | {} | {} | {:.1f} | {:.1f} |\n",
               count, (size_mib << 20) / count, pack, r->open_s, r->publish_s, r->receive_s,
               r->chunks, r->objects, r->payload, r->uploaded,
               static_cast<double>(r->uploaded - r->payload) / n, r->publish_s / n * 1e6);
  }
  return 0;
}

}  // namespace
}  // namespace refit

int main(int argc, char** argv) { return refit::Main(argc, argv); }
