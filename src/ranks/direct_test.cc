// Versions published by several trainer ranks reach receivers directly
// (docs/protocol.md, "Versions from many ranks"): the ranks of random
// layouts (tensor-parallel row and column splits, so strided regions;
// uneven splits; pipeline and data parallel) upload their parts to the
// protocol store, a DirectCoordinator that holds no tensor decides, and
// two checkpoint receivers and two in-memory receivers apply the ranks'
// chunks as the manifest lists them. Versions include a missing rank, a
// tampered chunk (aborted by the members' failed votes) and commits; every
// receiver ends bit-exact with the canonical target assembled the slow way.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "delta/chunk.h"
#include "format/safetensors.h"
#include "layout/generate.h"
#include "ranks/parts.h"
#include "support/status_matchers.h"
#include "support/test_layout.h"
#include "support/testing.h"
#include "sync/chunk_pack.h"
#include "sync/follow.h"
#include "sync/keys.h"
#include "sync/host_staged_target.h"
#include "sync/receiver.h"

namespace refit::ranks {
namespace {

using ::refit::testing::StatusIs;
using layout::Layout;
using layout::testing::TensorBytes;
using testing::TempDir;

Authenticator Key() {
  auto a = Authenticator::Hmac(std::vector<uint8_t>(32, 5));
  EXPECT_TRUE(a.ok());
  return *a;
}

Layout RandomLayout(std::mt19937_64& rng) {
  layout::ModelConfig c;
  c.model_type = "qwen2";
  c.num_attention_heads = 4 + 2 * static_cast<int>(rng() % 3);
  c.num_key_value_heads = c.num_attention_heads / 2;
  c.head_dim = 8;
  c.hidden_size = c.num_attention_heads * c.head_dim;
  c.intermediate_size = 40 + 8 * static_cast<int>(rng() % 4);
  c.num_hidden_layers = 2 + static_cast<int>(rng() % 2);
  c.vocab_size = 97 + static_cast<int>(rng() % 40);
  c.attention_bias = true;
  layout::Parallelism p;
  p.tp = 2 + static_cast<uint32_t>(rng() % 2);  // 2 or 3 (uneven)
  p.pp = 1 + static_cast<uint32_t>(rng() % 2);
  p.dp = 1 + static_cast<uint32_t>(rng() % 2);
  p.fused_qkv = rng() % 2 == 0;
  p.gate_up = rng() % 2 == 0 ? layout::GateUp::kConcat : layout::GateUp::kInterleaved;
  p.gate_up_group = 4;
  p.transposed = rng() % 3 == 0;
  auto l = layout::GenerateLayout(c, p);
  EXPECT_OK(l);
  return *l;
}

std::vector<TensorView> LocalViews(const Layout& l, size_t ri, const TensorBytes& b) {
  std::vector<TensorView> v;
  for (const auto& t : l.ranks[ri].tensors) {
    v.push_back({t.name, t.dtype, 2, t.shape, b.at(t.name).data()});
  }
  return v;
}

// Parameter: the layout's seed (0..2), and packs on from 3 (the same
// seeds with the ranks' chunks stored in chunk packs).
class DirectTest : public ::testing::TestWithParam<int> {
 protected:
  static uint64_t Seed() { return static_cast<uint64_t>(GetParam() % 3); }
  static bool Packs() { return GetParam() >= 3; }

  void SetUp() override {
    std::mt19937_64 rng(Seed() * 104729 + 3);
    layout_ = RandomLayout(rng);
    for (const auto& c : layout_.canonical) {
      uint64_t n = 1;
      for (uint64_t d : c.shape) n *= d;
      std::vector<uint8_t> b(n * 2);
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      canon_[c.name] = std::move(b);
    }
    std::vector<SafetensorsTensorView> views;
    for (const auto& c : layout_.canonical) {
      views.push_back({c.name, c.dtype, c.shape, canon_.at(c.name)});
    }
    for (int i = 0; i < 2; ++i) {
      std::filesystem::create_directories(dir_.File("c" + std::to_string(i)));
      ASSERT_OK(WriteSafetensors(dir_.File("c" + std::to_string(i) + "/model.safetensors"), {},
                                 views));
      memory_.push_back(canon_);
    }
    auto s = OpenObjectStore(dir_.File("store"));
    ASSERT_OK(s);
    store_ = std::move(*s);
    auto ck = Checkpoint::Open(dir_.File("c0/model.safetensors"), Checkpoint::Mode::kReadOnly);
    ASSERT_OK(ck);
    initial_ = TensorTableOf(*ck);
    auto local = layout::testing::ScatterToRanks(layout_, canon_);
    ASSERT_OK(local);
    local_ = *local;
    for (size_t ri = 0; ri < layout_.ranks.size(); ++ri) {
      trainer::RankEncoderOptions eo;
      eo.chunk_bytes = 256;  // several chunks per region, rows cut
      auto e = trainer::RankEncoder::Create(layout_, layout_.ranks[ri].rank, eo);
      ASSERT_OK(e);
      ASSERT_OK((*e)->SetBaselineFromLocal(LocalViews(layout_, ri, local_[ri])));
      RankPublisherOptions ro;
      ro.auth = Key();
      ro.poll_ms = 2;
      // ~6 chunks of 256 elements' bytes to a pack.
      if (Packs()) ro.pack_bytes = 2048;
      // The direct path: parts go to the protocol store itself.
      auto rp = RankPublisher::Open(store_.get(), store_.get(), e->get(),
                                    layout_.ranks[ri].rank, 0, ro);
      ASSERT_OK(rp);
      encoders_.push_back(std::move(*e));
      ranks_.push_back(std::move(*rp));
    }
  }

  DirectCoordinatorOptions CoordinatorOptions(int parts_timeout_ms) {
    DirectCoordinatorOptions co;
    for (const auto& r : layout_.ranks) co.ranks.push_back(r.rank);
    co.members = {"c0", "c1", "m0", "m1"};
    co.auth = Key();
    co.poll_ms = 2;
    co.parts_timeout_ms = parts_timeout_ms;
    co.vote_timeout_ms = 30000;
    co.initial = initial_;
    return co;
  }

