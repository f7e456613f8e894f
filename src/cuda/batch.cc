#include "cuda/batch.h"

#include <algorithm>
#include <cstring>

#include "base/bytes.h"
#include "base/hash.h"
#include "base/parallel.h"
#include "codec/payload.h"
#include "codec/rans.h"
#include "codec/sparse_plane.h"
#include "codec/table.h"
#include "delta/chunk.h"

namespace refit::cuda {
namespace {

using codec::ChunkKind;

uint64_t Align8(uint64_t x) { return (x + 7) & ~uint64_t{7}; }
uint64_t Align16(uint64_t x) { return (x + 15) & ~uint64_t{15}; }

// One chunk as placed on this GPU, before batching. Offsets are relative
// to the chunk's own bytes (sparse streams) or its decoded dense bytes.
struct Parsed {
  DevChunk dev{};
  std::vector<DevTable> tables;
  std::vector<uint32_t> lanes;  // offsets relative to the chunk start
  std::vector<DevDensePlane> planes;  // GPU dense planes (chunk-relative)
  std::vector<uint8_t> dense;   // CPU-decoded dense bytes
  uint64_t dense_bytes = 0;     // decoded dense bytes on the device
  uint64_t scratch = 0;
  uint32_t chunk_index = 0;
};

// Lane framing (docs/format.md §5.3) of the stream at `s`, which starts at
// `offset` from the chunk start: lane start offsets, then the stream end.
Status ParseLaneFraming(std::span<const uint8_t> s, uint64_t offset,
                        std::vector<uint32_t>* lanes) {
  ByteReader r(s);
  const uint32_t L = r.U8();
  if (!r.ok() || L == 0) return DataLossError("stream lane count missing or 0");
  std::vector<uint64_t> size(L, 0);
  for (uint32_t j = 0; j + 1 < L; ++j) size[j] = r.Varint();
  if (!r.ok()) return DataLossError("stream lane sizes truncated");
  uint64_t pos = offset + static_cast<uint64_t>(r.position() - s.data());
  uint64_t left = r.remaining();
  lanes->clear();
  for (uint32_t j = 0; j < L; ++j) {
    if (j + 1 == L) size[j] = left;
    if (size[j] < 4 || size[j] > left) {
      return DataLossError("lane " + std::to_string(j) +
                           " is below 4 bytes or past the stream end");
    }
    lanes->push_back(static_cast<uint32_t>(pos));
    pos += size[j];
    left -= size[j];
  }
  lanes->push_back(static_cast<uint32_t>(pos));
  return Status::Ok();
}

// Dense payload (docs/format.md §4.2): plane jobs for the GPU, or, when a
// plane is zstd (mode 3), the whole chunk decoded here with the codec.
// Checks what the codec's decoder checks before the symbols: modes, models,
// sizes, lane framing, no bytes after the last plane; the GPU checks the
// lanes' contents and ends. An entropy plane whose model is one symbol
// decodes no bytes: its lanes must be bare final states, as the codec
// requires, and it becomes a constant plane.
Status ParseDense(const ParsedChunk& c, uint64_t payload_offset, Parsed* out) {
  const ChunkHeader& h = c.header;
  const uint32_t n = static_cast<uint32_t>(h.count);
  const int w = h.width;
  std::span<const uint8_t> p = c.payload;
  ByteReader r(p);
  std::vector<DevDensePlane> planes;
  std::vector<DevTable> tables;
  std::vector<uint32_t> lanes;
  bool zstd = false;
  for (int j = 0; j < w && !zstd; ++j) {
    const uint8_t mode = r.U8();
    if (!r.ok()) return DataLossError("dense plane " + std::to_string(j) + " truncated");
    DevDensePlane d{};
    d.j = static_cast<uint8_t>(j);
    d.mode = mode;
    if (mode == kPlaneConstant) {
      d.src = r.U8();
      if (!r.ok()) return DataLossError("constant plane truncated");
    } else if (mode == kPlaneVerbatim) {
      d.src = static_cast<uint32_t>(payload_offset + (r.position() - p.data()));
      r.Bytes(n);
      if (!r.ok()) return DataLossError("verbatim plane truncated");
    } else if (mode == kPlaneEntropy) {
      codec::Model m;
      size_t used = 0;
      Status s = codec::ReadModel(std::span<const uint8_t>(r.position(), r.remaining()),
                                  codec::GapContext{}, &m, &used);
      if (!s.ok()) return s.WithContext("dense plane " + std::to_string(j));
      r.Bytes(used);
      const uint64_t size = r.Varint();
      if (!r.ok() || size > r.remaining()) {
        return DataLossError("entropy plane size truncated or past the payload end");
      }
      const uint64_t at = payload_offset + static_cast<uint64_t>(r.position() - p.data());
      std::span<const uint8_t> stream = r.Bytes(size);
      std::vector<uint32_t> offs;
      REFIT_RETURN_IF_ERROR(ParseLaneFraming(stream, at, &offs));
      const uint32_t L = static_cast<uint32_t>(offs.size() - 1);
      if (!m.coded()) {
        // No symbol is coded: every lane is its 4-byte final state.
        for (uint32_t l = 0; l < L; ++l) {
          const uint8_t* q = p.data() + (offs[l] - payload_offset);
          if (offs[l + 1] - offs[l] != 4 || LoadLE(q, 4) != uint64_t{1} << 16) {
            return DataLossError("lane " + std::to_string(l) +
                                 " of a one-symbol plane is not a bare final state");
          }
        }
        d.mode = kPlaneConstant;
        d.src = m.symbol;
      } else {
        DevTable t{};
        t.t = static_cast<uint32_t>(m.t);
        std::memcpy(t.f, m.f.data(), sizeof(t.f));
        d.table = static_cast<uint32_t>(tables.size());
        tables.push_back(t);
        d.lane_first = static_cast<uint32_t>(lanes.size());
        d.lanes = static_cast<uint8_t>(L);
        lanes.insert(lanes.end(), offs.begin(), offs.end());
      }
    } else if (mode == 3) {
      zstd = true;
      break;
    } else {
      return DataLossError("dense plane " + std::to_string(j) + " has mode " +
                           std::to_string(mode));
    }
    planes.push_back(d);
  }
  if (zstd) {
    out->dense.resize(uint64_t{n} * w);
    out->dense_bytes = out->dense.size();
    return codec::DecodeDense(p, n, w, out->dense.data());
  }
  if (r.remaining() != 0) {
    return DataLossError(std::to_string(r.remaining()) +
                         " bytes left after the last dense plane");
  }
  out->planes = std::move(planes);
  out->tables = std::move(tables);
  out->lanes = std::move(lanes);
  out->dense_bytes = uint64_t{n} * w;
  out->dev.dense_gpu = 1;
  return Status::Ok();
}

// Sparse payload header (docs/format.md §4.1) and lane framing (§5.3).
Status ParseSparse(const ParsedChunk& c, uint64_t payload_offset, Parsed* out) {
  const ChunkHeader& h = c.header;
  const uint32_t n = static_cast<uint32_t>(h.count);
  const uint32_t k = static_cast<uint32_t>(h.changed);
  const int w = h.width;
  std::span<const uint8_t> p = c.payload;
  if (p.empty()) return DataLossError("sparse payload is empty");
  const int gw = p[0];
  if (gw < 1 || gw > 4) return DataLossError("gap width outside 1..4");
  size_t off = 1;
  DevChunk& d = out->dev;
  d.gw = static_cast<uint8_t>(gw);
  uint32_t smem = 0;
  for (int j = 0; j < gw + w; ++j) {
    const codec::SparsePlane plane = codec::SparsePlaneAt(j, gw);
    codec::Model m;
    size_t used = 0;
    Status s = codec::ReadModel(p.subspan(off), codec::SparsePlaneContext(j, gw, n, k),
                                &m, &used);
    if (!s.ok()) return s.WithContext("plane " + std::to_string(j));
    off += used;
    if (!m.coded()) {
      uint64_t& fixed = plane.is_gap ? d.fixed_gap : d.fixed_value;
      fixed |= uint64_t{m.symbol} << (8 * plane.byte);
      continue;
    }
    DevTable t{};
    t.t = static_cast<uint32_t>(m.t);
    std::memcpy(t.f, m.f.data(), sizeof(t.f));
    out->tables.push_back(t);
    d.coded_shift[d.coded++] = static_cast<uint8_t>(plane.shift());
    smem += 1024 + (1u << std::min(m.t, kSlotTableBits));
  }
  d.smem = smem;
  // Lane framing; lane bytes must lie inside the payload.
  REFIT_RETURN_IF_ERROR(
      ParseLaneFraming(p.subspan(off), payload_offset + off, &out->lanes));
  const uint32_t L = static_cast<uint32_t>(out->lanes.size() - 1);
  d.lanes = static_cast<uint8_t>(L);
  return Status::Ok();
}

// Conditional XOR payload (kind 5, docs/format.md §4.3): the header, the
// models and the lane framing, checked as codec::DecodeConditional checks
// them before the symbols, except what needs the base's classes: a class's
// change count against its members and its geometric gap models, which
// the device builds once it has counted the members (conditional_apply.cu).
// The chunk becomes a sparse XOR chunk that the conditional kernels decode
// and apply (DevConditional).
Status ParseConditional(const ParsedChunk& c, uint64_t payload_offset, Parsed* out) {
  const ChunkHeader& h = c.header;
  const uint32_t k = static_cast<uint32_t>(h.changed);
  std::span<const uint8_t> p = c.payload;
  ByteReader r(p);
  DevConditional dc{};
  dc.lo = r.U8();
  uint64_t total = 0;
  for (int cl = 0; cl < kCondClasses; ++cl) {
    const uint64_t v = r.Varint();
    if (v > k) return DataLossError("class change count above the chunk's");
    dc.k[cl] = static_cast<uint32_t>(v);
    dc.first[cl] = static_cast<uint32_t>(total);
    total += v;
  }
  REFIT_RETURN_IF_ERROR(r.status("conditional header"));
  if (total != k) {
    return DataLossError("class change counts sum to " + std::to_string(total) +
                         ", the chunk says " + std::to_string(k));
  }
  for (DevConditionalPlane& pl : dc.plane) pl = DevConditionalPlane{kCondAbsent, 0, 0, 0};
  std::vector<DevTable> tables(1);  // slot 0: the DevConditional
  auto add = [&](const codec::Model& m, DevConditionalPlane* pl) {
    pl->mode = static_cast<uint8_t>(m.mode);
    pl->t = static_cast<uint8_t>(m.t);
    if (m.mode == codec::ModelMode::kConstant) pl->symbol = m.symbol;
    if (m.mode == codec::ModelMode::kTable) {
      DevTable t{};
      t.t = static_cast<uint32_t>(m.t);
      std::memcpy(t.f, m.f.data(), sizeof(t.f));
      pl->table = static_cast<uint8_t>(tables.size() - 1);
      tables.push_back(t);
    }
  };
  size_t off = static_cast<size_t>(r.position() - p.data());
  for (int cl = 0; cl < kCondClasses; ++cl) {
    if (dc.k[cl] == 0) continue;
    if (off >= p.size()) return DataLossError("conditional models truncated");
    const int gw = p[off++];
    if (gw < 1 || gw > 4) return DataLossError("gap width outside 1..4");
    dc.gw[cl] = static_cast<uint32_t>(gw);
    for (int b = 0; b < gw; ++b) {
      DevConditionalPlane& pl = dc.plane[4 * cl + b];
      if (off < p.size() && p[off] == static_cast<uint8_t>(codec::ModelMode::kGeometric)) {
        // Its frequencies follow from the class's members (section 5.2);
        // what does not depend on them is checked as ReadModel does.
        if (p.size() - off < 3) return DataLossError("geometric model truncated");
        const uint32_t t = p[off + 1], max_symbol = p[off + 2];
        if (t < 1 || t > static_cast<uint32_t>(codec::kMaxPrecision) ||
            max_symbol + 1 > (uint32_t{1} << t)) {
          return DataLossError("class " + std::to_string(cl) +
                               " gap plane: geometric model precision " + std::to_string(t) +
                               " invalid for max symbol " + std::to_string(max_symbol));
        }
        pl = DevConditionalPlane{kCondGeometric, static_cast<uint8_t>(max_symbol),
                                 static_cast<uint8_t>(t), 0};
        off += 3;
        continue;
      }
      codec::Model m;
      size_t used = 0;
      Status s = codec::ReadModel(p.subspan(off), codec::GapContext{}, &m, &used);
      if (!s.ok()) return s.WithContext("class " + std::to_string(cl) + " gap plane");
      off += used;
      add(m, &pl);
    }
  }
  for (int b = 0; b < 2; ++b) {
    codec::Model m;
    size_t used = 0;
    Status s = codec::ReadModel(p.subspan(off), codec::GapContext{}, &m, &used);
    if (!s.ok()) return s.WithContext("value plane");
    off += used;
    add(m, &dc.plane[4 * kCondClasses + b]);
  }
  if (tables.size() > 256) return DataLossError("conditional payload has too many tables");
  REFIT_RETURN_IF_ERROR(
      ParseLaneFraming(p.subspan(off), payload_offset + off, &out->lanes));
  std::memcpy(static_cast<void*>(&tables[0]), &dc, sizeof(dc));
  out->tables = std::move(tables);
  DevChunk& d = out->dev;
  d.lanes = static_cast<uint8_t>(out->lanes.size() - 1);
  d.layout = kDevSparse;
  d.conditional = 1;
  d.kind = static_cast<uint8_t>(ChunkKind::kSparseXor);
  out->scratch = CondScratchLayout(static_cast<uint32_t>(h.count), k).total;
  return Status::Ok();
}

// Parses chunk `index` (at `span` in buffer) and lays out each of its
// placements on this GPU into *out: none when the plan does not place its
// tensor here or no placement holds an element of its range.
Status ParsePlacements(std::span<const uint8_t> buffer, const ChunkSpan& span,
                       uint32_t index, std::span<const std::string> tensor_names,
                       const PlacementPlan& plan, bool verify, std::vector<Parsed>* out) {
  auto pc = ParseChunk(buffer.subspan(span.offset, span.size));
  if (!pc.ok()) return pc.status();
  if (pc->size != span.size) {
    return DataLossError("chunk size disagrees with its framing");
  }
  const ChunkHeader& h = pc->header;
  if (h.tensor_id >= tensor_names.size()) {
    return DataLossError("chunk names tensor " + std::to_string(h.tensor_id) +
                         " outside the tensor table");
  }
  // A strided region (a trainer rank's block of a matrix, docs/format.md
  // §3) is placed through its span, first to last element; its elements
  // are mapped one by one on the device.
  const uint64_t span_elems = RegionSpan(h.count, h.run, h.stride);
  for (uint32_t pi : plan.Find(tensor_names[h.tensor_id])) {
    const TensorPlacement& tp = plan.placements()[pi];
    if (tp.width != h.width || h.start + span_elems > tp.rows * tp.cols) {
      return FailedPreconditionError(
          "chunk of '" + tp.name + "' does not fit its placement (width or "
          "range); the plan does not match the delta");
    }
    if (!Intersects(tp, h.start, span_elems)) continue;
    Parsed p;
    p.chunk_index = index;
    DevChunk& d = p.dev;
    d.start = h.start;
    d.run = h.run;
    d.stride = h.IsStrided() ? h.stride : 0;
    d.n = static_cast<uint32_t>(h.count);
    d.k = static_cast<uint32_t>(h.changed);
    d.kind = static_cast<uint8_t>(h.kind);
    d.width = h.width;
    d.placement = pi;
    d.after_lo = h.after.lo;
    d.after_hi = h.after.hi;
    d.before_lo = h.before.lo;
    d.before_hi = h.before.hi;
    const uint64_t bytes = h.count * h.width;
    d.segments = static_cast<uint32_t>((bytes + kRangeHashSegment - 1) /
                                       kRangeHashSegment);
    const auto addr = ContiguousAddress(tp, h.start, span_elems);
    d.linear_address = addr ? *addr : 0;
    if (verify) {
      if (!addr) {
        return FailedPreconditionError(
            "chunk of '" + tp.name + "' is not stored contiguously on this "
            "GPU, so its range hash cannot be checked here; apply with "
            "verification off (and verify elsewhere)");
      }
      d.range_address = *addr;
    }
    const uint64_t w = h.width;
    Status st;
    if (h.IsConditional()) {
      // Every base element of the range is read on the device (its class
      // and, where changed, its old bits), through the linear address.
      if (!addr) {
        return UnimplementedError(
            "chunk " + std::to_string(index) + " of '" + tp.name +
            "' is conditional XOR (kind 5), which the GPU receiver decodes only where the "
            "chunk's span is stored contiguously on this GPU (its base elements are read "
            "there); nothing was written. Publish without conditional chunks (refit publish "
            "without --conditional, Publisher(conditional=False)), or receive on the CPU");
      }
      const uint64_t payload_offset =
          static_cast<uint64_t>(pc->payload.data() - buffer.data()) - span.offset;
      st = ParseConditional(*pc, payload_offset, &p);
    } else if (h.IsSparse()) {
      d.layout = kDevSparse;
      const uint64_t payload_offset =
          static_cast<uint64_t>(pc->payload.data() - buffer.data()) -
          span.offset;
      st = ParseSparse(*pc, payload_offset, &p);
      if (h.kind == ChunkKind::kSparseXor) {
        d.fused = 1;  // no staged records (decode_apply.cu, fused kernel)
      } else {
        p.scratch = Align16(4 * uint64_t{d.k}) + 2 * Align16(w * d.k);
      }
    } else {
      d.layout = kDevDense;
      const uint64_t payload_offset =
          static_cast<uint64_t>(pc->payload.data() - buffer.data()) -
          span.offset;
      st = ParseDense(*pc, payload_offset, &p);
      if (h.kind == ChunkKind::kRaw) p.scratch = Align8(bytes);
    }
    if (!st.ok()) return st.WithContext("chunk " + std::to_string(index));
    // Digests sit at the end of the chunk's scratch, 16-byte aligned.
    p.scratch = Align16(p.scratch);
    if (verify) p.scratch += 16 * uint64_t{d.segments};
    out->push_back(std::move(p));
  }
  return Status::Ok();
}

// A region of a tensor (DevChunk's start, n, run, stride; run 0:
// contiguous).
struct Region {
  uint64_t start, count, run, stride;
  uint64_t rows() const { return run == 0 ? 1 : count / run; }
  uint64_t row_len() const { return run == 0 ? count : run; }
  uint64_t step() const { return run == 0 ? 0 : stride; }
  uint64_t end() const { return start + (rows() - 1) * step() + row_len(); }
};

// Whether the elements [a, b) include one of r's.
bool IntervalHits(uint64_t a, uint64_t b, const Region& r) {
  if (b <= r.start || a >= r.end()) return false;
  if (r.run == 0 || a <= r.start) return true;
  // a lies in row `row`'s stride (row < rows, since a < end).
  const uint64_t o = a - r.start, row = o / r.stride;
  if (o % r.stride < r.run) return true;
  return row + 1 < r.rows() && b > r.start + (row + 1) * r.stride;
}

// Whether regions x and y share an element: each row of the one with fewer
// rows against the other.
bool RegionsOverlap(const Region& x, const Region& y) {
  if (x.end() <= y.start || y.end() <= x.start) return false;
  const Region& a = x.rows() <= y.rows() ? x : y;
  const Region& b = x.rows() <= y.rows() ? y : x;
  for (uint64_t i = 0; i < a.rows(); ++i) {
    const uint64_t first = a.start + i * a.step();
    if (IntervalHits(first, first + a.row_len(), b)) return true;
  }
  return false;
}

// A kind-5 chunk decodes against its range as it is when its batch runs;
// the batches of one apply run concurrently, in no set order, so another
// chunk of the same apply that writes one of its elements would race with
// that read. The chunks of one delta never share elements (each element
// changes once per version), so this refuses only chunks of several
// versions given to one apply: DeviceTarget applies a fold's versions one
// apply after another, each decoded against what the one before left.
Status CheckConditionalOverlaps(const std::vector<std::vector<Parsed>>& parsed,
                                const PlacementPlan& plan) {
  struct Entry {
    Region r;
    uint32_t chunk;
    bool conditional;
  };
  std::vector<std::vector<Entry>> by_placement(plan.placements().size());
  bool any = false;
  for (const std::vector<Parsed>& ps : parsed) {
    for (const Parsed& p : ps) {
      const DevChunk& d = p.dev;
      by_placement[d.placement].push_back(
          {Region{d.start, d.n, d.run, d.stride}, p.chunk_index, d.conditional != 0});
      any |= d.conditional != 0;
    }
  }
  if (!any) return Status::Ok();
  for (size_t pi = 0; pi < by_placement.size(); ++pi) {
    const std::vector<Entry>& es = by_placement[pi];
    for (const Entry& x : es) {
      if (!x.conditional) continue;
      for (const Entry& y : es) {
        if (&x == &y || !RegionsOverlap(x.r, y.r)) continue;
        return FailedPreconditionError(
            "chunk " + std::to_string(x.chunk) + " of '" + plan.placements()[pi].name +
            "' is conditional XOR (kind 5) and shares elements with chunk " +
            std::to_string(y.chunk) +
            " of the same apply; it decodes against its range's base, which that chunk "
            "writes while the apply runs. Apply each version on its own; nothing was written");
      }
    }
  }
  return Status::Ok();
}

// The staging limits when opts.staging_total is set (PrepareOptions): the
// slots (*slots_out) and the split of each slot between payload, scratch
// and metadata, from what the parsed chunks need.
BatchLimits SplitStaging(const PrepareOptions& opts, std::span<const ChunkSpan> chunks,
                         const std::vector<std::vector<Parsed>>& parsed,
                         uint32_t* slots_out) {
  BatchLimits limits = opts.limits;
  uint32_t slots = 2;
  // Payload P (chunk bytes and decoded dense bytes) and scratch S of the
  // whole delta; each of the `slots` slots gets total / slots, 1/16 of it
  // for metadata and the rest split so that payload slot / scratch slot
  // ~= P / S, each side keeping at least 1/16 so that a lone large chunk
  // still fits. Fewer slots (larger ones) when the largest chunk does not
  // fit.
  const uint64_t total = opts.staging_total;
  uint64_t need_p = 0, need_s = 0, max_p = 0, max_s = 0, max_m = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (const Parsed& q : parsed[i]) {
      const uint64_t pb = chunks[i].size + Align8(q.dense_bytes) + 8;
      need_p += pb;
      need_s += q.scratch;
      max_p = std::max(max_p, pb);
      max_s = std::max(max_s, q.scratch);
      max_m = std::max<uint64_t>(
          max_m, sizeof(DevChunk) + q.tables.size() * sizeof(DevTable) +
                     4 * q.lanes.size() +
                     q.planes.size() * sizeof(DevDensePlane) + 96);
    }
  }
  const long double share =
      need_p + need_s == 0
          ? 0.5L
          : static_cast<long double>(need_p) /
                static_cast<long double>(need_p + need_s);
  for (slots = static_cast<uint32_t>(std::max(2, opts.slots));; --slots) {
    const uint64_t per = total / slots - kSlotPadding;
    limits.meta_bytes = per / 16;
    const uint64_t avail = per - limits.meta_bytes;
    const uint64_t min_side = avail / 16;
    uint64_t slot =
        static_cast<uint64_t>(share * static_cast<long double>(avail));
    slot = std::clamp<uint64_t>(slot, min_side, avail - min_side);
    slot = std::min<uint64_t>(slot, (uint64_t{1} << 32) - 1);
    limits.payload_bytes = slot;
    limits.scratch_bytes = avail - slot;
    if (slots == 2 || (max_p <= limits.payload_bytes &&
                       max_s <= limits.scratch_bytes &&
                       max_m <= limits.meta_bytes)) {
      break;
    }
  }
  // Batches of about 1/slots of the payload, so that copies overlap.
  const uint64_t target =
      std::max({need_p / slots + 1, uint64_t{64} << 10, max_p});
  limits.payload_bytes = std::min(limits.payload_bytes, target);
  *slots_out = slots;
  return limits;
}

// Cuts the placed chunks, in order, into batches within the staging
// limits, into *out (batches, status indices, the largest needs).
class BatchCutter {
 public:
  BatchCutter(const BatchLimits& limits, bool verify, PreparedDelta* out)
      : limits_(limits), verify_(verify), out_(out) {}

