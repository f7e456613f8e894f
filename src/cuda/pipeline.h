// The GPU receiver: applies delta chunks to tensors resident in device
// memory, placed by a PlacementPlan (placement.h).
//
// Flow (docs/format.md §3 "Apply rule", per chunk):
//   Prepare   (CPU, before the pause) parses and checksums every chunk,
//             reads its models and lane framing, decodes dense chunks
//             that have a zstd plane (the GPU decodes the others), and
//             cuts batches that fit the staging budget.
//   Classify  (GPU, optional, before the pause) hashes each chunk's range:
//             "before", "after" (already applied: skipped) or neither
//             (refused: Apply writes nothing).
//   Stage     (optional, before the pause) copies every batch (payload,
//             CPU-decoded dense bytes, metadata) into a device region of
//             its own, with its own scratch; MapConditional then decodes
//             its conditional XOR chunks against the base into XOR records
//             there.
//   Apply     (GPU, the pause) per batch: the payload is copied on a copy
//             stream into one of up to 8 staging slots, and the batch is
//             decoded and applied on that slot's compute stream as soon as
//             its bytes are in, while later batches are copied and earlier
//             ones still run; then each applied range is re-hashed and, if
//             it is not "after", the chunk's stores are undone. A staged
//             delta's batches are all launched at once, on up to 16
//             streams, with no copy and no host wait between them.
//
// Guarantee: every chunk's range ends either untouched or exactly "after"
// (at most once). Chunks are independent: a corrupt chunk is refused and
// reported while the others apply; callers that need all-or-nothing undo
// the XOR chunks by applying them again, except conditional XOR chunks
// (kind 5), which decode only against their base: save their ranges
// before (DeviceTarget does). Range hashes need the range stored
// contiguously on this GPU; shards and interleaved layouts must run with
// verify = false (their canonical bytes are not all here).
//
// Conditional XOR chunks (docs/format.md §4.3) are decoded on the device
// against the range as it is when their batch runs (conditional_apply.cu);
// they need their span stored contiguously on this GPU, and Prepare
// refuses one that shares elements with another chunk of the same apply
// (the batches run in no set order): apply a fold's versions one Apply
// after another.
//
// Device memory: one staging arena of ReceiverOptions::staging_bytes,
// allocated at the first Classify or Apply and split into payload, metadata
// and scratch slots (digests, and decoded
// records and undo bytes of non-XOR chunks; sparse XOR chunks are decoded
// straight into the weights), plus the plan's small arrays and one status
// word per chunk; host memory: pinned metadata slots. The engine's own
// buffers (KV cache) are never touched. A Receiver is single-caller.
// Batches run concurrently on different streams; they hold different chunks,
// whose ranges do not overlap.
#ifndef REFIT_CUDA_PIPELINE_H_
#define REFIT_CUDA_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/hash.h"
#include "cuda/batch.h"
#include "cuda/placement.h"
#include "refit/status.h"

namespace refit::cuda {

struct ReceiverOptions {
  uint64_t staging_bytes = uint64_t{256} << 20;
  bool verify = true;    // check "after" on the device (needs contiguity)
  int host_threads = 0;  // Prepare's parsing threads (0: default)
  int device = 0;        // CUDA device ordinal
};

struct GpuApplyReport {
  uint64_t chunks = 0;           // chunks prepared for this GPU
  uint64_t chunks_applied = 0;
  uint64_t chunks_skipped = 0;   // already "after" (Classify)
  uint64_t chunks_not_here = 0;  // no element placed on this GPU
  uint64_t records = 0;          // sparse records decoded
  uint64_t batches = 0;
  uint64_t payload_bytes = 0;    // bytes copied host -> device
  uint64_t device_bytes = 0;     // staging and status memory held
  double seconds = 0;            // wall time of Apply
  double kernel_ms = 0;          // GPU span (events): the first batch's
                                 // kernels start to the last one's end
  double decode_ms = 0;          // decode + apply kernels, summed over
                                 // batches (they overlap: >= the span's share)
  double verify_ms = 0;          // verification kernels, summed likewise
};

// A prepared delta's batches resident in device memory (Receiver::Stage).
// Belongs to the Receiver that staged it and the PreparedDelta it was
// staged from; holds its device memory until destroyed.
class StagedDelta {
 public:
  ~StagedDelta();
  StagedDelta(const StagedDelta&) = delete;
  StagedDelta& operator=(const StagedDelta&) = delete;
  uint64_t bytes() const;  // device memory held

