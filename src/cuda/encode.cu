// GPU delta encoder (encoder.h): change detection and segment hashes,
// compaction, byte-plane histograms, rANS lane encoding and stream
// assembly on the device (the kernels below); model choice and chunk
// framing on the host with the CPU encoder's own functions, so the bytes
// match EncodeChunkRange. The host's planning is encode_plan.h's; the
// DeviceEncoder class below runs a call's stages.
#include "cuda/encoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <initializer_list>
#include <optional>
#include <span>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "base/hash.h"
#include "base/parallel.h"
#include "codec/sparse_plane.h"
#include "cuda/cuda_common.h"
#include "cuda/encode_plan.h"
#include "cuda/xxh3.cuh"
#include "delta/chunk.h"
#include "delta/encoder.h"

namespace refit::cuda {
namespace internal {
namespace {

constexpr uint64_t kSeg = 64 * 1024;
constexpr uint32_t kRansLowE = 1u << 16;

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

// Change bits of the 8 bytes whose XOR is x: bit e for element e, without
// a branch (per element, the OR of its bits folded into its lowest bit,
// then those bits gathered by one multiplication).
__device__ inline uint32_t WordBits(uint64_t x, uint32_t w) {
  switch (w) {
    case 1: {
      uint64_t y = x | (x >> 4);
      y |= y >> 2;
      y |= y >> 1;
      y &= 0x0101010101010101ULL;
      return static_cast<uint32_t>((y * 0x0102040810204080ULL) >> 56);
    }
    case 2: {
      uint64_t y = x | (x >> 8);
      y |= y >> 4;
      y |= y >> 2;
      y |= y >> 1;
      y &= 0x0001000100010001ULL;
      return static_cast<uint32_t>((y * 0x0001000200040008ULL) >> 48) & 0xf;
    }
    case 4:
      return static_cast<uint32_t>((x & 0xffffffffULL) != 0) |
             static_cast<uint32_t>((x >> 32) != 0) << 1;
    default:
      return static_cast<uint32_t>(x != 0);
  }
}

// Change bits of the 16 bytes whose XOR is (lo, hi): bit e for element e.
__device__ inline uint32_t Bits16(uint64_t lo, uint64_t hi, uint32_t w) {
  return WordBits(lo, w) | WordBits(hi, w) << (8 / w);
}

// XOR of the w-byte elements at p and q; kAligned: both are w-aligned.
template <bool kAligned>
__device__ inline uint64_t XorAt(const uint8_t* p, const uint8_t* q, uint32_t w) {
  if constexpr (kAligned) return LoadWord(p, w) ^ LoadWord(q, w);
  uint64_t v = 0;
  for (uint32_t j = 0; j < w; ++j) {
    v |= uint64_t{static_cast<uint8_t>(p[j] ^ q[j])} << (8 * j);
  }
  return v;
}

// Compares elements [e0, e) of a and b (e0 a multiple of 32) 32 at a
// time: one mask word each (lane 0 stores it), and the lane's count.
template <bool kAligned>
__device__ inline uint32_t CompareTail(const uint8_t* a, const uint8_t* b,
                                       uint32_t w, uint64_t e0, uint64_t e,
                                       uint32_t* mask) {
  const uint32_t lane = threadIdx.x & 31;
  uint32_t count = 0;
  for (uint64_t x = e0; x < e; x += 32) {
    const uint64_t i = x + lane;
    const bool changed = i < e && XorAt<kAligned>(a + i * w, b + i * w, w) != 0;
    const uint32_t word = __ballot_sync(0xffffffffu, changed);
    count += changed ? 1 : 0;
    if (lane == 0) mask[x / 32] = word;
  }
  return count;
}

// Step 1: one warp per 64 KiB segment of the window [seg_begin, seg_end):
// both digests, the changed count, and the segment's change mask (bit i of
// word i / 32 for element i). The common case (16-byte aligned, > 240
// bytes) reads each byte once: the 16-byte pairs XXH3's warp loop loads
// are compared as they come in.
// 3 blocks of 8 warps per multiprocessor (<= 85 registers, a few bytes
// spilled): more loads in flight. On an H200 with the 32 GiB benchmark
// (docs/benchmarks.md) this took the kernel from 30 ms (102 registers, 2
// blocks) to 26; 4 blocks of 4 warps measured the same, 8 of 4 (64
// registers, more spills) 30.
constexpr int kDetectThreads = 256;
constexpr int kDetectMinBlocks = 3;
__global__ void __launch_bounds__(kDetectThreads, kDetectMinBlocks)
    DetectKernel(const EncRange* ranges, uint32_t nranges,
                             uint64_t seg_begin, uint64_t seg_end,
                             uint32_t* mask, uint64_t mask_base,
                             uint64_t* before, uint64_t* after,
                             uint32_t* counts) {
  const uint64_t s =
      seg_begin + (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  if (s >= seg_end) return;
  const uint32_t lane = threadIdx.x & 31;
  const EncRange r = ranges[FindRange(ranges, nranges, s)];
  const uint64_t off = (s - r.seg_first) * kSeg;
  const uint64_t len = min(kSeg, r.bytes - off);
  const uint8_t* a = Ptr(r.a) + off;
  const uint8_t* b = Ptr(r.b) + off;
  const uint32_t w = r.width;
  const uint64_t elems = len / w;
  uint32_t* m = mask + (r.mask_off - mask_base) + off / w / 32;
  uint32_t count = 0;
  H128 hb, ha;
  const uintptr_t both = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b);
  if ((both & 15) == 0 && len > 240) {
    Xxh3LongState sa, sb;
    sa.Init();
    sb.Init();
    const uint64_t nb_blocks = (len - 1) / 1024;
    const uint32_t per_word = 2 * w;  // lanes whose 16 bytes make a word
    // Block blk + 1 is loaded while block blk is hashed and compared, so
    // a warp's next loads are in flight during its arithmetic.
    uint64_t na[2][2], nb[2][2];
    auto load = [&](uint64_t blk) {
      for (int h = 0; h < 2; ++h) {
        Load16<true>(a + blk * 1024 + 16 * (lane + 32 * h), &na[h][0], &na[h][1]);
        Load16<true>(b + blk * 1024 + 16 * (lane + 32 * h), &nb[h][0], &nb[h][1]);
      }
    };
    if (nb_blocks > 0) load(0);
    for (uint64_t blk = 0; blk < nb_blocks; ++blk) {
      uint64_t da[2][2], db[2][2];
      for (int h = 0; h < 2; ++h) {
        for (int j = 0; j < 2; ++j) {
          da[h][j] = na[h][j];
          db[h][j] = nb[h][j];
        }
      }
      if (blk + 1 < nb_blocks) load(blk + 1);
      sa.Block(da);
      sb.Block(db);
      for (int h = 0; h < 2; ++h) {
        const uint32_t bits = Bits16(da[h][0] ^ db[h][0], da[h][1] ^ db[h][1], w);
        count += __popc(bits);
        uint32_t word = bits << ((lane % per_word) * (16 / w));
        for (uint32_t o = 1; o < per_word; o <<= 1) {
          word |= __shfl_xor_sync(0xffffffffu, word, o);
        }
        if (lane % per_word == 0) {
          m[blk * 32 / w + h * (16 / w) + lane / per_word] = word;
        }
      }
    }
    hb = sa.Finish<true>(a, len);
    ha = sb.Finish<true>(b, len);
    const bool aligned_w = (both & (w - 1)) == 0;
    count += aligned_w ? CompareTail<true>(a, b, w, nb_blocks * 1024 / w, elems, m)
                       : CompareTail<false>(a, b, w, nb_blocks * 1024 / w, elems, m);
    count = __reduce_add_sync(0xffffffffu, count);
  } else {
    count = (both & (w - 1)) == 0 ? CompareTail<true>(a, b, w, 0, elems, m)
                                  : CompareTail<false>(a, b, w, 0, elems, m);
    count = __reduce_add_sync(0xffffffffu, count);
    hb = Xxh3Warp(a, len);
    ha = count != 0 ? Xxh3Warp(b, len) : hb;
  }
  if (lane == 0) {
    before[2 * s] = hb.lo;
    before[2 * s + 1] = hb.hi;
    after[2 * s] = ha.lo;
    after[2 * s + 1] = ha.hi;
    counts[s] = count;
  }
}

// Step 1b: one warp per range of the window: its range hashes (docs/format.md
// section 2: the XXH3-128 of its segment digests, lo then hi, little-endian),
// "before" and "after", into rb and ra (two words a range).
__global__ void RangeDigestKernel(const EncRange* ranges, uint32_t r0, uint32_t r1,
                                  const uint64_t* before, const uint64_t* after,
                                  uint64_t* rb, uint64_t* ra) {
  const uint64_t i = r0 + (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  if (i >= r1) return;
  const EncRange r = ranges[i];
  const uint64_t segs = (r.bytes + kSeg - 1) / kSeg;
  const H128 hb = Xxh3Warp(reinterpret_cast<const uint8_t*>(before + 2 * r.seg_first),
                           16 * segs);
  const H128 ha = Xxh3Warp(reinterpret_cast<const uint8_t*>(after + 2 * r.seg_first),
                           16 * segs);
  if ((threadIdx.x & 31) == 0) {
    rb[2 * i] = hb.lo;
    rb[2 * i + 1] = hb.hi;
    ra[2 * i] = ha.lo;
    ra[2 * i + 1] = ha.hi;
  }
}

// Step 2a: one warp per segment of a compacted range: positions (relative
// to the range start) and XOR values of the changed elements, in order,
// from the segment's change mask; only the changed elements of the tensors
// are read. seg_rec[s]: records of the range before segment s. Each round
// of 32 mask words lists its changed elements in shared memory, then the
// lanes take one listed element each (their loads in flight together,
// their stores coalesced).
constexpr int kCompactWarps = 8;
__global__ void __launch_bounds__(32 * kCompactWarps)
    CompactKernel(const EncRange* ranges, uint32_t nranges, uint64_t seg_begin,
                  uint64_t seg_end, const uint32_t* mask, uint64_t mask_base,
                  const uint32_t* seg_rec, uint32_t* pos, uint8_t* vals) {
  __shared__ uint32_t list[kCompactWarps][32 * 32];
  const uint64_t s =
      seg_begin + (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  if (s >= seg_end) return;
  const uint32_t lane = threadIdx.x & 31;
  uint32_t* mine = list[threadIdx.x / 32];
  const EncRange r = ranges[FindRange(ranges, nranges, s)];
  if (r.rec_off == ~uint64_t{0}) return;
  const uint64_t off = (s - r.seg_first) * kSeg;
  const uint64_t len = min(kSeg, r.bytes - off);
  const uint8_t* a = Ptr(r.a) + off;
  const uint8_t* b = Ptr(r.b) + off;
  const uint32_t w = r.width;
  const uint32_t elem0 = static_cast<uint32_t>(off / w);
  const uint32_t words = static_cast<uint32_t>((len / w + 31) / 32);
  const uint32_t* m = mask + (r.mask_off - mask_base) + elem0 / 32;
  const uint64_t first = seg_rec[s];  // record index within the range
  uint32_t* pout = pos + r.rec_off + first;
  uint8_t* vout = vals + r.val_off + first * w;
  const bool aligned_w =
      ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & (w - 1)) == 0;
  uint32_t run = 0;
  for (uint32_t base = 0; base < words; base += 32) {
    const uint32_t j = base + lane;
    uint32_t word = j < words ? __ldg(m + j) : 0;
    const uint32_t c = __popc(word);
    uint32_t incl = c;
    for (int d = 1; d < 32; d <<= 1) {
      const uint32_t v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= static_cast<uint32_t>(d)) incl += v;
    }
    const uint32_t total = __shfl_sync(0xffffffffu, incl, 31);
    for (uint32_t at = incl - c; word != 0; word &= word - 1) {
      mine[at++] = 32 * j + (__ffs(word) - 1);
    }
    __syncwarp();
    for (uint32_t i = lane; i < total; i += 32) {
      const uint32_t e = mine[i];
      const uint64_t v = aligned_w ? XorAt<true>(a + uint64_t{e} * w, b + uint64_t{e} * w, w)
                                   : XorAt<false>(a + uint64_t{e} * w, b + uint64_t{e} * w, w);
      pout[run + i] = elem0 + e;
      StoreWord(vout + uint64_t{run + i} * w, v, w);
    }
    __syncwarp();
    run += total;
  }
}

__device__ inline uint32_t GapAt(const uint32_t* pos, uint32_t i) {
  return i == 0 ? pos[0] : pos[i] - pos[i - 1] - 1;
}

// Step 2b: `slices` blocks per GPU chunk, each over its share of the
// chunk's records: the 4 gap-byte and w value-byte histograms (as
// EncodeSparse counts them, codec::SparsePlane::histogram) and the largest
// gap, added into hist and max_gap (zeroed before). Zero bytes are not
// counted (the high gap and value bytes are nearly all zero, and threads
// adding to one bin serialize): the host sets each plane's zero count to k
// minus its other bins (internal::FullHistograms).
__global__ void __launch_bounds__(256)
    HistKernel(const EncChunk* chunks, uint32_t slices, const uint32_t* pos,
               const uint8_t* vals, uint32_t* hist, uint32_t* max_gap) {
  const uint32_t chunk = blockIdx.x / slices, slice = blockIdx.x % slices;
  const EncChunk c = chunks[chunk];
  __shared__ uint32_t h[kEncPlanes * 256];
  __shared__ uint32_t s_max;
  for (uint32_t i = threadIdx.x; i < kEncPlanes * 256; i += blockDim.x) h[i] = 0;
  if (threadIdx.x == 0) s_max = 0;
  __syncthreads();
  const uint32_t* p = pos + c.rec_off;
  const uint8_t* v = vals + c.val_off;
  const uint32_t first = static_cast<uint32_t>(uint64_t{c.k} * slice / slices);
  const uint32_t last = static_cast<uint32_t>(uint64_t{c.k} * (slice + 1) / slices);
  uint32_t mx = 0;
  for (uint32_t i = first + threadIdx.x; i < last; i += blockDim.x) {
    const uint32_t g = GapAt(p, i);
    mx = max(mx, g);
    for (int j = 0; j < codec::kSparseGapBytes; ++j) {
      const uint32_t sym = (g >> (8 * j)) & 0xff;
      if (sym != 0) atomicAdd(&h[codec::SparsePlane::Gap(j).histogram() * 256 + sym], 1u);
    }
    const uint64_t x = LoadWord(v + uint64_t{i} * c.width, c.width);
    for (uint32_t j = 0; j < c.width; ++j) {
      const uint32_t sym = static_cast<uint32_t>(x >> (8 * j)) & 0xff;
      const int plane = codec::SparsePlane::Value(static_cast<int>(j)).histogram();
      if (sym != 0) atomicAdd(&h[plane * 256 + sym], 1u);
    }
  }
  atomicMax(&s_max, mx);
  __syncthreads();
  uint32_t* out = hist + uint64_t{chunk} * kEncPlanes * 256;
  for (uint32_t i = threadIdx.x; i < (codec::kSparseGapBytes + c.width) * 256;
       i += blockDim.x) {
    if (h[i] != 0) atomicAdd(&out[i], h[i]);
  }
  if (threadIdx.x == 0) atomicMax(&max_gap[chunk], s_max);
}

// Step 4a, first: one block per (GPU chunk, coded plane): the plane's encoder
// symbols, {rcp low, rcp high, x_max - 1, cum | (2^t - f) << 16} with rcp =
// ceil(2^(32+t) / f), so that x / f = (x * rcp) >> (32 + t) for every state
// x < x_max (f <= 2^t and t <= 15: every field fits). Absent symbols are
// never looked up.
__global__ void __launch_bounds__(256)
    SymbolKernel(const EncChunk* chunks, const EncTable* tables, uint4* syms) {
  const EncChunk& c = chunks[blockIdx.x];
  if (blockIdx.y >= c.coded) return;  // the whole block
  using Scan = cub::BlockScan<uint32_t, 256>;
  __shared__ typename Scan::TempStorage temp;
  const uint32_t table = c.table_first + blockIdx.y;
  const EncTable& tb = tables[table];
  const uint32_t t = tb.t, f = tb.f[threadIdx.x];
  uint32_t cum;
  Scan(temp).ExclusiveSum(f, cum);
  uint4 e{0, 0, 0, 0};
  if (f != 0) {
    const uint64_t rcp = ((uint64_t{1} << (32 + t)) + f - 1) / f;
    e.x = static_cast<uint32_t>(rcp);
    e.y = static_cast<uint32_t>(rcp >> 32);
    e.z = static_cast<uint32_t>((uint64_t{f} << (32 - t)) - 1);
    e.w = cum | (((1u << t) - f) << 16);
  }
  syms[uint64_t{table} * 256 + threadIdx.x] = e;
}

// Step 4a: one block per GPU chunk, thread j encodes lane j exactly as
// codec::EncodeStream does: records j + mL in reverse, coded planes in
// reverse, words written backwards into the lane's region. A lane is a
// serial chain (each symbol's state depends on the one before), and a
// group leaves most warp slots empty (3%: ~90 blocks of ~120 lanes), so
// only what depends on the state is left on the chain: plane shifts and
// scales sit in registers (NC >= the group's most coded planes, unrolled),
// a record's symbols are looked up while the record before is coded, and
// records are loaded a batch ahead.
template <int NC>
__global__ void __launch_bounds__(256)
    EncodeLanesKernel(const EncChunk* __restrict__ chunks, const uint4* __restrict__ syms,
                      const uint32_t* __restrict__ pos, const uint8_t* __restrict__ vals,
                      uint16_t* __restrict__ words, uint32_t* __restrict__ lane_state,
                      uint32_t* __restrict__ lane_used) {
  const EncChunk& c = chunks[blockIdx.x];
  const uint32_t nc = c.coded, L = c.lanes, k = c.k, width = c.width;
  extern __shared__ uint4 s_sym[];
  const uint4* gs = syms + uint64_t{c.table_first} * 256;
  // Planes past nc are zeros, so that lookups need no guard (see below).
  for (uint32_t i = threadIdx.x; i < NC * 256; i += blockDim.x) {
    s_sym[i] = i < nc * 256 ? gs[i] : make_uint4(0, 0, 0, 0);
  }
  __syncthreads();
  const uint32_t tid = threadIdx.x;
  if (tid >= L) return;
  const uint32_t recs = k / L + (tid < k % L ? 1 : 0);
  uint16_t* const out = words + LaneRegionEnd(c, tid);
  uint16_t* p = out;
  uint32_t x = kRansLowE;
  if (nc > 0 && recs > 0) {
    uint32_t shift[NC], scale[NC];
#pragma unroll
    for (int q = 0; q < NC; ++q) {
      shift[q] = q < nc ? c.shift[q] : 0;
      scale[q] = q < nc ? c.scale[q] : 0;
    }
    const uint32_t* ps = pos + c.rec_off;
    const uint8_t* vs = vals + c.val_off;
    constexpr uint32_t kBatch = NC <= 6 ? 16 : 8;
    // Raw, unconditional loads straight into the batch's registers (a
    // record past the lane's end loads record tid instead): a guarded load
    // lands in a temporary and its move waits for the data at once. Gaps
    // and values are formed when the batch is coded.
    const uint32_t* vw = reinterpret_cast<const uint32_t*>(vs);  // 16-byte aligned
    const uint32_t vmask = width >= 4 ? ~0u : (1u << (8 * width)) - 1;
    uint32_t next_pos[kBatch], next_prev[kBatch], next_lo[kBatch], next_hi[kBatch];
    auto load_batch = [&](uint32_t top) {
#pragma unroll
      for (uint32_t j = 0; j < kBatch; ++j) {
        const uint32_t i = tid + (j < top ? top - 1 - j : 0) * L;
        const uint64_t word = uint64_t{i} * width / 4;
        next_pos[j] = ps[i];
        next_prev[j] = ps[i - (i != 0 ? 1 : 0)];
        next_lo[j] = vw[word];
        next_hi[j] = vw[word + (width == 8 ? 1 : 0)];
      }
    };
    auto lookup = [&](uint32_t gap, uint64_t val, uint4* e) {
#pragma unroll
      for (int q = 0; q < NC; ++q) {
        const uint32_t sh = shift[q];
        const uint32_t s = static_cast<uint32_t>(
            (codec::ShiftIsGap(sh) ? uint64_t{gap} >> sh
                                   : val >> (sh - codec::kSparseValueShift)) & 0xff);
        e[q] = s_sym[q * 256 + s];
      }
    };
    load_batch(recs);
    for (uint32_t top = recs; top > 0;) {
      const uint32_t nb = min(top, kBatch);
      uint32_t gaps[kBatch];
      uint64_t vals8[kBatch];
      top -= nb;
#pragma unroll
      for (uint32_t j = 0; j < kBatch; ++j) {
        // Record 0 loaded itself as its "previous": its gap is its position.
        const uint32_t gap = next_pos[j] - next_prev[j] - 1;
        gaps[j] = gap == ~0u ? next_pos[j] : gap;
        const uint32_t i = tid + (top + nb - 1 - j) * L;
        vals8[j] = width == 8 ? (uint64_t{next_hi[j]} << 32 | next_lo[j])
                              : (next_lo[j] >> (8 * (i * width & 3))) & vmask;
      }
      load_batch(max(top, 1u));  // the last batch loads one more, unused
      uint4 e[NC], en[NC];
      lookup(gaps[0], vals8[0], e);
#pragma unroll
      for (uint32_t j = 0; j < kBatch; ++j) {
        if (j >= nb) break;
        if (j + 1 < kBatch) lookup(gaps[j + 1], vals8[j + 1], en);
#pragma unroll
        for (int q = NC - 1; q >= 0; --q) {
          if (q < nc) {
            const uint4 s = e[q];
            const bool emit = x > s.z;
            p -= emit ? 1 : 0;
            if (emit) *p = static_cast<uint16_t>(x);
            x = emit ? x >> 16 : x;
            // (x * rcp) >> 32 without a 64 x 64 product.
            const uint64_t hi = uint64_t{__umulhi(x, s.x)} + uint64_t{x} * s.y;
            const uint32_t qq = static_cast<uint32_t>(hi >> scale[q]);
            x += (s.w & 0xffff) + qq * (s.w >> 16);
          }
        }
        if (j + 1 < kBatch) {
#pragma unroll
          for (int q = 0; q < NC; ++q) e[q] = en[q];
        }
      }
    }
  }
  lane_state[c.lane_first + tid] = x;
  lane_used[c.lane_first + tid] = static_cast<uint32_t>(out - p);
}

// The lane kernel for a group whose chunks code at most `coded` planes.
inline cudaError_t LaunchEncodeLanes(uint32_t coded, uint32_t nchunks, uint32_t threads,
                                     cudaStream_t st, const EncChunk* chunks,
                                     const uint4* syms, const uint32_t* pos,
                                     const uint8_t* vals, uint16_t* words,
                                     uint32_t* lane_state, uint32_t* lane_used) {
  auto launch = [&](auto kernel, uint32_t nc) {
    const int smem = static_cast<int>(nc * 256 * sizeof(uint4));
    cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    kernel<<<nchunks, threads, smem, st>>>(chunks, syms, pos, vals, words, lane_state,
                                           lane_used);
    return cudaGetLastError();
  };
  if (coded <= 2) return launch(EncodeLanesKernel<2>, 2);
  if (coded <= 4) return launch(EncodeLanesKernel<4>, 4);
  if (coded <= 6) return launch(EncodeLanesKernel<6>, 6);
  if (coded <= 8) return launch(EncodeLanesKernel<8>, 8);
  return launch(EncodeLanesKernel<kEncPlanes>, kEncPlanes);
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
  const uint32_t L = c.lanes;
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
  for (uint32_t j = 0; j < L; ++j) {
    uint8_t* d = dst + s_hdr + s_lane_off[j];
    const uint32_t used = lane_used[c.lane_first + j];
    const uint8_t* src =
        reinterpret_cast<const uint8_t*>(words + LaneRegionEnd(c, j) - used);
    if (tid < 4) d[tid] = static_cast<uint8_t>(lane_state[c.lane_first + j] >> (8 * tid));
    for (uint32_t q = tid; q < 2 * used; q += blockDim.x) d[4 + q] = src[q];
  }
}

}  // namespace
}  // namespace internal

namespace {

using internal::DeviceBuffer;
using internal::DeviceMemory;
using internal::EncChunk;
using internal::EncRange;
using internal::EncTable;
using internal::HostChunk;
using internal::HostRange;
using internal::kEncPlanes;

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
    REFIT_CUDA_RETURN(cudaHostAlloc(&p_, want, cudaHostAllocDefault),
                      "cudaHostAlloc");
    size_ = want;
    return Status::Ok();
  }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }

 private:
  void* p_ = nullptr;
  uint64_t size_ = 0;
};

