#include "cuda/batch.h"

#include <gtest/gtest.h>

#include <random>

#include <cstring>

#include "base/hash.h"
#include "codec/conditional.h"
#include "codec/payload.h"
#include "delta/chunk.h"
#include "delta/encoder.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit::cuda {
namespace {

using ::refit::testing::StatusIs;

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
  ASSERT_OK(p);
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

TEST(Batch, PlacesStridedRegionsThroughTheirSpan) {
  // A trainer rank's chunk of a column block: 32 rows of 64 elements at
  // stride 256, from element 64 of a [256, 256] tensor.
  std::mt19937_64 rng(4);
  std::vector<uint8_t> a(64 * 32 * 2), b;
  for (auto& x : a) x = static_cast<uint8_t>(rng());
  b = a;
  b[10] ^= 1;
  ChunkHeader ids;
  ids.width = 2;
  ids.version = 1;
  EncodeScratch scratch;
  ChunkResult r;
  ASSERT_TRUE(EncodeRegionChunk(ids, a.data(), b.data(), 64, 64 * 32, 64, 256, {}, &scratch,
                                &r).ok());
  ASSERT_TRUE(r.header.IsStrided());
  std::vector<std::string> names = {"t"};
  ChunkSpan span{0, r.chunk.size()};
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(WholePlacement("t", 2, 256, 256, 4096)).ok());
  auto p = PrepareBatches(r.chunk, std::span(&span, 1), names, plan, {});
  ASSERT_OK(p);
  ASSERT_EQ(p->batches.size(), 1u);
  const HostBatch& hb = p->batches[0];
  ASSERT_EQ(hb.chunks.size(), 1u);
  const DevChunk& d = hb.chunks[0];
  EXPECT_EQ(d.start, 64u);
  EXPECT_EQ(d.run, 64u);
  EXPECT_EQ(d.stride, 256u);
  EXPECT_EQ(hb.regions, 1u);  // its batch launches the region digests
  EXPECT_EQ(d.n, 64u * 32);
  EXPECT_EQ(RegionSpan(d.n, d.run, d.stride), 31u * 256 + 64);
  EXPECT_EQ(d.range_address, 4096u + 64 * 2);
  EXPECT_EQ(d.linear_address, d.range_address);
  // Hashed as its rows laid end to end: one segment, no gathering room.
  EXPECT_EQ(d.segments, 1u);
  EXPECT_EQ(hb.scratch_bytes, d.seg_first * 16 + 16 * uint64_t{d.segments});

