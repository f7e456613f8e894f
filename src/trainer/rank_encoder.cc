#include "trainer/rank_encoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "base/bytes.h"
#include "base/parallel.h"
#include "base/pipeline.h"
#include "delta/apply.h"
#include "trainer/convert.h"

namespace refit::trainer {
namespace {

using layout::CanonicalTensor;
using layout::Piece;

// One owned piece, walked in canonical order: `outer` canonical rows of
// `inner` contiguous elements, `stride` apart from canonical element
// `start`. Region element (o, i) is piece element (r, c) = (o, i), or
// (i, o) for transposed storage. A packed FP4 tensor (pack 2) counts
// outer/inner/start/stride in bytes, two logical elements each, and its
// piece in logical elements: byte i of a row holds logical elements 2i and
// 2i + 1, LocalIndex(o, 2i) and LocalIndex(o, 2i + 1).
struct Region {
  uint32_t local = 0;   // index into the rank's local tensors
  uint32_t canon = 0;   // index into the sorted canonical tensors
  Piece piece;
  bool transposed = false;
  uint64_t outer = 0, inner = 0, start = 0, stride = 0;
  int width = 0;             // canonical element width
  bool direct = false;       // local dtype is the checkpoint's
  bool in_place = false;     // direct, and the local block is in canonical order
  uint64_t pack = 1;         // logical elements per canonical element
  uint64_t packed = 0;       // layout::PackedBlock of the canonical tensor
  uint64_t base_offset = 0;  // bytes into the baseline

  uint64_t LocalIndex(uint64_t o, uint64_t i) const {
    const uint64_t r = transposed ? i : o;
    const uint64_t c = transposed ? o : i;
    return piece.local_offset + r * piece.local_row_stride + c * piece.local_col_stride;
  }
};

// A chunk's worth of one region: rows [o0, o0 + rows) whole, or the part
// [i0, i0 + n) of row o0 (rows == 1). scale_of >= 0: elements
// [first, first + count) of the owned scales of canonical tensor
// `scale_of` instead, which lie in its scale tensor at start/run/stride;
// with `global`, the one F32 element of its nvfp4 global scale tensor.
struct Job {
  uint32_t region = 0;
  uint64_t o0 = 0, rows = 0, i0 = 0, n = 0;
  int64_t scale_of = -1;
  bool global = false;
  uint64_t first = 0;
  uint64_t start = 0, run = 0, stride = 0;  // scale jobs' region
  uint64_t base_offset = 0;  // bytes into the baseline
  uint64_t count = 0;        // elements
};

// The scales of one quantized canonical tensor that this rank owns:
// per_tensor is one block covering the whole tensor. The tensor is viewed
// as `rows` x `cols` (its first dimension by the rest; logical elements for
// a packed FP4 tensor, whose blocks are 1 x 32 or 1 x 16 along its logical
// rows); block (bi, bj) covers rows [bi*br, ...) and columns [bj*bc, ...),
// and its scale is element bi * nbc + bj of the scale tensor.
struct ScaleState {
  uint32_t canon = 0;            // the quantized tensor
  uint32_t scale_canon = 0;      // its scale tensor
  bool per_tensor = true;
  uint64_t packed = 0;           // layout::PackedBlock of the tensor
  int width = 4;                 // scale element bytes: F32, or 1 when packed
  uint64_t rows = 1, cols = 1, br = 1, bc = 1, nbc = 1;
  std::vector<uint64_t> blocks;  // owned scale-tensor indices, ascending
  std::map<uint64_t, uint32_t> slot;  // scale index -> position in blocks
  std::vector<float> current;    // FP8: per owned block, computed by Encode
  std::vector<uint8_t> codes;    // packed: per owned block, computed by Encode
  // A per_tensor scale or nvfp4 global scale is the amax of the whole
  // tensor. `split`: this rank owns `owned` of its elements, not all, and
  // takes that amax from the caller (GlobalAmax); then only the owner of
  // the tensor's element 0 emits that scale (`emits_whole_scale`).
  bool nvfp4 = false;
  bool split = false;
  bool emits_whole_scale = true;
  uint64_t owned = 0;
  // Whether this rank holds and emits the scale-tensor elements of its
  // blocks: a split per-tensor scale is another owner's to emit.
  bool EmitsBlockScales() const { return !per_tensor || emits_whole_scale; }
  // nvfp4: the global scale tensor, when this rank emits it, and its value,
  // computed by Encode; global_canon < 0 otherwise.
  int64_t global_canon = -1;
  float global = 1.0f;
  uint64_t global_offset = 0;    // its bytes in the baseline
  uint64_t base_offset = 0;      // the owned scales' bytes in the baseline

