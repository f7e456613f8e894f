// Protocol tests on the directory store: authentication, object codecs,
// journal, and publisher + receivers end to end (threads), including
// deadlines, drops, torn chunks and tampering. Process-kill tests live in
// tests/sync_crash_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "base/bytes.h"
#include "base/file.h"
#include "base/hash.h"
#include "format/safetensors.h"
#include "refit/checkpoint.h"
#include "support/moto_testing.h"
#include "support/status_matchers.h"
#include "support/store_test_fixture.h"
#include "support/test_model.h"
#include "support/testing.h"
#include "sync/auth.h"
#include "sync/chunk_pack.h"
#include "sync/journal.h"
#include "sync/protocol.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "transport/memory_store.h"
#include "transport/object_store.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using testing::TempDir;

Authenticator Key() {
  return *Authenticator::Hmac(std::vector<uint8_t>(32, 7));
}

// Steps `r` on a thread until a step does something (or fails), at most
// `tries` times 2 ms apart; the result lands in `*out`. Join before reading.
std::thread StepUntilBusy(Receiver* r, Result<StepResult>* out, int tries) {
  return std::thread([r, out, tries] {
    for (int i = 0; i < tries; ++i) {
      *out = r->Step();
      if (!out->ok() || (*out)->outcome != StepResult::Outcome::kIdle) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
}

TEST(AuthTest, SealOpenAndTamper) {
  Authenticator a = Key();
  std::vector<uint8_t> body = {1, 2, 3, 4};
  auto env = a.Seal(body);
  auto opened = a.Open(env);
  ASSERT_OK(opened);
  EXPECT_EQ(std::vector<uint8_t>(opened->begin(), opened->end()), body);
  for (size_t i = 0; i < env.size(); ++i) {
    auto bad = env;
    bad[i] ^= 0x20;
    EXPECT_FALSE(a.Open(bad).ok()) << i;
  }
  auto other = *Authenticator::Hmac(std::vector<uint8_t>(32, 8));
  EXPECT_THAT(other.Open(env), StatusIs(StatusCode::kUnauthenticated));
  EXPECT_THAT(Authenticator::None().Open(env),
              StatusIs(StatusCode::kUnauthenticated));
  EXPECT_THAT(a.Open(Authenticator::None().Seal(body)),
              StatusIs(StatusCode::kUnauthenticated));
  EXPECT_FALSE(Authenticator::Hmac({1, 2}).ok());
}

TEST(AuthTest, Ed25519SignaturesTamperingAndWrongKeys) {
  auto pair = Authenticator::GenerateEd25519();
  ASSERT_OK(pair);
  auto other = Authenticator::GenerateEd25519();
  ASSERT_OK(other);
  auto signer = Key().WithSigningKey(pair->first);
  ASSERT_OK(signer);
  auto verifier = Key().WithVerifyKey(pair->second);
  ASSERT_OK(verifier);
  std::vector<uint8_t> body = {5, 6, 7, 8, 9};
  auto env = signer->Seal(body);
  EXPECT_EQ(env[4], 2);  // scheme 2
  auto opened = verifier->Open(env);
  ASSERT_OK(opened);
  EXPECT_EQ(std::vector<uint8_t>(opened->begin(), opened->end()), body);
  ASSERT_OK(signer->Open(env));  // the publisher reads its own objects
  // Any changed byte, in body or signature, is refused.
  for (size_t i = 0; i < env.size(); ++i) {
    auto bad = env;
    bad[i] ^= 0x20;
    EXPECT_FALSE(verifier->Open(bad).ok()) << i;
  }
  // Another publisher's key, and nodes without a verify key.
  auto wrong = Key().WithVerifyKey(other->second);
  ASSERT_OK(wrong);
  EXPECT_THAT(wrong->Open(env), StatusIs(StatusCode::kUnauthenticated));
  EXPECT_THAT(Key().Open(env), StatusIs(StatusCode::kUnauthenticated));
  EXPECT_THAT(Authenticator::None().Open(env),
              StatusIs(StatusCode::kUnauthenticated));
  // A holder of the shared key (any member) cannot pass off a publisher
  // object: a verifier takes only signed ones.
  EXPECT_THAT(verifier->Open(Key().Seal(body)),
              StatusIs(StatusCode::kUnauthenticated));
  EXPECT_THAT(verifier->Open(Authenticator::None().Seal(body)),
              StatusIs(StatusCode::kUnauthenticated));
  // Member objects (votes, requests) use the shared key, never a signature.
  auto vote = verifier->SealMember(body);
  EXPECT_EQ(vote[4], 1);
  ASSERT_OK(signer->OpenMember(vote));
  EXPECT_EQ(signer->SealMember(body)[4], 1);
  EXPECT_THAT(signer->OpenMember(env), StatusIs(StatusCode::kUnauthenticated));
  // Without a shared key, member objects carry no tag.
  auto bare = Authenticator::None().WithVerifyKey(pair->second);
  ASSERT_OK(bare);
  EXPECT_EQ(bare->SealMember(body)[4], 0);
  EXPECT_FALSE(bare->Open(bare->SealMember(body)).ok());
  // Key sizes.
  EXPECT_FALSE(Key().WithSigningKey(std::vector<uint8_t>(31, 1)).ok());
  EXPECT_FALSE(Key().WithVerifyKey(std::vector<uint8_t>(33, 1)).ok());
}

TEST(AuthTest, Ed25519KeyFiles) {
  TempDir dir;
  const std::string priv = dir.File("sign.pem"), pub = dir.File("verify.pem");
  ASSERT_OK(Authenticator::WriteEd25519KeyFiles(priv, pub));
  EXPECT_EQ(std::filesystem::status(priv).permissions() & std::filesystem::perms::others_read,
            std::filesystem::perms::none);
  // Never overwrites a key.
  EXPECT_THAT(Authenticator::WriteEd25519KeyFiles(priv, dir.File("x.pem")),
              StatusIs(StatusCode::kFailedPrecondition));
  auto signer = Authenticator::None().WithSigningKeyFile(priv);
  ASSERT_OK(signer);
  auto verifier = Authenticator::None().WithVerifyKeyFile(pub);
  ASSERT_OK(verifier);
  std::vector<uint8_t> body = {1, 2, 3};
  ASSERT_OK(verifier->Open(signer->Seal(body)));
  // The public key is not a private key, and an HMAC key file is neither.
  EXPECT_THAT(Authenticator::None().WithSigningKeyFile(pub),
              StatusIs(StatusCode::kInvalidArgument));
  testing::WriteBytes(dir.File("hmac.key"), std::vector<uint8_t>(40, 'k'));
  auto refused = Authenticator::None().WithVerifyKeyFile(dir.File("hmac.key"));
  EXPECT_THAT(refused, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(refused.status().message().find("hmac.key"), std::string::npos);
}

TEST(ProtocolTest, ObjectsRoundTripAndRejectGarbage) {
  Manifest m;
  m.version = 5;
  m.base_version = 3;
  m.members = {"r0", "r1"};
  TensorEntry e;
  e.name = "w";
  e.dtype = "BF16";
  e.width = 2;
  e.shape = {4, 8};
  e.num_elements = 32;
  m.tensors = {e};
  ManifestChunk c;
  c.size = 100;
  c.tensor_id = 0;
  c.count = 32;
  c.changed = 3;
  c.kind = 1;
  m.chunks = {c};
  auto bytes = EncodeManifest(m);
  auto back = DecodeManifest(bytes);
  ASSERT_OK(back);
  EXPECT_EQ(back->members, m.members);
  EXPECT_EQ(back->chunks[0].changed, 3u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeManifest(std::span<const uint8_t>(bytes.data(), n)).ok()) << n;
  }
  Decision d{5, true, {"r9"}, "dropped", {}};
  auto dd = DecodeDecision(EncodeDecision(d));
  ASSERT_OK(dd);
  EXPECT_TRUE(dd->commit);
  EXPECT_EQ(dd->dropped, d.dropped);
  auto v = DecodeVote(EncodeVote(Vote{false, "disk full", {}}));
  ASSERT_OK(v);
  EXPECT_FALSE(v->ready);
  EXPECT_EQ(v->message, "disk full");
  EXPECT_FALSE(ValidateMember("../x").ok());
  EXPECT_EQ(ChunkKey(7, 3), "v/00000000000000000007/chunk/00000003");
}

// Versions published by several ranks (docs/protocol.md, "Versions from
// many ranks"): a manifest of format 2 lists strided regions and the ranks'
// part objects, votes and commit decisions carry tensor hashes; objects
// without them keep format 1, byte for byte as before.
TEST(ProtocolTest, DirectVersionObjectsRoundTrip) {
  Manifest m;
  m.version = 5;
  m.base_version = 3;
  m.members = {"r0"};
  TensorEntry e;
  e.name = "w";
  e.dtype = "BF16";
  e.width = 2;
  e.shape = {4, 8};
  e.num_elements = 32;
  m.tensors = {e};
  ManifestChunk c;
  c.size = 100;
  c.count = 32;
  c.changed = 3;
  c.kind = 1;
  m.chunks = {c};
  const auto v1 = EncodeManifest(m);
  EXPECT_EQ(std::string(v1.begin(), v1.begin() + 8), "RFMANIF1");
  EXPECT_EQ(ManifestChunkKey(m, 0), ChunkKey(5, 0));
  m.direct = true;
  c.start = 2;
  c.count = 12;  // rows 0..3, columns 2..4 of the 4 x 8 matrix
  c.run = 3;
  c.stride = 8;
  c.in_part = true;
  c.rank = 7;
  c.part_index = 9;
  m.chunks = {c};
  const auto v2 = EncodeManifest(m);
  EXPECT_EQ(std::string(v2.begin(), v2.begin() + 8), "RFMANIF2");
  auto back = DecodeManifest(v2);
  ASSERT_OK(back);
  EXPECT_TRUE(back->direct);
  ASSERT_EQ(back->chunks.size(), 1u);
  EXPECT_EQ(back->chunks[0].run, 3u);
  EXPECT_EQ(back->chunks[0].stride, 8u);
  EXPECT_TRUE(back->chunks[0].in_part);
  EXPECT_EQ(back->chunks[0].rank, 7u);
  EXPECT_EQ(back->chunks[0].part_index, 9u);
  EXPECT_EQ(ManifestChunkKey(*back, 0), PartChunkKey(5, 7, 9));
  EXPECT_EQ(PartChunkKey(5, 7, 9),
            "parts/00000000000000000005/0000000007/chunk/0000000009");
  for (size_t n = 0; n < v2.size(); ++n) {
    EXPECT_FALSE(DecodeManifest(std::span<const uint8_t>(v2.data(), n)).ok()) << n;
  }
  // A region whose last row ends past its tensor, or not in canonical form.
  for (auto [start, stride] : {std::pair<uint64_t, uint64_t>{6, 8}, {2, 3}}) {
    Manifest bad = m;
    bad.chunks[0].start = start;
    bad.chunks[0].stride = stride;
    EXPECT_THAT(DecodeManifest(EncodeManifest(bad)), StatusIs(StatusCode::kDataLoss))
        << start << " " << stride;
  }
  Vote ready{true, "", {Hash128{1, 2}, Hash128{3, 4}}};
  auto vb = EncodeVote(ready);
  EXPECT_EQ(std::string(vb.begin(), vb.begin() + 4), "RFV2");
  auto v = DecodeVote(vb);
  ASSERT_OK(v);
  EXPECT_TRUE(v->ready);
  EXPECT_EQ(v->tensors, ready.tensors);
  Decision d{5, true, {}, "", {Hash128{5, 6}}};
  auto dd = DecodeDecision(EncodeDecision(d));
  ASSERT_OK(dd);
  EXPECT_EQ(dd->tensors, d.tensors);
  // Only a commit records hashes.
  d.commit = false;
  EXPECT_THAT(DecodeDecision(EncodeDecision(d)), StatusIs(StatusCode::kDataLoss));
}

// A decision's dropped members are member names, as its version's members
// are: a name that would not key a vote is refused like a damaged object.
TEST(ProtocolTest, DecisionRefusesMalformedDroppedNames) {
  for (const char* bad : {"../x", "", "a b", "r0/done", "."}) {
    auto refused = DecodeDecision(EncodeDecision(Decision{5, true, {"r0", bad}, "dropped", {}}));
    EXPECT_THAT(refused, StatusIs(StatusCode::kDataLoss)) << bad;
    EXPECT_NE(refused.status().message().find("malformed member name"), std::string::npos)
        << bad << ": " << refused.status().ToString();
  }
  ASSERT_OK(DecodeDecision(EncodeDecision(Decision{5, true, {"r0", "r-1.x_2"}, "dropped", {}})));
}

TEST(ProtocolTest, AnnouncementRefusesAnAfterHash) {
  Announcement a;
  a.version = 5;
  a.base_version = 3;
  a.members = {"r0"};
  TensorEntry e;
  e.name = "w";
  e.dtype = "F32";
  e.width = 4;
  e.shape = {8};
  e.num_elements = 8;
  e.before = Hash128{1, 2};
  a.tensors = {e};
  auto bytes = EncodeAnnouncement(a);
  ASSERT_OK(DecodeAnnouncement(bytes));
  // The tensor's "after" hash is the 16 bytes before the seal: set one bit
  // and seal the object again, so only that check can refuse it.
  bytes.resize(bytes.size() - 8);
  bytes.back() ^= 1;
  ByteWriter(&bytes).U64(XXH3_64bits(bytes.data(), bytes.size()));
  auto refused = DecodeAnnouncement(bytes);
  EXPECT_THAT(refused, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(refused.status().message().find("after hash"), std::string::npos);
}

TEST(JournalTest, TornTailIsIgnored) {
  TempDir dir;
  std::string path = dir.File("journal");
  Sha256 sha{};
  sha[0] = 9;
  {
    auto j = Journal::Begin(path, 4, 3, sha);
    ASSERT_OK(j);
    UndoRecord undo;
    undo.at = {1, 5};
    undo.old = {1, 2, 3, 4};
    ASSERT_OK(j->Applied(0, {}));
    ASSERT_OK(j->Applied(2, undo));
    ASSERT_OK(j->Voted());
    ASSERT_OK(j->Sync());
  }
  auto bytes = testing::ReadBytes(path);
  auto full = Journal::Load(path);
  ASSERT_OK(full);
  ASSERT_TRUE(full->has_value());
  EXPECT_EQ((*full)->version, 4u);
  EXPECT_TRUE((*full)->voted);
  EXPECT_EQ((*full)->applied.size(), 2u);
  EXPECT_EQ((*full)->applied[2].old, (std::vector<uint8_t>{1, 2, 3, 4}));
  // Any truncation keeps a consistent prefix of the records.
  for (size_t n = 0; n < bytes.size(); ++n) {
    testing::WriteBytes(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(n)));
    auto part = Journal::Load(path);
    ASSERT_OK(part);
    if (part->has_value()) {
      EXPECT_LE((*part)->applied.size(), 2u);
    }
  }
}

// A small model: a few BF16 tensors in one safetensors file.
using Model = testing::TestModel;

// Every protocol test runs against the directory store and against an
// S3-compatible store (a moto_server the suite starts on 127.0.0.1).
class SyncTest : public testing::AnyStoreTest {
 protected:
  void SetUp() override {
    if (S3Missing()) {
      GTEST_SKIP() << "moto_server is not on PATH: the S3 protocol tests did not run";
    }
    store_ = NewStore();
    ASSERT_NE(store_, nullptr);
    model_.Write(dir_.File("baseline.safetensors"));
  }

  std::unique_ptr<ObjectStore> NewStore() {
    return AnyStoreTest::NewStore("store");
  }

  // After an aborted version 1, receiver `r` (checkpoint at `checkpoint`)
  // follows version 2, published from the right baseline.
  void ExpectFollowsTheNextVersion(std::unique_ptr<Receiver> r,
                                   const std::string& checkpoint,
                                   std::mt19937_64& rng) {
    Model next = model_;
    next.Step(rng, 0.03);
    auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"),
                               MakePublisher(1));
    ASSERT_OK(pub);
    std::vector<std::unique_ptr<Receiver>> rcv;
    rcv.push_back(std::move(r));
    ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, rcv, 2, next, 20000));
    EXPECT_TRUE(next.Matches(checkpoint));
  }

  // Receiver i's checkpoint and state dir, starting at version 0.
  ReceiverOptions MakeReceiver(int i) {
    std::string name = "r" + std::to_string(i);
    std::filesystem::create_directories(dir_.File(name));
    std::string ckpt = dir_.File(name + "/model.safetensors");
    if (!PathExists(ckpt)) model_.Write(ckpt);
    ReceiverOptions o;
    o.member = name;
    o.checkpoint = ckpt;
    o.state_dir = dir_.File(name);
    o.auth = Key();
    o.poll_ms = PollMs();
    o.decision_timeout_ms = 20000;
    o.resend_timeout_ms = 20000;
    return o;
  }

  // A publisher of baseline.safetensors for one receiver, r0, both at
  // version 1: the trainer stepped once from version 0 with `rng`.
  void PublishVersionOne(std::mt19937_64& rng, std::unique_ptr<Publisher>* pub,
                         std::vector<std::unique_ptr<Receiver>>* rcv, Model* trainer) {
    auto p = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), MakePublisher(1));
    ASSERT_OK(p);
    *pub = std::move(*p);
    auto r0 = Receiver::Open(store_.get(), MakeReceiver(0));
    ASSERT_OK(r0);
    rcv->push_back(std::move(*r0));
    *trainer = model_;
    trainer->Step(rng, 0.03);
    ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, *rcv, 1, *trainer, 20000));
  }

  PublisherOptions MakePublisher(int members) {
    PublisherOptions o;
    for (int i = 0; i < members; ++i) o.members.push_back("r" + std::to_string(i));
    o.auth = Key();
    o.poll_ms = PollMs();
    o.vote_timeout_ms = 20000;
    o.diff.chunk_bytes = 64 * 1024;
    return o;
  }

  std::unique_ptr<ObjectStore> store_;
  Model model_{1};
};