  // A row shard: rows [0, 128) on this GPU hold the region's rows 0..31,
  // so the chunk is placed.
  PlacementPlan rows;
  ASSERT_TRUE(rows.Add(RowShardPlacement("t", 2, 256, 256, 0, 128, 0)).ok());
  PrepareOptions unchecked;
  unchecked.verify = false;
  auto q = PrepareBatches(r.chunk, std::span(&span, 1), names, rows, unchecked);
  ASSERT_OK(q);
  ASSERT_EQ(q->batches.size(), 1u);
  EXPECT_EQ(q->batches[0].chunks[0].run, 64u);
  // Rows [128, 256) hold none of it.
  PlacementPlan far;
  ASSERT_TRUE(far.Add(RowShardPlacement("t", 2, 256, 256, 128, 256, 0)).ok());
  q = PrepareBatches(r.chunk, std::span(&span, 1), names, far, unchecked);
  ASSERT_OK(q);
  EXPECT_EQ(q->chunks_not_here, 1u);
  // A tensor too small for the span does not match the delta.
  PlacementPlan small;
  ASSERT_TRUE(small.Add(WholePlacement("t", 2, 31, 256, 0)).ok());
  EXPECT_THAT(PrepareBatches(r.chunk, std::span(&span, 1), names, small, {}),
              StatusIs(StatusCode::kFailedPrecondition));
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
  ASSERT_OK(p);
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
  ASSERT_OK(p);
  EXPECT_EQ(p->slots, 8u);
  // About 1/8 of the payload a batch (at least 64 KiB), so copies overlap.
  EXPECT_GE(p->batches.size(), std::min<size_t>(8, buf.size() / (64 << 10)));
  EXPECT_LE(CarvedBytes(*p), opt.staging_total);
  uint64_t chunks = 0;
  for (const HostBatch& b : p->batches) {
    chunks += b.chunks.size();
    EXPECT_EQ(b.meta.size(), b.meta_bytes());
    EXPECT_EQ(b.unfused, 0u);  // sparse XOR chunks only
    EXPECT_EQ(b.regions, 0u);  // contiguous ranges
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
  ASSERT_OK(p);
  EXPECT_LT(p->slots, 8u);
  EXPECT_GE(p->slots, 2u);
  EXPECT_LE(CarvedBytes(*p), opt.staging_total);
  ASSERT_EQ(p->batches.size(), 1u);
  EXPECT_EQ(p->batches[0].unfused, 1u);
}

// A dense chunk of w = 2 whose XOR is `pattern` at every element: plane
// models as the encoder picks them.
std::vector<uint8_t> DenseChunk(const std::vector<uint8_t>& a,
                                const std::vector<uint8_t>& b,
                                ChunkHeader* header) {
  ChunkHeader ids;
  ids.width = 2;
  ids.version = 1;
  ChunkEncodeOptions opt;
  EncodeScratch scratch;
  ChunkResult r;
  EXPECT_TRUE(EncodeChunkRange(ids, a.data(), b.data(), 0, a.size() / 2, opt,
                               &scratch, &r).ok());
  *header = r.header;
  return r.chunk;
}

TEST(Batch, DensePlanesBecomeGpuJobsUnlessZstd) {
  const uint64_t n = 1 << 16;
  std::mt19937_64 rng(7);
  std::vector<uint8_t> a(2 * n);
  for (auto& x : a) x = static_cast<uint8_t>(rng());
  // New values cheaper to send whole (kind 4, dense) than as XORs: low
  // bytes in 1..3 (an entropy plane), high bytes random.
  std::vector<uint8_t> b(2 * n);
  for (uint64_t i = 0; i < n; ++i) {
    b[2 * i] = static_cast<uint8_t>(1 + rng() % 3);
    b[2 * i + 1] = static_cast<uint8_t>(rng());
  }
  // New values repeating a random 521-element pattern: zstd's matches beat
  // order-0 coding in both planes.
  std::vector<uint8_t> pattern(2 * 521);
  for (auto& x : pattern) x = static_cast<uint8_t>(rng());
  std::vector<uint8_t> z(2 * n);
  for (uint64_t i = 0; i < z.size(); ++i) z[i] = pattern[i % pattern.size()];
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(WholePlacement("t", 2, n, 1, 4096)).ok());
  std::vector<std::string> names = {"t"};
  for (const auto* target : {&b, &z}) {
    ChunkHeader h;
    auto chunk = DenseChunk(a, *target, &h);
    ASSERT_EQ(h.kind, codec::ChunkKind::kRaw);
    auto pc = ParseChunk(chunk);
    ASSERT_TRUE(pc.ok());
    auto info = codec::DescribePayload(pc->payload, h.kind, static_cast<uint32_t>(n),
                                       2, static_cast<uint32_t>(h.changed));
    ASSERT_TRUE(info.ok());
    bool zstd = false;
    for (const auto& plane : info->planes) zstd |= plane.model == "zstd";
    EXPECT_EQ(zstd, target == &z) << "the encoder's plane choice changed";
    ChunkSpan span{0, chunk.size()};
    auto p = PrepareBatches(chunk, std::span(&span, 1), names, plan, {});
    ASSERT_OK(p);
    ASSERT_EQ(p->batches.size(), 1u);
    const HostBatch& hb = p->batches[0];
    ASSERT_EQ(hb.chunks.size(), 1u);
    EXPECT_EQ(hb.chunks[0].layout, kDevDense);
    EXPECT_EQ(hb.chunks[0].dense_gpu, zstd ? 0 : 1);
    if (zstd) {
      // Decoded here: the decoded bytes travel, no plane jobs.
      EXPECT_TRUE(hb.planes.empty());
      ASSERT_EQ(hb.dense.size(), 2 * n);
      EXPECT_EQ(hb.dense, z);  // kind 4: the new bytes
      EXPECT_EQ(hb.gpu_dense_bytes, 0u);
    } else {
      // One job per plane, nothing decoded here; room for the decoded
      // bytes after the chunk bytes.
      ASSERT_EQ(hb.planes.size(), 2u);
      EXPECT_TRUE(hb.dense.empty());
      EXPECT_EQ(hb.gpu_dense_bytes, 2 * n);
      EXPECT_GE(hb.chunks[0].data, hb.payload_end - hb.payload_begin);
      EXPECT_EQ(p->largest_batch, hb.chunks[0].data + 2 * n);
      for (size_t j = 0; j < 2; ++j) {
        const DevDensePlane& q = hb.planes[j];
        EXPECT_EQ(q.j, j);
        EXPECT_EQ(q.chunk, 0u);
        EXPECT_EQ(q.mode, info->planes[j].model == "verbatim" ? kPlaneVerbatim
                          : info->planes[j].model == "constant" ? kPlaneConstant
                                                               : kPlaneEntropy);
        if (q.mode == kPlaneEntropy) {
          ASSERT_LT(q.table, hb.tables.size());
          ASSERT_LE(q.lane_first + q.lanes + 1u, hb.lanes.size());
          EXPECT_LE(hb.lanes[q.lane_first + q.lanes], chunk.size() - 4);
        }
      }
      std::vector<uint8_t> meta;
      hb.SerializeMeta(&meta);
      EXPECT_EQ(meta.size(), hb.meta_bytes());
    }
  }
  // A dense plane's bytes cut short: refused here, as by the codec.
  ChunkHeader h;
  auto chunk = DenseChunk(a, b, &h);
  auto pc = ParseChunk(chunk);
  ASSERT_TRUE(pc.ok());
  std::vector<uint8_t> payload(pc->payload.begin(), pc->payload.end() - 7);
  std::vector<uint8_t> bad;
  SerializeChunk(h, payload, &bad);
  ChunkSpan span{0, bad.size()};
  EXPECT_FALSE(PrepareBatches(bad, std::span(&span, 1), names, plan, {}).ok());
}

