#include "cuda/encode_plan.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "codec/payload.h"
#include "codec/rans.h"
#include "cuda/batch.h"
#include "delta/chunk.h"
#include "delta/encoder.h"
#include "format/safetensors.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit::cuda::internal {
namespace {

using ::refit::testing::StatusIs;

const void* FakeAddress(uint64_t a) {
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(a));
}

TEST(EncodePlan, RangesAreCutAsTheCpuEncoderCutsThem) {
  const uint64_t chunk_bytes = 1 << 16;
  std::vector<DeviceTensorPair> pairs;
  const uint64_t sizes[] = {100000, 0, 32768, 1, 20000, 65536};
  const int widths[] = {1, 2, 2, 4, 8, 8};
  for (int i = 0; i < 6; ++i) {
    DeviceTensorPair p;
    p.elements = sizes[i];
    p.width = widths[i];
    p.old_data = FakeAddress(0x100000000ull * (i + 1));
    p.new_data = FakeAddress(0x100000000ull * (i + 1) + 0x80000000ull);
    pairs.push_back(p);
  }
  auto plan = PlanRanges(pairs, chunk_bytes);
  ASSERT_OK(plan.status());
  size_t at = 0;
  uint64_t segs = 0, words = 0;
  for (size_t p = 0; p < pairs.size(); ++p) {
    const uint64_t per = chunk_bytes / pairs[p].width;
    for (uint64_t s = 0; s < pairs[p].elements; s += per, ++at) {
      ASSERT_LT(at, plan->ranges.size());
      const HostRange& r = plan->ranges[at];
      const EncRange& d = plan->dev[at];
      const uint64_t count = std::min(per, pairs[p].elements - s);
      EXPECT_EQ(r.pair, p);
      EXPECT_EQ(r.width, pairs[p].width);
      EXPECT_EQ(r.start, s);
      EXPECT_EQ(r.count, count);
      EXPECT_EQ(r.seg_first, segs);
      EXPECT_EQ(r.segs,
                (count * r.width + kRangeHashSegment - 1) / kRangeHashSegment);
      EXPECT_EQ(d.a, 0x100000000ull * (p + 1) + s * r.width);
      EXPECT_EQ(d.b, d.a + 0x80000000ull);
      EXPECT_EQ(d.bytes, count * r.width);
      EXPECT_EQ(d.seg_first, segs);
      EXPECT_EQ(d.rec_off, ~uint64_t{0});
      EXPECT_EQ(d.mask_off, words);
      EXPECT_EQ(plan->MaskEnd(at), words);
      segs += r.segs;
      words += (count + 31) / 32;
    }
  }
  EXPECT_EQ(at, plan->ranges.size());
  EXPECT_EQ(plan->segs, segs);
  EXPECT_EQ(plan->mask_words, words);
  EXPECT_EQ(plan->MaskEnd(at), words);

  // 2^28 elements at most, whatever the chunk size.
  DeviceTensorPair big = pairs[0];
  big.elements = (uint64_t{1} << 28) + 5;
  auto cut = PlanRanges(std::span(&big, 1), uint64_t{1} << 30);
  ASSERT_OK(cut.status());
  ASSERT_EQ(cut->ranges.size(), 2u);
  EXPECT_EQ(cut->ranges[0].count, uint64_t{1} << 28);
  EXPECT_EQ(cut->ranges[1].count, 5u);

  DeviceTensorPair bad = pairs[0];
  bad.width = 3;
  EXPECT_THAT(PlanRanges(std::span(&bad, 1), chunk_bytes),
              StatusIs(StatusCode::kInvalidArgument));
  bad = pairs[0];
  bad.new_data = nullptr;
  EXPECT_THAT(PlanRanges(std::span(&bad, 1), chunk_bytes),
              StatusIs(StatusCode::kInvalidArgument));
  bad.elements = 0;  // no elements, no data needed
  EXPECT_OK(PlanRanges(std::span(&bad, 1), chunk_bytes).status());
}