TEST_P(SyncTest, VersionsReachEveryReceiverBitExact) {
  constexpr int kReceivers = 8;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), MakePublisher(kReceivers));
  ASSERT_OK(pub);
  std::vector<std::unique_ptr<Receiver>> rcv;
  for (int i = 0; i < kReceivers; ++i) {
    // Half of them leave every write-back to the flush before the vote.
    ReceiverOptions o = MakeReceiver(i);
    o.early_writeback = i % 2 == 0;
    auto r = Receiver::Open(store_.get(), o);
    ASSERT_OK(r);
    rcv.push_back(std::move(*r));
  }
  std::mt19937_64 rng(2);
  Model trainer = model_;
  for (uint64_t v = 1; v <= 20; ++v) {
    trainer.Step(rng, v == 4 ? 0.5 : 0.02);  // one dense step
    ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, rcv, v, trainer, 20000));
    for (int i = 0; i < kReceivers; ++i) {
      EXPECT_TRUE(trainer.Matches(dir_.File("r" + std::to_string(i) + "/model.safetensors")))
          << "receiver " << i << " version " << v;
    }
    EXPECT_TRUE(trainer.Matches(dir_.File("baseline.safetensors")));
  }
  // A receiver that joins late catches up through the committed versions
  // (folded, without early write-back).
  ReceiverOptions late_options = MakeReceiver(7);
  late_options.early_writeback = false;
  auto late = Receiver::Open(store_.get(), late_options);
  ASSERT_OK(late);
  ASSERT_OK((*late)->SyncTo(20, 20000));
  EXPECT_TRUE(trainer.Matches(dir_.File("r7/model.safetensors")));
}

TEST_P(SyncTest, MissingVoteAbortsAndReceiversRollBack) {
  auto opts = MakePublisher(2);  // r1 never runs
  opts.vote_timeout_ms = 300;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), opts);
  ASSERT_OK(pub);
  auto r0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r0);
  Model trainer = model_;
  std::mt19937_64 rng(3);
  trainer.Step(rng, 0.03);
  Result<StepResult> step = InternalError("not run");
  std::thread t = StepUntilBusy(r0->get(), &step, 1000);
  auto report = (*pub)->Publish(1, trainer.Views());
  t.join();
  ASSERT_OK(report);
  EXPECT_FALSE(report->committed);
  ASSERT_OK(step);
  EXPECT_EQ(step->outcome, StepResult::Outcome::kAborted);
  EXPECT_EQ((*r0)->active_version(), 0u);
  EXPECT_TRUE(model_.Matches(dir_.File("r0/model.safetensors")));
  EXPECT_TRUE(model_.Matches(dir_.File("baseline.safetensors")));
  EXPECT_EQ((*pub)->committed_version(), 0u);
}

TEST_P(SyncTest, DropPolicyCommitsAndTheDroppedMemberCatchesUp) {
  auto opts = MakePublisher(2);
  // Long enough for r0 to vote through moto on a loaded machine; r1 never
  // votes and is dropped.
  opts.vote_timeout_ms = 2000;
  opts.policy = DeadlinePolicy::kDrop;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), opts);
  ASSERT_OK(pub);
  auto r0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r0);
  Model trainer = model_;
  std::mt19937_64 rng(4);
  trainer.Step(rng, 0.03);
  std::thread t([&] { EXPECT_OK((*r0)->SyncTo(1, 20000)); });
  auto report = (*pub)->Publish(1, trainer.Views());
  t.join();
  ASSERT_OK(report);
  EXPECT_TRUE(report->committed);
  EXPECT_EQ(report->dropped, std::vector<std::string>{"r1"});
  auto r1 = Receiver::Open(store_.get(), MakeReceiver(1));
  ASSERT_OK(r1);
  auto s = (*r1)->SyncTo(1, 20000);
  ASSERT_OK(s);
  EXPECT_EQ(s->outcome, StepResult::Outcome::kCaughtUp);
  EXPECT_EQ(s->changed_tensors, trainer.names);
  EXPECT_TRUE(trainer.Matches(dir_.File("r1/model.safetensors")));
}