// A conditional XOR chunk (kind 5) of a region of a [256, 256] BF16-like
// tensor (exponents over a few classes), ~rate of its elements changed by
// one unit in the last place.
std::vector<uint8_t> MakeConditionalChunk(uint64_t start, uint64_t count, uint64_t run,
                                          uint64_t stride, double rate, uint32_t seed,
                                          ChunkHeader* header) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> a(count), b;
  for (auto& x : a) {
    const uint32_t r = static_cast<uint32_t>(rng());
    x = static_cast<uint16_t>((r & 0x8000) | (110 + (r >> 16) % 12) << 7 | (r & 0x7f));
  }
  b = a;
  std::bernoulli_distribution change(rate);
  std::vector<uint32_t> positions;
  std::vector<uint8_t> xors;
  for (uint64_t i = 0; i < count; ++i) {
    if (!change(rng)) continue;
    b[i] = static_cast<uint16_t>(b[i] + 1);
    const uint16_t x = a[i] ^ b[i];
    positions.push_back(static_cast<uint32_t>(i));
    xors.push_back(static_cast<uint8_t>(x));
    xors.push_back(static_cast<uint8_t>(x >> 8));
  }
  std::vector<uint8_t> payload;
  EXPECT_OK(codec::EncodeConditional(static_cast<uint32_t>(count),
                                     reinterpret_cast<const uint8_t*>(a.data()), positions,
                                     xors.data(), codec::EncodeOptions{}, &payload));
  ChunkHeader& h = *header;
  h = ChunkHeader{};
  h.kind = codec::ChunkKind::kConditionalXor;
  h.width = 2;
  h.version = 1;
  h.start = start;
  h.count = count;
  h.run = run;
  h.stride = stride;
  h.changed = positions.size();
  h.before = RangeHash(a.data(), 2 * count);
  h.after = RangeHash(b.data(), 2 * count);
  std::vector<uint8_t> out;
  SerializeChunk(h, payload, &out);
  return out;
}