// The host buffers of the calling thread, kept across its calls
// (page-locking is too slow to repeat per call, and fresh pages cost a
// fault each). "Per set" buffers belong to a front set, "per parity" ones
// to the groups of even or odd index.
struct ThreadHostBuffers {
  PinnedHost detect;    // range hashes, segment counts and record offsets
  PinnedHost hist[2];   // per set: histograms and largest gaps, back
  PinnedHost front[2];  // per set: range and chunk uploads
  PinnedHost sizes[2];  // per parity: stream sizes, then offsets, back
  PinnedHost back[2];   // per parity: chunk and table uploads
  PinnedHost streams[2];  // per parity: gathered streams, back
  // Per parity: framed chunks, handed to the sink from here.
  std::vector<uint8_t> framed[2];
};

ThreadHostBuffers& ThisThreadsHostBuffers() {
  thread_local ThreadHostBuffers buffers;
  return buffers;
}

const void* HostPtr(uint64_t a) {
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(a));
}

void DestroyEvents(std::initializer_list<cudaEvent_t> events) {
  for (cudaEvent_t e : events) {
    if (e) cudaEventDestroy(e);
  }
}

// A stream of one call, destroyed with it.
class OwnedStream {
 public:
  OwnedStream() = default;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Status Create(int priority) {
    REFIT_CUDA_RETURN(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority),
                      "stream");
    return Status::Ok();
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// One EncodeOnDevice call (encoder.h describes the steps). Run runs it once.
// Host planning (ranges, windows, groups, models, lane layout) is
// encode_plan.h's; this class owns the call's device resources and moves
// each group through the stages:
//   detect         LaunchDetect, FinishDetect (step 1, per window)
//   compact        StartGroup (step 2)
//   choose models  ChooseModels (step 3), beside EncodeOnCpu for the ranges
//                  the CPU encodes
//   encode lanes   LaunchEncode (steps 4a-b)
//   gather         GatherBack, FrameGathered (step 4c), then LaunchFraming
// EncodeGroups is the pipeline that interleaves them.
class DeviceEncoder {
 public:
  DeviceEncoder(std::span<const DeviceTensorPair> pairs, const GpuEncodeOptions& opt,
                const GpuChunkSink& sink);
  // Waits for the framing in flight, which writes into this object.
  ~DeviceEncoder();
  DeviceEncoder(const DeviceEncoder&) = delete;
  DeviceEncoder& operator=(const DeviceEncoder&) = delete;