  // Adds placement p of chunk `index`, which lies at `span`; closes the
  // open batch first when p does not fit it. kResourceExhausted when p
  // does not fit an empty batch.
  Status Add(size_t index, const ChunkSpan& span, const Parsed& p) {
    const uint64_t chunk_end = span.offset + span.size;
    const uint64_t extra_dense = Align8(p.dense_bytes);
    if (open_) {
      const uint64_t payload = chunk_end - cur_.payload_begin + 8 +
                               dense_bytes_ + extra_dense;
      const uint64_t meta = cur_.meta_bytes() + sizeof(DevChunk) +
                            p.tables.size() * sizeof(DevTable) +
                            4 * p.lanes.size() +
                            p.planes.size() * sizeof(DevDensePlane) + 48;
      if (payload > limits_.payload_bytes ||
          cur_.scratch_bytes + p.scratch > limits_.scratch_bytes ||
          meta > limits_.meta_bytes) {
        Close();
      }
    }
    if (!open_) {
      cur_.payload_begin = span.offset;
      open_ = true;
    }
    const uint64_t payload = chunk_end - cur_.payload_begin + 8 + extra_dense;
    if (payload > limits_.payload_bytes ||
        p.scratch > limits_.scratch_bytes) {
      return ResourceExhaustedError(
          "chunk " + std::to_string(index) + " needs " + std::to_string(payload) +
          " payload and " + std::to_string(p.scratch) +
          " scratch bytes, more than a staging slot holds");
    }
    cur_.payload_end = chunk_end;
    DevChunk d = p.dev;
    const uint64_t rel = span.offset - cur_.payload_begin;
    if (d.layout == kDevSparse) {
      d.lane_first = static_cast<uint32_t>(cur_.lanes.size());
      for (uint32_t lane : p.lanes) {
        cur_.lanes.push_back(static_cast<uint32_t>(rel + lane));
      }
      d.table_first = static_cast<uint32_t>(cur_.tables.size());
      cur_.tables.insert(cur_.tables.end(), p.tables.begin(), p.tables.end());
      d.records = cur_.scratch_bytes;
      d.values = d.records + Align16(4 * uint64_t{d.k});
      d.undo = d.values + Align16(uint64_t{d.width} * d.k);
      cur_.records += d.k;
      if (d.conditional) ++cur_.conditional;
    } else if (d.dense_gpu) {
      // Room in device staging only; shifted when the batch closes.
      d.data = cur_.gpu_dense_bytes;
      cur_.gpu_dense_bytes += extra_dense;
      dense_bytes_ += extra_dense;
      const uint32_t lane_base = static_cast<uint32_t>(cur_.lanes.size());
      for (uint32_t lane : p.lanes) {
        cur_.lanes.push_back(static_cast<uint32_t>(rel + lane));
      }
      const uint32_t table_base = static_cast<uint32_t>(cur_.tables.size());
      cur_.tables.insert(cur_.tables.end(), p.tables.begin(), p.tables.end());
      for (DevDensePlane q : p.planes) {
        q.chunk = static_cast<uint32_t>(cur_.chunks.size());
        if (q.mode == kPlaneEntropy) {
          q.table += table_base;
          q.lane_first += lane_base;
        } else if (q.mode == kPlaneVerbatim) {
          q.src += static_cast<uint32_t>(rel);
        }
        cur_.planes.push_back(q);
      }
      d.undo = cur_.scratch_bytes;
    } else {
      // CPU-decoded; shifted by dense_offset when the batch closes.
      const uint64_t cpu_bytes = cur_.dense.size();
      d.data = cpu_bytes;
      cur_.dense.insert(cur_.dense.end(), p.dense.begin(), p.dense.end());
      cur_.dense.resize(cpu_bytes + extra_dense);
      dense_bytes_ += extra_dense;
      d.undo = cur_.scratch_bytes;
    }
    const uint64_t digest_bytes = verify_ ? 16 * uint64_t{d.segments} : 0;
    d.seg_first = (cur_.scratch_bytes + p.scratch - digest_bytes) / 16;
    cur_.scratch_bytes += p.scratch;
    cur_.segments += d.segments;
    cur_.smem = std::max(cur_.smem, d.smem);
    if (d.fused) {
      cur_.max_fused_lanes = std::max<uint32_t>(cur_.max_fused_lanes, d.lanes);
    } else if (!d.conditional) {
      ++cur_.unfused;
    }
    if (d.run != 0) ++cur_.regions;
    d.status_index = out_->status_count++;
    out_->chunk_of_status.push_back(p.chunk_index);
    cur_.chunks.push_back(d);
    return Status::Ok();
  }

