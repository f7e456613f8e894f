#include "delta/encoder.h"

#include <algorithm>
#include <time.h>

#include <chrono>
#include <cstring>
#include <numeric>

#include "base/bytes.h"
#include "base/pipeline.h"
#include "delta/detect.h"

namespace refit {
namespace {

using codec::ChunkKind;

bool ValidWidth(int w) { return w == 1 || w == 2 || w == 4 || w == 8; }

// CPU seconds of the calling thread: stage times that other work on the
// same cores does not inflate.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Keeps the smaller of scratch->candidate and scratch->best.
void Keep(ChunkKind kind, EncodeScratch* s, ChunkKind* best_kind, bool* have) {
  if (!*have || s->candidate.size() < s->best.size()) {
    s->best.swap(s->candidate);
    *best_kind = kind;
    *have = true;
  }
}

}  // namespace

namespace {

template <int W>
struct Word;
template <>
struct Word<1> { using T = uint8_t; };
template <>
struct Word<2> { using T = uint16_t; };
template <>
struct Word<4> { using T = uint32_t; };
template <>
struct Word<8> { using T = uint64_t; };

// For the `found` changed elements of a segment (indices relative to it in
// pos[]): writes their values (new bits, or new XOR old) to vout and makes
// the indices relative to the range by adding base_index.
template <int W>
void ExtractValues(const uint8_t* a, const uint8_t* b, uint32_t* pos,
                   size_t found, uint32_t base_index, bool allow_xor,
                   uint8_t* vout) {
  using T = typename Word<W>::T;
  for (size_t i = 0; i < found; ++i) {
    const size_t p = pos[i];
    pos[i] = static_cast<uint32_t>(p) + base_index;
    T x, y;
    std::memcpy(&x, b + p * W, W);
    std::memcpy(&y, a + p * W, W);
    if (allow_xor) x = static_cast<T>(x ^ y);
    std::memcpy(vout + i * W, &x, W);
  }
}

// Encodes the `count` region elements whose old and new bytes are at a and
// b (contiguous, in region order); `region` carries the header's start,
// run and stride.
Status EncodeElements(const ChunkHeader& ids, const uint8_t* a, const uint8_t* b,
                      uint64_t count, const ChunkHeader& region,
                      const ChunkEncodeOptions& options, EncodeScratch* s,
                      ChunkResult* out) {
  const int w = ids.width;
  if (!ValidWidth(w)) return InvalidArgumentError("element width must be 1, 2, 4 or 8");
  if (count == 0 || count > kMaxChunkElements) {
    return InvalidArgumentError("chunk element count outside 1..2^28");
  }
  const uint64_t bytes = count * static_cast<uint64_t>(w);
  const double t_start = ThreadCpuSeconds();

  // One pass per 64 KiB segment: detect, then hash the segment while it is
  // still in cache. Unchanged segments are hashed once.
  s->positions.clear();
  out->before_digests.clear();
  out->after_digests.clear();
  out->chunk.clear();
  out->payload_bytes = 0;
  // The changed values are extracted in the same pass, while the segment
  // is still in cache (a second pass over an 8 MiB chunk misses).
  s->values.clear();
  // So are the base's exponent counts that conditional XOR (kind 5) picks
  // its class window from, from the first segment with a change on (a
  // range without changes is not coded).
  const bool conditional = options.allow_xor && options.allow_conditional &&
                           w == codec::kConditionalWidth;
  bool sampling = false;
  for (uint64_t off = 0; off < bytes; off += kRangeHashSegment) {
    uint64_t len = std::min<uint64_t>(kRangeHashSegment, bytes - off);
    size_t first = s->positions.size();
    FindChanged(a + off, b + off, len / w, w, &s->positions);
    uint32_t base_index = static_cast<uint32_t>(off / w);
    const size_t found = s->positions.size() - first;
    if (found > 0) {
      s->values.resize(s->values.size() + found * w);
      uint32_t* pos = s->positions.data() + first;
      uint8_t* vout = s->values.data() + first * w;
      const uint8_t* sa = a + off;
      const uint8_t* sb = b + off;
      switch (w) {
        case 1:
          ExtractValues<1>(sa, sb, pos, found, base_index, options.allow_xor, vout);
          break;
        case 2:
          ExtractValues<2>(sa, sb, pos, found, base_index, options.allow_xor, vout);
          break;
        case 4:
          ExtractValues<4>(sa, sb, pos, found, base_index, options.allow_xor, vout);
          break;
        default:
          ExtractValues<8>(sa, sb, pos, found, base_index, options.allow_xor, vout);
          break;
      }
    }
    if (conditional && (sampling || found > 0)) {
      if (!sampling) s->sample = codec::ConditionalSample{static_cast<uint32_t>(off / w)};
      sampling = true;
      codec::SampleConditional(a, static_cast<uint32_t>(off / w),
                               static_cast<uint32_t>((off + len) / w),
                               std::span<const uint32_t>(s->positions).subspan(first),
                               &s->sample);
    }
    const Hash128 before = options.base_digests
                               ? options.base_digests[off / kRangeHashSegment]
                               : HashBytes(a + off, len);
    out->before_digests.push_back(before);
    out->after_digests.push_back(found > 0 ? HashBytes(b + off, len) : before);
  }
  const uint64_t k = s->positions.size();
  const double t_scanned = ThreadCpuSeconds();
  out->scan_seconds = t_scanned - t_start;
  out->code_seconds = 0;
  if (k == 0) return Status();

  ChunkHeader& h = out->header;
  h = ids;
  h.start = region.start;
  h.count = count;
  h.run = region.run;
  h.stride = region.stride;
  h.changed = k;
  h.before = HashSegmentDigests(out->before_digests.data(),
                                out->before_digests.size());
  h.after = HashSegmentDigests(out->after_digests.data(),
                               out->after_digests.size());

  const uint32_t n = static_cast<uint32_t>(count);

  ChunkKind best_kind = ChunkKind::kSparseXor;
  bool have = false;
  const ChunkKind sparse_kind =
      options.allow_xor ? ChunkKind::kSparseXor : ChunkKind::kSparseOverwrite;
  s->candidate.clear();
  REFIT_RETURN_IF_ERROR(codec::EncodeSparse(sparse_kind, n, w, s->positions,
                                            s->values.data(), options.codec,
                                            &s->candidate));
  Keep(sparse_kind, s, &best_kind, &have);
  if (conditional) {
    s->candidate.clear();
    REFIT_RETURN_IF_ERROR(codec::EncodeConditional(n, a, s->positions,
                                                   s->values.data(), options.codec,
                                                   &s->candidate, &s->sample));
    Keep(ChunkKind::kConditionalXor, s, &best_kind, &have);
  }

  // Dense encodings can only win once a sizeable share of the range
  // changed; below 1/16 a sparse record costs less than 16 dense elements.
  if (options.allow_xor && k * 16 >= count) {
    s->dense.assign(b, b + bytes);
    for (uint64_t i = 0; i < bytes; ++i) s->dense[i] ^= a[i];
    s->candidate.clear();
    REFIT_RETURN_IF_ERROR(
        codec::EncodeDense(n, w, s->dense.data(), options.codec, &s->candidate));
    Keep(ChunkKind::kDenseXor, s, &best_kind, &have);
  }
  if (k * 4 >= count) {
    s->candidate.clear();
    REFIT_RETURN_IF_ERROR(
        codec::EncodeDense(n, w, b, options.codec, &s->candidate));
    Keep(ChunkKind::kRaw, s, &best_kind, &have);
  }
  h.kind = best_kind;
  out->payload_bytes = s->best.size();
  SerializeChunk(h, s->best, &out->chunk);
  out->code_seconds = ThreadCpuSeconds() - t_scanned;
  return Status();
}

}  // namespace

Status EncodeChunkRange(const ChunkHeader& ids, const uint8_t* old_data,
                        const uint8_t* new_data, uint64_t start, uint64_t count,
                        const ChunkEncodeOptions& options, EncodeScratch* s,
                        ChunkResult* out) {
  ChunkHeader region;
  region.start = start;
  const uint64_t w = ids.width;
  return EncodeElements(ids, old_data + start * w, new_data + start * w, count,
                        region, options, s, out);
}

Status EncodeRegionChunk(const ChunkHeader& ids, const uint8_t* old_region,
                         const uint8_t* new_region, uint64_t start, uint64_t count,
                         uint64_t run, uint64_t stride,
                         const ChunkEncodeOptions& options, EncodeScratch* s,
                         ChunkResult* out) {
  ChunkHeader region;
  region.start = start;
  // Canonical form (docs/format.md §3): one row, or rows without gaps, is
  // a contiguous range.
  if (run != 0 && run < count && stride > run) {
    if (count % run != 0) {
      return InvalidArgumentError("region of " + std::to_string(count) +
                                  " elements is not whole rows of " + std::to_string(run));
    }
    region.run = run;
    region.stride = stride;
  }
  return EncodeElements(ids, old_region, new_region, count, region, options, s, out);
}

Result<std::vector<TensorEntry>> MatchTensors(
    const std::vector<TensorView>& base, const std::vector<TensorView>& target,
    std::vector<size_t>* base_order, std::vector<size_t>* target_order) {
  auto order = [](const std::vector<TensorView>& v) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), size_t{0});
    std::sort(idx.begin(), idx.end(),
              [&](size_t x, size_t y) { return v[x].name < v[y].name; });
    return idx;
  };
  *base_order = order(base);
  *target_order = order(target);
  if (target.size() > kMaxTensors) {
    return InvalidArgumentError("more than 2^24 tensors");
  }
  std::vector<TensorEntry> entries;
  entries.reserve(target.size());
  size_t i = 0, j = 0;
  while (i < base.size() || j < target.size()) {
    const TensorView* bt = i < base.size() ? &base[(*base_order)[i]] : nullptr;
    const TensorView* tt = j < target.size() ? &target[(*target_order)[j]] : nullptr;
    if (!tt || (bt && bt->name < tt->name)) {
      return InvalidArgumentError("tensor '" + bt->name +
                                  "' is in the base but not in the target; "
                                  "both versions must have the same tensors");
    }
    if (!bt || tt->name < bt->name) {
      return InvalidArgumentError("tensor '" + tt->name +
                                  "' is in the target but not in the base; "
                                  "both versions must have the same tensors");
    }
    if (!entries.empty() && entries.back().name == tt->name) {
      return InvalidArgumentError("tensor '" + tt->name + "' appears twice");
    }
    if (bt->dtype != tt->dtype || bt->width != tt->width || bt->shape != tt->shape) {
      return InvalidArgumentError("tensor '" + tt->name +
                                  "' changed dtype or shape between versions; "
                                  "a delta can only change values");
    }
    if (!ValidWidth(tt->width)) {
      return InvalidArgumentError("tensor '" + tt->name + "' has element width " +
                                  std::to_string(tt->width) +
                                  "; the codec supports 1, 2, 4 and 8 bytes");
    }
    if (tt->name.empty() || tt->name.size() > kMaxNameBytes) {
      return InvalidArgumentError("tensor name empty or longer than 4096 bytes");
    }
    if (tt->shape.size() > kMaxDims) {
      return InvalidArgumentError("tensor '" + tt->name + "' has more than 16 dims");
    }
    TensorEntry e;
    e.name = tt->name;
    e.dtype = tt->dtype;
    e.width = static_cast<uint8_t>(tt->width);
    e.shape = tt->shape;
    uint64_t n = 1, nbytes = 0;
    for (uint64_t d : tt->shape) {
      if (!MulChecked(n, d, &n)) return InvalidArgumentError("shape overflows");
    }
    if (!MulChecked(n, static_cast<uint64_t>(tt->width), &nbytes) ||
        nbytes > (uint64_t{1} << 62)) {
      return InvalidArgumentError("tensor '" + tt->name + "' is too large");
    }
    if (n > 0 && (bt->data == nullptr || tt->data == nullptr)) {
      return InvalidArgumentError("tensor '" + tt->name + "' has no data");
    }
    e.num_elements = n;
    entries.push_back(std::move(e));
    ++i;
    ++j;
  }
  return entries;
}

