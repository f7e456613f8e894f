#include "layout/layout.h"

#include <algorithm>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/file.h"
#include "format/json.h"
#include "refit/checkpoint.h"

namespace refit::layout {

using internal::QuoteForMessage;

// ---------------------------------------------------------------------------
// Strided ranges and sweeps.

std::optional<Runs> PieceRuns(uint64_t offset, uint64_t rows, uint64_t cols,
                              uint64_t row_stride, uint64_t col_stride) {
  if (rows == 0 || cols == 0) return std::nullopt;
  Runs r;
  r.offset = offset;
  if (rows == 1 && cols == 1) {
    r.run = 1, r.stride = 1, r.count = 1;
  } else if (cols > 1 && col_stride == 1) {
    r.run = cols, r.stride = row_stride, r.count = rows;
  } else if (rows > 1 && row_stride == 1) {
    r.run = rows, r.stride = col_stride, r.count = cols;
  } else if (rows == 1) {
    r.run = 1, r.stride = col_stride, r.count = cols;
  } else if (cols == 1) {
    r.run = 1, r.stride = row_stride, r.count = rows;
  } else {
    return std::nullopt;  // neither stride is 1: not a strided range
  }
  if (r.count == 1) r.stride = r.run;
  if (r.stride < r.run) return std::nullopt;  // runs would overlap
  uint64_t span = 0;
  if (__builtin_mul_overflow(r.count - 1, r.stride, &span) ||
      __builtin_add_overflow(span, r.run, &span) ||
      __builtin_add_overflow(span, r.offset, &span)) {
    return std::nullopt;
  }
  if (r.stride == r.run) {  // contiguous: one run
    r.run *= r.count;
    r.stride = r.run;
    r.count = 1;
  }
  return r;
}

namespace {

// Visits the runs of several strided ranges in ascending order of start
// (ties: lower source index first). `visit(source, begin, end)` returns
// false to stop. Memory is O(sources); time O(runs log sources).
template <typename Visit>
void SweepRuns(const std::vector<Runs>& sets, Visit&& visit) {
  using Item = std::tuple<uint64_t, size_t, uint64_t>;  // start, source, index
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  for (size_t i = 0; i < sets.size(); ++i) heap.emplace(sets[i].offset, i, 0);
  while (!heap.empty()) {
    auto [start, src, index] = heap.top();
    heap.pop();
    const Runs& r = sets[src];
    if (!visit(src, start, start + r.run)) return;
    if (index + 1 < r.count) heap.emplace(start + r.stride, src, index + 1);
  }
}

// Merges strided ranges that sit side by side (same stride and count, the
// runs of one ending where those of the other begin; or contiguous ranges
// that touch) into fewer ranges with the same union. Overlapping ranges are
// never merged, so an overlap survives. Tensor-parallel shards of one tensor
// merge back into a single range, which keeps sweeps over large layouts
// O(pieces) instead of O(rows).
std::vector<Runs> MergeAdjacent(std::vector<Runs> sets) {
  auto key = [](const Runs& r) {
    return r.count == 1 ? std::make_tuple(uint64_t{0}, uint64_t{0}, r.offset)
                        : std::make_tuple(r.stride, r.count, r.offset);
  };
  for (bool changed = true; changed;) {
    changed = false;
    std::sort(sets.begin(), sets.end(),
              [&](const Runs& a, const Runs& b) { return key(a) < key(b); });
    std::vector<Runs> out;
    for (const Runs& r : sets) {
      if (!out.empty()) {
        Runs& b = out.back();
        bool both_flat = b.count == 1 && r.count == 1;
        bool same_grid = b.count > 1 && b.count == r.count && b.stride == r.stride &&
                         b.run + r.run <= b.stride;
        if ((both_flat || same_grid) && b.offset + b.run == r.offset) {
          b.run += r.run;
          if (b.count > 1 && b.run == b.stride) {  // the runs now touch
            b.run *= b.count;
            b.count = 1;
          }
          if (b.count == 1) b.stride = b.run;
          changed = true;
          continue;
        }
      }
      out.push_back(r);
    }
    sets = std::move(out);
  }
  return sets;
}

// The first place, in canonical order, where the ranges overlap or (when
// `total` is given) leave a gap in [0, total). A fast test on merged
// ranges; a gap needs no more, an overlap is swept again, unmerged, by the
// caller to name the pieces involved.
struct Problem {
  enum Kind { kNone, kGap, kOverlap } kind = kNone;
  uint64_t at = 0;
};

Problem FirstProblem(const std::vector<Runs>& sets, std::optional<uint64_t> total) {
  std::vector<Runs> merged = MergeAdjacent(sets);
  Problem p;
  if (merged.size() <= 1) {  // a strided range never overlaps itself
    if (!total) return p;
    if (merged.empty()) return *total ? Problem{Problem::kGap, 0} : p;
    const Runs& r = merged[0];
    if (r.offset > 0) return {Problem::kGap, 0};
    if (r.run < *total) return {Problem::kGap, r.run};  // after the first run
    return p;
  }
  uint64_t reach = 0;
  bool first = true;
  SweepRuns(merged, [&](size_t, uint64_t b, uint64_t e) {
    if (!first && b < reach) {
      p = {Problem::kOverlap, b};
      return false;
    }
    if (total && b > reach) {
      p = {Problem::kGap, reach};
      return false;
    }
    first = false;
    reach = e;
    return true;
  });
  if (p.kind == Problem::kNone && total && reach < *total) p = {Problem::kGap, reach};
  return p;
}

bool Disjoint(const std::vector<Runs>& sets, std::optional<uint64_t> total) {
  return FirstProblem(sets, total).kind == Problem::kNone;
}

// "element 1234 [6, 82]" of a tensor with `shape`.
std::string ElementName(const std::vector<uint64_t>& shape, uint64_t flat) {
  std::string s = "element " + std::to_string(flat);
  if (shape.size() <= 1) return s;
  std::vector<uint64_t> idx(shape.size());
  uint64_t rest = flat;
  for (size_t d = shape.size(); d-- > 0;) {
    uint64_t dim = shape[d] == 0 ? 1 : shape[d];
    idx[d] = rest % dim;
    rest /= dim;
  }
  s += " [";
  for (size_t d = 0; d < idx.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(idx[d]);
  }
  return s + "]";
}

std::optional<uint64_t> NumElements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

bool IsFloatDType(std::string_view d) {
  return d == "BF16" || (!d.empty() && d[0] == 'F');
}

std::string DescribePiece(const Layout& l, size_t rank, size_t tensor,
                          size_t piece) {
  const LocalTensor& t = l.ranks[rank].tensors[tensor];
  return "rank " + std::to_string(l.ranks[rank].rank) + ", local tensor " +
         QuoteForMessage(t.name) + ", piece " + std::to_string(piece) +
         " (canonical " + QuoteForMessage(t.pieces[piece].canonical) + ")";
}

std::string PieceShape(const Piece& p) {
  return "rows " + std::to_string(p.rows) + " x cols " + std::to_string(p.cols) +
         ", local [" + std::to_string(p.local_offset) + ", " +
         std::to_string(p.local_row_stride) + ", " +
         std::to_string(p.local_col_stride) + "], canon [" +
         std::to_string(p.canon_offset) + ", " +
         std::to_string(p.canon_row_stride) + ", " +
         std::to_string(p.canon_col_stride) + "]";
}

// Where a mapped canonical element lives.
struct PieceRef {
  size_t rank = 0, tensor = 0, piece = 0;
};

// Facts about the canonical tensors that every check needs.
struct CanonInfo {
  std::map<std::string, size_t, std::less<>> index;
  std::vector<uint64_t> numel;
  std::vector<int> width;
  std::vector<bool> derived;  // the scale of another tensor: mapped by no piece
};

// A packed FP4 tensor `c` of `logical` elements and its scale tensor `s`
// of `scales` elements (docs/layout.md, section 3).
Status CheckPacked(const CanonicalTensor& c, const CanonicalTensor& s,
                   uint64_t logical, uint64_t scales) {
  const std::string what = "canonical tensor " + QuoteForMessage(c.name) + " (" +
                           c.scale_kind + ")";
  const uint64_t block = PackedBlock(c);
  const bool mx = c.scale_kind == "mxfp4";
  if (c.dtype != "U8") return InvalidArgumentError(what + ": dtype must be U8, two codes a byte");
  if (c.block_rows != 0 || c.block_cols != 0) {
    return InvalidArgumentError(what + ": has a \"block\"; its blocks are implied");
  }
  const std::vector<uint64_t> shape = LogicalShape(c);
  if (mx ? c.shape.size() < 2 || c.shape.back() != block / 2 : c.shape.empty() ||
           shape.back() % block != 0) {
    return InvalidArgumentError(
        what + (mx ? ": shape must be [..., C/32, 16]" : ": shape must be [..., K/2], K a "
                                                          "multiple of 16"));
  }
  const std::string scale_dtype = mx ? "U8" : "F8_E4M3";
  if (s.dtype != scale_dtype || scales != logical / block) {
    return InvalidArgumentError(what + ": scale tensor " + QuoteForMessage(s.name) +
                                " must be " + std::to_string(logical / block) + " " +
                                scale_dtype + " element(s), one per " +
                                std::to_string(block) + " elements");
  }
  return Status();
}

Result<CanonInfo> CheckCanonical(const Layout& l) {
  CanonInfo info;
  DTypeRegistry dtypes;
  size_t n = l.canonical.size();
  info.numel.resize(n);
  info.width.resize(n);
  info.derived.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const CanonicalTensor& c = l.canonical[i];
    std::string what = "canonical tensor " + QuoteForMessage(c.name);
    if (c.name.empty()) {
      return InvalidArgumentError("canonical tensor " + std::to_string(i) +
                                  " has an empty name");
    }
    if (!info.index.emplace(c.name, i).second) {
      return InvalidArgumentError(what + " is listed twice");
    }
    Result<int> w = dtypes.ElementWidth(c.dtype);
    if (!w.ok()) return w.status().WithContext(what);
    info.width[i] = *w;
    std::optional<uint64_t> ne = NumElements(c.shape);
    if (!ne || *ne == 0) {
      return InvalidArgumentError(what + ": shape has no elements or overflows");
    }
    if (PackedBlock(c) != 0 && __builtin_mul_overflow(*ne, uint64_t{2}, &*ne)) {
      return InvalidArgumentError(what + ": shape overflows");
    }
    info.numel[i] = *ne;  // logical elements: pieces map those
  }
  for (size_t i = 0; i < n; ++i) {
    const CanonicalTensor& c = l.canonical[i];
    std::string what = "canonical tensor " + QuoteForMessage(c.name);
    if (c.scale_kind.empty() && c.scale.empty()) continue;
    if (c.scale_kind != "per_tensor" && c.scale_kind != "per_block" &&
        PackedBlock(c) == 0) {
      return InvalidArgumentError(what + ": scale_kind " +
                                  QuoteForMessage(c.scale_kind) +
                                  " is not \"per_tensor\", \"per_block\", "
                                  "\"mxfp4\" or \"nvfp4\"");
    }
    auto it = info.index.find(c.scale);
    if (it == info.index.end()) {
      return InvalidArgumentError(what + ": its scale tensor " +
                                  QuoteForMessage(c.scale) +
                                  " is not a canonical tensor");
    }
    const CanonicalTensor& s = l.canonical[it->second];
    if (it->second == i || !s.scale.empty()) {
      return InvalidArgumentError(what + ": scale tensor " +
                                  QuoteForMessage(c.scale) +
                                  " is itself quantized");
    }
    if (info.derived[it->second]) {
      return InvalidArgumentError(what + ": scale tensor " +
                                  QuoteForMessage(c.scale) +
                                  " is the scale of another tensor too");
    }
    info.derived[it->second] = true;
    if (PackedBlock(c) != 0) {
      REFIT_RETURN_IF_ERROR(CheckPacked(c, s, info.numel[i], info.numel[it->second]));
      const std::string global = GlobalScaleName(c);
      if (!global.empty()) {
        auto g = info.index.find(global);
        if (g == info.index.end() || g->second == i || info.derived[g->second] ||
            !l.canonical[g->second].scale.empty() || l.canonical[g->second].dtype != "F32" ||
            info.numel[g->second] != 1) {
          return InvalidArgumentError(what + ": its global scale " +
                                      QuoteForMessage(global) +
                                      " must be a canonical F32 tensor of 1 element, not "
                                      "quantized and the scale of nothing else");
        }
        info.derived[g->second] = true;
      }
      continue;
    }
    if (c.scale_kind == "per_tensor") {
      if (info.numel[it->second] != 1) {
        return InvalidArgumentError(what + ": per_tensor scale " +
                                    QuoteForMessage(c.scale) + " has " +
                                    std::to_string(info.numel[it->second]) +
                                    " elements, not 1");
      }
      continue;
    }
    if (c.block_rows == 0 || c.block_cols == 0) {
      return InvalidArgumentError(what + ": per_block needs block_rows and "
                                  "block_cols > 0");
    }
    uint64_t cols = c.shape.empty() ? 1 : c.shape.back();
    uint64_t rows = info.numel[i] / cols;
    std::vector<uint64_t> want = {(rows + c.block_rows - 1) / c.block_rows,
                                  (cols + c.block_cols - 1) / c.block_cols};
    std::optional<uint64_t> have = NumElements(s.shape);
    if (!have || *have != want[0] * want[1]) {
      return InvalidArgumentError(
          what + ": per_block scale " + QuoteForMessage(c.scale) +
          " should have " + std::to_string(want[0]) + " x " +
          std::to_string(want[1]) + " elements (blocks of " +
          std::to_string(c.block_rows) + " x " + std::to_string(c.block_cols) +
          ")");
    }
  }
  return info;
}

// Per canonical tensor, every piece that maps it with its canonical runs.
struct Mapped {
  std::vector<PieceRef> refs;
  std::vector<Runs> runs;
};

// Checks everything local to one piece and collects the canonical runs.
Result<std::vector<Mapped>> CheckPieces(const Layout& l, const CanonInfo& ci) {
  DTypeRegistry dtypes;
  std::vector<Mapped> mapped(l.canonical.size());
  std::set<uint32_t> rank_ids;
  for (size_t ri = 0; ri < l.ranks.size(); ++ri) {
    const RankLayout& rank = l.ranks[ri];
    if (!rank_ids.insert(rank.rank).second) {
      return InvalidArgumentError("rank " + std::to_string(rank.rank) +
                                  " is listed twice");
    }
    std::set<std::string, std::less<>> names;
    for (size_t ti = 0; ti < rank.tensors.size(); ++ti) {
      const LocalTensor& t = rank.tensors[ti];
      std::string what = "rank " + std::to_string(rank.rank) +
                         ", local tensor " + QuoteForMessage(t.name);
      if (t.name.empty() || !names.insert(t.name).second) {
        return InvalidArgumentError(what + ": name empty or used twice on "
                                    "this rank");
      }
      Result<int> w = dtypes.ElementWidth(t.dtype);
      if (!w.ok()) return w.status().WithContext(what);
      std::optional<uint64_t> numel = NumElements(t.shape);
      if (!numel) return InvalidArgumentError(what + ": shape overflows");
      std::vector<Runs> local_runs;
      for (size_t pi = 0; pi < t.pieces.size(); ++pi) {
        const Piece& p = t.pieces[pi];
        std::string pw = DescribePiece(l, ri, ti, pi);
        auto it = ci.index.find(p.canonical);
        if (it == ci.index.end()) {
          return InvalidArgumentError(pw + ": unknown canonical tensor");
        }
        size_t c = it->second;
        const CanonicalTensor& ct = l.canonical[c];
        if (ci.derived[c]) {
          return InvalidArgumentError(
              pw + ": maps a scale tensor, which is derived from the tensor "
                   "it scales and must not be mapped");
        }
        // A packed FP4 tensor is always a conversion (its pieces map
        // logical elements, two a byte).
        if (PackedBlock(ct) != 0 ? !IsFloatDType(t.dtype)
                                 : t.dtype != ct.dtype && !(IsFloatDType(t.dtype) &&
                                                            IsFloatDType(ct.dtype))) {
          return InvalidArgumentError(pw + ": local dtype " + t.dtype +
                                      " cannot hold canonical dtype " +
                                      ct.dtype);
        }
        std::optional<Runs> lr = PieceRuns(p.local_offset, p.rows, p.cols,
                                           p.local_row_stride,
                                           p.local_col_stride);
        if (!lr) {
          return InvalidArgumentError(
              pw + ": local block (" + PieceShape(p) +
              ") is empty, overflows, overlaps itself or is not a strided "
              "range (one stride must be 1)");
        }
        if (lr->end() > *numel) {
          return InvalidArgumentError(
              pw + ": local block (" + PieceShape(p) + ") ends at element " +
              std::to_string(lr->end()) + ", past the local tensor's " +
              std::to_string(*numel) + " elements (shape mismatch)");
        }
        std::optional<Runs> cr = PieceRuns(p.canon_offset, p.rows, p.cols,
                                           p.canon_row_stride,
                                           p.canon_col_stride);
        if (!cr) {
          return InvalidArgumentError(
              pw + ": canonical block (" + PieceShape(p) +
              ") overflows, overlaps itself or is not a strided range (one "
              "stride must be 1)");
        }
        if (cr->end() > ci.numel[c]) {
          return InvalidArgumentError(
              pw + ": canonical block (" + PieceShape(p) + ") reaches " +
              ElementName(LogicalShape(ct), cr->end() - 1) + ", past the canonical "
              "tensor's " + std::to_string(ci.numel[c]) +
              " elements (shape mismatch)");
        }
        local_runs.push_back(*lr);
        mapped[c].refs.push_back({ri, ti, pi});
        mapped[c].runs.push_back(*cr);
      }
      // No two pieces of one local tensor share an element.
      if (Disjoint(local_runs, std::nullopt)) continue;
      uint64_t reach = 0;
      size_t reach_src = 0;
      bool first = true;
      Status st;
      SweepRuns(local_runs, [&](size_t src, uint64_t b, uint64_t e) {
        if (!first && b < reach && src != reach_src) {
          st = InvalidArgumentError(
              DescribePiece(l, ri, ti, src) + " overlaps piece " +
              std::to_string(reach_src) + " at local " +
              ElementName(t.shape, b));
          return false;
        }
        if (first || e > reach) reach = e, reach_src = src;
        first = false;
        return true;
      });
      REFIT_RETURN_IF_ERROR(st);
    }
  }
  return mapped;
}

// Every element of canonical tensor c is mapped, at most once per rank, and
// replicas map it from local storage of one dtype.
Status CheckCanonicalCoverage(const Layout& l, const CanonInfo& ci, size_t c,
                              const Mapped& m) {
  const CanonicalTensor& ct = l.canonical[c];
  std::string what = "canonical tensor " + QuoteForMessage(ct.name);
  if (m.runs.empty()) {
    return InvalidArgumentError(what + " is mapped by no piece on any rank "
                                "(gap: all " + std::to_string(ci.numel[c]) +
                                " elements)");
  }
  auto dtype_of = [&](size_t src) -> const std::string& {
    const PieceRef& r = m.refs[src];
    return l.ranks[r.rank].tensors[r.tensor].dtype;
  };
  // Fast path: the distinct blocks tile the tensor and replicas of each
  // block share a dtype. Otherwise sweep every run to name the problem (or
  // find only replicas that overlap in part, which is fine).
  std::map<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>, size_t> distinct;
  std::vector<Runs> unique;
  bool same_dtype = true;
  for (size_t i = 0; i < m.runs.size(); ++i) {
    const Runs& r = m.runs[i];
    auto [it, fresh] =
        distinct.emplace(std::make_tuple(r.offset, r.run, r.stride, r.count), i);
    if (fresh) {
      unique.push_back(r);
    } else if (dtype_of(i) != dtype_of(it->second)) {
      same_dtype = false;
    }
  }
  Status st;
  Problem problem = FirstProblem(unique, ci.numel[c]);
  if (problem.kind == Problem::kGap) {
    return InvalidArgumentError(what + ": gap: " + ElementName(LogicalShape(ct), problem.at) +
                                " is mapped by no piece on any rank");
  }
  if (!same_dtype || problem.kind != Problem::kNone) {
    uint64_t reach = 0;
    size_t holder = 0;
    SweepRuns(m.runs, [&](size_t src, uint64_t b, uint64_t e) {
      if (b > reach) {
        st = InvalidArgumentError(what + ": gap: " + ElementName(LogicalShape(ct), reach) +
                                  " is mapped by no piece on any rank");
        return false;
      }
      if (b < reach && dtype_of(src) != dtype_of(holder)) {
        const PieceRef& a = m.refs[src];
        const PieceRef& h = m.refs[holder];
        st = InvalidArgumentError(
            what + ": replicas disagree on storage at " + ElementName(LogicalShape(ct), b) +
            ": " + DescribePiece(l, a.rank, a.tensor, a.piece) + " holds " +
            dtype_of(src) + ", " + DescribePiece(l, h.rank, h.tensor, h.piece) +
            " holds " + dtype_of(holder));
        return false;
      }
      if (e > reach) reach = e, holder = src;
      return true;
    });
    REFIT_RETURN_IF_ERROR(st);
    if (reach < ci.numel[c]) {
      return InvalidArgumentError(what + ": gap: " + ElementName(LogicalShape(ct), reach) +
                                  " is mapped by no piece on any rank");
    }
  }
  // Per rank: no element mapped twice.
  std::map<size_t, std::vector<size_t>> by_rank;
  for (size_t i = 0; i < m.refs.size(); ++i) by_rank[m.refs[i].rank].push_back(i);
  for (const auto& entry : by_rank) {
    const std::vector<size_t>& idx = entry.second;  // (captured below: no binding)
    if (idx.size() < 2) continue;
    std::vector<Runs> sets;
    for (size_t i : idx) sets.push_back(m.runs[i]);
    if (Disjoint(sets, std::nullopt)) continue;
    uint64_t rr = 0;
    size_t rh = 0;
    bool first = true;
    SweepRuns(sets, [&](size_t src, uint64_t b, uint64_t e) {
      if (!first && b < rr) {
        const PieceRef& a = m.refs[idx[src]];
        const PieceRef& h = m.refs[idx[rh]];
        st = InvalidArgumentError(
            what + ": " + ElementName(LogicalShape(ct), b) + " is mapped twice on one "
            "rank: by " + DescribePiece(l, a.rank, a.tensor, a.piece) +
            " and by " + DescribePiece(l, h.rank, h.tensor, h.piece));
        return false;
      }
      if (first || e > rr) rr = e, rh = src;
      first = false;
      return true;
    });
    REFIT_RETURN_IF_ERROR(st);
  }
  return Status();
}

struct Validated {
  CanonInfo info;
  std::vector<Mapped> mapped;
};

Result<Validated> ValidateImpl(const Layout& l) {
  Validated v;
  REFIT_ASSIGN_OR_RETURN(v.info, CheckCanonical(l));
  REFIT_ASSIGN_OR_RETURN(v.mapped, CheckPieces(l, v.info));
  for (size_t c = 0; c < l.canonical.size(); ++c) {
    if (v.info.derived[c]) continue;
    REFIT_RETURN_IF_ERROR(CheckCanonicalCoverage(l, v.info, c, v.mapped[c]));
  }
  return v;
}

}  // namespace