TEST_P(SyncTest, TornChunkIsRepairedByOverwriteResend) {
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), MakePublisher(1));
  ASSERT_OK(pub);
  Model trainer = model_;
  std::mt19937_64 rng(5);
  trainer.Step(rng, 0.05);
  auto opts = MakeReceiver(0);
  // Simulate a receiver killed in the middle of a chunk: the journal says
  // version 1 began, and half of one tensor's changes are in place.
  std::thread pub_thread([&] {
    auto report = (*pub)->Publish(1, trainer.Views());
    EXPECT_OK(report);
    if (report.ok()) {
      EXPECT_TRUE(report->committed);
    }
  });
  // Wait for the manifest, then tear the checkpoint and journal by hand
  // (the journal names the version's announcement).
  Sha256 sha{};
  for (int i = 0; i < 5000; ++i) {
    auto b = store_->Get(ManifestKey(1));
    if (b.ok()) {
      auto ann = store_->Get(IndexKey(1));
      ASSERT_OK(ann);
      sha = ComputeSha256(*ann);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  {
    auto ck = Checkpoint::Open(opts.checkpoint, Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    auto d = ck->MutableData(*ck->IndexOf("a.weight"));
    const auto& target = trainer.data[0];
    size_t copied = 0;
    for (size_t i = 0; i < 20000 && copied < 50; i += 2) {
      if (d[i] != target[i]) {
        d[i] = target[i];
        ++copied;
      }
    }
    ASSERT_GT(copied, 0u);
    ASSERT_OK(ck->Sync());
    ASSERT_OK(Journal::Begin(dir_.File("r0/journal"), 1, 0, sha));
  }
  auto r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  auto s = (*r0)->SyncTo(1, 20000);
  pub_thread.join();
  ASSERT_OK(s);
  EXPECT_GE(s->chunks_resent, 1u);
  EXPECT_TRUE(trainer.Matches(opts.checkpoint));
}

TEST_P(SyncTest, TamperedChunkIsRefusedBeforeUse) {
  auto popts = MakePublisher(1);
  popts.vote_timeout_ms = 500;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  Model trainer = model_;
  std::mt19937_64 rng(6);
  trainer.Step(rng, 0.05);
  // Publish with nobody voting (abort after the deadline) to get objects.
  auto report = (*pub)->Publish(1, trainer.Views());
  ASSERT_OK(report);
  ASSERT_FALSE(report->committed);
  // Republish as version 2 and tamper with its first chunk in the store.
  std::thread pub_thread([&] { (void)(*pub)->Publish(2, trainer.Views()); });
  std::string key = ChunkKey(2, 0);
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 5000; ++i) {
    auto b = store_->Get(ManifestKey(2));
    if (b.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto chunk = store_->Get(key);
  ASSERT_OK(chunk);
  bytes = *chunk;
  bytes[bytes.size() / 2] ^= 1;
  ASSERT_OK(store_->Put(key, bytes));
  auto r0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r0);
  auto before = testing::ReadBytes(dir_.File("r0/model.safetensors"));
  auto s = (*r0)->Step();
  pub_thread.join();
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  // Chunks before the tampered one may have been applied; none after it.
  // The receiver never activated, and the journal keeps its place.
  EXPECT_EQ((*r0)->active_version(), 0u);
  (void)before;
}

TEST_P(SyncTest, ReplayedManifestOfAnotherVersionIsRefused) {
  auto popts = MakePublisher(1);
  popts.vote_timeout_ms = 200;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  Model trainer = model_;
  std::mt19937_64 rng(7);
  trainer.Step(rng, 0.02);
  ASSERT_OK((*pub)->Publish(1, trainer.Views()));
  // An attacker copies version 1's (validly signed) manifest to version 9.
  auto m1 = store_->Get(ManifestKey(1));
  ASSERT_OK(m1);
  auto a1 = store_->Get(IndexKey(1));
  ASSERT_OK(a1);
  ASSERT_OK(store_->Put(ManifestKey(9), *m1));
  ASSERT_OK(store_->Put(IndexKey(9), *a1));
  auto r0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r0);
  auto s = (*r0)->Step();
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
}

}  // namespace
}  // namespace refit

namespace refit {
namespace {

// Hands receivers damaged objects: a bit flip, a truncation, another
// chunk's bytes (reordering), the same chunk of an older version (replay),
// or nothing at all, on a seeded fraction of chunk and manifest reads.
// Chunks read before the manifest are checked against the announcement
// (authentication, version, range) and, once it arrives, against the
// manifest's hashes, so a reordered chunk is caught then.
class TamperStore final : public ObjectStore {
 public:
  TamperStore(ObjectStore* inner, uint64_t seed, double rate)
      : inner_(inner), rng_(seed), rate_(rate) {}
  std::string Describe() const override { return "tamper(" + inner_->Describe() + ")"; }
  Status Put(std::string_view k, std::span<const uint8_t> d) override { return inner_->Put(k, d); }
  Status PutIfAbsent(std::string_view k, std::span<const uint8_t> d) override {
    return inner_->PutIfAbsent(k, d);
  }
  Result<std::vector<ObjectInfo>> List(std::string_view p) override { return inner_->List(p); }
  Status Delete(std::string_view k) override { return inner_->Delete(k); }
  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    REFIT_ASSIGN_OR_RETURN(auto bytes, inner_->Get(key));
    std::string k(key);
    bool chunk = k.find("/chunk/") != std::string::npos;
    if (!chunk && k.find("/manifest") == std::string::npos) return bytes;
    std::uniform_real_distribution<double> u(0, 1);
    if (u(rng_) >= rate_) return bytes;
    ++injected_;
    switch (rng_() % 5) {
      case 0:
        bytes[rng_() % bytes.size()] ^= static_cast<uint8_t>(1u << (rng_() % 8));
        break;
      case 1:
        bytes.resize(rng_() % bytes.size());
        break;
      case 2: {  // another object of the same version in its place
        std::string other = k.substr(0, k.find_last_of('/') + 1) + "00000000";
        auto o = inner_->Get(chunk ? other : ChunkKey(1, 0));
        if (o.ok() && *o != bytes) return *o;
        bytes.push_back(0);
        break;
      }
      case 3: {  // replay: the same key one version earlier
        uint64_t v = std::strtoull(k.c_str() + 2, nullptr, 10);
        std::string old = VersionPrefix(v > 1 ? v - 1 : v + 1) + k.substr(VersionPrefix(v).size());
        auto o = inner_->Get(old);
        if (o.ok() && *o != bytes) return *o;
        bytes[0] ^= 1;
        break;
      }
      default:
        ++lost_;
        return NotFoundError("lost");
    }
    return bytes;
  }
  int injected() const { return injected_; }
  int lost() const { return lost_; }

 private:
  int lost_ = 0;
  ObjectStore* inner_;
  std::mt19937_64 rng_;
  double rate_;
  int injected_ = 0;
};

TEST_P(SyncTest, InjectedFaultsAreAllDetectedAndNothingAppliesTwice) {
  for (bool keyed : {true, false}) {
    SCOPED_TRACE(keyed ? "HMAC" : "no key");
    TempDir dir;
    auto store = NewStore();
    ASSERT_NE(store, nullptr);
    Model base(11);
    base.Write(dir.File("baseline.safetensors"));
    base.Write(dir.File("r0.safetensors"));
    std::filesystem::create_directories(dir.File("r0"));
    auto popts = MakePublisher(1);
    if (!keyed) popts.auth = Authenticator::None();
    auto pub = Publisher::Open(store.get(), dir.File("baseline.safetensors"), popts);
    ASSERT_OK(pub);
    TamperStore tamper(store.get(), keyed ? 1 : 2, 0.3);
    ReceiverOptions ropts = MakeReceiver(0);
    ropts.checkpoint = dir.File("r0.safetensors");
    ropts.state_dir = dir.File("r0");
    if (!keyed) ropts.auth = Authenticator::None();
    auto r0 = Receiver::Open(&tamper, ropts);
    ASSERT_OK(r0);
    Model trainer = base;
    std::mt19937_64 rng(12);
    int failures = 0;
    for (uint64_t v = 1; v <= 20; ++v) {
      trainer.Step(rng, 0.03);
      const uint64_t applied_before = (*r0)->chunks_applied_total();
      std::thread t([&] {
        while ((*r0)->active_version() < v) {
          auto s = (*r0)->Step();
          if (!s.ok()) {
            ++failures;
            EXPECT_TRUE(s.status().code() == StatusCode::kDataLoss ||
                        s.status().code() == StatusCode::kUnauthenticated ||
                        s.status().code() == StatusCode::kNotFound)
                << s.status().ToString();
            continue;
          }
        }
      });
      auto report = (*pub)->Publish(v, trainer.Views());
      t.join();
      ASSERT_OK(report);
      ASSERT_TRUE(report->committed);
      // Each chunk was applied exactly once across all the retries.
      EXPECT_EQ((*r0)->chunks_applied_total() - applied_before, report->diff.chunks)
          << "version " << v;
      EXPECT_TRUE(trainer.Matches(ropts.checkpoint)) << "version " << v;
    }
    EXPECT_GE(tamper.injected(), 100);  // >= 200 over both modes
    // Every fault is detected, none silently used. A lost object is an
    // error once the manifest lists it; before that a receiver streaming
    // the version takes it for one not uploaded yet and reads it again.
    EXPECT_LE(failures, tamper.injected());
    EXPECT_GE(failures, tamper.injected() - tamper.lost());
  }
}

}  // namespace
}  // namespace refit

namespace refit {
namespace {

// The real fixture steps as a trajectory of 21 versions (0->1->2->3->0...),
// one receiver and then four, every version bit-exact on every receiver.
TEST_P(SyncTest, FixtureTrajectoryOfTwentyVersions) {
  REFIT_REQUIRE_FIXTURES();
  const std::string fx = testing::FixturesDir();
  ASSERT_OK(CopyCheckpoint(fx + "/step0.safetensors", dir_.File("pub.safetensors")));
  auto popts = MakePublisher(4);
  popts.diff.chunk_bytes = 1 << 20;
  auto pub = Publisher::Open(store_.get(), dir_.File("pub.safetensors"), popts);
  ASSERT_OK(pub);
  std::vector<std::unique_ptr<Receiver>> rcv;
  for (int i = 0; i < 4; ++i) {
    auto o = MakeReceiver(i);
    o.checkpoint = dir_.File("r" + std::to_string(i) + "/fx.safetensors");
    ASSERT_OK(CopyCheckpoint(fx + "/step0.safetensors", o.checkpoint));
    auto r = Receiver::Open(store_.get(), o);
    ASSERT_OK(r);
    rcv.push_back(std::move(*r));
  }
  for (uint64_t v = 1; v <= 21; ++v) {
    const std::string step = fx + "/step" + std::to_string(v % 4) + ".safetensors";
    std::vector<std::thread> threads;
    for (auto& r : rcv) {
      threads.emplace_back([&, rp = r.get()] { EXPECT_OK(rp->SyncTo(v, 30000)); });
    }
    auto report = (*pub)->PublishCheckpoint(v, step);
    for (auto& t : threads) t.join();
    ASSERT_OK(report);
    ASSERT_TRUE(report->committed) << report->reason;
    for (int i = 0; i < 4; ++i) {
      auto a = Checkpoint::Open(dir_.File("r" + std::to_string(i) + "/fx.safetensors"),
                                Checkpoint::Mode::kReadOnly);
      auto b = Checkpoint::Open(step, Checkpoint::Mode::kReadOnly);
      ASSERT_OK(a);
      ASSERT_OK(b);
      for (size_t t = 0; t < b->tensors().size(); ++t) {
        auto x = a->Data(*a->IndexOf(b->tensors()[t].name));
        auto y = b->Data(t);
        ASSERT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end()))
            << "receiver " << i << " version " << v << " " << b->tensors()[t].name;
      }
    }
  }
}

}  // namespace
}  // namespace refit