TEST(EncodePlan, WindowsRecordsAndGroups) {
  DeviceTensorPair p;
  p.elements = 10 * 32768 + 1000;
  p.width = 2;
  p.old_data = FakeAddress(1 << 20);
  p.new_data = FakeAddress(1 << 30);
  auto plan = PlanRanges(std::span(&p, 1), 1 << 16);
  ASSERT_OK(plan.status());
  ASSERT_EQ(plan->ranges.size(), 11u);
  // Each full range has 1024 mask words.
  EXPECT_EQ(WindowEnd(*plan, 0, 1), 1u);  // at least one range
  EXPECT_EQ(WindowEnd(*plan, 0, 1024), 1u);
  EXPECT_EQ(WindowEnd(*plan, 0, 3000), 2u);
  EXPECT_EQ(WindowEnd(*plan, 3, 4096), 7u);
  EXPECT_EQ(WindowEnd(*plan, 8, 1 << 20), 11u);

  // Range i < 10 (one segment each): i * 200 changed; range 10: 10.
  std::vector<uint32_t> counts(plan->segs, 0);
  ASSERT_EQ(plan->segs, 11u);
  for (uint32_t i = 0; i < 11; ++i) counts[i] = i < 10 ? i * 200 : 10;
  std::vector<uint32_t> seg_rec(plan->segs, 99);
  CountRecords(counts, 0, 11, plan->ranges, seg_rec);
  for (size_t i = 0; i < plan->ranges.size(); ++i) {
    const HostRange& r = plan->ranges[i];
    EXPECT_EQ(seg_rec[r.seg_first], 0u);
    EXPECT_EQ(r.k, counts[i]);
    EXPECT_EQ(r.gpu, r.k > 0 && r.k * 16 < r.count) << i;
  }
  EXPECT_FALSE(plan->ranges[0].gpu);  // unchanged
  EXPECT_TRUE(plan->ranges[9].gpu);   // 1800 of 32768
  EXPECT_TRUE(plan->ranges[10].gpu);  // 10 of 1000
  // Segment offsets within a range of several segments.
  std::vector<HostRange> two(1);
  two[0].segs = 3;
  two[0].seg_first = 1;
  two[0].count = 100000;
  const uint32_t seg_counts[] = {0, 5, 7, 9};
  std::vector<uint32_t> offs(4, 99);
  CountRecords(seg_counts, 0, 1, two, offs);
  EXPECT_EQ(offs, (std::vector<uint32_t>{99, 0, 5, 12}));
  EXPECT_EQ(two[0].k, 21u);
  EXPECT_FALSE(GpuEncodes(2048, 32768));  // 1/16: the CPU tries dense
  EXPECT_TRUE(GpuEncodes(2047, 32768));

  // Groups: ranges whose staging fits, at least one.
  std::span<const HostRange> ranges = plan->ranges;
  const uint64_t one = StagingBytes(ranges[1]);
  EXPECT_EQ(one, 200 * (2 * 6 + 2 * 6) + 64u);
  EXPECT_EQ(StagingBytes(ranges[0]), 0u);
  EXPECT_EQ(GroupEnd(ranges, 1, 11, 1), 2u);
  EXPECT_EQ(GroupEnd(ranges, 0, 11, one), 2u);  // range 0 takes nothing
  EXPECT_EQ(GroupEnd(ranges, 1, 5, 1 << 30), 5u);
  const GroupLayout g = LayOutGroup(ranges, 0, 11);
  ASSERT_EQ(g.list.size(), 10u);
  uint64_t recs = 0, vals = 0;
  for (size_t c = 0; c < g.list.size(); ++c) {
    const HostRange& r = ranges[g.list[c]];
    EXPECT_TRUE(r.gpu);
    EXPECT_EQ(g.chunks[c].rec_off, recs);
    EXPECT_EQ(g.chunks[c].val_off, vals);
    EXPECT_EQ(g.chunks[c].val_off % 16, 0u);
    EXPECT_EQ(g.chunks[c].k, r.k);
    EXPECT_EQ(g.chunks[c].width, 2u);
    recs += r.k;
    vals += (r.k * 2 + 15) / 16 * 16;
  }
  EXPECT_EQ(g.records, recs);
  EXPECT_EQ(g.value_bytes, vals);
  std::vector<EncRange> staged(11);
  StagedRanges(*plan, 0, 11, g, staged.data());
  EXPECT_EQ(staged[0].rec_off, ~uint64_t{0});  // not compacted
  EXPECT_EQ(staged[1].rec_off, 0u);
  EXPECT_EQ(staged[2].rec_off, ranges[1].k);
  EXPECT_EQ(staged[2].a, plan->dev[2].a);

  EXPECT_EQ(HistogramSlices(132, 1, 1000), 1u);
  EXPECT_EQ(HistogramSlices(132, 1, 1 << 20), 64u);
  EXPECT_EQ(HistogramSlices(132, 100, 100 << 12), 1u);
  EXPECT_EQ(HistogramSlices(132, 20, uint64_t{20} << 20), 27u);
}

