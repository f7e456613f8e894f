// Two-phase receivers (docs/protocol.md, "Two-phase receivers") through a
// directory store, with the host target: nothing is written before the
// activation, votes, aborts, folds, a damaged chunk, a failed activation
// that restores, snapshots and the staging bound.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>

#include "sync/host_staged_target.h"
#include "sync/keys.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "support/test_model.h"
#include "support/testing.h"
#include "transport/object_store.h"

namespace refit {
namespace {

using Model = testing::TestModel;
using Outcome = StepResult::Outcome;
using testing::TempDir;

Authenticator Key() {
  return *Authenticator::Hmac(std::vector<uint8_t>(32, 7));
}

// Returns damaged bytes for one key, every time (a damaged stored object).
class DamageStore final : public ForwardingStore {
 public:
  explicit DamageStore(std::shared_ptr<ObjectStore> inner)
      : ForwardingStore(std::move(inner)) {}
  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    REFIT_ASSIGN_OR_RETURN(auto bytes, inner()->Get(key));
    if (key == damaged_ && !bytes.empty()) bytes[bytes.size() / 2] ^= 0x10;
    return bytes;
  }
  std::string damaged_;
};

// On a thread of its own: Prepare() (or Step()) until it is not idle.
std::thread UntilBusy(Receiver* r, bool prepare, Result<StepResult>* out) {
  return std::thread([r, prepare, out] {
    for (int i = 0; i < 5000; ++i) {
      *out = prepare ? r->Prepare() : r->Step();
      if (!out->ok() || (*out)->outcome != Outcome::kIdle) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
}

// What a publish beside a busy receiver returned.
struct Published {
  Result<PublishReport> report = InternalError("not run");
  Result<StepResult> step = InternalError("not run");
};

class StagedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = OpenObjectStore(dir_.File("store"));
    ASSERT_OK(s);
    store_ = std::move(*s);
    model_.Write(dir_.File("baseline.safetensors"));
  }
  PublisherOptions MakePublisher(int members) {
    PublisherOptions o;
    for (int i = 0; i < members; ++i)
      o.members.push_back("r" + std::to_string(i));
    o.auth = Key();
    o.poll_ms = 2;
    o.vote_timeout_ms = 20000;
    o.diff.chunk_bytes = 64 * 1024;
    return o;
  }
  // A two-phase receiver on `memory`, named r<i>.
  ReceiverOptions MakeStaged(int i, Model* memory,
                             uint64_t limit = uint64_t{1} << 30) {
    const std::string name = "r" + std::to_string(i);
    std::filesystem::create_directories(dir_.File(name));
    ReceiverOptions o;
    o.member = name;
    o.state_dir = dir_.File(name);
    o.staged =
        std::make_shared<HostStagedTarget>(memory->MutableViews(), limit);
    o.auth = Key();
    o.poll_ms = 2;
    o.decision_timeout_ms = 20000;
    o.chunk_timeout_ms = 20000;
    return o;
  }

  std::unique_ptr<Publisher> OpenPublisher(PublisherOptions options) {
    auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"),
                               std::move(options));
    EXPECT_OK(pub);
    return pub.ok() ? std::move(*pub) : nullptr;
  }

  // Publishes `trainer` as `version` while `r` prepares (or steps) on a
  // thread of its own until it is not idle.
  static Published PublishWhileBusy(Publisher* pub, Receiver* r, bool prepare,
                                    uint64_t version, const Model& trainer) {
    Published out;
    std::thread t = UntilBusy(r, prepare, &out.step);
    out.report = pub->Publish(version, trainer.Views());
    t.join();
    return out;
  }

  // Publishes `trainer` as `version` while every receiver syncs to it;
  // expects a commit.
  static void PublishAndSync(Publisher* pub, const std::vector<Receiver*>& rs,
                             uint64_t version, const Model& trainer) {
    std::vector<std::thread> threads;
    for (Receiver* r : rs) {
      threads.emplace_back([r, version] { EXPECT_OK(r->SyncTo(version, 20000)); });
    }
    auto report = pub->Publish(version, trainer.Views());
    for (std::thread& t : threads) t.join();
    ASSERT_OK(report);
    ASSERT_TRUE(report->committed) << report->reason;
  }

  TempDir dir_;
  std::shared_ptr<ObjectStore> store_;
  Model model_{3};
};

// Prepare() stages and votes without writing; ActivatePrepared() applies.
TEST_F(StagedTest, PrepareWritesNothingAndActivateApplies) {
  auto pub = OpenPublisher(MakePublisher(1));
  ASSERT_NE(pub, nullptr);
  Model memory = model_;
  auto r = Receiver::Open(store_.get(), MakeStaged(0, &memory));
  ASSERT_OK(r);
  Model trainer = model_;
  std::mt19937_64 rng(5);
  for (uint64_t v = 1; v <= 6; ++v) {
    Model before = memory;
    trainer.Step(rng, v == 3 ? 0.6 : 0.03);  // one dense step
    auto [report, prepared] =
        PublishWhileBusy(pub.get(), r->get(), /*prepare=*/true, v, trainer);
    ASSERT_OK(report);
    ASSERT_TRUE(report->committed) << report->reason;
    ASSERT_OK(prepared);
    ASSERT_EQ(prepared->outcome, Outcome::kPrepared);
    EXPECT_EQ(prepared->version, v);
    EXPECT_TRUE((*r)->prepared());
    EXPECT_EQ(memory.data, before.data) << "prepare wrote version " << v;
    EXPECT_EQ((*r)->active_version(), v - 1);
    auto again = (*r)->Prepare();  // the same preparation
    ASSERT_OK(again);
    EXPECT_EQ(again->version, v);
    auto active = (*r)->ActivatePrepared();
    ASSERT_OK(active);
    EXPECT_EQ(active->outcome, Outcome::kCommitted);
    EXPECT_GT(active->chunks_applied, 0u);
    EXPECT_GE(active->pause_seconds, 0.0);
    EXPECT_GT(active->staged_host_bytes, 0u);
    EXPECT_EQ(memory.data, trainer.data) << "version " << v;
    EXPECT_EQ((*r)->active_version(), v);
  }
  EXPECT_EQ((*r)->ActivatePrepared().status().code(),
            StatusCode::kFailedPrecondition);
}

// A version a silent member aborts is dropped without a write; a late
// two-phase receiver folds the committed versions into one pause.
TEST_F(StagedTest, AbortsWriteNothingAndLateReceiversFold) {
  auto popts = MakePublisher(2);
  popts.vote_timeout_ms = 3000;
  auto pub = OpenPublisher(popts);
  ASSERT_NE(pub, nullptr);
  Model m0 = model_, m1 = model_, late = model_;
  auto r0 = Receiver::Open(store_.get(), MakeStaged(0, &m0));
  auto r1 = Receiver::Open(store_.get(), MakeStaged(1, &m1));
  ASSERT_OK(r0);
  ASSERT_OK(r1);
  Model trainer = model_;
  std::mt19937_64 rng(6);
  for (uint64_t v = 1; v <= 4; ++v) {
    trainer.Step(rng, 0.02);
    ASSERT_NO_FATAL_FAILURE(
        PublishAndSync(pub.get(), {r0->get(), r1->get()}, v, trainer));
    EXPECT_EQ(m0.data, trainer.data);
    EXPECT_EQ(m1.data, trainer.data);
  }
  // r1 stays silent: version 5 aborts; r0 staged it and drops it.
  Model at4 = trainer;
  trainer.Step(rng, 0.02);
  auto [report, step] =
      PublishWhileBusy(pub.get(), r0->get(), /*prepare=*/false, 5, trainer);
  ASSERT_OK(report);
  EXPECT_FALSE(report->committed);
  ASSERT_OK(step);
  EXPECT_EQ(step->outcome, Outcome::kAborted);
  EXPECT_FALSE((*r0)->prepared());
  EXPECT_EQ(m0.data, at4.data);
  EXPECT_EQ((*r0)->active_version(), 4u);
  // A receiver still at version 0 catches up with versions 1-4 in one
  // pause (5 was aborted).
  auto r9 = Receiver::Open(store_.get(), MakeStaged(9, &late));
  ASSERT_OK(r9);
  auto caught = (*r9)->Step();
  ASSERT_OK(caught);
  EXPECT_EQ(caught->outcome, Outcome::kCaughtUp);
  EXPECT_EQ(caught->version, 4u);
  EXPECT_EQ(caught->versions_folded, 4u);
  EXPECT_EQ(late.data, at4.data);
}

// A chunk the store keeps returning damaged: the member votes failed, the
// version aborts, and its tensors were never written.
TEST_F(StagedTest, DamagedChunkVotesFailedAndWritesNothing) {
  DamageStore damage(store_);
  damage.damaged_ = ChunkKey(1, 1);
  auto pub = OpenPublisher(MakePublisher(1));
  ASSERT_NE(pub, nullptr);
  Model memory = model_;
  auto r = Receiver::Open(&damage, MakeStaged(0, &memory));
  ASSERT_OK(r);
  Model trainer = model_;
  std::mt19937_64 rng(7);
  trainer.Step(rng, 0.05);
  auto [report, step] =
      PublishWhileBusy(pub.get(), r->get(), /*prepare=*/false, 1, trainer);
  ASSERT_OK(report);
  EXPECT_FALSE(report->committed);
  // The damaged byte fails the envelope's authentication tag.
  EXPECT_EQ(step.status().code(), StatusCode::kUnauthenticated)
      << step.status().ToString();
  EXPECT_EQ((*r)->failed_vote(), std::optional<uint64_t>(1));
  EXPECT_EQ(memory.data, model_.data);
  // The next version (on base 0) applies.
  damage.damaged_.clear();
  trainer.Step(rng, 0.02);
  ASSERT_NO_FATAL_FAILURE(PublishAndSync(pub.get(), {r->get()}, 2, trainer));
  EXPECT_EQ(memory.data, trainer.data);
}

// Conditional XOR chunks (kind 5) apply on a host staging target.
TEST_F(StagedTest, ConditionalChunksApplyOnTheHost) {
  auto popts = MakePublisher(1);
  popts.diff.allow_conditional = true;
  auto pub = OpenPublisher(popts);
  ASSERT_NE(pub, nullptr);
  Model memory = model_;
  auto r = Receiver::Open(store_.get(), MakeStaged(0, &memory));
  ASSERT_OK(r);
  Model trainer = model_;
  std::mt19937_64 rng(9);
  for (uint64_t v = 1; v <= 2; ++v) {
    trainer.StepByOne(rng, 0.03);
    ASSERT_NO_FATAL_FAILURE(PublishAndSync(pub.get(), {r->get()}, v, trainer));
    EXPECT_EQ(memory.data, trainer.data) << "version " << v;
  }
}

// A staging target that does not decode kind 5, as the GPU one does not
// for a tensor whose chunk spans it does not store contiguously (cuda/
// batch.cc): it refuses such a chunk with UNIMPLEMENTED; everything else
// goes to a host target.
class NoConditionalTarget final : public StagedTarget {
 public:
  explicit NoConditionalTarget(std::shared_ptr<StagedTarget> host) : host_(std::move(host)) {}
  Status Check(const std::vector<TensorEntry>& table) override { return host_->Check(table); }
  Result<std::vector<std::optional<Hash128>>> Hashes(
      const std::vector<TensorEntry>& table) override {
    return host_->Hashes(table);
  }
  Status Begin() override { return host_->Begin(); }
  Status Add(size_t version, const std::vector<TensorEntry>& table,
             std::span<const uint8_t> chunk) override {
    auto parsed = ParseChunk(chunk);
    if (parsed.ok() && parsed->header.IsConditional()) {
      return UnimplementedError("chunk is conditional XOR (kind 5), which this target "
                                "does not decode");
    }
    return host_->Add(version, table, chunk);
  }
  Status Seal() override { return host_->Seal(); }
  Result<StagedApplyReport> Apply() override { return host_->Apply(); }
  Status Load(const TensorEntry& e, std::span<const uint8_t> bytes) override {
    return host_->Load(e, bytes);
  }
  StagingUsage usage() const override { return host_->usage(); }