  Result<GpuEncodeReport> Run();

 private:
  // Step 1 for a window: the ranges from w0 whose change masks fit one
  // mask buffer (at least one range). Windows alternate between the two
  // buffers. A window's detection runs on st_detect_, at low priority: it
  // is enqueued as soon as the window before has been detected, and waits
  // on the GPU only for the last compaction that read its mask buffer (the
  // window two before), so it runs while the window before is compacted
  // and encoded, and the host rarely waits for it when it forms the
  // window's first group. (At equal priority its blocks held the
  // multiprocessors that the lanes' encoding and the compactions wait for:
  // slower than detecting on st_front_ between windows.)
  struct Window {
    ~Window() { DestroyEvents({e0, e1, ready, mask_read}); }
    size_t w0 = 0, w1 = 0;     // its ranges
    uint64_t s0 = 0, s1 = 0;   // their segments
    uint64_t mask_base = 0;  // the window's first mask word
    uint32_t* d_mask = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr, ready = nullptr;
    // Recorded on st_front_ after each compaction that reads the mask.
    cudaEvent_t mask_read = nullptr;
  };

  // A group (below): consecutive ranges of one window whose records fit
  // the staging budget. Its compaction (steps 2a-b, "front") runs on
  // st_front_ in one of two buffer sets while the host chooses the previous
  // group's models; steps 4a-c ("back") run on st_.
  struct FrontSet {
    explicit FrontSet(DeviceMemory* m)
        : pos(m), vals(m), chunks(m), hist(m), maxgap(m) {}
    ~FrontSet() {
      DestroyEvents({done, lanes_done});
      DestroyEvents({t[0], t[1], t[2]});
    }
    DeviceBuffer pos, vals, chunks, hist, maxgap;
    cudaEvent_t done = nullptr;  // histograms and gaps are back
    cudaEvent_t t[3] = {};       // around the compaction and histograms
    // The lanes' encoding of the last group that used the set has read its
    // records (recorded on st_; the next compaction into the set waits).
    cudaEvent_t lanes_done = nullptr;
    bool lanes_recorded = false;
  };
  struct Group {
    size_t g0 = 0, g1 = 0;
    int set = 0;
    std::vector<uint32_t> list;  // its GPU-encoded ranges
    std::vector<EncChunk> ec;
    std::span<const uint32_t> maxgap;
    std::span<const uint32_t> hist;
    uint32_t* d_pos = nullptr;  // the front set's records
    uint8_t* d_vals = nullptr;
    EncChunk* d_chunks = nullptr;
  };

