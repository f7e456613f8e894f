// DeviceTarget: the tensors of a two-phase receiver in GPU memory
// (sync/staged_target.h; docs/protocol.md, "Two-phase receivers"), e.g. an
// inference engine's weights, applied in place by the GPU receiver
// (pipeline.h) through a PlacementPlan (placement.h), so fused and sharded
// engine parameters take canonical chunks directly.
//
// Staging (before the pause, while the engine serves): chunk bytes are
// gathered in host memory; Seal() parses and batches them (cuda::Receiver
// ::Prepare, on the CPU) and, when every batch fits `device_staging_bytes`,
// stages them in device memory, each batch with its metadata and scratch
// in a region of its own (cuda::Receiver::Stage), so that the pause only
// launches kernels; else it copies the payload into page-locked host memory
// (bounded by `host_staging_bytes`; the pause then includes the copies
// over the bus, through the GPU receiver's slots). Staged in device
// memory, the first version's conditional XOR chunks (kind 5) are decoded
// against the base the GPU holds into XOR records
// (cuda::Receiver::MapConditional), so that the pause only XORs them in,
// and a restore XORs them in again. The ranges of non-XOR chunks and of
// the other conditional XOR chunks (which decode only against their base)
// are saved on the device, for a restore; Seal() saves them, since nothing
// writes the tensors between it and the pause.
//
// The pause (Apply): the versions are applied one after another (one GPU
// apply each, so a later version's conditional chunks decode against their
// ranges as the version before left them), each chunk's range checked on
// the device to its "after" hash (when every placement stores its
// canonical tensor contiguously; see verify in pipeline.h). On any
// failure, the applied chunks are undone (XOR chunks and mapped
// conditional ones by applying their records again, others from their
// saved ranges) and every tensor the target can hash is checked to hold
// its hash from before the pause.
//
// Device memory: the staged payload, the GPU receiver's decode arena
// (`apply_staging_bytes`), the saved ranges; usage()
// reports them. Not thread-safe.
#ifndef REFIT_CUDA_DEVICE_TARGET_H_
#define REFIT_CUDA_DEVICE_TARGET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/placement.h"
#include "delta/delta_file.h"
#include "sync/staged_target.h"

namespace refit::cuda {

struct DeviceTargetOptions {
  int device = 0;
  uint64_t device_staging_bytes = uint64_t{512} << 20;
  uint64_t host_staging_bytes = uint64_t{8} << 30;
  uint64_t apply_staging_bytes = uint64_t{128} << 20;
  int host_threads = 0;
};

// A canonical tensor the target holds (where: the plan's placements).
struct CanonicalTensor {
  std::string name;
  std::string dtype;
  int width = 0;
  std::vector<uint64_t> shape;
};

class DeviceTarget final : public StagedTarget {
 public:
  // Every placement of `plan` must name a tensor of `tensors`, on
  // options.device; every tensor must be placed.
  static Result<std::unique_ptr<DeviceTarget>> Create(
      std::vector<CanonicalTensor> tensors, PlacementPlan plan,
      const DeviceTargetOptions& options);
  ~DeviceTarget() override;
  DeviceTarget(const DeviceTarget&) = delete;
  DeviceTarget& operator=(const DeviceTarget&) = delete;

  Status Check(const std::vector<TensorEntry>& table) override;
  Result<std::vector<std::optional<Hash128>>> Hashes(
      const std::vector<TensorEntry>& table) override;
  Status Begin() override;
  Status Add(size_t version, const std::vector<TensorEntry>& table,
             std::span<const uint8_t> chunk) override;
  Status Seal() override;
  // Seal(), and a device copy of the staged payload kept for HashesAfter
  // when the batches and it fit device_staging_bytes together (so that
  // the payload crosses the bus once).
  Status SealDirect() override;
  Result<StagedApplyReport> Apply() override;
  Status Load(const TensorEntry& e, std::span<const uint8_t> bytes) override;
  // Direct versions (trainer ranks' strided regions): the pause applies
  // them like any version; HashesAfter copies the tensors the staged
  // chunks touch into device memory, in groups of up to
  // device_staging_bytes (at least the largest such tensor), applies the
  // chunks there with the GPU receiver (each checked at "after"; those of
  // the kinds whose "after" does not prove "before", overwrites and
  // conditional XOR, at "before" first) and hashes the copies; untouched
  // contiguous tensors are hashed in place. A refused chunk is named by
  // its tensor and first element.
  bool AppliesDirectVersions() const override { return true; }
  Result<std::vector<Hash128>> HashesAfter(const std::vector<TensorEntry>& table) override;
  StagingUsage usage() const override;

  // Whether chunk ranges are checked on the device (every placement
  // contiguous).
  bool verifies() const;

 private:
  struct Impl;
  explicit DeviceTarget(std::unique_ptr<Impl> impl);
  Status SealVersions(bool keep_raw);
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit::cuda

#endif  // REFIT_CUDA_DEVICE_TARGET_H_
