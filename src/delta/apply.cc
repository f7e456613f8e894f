#include "delta/apply.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "base/bytes.h"
#include "base/hash.h"
#include "base/parallel.h"
#include "codec/conditional.h"

namespace refit {
namespace {

using codec::ChunkKind;
constexpr uint64_t kPage = 4096;

// Counts distinct pages among ascending addresses as they are stored to,
// and remembers the first and last, so that a page two adjacent chunks
// share can be counted once over a whole apply.
struct PageCounter {
  uint64_t first = UINT64_MAX;
  uint64_t last = UINT64_MAX;
  uint64_t pages = 0;
  void Touch(const uint8_t* p) {
    uint64_t page = reinterpret_cast<uintptr_t>(p) / kPage;
    if (page != last) {
      ++pages;
      last = page;
      if (first == UINT64_MAX) first = page;
    }
  }
};

// Distinct pages of chunks over disjoint ascending ranges: only the first
// page of one chunk can be the last page of the chunk before it.
uint64_t DistinctPages(std::vector<PageCounter> chunks) {
  std::sort(chunks.begin(), chunks.end(),
            [](const PageCounter& a, const PageCounter& b) { return a.first < b.first; });
  uint64_t total = 0, prev_last = UINT64_MAX;
  for (const PageCounter& c : chunks) {
    if (c.pages == 0) continue;
    total += c.pages - (c.first == prev_last ? 1 : 0);
    prev_last = c.last;
  }
  return total;
}

}  // namespace

RangeState ClassifyRange(const ChunkHeader& h, const Hash128& range_hash) {
  if (range_hash == h.after) return RangeState::kAfter;
  if (range_hash == h.before) return RangeState::kBefore;
  return RangeState::kNeither;
}

namespace {

// Where the region's i-th element lives: contiguous ranges index directly,
// strided regions map through their rows.
struct RegionAddr {
  uint8_t* base;  // the region's first element
  uint64_t w, run, stride;
  RegionAddr(const ChunkHeader& h, uint8_t* tensor_data)
      : base(tensor_data + h.start * h.width), w(h.width), run(h.run), stride(h.stride) {}
  uint8_t* At(uint64_t i) const {
    return run == 0 ? base + i * w : base + ((i / run) * stride + i % run) * w;
  }
};

template <int W>
struct Elem;
template <>
struct Elem<1> { using T = uint8_t; };
template <>
struct Elem<2> { using T = uint16_t; };
template <>
struct Elem<4> { using T = uint32_t; };
template <>
struct Elem<8> { using T = uint64_t; };

// Element loads and stores of one width; byte order does not matter since
// values are only XORed, compared and copied.
template <int W>
inline typename Elem<W>::T Load(const uint8_t* p) {
  typename Elem<W>::T v;
  std::memcpy(&v, p, W);
  return v;
}
template <int W>
inline void Store(uint8_t* p, typename Elem<W>::T v) {
  std::memcpy(p, &v, W);
}

// XORs the sparse records into the region. Positions ascend, so a strided
// region walks its rows instead of dividing per record. kKeep: also writes
// each record's old element to keep[r * W], in the same pass.
template <int W, bool kCount, bool kKeep>
void XorSparse(const RegionAddr& at, const uint32_t* pos, const uint8_t* values,
               uint32_t k, PageCounter* pages, uint8_t* keep) {
  auto store = [&](uint8_t* p, uint32_t r) {
    const auto old = Load<W>(p);
    if constexpr (kKeep) Store<W>(keep + static_cast<size_t>(r) * W, old);
    Store<W>(p, old ^ Load<W>(values + static_cast<size_t>(r) * W));
    if constexpr (kCount) pages->Touch(p);
  };
  if (at.run == 0) {
    uint8_t* base = at.base;
    for (uint32_t r = 0; r < k; ++r) store(base + static_cast<size_t>(pos[r]) * W, r);
    return;
  }
  uint64_t row_first = 0;  // region index of the current row's first element
  uint8_t* row = at.base;
  for (uint32_t r = 0; r < k; ++r) {
    const uint64_t i = pos[r];
    if (i - row_first >= at.run) {
      row_first = i - i % at.run;
      row = at.base + (i / at.run) * at.stride * W;
    }
    store(row + (i - row_first) * W, r);
  }
}

template <int W, bool kKeep>
void XorSparseCounting(const RegionAddr& at, const uint32_t* pos, const uint8_t* values,
                       uint32_t k, PageCounter* pages, uint8_t* keep) {
  if (pages) {
    XorSparse<W, true, kKeep>(at, pos, values, k, pages, keep);
  } else {
    XorSparse<W, false, kKeep>(at, pos, values, k, pages, keep);
  }
}

// Stores the chunk's decoded records (in scratch) into the region. XOR
// kinds toggle bits, so calling this twice restores the region; overwrite
// kinds record what they replace in *undo. Only records [lo, hi) of a
// sparse kind, elements [lo, hi) of a dense one (clamped to the chunk), in
// order: calls over consecutive windows store the chunk as one call does.
template <int W>
void StoreRecordsW(const ChunkHeader& h, const RegionAddr& at, ApplyScratch* s,
                   PageCounter* pages, UndoRecord* undo, uint64_t lo = 0,
                   uint64_t hi = UINT64_MAX) {
  if (h.kind == ChunkKind::kSparseXor || h.kind == ChunkKind::kConditionalXor) {
    const uint32_t r0 = static_cast<uint32_t>(std::min(lo, h.changed));
    const uint32_t k = static_cast<uint32_t>(std::min(hi, h.changed)) - r0;
    const uint32_t* pos = s->positions.data() + r0;
    const uint8_t* values = s->values.data() + static_cast<size_t>(r0) * W;
    if (h.IsConditional() && undo != nullptr) {
      // Its records cannot be decoded again once the range is at "after"
      // (they are coded given the base): keep what they replace.
      const size_t u = undo->at.size();
      undo->at.insert(undo->at.end(), pos, pos + k);
      undo->old.resize((u + k) * W);
      XorSparseCounting<W, true>(at, pos, values, k, pages, undo->old.data() + u * W);
    } else {
      XorSparseCounting<W, false>(at, pos, values, k, pages, nullptr);
    }
    return;
  }
  if (h.kind == ChunkKind::kSparseOverwrite) {
    const uint32_t end = static_cast<uint32_t>(std::min(hi, h.changed));
    for (uint32_t r = static_cast<uint32_t>(std::min(lo, h.changed)); r < end;
         ++r) {
      uint8_t* p = at.At(s->positions[r]);
      undo->at.push_back(s->positions[r]);
      undo->old.insert(undo->old.end(), p, p + W);
      std::memcpy(p, s->values.data() + static_cast<size_t>(r) * W, W);
      if (pages) pages->Touch(p);
    }
    return;
  }
  const uint32_t n = static_cast<uint32_t>(std::min(hi, h.count));
  const uint8_t* d = s->dense.data();
  const bool xor_kind = h.kind == ChunkKind::kDenseXor;
  for (uint32_t i = static_cast<uint32_t>(std::min(lo, h.count)); i < n; ++i) {
    const auto v = Load<W>(d + static_cast<size_t>(i) * W);
    uint8_t* p = at.At(i);
    const auto old = Load<W>(p);
    if (xor_kind) {
      if (v == 0) continue;
      Store<W>(p, old ^ v);
    } else {
      if (old == v) continue;
      undo->at.push_back(i);
      undo->old.insert(undo->old.end(), p, p + W);
      Store<W>(p, v);
    }
    if (pages) pages->Touch(p);
  }
}

void StoreRecords(const ChunkHeader& h, const RegionAddr& at, ApplyScratch* s,
                  PageCounter* pages, UndoRecord* undo, uint64_t lo = 0,
                  uint64_t hi = UINT64_MAX) {
  switch (h.width) {
    case 1:
      return StoreRecordsW<1>(h, at, s, pages, undo, lo, hi);
    case 2:
      return StoreRecordsW<2>(h, at, s, pages, undo, lo, hi);
    case 4:
      return StoreRecordsW<4>(h, at, s, pages, undo, lo, hi);
    default:
      return StoreRecordsW<8>(h, at, s, pages, undo, lo, hi);
  }
}

// A contiguous range: stores each 64 KiB segment's records, then hashes the
// segment while it is still in cache, so the check against "after" does not
// read the range a second time. Writes one digest per segment.
void StoreAndDigest(const ChunkHeader& h, const RegionAddr& at, ApplyScratch* s,
                    PageCounter* pages, UndoRecord* undo, Hash128* digests) {
  const uint64_t w = h.width;
  const uint64_t per = kRangeHashSegment / w;  // elements per segment
  uint64_t r = 0;                              // a sparse chunk's next record
  for (uint64_t e = 0, seg = 0; e < h.count; e += per, ++seg) {
    const uint64_t end = std::min(h.count, e + per);
    if (h.HasRecords()) {
      uint64_t r_end = r;
      while (r_end < h.changed && s->positions[r_end] < end) ++r_end;
      StoreRecords(h, at, s, pages, undo, r, r_end);
      r = r_end;
    } else {
      StoreRecords(h, at, s, pages, undo, e, end);
    }
    digests[seg] = HashBytes(at.base + e * w, (end - e) * w);
  }
  // Decoding checked that positions ascend inside the range, so every
  // record was stored above; whatever remains is stored all the same, so an
  // undo (which stores or restores every record) always matches.
  if (h.HasRecords() && r < h.changed)
    StoreRecords(h, at, s, pages, undo, r, h.changed);
}

// tensor_data: the tensor, whose chunk region holds the base (read by
// conditional kinds only).
Status DecodeRecords(const ParsedChunk& chunk, const uint8_t* tensor_data,
                     ApplyScratch* s) {
  const ChunkHeader& h = chunk.header;
  const int w = h.width;
  const uint32_t n = static_cast<uint32_t>(h.count);
  const uint32_t k = static_cast<uint32_t>(h.changed);
  if (h.IsConditional()) {
    s->positions.resize(k);
    s->values.resize(static_cast<size_t>(k) * w);
    const uint8_t* base = tensor_data + h.start * h.width;
    if (h.IsStrided()) {
      // The decoder reads the region in order: gather its rows.
      s->dense.resize(h.count * static_cast<uint64_t>(w));
      const RegionAddr at(h, const_cast<uint8_t*>(tensor_data));
      const uint64_t row_bytes = h.run * static_cast<uint64_t>(w);
      for (uint64_t r = 0; r < h.count / h.run; ++r) {
        std::memcpy(s->dense.data() + r * row_bytes, at.At(r * h.run), row_bytes);
      }
      base = s->dense.data();
    }
    return codec::DecodeConditional(chunk.payload, n, base, k, s->positions.data(),
                                    s->values.data());
  }
  if (h.IsSparse()) {
    s->positions.resize(k);
    s->values.resize(static_cast<size_t>(k) * w);
    return codec::DecodeSparse(chunk.payload, h.kind, n, w, k,
                               s->positions.data(), s->values.data());
  }
  s->dense.resize(h.count * static_cast<uint64_t>(w));
  return codec::DecodeDense(chunk.payload, n, w, s->dense.data());
}

void Restore(const ChunkHeader& h, const RegionAddr& at, const UndoRecord& undo) {
  const size_t w = h.width;
  for (size_t j = 0; j < undo.at.size(); ++j) {
    std::memcpy(at.At(undo.at[j]), undo.old.data() + j * w, w);
  }
}

// Elements a decoded chunk may store to, in the order its pre-image lists
// them (apply_journal.h): the positions of a sparse chunk, every element of
// a dense one.
uint64_t PreImageElements(const ChunkHeader& h) {
  return h.HasRecords() ? h.changed : h.count;
}

template <typename Fn>
void ForEachPreImageElement(const ChunkHeader& h, const RegionAddr& at,
                            const ApplyScratch& s, Fn&& fn) {
  // Pre-images are written and restored through the same walk.
  const uint64_t n = PreImageElements(h);
  for (uint64_t i = 0; i < n; ++i) {
    fn(at.At(h.HasRecords() ? s.positions[i] : i), i * h.width);
  }
}

// A conditional chunk's pre-image starts with its k positions (u32 each):
// a torn range is neither base nor after, so its records could not be
// decoded again to find them (docs/format.md §9).
uint64_t PreImagePrefix(const ChunkHeader& h) {
  return h.IsConditional() ? 4 * h.changed : 0;
}

void GatherPreImage(const ChunkHeader& h, const RegionAddr& at,
                    const ApplyScratch& s, std::vector<uint8_t>* out) {
  const uint64_t prefix = PreImagePrefix(h);
  out->resize(prefix + PreImageElements(h) * h.width);
  for (uint64_t i = 0; i < prefix / 4; ++i) {
    for (int b = 0; b < 4; ++b) {
      (*out)[4 * i + b] = static_cast<uint8_t>(s.positions[i] >> (8 * b));
    }
  }
  ForEachPreImageElement(h, at, s, [&](const uint8_t* p, uint64_t off) {
    std::memcpy(out->data() + prefix + off, p, h.width);
  });
}

}  // namespace

namespace {

// ApplyChunkInPlace in two steps, StoreAndCheck also handing back the
// 64 KiB segment digests of a contiguous range after the apply (empty for
// strided regions): the check against "after" already hashed every
// segment, and ApplyDelta would otherwise hash the range a second time to
// refresh its tensor digests.
// The second half of applying a chunk whose records DecodeRecords left in
// *s: stores them, checks the range against "after" and undoes the stores
// if it does not match.
Status StoreAndCheck(const ChunkHeader& h, uint8_t* tensor_data, ApplyScratch* s,
                     PageCounter* pages_written, UndoRecord* undo,
                     std::vector<Hash128>* after_digests) {
  const RegionAddr at(h, tensor_data);
  PageCounter pages;
  s->undo.at.clear();
  s->undo.old.clear();
  Hash128 got;
  if (after_digests != nullptr && !h.IsStrided()) {
    const uint64_t bytes = h.count * h.width;
    after_digests->resize(SegmentCount(bytes));
    StoreAndDigest(h, at, s, &pages, &s->undo, after_digests->data());
    got = HashSegmentDigests(after_digests->data(), after_digests->size());
  } else {
    StoreRecords(h, at, s, &pages, &s->undo);
    if (after_digests != nullptr) after_digests->clear();
    got = RegionHash(h, tensor_data);
  }
  if (got == h.after) {
    if (pages_written) *pages_written = pages;
    if (undo) *undo = std::move(s->undo);  // cleared before its next use
    return Status();
  }
  if (h.IsXor()) {
    StoreRecords(h, at, s, nullptr, nullptr);
  } else {
    Restore(h, at, s->undo);
  }
  return DataLossError("chunk decoded but its result does not hash to the "
                       "chunk's \"after\" hash; the chunk is corrupt and was "
                       "not applied");
}

// Stores happen only after the payload decoded completely, so a corrupt
// payload is refused before the region is touched.
Status ApplyChunk(const ParsedChunk& chunk, uint8_t* tensor_data,
                  ApplyScratch* s, uint64_t* pages_written, UndoRecord* undo,
                  std::vector<Hash128>* after_digests) {
  REFIT_RETURN_IF_ERROR(DecodeRecords(chunk, tensor_data, s));
  PageCounter pages;
  REFIT_RETURN_IF_ERROR(StoreAndCheck(chunk.header, tensor_data, s, &pages, undo,
                                      after_digests));
  if (pages_written) *pages_written += pages.pages;
  return Status();
}

}  // namespace

Status ApplyChunkInPlace(const ParsedChunk& chunk, uint8_t* tensor_data,
                         ApplyScratch* s, uint64_t* pages_written,
                         UndoRecord* undo,
                         std::vector<Hash128>* after_digests) {
  return ApplyChunk(chunk, tensor_data, s, pages_written, undo, after_digests);
}

Status UndoChunkInPlace(const ParsedChunk& chunk, uint8_t* tensor_data,
                        ApplyScratch* s, const UndoRecord& undo) {
  const ChunkHeader& h = chunk.header;
  const RegionAddr at(h, tensor_data);
  if (!h.IsXor()) {
    Restore(h, at, undo);
    return Status();
  }
  if (h.IsConditional()) {
    // The range is at "after"; the records were coded given the base.
    if (undo.at.size() != h.changed || undo.old.size() != h.changed * h.width) {
      return FailedPreconditionError(
          "a conditional XOR chunk is undone from the old bytes its apply "
          "recorded, and none were given");
    }
    Restore(h, at, undo);
    return Status();
  }
  REFIT_RETURN_IF_ERROR(DecodeRecords(chunk, tensor_data, s));
  StoreRecords(h, at, s, nullptr, nullptr);
  return Status();
}

namespace {

struct Binding {
  const TensorEntry* entry;
  uint8_t* data;            // mutable (apply) or const-cast view (verify)
  size_t caller_index;      // index into the caller's list
  std::vector<Hash128> digests;
};

Result<std::vector<Binding>> Bind(const DeltaReader& delta,
                                  const std::vector<std::string>& names,
                                  const std::vector<std::string>& dtypes,
                                  const std::vector<int>& widths,
                                  const std::vector<std::vector<uint64_t>>& shapes,
                                  const std::vector<uint8_t*>& data) {
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!by_name.emplace(names[i], i).second) {
      return InvalidArgumentError("tensor '" + names[i] + "' given twice");
    }
  }
  std::vector<Binding> out;
  out.reserve(delta.tensors().size());
  for (const TensorEntry& e : delta.tensors()) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      return FailedPreconditionError(
          "the checkpoint has no tensor '" + e.name +
          "' that the delta describes; it is not the delta's base");
    }
    size_t i = it->second;
    if (dtypes[i] != e.dtype || widths[i] != e.width || shapes[i] != e.shape) {
      return FailedPreconditionError("tensor '" + e.name +
                                     "' has a different dtype or shape than "
                                     "in the delta; it is not the delta's base");
    }
    if (e.num_elements > 0 && data[i] == nullptr) {
      return InvalidArgumentError("tensor '" + e.name + "' has no data");
    }
    out.push_back(Binding{&e, data[i], i, {}});
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return FailedPreconditionError("the checkpoint has tensor '" +
                                   by_name.begin()->first +
                                   "' that the delta does not describe; it is "
                                   "not the delta's base");
  }
  return out;
}