  // A group whose lanes are being encoded (steps 4a-b on st_) while the
  // host chooses the next group's models; its gathering is enqueued during
  // the next group's turn and it is framed during the turn after (by then
  // the gathering and the copy back are done, so the host does not wait for
  // them). The back buffers are one set: on st_, a group's gathering is
  // enqueued before the next group's encoding.
  struct Back {
    Group g;
    std::vector<HostChunk> hc;
    uint64_t index = 0;  // the group's place (parity of its host buffers)
  };
  // Per parity: around the lanes' encoding and the gathering; the stream
  // sizes are back; the streams are back.
  struct BackEvents {
    ~BackEvents() {
      for (int p = 0; p < 2; ++p) {
        DestroyEvents({bt[p][0], bt[p][1], bt[p][2], bt[p][3]});
        DestroyEvents({sizes_ready[p], gathered[p]});
      }
    }
    cudaEvent_t bt[2][4] = {};
    cudaEvent_t sizes_ready[2] = {}, gathered[2] = {};
  };

  // Streams, per-call buffers, events and host workers.
  Status Prepare();
  // The pipeline over all groups.
  Status EncodeGroups();

  Status LaunchDetect(size_t w0);
  Status FinishDetect();
  Status StartGroup(size_t g0, int set, Group* g);
  Status LaunchCompaction(Group* g, uint64_t records, uint32_t* d_hist,
                          uint32_t* d_maxgap);
  Status EncodeOnCpu(const Group& g);
  void ChooseModels(Group& g, std::vector<HostChunk>* hc);
  Status LaunchEncode(Group& g, const std::vector<HostChunk>& hc, uint64_t index);
  Status LaunchGather();
  Status GatherBack();
  Status FrameGathered();
  Status LaunchFraming(const Group& g, uint64_t index, std::span<const uint8_t> streams,
                       std::vector<HostChunk> hc, std::vector<uint64_t> offs,
                       std::vector<uint64_t> sizes);
  Status FrameGroup(std::vector<uint8_t>* out_buf, std::span<const uint8_t> streams,
                    size_t g0, size_t g1, const std::vector<uint32_t>& list,
                    const std::vector<HostChunk>& hc, const std::vector<uint64_t>& offs,
                    const std::vector<uint64_t>& sizes);

  ChunkHeader HeaderOf(size_t i) const {
    const HostRange& r = plan_.ranges[i];
    return internal::RangeHeader(r, pairs_[r.pair].tensor_id, opt_, before_[i], after_[i]);
  }
  // Waits for event e, adding the wait (host clock) to *wall_ms.
  static Status WaitFor(cudaEvent_t e, const char* what, double* wall_ms);
  // Elapsed GPU time between two completed events, added to *into.
  static void AddElapsed(cudaEvent_t a, cudaEvent_t b, double* into);

  const std::span<const DeviceTensorPair> pairs_;
  const GpuEncodeOptions& opt_;
  const GpuChunkSink& sink_;
  ThreadHostBuffers& host_;  // the calling thread's
  int sm_count_ = 0;
  int threads_ = 0;
  GpuEncodeReport report_;
  internal::RangePlan plan_;  // ranges as DiffTensorsToSink cuts them
  uint32_t nranges_ = 0;

  // Detection (st_detect_) streams through both tensors and is never
  // waited for at once; the compactions (st_front_) and the lanes' encoding
  // (st_) are, so their blocks go first (stream priorities).
  OwnedStream st_, st_front_, st_detect_;
  DeviceMemory mem_;

  // Per call: ranges, digests, counts, offsets, two windows' change masks.
  DeviceBuffer b_ranges_, b_before_, b_after_, b_rbefore_, b_rafter_, b_counts_,
      b_seg_rec_;
  DeviceBuffer b_mask_[2];
  EncRange* d_ranges_ = nullptr;
  uint64_t *d_before_ = nullptr, *d_after_ = nullptr;
  uint64_t *d_rbefore_ = nullptr, *d_rafter_ = nullptr;
  uint32_t *d_counts_ = nullptr, *d_seg_rec_ = nullptr;
  // Range hashes and segment counts come back into host_.detect, and the
  // per-segment record offsets go to the device from there.
  std::span<Hash128> before_, after_;
  std::span<uint32_t> counts_, seg_rec_;
  uint64_t mask_cap_words_ = 0;  // each of the two masks: half of mask_bytes

  Window windows_[2];
  size_t detected_end_ = 0;  // ranges [0, detected_end_) have counts
  int window_count_ = 0;
  Window* cur_window_ = nullptr;  // the window groups are formed in
  Window* pending_ = nullptr;     // enqueued, not yet finished

  // CPU-encoded chunks, and every chunk's header, per range.
  std::vector<std::vector<uint8_t>> chunk_bytes_;
  std::vector<ChunkHeader> headers_;

  FrontSet sets_[2];

  // Buffers of the back half, one set; chunk framing of group g runs on
  // the host while group g + 1 goes through the GPU; its streams sit in
  // host_.streams[g % 2]. At most one framing is in flight, and it is
  // waited for before any return (the destructor waits, before anything
  // it writes is destroyed).
  DeviceBuffer b_chunks_, b_tables_, b_syms_, b_words_, b_state_, b_used_, b_sizes_,
      b_offs_, b_temp_, b_out_;
  std::optional<WorkerPool> model_pool_, frame_pool_;
  std::future<Status> framing_;

