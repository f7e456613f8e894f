// Catch-up by folding (docs/protocol.md, "Catch-up by folding"): a
// receiver several committed versions behind applies them in one step,
// bit-exact, resumes an interrupted fold, repairs a torn range from
// re-sends, rolls a fold stopped by a tampered chunk back to the active
// version, and falls back to one version at a time when the versions do
// not fold.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <span>
#include <thread>

#include "base/file.h"
#include "refit/checkpoint.h"
#include "support/moto_testing.h"
#include "support/status_matchers.h"
#include "support/store_test_fixture.h"
#include "support/test_model.h"
#include "support/testing.h"
#include "sync/journal.h"
#include "sync/protocol.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "transport/object_store.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using testing::TempDir;
using Model = testing::TestModel;

Authenticator Key() { return *Authenticator::Hmac(std::vector<uint8_t>(32, 7)); }

TEST(FoldJournalTest, FoldRecordRoundTripsAndATornOneIsNoJournal) {
  TempDir dir;
  const std::string path = dir.File("journal");
  std::vector<Sha256> shas(3);
  for (size_t i = 0; i < shas.size(); ++i) shas[i][0] = static_cast<uint8_t>(i + 1);
  ASSERT_OK(Journal::BeginFold(path, 4, {5, 7, 9}, shas).status());
  auto loaded = Journal::Load(path);
  ASSERT_OK(loaded);
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->version, 9u);
  EXPECT_EQ((*loaded)->base_version, 4u);
  EXPECT_EQ((*loaded)->fold_versions, (std::vector<uint64_t>{5, 7, 9}));
  EXPECT_EQ((*loaded)->fold_announcements, shas);
  EXPECT_EQ((*loaded)->announcement_sha256, shas[2]);
  // One record: any truncation leaves all of it or nothing.
  auto bytes = testing::ReadBytes(path);
  for (size_t n = 0; n < bytes.size(); ++n) {
    testing::WriteBytes(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(n)));
    auto part = Journal::Load(path);
    ASSERT_OK(part);
    EXPECT_FALSE(part->has_value()) << n;
  }
  // A fold is two versions or more, each with its announcement.
  EXPECT_FALSE(Journal::BeginFold(path, 4, {5}, {shas[0]}).ok());
  EXPECT_FALSE(Journal::BeginFold(path, 4, {5, 6}, {shas[0]}).ok());
}

TEST(FoldJournalTest, FoldAppliedRecordsRoundTripInOrder) {
  TempDir dir;
  const std::string path = dir.File("journal");
  std::vector<Sha256> shas(2);
  auto journal = Journal::BeginFold(path, 4, {5, 7}, shas);
  ASSERT_OK(journal);
  UndoRecord overwrite{{1, 9}, {0xaa, 0xbb, 0xcc, 0xdd}};
  ASSERT_OK(journal->FoldApplied(0, 3, UndoRecord{}));
  ASSERT_OK(journal->FoldApplied(1, 3, overwrite));
  ASSERT_OK(journal->FoldApplied(0, 0, UndoRecord{}));
  ASSERT_OK(journal->Sync());
  auto loaded = Journal::Load(path);
  ASSERT_OK(loaded);
  ASSERT_TRUE(loaded->has_value());
  const auto& applied = (*loaded)->fold_applied;
  ASSERT_EQ(applied.size(), 3u);
  EXPECT_EQ(applied[0].position, 0u);
  EXPECT_EQ(applied[0].chunk, 3u);
  EXPECT_TRUE(applied[0].undo.at.empty());
  EXPECT_EQ(applied[1].position, 1u);
  EXPECT_EQ(applied[1].chunk, 3u);
  EXPECT_EQ(applied[1].undo.at, overwrite.at);
  EXPECT_EQ(applied[1].undo.old, overwrite.old);
  EXPECT_EQ(applied[2].chunk, 0u);
  EXPECT_TRUE((*loaded)->applied.empty());
  // A position past the chain is a corrupt journal.
  ASSERT_OK(journal->FoldApplied(2, 0, UndoRecord{}));
  ASSERT_OK(journal->Sync());
  EXPECT_THAT(Journal::Load(path), StatusIs(StatusCode::kDataLoss));
  // A version's journal holds no fold records.
  auto single = Journal::Begin(path, 5, 4, shas[0]);
  ASSERT_OK(single);
  ASSERT_OK(single->FoldApplied(0, 0, UndoRecord{}));
  ASSERT_OK(single->Sync());
  EXPECT_THAT(Journal::Load(path), StatusIs(StatusCode::kDataLoss));
}