  uint64_t BlockOf(uint64_t canonical_index) const {
    if (per_tensor) return 0;
    const uint64_t r = canonical_index / cols, c = canonical_index % cols;
    return (r / br) * nbc + c / bc;
  }
  uint64_t BlockElements(uint64_t b) const {
    if (per_tensor) return rows * cols;
    const uint64_t bi = b / nbc, bj = b % nbc;
    return (std::min(rows, (bi + 1) * br) - bi * br) * (std::min(cols, (bj + 1) * bc) - bj * bc);
  }
};

struct Encoded {
  std::vector<uint8_t> chunk;
  ChunkHeader header;
  uint64_t changed = 0;
};

// Converts region `r` of packed FP4 tensor `ct`, in logical elements, to
// bytes (Region, pack 2). Each row segment must be whole `block`-element
// scale blocks: the rank quantizes and packs them alone.
Status PackRegion(const CanonicalTensor& ct, uint32_t rank, uint64_t block, Region* r) {
  auto split = [&](uint64_t logical) {
    return InvalidArgumentError(
        "canonical tensor '" + ct.name + "' (" + ct.scale_kind + "): rank " +
        std::to_string(rank) + " owns part of the " + std::to_string(block) +
        "-element scale block " + std::to_string(logical / block) + " (logical element " +
        std::to_string(logical) + "); a scale is the amax of its block and a byte holds "
        "two elements, so one rank must own the whole block (splits must fall on block "
        "boundaries)");
  };
  if (r->start % block != 0) return split(r->start);
  if (r->inner % block != 0) return split(r->start + r->inner - 1);
  if (r->outer > 1 && r->stride % block != 0) return split(r->start + r->stride);
  r->pack = 2;
  r->packed = block;
  r->start /= 2;
  r->inner /= 2;
  r->stride /= 2;
  return Status();
}

}  // namespace

struct RankEncoder::Impl {
  RankEncoderOptions opt;
  uint32_t rank = 0;
  std::vector<CanonicalTensor> canonical;       // sorted by name
  std::vector<layout::LocalTensor> local;       // this rank's, layout order
  std::vector<Region> regions;
  std::vector<Job> jobs;
  std::map<uint32_t, ScaleState> scales;        // by quantized canonical index
  std::vector<uint8_t> baseline;
  uint64_t owned_bytes = 0;
  // The last Encode's chunks, kept until Commit or Abort.
  std::vector<std::pair<uint32_t, std::vector<uint8_t>>> pending;  // job, chunk
  bool have_baseline = false;