// One range's changed elements, as the compaction kernel leaves them.
struct Records {
  std::vector<uint32_t> positions;
  std::vector<uint8_t> values;  // XOR, w bytes each
};

Records Compact(const uint8_t* a, const uint8_t* b, uint64_t count, int w) {
  Records r;
  for (uint64_t i = 0; i < count; ++i) {
    if (std::memcmp(a + i * w, b + i * w, w) == 0) continue;
    r.positions.push_back(static_cast<uint32_t>(i));
    for (int j = 0; j < w; ++j) r.values.push_back(a[i * w + j] ^ b[i * w + j]);
  }
  return r;
}

uint64_t ValueAt(const Records& r, size_t i, int w) {
  uint64_t v = 0;
  std::memcpy(&v, r.values.data() + i * w, w);
  return v;
}

uint32_t GapAt(const Records& r, size_t i) {
  return i == 0 ? r.positions[0] : r.positions[i] - r.positions[i - 1] - 1;
}

// What the histogram kernel counts: per plane (SparsePlane::histogram
// order) the non-zero bytes of the gaps and values, and the largest gap.
std::vector<uint32_t> GpuHistograms(const Records& r, int w,
                                    uint32_t* max_gap) {
  std::vector<uint32_t> h(kEncPlanes * 256, 0);
  *max_gap = 0;
  for (size_t i = 0; i < r.positions.size(); ++i) {
    const uint32_t g = GapAt(r, i);
    *max_gap = std::max(*max_gap, g);
    for (int j = 0; j < codec::kSparseGapBytes; ++j) {
      const uint32_t s = (g >> (8 * j)) & 0xff;
      if (s != 0) ++h[codec::SparsePlane::Gap(j).histogram() * 256 + s];
    }
    const uint64_t v = ValueAt(r, i, w);
    for (int j = 0; j < w; ++j) {
      const uint32_t s = static_cast<uint32_t>(v >> (8 * j)) & 0xff;
      if (s != 0) ++h[codec::SparsePlane::Value(j).histogram() * 256 + s];
    }
  }
  return h;
}