// Every fold test runs against the directory store and against an
// S3-compatible store (a moto_server the suite starts on 127.0.0.1).
class FoldTest : public testing::AnyStoreTest {
 protected:
  void SetUp() override {
    if (S3Missing()) GTEST_SKIP() << "moto_server is not on PATH: the S3 fold tests did not run";
    store_ = NewStore("fold");
    ASSERT_NE(store_, nullptr);
    model_.Write(dir_.File("baseline.safetensors"));
    follower_ = model_;
    committed_.push_back(model_);
    trainer_ = model_;
  }

  PublisherOptions MakePublisher(uint64_t chunk_bytes = 64 * 1024, bool allow_xor = true) {
    PublisherOptions o;
    o.members = {"f"};
    o.auth = Key();
    o.poll_ms = PollMs();
    // Only aborted versions wait for all of it.
    o.vote_timeout_ms = GetParam() == "s3" ? 4000 : 1500;
    o.diff.chunk_bytes = chunk_bytes;
    o.diff.allow_xor = allow_xor;
    return o;
  }
  void OpenPublisher(PublisherOptions o) {
    pub_.reset();
    auto p = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), std::move(o));
    ASSERT_OK(p);
    pub_ = std::move(*p);
    ReceiverOptions f = Base("f");
    f.tensors = follower_.MutableViews();
    auto r = Receiver::Open(store_.get(), f);
    ASSERT_OK(r);
    follower_rcv_ = std::move(*r);
  }
  ReceiverOptions Base(const std::string& name) {
    std::filesystem::create_directories(dir_.File(name));
    ReceiverOptions o;
    o.member = name;
    o.state_dir = dir_.File(name);
    o.auth = Key();
    o.poll_ms = PollMs();
    o.decision_timeout_ms = 20000;
    o.resend_timeout_ms = 20000;
    o.threads = 2;
    return o;
  }
  // A receiver that is not a member, on a checkpoint at version 0.
  ReceiverOptions Lagging(const std::string& name, int max_fold) {
    ReceiverOptions o = Base(name);
    o.checkpoint = dir_.File(name + "/model.safetensors");
    model_.Write(o.checkpoint);
    o.max_fold_versions = max_fold;
    return o;
  }

  // Publishes the next version at `rate`; the member follows it (and the
  // version commits) unless `abort`, when it stays silent.
  uint64_t Publish(double rate, bool abort = false) {
    const uint64_t v = ++version_;
    if (by_one_) {
      trainer_.StepByOne(rng_, rate);
    } else {
      trainer_.Step(rng_, rate);
    }
    std::thread t;
    if (!abort) t = std::thread([&] { EXPECT_OK(follower_rcv_->SyncTo(v, 20000)); });
    auto report = pub_->Publish(v, trainer_.Views());
    if (t.joinable()) t.join();
    EXPECT_OK(report);
    if (report.ok()) {
      EXPECT_EQ(report->committed, !abort) << report->reason;
      for (const auto& [kind, n] : report->diff.chunks_by_kind) kinds_[kind] += n;
      if (report->committed) chunks_[v] = report->diff.chunks;
    }
    if (abort) {
      trainer_ = committed_.back();  // the next version starts from the baseline
    } else {
      committed_.push_back(trainer_);
      committed_version_.push_back(v);
    }
    return v;
  }
  // The model at committed version v.
  const Model& At(uint64_t v) const {
    for (size_t i = 0; i < committed_version_.size(); ++i) {
      if (committed_version_[i] == v) return committed_[i + 1];
    }
    return committed_.front();
  }
  Sha256 AnnouncementSha(uint64_t v) {
    auto bytes = store_->Get(IndexKey(v));
    EXPECT_OK(bytes);
    return bytes.ok() ? ComputeSha256(*bytes) : Sha256{};
  }
  // Journals a fold of `versions` onto version 0 in `state_dir`, as a
  // receiver killed inside that fold leaves it.
  void JournalFold(const std::string& state_dir, const std::vector<uint64_t>& versions) {
    std::vector<Sha256> shas;
    for (uint64_t v : versions) shas.push_back(AnnouncementSha(v));
    ASSERT_OK(Journal::BeginFold(state_dir + "/journal", 0, versions, shas).status());
  }
  // Tears a range as a crash inside a chunk would: the first 5 bytes of
  // `d` from `from` on that differ from `toward` take its values.
  static void Tear(std::span<uint8_t> d, const std::vector<uint8_t>& toward, size_t from = 0) {
    size_t copied = 0;
    for (size_t i = from; i < d.size() && copied < 5; ++i) {
      if (d[i] != toward[i]) {
        d[i] = toward[i];
        ++copied;
      }
    }
    ASSERT_GT(copied, 0u);
  }


  std::unique_ptr<ObjectStore> store_;
  Model model_{11};
  Model follower_{11};
  Model trainer_{11};
  std::vector<Model> committed_;
  std::vector<uint64_t> committed_version_;
  std::map<uint64_t, uint64_t> chunks_;  // chunks of each committed version
  std::map<std::string, uint64_t> kinds_;
  std::unique_ptr<Publisher> pub_;
  std::unique_ptr<Receiver> follower_rcv_;
  std::mt19937_64 rng_{12};
  uint64_t version_ = 0;
  bool by_one_ = false;  // steps by one unit (Model::StepByOne)
};

