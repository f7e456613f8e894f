// FileBaseline: kept segment digests across versions, and an advance that
// stores and hashes only the committed chunks' ranges.
#include "sync/publisher_baseline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "base/file.h"
#include "base/hash.h"
#include "support/status_matchers.h"
#include "support/test_model.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;
using testing::TestModel;

// Collects a diff's chunk ranges and tensor table as a manifest.
class ManifestSink final : public ChunkSink {
 public:
  // An advance needs only the chunks' ranges.
  Status AddChunk(std::span<const uint8_t>, const ChunkHeader& h) override {
    manifest.chunks.emplace_back();
    manifest.chunks.back().tensor_id = h.tensor_id;
    manifest.chunks.back().start = h.start;
    manifest.chunks.back().count = h.count;
    return Status();
  }
  Status Finish(const std::vector<TensorEntry>& tensors) override {
    manifest.tensors = tensors;
    return Status();
  }
  Manifest manifest;
};

class FileBaselineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.File("baseline.safetensors");
    model_.Write(path_);
  }

  // Opens the baseline and hashes it, as Publisher::Open does; returns
  // the tensors' hashes.
  std::unique_ptr<FileBaseline> Open(FileBaselineOptions options,
                                     std::vector<Hash128>* hashes = nullptr) {
    auto b = FileBaseline::Open(path_, options);
    EXPECT_OK(b);
    if (!b.ok()) return nullptr;
    for (size_t i = 0; i < (*b)->tensors().size(); ++i) {
      auto h = (*b)->HashTensor(i);
      EXPECT_OK(h);
      if (hashes && h.ok()) hashes->push_back(*h);
    }
    return std::move(*b);
  }

  Result<Manifest> Diff(FileBaseline& b, const TestModel& target) {
    ManifestSink sink;
    DiffOptions o;
    o.chunk_bytes = 64 * 1024;
    o.threads = 2;
    REFIT_RETURN_IF_ERROR(b.Diff(target.Views(), o, &sink).status());
    return sink.manifest;
  }

  // Steps the trainer, diffs it against the baseline and advances the
  // baseline to it; checks the hashes against the file's bytes. Whether
  // the diff hashed the baseline's bytes.
  bool NextVersion(FileBaseline& b, TestModel* trainer, std::mt19937_64& rng) {
    trainer->Step(rng, 0.02);
    const std::vector<Hash128> base = HashFile(path_);
    auto m = Diff(b, *trainer);
    EXPECT_OK(m);
    if (!m.ok()) return false;
    EXPECT_EQ(m->tensors.size(), base.size());
    for (size_t t = 0; t < base.size() && t < m->tensors.size(); ++t) {
      EXPECT_EQ(m->tensors[t].before, base[t]);
    }
    EXPECT_OK(b.Advance(*m, trainer->Views()));
    EXPECT_TRUE(trainer->Matches(path_));
    const std::vector<Hash128> after = HashFile(path_);
    for (size_t t = 0; t < after.size() && t < m->tensors.size(); ++t) {
      EXPECT_EQ(m->tensors[t].after, after[t]);
    }
    return b.last_diff_hashed_base();
  }

  // Publishes `versions` versions to a baseline opened with
  // `full_check_every`: whether each one's diff hashed the baseline.
  std::vector<bool> WhichDiffsHashed(int full_check_every, int versions) {
    FileBaselineOptions o;
    o.full_check_every = full_check_every;
    std::unique_ptr<FileBaseline> b = Open(o);
    std::vector<bool> out;
    if (!b) return out;
    std::mt19937_64 rng(5);
    TestModel trainer = model_;
    for (int v = 1; v <= versions; ++v) out.push_back(NextVersion(*b, &trainer, rng));
    return out;
  }

  // The hashes of the checkpoint's tensors, from its bytes.
  static std::vector<Hash128> HashFile(const std::string& path) {
    auto ck = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
    EXPECT_OK(ck);
    std::vector<Hash128> out;
    if (!ck.ok()) return out;
    for (size_t i = 0; i < ck->tensors().size(); ++i) {
      auto d = ck->Data(i);
      out.push_back(RangeHash(d.data(), d.size()));
    }
    return out;
  }

  testing::TempDir dir_;
  std::string path_;
  TestModel model_{3};
};

TEST_F(FileBaselineTest, KeptDigestsServeDiffsAndEveryNthHashesTheBytes) {
  EXPECT_EQ(WhichDiffsHashed(3, 6), std::vector<bool>({false, false, true, false, false, true}));
}

TEST_F(FileBaselineTest, EveryDiffHashesTheBytesWhenAskedTo) {
  EXPECT_EQ(WhichDiffsHashed(1, 3), std::vector<bool>({true, true, true}));
}

// One changed element: the advance compares its chunk's range and stores
// the one 4 KiB block that holds it (no other page is dirtied).
TEST_F(FileBaselineTest, AdvanceStoresOnlyTheBlocksThatChanged) {
  std::unique_ptr<FileBaseline> b = Open({});
  ASSERT_NE(b, nullptr);
  TestModel trainer = model_;
  trainer.data[0][2 * 40000] ^= 1;  // a.weight, inside its second 64 KiB chunk
  auto m = Diff(*b, trainer);
  ASSERT_OK(m);
  ASSERT_EQ(m->chunks.size(), 1u);
  ASSERT_OK(b->Advance(*m, trainer.Views()));
  EXPECT_EQ(b->last_advance().compared_bytes, 64u * 1024);
  EXPECT_EQ(b->last_advance().stored_bytes, 4096u);
  EXPECT_TRUE(trainer.Matches(path_));
}

// The checkpoint written by someone else between versions: its stamp
// changed, so the next diff hashes the bytes (its "before" hashes are not
// the kept ones, which a Publisher refuses), and so does every diff after
// it until the digests are confirmed again.
TEST_F(FileBaselineTest, FileChangedBetweenVersionsIsHashedAgain) {
  std::vector<Hash128> kept;
  std::unique_ptr<FileBaseline> b = Open({}, &kept);
  ASSERT_NE(b, nullptr);
  // Timestamps tick coarsely: a write in the tick of the open could keep
  // the stamp.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto ck = Checkpoint::Open(path_, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  const TensorInfo& info = ck->tensors()[1];
  std::vector<uint8_t> flipped = {static_cast<uint8_t>(ck->Data(1)[10] ^ 0x40)};
  ASSERT_OK(WriteFileRange(path_, info.offset + 10, flipped, false));
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto m = Diff(*b, model_);
    ASSERT_OK(m);
    EXPECT_TRUE(b->last_diff_hashed_base());
    EXPECT_EQ(m->tensors[0].before, kept[0]);
    EXPECT_NE(m->tensors[1].before, kept[1]);
  }
}

// The target changed inside a committed chunk's range after the diff: the
// advance stores bytes the manifest does not describe, and says so.
TEST_F(FileBaselineTest, TargetChangedAfterTheDiffIsDataLoss) {
  std::unique_ptr<FileBaseline> b = Open({});
  ASSERT_NE(b, nullptr);
  TestModel trainer = model_;
  trainer.data[1][100] ^= 1;
  auto m = Diff(*b, trainer);
  ASSERT_OK(m);
  trainer.data[1][200] ^= 1;  // same chunk, after the diff
  EXPECT_THAT(b->Advance(*m, trainer.Views()), StatusIs(StatusCode::kDataLoss));
}

}  // namespace
}  // namespace refit
