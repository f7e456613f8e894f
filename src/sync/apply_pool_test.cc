// The apply pool's bookkeeping of in-flight ranges (strided regions of
// distinct columns interleave in the same bytes without sharing any), its
// workers' classification of a strided region before they apply it, and
// the digests' refresh of segments strided regions wrote.
#include "sync/apply_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "base/hash.h"
#include "delta/encoder.h"
#include "support/testing.h"
#include "sync/bound_tensors.h"

namespace refit::internal {
namespace {

// A job that applies nothing: it only occupies its range until drained.
ApplyPool::Job Occupy(size_t tensor, uint64_t offset, uint64_t length, uint64_t run = 0,
                      uint64_t stride = 0) {
  ApplyPool::Job j;
  j.tensor = tensor;
  j.offset = offset;
  j.length = length;
  j.run = run;
  j.stride = stride;
  return j;
}

TEST(ApplyPoolTest, PendingTellsInterleavedColumnsApart) {
  ApplyPool pool(1);  // one thread: jobs run at Submit and stay until drained
  // Columns [0, 256) of 8 rows of 1024 bytes, from byte 0.
  pool.Submit(Occupy(0, 0, 7 * 1024 + 256, 256, 1024));
  // The next rank's columns [256, 512) of the same rows: no byte shared.
  EXPECT_FALSE(pool.Pending(0, 256, 7 * 1024 + 256, 256, 1024));
  EXPECT_FALSE(pool.Pending(0, 768, 3 * 1024 + 256, 256, 1024));
  // Columns [128, 384) meet [0, 256) in every row.
  EXPECT_TRUE(pool.Pending(0, 128, 7 * 1024 + 256, 256, 1024));
  // Rows below the region's: its byte span ends before them.
  EXPECT_FALSE(pool.Pending(0, 8 * 1024, 1024, 256, 1024));
  // Another stride, a contiguous range inside the span, or rows that wrap
  // are taken to overlap where the byte spans do.
  EXPECT_TRUE(pool.Pending(0, 256, 7 * 512 + 128, 128, 512));
  EXPECT_TRUE(pool.Pending(0, 300, 100));
  EXPECT_TRUE(pool.Pending(0, 1000, 7 * 1024 + 256, 256, 1024));
  // Another tensor shares nothing.
  EXPECT_FALSE(pool.Pending(1, 0, 7 * 1024 + 256, 256, 1024));
  ASSERT_EQ(pool.Drain(true).size(), 1u);
  EXPECT_FALSE(pool.Pending(0, 128, 7 * 1024 + 256, 256, 1024));
  // A contiguous job against a strided query: the byte spans decide.
  pool.Submit(Occupy(0, 2048, 100));
  EXPECT_TRUE(pool.Pending(0, 256, 7 * 1024 + 256, 256, 1024));
  EXPECT_FALSE(pool.Pending(0, 4096, 1024, 256, 1024));
  pool.Drain(true);
}

struct Matrix {
  static constexpr uint64_t kRows = 64, kCols = 512;  // BF16
  std::vector<uint8_t> base, target;
  explicit Matrix(uint64_t seed) : base(2 * kRows * kCols) {
    std::mt19937_64 rng(seed);
    for (auto& b : base) b = static_cast<uint8_t>(rng());
    target = base;
    for (size_t e = 0; e < kRows * kCols; e += 7) target[2 * e] ^= 1;
  }
};

// A strided chunk of columns [c0, c0 + n) of every row, base -> target.
ParsedChunk StridedChunk(const Matrix& m, uint64_t c0, uint64_t n, std::vector<uint8_t>* bytes) {
  std::vector<uint8_t> a, b;
  for (uint64_t r = 0; r < Matrix::kRows; ++r) {
    const size_t at = 2 * (r * Matrix::kCols + c0);
    a.insert(a.end(), m.base.begin() + at, m.base.begin() + at + 2 * n);
    b.insert(b.end(), m.target.begin() + at, m.target.begin() + at + 2 * n);
  }
  ChunkHeader ids;
  ids.version = 2;
  ids.base_version = 1;
  ids.width = 2;
  EncodeScratch scratch;
  ChunkResult result;
  EXPECT_OK(EncodeRegionChunk(ids, a.data(), b.data(), c0, Matrix::kRows * n, n,
                              Matrix::kCols, {}, &scratch, &result));
  *bytes = std::move(result.chunk);
  auto parsed = ParseChunk(*bytes);
  EXPECT_OK(parsed);
  return *parsed;
}

TEST(ApplyPoolTest, ClassifyingWorkersApplyOnlyAtBefore) {
  const Matrix m(3);
  std::vector<uint8_t> work = m.base;
  for (int threads : {1, 3}) {
    ApplyPool pool(threads);
    auto submit = [&](uint64_t c0) {
      ApplyPool::Job j;
      j.objects.emplace_back();
      j.chunks.push_back(StridedChunk(m, c0, 128, &j.objects.back()));
      const ChunkHeader& h = j.chunks.back().header;
      j.offset = 2 * h.start;
      j.length = 2 * (h.End() - h.start);
      j.run = 2 * h.run;
      j.stride = 2 * h.stride;
      j.classify = true;
      j.data = work.data();
      j.index = c0;
      pool.Submit(std::move(j));
    };
    // threads == 1: the base -> every column block at "before", applied;
    // threads == 3: the same chunks again, now at "after", left alone.
    for (uint64_t c0 = 0; c0 < Matrix::kCols; c0 += 128) submit(c0);
    const RangeState expect = threads == 1 ? RangeState::kBefore : RangeState::kAfter;
    auto done = pool.Drain(true);
    ASSERT_EQ(done.size(), 4u);
    for (const auto& d : done) {
      EXPECT_OK(d.status);
      EXPECT_EQ(d.state, expect) << d.job.index;
      EXPECT_EQ(d.applied, expect == RangeState::kBefore ? 1u : 0u);
    }
    EXPECT_EQ(work, m.target);
  }
  // A region at neither hash is reported, and not written.
  work[2 * 130] ^= 0x40;  // row 0, column 130: in the block [128, 256)
  const std::vector<uint8_t> torn = work;
  ApplyPool pool(2);
  ApplyPool::Job j;
  j.objects.emplace_back();
  j.chunks.push_back(StridedChunk(m, 128, 128, &j.objects.back()));
  j.classify = true;
  j.data = work.data();
  pool.Submit(std::move(j));
  auto done = pool.Drain(true);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].state, RangeState::kNeither);
  EXPECT_EQ(done[0].applied, 0u);
  EXPECT_EQ(work, torn);
}