TEST_P(FoldTest, FoldsTwoToSixVersionsBitExact) {
  OpenPublisher(MakePublisher());
  for (int i = 0; i < 6; ++i) Publish(i == 2 ? 0.4 : 0.02);
  EXPECT_GT(kinds_["dense-xor"], 0u);
  EXPECT_GT(kinds_["sparse-xor"], 0u);
  for (int k = 2; k <= 6; ++k) {
    const std::string name = "k" + std::to_string(k);
    auto opts = Lagging(name, k);
    auto r = Receiver::Open(store_.get(), opts);
    ASSERT_OK(r);
    auto s = (*r)->Step();
    ASSERT_OK(s);
    EXPECT_EQ(s->outcome, StepResult::Outcome::kCaughtUp);
    EXPECT_EQ(s->version, static_cast<uint64_t>(k));
    EXPECT_EQ(s->versions_folded, static_cast<uint64_t>(k));
    uint64_t chunks = 0;
    for (uint64_t v = 1; v <= static_cast<uint64_t>(k); ++v) chunks += chunks_[v];
    // Every chunk of every version applied once, in one step.
    EXPECT_EQ(s->chunks_applied, chunks);
    EXPECT_EQ(s->chunks_skipped, 0u);
    EXPECT_EQ(s->changed_tensors, model_.names);
    EXPECT_EQ((*r)->active_version(), static_cast<uint64_t>(k));
    EXPECT_TRUE(At(static_cast<uint64_t>(k)).Matches(opts.checkpoint)) << k;
    EXPECT_FALSE(PathExists(opts.state_dir + "/journal"));
    // The rest of the way in one more fold (or one version).
    uint64_t folded = 0;
    while ((*r)->active_version() < 6) {
      auto rest = (*r)->Step();
      ASSERT_OK(rest);
      EXPECT_LE(rest->versions_folded, static_cast<uint64_t>(k));
      folded += rest->versions_folded;
    }
    EXPECT_EQ(folded, 6u - static_cast<uint64_t>(k));
    EXPECT_TRUE(At(6).Matches(opts.checkpoint)) << k;
  }
  // Folding off: one version per step, the same bits and the same chunks.
  auto opts = Lagging("one", 1);
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  uint64_t chunks = 0;
  for (uint64_t v = 1; v <= 6; ++v) {
    auto s = (*r)->Step();
    ASSERT_OK(s);
    EXPECT_EQ(s->versions_folded, 1u);
    EXPECT_EQ(s->version, v);
    chunks += s->chunks_applied;
  }
  EXPECT_EQ(chunks, chunks_[1] + chunks_[2] + chunks_[3] + chunks_[4] + chunks_[5] + chunks_[6]);
  EXPECT_TRUE(At(6).Matches(opts.checkpoint));
}