// A kind-5 chunk becomes a sparse XOR chunk for the conditional kernels
// only: its header (lo, the classes' change counts) in its first table
// slot, its lanes framed, and scratch for its records, the class counts,
// ranks and differences, O(k + n / 64) bytes (no dense staging), so that
// it batches with others like a sparse chunk.
TEST(Batch, ConditionalChunkBecomesASparseXorChunkOfTheConditionalKernels) {
  ChunkHeader h;
  const uint64_t n = 1 << 16;
  auto chunk = MakeConditionalChunk(0, n, 0, 0, 0.03, 5, &h);
  PlacementPlan plan;
  ASSERT_OK(plan.Add(WholePlacement("t", 2, 256, 256, 4096)));
  std::vector<std::string> names = {"t"};
  ChunkSpan span{0, chunk.size()};
  auto p = PrepareBatches(chunk, std::span(&span, 1), names, plan, {});
  ASSERT_OK(p);
  ASSERT_EQ(p->batches.size(), 1u);
  const HostBatch& b = p->batches[0];
  ASSERT_EQ(b.chunks.size(), 1u);
  const DevChunk& d = b.chunks[0];
  EXPECT_EQ(d.layout, kDevSparse);
  EXPECT_EQ(d.kind, static_cast<uint8_t>(codec::ChunkKind::kSparseXor));
  EXPECT_EQ(d.dense_gpu, 0);
  EXPECT_EQ(d.conditional, 1);
  EXPECT_EQ(d.fused, 0);
  EXPECT_EQ(b.conditional, 1u);
  EXPECT_EQ(b.unfused, 0u);  // kernels A and B have nothing to do
  EXPECT_TRUE(b.planes.empty());
  EXPECT_EQ(b.gpu_dense_bytes, 0u);
  EXPECT_TRUE(b.dense.empty());
  EXPECT_EQ(d.linear_address, 4096u);
  EXPECT_EQ(d.records, 0u);
  const CondScratch layout = CondScratchLayout(n, d.k);
  EXPECT_EQ(d.values, layout.values);  // where the undo reads XOR values
  EXPECT_EQ(b.records, d.k);
  EXPECT_GE(b.scratch_bytes, layout.total + 16 * uint64_t{d.segments});
  EXPECT_LT(b.scratch_bytes, 8 * uint64_t{d.k} + n / 64 + 16 * uint64_t{d.segments} + 256);
  EXPECT_EQ(b.lanes.size(), d.lanes + 1u);
  EXPECT_EQ(b.lanes.back(), chunk.size() - 4);  // the stream ends at the checksum
  ASSERT_GE(b.tables.size(), d.table_first + 1u);
  DevConditional dc;
  std::memcpy(&dc, &b.tables[d.table_first], sizeof(dc));
  auto parsed = ParseChunk(chunk);
  ASSERT_OK(parsed);
  auto info = codec::DescribeConditional(parsed->payload);
  ASSERT_OK(info);
  EXPECT_EQ(dc.lo, static_cast<uint32_t>(info->lo));
  uint32_t sum = 0;
  for (int c = 0; c < kCondClasses; ++c) {
    EXPECT_EQ(dc.k[c], info->changes[c]);
    EXPECT_EQ(dc.first[c], sum);
    sum += dc.k[c];
    EXPECT_EQ(dc.gw[c] != 0, dc.k[c] != 0);
    for (uint32_t g = 0; g < 4; ++g) {
      EXPECT_EQ(dc.plane[4 * c + g].mode == kCondAbsent, g >= dc.gw[c]) << c << " " << g;
      if (dc.plane[4 * c + g].mode == kCondTable) {
        EXPECT_LT(d.table_first + 1u + dc.plane[4 * c + g].table, b.tables.size());
      }
    }
  }
  EXPECT_EQ(sum, h.changed);
  EXPECT_NE(dc.plane[4 * kCondClasses].mode, kCondAbsent);
  EXPECT_NE(dc.plane[4 * kCondClasses + 1].mode, kCondAbsent);
  // A truncated payload (the checksum fixed) never gets past the host.
  auto bad = chunk;
  auto pc = ParseChunk(bad);
  ASSERT_OK(pc);
  std::vector<uint8_t> cut(pc->payload.begin(), pc->payload.begin() + 5);
  bad.clear();
  SerializeChunk(pc->header, cut, &bad);
  span = {0, bad.size()};
  EXPECT_THAT(PrepareBatches(bad, std::span(&span, 1), names, plan, {}),
              StatusIs(StatusCode::kDataLoss));
}

