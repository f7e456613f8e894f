// The trainer side of a version, per rank (docs/trainer.md):
// detect the changes of the canonical elements this rank owns, bit by bit
// against its own baseline, map them to canonical coordinates with the
// layout's affine pieces, and encode them as chunks - without assembling
// any tensor and without talking to other ranks.
//
// Two paths, chosen per owned piece from the layout:
// - direct: the local dtype is the checkpoint's, so the local bits are the
//   checkpoint's bits. A piece whose local block is stored in canonical
//   order is compared in place; others (transposed storage) are gathered
//   one chunk at a time.
// - residual: the local dtype differs (FP32 masters -> BF16, FP32/BF16 ->
//   FP8 E4M3 with a per-tensor or per-block scale, FP32/BF16 -> packed
//   MXFP4 or NVFP4, two logical elements a byte, whose owned runs must be
//   whole scale blocks). The owned fragment is converted, one chunk at a
//   time, and compared with the canonical baseline; one scale change can
//   change every element of its block or tensor. The owned scale elements
//   (and NVFP4's global scale) are emitted by the rank that owns their
//   blocks. A per-tensor FP8 scale or NVFP4 global scale is the amax of
//   the whole tensor: a rank that owns only part of such a tensor takes
//   that amax from the caller each version (GlobalAmax), and the owner of
//   the tensor's element 0 emits the scale.
// Either path emits XOR records (the rank holds the exact canonical base
// bits), or overwrite records for residual chunks when asked.
//
// Memory: the baseline holds the owned canonical bytes once (in the
// checkpoint's dtype); Encode adds scratch of a few chunks and keeps the
// encoded chunks until Commit() folds them into the baseline (Abort()
// drops them), so it never holds a second copy of the owned shard.
// Not thread-safe; Encode uses `threads` workers internally.
#ifndef REFIT_TRAINER_RANK_ENCODER_H_
#define REFIT_TRAINER_RANK_ENCODER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "delta/chunk.h"
#include "delta/encoder.h"
#include "layout/layout.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "refit/status.h"

namespace refit {
struct ApplyScratch;  // delta/apply.h
}  // namespace refit

namespace refit::trainer {

struct RankEncoderOptions {
  // Upper bound on one chunk's region bytes (whole canonical rows, or a
  // part of one row that alone exceeds it).
  uint64_t chunk_bytes = uint64_t{8} << 20;
  int threads = 0;
  codec::EncodeOptions codec;
  // Residual chunks as overwrite records instead of XOR.
  bool residual_overwrite = false;
  // Plan only: no host baseline is allocated (SetBaseline*, Encode and
  // Commit are refused). For encoders that keep the baseline elsewhere and
  // follow jobs() (cuda::DeviceRankEncoder).
  bool plan_only = false;
};

struct RankReport {
  uint64_t owned_elements = 0;
  uint64_t owned_bytes = 0;       // canonical bytes owned (the baseline's size)
  uint64_t changed_direct = 0;    // changed canonical elements, direct path
  uint64_t changed_residual = 0;  // changed canonical elements, residual path
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;     // serialized chunk bytes
  uint64_t peak_scratch_bytes = 0;
  double seconds = 0;
};

// The amax (largest magnitude, in FP32) of whole canonical tensors, by the
// quantized tensor's canonical name. A rank that owns only part of a
// per_tensor FP8 or an nvfp4 tensor needs it for each version, since the
// tensor's scale (per_tensor) or global scale (nvfp4) is the amax of every
// owner's elements: the caller computes it, e.g. as an all-reduce MAX of
// each owner's local amax over the owners' process group. Entries for other
// tensors are ignored, so every rank may be given the same map.
using GlobalAmax = std::map<std::string, float>;

// Receives each chunk as it is encoded (from the calling thread, in a
// deterministic order): the serialized chunk and its header. tensor_id is
// the canonical tensor's index in canonical_tensors().
using EmitChunkFn = std::function<Status(std::span<const uint8_t>, const ChunkHeader&)>;

// What a rank publisher (ranks/parts.h) needs of an encoder: RankEncoder
// on the CPU, or cuda::DeviceRankEncoder, which keeps the baseline in
// device memory and encodes local CUDA tensors on the GPU. The contract of
// each call is RankEncoder's, below.
class RankEncoderInterface {
 public:
  virtual ~RankEncoderInterface() = default;
  virtual const std::vector<layout::CanonicalTensor>& canonical_tensors() const = 0;
  virtual uint64_t owned_bytes() const = 0;
  virtual Result<RankReport> Encode(uint64_t version, uint64_t base_version,
                                    const std::vector<TensorView>& local,
                                    const EmitChunkFn& emit, const GlobalAmax& amax) = 0;
  // Without an amax: for ranks that own every such tensor whole.
  Result<RankReport> Encode(uint64_t version, uint64_t base_version,
                            const std::vector<TensorView>& local, const EmitChunkFn& emit) {
    return Encode(version, base_version, local, emit, GlobalAmax{});
  }
  virtual Status Commit() = 0;
  virtual void Abort() = 0;
  virtual size_t pending_chunks() const = 0;
  virtual Result<std::span<const uint8_t>> PendingChunk(size_t index) const = 0;
  virtual Result<std::vector<uint8_t>> PendingRegion(size_t index, bool after) const = 0;
};

// One chunk's worth of the owned regions, as Encode cuts them, in emit
// order: canonical tensor `tensor_id`, region (start, count, run, stride)
// in canonical form (run 0: contiguous), `width`-byte elements, held at
// `base_offset` in the baseline (the owned bytes, gathered in chunk
// order). `in_place`: the local elements are the checkpoint's bits and
// lie consecutively in chunk order from element `local_element` of local
// tensor `local` (an index into local_tensors()), so the chunk is a plain
// range of local memory; the others are gathered or converted.
struct RankJob {
  bool in_place = false;
  uint32_t local = 0;
  uint64_t local_element = 0;
  uint64_t tensor_id = 0;
  uint64_t start = 0, count = 0, run = 0, stride = 0;
  int width = 0;
  uint64_t base_offset = 0;
};

// For encoders (RankEncoderInterface): applies one of the rank's chunks to
// its region held gathered (count * width bytes, in the chunk's element
// order) as a contiguous range; how a baseline advances, and how a region
// at the version is served.
Status ApplyToGatheredRegion(std::span<const uint8_t> chunk, uint8_t* region,
                             ApplyScratch* scratch);
// OUT_OF_RANGE for chunk `index` of a pending version of `pending` chunks.
Status PendingChunkOutOfRange(size_t index, size_t pending);

class RankEncoder final : public RankEncoderInterface {
 public:
  // The layout is validated and ownership assigned here (every rank
  // computes the same ownership from the same layout).
  static Result<std::unique_ptr<RankEncoder>> Create(const layout::Layout& layout,
                                                     uint32_t rank,
                                                     RankEncoderOptions options);
  ~RankEncoder() override;