namespace refit {
namespace {

TEST(ProtocolTest, SnapshotIndexRoundTripsAndRefusesUnsafeNames) {
  SnapshotIndex s;
  s.version = 10;
  s.files = {{"model-00001-of-00002.safetensors", 123, {}}, {"sub/b.safetensors", 7, {}}};
  s.files[0].sha256[3] = 9;
  TensorEntry e;
  e.name = "w";
  e.dtype = "BF16";
  e.width = 2;
  e.shape = {4};
  e.num_elements = 4;
  s.tensors = {e};
  auto bytes = EncodeSnapshotIndex(s);
  auto back = DecodeSnapshotIndex(bytes);
  ASSERT_OK(back);
  EXPECT_EQ(back->version, 10u);
  ASSERT_EQ(back->files.size(), 2u);
  EXPECT_EQ(back->files[1].name, "sub/b.safetensors");
  EXPECT_EQ(back->files[0].sha256, s.files[0].sha256);
  EXPECT_EQ(back->tensors.size(), 1u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeSnapshotIndex(std::span<const uint8_t>(bytes.data(), n)).ok()) << n;
  }
  for (const char* bad : {"../x", "/abs", "a//b", "a/./b", "", "a/"}) {
    SnapshotIndex u = s;
    u.files[0].name = bad;
    EXPECT_FALSE(DecodeSnapshotIndex(EncodeSnapshotIndex(u)).ok()) << bad;
  }
  EXPECT_EQ(SnapshotFileKey(10, 2), "snap/00000000000000000010/file/00000002");
  EXPECT_EQ(ParseSnapshotIndexKey(SnapshotIndexKey(10)), std::optional<uint64_t>(10));
  EXPECT_FALSE(ParseSnapshotIndexKey(SnapshotFileKey(10, 0)).has_value());
  EXPECT_EQ(ParseSnapshotIndexKey("snap/18446744073709551615/index"),
            std::optional<uint64_t>(UINT64_MAX));
  EXPECT_FALSE(ParseSnapshotIndexKey("snap/18446744073709551616/index").has_value());
  EXPECT_FALSE(ParseSnapshotIndexKey("snap/80000000000000000042/index").has_value());
}

// Publishes versions first..last with r0 (the only member) following.
void PublishFollowed(Publisher* pub, Receiver* r0, Model* trainer, std::mt19937_64* rng,
                     uint64_t first, uint64_t last) {
  for (uint64_t v = first; v <= last; ++v) {
    trainer->Step(*rng, 0.02);
    std::thread t([&] { EXPECT_OK(r0->SyncTo(v, 20000)); });
    auto report = pub->Publish(v, trainer->Views());
    t.join();
    ASSERT_OK(report);
    ASSERT_TRUE(report->committed) << report->reason;
    EXPECT_EQ(report->snapshot, v % 5 == 0) << v;
    EXPECT_EQ(report->retention_error, "");
  }
}

std::vector<std::string> Keys(ObjectStore* store, const std::string& prefix) {
  auto list = store->List(prefix);
  EXPECT_OK(list);
  std::vector<std::string> out;
  if (list.ok()) {
    for (const ObjectInfo& o : *list) out.push_back(o.key);
  }
  return out;
}

TEST_P(SyncTest, NewReceiverCatchesUpFromSnapshotAfterRetention) {
  auto popts = MakePublisher(1);
  popts.snapshot_every = 5;
  popts.keep_versions = 3;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  EXPECT_EQ(Keys(store_.get(), SnapshotPrefix(0)).size(), 2u);  // index + the one file
  auto r0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r0);
  Model trainer = model_;
  std::mt19937_64 rng(21);
  PublishFollowed(pub->get(), r0->get(), &trainer, &rng, 1, 12);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(trainer.Matches(dir_.File("r0/model.safetensors")));

  // Versions 1..9 are gone (10 is the newest snapshot; 10..12 are the 3
  // newest), and so is snapshot 0 (older than the newest two).
  std::vector<std::string> index_keys = Keys(store_.get(), "index/");
  EXPECT_EQ(index_keys, (std::vector<std::string>{IndexKey(10), IndexKey(11), IndexKey(12)}));
  for (const std::string& k : Keys(store_.get(), "v/")) {
    EXPECT_TRUE(k.starts_with(VersionPrefix(10)) || k.starts_with(VersionPrefix(11)) ||
                k.starts_with(VersionPrefix(12)))
        << k;
  }
  for (uint64_t v = 1; v < 10; ++v) EXPECT_TRUE(Keys(store_.get(), VersionPrefix(v)).empty()) << v;
  EXPECT_TRUE(Keys(store_.get(), SnapshotPrefix(0)).empty());
  EXPECT_EQ(Keys(store_.get(), SnapshotPrefix(5)),
            (std::vector<std::string>{SnapshotFileKey(5, 0), SnapshotIndexKey(5)}));
  EXPECT_EQ(Keys(store_.get(), SnapshotPrefix(10)),
            (std::vector<std::string>{SnapshotFileKey(10, 0), SnapshotIndexKey(10)}));

  // A new receiver holding version 0, whose next versions were deleted:
  // the snapshot at 10, then deltas 11 and 12.
  auto late = Receiver::Open(store_.get(), MakeReceiver(5));
  ASSERT_OK(late);
  auto step = (*late)->Step();
  ASSERT_OK(step);
  EXPECT_EQ(step->outcome, StepResult::Outcome::kSnapshot);
  EXPECT_EQ(step->version, 10u);
  EXPECT_EQ((*late)->active_version(), 10u);
  step = (*late)->Step();
  ASSERT_OK(step);
  EXPECT_EQ(step->outcome, StepResult::Outcome::kCaughtUp);
  EXPECT_EQ(step->version, 12u);  // 11 and 12 folded into one step
  EXPECT_EQ(step->versions_folded, 2u);
  ASSERT_OK((*late)->SyncTo(12, 20000));
  EXPECT_TRUE(trainer.Matches(dir_.File("r5/model.safetensors")));
  EXPECT_FALSE(PathExists(dir_.File("r5/model.safetensors.refit-snapshot")));

  // A brand-new receiver with no checkpoint at all, into a directory.
  auto opts = MakeReceiver(6);
  opts.checkpoint = dir_.File("r6/ckpt");
  auto fresh = Receiver::Open(store_.get(), opts);
  ASSERT_OK(fresh);
  ASSERT_OK((*fresh)->SyncTo(12, 20000));
  EXPECT_TRUE(trainer.Matches(opts.checkpoint));
  EXPECT_TRUE(PathExists(opts.checkpoint + "/model.safetensors"));
}

TEST_P(SyncTest, LaggingReceiverRecoversViaSnapshot) {
  auto popts = MakePublisher(1);
  popts.snapshot_every = 5;
  popts.keep_versions = 3;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  auto r0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r0);
  auto r1 = Receiver::Open(store_.get(), MakeReceiver(1));  // not a member
  ASSERT_OK(r1);
  Model trainer = model_;
  std::mt19937_64 rng(22);
  PublishFollowed(pub->get(), r0->get(), &trainer, &rng, 1, 3);
  ASSERT_FALSE(HasFailure());
  ASSERT_OK((*r1)->SyncTo(3, 20000));
  EXPECT_TRUE(trainer.Matches(dir_.File("r1/model.safetensors")));
  PublishFollowed(pub->get(), r0->get(), &trainer, &rng, 4, 12);
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(Keys(store_.get(), VersionPrefix(4)).empty());

  // r1 (active 3, a valid state) restarts: versions 4..9 are gone.
  r1 = Receiver::Open(store_.get(), MakeReceiver(1));
  ASSERT_OK(r1);
  EXPECT_EQ((*r1)->active_version(), 3u);
  auto step = (*r1)->Step();
  ASSERT_OK(step);
  EXPECT_EQ(step->outcome, StepResult::Outcome::kSnapshot);
  EXPECT_EQ(step->version, 10u);
  ASSERT_OK((*r1)->SyncTo(12, 20000));
  EXPECT_TRUE(trainer.Matches(dir_.File("r1/model.safetensors")));
  EXPECT_EQ(testing::ReadBytes(dir_.File("r1/active")),
            (std::vector<uint8_t>{'1', '2', '\n'}));

  // A receiver killed while putting a snapshot in place (marker written,
  // files partly replaced, active still the old version) finishes it on
  // the next step, although deltas from its active version (9 -> 10) exist.
  ASSERT_OK(WriteFileAtomic(dir_.File("r0/snapshot"), std::vector<uint8_t>{'1', '0'}));
  ASSERT_OK(WriteFileAtomic(dir_.File("r0/active"), std::vector<uint8_t>{'9', '\n'}));
  {
    auto ck = Checkpoint::Open(dir_.File("r0/model.safetensors"), Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    ck->MutableData(0)[0] ^= 1;
    ASSERT_OK(ck->Sync());
  }
  r0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r0);
  EXPECT_EQ((*r0)->active_version(), 9u);
  step = (*r0)->Step();
  ASSERT_OK(step);
  EXPECT_EQ(step->outcome, StepResult::Outcome::kSnapshot);
  EXPECT_EQ(step->version, 10u);
  EXPECT_FALSE(PathExists(dir_.File("r0/snapshot")));
  ASSERT_OK((*r0)->SyncTo(12, 20000));
  EXPECT_TRUE(trainer.Matches(dir_.File("r0/model.safetensors")));
}

// Holds back (or refuses) the publisher's Put of one version's manifest, so
// the receivers must work while the upload is still "in progress".
class GateStore final : public ObjectStore {
 public:
  GateStore(ObjectStore* inner, std::string key) : inner_(inner), key_(std::move(key)) {}
  std::string Describe() const override { return "gate(" + inner_->Describe() + ")"; }
  Status Put(std::string_view k, std::span<const uint8_t> d) override {
    REFIT_RETURN_IF_ERROR(Wait(k));
    return inner_->Put(k, d);
  }
  Status PutIfAbsent(std::string_view k, std::span<const uint8_t> d) override {
    REFIT_RETURN_IF_ERROR(Wait(k));
    return inner_->PutIfAbsent(k, d);
  }
  Result<std::vector<uint8_t>> Get(std::string_view k) override { return inner_->Get(k); }
  Result<std::vector<ObjectInfo>> List(std::string_view p) override { return inner_->List(p); }
  Status Delete(std::string_view k) override { return inner_->Delete(k); }

