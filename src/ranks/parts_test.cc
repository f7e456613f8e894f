// Versions from many ranks: four trainer ranks (TP 2 x DP 2) publish their
// parts concurrently, the coordinator assembles and publishes each version,
// two receivers follow; every receiver ends bit-exact with the canonical
// target, and ranks advance their baselines only on commit.
#include "ranks/parts.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <thread>

#include "base/file.h"
#include "base/hash.h"
#include "format/safetensors.h"
#include "layout/generate.h"
#include "support/status_matchers.h"
#include "support/test_layout.h"
#include "support/testing.h"
#include "sync/chunk_pack.h"
#include "sync/receiver.h"

namespace refit::ranks {
namespace {

using ::refit::testing::StatusIs;

using layout::Layout;
using layout::testing::TensorBytes;
using testing::TempDir;

Authenticator Key() {
  auto a = Authenticator::Hmac(std::vector<uint8_t>(32, 7));
  EXPECT_TRUE(a.ok());
  return *a;
}

Layout SmallLayout() {
  layout::ModelConfig m;
  m.model_type = "qwen2";
  m.hidden_size = 64;
  m.intermediate_size = 96;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 16;
  m.vocab_size = 200;
  m.attention_bias = true;
  layout::Parallelism p;
  p.tp = 2;
  p.dp = 2;
  p.gate_up = layout::GateUp::kInterleaved;
  p.gate_up_group = 8;
  auto l = layout::GenerateLayout(m, p);
  EXPECT_OK(l);
  return *l;
}

void Write(const std::string& path, const Layout& l, const TensorBytes& t) {
  std::vector<SafetensorsTensorView> views;
  for (const auto& c : l.canonical) views.push_back({c.name, c.dtype, c.shape, t.at(c.name)});
  ASSERT_TRUE(WriteSafetensors(path, {}, views).ok());
}

bool Matches(const std::string& path, const TensorBytes& t) {
  auto ck = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
  if (!ck.ok()) return false;
  for (size_t i = 0; i < ck->tensors().size(); ++i) {
    auto d = ck->Data(i);
    const auto& want = t.at(ck->tensors()[i].name);
    if (!std::equal(d.begin(), d.end(), want.begin(), want.end())) return false;
  }
  return true;
}

std::vector<TensorView> LocalViews(const Layout& l, size_t ri, const TensorBytes& b) {
  std::vector<TensorView> v;
  for (const auto& t : l.ranks[ri].tensors) v.push_back({t.name, t.dtype, 2, t.shape, b.at(t.name).data()});
  return v;
}

class PartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = SmallLayout();
    std::mt19937_64 rng(1);
    for (const auto& c : layout_.canonical) {
      uint64_t n = 1;
      for (uint64_t d : c.shape) n *= d;
      std::vector<uint8_t> b(n * 2);
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      canon_[c.name] = std::move(b);
    }
    Write(dir_.File("baseline.safetensors"), layout_, canon_);
    for (int r = 0; r < 2; ++r) {
      std::filesystem::create_directories(dir_.File("r" + std::to_string(r)));
      Write(dir_.File("r" + std::to_string(r) + "/model.safetensors"), layout_, canon_);
    }
    auto s = OpenObjectStore(dir_.File("store"));
    ASSERT_TRUE(s.ok());
    store_ = std::move(*s);
    auto p = OpenObjectStore(dir_.File("parts"));
    ASSERT_TRUE(p.ok());
    parts_ = std::move(*p);
    PublisherOptions po;
    po.members = {"r0", "r1"};
    po.auth = Key();
    po.poll_ms = 2;
    po.vote_timeout_ms = 20000;
    po.diff.chunk_bytes = 64 * 1024;
    auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), po);
    ASSERT_OK(pub);
    publisher_ = std::move(*pub);
    CoordinatorOptions co;
    for (const auto& r : layout_.ranks) co.ranks.push_back(r.rank);
    co.auth = Key();
    co.poll_ms = 2;
    co.parts_timeout_ms = 20000;
    auto c = PartsCoordinator::Open(parts_.get(), publisher_.get(),
                                    dir_.File("baseline.safetensors"),
                                    dir_.File("staging.safetensors"), co);
    ASSERT_OK(c);
    coordinator_ = std::move(*c);
    auto local = layout::testing::ScatterToRanks(layout_, canon_);
    ASSERT_TRUE(local.ok());
    local_ = *local;
    for (size_t ri = 0; ri < layout_.ranks.size(); ++ri) {
      auto e = trainer::RankEncoder::Create(layout_, layout_.ranks[ri].rank, {});
      ASSERT_OK(e);
      ASSERT_TRUE((*e)->SetBaselineFromLocal(LocalViews(layout_, ri, local_[ri])).ok());
      RankPublisherOptions ro;
      ro.auth = Key();
      ro.poll_ms = 2;
      ro.pack_bytes = pack_bytes_;
      auto rp = RankPublisher::Open(parts_.get(), store_.get(), e->get(), layout_.ranks[ri].rank,
                                    0, ro);
      ASSERT_TRUE(rp.ok());
      encoders_.push_back(std::move(*e));
      ranks_.push_back(std::move(*rp));
    }
  }

  ReceiverOptions MakeReceiver(int i) {
    ReceiverOptions o;
    o.member = "r" + std::to_string(i);
    o.checkpoint = dir_.File(o.member + "/model.safetensors");
    o.state_dir = dir_.File(o.member);
    o.auth = Key();
    o.poll_ms = 2;
    o.decision_timeout_ms = 20000;
    return o;
  }

  // One training step on the canonical model, scattered to every rank.
  void Step(std::mt19937_64& rng) {
    std::uniform_real_distribution<double> u(0, 1);
    for (auto& [name, b] : canon_) {
      for (size_t i = 0; i < b.size(); i += 2) {
        if (u(rng) < 0.03) b[i] ^= static_cast<uint8_t>(1 + rng() % 3);
      }
    }
    auto local = layout::testing::ScatterToRanks(layout_, canon_);
    ASSERT_TRUE(local.ok());
    local_ = *local;
  }

  // Two receivers, each opened and synced to `version` on its own thread;
  // the caller joins them.
  std::vector<std::thread> SyncReceivers(uint64_t version) {
    std::vector<std::thread> receivers;
    for (int i = 0; i < 2; ++i) {
      receivers.emplace_back([this, i, version] {
        auto r = Receiver::Open(store_.get(), MakeReceiver(i));
        ASSERT_OK(r);
        EXPECT_OK((*r)->SyncTo(version, 30000));
      });
    }
    return receivers;
  }

  // Both receivers hold the canonical model, and every rank learned that
  // `version` committed.
  void ExpectEveryoneHolds(uint64_t version) {
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(Matches(dir_.File("r" + std::to_string(i) + "/model.safetensors"), canon_))
          << "receiver " << i << " version " << version;
    }
    for (auto& r : ranks_) {
      auto d = r->AwaitDecision(10000);
      ASSERT_OK(d);
      EXPECT_TRUE(*d);
      EXPECT_EQ(r->committed_version(), version);
    }
  }

  // Every rank publishes its part on its own thread.
  void PublishParts(uint64_t version) {
    std::vector<std::thread> threads;
    std::vector<Status> results(ranks_.size());
    for (size_t ri = 0; ri < ranks_.size(); ++ri) {
      threads.emplace_back([&, ri] {
        results[ri] = ranks_[ri]->Publish(version, LocalViews(layout_, ri, local_[ri])).status();
      });
    }
    for (auto& t : threads) t.join();
    for (const Status& s : results) ASSERT_OK(s);
  }

  // The part list of `rank`'s part of `version`, as stored.
  Result<PartList> StoredList(uint64_t version, uint32_t rank) {
    REFIT_ASSIGN_OR_RETURN(auto bytes, parts_->Get(PartListKey(version, rank)));
    REFIT_ASSIGN_OR_RETURN(auto body, Key().Open(bytes));
    return DecodePartList(body);
  }

  uint64_t pack_bytes_ = 0;  // the ranks' RankPublisherOptions::pack_bytes
  TempDir dir_;
  Layout layout_;
  TensorBytes canon_;
  std::vector<TensorBytes> local_;
  std::unique_ptr<ObjectStore> store_, parts_;
  std::unique_ptr<Publisher> publisher_;
  std::unique_ptr<PartsCoordinator> coordinator_;
  std::vector<std::unique_ptr<trainer::RankEncoder>> encoders_;
  std::vector<std::unique_ptr<RankPublisher>> ranks_;
};