TEST_P(FoldTest, AbortedVersionsArePassedOver) {
  OpenPublisher(MakePublisher());
  Publish(0.02);
  Publish(0.02, /*abort=*/true);
  Publish(0.02);
  Publish(0.02, /*abort=*/true);
  const uint64_t last = Publish(0.02);
  ASSERT_EQ(last, 5u);
  auto opts = Lagging("lag", 16);
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  ASSERT_OK(s);
  EXPECT_EQ(s->outcome, StepResult::Outcome::kCaughtUp);
  EXPECT_EQ(s->version, 5u);
  EXPECT_EQ(s->versions_folded, 3u);  // 1, 3, 5
  EXPECT_EQ(s->chunks_applied, chunks_[1] + chunks_[3] + chunks_[5]);
  EXPECT_TRUE(At(5).Matches(opts.checkpoint));
  auto idle = (*r)->Step();
  ASSERT_OK(idle);
  EXPECT_EQ(idle->outcome, StepResult::Outcome::kIdle);
}

TEST_P(FoldTest, FoldsStopAtTheTarget) {
  OpenPublisher(MakePublisher());
  for (int i = 0; i < 5; ++i) Publish(0.02);
  auto opts = Lagging("lag", 16);
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  // SyncTo(3) folds 1..3 and stops there although 4 and 5 are committed.
  auto s = (*r)->SyncTo(3, 20000);
  ASSERT_OK(s);
  EXPECT_EQ(s->versions_folded, 3u);
  EXPECT_EQ((*r)->active_version(), 3u);
  EXPECT_TRUE(At(3).Matches(opts.checkpoint));
  // A step limited below the next version still applies that one version.
  s = (*r)->Step(/*fold_limit=*/3);
  ASSERT_OK(s);
  EXPECT_EQ(s->version, 4u);
  EXPECT_EQ(s->versions_folded, 1u);
  s = (*r)->Step();
  ASSERT_OK(s);
  EXPECT_EQ(s->version, 5u);
  EXPECT_TRUE(At(5).Matches(opts.checkpoint));
}

TEST_P(FoldTest, ChangedChunkSizeFallsBackToOneVersionAtATime) {
  OpenPublisher(MakePublisher(64 * 1024));
  Publish(0.02);
  Publish(0.02);
  OpenPublisher(MakePublisher(128 * 1024));  // a restarted publisher, new grid
  Publish(0.02);
  Publish(0.02);
  auto opts = Lagging("lag", 16);
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  // 1..4 and 2..4 straddle the change: one version each. 3..4 fold.
  std::vector<uint64_t> folded;
  while ((*r)->active_version() < 4) {
    auto s = (*r)->Step();
    ASSERT_OK(s);
    ASSERT_EQ(s->outcome, StepResult::Outcome::kCaughtUp);
    folded.push_back(s->versions_folded);
    EXPECT_TRUE(At(s->version).Matches(opts.checkpoint)) << s->version;
  }
  EXPECT_EQ(folded, (std::vector<uint64_t>{1, 1, 2}));
  // With the cap at two, 1..2 fold on the old grid.
  auto capped = Lagging("capped", 2);
  auto c = Receiver::Open(store_.get(), capped);
  ASSERT_OK(c);
  auto s = (*c)->Step();
  ASSERT_OK(s);
  EXPECT_EQ(s->versions_folded, 2u);
  EXPECT_TRUE(At(2).Matches(capped.checkpoint));
}

TEST_P(FoldTest, OverwriteChunksFold) {
  OpenPublisher(MakePublisher(64 * 1024, /*allow_xor=*/false));
  Publish(0.02);
  Publish(1.0);  // every element: raw chunks
  Publish(0.02);
  Publish(0.03);
  EXPECT_GT(kinds_["raw"], 0u);
  EXPECT_GT(kinds_["sparse-overwrite"], 0u);
  auto opts = Lagging("lag", 16);
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  ASSERT_OK(s);
  EXPECT_EQ(s->versions_folded, 4u);
  EXPECT_EQ(s->chunks_applied, chunks_[1] + chunks_[2] + chunks_[3] + chunks_[4]);
  EXPECT_TRUE(At(4).Matches(opts.checkpoint));
}

