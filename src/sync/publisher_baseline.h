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

#include "base/file.h"
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

  // Where the last Advance spent its time, for benchmarks; zeros where an
  // implementation does not measure it.
  struct AdvanceStages {
    double apply = 0;  // wall seconds storing the chunks' ranges and checking
    double sync = 0;   // wall seconds making them durable
    uint64_t compared_bytes = 0;  // bytes of the chunks' ranges
    uint64_t stored_bytes = 0;    // of which stored (4 KiB blocks that differed)
  };
  virtual AdvanceStages last_advance() const { return {}; }
  // Whether the last Diff hashed the baseline's bytes (else it took the
  // base's hashes from digests it keeps).
  virtual bool last_diff_hashed_base() const { return true; }

  // The files of a snapshot of the baseline (docs/protocol.md, "Snapshots
  // and retention"), handed to `put` one at a time, in order: a name
  // relative to the checkpoint and the file's bytes (valid during the
  // call).
  using SnapshotFileFn =
      std::function<Status(const std::string& name, std::span<const uint8_t> bytes)>;
  virtual Status ForEachSnapshotFile(const SnapshotFileFn& put) = 0;
};

struct FileBaselineOptions {
  // Kept digests (docs/protocol.md, "Publisher", "The baseline's
  // digests"): the baseline keeps the 64 KiB segment digests of what it
  // holds (hashed from its bytes by HashTensor, which the Publisher calls
  // once when it opens, and kept current by every Advance, which hashes
  // the segments it stores to), and a Diff takes the base's hashes from
  // them instead of hashing the baseline's bytes again, except in every
  // full_check_every-th Diff and whenever the checkpoint's files changed
  // (FileStamp) since the baseline last synced them, which hash the bytes
  // and refuse the version if they are not what the digests say. 1: hash
  // the baseline's bytes in every Diff (as before digests were kept); 0:
  // never again while the files' stamps are unchanged.
  int full_check_every = 16;
  // Threads of Advance; 0: every core.
  int threads = 0;
};

// A checkpoint file or directory, opened read-write.
//
// Advance stores only the 4 KiB blocks of the chunks' ranges that differ
// from the target (a block that holds no change is neither written nor
// dirtied), hashes the 64 KiB segments of those ranges while they are in
// cache, checks every tensor against the manifest (segments outside the
// ranges from the kept digests), then msyncs and fsyncs the checkpoint:
// only the pages it stored to are written back. A crash in the middle
// leaves tensors that hash to neither version, which the next Publisher
// refuses (docs/protocol.md, "Publisher", step 0).
class FileBaseline final : public PublisherBaseline {
 public:
  static Result<std::unique_ptr<FileBaseline>> Open(const std::string& path,
                                                    FileBaselineOptions options = {});

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
  AdvanceStages last_advance() const override { return last_advance_; }
  bool last_diff_hashed_base() const override { return last_diff_hashed_base_; }

 private:
  class ConfirmingSink;
  FileBaseline(Checkpoint ckpt, FileBaselineOptions options);
  std::vector<FileStamp> Stamps() const;
  // Whether every tensor's digests are kept and the files are as stamped.
  bool DigestsCurrent() const;
  // Called by a Diff that hashed the bytes, with its tensor table: whether
  // every "before" hash is what the kept digests compose to.
  bool DigestsMatch(const std::vector<TensorEntry>& tensors) const;

  Checkpoint ckpt_;
  FileBaselineOptions opt_;
  std::vector<TensorView> views_;
  // Per tensor (views_' order), the segment digests of its bytes; empty:
  // not kept.
  std::vector<std::vector<Hash128>> digests_;
  // The checkpoint's files when the digests were last known to match
  // (opened, synced by Advance, or checked by a Diff).
  std::vector<FileStamp> stamps_;
  int reused_ = 0;  // Diffs from kept digests since the bytes were hashed
  bool last_diff_hashed_base_ = true;
  AdvanceStages last_advance_;
};

}  // namespace refit

#endif  // REFIT_SYNC_PUBLISHER_BASELINE_H_