  // Refuse the manifest instead of holding it (the publisher dies there).
  void Refuse() { refuse_ = true; }
  bool held() const { return held_.load(); }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  Status Wait(std::string_view k) {
    if (k != key_) return Status();
    if (refuse_) return UnavailableError("the publisher died before its manifest");
    std::unique_lock<std::mutex> lock(mu_);
    held_ = true;
    cv_.wait_for(lock, std::chrono::seconds(30), [&] { return open_; });
    return Status();
  }
  ObjectStore* inner_;
  std::string key_;
  std::atomic<bool> refuse_{false}, held_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A signing publisher: receivers with its public key follow versions; a
// receiver with another key, and a chunk forged by a holder of the shared
// key, are refused before anything is applied.
TEST_P(SyncTest, SignedVersionsAndForgedChunks) {
  auto pair = Authenticator::GenerateEd25519();
  ASSERT_OK(pair);
  auto other = Authenticator::GenerateEd25519();
  ASSERT_OK(other);
  auto popts = MakePublisher(1);
  auto signer = Key().WithSigningKey(pair->first);
  ASSERT_OK(signer);
  popts.auth = *signer;
  popts.vote_timeout_ms = 1500;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  auto ropts = MakeReceiver(0);
  auto verifier = Key().WithVerifyKey(pair->second);
  ASSERT_OK(verifier);
  ropts.auth = *verifier;
  auto r0 = Receiver::Open(store_.get(), ropts);
  ASSERT_OK(r0);
  Model trainer = model_;
  std::mt19937_64 rng(31);
  trainer.Step(rng, 0.03);
  std::thread t([&] { EXPECT_OK((*r0)->SyncTo(1, 20000)); });
  auto report = (*pub)->Publish(1, trainer.Views());
  t.join();
  ASSERT_OK(report);
  ASSERT_TRUE(report->committed) << report->reason;
  EXPECT_TRUE(trainer.Matches(ropts.checkpoint));

  // A receiver holding another publisher's key refuses version 1.
  auto wopts = MakeReceiver(1);
  auto wrong = Key().WithVerifyKey(other->second);
  ASSERT_OK(wrong);
  wopts.auth = *wrong;
  auto r1 = Receiver::Open(store_.get(), wopts);
  ASSERT_OK(r1);
  auto refused = (*r1)->Step();
  EXPECT_THAT(refused, StatusIs(StatusCode::kUnauthenticated));
  EXPECT_TRUE(model_.Matches(wopts.checkpoint));

  // A member (it has the shared key, not the private one) plants a forged
  // version 2: announcement and first chunk re-sealed with the shared key.
  Model forged = trainer;
  forged.Step(rng, 0.03);
  auto a1 = store_->Get(IndexKey(1));
  ASSERT_OK(a1);
  auto a1body = verifier->Open(*a1);
  ASSERT_OK(a1body);
  auto ann = DecodeAnnouncement(*a1body);
  ASSERT_OK(ann);
  ann->version = 2;
  ann->base_version = 1;
  ASSERT_OK(store_->Put(IndexKey(2), Key().Seal(EncodeAnnouncement(*ann))));
  auto before = testing::ReadBytes(ropts.checkpoint);
  auto s = (*r0)->Step();
  EXPECT_THAT(s, StatusIs(StatusCode::kUnauthenticated));
  EXPECT_EQ(testing::ReadBytes(ropts.checkpoint), before);
  ASSERT_OK(store_->Delete(IndexKey(2)));
  // Forged chunk while the real version 2 streams: chunk 0 re-sealed with
  // the shared key after a bit flip in its payload.
  GateStore gate(store_.get(), ManifestKey(2));
  auto pub2 = Publisher::Open(&gate, dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub2);
  Result<PublishReport> r2 = InternalError("not run");
  std::thread pt([&] { r2 = (*pub2)->Publish(2, forged.Views()); });
  for (int i = 0; i < 10000 && !gate.held(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(gate.held());
  auto c0 = store_->Get(ChunkKey(2, 0));
  ASSERT_OK(c0);
  auto c0body = verifier->Open(*c0);
  ASSERT_OK(c0body);
  std::vector<uint8_t> evil(c0body->begin(), c0body->end());
  evil[evil.size() / 2] ^= 1;
  ASSERT_OK(store_->Put(ChunkKey(2, 0), Key().Seal(evil)));
  before = testing::ReadBytes(ropts.checkpoint);
  s = (*r0)->Step();
  EXPECT_THAT(s, StatusIs(StatusCode::kUnauthenticated));
  EXPECT_EQ(testing::ReadBytes(ropts.checkpoint), before);
  EXPECT_EQ((*r0)->active_version(), 1u);
  gate.Release();
  pt.join();
  ASSERT_OK(r2);
  EXPECT_FALSE(r2->committed);  // r0 could not vote
}

// Receivers apply every chunk while the manifest is still held back; after
// it, only the tail (checks, flush, vote) remains.
TEST_P(SyncTest, ChunksAreAppliedBeforeTheManifest) {
  GateStore gate(store_.get(), ManifestKey(1));
  auto pub = Publisher::Open(&gate, dir_.File("baseline.safetensors"), MakePublisher(1));
  ASSERT_OK(pub);
  auto r0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r0);
  Model trainer = model_;
  std::mt19937_64 rng(21);
  trainer.Step(rng, 0.03);
  Result<StepResult> step = InternalError("not run");
  std::thread rt([&] { step = (*r0)->SyncTo(1, 30000); });
  Result<PublishReport> report = InternalError("not run");
  std::thread pt([&] { report = (*pub)->Publish(1, trainer.Views()); });
  // Every chunk is stored before the manifest Put; give the receiver the
  // time to apply them all, then let the manifest through.
  for (int i = 0; i < 10000 && !gate.held(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(gate.held());
  EXPECT_FALSE(PathExists(dir_.File("r0/active")) &&
               testing::ReadBytes(dir_.File("r0/active"))[0] == '1');
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  gate.Release();
  rt.join();
  pt.join();
  ASSERT_OK(report);
  ASSERT_TRUE(report->committed) << report->reason;
  ASSERT_OK(step);
  EXPECT_EQ(step->outcome, StepResult::Outcome::kCommitted);
  EXPECT_EQ(step->chunks_applied, report->diff.chunks);
  EXPECT_EQ(step->chunks_before_manifest, report->diff.chunks);
  EXPECT_TRUE(trainer.Matches(dir_.File("r0/model.safetensors")));
}

// A publisher that dies before its manifest: the receiver applied chunks,
// times out clearly, keeps its journal; the next publish aborts the version
// and the receiver rolls it back (without a manifest) before following the
// new one. Every chunk of the dead version was applied once.
TEST_P(SyncTest, VersionWithoutManifestIsAbortedAndRolledBack) {
  GateStore gate(store_.get(), ManifestKey(1));
  gate.Refuse();
  auto pub = Publisher::Open(&gate, dir_.File("baseline.safetensors"), MakePublisher(1));
  ASSERT_OK(pub);
  auto opts = MakeReceiver(0);
  opts.chunk_timeout_ms = 400;
  auto r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  Model trainer = model_;
  std::mt19937_64 rng(22);
  trainer.Step(rng, 0.03);
  auto dead = (*pub)->Publish(1, trainer.Views());
  ASSERT_FALSE(dead.ok());
  auto chunks = store_->List(VersionPrefix(1) + "chunk/");
  ASSERT_OK(chunks);
  ASSERT_GT(chunks->size(), 2u);
  auto step = (*r0)->Step();
  EXPECT_THAT(step, StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_NE(step.status().message().find("manifest"), std::string::npos);
  EXPECT_EQ((*r0)->chunks_applied_total(), chunks->size());
  EXPECT_FALSE(model_.Matches(opts.checkpoint));  // partly applied
  auto journal = Journal::Load(dir_.File("r0/journal"));
  ASSERT_OK(journal);
  ASSERT_TRUE(journal->has_value());
  EXPECT_EQ((*journal)->version, 1u);

  // The trainer moves on: version 2 from the same base. Publishing it
  // aborts version 1; the receiver (restarted, as after a crash) rolls
  // version 1 back without its manifest, then follows version 2.
  Model next = model_;
  std::mt19937_64 rng2(23);
  next.Step(rng2, 0.02);
  auto pub2 = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), MakePublisher(1));
  ASSERT_OK(pub2);
  r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  std::vector<StepResult> outcomes;
  std::thread follow([&] {
    for (int i = 0; i < 200 && (*r0)->active_version() < 2; ++i) {
      auto s = (*r0)->Step();
      if (s.ok() && s->outcome != StepResult::Outcome::kIdle) outcomes.push_back(*s);
      if (!s.ok()) {
        EXPECT_THAT(s, StatusIs(StatusCode::kDeadlineExceeded));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  auto report = (*pub2)->Publish(2, next.Views());
  follow.join();
  ASSERT_OK(report);
  EXPECT_TRUE(report->committed) << report->reason;
  auto d1 = store_->Get(DecisionKey(1));
  ASSERT_OK(d1);
  auto body = Key().Open(*d1);
  ASSERT_OK(body);
  auto decision = DecodeDecision(*body);
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->commit);
  EXPECT_NE(decision->reason.find("superseded"), std::string::npos);
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[0].outcome, StepResult::Outcome::kAborted);
  EXPECT_EQ(outcomes[0].version, 1u);
  EXPECT_EQ(outcomes[0].chunks_applied, 0u);
  EXPECT_EQ(outcomes[1].outcome, StepResult::Outcome::kCommitted);
  EXPECT_EQ(outcomes[1].version, 2u);
  EXPECT_FALSE(PathExists(dir_.File("r0/journal")));
  EXPECT_EQ((*r0)->active_version(), 2u);
  EXPECT_TRUE(next.Matches(opts.checkpoint));
}

// The base is checked once per version, tensor by tensor, before any chunk
// of the tensor is applied: a receiver whose model was changed locally
// refuses the version and writes nothing into that tensor.
TEST_P(SyncTest, ChangedLocalModelIsRefusedBeforeItsChunksApply) {
  auto popts = MakePublisher(1);
  popts.vote_timeout_ms = 500;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  auto opts = MakeReceiver(0);
  std::vector<uint8_t> changed;
  {
    // One bit of the last tensor ("c.bias", tensor table order: a, b, c).
    auto ck = Checkpoint::Open(opts.checkpoint, Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    auto d = ck->MutableData(*ck->IndexOf("c.bias"));
    d[7] ^= 0x40;
    changed.assign(d.begin(), d.end());
    ASSERT_OK(ck->Sync());
  }
  auto r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  Model trainer = model_;
  std::mt19937_64 rng(41);
  trainer.Step(rng, 0.05);
  Result<StepResult> step = InternalError("not run");
  std::thread t = StepUntilBusy(r0->get(), &step, 2000);
  auto report = (*pub)->Publish(1, trainer.Views());
  t.join();
  ASSERT_OK(report);
  EXPECT_FALSE(report->committed);
  EXPECT_THAT(step, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(step.status().message().find("c.bias"), std::string::npos);
  auto ck = Checkpoint::Open(opts.checkpoint, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  auto d = ck->Data(*ck->IndexOf("c.bias"));
  EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.end()), changed);
  EXPECT_EQ((*r0)->active_version(), 0u);
}

// A receiver that keeps the digests of the version it activated checks
// the next version's base from them (ReceiverOptions::
// full_base_check_every), except where they may no longer hold: a
// checkpoint file written since the flush, or a full check. A model changed
// between versions is then refused at the base, as in the first version.
TEST_P(SyncTest, ModelChangedBetweenVersionsIsRefusedAtTheBase) {
  auto popts = MakePublisher(2);
  popts.vote_timeout_ms = 2000;
  auto pub =
      Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  Model memory = model_;
  ReceiverOptions file_opts = MakeReceiver(0);  // digests kept (the default)
  ReceiverOptions mem_opts = MakeReceiver(1);
  mem_opts.checkpoint.clear();
  mem_opts.tensors = memory.MutableViews();
  mem_opts.full_base_check_every = 1;  // nothing to tell a change in memory by
  std::vector<std::unique_ptr<Receiver>> rcv;
  for (const ReceiverOptions& o : {file_opts, mem_opts}) {
    auto r = Receiver::Open(store_.get(), o);
    ASSERT_OK(r);
    rcv.push_back(std::move(*r));
  }
  Model trainer = model_;
  std::mt19937_64 rng(43);
  trainer.Step(rng, 0.03);
  ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, rcv, 1, trainer, 20000));
  EXPECT_TRUE(trainer.Matches(file_opts.checkpoint));
  EXPECT_EQ(memory.data, trainer.data);
  // Past the file system's timestamp granularity, so the write shows.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    auto ck =
        Checkpoint::Open(file_opts.checkpoint, Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    ck->MutableData(*ck->IndexOf("c.bias"))[7] ^= 0x40;
    ASSERT_OK(ck->Sync());
  }
  memory.MutableViews().back().data[7] ^= 0x40;  // c.bias too
  trainer.Step(rng, 0.03);
  std::vector<Status> steps(rcv.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < rcv.size(); ++i) {
    threads.emplace_back(
        [&, i] { steps[i] = rcv[i]->SyncTo(2, 5000).status(); });
  }
  auto report = (*pub)->Publish(2, trainer.Views());
  for (std::thread& t : threads) t.join();
  ASSERT_OK(report);
  EXPECT_FALSE(report->committed);
  for (size_t i = 0; i < rcv.size(); ++i) {
    EXPECT_EQ(steps[i].code(), StatusCode::kDataLoss) << steps[i].ToString();
    EXPECT_NE(steps[i].message().find("'c.bias' is not at version 1"),
              std::string::npos)
        << steps[i].ToString();
    EXPECT_EQ(rcv[i]->failed_vote(), std::optional<uint64_t>(2));
    EXPECT_EQ(rcv[i]->active_version(), 1u);
  }
}

// A checkpoint receiver checks each next version's base from the digests
// it kept: opening its checkpoint again for the next version (which
// reserves the file's holes) must not make the file look written since
// the flush. Version 1 reads every tensor; versions 2 and 3 none.
TEST_P(SyncTest, CheckpointReceiverChecksTheNextBaseFromKeptDigests) {
  auto popts = MakePublisher(1);
  popts.vote_timeout_ms = 5000;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  auto r = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r);
  Model trainer = model_;
  std::mt19937_64 rng(47);
  for (uint64_t v = 1; v <= 3; ++v) {
    trainer.Step(rng, 0.03);
    Result<StepResult> step = InternalError("not run");
    std::thread t([&] { step = (*r)->SyncTo(v, 20000); });
    auto report = (*pub)->Publish(v, trainer.Views());
    t.join();
    ASSERT_OK(report);
    ASSERT_OK(step);
    EXPECT_TRUE(report->committed);
    EXPECT_EQ(step->base_from_kept_digests, v > 1) << "version " << v;
    // Past the file system's timestamp granularity, so a write would show.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(trainer.Matches(MakeReceiver(0).checkpoint));
}

// A restarted publisher that re-encodes other tensors under an announced
// version cannot change the chunks receivers may already have applied.
TEST_P(SyncTest, AnnouncedChunksNeverChange) {
  GateStore gate(store_.get(), ManifestKey(1));
  gate.Refuse();
  auto pub = Publisher::Open(&gate, dir_.File("baseline.safetensors"), MakePublisher(1));
  ASSERT_OK(pub);
  Model a = model_, b = model_;
  std::mt19937_64 rng(24);
  a.Step(rng, 0.03);
  b.Step(rng, 0.03);
  ASSERT_FALSE((*pub)->Publish(1, a.Views()).ok());
  auto before = store_->Get(ChunkKey(1, 0));
  ASSERT_OK(before);
  auto pub2 = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), MakePublisher(1));
  ASSERT_OK(pub2);
  auto r = (*pub2)->Publish(1, b.Views());
  EXPECT_THAT(r, StatusIs(StatusCode::kFailedPrecondition));
  auto after = store_->Get(ChunkKey(1, 0));
  ASSERT_OK(after);
  EXPECT_EQ(*before, *after);
}

// An in-memory receiver: tensors in the caller's memory instead of a
// checkpoint file; versions commit, roll back and catch up the same way.
TEST_P(SyncTest, InMemoryReceiverFollowsVersions) {
  auto popts = MakePublisher(2);
  popts.vote_timeout_ms = 1000;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  Model memory = model_;  // the worker's weights
  auto mem_opts = [&](const std::string& member) {
    ReceiverOptions o = MakeReceiver(member == "r0" ? 0 : 1);
    o.checkpoint.clear();
    o.tensors = memory.MutableViews();
    return o;
  };
  auto r0 = Receiver::Open(store_.get(), mem_opts("r0"));
  ASSERT_OK(r0);
  auto r1 = Receiver::Open(store_.get(), MakeReceiver(1));  // a file receiver alongside
  ASSERT_OK(r1);
  Model trainer = model_;
  std::mt19937_64 rng(25);
  for (uint64_t v = 1; v <= 3; ++v) {
    trainer.Step(rng, 0.03);
    std::thread t0([&] { EXPECT_OK((*r0)->SyncTo(v, 20000)); });
    std::thread t1([&] { EXPECT_OK((*r1)->SyncTo(v, 20000)); });
    auto report = (*pub)->Publish(v, trainer.Views());
    t0.join();
    t1.join();
    ASSERT_OK(report);
    ASSERT_TRUE(report->committed) << report->reason;
    EXPECT_EQ(memory.data, trainer.data) << "version " << v;
  }
  // r1 stays silent: version 4 aborts and the in-memory receiver rolls back.
  Model at3 = trainer;
  trainer.Step(rng, 0.03);
  Result<StepResult> step = InternalError("not run");
  std::thread t0 = StepUntilBusy(r0->get(), &step, 2000);
  auto report = (*pub)->Publish(4, trainer.Views());
  t0.join();
  ASSERT_OK(report);
  EXPECT_FALSE(report->committed);
  ASSERT_OK(step);
  EXPECT_EQ(step->outcome, StepResult::Outcome::kAborted);
  EXPECT_EQ(memory.data, at3.data);
  EXPECT_EQ((*r0)->active_version(), 3u);
  // A receiver needs one model: a path or tensors.
  auto both = mem_opts("r0");
  both.checkpoint = dir_.File("r0/model.safetensors");
  EXPECT_THAT(Receiver::Open(store_.get(), both),
              StatusIs(StatusCode::kInvalidArgument));
  // Tensors that are not the model are refused before anything is written.
  auto wrong = mem_opts("r0");
  wrong.tensors[0].shape = {1};
  auto rw = Receiver::Open(store_.get(), wrong);
  ASSERT_OK(rw);
  std::thread pw([&] { (void)(*pub)->Publish(5, trainer.Views()); });
  Result<StepResult> refused = InternalError("not run");
  for (int i = 0; i < 2000; ++i) {
    refused = (*rw)->Step();
    if (!refused.ok() || refused->outcome != StepResult::Outcome::kIdle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  pw.join();
  EXPECT_THAT(refused, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(memory.data, at3.data);
}

// Versions with conditional XOR chunks (kind 5, PublisherOptions::diff.
// allow_conditional) reach checkpoint and in-memory receivers bit for bit;
// aborted ones roll back from the old bytes each receiver's journal kept
// (such records cannot be decoded again once the range is at "after").
TEST_P(SyncTest, ConditionalVersionsReachCpuReceiversAndRollBack) {
  auto popts = MakePublisher(2);
  popts.vote_timeout_ms = 1000;
  popts.diff.allow_conditional = true;
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  Model memory = model_;  // r0's weights, in host memory
  ReceiverOptions mem = MakeReceiver(0);
  mem.checkpoint.clear();
  mem.tensors = memory.MutableViews();
  auto r0 = Receiver::Open(store_.get(), mem);
  ASSERT_OK(r0);
  auto r1 = Receiver::Open(store_.get(), MakeReceiver(1));
  ASSERT_OK(r1);
  Model trainer = model_;
  std::mt19937_64 rng(41);
  uint64_t conditional_chunks = 0;
  for (uint64_t v = 1; v <= 3; ++v) {
    trainer.StepByOne(rng, 0.03);
    std::thread t0([&] { EXPECT_OK((*r0)->SyncTo(v, 20000)); });
    std::thread t1([&] { EXPECT_OK((*r1)->SyncTo(v, 20000)); });
    auto report = (*pub)->Publish(v, trainer.Views());
    t0.join();
    t1.join();
    ASSERT_OK(report);
    ASSERT_TRUE(report->committed) << report->reason;
    conditional_chunks += report->diff.chunks_by_kind["conditional-xor"];
    EXPECT_EQ(memory.data, trainer.data) << "version " << v;
    EXPECT_TRUE(trainer.Matches(dir_.File("r1/model.safetensors"))) << "version " << v;
    EXPECT_TRUE(trainer.Matches(dir_.File("baseline.safetensors"))) << "version " << v;
  }
  EXPECT_GT(conditional_chunks, 0u);
  // Version 4: r1 stays silent, the in-memory receiver applies it and rolls
  // back. Version 5: r0 stays silent, the checkpoint receiver does.
  const Model at3 = trainer;
  for (uint64_t v = 4; v <= 5; ++v) {
    Model next = at3;
    next.StepByOne(rng, 0.03);
    Receiver* active = v == 4 ? r0->get() : r1->get();
    Result<StepResult> step = InternalError("not run");
    std::thread t = StepUntilBusy(active, &step, 2000);
    auto report = (*pub)->Publish(v, next.Views());
    t.join();
    ASSERT_OK(report);
    EXPECT_FALSE(report->committed);
    EXPECT_GT(report->diff.chunks_by_kind["conditional-xor"], 0u);
    ASSERT_OK(step);
    EXPECT_EQ(step->outcome, StepResult::Outcome::kAborted) << "version " << v;
    EXPECT_EQ(active->active_version(), 3u);
  }
  EXPECT_EQ(memory.data, at3.data);
  EXPECT_TRUE(at3.Matches(dir_.File("r1/model.safetensors")));
  EXPECT_TRUE(at3.Matches(dir_.File("baseline.safetensors")));
  // The next version commits on both.
  Model next = at3;
  next.StepByOne(rng, 0.03);
  std::thread t0([&] { EXPECT_OK((*r0)->SyncTo(6, 20000)); });
  std::thread t1([&] { EXPECT_OK((*r1)->SyncTo(6, 20000)); });
  auto report = (*pub)->Publish(6, next.Views());
  t0.join();
  t1.join();
  ASSERT_OK(report);
  EXPECT_TRUE(report->committed) << report->reason;
  EXPECT_EQ(memory.data, next.data);
  EXPECT_TRUE(next.Matches(dir_.File("r1/model.safetensors")));
}

// A baseline whose targets are device addresses, as a GPU publisher's is;
// only its kind is ever asked for here.
class DeviceLikeBaseline final : public PublisherBaseline {
 public:
  const std::vector<TensorView>& tensors() const override { return views_; }
  std::string Describe() const override { return "a device baseline"; }
  bool targets_on_device() const override { return true; }
  Result<Hash128> HashTensor(size_t) override { return UnimplementedError("fake"); }
  Result<Hash128> HashTarget(const TensorView&) override { return UnimplementedError("fake"); }
  Result<DiffReport> Diff(const std::vector<TensorView>&, const DiffOptions&,
                          ChunkSink*) override {
    return UnimplementedError("fake");
  }
  Status Read(size_t, uint64_t, uint64_t, uint8_t*) override { return UnimplementedError("fake"); }
  Status ReadTarget(const TensorView&, uint64_t, uint64_t, uint8_t*) override {
    return UnimplementedError("fake");
  }
  Status Advance(const Manifest&, const std::vector<TensorView>&) override {
    return UnimplementedError("fake");
  }
  Status ForEachSnapshotFile(const SnapshotFileFn&) override { return UnimplementedError("fake"); }

 private:
  std::vector<TensorView> views_;
};

// GPU publishers never emit conditional chunks: asking for them is refused
// when the publisher opens, before it reads or writes the store.
TEST(PublisherOptionsTest, ConditionalChunksNeedAHostBaseline) {
  MemoryStore store;
  PublisherOptions o;
  o.members = {"r0"};
  o.diff.allow_conditional = true;
  auto pub = Publisher::Open(&store, std::make_unique<DeviceLikeBaseline>(), o);
  EXPECT_THAT(pub, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(pub.status().message().find("conditional"), std::string::npos);
  auto keys = store.List("");
  ASSERT_OK(keys);
  EXPECT_TRUE(keys->empty());
}

// Reads member `member`'s vote on `version`, or nullopt when there is none.
std::optional<Vote> VoteOf(ObjectStore* store, uint64_t version, const std::string& member) {
  auto bytes = store->Get(VoteKey(version, member));
  if (!bytes.ok()) return std::nullopt;
  auto body = Key().OpenMember(*bytes);
  if (!body.ok()) return std::nullopt;
  auto vote = DecodeVote(*body);
  if (!vote.ok()) return std::nullopt;
  return *vote;
}

// A publisher whose baseline is not the store's head version (here: the
// base model, while head is version 2) is refused before it writes
// anything: its announcement would carry hashes no receiver holds.
TEST_P(SyncTest, PublisherWithAnotherBaselineIsRefusedBeforeItWritesAnything) {
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), MakePublisher(1));
  ASSERT_OK(pub);
  std::vector<std::unique_ptr<Receiver>> rcv;
  auto r0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r0);
  rcv.push_back(std::move(*r0));
  Model trainer = model_;
  std::mt19937_64 rng(51);
  for (uint64_t v = 1; v <= 2; ++v) {
    trainer.Step(rng, 0.03);
    ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, rcv, v, trainer, 20000));
  }
  model_.Write(dir_.File("stale.safetensors"));  // version 0's weights
  auto stale = Publisher::Open(store_.get(), dir_.File("stale.safetensors"), MakePublisher(1));
  ASSERT_OK(stale);
  auto listed_before = store_->List("");
  ASSERT_OK(listed_before);
  Model next = trainer;
  next.Step(rng, 0.03);
  auto refused = (*stale)->Publish(3, next.Views());
  EXPECT_THAT(refused, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_NE(refused.status().message().find("version 2"), std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("a.weight"), std::string::npos)
      << refused.status().ToString();
  auto listed_after = store_->List("");
  ASSERT_OK(listed_after);
  EXPECT_EQ(listed_after->size(), listed_before->size()) << "the refused publisher wrote";
  EXPECT_FALSE(store_->Get(IndexKey(3)).ok());
  // The right baseline publishes version 3 as usual.
  ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, rcv, 3, next, 20000));
}