TEST_F(PartsTest, RanksPartsBecomeVersionsEveryReceiverHolds) {
  std::mt19937_64 rng(2);
  for (uint64_t version = 1; version <= 3; ++version) {
    Step(rng);
    std::vector<std::thread> receivers = SyncReceivers(version);
    // The coordinator starts first and waits for the parts.
    Result<CoordinatedReport> report = InternalError("not run");
    std::thread coord([&] { report = coordinator_->Publish(version); });
    PublishParts(version);
    coord.join();
    for (auto& t : receivers) t.join();
    ASSERT_OK(report);
    EXPECT_TRUE(report->publish.committed);
    EXPECT_GT(report->part_chunks, 0u);
    EXPECT_GT(report->changed_elements, 0u);
    EXPECT_EQ(report->changed_elements, report->publish.diff.changed_elements);
    ExpectEveryoneHolds(version);
  }
}

TEST_F(PartsTest, MissingPartPublishesNothingAndAbortedVersionsKeepBaselines) {
  std::mt19937_64 rng(3);
  Step(rng);
  // Rank 3 never reports: the coordinator gives up, nothing is announced.
  CoordinatorOptions co;
  for (const auto& r : layout_.ranks) co.ranks.push_back(r.rank);
  co.auth = Key();
  co.poll_ms = 2;
  co.parts_timeout_ms = 300;
  auto c = PartsCoordinator::Open(parts_.get(), publisher_.get(),
                                  dir_.File("baseline.safetensors"),
                                  dir_.File("staging.safetensors"), co);
  ASSERT_TRUE(c.ok());
  for (size_t ri = 0; ri + 1 < ranks_.size(); ++ri) {
    ASSERT_TRUE(ranks_[ri]->Publish(1, LocalViews(layout_, ri, local_[ri])).ok());
  }
  auto missing = (*c)->Publish(1);
  ASSERT_THAT(missing, StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_NE(missing.status().message().find("rank(s) 3"), std::string::npos);
  auto listed = store_->List("");
  ASSERT_TRUE(listed.ok());
  for (const auto& o : *listed) EXPECT_EQ(o.key.rfind("v/", 0), std::string::npos) << o.key;

  // The last part arrives; no receiver votes, so the version aborts and
  // the ranks keep their baselines.
  ASSERT_TRUE(ranks_.back()->Publish(1, LocalViews(layout_, ranks_.size() - 1, local_.back())).ok());
  PublisherOptions po;
  po.members = {"r0", "r1"};
  po.auth = Key();
  po.poll_ms = 2;
  po.vote_timeout_ms = 200;
  po.diff.chunk_bytes = 64 * 1024;
  publisher_.reset();
  auto pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), po);
  ASSERT_TRUE(pub.ok());
  publisher_ = std::move(*pub);
  co.parts_timeout_ms = 5000;
  c = PartsCoordinator::Open(parts_.get(), publisher_.get(), dir_.File("baseline.safetensors"),
                             dir_.File("staging.safetensors"), co);
  ASSERT_TRUE(c.ok());
  auto aborted = (*c)->Publish(1);
  ASSERT_OK(aborted);
  EXPECT_FALSE(aborted->publish.committed);
  for (auto& r : ranks_) {
    auto d = r->AwaitDecision(5000);
    ASSERT_TRUE(d.ok());
    EXPECT_FALSE(*d);
    EXPECT_EQ(r->committed_version(), 0u);
  }
  // Version 2 from the same base carries the same step, and commits.
  po.vote_timeout_ms = 20000;
  publisher_.reset();
  pub = Publisher::Open(store_.get(), dir_.File("baseline.safetensors"), po);
  ASSERT_TRUE(pub.ok());
  publisher_ = std::move(*pub);
  c = PartsCoordinator::Open(parts_.get(), publisher_.get(), dir_.File("baseline.safetensors"),
                             dir_.File("staging.safetensors"), co);
  ASSERT_TRUE(c.ok());
  std::vector<std::thread> receivers = SyncReceivers(2);
  Result<CoordinatedReport> report = InternalError("not run");
  std::thread coord([&] { report = (*c)->Publish(2); });
  PublishParts(2);
  coord.join();
  for (auto& t : receivers) t.join();
  ASSERT_OK(report);
  EXPECT_TRUE(report->publish.committed);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(Matches(dir_.File("r" + std::to_string(i) + "/model.safetensors"), canon_));
  }
}