TEST(DigestsTest, RefreshHashesWrittenSegmentsAgain) {
  // Two tensors: 5 segments and a short tail, and one never hashed.
  std::vector<uint8_t> t0(5 * kRangeHashSegment + 100), t1(3 * kRangeHashSegment);
  std::mt19937_64 rng(5);
  for (auto& b : t0) b = static_cast<uint8_t>(rng());
  for (auto& b : t1) b = static_cast<uint8_t>(rng());
  BoundTensors b;
  b.data = {t0.data(), t1.data()};
  b.bytes = {t0.size(), t1.size()};
  Digests d(2, 3);
  d.Ensure(b, 0);
  EXPECT_EQ(d.Current(0).size(), 6u);
  EXPECT_TRUE(d.Current(1).empty());
  // Strided writes across segments 1-3 of tensor 0.
  for (uint64_t r = 0; r < 40; ++r) t0[kRangeHashSegment + r * 4096 + 7] ^= 0x5a;
  d.Written(0, kRangeHashSegment + 7, 39 * 4096 + 1);
  EXPECT_TRUE(d.Current(0).empty());
  d.Refresh(b);
  Digests fresh(2, 1);
  fresh.Ensure(b, 0);
  fresh.Ensure(b, 1);
  EXPECT_EQ(d.Current(0), fresh.Current(0));
  EXPECT_EQ(d.Current(1), fresh.Current(1));
  EXPECT_EQ(d.Range(b, 0, 0, t0.size()), RangeHash(t0.data(), t0.size()));
  EXPECT_EQ(d.Range(b, 1, 0, t1.size()), RangeHash(t1.data(), t1.size()));
}

}  // namespace
}  // namespace refit::internal
