// Host-side preparation of chunk batches for the GPU receiver.
//
// The CPU parses what is cheap and serial (chunk framing and checksum, the
// per-plane models of docs/format.md §5.2 through the codec's own parser,
// lane framing of §5.3) and lays it out as POD descriptors; the GPU does the
// per-symbol work. Dense payloads (kinds 3, 4): their constant, verbatim and
// entropy planes (docs/format.md §4.2, modes 0-2) become plane jobs that the
// GPU decodes into the batch's device staging; a chunk with a zstd plane
// (mode 3) is decoded here, on the CPU, with the codec, and its decoded
// bytes travel with the batch.
//
// A batch is a run of consecutive chunks of the caller's payload buffer,
// bounded so that its payload, decoded records and digests fit the device
// staging slots. Everything here is plain C++ with no CUDA dependency, so it
// is unit-tested on CPU-only machines. PrepareBatches is thread-safe for
// distinct outputs.
#ifndef REFIT_CUDA_BATCH_H_
#define REFIT_CUDA_BATCH_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "codec/sparse_plane.h"
#include "cuda/placement.h"
#include "refit/status.h"

namespace refit::cuda {

inline constexpr int kMaxCodedPlanes = codec::kMaxSparsePlanes;
// Every coded plane gets a slot -> symbol lookup of min(2^t, 2^kSlotTableBits)
// entries in shared memory; wider tables look up the symbol of the slot's
// 2^(t - kSlotTableBits)-slot bucket and step forward from there.
inline constexpr int kSlotTableBits = 11;  // 11: ~10 KB a chunk at 3 planes,
                                          // so ~2.7 K chunks are resident

// Per-chunk status written by the kernels (0: applied or pending).
enum ChunkStatus : uint32_t {
  kStatusOk = 0,
  kStatusLaneShort = 1,      // a lane ran out of bytes
  kStatusLaneEnd = 2,        // leftover bytes or wrong final state
  kStatusPosition = 3,       // a decoded position past the chunk
  kStatusZeroXor = 4,        // a zero XOR value
  kStatusAfterMismatch = 5,  // applied, did not hash to "after", undone
  kStatusSkipped = 6,        // not applied (Classify said so)
  kStatusClassCount = 7,     // kind 5: a class has more changes than members
};
const char* ChunkStatusName(uint32_t status);

// A plane's frequency table as the kernel reads it.
struct DevTable {
  uint32_t t;
  uint16_t f[256];
  uint32_t reserved;
};

enum : uint8_t { kDevSparse = 0, kDevDense = 1 };

struct DevChunk {
  uint64_t start;          // canonical first element
  uint64_t data;           // payload-buffer offset: sparse stream / dense bytes
  uint64_t records;        // scratch offset: u32 gaps, then positions [k]
                           // (16-byte aligned)
  uint64_t values;         // scratch offset of the values
  uint64_t undo;           // scratch offset of replaced bytes (overwrite kinds)
  uint64_t range_address;  // contiguous device address of the range, or 0
                           // (0 also when verification is off)
  uint64_t linear_address;  // same, regardless of verification: records of
                            // such chunks skip the placement lookup
  uint64_t seg_first;      // first segment digest (scratch digest array)
  // Strided regions (docs/format.md §3; trainer ranks' chunks): element i
  // of the chunk is canonical element start + (i / run) * stride + i % run;
  // run = stride = 0 for a contiguous range. range_address and
  // linear_address then give canonical element `start`, and the region
  // spans RegionSpan() elements from there.
  uint64_t run, stride;
  uint64_t after_lo, after_hi;    // docs/format.md §3 "after"
  uint64_t before_lo, before_hi;  // and "before"
  uint64_t fixed_gap;      // constant gap planes' bytes, in place
  uint64_t fixed_value;    // constant value planes' bytes, in place
  uint32_t n, k;
  uint32_t lane_first;     // lane offsets: lanes[lane_first .. + lanes]
  uint32_t table_first;    // tables[table_first .. + coded]
  uint32_t placement;      // index into the flattened plan
  uint32_t status_index;   // index into the status array
  uint32_t segments;       // 64 KiB segments of the range
  uint32_t smem;           // shared memory the chunk's tables need
  uint8_t layout;          // kDevSparse or kDevDense
  uint8_t kind;            // codec::ChunkKind
  uint8_t width;
  uint8_t gw;
  uint8_t lanes;
  uint8_t coded;                          // coded planes
  uint8_t coded_shift[kMaxCodedPlanes];   // codec::SparsePlane::shift of
                                          // each coded plane
  uint8_t fused;           // sparse XOR: decoded and applied in one kernel,
                           // no record staging (records/values unused)
  uint8_t dense_gpu;       // dense, its planes decoded on the GPU into
                           // staging at `data` (DevDensePlane)
  uint8_t conditional;     // kind 5 (see DevConditional): decoded and
                           // applied on the GPU against its base into
                           // sparse XOR records; `kind` then reads 1 (sparse
                           // XOR), as the undo treats it
};

// Conditional XOR chunks (kind 5, docs/format.md §4.3) on the GPU. The
// host parses the payload's header, models and lane framing; the class of
// each element and the members per class come from the base, in device
// memory, only at apply time (conditional_apply.cu). The chunk is
// presented to the other kernels as a sparse XOR chunk (layout kDevSparse,
// kind 1, not fused) that kernels A and B leave alone: the conditional
// kernels decode it, apply it and leave its records (positions and XOR
// values) in its scratch like a kind-1 chunk's, so that an "after"
// mismatch XORs them again. An undo never decodes against the range's
// after state.
//
// The chunk's first table slot (DevChunk::table_first) holds its
// DevConditional; the slots after it the frequencies of its table-mode
// planes (DevConditionalPlane::table counts from table_first + 1).
inline constexpr int kCondClasses = 8;
inline constexpr int kCondPlanes = 4 * kCondClasses + 2;  // class c gap byte
                                                           // b at 4c + b;
                                                           // difference bytes
                                                           // at 32, 33
// Elements per tile (conditional_apply.cu): 8 per lane of a warp; a run
// of kCondRunTiles tiles is one warp's work, and the unit of the class
// counts kept in scratch.
inline constexpr uint32_t kCondTile = 256;
inline constexpr uint32_t kCondRunTiles = 16;
inline constexpr uint32_t kCondRun = kCondTile * kCondRunTiles;

enum : uint8_t {
  kCondConstant = 0,   // section 5.2 modes
  kCondUniform = 1,
  kCondTable = 2,
  kCondGeometric = 3,  // built on the device from m_c and k_c
  kCondAbsent = 255,   // past the class's gap width, or an empty class
};
struct DevConditionalPlane {
  uint8_t mode;
  uint8_t symbol;      // constant: the symbol; geometric: max_symbol
  uint8_t t;           // precision (uniform 8; table; geometric)
  uint8_t table;       // table mode: frequencies at table_first + 1 + table
};
struct DevConditional {
  uint32_t lo;
  uint32_t k[kCondClasses];      // changes per class (sum: DevChunk::k)
  uint32_t first[kCondClasses];  // first record of each class
  uint32_t gw[kCondClasses];     // gap width (0 for an empty class)
  DevConditionalPlane plane[kCondPlanes];
};
static_assert(sizeof(DevConditional) <= sizeof(DevTable));

// Scratch of a kind-5 chunk, from DevChunk::records on (byte offsets):
// the records' gaps, made ranks and then positions (k u32), and their
// differences, made XOR values (k u16 at DevChunk::values), where kernel
// B's undo reads a sparse XOR chunk's records; the members per class (8
// u32); per run of kCondRun elements its class counts, made exclusive
// prefixes by the decode (runs x 8 u32), and its first record of each
// class (runs x 8 u32). O(k + n / 64) bytes, 6 per record and 1 per 64
// elements: the chunk batches with others as a sparse chunk does.
struct CondScratch {
  uint64_t values, members, counts, cursors, total;
};
REFIT_HOST_DEVICE inline uint64_t CondRuns(uint32_t n) {
  return (uint64_t{n} + kCondRun - 1) / kCondRun;
}
REFIT_HOST_DEVICE inline CondScratch CondScratchLayout(uint32_t n, uint32_t k) {
  const uint64_t runs = CondRuns(n);
  const uint64_t m16 = ~uint64_t{15};
  CondScratch s;
  s.values = (4 * uint64_t{k} + 15) & m16;
  s.members = s.values + ((2 * uint64_t{k} + 15) & m16);
  s.counts = s.members + 32;
  s.cursors = s.counts + 32 * runs;
  s.total = s.cursors + 32 * runs;
  return s;
}

// Elements from a chunk's first canonical element to one past its last.
inline uint64_t RegionSpan(uint64_t count, uint64_t run, uint64_t stride) {
  return run == 0 ? count : (count / run - 1) * stride + run;
}

// One byte plane of a dense chunk for the GPU to decode (docs/format.md
// §4.2) into byte j of each of the chunk's n elements at DevChunk::data.
enum : uint8_t { kPlaneConstant = 0, kPlaneVerbatim = 1, kPlaneEntropy = 2 };
struct DevDensePlane {
  uint32_t chunk;       // index into the batch's chunks
  uint32_t table;       // entropy: index into the batch's tables
  uint32_t lane_first;  // entropy: lanes[lane_first .. + lanes]
  uint32_t src;         // verbatim: payload offset of the n bytes;
                        // constant: the symbol
  uint8_t mode;
  uint8_t j;            // byte of the element
  uint8_t lanes;        // entropy: rANS lanes
  uint8_t reserved;
};

// Bytes of each staging slot's share held back for alignment (three parts
// rounded up to 256 bytes) and the decoders' read-ahead past a batch's
// payload (kernels.h, kPayloadPad).
inline constexpr uint64_t kSlotPadding = 1024;

struct BatchLimits {
  uint64_t payload_bytes = 32 << 20;   // per staging slot
  uint64_t scratch_bytes = 160 << 20;  // records, undo bytes, digests
  uint64_t meta_bytes = 16 << 20;      // descriptors, tables, lane offsets
};

struct PrepareOptions {
  BatchLimits limits;
  // When nonzero, `limits` is ignored: the payload slots, metadata slots and
  // scratch area share this many bytes (2 * payload + 2 * meta + scratch),
  // split in proportion to what the whole delta needs of each, so that
  // neither bound cuts many more batches than the other.
  uint64_t staging_total = 0;
  // With staging_total: how many slots (payload, metadata and scratch
  // each) it is split into, i.e. how many batches may be in flight (copy,
  // decode, apply) at once; lowered, down to 2, until the largest chunk
  // fits one slot. Batches are also cut at about 1/slots of the delta's
  // payload (at least 64 KiB), so that a small delta still gets several
  // batches whose copies overlap the kernels. Each slot's share keeps
  // kSlotPadding bytes back, so that the slots, each part rounded up to 256
  // bytes and the payload part padded for the decoders' read-ahead, still
  // fit staging_total.
  int slots = 2;
  bool verify = true;  // check "after" range hashes on the device
  int threads = 0;     // host threads for parsing (0: default)
};

struct ChunkSpan {
  uint64_t offset = 0;  // in the payload buffer
  uint64_t size = 0;
};

struct HostBatch {
  uint64_t payload_begin = 0;  // byte range of the caller's buffer to upload
  uint64_t payload_end = 0;
  uint64_t dense_offset = 0;   // decoded dense bytes go here on the device
  std::vector<uint8_t> dense;  // decoded dense payloads (CPU)
  uint64_t gpu_dense_bytes = 0;  // device staging for GPU-decoded dense
                                 // chunks, after `dense` (not copied)
  std::vector<DevChunk> chunks;
  std::vector<DevTable> tables;
  std::vector<uint32_t> lanes;  // payload-buffer offsets, per chunk L + 1
  std::vector<DevDensePlane> planes;  // dense planes for the GPU
  uint64_t scratch_bytes = 0;
  uint64_t segments = 0;
  uint32_t smem = 0;            // largest per-chunk table need
  uint32_t max_fused_lanes = 0;  // widest fused chunk (lanes), 0 if none
  uint64_t records = 0;         // changed records (sparse, kind 5) in the batch
  uint32_t unfused = 0;         // chunks for kernels A and B (not fused,
                                // not kind 5)
  uint32_t regions = 0;         // strided regions (run != 0) among the chunks
  uint32_t conditional = 0;     // kind-5 chunks (DevChunk::conditional)
  std::vector<uint8_t> meta;    // SerializeMeta's bytes, made by Prepare
  // Bytes copied to the device (chunk bytes and CPU-decoded dense bytes).
  uint64_t device_bytes() const {
    return payload_end - payload_begin + dense.size();
  }
  // Descriptor bytes as uploaded: chunks, then tables, then lane offsets,
  // then dense plane jobs, each 16-byte aligned (MetaOffsets gives the
  // offsets).
  uint64_t meta_bytes() const;
  void MetaOffsets(uint64_t* tables, uint64_t* lanes,
                   uint64_t* planes = nullptr) const;
  void SerializeMeta(std::vector<uint8_t>* out) const;
};

struct PreparedDelta {
  std::vector<HostBatch> batches;
  uint32_t status_count = 0;
  uint64_t chunks_not_here = 0;  // chunks with no element on this GPU
  uint64_t payload_bytes = 0;    // bytes uploaded over all batches
  uint64_t largest_batch = 0;    // device bytes of the largest batch
  uint64_t largest_scratch = 0;
  uint64_t largest_meta = 0;
  uint32_t largest_smem = 0;
  uint32_t slots = 2;            // staging slots the limits were cut for
  // For each status index: the caller's chunk index.
  std::vector<uint32_t> chunk_of_status;
};

// Parses and batches `chunks` (each a whole chunk, docs/format.md §3, lying
// in `buffer`), for a receiver whose tensors are `tensor_names` (the
// delta's tensor table: a chunk's tensor_id indexes it) placed by `plan`.
// Chunks of tensors the plan does not place here, or whose range has no
// element here, are skipped. Requires every chunk to parse (checksum
// included), its width and range to fit its placement, and with
// opts.verify, its range to be contiguous where placed.
Result<PreparedDelta> PrepareBatches(std::span<const uint8_t> buffer,
                                     std::span<const ChunkSpan> chunks,
                                     std::span<const std::string> tensor_names,
                                     const PlacementPlan& plan,
                                     const PrepareOptions& opts);

}  // namespace refit::cuda

#endif  // REFIT_CUDA_BATCH_H_