  const CanonicalTensor& Canon(const Region& r) const { return canonical[r.canon]; }
  // A scale job's canonical tensor and element width.
  uint32_t ScaleTensor(const Job& j) const {
    const ScaleState& s = scales.at(static_cast<uint32_t>(j.scale_of));
    return j.global ? static_cast<uint32_t>(s.global_canon) : s.scale_canon;
  }
  int ScaleWidth(const Job& j) const {
    return j.global ? 4 : scales.at(static_cast<uint32_t>(j.scale_of)).width;
  }
  Status CheckLocal(const std::vector<TensorView>& views,
                    std::vector<const uint8_t*>* data) const;
  // The whole-tensor amax of split tensor s from `amax`, checked against
  // `local_amax`, the amax of the rank's own elements.
  Result<float> WholeAmax(const ScaleState& s, const GlobalAmax& amax, float local_amax) const;
  // ComputeScales for every quantized tensor the rank owns.
  Status ComputeAllScales(const std::vector<const uint8_t*>& data, const GlobalAmax& amax);
  // Writes the job's current canonical bytes into out (count * width).
  void Gather(const Job& job, const std::vector<const uint8_t*>& data, uint8_t* out) const;
  // The current scale of every owned block of s (amax / 448; 1 where the
  // block is all zeros, so its elements encode as zeros), or of a packed
  // tensor the scale codes its quantizer writes.
  Status ComputeScales(ScaleState* s, const std::vector<const uint8_t*>& data,
                       const GlobalAmax& amax) const;
  Status ComputePackedScales(ScaleState* s, const std::vector<const uint8_t*>& data,
                             const GlobalAmax& amax) const;
  // Quantizes bytes [i0, i0 + n) of row o of packed region r: writes n
  // bytes to `packed` and their blocks' scale codes to `codes`.
  Status QuantizePacked(const Region& r, uint64_t o, uint64_t i0, uint64_t n,
                        const std::vector<const uint8_t*>& data, uint8_t* packed,
                        std::vector<float>* x, std::vector<uint8_t>* codes) const;
  // The logical elements of those bytes, as FP32.
  void LoadPacked(const Region& r, uint64_t o, uint64_t i0, uint64_t n,
                  const std::vector<const uint8_t*>& data, std::vector<float>* x) const;
};

RankEncoder::RankEncoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RankEncoder::~RankEncoder() = default;

const std::vector<layout::CanonicalTensor>& RankEncoder::canonical_tensors() const {
  return impl_->canonical;
}
uint64_t RankEncoder::owned_bytes() const { return impl_->owned_bytes; }
const std::vector<layout::LocalTensor>& RankEncoder::local_tensors() const {
  return impl_->local;
}

std::vector<RankJob> RankEncoder::jobs() const {
  const Impl& m = *impl_;
  std::vector<RankJob> out;
  out.reserve(m.jobs.size());
  for (const Job& j : m.jobs) {
    RankJob rj;
    rj.count = j.count;
    rj.base_offset = j.base_offset;
    if (j.scale_of >= 0) {
      rj.tensor_id = m.ScaleTensor(j);
      rj.start = j.start;
      rj.run = j.run;
      rj.stride = j.stride;
      rj.width = m.ScaleWidth(j);
    } else {
      const Region& r = m.regions[j.region];
      rj.in_place = r.in_place;
      rj.local = r.local;
      rj.local_element = r.LocalIndex(j.o0, j.i0);
      rj.tensor_id = r.canon;
      rj.start = r.start + j.o0 * r.stride + j.i0;
      if (j.rows > 1) {
        rj.run = r.inner;
        rj.stride = r.stride;
      }
      rj.width = r.width;
    }
    // Canonical form (EncodeRegionChunk): one row, or rows without gaps, is
    // a contiguous range.
    if (!(rj.run != 0 && rj.run < rj.count && rj.stride > rj.run)) rj.run = rj.stride = 0;
    out.push_back(rj);
  }
  return out;
}

Result<std::unique_ptr<RankEncoder>> RankEncoder::Create(const layout::Layout& layout,
                                                         uint32_t rank,
                                                         RankEncoderOptions options) {
  REFIT_ASSIGN_OR_RETURN(layout::Ownership owned, layout::AssignOwnership(layout));
  size_t rank_index = layout.ranks.size();
  for (size_t i = 0; i < layout.ranks.size(); ++i) {
    if (layout.ranks[i].rank == rank) rank_index = i;
  }
  if (rank_index == layout.ranks.size()) {
    return InvalidArgumentError("the layout has no rank " + std::to_string(rank));
  }
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->rank = rank;
  impl->canonical = layout.canonical;
  std::sort(impl->canonical.begin(), impl->canonical.end(),
            [](const CanonicalTensor& a, const CanonicalTensor& b) { return a.name < b.name; });
  std::map<std::string, uint32_t> canon_index;
  for (size_t i = 0; i < impl->canonical.size(); ++i) {
    canon_index[impl->canonical[i].name] = static_cast<uint32_t>(i);
  }
  impl->local = layout.ranks[rank_index].tensors;

  uint64_t offset = 0;
  std::map<uint32_t, uint64_t> owned_elements_of;  // per quantized canonical tensor
  for (const layout::OwnedPiece& op : owned[rank_index]) {
    const Piece& p = op.piece;
    if (p.rows == 0 || p.cols == 0) continue;
    Region r;
    r.local = op.tensor;
    r.canon = canon_index.at(p.canonical);
    r.piece = p;
    const CanonicalTensor& ct = impl->canonical[r.canon];
    const layout::LocalTensor& lt = impl->local[op.tensor];
    REFIT_ASSIGN_OR_RETURN(r.width, DTypeRegistry().ElementWidth(ct.dtype));
    const uint64_t packed = layout::PackedBlock(ct);
    const std::string what =
        "rank " + std::to_string(rank) + " local tensor '" + lt.name + "' -> '" + ct.name + "'";
    if (packed && !IsConvertibleSource(lt.dtype)) {
      return InvalidArgumentError(what + ": " + ct.scale_kind + " is quantized from F32 or "
                                  "BF16, not from local dtype " + lt.dtype);
    }
    if (!packed) REFIT_RETURN_IF_ERROR(CheckConversion(lt.dtype, ct.dtype).WithContext(what));
    r.direct = lt.dtype == ct.dtype && packed == 0;
    if (ct.dtype == "F8_E4M3" && !r.direct && ct.scale_kind.empty()) {
      return InvalidArgumentError("canonical tensor '" + ct.name +
                                  "' is F8_E4M3 converted from " + lt.dtype +
                                  " but has no scale (per_tensor or per_block)");
    }
    // Canonical order: rows of the piece, unless canonical rows run along
    // the piece's columns (transposed storage).
    r.transposed = p.rows > 1 && p.canon_row_stride == 1 && p.cols > 1;
    if (p.rows > 1 && p.cols == 1 && p.canon_row_stride == 1) {
      // A column of the piece that is contiguous in canonical order.
      r.transposed = true;
    }
    r.outer = r.transposed ? p.cols : p.rows;
    r.inner = r.transposed ? p.rows : p.cols;
    r.stride = r.transposed ? p.canon_col_stride : p.canon_row_stride;
    r.start = p.canon_offset;
    if (r.outer == 1) r.stride = r.inner;
    r.in_place = r.direct && !r.transposed &&
                 (p.cols == 1 || p.local_col_stride == 1) &&
                 (p.rows == 1 || p.local_row_stride == p.cols * p.local_col_stride);
    if (packed) {
      REFIT_RETURN_IF_ERROR(PackRegion(ct, rank, packed, &r));
    }
    r.base_offset = offset;
    offset += r.outer * r.inner * static_cast<uint64_t>(r.width);
    if (!ct.scale_kind.empty() && !r.direct) owned_elements_of[r.canon] += r.outer * r.inner;
    impl->regions.push_back(r);
  }
  // Scales: the rank must own every element of each scale block it
  // touches (the scale is the block's amax), and then owns the block's
  // scale-tensor element; but a per-tensor scale or an nvfp4 global scale
  // may be split, its amax given by the caller, its element emitted by the
  // owner of the tensor's element 0.
  for (const auto& [ci, n] : owned_elements_of) {
    (void)n;
    const CanonicalTensor& ct = impl->canonical[ci];
    auto it = canon_index.find(ct.scale);
    if (it == canon_index.end()) {
      return InvalidArgumentError("canonical tensor '" + ct.name + "' names scale tensor '" +
                                  ct.scale + "', which the layout does not list");
    }
    const CanonicalTensor& st = impl->canonical[it->second];
    ScaleState s;
    s.canon = ci;
    s.scale_canon = it->second;
    s.per_tensor = ct.scale_kind == "per_tensor";
    s.packed = layout::PackedBlock(ct);
    s.rows = ct.shape.empty() ? 1 : ct.shape[0];
    s.cols = 1;
    for (size_t d = 1; d < ct.shape.size(); ++d) s.cols *= ct.shape[d];
    if (ct.shape.size() == 1) {
      s.cols = s.rows;
      s.rows = 1;
    }
    uint64_t want = 1;
    if (s.packed) {
      // Validated by the layout: U8 codes, logical rows of whole blocks.
      const std::vector<uint64_t> logical = layout::LogicalShape(ct);
      s.cols = logical.back();
      s.rows = 1;
      for (size_t d = 0; d + 1 < logical.size(); ++d) s.rows *= logical[d];
      s.br = 1;
      s.bc = s.packed;
      s.nbc = s.cols / s.bc;
      s.width = 1;
    } else if (!s.per_tensor) {
      if (ct.block_rows == 0 || ct.block_cols == 0) {
        return InvalidArgumentError("canonical tensor '" + ct.name + "' has per_block scales "
                                    "without a block size");
      }
      s.br = ct.block_rows;
      s.bc = ct.block_cols;
      s.nbc = (s.cols + s.bc - 1) / s.bc;
      want = ((s.rows + s.br - 1) / s.br) * s.nbc;
    }
    uint64_t st_elements = 1;
    for (uint64_t d : st.shape) st_elements *= d;
    // A packed tensor's scale dtype and size are the layout's rules.
    if (!s.packed && (st.dtype != "F32" || st_elements != want)) {
      return InvalidArgumentError("scale tensor '" + st.name + "' must be " +
                                  std::to_string(want) + " F32 element(s)");
    }
    // Owned elements per block, a canonical row segment at a time.
    std::map<uint64_t, uint64_t> per_block;
    for (const Region& r : impl->regions) {
      if (r.canon != ci) continue;
      for (uint64_t o = 0; o < r.outer; ++o) {
        uint64_t a = (r.start + o * r.stride) * r.pack;
        const uint64_t end = a + r.inner * r.pack;
        while (a < end) {
          // The segment up to the end of this block's columns (and row).
          const uint64_t col = a % s.cols;
          uint64_t stop = std::min(end, a - col + s.cols);
          if (!s.per_tensor) stop = std::min(stop, a - col + std::min(s.cols, (col / s.bc + 1) * s.bc));
          per_block[s.BlockOf(a)] += stop - a;
          a = stop;
        }
      }
    }
    // A per-tensor scale may be split (its amax comes from the caller);
    // a per-block or packed block may not.
    for (const auto& [b, count] : per_block) {
      if (count != s.BlockElements(b) && !s.per_tensor) {
        return InvalidArgumentError(
            "canonical tensor '" + ct.name + "': rank " + std::to_string(rank) + " owns " +
            std::to_string(count) + " of the " + std::to_string(s.BlockElements(b)) +
            " elements behind the elements of its per-block scale " + std::to_string(b) +
            "; a scale is the amax of its block, so one rank must own the whole block "
            "(per-block splits must fall on block boundaries)");
      }
      s.owned += count;
      s.slot[b] = static_cast<uint32_t>(s.blocks.size());
      s.blocks.push_back(b);
    }
    s.nvfp4 = !layout::GlobalScaleName(ct).empty();
    if (s.per_tensor || s.nvfp4) {
      s.split = s.owned != s.rows * s.cols;
      s.emits_whole_scale = !s.split;
      for (const Region& r : impl->regions) s.emits_whole_scale |= r.canon == ci && r.start == 0;
    }
    if (s.packed) {
      s.codes.assign(s.blocks.size(), 0);
    } else {
      s.current.assign(s.blocks.size(), 1.0f);
    }
    s.base_offset = offset;
    if (s.EmitsBlockScales()) offset += static_cast<uint64_t>(s.width) * s.blocks.size();
    if (s.nvfp4 && s.emits_whole_scale) {
      s.global_canon = canon_index.at(layout::GlobalScaleName(ct));
      s.global_offset = offset;
      offset += 4;
    }
    impl->scales[ci] = std::move(s);
  }
  impl->owned_bytes = offset;
  if (!options.plan_only) impl->baseline.assign(offset, 0);

  // Jobs, in canonical order: (tensor, start) of each region.
  std::vector<uint32_t> order(impl->regions.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const Region& x = impl->regions[a];
    const Region& y = impl->regions[b];
    return std::tie(x.canon, x.start) < std::tie(y.canon, y.start);
  });
  const uint64_t limit = std::max<uint64_t>(options.chunk_bytes, 1);
  // A tensor's owned scales as scale-tensor regions: one strided region
  // when they form a rectangle of blocks (the usual case), else one
  // contiguous run per block row.
  auto add_scale_job = [&](uint32_t canon) {
    auto it = impl->scales.find(canon);
    if (it == impl->scales.end()) return;
    const ScaleState& s = it->second;
    std::vector<std::pair<uint64_t, uint64_t>> runs;  // (first scale index, length)
    for (uint64_t b : s.blocks) {
      if (!s.EmitsBlockScales()) break;
      if (!runs.empty() && runs.back().first + runs.back().second == b &&
          b % s.nbc != 0) {
        ++runs.back().second;
      } else {
        runs.push_back({b, 1});
      }
    }
    bool rectangle = runs.size() > 1;
    for (size_t k = 1; k < runs.size() && rectangle; ++k) {
      rectangle = runs[k].second == runs[0].second && runs[k].first == runs[k - 1].first + s.nbc;
    }
    uint64_t first = 0;
    auto push = [&](uint64_t start, uint64_t count, uint64_t run, uint64_t stride) {
      Job j;
      j.scale_of = canon;
      j.first = first;
      j.count = count;
      j.start = start;
      j.run = run;
      j.stride = stride;
      j.base_offset = s.base_offset + static_cast<uint64_t>(s.width) * first;
      first += count;
      impl->jobs.push_back(j);
    };
    // At most chunk_bytes of scales a chunk (an MXFP4 tensor has one per
    // 16 bytes): whole block rows of the rectangle, else parts of runs.
    const uint64_t most = std::max<uint64_t>(1, limit / static_cast<uint64_t>(s.width));
    if (rectangle && runs[0].second <= most) {
      const uint64_t len = runs[0].second, per = std::max<uint64_t>(1, most / len);
      for (size_t k = 0; k < runs.size(); k += per) {
        const uint64_t rows = std::min<uint64_t>(per, runs.size() - k);
        if (rows == 1) {
          push(runs[k].first, len, 0, 0);
        } else {
          push(runs[k].first, rows * len, len, s.nbc);
        }
      }
    } else {
      for (const auto& [b, n] : runs) {
        for (uint64_t i = 0; i < n; i += most) push(b + i, std::min(most, n - i), 0, 0);
      }
    }
    if (s.global_canon >= 0) {
      Job j;
      j.scale_of = canon;
      j.global = true;
      j.count = 1;
      j.base_offset = s.global_offset;
      impl->jobs.push_back(j);
    }
  };
  for (size_t k = 0; k < order.size(); ++k) {
    const Region& r = impl->regions[order[k]];
    const uint64_t row_bytes = r.inner * static_cast<uint64_t>(r.width);
    uint64_t max_elems = std::min<uint64_t>(
        kMaxChunkElements, std::max<uint64_t>(limit / static_cast<uint64_t>(r.width), 1));
    if (r.packed) {
      // A part of a row holds whole scale blocks (packed / 2 bytes each).
      const uint64_t block_bytes = r.packed / 2;
      max_elems = std::max(block_bytes, max_elems / block_bytes * block_bytes);
    }
    if (row_bytes <= limit && r.inner <= max_elems) {
      const uint64_t rows_per = std::max<uint64_t>(1, std::min(limit / row_bytes, max_elems / r.inner));
      for (uint64_t o = 0; o < r.outer; o += rows_per) {
        Job j;
        j.region = order[k];
        j.o0 = o;
        j.rows = std::min(rows_per, r.outer - o);
        j.n = r.inner;
        j.count = j.rows * r.inner;
        j.base_offset = r.base_offset + o * row_bytes;
        impl->jobs.push_back(j);
      }
    } else {
      for (uint64_t o = 0; o < r.outer; ++o) {
        for (uint64_t i = 0; i < r.inner; i += max_elems) {
          Job j;
          j.region = order[k];
          j.o0 = o;
          j.rows = 1;
          j.i0 = i;
          j.n = std::min(max_elems, r.inner - i);
          j.count = j.n;
          j.base_offset = r.base_offset + o * row_bytes + i * static_cast<uint64_t>(r.width);
          impl->jobs.push_back(j);
        }
      }
    }
    // The scale chunk follows the last region of its tensor.
    if (k + 1 == order.size() || impl->regions[order[k + 1]].canon != r.canon) {
      add_scale_job(r.canon);
    }
  }
  // Scale tensors sort by name among the others: the receivers' tensor
  // table decides ids, not the emit order, so order within the version is
  // free; keep it deterministic (as above).
  return std::unique_ptr<RankEncoder>(new RankEncoder(std::move(impl)));
}