// The baseline's file written by someone else between versions: the
// publisher's kept digests no longer describe it, but its stamps changed,
// so the diff hashes its bytes and the version is refused before its
// manifest.
TEST_P(SyncTest, BaselineChangedBetweenVersionsIsRefusedBeforeItsManifest) {
  const std::string baseline = dir_.File("baseline.safetensors");
  std::unique_ptr<Publisher> pub;
  std::vector<std::unique_ptr<Receiver>> rcv;
  Model trainer = model_;
  std::mt19937_64 rng(61);
  ASSERT_NO_FATAL_FAILURE(PublishVersionOne(rng, &pub, &rcv, &trainer));
  // Timestamps tick coarsely: a write in the tick of the advance's sync
  // could keep the stamp.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    auto ck = Checkpoint::Open(baseline, Checkpoint::Mode::kReadOnly);
    ASSERT_OK(ck);
    std::vector<uint8_t> flipped = {static_cast<uint8_t>(ck->Data(0)[3] ^ 1)};
    ASSERT_OK(WriteFileRange(baseline, ck->tensors()[0].offset + 3, flipped, false));
  }
  Model next = trainer;
  next.Step(rng, 0.03);
  EXPECT_THAT(pub->Publish(2, next.Views()), StatusIs(StatusCode::kDataLoss));
  EXPECT_FALSE(store_->Get(ManifestKey(2)).ok());
}