 private:
  friend class Receiver;
  struct Impl;
  explicit StagedDelta(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Receiver {
 public:
  // `tensor_names` is the delta's tensor table (a chunk's tensor_id indexes
  // it). Pointers in `plan` are device addresses on options.device.
  static Result<std::unique_ptr<Receiver>> Create(
      PlacementPlan plan, std::vector<std::string> tensor_names,
      const ReceiverOptions& options);
  ~Receiver();
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  // Places the next deltas through `plan` instead (its streams, arena and
  // buffers are kept): for one receiver applying to one group of tensors
  // after another. Waits for the work in flight first; deltas prepared or
  // staged through the old plan must not be applied after it.
  Status SetPlan(PlacementPlan plan);

  // CPU side. `payload` holds the chunks (docs/format.md §3) at `chunks`;
  // for copies that overlap with kernels it should be pinned
  // (cudaHostAlloc / cudaHostRegister). It must stay unchanged until
  // Apply returns. Classify and Apply may be given a device copy of the
  // same bytes instead (the payload already staged in device memory).
  Result<PreparedDelta> Prepare(std::span<const uint8_t> payload,
                                std::span<const ChunkSpan> chunks);

  // Device range check before applying: per status index, 0 "before",
  // 1 "after", 2 neither, 3 not hashable here.
  Result<std::vector<uint8_t>> Classify(std::span<const uint8_t> payload,
                                        const PreparedDelta& prepared);

  // Applies the prepared chunks. With `states` (from Classify), chunks
  // already "after" are skipped and any chunk in neither state makes Apply
  // refuse before writing. Returns kDataLoss naming the first refused chunk
  // (corrupt payload or wrong "after" hash); the rest are applied.
  Result<GpuApplyReport> Apply(std::span<const uint8_t> payload,
                               const PreparedDelta& prepared,
                               const std::vector<uint8_t>* states = nullptr);

  // Device bytes Stage needs for `prepared`: every batch's payload and
  // dense bytes (padded for the decoders' read-ahead), metadata and
  // scratch, each rounded up to 256 bytes.
  static uint64_t StagedBytes(const PreparedDelta& prepared);

  // Copies every batch of `prepared` (whose chunks lie in `payload`, host
  // or device memory) into device memory, before the pause; returns when
  // the copies are complete.
  Result<std::unique_ptr<StagedDelta>> Stage(std::span<const uint8_t> payload,
                                             const PreparedDelta& prepared);

  // Before the pause, for a staged delta whose ranges hold its base now:
  // decodes its conditional XOR chunks (kind 5) against that base into
  // XOR records in the staged scratch, writing no element, so that the
  // pause only XORs them in as it does sparse XOR chunks. The ranges must
  // not change until the staged delta is applied (a chunk mapped against
  // another base applies wrong records, which the "after" check refuses
  // and undoes). A chunk the decode refuses stays refused: Apply reports it
  // as it would have. Does nothing for a delta without kind-5 chunks;
  // FAILED_PRECONDITION for one already mapped.
  Status MapConditional(StagedDelta& staged, const PreparedDelta& prepared);

  // Undoes, for a staged delta whose conditional chunks were mapped, the
  // mapped chunks that an Apply of it wrote: those with `applied[i]` (by
  // status index) XOR their records in again, with no check. The others,
  // and every other kind, are left alone. Returns when done. Does nothing
  // for a delta without kind-5 chunks (MapConditional mapped nothing).
  Status UndoMapped(const StagedDelta& staged, const PreparedDelta& prepared,
                    const std::vector<bool>& applied);

  // Apply for a delta staged by this receiver's Stage from `prepared`:
  // the same guarantees and report; the batches run concurrently.
  Result<GpuApplyReport> Apply(const StagedDelta& staged,
                               const PreparedDelta& prepared,
                               const std::vector<uint8_t>* states = nullptr);

  // Device memory held now: the plan, the staging arena once a Classify
  // or an Apply through the slots has allocated it, the status words (not
  // StagedDelta regions, which their owners hold).
  uint64_t device_bytes() const;

  // Statuses (ChunkStatus) of the last Apply, by status index.
  const std::vector<uint32_t>& last_status() const { return last_status_; }

 private:
  struct Impl;
  explicit Receiver(std::unique_ptr<Impl> impl);
  // Apply's body: batches from `payload` through the staging slots, or
  // from `staged`.
  Result<GpuApplyReport> Run(std::span<const uint8_t> payload,
                             const StagedDelta::Impl* staged,
                             const PreparedDelta& prepared,
                             const std::vector<uint8_t>* states);
  std::unique_ptr<Impl> impl_;
  std::vector<uint32_t> last_status_;
};

// Range hash (docs/format.md §2) of `len` bytes of device memory; a
// synchronous helper for tests and the pre-pause check of whole tensors.
Result<Hash128> RangeHashDevice(const void* data, uint64_t len);

// Range hashes of several device ranges (e.g. every tensor of a model):
// one launch each on one stream, one scratch buffer, one copy back.
struct DeviceRange {
  const void* data = nullptr;
  uint64_t len = 0;
};
Result<std::vector<Hash128>> RangeHashesDevice(std::span<const DeviceRange> ranges);

// XXH3-128 of spans of one device buffer (tests).
Result<std::vector<Hash128>> HashSpansDevice(const void* data,
                                             std::span<const uint64_t> offsets,
                                             std::span<const uint64_t> lens);

}  // namespace refit::cuda

#endif  // REFIT_CUDA_PIPELINE_H_
