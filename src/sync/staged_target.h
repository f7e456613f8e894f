// StagedTarget: the tensors of a two-phase receiver (docs/protocol.md,
// "Two-phase receivers"), e.g. an inference engine's weights in GPU memory.
//
// A two-phase receiver never writes a tensor while it prepares a version:
// it fetches and checks the version's chunks and hands them to the target,
// which stages them (page-locked host or device memory) and does the CPU
// side of the apply; the engine keeps serving the active version. Only
// Apply() writes: the pause, in which every staged chunk is applied in
// place and each range is checked to its "after" hash. Apply either
// leaves every tensor at the last staged version or restores all of them
// to what they held before it started, and says which.
//
// Implementations: HostStagedTarget (sync/host_staged_target.h) for host
// tensors, and the GPU one (cuda/device_target.h). A target serves one
// receiver, on its stepping thread; not thread-safe.
#ifndef REFIT_SYNC_STAGED_TARGET_H_
#define REFIT_SYNC_STAGED_TARGET_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/hash.h"
#include "delta/delta_file.h"
#include "refit/status.h"

namespace refit {

// Memory a target holds for staging, and its bounds.
struct StagingUsage {
  uint64_t host_bytes = 0;    // page-locked host memory held now
  uint64_t device_bytes = 0;  // device memory held now
  uint64_t host_limit = 0;    // the bounds (options)
  uint64_t device_limit = 0;
  uint64_t staged_payload = 0;  // chunk bytes staged for the next Apply
};

struct StagedApplyReport {
  uint64_t versions = 0;  // versions applied in this pause
  uint64_t chunks = 0;    // chunks applied
  double seconds = 0;     // wall time of the pause
  double kernel_ms = 0;   // device time of the apply kernels (GPU targets)
  double verify_ms = 0;   // of which checking ranges to "after" (summed
                          // over batches, which overlap)
};

class StagedTarget {
 public:
  virtual ~StagedTarget() = default;

  // Every tensor of `table` (a version's tensor table) is held here with
  // its dtype, width and shape. FAILED_PRECONDITION naming the first that
  // is not (it is not this model).
  virtual Status Check(const std::vector<TensorEntry>& table) = 0;

  // The range hash (docs/format.md, "Range hash") of each tensor of
  // `table` as held now; nullopt for a tensor this target cannot hash
  // because it does not hold its canonical bytes contiguously (a shard).
  virtual Result<std::vector<std::optional<Hash128>>> Hashes(
      const std::vector<TensorEntry>& table) = 0;

  // Staging. Begin() drops whatever was staged. Add() stages one chunk
  // (docs/format.md §3, already checked against its version) of the
  // version-th version of this staging (0, 1, ... in the order they are
  // to be applied; each has its tensor table `table`, which must outlive
  // the staging). Seal() does the CPU work of the apply (parsing,
  // batching, copies to the device) so that Apply() is only the pause.
  // RESOURCE_EXHAUSTED when the staging bounds cannot hold the versions.
  virtual Status Begin() = 0;
  virtual Status Add(size_t version, const std::vector<TensorEntry>& table,
                     std::span<const uint8_t> chunk) = 0;
  virtual Status Seal() = 0;
  // Seal() for a direct version, whose HashesAfter() follows: a target
  // may keep what that needs (the GPU target: the payload in device
  // memory).
  virtual Status SealDirect() { return Seal(); }

  // The pause: applies every staged chunk in place, version after version,
  // each range checked to its chunk's "after" hash. On any failure every
  // tensor is restored to what it held before and the error says so; a
  // DATA_LOSS that says the restore failed too leaves the tensors
  // undefined (load them again). Drops the staging either way.
  virtual Result<StagedApplyReport> Apply() = 0;

  // Overwrites tensor `e` with `bytes` (all of it, host memory): a
  // snapshot taken in place of the chain of versions.
  virtual Status Load(const TensorEntry& e, std::span<const uint8_t> bytes) = 0;

  virtual StagingUsage usage() const = 0;

  // Versions published by several trainer ranks (docs/protocol.md,
  // "Versions from many ranks": strided regions, and ready votes that
  // carry every tensor's hash after the version): whether this target
  // applies them.
  virtual bool AppliesDirectVersions() const { return false; }

  // The range hash of every tensor of `table` as Apply() would leave it
  // with what is staged now, computed without writing any tensor (a ready
  // vote on a direct version carries them before anything is applied).
  // Each staged chunk is checked as Apply() checks it (its region at
  // "before", then at "after"; for an XOR chunk, whose records are fixed,
  // reaching "after" proves "before"), so a chunk that would fail the
  // pause fails here, with DATA_LOSS. UNIMPLEMENTED unless
  // AppliesDirectVersions().
  virtual Result<std::vector<Hash128>> HashesAfter(const std::vector<TensorEntry>& table) {
    (void)table;
    return UnimplementedError("this staging target does not apply versions published by "
                              "several trainer ranks");
  }
};

}  // namespace refit

#endif  // REFIT_SYNC_STAGED_TARGET_H_