// A version announced on a base this receiver does not hold (its
// publisher's baseline was another model; the store had no manifest to
// check it against) is not applied: the receiver votes failed at once, so
// the publisher aborts without waiting for its deadline, and the next step
// rolls back and follows the next version with no manual step.
TEST_P(SyncTest, ReceiverOffTheAnnouncedBaseVotesFailedAndFollowsTheNextVersion) {
  Model other(77);
  other.Write(dir_.File("other.safetensors"));
  auto popts = MakePublisher(1);
  popts.vote_timeout_ms = 5000;
  auto wrong = Publisher::Open(store_.get(), dir_.File("other.safetensors"), popts);
  ASSERT_OK(wrong);
  auto opts = MakeReceiver(0);
  auto r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  Model bad = other;
  std::mt19937_64 rng(52);
  bad.Step(rng, 0.03);
  Result<StepResult> step = InternalError("not run");
  std::thread t = StepUntilBusy(r0->get(), &step, 2000);
  auto report = (*wrong)->Publish(1, bad.Views());
  t.join();
  ASSERT_OK(report);
  EXPECT_FALSE(report->committed);
  EXPECT_LT(report->commit_seconds, 2.5) << "the publisher waited for its deadline";
  EXPECT_NE(report->reason.find("r0"), std::string::npos) << report->reason;
  EXPECT_FALSE(step.ok());
  auto vote = VoteOf(store_.get(), 1, "r0");
  ASSERT_TRUE(vote.has_value());
  EXPECT_FALSE(vote->ready);
  EXPECT_NE(vote->message.find("a.weight"), std::string::npos) << vote->message;
  EXPECT_TRUE(model_.Matches(opts.checkpoint));

  // The next step rolls the aborted version back (nothing of it was
  // written), and the receiver follows the next version.
  auto rolled = (*r0)->Step();
  ASSERT_OK(rolled);
  EXPECT_EQ(rolled->outcome, StepResult::Outcome::kAborted);
  EXPECT_FALSE(PathExists(opts.state_dir + "/journal"));
  EXPECT_TRUE(model_.Matches(opts.checkpoint));
  ExpectFollowsTheNextVersion(std::move(*r0), opts.checkpoint, rng);
}

// The announcement's base hashes are checked against the active version's
// manifest before anything is journaled or written: a version built on
// another baseline is voted failed at once and then passed over.
TEST_P(SyncTest, AnnouncementOnAnotherBaselineIsVotedFailedBeforeAnythingIsWritten) {
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), MakePublisher(1));
  ASSERT_OK(pub);
  auto opts = MakeReceiver(0);
  std::vector<std::unique_ptr<Receiver>> rcv;
  auto r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  rcv.push_back(std::move(*r0));
  Model trainer = model_;
  std::mt19937_64 rng(53);
  trainer.Step(rng, 0.03);
  ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, rcv, 1, trainer, 20000));
  // Version 2 on base 1, announced with version 0's hashes (as a publisher
  // started with a stale baseline would).
  auto a1 = store_->Get(IndexKey(1));
  ASSERT_OK(a1);
  auto body = Key().Open(*a1);
  ASSERT_OK(body);
  auto a = DecodeAnnouncement(*body);
  ASSERT_OK(a);
  a->version = 2;
  a->base_version = 1;
  ASSERT_OK(store_->Put(IndexKey(2), Key().Seal(EncodeAnnouncement(*a))));
  auto before = testing::ReadBytes(opts.checkpoint);
  auto s = rcv[0]->Step();
  EXPECT_THAT(s, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_NE(s.status().message().find("version 1"), std::string::npos) << s.status().ToString();
  auto vote = VoteOf(store_.get(), 2, "r0");
  ASSERT_TRUE(vote.has_value());
  EXPECT_FALSE(vote->ready);
  EXPECT_FALSE(PathExists(opts.state_dir + "/journal"));
  EXPECT_EQ(testing::ReadBytes(opts.checkpoint), before);
  // Once aborted, the version is passed over and the next one followed.
  Decision d{2, false, {}, "member failed", {}};
  ASSERT_OK(store_->PutIfAbsent(DecisionKey(2), Key().Seal(EncodeDecision(d))));
  auto idle = rcv[0]->Step();
  ASSERT_OK(idle);
  EXPECT_EQ(idle->outcome, StepResult::Outcome::kIdle);
  trainer.Step(rng, 0.03);
  ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, rcv, 3, trainer, 20000));
  EXPECT_TRUE(trainer.Matches(opts.checkpoint));
}

// A chunk modified in the store: the receiver votes failed at once (the
// publisher aborts without waiting for its deadline), the next step rolls
// back what was applied although the modified chunk is still there, and
// the receiver follows the next version.
TEST_P(SyncTest, CorruptChunkIsVotedFailedRolledBackAndTheNextVersionFollowed) {
  auto popts = MakePublisher(1);
  popts.vote_timeout_ms = 5000;
  GateStore gate(store_.get(), ManifestKey(1));
  auto pub = Publisher::Open(&gate, dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  Model trainer = model_;
  std::mt19937_64 rng(54);
  trainer.Step(rng, 0.05);
  Result<PublishReport> report = InternalError("not run");
  std::thread pt([&] { report = (*pub)->Publish(1, trainer.Views()); });
  for (int i = 0; i < 10000 && !gate.held(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(gate.held());
  auto chunks = store_->List(VersionPrefix(1) + "chunk/");
  ASSERT_OK(chunks);
  ASSERT_GE(chunks->size(), 3u);
  const std::string key = chunks->back().key;
  auto original = store_->Get(key);
  ASSERT_OK(original);
  auto bad = *original;
  bad[bad.size() / 2] ^= 1;
  ASSERT_OK(store_->Put(key, bad));
  gate.Release();
  auto opts = MakeReceiver(0);
  auto r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  // The same bytes in consecutive steps: the stored object, not a read
  // damaged on the way; then the receiver votes failed. Which check
  // catches it depends on whether the manifest (released just above) has
  // landed when the chunk is fetched: its hash (DATA_LOSS) or, before it,
  // the chunk's authentication tag (UNAUTHENTICATED).
  for (int n = 0; n < 10 && !(*r0)->failed_vote(); ++n) {
    auto s = (*r0)->Step();
    EXPECT_TRUE(s.status().code() == StatusCode::kDataLoss ||
                s.status().code() == StatusCode::kUnauthenticated)
        << s.status().ToString();
  }
  pt.join();
  EXPECT_EQ((*r0)->failed_vote(), std::optional<uint64_t>(1));
  EXPECT_GT((*r0)->chunks_applied_total(), 0u);
  ASSERT_OK(report);
  EXPECT_FALSE(report->committed);
  EXPECT_LT(report->commit_seconds, 2.5) << "the publisher waited for its deadline";
  auto vote = VoteOf(store_.get(), 1, "r0");
  ASSERT_TRUE(vote.has_value());
  EXPECT_FALSE(vote->ready);

  // Restarted (as the CLI would), with the modified chunk still stored.
  r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  auto rolled = (*r0)->Step();
  ASSERT_OK(rolled);
  EXPECT_EQ(rolled->outcome, StepResult::Outcome::kAborted);
  EXPECT_TRUE(model_.Matches(opts.checkpoint));
  EXPECT_FALSE(PathExists(opts.state_dir + "/journal"));
  ExpectFollowsTheNextVersion(std::move(*r0), opts.checkpoint, rng);
}

// Re-publishing a decided version resumes only when the target is that
// version's content; other weights under a used number are refused.
TEST_P(SyncTest, ReusedVersionNumberWithOtherWeightsIsRefused) {
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), MakePublisher(1));
  ASSERT_OK(pub);
  std::vector<std::unique_ptr<Receiver>> rcv;
  auto r0 = Receiver::Open(store_.get(), MakeReceiver(0));
  ASSERT_OK(r0);
  rcv.push_back(std::move(*r0));
  Model trainer = model_;
  std::mt19937_64 rng(55);
  trainer.Step(rng, 0.03);
  ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, rcv, 1, trainer, 20000));
  Model v1 = trainer;
  trainer.Step(rng, 0.03);
  ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, rcv, 2, trainer, 20000));
  EXPECT_OK((*pub)->CheckPublished(2, trainer.Views()));
  EXPECT_OK((*pub)->CheckPublished(1, v1.Views()));
  Status s = (*pub)->CheckPublished(2, model_.Views());
  EXPECT_THAT(s, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("head"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("version 2"), std::string::npos) << s.ToString();
  EXPECT_THAT((*pub)->CheckPublished(7, trainer.Views()),
              StatusIs(StatusCode::kNotFound));
}