// Conditional XOR chunks (kind 5) fold: a cell's chunks apply in version
// order, each one decoded against the range as the version before left it.
TEST_P(FoldTest, ConditionalChunksFold) {
  auto popts = MakePublisher();
  popts.diff.allow_conditional = true;
  OpenPublisher(popts);
  by_one_ = true;
  for (int i = 0; i < 4; ++i) Publish(0.03);
  Publish(0.03, /*abort=*/true);
  Publish(0.02);
  EXPECT_GT(kinds_["conditional-xor"], 0u);
  auto opts = Lagging("lag", 16);
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  ASSERT_OK(s);
  EXPECT_EQ(s->versions_folded, 5u);
  EXPECT_EQ(s->version, 6u);
  EXPECT_TRUE(At(6).Matches(opts.checkpoint));
  Model memory = model_;
  ReceiverOptions o = Base("mem");
  o.tensors = memory.MutableViews();
  auto m = Receiver::Open(store_.get(), o);
  ASSERT_OK(m);
  auto ms = (*m)->Step();
  ASSERT_OK(ms);
  EXPECT_EQ(ms->versions_folded, 5u);
  EXPECT_EQ(memory.data, At(6).data);
}

TEST_P(FoldTest, InMemoryReceiverFolds) {
  OpenPublisher(MakePublisher());
  for (int i = 0; i < 4; ++i) Publish(0.03);
  Model memory = model_;
  ReceiverOptions o = Base("mem");
  o.tensors = memory.MutableViews();
  auto r = Receiver::Open(store_.get(), o);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  ASSERT_OK(s);
  EXPECT_EQ(s->versions_folded, 4u);
  EXPECT_EQ(s->version, 4u);
  EXPECT_EQ(memory.data, At(4).data);
}

// A chunk of an intermediate version that fails its checks (here changed
// in the store, found after earlier ranges were applied) stops the fold:
// what the fold wrote is undone from its journal, so the checkpoint is
// exactly the active version again, the journal is gone, and a re-send of
// the chunk is requested. The next step checks that chunk before writing
// anything; once the store holds the right object, the fold completes
// bit-exact.
TEST_P(FoldTest, TamperedIntermediateChunkRollsTheFoldBackAndTheFoldCompletesOnceRestored) {
  OpenPublisher(MakePublisher());
  for (int i = 0; i < 3; ++i) Publish(0.02);
  auto listed = store_->List(VersionPrefix(2) + "chunk/");
  ASSERT_OK(listed);
  ASSERT_GE(listed->size(), 2u);
  const std::string key = listed->back().key;  // the last range's chunk
  const uint64_t index = listed->size() - 1;
  ASSERT_EQ(key, ChunkKey(2, index));
  auto original = store_->Get(key);
  ASSERT_OK(original);
  auto bad = *original;
  bad[bad.size() / 2] ^= 0x10;
  ASSERT_OK(store_->Put(key, bad));

  auto opts = Lagging("lag", 16);
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(s.status().message().find("rolled back to version 0"), std::string::npos)
      << s.status().ToString();
  EXPECT_EQ((*r)->active_version(), 0u);
  const uint64_t applied = (*r)->chunks_applied_total();
  EXPECT_GT(applied, 0u);  // earlier ranges were applied, then undone
  EXPECT_TRUE(At(0).Matches(opts.checkpoint));
  EXPECT_FALSE(PathExists(opts.state_dir + "/journal"));
  auto request = store_->Get(RequestKey(2, "lag"));
  ASSERT_OK(request);
  auto body = Key().OpenMember(*request);
  ASSERT_OK(body);
  auto q = DecodeRequest(*body);
  ASSERT_OK(q);
  EXPECT_EQ(q->chunks, (std::vector<uint64_t>{index}));
  EXPECT_EQ(q->after, (std::vector<bool>{true}));

  // Another version's valid chunk in its place is refused too, before
  // anything is written.
  ASSERT_OK(store_->Put(key, *store_->Get(listed->front().key)));
  s = (*r)->Step();
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(s.status().message().find("was written"), std::string::npos)
      << s.status().ToString();
  EXPECT_EQ((*r)->chunks_applied_total(), applied);
  EXPECT_TRUE(At(0).Matches(opts.checkpoint));

  // An in-memory receiver is rolled back the same way.
  Model memory = model_;
  ReceiverOptions m = Base("mem");
  m.tensors = memory.MutableViews();
  auto rm = Receiver::Open(store_.get(), m);
  ASSERT_OK(rm);
  auto sm = (*rm)->Step();
  EXPECT_THAT(sm, StatusIs(StatusCode::kDataLoss));
  EXPECT_GT((*rm)->chunks_applied_total(), 0u);
  EXPECT_EQ(memory.data, model_.data);
  EXPECT_EQ((*rm)->active_version(), 0u);

  ASSERT_OK(store_->Put(key, *original));
  s = (*r)->Step();
  ASSERT_OK(s);
  EXPECT_EQ(s->outcome, StepResult::Outcome::kCaughtUp);
  EXPECT_EQ(s->versions_folded, 3u);
  EXPECT_EQ(s->chunks_skipped, 0u);  // the fold starts over from version 0
  EXPECT_EQ(s->chunks_applied, chunks_[1] + chunks_[2] + chunks_[3]);
  EXPECT_TRUE(At(3).Matches(opts.checkpoint));
  EXPECT_EQ((*r)->active_version(), 3u);
  EXPECT_FALSE(PathExists(opts.state_dir + "/journal"));
}

