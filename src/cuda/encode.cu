// GPU delta encoder (encoder.h): change detection and segment hashes,
// compaction, byte-plane histograms, rANS lane encoding and stream
// assembly on the device; model choice and chunk framing on the host with
// the CPU encoder's own functions, so the bytes match EncodeChunkRange.
#include "cuda/encoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <span>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "base/bytes.h"
#include "base/hash.h"
#include "base/parallel.h"
#include "codec/payload.h"
#include "codec/rans.h"
#include "codec/table.h"
#include "cuda/xxh3.cuh"
#include "delta/encoder.h"

namespace refit::cuda {
namespace internal {
namespace {

constexpr uint64_t kSeg = 64 * 1024;
constexpr int kPlanes = 12;  // 4 gap bytes + up to 8 value bytes
constexpr uint32_t kRansLowE = 1u << 16;

// One chunk range as the detection and compaction kernels see it.
struct EncRange {
  uint64_t a, b;       // device addresses of the range's old and new bytes
  uint64_t bytes;
  uint64_t seg_first;  // first global segment
  uint64_t rec_off;    // group staging: first record, or ~0: not compacted
  uint64_t val_off;    // group staging: byte offset of the values
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
  uint8_t shift[kPlanes];     // coded plane c: gap byte shift, or 64 + value
  uint32_t reserved;
};

struct EncTable {
  uint32_t t;
  uint16_t f[256];
};

struct EncSym {
  uint64_t rcp;
  uint64_t x_max;
  uint32_t bias, cmpl;
};

__device__ inline uint64_t LoadWE(const uint8_t* p, uint32_t w) {
  switch (w) {
    case 1: return *p;
    case 2: return *reinterpret_cast<const uint16_t*>(p);
    case 4: return *reinterpret_cast<const uint32_t*>(p);
    default: return *reinterpret_cast<const uint64_t*>(p);
  }
}
__device__ inline void StoreWE(uint8_t* p, uint64_t v, uint32_t w) {
  switch (w) {
    case 1: *p = static_cast<uint8_t>(v); break;
    case 2: *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(v); break;
    case 4: *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(v); break;
    default: *reinterpret_cast<uint64_t*>(p) = v; break;
  }
}

__device__ inline uint32_t FindRange(const EncRange* r, uint32_t n, uint64_t s) {
  uint32_t lo = 0, hi = n;  // last range with seg_first <= s
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (r[mid].seg_first <= s) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__device__ inline const uint8_t* Ptr(uint64_t a) {
  return reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(a));
}

// Element e of a 16-byte word pair (lo, hi) of width w: its XOR.
__device__ inline uint64_t Elem16(uint64_t lo, uint64_t hi, uint32_t w,
                                  uint32_t e) {
  const uint32_t bit = e * w * 8;
  const uint64_t word = bit < 64 ? lo : hi;
  const uint32_t sh = bit & 63;
  return w == 8 ? word : (word >> sh) & ((uint64_t{1} << (8 * w)) - 1);
}

// Step 1: one warp per 64 KiB segment: both digests and the changed count.
__global__ void DetectKernel(const EncRange* ranges, uint32_t nranges,
                             uint64_t segs, uint64_t* before, uint64_t* after,
                             uint32_t* counts) {
  const uint64_t s = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  if (s >= segs) return;
  const uint32_t lane = threadIdx.x & 31;
  const EncRange r = ranges[FindRange(ranges, nranges, s)];
  const uint64_t off = (s - r.seg_first) * kSeg;
  const uint64_t len = min(kSeg, r.bytes - off);
  const uint8_t* a = Ptr(r.a) + off;
  const uint8_t* b = Ptr(r.b) + off;
  const uint32_t w = r.width;
  uint32_t count = 0;
  if (((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15) == 0) {
    const uint64_t full = len / 16 * 16;
    for (uint64_t o = 16 * lane; o < full; o += 512) {
      const ulonglong2 x = __ldg(reinterpret_cast<const ulonglong2*>(a + o));
      const ulonglong2 y = __ldg(reinterpret_cast<const ulonglong2*>(b + o));
      const uint64_t lo = x.x ^ y.x, hi = x.y ^ y.y;
      if ((lo | hi) == 0) continue;
      for (uint32_t e = 0; e < 16 / w; ++e) count += Elem16(lo, hi, w, e) != 0;
    }
    for (uint64_t o = full + uint64_t{lane} * w; o < len; o += 32 * w) {
      count += LoadWE(a + o, w) != LoadWE(b + o, w);
    }
  } else {
    for (uint64_t o = uint64_t{lane} * w; o < len; o += 32 * w) {
      for (uint32_t j = 0; j < w; ++j) {
        if (a[o + j] != b[o + j]) {
          ++count;
          break;
        }
      }
    }
  }
  count = __reduce_add_sync(0xffffffffu, count);
  const H128 hb = Xxh3Warp(a, len);
  const H128 ha = count != 0 ? Xxh3Warp(b, len) : hb;
  if (lane == 0) {
    before[2 * s] = hb.lo;
    before[2 * s + 1] = hb.hi;
    after[2 * s] = ha.lo;
    after[2 * s + 1] = ha.hi;
    counts[s] = count;
  }
}

// Step 2a: one warp per segment of a compacted range: positions (relative
// to the range start) and XOR values of the changed elements, in order.
// seg_rec[s]: records of the range before segment s.
__global__ void CompactKernel(const EncRange* ranges, uint32_t nranges,
                              uint64_t seg_begin, uint64_t seg_end,
                              const uint32_t* seg_rec, uint32_t* pos,
                              uint8_t* vals) {
  const uint64_t s =
      seg_begin + (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  if (s >= seg_end) return;
  const uint32_t lane = threadIdx.x & 31;
  const EncRange r = ranges[FindRange(ranges, nranges, s)];
  if (r.rec_off == ~uint64_t{0}) return;
  const uint64_t off = (s - r.seg_first) * kSeg;
  const uint64_t len = min(kSeg, r.bytes - off);
  const uint8_t* a = Ptr(r.a) + off;
  const uint8_t* b = Ptr(r.b) + off;
  const uint32_t w = r.width;
  const uint32_t elem0 = static_cast<uint32_t>(off / w);
  uint64_t out = r.rec_off + seg_rec[s];
  uint8_t* vout = vals + r.val_off + (out - r.rec_off) * w;
  uint32_t* pout = pos + out;
  uint32_t run = 0;
  const bool vec =
      ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15) == 0;
  const uint64_t full = vec ? len / 512 * 512 : 0;
  for (uint64_t base = 0; base < full; base += 512) {
    const uint64_t o = base + 16 * lane;
    const ulonglong2 x = __ldg(reinterpret_cast<const ulonglong2*>(a + o));
    const ulonglong2 y = __ldg(reinterpret_cast<const ulonglong2*>(b + o));
    const uint64_t lo = x.x ^ y.x, hi = x.y ^ y.y;
    uint32_t mine = 0;
    if ((lo | hi) != 0) {
      for (uint32_t e = 0; e < 16 / w; ++e) mine += Elem16(lo, hi, w, e) != 0;
    }
    uint32_t incl = mine;
    for (int d = 1; d < 32; d <<= 1) {
      const uint32_t v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= static_cast<uint32_t>(d)) incl += v;
    }
    const uint32_t total = __shfl_sync(0xffffffffu, incl, 31);
    uint32_t at = run + incl - mine;
    if (mine != 0) {
      for (uint32_t e = 0; e < 16 / w; ++e) {
        const uint64_t v = Elem16(lo, hi, w, e);
        if (v == 0) continue;
        pout[at] = elem0 + static_cast<uint32_t>(o / w) + e;
        StoreWE(vout + uint64_t{at} * w, v, w);
        ++at;
      }
    }
    run += total;
  }
  for (uint64_t o = full + uint64_t{lane} * w;; o += 32 * w) {
    const bool in = o < len;
    uint64_t v = 0;
    if (in) {
      for (uint32_t j = 0; j < w; ++j) {
        v |= uint64_t{static_cast<uint8_t>(a[o + j] ^ b[o + j])} << (8 * j);
      }
    }
    const uint32_t mask = __ballot_sync(0xffffffffu, v != 0);
    if (v != 0) {
      const uint32_t at = run + __popc(mask & ((1u << lane) - 1));
      pout[at] = elem0 + static_cast<uint32_t>(o / w);
      StoreWE(vout + uint64_t{at} * w, v, w);
    }
    run += __popc(mask);
    if (!__any_sync(0xffffffffu, o + 32 * w < len)) break;
  }
}

__device__ inline uint32_t GapAt(const uint32_t* pos, uint32_t i) {
  return i == 0 ? pos[0] : pos[i] - pos[i - 1] - 1;
}

// Step 2b: one block per GPU chunk: the 4 gap-byte and w value-byte
// histograms (as EncodeSparse counts them) and the largest gap.
__global__ void __launch_bounds__(256)
    HistKernel(const EncChunk* chunks, const uint32_t* pos, const uint8_t* vals,
               uint32_t* hist, uint32_t* max_gap) {
  const EncChunk c = chunks[blockIdx.x];
  __shared__ uint32_t h[kPlanes * 256];
  __shared__ uint32_t s_max;
  for (uint32_t i = threadIdx.x; i < kPlanes * 256; i += blockDim.x) h[i] = 0;
  if (threadIdx.x == 0) s_max = 0;
  __syncthreads();
  const uint32_t* p = pos + c.rec_off;
  const uint8_t* v = vals + c.val_off;
  uint32_t mx = 0;
  for (uint32_t i = threadIdx.x; i < c.k; i += blockDim.x) {
    const uint32_t g = GapAt(p, i);
    mx = max(mx, g);
    for (int j = 0; j < 4; ++j) atomicAdd(&h[j * 256 + ((g >> (8 * j)) & 0xff)], 1u);
    const uint64_t x = LoadWE(v + uint64_t{i} * c.width, c.width);
    for (uint32_t j = 0; j < c.width; ++j) {
      atomicAdd(&h[(4 + j) * 256 + ((x >> (8 * j)) & 0xff)], 1u);
    }
  }
  atomicMax(&s_max, mx);
  __syncthreads();
  uint32_t* out = hist + uint64_t{blockIdx.x} * kPlanes * 256;
  for (uint32_t i = threadIdx.x; i < (4 + c.width) * 256; i += blockDim.x) out[i] = h[i];
  if (threadIdx.x == 0) max_gap[blockIdx.x] = s_max;
}

// Step 4a: one block per GPU chunk, thread j encodes lane j exactly as
// codec::EncodeStream does: records j + mL in reverse, coded planes in
// reverse, words written backwards into the lane's region.
__global__ void __launch_bounds__(256)
    EncodeLanesKernel(const EncChunk* chunks, const EncTable* tables,
                      const uint32_t* pos, const uint8_t* vals, uint16_t* words,
                      uint32_t* lane_state, uint32_t* lane_used) {
  const EncChunk c = chunks[blockIdx.x];
  using Scan = cub::BlockScan<uint32_t, 256>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ uint32_t s_shift[kPlanes];
  extern __shared__ __align__(16) uint8_t smem[];
  EncSym* sym = reinterpret_cast<EncSym*>(smem);
  const uint32_t tid = threadIdx.x;
  if (tid < c.coded) s_shift[tid] = c.shift[tid];
  for (uint32_t p = 0; p < c.coded; ++p) {
    const EncTable& tb = tables[c.table_first + p];
    const uint32_t t = tb.t, f = tb.f[tid];
    uint32_t cum;
    Scan(temp).ExclusiveSum(f, cum);
    EncSym e{0, 0, 0, 0};
    if (f != 0) {
      e.rcp = ((uint64_t{1} << (32 + t)) + f - 1) / f;
      e.x_max = uint64_t{f} << (32 - t);
      e.bias = cum;
      e.cmpl = (1u << t) - f;
    }
    sym[p * 256 + tid] = e;
    __syncthreads();
  }
  __shared__ uint32_t s_t[kPlanes];
  if (tid < c.coded) s_t[tid] = tables[c.table_first + tid].t;
  __syncthreads();
  const uint32_t L = c.lanes, k = c.k, nc = c.coded;
  if (tid >= L) return;
  const uint32_t full = k / L, rem = k % L;
  const uint32_t recs = full + (tid < rem ? 1 : 0);
  const uint64_t region_end =
      c.word_off + uint64_t{nc} * (uint64_t{full} * (tid + 1) + min(tid + 1, rem));
  uint16_t* out = words + region_end;
  uint16_t* p = out;
  uint32_t x = kRansLowE;
  const uint32_t* ps = pos + c.rec_off;
  const uint8_t* vs = vals + c.val_off;
  if (nc > 0) {
    for (uint32_t m = recs; m-- > 0;) {
      const uint32_t i = tid + m * L;
      const uint64_t gap = GapAt(ps, i);
      const uint64_t val = LoadWE(vs + uint64_t{i} * c.width, c.width);
      for (uint32_t q = nc; q-- > 0;) {
        const uint32_t sh = s_shift[q];
        const uint32_t s = static_cast<uint32_t>(
            (sh < 64 ? gap >> sh : val >> (sh - 64)) & 0xff);
        const EncSym e = sym[q * 256 + s];
        if (x >= e.x_max) {
          *--p = static_cast<uint16_t>(x);
          x >>= 16;
        }
        const uint64_t qq = (uint64_t{x} * e.rcp) >> (32 + s_t[q]);
        x += e.bias + static_cast<uint32_t>(qq) * e.cmpl;
      }
    }
  }
  lane_state[c.lane_first + tid] = x;
  lane_used[c.lane_first + tid] = static_cast<uint32_t>(out - p);
}

__device__ inline uint32_t VarintLen(uint64_t v) {
  uint32_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Step 4b: stream size of each chunk (section 5.3 framing).
__global__ void StreamSizeKernel(const EncChunk* chunks, uint32_t n,
                                 const uint32_t* lane_used, uint64_t* sizes) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const EncChunk c = chunks[i];
  uint64_t size = 1;
  for (uint32_t j = 0; j < c.lanes; ++j) {
    const uint64_t lane = 4 + 2 * uint64_t{lane_used[c.lane_first + j]};
    size += lane + (j + 1 < c.lanes ? VarintLen(lane) : 0);
  }
  sizes[i] = size;
}

// Step 4c: one block per chunk writes its stream at offs[i].
__global__ void __launch_bounds__(256)
    GatherKernel(const EncChunk* chunks, const uint16_t* words,
                 const uint32_t* lane_state, const uint32_t* lane_used,
                 const uint64_t* offs, uint8_t* out) {
  const EncChunk c = chunks[blockIdx.x];
  using Scan = cub::BlockScan<uint32_t, 256>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ uint32_t s_hdr;
  __shared__ uint32_t s_lane_off[256];
  uint8_t* dst = out + offs[blockIdx.x];
  const uint32_t tid = threadIdx.x;
  const uint32_t L = c.lanes, nc = c.coded;
  if (tid == 0) {
    uint32_t o = 0;
    dst[o++] = static_cast<uint8_t>(L);
    for (uint32_t j = 0; j + 1 < L; ++j) {
      uint64_t v = 4 + 2 * uint64_t{lane_used[c.lane_first + j]};
      while (v >= 0x80) {
        dst[o++] = static_cast<uint8_t>(v | 0x80);
        v >>= 7;
      }
      dst[o++] = static_cast<uint8_t>(v);
    }
    s_hdr = o;
  }
  const uint32_t mine = tid < L ? 4 + 2 * lane_used[c.lane_first + tid] : 0;
  uint32_t excl;
  Scan(temp).ExclusiveSum(mine, excl);
  s_lane_off[tid] = excl;
  __syncthreads();
  const uint32_t full = c.k / L, rem = c.k % L;
  for (uint32_t j = 0; j < L; ++j) {
    uint8_t* d = dst + s_hdr + s_lane_off[j];
    const uint32_t used = lane_used[c.lane_first + j];
    const uint64_t region_end =
        c.word_off + uint64_t{nc} * (uint64_t{full} * (j + 1) + min(j + 1, rem));
    const uint8_t* src = reinterpret_cast<const uint8_t*>(words + region_end - used);
    if (tid < 4) d[tid] = static_cast<uint8_t>(lane_state[c.lane_first + j] >> (8 * tid));
    for (uint32_t q = tid; q < 2 * used; q += blockDim.x) d[4 + q] = src[q];
  }
}

}  // namespace
}  // namespace internal

namespace {

using internal::EncChunk;
using internal::EncRange;
using internal::EncTable;

Status CudaErr(cudaError_t e, const char* what) {
  return InternalError(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}
#define REFIT_ENC_CUDA(expr, what)                  \
  do {                                              \
    const cudaError_t e_ = (expr);                  \
    if (e_ != cudaSuccess) return CudaErr(e_, what); \
  } while (0)

// Device allocations of one call, freed together; tracks the total.
// Allocations past a Release(keep) point are kept and handed out again, in
// the same order, by the Gets that follow (the next group asks for the same
// buffers in the same order): a buffer is reallocated only when it is too
// small, so groups after the first cost no cudaMalloc or cudaFree (each
// cudaFree also waits for the whole device).
class Arena {
 public:
  ~Arena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  Status Get(uint64_t count, T** out) {
    const uint64_t bytes = std::max<uint64_t>(count * sizeof(T), 16);
    if (cursor_ < ptrs_.size()) {
      if (sizes_[cursor_] < bytes) {
        cudaFree(ptrs_[cursor_]);
        held_ -= sizes_[cursor_];
        sizes_[cursor_] = 0;
        void* p = nullptr;
        REFIT_ENC_CUDA(cudaMalloc(&p, bytes), "cudaMalloc");
        ptrs_[cursor_] = p;
        sizes_[cursor_] = bytes;
        held_ += bytes;
        peak_ = std::max(peak_, held_);
      }
      *out = static_cast<T*>(ptrs_[cursor_++]);
      return Status::Ok();
    }
    void* p = nullptr;
    REFIT_ENC_CUDA(cudaMalloc(&p, bytes), "cudaMalloc");
    ptrs_.push_back(p);
    sizes_.push_back(bytes);
    cursor_ = ptrs_.size();
    held_ += bytes;
    peak_ = std::max(peak_, held_);
    *out = static_cast<T*>(p);
    return Status::Ok();
  }
  // The next Get hands out the allocation made after the first `keep`.
  void Release(size_t keep) { cursor_ = keep; }
  size_t size() const { return cursor_; }
  uint64_t peak() const { return peak_; }

 private:
  std::vector<void*> ptrs_;
  std::vector<uint64_t> sizes_;
  size_t cursor_ = 0;
  uint64_t held_ = 0, peak_ = 0;
};

// Page-locked host memory for what comes back each group (histograms,
// streams), kept per thread across calls: a copy into pageable memory runs
// at a fraction of the link's speed, and page-locking memory takes
// milliseconds, too long to repeat per call.
class PinnedHost {
 public:
  ~PinnedHost() {
    if (p_) cudaFreeHost(p_);
  }
  // At least `bytes` bytes; the previous contents are not kept.
  Status Reserve(uint64_t bytes) {
    if (bytes <= size_) return Status::Ok();
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    size_ = 0;
    const uint64_t want = std::max<uint64_t>(bytes + bytes / 4, 1 << 20);
    REFIT_ENC_CUDA(cudaHostAlloc(&p_, want, cudaHostAllocDefault),
                   "cudaHostAlloc");
    size_ = want;
    return Status::Ok();
  }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }

 private:
  void* p_ = nullptr;
  uint64_t size_ = 0;
};

const void* HostPtr(uint64_t a) {
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(a));
}

int GapWidthFor(uint32_t max_gap) {  // as codec/payload.cc
  if (max_gap < (1u << 8)) return 1;
  if (max_gap < (1u << 16)) return 2;
  if (max_gap < (1u << 24)) return 3;
  return 4;
}

struct HostRange {
  uint32_t pair;
  uint64_t start, count;
  uint64_t seg_first;
  uint32_t segs;
  uint64_t k = 0;
  bool gpu = false;  // encoded on the GPU (else CPU, if changed)
};

// Host side of one GPU chunk: models and lane layout.
struct HostChunk {
  uint32_t range;
  std::vector<uint8_t> header;  // gw byte and model descriptions
  std::vector<EncTable> tables;
};

}  // namespace