  // Closes the open batch, if any: its dense offsets, descriptors and
  // totals.
  void Close() {
    if (!open_) return;
    // Decoded dense bytes follow the chunk bytes on the device: first the
    // CPU-decoded ones (copied), then room for the GPU-decoded ones; fix
    // their offsets.
    cur_.dense_offset = Align8(cur_.payload_end - cur_.payload_begin);
    for (DevChunk& d : cur_.chunks) {
      if (d.layout != kDevDense) continue;
      d.data += cur_.dense_offset + (d.dense_gpu ? cur_.dense.size() : 0);
    }
    out_->payload_bytes += cur_.device_bytes();
    out_->largest_batch =
        std::max(out_->largest_batch,
                 cur_.dense_offset + cur_.dense.size() + cur_.gpu_dense_bytes);
    out_->largest_scratch = std::max(out_->largest_scratch, cur_.scratch_bytes);
    out_->largest_smem = std::max(out_->largest_smem, cur_.smem);
    out_->largest_meta = std::max(out_->largest_meta, cur_.meta_bytes());
    cur_.SerializeMeta(&cur_.meta);
    out_->batches.push_back(std::move(cur_));
    cur_ = HostBatch{};
    open_ = false;
    dense_bytes_ = 0;
  }

 private:
  const BatchLimits limits_;
  const bool verify_;
  PreparedDelta* const out_;
  HostBatch cur_;
  bool open_ = false;
  uint64_t dense_bytes_ = 0;  // CPU- and GPU-decoded dense bytes of cur_
};

}  // namespace