// Hands back one object damaged (a byte flipped) on every read, as a
// faulty link would, while the stored object stays intact.
class DamagedReads final : public ObjectStore {
 public:
  DamagedReads(ObjectStore* inner, std::string key) : inner_(inner), key_(std::move(key)) {}
  std::string Describe() const override { return "damaged(" + inner_->Describe() + ")"; }
  Status Put(std::string_view k, std::span<const uint8_t> d) override { return inner_->Put(k, d); }
  Status PutIfAbsent(std::string_view k, std::span<const uint8_t> d) override {
    return inner_->PutIfAbsent(k, d);
  }
  Result<std::vector<ObjectInfo>> List(std::string_view p) override { return inner_->List(p); }
  Status Delete(std::string_view k) override { return inner_->Delete(k); }
  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    REFIT_ASSIGN_OR_RETURN(auto bytes, inner_->Get(key));
    if (key == key_) bytes[bytes.size() / 2] ^= 0x10;
    return bytes;
  }

 private:
  ObjectStore* inner_;
  std::string key_;
};

// A chunk of the last version that arrives damaged every time stops the
// fold as a damaged object does. The publisher, whose baseline holds that
// version (the head), serves the requested re-send from the intact stored
// chunk, and the next step applies the re-send in the chunk's place: the
// fold completes bit-exact.
TEST_P(FoldTest, ChunkDamagedOnTheWayIsReplacedByItsResend) {
  OpenPublisher(MakePublisher());
  for (int i = 0; i < 3; ++i) Publish(0.02);
  auto listed = store_->List(VersionPrefix(3) + "chunk/");
  ASSERT_OK(listed);
  ASSERT_GE(listed->size(), 2u);
  DamagedReads damaged(store_.get(), listed->at(listed->size() / 2).key);
  auto opts = Lagging("lag", 16);
  auto r = Receiver::Open(&damaged, opts);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ((*r)->active_version(), 0u);
  EXPECT_GT((*r)->chunks_applied_total(), 0u);
  EXPECT_TRUE(At(0).Matches(opts.checkpoint));

  ASSERT_OK(pub_->Serve(3, 1));
  s = (*r)->Step();
  ASSERT_OK(s);
  EXPECT_EQ(s->outcome, StepResult::Outcome::kCaughtUp);
  EXPECT_EQ(s->version, 3u);
  EXPECT_EQ(s->versions_folded, 3u);
  EXPECT_EQ(s->chunks_resent, 1u);
  EXPECT_EQ(s->chunks_applied + s->chunks_resent, chunks_[1] + chunks_[2] + chunks_[3]);
  EXPECT_TRUE(At(3).Matches(opts.checkpoint));
  EXPECT_EQ((*r)->active_version(), 3u);
}