 private:
  std::shared_ptr<StagedTarget> host_;
};

// Such a target votes failed on a version with conditional chunks, naming
// the chunk, before anything is written; the version aborts at once and
// the next one, without them, applies.
TEST_F(StagedTest, TargetWithoutConditionalDecoderVotesFailedAndWritesNothing) {
  auto popts = MakePublisher(1);
  popts.diff.allow_conditional = true;
  auto pub = OpenPublisher(popts);
  ASSERT_NE(pub, nullptr);
  Model memory = model_;
  ReceiverOptions o = MakeStaged(0, &memory);
  o.staged = std::make_shared<NoConditionalTarget>(o.staged);
  auto r = Receiver::Open(store_.get(), o);
  ASSERT_OK(r);
  Model trainer = model_;
  std::mt19937_64 rng(10);
  trainer.StepByOne(rng, 0.03);
  auto [report, step] =
      PublishWhileBusy(pub.get(), r->get(), /*prepare=*/false, 1, trainer);
  ASSERT_OK(report);
  EXPECT_GT(report->diff.chunks_by_kind["conditional-xor"], 0u);
  EXPECT_FALSE(report->committed);
  EXPECT_NE(report->reason.find("kind 5"), std::string::npos) << report->reason;
  EXPECT_EQ(step.status().code(), StatusCode::kUnimplemented) << step.status().ToString();
  EXPECT_EQ((*r)->failed_vote(), std::optional<uint64_t>(1));
  EXPECT_EQ(memory.data, model_.data);
  // A publisher without the option: the next version applies.
  pub.reset();
  pub = OpenPublisher(MakePublisher(1));
  ASSERT_NE(pub, nullptr);
  ASSERT_NO_FATAL_FAILURE(PublishAndSync(pub.get(), {r->get()}, 2, trainer));
  EXPECT_EQ(memory.data, trainer.data);
}

// Memory that changed between Prepare() and ActivatePrepared() makes a
// chunk fail in the pause: every tensor is restored and the receiver stays
// at its version; the next preparation refuses the changed model.
TEST_F(StagedTest, FailedActivationRestoresEveryTensor) {
  auto pub = OpenPublisher(MakePublisher(1));
  ASSERT_NE(pub, nullptr);
  Model memory = model_;
  auto r = Receiver::Open(store_.get(), MakeStaged(0, &memory));
  ASSERT_OK(r);
  Model trainer = model_;
  std::mt19937_64 rng(8);
  trainer.Step(rng, 0.03);
  auto [report, prepared] =
      PublishWhileBusy(pub.get(), r->get(), /*prepare=*/true, 1, trainer);
  ASSERT_OK(report);
  ASSERT_OK(prepared);
  ASSERT_EQ(prepared->outcome, Outcome::kPrepared);
  // The last tensor's bytes change under the receiver (its chunks come last).
  memory.data[2][10] ^= 0x40;
  Model changed = memory;
  auto active = (*r)->ActivatePrepared();
  EXPECT_EQ(active.status().code(), StatusCode::kDataLoss)
      << active.status().ToString();
  EXPECT_NE(active.status().ToString().find("restored"), std::string::npos);
  EXPECT_EQ(memory.data, changed.data);
  EXPECT_EQ((*r)->active_version(), 0u);
  auto again = (*r)->Step();
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition)
      << again.status().ToString();
  EXPECT_EQ(memory.data, changed.data);
}