uint64_t HostBatch::meta_bytes() const {
  uint64_t t, l, d;
  MetaOffsets(&t, &l, &d);
  return d + planes.size() * sizeof(DevDensePlane);
}

void HostBatch::MetaOffsets(uint64_t* t, uint64_t* l, uint64_t* d) const {
  *t = Align16(chunks.size() * sizeof(DevChunk));
  *l = Align16(*t + tables.size() * sizeof(DevTable));
  if (d) *d = Align16(*l + 4 * lanes.size());
}

void HostBatch::SerializeMeta(std::vector<uint8_t>* out) const {
  uint64_t t, l, d;
  MetaOffsets(&t, &l, &d);
  out->assign(meta_bytes(), 0);
  // memcpy from an empty vector's data() (possibly null) is undefined.
  if (!chunks.empty()) {
    std::memcpy(out->data(), chunks.data(), chunks.size() * sizeof(DevChunk));
  }
  if (!tables.empty()) {
    std::memcpy(out->data() + t, tables.data(), tables.size() * sizeof(DevTable));
  }
  if (!lanes.empty()) {
    std::memcpy(out->data() + l, lanes.data(), lanes.size() * 4);
  }
  if (!planes.empty()) {
    std::memcpy(out->data() + d, planes.data(),
                planes.size() * sizeof(DevDensePlane));
  }
}

