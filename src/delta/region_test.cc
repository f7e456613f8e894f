// Strided-region chunks (docs/format.md §3): a rank encodes the block of a
// matrix it holds, gathered in region order, and a receiver applies it in
// place to the whole canonical tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "base/bytes.h"
#include "delta/apply.h"
#include "delta/chunk.h"
#include "delta/encoder.h"
#include "support/testing.h"

namespace refit {
namespace {

struct Matrix {
  uint64_t rows, cols;
  int width;
  std::vector<uint8_t> bytes;
  Matrix(uint64_t r, uint64_t c, int w, std::mt19937_64& rng)
      : rows(r), cols(c), width(w), bytes(r * c * static_cast<uint64_t>(w)) {
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  }
  uint8_t* At(uint64_t r, uint64_t c) { return bytes.data() + (r * cols + c) * width; }
};

// The block rows [r0, r1) x cols [c0, c1), gathered row by row.
std::vector<uint8_t> Gather(Matrix& m, uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1) {
  std::vector<uint8_t> out;
  for (uint64_t r = r0; r < r1; ++r) {
    out.insert(out.end(), m.At(r, c0), m.At(r, c1));
  }
  return out;
}

void Mutate(Matrix& m, double rate, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  for (uint64_t i = 0; i < m.rows * m.cols; ++i) {
    if (u(rng) < rate) m.bytes[i * m.width] ^= static_cast<uint8_t>(1 + rng() % 7);
  }
}

ChunkHeader Ids(int width) {
  ChunkHeader ids;
  ids.width = static_cast<uint8_t>(width);
  ids.version = 2;
  ids.base_version = 1;
  ids.tensor_id = 0;
  return ids;
}

struct Case {
  int width;
  double rate;
  bool allow_xor;
};

class RegionTest : public ::testing::TestWithParam<Case> {};

TEST_P(RegionTest, ColumnBlockEncodesAppliesAndUndoes) {
  const Case c = GetParam();
  std::mt19937_64 rng(static_cast<uint64_t>(c.width * 100 + c.rate * 1000));
  Matrix base(96, 200, c.width, rng);
  Matrix target = base;
  Mutate(target, c.rate, rng);
  // The column block [50, 130) of rows [8, 90): what a row-parallel rank
  // holds of a [96, 200] weight.
  const uint64_t r0 = 8, r1 = 90, c0 = 50, c1 = 130;
  auto old_region = Gather(base, r0, r1, c0, c1);
  auto new_region = Gather(target, r0, r1, c0, c1);
  ChunkEncodeOptions opts;
  opts.allow_xor = c.allow_xor;
  EncodeScratch scratch;
  ChunkResult result;
  const uint64_t count = (r1 - r0) * (c1 - c0);
  ASSERT_TRUE(EncodeRegionChunk(Ids(c.width), old_region.data(), new_region.data(),
                                r0 * 200 + c0, count, c1 - c0, 200, opts, &scratch,
                                &result).ok());
  ASSERT_FALSE(result.chunk.empty());
  auto parsed = ParseChunk(result.chunk);
  ASSERT_OK(parsed);
  const ChunkHeader& h = parsed->header;
  EXPECT_TRUE(h.IsStrided());
  EXPECT_EQ(h.start, r0 * 200 + c0);
  EXPECT_EQ(h.run, c1 - c0);
  EXPECT_EQ(h.stride, 200u);
  EXPECT_EQ(h.End(), (r1 - 1) * 200 + c1);
  EXPECT_EQ(h.Element(c1 - c0), (r0 + 1) * 200 + c0);
  // The receiver hashes the region in the whole tensor as the rank hashed
  // its gathered copy.
  EXPECT_EQ(RegionHash(h, base.bytes.data()), h.before);
  EXPECT_EQ(RegionHash(h, target.bytes.data()), h.after);
  EXPECT_EQ(ClassifyRange(h, RegionHash(h, base.bytes.data())), RangeState::kBefore);

  // Expected: the target's block inside the base's surroundings.
  Matrix expected = base;
  for (uint64_t r = r0; r < r1; ++r) {
    std::memcpy(expected.At(r, c0), target.At(r, c0), (c1 - c0) * c.width);
  }
  Matrix work = base;
  ApplyScratch as;
  UndoRecord undo;
  ASSERT_TRUE(ApplyChunkInPlace(*parsed, work.bytes.data(), &as, nullptr, &undo).ok());
  EXPECT_EQ(work.bytes, expected.bytes);
  EXPECT_EQ(ClassifyRange(h, RegionHash(h, work.bytes.data())), RangeState::kAfter);
  ASSERT_TRUE(UndoChunkInPlace(*parsed, work.bytes.data(), &as, undo).ok());
  EXPECT_EQ(work.bytes, base.bytes);

  // Applied to a tensor whose region is neither before nor after: the
  // after-hash check refuses it and leaves every byte as it was (a raw
  // chunk rewrites every element, so it reaches "after" from anywhere).
  if (h.kind == codec::ChunkKind::kRaw) return;
  Matrix other = base;
  *other.At(r1 - 1, c1 - 1) ^= 0x80;
  Matrix other_copy = other;
  EXPECT_FALSE(ApplyChunkInPlace(*parsed, other.bytes.data(), &as, nullptr, nullptr).ok());
  EXPECT_EQ(other.bytes, other_copy.bytes);
}

INSTANTIATE_TEST_SUITE_P(
    KindsAndWidths, RegionTest,
    ::testing::Values(Case{2, 0.02, true}, Case{2, 0.6, true}, Case{2, 0.03, false},
                      Case{1, 0.05, true}, Case{4, 0.3, true}, Case{8, 0.02, true},
                      Case{2, 1.0, false}));

TEST(RegionTest, WholeRowsAndSingleRowsAreContiguous) {
  std::mt19937_64 rng(7);
  Matrix base(10, 64, 2, rng);
  Matrix target = base;
  Mutate(target, 0.2, rng);
  EncodeScratch scratch;
  ChunkResult result;
  // Rows [2, 6) at full width: run == stride, so a plain range.
  auto a = Gather(base, 2, 6, 0, 64);
  auto b = Gather(target, 2, 6, 0, 64);
  ASSERT_TRUE(EncodeRegionChunk(Ids(2), a.data(), b.data(), 2 * 64, 4 * 64, 64, 64, {},
                                &scratch, &result).ok());
  auto parsed = ParseChunk(result.chunk);
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->header.IsStrided());
  EXPECT_EQ(parsed->header.start, 128u);
  EXPECT_EQ(RegionHash(parsed->header, target.bytes.data()), parsed->header.after);
  // Rows that are not whole: an error, not a silently wrong region.
  EXPECT_FALSE(EncodeRegionChunk(Ids(2), a.data(), b.data(), 0, 100, 64, 80, {}, &scratch,
                                 &result).ok());
}

TEST(RegionTest, MalformedRegionsAreRejectedByTheParser) {
  ChunkHeader h = Ids(2);
  h.start = 10;
  h.count = 12;
  h.changed = 1;
  std::vector<uint8_t> payload = {1, 2, 3};
  auto parses = [&](uint64_t run, uint64_t stride) {
    ChunkHeader x = h;
    x.run = run;
    x.stride = stride;
    std::vector<uint8_t> bytes;
    SerializeChunk(x, payload, &bytes);
    return ParseChunk(bytes).ok();
  };
  EXPECT_TRUE(parses(4, 9));
  EXPECT_TRUE(parses(0, 0));
  EXPECT_FALSE(parses(5, 9));   // 12 is not whole rows of 5
  EXPECT_FALSE(parses(12, 20)); // one row: must be written contiguous
  EXPECT_FALSE(parses(4, 4));   // no gaps: must be written contiguous
  EXPECT_FALSE(parses(4, 3));   // rows overlap
  EXPECT_FALSE(parses(4, uint64_t{1} << 61));  // beyond 2^62
}

// A region of several 64 KiB segments whose rows straddle segment
// boundaries hashes as its gathered bytes do (RegionHash gathers one
// segment at a time).
TEST(RegionTest, RegionHashOverManySegmentsIsTheGatheredRangeHash) {
  std::mt19937_64 rng(11);
  Matrix m(700, 1000, 2, rng);
  for (uint64_t cols : {uint64_t{1}, uint64_t{333}, uint64_t{999}}) {
    const uint64_t r0 = 3, r1 = 697, c0 = 1;
    ChunkHeader h = Ids(2);
    h.start = r0 * 1000 + c0;
    h.count = (r1 - r0) * cols;
    h.run = cols;
    h.stride = 1000;
    const auto gathered = Gather(m, r0, r1, c0, c0 + cols);
    EXPECT_EQ(RegionHash(h, m.bytes.data()), RangeHash(gathered.data(), gathered.size()))
        << cols;
  }
}

}  // namespace
}  // namespace refit