template <typename View>
Result<std::vector<Binding>> BindViews(const DeltaReader& delta,
                                       const std::vector<View>& views) {
  std::vector<std::string> names, dtypes;
  std::vector<int> widths;
  std::vector<std::vector<uint64_t>> shapes;
  std::vector<uint8_t*> data;
  for (const View& v : views) {
    names.push_back(v.name);
    dtypes.push_back(v.dtype);
    widths.push_back(v.width);
    shapes.push_back(v.shape);
    data.push_back(const_cast<uint8_t*>(v.data));
  }
  return Bind(delta, names, dtypes, widths, shapes, data);
}

// Fills every binding's segment digests, in parallel over tensors.
void HashAll(std::vector<Binding>* bindings, int threads, const ProgressFn& progress,
             const char* stage) {
  uint64_t total = 0;
  for (Binding& b : *bindings) {
    uint64_t bytes = b.entry->num_elements * b.entry->width;
    b.digests.resize(SegmentCount(bytes));
    total += bytes;
  }
  // Segments are the unit of work so one huge tensor still spreads over
  // all threads.
  struct Seg {
    size_t binding;
    uint64_t index;
  };
  std::vector<Seg> segs;
  for (size_t i = 0; i < bindings->size(); ++i) {
    for (uint64_t j = 0; j < (*bindings)[i].digests.size(); ++j) segs.push_back({i, j});
  }
  std::atomic<uint64_t> done{0};
  std::mutex progress_mu;
  ParallelForEach(segs.size(), threads, [&](size_t i, int worker) {
    Binding& b = (*bindings)[segs[i].binding];
    uint64_t bytes = b.entry->num_elements * b.entry->width;
    uint64_t off = segs[i].index * kRangeHashSegment;
    uint64_t len = std::min<uint64_t>(kRangeHashSegment, bytes - std::min(bytes, off));
    b.digests[segs[i].index] = HashBytes(b.data + off, len);
    uint64_t d = done.fetch_add(len) + len;
    if (progress && worker == 0 && (i % 256 == 0)) {
      std::lock_guard<std::mutex> lock(progress_mu);
      progress(stage, d, total);
    }
  });
  if (progress) progress(stage, total, total);
}

}  // namespace

