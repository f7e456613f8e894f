#include "cuda/encode_plan.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "codec/rans.h"

namespace refit::cuda::internal {

Result<RangePlan> PlanRanges(std::span<const DeviceTensorPair> pairs,
                             uint64_t chunk_bytes) {
  RangePlan plan;
  for (size_t p = 0; p < pairs.size(); ++p) {
    const DeviceTensorPair& t = pairs[p];
    if (t.width != 1 && t.width != 2 && t.width != 4 && t.width != 8) {
      return InvalidArgumentError("element width must be 1, 2, 4 or 8");
    }
    if (t.elements == 0) continue;
    if (t.old_data == nullptr || t.new_data == nullptr) {
      return InvalidArgumentError("pair " + std::to_string(p) + " has no data");
    }
    const uint64_t per =
        std::min<uint64_t>(chunk_bytes / t.width, kMaxChunkElements);
    for (uint64_t s = 0; s < t.elements; s += per) {
      HostRange r;
      r.pair = static_cast<uint32_t>(p);
      r.width = t.width;
      r.start = s;
      r.count = std::min(per, t.elements - s);
      r.seg_first = plan.segs;
      const uint64_t bytes = r.count * t.width;
      r.segs = static_cast<uint32_t>((bytes + kRangeHashSegment - 1) /
                                     kRangeHashSegment);
      plan.segs += r.segs;
      plan.ranges.push_back(r);
      EncRange d{};
      d.a = reinterpret_cast<uintptr_t>(t.old_data) + s * t.width;
      d.b = reinterpret_cast<uintptr_t>(t.new_data) + s * t.width;
      d.bytes = bytes;
      d.seg_first = r.seg_first;
      d.rec_off = ~uint64_t{0};
      d.mask_off = plan.mask_words;
      plan.mask_words += (r.count + 31) / 32;
      d.width = static_cast<uint32_t>(t.width);
      plan.dev.push_back(d);
    }
  }
  return plan;
}

size_t WindowEnd(const RangePlan& plan, size_t w0, uint64_t mask_cap_words) {
  size_t w1 = w0 + 1;
  while (w1 < plan.ranges.size() &&
         plan.MaskEnd(w1 + 1) - plan.MaskEnd(w0) <= mask_cap_words) {
    ++w1;
  }
  return w1;
}

void CountRecords(std::span<const uint32_t> counts, size_t w0, size_t w1,
                  std::span<HostRange> ranges, std::span<uint32_t> seg_rec) {
  for (size_t i = w0; i < w1; ++i) {
    HostRange& r = ranges[i];
    uint64_t k = 0;
    for (uint32_t j = 0; j < r.segs; ++j) {
      seg_rec[r.seg_first + j] = static_cast<uint32_t>(k);
      k += counts[r.seg_first + j];
    }
    r.k = k;
    r.gpu = GpuEncodes(k, r.count);
  }
}

uint64_t StagingBytes(const HostRange& r) {
  const uint64_t w = static_cast<uint64_t>(r.width);
  return r.gpu ? r.k * (2 * (4 + w) + 2 * (4 + w)) + 64 : 0;
}

size_t GroupEnd(std::span<const HostRange> ranges, size_t g0,
                size_t detected_end, uint64_t staging_bytes) {
  uint64_t need = 0;
  size_t g1 = g0;
  for (; g1 < detected_end; ++g1) {
    const uint64_t more = StagingBytes(ranges[g1]);
    if (g1 > g0 && need + more > staging_bytes) break;
    need += more;
  }
  return g1;
}

GroupLayout LayOutGroup(std::span<const HostRange> ranges, size_t g0,
                        size_t g1) {
  GroupLayout g;
  for (size_t i = g0; i < g1; ++i) {
    if (ranges[i].gpu) g.list.push_back(static_cast<uint32_t>(i));
  }
  g.chunks.assign(g.list.size(), EncChunk{});
  for (size_t c = 0; c < g.list.size(); ++c) {
    const HostRange& r = ranges[g.list[c]];
    const uint32_t w = static_cast<uint32_t>(r.width);
    EncChunk& e = g.chunks[c];
    e.rec_off = g.records;
    e.val_off = g.value_bytes;
    e.k = static_cast<uint32_t>(r.k);
    e.width = w;
    g.records += r.k;
    g.value_bytes += (r.k * w + 15) / 16 * 16;
  }
  return g;
}

void StagedRanges(const RangePlan& plan, size_t g0, size_t g1,
                  const GroupLayout& group, EncRange* out) {
  std::copy(plan.dev.begin() + static_cast<ptrdiff_t>(g0),
            plan.dev.begin() + static_cast<ptrdiff_t>(g1), out);
  for (size_t c = 0; c < group.list.size(); ++c) {
    out[group.list[c] - g0].rec_off = group.chunks[c].rec_off;
    out[group.list[c] - g0].val_off = group.chunks[c].val_off;
  }
}

uint32_t HistogramSlices(int sm_count, uint32_t nchunks, uint64_t records) {
  return static_cast<uint32_t>(std::clamp<uint64_t>(
      std::min<uint64_t>((4 * sm_count + nchunks - 1) / nchunks,
                         records / nchunks / 4096),
      1, 64));
}

std::vector<codec::Histogram> FullHistograms(std::span<const uint32_t> gpu_hist,
                                             uint32_t k, int width) {
  std::vector<codec::Histogram> hist(
      static_cast<size_t>(codec::kSparseGapBytes + width));
  for (size_t plane = 0; plane < hist.size(); ++plane) {
    const uint32_t* src = gpu_hist.data() + plane * 256;
    codec::Histogram& h = hist[plane];
    uint64_t others = 0;
    for (int s = 1; s < 256; ++s) {
      h[s] = src[s];
      others += src[s];
    }
    h[0] = k - others;
  }
  return hist;
}

void ChooseChunkModels(std::span<const uint32_t> gpu_hist, uint32_t max_gap,
                       uint32_t n, uint32_t records_per_lane, EncChunk* chunk,
                       HostChunk* out) {
  const uint32_t k = chunk->k;
  const int w = static_cast<int>(chunk->width);
  std::vector<codec::Model> models;
  const int gw = codec::ChooseSparseModels(FullHistograms(gpu_hist, k, w), n, k,
                                           max_gap, &models, &out->header);
  chunk->coded = 0;
  for (int j = 0; j < gw + w; ++j) {
    const codec::Model& m = models[j];
    if (!m.coded()) continue;
    EncTable t{};
    t.t = static_cast<uint32_t>(m.t);
    std::memcpy(t.f, m.f.data(), sizeof(t.f));
    out->tables.push_back(t);
    chunk->scale[chunk->coded] = static_cast<uint8_t>(m.t);
    chunk->shift[chunk->coded++] =
        static_cast<uint8_t>(codec::SparsePlaneAt(j, gw).shift());
  }
  chunk->lanes = static_cast<uint32_t>(
      codec::ChooseLanes(k, records_per_lane, chunk->coded > 0));
}

LaneLayout LayOutLanes(std::span<EncChunk> chunks,
                       std::span<const HostChunk> hc) {
  LaneLayout l;
  for (size_t c = 0; c < chunks.size(); ++c) {
    EncChunk& e = chunks[c];
    e.table_first = static_cast<uint32_t>(l.tables);
    l.tables += hc[c].tables.size();
    e.word_off = l.words;
    l.words += uint64_t{e.k} * e.coded;
    e.lane_first = l.lanes;
    l.lanes += e.lanes;
    l.max_coded = std::max(l.max_coded, e.coded);
    l.max_lanes = std::max(l.max_lanes, e.lanes);
  }
  return l;
}

ChunkHeader RangeHeader(const HostRange& r, uint64_t tensor_id,
                        const GpuEncodeOptions& opt, const Hash128& before,
                        const Hash128& after) {
  ChunkHeader h;
  h.kind = codec::ChunkKind::kSparseXor;
  h.width = static_cast<uint8_t>(r.width);
  h.version = opt.version;
  h.base_version = opt.base_version;
  h.tensor_id = tensor_id;
  h.start = r.start;
  h.count = r.count;
  h.changed = r.k;
  h.before = before;
  h.after = after;
  return h;
}

}  // namespace refit::cuda::internal