TEST_F(PartsTest, TamperedOrForeignPartsAreRefused) {
  std::mt19937_64 rng(4);
  Step(rng);
  PublishParts(1);
  // A chunk object replaced by other bytes: its SHA-256 is not the list's.
  const std::string key = PartChunkKey(1, layout_.ranks[1].rank, 0);
  auto bytes = parts_->Get(key);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() / 2] ^= 1;
  ASSERT_TRUE(parts_->Put(key, *bytes).ok());
  auto bad = coordinator_->Publish(1);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad, StatusIs(StatusCode::kDataLoss));
  // The staging copy was rolled back: the coordinator reopens on it as is.
  CoordinatorOptions co;
  co.ranks = {0};
  co.auth = Key();
  auto again = PartsCoordinator::Open(parts_.get(), publisher_.get(),
                                      dir_.File("baseline.safetensors"),
                                      dir_.File("staging.safetensors"), co);
  ASSERT_TRUE(again.ok());
  // A part list sealed with another key is refused before it is parsed.
  auto other = Authenticator::Hmac(std::vector<uint8_t>(32, 9));
  ASSERT_TRUE(other.ok());
  PartList forged;
  forged.version = 1;
  forged.rank = 0;
  ASSERT_TRUE(parts_->Put(PartListKey(1, 0), other->Seal(EncodePartList(forged))).ok());
  auto refused = (*again)->Publish(1);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused, StatusIs(StatusCode::kUnauthenticated));
}