uint64_t PackedBlock(const CanonicalTensor& tensor) {
  if (tensor.scale_kind == "mxfp4") return 32;
  if (tensor.scale_kind == "nvfp4") return 16;
  return 0;
}

std::string GlobalScaleName(const CanonicalTensor& tensor) {
  return tensor.scale_kind == "nvfp4" ? tensor.scale + "_2" : std::string();
}

std::vector<uint64_t> LogicalShape(const CanonicalTensor& tensor) {
  std::vector<uint64_t> shape = tensor.shape;
  if (tensor.scale_kind == "mxfp4" && shape.size() >= 2) {
    const uint64_t last = shape.back();
    shape.pop_back();
    shape.back() *= 2 * last;
  } else if (tensor.scale_kind == "nvfp4" && !shape.empty()) {
    shape.back() *= 2;
  }
  return shape;
}

Status ValidateLayout(const Layout& layout) {
  return ValidateImpl(layout).status();
}

uint64_t PieceBytes(const Layout& layout, const Piece& piece) {
  DTypeRegistry dtypes;
  for (const CanonicalTensor& c : layout.canonical) {
    if (c.name != piece.canonical) continue;
    if (PackedBlock(c) != 0) return piece.rows * piece.cols / 2;
    Result<int> w = dtypes.ElementWidth(c.dtype);
    return piece.rows * piece.cols * static_cast<uint64_t>(w.ok() ? *w : 0);
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Ownership.

namespace {

Piece SubPiece(const Piece& p, uint64_t r0, uint64_t nr, uint64_t c0,
               uint64_t nc) {
  Piece s = p;
  s.rows = nr;
  s.cols = nc;
  s.local_offset = p.local_offset + r0 * p.local_row_stride + c0 * p.local_col_stride;
  s.canon_offset = p.canon_offset + r0 * p.canon_row_stride + c0 * p.canon_col_stride;
  return s;
}

// Whether piece `p` may be cut before position i of its outer dimension
// (rows when rows > 1, else cols) without cutting a quantization block of
// canonical tensor `ct`.
bool CanCut(const CanonicalTensor& ct, const Piece& p, uint64_t i) {
  if (ct.scale_kind.empty()) return true;
  const uint64_t packed = PackedBlock(ct);
  // nvfp4's global scale is the amax of the whole tensor: never cut.
  if ((ct.scale_kind != "per_block" && packed == 0) || ct.scale_kind == "nvfp4") return false;
  // A packed tensor's blocks are 1 x PackedBlock in logical coordinates.
  const std::vector<uint64_t> shape = LogicalShape(ct);
  uint64_t width = shape.empty() ? 1 : shape.back();
  uint64_t br = packed ? 1 : ct.block_rows, bc = packed ? packed : ct.block_cols;
  if (p.rows > 1) {
    if (p.cols == 1 || p.canon_col_stride == 1) {
      // Piece rows ascend through the canonical rows: cut between the last
      // canonical row of piece row i-1 and the first of piece row i, at a
      // multiple of the block height.
      uint64_t last = p.canon_offset + (i - 1) * p.canon_row_stride + p.cols - 1;
      uint64_t lo = last / width + 1;
      uint64_t hi = (p.canon_offset + i * p.canon_row_stride) / width;
      return (lo + br - 1) / br * br <= hi;
    }
    // Transposed: piece row i is canonical column (offset % width) + i.
    uint64_t col0 = p.canon_offset % width;
    if (p.canon_col_stride % width != 0 || col0 + p.rows > width) return false;
    return (col0 + i) % bc == 0;
  }
  if (p.canon_col_stride != 1) return false;
  uint64_t x = p.canon_offset + i;
  if (x % (width * br) == 0) return true;
  bool one_row = p.canon_offset / width == (p.canon_offset + p.cols - 1) / width;
  return one_row && (x % width) % bc == 0;
}

// Splits piece `p` along its outer dimension into at most `parts` parts of
// about equal size, cutting only where CanCut allows: each cut is the
// allowed position nearest its ideal place, searched at most kCutSearch
// positions away (a quantized piece with no allowed cut nearby gets fewer
// parts). Returns the cut positions including 0 and the end.
constexpr uint64_t kCutSearch = uint64_t{1} << 20;

std::vector<uint64_t> Cuts(const CanonicalTensor& ct, const Piece& p,
                           uint64_t parts) {
  uint64_t n = p.rows > 1 ? p.rows : p.cols;
  std::vector<uint64_t> cuts = {0};
  for (uint64_t j = 1; j < parts && n > 1; ++j) {
    uint64_t target = (n * j + parts / 2) / parts;
    auto usable = [&](uint64_t i) { return i > cuts.back() && i < n && CanCut(ct, p, i); };
    std::optional<uint64_t> best;
    for (uint64_t d = 0; d <= kCutSearch && !best; ++d) {
      if (d > target && target + d >= n) break;
      if (d <= target && usable(target - d)) {
        best = target - d;
      } else if (target + d < n && usable(target + d)) {
        best = target + d;
      }
    }
    if (best) cuts.push_back(*best);
  }
  cuts.push_back(n);
  return cuts;
}

Piece OuterSlice(const Piece& p, uint64_t a, uint64_t b) {
  return p.rows > 1 ? SubPiece(p, a, b - a, 0, p.cols)
                    : SubPiece(p, 0, p.rows, a, b - a);
}

}  // namespace

Result<Ownership> AssignOwnership(const Layout& layout,
                                  const OwnershipOptions& options) {
  REFIT_ASSIGN_OR_RETURN(Validated v, ValidateImpl(layout));
  Ownership owned(layout.ranks.size());
  std::vector<uint64_t> load(layout.ranks.size(), 0);
  auto give = [&](const PieceRef& ref, Piece piece, int width) {
    load[ref.rank] += piece.rows * piece.cols * static_cast<uint64_t>(width);
    owned[ref.rank].push_back({static_cast<uint32_t>(ref.tensor), std::move(piece)});
  };
  auto piece_of = [&](const PieceRef& r) -> const Piece& {
    return layout.ranks[r.rank].tensors[r.tensor].pieces[r.piece];
  };
  auto less_loaded = [&](const PieceRef& a, const PieceRef& b) {
    return std::tie(load[a.rank], a.rank, a.tensor, a.piece) <
           std::tie(load[b.rank], b.rank, b.tensor, b.piece);
  };
  for (size_t c = 0; c < layout.canonical.size(); ++c) {
    if (v.info.derived[c]) continue;
    const CanonicalTensor& ct = layout.canonical[c];
    const Mapped& m = v.mapped[c];
    int width = v.info.width[c];
    // Replica groups: pieces with the same canonical block and shape.
    using Key = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>;
    std::map<Key, std::vector<size_t>> groups;
    for (size_t i = 0; i < m.refs.size(); ++i) {
      const Piece& p = piece_of(m.refs[i]);
      groups[{p.canon_offset, p.rows, p.cols,
              p.rows > 1 ? p.canon_row_stride : 0,
              p.cols > 1 ? p.canon_col_stride : 0}]
          .push_back(i);
    }
    std::vector<Runs> reps;
    for (const auto& [key, members] : groups) reps.push_back(m.runs[members[0]]);
    if (Disjoint(reps, std::nullopt)) {
      // A per-tensor or NVFP4 global scale is the amax of the whole tensor:
      // when some rank maps all of its blocks (a tensor mapped by several
      // pieces, replicated), the least loaded such rank owns them all.
      std::optional<size_t> whole;
      if (groups.size() > 1 && (ct.scale_kind == "per_tensor" || ct.scale_kind == "nvfp4")) {
        std::map<size_t, size_t> blocks;  // rank index -> groups it maps
        for (const auto& [key, members] : groups) {
          for (size_t i : members) ++blocks[m.refs[i].rank];
        }
        for (const auto& [rank, k] : blocks) {
          if (k == groups.size() && (!whole || load[rank] < load[*whole])) whole = rank;
        }
      }
      for (auto& [key, members] : groups) {
        const Piece& p = piece_of(m.refs[members[0]]);
        uint64_t bytes = p.rows * p.cols * static_cast<uint64_t>(width);
        uint64_t parts = std::max<uint64_t>(
            1, std::min<uint64_t>(members.size(),
                                  bytes / std::max<uint64_t>(1, options.min_split_bytes)));
        std::vector<uint64_t> cuts = Cuts(ct, p, parts);
        // Largest part to the least loaded replica.
        std::vector<size_t> order(cuts.size() - 1);
        for (size_t j = 0; j < order.size(); ++j) order[j] = j;
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
          return cuts[a + 1] - cuts[a] > cuts[b + 1] - cuts[b];
        });
        std::vector<PieceRef> refs;
        for (size_t i : members) {
          if (!whole || m.refs[i].rank == *whole) refs.push_back(m.refs[i]);
        }
        for (size_t j : order) {
          auto it = std::min_element(refs.begin(), refs.end(), less_loaded);
          PieceRef ref = *it;
          refs.erase(it);
          give(ref, OuterSlice(piece_of(ref), cuts[j], cuts[j + 1]), width);
        }
      }
      continue;
    }
    // Replicas that overlap only in part: own element ranges one run at a
    // time (more, smaller owned pieces; generated layouts never get here).
    if (!ct.scale_kind.empty()) {
      return UnimplementedError(
          "canonical tensor " + QuoteForMessage(ct.name) +
          " is quantized and its replicas overlap only in part; ownership "
          "would cut quantization blocks. Map it with identical pieces on "
          "every replica");
    }
    // Expand each piece into its rows (runs along cols) or columns.
    struct Run {
      uint64_t begin, end;
      size_t src;
      uint64_t index;  // piece row (or col, when transposed)
      bool by_row;
    };
    std::vector<Run> runs;
    for (size_t i = 0; i < m.refs.size(); ++i) {
      const Piece& p = piece_of(m.refs[i]);
      bool by_row = !(p.rows > 1 && p.canon_row_stride == 1 &&
                      !(p.cols > 1 && p.canon_col_stride == 1));
      uint64_t n = by_row ? p.rows : p.cols;
      uint64_t len = by_row ? p.cols : p.rows;
      uint64_t step = by_row ? p.canon_row_stride : p.canon_col_stride;
      uint64_t inner = by_row ? p.canon_col_stride : p.canon_row_stride;
      if (len > 1 && inner != 1) {
        // Single-element runs (rows of one at a stride): expand elements.
        for (uint64_t a = 0; a < n; ++a) {
          for (uint64_t b = 0; b < len; ++b) {
            uint64_t s = p.canon_offset + a * step + b * inner;
            runs.push_back({s, s + 1, i, a * len + b, by_row});
          }
        }
        continue;
      }
      for (uint64_t a = 0; a < n; ++a) {
        uint64_t s = p.canon_offset + a * step;
        runs.push_back({s, s + len, i, a, by_row});
      }
    }
    std::vector<uint64_t> points;
    for (const Run& r : runs) points.push_back(r.begin), points.push_back(r.end);
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) {
      return std::tie(a.begin, a.src) < std::tie(b.begin, b.src);
    });
    size_t next = 0;
    std::vector<const Run*> active;
    for (size_t k = 0; k + 1 < points.size(); ++k) {
      uint64_t s = points[k], e = points[k + 1];
      std::erase_if(active, [&](const Run* r) { return r->end <= s; });
      while (next < runs.size() && runs[next].begin <= s) active.push_back(&runs[next++]);
      if (active.empty()) continue;
      const Run* best = *std::min_element(
          active.begin(), active.end(), [&](const Run* a, const Run* b) {
            return less_loaded(m.refs[a->src], m.refs[b->src]);
          });
      const Piece& p = piece_of(m.refs[best->src]);
      uint64_t len = best->by_row ? p.cols : p.rows;
      Piece sub;
      if (best->end - best->begin == 1 && len > 1) {
        uint64_t a = best->index / len, b = best->index % len;
        sub = best->by_row ? SubPiece(p, a, 1, b, 1) : SubPiece(p, b, 1, a, 1);
      } else if (best->by_row) {
        sub = SubPiece(p, best->index, 1, s - best->begin, e - s);
      } else {
        sub = SubPiece(p, s - best->begin, e - s, best->index, 1);
      }
      give(m.refs[best->src], std::move(sub), width);
    }
  }
  return owned;
}

