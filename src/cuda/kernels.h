// Launchers for the receiver kernels (decode_apply.cu) and the device range
// hash (range_hash.cu). Internal to src/cuda: pipeline.cc is the caller.
//
// Every launcher enqueues work on `stream` and returns the launch error;
// the kernels report per-chunk outcomes in BatchDevice::status (ChunkStatus,
// indexed by DevChunk::status_index), never by failing the launch.
#ifndef REFIT_CUDA_KERNELS_H_
#define REFIT_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/batch.h"
#include "cuda/placement.h"

namespace refit::cuda::internal {

// Device pointers of one batch (the meta slot holds chunks, tables, lanes).
struct BatchDevice {
  const DevChunk* chunks = nullptr;
  uint32_t num_chunks = 0;
  const DevTable* tables = nullptr;
  const uint32_t* lanes = nullptr;
  const uint8_t* payload = nullptr;  // chunk bytes, then decoded dense bytes
  uint8_t* scratch = nullptr;
  const DevicePlacement* placements = nullptr;
  const DevicePiece* pieces = nullptr;
  uint32_t* status = nullptr;
  uint32_t smem = 0;  // dynamic shared memory for the decode kernels
  uint32_t fused_lanes = 0;    // lanes of the widest fused chunk (0: none)
  uint32_t unfused = 0;        // chunks for kernels A and B (0: skip them)
  uint32_t regions = 0;        // strided regions among the chunks (0: none)
  uint32_t conditional = 0;    // kind-5 chunks (0: skip their kernels)
  // The kind-5 chunks were mapped against the base the GPU holds
  // (LaunchConditionalMap): their records only need XORing in.
  uint32_t conditional_mapped = 0;
  const DevDensePlane* planes = nullptr;  // dense planes decoded on the GPU
  uint32_t num_planes = 0;
};

// Bytes a payload slot must hold past its batch's last byte: the decoders
// read lanes through aligned words loaded ahead of the read position
// (decode_apply.cu, LaneRing and FusedLane).
inline constexpr uint64_t kPayloadPad = 64;

// Largest dynamic shared memory the decode kernel accepts (per block).
inline constexpr uint32_t kMaxDecodeSmem = 96 * 1024;

// Sparse XOR chunks (DevChunk::fused): one kernel decodes, checks and
// applies them (one block per chunk, one thread per rANS lane; the lanes
// decode a few rows of records into registers, then one exchange turns
// their gaps into positions); a group of rows is scattered only once all
// its checks passed, and a chunk found corrupt is put back before its
// status is set, so its range ends untouched.
// Other sparse chunks, kernel A: decodes their lanes (one block per chunk,
// one thread per rANS lane) into gaps and values in scratch and checks the
// payload (lane framing and ends, positions < n, zero XOR values), setting
// the chunk's status on failure; writes nothing outside scratch.
// Dense planes (DevDensePlane): one block per plane writes byte j of each
// element of its chunk's decoded staging (constant, verbatim, or rANS lanes
// checked as the codec checks them, one thread per lane); a bad lane sets
// the chunk's status, so kernel B leaves its range alone.
// Conditional XOR chunks (kind 5, DevChunk::conditional), when the batch
// has any (conditional_apply.cu): decode each against its base in device
// memory, checking the payload as the codec does (class counts, lanes,
// ranks, zero differences) and setting the chunk's status on failure, then
// apply those still kStatusOk, leaving their records (positions, XOR
// values) in scratch for the "after" check's undo; kernels A and B leave
// them alone.
// Mapped conditional chunks (BatchDevice::conditional_mapped): their
// records are XORed in, nothing is decoded.
cudaError_t LaunchDecode(const BatchDevice& b, cudaStream_t stream);
cudaError_t LaunchConditional(const BatchDevice& b, cudaStream_t stream);

// Before the pause: decodes the batch's conditional XOR chunks against the
// base the GPU holds now, checking them as LaunchConditional does, and
// leaves their records (positions, XOR values) in scratch without writing
// an element. The batch must then be applied to this same base, with
// conditional_mapped set.
cudaError_t LaunchConditionalMap(const BatchDevice& b, cudaStream_t stream);

// Kernel B: for non-fused chunks still kStatusOk, turns gaps into positions (block
// scan per chunk) and applies the records through the placement, one
// thread per 8 consecutive records (XOR, or overwrite saving the replaced
// bytes for undo); dense chunks are applied from their CPU-decoded bytes.
// Chunks whose status is not kStatusOk are left alone.
cudaError_t LaunchApply(const BatchDevice& b, cudaStream_t stream);

// Hashes each applied chunk's range (64 KiB segment digests, then the
// digest of digests) and compares it with "after"; a mismatch undoes the
// chunk's stores (fused chunks: by decoding and XORing them again) and sets
// kStatusAfterMismatch. Chunks without a
// contiguous range (range_address == 0) are not checked.
cudaError_t LaunchVerifyAfter(const BatchDevice& b, cudaStream_t stream);

// The pre-apply check: state[status_index] = 0 when the range hashes to
// "before", 1 to "after", 2 to neither, 3 when it cannot be hashed here.
cudaError_t LaunchClassify(const BatchDevice& b, uint8_t* state,
                           cudaStream_t stream);

// XXH3-128 of n byte spans of `data` (offsets[i], lens[i]; device arrays),
// one warp each, into out[2 * i] (low half) and out[2 * i + 1] (high half).
cudaError_t LaunchHashSpans(const uint8_t* data, const uint64_t* offsets,
                            const uint64_t* lens, uint32_t n, uint64_t* out,
                            cudaStream_t stream);

// Range hash (docs/format.md §2) of `len` bytes at `data` (device), using
// `digests` (device, 16 * max(1, ceil(len / 64 KiB)) bytes) and writing the
// two halves to out[0], out[1] (device).
cudaError_t LaunchRangeHash(const uint8_t* data, uint64_t len,
                            uint8_t* digests, uint64_t* out,
                            cudaStream_t stream);

}  // namespace refit::cuda::internal

#endif  // REFIT_CUDA_KERNELS_H_