// The same ranks with their chunks in chunk packs.
class PackedPartsTest : public PartsTest {
 protected:
  void SetUp() override {
    pack_bytes_ = 4096;
    PartsTest::SetUp();
  }
};

TEST_F(PackedPartsTest, PackedPartsAreAssembledIntoVersions) {
  std::mt19937_64 rng(6);
  for (uint64_t version = 1; version <= 2; ++version) {
    Step(rng);
    std::vector<std::thread> receivers = SyncReceivers(version);
    PublishParts(version);
    // The parts are in packs: a part's objects are its chunks less those
    // listed with an offset in a pack (part list format 3).
    uint64_t packed = 0;
    for (const auto& rank : layout_.ranks) {
      auto list = StoredList(version, rank.rank);
      ASSERT_OK(list);
      uint64_t in_packs = 0;
      for (const PartEntry& e : list->chunks) in_packs += e.pack_offset != 0;
      packed += in_packs;
      const std::string chunk0 = PartChunkKey(version, rank.rank, 0);
      auto objects = parts_->List(chunk0.substr(0, chunk0.rfind('/') + 1));
      ASSERT_OK(objects);
      EXPECT_EQ(objects->size() + in_packs, list->chunks.size()) << "rank " << rank.rank;
    }
    EXPECT_GT(packed, 0u);
    auto report = coordinator_->Publish(version);
    for (auto& t : receivers) t.join();
    ASSERT_OK(report);
    EXPECT_TRUE(report->publish.committed);
    EXPECT_EQ(report->changed_elements, report->publish.diff.changed_elements);
    ExpectEveryoneHolds(version);
  }
}

TEST_F(PackedPartsTest, TamperedPackIsRefused) {
  std::mt19937_64 rng(8);
  Step(rng);
  PublishParts(1);
  // The first pack of the first rank that stored one.
  std::string key;
  for (size_t ri = 0; ri < layout_.ranks.size() && key.empty(); ++ri) {
    auto list = StoredList(1, layout_.ranks[ri].rank);
    ASSERT_OK(list);
    for (size_t k = 1; k < list->chunks.size() && key.empty(); ++k) {
      if (list->chunks[k].pack_offset == 1) key = PartChunkKey(1, layout_.ranks[ri].rank, k - 1);
    }
  }
  ASSERT_FALSE(key.empty()) << "no rank stored a pack";
  auto original = parts_->Get(key);
  ASSERT_OK(original);
  ASSERT_TRUE(IsPack(*original));
  // Damaged: the pack's checksum fails.
  auto damaged = *original;
  damaged[damaged.size() / 2] ^= 1;
  ASSERT_OK(parts_->Put(key, damaged));
  EXPECT_THAT(coordinator_->Publish(1), StatusIs(StatusCode::kDataLoss));
  // A chunk in it altered and the pack framed again: the pack reads, the
  // chunk's SHA-256 is not the list's.
  auto elements = DecodePack(*original);
  ASSERT_OK(elements);
  std::vector<std::vector<uint8_t>> objects;
  for (auto e : *elements) objects.emplace_back(e.begin(), e.end());
  objects[1][objects[1].size() / 2] ^= 1;
  ASSERT_OK(parts_->Put(key, EncodePack(objects)));
  EXPECT_THAT(coordinator_->Publish(1), StatusIs(StatusCode::kDataLoss));
  // Intact again, the version is assembled from the staging copy rolled
  // back each time.
  ASSERT_OK(parts_->Put(key, *original));
  std::vector<std::thread> receivers = SyncReceivers(1);
  auto report = coordinator_->Publish(1);
  for (auto& t : receivers) t.join();
  ASSERT_OK(report);
  EXPECT_TRUE(report->publish.committed);
  EXPECT_TRUE(Matches(dir_.File("r0/model.safetensors"), canon_));
}