// ---------------------------------------------------------------------------
// Coverage.

namespace {

// Block coordinates (r, c) of local element x in piece p, if it maps it.
std::optional<std::pair<uint64_t, uint64_t>> LocalToBlock(const Piece& p,
                                                          uint64_t x) {
  if (x < p.local_offset) return std::nullopt;
  uint64_t d = x - p.local_offset;
  std::optional<Runs> r = PieceRuns(0, p.rows, p.cols, p.local_row_stride,
                                    p.local_col_stride);
  if (!r) return std::nullopt;
  // Find (a, b) with a*rs + b*cs == d inside the block, trying the run
  // orientation PieceRuns picked (contiguous blocks collapse to one run, so
  // try both).
  auto try_rc = [&](uint64_t a, uint64_t b)
      -> std::optional<std::pair<uint64_t, uint64_t>> {
    if (a < p.rows && b < p.cols &&
        a * p.local_row_stride + b * p.local_col_stride == d) {
      return std::make_pair(a, b);
    }
    return std::nullopt;
  };
  if (p.cols == 1 || p.local_col_stride == 1) {
    uint64_t rs = p.rows > 1 ? p.local_row_stride : 1;
    if (rs == 0) return try_rc(0, d);
    if (auto v = try_rc(d / rs, d % rs)) return v;
  }
  if (p.rows == 1 || p.local_row_stride == 1) {
    uint64_t cs = p.cols > 1 ? p.local_col_stride : 1;
    if (cs == 0) return try_rc(d, 0);
    if (auto v = try_rc(d % cs, d / cs)) return v;
  }
  if (p.rows == 1 && p.local_col_stride != 0 && d % p.local_col_stride == 0) {
    return try_rc(0, d / p.local_col_stride);
  }
  if (p.cols == 1 && p.local_row_stride != 0 && d % p.local_row_stride == 0) {
    return try_rc(d / p.local_row_stride, 0);
  }
  return std::nullopt;
}

// Whether `o` is a sub-block of `p` with the same map.
bool IsSubPiece(const Piece& p, const Piece& o) {
  if (o.canonical != p.canonical || o.rows == 0 || o.cols == 0) return false;
  std::optional<std::pair<uint64_t, uint64_t>> rc = LocalToBlock(p, o.local_offset);
  if (!rc) return false;
  auto [a, b] = *rc;
  if (o.rows > p.rows - a || o.cols > p.cols - b) return false;
  if (p.canon_offset + a * p.canon_row_stride + b * p.canon_col_stride !=
      o.canon_offset) {
    return false;
  }
  if (o.rows > 1 && (o.local_row_stride != p.local_row_stride ||
                     o.canon_row_stride != p.canon_row_stride)) {
    return false;
  }
  if (o.cols > 1 && (o.local_col_stride != p.local_col_stride ||
                     o.canon_col_stride != p.canon_col_stride)) {
    return false;
  }
  return true;
}

}  // namespace

