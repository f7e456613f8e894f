// The GPU delta encoder (trainer side): encodes the difference of device
// tensors against device baselines into chunks whose bytes are identical to
// the CPU encoder's (src/delta/encoder.cc EncodeChunkRange, docs/format.md
// §3-§5), so receivers and tools cannot tell them apart.
//
// Per window of chunk ranges (ranges as DiffTensorsToSink cuts them, as
// many as GpuEncodeOptions::mask_bytes of change mask covers):
//   1. GPU: per 64 KiB segment, XXH3-128 of the old and new bytes (the
//      range hashes' segment digests), the count of changed elements and
//      their bit mask, reading each byte of both tensors once. It runs on a
//      low-priority stream of its own as soon as the window before has
//      been detected, behind the other work of the window before.
// Then per group of ranges of the window (records within staging_bytes):
//   2. GPU: compaction of the changed elements into (position, XOR value)
//      records from the mask (only changed elements are read again); per
//      chunk, byte-plane histograms and the largest gap.
//   3. CPU: the small histograms come back and the CPU encoder's own
//      function chooses gap width and models (codec::ChooseSparseModels)
//      and writes the model descriptions, while the GPU compacts the next
//      group and encodes the previous group's lanes.
//   4. GPU: one thread per rANS lane encodes the lane's records in reverse
//      (as codec::EncodeStream does), then one block per chunk gathers the
//      lanes into the stream bytes (during the next group's turn), which
//      come back to the host for framing (SerializeChunkTo, into buffers
//      kept across calls) and the sink during the turn after; a group's
//      framing runs on the host while the groups after it go through the
//      GPU.
// Chunks where the CPU encoder would also try dense encodings (at least
// 1/16 of the range changed) are encoded on the CPU from copied-back ranges,
// so every chunk matches. Only XOR encodings are produced (allow_xor).
//
// Device memory beyond the tensors: per-segment digests and counts, two
// windows' change masks (mask_bytes; one bit per element), and staging for
// groups (two groups' records, one group's lanes: within staging_bytes; a
// single chunk larger than that still gets its own group), kept across the
// groups of a call. Host memory: page-locked buffers for the digests,
// histograms and streams that come back and for each group's uploads (a
// copy from or into pageable memory may wait for its stream), and two
// groups' framed chunks,
// kept per calling thread across calls (page-locking is too slow to repeat
// per call, and fresh pages cost a fault each).
// The host's planning (ranges, windows, groups, models, lane layout) is
// plain C++ in encode_plan.h, tested on CPU-only machines; encode.cu runs
// the device stages.
// Not thread-safe; one call at a time per device.
#ifndef REFIT_CUDA_ENCODER_H_
#define REFIT_CUDA_ENCODER_H_

#include <cstdint>
#include <functional>
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
  // Change masks (one bit per element) of two windows of ranges, half
  // each: a window's detection runs while the window before is encoded.
  uint64_t mask_bytes = uint64_t{256} << 20;
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
  double detect_ms = 0;          // step 1, summed over windows (GPU events)
  // GPU time of the other kernels, summed over groups (events): step 2a,
  // step 2b, step 4a (lane encoding), step 4c (gathering the streams).
  double gpu_compact_ms = 0, gpu_hist_ms = 0, gpu_encode_ms = 0, gpu_gather_ms = 0;
  // Host wall time, summed over groups: the CPU's own steps, and how long
  // the host waited for each GPU step (which overlap one another).
  double cpu_fallback_ms = 0;    // dense-prone ranges copied back and encoded
  double compact_ms = 0;         // waiting for step 2 and the histograms
  double models_ms = 0;          // step 3
  double encode_ms = 0;          // waiting for step 4a-b and the stream sizes
  double gather_ms = 0;          // waiting for step 4c and the streams
  double frame_ms = 0;           // chunk framing and the sink, on their own
                                 // thread (while later groups go through
                                 // the GPU)
};

// What the sink learns of each chunk besides its bytes.
struct GpuChunkInfo {
  uint32_t pair = 0;  // index into the pairs argument
  ChunkHeader header;
};

// Receives every chunk of EncodeOnDevice as soon as its group is framed,
// in pair then range order, one call at a time, on a thread of the
// encoder's (not the caller's). `bytes` is valid only during the call. A
// non-OK status stops the encoding, and EncodeOnDevice returns it.
using GpuChunkSink =
    std::function<Status(const GpuChunkInfo& info, std::span<const uint8_t> bytes)>;

// Encodes every changed chunk range of every pair, in pair then range
// order, into the sink (unchanged ranges produce nothing). Requires valid
// widths, non-null device pointers for non-empty pairs, and chunk_bytes a
// positive multiple of 64 KiB.
Result<GpuEncodeReport> EncodeOnDevice(std::span<const DeviceTensorPair> pairs,
                                       const GpuEncodeOptions& options,
                                       const GpuChunkSink& sink);
// The same, collecting the chunks into *out (replacing its contents).
Result<GpuEncodeReport> EncodeOnDevice(std::span<const DeviceTensorPair> pairs,
                                       const GpuEncodeOptions& options,
                                       std::vector<GpuEncodedChunk>* out);

}  // namespace refit::cuda

#endif  // REFIT_CUDA_ENCODER_H_