TEST(PartListTest, RoundTripAndCorruption) {
  PartList l;
  l.version = 9;
  l.base_version = 4;
  l.rank = 3;
  l.tensor_count = 51;
  l.names_hash = 0x1234;
  l.chunks.resize(2);
  l.chunks[0].size = 100;
  l.chunks[0].count = 64;
  l.chunks[0].changed = 3;
  l.chunks[0].kind = 1;
  l.chunks[1].size = 200;
  l.chunks[1].tensor_id = 4;
  l.chunks[1].start = 10;
  l.chunks[1].count = 24;
  l.chunks[1].run = 8;
  l.chunks[1].stride = 40;
  l.chunks[1].changed = 2;
  l.chunks[1].kind = 2;
  l.chunks[1].sha256[5] = 7;
  auto bytes = EncodePartList(l);
  auto back = DecodePartList(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->chunks.size(), 2u);
  EXPECT_EQ(back->chunks[1].sha256[5], 7);
  EXPECT_EQ(back->chunks[1].tensor_id, 4u);
  EXPECT_EQ(back->chunks[1].start, 10u);
  EXPECT_EQ(back->chunks[1].run, 8u);
  EXPECT_EQ(back->chunks[1].stride, 40u);
  EXPECT_EQ(back->chunks[1].kind, 2);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "RFPART02");
  // A packed chunk: format 3, with each chunk's offset in its pack.
  PartList packed = l;
  packed.chunks[1].pack_offset = 1;
  auto packed_bytes = EncodePartList(packed);
  EXPECT_EQ(std::string(packed_bytes.begin(), packed_bytes.begin() + 8), "RFPART03");
  auto packed_back = DecodePartList(packed_bytes);
  ASSERT_OK(packed_back);
  EXPECT_EQ(packed_back->chunks[0].pack_offset, 0u);
  EXPECT_EQ(packed_back->chunks[1].pack_offset, 1u);
  // An offset that does not follow the previous chunk's is refused.
  packed.chunks[1].pack_offset = 2;
  EXPECT_THAT(DecodePartList(EncodePartList(packed)), StatusIs(StatusCode::kDataLoss));
  packed.chunks[0].pack_offset = 1;
  packed.chunks[1].pack_offset = 2;
  EXPECT_THAT(DecodePartList(EncodePartList(packed)), StatusIs(StatusCode::kDataLoss));
  // A region not in canonical form is refused.
  PartList bad = l;
  bad.chunks[1].stride = 8;
  EXPECT_THAT(DecodePartList(EncodePartList(bad)), StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ(back->names_hash, 0x1234u);
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto c = bytes;
    c[i] ^= 0x10;
    EXPECT_FALSE(DecodePartList(c).ok()) << i;
  }
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodePartList(std::span(bytes).first(n)).ok()) << n;
  }
}