Status CheckCoverage(const Layout& layout, const Ownership& owned) {
  REFIT_ASSIGN_OR_RETURN(Validated v, ValidateImpl(layout));
  if (owned.size() != layout.ranks.size()) {
    return InvalidArgumentError("ownership lists " + std::to_string(owned.size()) +
                                " ranks, the layout " +
                                std::to_string(layout.ranks.size()));
  }
  std::vector<Mapped> by_canon(layout.canonical.size());
  for (size_t ri = 0; ri < owned.size(); ++ri) {
    const RankLayout& rank = layout.ranks[ri];
    for (size_t oi = 0; oi < owned[ri].size(); ++oi) {
      const OwnedPiece& op = owned[ri][oi];
      std::string what = "rank " + std::to_string(rank.rank) + ", owned piece " +
                         std::to_string(oi) + " (canonical " +
                         QuoteForMessage(op.piece.canonical) + ")";
      if (op.tensor >= rank.tensors.size()) {
        return InvalidArgumentError(what + ": local tensor index " +
                                    std::to_string(op.tensor) +
                                    " is out of range");
      }
      const LocalTensor& t = rank.tensors[op.tensor];
      size_t parent = t.pieces.size();
      for (size_t pi = 0; pi < t.pieces.size(); ++pi) {
        if (IsSubPiece(t.pieces[pi], op.piece)) {
          parent = pi;
          break;
        }
      }
      if (parent == t.pieces.size()) {
        return InvalidArgumentError(what + ": (" + PieceShape(op.piece) +
                                    ") is not part of any piece of local "
                                    "tensor " + QuoteForMessage(t.name));
      }
      size_t c = v.info.index.at(op.piece.canonical);
      std::optional<Runs> r =
          PieceRuns(op.piece.canon_offset, op.piece.rows, op.piece.cols,
                    op.piece.canon_row_stride, op.piece.canon_col_stride);
      if (!r) {  // cannot happen for a sub-block of a valid piece
        return InternalError(what + ": its canonical block is not a strided range");
      }
      by_canon[c].refs.push_back({ri, op.tensor, oi});
      by_canon[c].runs.push_back(*r);
    }
  }
  for (size_t c = 0; c < layout.canonical.size(); ++c) {
    if (v.info.derived[c]) continue;
    const CanonicalTensor& ct = layout.canonical[c];
    const Mapped& m = by_canon[c];
    std::string what = "ownership of canonical tensor " + QuoteForMessage(ct.name);
    Problem problem = FirstProblem(m.runs, v.info.numel[c]);
    if (problem.kind == Problem::kNone) continue;
    if (problem.kind == Problem::kGap) {
      return InvalidArgumentError(what + ": gap: " + ElementName(LogicalShape(ct), problem.at) +
                                  " is owned by no rank");
    }
    uint64_t reach = 0;
    size_t holder = 0;
    Status st;
    SweepRuns(m.runs, [&](size_t src, uint64_t b, uint64_t e) {
      if (b > reach) {
        st = InvalidArgumentError(what + ": gap: " + ElementName(LogicalShape(ct), reach) +
                                  " is owned by no rank");
        return false;
      }
      if (b < reach) {
        st = InvalidArgumentError(
            what + ": overlap: " + ElementName(LogicalShape(ct), b) +
            " is owned twice, by rank " +
            std::to_string(layout.ranks[m.refs[src].rank].rank) + " (owned piece " +
            std::to_string(m.refs[src].piece) + ") and by rank " +
            std::to_string(layout.ranks[m.refs[holder].rank].rank) +
            " (owned piece " + std::to_string(m.refs[holder].piece) + ")");
        return false;
      }
      reach = e;
      holder = src;
      return true;
    });
    REFIT_RETURN_IF_ERROR(st);
    if (reach < v.info.numel[c]) {
      return InvalidArgumentError(what + ": gap: " + ElementName(LogicalShape(ct), reach) +
                                  " is owned by no rank");
    }
  }
  return Status();
}