  std::optional<Back> back_, in_gather_;
  BackEvents back_events_;
  // The back half's buffers as the last lane encoding left them (read by
  // the gathering that follows it on st_).
  EncChunk* d_back_chunks_ = nullptr;
  uint16_t* d_words_ = nullptr;
  uint32_t *d_state_ = nullptr, *d_used_ = nullptr;
  uint64_t *d_sizes_ = nullptr, *d_offs_ = nullptr;
  // The gathered group's stream sizes, offsets and streams.
  std::vector<uint64_t> back_sizes_, back_offs_;
  std::span<const uint8_t> back_streams_;
};

DeviceEncoder::DeviceEncoder(std::span<const DeviceTensorPair> pairs,
                             const GpuEncodeOptions& opt, const GpuChunkSink& sink)
    : pairs_(pairs),
      opt_(opt),
      sink_(sink),
      host_(ThisThreadsHostBuffers()),
      b_ranges_(&mem_),
      b_before_(&mem_),
      b_after_(&mem_),
      b_rbefore_(&mem_),
      b_rafter_(&mem_),
      b_counts_(&mem_),
      b_seg_rec_(&mem_),
      b_mask_{DeviceBuffer(&mem_), DeviceBuffer(&mem_)},
      sets_{FrontSet(&mem_), FrontSet(&mem_)},
      b_chunks_(&mem_),
      b_tables_(&mem_),
      b_syms_(&mem_),
      b_words_(&mem_),
      b_state_(&mem_),
      b_used_(&mem_),
      b_sizes_(&mem_),
      b_offs_(&mem_),
      b_temp_(&mem_),
      b_out_(&mem_) {}

DeviceEncoder::~DeviceEncoder() {
  if (framing_.valid()) framing_.wait();
}

Result<GpuEncodeReport> DeviceEncoder::Run() {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt_.chunk_bytes == 0 || opt_.chunk_bytes % kRangeHashSegment != 0) {
    return InvalidArgumentError("chunk size must be a positive multiple of 64 KiB");
  }
  if (opt_.records_per_lane == 0) {
    return InvalidArgumentError("records_per_lane must be >= 1");
  }
  REFIT_CUDA_RETURN(cudaSetDevice(opt_.device), "cudaSetDevice");
  REFIT_CUDA_RETURN(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount,
                                           opt_.device), "device attribute");
  threads_ = opt_.host_threads > 0 ? opt_.host_threads : DefaultThreads();
  REFIT_ASSIGN_OR_RETURN(plan_, internal::PlanRanges(pairs_, opt_.chunk_bytes));
  report_.chunk_ranges = plan_.ranges.size();
  if (plan_.ranges.empty()) return report_;
  if (plan_.ranges.size() >= (uint64_t{1} << 32)) {
    return InvalidArgumentError("too many chunk ranges");
  }
  nranges_ = static_cast<uint32_t>(plan_.ranges.size());
  REFIT_RETURN_IF_ERROR(Prepare());
  REFIT_RETURN_IF_ERROR(EncodeGroups());
  if (framing_.valid()) REFIT_RETURN_IF_ERROR(framing_.get());
  report_.peak_device_bytes = mem_.peak;
  report_.seconds = std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - t0).count();
  return report_;
}

Status DeviceEncoder::Prepare() {
  int prio_low = 0, prio_high = 0;
  REFIT_CUDA_RETURN(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high), "priorities");
  REFIT_RETURN_IF_ERROR(st_.Create(prio_high));
  REFIT_RETURN_IF_ERROR(st_front_.Create(prio_high));
  REFIT_RETURN_IF_ERROR(st_detect_.Create(prio_low));

  const uint64_t segs = plan_.segs, nranges = plan_.ranges.size();
  REFIT_RETURN_IF_ERROR(b_ranges_.Get(plan_.dev.size(), &d_ranges_));
  REFIT_RETURN_IF_ERROR(b_before_.Get(2 * segs, &d_before_));
  REFIT_RETURN_IF_ERROR(b_after_.Get(2 * segs, &d_after_));
  REFIT_RETURN_IF_ERROR(b_rbefore_.Get(2 * nranges, &d_rbefore_));
  REFIT_RETURN_IF_ERROR(b_rafter_.Get(2 * nranges, &d_rafter_));
  REFIT_RETURN_IF_ERROR(b_counts_.Get(segs, &d_counts_));
  REFIT_RETURN_IF_ERROR(b_seg_rec_.Get(segs, &d_seg_rec_));
  // On st_detect_, ahead of the first detection that reads them; the
  // compactions (st_front_) read them after the host has waited for a
  // detection.
  REFIT_CUDA_RETURN(cudaMemcpyAsync(d_ranges_, plan_.dev.data(),
                                    plan_.dev.size() * sizeof(EncRange),
                                    cudaMemcpyHostToDevice, st_detect_.get()),
                    "copy ranges");
  // Range hashes and segment counts come back into page-locked memory (a
  // copy into pageable memory would block the host until the detection is
  // done). Per-segment record offsets go to the device from page-locked
  // memory too: a pageable source may make the copy wait for the stream.
  REFIT_RETURN_IF_ERROR(host_.detect.Reserve(nranges * 32 + segs * 8));
  static_assert(sizeof(Hash128) == 16);
  before_ = std::span<Hash128>(reinterpret_cast<Hash128*>(host_.detect.data()), nranges);
  after_ = std::span<Hash128>(before_.data() + nranges, nranges);
  counts_ = std::span<uint32_t>(reinterpret_cast<uint32_t*>(after_.data() + nranges), segs);
  seg_rec_ = std::span<uint32_t>(counts_.data() + segs, segs);
  mask_cap_words_ = std::max<uint64_t>(opt_.mask_bytes / 8, 1);
  for (Window& w : windows_) {
    REFIT_CUDA_RETURN(cudaEventCreate(&w.e0), "event");
    REFIT_CUDA_RETURN(cudaEventCreate(&w.e1), "event");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&w.ready, cudaEventDisableTiming), "event");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&w.mask_read, cudaEventDisableTiming),
                      "event");
  }
  chunk_bytes_.resize(nranges);
  headers_.resize(nranges);
  for (FrontSet& f : sets_) {
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&f.done, cudaEventDisableTiming), "event");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&f.lanes_done, cudaEventDisableTiming),
                      "event");
    for (cudaEvent_t& e : f.t) REFIT_CUDA_RETURN(cudaEventCreate(&e), "event");
  }
  model_pool_.emplace(threads_);
  frame_pool_.emplace(std::max(1, threads_ / 4));
  BackEvents& be = back_events_;
  for (int p = 0; p < 2; ++p) {
    for (cudaEvent_t& e : be.bt[p]) REFIT_CUDA_RETURN(cudaEventCreate(&e), "event");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&be.sizes_ready[p], cudaEventDisableTiming),
                      "event");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&be.gathered[p], cudaEventDisableTiming),
                      "event");
  }
  return Status::Ok();
}

// The pipeline, per group i: its histograms are waited for; group i + 1's
// compaction is launched; the host chooses group i's models while the GPU
// compacts group i + 1, encodes group i - 1's lanes and gathers group
// i - 2; group i - 2 is framed (its gathering is done by then, so the
// host does not wait for it), group i - 1's gathering and group i's lanes
// are enqueued.
Status DeviceEncoder::EncodeGroups() {
  Group cur, next;
  uint64_t group_index = 0;
  REFIT_RETURN_IF_ERROR(StartGroup(0, 0, &cur));
  while (true) {
    ++report_.groups;
    if (!cur.list.empty()) {
      const FrontSet& f = sets_[cur.set];
      REFIT_RETURN_IF_ERROR(WaitFor(f.done, "histograms", &report_.compact_ms));
      AddElapsed(f.t[0], f.t[1], &report_.gpu_compact_ms);
      AddElapsed(f.t[1], f.t[2], &report_.gpu_hist_ms);
    }
    const bool more = cur.g1 < plan_.ranges.size();
    if (more) REFIT_RETURN_IF_ERROR(StartGroup(cur.g1, cur.set ^ 1, &next));
    auto lap = std::chrono::steady_clock::now();
    REFIT_RETURN_IF_ERROR(EncodeOnCpu(cur));
    const auto lap2 = std::chrono::steady_clock::now();
    report_.cpu_fallback_ms += std::chrono::duration<double, std::milli>(lap2 - lap).count();
    std::vector<HostChunk> hc;
    if (!cur.list.empty()) ChooseModels(cur, &hc);
    report_.models_ms += std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - lap2).count();
    if (in_gather_) REFIT_RETURN_IF_ERROR(FrameGathered());
    if (back_) REFIT_RETURN_IF_ERROR(GatherBack());
    const uint64_t index = group_index++;
    if (!cur.list.empty()) REFIT_RETURN_IF_ERROR(LaunchEncode(cur, hc, index));
    if (cur.list.empty()) {
      // Chunks reach the sink in order: the groups before go first.
      if (in_gather_) REFIT_RETURN_IF_ERROR(FrameGathered());
      REFIT_RETURN_IF_ERROR(LaunchFraming(cur, index, {}, {}, {}, {}));
    } else {
      back_.emplace(Back{std::move(cur), std::move(hc), index});
    }
    if (!more) break;
    cur = std::move(next);
    next = Group{};
  }
  if (in_gather_) REFIT_RETURN_IF_ERROR(FrameGathered());
  if (back_) {
    REFIT_RETURN_IF_ERROR(GatherBack());
    REFIT_RETURN_IF_ERROR(FrameGathered());
  }
  return Status::Ok();
}