// The coordinator's streamed table equals the one hashed through the
// mappings, whatever the buffers and threads: a tensor of many buffers
// ending mid-segment, one of exactly one segment, an empty one, a scalar,
// and the tensors of two shards.
TEST(ReadTensorTableTest, EqualsTheMappedTable) {
  TempDir dir;
  std::mt19937_64 rng(11);
  auto bytes = [&](size_t n) {
    std::vector<uint8_t> b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    return b;
  };
  const std::vector<uint8_t> big = bytes(4 * (5 * kRangeHashSegment + 1000));
  const std::vector<uint8_t> one = bytes(kRangeHashSegment);
  const std::vector<uint8_t> scalar = bytes(2);
  const std::vector<uint8_t> other = bytes(3 * kRangeHashSegment / 2);
  std::filesystem::create_directories(dir.File("ck"));
  const std::vector<SafetensorsTensorView> first = {
      {"big", "F32", {5 * kRangeHashSegment + 1000}, big},
      {"empty", "BF16", {0, 16}, {}},
      {"one", "U8", {kRangeHashSegment}, one}};
  const std::vector<SafetensorsTensorView> second = {
      {"other", "I16", {3 * kRangeHashSegment / 4}, other}, {"scalar", "BF16", {}, scalar}};
  ASSERT_OK(WriteSafetensors(dir.File("ck/model-00001-of-00002.safetensors"), {}, first));
  ASSERT_OK(WriteSafetensors(dir.File("ck/model-00002-of-00002.safetensors"), {}, second));
  const std::string index = R"({"metadata": {}, "weight_map": {
      "big": "model-00001-of-00002.safetensors",
      "empty": "model-00001-of-00002.safetensors",
      "one": "model-00001-of-00002.safetensors",
      "other": "model-00002-of-00002.safetensors",
      "scalar": "model-00002-of-00002.safetensors"}})";
  ASSERT_OK(WriteFileAtomic(dir.File("ck/model.safetensors.index.json"),
                            {reinterpret_cast<const uint8_t*>(index.data()), index.size()}));
  auto ck = Checkpoint::Open(dir.File("ck"), Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  ASSERT_TRUE(ck->sharded());
  const std::vector<TensorEntry> mapped = TensorTableOf(*ck);
  ASSERT_EQ(mapped.size(), 5u);
  EXPECT_EQ(mapped[0].before, RangeHash(big.data(), big.size()));
  EXPECT_EQ(mapped[1].before, RangeHash(nullptr, 0));

  for (size_t buffer : {size_t{1}, kRangeHashSegment, 3 * kRangeHashSegment - 1,
                        TableReadOptions().buffer_bytes}) {
    for (int threads : {1, 3}) {
      SCOPED_TRACE("buffer " + std::to_string(buffer) + ", threads " + std::to_string(threads));
      auto streamed = ReadTensorTable(*ck, {.buffer_bytes = buffer, .threads = threads});
      ASSERT_OK(streamed);
      ASSERT_EQ(streamed->size(), mapped.size());
      for (size_t i = 0; i < mapped.size(); ++i) {
        const TensorEntry& a = mapped[i];
        const TensorEntry& b = (*streamed)[i];
        EXPECT_EQ(a.name, b.name);
        EXPECT_EQ(a.dtype, b.dtype);
        EXPECT_EQ(a.width, b.width);
        EXPECT_EQ(a.shape, b.shape);
        EXPECT_EQ(a.num_elements, b.num_elements);
        EXPECT_EQ(a.before, b.before) << a.name;
        EXPECT_EQ(a.after, b.after) << a.name;
      }
    }
  }
}

// A file that shrank or vanished after Open fails the read, naming the
// tensor and the file.
TEST(ReadTensorTableTest, ShortOrMissingFileNamesTensorAndFile) {
  TempDir dir;
  const std::vector<uint8_t> a(3 * kRangeHashSegment, 1);
  const std::vector<uint8_t> b(1000, 2);
  const std::string path = dir.File("m.safetensors");
  const std::vector<SafetensorsTensorView> views = {{"a", "U8", {a.size()}, a},
                                                    {"b", "U8", {b.size()}, b}};
  ASSERT_OK(WriteSafetensors(path, {}, views));
  auto ck = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  const TensorInfo& last = ck->tensors()[1];
  std::filesystem::resize_file(path, last.offset + 10);
  auto short_read = ReadTensorTable(*ck, {.buffer_bytes = kRangeHashSegment, .threads = 2});
  EXPECT_THAT(short_read, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(short_read.status().message().find("'b'"), std::string::npos)
      << short_read.status().message();
  EXPECT_NE(short_read.status().message().find(path), std::string::npos);

  std::filesystem::remove(path);
  auto missing = ReadTensorTable(*ck);
  EXPECT_THAT(missing, StatusIs(StatusCode::kNotFound));
  EXPECT_NE(missing.status().message().find("'a'"), std::string::npos)
      << missing.status().message();
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

}  // namespace
}  // namespace refit::ranks