// ---------------------------------------------------------------------------
// JSON.

namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

constexpr int kMaxDepth = 8;
constexpr size_t kMaxDims = 8;

Status UnknownKeys(const Json& j, std::initializer_list<std::string_view> keys,
                   const std::string& where) {
  for (const auto& [k, val] : j.items()) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
      return InvalidArgumentError(where + ": unknown field " + QuoteForMessage(k));
    }
  }
  return Status();
}

const Json* Field(const Json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

Result<std::string> GetString(const Json& j, const char* key,
                              const std::string& where, bool required = true) {
  const Json* f = Field(j, key);
  if (!f) {
    if (!required) return std::string();
    return InvalidArgumentError(where + ": missing field \"" + key + "\"");
  }
  if (!f->is_string()) {
    return InvalidArgumentError(where + ": field \"" + key + "\" is not a string");
  }
  return f->get<std::string>();
}

Result<uint64_t> ToU64(const Json& v, const std::string& where) {
  if (!v.is_number_unsigned()) {
    if (v.is_number_integer() && v.get<int64_t>() >= 0) {
      return static_cast<uint64_t>(v.get<int64_t>());
    }
    return InvalidArgumentError(where + " is not a non-negative integer");
  }
  return v.get<uint64_t>();
}

Result<uint64_t> GetU64(const Json& j, const char* key, const std::string& where,
                        bool required = true) {
  const Json* f = Field(j, key);
  if (!f) {
    if (!required) return uint64_t{0};
    return InvalidArgumentError(where + ": missing field \"" + key + "\"");
  }
  return ToU64(*f, where + ": field \"" + key + "\"");
}

Result<std::vector<uint64_t>> GetU64s(const Json& j, const char* key,
                                      const std::string& where, size_t min_n,
                                      size_t max_n) {
  const Json* f = Field(j, key);
  std::string fw = where + ": field \"" + key + "\"";
  if (!f) return InvalidArgumentError(where + ": missing field \"" + key + "\"");
  if (!f->is_array() || f->size() < min_n || f->size() > max_n) {
    return InvalidArgumentError(fw + " must be an array of " +
                                (min_n == max_n ? std::to_string(min_n)
                                                : "at most " + std::to_string(max_n)) +
                                " integers");
  }
  std::vector<uint64_t> out;
  for (const Json& v : *f) {
    REFIT_ASSIGN_OR_RETURN(uint64_t x, ToU64(v, fw));
    out.push_back(x);
  }
  return out;
}

Result<const Json*> GetArray(const Json& j, const char* key,
                             const std::string& where) {
  const Json* f = Field(j, key);
  if (!f || !f->is_array()) {
    return InvalidArgumentError(where + ": field \"" + key +
                                "\" is missing or not an array");
  }
  return f;
}

Result<Layout> FromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgumentError("layout: not a JSON object");
  REFIT_RETURN_IF_ERROR(UnknownKeys(j, {"format", "version", "canonical", "ranks"},
                                    "layout"));
  REFIT_ASSIGN_OR_RETURN(std::string format, GetString(j, "format", "layout"));
  if (format != "refit-layout") {
    return InvalidArgumentError("layout: \"format\" is " + QuoteForMessage(format) +
                                ", not \"refit-layout\"");
  }
  REFIT_ASSIGN_OR_RETURN(uint64_t version, GetU64(j, "version", "layout"));
  if (version != 1) {
    return InvalidArgumentError("layout: version " + std::to_string(version) +
                                " is not supported (this build reads version 1)");
  }
  Layout l;
  REFIT_ASSIGN_OR_RETURN(const Json* canon, GetArray(j, "canonical", "layout"));
  for (size_t i = 0; i < canon->size(); ++i) {
    const Json& cj = (*canon)[i];
    std::string w = "layout: canonical[" + std::to_string(i) + "]";
    if (!cj.is_object()) return InvalidArgumentError(w + " is not an object");
    REFIT_RETURN_IF_ERROR(UnknownKeys(
        cj, {"name", "dtype", "shape", "scale", "scale_kind", "block"}, w));
    CanonicalTensor c;
    REFIT_ASSIGN_OR_RETURN(c.name, GetString(cj, "name", w));
    w += " " + QuoteForMessage(c.name);
    REFIT_ASSIGN_OR_RETURN(c.dtype, GetString(cj, "dtype", w));
    REFIT_ASSIGN_OR_RETURN(c.shape, GetU64s(cj, "shape", w, 0, kMaxDims));
    REFIT_ASSIGN_OR_RETURN(c.scale, GetString(cj, "scale", w, false));
    REFIT_ASSIGN_OR_RETURN(c.scale_kind, GetString(cj, "scale_kind", w, false));
    if (Field(cj, "block")) {
      REFIT_ASSIGN_OR_RETURN(std::vector<uint64_t> b, GetU64s(cj, "block", w, 2, 2));
      c.block_rows = b[0];
      c.block_cols = b[1];
    }
    l.canonical.push_back(std::move(c));
  }
  REFIT_ASSIGN_OR_RETURN(const Json* ranks, GetArray(j, "ranks", "layout"));
  for (size_t i = 0; i < ranks->size(); ++i) {
    const Json& rj = (*ranks)[i];
    std::string w = "layout: ranks[" + std::to_string(i) + "]";
    if (!rj.is_object()) return InvalidArgumentError(w + " is not an object");
    REFIT_RETURN_IF_ERROR(UnknownKeys(rj, {"rank", "tensors"}, w));
    RankLayout r;
    REFIT_ASSIGN_OR_RETURN(uint64_t id, GetU64(rj, "rank", w));
    if (id > UINT32_MAX) return InvalidArgumentError(w + ": rank out of range");
    r.rank = static_cast<uint32_t>(id);
    REFIT_ASSIGN_OR_RETURN(const Json* tensors, GetArray(rj, "tensors", w));
    for (size_t ti = 0; ti < tensors->size(); ++ti) {
      const Json& tj = (*tensors)[ti];
      std::string tw = w + ".tensors[" + std::to_string(ti) + "]";
      if (!tj.is_object()) return InvalidArgumentError(tw + " is not an object");
      REFIT_RETURN_IF_ERROR(UnknownKeys(tj, {"name", "dtype", "shape", "pieces"}, tw));
      LocalTensor t;
      REFIT_ASSIGN_OR_RETURN(t.name, GetString(tj, "name", tw));
      tw += " " + QuoteForMessage(t.name);
      REFIT_ASSIGN_OR_RETURN(t.dtype, GetString(tj, "dtype", tw));
      REFIT_ASSIGN_OR_RETURN(t.shape, GetU64s(tj, "shape", tw, 0, kMaxDims));
      REFIT_ASSIGN_OR_RETURN(const Json* pieces, GetArray(tj, "pieces", tw));
      for (size_t pi = 0; pi < pieces->size(); ++pi) {
        const Json& pj = (*pieces)[pi];
        std::string pw = tw + ".pieces[" + std::to_string(pi) + "]";
        if (!pj.is_object()) return InvalidArgumentError(pw + " is not an object");
        REFIT_RETURN_IF_ERROR(
            UnknownKeys(pj, {"canonical", "rows", "cols", "local", "canon"}, pw));
        Piece p;
        REFIT_ASSIGN_OR_RETURN(p.canonical, GetString(pj, "canonical", pw));
        REFIT_ASSIGN_OR_RETURN(p.rows, GetU64(pj, "rows", pw));
        REFIT_ASSIGN_OR_RETURN(p.cols, GetU64(pj, "cols", pw));
        REFIT_ASSIGN_OR_RETURN(std::vector<uint64_t> lo, GetU64s(pj, "local", pw, 3, 3));
        REFIT_ASSIGN_OR_RETURN(std::vector<uint64_t> co, GetU64s(pj, "canon", pw, 3, 3));
        p.local_offset = lo[0], p.local_row_stride = lo[1], p.local_col_stride = lo[2];
        p.canon_offset = co[0], p.canon_row_stride = co[1], p.canon_col_stride = co[2];
        t.pieces.push_back(std::move(p));
      }
      r.tensors.push_back(std::move(t));
    }
    l.ranks.push_back(std::move(r));
  }
  return l;
}

}  // namespace