Status DeviceEncoder::WaitFor(cudaEvent_t e, const char* what, double* wall_ms) {
  const auto w0 = std::chrono::steady_clock::now();
  REFIT_CUDA_RETURN(cudaEventSynchronize(e), what);
  *wall_ms += std::chrono::duration<double, std::milli>(
                  std::chrono::steady_clock::now() - w0).count();
  return Status::Ok();
}

void DeviceEncoder::AddElapsed(cudaEvent_t a, cudaEvent_t b, double* into) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, b) == cudaSuccess) *into += ms;
}

// Step 1: enqueues the detection of the window that starts at range w0 in
// the next mask buffer.
Status DeviceEncoder::LaunchDetect(size_t w0) {
  const std::vector<HostRange>& ranges = plan_.ranges;
  const size_t w1 = internal::WindowEnd(plan_, w0, mask_cap_words_);
  const int slot = window_count_++ % 2;
  Window& w = windows_[slot];
  w.w0 = w0;
  w.w1 = w1;
  w.s0 = ranges[w0].seg_first;
  w.s1 = ranges[w1 - 1].seg_first + ranges[w1 - 1].segs;
  w.mask_base = plan_.MaskEnd(w0);
  // A reallocation waits for the device, so for the window that last
  // used this buffer too.
  REFIT_RETURN_IF_ERROR(b_mask_[slot].Get(plan_.MaskEnd(w1) - w.mask_base, &w.d_mask));
  const uint64_t s0 = w.s0, s1 = w.s1;
  const cudaStream_t st_detect = st_detect_.get();
  // The slot's last window has had all its compactions enqueued (groups
  // are formed in order); the last of them is the one waited for. An
  // event never recorded is no wait. (The compactions' range updates,
  // copied on st_front_ meanwhile, rewrite only fields this detection
  // does not read, and the others with their own values.)
  REFIT_CUDA_RETURN(cudaStreamWaitEvent(st_detect, w.mask_read, 0), "wait");
  REFIT_CUDA_RETURN(cudaEventRecord(w.e0, st_detect), "record");
  constexpr unsigned kSegsPerBlock = internal::kDetectThreads / 32;
  internal::DetectKernel<<<static_cast<unsigned>((s1 - s0 + kSegsPerBlock - 1) /
                                                 kSegsPerBlock),
                           internal::kDetectThreads, 0, st_detect>>>(
      d_ranges_, nranges_, s0, s1, w.d_mask, w.mask_base, d_before_, d_after_, d_counts_);
  REFIT_CUDA_RETURN(cudaGetLastError(), "detect launch");
  internal::RangeDigestKernel<<<static_cast<unsigned>((w1 - w0 + 7) / 8), 256, 0,
                                st_detect>>>(d_ranges_, static_cast<uint32_t>(w0),
                                             static_cast<uint32_t>(w1), d_before_, d_after_,
                                             d_rbefore_, d_rafter_);
  REFIT_CUDA_RETURN(cudaGetLastError(), "range hash launch");
  REFIT_CUDA_RETURN(cudaEventRecord(w.e1, st_detect), "record");
  REFIT_CUDA_RETURN(cudaMemcpyAsync(before_.data() + w0, d_rbefore_ + 2 * w0, 16 * (w1 - w0),
                                    cudaMemcpyDeviceToHost, st_detect), "copy hashes");
  REFIT_CUDA_RETURN(cudaMemcpyAsync(after_.data() + w0, d_rafter_ + 2 * w0, 16 * (w1 - w0),
                                    cudaMemcpyDeviceToHost, st_detect), "copy hashes");
  REFIT_CUDA_RETURN(cudaMemcpyAsync(counts_.data() + s0, d_counts_ + s0, 4 * (s1 - s0),
                                    cudaMemcpyDeviceToHost, st_detect), "copy counts");
  REFIT_CUDA_RETURN(cudaEventRecord(w.ready, st_detect), "record");
  pending_ = &w;
  return Status::Ok();
}

// Step 1, end: waits for the pending window's detection; per-range record
// counts and per-segment record offsets; the next window's detection.
Status DeviceEncoder::FinishDetect() {
  Window& w = *pending_;
  pending_ = nullptr;
  REFIT_CUDA_RETURN(cudaEventSynchronize(w.ready), "detect");
  float ms = 0;
  REFIT_CUDA_RETURN(cudaEventElapsedTime(&ms, w.e0, w.e1), "event time");
  report_.detect_ms += ms;
  internal::CountRecords(counts_, w.w0, w.w1, plan_.ranges, seg_rec_);
  REFIT_CUDA_RETURN(cudaMemcpyAsync(d_seg_rec_ + w.s0, seg_rec_.data() + w.s0,
                                    4 * (w.s1 - w.s0), cudaMemcpyHostToDevice,
                                    st_front_.get()), "copy offsets");
  detected_end_ = w.w1;
  cur_window_ = &w;
  // The next window's detection starts now, in the other mask buffer.
  if (w.w1 < plan_.ranges.size()) return LaunchDetect(w.w1);
  return Status::Ok();
}

// Step 2: forms the group starting at range g0 (detecting its window first
// if needed), lays out its staging in front set `set` and launches its
// compaction and histograms.
Status DeviceEncoder::StartGroup(size_t g0, int set, Group* g) {
  if (g0 >= detected_end_) {
    if (pending_ == nullptr) REFIT_RETURN_IF_ERROR(LaunchDetect(g0));
    REFIT_RETURN_IF_ERROR(FinishDetect());
  }
  g->g0 = g0;
  g->set = set;
  const size_t g1 =
      internal::GroupEnd(plan_.ranges, g0, detected_end_, opt_.staging_bytes);
  g->g1 = g1;
  internal::GroupLayout layout = internal::LayOutGroup(plan_.ranges, g0, g1);
  if (layout.list.empty()) {
    g->list.clear();
    return Status::Ok();
  }
  const uint32_t nchunks = static_cast<uint32_t>(layout.list.size());
  FrontSet& f = sets_[set];
  // The set's page-locked copy sources: its last copies (two groups ago)
  // were done when that group's histograms were waited for.
  REFIT_RETURN_IF_ERROR(host_.front[set].Reserve((g1 - g0) * sizeof(EncRange) +
                                                 nchunks * sizeof(EncChunk)));
  EncRange* upd = reinterpret_cast<EncRange*>(host_.front[set].data());
  internal::StagedRanges(plan_, g0, g1, layout, upd);
  EncChunk* ec_src = reinterpret_cast<EncChunk*>(upd + (g1 - g0));
  g->list = std::move(layout.list);
  g->ec = std::move(layout.chunks);
  uint32_t *d_hist, *d_maxgap;
  REFIT_RETURN_IF_ERROR(f.pos.Get(layout.records, &g->d_pos));
  REFIT_RETURN_IF_ERROR(f.vals.Get(layout.value_bytes, &g->d_vals));
  REFIT_RETURN_IF_ERROR(f.chunks.Get(nchunks, &g->d_chunks));
  REFIT_RETURN_IF_ERROR(f.hist.Get(uint64_t{nchunks} * kEncPlanes * 256, &d_hist));
  REFIT_RETURN_IF_ERROR(f.maxgap.Get(nchunks, &d_maxgap));
  std::copy(g->ec.begin(), g->ec.end(), ec_src);
  REFIT_CUDA_RETURN(cudaMemcpyAsync(d_ranges_ + g0, upd, (g1 - g0) * sizeof(EncRange),
                                    cudaMemcpyHostToDevice, st_front_.get()),
                    "copy ranges");
  REFIT_CUDA_RETURN(cudaMemcpyAsync(g->d_chunks, ec_src, nchunks * sizeof(EncChunk),
                                    cudaMemcpyHostToDevice, st_front_.get()),
                    "copy chunks");
  return LaunchCompaction(g, layout.records, d_hist, d_maxgap);
}

