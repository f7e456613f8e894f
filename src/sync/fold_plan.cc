#include "sync/fold_plan.h"

#include <map>
#include <string>
#include <utility>

#include "sync/chunk_check.h"

namespace refit::internal {
namespace {

// Rows [r0, r1) by columns [c0, c1) of a tensor seen as rows of s elements.
struct Rect {
  uint64_t r0, r1, c0, c1;
};

// Region x as rectangles of rows of s elements; s is x's stride when x is
// strided. A strided row that crosses a multiple of s splits in two.
void AddRects(const FoldCell& x, uint64_t s, std::vector<Rect>* out) {
  if (x.run != 0) {
    const uint64_t rows = x.count / x.run, q = x.start / s, o = x.start % s;
    if (o + x.run <= s) {
      out->push_back({q, q + rows, o, o + x.run});
    } else {
      out->push_back({q, q + rows, o, s});
      out->push_back({q + 1, q + 1 + rows, 0, o + x.run - s});
    }
    return;
  }
  const uint64_t end = x.start + x.count;
  const uint64_t qa = x.start / s, oa = x.start % s, qb = end / s, ob = end % s;
  if (qa == qb) {
    out->push_back({qa, qa + 1, oa, ob});
    return;
  }
  out->push_back({qa, qa + 1, oa, s});
  if (qb > qa + 1) out->push_back({qa + 1, qb, 0, s});
  if (ob > 0) out->push_back({qb, qb + 1, 0, ob});
}

}  // namespace

bool RegionsDisjoint(const FoldCell& x, const FoldCell& y) {
  if (x.End() <= y.start || y.End() <= x.start) return true;
  if (x.run == 0 && y.run == 0) return false;
  if (x.run != 0 && y.run != 0 && x.stride != y.stride) return false;
  const uint64_t s = x.run != 0 ? x.stride : y.stride;
  std::vector<Rect> a, b;
  AddRects(x, s, &a);
  AddRects(y, s, &b);
  for (const Rect& p : a) {
    for (const Rect& q : b) {
      if (p.r0 < q.r1 && q.r0 < p.r1 && p.c0 < q.c1 && q.c0 < p.c1) return false;
    }
  }
  return true;
}

Status CheckFoldManifest(const Announcement& a, const Manifest& m) {
  bool same = ManifestMatches(a, m);
  for (size_t i = 0; same && i < m.chunks.size(); ++i) {
    const ManifestChunk& mc = m.chunks[i];
    const FoldCell region{0, mc.start, mc.count, mc.run, mc.stride, {}};
    same = (mc.run == 0 || (mc.count % mc.run == 0 && mc.stride > mc.run)) &&
           RangeInside(a.tensors, mc.tensor_id, mc.start, region.End() - mc.start);
  }
  if (!same) {
    return DataLossError("the manifest of version " + std::to_string(a.version) +
                         " does not match its announcement");
  }
  return Status();
}

Result<std::optional<std::vector<FoldCell>>> PlanFold(const std::vector<Announcement>& chain,
                                                      const std::vector<Manifest>& manifests) {
  using Plan = std::optional<std::vector<FoldCell>>;
  const size_t k = chain.size();
  if (k == 0 || manifests.size() != k) {
    return InvalidArgumentError("a fold plan needs one manifest per version of a chain");
  }
  for (size_t j = 0; j < k; ++j) REFIT_RETURN_IF_ERROR(CheckFoldManifest(chain[j], manifests[j]));
  const Announcement& first = chain.front();
  const size_t tensors = first.tensors.size();
  // One tensor table throughout, each version starting where the previous
  // one ended.
  for (size_t j = 1; j < k; ++j) {
    const Announcement& a = chain[j];
    if (a.base_version != chain[j - 1].version || a.tensors.size() != tensors) return Plan();
    for (size_t t = 0; t < tensors; ++t) {
      if (!SameTensor(a.tensors[t], first.tensors[t]) ||
          a.tensors[t].before != manifests[j - 1].tensors[t].after) {
        return Plan();
      }
    }
  }
  // The chunks of all versions grouped by region, in version order;
  // regions equal or disjoint across versions (one chunk grid, one
  // layout).
  std::map<std::pair<uint64_t, uint64_t>, FoldCell> by_range;  // (tensor, start)
  for (size_t j = 0; j < k; ++j) {
    for (uint64_t i = 0; i < manifests[j].chunks.size(); ++i) {
      const ManifestChunk& mc = manifests[j].chunks[i];
      const uint64_t stride = mc.run != 0 ? mc.stride : 0;
      auto [it, fresh] = by_range.try_emplace(
          {mc.tensor_id, mc.start},
          FoldCell{static_cast<size_t>(mc.tensor_id), mc.start, mc.count, mc.run, stride, {}});
      const FoldCell& cell = it->second;
      if (!fresh && (cell.count != mc.count || cell.run != mc.run || cell.stride != stride)) {
        return Plan();
      }
      if (!fresh && it->second.chunks.back().position == j) {
        return DataLossError("the manifest of version " + std::to_string(chain[j].version) +
                             " lists one range twice");
      }
      it->second.chunks.push_back({j, i});
    }
  }
  // Cells in (tensor, start) order; each is checked against the earlier
  // cells of its tensor whose span reaches past its start (interleaved
  // strided regions: the other ranks' blocks of the same rows).
  std::vector<FoldCell> cells;
  std::vector<size_t> open;  // indices into `cells`
  for (auto& [key, cell] : by_range) {
    if (!cells.empty() && cells.back().tensor != cell.tensor) open.clear();
    std::erase_if(open, [&](size_t q) { return cells[q].End() <= cell.start; });
    for (size_t q : open) {
      if (!RegionsDisjoint(cells[q], cell)) return Plan();
    }
    open.push_back(cells.size());
    cells.push_back(std::move(cell));
  }
  return Plan(std::move(cells));
}

}  // namespace refit::internal