Result<Layout> ParseLayout(std::string_view json) {
  Result<Json> j = internal::ParseJsonStrict(json, kMaxDepth, "layout");
  if (!j.ok()) return InvalidArgumentError(std::string(j.status().message()));
  try {
    return FromJson(*j);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("layout: ") + e.what());
  }
}

Result<Layout> LoadLayout(const std::string& path) {
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
  Result<Layout> l = ParseLayout(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!l.ok()) return l.status().WithContext(path);
  return l;
}

std::string LayoutToJson(const Layout& layout) {
  // One piece per line: layouts of large jobs hold many thousands.
  std::string out = "{\"format\": \"refit-layout\", \"version\": 1,\n\"canonical\": [";
  for (size_t i = 0; i < layout.canonical.size(); ++i) {
    const CanonicalTensor& c = layout.canonical[i];
    OJson cj = OJson::object();
    cj["name"] = c.name;
    cj["dtype"] = c.dtype;
    cj["shape"] = c.shape;
    if (!c.scale.empty() || !c.scale_kind.empty()) {
      cj["scale"] = c.scale;
      cj["scale_kind"] = c.scale_kind;
    }
    if (c.block_rows || c.block_cols) cj["block"] = {c.block_rows, c.block_cols};
    out += (i ? ",\n  " : "\n  ") + cj.dump();
  }
  out += "\n],\n\"ranks\": [";
  for (size_t ri = 0; ri < layout.ranks.size(); ++ri) {
    const RankLayout& r = layout.ranks[ri];
    out += std::string(ri ? ",\n" : "\n") + " {\"rank\": " + std::to_string(r.rank) +
           ", \"tensors\": [";
    for (size_t ti = 0; ti < r.tensors.size(); ++ti) {
      const LocalTensor& t = r.tensors[ti];
      OJson tj = OJson::object();
      tj["name"] = t.name;
      tj["dtype"] = t.dtype;
      tj["shape"] = t.shape;
      std::string head = tj.dump();
      head.pop_back();  // the closing brace
      out += std::string(ti ? ",\n" : "\n") + "  " + head + ", \"pieces\": [";
      for (size_t pi = 0; pi < t.pieces.size(); ++pi) {
        const Piece& p = t.pieces[pi];
        OJson pj = OJson::object();
        pj["canonical"] = p.canonical;
        pj["rows"] = p.rows;
        pj["cols"] = p.cols;
        pj["local"] = {p.local_offset, p.local_row_stride, p.local_col_stride};
        pj["canon"] = {p.canon_offset, p.canon_row_stride, p.canon_col_stride};
        out += std::string(pi ? ",\n" : "\n") + "    " + pj.dump();
      }
      out += "]}";
    }
    out += "]}";
  }
  out += "\n]}\n";
  return out;
}

}  // namespace refit::layout