// The GPU decoder reads a kind-5 chunk's base through its span's linear
// address: a placement that does not store the span contiguously (a
// column shard) is refused, naming the chunk, before anything runs.
TEST(Batch, ConditionalChunkNeedsItsSpanContiguous) {
  ChunkHeader h;
  auto chunk = MakeConditionalChunk(0, 1 << 16, 0, 0, 0.03, 6, &h);
  PlacementPlan plan;
  ASSERT_OK(plan.Add(ColShardPlacement("t", 2, 256, 256, 0, 128, 4096)));
  std::vector<std::string> names = {"t"};
  ChunkSpan span{0, chunk.size()};
  PrepareOptions opts;
  opts.verify = false;
  auto p = PrepareBatches(chunk, std::span(&span, 1), names, plan, opts);
  EXPECT_THAT(p, StatusIs(StatusCode::kUnimplemented));
  EXPECT_NE(p.status().message().find("chunk 0"), std::string::npos) << p.status().ToString();
}

// A kind-5 chunk decodes against its range as the batches of one apply
// find it, in no set order: one that shares an element with another chunk
// of the apply is refused, naming it; regions that interleave without
// sharing elements (tensor-parallel ranks' column blocks) are not.
TEST(Batch, ConditionalChunkSharingElementsWithAnotherIsRefused) {
  PlacementPlan plan;
  ASSERT_OK(plan.Add(WholePlacement("t", 2, 256, 256, 4096)));
  std::vector<std::string> names = {"t"};
  struct R {
    uint64_t start, count, run, stride;
  };
  auto prepare = [&](std::initializer_list<R> regions) {
    std::vector<uint8_t> buf;
    std::vector<ChunkSpan> spans;
    uint32_t seed = 10;
    for (const R& r : regions) {
      ChunkHeader h;
      auto c = MakeConditionalChunk(r.start, r.count, r.run, r.stride, 0.05, ++seed, &h);
      spans.push_back({buf.size(), c.size()});
      buf.insert(buf.end(), c.begin(), c.end());
    }
    return PrepareBatches(buf, spans, names, plan, {});
  };
  // Two ranks' column halves of rows 0..99, and the range right after.
  EXPECT_OK(prepare({{0, 100 * 128, 128, 256}, {128, 100 * 128, 128, 256}, {100 * 256, 1000, 0, 0}}));
  // A range in the gaps between a region's rows (row 0's right half).
  EXPECT_OK(prepare({{0, 100 * 128, 128, 256}, {128, 128, 0, 0}}));
  // Overlapping column blocks.
  auto p = prepare({{0, 100 * 128, 128, 256}, {100, 100 * 128, 128, 256}});
  EXPECT_THAT(p, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_NE(p.status().message().find("chunk 0"), std::string::npos) << p.status().ToString();
  // A range that ends in a region's last row, given first.
  p = prepare({{99 * 256 + 127, 10, 0, 0}, {0, 100 * 128, 128, 256}});
  EXPECT_THAT(p, StatusIs(StatusCode::kFailedPrecondition));
  // The same range twice (two versions of it in one apply).
  p = prepare({{0, 4096, 0, 0}, {0, 4096, 0, 0}});
  EXPECT_THAT(p, StatusIs(StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace refit::cuda
