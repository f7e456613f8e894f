// The tensors a receiver applies a version (or a fold) to, and what it
// knows of their hashes (docs/protocol.md, "Receiver", "Hashing").
//
// BoundTensors maps a version's tensor table onto a checkpoint (opened
// read-write and memory-mapped) or onto the caller's in-memory tensors.
// Digests keeps each tensor's 64 KiB segment digests, hashed once, so a
// chunk's "before" range hash composes from them, and whether a tensor is
// covered (its final check needs no re-read). BaseCheck is the one check
// of the base per step. Flusher starts the kernel's write-back of applied
// ranges while later chunks are applied.
//
// Ownership: BoundTensors owns the mapping (when a checkpoint); Digests,
// BaseCheck and Flusher refer to a BoundTensors that must outlive them.
// Thread-safety: none, except that workers may write the bound bytes of
// distinct ranges while the stepping thread uses these objects for other
// ranges (the ApplyPool's contract); Flusher::Add may be called while its
// own thread runs.
#ifndef REFIT_SYNC_BOUND_TENSORS_H_
#define REFIT_SYNC_BOUND_TENSORS_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/hash.h"
#include "delta/delta_file.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "refit/status.h"

namespace refit::internal {

// The tensors a version is applied to: a checkpoint's mapped tensors or
// the caller's memory, in the order of the version's tensor table.
struct BoundTensors {
  std::optional<Checkpoint> ckpt;
  std::vector<uint8_t*> data;
  std::vector<uint64_t> bytes;
  std::vector<size_t> ckpt_index;  // table id -> checkpoint tensor index

  Status SyncRange(size_t t, uint64_t offset, uint64_t length) {
    return ckpt ? ckpt->SyncRange(ckpt_index[t], offset, length) : Status();
  }
  Status Sync() { return ckpt ? ckpt->Sync() : Status(); }
  // The range hash (docs/format.md, "Range hash") of [offset, offset +
  // length) of tensor t, and of all of tensor t, read from the bytes.
  Hash128 Range(size_t t, uint64_t offset, uint64_t length) const {
    return RangeHash(data[t] + offset, length);
  }
  Hash128 Tensor(size_t t) const { return RangeHash(data[t], bytes[t]); }
};

// Binds `table` (the tensor table of `version`, which names it in errors)
// to the checkpoint at `checkpoint` when it is not empty, else to
// `tensors`. Every table entry must be there with its name, dtype, width
// and shape, and nothing else (FAILED_PRECONDITION otherwise: it is not
// this model); errors of opening the checkpoint pass through.
Result<BoundTensors> BindTensors(const std::string& checkpoint,
                                 const std::vector<MutableTensorView>& tensors,
                                 const std::vector<TensorEntry>& table, uint64_t version);

// Segment digests (64 KiB, docs/format.md "Range hash") of a version's
// base, hashed once per tensor, so a chunk's "before" range hash composes
// from them without reading the range again, and what is known of each
// tensor, so that the check of every tensor against the manifest reads
// only the tensors that need it (docs/protocol.md, "Hashing").
class Digests {
 public:
  // `threads` hash a tensor's segments side by side (1: the caller alone).
  explicit Digests(size_t tensors, int threads = 1)
      : digests_(tensors),
        known_(tensors),
        stale_(tensors),
        covered_(tensors),
        threads_(threads) {}