Result<ApplyReport> ApplyDelta(const DeltaReader& delta,
                               const std::vector<MutableTensorView>& tensors,
                               const ApplyOptions& options,
                               const SyncRangeFn& sync, ApplyJournal* journal) {
  auto t0 = std::chrono::steady_clock::now();
  REFIT_ASSIGN_OR_RETURN(auto bindings, BindViews(delta, tensors));
  ApplyReport report;
  report.chunks = delta.index().size();
  for (const Binding& b : bindings) {
    report.checkpoint_bytes += b.entry->num_elements * b.entry->width;
  }

  // Phase 1: check every chunk's framing and checksum (even those that
  // will turn out to be applied already: a damaged delta is an error
  // whatever the checkpoint holds), then every tensor's hash, all before
  // writing anything. A tensor must be exactly the base or exactly the
  // target: chunk range hashes alone would miss a difference outside the
  // chunks' ranges, found only after the writes. An interrupted apply
  // leaves no tensor in between: its journal restores the base first.
  for (size_t c = 0; c < delta.index().size(); ++c) {
    REFIT_RETURN_IF_ERROR(delta.ReadChunk(c).status());
  }
  HashAll(&bindings, options.threads, options.progress, "check");
  std::vector<bool> tensor_at_after(bindings.size(), false);
  for (size_t t = 0; t < bindings.size(); ++t) {
    const Binding& b = bindings[t];
    Hash128 h = HashSegmentDigests(b.digests.data(), b.digests.size());
    tensor_at_after[t] = h == b.entry->after;
    if (!tensor_at_after[t] && h != b.entry->before) {
      return FailedPreconditionError(
          "tensor '" + b.entry->name +
          "' hashes to neither the delta's base nor its target; this "
          "checkpoint is not the delta's base (check with `refit verify`); "
          "nothing was written");
    }
  }

  // Phase 2: apply, in parallel over chunks.
  std::vector<size_t> todo;
  for (size_t c = 0; c < delta.index().size(); ++c) {
    if (!tensor_at_after[delta.index()[c].tensor_id]) todo.push_back(c);
  }
  report.chunks_applied = todo.size();
  report.chunks_skipped = report.chunks - todo.size();
  int threads = options.threads > 0 ? options.threads : DefaultThreads();
  std::vector<PageCounter> pages(todo.size());
  std::vector<uint64_t> changed(static_cast<size_t>(threads), 0);
  // Per applied chunk: whether it was stored, and how to undo it, so a
  // failure anywhere rolls every chunk back and leaves the base intact.
  std::vector<char> applied(todo.size(), 0);
  std::vector<UndoRecord> undo(todo.size());
  std::mutex err_mu;
  Status first_error;
  std::atomic<bool> failed{false};
  std::atomic<bool> cancelled{false};
  std::atomic<uint64_t> done_bytes{0};
  std::atomic<uint64_t> done_chunks{0};
  uint64_t todo_bytes = 0;
  for (size_t c : todo) {
    todo_bytes += delta.index()[c].count * bindings[delta.index()[c].tensor_id].entry->width;
  }
  if (journal != nullptr && !todo.empty()) REFIT_RETURN_IF_ERROR(journal->Start());
  std::vector<std::vector<Hash128>> after_digests(static_cast<size_t>(threads));
  auto fail = [&](const Status& st, size_t c) {
    std::lock_guard<std::mutex> lock(err_mu);
    if (first_error.ok()) {
      first_error = st.WithContext(
          "tensor '" + bindings[delta.index()[c].tensor_id].entry->name +
          "' chunk " + std::to_string(c));
    }
    failed.store(true);
  };
  // Chunks go in batches: every chunk of a batch is decoded and its
  // pre-image journaled, the journal is synced once, then the batch is
  // stored. One fdatasync per batch instead of per chunk keeps the
  // journal's cost small while no store can reach the disk before its
  // pre-image does. A batch holds at most kBatchChunks chunks and about
  // kBatchBytes of decoded records and pre-images.
  auto stop = [&] {
    if (!failed.load() && options.cancel != nullptr && options.cancel->load()) {
      cancelled.store(true);
      failed.store(true);
    }
    return failed.load();
  };
  constexpr size_t kBatchChunks = 256;
  constexpr uint64_t kBatchBytes = uint64_t{64} << 20;
  std::vector<ApplyScratch> slots;  // a batch's decoded records, by position
  std::vector<ChunkHeader> headers;  // and their chunks' headers
  WorkerPool pool(static_cast<int>(std::min<size_t>(static_cast<size_t>(threads),
                                                    std::max<size_t>(todo.size(), 1))));
  for (size_t first = 0; first < todo.size() && !failed.load();) {
    size_t end = first;
    uint64_t batch_bytes = 0;
    while (end < todo.size() && end - first < kBatchChunks &&
           (end == first || batch_bytes < kBatchBytes)) {
      const IndexEntry& e = delta.index()[todo[end]];
      const uint64_t w = bindings[e.tensor_id].entry->width;
      // Sparse records decode to ~(4 + w) bytes per changed element, a few
      // times the payload; dense ones to the range, journaled whole.
      const bool dense = e.kind == ChunkKind::kDenseXor || e.kind == ChunkKind::kRaw;
      batch_bytes += dense ? 2 * e.count * w : 8 * e.size;
      ++end;
    }
    if (slots.size() < end - first) {
      slots.resize(end - first);
      headers.resize(end - first);
    }
    pool.ForEach(end - first, [&](size_t i, int) {
      if (stop()) return;
      const size_t c = todo[first + i];
      ApplyScratch* slot = &slots[i];
      auto chunk = delta.ReadChunk(c);
      Status st = chunk.status();
      if (st.ok()) {
        headers[i] = chunk->header;
        st = DecodeRecords(*chunk, bindings[delta.index()[c].tensor_id].data, slot);
      }
      if (st.ok() && journal != nullptr) {
        const RegionAddr at(chunk->header, bindings[delta.index()[c].tensor_id].data);
        GatherPreImage(chunk->header, at, *slot, &slot->pre_image);
        st = journal->Record(c, slot->pre_image);
      }
      if (!st.ok()) fail(st, c);
    });
    if (failed.load()) break;
    if (journal != nullptr && options.sync) {
      if (Status st = journal->Sync(); !st.ok()) {
        fail(st, todo[first]);
        break;
      }
    }
    pool.ForEach(end - first, [&](size_t i, int worker) {
      // A cancel stops here too: the batch's chunks not yet stored were
      // journaled, and restoring their pre-images rewrites the same bytes.
      if (stop()) return;
      const size_t j = first + i;
      const size_t c = todo[j];
      Binding& b = bindings[delta.index()[c].tensor_id];
      const IndexEntry& e = delta.index()[c];
      std::vector<Hash128>& digests = after_digests[static_cast<size_t>(worker)];
      Status st = StoreAndCheck(headers[i], b.data, &slots[i], &pages[j], &undo[j],
                                &digests);
      if (!st.ok()) return fail(st, c);
      applied[j] = 1;
      done_chunks.fetch_add(1);
      changed[static_cast<size_t>(worker)] += headers[i].changed;
      // Refresh this range's digests for the final tensor check; chunks own
      // disjoint segments (chunk ranges are segment-aligned).
      const uint64_t w = b.entry->width;
      const uint64_t off = e.start * w;
      if (!digests.empty() && off % kRangeHashSegment == 0) {
        std::copy(digests.begin(), digests.end(),
                  b.digests.begin() + static_cast<ptrdiff_t>(off / kRangeHashSegment));
      } else {
        SegmentDigests(b.data + off, e.count * w,
                       b.digests.data() + off / kRangeHashSegment);
      }
      uint64_t d = done_bytes.fetch_add(e.count * w) + e.count * w;
      if (options.progress && worker == 0) options.progress("apply", d, todo_bytes);
    });
    first = end;
  }
  for (int t = 0; t < threads; ++t) {
    report.changed_elements += changed[static_cast<size_t>(t)];
  }
  report.pages_written = DistinctPages(std::move(pages));
  auto roll_back = [&](Status why) {
    std::vector<ApplyScratch> scratch(static_cast<size_t>(pool.threads()));
    pool.ForEach(todo.size(), [&](size_t j, int worker) {
      if (!applied[j]) return;
      auto chunk = delta.ReadChunk(todo[j]);
      if (!chunk.ok()) return;  // read fine moments ago; the map is read-only
      Binding& b = bindings[delta.index()[todo[j]].tensor_id];
      (void)UndoChunkInPlace(*chunk, b.data, &scratch[static_cast<size_t>(worker)],
                             undo[j]);
    });
    return why.WithContext("rolled back; the checkpoint is unchanged");
  };
  if (cancelled.load() && first_error.ok()) {
    const std::string progress = "interrupted after " +
                                 std::to_string(done_chunks.load()) + " of " +
                                 std::to_string(todo.size()) + " chunks";
    if (journal == nullptr) return roll_back(CancelledError(progress));
    // The journal holds every stored chunk's pre-image: the next run
    // restores them, or a rollback does.
    return CancelledError(progress + "; the journal records the chunks applied");
  }
  if (!first_error.ok()) return roll_back(first_error);

  // Phase 3: every tensor must now be exactly the target.
  for (const Binding& b : bindings) {
    if (HashSegmentDigests(b.digests.data(), b.digests.size()) != b.entry->after) {
      return roll_back(DataLossError(
          "after apply, tensor '" + b.entry->name +
          "' does not hash to the delta's target; was the checkpoint "
          "modified concurrently?"));
    }
  }
  if (options.sync && sync) {
    std::vector<bool> synced(tensors.size(), false);
    for (size_t c : todo) {
      size_t ci = bindings[delta.index()[c].tensor_id].caller_index;
      if (!synced[ci]) {
        synced[ci] = true;
        REFIT_RETURN_IF_ERROR(sync(ci));
      }
    }
  }
  report.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - t0).count();
  return report;
}

