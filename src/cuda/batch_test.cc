#include "cuda/batch.h"

#include <gtest/gtest.h>

#include <random>

#include "delta/encoder.h"

namespace refit::cuda {
namespace {

// Encodes one chunk of a random tensor with ~rate changed elements.
std::vector<uint8_t> MakeChunk(int w, uint64_t count, double rate,
                               uint32_t seed, ChunkHeader* header) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> a(count * w), b;
  for (auto& x : a) x = static_cast<uint8_t>(rng());
  b = a;
  std::bernoulli_distribution change(rate);
  for (uint64_t i = 0; i < count; ++i) {
    if (change(rng)) b[i * w] ^= 1;
  }
  ChunkHeader ids;
  ids.width = static_cast<uint8_t>(w);
  ids.version = 1;
  ChunkEncodeOptions opt;
  EncodeScratch scratch;
  ChunkResult r;
  EXPECT_TRUE(EncodeChunkRange(ids, a.data(), b.data(), 0, count, opt,
                               &scratch, &r).ok());
  *header = r.header;
  return r.chunk;
}

TEST(Batch, PreparesSparseChunkWithLanesAndTables) {
  ChunkHeader h;
  auto chunk = MakeChunk(2, 1 << 16, 0.01, 1, &h);
  ASSERT_FALSE(chunk.empty());
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(WholePlacement("t", 2, 256, 256, 4096)).ok());
  std::vector<std::string> names = {"t"};
  ChunkSpan span{0, chunk.size()};
  auto p = PrepareBatches(chunk, std::span(&span, 1), names, plan, {});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->batches.size(), 1u);
  const HostBatch& b = p->batches[0];
  ASSERT_EQ(b.chunks.size(), 1u);
  const DevChunk& d = b.chunks[0];
  EXPECT_EQ(d.layout, kDevSparse);
  EXPECT_EQ(d.k, h.changed);
  EXPECT_EQ(d.range_address, 4096u);
  EXPECT_GE(d.lanes, 1);
  EXPECT_EQ(b.lanes.size(), d.lanes + 1u);
  EXPECT_EQ(b.lanes.back(), chunk.size() - 4);  // the stream ends at the checksum
  EXPECT_EQ(b.tables.size(), d.coded);
  std::vector<uint8_t> meta;
  b.SerializeMeta(&meta);
  EXPECT_EQ(meta.size(), b.meta_bytes());
}

TEST(Batch, SkipsChunksNotHeldAndRejectsCorruptOnes) {
  ChunkHeader h;
  auto chunk = MakeChunk(2, 1 << 16, 0.01, 2, &h);
  PlacementPlan plan;
  // Rows [0, 8) of a [512, 256] tensor: the chunk covers rows 0..255.
  ASSERT_TRUE(plan.Add(RowShardPlacement("t", 2, 512, 256, 300, 512, 0)).ok());
  std::vector<std::string> names = {"t"};
  ChunkSpan span{0, chunk.size()};
  PrepareOptions opt;
  opt.verify = false;
  auto p = PrepareBatches(chunk, std::span(&span, 1), names, plan, opt);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->chunks_not_here, 1u);
  EXPECT_TRUE(p->batches.empty());

  PlacementPlan whole;
  ASSERT_TRUE(whole.Add(WholePlacement("t", 2, 512, 256, 0)).ok());
  chunk[chunk.size() / 2] ^= 0x40;
  EXPECT_FALSE(PrepareBatches(chunk, std::span(&span, 1), names, whole, {}).ok());
}

TEST(Batch, RefusesVerificationOfNonContiguousRanges) {
  ChunkHeader h;
  auto chunk = MakeChunk(2, 1 << 16, 0.01, 3, &h);
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(TransposedPlacement("t", 2, 256, 256, 0)).ok());
  std::vector<std::string> names = {"t"};
  ChunkSpan span{0, chunk.size()};
  EXPECT_FALSE(PrepareBatches(chunk, std::span(&span, 1), names, plan, {}).ok());
  PrepareOptions opt;
  opt.verify = false;
  EXPECT_TRUE(PrepareBatches(chunk, std::span(&span, 1), names, plan, opt).ok());
}