// Steps 2a-b of group *g, staged in its front set (d_hist and d_maxgap are
// the set's): compaction, histograms and largest gaps, which come back into
// host_.hist[g->set] (g->hist, g->maxgap).
Status DeviceEncoder::LaunchCompaction(Group* g, uint64_t records, uint32_t* d_hist,
                                       uint32_t* d_maxgap) {
  FrontSet& f = sets_[g->set];
  const cudaStream_t st_front = st_front_.get();
  const uint32_t nchunks = static_cast<uint32_t>(g->list.size());
  const uint64_t hist_n = uint64_t{nchunks} * kEncPlanes * 256;
  const uint64_t seg_begin = plan_.ranges[g->g0].seg_first;
  const uint64_t seg_end =
      plan_.ranges[g->g1 - 1].seg_first + plan_.ranges[g->g1 - 1].segs;
  if (f.lanes_recorded) {
    REFIT_CUDA_RETURN(cudaStreamWaitEvent(st_front, f.lanes_done, 0), "wait");
  }
  REFIT_CUDA_RETURN(cudaEventRecord(f.t[0], st_front), "record");
  internal::CompactKernel<<<static_cast<unsigned>((seg_end - seg_begin +
                                                   internal::kCompactWarps - 1) /
                                                  internal::kCompactWarps),
                            32 * internal::kCompactWarps, 0, st_front>>>(
      d_ranges_, nranges_, seg_begin, seg_end, cur_window_->d_mask,
      cur_window_->mask_base, d_seg_rec_, g->d_pos, g->d_vals);
  REFIT_CUDA_RETURN(cudaGetLastError(), "compact launch");
  REFIT_CUDA_RETURN(cudaEventRecord(cur_window_->mask_read, st_front), "record");
  REFIT_CUDA_RETURN(cudaEventRecord(f.t[1], st_front), "record");
  REFIT_CUDA_RETURN(cudaMemsetAsync(d_hist, 0, 4 * hist_n, st_front), "clear histograms");
  REFIT_CUDA_RETURN(cudaMemsetAsync(d_maxgap, 0, 4 * nchunks, st_front), "clear gaps");
  const uint32_t slices = internal::HistogramSlices(sm_count_, nchunks, records);
  internal::HistKernel<<<nchunks * slices, 256, 0, st_front>>>(
      g->d_chunks, slices, g->d_pos, g->d_vals, d_hist, d_maxgap);
  REFIT_CUDA_RETURN(cudaGetLastError(), "histogram launch");
  REFIT_CUDA_RETURN(cudaEventRecord(f.t[2], st_front), "record");
  // Into page-locked memory: a copy into pageable memory would block the
  // host here until the compaction and histograms are done.
  REFIT_RETURN_IF_ERROR(host_.hist[g->set].Reserve(4 * (hist_n + nchunks)));
  uint32_t* hist_host = reinterpret_cast<uint32_t*>(host_.hist[g->set].data());
  g->hist = std::span<const uint32_t>(hist_host, hist_n);
  g->maxgap = std::span<const uint32_t>(hist_host + hist_n, nchunks);
  REFIT_CUDA_RETURN(cudaMemcpyAsync(hist_host, d_hist, 4 * hist_n,
                                    cudaMemcpyDeviceToHost, st_front), "copy histograms");
  REFIT_CUDA_RETURN(cudaMemcpyAsync(hist_host + hist_n, d_maxgap, 4 * nchunks,
                                    cudaMemcpyDeviceToHost, st_front), "copy gaps");
  REFIT_CUDA_RETURN(cudaEventRecord(f.done, st_front), "record");
  return Status::Ok();
}

// The CPU's share of a group: its dense-prone ranges (GpuEncodes is false
// for them), copied back and encoded with EncodeChunkRange.
Status DeviceEncoder::EncodeOnCpu(const Group& g) {
  for (size_t i = g.g0; i < g.g1; ++i) {
    const HostRange& r = plan_.ranges[i];
    if (r.k == 0 || r.gpu) continue;
    const uint64_t w = static_cast<uint64_t>(r.width);
    std::vector<uint8_t> a(r.count * w), b(r.count * w);
    REFIT_CUDA_RETURN(cudaMemcpy(a.data(), HostPtr(plan_.dev[i].a), a.size(),
                                 cudaMemcpyDeviceToHost), "copy range");
    REFIT_CUDA_RETURN(cudaMemcpy(b.data(), HostPtr(plan_.dev[i].b), b.size(),
                                 cudaMemcpyDeviceToHost), "copy range");
    ChunkHeader ids = HeaderOf(i);
    ChunkEncodeOptions copt;
    copt.codec.records_per_lane = opt_.records_per_lane;
    EncodeScratch scratch;
    ChunkResult res;
    REFIT_RETURN_IF_ERROR(EncodeChunkRange(ids, a.data(), b.data(), 0, r.count,
                                           copt, &scratch, &res));
    res.header.start = r.start;
    auto pc = ParseChunk(res.chunk);
    REFIT_RETURN_IF_ERROR(pc.status());
    std::vector<uint8_t> payload(pc->payload.begin(), pc->payload.end());
    headers_[i] = res.header;
    SerializeChunk(res.header, payload, &chunk_bytes_[i]);
    ++report_.cpu_chunks;
  }
  return Status::Ok();
}

// Step 3: every GPU chunk's models from its histograms, as EncodeSparseW
// chooses them (internal::ChooseChunkModels), into g.ec and *hc.
void DeviceEncoder::ChooseModels(Group& g, std::vector<HostChunk>* hc) {
  const uint32_t nchunks = static_cast<uint32_t>(g.list.size());
  hc->assign(nchunks, HostChunk{});
  model_pool_->ForEach(nchunks, [&](size_t c, int) {
    const HostRange& r = plan_.ranges[g.list[c]];
    internal::ChooseChunkModels(g.hist.subspan(c * kEncPlanes * 256, kEncPlanes * 256),
                                g.maxgap[c], static_cast<uint32_t>(r.count),
                                opt_.records_per_lane, &g.ec[c], &(*hc)[c]);
  });
}

// Steps 4a-b: enqueues group g's lane encoding, stream sizes and offsets
// (back into host_.sizes[index % 2]).
Status DeviceEncoder::LaunchEncode(Group& g, const std::vector<HostChunk>& hc,
                                   uint64_t index) {
  const uint32_t nchunks = static_cast<uint32_t>(g.list.size());
  const int parity = static_cast<int>(index % 2);
  const cudaStream_t st = st_.get();
  const internal::LaneLayout l = internal::LayOutLanes(g.ec, hc);
  EncTable* d_tables;
  uint4* d_syms;
  REFIT_RETURN_IF_ERROR(b_chunks_.Get(nchunks, &d_back_chunks_));
  REFIT_RETURN_IF_ERROR(b_tables_.Get(std::max<uint64_t>(l.tables, 1), &d_tables));
  REFIT_RETURN_IF_ERROR(b_syms_.Get(std::max<uint64_t>(l.tables, 1) * 256, &d_syms));
  REFIT_RETURN_IF_ERROR(b_words_.Get(l.words + 1, &d_words_));
  REFIT_RETURN_IF_ERROR(b_state_.Get(l.lanes, &d_state_));
  REFIT_RETURN_IF_ERROR(b_used_.Get(l.lanes, &d_used_));
  REFIT_RETURN_IF_ERROR(b_sizes_.Get(nchunks, &d_sizes_));
  REFIT_RETURN_IF_ERROR(b_offs_.Get(nchunks, &d_offs_));
  // From page-locked memory (pageable sources may make a copy wait for
  // the stream, here the previous group's gathering). This parity's last
  // copies (two groups ago) were done when that group's sizes came back.
  const uint64_t ec_bytes = nchunks * sizeof(EncChunk);
  REFIT_RETURN_IF_ERROR(host_.back[parity].Reserve(ec_bytes + l.tables * sizeof(EncTable)));
  uint8_t* src = host_.back[parity].data();
  std::memcpy(src, g.ec.data(), ec_bytes);
  EncTable* src_tables = reinterpret_cast<EncTable*>(src + ec_bytes);
  for (uint32_t c = 0; c < nchunks; ++c) {
    std::copy(hc[c].tables.begin(), hc[c].tables.end(), src_tables + g.ec[c].table_first);
  }
  REFIT_CUDA_RETURN(cudaMemcpyAsync(d_back_chunks_, src, ec_bytes, cudaMemcpyHostToDevice,
                                    st), "copy chunks");
  if (l.tables > 0) {
    REFIT_CUDA_RETURN(cudaMemcpyAsync(d_tables, src_tables, l.tables * sizeof(EncTable),
                                      cudaMemcpyHostToDevice, st), "copy tables");
  }
  cudaEvent_t* bt = back_events_.bt[parity];
  REFIT_CUDA_RETURN(cudaEventRecord(bt[0], st), "record");
  if (l.max_coded > 0) {
    internal::SymbolKernel<<<dim3(nchunks, l.max_coded), 256, 0, st>>>(d_back_chunks_,
                                                                       d_tables, d_syms);
    REFIT_CUDA_RETURN(cudaGetLastError(), "symbol launch");
  }
  // A block per chunk, a thread per lane (<= 255).
  REFIT_CUDA_RETURN(internal::LaunchEncodeLanes(l.max_coded, nchunks,
                                                (l.max_lanes + 31) / 32 * 32, st,
                                                d_back_chunks_, d_syms, g.d_pos, g.d_vals,
                                                d_words_, d_state_, d_used_),
                    "encode launch");
  REFIT_CUDA_RETURN(cudaEventRecord(bt[1], st), "record");
  // The front set's records are read: the compaction that reuses the set
  // (two groups on) waits for this point.
  REFIT_CUDA_RETURN(cudaEventRecord(sets_[g.set].lanes_done, st), "record");
  sets_[g.set].lanes_recorded = true;
  internal::StreamSizeKernel<<<(nchunks + 127) / 128, 128, 0, st>>>(
      d_back_chunks_, nchunks, d_used_, d_sizes_);
  REFIT_CUDA_RETURN(cudaGetLastError(), "size launch");
  size_t temp_bytes = 0;
  REFIT_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, d_sizes_,
                                                  d_offs_, nchunks, st), "scan");
  uint8_t* d_temp;
  REFIT_RETURN_IF_ERROR(b_temp_.Get(temp_bytes, &d_temp));
  REFIT_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(d_temp, temp_bytes, d_sizes_,
                                                  d_offs_, nchunks, st), "scan");
  REFIT_RETURN_IF_ERROR(host_.sizes[parity].Reserve(16 * uint64_t{nchunks}));
  uint8_t* host = host_.sizes[parity].data();
  REFIT_CUDA_RETURN(cudaMemcpyAsync(host, d_sizes_, 8 * nchunks, cudaMemcpyDeviceToHost, st),
                    "copy sizes");
  REFIT_CUDA_RETURN(cudaMemcpyAsync(host + 8 * nchunks, d_offs_, 8 * nchunks,
                                    cudaMemcpyDeviceToHost, st), "copy offsets");
  REFIT_CUDA_RETURN(cudaEventRecord(back_events_.sizes_ready[parity], st), "record");
  return Status::Ok();
}

