// The GPU delta encoder (trainer side): encodes the difference of device
// tensors against device baselines into chunks whose bytes are identical to
// the CPU encoder's (src/delta/encoder.cc EncodeChunkRange, docs/format.md
// §3-§5), so receivers and tools cannot tell them apart.
//
// Per group of chunk ranges (ranges as DiffTensorsToSink cuts them):
//   1. GPU: per 64 KiB segment, XXH3-128 of the old and new bytes (the
//      range hashes' segment digests) and the count of changed elements.
//   2. GPU: compaction of the changed elements into (position, XOR value)
//      records; per chunk, byte-plane histograms and the largest gap.
//   3. CPU: the small histograms come back and the CPU encoder's own
//      functions choose gap width and models (codec::ChooseModel) and write
//      the model descriptions.
//   4. GPU: one thread per rANS lane encodes the lane's records in reverse
//      (as codec::EncodeStream does), then one block per chunk gathers the
//      lanes into the stream bytes, which come back to the host for framing
//      (SerializeChunk); a group's framing runs on the host while the next
//      group goes through steps 2-4.
// Chunks where the CPU encoder would also try dense encodings (at least
// 1/16 of the range changed) are encoded on the CPU from copied-back ranges,
// so every chunk matches. Only XOR encodings are produced (allow_xor).
//
// Device memory beyond the tensors: per-segment digests and counts, plus
// staging for one group of records, bounded by GpuEncodeOptions::
// staging_bytes (a single chunk larger than that still gets its own group),
// kept across the groups of a call. Host memory: page-locked buffers for
// the histograms and streams that come back, kept per calling thread
// across calls (page-locking is too slow to repeat per call).
// Not thread-safe; one call at a time per device.
#ifndef REFIT_CUDA_ENCODER_H_
#define REFIT_CUDA_ENCODER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "delta/chunk.h"
#include "refit/status.h"

namespace refit::cuda {

struct DeviceTensorPair {
  // The baseline: a device address, or page-locked host memory
  // (cudaMallocHost, or cudaHostRegister'ed) when device memory is short,
  // which the kernels then read in place over the bus (no staging copy).
  const void* old_data = nullptr;
  const void* new_data = nullptr;  // device address of the new values
  uint64_t elements = 0;
  int width = 0;                   // 1, 2, 4 or 8
  uint64_t tensor_id = 0;          // goes into the chunk header
};

struct GpuEncodeOptions {
  uint64_t version = 0;       // chunk header ids, as ChunkHeader
  uint64_t base_version = 0;
  uint64_t chunk_bytes = uint64_t{8} << 20;  // multiple of 64 KiB
  uint32_t records_per_lane = 1024;          // the CPU encoder's default
  uint64_t staging_bytes = uint64_t{256} << 20;
  int host_threads = 0;  // model choice and framing (0: default)
  int device = 0;
};

struct GpuEncodedChunk {
  uint32_t pair = 0;          // index into the pairs argument
  ChunkHeader header;
  std::vector<uint8_t> bytes;  // the serialized chunk
};

struct GpuEncodeReport {
  uint64_t chunk_ranges = 0;     // ranges examined
  uint64_t chunks = 0;           // changed ranges (chunks produced)
  uint64_t cpu_chunks = 0;       // of which encoded on the CPU (dense-prone)
  uint64_t changed_elements = 0;
  uint64_t chunk_bytes = 0;      // bytes of all chunks
  uint64_t groups = 0;
  uint64_t peak_device_bytes = 0;  // device memory this call allocated
  double seconds = 0;
  double detect_ms = 0;          // step 1 (GPU events)
  // Wall time of the per-group steps, summed over groups (host clock, each
  // up to the synchronization that ends it).
  double cpu_fallback_ms = 0;    // dense-prone ranges copied back and encoded
  double compact_ms = 0;         // step 2 and its copy back
  double models_ms = 0;          // step 3
  double encode_ms = 0;          // step 4a-b and the stream sizes back
  double gather_ms = 0;          // step 4c and the streams back
  double frame_ms = 0;           // chunk framing on the host (runs while
                                 // the next group goes through the GPU)
};

// Encodes every changed chunk range of every pair, in pair then range
// order, into *out (unchanged ranges produce nothing). Requires valid
// widths, non-null device pointers for non-empty pairs, and chunk_bytes a
// positive multiple of 64 KiB.
Result<GpuEncodeReport> EncodeOnDevice(std::span<const DeviceTensorPair> pairs,
                                       const GpuEncodeOptions& options,
                                       std::vector<GpuEncodedChunk>* out);

}  // namespace refit::cuda

#endif  // REFIT_CUDA_ENCODER_H_
