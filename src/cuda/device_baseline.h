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
//     (the publisher refuses one that does not hash to it), or, with
//     `durable_path`, from that file.
//   - Durable file (`durable_path`): after each commit a background thread
//     writes the baseline to a safetensors file (a temporary file beside
//     it, fsync, rename; metadata "refit_version"), through a page-locked
//     buffer of `durable_buffer_bytes`, never a host copy of the model. It
//     reads the device memory a buffer at a time under a lock that Advance
//     also takes, notes the ranges Advance changes meanwhile and rewrites
//     them before the rename, so the file is always one committed version
//     whole; commits that come faster than a write are coalesced (the file
//     lags, it is never mixed). Publish does not wait for it; the
//     destructor waits for the newest commit to be written.
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
  // The durable baseline file (empty: none). When it exists at Create, the
  // baseline starts from it instead of `initial`'s bytes (its tensors must
  // have `initial`'s names, dtypes and shapes).
  std::string durable_path;
  uint64_t durable_buffer_bytes = uint64_t{64} << 20;
};

// The durable file's state (DeviceBaseline::durable()).
struct DurableState {
  uint64_t loaded_version = 0;   // the file's version Create started from
  bool loaded = false;           // whether Create started from the file
  uint64_t written_version = 0;  // the newest version written (0: none)
  uint64_t writes = 0;           // files written
  double last_write_ms = 0;      // wall time of the last write
  std::string error;             // the last write's error, "" if it worked
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
  DurableState durable() const;
  // Blocks until the newest committed version is in the durable file (or
  // its write failed: the error); OK at once without a durable file.
  Status FlushDurable();

 private:
  class DurableWriter;
  DeviceBaseline() = default;
  Status SetDevice() const;
  Status AdvanceLocked(const Manifest& m, const std::vector<TensorView>& target);

  DeviceBaselineOptions options_;
  void* memory_ = nullptr;
  std::vector<TensorView> views_;
  std::vector<Hash128> hashes_;  // per tensor, kept current by Advance
  DeviceBaselineStats stats_;
  DurableState loaded_;
  std::unique_ptr<DurableWriter> durable_;  // stopped before memory_ is freed
};

}  // namespace refit::cuda

#endif  // REFIT_CUDA_DEVICE_BASELINE_H_