Result<GpuEncodeReport> EncodeOnDevice(std::span<const DeviceTensorPair> pairs,
                                       const GpuEncodeOptions& opt,
                                       std::vector<GpuEncodedChunk>* out) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.chunk_bytes == 0 || opt.chunk_bytes % kRangeHashSegment != 0) {
    return InvalidArgumentError("chunk size must be a positive multiple of 64 KiB");
  }
  if (opt.records_per_lane == 0) {
    return InvalidArgumentError("records_per_lane must be >= 1");
  }
  REFIT_ENC_CUDA(cudaSetDevice(opt.device), "cudaSetDevice");
  const int threads = opt.host_threads > 0 ? opt.host_threads : DefaultThreads();
  GpuEncodeReport report;
  // Ranges as DiffTensorsToSink cuts them.
  std::vector<HostRange> ranges;
  std::vector<EncRange> dev_ranges;
  uint64_t segs = 0;
  for (size_t p = 0; p < pairs.size(); ++p) {
    const DeviceTensorPair& t = pairs[p];
    if (t.width != 1 && t.width != 2 && t.width != 4 && t.width != 8) {
      return InvalidArgumentError("element width must be 1, 2, 4 or 8");
    }
    if (t.elements == 0) continue;
    if (t.old_data == nullptr || t.new_data == nullptr) {
      return InvalidArgumentError("pair " + std::to_string(p) + " has no data");
    }
    const uint64_t per = std::min<uint64_t>(opt.chunk_bytes / t.width,
                                            kMaxChunkElements);
    for (uint64_t s = 0; s < t.elements; s += per) {
      HostRange r;
      r.pair = static_cast<uint32_t>(p);
      r.start = s;
      r.count = std::min(per, t.elements - s);
      r.seg_first = segs;
      const uint64_t bytes = r.count * t.width;
      r.segs = static_cast<uint32_t>((bytes + kRangeHashSegment - 1) / kRangeHashSegment);
      segs += r.segs;
      ranges.push_back(r);
      EncRange d{};
      d.a = reinterpret_cast<uintptr_t>(t.old_data) + s * t.width;
      d.b = reinterpret_cast<uintptr_t>(t.new_data) + s * t.width;
      d.bytes = bytes;
      d.seg_first = r.seg_first;
      d.rec_off = ~uint64_t{0};
      d.width = static_cast<uint32_t>(t.width);
      dev_ranges.push_back(d);
    }
  }
  report.chunk_ranges = ranges.size();
  out->clear();
  if (ranges.empty()) return report;
  if (ranges.size() >= (uint64_t{1} << 32)) {
    return InvalidArgumentError("too many chunk ranges");
  }
  const uint32_t nranges = static_cast<uint32_t>(ranges.size());

  Arena arena;
  cudaStream_t st = nullptr;
  REFIT_ENC_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{st};
  EncRange* d_ranges;
  uint64_t *d_before, *d_after;
  uint32_t *d_counts, *d_seg_rec;
  REFIT_RETURN_IF_ERROR(arena.Get(dev_ranges.size(), &d_ranges));
  REFIT_RETURN_IF_ERROR(arena.Get(2 * segs, &d_before));
  REFIT_RETURN_IF_ERROR(arena.Get(2 * segs, &d_after));
  REFIT_RETURN_IF_ERROR(arena.Get(segs, &d_counts));
  REFIT_RETURN_IF_ERROR(arena.Get(segs, &d_seg_rec));
  REFIT_ENC_CUDA(cudaMemcpyAsync(d_ranges, dev_ranges.data(),
                                 dev_ranges.size() * sizeof(EncRange),
                                 cudaMemcpyHostToDevice, st), "copy ranges");
  cudaEvent_t e0, e1;
  REFIT_ENC_CUDA(cudaEventCreate(&e0), "event");
  REFIT_ENC_CUDA(cudaEventCreate(&e1), "event");
  REFIT_ENC_CUDA(cudaEventRecord(e0, st), "record");
  internal::DetectKernel<<<static_cast<unsigned>((segs + 7) / 8), 256, 0, st>>>(
      d_ranges, nranges, segs, d_before, d_after, d_counts);
  REFIT_ENC_CUDA(cudaGetLastError(), "detect launch");
  REFIT_ENC_CUDA(cudaEventRecord(e1, st), "record");
  std::vector<Hash128> before(segs), after(segs);
  std::vector<uint32_t> counts(segs);
  static_assert(sizeof(Hash128) == 16);
  REFIT_ENC_CUDA(cudaMemcpyAsync(before.data(), d_before, 16 * segs,
                                 cudaMemcpyDeviceToHost, st), "copy digests");
  REFIT_ENC_CUDA(cudaMemcpyAsync(after.data(), d_after, 16 * segs,
                                 cudaMemcpyDeviceToHost, st), "copy digests");
  REFIT_ENC_CUDA(cudaMemcpyAsync(counts.data(), d_counts, 4 * segs,
                                 cudaMemcpyDeviceToHost, st), "copy counts");
  REFIT_ENC_CUDA(cudaStreamSynchronize(st), "detect");
  float detect_ms = 0;
  cudaEventElapsedTime(&detect_ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  report.detect_ms = detect_ms;

  // Per-range record counts and per-segment record offsets.
  std::vector<uint32_t> seg_rec(segs);
  for (HostRange& r : ranges) {
    uint64_t k = 0;
    for (uint32_t j = 0; j < r.segs; ++j) {
      seg_rec[r.seg_first + j] = static_cast<uint32_t>(k);
      k += counts[r.seg_first + j];
    }
    r.k = k;
    // EncodeChunkRange tries dense encodings from k * 16 >= count on.
    r.gpu = k > 0 && k * 16 < r.count;
  }
  REFIT_ENC_CUDA(cudaMemcpyAsync(d_seg_rec, seg_rec.data(), 4 * segs,
                                 cudaMemcpyHostToDevice, st), "copy offsets");

  std::vector<std::vector<uint8_t>> chunk_bytes(ranges.size());
  std::vector<ChunkHeader> headers(ranges.size());
  auto header_of = [&](const HostRange& r) {
    ChunkHeader h;
    h.kind = codec::ChunkKind::kSparseXor;
    h.width = static_cast<uint8_t>(pairs[r.pair].width);
    h.version = opt.version;
    h.base_version = opt.base_version;
    h.tensor_id = pairs[r.pair].tensor_id;
    h.start = r.start;
    h.count = r.count;
    h.changed = r.k;
    h.before = HashSegmentDigests(before.data() + r.seg_first, r.segs);
    h.after = HashSegmentDigests(after.data() + r.seg_first, r.segs);
    return h;
  };

  // Groups of consecutive ranges whose records fit the staging budget.
  const size_t base_allocs = arena.size();
  // Chunk framing of group g runs on the host while group g + 1 goes
  // through the GPU; its streams sit in page-locked buffer g % 2. At most
  // one framing is in flight, and it is waited for before any return
  // (the future is destroyed before what it writes).
  thread_local PinnedHost pinned_streams[2];
  std::future<double> framing;
  uint64_t group_index = 0;
  size_t g0 = 0;
  while (g0 < ranges.size()) {
    uint64_t need = 0;
    size_t g1 = g0;
    for (; g1 < ranges.size(); ++g1) {
      const HostRange& r = ranges[g1];
      const uint64_t w = pairs[r.pair].width;
      const uint64_t more = r.gpu ? r.k * (4 + w + 2 * (4 + w)) + 64 : 0;
      if (g1 > g0 && need + more > opt.staging_bytes) break;
      need += more;
    }
    ++report.groups;
    auto lap = std::chrono::steady_clock::now();
    auto take = [&lap](double* into) {
      const auto now = std::chrono::steady_clock::now();
      *into += std::chrono::duration<double, std::milli>(now - lap).count();
      lap = now;
    };
    // CPU fallback for dense-prone ranges of this group.
    for (size_t i = g0; i < g1; ++i) {
      const HostRange& r = ranges[i];
      if (r.k == 0 || r.gpu) continue;
      const uint64_t w = pairs[r.pair].width;
      std::vector<uint8_t> a(r.count * w), b(r.count * w);
      REFIT_ENC_CUDA(cudaMemcpy(a.data(), HostPtr(dev_ranges[i].a), a.size(),
                                cudaMemcpyDeviceToHost), "copy range");
      REFIT_ENC_CUDA(cudaMemcpy(b.data(), HostPtr(dev_ranges[i].b), b.size(),
                                cudaMemcpyDeviceToHost), "copy range");
      ChunkHeader ids = header_of(r);
      ChunkEncodeOptions copt;
      copt.codec.records_per_lane = opt.records_per_lane;
      EncodeScratch scratch;
      ChunkResult res;
      REFIT_RETURN_IF_ERROR(EncodeChunkRange(ids, a.data(), b.data(), 0, r.count,
                                             copt, &scratch, &res));
      res.header.start = r.start;
      auto pc = ParseChunk(res.chunk);
      REFIT_RETURN_IF_ERROR(pc.status());
      std::vector<uint8_t> payload(pc->payload.begin(), pc->payload.end());
      headers[i] = res.header;
      SerializeChunk(res.header, payload, &chunk_bytes[i]);
      ++report.cpu_chunks;
    }
    take(&report.cpu_fallback_ms);
    // GPU chunks: staging layout.
    std::vector<uint32_t> list;
    uint64_t recs = 0, val_bytes = 0;
    for (size_t i = g0; i < g1; ++i) {
      HostRange& r = ranges[i];
      if (!r.gpu) continue;
      list.push_back(static_cast<uint32_t>(i));
      recs += r.k;
      val_bytes += (r.k * pairs[r.pair].width + 15) / 16 * 16;
    }
    if (list.empty()) {
      g0 = g1;
      continue;
    }
    const uint32_t nchunks = static_cast<uint32_t>(list.size());
    std::vector<EncChunk> ec(nchunks);
    {
      uint64_t ro = 0, vo = 0;
      std::vector<EncRange> upd(dev_ranges.begin() + g0, dev_ranges.begin() + g1);
      for (uint32_t c = 0; c < nchunks; ++c) {
        const HostRange& r = ranges[list[c]];
        const uint32_t w = static_cast<uint32_t>(pairs[r.pair].width);
        ec[c] = EncChunk{};
        ec[c].rec_off = ro;
        ec[c].val_off = vo;
        ec[c].k = static_cast<uint32_t>(r.k);
        ec[c].width = w;
        upd[list[c] - g0].rec_off = ro;
        upd[list[c] - g0].val_off = vo;
        ro += r.k;
        vo += (r.k * w + 15) / 16 * 16;
      }
      REFIT_ENC_CUDA(cudaMemcpyAsync(d_ranges + g0, upd.data(),
                                     upd.size() * sizeof(EncRange),
                                     cudaMemcpyHostToDevice, st), "copy ranges");
      REFIT_ENC_CUDA(cudaStreamSynchronize(st), "sync");
    }
    uint32_t* d_pos;
    uint8_t* d_vals;
    EncChunk* d_chunks;
    uint32_t *d_hist, *d_maxgap;
    REFIT_RETURN_IF_ERROR(arena.Get(recs, &d_pos));
    REFIT_RETURN_IF_ERROR(arena.Get(val_bytes, &d_vals));
    REFIT_RETURN_IF_ERROR(arena.Get(nchunks, &d_chunks));
    REFIT_RETURN_IF_ERROR(arena.Get(uint64_t{nchunks} * internal::kPlanes * 256, &d_hist));
    REFIT_RETURN_IF_ERROR(arena.Get(nchunks, &d_maxgap));
    REFIT_ENC_CUDA(cudaMemcpyAsync(d_chunks, ec.data(), nchunks * sizeof(EncChunk),
                                   cudaMemcpyHostToDevice, st), "copy chunks");
    const uint64_t seg_begin = ranges[g0].seg_first;
    const uint64_t seg_end = ranges[g1 - 1].seg_first + ranges[g1 - 1].segs;
    internal::CompactKernel<<<static_cast<unsigned>((seg_end - seg_begin + 7) / 8),
                              256, 0, st>>>(d_ranges, nranges, seg_begin, seg_end,
                                            d_seg_rec, d_pos, d_vals);
    REFIT_ENC_CUDA(cudaGetLastError(), "compact launch");
    internal::HistKernel<<<nchunks, 256, 0, st>>>(d_chunks, d_pos, d_vals, d_hist,
                                                  d_maxgap);
    REFIT_ENC_CUDA(cudaGetLastError(), "histogram launch");
    thread_local PinnedHost pinned_hist;
    const uint64_t hist_n = uint64_t{nchunks} * internal::kPlanes * 256;
    REFIT_RETURN_IF_ERROR(pinned_hist.Reserve(4 * hist_n));
    std::span<uint32_t> hist(reinterpret_cast<uint32_t*>(pinned_hist.data()),
                             hist_n);
    std::vector<uint32_t> maxgap(nchunks);
    REFIT_ENC_CUDA(cudaMemcpyAsync(hist.data(), d_hist, 4 * hist.size(),
                                   cudaMemcpyDeviceToHost, st), "copy histograms");
    REFIT_ENC_CUDA(cudaMemcpyAsync(maxgap.data(), d_maxgap, 4 * nchunks,
                                   cudaMemcpyDeviceToHost, st), "copy gaps");
    REFIT_ENC_CUDA(cudaStreamSynchronize(st), "histograms");
    take(&report.compact_ms);

    // Models, exactly as EncodeSparseW chooses them.
    std::vector<HostChunk> hc(nchunks);
    ParallelForEach(nchunks, threads, [&](size_t c, int) {
      const HostRange& r = ranges[list[c]];
      const int w = pairs[r.pair].width;
      const uint32_t n = static_cast<uint32_t>(r.count);
      const uint32_t k = static_cast<uint32_t>(r.k);
      const int gw = GapWidthFor(maxgap[c]);
      HostChunk& h = hc[c];
      h.range = list[c];
      h.header.push_back(static_cast<uint8_t>(gw));
      EncChunk& e = ec[c];
      for (int j = 0; j < gw + w; ++j) {
        const bool is_gap = j < gw;
        const int plane = is_gap ? j : 4 + (j - gw);
        codec::Histogram hh;
        const uint32_t* src = hist.data() + (uint64_t{c} * internal::kPlanes + plane) * 256;
        for (int s = 0; s < 256; ++s) hh[s] = src[s];
        const codec::GapContext ctx{is_gap, n, k, is_gap ? j : 0};
        uint64_t cost;
        const codec::Model m = codec::ChooseModel(hh, ctx, &cost);
        codec::WriteModel(m, &h.header);
        if (!m.coded()) continue;
        EncTable t{};
        t.t = static_cast<uint32_t>(m.t);
        std::memcpy(t.f, m.f.data(), sizeof(t.f));
        h.tables.push_back(t);
        e.shift[e.coded++] = static_cast<uint8_t>(is_gap ? 8 * j : 64 + 8 * (j - gw));
      }
      e.lanes = static_cast<uint32_t>(
          codec::ChooseLanes(k, opt.records_per_lane, e.coded > 0));
    });
    take(&report.models_ms);
    std::vector<EncTable> tables;
    uint64_t words = 0;
    uint32_t lanes = 0, max_coded = 0;
    for (uint32_t c = 0; c < nchunks; ++c) {
      EncChunk& e = ec[c];
      e.table_first = static_cast<uint32_t>(tables.size());
      tables.insert(tables.end(), hc[c].tables.begin(), hc[c].tables.end());
      e.word_off = words;
      words += uint64_t{e.k} * e.coded;
      e.lane_first = lanes;
      lanes += e.lanes;
      max_coded = std::max(max_coded, e.coded);
    }
    EncTable* d_tables;
    uint16_t* d_words;
    uint32_t *d_state, *d_used;
    uint64_t *d_sizes, *d_offs;
    REFIT_RETURN_IF_ERROR(arena.Get(std::max<size_t>(tables.size(), 1), &d_tables));
    REFIT_RETURN_IF_ERROR(arena.Get(words + 1, &d_words));
    REFIT_RETURN_IF_ERROR(arena.Get(lanes, &d_state));
    REFIT_RETURN_IF_ERROR(arena.Get(lanes, &d_used));
    REFIT_RETURN_IF_ERROR(arena.Get(nchunks, &d_sizes));
    REFIT_RETURN_IF_ERROR(arena.Get(nchunks, &d_offs));
    REFIT_ENC_CUDA(cudaMemcpyAsync(d_chunks, ec.data(), nchunks * sizeof(EncChunk),
                                   cudaMemcpyHostToDevice, st), "copy chunks");
    if (!tables.empty()) {
      REFIT_ENC_CUDA(cudaMemcpyAsync(d_tables, tables.data(),
                                     tables.size() * sizeof(EncTable),
                                     cudaMemcpyHostToDevice, st), "copy tables");
    }
    const int smem = static_cast<int>(max_coded * 256 * sizeof(internal::EncSym));
    REFIT_ENC_CUDA(cudaFuncSetAttribute(internal::EncodeLanesKernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        std::max(smem, 1)), "attribute");
    internal::EncodeLanesKernel<<<nchunks, 256, smem, st>>>(
        d_chunks, d_tables, d_pos, d_vals, d_words, d_state, d_used);
    REFIT_ENC_CUDA(cudaGetLastError(), "encode launch");
    internal::StreamSizeKernel<<<(nchunks + 127) / 128, 128, 0, st>>>(
        d_chunks, nchunks, d_used, d_sizes);
    REFIT_ENC_CUDA(cudaGetLastError(), "size launch");
    size_t temp_bytes = 0;
    REFIT_ENC_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, d_sizes,
                                                 d_offs, nchunks, st), "scan");
    uint8_t* d_temp;
    REFIT_RETURN_IF_ERROR(arena.Get(temp_bytes, &d_temp));
    REFIT_ENC_CUDA(cub::DeviceScan::ExclusiveSum(d_temp, temp_bytes, d_sizes,
                                                 d_offs, nchunks, st), "scan");
    std::vector<uint64_t> sizes(nchunks), offs(nchunks);
    REFIT_ENC_CUDA(cudaMemcpyAsync(sizes.data(), d_sizes, 8 * nchunks,
                                   cudaMemcpyDeviceToHost, st), "copy sizes");
    REFIT_ENC_CUDA(cudaMemcpyAsync(offs.data(), d_offs, 8 * nchunks,
                                   cudaMemcpyDeviceToHost, st), "copy offsets");
    REFIT_ENC_CUDA(cudaStreamSynchronize(st), "encode");
    take(&report.encode_ms);
    const uint64_t total = offs.back() + sizes.back();
    uint8_t* d_out;
    REFIT_RETURN_IF_ERROR(arena.Get(total, &d_out));
    internal::GatherKernel<<<nchunks, 256, 0, st>>>(d_chunks, d_words, d_state,
                                                    d_used, d_offs, d_out);
    REFIT_ENC_CUDA(cudaGetLastError(), "gather launch");
    PinnedHost& pinned = pinned_streams[group_index++ % 2];
    REFIT_RETURN_IF_ERROR(pinned.Reserve(total));
    std::span<const uint8_t> streams(pinned.data(), total);
    REFIT_ENC_CUDA(cudaMemcpyAsync(pinned.data(), d_out, total,
                                   cudaMemcpyDeviceToHost, st), "copy streams");
    REFIT_ENC_CUDA(cudaStreamSynchronize(st), "gather");
    take(&report.gather_ms);
    if (framing.valid()) report.frame_ms += framing.get();
    framing = std::async(
        std::launch::async,
        [&, streams, list = std::move(list), hc = std::move(hc),
         offs = std::move(offs), sizes = std::move(sizes), nchunks]() mutable {
          const auto f0 = std::chrono::steady_clock::now();
          ParallelForEach(nchunks, threads, [&](size_t c, int) {
            const uint32_t i = list[c];
            std::vector<uint8_t> payload = std::move(hc[c].header);
            payload.insert(payload.end(),
                           streams.begin() + static_cast<ptrdiff_t>(offs[c]),
                           streams.begin() +
                               static_cast<ptrdiff_t>(offs[c] + sizes[c]));
            headers[i] = header_of(ranges[i]);
            SerializeChunk(headers[i], payload, &chunk_bytes[i]);
          });
          return std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - f0).count();
        });
    arena.Release(base_allocs);
    g0 = g1;
  }
  if (framing.valid()) report.frame_ms += framing.get();
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].k == 0) continue;
    GpuEncodedChunk c;
    c.pair = ranges[i].pair;
    c.header = headers[i];
    c.bytes = std::move(chunk_bytes[i]);
    ++report.chunks;
    report.changed_elements += ranges[i].k;
    report.chunk_bytes += c.bytes.size();
    out->push_back(std::move(c));
  }
  report.peak_device_bytes = arena.peak();
  report.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace refit::cuda