// With snapshots in the store, a fold stopped by a chunk that fails its
// checks is rolled back and then ends in the newest snapshot, instead of
// failing on every step.
TEST_P(FoldTest, TamperedChunkOfAFoldIsResyncedFromASnapshot) {
  auto popts = MakePublisher();
  popts.snapshot_every = 2;
  OpenPublisher(popts);
  for (int i = 0; i < 4; ++i) Publish(0.02);
  auto listed = store_->List(VersionPrefix(3) + "chunk/");
  ASSERT_OK(listed);
  ASSERT_GE(listed->size(), 2u);
  const std::string key = listed->back().key;
  auto bad = store_->Get(key);
  ASSERT_OK(bad);
  (*bad)[bad->size() / 2] ^= 0x10;
  ASSERT_OK(store_->Put(key, *bad));
  auto opts = Lagging("lag", 16);
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  ASSERT_OK(s);
  EXPECT_EQ(s->outcome, StepResult::Outcome::kSnapshot);
  EXPECT_EQ(s->version, 4u);
  EXPECT_NE(s->recovered.find("rolled back to version 0"), std::string::npos) << s->recovered;
  EXPECT_EQ((*r)->active_version(), 4u);
  EXPECT_TRUE(At(4).Matches(opts.checkpoint));
  EXPECT_FALSE(PathExists(opts.state_dir + "/journal"));
}

