// A publisher baseline in device memory (sync/publisher_baseline.h): the
// trainer publishes straight from its CUDA tensors.
//
// Create copies the initial tensors (device or host addresses) into one
// allocation the baseline owns: device memory, or page-locked host memory
// when `pinned_host` (device memory is short; the encoder's kernels then
// read the baseline over the bus, about 55 GB/s on an H200 host, instead of
// HBM). Targets are device addresses on the same device.
//   - Diff: the GPU encoder (encoder.h, EncodeOnDevice): detection and the
//     sparse encodings on the device; only chunks come to the host. The
//     tensor table's "before" hashes are the baseline's (kept from the last
//     commit), the "after" hashes one pass over the target on the device.
//     XOR chunks only: options.allow_xor must be true.
//   - Advance: device-to-device copies of the committed chunks' ranges, then
//     every changed tensor is hashed on the device against the manifest.
//     Device memory is not durable: a publisher restarted after a crash
//     opens a new baseline from the trainer's weights at the store's head
//     (the publisher refuses one that does not hash to it).
//   - Read / ReadTarget (re-sends) and snapshots copy to host memory; a
//     snapshot is one safetensors file, assembled in host memory.
// Memory: the model's size once (the baseline), plus the encoder's staging
// (GpuEncodeOptions: staging_bytes and mask_bytes, 512 MiB by default).
// Not thread-safe.
#ifndef REFIT_CUDA_DEVICE_BASELINE_H_
#define REFIT_CUDA_DEVICE_BASELINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/encoder.h"
#include "sync/publisher_baseline.h"

namespace refit::cuda {

struct DeviceBaselineOptions {
  int device = 0;
  bool pinned_host = false;  // the baseline in page-locked host memory
  GpuEncodeOptions encode;   // version fields and chunk size come from Diff
};

struct DeviceBaselineStats {
  uint64_t bytes = 0;        // the baseline's allocation
  double last_diff_ms = 0;   // wall time of the last Diff
  double last_hash_ms = 0;   // of which the target's "after" hashes
  double last_advance_ms = 0;
  GpuEncodeReport last_encode;
};

class DeviceBaseline final : public PublisherBaseline {
 public:
  static Result<std::unique_ptr<DeviceBaseline>> Create(const std::vector<TensorView>& initial,
                                                        const DeviceBaselineOptions& options);
  ~DeviceBaseline() override;
  DeviceBaseline(const DeviceBaseline&) = delete;
  DeviceBaseline& operator=(const DeviceBaseline&) = delete;

  const std::vector<TensorView>& tensors() const override { return views_; }
  std::string Describe() const override;
  bool targets_on_device() const override { return true; }
  Result<Hash128> HashTensor(size_t i) override;
  Result<Hash128> HashTarget(const TensorView& target) override;
  Result<DiffReport> Diff(const std::vector<TensorView>& target, const DiffOptions& options,
                          ChunkSink* sink) override;
  Status Read(size_t i, uint64_t offset, uint64_t bytes, uint8_t* out) override;
  Status ReadTarget(const TensorView& target, uint64_t offset, uint64_t bytes,
                    uint8_t* out) override;
  Status Advance(const Manifest& m, const std::vector<TensorView>& target) override;
  Status ForEachSnapshotFile(const SnapshotFileFn& put) override;

  const DeviceBaselineStats& stats() const { return stats_; }

 private:
  DeviceBaseline() = default;
  Status SetDevice() const;

  DeviceBaselineOptions options_;
  void* memory_ = nullptr;
  std::vector<TensorView> views_;
  std::vector<Hash128> hashes_;  // per tensor, kept current by Advance
  DeviceBaselineStats stats_;
};

}  // namespace refit::cuda

#endif  // REFIT_CUDA_DEVICE_BASELINE_H_