  // The version's tensor table order: canonical tensors sorted by name.
  const std::vector<layout::CanonicalTensor>& canonical_tensors() const override;
  uint64_t owned_bytes() const override;
  // This rank's local tensors (the layout's order) and the chunk plan.
  const std::vector<layout::LocalTensor>& local_tensors() const;
  std::vector<RankJob> jobs() const;
  // The data of each local tensor the plan reads, by index into
  // local_tensors() (null for the others), once `local` is checked to hold
  // every one of them with the layout's dtype and shape.
  Result<std::vector<const uint8_t*>> LocalData(const std::vector<TensorView>& local) const;

  // Baseline from canonical tensors (a checkpoint at the committed
  // version): reads only the owned regions.
  Status SetBaseline(const std::vector<TensorView>& canonical);
  // Baseline from this rank's local tensors (by local name), converted
  // where the layout says so: for a trainer that starts from its own state.
  // `amax` as for Encode.
  Status SetBaselineFromLocal(const std::vector<TensorView>& local,
                              const GlobalAmax& amax = {});

  // The quantized canonical tensors (sorted by name) that this rank owns
  // only part of and whose scale is the amax of the whole tensor
  // (per_tensor FP8, nvfp4): Encode and SetBaselineFromLocal need their
  // GlobalAmax.
  std::vector<std::string> global_amax_tensors() const;

  // Detect + project + encode the owned regions of `local` (this rank's
  // tensors by local name, in its own layout) against the baseline.
  // `amax` must hold the whole-tensor amax of every tensor of
  // global_amax_tensors() (kInvalidArgument naming the first one missing,
  // or one whose amax is NaN, negative or below that of the rank's own
  // elements); every owner must be given the same value, or the version's
  // scales disagree and the receivers' hashes will not match.
  Result<RankReport> Encode(uint64_t version, uint64_t base_version,
                            const std::vector<TensorView>& local,
                            const EmitChunkFn& emit, const GlobalAmax& amax) override;
  using RankEncoderInterface::Encode;

  // The version encoded last committed: the baseline becomes its bits.
  Status Commit() override;
  // The version encoded last aborted: the baseline stays.
  void Abort() override;

  // Until Commit() or Abort(): the number of chunks the last Encode
  // emitted, and for chunk `index` of them (in emit order) the serialized
  // chunk and its region's canonical bytes (count * width, in the chunk's
  // element order) at the base, or at the encoded version when `after`.
  // What a rank serves as overwrite re-sends of its own regions while its
  // version is undecided (docs/protocol.md, "Versions from many ranks").
  // OUT_OF_RANGE for an index past the pending chunks.
  size_t pending_chunks() const override;
  Result<std::span<const uint8_t>> PendingChunk(size_t index) const override;
  Result<std::vector<uint8_t>> PendingRegion(size_t index, bool after) const override;

 private:
  struct Impl;
  explicit RankEncoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit::trainer

#endif  // REFIT_TRAINER_RANK_ENCODER_H_