// Staging bounded below one version: a clear error, nothing written.
TEST_F(StagedTest, StagingLimitBelowOneVersionIsAnError) {
  auto popts = MakePublisher(1);
  popts.vote_timeout_ms = 20000;  // the failed vote aborts it at once
  auto pub = OpenPublisher(popts);
  ASSERT_NE(pub, nullptr);
  Model memory = model_;
  auto r = Receiver::Open(store_.get(), MakeStaged(0, &memory, /*limit=*/1000));
  ASSERT_OK(r);
  Model trainer = model_;
  std::mt19937_64 rng(9);
  trainer.Step(rng, 0.05);
  auto [report, step] =
      PublishWhileBusy(pub.get(), r->get(), /*prepare=*/false, 1, trainer);
  ASSERT_OK(report);
  EXPECT_FALSE(report->committed);
  EXPECT_EQ(step.status().code(), StatusCode::kResourceExhausted)
      << step.status().ToString();
  EXPECT_EQ((*r)->failed_vote(), std::optional<uint64_t>(1));
  EXPECT_EQ(memory.data, model_.data);
}

// A receiver whose chain of versions was deleted takes the newest
// snapshot in its pause, then follows versions again.
TEST_F(StagedTest, SnapshotIntoStagedTensors) {
  auto popts = MakePublisher(1);
  popts.snapshot_every = 2;
  popts.keep_versions = 1;
  auto pub = OpenPublisher(popts);
  ASSERT_NE(pub, nullptr);
  Model m0 = model_;
  auto r0 = Receiver::Open(store_.get(), MakeStaged(0, &m0));
  ASSERT_OK(r0);
  Model trainer = model_;
  std::mt19937_64 rng(10);
  for (uint64_t v = 1; v <= 4; ++v) {
    trainer.Step(rng, 0.02);
    ASSERT_NO_FATAL_FAILURE(PublishAndSync(pub.get(), {r0->get()}, v, trainer));
  }
  Model fresh =
      model_;  // another worker, loaded with zeros: it takes the snapshot
  for (auto& d : fresh.data) std::fill(d.begin(), d.end(), 0);
  auto r5 = Receiver::Open(store_.get(), MakeStaged(5, &fresh));
  ASSERT_OK(r5);
  auto snap = (*r5)->Step();
  ASSERT_OK(snap);
  EXPECT_EQ(snap->outcome, Outcome::kSnapshot);
  EXPECT_EQ(snap->version, 4u);
  EXPECT_EQ(fresh.data, trainer.data);
  EXPECT_EQ((*r5)->active_version(), 4u);
}

}  // namespace
}  // namespace refit