// A receiver killed inside a fold: the journal names the fold; one range
// is already at the last version, one at an intermediate version, one torn
// inside a chunk. The restarted receiver finishes the same fold: skips the
// first, applies the rest of the second's chunks, and rebuilds the torn
// one from overwrite re-sends of its chunks, which the publisher serves.
TEST_P(FoldTest, CrashedFoldResumesAndRepairsATornRange) {
  OpenPublisher(MakePublisher());
  for (int i = 0; i < 4; ++i) Publish(0.02);
  auto opts = Lagging("lag", 16);
  {
    auto ck = Checkpoint::Open(opts.checkpoint, Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    auto d = ck->MutableData(*ck->IndexOf("a.weight"));
    const size_t cell = 64 * 1024;  // bytes of a range (the chunk size)
    ASSERT_GT(d.size(), 2 * cell);
    const auto& v4 = At(4).data[0];
    const auto& v2 = At(2).data[0];
    const auto& v3 = At(3).data[0];
    std::copy(v4.begin(), v4.begin() + cell, d.begin());                   // done
    std::copy(v2.begin() + cell, v2.begin() + 2 * cell, d.begin() + cell);  // at 2
    std::copy(v2.begin() + 2 * cell, v2.end(), d.begin() + 2 * cell);       // torn 2..3
    ASSERT_NO_FATAL_FAILURE(Tear(d, v3, 2 * cell));
    ASSERT_OK(ck->Sync());
  }
  ASSERT_NO_FATAL_FAILURE(JournalFold(opts.state_dir, {1, 2, 3, 4}));
  std::atomic<bool> done{false};
  std::thread serve([&] {
    while (!done) {
      for (uint64_t v = 1; v <= 4; ++v) ASSERT_OK(pub_->Serve(v, 5));
    }
  });
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  done = true;
  serve.join();
  ASSERT_OK(s);
  EXPECT_EQ(s->outcome, StepResult::Outcome::kCaughtUp);
  EXPECT_EQ(s->version, 4u);
  EXPECT_EQ(s->versions_folded, 4u);
  EXPECT_EQ(s->chunks_resent, 4u);    // the torn range: one re-send per version
  EXPECT_GE(s->chunks_skipped, 6u);   // 4 of the done range, 2 of the one at 2
  EXPECT_EQ(s->chunks_applied + s->chunks_skipped + s->chunks_resent,
            chunks_[1] + chunks_[2] + chunks_[3] + chunks_[4]);
  EXPECT_TRUE(At(4).Matches(opts.checkpoint));
  EXPECT_EQ((*r)->active_version(), 4u);
  EXPECT_FALSE(PathExists(opts.state_dir + "/journal"));
}

// Re-sends come from the publisher's baseline, which holds head: a torn
// range of a fold that ends below head (here 1..2 of 4, capped) cannot be
// rebuilt when later versions changed it. The step says so (DATA_LOSS)
// and writes nothing into the range.
TEST_P(FoldTest, TornRangeOfAFoldBelowHeadIsRefused) {
  OpenPublisher(MakePublisher());
  for (int i = 0; i < 4; ++i) Publish(0.02);
  auto opts = Lagging("lag", 2);
  std::vector<uint8_t> torn;
  {
    auto ck = Checkpoint::Open(opts.checkpoint, Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    auto d = ck->MutableData(*ck->IndexOf("b.weight"));
    ASSERT_NO_FATAL_FAILURE(Tear(d, At(1).data[1]));
    torn.assign(d.begin(), d.end());
    ASSERT_OK(ck->Sync());
  }
  ASSERT_NO_FATAL_FAILURE(JournalFold(opts.state_dir, {1, 2}));
  std::atomic<bool> done{false};
  std::thread serve([&] {
    while (!done) {
      for (uint64_t v = 1; v <= 2; ++v) ASSERT_OK(pub_->Serve(v, 5));
    }
  });
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  done = true;
  serve.join();
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(s.status().message().find("snapshot"), std::string::npos) << s.status().ToString();
  EXPECT_EQ((*r)->active_version(), 0u);
  auto ck = Checkpoint::Open(opts.checkpoint, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  auto d = ck->Data(*ck->IndexOf("b.weight"));
  // The first range of b.weight (the torn one) is as it was.
  const size_t cell = 64 * 1024;
  EXPECT_TRUE(std::equal(d.begin(), d.begin() + cell, torn.begin()));
}

// A torn range that nobody re-sends (no publisher serves those versions)
// ends the catch-up in a snapshot when the store keeps them: the receiver
// resyncs instead of failing on every step.
TEST_P(FoldTest, TornRangeNobodyResendsIsResyncedFromASnapshot) {
  auto popts = MakePublisher();
  popts.snapshot_every = 2;
  OpenPublisher(popts);
  for (int i = 0; i < 4; ++i) Publish(0.02);
  auto opts = Lagging("lag", 2);
  opts.resend_timeout_ms = 300;
  {
    // b.weight's first range: some elements at version 1, the rest at 0.
    auto ck = Checkpoint::Open(opts.checkpoint, Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    auto d = ck->MutableData(*ck->IndexOf("b.weight"));
    ASSERT_NO_FATAL_FAILURE(Tear(d, At(1).data[1]));
    ASSERT_OK(ck->Sync());
  }
  ASSERT_NO_FATAL_FAILURE(JournalFold(opts.state_dir, {1, 2}));
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  ASSERT_OK(s);
  EXPECT_EQ(s->outcome, StepResult::Outcome::kSnapshot);
  EXPECT_EQ(s->version, 4u);
  EXPECT_NE(s->recovered.find("re-send"), std::string::npos) << s->recovered;
  EXPECT_EQ((*r)->active_version(), 4u);
  EXPECT_TRUE(At(4).Matches(opts.checkpoint));
  EXPECT_FALSE(PathExists(opts.state_dir + "/journal"));
  auto idle = (*r)->Step();
  ASSERT_OK(idle);
  EXPECT_EQ(idle->outcome, StepResult::Outcome::kIdle);

  // An in-memory receiver cannot take a snapshot: the failure stands.
  Model memory = model_;
  ReceiverOptions m = Base("mem");
  m.resend_timeout_ms = 300;
  m.tensors = memory.MutableViews();
  ASSERT_NO_FATAL_FAILURE(Tear(memory.data[1], At(1).data[1]));
  ASSERT_NO_FATAL_FAILURE(JournalFold(m.state_dir, {1, 2}));
  auto rm = Receiver::Open(store_.get(), m);
  ASSERT_OK(rm);
  auto sm = (*rm)->Step();
  EXPECT_THAT(sm, StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_EQ((*rm)->active_version(), 0u);
}

TEST_P(FoldTest, ChangedLocalModelIsRefusedBeforeAnythingIsWritten) {
  OpenPublisher(MakePublisher());
  for (int i = 0; i < 3; ++i) Publish(0.02);
  auto opts = Lagging("lag", 16);
  Model changed = model_;
  changed.data[1][10] ^= 1;
  changed.Write(opts.checkpoint);
  auto r = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r);
  auto s = (*r)->Step();
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ((*r)->active_version(), 0u);
  // Tensors before the changed one were applied; the changed one was not
  // written.
  auto ck = Checkpoint::Open(opts.checkpoint, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  auto d = ck->Data(*ck->IndexOf("b.weight"));
  EXPECT_TRUE(std::equal(d.begin(), d.end(), changed.data[1].begin(), changed.data[1].end()));
}

INSTANTIATE_TEST_SUITE_P(Stores, FoldTest, ::testing::Values("dir", "s3"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace refit