const char* ChunkStatusName(uint32_t status) {
  switch (status) {
    case kStatusOk: return "ok";
    case kStatusLaneShort: return "a rANS lane ran out of bytes";
    case kStatusLaneEnd: return "a rANS lane has leftover bytes or ends in a wrong state";
    case kStatusPosition: return "a decoded position lies past the chunk";
    case kStatusZeroXor: return "a sparse XOR value is zero";
    case kStatusAfterMismatch: return "the result does not hash to \"after\"; undone";
    case kStatusSkipped: return "skipped";
    case kStatusClassCount:
      return "a conditional XOR class has more changes than the base has members";
    default: return "unknown status";
  }
}

Result<PreparedDelta> PrepareBatches(std::span<const uint8_t> buffer,
                                     std::span<const ChunkSpan> chunks,
                                     std::span<const std::string> tensor_names,
                                     const PlacementPlan& plan,
                                     const PrepareOptions& opts) {
  if (opts.limits.payload_bytes >= (uint64_t{1} << 32)) {
    return InvalidArgumentError("staging payload slots must be below 4 GiB");
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!AddWithin(chunks[i].offset, chunks[i].size, buffer.size())) {
      return InvalidArgumentError("chunk " + std::to_string(i) +
                                  " lies outside the payload buffer");
    }
    if (i > 0 && chunks[i].offset < chunks[i - 1].offset + chunks[i - 1].size) {
      return InvalidArgumentError("chunks must be given in buffer order, "
                                  "without overlap");
    }
  }
  // Parse every chunk in parallel; one chunk may yield several placements.
  std::vector<std::vector<Parsed>> parsed(chunks.size());
  std::vector<Status> errors(chunks.size());
  ParallelForEach(chunks.size(), opts.threads, [&](size_t i, int) {
    errors[i] = ParsePlacements(buffer, chunks[i], static_cast<uint32_t>(i),
                                tensor_names, plan, opts.verify, &parsed[i]);
  });
  for (const Status& s : errors) REFIT_RETURN_IF_ERROR(s);
  REFIT_RETURN_IF_ERROR(CheckConditionalOverlaps(parsed, plan));

  BatchLimits limits = opts.limits;
  uint32_t slots = 2;
  if (opts.staging_total != 0) limits = SplitStaging(opts, chunks, parsed, &slots);

  PreparedDelta out;
  BatchCutter cutter(limits, opts.verify, &out);
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (parsed[i].empty()) {
      ++out.chunks_not_here;
      continue;
    }
    for (const Parsed& p : parsed[i]) {
      REFIT_RETURN_IF_ERROR(cutter.Add(i, chunks[i], p));
    }
  }
  cutter.Close();
  out.slots = slots;
  return out;
}

}  // namespace refit::cuda