  // Hashes tensor t's segments (once), unless Seed gave them. Returns the
  // tensor's hash.
  Hash128 Ensure(const BoundTensors& b, size_t t);
  // Takes `digests` as tensor t's segment digests without reading it (the
  // receiver kept them from the version before, docs/protocol.md
  // "Hashing"). Requires one digest per segment of the tensor.
  void Seed(size_t t, std::vector<Hash128> digests);
  // The range hash of [offset, offset + length) of tensor t: composed from
  // the digests when the range is made of whole segments of the tensor (the
  // last may be the tensor's short tail) none of which was written since
  // they were hashed; otherwise hashed from the bytes.
  Hash128 Range(const BoundTensors& b, size_t t, uint64_t offset, uint64_t length) const;
  // Bytes of tensor t were written: their digests no longer hold.
  void Written(size_t t, uint64_t offset, uint64_t length);
  // The same, where `after` are the digests of the range's segments as
  // written (ApplyChunkInPlace's): they replace the old ones when the range
  // is whole segments of the tensor; otherwise as Written.
  void Rewritten(const BoundTensors& b, size_t t, uint64_t offset,
                 uint64_t length, std::vector<Hash128>&& after);
  // Hashes again, from the bytes, every segment whose digest no longer
  // holds, and every tensor not hashed yet, segments side by side across
  // all tensors: afterwards Range composes every whole-segment range and
  // Current returns every tensor's digests. For when the bytes are final
  // (a vote's hashes, the digests kept for the next version).
  void Refresh(const BoundTensors& b);
  // Tensor t's segment digests when every one of them is known and holds;
  // empty otherwise.
  std::vector<Hash128> Current(size_t t) const;
  // Covered: tensor t was checked at the base as a whole, and every write
  // since was a chunk whose range then hashed to the chunk's "after".
  void SetCovered(size_t t, bool covered) { covered_[t] = covered; }
  bool covered(size_t t) const { return covered_[t]; }

 private:
  std::vector<std::vector<Hash128>> digests_;
  std::vector<bool> known_;
  std::vector<std::vector<bool>> stale_;
  std::vector<bool> covered_;
  int threads_;
};

// What a checkpoint file looked like when it was flushed: a cheap check
// that nothing wrote it since (a write changes its modification time).
struct FileStamp {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

// The stamps of the checkpoint's files (empty for in-memory tensors);
// a file that cannot be stat'ed gets a zero stamp.
std::vector<FileStamp> StampFiles(const BoundTensors& b);

// Segment digests of the version a receiver activated last, kept for the
// next version's base check (ReceiverOptions::full_base_check_every).
struct KeptDigests {
  uint64_t version = 0;
  std::vector<std::string> names;             // the version's tensor table
  std::vector<std::vector<Hash128>> digests;  // per tensor; empty: not kept
  std::vector<FileStamp> files;               // the checkpoint as flushed
  int reused = 0;  // base checks from kept digests since the last full one
};

// The one check of the base per step: tensors are hashed in order, once,
// before any chunk of them is applied in the step (chunks come in tensor
// order). In a fresh step each must be at the base; it is then covered.
// When resuming, earlier steps may have applied chunks: the tensor is not
// covered, and is checked from its bytes at the end.
class BaseCheck {
 public:
  // `of` names what `base_version` is the base of ("version 7"), for errors.
  BaseCheck(const BoundTensors& b, Digests* digests, const std::vector<TensorEntry>& base,
            bool resume, uint64_t base_version, std::string of)
      : b_(b), digests_(digests), base_(base), resume_(resume),
        of_("version " + std::to_string(base_version) + ", the base of " + std::move(of)) {}

  // Checks tensors [next, upto]. DATA_LOSS when a fresh step finds one
  // off the base.
  Status Through(size_t upto);
  Status All() { return Through(base_.size()); }

 private:
  const BoundTensors& b_;
  Digests* digests_;
  const std::vector<TensorEntry>& base_;
  const bool resume_;
  const std::string of_;
  size_t next_ = 0;
};

// Starts the write-back of applied ranges to the checkpoint's files while
// the next chunks are applied: a thread of its own hands each range to the
// kernel (sync_file_range, SYNC_FILE_RANGE_WRITE: start writing the range's
// dirty pages, do not wait for them), so the durable flush before the vote
// (msync + fsync of everything) finds little left to write, and the apply
// loop never blocks on the disk queue. A hint only: durability comes from
// that flush, and an error here only costs the overlap. Does nothing for
// in-memory tensors.
class Flusher {
 public:
  explicit Flusher(const BoundTensors& b);
  ~Flusher();
  Flusher(const Flusher&) = delete;
  Flusher& operator=(const Flusher&) = delete;

  void Add(size_t t, uint64_t offset, uint64_t length);

 private:
  struct Range {
    int fd;
    uint64_t offset, length;
  };
  void Run();
  const BoundTensors& b_;
  std::vector<int> fds_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Range> queue_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace refit::internal

#endif  // REFIT_SYNC_BOUND_TENSORS_H_