// The stream the lane kernel is to write for a planned chunk: its records
// coded with the planned tables, plane shifts and lanes, by the codec.
std::vector<uint8_t> PlannedStream(const EncChunk& e, const HostChunk& hc,
                                   const Records& r, int w) {
  std::vector<codec::EncPlane> enc(e.coded);
  std::vector<const codec::EncPlane*> encp;
  std::vector<int> index;
  for (uint32_t q = 0; q < e.coded; ++q) {
    codec::Model m;
    m.mode = codec::ModelMode::kTable;
    m.t = static_cast<int>(hc.tables[q].t);
    std::memcpy(m.f.data(), hc.tables[q].f, sizeof(hc.tables[q].f));
    EXPECT_EQ(m.t, e.scale[q]);
    codec::BuildEncPlane(m, &enc[q]);
    encp.push_back(&enc[q]);
    index.push_back(static_cast<int>(q));
  }
  std::vector<uint8_t> out;
  codec::EncodeStream(
      e.k, static_cast<int>(e.lanes), index, encp,
      [&](uint32_t i, uint8_t* syms) {
        const uint64_t gap = GapAt(r, i), val = ValueAt(r, i, w);
        for (uint32_t q = 0; q < e.coded; ++q) {
          const uint32_t sh = e.shift[q];
          syms[q] = static_cast<uint8_t>(
              codec::ShiftIsGap(sh) ? gap >> sh
                                    : val >> (sh - codec::kSparseValueShift));
        }
      },
      &out);
  return out;
}

// Plans range [start, start + count) of a tensor as the GPU encoder does and
// checks it against the CPU encoder's chunk of the same range: the payload
// header, the lanes, the stream its tables and shifts give, the chunk
// header, and the receiver's reading of the CPU chunk (batch.cc). Returns
// whether the range was one the GPU encodes.
bool CheckRange(const uint8_t* old_data, const uint8_t* new_data,
                uint64_t start, uint64_t count, int w, uint32_t per_lane) {
  const uint8_t* a = old_data + start * w;
  const uint8_t* b = new_data + start * w;
  const Records rec = Compact(a, b, count, w);
  const uint32_t k = static_cast<uint32_t>(rec.positions.size());
  if (!GpuEncodes(k, count)) return false;
  SCOPED_TRACE("range at " + std::to_string(start) + ", w " +
               std::to_string(w) + ", k " + std::to_string(k) + ", lanes of " +
               std::to_string(per_lane));
  ChunkHeader ids;
  ids.width = static_cast<uint8_t>(w);
  ids.version = 5;
  ids.base_version = 4;
  ids.tensor_id = 3;
  ChunkEncodeOptions copt;
  copt.codec.records_per_lane = per_lane;
  EncodeScratch scratch;
  ChunkResult cpu;
  EXPECT_OK(EncodeChunkRange(ids, old_data, new_data, start, count, copt,
                             &scratch, &cpu));
  auto parsed = ParseChunk(cpu.chunk);
  EXPECT_OK(parsed.status());
  if (!parsed.ok()) return true;
  EXPECT_EQ(parsed->header.kind, codec::ChunkKind::kSparseXor);
  const std::span<const uint8_t> payload = parsed->payload;

  HostRange r;
  r.width = w;
  r.start = start;
  r.count = count;
  r.k = k;
  r.gpu = true;
  GroupLayout g = LayOutGroup(std::span(&r, 1), 0, 1);
  EXPECT_EQ(g.chunks.size(), 1u);
  uint32_t max_gap = 0;
  const std::vector<uint32_t> hist = GpuHistograms(rec, w, &max_gap);
  HostChunk hc;
  EncChunk& e = g.chunks[0];
  ChooseChunkModels(hist, max_gap, static_cast<uint32_t>(count), per_lane, &e,
                    &hc);
  LayOutLanes(g.chunks, std::span(&hc, 1));

  EXPECT_LE(hc.header.size(), payload.size());
  EXPECT_TRUE(std::equal(hc.header.begin(), hc.header.end(), payload.begin()))
      << "model descriptions differ";
  EXPECT_EQ(hc.tables.size(), e.coded);
  auto info = codec::DescribePayload(payload, codec::ChunkKind::kSparseXor,
                                     static_cast<uint32_t>(count), w, k);
  EXPECT_OK(info.status());
  if (info.ok()) {
    EXPECT_EQ(static_cast<int>(e.lanes), info->lanes);
  }
  std::vector<uint8_t> planned = hc.header;
  const std::vector<uint8_t> stream = PlannedStream(e, hc, rec, w);
  planned.insert(planned.end(), stream.begin(), stream.end());
  EXPECT_TRUE(std::equal(planned.begin(), planned.end(), payload.begin(),
                         payload.end()))
      << "planned payload of " << planned.size() << " bytes, CPU "
      << payload.size();
  std::vector<uint8_t> chunk;
  GpuEncodeOptions gopt;
  gopt.version = 5;
  gopt.base_version = 4;
  SerializeChunk(
      RangeHeader(r, ids.tensor_id, gopt, cpu.header.before, cpu.header.after),
      planned, &chunk);
  EXPECT_EQ(chunk, cpu.chunk);

  // The receiver reads the same tables and shifts from the CPU chunk.
  PlacementPlan place;
  EXPECT_OK(place.Add(WholePlacement("t", w, 1, start + count, 1 << 20)));
  const std::vector<std::string> names = {"t0", "t1", "t2", "t"};
  const ChunkSpan span{0, cpu.chunk.size()};
  PrepareOptions popt;
  popt.verify = false;
  auto prepared =
      PrepareBatches(cpu.chunk, std::span(&span, 1), names, place, popt);
  EXPECT_OK(prepared.status());
  if (prepared.ok() && prepared->batches.size() == 1) {
    const HostBatch& hb = prepared->batches[0];
    const DevChunk& d = hb.chunks[0];
    EXPECT_EQ(d.coded, e.coded);
    EXPECT_EQ(d.lanes, e.lanes);
    for (uint32_t q = 0; q < e.coded && q < d.coded; ++q) {
      EXPECT_EQ(d.coded_shift[q], e.shift[q]);
      EXPECT_EQ(hb.tables[q].t, hc.tables[q].t);
      EXPECT_EQ(0, std::memcmp(hb.tables[q].f, hc.tables[q].f,
                               sizeof(hb.tables[q].f)));
    }
  }
  return true;
}

