#include "cuda/layout_placement.h"

#include <string>

namespace refit::cuda {
namespace {

using layout::CanonicalTensor;
using layout::Layout;
using layout::LocalTensor;
using layout::Piece;
using layout::RankLayout;

uint64_t Elements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// Piece `p` of local tensor `t` (at `address`, `local_elements` long) as a
// placement of canonical tensor `c` of `width`-byte elements.
Result<TensorPlacement> PieceToPlacement(const Piece& p, const LocalTensor& t,
                                         const CanonicalTensor& c, int width,
                                         uint64_t address,
                                         uint64_t local_elements) {
  const std::string what = "piece of '" + t.name + "' onto '" + c.name + "'";
  const uint64_t n = Elements(c.shape);
  // Canonical element = offset + r * crs + c * ccs: runs along the piece's
  // columns (ccs == 1) or, transposed, along its rows (crs == 1).
  const bool along_cols = p.canon_col_stride == 1 || p.cols == 1;
  const uint64_t run = along_cols ? p.cols : p.rows;    // canonical run
  const uint64_t count = along_cols ? p.rows : p.cols;  // runs
  uint64_t stride = along_cols ? p.canon_row_stride : p.canon_col_stride;
  if (!along_cols && p.canon_row_stride != 1) {
    return InvalidArgumentError(
        what + ": its canonical side is not a block of rows or columns");
  }
  if (count == 1) stride = n;  // one run: the tensor as one row
  if (stride == 0 || stride < run || n % stride != 0) {
    return InvalidArgumentError(
        what + ": its canonical stride does not tile the tensor");
  }
  TensorPlacement out;
  out.name = c.name;
  out.width = width;
  out.rows = n / stride;
  out.cols = stride;
  out.base = address + p.local_offset * static_cast<uint64_t>(width);
  out.dst_elements = local_elements - p.local_offset;
  const uint64_t a = p.canon_offset / stride, b = p.canon_offset % stride;
  if (b + run > stride || a + count > out.rows) {
    return InvalidArgumentError(what +
                                ": it lies outside the canonical tensor");
  }
  out.row_map = AxisMap::Slice(a, a + count);
  out.col_map = AxisMap::Slice(b, b + run);
  out.row_stride = along_cols ? p.local_row_stride : p.local_col_stride;
  out.col_stride = along_cols ? p.local_col_stride : p.local_row_stride;
  if (count == 1 && out.row_stride == 0) out.row_stride = run;
  return out;
}

}  // namespace

Result<PlacementPlan> PlanFromLayout(
    const layout::Layout& layout, uint32_t rank,
    const std::map<std::string, uint64_t>& local_address,
    const DTypeRegistry& dtypes) {
  const RankLayout* r = nullptr;
  for (const RankLayout& x : layout.ranks) {
    if (x.rank == rank) r = &x;
  }
  if (r == nullptr) {
    return InvalidArgumentError("the layout has no rank " +
                                std::to_string(rank));
  }
  std::map<std::string, const CanonicalTensor*> canonical;
  for (const CanonicalTensor& c : layout.canonical) canonical[c.name] = &c;
  PlacementPlan plan;
  for (const LocalTensor& t : r->tensors) {
    auto at = local_address.find(t.name);
    if (at == local_address.end()) {
      return InvalidArgumentError("local tensor '" + t.name + "' of rank " +
                                  std::to_string(rank) + " was not given");
    }
    for (const Piece& p : t.pieces) {
      auto c = canonical.find(p.canonical);
      if (c == canonical.end()) {
        return InvalidArgumentError("a piece of '" + t.name +
                                    "' names unknown tensor '" + p.canonical +
                                    "'");
      }
      if (c->second->dtype != t.dtype) {
        return InvalidArgumentError(
            "local tensor '" + t.name + "' is " + t.dtype + " but '" +
            p.canonical + "' is " + c->second->dtype +
            "; a receiver applies bits and converts nothing");
      }
      REFIT_ASSIGN_OR_RETURN(int width, dtypes.ElementWidth(t.dtype));
      REFIT_ASSIGN_OR_RETURN(TensorPlacement placement,
                             PieceToPlacement(p, t, *c->second, width,
                                              at->second, Elements(t.shape)));
      REFIT_RETURN_IF_ERROR(plan.Add(std::move(placement)));
    }
  }
  return plan;
}

}  // namespace refit::cuda