Status RankEncoder::Impl::CheckLocal(const std::vector<TensorView>& views,
                                     std::vector<const uint8_t*>* data) const {
  std::map<std::string, const TensorView*> by_name;
  for (const TensorView& v : views) by_name[v.name] = &v;
  data->assign(local.size(), nullptr);
  std::vector<bool> needed(local.size(), false);
  for (const Region& r : regions) needed[r.local] = true;
  for (size_t i = 0; i < local.size(); ++i) {
    if (!needed[i]) continue;
    const layout::LocalTensor& lt = local[i];
    auto it = by_name.find(lt.name);
    if (it == by_name.end()) {
      return InvalidArgumentError("rank " + std::to_string(rank) + " has no local tensor '" +
                                  lt.name + "' that the layout names");
    }
    const TensorView& v = *it->second;
    if (v.dtype != lt.dtype || v.shape != lt.shape) {
      return InvalidArgumentError("local tensor '" + lt.name +
                                  "' has a different dtype or shape than the layout says");
    }
    if (v.data == nullptr) return InvalidArgumentError("local tensor '" + lt.name + "' has no data");
    (*data)[i] = v.data;
  }
  return Status();
}

Result<std::vector<const uint8_t*>> RankEncoder::LocalData(
    const std::vector<TensorView>& local) const {
  std::vector<const uint8_t*> data;
  REFIT_RETURN_IF_ERROR(impl_->CheckLocal(local, &data));
  return data;
}

