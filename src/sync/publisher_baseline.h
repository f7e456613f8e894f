// The publisher's copy of the committed version (its "baseline"), and how a
// target is diffed against it.
//
// The Publisher (publisher.h) runs the protocol; a PublisherBaseline holds
// the bytes. Two kinds exist:
//   - FileBaseline (below): a checkpoint opened read-write; targets are
//     host tensors; the CPU encoder diffs them; commits patch the file and
//     make it durable.
//   - cuda::DeviceBaseline (src/cuda/device_baseline.h, CUDA builds): the
//     tensors live in device memory (or page-locked host memory); targets
//     are device tensors; the GPU encoder diffs them; commits copy the
//     changed ranges on the device. Nothing of the model crosses the bus
//     except the encoded chunks, the ranges re-sends need, and snapshots.
//
// Contract shared by every implementation:
//   - tensors() lists the baseline's tensors (name, dtype, width, shape) in
//     a fixed order; `data` is an address in the implementation's own
//     memory kind (callers never dereference it).
//   - Targets passed to Diff, HashTarget, ReadTarget and Advance hold the
//     same tensors, their data in the memory kind the implementation
//     takes (targets_on_device()).
//   - Diff behaves as DiffTensorsToSink(baseline, target): chunks in
//     tensor-table order (tensors sorted by name) then by start, the
//     table's before/after hashes filled in, then sink->Finish.
// Not thread-safe.
#ifndef REFIT_SYNC_PUBLISHER_BASELINE_H_
#define REFIT_SYNC_PUBLISHER_BASELINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/hash.h"
#include "delta/delta_file.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "refit/status.h"
#include "sync/protocol.h"

namespace refit {

// Bytes of a tensor: width times the product of its shape.
uint64_t TensorBytes(const TensorView& t);

class PublisherBaseline {
 public:
  virtual ~PublisherBaseline() = default;

  virtual const std::vector<TensorView>& tensors() const = 0;
  // Names the baseline in messages, e.g. "the baseline 'model.safetensors'".
  virtual std::string Describe() const = 0;
  // Whether targets' data are device addresses (else host memory).
  virtual bool targets_on_device() const = 0;

  // Range hash (docs/format.md §2) of baseline tensor `i`, or of a target
  // tensor's bytes.
  virtual Result<Hash128> HashTensor(size_t i) = 0;
  virtual Result<Hash128> HashTarget(const TensorView& target) = 0;

  virtual Result<DiffReport> Diff(const std::vector<TensorView>& target,
                                  const DiffOptions& options, ChunkSink* sink) = 0;

  // Copies `bytes` bytes from byte `offset` of baseline tensor `i`, or of
  // a target tensor, into host memory at `out`.
  virtual Status Read(size_t i, uint64_t offset, uint64_t bytes, uint8_t* out) = 0;
  virtual Status ReadTarget(const TensorView& target, uint64_t offset, uint64_t bytes,
                            uint8_t* out) = 0;

  // Makes the baseline hold `target` where `m`'s chunks changed it, then
  // checks every tensor against `m`'s after hashes (kDataLoss if one
  // differs). Durable when the implementation is (file baselines sync).
  virtual Status Advance(const Manifest& m, const std::vector<TensorView>& target) = 0;

  // The files of a snapshot of the baseline (docs/protocol.md, "Snapshots
  // and retention"), handed to `put` one at a time, in order: a name
  // relative to the checkpoint and the file's bytes (valid during the
  // call).
  using SnapshotFileFn =
      std::function<Status(const std::string& name, std::span<const uint8_t> bytes)>;
  virtual Status ForEachSnapshotFile(const SnapshotFileFn& put) = 0;
};

// A checkpoint file or directory, opened read-write.
class FileBaseline final : public PublisherBaseline {
 public:
  static Result<std::unique_ptr<FileBaseline>> Open(const std::string& path);

  const std::vector<TensorView>& tensors() const override { return views_; }
  std::string Describe() const override;
  bool targets_on_device() const override { return false; }
  Result<Hash128> HashTensor(size_t i) override;
  Result<Hash128> HashTarget(const TensorView& target) override;
  Result<DiffReport> Diff(const std::vector<TensorView>& target, const DiffOptions& options,
                          ChunkSink* sink) override;
  Status Read(size_t i, uint64_t offset, uint64_t bytes, uint8_t* out) override;
  Status ReadTarget(const TensorView& target, uint64_t offset, uint64_t bytes,
                    uint8_t* out) override;
  Status Advance(const Manifest& m, const std::vector<TensorView>& target) override;
  Status ForEachSnapshotFile(const SnapshotFileFn& put) override;

 private:
  explicit FileBaseline(Checkpoint ckpt);
  Checkpoint ckpt_;
  std::vector<TensorView> views_;
};

}  // namespace refit

#endif  // REFIT_SYNC_PUBLISHER_BASELINE_H_
