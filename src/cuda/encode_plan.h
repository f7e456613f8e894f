// Host-side planning of the GPU delta encoder (encoder.h, encode.cu):
// everything it decides without the device. The chunk ranges and their
// device descriptors, the detection windows, which ranges the GPU encodes,
// the groups and their staging offsets, each chunk's models from the
// histograms the GPU counted (codec::ChooseSparseModels, as the CPU encoder
// chooses them) and the lanes' layout. Plain C++ with no CUDA dependency, so
// CPU-only builds compile and test it (encode_plan_test.cc).
//
// EncRange, EncChunk and EncTable are what the kernels read: plain structs
// copied to the device as they are. All functions are pure and thread-safe
// for distinct outputs.
#ifndef REFIT_CUDA_ENCODE_PLAN_H_
#define REFIT_CUDA_ENCODE_PLAN_H_

#include <cstdint>
#include <span>
#include <vector>

#include "base/hash.h"
#include "base/host_device.h"
#include "codec/sparse_plane.h"
#include "cuda/encoder.h"
#include "delta/chunk.h"
#include "refit/status.h"

namespace refit::cuda::internal {

// Histograms per GPU chunk (codec::SparsePlane::histogram order), of 256
// counts each: four gap bytes, then up to eight value bytes.
inline constexpr int kEncPlanes = codec::kMaxSparsePlanes;

// One chunk range as the detection and compaction kernels see it.
struct EncRange {
  uint64_t a, b;  // device addresses of the range's old and new bytes
  uint64_t bytes;
  uint64_t seg_first;  // first global segment
  uint64_t rec_off;    // group staging: first record, or ~0: not compacted
  uint64_t val_off;    // group staging: byte offset of the values
  uint64_t mask_off;   // first 32-bit word of the range's change mask
  uint32_t width;
  uint32_t reserved;
};

// One GPU-encoded chunk of a group.
struct EncChunk {
  uint64_t rec_off, val_off;  // staging offsets (records, value bytes)
  uint64_t word_off;          // first 16-bit word of the lanes' regions
  uint32_t k, width;
  uint32_t lanes, coded;
  uint32_t lane_first;        // index into the per-lane arrays
  uint32_t table_first;       // index into the tables
  uint8_t shift[kEncPlanes];  // coded plane c: codec::SparsePlane::shift
  uint8_t scale[kEncPlanes];  // coded plane c: its table's t
};

struct EncTable {
  uint32_t t;
  uint16_t f[256];
};

// One past the last 16-bit word of lane j's region (lane j holds records
// j + mL, each coded symbol emits at most one word; the regions of a
// chunk's lanes follow one another from word_off).
REFIT_HD inline uint64_t LaneRegionEnd(const EncChunk& c, uint32_t j) {
  const uint32_t full = c.k / c.lanes, rem = c.k % c.lanes;
  return c.word_off + uint64_t{c.coded} * (uint64_t{full} * (j + 1) +
                                           (j + 1 < rem ? j + 1 : rem));
}

// One chunk range as the host tracks it.
struct HostRange {
  uint32_t pair = 0;  // index into the pairs
  int width = 0;
  uint64_t start = 0, count = 0;
  uint64_t seg_first = 0;  // first global 64 KiB segment
  uint32_t segs = 0;
  uint64_t k = 0;    // changed elements, once detected
  bool gpu = false;  // encoded on the GPU (else CPU, if changed)
};

// The chunk ranges of a call, as DiffTensorsToSink cuts them.
struct RangePlan {
  std::vector<HostRange> ranges;
  std::vector<EncRange> dev;  // ranges[i]'s descriptor, not compacted
  uint64_t segs = 0;          // segments of all ranges
  uint64_t mask_words = 0;    // change mask words of all ranges
  // Mask words of ranges [0, i).
  uint64_t MaskEnd(size_t i) const {
    return i == ranges.size() ? mask_words : dev[i].mask_off;
  }
};

// Cuts every pair into ranges of chunk_bytes (a positive multiple of 64
// KiB) or 2^28 elements, whichever is fewer elements; pairs without
// elements give none. kInvalidArgument for a width other than 1, 2, 4 or
// 8, or a null pointer of a pair that has elements.
Result<RangePlan> PlanRanges(std::span<const DeviceTensorPair> pairs,
                             uint64_t chunk_bytes);

// The detection window that starts at range w0 < ranges.size() ends before
// the returned range: as many ranges as have change masks within
// mask_cap_words, and at least one.
size_t WindowEnd(const RangePlan& plan, size_t w0, uint64_t mask_cap_words);

// Whether the GPU encodes a range of `count` elements of which k changed:
// then the CPU encoder would try only a sparse XOR chunk (it tries dense
// encodings from k * 16 >= count on, EncodeChunkRange).
inline bool GpuEncodes(uint64_t k, uint64_t count) {
  return k > 0 && k * 16 < count;
}

// Once ranges [w0, w1) are detected: each one's k from its segments'
// changed counts (counts[s] for global segment s) and whether the GPU
// encodes it; seg_rec[s] receives the records of s's range before s.
void CountRecords(std::span<const uint32_t> counts, size_t w0, size_t w1,
                  std::span<HostRange> ranges, std::span<uint32_t> seg_rec);

// Staging bytes a range takes in a group: records and values in both front
// sets and the lanes' words (0 for a range the GPU does not encode).
uint64_t StagingBytes(const HostRange& r);

// The group that starts at detected range g0 < detected_end ends before the
// returned range: as many ranges as fit staging_bytes, and at least one.
size_t GroupEnd(std::span<const HostRange> ranges, size_t g0,
                size_t detected_end, uint64_t staging_bytes);

// The GPU chunks of ranges [g0, g1) and their places in the group's
// staging: records one after another, each chunk's values 16-byte aligned.
struct GroupLayout {
  std::vector<uint32_t> list;    // the GPU-encoded ranges
  std::vector<EncChunk> chunks;  // rec_off, val_off, k, width set
  uint64_t records = 0;
  uint64_t value_bytes = 0;
};
GroupLayout LayOutGroup(std::span<const HostRange> ranges, size_t g0,
                        size_t g1);

// The device descriptors of ranges [g0, g1) for the group's compaction:
// dev[g0 .. g1), with the staging offsets of the group's GPU chunks.
void StagedRanges(const RangePlan& plan, size_t g0, size_t g1,
                  const GroupLayout& group, EncRange* out);

// Blocks per chunk of the histogram kernel: enough to fill the device a few
// times over, in slices of at least a few thousand records (1 .. 64).
uint32_t HistogramSlices(int sm_count, uint32_t nchunks, uint64_t records);

// Host side of one GPU chunk: its payload header and tables.
struct HostChunk {
  std::vector<uint8_t> header;   // gw byte and model descriptions
  std::vector<EncTable> tables;  // of the coded planes, in plane order
};

// Step 3 for one chunk of n elements whose k = chunk->k records the GPU
// counted into gpu_hist (kEncPlanes * 256 counts, zero bytes not counted)
// with the largest gap max_gap: the models EncodeSparseW chooses for the
// same records. Writes *out and chunk's coded, shift, scale and lanes.
void ChooseChunkModels(std::span<const uint32_t> gpu_hist, uint32_t max_gap,
                       uint32_t n, uint32_t records_per_lane, EncChunk* chunk,
                       HostChunk* out);

// The full histograms of a chunk of k records from the GPU's counts,
// which leave out zero bytes: each plane's zero count is k minus the rest.
std::vector<codec::Histogram> FullHistograms(std::span<const uint32_t> gpu_hist,
                                             uint32_t k, int width);

// Step 4a's layout of a group's chunks: each one's first table, first lane
// and lanes' word region, one after another; totals for the buffers.
struct LaneLayout {
  uint64_t words = 0;  // 16-bit words of all lanes' regions
  uint64_t tables = 0;
  uint32_t lanes = 0;
  uint32_t max_coded = 0;
  uint32_t max_lanes = 1;
};
LaneLayout LayOutLanes(std::span<EncChunk> chunks,
                       std::span<const HostChunk> hc);

// The header of a range's chunk: a sparse XOR chunk of the pair's tensor.
ChunkHeader RangeHeader(const HostRange& r, uint64_t tensor_id,
                        const GpuEncodeOptions& opt, const Hash128& before,
                        const Hash128& after);

}  // namespace refit::cuda::internal

#endif  // REFIT_CUDA_ENCODE_PLAN_H_