// Step 4c for the group in back_: waits for its stream sizes, then
// enqueues the gathering and the copy of its streams into
// host_.streams[index % 2] (the framing that last read that buffer, two
// groups ago, was waited for when the previous group's framing started,
// just before).
Status DeviceEncoder::LaunchGather() {
  Back& bk = *back_;
  const uint32_t nchunks = static_cast<uint32_t>(bk.g.list.size());
  const int parity = static_cast<int>(bk.index % 2);
  const cudaStream_t st = st_.get();
  cudaEvent_t* bt = back_events_.bt[parity];
  REFIT_RETURN_IF_ERROR(
      WaitFor(back_events_.sizes_ready[parity], "encode", &report_.encode_ms));
  AddElapsed(bt[0], bt[1], &report_.gpu_encode_ms);
  const uint64_t* host = reinterpret_cast<const uint64_t*>(host_.sizes[parity].data());
  back_sizes_.assign(host, host + nchunks);
  back_offs_.assign(host + nchunks, host + 2 * nchunks);
  const uint64_t total = back_offs_.back() + back_sizes_.back();
  uint8_t* d_out;
  REFIT_RETURN_IF_ERROR(b_out_.Get(total, &d_out));
  REFIT_CUDA_RETURN(cudaEventRecord(bt[2], st), "record");
  internal::GatherKernel<<<nchunks, 256, 0, st>>>(d_back_chunks_, d_words_, d_state_,
                                                  d_used_, d_offs_, d_out);
  REFIT_CUDA_RETURN(cudaGetLastError(), "gather launch");
  REFIT_CUDA_RETURN(cudaEventRecord(bt[3], st), "record");
  PinnedHost& pinned = host_.streams[parity];
  REFIT_RETURN_IF_ERROR(pinned.Reserve(total));
  back_streams_ = std::span<const uint8_t>(pinned.data(), total);
  REFIT_CUDA_RETURN(cudaMemcpyAsync(pinned.data(), d_out, total,
                                    cudaMemcpyDeviceToHost, st), "copy streams");
  REFIT_CUDA_RETURN(cudaEventRecord(back_events_.gathered[parity], st), "record");
  return Status::Ok();
}

// Enqueues the gathering of the group in back_, which moves to in_gather_.
Status DeviceEncoder::GatherBack() {
  REFIT_RETURN_IF_ERROR(LaunchGather());
  in_gather_ = std::move(back_);
  back_.reset();
  return Status::Ok();
}

// Waits for the group in in_gather_ to be gathered and starts its framing.
Status DeviceEncoder::FrameGathered() {
  Back& bk = *in_gather_;
  const int parity = static_cast<int>(bk.index % 2);
  REFIT_RETURN_IF_ERROR(
      WaitFor(back_events_.gathered[parity], "gather", &report_.gather_ms));
  AddElapsed(back_events_.bt[parity][2], back_events_.bt[parity][3],
             &report_.gpu_gather_ms);
  Status st_frame = LaunchFraming(bk.g, bk.index, back_streams_, std::move(bk.hc),
                                  std::move(back_offs_), std::move(back_sizes_));
  in_gather_.reset();
  return st_frame;
}

// Frames group g's GPU chunks (model descriptions hc[c].header, streams at
// offs[c], sizes[c]) into host_.framed[index % 2], then gives the sink every
// chunk of the group in range order (CPU-encoded ones from chunk_bytes_).
// Runs on its own thread (FrameGroup) while the next group goes through the
// GPU, once the framing before it is done.
Status DeviceEncoder::LaunchFraming(const Group& g, uint64_t index,
                                    std::span<const uint8_t> streams,
                                    std::vector<HostChunk> hc, std::vector<uint64_t> offs,
                                    std::vector<uint64_t> sizes) {
  if (framing_.valid()) REFIT_RETURN_IF_ERROR(framing_.get());
  std::vector<uint8_t>* const out_buf = &host_.framed[index % 2];
  framing_ = std::async(
      std::launch::async,
      [this, out_buf, streams, g0 = g.g0, g1 = g.g1, list = g.list, hc = std::move(hc),
       offs = std::move(offs), sizes = std::move(sizes)]() -> Status {
        return FrameGroup(out_buf, streams, g0, g1, list, hc, offs, sizes);
      });
  return Status::Ok();
}

Status DeviceEncoder::FrameGroup(std::vector<uint8_t>* out_buf,
                                 std::span<const uint8_t> streams, size_t g0, size_t g1,
                                 const std::vector<uint32_t>& list,
                                 const std::vector<HostChunk>& hc,
                                 const std::vector<uint64_t>& offs,
                                 const std::vector<uint64_t>& sizes) {
  const auto f0 = std::chrono::steady_clock::now();
  const size_t nchunks = list.size();
  std::vector<uint8_t>& buf = *out_buf;
  std::vector<uint64_t> at(nchunks + 1, 0), len(nchunks, 0);
  for (size_t c = 0; c < nchunks; ++c) {
    at[c + 1] = at[c] + ChunkSizeBound(hc[c].header.size() + sizes[c]);
  }
  if (buf.size() < at[nchunks]) buf.resize(at[nchunks]);
  frame_pool_->ForEach(nchunks, [&](size_t c, int) {
    const uint32_t i = list[c];
    headers_[i] = HeaderOf(i);
    len[c] = SerializeChunkTo(headers_[i], hc[c].header,
                              streams.subspan(offs[c], sizes[c]), buf.data() + at[c]);
  });
  size_t c = 0;
  for (size_t i = g0; i < g1; ++i) {
    const HostRange& r = plan_.ranges[i];
    if (r.k == 0) continue;
    std::span<const uint8_t> bytes;
    if (c < nchunks && list[c] == i) {
      bytes = std::span<const uint8_t>(buf.data() + at[c], len[c]);
      ++c;
    } else {
      bytes = chunk_bytes_[i];
    }
    ++report_.chunks;
    report_.changed_elements += r.k;
    report_.chunk_bytes += bytes.size();
    Status delivered = sink_(GpuChunkInfo{r.pair, headers_[i]}, bytes);
    chunk_bytes_[i] = {};
    if (!delivered.ok()) return delivered;
  }
  report_.frame_ms += std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - f0).count();
  return Status::Ok();
}

}  // namespace

Result<GpuEncodeReport> EncodeOnDevice(std::span<const DeviceTensorPair> pairs,
                                       const GpuEncodeOptions& opt,
                                       std::vector<GpuEncodedChunk>* out) {
  out->clear();
  return EncodeOnDevice(pairs, opt, [out](const GpuChunkInfo& info,
                                          std::span<const uint8_t> bytes) {
    GpuEncodedChunk c;
    c.pair = info.pair;
    c.header = info.header;
    c.bytes.assign(bytes.begin(), bytes.end());
    out->push_back(std::move(c));
    return Status::Ok();
  });
}

Result<GpuEncodeReport> EncodeOnDevice(std::span<const DeviceTensorPair> pairs,
                                       const GpuEncodeOptions& opt,
                                       const GpuChunkSink& sink) {
  DeviceEncoder encoder(pairs, opt, sink);
  return encoder.Run();
}

}  // namespace refit::cuda