Result<uint64_t> RestorePreImages(const DeltaReader& delta,
                                  const std::vector<MutableTensorView>& tensors,
                                  const ApplyJournalState& journal, int threads) {
  REFIT_ASSIGN_OR_RETURN(auto bindings, BindViews(delta, tensors));
  std::vector<std::pair<size_t, std::span<const uint8_t>>> items;
  for (const auto& [c, pre] : journal.pre_images) {
    if (c >= delta.index().size()) {
      return DataLossError("the apply journal names chunk " + std::to_string(c) +
                           ", which the delta does not have");
    }
    items.emplace_back(static_cast<size_t>(c), pre);
  }
  std::vector<ApplyScratch> scratch(static_cast<size_t>(threads > 0 ? threads : DefaultThreads()));
  std::mutex err_mu;
  Status first_error;
  ParallelForEach(items.size(), static_cast<int>(scratch.size()), [&](size_t i, int worker) {
    // Not a structured binding: clang before 16 cannot capture one below.
    const size_t c = items[i].first;
    const std::span<const uint8_t> pre = items[i].second;
    auto chunk = delta.ReadChunk(c);
    Status st = chunk.status();
    ApplyScratch* s = &scratch[static_cast<size_t>(worker)];
    if (st.ok() && chunk->header.IsConditional()) {
      // The positions come from the pre-image (checked: ascending, inside
      // the range), not from decoding the torn range.
      const ChunkHeader& h = chunk->header;
      if (pre.size() != PreImagePrefix(h) + h.changed * h.width) {
        st = DataLossError("the apply journal's pre-image of chunk " + std::to_string(c) +
                           " has the wrong size");
      } else {
        s->positions.resize(h.changed);
        for (uint64_t r = 0; r < h.changed && st.ok(); ++r) {
          s->positions[r] = static_cast<uint32_t>(LoadLE(pre.data() + 4 * r, 4));
          if (s->positions[r] >= h.count || (r > 0 && s->positions[r] <= s->positions[r - 1])) {
            st = DataLossError("the apply journal's pre-image of chunk " + std::to_string(c) +
                               " names positions out of order or outside its range");
          }
        }
      }
    } else if (st.ok()) {
      st = DecodeRecords(*chunk, nullptr, s);
      if (st.ok() && pre.size() != PreImageElements(chunk->header) * chunk->header.width) {
        st = DataLossError("the apply journal's pre-image of chunk " + std::to_string(c) +
                           " has the wrong size");
      }
    }
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(err_mu);
      if (first_error.ok()) first_error = st;
      return;
    }
    const ChunkHeader& h = chunk->header;
    const RegionAddr at(h, bindings[h.tensor_id].data);
    const uint64_t prefix = PreImagePrefix(h);
    ForEachPreImageElement(h, at, *s, [&](uint8_t* p, uint64_t off) {
      std::memcpy(p, pre.data() + prefix + off, h.width);
    });
  });
  REFIT_RETURN_IF_ERROR(first_error);
  return static_cast<uint64_t>(items.size());
}

Result<VerifyReport> VerifyTensors(const DeltaReader& delta,
                                   const std::vector<TensorView>& tensors,
                                   int threads) {
  VerifyReport report;
  auto bound = BindViews(delta, tensors);
  if (!bound.ok()) {
    if (bound.status().code() == StatusCode::kFailedPrecondition) {
      report.mismatched.push_back(std::string(bound.status().message()));
      return report;
    }
    return bound.status();
  }
  auto bindings = std::move(bound).value();
  HashAll(&bindings, threads, nullptr, "verify");
  report.tensors = bindings.size();
  report.matches_target = true;
  report.matches_base = true;
  for (const Binding& b : bindings) {
    Hash128 h = HashSegmentDigests(b.digests.data(), b.digests.size());
    if (h != b.entry->after) {
      report.matches_target = false;
      report.mismatched.push_back(b.entry->name);
    }
    if (h != b.entry->before) report.matches_base = false;
  }
  return report;
}

}  // namespace refit