Status RankEncoder::Impl::QuantizePacked(const Region& r, uint64_t o, uint64_t i0, uint64_t n,
                                          const std::vector<const uint8_t*>& data,
                                          uint8_t* packed, std::vector<float>* x,
                                          std::vector<uint8_t>* codes) const {
  LoadPacked(r, o, i0, n, data, x);
  codes->resize(2 * n / r.packed);
  const std::span<uint8_t> out(packed, n);
  Status st = r.packed == kMxfp4Block
                  ? QuantizeMxfp4Row(*x, out, *codes)
                  : QuantizeNvfp4Row(*x, scales.at(r.canon).global, out, *codes);
  return st.WithContext("canonical tensor '" + canonical[r.canon].name + "'");
}

void RankEncoder::Impl::LoadPacked(const Region& r, uint64_t o, uint64_t i0, uint64_t n,
                                   const std::vector<const uint8_t*>& data,
                                   std::vector<float>* x) const {
  const std::string& dt = local[r.local].dtype;
  x->resize(2 * n);
  for (uint64_t i = 0; i < 2 * n; ++i) {
    (*x)[i] = LoadAsF32(dt, data[r.local], r.LocalIndex(o, 2 * i0 + i));
  }
}

Result<float> RankEncoder::Impl::WholeAmax(const ScaleState& s, const GlobalAmax& amax,
                                           float local_amax) const {
  const CanonicalTensor& ct = canonical[s.canon];
  const std::string scale =
      s.nvfp4 ? "global scale '" + layout::GlobalScaleName(ct) + "'"
              : "per-tensor scale '" + ct.scale + "'";
  auto it = amax.find(ct.name);
  if (it == amax.end()) {
    return InvalidArgumentError(
        "canonical tensor '" + ct.name + "' is split across ranks (rank " +
        std::to_string(rank) + " owns " + std::to_string(s.owned) + " of its " +
        std::to_string(s.rows * s.cols) + " elements) and its " + scale +
        " is the amax of the whole tensor: the caller must pass the tensor's global amax "
        "(e.g. an all-reduce MAX of every owner's local amax)");
  }
  const float whole = it->second;
  if (std::isnan(whole) || whole < 0 || whole < local_amax) {
    return InvalidArgumentError(
        "the global amax " + std::to_string(whole) + " given for canonical tensor '" + ct.name +
        "' is not the amax of the whole tensor: rank " + std::to_string(rank) +
        "'s own elements reach " + std::to_string(local_amax));
  }
  return whole;
}