TEST(EncodePlan, ModelsAndStreamsEqualTheCpuEncoderOnSyntheticData) {
  int checked = 0;
  uint64_t seed = 1;
  for (int w : {1, 2, 4, 8}) {
    for (double rate : {0.0002, 0.003, 0.02, 0.05}) {
      const uint64_t count = 1 << 17;
      std::mt19937_64 rng(seed++);
      std::vector<uint8_t> a(count * w), b;
      for (auto& x : a) x = static_cast<uint8_t>(rng());
      b = a;
      const uint64_t threshold = static_cast<uint64_t>(rate * 1e6);
      for (uint64_t i = 0; i < count; ++i) {
        if (rng() % 1000000 >= threshold) continue;
        // BF16-like: mostly low mantissa bits, sometimes a higher byte.
        const uint64_t r = rng() % 100;
        const uint64_t x = r < 50   ? 1
                           : r < 75 ? 3
                           : r < 90 ? 1 + rng() % 15
                                    : rng();
        for (int j = 0; j < w; ++j)
          b[i * w + j] ^= static_cast<uint8_t>(x >> (8 * j));
        if (std::memcmp(&a[i * w], &b[i * w], w) == 0) b[i * w] ^= 1;
      }
      for (uint32_t per_lane : {64u, 1024u}) {
        checked += CheckRange(a.data(), b.data(), 0, count, w, per_lane);
        checked += CheckRange(a.data(), b.data(), 4096, 40000, w, per_lane);
      }
    }
  }
  // A few changes far apart: gaps of two, three and four bytes.
  for (int w : {1, 2}) {
    const uint64_t count = (uint64_t{1} << 24) + (uint64_t{1} << 20);
    std::vector<uint8_t> a(count * w, 0), b(count * w, 0);
    for (uint64_t i :
         {uint64_t{5}, uint64_t{70000}, uint64_t{300000}, uint64_t{17200000}}) {
      b[i * w] = static_cast<uint8_t>(i | 1);
    }
    checked += CheckRange(a.data(), b.data(), 0, count, w, 1024);
    checked += CheckRange(a.data(), b.data(), 0, 1 << 20, w, 1);
  }
  EXPECT_GE(checked, 64);
}