  ReceiverOptions MakeReceiver(int i) {
    ReceiverOptions o;
    o.member = (i < 2 ? "c" : "m") + std::to_string(i % 2);
    std::filesystem::create_directories(dir_.File("state-" + o.member));
    o.state_dir = dir_.File("state-" + o.member);
    if (i < 2) {
      o.checkpoint = dir_.File(o.member + "/model.safetensors");
    } else {
      for (const auto& c : layout_.canonical) {
        o.tensors.push_back({c.name, c.dtype, 2, c.shape, memory_[i - 2].at(c.name).data()});
      }
    }
    o.auth = Key();
    o.poll_ms = 2;
    o.decision_timeout_ms = 30000;
    o.threads = 2;
    return o;
  }

  // A two-phase receiver `name` of host tensors in *memory.
  ReceiverOptions StagedReceiver(const std::string& name, TensorBytes* memory) {
    ReceiverOptions o = MakeReceiver(2);
    o.member = name;
    std::filesystem::create_directories(dir_.File("state-" + name));
    o.state_dir = dir_.File("state-" + name);
    std::vector<MutableTensorView> views;
    for (const auto& c : layout_.canonical) {
      views.push_back({c.name, c.dtype, 2, c.shape, memory->at(c.name).data()});
    }
    o.tensors.clear();
    o.staged = std::make_shared<HostStagedTarget>(std::move(views), uint64_t{1} << 30);
    o.chunk_timeout_ms = 30000;
    return o;
  }