Status RankEncoder::Impl::ComputeAllScales(const std::vector<const uint8_t*>& data,
                                            const GlobalAmax& amax) {
  for (auto& [ci, s] : scales) REFIT_RETURN_IF_ERROR(ComputeScales(&s, data, amax));
  return Status();
}

Status RankEncoder::Impl::ComputePackedScales(ScaleState* s,
                                               const std::vector<const uint8_t*>& data,
                                               const GlobalAmax& given) const {
  std::vector<float> x;
  std::vector<uint8_t> bytes, codes;
  if (s->nvfp4) {
    // NaN and infinity are refused below, block by block.
    float amax = 0;
    for (const Region& r : regions) {
      if (r.canon != s->canon) continue;
      for (uint64_t o = 0; o < r.outer; ++o) {
        LoadPacked(r, o, 0, r.inner, data, &x);
        for (float v : x) amax = std::max(amax, std::fabs(v));
      }
    }
    if (s->split) {
      REFIT_ASSIGN_OR_RETURN(amax, WholeAmax(*s, given, amax));
    }
    s->global = Nvfp4GlobalScale(amax);
  }
  for (const Region& r : regions) {
    if (r.canon != s->canon) continue;
    bytes.resize(r.inner);
    for (uint64_t o = 0; o < r.outer; ++o) {
      REFIT_RETURN_IF_ERROR(QuantizePacked(r, o, 0, r.inner, data, bytes.data(), &x, &codes));
      const uint64_t first = (r.start + o * r.stride) * 2 / s->packed;
      for (size_t k = 0; k < codes.size(); ++k) s->codes[s->slot.at(first + k)] = codes[k];
    }
  }
  return Status();
}

Status RankEncoder::Impl::ComputeScales(ScaleState* s,
                                         const std::vector<const uint8_t*>& data,
                                         const GlobalAmax& given) const {
  if (s->packed) return ComputePackedScales(s, data, given);
  std::vector<float> amax(s->blocks.size(), 0.0f);
  for (const Region& r : regions) {
    if (r.canon != s->canon) continue;
    const std::string& dt = local[r.local].dtype;
    for (uint64_t o = 0; o < r.outer; ++o) {
      const uint64_t row_start = r.start + o * r.stride;
      for (uint64_t i = 0; i < r.inner; ++i) {
        float x = std::fabs(LoadAsF32(dt, data[r.local], r.LocalIndex(o, i)));
        if (std::isnan(x)) {
          return InvalidArgumentError("canonical tensor '" + canonical[s->canon].name +
                                      "' has a NaN; its FP8 scale is undefined");
        }
        float& m = amax[s->slot.at(s->BlockOf(row_start + i))];
        m = std::max(m, x);
      }
    }
  }
  // Every owner scales by the same amax, so their elements agree with the
  // scale that one of them emits.
  if (s->split) {
    REFIT_ASSIGN_OR_RETURN(amax[0], WholeAmax(*s, given, amax[0]));
  }
  for (size_t b = 0; b < amax.size(); ++b) {
    s->current[b] = amax[b] > 0 ? amax[b] / 448.0f : 1.0f;
  }
  return Status();
}