TEST(Batch, SplitsBatchesAtTheStagingLimit) {
  std::vector<uint8_t> buf;
  std::vector<ChunkSpan> spans;
  for (int i = 0; i < 6; ++i) {
    ChunkHeader h;
    auto c = MakeChunk(2, 1 << 15, 0.05, 10 + i, &h);
    spans.push_back({buf.size(), c.size()});
    buf.insert(buf.end(), c.begin(), c.end());
  }
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(WholePlacement("t", 2, 1 << 15, 1, 0)).ok());
  std::vector<std::string> names = {"t"};
  PrepareOptions opt;
  opt.limits.payload_bytes = spans[0].size * 2 + 64;
  auto p = PrepareBatches(buf, spans, names, plan, opt);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_GE(p->batches.size(), 3u);
  for (const HostBatch& b : p->batches) {
    EXPECT_LE(b.device_bytes(), opt.limits.payload_bytes);
  }
  opt.limits.payload_bytes = 16;
  EXPECT_FALSE(PrepareBatches(buf, spans, names, plan, opt).ok());
}

// What the receiver carves from its staging arena (pipeline.cc, Reserve):
// per slot, each part rounded up to 256 bytes, the payload part padded by
// 64 bytes for the decoders' read-ahead.
uint64_t CarvedBytes(const PreparedDelta& p) {
  auto a256 = [](uint64_t x) { return (x + 255) & ~uint64_t{255}; };
  return p.slots * (a256(p.largest_batch + 64) + a256(p.largest_meta) +
                    a256(p.largest_scratch));
}

TEST(Batch, SplitsTheStagingBudgetIntoSlots) {
  std::vector<uint8_t> buf;
  std::vector<ChunkSpan> spans;
  for (int i = 0; i < 40; ++i) {
    ChunkHeader h;
    auto c = MakeChunk(2, 1 << 16, 0.05, 40 + i, &h);
    spans.push_back({buf.size(), c.size()});
    buf.insert(buf.end(), c.begin(), c.end());
  }
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(WholePlacement("t", 2, 1 << 16, 1, 4096)).ok());
  std::vector<std::string> names = {"t"};
  PrepareOptions opt;
  opt.staging_total = 8 << 20;
  opt.slots = 8;
  auto p = PrepareBatches(buf, spans, names, plan, opt);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->slots, 8u);
  // About 1/8 of the payload a batch (at least 64 KiB), so copies overlap.
  EXPECT_GE(p->batches.size(), std::min<size_t>(8, buf.size() / (64 << 10)));
  EXPECT_LE(CarvedBytes(*p), opt.staging_total);
  uint64_t chunks = 0;
  for (const HostBatch& b : p->batches) {
    chunks += b.chunks.size();
    EXPECT_EQ(b.meta.size(), b.meta_bytes());
    EXPECT_EQ(b.unfused, 0u);  // sparse XOR chunks only
  }
  EXPECT_EQ(chunks, spans.size());
  // Budgets the delta fills: the batches fill their slots, and what the
  // receiver carves still fits.
  for (uint64_t total : {uint64_t{64} << 10, uint64_t{160} << 10,
                         uint64_t{1} << 20}) {
    opt.staging_total = total;
    p = PrepareBatches(buf, spans, names, plan, opt);
    ASSERT_TRUE(p.ok()) << total << ": " << p.status().ToString();
    EXPECT_GE(p->batches.size(), 2u);
    EXPECT_LE(CarvedBytes(*p), total) << total;
  }

  // A chunk that needs more than an eighth of the budget: fewer, larger
  // slots, still within the budget.
  ChunkHeader h;
  auto big = MakeChunk(2, 1 << 20, 1.0, 99, &h);  // dense: 2 MiB decoded
  ASSERT_FALSE(big.empty());
  PlacementPlan plan2;
  ASSERT_TRUE(plan2.Add(WholePlacement("t", 2, 1 << 20, 1, 4096)).ok());
  ChunkSpan span{0, big.size()};
  opt.staging_total = 12 << 20;
  p = PrepareBatches(big, std::span(&span, 1), names, plan2, opt);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_LT(p->slots, 8u);
  EXPECT_GE(p->slots, 2u);
  EXPECT_LE(CarvedBytes(*p), opt.staging_total);
  ASSERT_EQ(p->batches.size(), 1u);
  EXPECT_EQ(p->batches[0].unfused, 1u);
}

}  // namespace
}  // namespace refit::cuda