  // A thread on which `r` prepares (or steps) until it is not idle, its
  // last result in *step.
  static std::thread BusyUntilNotIdle(Receiver* r, bool prepare, Result<StepResult>* step) {
    return std::thread([r, prepare, step] {
      for (int i = 0; i < 20000; ++i) {
        *step = prepare ? r->Prepare() : r->Step();
        if (!step->ok() || (*step)->outcome != StepResult::Outcome::kIdle) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }

  // One training step: ~3% of the elements change, scattered to the ranks.
  void TrainStep(std::mt19937_64& rng) {
    std::uniform_real_distribution<double> u(0, 1);
    for (auto& [name, b] : canon_) {
      for (size_t i = 0; i < b.size(); i += 2) {
        if (u(rng) < 0.03) b[i] ^= static_cast<uint8_t>(1 + rng() % 3);
      }
    }
    auto local = layout::testing::ScatterToRanks(layout_, canon_);
    ASSERT_OK(local);
    local_ = *local;
  }

  void PublishRank(size_t ri, uint64_t version) {
    ASSERT_OK(ranks_[ri]->Publish(version, LocalViews(layout_, ri, local_[ri])));
  }

  // The header of a part chunk of version v that the manifest lists.
  void PartChunkHeader(const Manifest& m, const ManifestChunk& mc, ChunkHeader* h) {
    auto object = FindChunkObject(store_.get(), m.version, &mc - m.chunks.data(), &m);
    ASSERT_OK(object);
    auto body = Key().Open(*object);
    ASSERT_OK(body);
    auto c = ParseChunk(*body);
    ASSERT_OK(c);
    *h = c->header;
  }

  // The canonical elements of h's region (rows of a strided one) whose
  // bytes in `data` differ from `want`'s.
  static std::vector<uint64_t> ElementsOffTarget(const ChunkHeader& h, const uint8_t* data,
                                                 const std::vector<uint8_t>& want) {
    std::vector<uint64_t> d;
    for (uint64_t j = 0; j < h.count; ++j) {
      const uint64_t e =
          h.IsStrided() ? h.start + (j / h.run) * h.stride + j % h.run : h.start + j;
      if (std::memcmp(data + e * h.width, want.data() + e * h.width, h.width) != 0) {
        d.push_back(e);
      }
    }
    return d;
  }

  void AwaitRanks(bool committed, uint64_t version) {
    for (auto& r : ranks_) {
      auto d = r->AwaitDecision(30000);
      ASSERT_OK(d);
      EXPECT_EQ(*d, committed);
      EXPECT_EQ(r->committed_version(), version);
    }
  }

  // Damages a chunk object of version v's parts in the store after its rank
  // listed it (the coordinator never reads it): `victim`, or the last one
  // listed. Damaging one twice restores it.
  void DamageAPartChunk(uint64_t v, std::string victim = "") {
    auto listed = store_->List(PartsPrefix(v));
    ASSERT_OK(listed);
    std::string last;
    for (const auto& o : *listed) {
      if (o.key.find("/chunk/") != std::string::npos) last = o.key;
    }
    if (victim.empty()) victim = last;
    ASSERT_FALSE(victim.empty());
    auto bytes = store_->Get(victim);
    ASSERT_OK(bytes);
    (*bytes)[bytes->size() / 2] ^= 0x40;
    ASSERT_OK(store_->Put(victim, *bytes));
  }

  // Alters one chunk inside a pack of version v's parts and frames the
  // pack again, so that its own checksum holds and only the chunk's
  // checks (envelope, manifest SHA-256) can refuse it.
  void TamperAPackedChunk(uint64_t v) {
    auto listed = store_->List(PartsPrefix(v));
    ASSERT_OK(listed);
    for (const auto& o : *listed) {
      if (o.key.find("/chunk/") == std::string::npos) continue;
      auto bytes = store_->Get(o.key);
      ASSERT_OK(bytes);
      if (!IsPack(*bytes)) continue;
      auto elements = DecodePack(*bytes);
      ASSERT_OK(elements);
      std::vector<std::vector<uint8_t>> objects;
      for (auto e : *elements) objects.emplace_back(e.begin(), e.end());
      objects[1][objects[1].size() / 2] ^= 0x40;
      ASSERT_OK(store_->Put(o.key, EncodePack(objects)));
      return;
    }
    FAIL() << "version " << v << " has no pack";
  }

  // Version v's manifest as stored.
  Result<Manifest> StoredManifest(uint64_t v) {
    REFIT_ASSIGN_OR_RETURN(auto bytes, store_->Get(ManifestKey(v)));
    REFIT_ASSIGN_OR_RETURN(auto body, Key().Open(bytes));
    return DecodeManifest(body);
  }

  void ExpectReceiversHoldCanon() {
    for (int i = 0; i < 2; ++i) {
      auto ck = Checkpoint::Open(dir_.File("c" + std::to_string(i) + "/model.safetensors"),
                                 Checkpoint::Mode::kReadOnly);
      ASSERT_OK(ck);
      for (size_t t = 0; t < ck->tensors().size(); ++t) {
        auto d = ck->Data(t);
        const auto& want = canon_.at(ck->tensors()[t].name);
        EXPECT_TRUE(std::equal(d.begin(), d.end(), want.begin(), want.end()))
            << "checkpoint receiver " << i << " tensor " << ck->tensors()[t].name;
      }
      for (const auto& [name, want] : canon_) {
        EXPECT_EQ(memory_[i].at(name), want) << "in-memory receiver " << i << " " << name;
      }
    }
  }

  TempDir dir_;
  Layout layout_;
  TensorBytes canon_;
  std::vector<TensorBytes> memory_;
  std::vector<TensorBytes> local_;
  std::vector<TensorEntry> initial_;
  std::unique_ptr<ObjectStore> store_;
  std::vector<std::unique_ptr<trainer::RankEncoder>> encoders_;
  std::vector<std::unique_ptr<RankPublisher>> ranks_;
};

TEST_P(DirectTest, ReceiversApplyRanksChunksDirectly) {
  std::mt19937_64 rng(Seed() + 11);
  SCOPED_TRACE("ranks " + std::to_string(layout_.ranks.size()));
  // Four receivers follow every version on their own threads, retrying a
  // failed step as `refit receive` does.
  constexpr uint64_t kLast = 5;
  std::vector<std::thread> receivers;
  std::vector<Status> followed(4);
  std::atomic<bool> stop{false};
  for (int i = 0; i < 4; ++i) {
    receivers.emplace_back([&, i] {
      ReceiverOptions o = MakeReceiver(i);
      o.stop = [&] { return stop.load(); };
      auto r = Receiver::Open(store_.get(), o);
      if (!r.ok()) {
        followed[i] = r.status();
        return;
      }
      FollowOptions f;
      f.until = kLast;
      f.timeout_ms = 120000;
      f.poll_ms = 2;
      f.stop = o.stop;
      f.on_error = [](const Status&) { return std::optional<int>(5); };
      auto res = Follow(**r, f);
      followed[i] = res.status();
      if (res.ok() && res->end != FollowEnd::kReached) followed[i] = InternalError("not reached");
    });
  }
  auto opened = DirectCoordinator::Open(store_.get(), CoordinatorOptions(60000));
  ASSERT_OK(opened);
  DirectCoordinator& coordinator = **opened;
  bool strided = false, packed = false;
  auto publish_all = [&](uint64_t v) {
    for (size_t ri = 0; ri < ranks_.size(); ++ri) PublishRank(ri, v);
  };
  auto note_strided = [&](uint64_t v) {
    auto m = StoredManifest(v);
    ASSERT_OK(m);
    EXPECT_TRUE(m->direct);
    for (const ManifestChunk& c : m->chunks) {
      EXPECT_TRUE(c.in_part);
      strided = strided || c.run != 0;
      packed = packed || c.pack_offset != 0;
    }
  };

  // 1: every rank's part; the coordinator decides, receivers apply.
  TrainStep(rng);
  publish_all(1);
  auto r1 = coordinator.Publish(1);
  ASSERT_OK(r1);
  EXPECT_TRUE(r1->committed) << r1->reason;
  EXPECT_GT(r1->part_chunks, 0u);
  note_strided(1);
  AwaitRanks(true, 1);

  // 2: the last rank is late: the version is announced, but no manifest
  // or decision is written; once the rank reports, the version commits.
  TrainStep(rng);
  for (size_t ri = 0; ri + 1 < ranks_.size(); ++ri) PublishRank(ri, 2);
  {
    auto impatient = DirectCoordinator::Open(store_.get(), CoordinatorOptions(200));
    ASSERT_OK(impatient);
    auto missing = (*impatient)->Publish(2);
    ASSERT_THAT(missing, StatusIs(StatusCode::kDeadlineExceeded));
    EXPECT_NE(missing.status().message().find(std::to_string(layout_.ranks.back().rank)),
              std::string::npos);
    EXPECT_TRUE(store_->Get(IndexKey(2)).ok());
    EXPECT_FALSE(store_->Get(ManifestKey(2)).ok());
    EXPECT_FALSE(store_->Get(DecisionKey(2)).ok());
    auto stored = (*impatient)->PartsStored(2);
    ASSERT_OK(stored);
    EXPECT_EQ(stored->size(), ranks_.size() - 1);
  }
  PublishRank(ranks_.size() - 1, 2);
  auto r2 = coordinator.Publish(2);
  ASSERT_OK(r2);
  EXPECT_TRUE(r2->committed) << r2->reason;
  AwaitRanks(true, 2);

  // 3: a chunk object is damaged in the store after its rank listed it
  // (with packs: a chunk inside a pack, the pack framed again): the
  // coordinator never reads it, the members refuse it and vote failed,
  // the version aborts and every rank keeps its baseline.
  TrainStep(rng);
  publish_all(3);
  if (Packs()) {
    ASSERT_NO_FATAL_FAILURE(TamperAPackedChunk(3));
  } else {
    ASSERT_NO_FATAL_FAILURE(DamageAPartChunk(3));
  }
  auto r3 = coordinator.Publish(3);
  ASSERT_OK(r3);
  EXPECT_FALSE(r3->committed);
  EXPECT_NE(r3->reason.find("failed"), std::string::npos) << r3->reason;
  AwaitRanks(false, 2);

  // 4: the same step again on base 2, and 5: one more step.
  publish_all(4);
  auto r4 = coordinator.Publish(4);
  ASSERT_OK(r4);
  EXPECT_TRUE(r4->committed) << r4->reason;
  note_strided(4);
  AwaitRanks(true, 4);
  TrainStep(rng);
  publish_all(5);
  auto r5 = coordinator.Publish(5);
  ASSERT_OK(r5);
  EXPECT_TRUE(r5->committed) << r5->reason;
  AwaitRanks(true, 5);

  for (auto& t : receivers) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(followed[i].ok()) << "receiver " << i << ": " << followed[i].ToString();
  EXPECT_TRUE(strided) << "the layout gave no strided region";
  EXPECT_EQ(packed, Packs());
  ExpectReceiversHoldCanon();
  // The version's recorded hashes are the target's.
  auto bytes = store_->Get(DecisionKey(5));
  ASSERT_OK(bytes);
  auto body = Key().Open(*bytes);
  ASSERT_OK(body);
  auto d = DecodeDecision(*body);
  ASSERT_OK(d);
  ASSERT_EQ(d->tensors.size(), initial_.size());
  for (size_t t = 0; t < initial_.size(); ++t) {
    const auto& b = canon_.at(initial_[t].name);
    EXPECT_EQ(d->tensors[t], RangeHash(b.data(), b.size())) << initial_[t].name;
  }

  // Snapshots come from a committed receiver's own files (no coordinator
  // holds the model): one whose files are off the version writes nothing,
  // an in-memory one has no files, c0 writes version 5's once, and a
  // receiver without a checkpoint installs it.
  {
    auto c1 = Receiver::Open(store_.get(), MakeReceiver(1));
    ASSERT_OK(c1);
    auto ck = Checkpoint::Open(dir_.File("c1/model.safetensors"), Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    ck->MutableData(0)[0] ^= 1;
    ASSERT_OK(ck->Sync());
    EXPECT_THAT((*c1)->WriteSnapshot(), StatusIs(StatusCode::kDataLoss));
    ck->MutableData(0)[0] ^= 1;
    ASSERT_OK(ck->Sync());
    EXPECT_FALSE(store_->Get(SnapshotIndexKey(5)).ok());
  }
  {
    auto m0 = Receiver::Open(store_.get(), MakeReceiver(2));
    ASSERT_OK(m0);
    EXPECT_THAT((*m0)->WriteSnapshot(), StatusIs(StatusCode::kFailedPrecondition));
  }
  auto c0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(c0);
  ASSERT_EQ((*c0)->active_version(), kLast);
  auto wrote = (*c0)->WriteSnapshot();
  ASSERT_OK(wrote);
  EXPECT_TRUE(*wrote);
  auto again = (*c0)->WriteSnapshot();
  ASSERT_OK(again);
  EXPECT_FALSE(*again);
  ReceiverOptions fresh = MakeReceiver(0);
  fresh.member = "c9";
  std::filesystem::create_directories(dir_.File("state-c9"));
  std::filesystem::create_directories(dir_.File("c9"));
  fresh.state_dir = dir_.File("state-c9");
  fresh.checkpoint = dir_.File("c9/model.safetensors");
  auto c9 = Receiver::Open(store_.get(), fresh);
  ASSERT_OK(c9);
  auto installed = (*c9)->SyncTo(kLast, 30000);
  ASSERT_OK(installed);
  EXPECT_EQ(installed->outcome, StepResult::Outcome::kSnapshot);
  auto ck9 = Checkpoint::Open(fresh.checkpoint, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck9);
  ASSERT_EQ(ck9->tensors().size(), canon_.size());
  for (size_t t = 0; t < ck9->tensors().size(); ++t) {
    auto data = ck9->Data(t);
    const auto& want = canon_.at(ck9->tensors()[t].name);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), want.begin(), want.end()))
        << "snapshot " << ck9->tensors()[t].name;
  }
}

// A checkpoint receiver killed (SIGKILL) after it applied some of a direct
// version's chunks resumes from its journal and the region hashes: the
// chunks in place are skipped, the rest applied, and it commits bit-exact.
TEST_P(DirectTest, ReceiverKilledMidVersionResumes) {
  std::mt19937_64 rng(Seed() + 17);
  TrainStep(rng);
  for (size_t ri = 0; ri < ranks_.size(); ++ri) PublishRank(ri, 1);
  DirectCoordinatorOptions co = CoordinatorOptions(60000);
  co.members = {"c0"};
  auto coordinator = DirectCoordinator::Open(store_.get(), co);
  ASSERT_OK(coordinator);
  // The child applies until its third chunk is journaled, then dies there.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("REFIT_CRASH_AT", "receiver.after-chunk:3", 1);
    auto r = Receiver::Open(store_.get(), MakeReceiver(0));
    if (!r.ok()) _exit(2);
    for (int i = 0; i < 20000; ++i) {
      (void)(*r)->Step();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    _exit(3);  // never killed: the crash point was not reached
  }
  Result<DirectReport> report = InternalError("not run");
  std::thread decide([&] { report = (*coordinator)->Publish(1); });
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  auto r = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r);
  auto resumed = (*r)->SyncTo(1, 30000);
  ASSERT_OK(resumed);
  EXPECT_GE(resumed->chunks_skipped, 1u);  // applied before the kill
  EXPECT_GE(resumed->chunks_applied, 1u);
  decide.join();
  ASSERT_OK(report);
  EXPECT_TRUE(report->committed) << report->reason;
  auto ck = Checkpoint::Open(dir_.File("c0/model.safetensors"), Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  for (size_t t = 0; t < ck->tensors().size(); ++t) {
    auto d = ck->Data(t);
    const auto& want = canon_.at(ck->tensors()[t].name);
    EXPECT_TRUE(std::equal(d.begin(), d.end(), want.begin(), want.end()))
        << ck->tensors()[t].name;
  }
}

// A checkpoint receiver SIGKILLed inside a direct version, with a region
// left half written (some of its changed elements at the version, the
// others at the base, as a kill inside that region's write leaves it),
// resumes: the region hashes to neither side, the receiver asks for an
// overwrite re-send, the rank that owns the region serves it from its own
// baseline while it waits for the decision, and the receiver commits
// bit-exact. No copy of the model exists outside the ranks and receivers.
TEST_P(DirectTest, RegionTornByAKillIsRepairedByItsRank) {
  std::mt19937_64 rng(Seed() + 23);
  TrainStep(rng);
  for (size_t ri = 0; ri < ranks_.size(); ++ri) PublishRank(ri, 1);
  DirectCoordinatorOptions co = CoordinatorOptions(60000);
  co.members = {"c0"};
  auto coordinator = DirectCoordinator::Open(store_.get(), co);
  ASSERT_OK(coordinator);
  // The child applies until its second chunk is journaled, then dies.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("REFIT_CRASH_AT", "receiver.after-chunk:2", 1);
    auto r = Receiver::Open(store_.get(), MakeReceiver(0));
    if (!r.ok()) _exit(2);
    for (int i = 0; i < 20000; ++i) {
      (void)(*r)->Step();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    _exit(3);  // never killed: the crash point was not reached
  }
  Result<DirectReport> report = InternalError("not run");
  std::thread decide([&] { report = (*coordinator)->Publish(1); });
  // Every rank waits for the decision on its own thread, as on its own
  // machine, serving re-sends of its regions meanwhile.
  std::vector<Result<bool>> decided(ranks_.size(), InternalError("not run"));
  std::vector<std::thread> waiting;
  for (size_t ri = 0; ri < ranks_.size(); ++ri) {
    waiting.emplace_back([&, ri] { decided[ri] = ranks_[ri]->AwaitDecision(60000); });
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  // Tear a region the kill left at its base, a strided one when there is.
  auto m = StoredManifest(1);
  ASSERT_OK(m);
  {
    auto ck = Checkpoint::Open(dir_.File("c0/model.safetensors"), Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    std::optional<ChunkHeader> victim;
    std::vector<uint64_t> differ;
    for (const ManifestChunk& mc : m->chunks) {
      ChunkHeader h;
      ASSERT_NO_FATAL_FAILURE(PartChunkHeader(*m, mc, &h));
      const std::string& name = m->tensors[h.tensor_id].name;
      auto data = ck->MutableData(*ck->IndexOf(name));
      if (RegionHash(h, data.data()) != h.before) continue;  // applied (or torn) already
      if (victim && (victim->IsStrided() || !h.IsStrided())) continue;
      std::vector<uint64_t> d = ElementsOffTarget(h, data.data(), canon_.at(name));
      if (d.size() < 2) continue;
      victim = h;
      differ = std::move(d);
    }
    ASSERT_TRUE(victim) << "no region of two changed elements left at its base";
    const std::string& name = m->tensors[victim->tensor_id].name;
    auto data = ck->MutableData(*ck->IndexOf(name));
    const auto& want = canon_.at(name);
    for (size_t k = 0; k < differ.size() / 2; ++k) {
      std::memcpy(data.data() + differ[k] * victim->width,
                  want.data() + differ[k] * victim->width, victim->width);
    }
    ASSERT_NE(RegionHash(*victim, data.data()), victim->before);
    ASSERT_NE(RegionHash(*victim, data.data()), victim->after);
    ASSERT_OK(ck->Sync());
    RecordProperty("strided", victim->IsStrided() ? "yes" : "no");
  }

  auto r = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r);
  auto resumed = (*r)->SyncTo(1, 30000);
  ASSERT_OK(resumed);
  EXPECT_GE(resumed->chunks_resent, 1u);
  decide.join();
  for (auto& t : waiting) t.join();
  ASSERT_OK(report);
  EXPECT_TRUE(report->committed) << report->reason;
  uint64_t served = 0;
  for (size_t ri = 0; ri < ranks_.size(); ++ri) {
    ASSERT_OK(decided[ri]);
    EXPECT_TRUE(*decided[ri]);
    served += ranks_[ri]->resends_served();
  }
  EXPECT_GE(served, 1u);
  auto ck = Checkpoint::Open(dir_.File("c0/model.safetensors"), Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  for (size_t t = 0; t < ck->tensors().size(); ++t) {
    auto d = ck->Data(t);
    const auto& want = canon_.at(ck->tensors()[t].name);
    EXPECT_TRUE(std::equal(d.begin(), d.end(), want.begin(), want.end()))
        << ck->tensors()[t].name;
  }
}

// Receivers that were stopped while several direct versions were decided
// (one of them aborted) catch up by folding them: a checkpoint receiver
// and two in-memory ones fold the committed versions, strided regions
// included, in one step each, and end bit-exact with the target. A chunk
// damaged in the store stops a fold, which rolls back to the active
// version.
TEST_P(DirectTest, StoppedReceiversFoldDirectVersions) {
  std::mt19937_64 rng(Seed() + 29);
  const TensorBytes at0 = canon_;
  DirectCoordinatorOptions co = CoordinatorOptions(60000);
  co.members = {"c0"};
  auto opened = DirectCoordinator::Open(store_.get(), co);
  ASSERT_OK(opened);
  DirectCoordinator& coordinator = **opened;
  constexpr uint64_t kLast = 5;
  std::atomic<bool> stop{false};
  Status followed;
  std::thread c0([&] {
    ReceiverOptions o = MakeReceiver(0);
    auto r = Receiver::Open(store_.get(), o);
    if (!r.ok()) {
      followed = r.status();
      return;
    }
    FollowOptions f;
    f.until = kLast;
    f.timeout_ms = 120000;
    f.poll_ms = 2;
    f.stop = [&] { return stop.load(); };
    f.on_error = [](const Status&) { return std::optional<int>(5); };
    auto res = Follow(**r, f);
    followed = res.status();
    if (res.ok() && res->end != FollowEnd::kReached) followed = InternalError("not reached");
  });
  auto decide = [&](uint64_t v, bool commit) {
    for (size_t ri = 0; ri < ranks_.size(); ++ri) PublishRank(ri, v);
    auto r = coordinator.Publish(v);
    ASSERT_OK(r);
    EXPECT_EQ(r->committed, commit) << "version " << v << ": " << r->reason;
  };
  // 1, 2 commit; 3 carries a damaged chunk and aborts; 4 (on base 2) and
  // 5 commit.
  TrainStep(rng);
  decide(1, true);
  AwaitRanks(true, 1);
  TrainStep(rng);
  decide(2, true);
  AwaitRanks(true, 2);
  const TensorBytes at2 = canon_;
  TrainStep(rng);
  for (size_t ri = 0; ri < ranks_.size(); ++ri) PublishRank(ri, 3);
  ASSERT_NO_FATAL_FAILURE(DamageAPartChunk(3));
  auto r3 = coordinator.Publish(3);
  ASSERT_OK(r3);
  EXPECT_FALSE(r3->committed);
  AwaitRanks(false, 2);
  canon_ = at2;
  TrainStep(rng);
  decide(4, true);
  AwaitRanks(true, 4);
  TrainStep(rng);
  decide(5, true);
  AwaitRanks(true, 5);
  c0.join();
  ASSERT_TRUE(followed.ok()) << followed.ToString();

  bool strided = false;
  for (uint64_t v : {1, 2, 4, 5}) {
    auto m = StoredManifest(v);
    ASSERT_OK(m);
    EXPECT_TRUE(m->direct);
    for (const ManifestChunk& c : m->chunks) strided = strided || c.run != 0;
  }
  EXPECT_TRUE(strided) << "the layout gave no strided region";

  // A chunk of version 4 damaged in the store after its commit: c1's fold
  // refuses it, rolls back what it applied (strided regions included) and
  // holds version 0 exactly; once the chunk is intact again, it folds.
  std::string last;  // version 4's chunk of the last cell a fold reaches
  {
    auto m = StoredManifest(4);
    ASSERT_OK(m);
    const ManifestChunk* c = &m->chunks.front();
    for (const ManifestChunk& mc : m->chunks) {
      if (std::pair(mc.tensor_id, mc.start) > std::pair(c->tensor_id, c->start)) c = &mc;
    }
    last = ManifestChunkKey(*m, c - m->chunks.data());
  }
  ASSERT_NO_FATAL_FAILURE(DamageAPartChunk(4, last));
  {
    auto r = Receiver::Open(store_.get(), MakeReceiver(1));
    ASSERT_OK(r);
    auto refused = (*r)->Step();
    ASSERT_EQ(refused.status().code(), StatusCode::kDataLoss) << refused.status().ToString();
    EXPECT_NE(refused.status().ToString().find("rolled back to version 0"), std::string::npos)
        << refused.status().ToString();
    EXPECT_EQ((*r)->active_version(), 0u);
    auto ck = Checkpoint::Open(dir_.File("c1/model.safetensors"), Checkpoint::Mode::kReadOnly);
    ASSERT_OK(ck);
    for (size_t t = 0; t < ck->tensors().size(); ++t) {
      auto d = ck->Data(t);
      const auto& want = at0.at(ck->tensors()[t].name);
      EXPECT_TRUE(std::equal(d.begin(), d.end(), want.begin(), want.end()))
          << "rolled back " << ck->tensors()[t].name;
    }
  }
  ASSERT_NO_FATAL_FAILURE(DamageAPartChunk(4, last));  // the same byte again: intact

  // c1 (a checkpoint), m0 and m1 (memory) were stopped since version 0.
  for (int i : {1, 2, 3}) {
    auto r = Receiver::Open(store_.get(), MakeReceiver(i));
    ASSERT_OK(r);
    auto step = (*r)->Step();
    ASSERT_OK(step);
    EXPECT_EQ(step->outcome, StepResult::Outcome::kCaughtUp);
    EXPECT_EQ(step->version, kLast);
    EXPECT_EQ(step->versions_folded, 4u) << "receiver " << i;
    EXPECT_GT(step->chunks_applied, 0u);
  }
  ExpectReceiversHoldCanon();
}

// A checkpoint receiver killed inside a fold of direct versions, one of
// whose strided cells is then torn: the ranks serve re-sends only of the
// version they wait on, so none answers for committed versions. The fold's
// step fails with DEADLINE_EXCEEDED after the re-send timeout (the journal
// kept, the receiver at its active version) instead of waiting, and once a
// committed receiver wrote a snapshot, the next step resyncs from it,
// bit-exact.
TEST_P(DirectTest, TornCellOfAFoldResyncsFromASnapshot) {
  std::mt19937_64 rng(Seed() + 31);
  DirectCoordinatorOptions co = CoordinatorOptions(60000);
  co.members = {"c0"};
  auto opened = DirectCoordinator::Open(store_.get(), co);
  ASSERT_OK(opened);
  constexpr uint64_t kLast = 3;
  Status followed = InternalError("not run");
  std::thread c0([&] {
    auto r = Receiver::Open(store_.get(), MakeReceiver(0));
    if (!r.ok()) {
      followed = r.status();
      return;
    }
    followed = (*r)->SyncTo(kLast, 120000).status();
  });
  for (uint64_t v = 1; v <= kLast; ++v) {
    TrainStep(rng);
    for (size_t ri = 0; ri < ranks_.size(); ++ri) PublishRank(ri, v);
    auto r = (*opened)->Publish(v);
    ASSERT_OK(r);
    ASSERT_TRUE(r->committed) << r->reason;
    AwaitRanks(true, v);
  }
  c0.join();
  ASSERT_TRUE(followed.ok()) << followed.ToString();

  // c1, stopped since version 0, folds 1..3 and dies after its first cell.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("REFIT_CRASH_AT", "receiver.after-fold-cell:1", 1);
    auto r = Receiver::Open(store_.get(), MakeReceiver(1));
    if (!r.ok()) _exit(2);
    (void)(*r)->Step();
    _exit(3);  // never killed: the fold had no second cell
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  // Tear a strided cell the kill left at its base: half of the elements
  // that differ from version 3 take their version-3 values.
  auto m = StoredManifest(1);
  ASSERT_OK(m);
  {
    auto ck = Checkpoint::Open(dir_.File("c1/model.safetensors"), Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    bool torn = false;
    for (const ManifestChunk& mc : m->chunks) {
      if (mc.run == 0) continue;
      ChunkHeader h;
      ASSERT_NO_FATAL_FAILURE(PartChunkHeader(*m, mc, &h));
      const std::string& name = m->tensors[h.tensor_id].name;
      auto data = ck->MutableData(*ck->IndexOf(name));
      if (RegionHash(h, data.data()) != h.before) continue;
      const auto& want = canon_.at(name);
      const std::vector<uint64_t> differ = ElementsOffTarget(h, data.data(), want);
      if (differ.size() < 4) continue;
      for (size_t k = 0; k < differ.size(); k += 2) {
        std::memcpy(data.data() + differ[k] * h.width, want.data() + differ[k] * h.width,
                    h.width);
      }
      ASSERT_NE(RegionHash(h, data.data()), h.before);
      ASSERT_NE(RegionHash(h, want.data()), RegionHash(h, data.data()));
      torn = true;
      break;
    }
    ASSERT_TRUE(torn) << "no strided cell with changes left at its base";
    ASSERT_OK(ck->Sync());
  }

  ReceiverOptions o = MakeReceiver(1);
  o.resend_timeout_ms = 300;
  {
    auto r = Receiver::Open(store_.get(), o);
    ASSERT_OK(r);
    const auto t0 = std::chrono::steady_clock::now();
    auto step = (*r)->Step();
    ASSERT_EQ(step.status().code(), StatusCode::kDeadlineExceeded) << step.status().ToString();
    EXPECT_NE(step.status().ToString().find("re-send"), std::string::npos)
        << step.status().ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
    EXPECT_EQ((*r)->active_version(), 0u);
  }
  {
    auto writer = Receiver::Open(store_.get(), MakeReceiver(0));
    ASSERT_OK(writer);
    ASSERT_EQ((*writer)->active_version(), kLast);
    auto wrote = (*writer)->WriteSnapshot();
    ASSERT_OK(wrote);
    ASSERT_TRUE(*wrote);
  }
  auto r = Receiver::Open(store_.get(), o);
  ASSERT_OK(r);
  auto step = (*r)->Step();
  ASSERT_OK(step);
  EXPECT_EQ(step->outcome, StepResult::Outcome::kSnapshot);
  EXPECT_EQ(step->version, kLast);
  EXPECT_NE(step->recovered.find("re-send"), std::string::npos) << step->recovered;
  auto ck = Checkpoint::Open(dir_.File("c1/model.safetensors"), Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  for (size_t t = 0; t < ck->tensors().size(); ++t) {
    auto d = ck->Data(t);
    const auto& want = canon_.at(ck->tensors()[t].name);
    EXPECT_TRUE(std::equal(d.begin(), d.end(), want.begin(), want.end()))
        << ck->tensors()[t].name;
  }
}

// A two-phase receiver (host staging) applies direct versions: Prepare
// stages the ranks' chunks, strided regions included, and votes the
// tensors' hashes after the version without writing; the pause applies
// them. A damaged chunk is voted failed with nothing written; a version
// aborted by a silent member is dropped; memory changed under a prepared
// version fails the pause, which restores every tensor; a late two-phase
// receiver folds the committed versions into one pause. Every receiver
// ends bit-exact with the target.
TEST_P(DirectTest, TwoPhaseReceiverAppliesDirectVersions) {
  std::mt19937_64 rng(Seed() + 31);
  TensorBytes held = canon_, late = canon_;
  auto opened = Receiver::Open(store_.get(), StagedReceiver("s0", &held));
  ASSERT_OK(opened);
  Receiver& s0 = **opened;
  DirectCoordinatorOptions co = CoordinatorOptions(60000);
  co.members = {"s0"};
  auto coordinator = DirectCoordinator::Open(store_.get(), co);
  ASSERT_OK(coordinator);
  // s0 prepares (or steps) on a thread of its own until it is not idle.
  auto busy = [&](bool prepare, Result<StepResult>* step) {
    return BusyUntilNotIdle(&s0, prepare, step);
  };
  // Publishes every rank's part of v and decides it while s0 is busy.
  auto decide = [&](DirectCoordinator* c, uint64_t v, bool prepare,
                    Result<StepResult>* step) -> Result<DirectReport> {
    for (size_t ri = 0; ri < ranks_.size(); ++ri) PublishRank(ri, v);
    std::thread t = busy(prepare, step);
    auto report = c->Publish(v);
    t.join();
    return report;
  };
  bool strided = false;
  auto note_strided = [&](uint64_t v) {
    auto m = StoredManifest(v);
    ASSERT_OK(m);
    for (const ManifestChunk& c : m->chunks) strided = strided || c.run != 0;
  };

  // Version v decided while s0 prepares it: committed and prepared.
  Result<StepResult> step = InternalError("not run");
  auto prepare_committed = [&](uint64_t v) {
    auto r = decide(coordinator->get(), v, /*prepare=*/true, &step);
    ASSERT_OK(r);
    EXPECT_TRUE(r->committed) << r->reason;
    AwaitRanks(true, v);
    note_strided(v);
    ASSERT_OK(step);
    ASSERT_EQ(step->outcome, StepResult::Outcome::kPrepared);
  };

  // 1: prepared (voted, nothing written), then activated.
  TrainStep(rng);
  const TensorBytes at0 = held;
  ASSERT_NO_FATAL_FAILURE(prepare_committed(1));
  EXPECT_EQ(held, at0) << "prepare wrote";
  auto active = s0.ActivatePrepared();
  ASSERT_OK(active);
  EXPECT_EQ(active->outcome, StepResult::Outcome::kCommitted);
  EXPECT_GT(active->chunks_applied, 0u);
  EXPECT_EQ(held, canon_);
  EXPECT_EQ(s0.active_version(), 1u);
  const TensorBytes at1 = canon_;

  // 2: a chunk object damaged in the store: s0 votes failed, the version
  // aborts, nothing was written.
  TrainStep(rng);
  for (size_t ri = 0; ri < ranks_.size(); ++ri) PublishRank(ri, 2);
  ASSERT_NO_FATAL_FAILURE(DamageAPartChunk(2));
  {
    Result<StepResult> failed = InternalError("not run");
    std::thread t = busy(/*prepare=*/false, &failed);
    auto r2 = (*coordinator)->Publish(2);
    t.join();
    ASSERT_OK(r2);
    EXPECT_FALSE(r2->committed);
    EXPECT_FALSE(failed.ok());
    EXPECT_EQ(s0.failed_vote(), std::optional<uint64_t>(2));
  }
  AwaitRanks(false, 1);
  EXPECT_EQ(held, at1);
  EXPECT_EQ(s0.active_version(), 1u);

  // 3 (on base 1): a member that never votes: the version aborts, s0
  // drops what it staged.
  canon_ = at1;
  TrainStep(rng);
  {
    DirectCoordinatorOptions two = co;
    two.members = {"s0", "silent"};
    two.vote_timeout_ms = 300;
    auto impatient = DirectCoordinator::Open(store_.get(), two);
    ASSERT_OK(impatient);
    auto r3 = decide(impatient->get(), 3, /*prepare=*/false, &step);
    ASSERT_OK(r3);
    EXPECT_FALSE(r3->committed);
  }
  AwaitRanks(false, 1);
  ASSERT_OK(step);
  EXPECT_EQ(step->outcome, StepResult::Outcome::kAborted);
  EXPECT_FALSE(s0.prepared());
  EXPECT_EQ(held, at1);

  // 4 (on base 1): prepared; then an element inside a region the version
  // writes (a strided one when there is) changes under s0 before the
  // pause: the pause fails and restores every tensor; once the element is
  // back, the committed version applies.
  canon_ = at1;
  TrainStep(rng);
  ASSERT_NO_FATAL_FAILURE(prepare_committed(4));
  {
    auto m = StoredManifest(4);
    ASSERT_OK(m);
    const ManifestChunk* victim = nullptr;
    for (const ManifestChunk& c : m->chunks) {
      if (c.changed > 0 && (victim == nullptr || (victim->run == 0 && c.run != 0))) victim = &c;
    }
    ASSERT_NE(victim, nullptr);
    uint8_t* at = held.at(m->tensors[victim->tensor_id].name).data() + victim->start * 2;
    at[0] ^= 0x40;
    const TensorBytes changed = held;
    auto failed = s0.ActivatePrepared();
    EXPECT_EQ(failed.status().code(), StatusCode::kDataLoss) << failed.status().ToString();
    EXPECT_NE(failed.status().ToString().find("restored"), std::string::npos)
        << failed.status().ToString();
    EXPECT_EQ(held, changed);
    EXPECT_EQ(s0.active_version(), 1u);
    at[0] ^= 0x40;
  }
  auto caught = s0.Step();
  ASSERT_OK(caught);
  EXPECT_EQ(caught->outcome, StepResult::Outcome::kCaughtUp);
  EXPECT_EQ(s0.active_version(), 4u);
  EXPECT_EQ(held, canon_);

  // A two-phase receiver still at version 0 folds 1 and 4 (2 and 3 were
  // aborted) into one pause.
  auto l = Receiver::Open(store_.get(), StagedReceiver("s9", &late));
  ASSERT_OK(l);
  auto folded = (*l)->Step();
  ASSERT_OK(folded);
  EXPECT_EQ(folded->outcome, StepResult::Outcome::kCaughtUp);
  EXPECT_EQ(folded->version, 4u);
  EXPECT_EQ(folded->versions_folded, 2u);
  EXPECT_EQ(late, canon_);
  EXPECT_TRUE(strided) << "the layout gave no strided region";
}

// Counts the part chunk objects read through it (each key once).
class PartReads final : public ForwardingStore {
 public:
  explicit PartReads(ObjectStore* inner)
      : ForwardingStore(std::shared_ptr<ObjectStore>(inner, [](ObjectStore*) {})) {}
  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    auto got = ForwardingStore::Get(key);
    if (got.ok() && ParsePartChunkKey(key)) {
      std::lock_guard<std::mutex> lock(mu_);
      keys_.insert(std::string(key));
    }
    return got;
  }
  size_t read() {
    std::lock_guard<std::mutex> lock(mu_);
    return keys_.size();
  }

 private:
  std::mutex mu_;
  std::set<std::string> keys_;
};

// A direct version is announced once its ranks start storing their parts:
// receivers read the ranks' chunks as they are stored (EarlyParts; a
// two-phase receiver stages them at once), and apply them once the
// manifest lists them, bit-exact. Here every rank but the last has stored
// its part, and both receivers have read every chunk object stored,
// before the last rank publishes and the manifest is written. In version
// 2 an extra object (a copy of a rank's chunk at an index its part list
// does not have) is read and staged early too: the two-phase receiver
// finds it is not in the manifest and stages the version again; the
// in-memory receiver never applies it.
TEST_P(DirectTest, ChunksStoredBeforeTheManifestAreReadEarly) {
  std::mt19937_64 rng(Seed() + 41);
  TensorBytes held = canon_;
  PartReads staged_store(store_.get()), memory_store(store_.get());
  auto s0 = Receiver::Open(&staged_store, StagedReceiver("s0", &held));
  ASSERT_OK(s0);
  auto m0 = Receiver::Open(&memory_store, MakeReceiver(2));
  ASSERT_OK(m0);
  DirectCoordinatorOptions co = CoordinatorOptions(60000);
  co.members = {"s0", "m0"};
  auto coordinator = DirectCoordinator::Open(store_.get(), co);
  ASSERT_OK(coordinator);

  for (uint64_t v = 1; v <= 2; ++v) {
    SCOPED_TRACE("version " + std::to_string(v));
    TrainStep(rng);
    Result<DirectReport> report = InternalError("not run");
    std::thread decide([&] { report = (*coordinator)->Publish(v); });
    std::vector<Result<StepResult>> steps(2, InternalError("not run"));
    std::vector<std::thread> receivers;
    receivers.push_back(BusyUntilNotIdle(s0->get(), /*prepare=*/false, &steps[0]));
    receivers.push_back(BusyUntilNotIdle(m0->get(), /*prepare=*/false, &steps[1]));
    const size_t read_before = staged_store.read(), memory_before = memory_store.read();
    for (size_t ri = 0; ri + 1 < ranks_.size(); ++ri) PublishRank(ri, v);
    auto stored = store_->List(PartsPrefix(v));
    ASSERT_OK(stored);
    size_t objects = 0;
    std::string first;
    for (const auto& o : *stored) {
      if (!ParsePartChunkKey(o.key)) continue;
      ++objects;
      if (first.empty()) first = o.key;
    }
    if (v == 2) {
      auto copy = store_->Get(first);
      ASSERT_OK(copy);
      const auto id = ParsePartChunkKey(first);
      ASSERT_OK(store_->Put(PartChunkKey(v, id->rank, 999999), *copy));
      ++objects;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while ((staged_store.read() - read_before < objects ||
            memory_store.read() - memory_before < objects) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_FALSE(store_->Get(ManifestKey(v)).ok());
    EXPECT_TRUE(store_->Get(IndexKey(v)).ok());
    EXPECT_EQ(staged_store.read() - read_before, objects);
    EXPECT_EQ(memory_store.read() - memory_before, objects);
    PublishRank(ranks_.size() - 1, v);
    decide.join();
    for (auto& t : receivers) t.join();
    ASSERT_OK(report);
    EXPECT_TRUE(report->committed) << report->reason;
    AwaitRanks(true, v);
    for (size_t i = 0; i < steps.size(); ++i) {
      const auto& step = steps[i];
      ASSERT_OK(step);
      EXPECT_EQ(step->outcome, StepResult::Outcome::kCommitted);
      EXPECT_LE(step->chunks_read_early, step->chunks_applied + step->chunks_skipped);
      // Version 2's two-phase receiver, having staged the stray copy of a
      // region early, started over (staged twice, the region would fail
      // its "before" check and the vote); after that it takes only the
      // chunks read since its last poll as read early.
      if (v == 1 || i == 1) {
        EXPECT_GT(step->chunks_read_early, 0u);
      }
    }
    EXPECT_EQ(held, canon_);
    EXPECT_EQ(memory_[0], canon_);
  }
}

INSTANTIATE_TEST_SUITE_P(RandomLayouts, DirectTest, ::testing::Range(0, 6));

TEST(DirectCoordinatorTest, RefusesWithoutATableOrMembers) {
  TempDir dir;
  auto s = OpenObjectStore(dir.File("store"));
  ASSERT_OK(s);
  DirectCoordinatorOptions co;
  co.ranks = {0};
  EXPECT_THAT(DirectCoordinator::Open(s->get(), co), StatusIs(StatusCode::kInvalidArgument));
  co.members = {"r0"};
  co.parts_timeout_ms = 10;
  auto c = DirectCoordinator::Open(s->get(), co);
  ASSERT_OK(c);
  EXPECT_THAT((*c)->Publish(1), StatusIs(StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace refit::ranks
