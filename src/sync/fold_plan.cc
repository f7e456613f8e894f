#include "sync/fold_plan.h"

#include <map>
#include <string>
#include <utility>

#include "sync/chunk_check.h"

namespace refit::internal {

Status CheckFoldManifest(const Announcement& a, const Manifest& m) {
  bool same = ManifestMatches(a, m);
  for (size_t i = 0; same && i < m.chunks.size(); ++i) {
    const ManifestChunk& mc = m.chunks[i];
    same = RangeInside(a.tensors, mc.tensor_id, mc.start, mc.count);
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
  // The chunks of all versions grouped by range, in version order; ranges
  // equal or disjoint across versions (one chunk grid).
  std::map<std::pair<uint64_t, uint64_t>, FoldCell> by_range;  // (tensor, start)
  for (size_t j = 0; j < k; ++j) {
    for (uint64_t i = 0; i < manifests[j].chunks.size(); ++i) {
      const ManifestChunk& mc = manifests[j].chunks[i];
      auto [it, fresh] = by_range.try_emplace(
          {mc.tensor_id, mc.start},
          FoldCell{static_cast<size_t>(mc.tensor_id), mc.start, mc.count, {}});
      if (!fresh && it->second.count != mc.count) return Plan();
      if (!fresh && it->second.chunks.back().position == j) {
        return DataLossError("the manifest of version " + std::to_string(chain[j].version) +
                             " lists one range twice");
      }
      it->second.chunks.push_back({j, i});
    }
  }
  std::vector<FoldCell> cells;
  for (auto& [key, cell] : by_range) {
    if (!cells.empty() && cells.back().tensor == cell.tensor &&
        cells.back().start + cells.back().count > cell.start) {
      return Plan();  // the chunk size changed between versions
    }
    cells.push_back(std::move(cell));
  }
  return Plan(std::move(cells));
}

}  // namespace refit::internal
