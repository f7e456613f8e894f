// The plan of a catch-up by folding (docs/protocol.md, "Catch-up by
// folding", step 1 and the cells of step 3): whether committed versions
// V1..Vk fold, and if so the cells, each one range with its chunks of all
// versions in version order. Pure: no store, no tensors; thread-safe.
#ifndef REFIT_SYNC_FOLD_PLAN_H_
#define REFIT_SYNC_FOLD_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "refit/status.h"
#include "sync/protocol.h"

namespace refit::internal {

// Chunk `chunk` of the chain's version at `position` (0 for V1).
struct FoldRef {
  size_t position = 0;
  uint64_t chunk = 0;
  bool operator==(const FoldRef&) const = default;
};

// One region of one tensor and the chunks of every version that has one
// for it, in version order: the range [start, start + count) in elements,
// or (run != 0, versions published by several ranks) the strided region of
// count / run rows of `run` elements, `stride` apart (docs/format.md §3).
struct FoldCell {
  size_t tensor = 0;
  uint64_t start = 0, count = 0;
  uint64_t run = 0, stride = 0;
  std::vector<FoldRef> chunks;

  // One past the region's last element.
  uint64_t End() const {
    return run == 0 ? start + count : start + (count / run - 1) * stride + run;
  }
};

// Whether regions x and y of one tensor share no element. Exact for
// ranges, for a strided region against a range, and for strided regions of
// one stride (the blocks of one matrix); regions of different strides whose
// spans overlap are reported as sharing (not proven disjoint).
bool RegionsDisjoint(const FoldCell& x, const FoldCell& y);

// DATA_LOSS ("the manifest of version V does not match its announcement")
// unless `m` carries `a`'s base, members and tensor table
// (ManifestMatches) and every chunk entry names a non-empty region inside
// the announced tensors.
Status CheckFoldManifest(const Announcement& a, const Manifest& m);

// Plans the fold of `chain` (V1..Vk, ascending) with `manifests`
// (manifests[j] is chain[j]'s). Returns the cells in tensor and range
// order, or nullopt when the chain does not fold:
//   1. a version's tensor table differs from V1's (name, dtype, width,
//      shape), or a version does not start where the previous one ended
//      (its base version, or its "before" hashes against the previous
//      manifest's "after" hashes);
//   2. chunk regions of one tensor share elements without being equal
//      (start, count, run and stride): the chunk grid or a rank's layout
//      changed between versions, or (RegionsDisjoint) their disjointness
//      is not proven. Such chains are applied one version at a time, where
//      every region is checked against its hashes alone.
// Errors: INVALID_ARGUMENT when chain is empty or the sizes differ;
// DATA_LOSS when a manifest fails CheckFoldManifest, or (for a chain that
// folds so far) a manifest lists one range twice.
Result<std::optional<std::vector<FoldCell>>> PlanFold(const std::vector<Announcement>& chain,
                                                      const std::vector<Manifest>& manifests);

}  // namespace refit::internal

#endif  // REFIT_SYNC_FOLD_PLAN_H_