void RankEncoder::Impl::Gather(const Job& job, const std::vector<const uint8_t*>& data,
                               uint8_t* out) const {
  if (job.scale_of >= 0) {
    const ScaleState& sc = scales.at(static_cast<uint32_t>(job.scale_of));
    if (job.global) {
      std::memcpy(out, &sc.global, 4);
    } else if (sc.packed) {
      std::memcpy(out, sc.codes.data() + job.first, job.count);
    } else {
      std::memcpy(out, sc.current.data() + job.first, job.count * 4);
    }
    return;
  }
  const Region& r = regions[job.region];
  const layout::LocalTensor& lt = local[r.local];
  const uint8_t* src = data[r.local];
  const uint64_t w = static_cast<uint64_t>(r.width);
  const CanonicalTensor& ct = canonical[r.canon];
  if (r.packed) {
    std::vector<float> x;
    std::vector<uint8_t> codes;
    for (uint64_t o = job.o0; o < job.o0 + job.rows; ++o) {
      // Cannot fail: ComputeScales quantized every owned block already.
      (void)QuantizePacked(r, o, job.i0, job.n, data, out + (o - job.o0) * job.n, &x, &codes);
    }
    return;
  }
  const ScaleState* sc = nullptr;
  if (!r.direct && ct.dtype == "F8_E4M3") sc = &scales.at(r.canon);
  uint8_t* p = out;
  for (uint64_t o = job.o0; o < job.o0 + job.rows; ++o) {
    const uint64_t row_start = r.start + o * r.stride;
    for (uint64_t i = job.i0; i < job.i0 + job.n; ++i, p += w) {
      const uint64_t li = r.LocalIndex(o, i);
      if (r.direct) {
        std::memcpy(p, src + li * w, w);
      } else if (ct.dtype == "BF16") {
        StoreLE(p, Bf16FromF32(LoadAsF32(lt.dtype, src, li)), 2);
      } else {
        const float scale = sc->current[sc->slot.at(sc->BlockOf(row_start + i))];
        *p = E4m3FromF32(LoadAsF32(lt.dtype, src, li) / scale);
      }
    }
  }
}

Status RankEncoder::SetBaseline(const std::vector<TensorView>& canonical) {
  Impl& m = *impl_;
  if (m.opt.plan_only) return FailedPreconditionError("a plan-only rank encoder has no baseline");
  std::map<std::string, const TensorView*> by_name;
  for (const TensorView& v : canonical) by_name[v.name] = &v;
  auto find = [&](const CanonicalTensor& ct) -> Result<const TensorView*> {
    auto it = by_name.find(ct.name);
    if (it == by_name.end()) {
      return InvalidArgumentError("the canonical baseline has no tensor '" + ct.name + "'");
    }
    if (it->second->dtype != ct.dtype || it->second->shape != ct.shape) {
      return InvalidArgumentError("canonical tensor '" + ct.name +
                                  "' has a different dtype or shape than the layout says");
    }
    return it->second;
  };
  for (const Region& r : m.regions) {
    REFIT_ASSIGN_OR_RETURN(const TensorView* v, find(m.Canon(r)));
    const uint64_t w = static_cast<uint64_t>(r.width);
    uint8_t* out = m.baseline.data() + r.base_offset;
    for (uint64_t o = 0; o < r.outer; ++o) {
      std::memcpy(out + o * r.inner * w, v->data + (r.start + o * r.stride) * w, r.inner * w);
    }
  }
  for (auto& [ci, s] : m.scales) {
    REFIT_ASSIGN_OR_RETURN(const TensorView* v, find(m.canonical[s.scale_canon]));
    for (size_t b = 0; b < s.blocks.size() && s.EmitsBlockScales(); ++b) {
      const uint64_t w = static_cast<uint64_t>(s.width);
      std::memcpy(m.baseline.data() + s.base_offset + w * b, v->data + w * s.blocks[b], w);
    }
    if (s.global_canon >= 0) {
      REFIT_ASSIGN_OR_RETURN(const TensorView* g, find(m.canonical[s.global_canon]));
      std::memcpy(m.baseline.data() + s.global_offset, g->data, 4);
    }
  }
  m.pending.clear();
  m.have_baseline = true;
  return Status();
}

Status RankEncoder::SetBaselineFromLocal(const std::vector<TensorView>& local,
                                         const GlobalAmax& amax) {
  Impl& m = *impl_;
  if (m.opt.plan_only) return FailedPreconditionError("a plan-only rank encoder has no baseline");
  std::vector<const uint8_t*> data;
  REFIT_RETURN_IF_ERROR(m.CheckLocal(local, &data));
  REFIT_RETURN_IF_ERROR(m.ComputeAllScales(data, amax));
  for (const Job& j : m.jobs) m.Gather(j, data, m.baseline.data() + j.base_offset);
  m.pending.clear();
  m.have_baseline = true;
  return Status();
}

std::vector<std::string> RankEncoder::global_amax_tensors() const {
  std::vector<std::string> out;
  for (const auto& [ci, s] : impl_->scales) {
    if (s.split) out.push_back(impl_->canonical[ci].name);
  }
  return out;
}