// Chunk packs (docs/protocol.md, "Chunk packs"): the framing round-trips
// and refuses damage; a manifest places packed chunks after the previous
// chunk of their pack and nowhere else.
TEST(ProtocolTest, ChunkPacksRoundTripAndRefuseDamage) {
  const std::vector<std::vector<uint8_t>> objects = {{'R', 'F', 'A', 'E', 1}, {7, 8}, {9}};
  const std::vector<uint8_t> pack = EncodePack(objects);
  EXPECT_TRUE(IsPack(pack));
  EXPECT_FALSE(IsPack(objects[0]));
  auto elements = DecodePack(pack);
  ASSERT_OK(elements);
  ASSERT_EQ(elements->size(), 3u);
  for (size_t i = 0; i < objects.size(); ++i) {
    EXPECT_EQ(std::vector<uint8_t>((*elements)[i].begin(), (*elements)[i].end()), objects[i]);
  }
  for (size_t n = 0; n < pack.size(); ++n) {
    EXPECT_THAT(DecodePack(std::span<const uint8_t>(pack.data(), n)),
                StatusIs(StatusCode::kDataLoss)) << n;
  }
  for (size_t i = 4; i < pack.size(); ++i) {
    std::vector<uint8_t> bad = pack;
    bad[i] ^= 0x10;
    EXPECT_THAT(DecodePack(bad), StatusIs(StatusCode::kDataLoss)) << i;
  }
  EXPECT_THAT(DecodePack(EncodePack({})), StatusIs(StatusCode::kDataLoss));

  Manifest m;
  m.version = 5;
  m.base_version = 4;
  m.members = {"r0"};
  TensorEntry e;
  e.name = "w";
  e.dtype = "BF16";
  e.width = 2;
  e.shape = {300};
  e.num_elements = 300;
  m.tensors = {e};
  for (uint64_t i = 0; i < 3; ++i) {
    ManifestChunk c;
    c.size = 10;
    c.start = i * 100;
    c.count = 100;
    c.changed = 1;
    c.kind = 1;
    c.pack_offset = i;  // chunks 0..2: one pack at chunk 0's key
    m.chunks.push_back(c);
  }
  auto back = DecodeManifest(EncodeManifest(m));
  ASSERT_OK(back);
  EXPECT_EQ(back->chunks[2].pack_offset, 2u);
  EXPECT_EQ(ManifestChunkKey(*back, 2), ChunkKey(5, 0));
  EXPECT_EQ(ManifestChunkKey(*back, 0), ChunkKey(5, 0));
  m.chunks[2].pack_offset = 1;  // does not follow chunk 1 in its pack
  EXPECT_THAT(DecodeManifest(EncodeManifest(m)), StatusIs(StatusCode::kDataLoss));
  m.chunks[1].pack_offset = 0;
  m.chunks[2].pack_offset = 2;
  EXPECT_THAT(DecodeManifest(EncodeManifest(m)), StatusIs(StatusCode::kDataLoss));
  // A rank's part chunks in a pack of its part: the manifest interleaves
  // ranks, so a packed part chunk is placed by its part index alone.
  m.direct = true;
  for (uint64_t i = 0; i < 3; ++i) {
    m.chunks[i].in_part = true;
    m.chunks[i].rank = i == 1 ? 1 : 0;
    m.chunks[i].part_index = i == 1 ? 0 : 4 + i / 2;
    m.chunks[i].pack_offset = i == 1 ? 0 : 2 + i / 2;
  }
  auto parts = DecodeManifest(EncodeManifest(m));
  ASSERT_OK(parts);
  EXPECT_EQ(parts->chunks[2].pack_offset, 3u);
  EXPECT_EQ(ManifestChunkKey(*parts, 0), PartChunkKey(5, 0, 2));
  EXPECT_EQ(ManifestChunkKey(*parts, 1), PartChunkKey(5, 1, 0));
  EXPECT_EQ(ManifestChunkKey(*parts, 2), PartChunkKey(5, 0, 2));
  m.chunks[2].pack_offset = 6;  // before the part's first chunk
  EXPECT_THAT(DecodeManifest(EncodeManifest(m)), StatusIs(StatusCode::kDataLoss));
}

// Small chunks gathered into packs reach every receiver bit-exact, with
// fewer objects than chunks; a receiver joining late folds the packed
// versions into one pass; a torn chunk inside a pack is re-sent.
TEST_P(SyncTest, PackedVersionsReachReceiversAndTornChunksAreResent) {
  auto popts = MakePublisher(2);
  popts.pack_bytes = 8192;  // packs of a few 3%-changed chunks of 64 KiB
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  std::vector<std::unique_ptr<Receiver>> rcv;
  for (int i = 0; i < 2; ++i) {
    auto r = Receiver::Open(store_.get(), MakeReceiver(i));
    ASSERT_OK(r);
    rcv.push_back(std::move(*r));
  }
  std::mt19937_64 rng(61);
  Model trainer = model_;
  for (uint64_t v = 1; v <= 3; ++v) {
    trainer.Step(rng, 0.03);
    ASSERT_NO_FATAL_FAILURE(testing::PublishToAll(**pub, rcv, v, trainer, 20000));
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(trainer.Matches(dir_.File("r" + std::to_string(i) + "/model.safetensors")));
    }
    auto stored = store_->Get(ManifestKey(v));
    ASSERT_OK(stored);
    auto body = Key().Open(*stored);
    ASSERT_OK(body);
    auto m = DecodeManifest(*body);
    ASSERT_OK(m);
    auto objects = store_->List(VersionPrefix(v) + "chunk/");
    ASSERT_OK(objects);
    EXPECT_LT(objects->size(), m->chunks.size()) << "version " << v;
    EXPECT_GT(std::count_if(m->chunks.begin(), m->chunks.end(),
                            [](const ManifestChunk& c) { return c.pack_offset > 0; }),
              0);
  }
  auto late_opts = MakeReceiver(2);
  auto late = Receiver::Open(store_.get(), late_opts);
  ASSERT_OK(late);
  auto caught = (*late)->SyncTo(3, 20000);
  ASSERT_OK(caught);
  EXPECT_EQ(caught->versions_folded, 3u);  // the packed versions fold into one pass
  EXPECT_TRUE(trainer.Matches(late_opts.checkpoint));

  // A receiver killed in the middle of a chunk that is not first in its
  // pack: the publisher finds the chunk in its pack and re-sends it.
  trainer.Step(rng, 0.03);
  auto opts = MakeReceiver(0);
  std::thread pub_thread([&] {
    auto report = (*pub)->Publish(4, trainer.Views());
    EXPECT_OK(report);
    if (report.ok()) {
      EXPECT_TRUE(report->committed) << report->reason;
    }
  });
  Result<Manifest> m4 = NotFoundError("no manifest yet");
  for (int i = 0; i < 5000 && !m4.ok(); ++i) {
    if (auto b = store_->Get(ManifestKey(4)); b.ok()) {
      auto body = Key().Open(*b);
      ASSERT_OK(body);
      m4 = DecodeManifest(*body);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  ASSERT_OK(m4);
  auto packed = std::find_if(m4->chunks.begin(), m4->chunks.end(),
                             [](const ManifestChunk& c) { return c.pack_offset > 0; });
  ASSERT_NE(packed, m4->chunks.end());
  {
    auto ann = store_->Get(IndexKey(4));
    ASSERT_OK(ann);
    auto ck = Checkpoint::Open(opts.checkpoint, Checkpoint::Mode::kReadWrite);
    ASSERT_OK(ck);
    const std::string& name = m4->tensors[packed->tensor_id].name;
    auto d = ck->MutableData(*ck->IndexOf(name));
    const auto& target =
        trainer.data[std::find(trainer.names.begin(), trainer.names.end(), name) -
                     trainer.names.begin()];
    size_t copied = 0;
    for (uint64_t i = packed->start * 2; i < (packed->start + packed->count) * 2 && copied < 5;
         i += 2) {
      if (d[i] != target[i]) {
        d[i] = target[i];
        ++copied;
      }
    }
    ASSERT_GT(copied, 0u);
    ASSERT_OK(ck->Sync());
    ASSERT_OK(Journal::Begin(dir_.File("r0/journal"), 4, 3, ComputeSha256(*ann)));
  }
  auto r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  std::thread r1_thread([&] { EXPECT_OK(rcv[1]->SyncTo(4, 20000)); });
  auto s = (*r0)->SyncTo(4, 20000);
  r1_thread.join();
  pub_thread.join();
  ASSERT_OK(s);
  EXPECT_GE(s->chunks_resent, 1u);
  EXPECT_TRUE(trainer.Matches(opts.checkpoint));
}

// A packed version whose publisher died before its manifest: the receiver
// applied the packs it found and rolls them back without a manifest,
// walking the packs from chunk 0.
TEST_P(SyncTest, PackedVersionWithoutManifestIsRolledBack) {
  GateStore gate(store_.get(), ManifestKey(1));
  gate.Refuse();
  auto popts = MakePublisher(1);
  popts.pack_bytes = 8192;
  auto pub = Publisher::Open(&gate, dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  auto opts = MakeReceiver(0);
  opts.chunk_timeout_ms = 400;
  auto r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  Model trainer = model_;
  std::mt19937_64 rng(62);
  trainer.Step(rng, 0.03);
  ASSERT_FALSE((*pub)->Publish(1, trainer.Views()).ok());
  auto objects = store_->List(VersionPrefix(1) + "chunk/");
  ASSERT_OK(objects);
  EXPECT_THAT((*r0)->Step(), StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_GT((*r0)->chunks_applied_total(), objects->size());  // packs of several chunks
  EXPECT_FALSE(model_.Matches(opts.checkpoint));

  Model next = model_;
  next.Step(rng, 0.02);
  auto pub2 = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), popts);
  ASSERT_OK(pub2);
  r0 = Receiver::Open(store_.get(), opts);
  ASSERT_OK(r0);
  std::vector<StepResult> outcomes;
  std::thread follow([&] {
    for (int i = 0; i < 200 && (*r0)->active_version() < 2; ++i) {
      auto s = (*r0)->Step();
      if (s.ok() && s->outcome != StepResult::Outcome::kIdle) outcomes.push_back(*s);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  auto report = (*pub2)->Publish(2, next.Views());
  follow.join();
  ASSERT_OK(report);
  EXPECT_TRUE(report->committed) << report->reason;
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[0].outcome, StepResult::Outcome::kAborted);
  EXPECT_EQ(outcomes[1].outcome, StepResult::Outcome::kCommitted);
  EXPECT_TRUE(next.Matches(opts.checkpoint));
}

INSTANTIATE_TEST_SUITE_P(Stores, SyncTest, ::testing::Values("dir", "s3"),
                         [](const auto& param_info) { return param_info.param; });
}  // namespace
}  // namespace refit