TEST(EncodePlan, ModelsAndStreamsEqualTheCpuEncoderOnFixtureSteps) {
  REFIT_REQUIRE_FIXTURES();
  const std::string dir = ::refit::testing::FixturesDir() + "/";
  int checked = 0;
  for (int step = 0; step < 3; ++step) {
    auto from = SafetensorsFile::Open(
        dir + "step" + std::to_string(step) + ".safetensors",
        MappedFile::Mode::kReadOnly);
    auto to = SafetensorsFile::Open(
        dir + "step" + std::to_string(step + 1) + ".safetensors",
        MappedFile::Mode::kReadOnly);
    ASSERT_OK(from.status());
    ASSERT_OK(to.status());
    ASSERT_EQ(from->tensors().size(), to->tensors().size());
    for (size_t t = 0; t < from->tensors().size(); ++t) {
      const SafetensorsTensor& st = from->tensors()[t];
      const int w = st.element_width;
      const uint64_t n = st.num_elements;
      const uint8_t* a = from->Data(t).data();
      const uint8_t* b = to->Data(t).data();
      // The chunk sizes the GPU tests use.
      for (uint64_t chunk_bytes : {uint64_t{1} << 16, uint64_t{1} << 20}) {
        const uint64_t per = chunk_bytes / w;
        for (uint64_t s = 0; s < n; s += per) {
          checked += CheckRange(a, b, s, std::min(per, n - s), w, 1024);
        }
      }
    }
  }
  std::printf("%d fixture ranges planned as the CPU encodes them\n", checked);
  EXPECT_GT(checked, 100);
}

TEST(EncodePlan, LaneRegionsTileEachChunksWords) {
  std::vector<EncChunk> chunks(4, EncChunk{});
  std::vector<HostChunk> hc(4);
  const uint32_t ks[] = {1, 1000, 4097, 77};
  const uint32_t lanes[] = {1, 3, 5, 77};
  const uint32_t coded[] = {0, 2, 5, 12};
  for (int c = 0; c < 4; ++c) {
    chunks[c].k = ks[c];
    chunks[c].lanes = lanes[c];
    chunks[c].coded = coded[c];
    hc[c].tables.resize(coded[c]);
  }
  const LaneLayout l = LayOutLanes(chunks, hc);
  uint64_t words = 0;
  uint32_t first_lane = 0, tables = 0;
  for (int c = 0; c < 4; ++c) {
    const EncChunk& e = chunks[c];
    EXPECT_EQ(e.word_off, words);
    EXPECT_EQ(e.lane_first, first_lane);
    EXPECT_EQ(e.table_first, tables);
    uint64_t end = e.word_off;
    for (uint32_t j = 0; j < e.lanes; ++j) {
      // Lane j's records: j, j + L, ...
      const uint64_t records = (e.k + e.lanes - 1 - j) / e.lanes;
      EXPECT_EQ(LaneRegionEnd(e, j) - end, records * e.coded) << c << " " << j;
      end = LaneRegionEnd(e, j);
    }
    EXPECT_EQ(end, e.word_off + uint64_t{e.k} * e.coded);
    words += uint64_t{e.k} * e.coded;
    first_lane += e.lanes;
    tables += coded[c];
  }
  EXPECT_EQ(l.words, words);
  EXPECT_EQ(l.lanes, first_lane);
  EXPECT_EQ(l.tables, tables);
  EXPECT_EQ(l.max_coded, 12u);
  EXPECT_EQ(l.max_lanes, 77u);
}

}  // namespace
}  // namespace refit::cuda::internal