Result<RankReport> RankEncoder::Encode(uint64_t version, uint64_t base_version,
                                       const std::vector<TensorView>& local,
                                       const EmitChunkFn& emit, const GlobalAmax& amax) {
  Impl& m = *impl_;
  if (!m.have_baseline) {
    return FailedPreconditionError("the rank encoder has no baseline (SetBaseline first)");
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<const uint8_t*> data;
  REFIT_RETURN_IF_ERROR(m.CheckLocal(local, &data));
  REFIT_RETURN_IF_ERROR(m.ComputeAllScales(data, amax));
  m.pending.clear();
  RankReport report;
  report.owned_bytes = m.owned_bytes;
  for (const Region& r : m.regions) report.owned_elements += r.outer * r.inner;

  const int threads = m.opt.threads > 0 ? m.opt.threads : DefaultThreads();
  struct Scratch {
    EncodeScratch enc;
    std::vector<uint8_t> gathered;
  };
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  Status st = RunOrdered<Encoded>(
      m.jobs.size(), threads, static_cast<size_t>(2 * threads),
      [&](size_t ji, int worker) -> Result<Encoded> {
        const Job& j = m.jobs[ji];
        Scratch& s = scratch[static_cast<size_t>(worker)];
        const bool is_scale = j.scale_of >= 0;
        const Region* r = is_scale ? nullptr : &m.regions[j.region];
        const int w = is_scale ? m.ScaleWidth(j) : r->width;
        const uint8_t* cur = nullptr;
        if (!is_scale && r->in_place) {
          const uint64_t li = r->LocalIndex(j.o0, j.i0);
          cur = data[r->local] + li * static_cast<uint64_t>(w);
        } else {
          s.gathered.resize(j.count * static_cast<uint64_t>(w));
          m.Gather(j, data, s.gathered.data());
          cur = s.gathered.data();
        }
        ChunkHeader ids;
        ids.width = static_cast<uint8_t>(w);
        ids.version = version;
        ids.base_version = base_version;
        ChunkEncodeOptions eo;
        eo.codec = m.opt.codec;
        const bool direct = !is_scale && r->direct;
        eo.allow_xor = direct || !m.opt.residual_overwrite;
        ChunkResult out;
        uint64_t start = 0, run = 0, stride = 0;
        if (is_scale) {
          ids.tensor_id = m.ScaleTensor(j);
          start = j.start;
          run = j.run;
          stride = j.stride;
        } else {
          ids.tensor_id = r->canon;
          start = r->start + j.o0 * r->stride + j.i0;
          if (j.rows > 1) {
            run = r->inner;
            stride = r->stride;
          }
        }
        REFIT_RETURN_IF_ERROR(EncodeRegionChunk(ids, m.baseline.data() + j.base_offset, cur,
                                                start, j.count, run, stride, eo, &s.enc, &out));
        Encoded e;
        e.chunk = std::move(out.chunk);
        e.header = out.header;
        e.changed = e.chunk.empty() ? 0 : out.header.changed;
        return e;
      },
      [&](size_t ji, Encoded&& e) -> Status {
        if (e.chunk.empty()) return Status();
        const Job& j = m.jobs[ji];
        const bool direct = j.scale_of < 0 && m.regions[j.region].direct;
        (direct ? report.changed_direct : report.changed_residual) += e.changed;
        ++report.chunks;
        report.payload_bytes += e.chunk.size();
        REFIT_RETURN_IF_ERROR(emit(e.chunk, e.header));
        m.pending.emplace_back(static_cast<uint32_t>(ji), std::move(e.chunk));
        return Status();
      });
  if (!st.ok()) {
    m.pending.clear();
    return st;
  }
  uint64_t scratch_bytes = 0;
  for (const Scratch& s : scratch) {
    scratch_bytes += s.gathered.capacity() + s.enc.positions.capacity() * 4 +
                     s.enc.values.capacity() + s.enc.dense.capacity() +
                     s.enc.candidate.capacity() + s.enc.best.capacity();
  }
  for (const auto& p : m.pending) scratch_bytes += p.second.capacity();
  report.peak_scratch_bytes = scratch_bytes;
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

Status ApplyToGatheredRegion(std::span<const uint8_t> chunk, uint8_t* region,
                             ApplyScratch* scratch) {
  REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(chunk));
  c.header.start = 0;
  c.header.run = 0;
  c.header.stride = 0;
  return ApplyChunkInPlace(c, region, scratch, nullptr, nullptr);
}

Status PendingChunkOutOfRange(size_t index, size_t pending) {
  return OutOfRangeError("chunk " + std::to_string(index) + " of the pending version: it has " +
                         std::to_string(pending) + " chunk(s)");
}

Status RankEncoder::Commit() {
  Impl& m = *impl_;
  ApplyScratch scratch;
  for (const auto& [ji, bytes] : m.pending) {
    // The baseline holds the region gathered.
    REFIT_RETURN_IF_ERROR(
        ApplyToGatheredRegion(bytes, m.baseline.data() + m.jobs[ji].base_offset, &scratch)
            .WithContext("advancing the rank's baseline"));
  }
  m.pending.clear();
  return Status();
}

void RankEncoder::Abort() { impl_->pending.clear(); }

size_t RankEncoder::pending_chunks() const { return impl_->pending.size(); }

Result<std::span<const uint8_t>> RankEncoder::PendingChunk(size_t index) const {
  if (index >= impl_->pending.size()) return PendingChunkOutOfRange(index, impl_->pending.size());
  return std::span<const uint8_t>(impl_->pending[index].second);
}

Result<std::vector<uint8_t>> RankEncoder::PendingRegion(size_t index, bool after) const {
  const Impl& m = *impl_;
  REFIT_ASSIGN_OR_RETURN(std::span<const uint8_t> bytes, PendingChunk(index));
  REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(bytes));
  const Job& j = m.jobs[m.pending[index].first];
  const uint64_t length = c.header.count * static_cast<uint64_t>(c.header.width);
  if (j.base_offset > m.baseline.size() || length > m.baseline.size() - j.base_offset) {
    return InternalError("pending chunk " + std::to_string(index) +
                         " lies outside the rank's baseline");
  }
  std::vector<uint8_t> out(m.baseline.begin() + static_cast<std::ptrdiff_t>(j.base_offset),
                           m.baseline.begin() + static_cast<std::ptrdiff_t>(j.base_offset + length));
  if (after) {
    ApplyScratch scratch;
    REFIT_RETURN_IF_ERROR(ApplyToGatheredRegion(bytes, out.data(), &scratch)
                              .WithContext("the region of a pending chunk at its version"));
  }
  return out;
}

}  // namespace refit::trainer