Result<DiffReport> DiffTensorsToSink(const std::vector<TensorView>& base,
                                     const std::vector<TensorView>& target,
                                     const DiffOptions& options, ChunkSink* sink,
                                     const std::vector<std::vector<Hash128>>* base_digests) {
  auto t0 = std::chrono::steady_clock::now();
  if (options.chunk_bytes == 0 || options.chunk_bytes % kRangeHashSegment != 0) {
    return InvalidArgumentError("chunk size must be a positive multiple of 64 KiB");
  }
  std::vector<size_t> base_order, target_order;
  REFIT_ASSIGN_OR_RETURN(auto entries,
                         MatchTensors(base, target, &base_order, &target_order));

  struct Task {
    size_t tensor;
    uint64_t start;
    uint64_t count;
  };
  std::vector<Task> tasks;
  DiffReport report;
  report.tensors = entries.size();
  for (size_t t = 0; t < entries.size(); ++t) {
    const uint64_t n = entries[t].num_elements;
    const uint64_t per = std::min<uint64_t>(options.chunk_bytes / entries[t].width,
                                            kMaxChunkElements);
    report.total_elements += n;
    report.full_bytes += n * entries[t].width;
    if (n == 0) {
      entries[t].before = entries[t].after = RangeHash(nullptr, 0);
      continue;
    }
    for (uint64_t s = 0; s < n; s += per) {
      tasks.push_back(Task{t, s, std::min(per, n - s)});
    }
  }

  ChunkEncodeOptions copts;
  copts.allow_xor = options.allow_xor;
  copts.allow_conditional = options.allow_conditional;
  copts.codec.records_per_lane = options.records_per_lane;
  copts.codec.zstd_level = options.zstd_level;
  const int threads = options.threads > 0 ? options.threads : DefaultThreads();
  report.threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads),
                                                     std::max<size_t>(tasks.size(), 1)));

  std::vector<EncodeScratch> scratch(static_cast<size_t>(threads));

  // Digests of the tensor being assembled, in chunk order.
  std::vector<Hash128> before_digests, after_digests;
  size_t current_tensor = SIZE_MAX;
  bool tensor_changed = false;
  uint64_t done_bytes = 0;

  auto finish_tensor = [&] {
    if (current_tensor == SIZE_MAX) return;
    TensorEntry& e = entries[current_tensor];
    e.before = HashSegmentDigests(before_digests.data(), before_digests.size());
    e.after = HashSegmentDigests(after_digests.data(), after_digests.size());
    if (tensor_changed) ++report.changed_tensors;
    before_digests.clear();
    after_digests.clear();
    tensor_changed = false;
  };

  Status s = RunOrdered<ChunkResult>(
      tasks.size(), threads, static_cast<size_t>(threads) * 2,
      [&](size_t i, int worker) -> Result<ChunkResult> {
        const Task& task = tasks[i];
        const TensorEntry& e = entries[task.tensor];
        ChunkHeader ids;
        ids.version = options.version;
        ids.base_version = options.base_version;
        ids.tensor_id = task.tensor;
        ids.width = e.width;
        ChunkResult result;
        ChunkEncodeOptions range_opts = copts;
        const size_t b = base_order[task.tensor];
        // Chunk starts are whole segments (chunk_bytes is a multiple of
        // 64 KiB, as is kMaxChunkElements times any width).
        if (base_digests && b < base_digests->size() &&
            (*base_digests)[b].size() == SegmentCount(e.num_elements * e.width)) {
          range_opts.base_digests =
              (*base_digests)[b].data() + task.start * e.width / kRangeHashSegment;
        }
        Status st = EncodeChunkRange(
            ids, base[b].data, target[target_order[task.tensor]].data, task.start,
            task.count, range_opts, &scratch[static_cast<size_t>(worker)], &result);
        if (!st.ok()) return st.WithContext("tensor '" + e.name + "'");
        return result;
      },
      [&](size_t i, ChunkResult&& r) -> Status {
        const Task& task = tasks[i];
        if (task.tensor != current_tensor) {
          finish_tensor();
          current_tensor = task.tensor;
        }
        report.scan_seconds += r.scan_seconds;
        report.code_seconds += r.code_seconds;
        before_digests.insert(before_digests.end(), r.before_digests.begin(),
                              r.before_digests.end());
        after_digests.insert(after_digests.end(), r.after_digests.begin(),
                             r.after_digests.end());
        if (!r.chunk.empty()) {
          tensor_changed = true;
          ++report.chunks;
          report.changed_elements += r.header.changed;
          report.payload_bytes += r.payload_bytes;
          report.chunk_bytes += r.chunk.size();
          ++report.chunks_by_kind[ChunkKindName(r.header.kind)];
          const auto t_sink = std::chrono::steady_clock::now();
          REFIT_RETURN_IF_ERROR(sink->AddChunk(r.chunk, r.header));
          report.sink_seconds += std::chrono::duration<double>(
                                     std::chrono::steady_clock::now() - t_sink).count();
        }
        done_bytes += task.count * entries[task.tensor].width;
        if (options.progress) options.progress("diff", done_bytes, report.full_bytes);
        return Status();
      });
  REFIT_RETURN_IF_ERROR(s);
  finish_tensor();
  REFIT_RETURN_IF_ERROR(sink->Finish(entries));
  report.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace refit
