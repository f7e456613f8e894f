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
#include <optional>
#include <span>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "base/bytes.h"
#include "base/hash.h"
#include "base/parallel.h"
#include "codec/payload.h"
#include "codec/rans.h"
#include "codec/table.h"
#include "cuda/cuda_common.h"
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
  uint8_t shift[kPlanes];     // coded plane c: gap byte shift, or 64 + value
  uint8_t scale[kPlanes];     // coded plane c: its table's t
};

struct EncTable {
  uint32_t t;
  uint16_t f[256];
};

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

// One past the last 16-bit word of lane j's region (lane j holds records
// j + mL; each coded symbol emits at most one word).
__device__ inline uint64_t LaneRegionEnd(const EncChunk& c, uint32_t j) {
  const uint32_t full = c.k / c.lanes, rem = c.k % c.lanes;
  return c.word_off + uint64_t{c.coded} * (uint64_t{full} * (j + 1) + min(j + 1, rem));
}

__device__ inline uint32_t GapAt(const uint32_t* pos, uint32_t i) {
  return i == 0 ? pos[0] : pos[i] - pos[i - 1] - 1;
}

// Step 2b: `slices` blocks per GPU chunk, each over its share of the
// chunk's records: the 4 gap-byte and w value-byte histograms (as
// EncodeSparse counts them) and the largest gap, added into hist and
// max_gap (zeroed before). Zero bytes are not counted (the high gap and
// value bytes are nearly all zero, and threads adding to one bin
// serialize): the host sets each plane's zero count to k minus its other
// bins.
__global__ void __launch_bounds__(256)
    HistKernel(const EncChunk* chunks, uint32_t slices, const uint32_t* pos,
               const uint8_t* vals, uint32_t* hist, uint32_t* max_gap) {
  const uint32_t chunk = blockIdx.x / slices, slice = blockIdx.x % slices;
  const EncChunk c = chunks[chunk];
  __shared__ uint32_t h[kPlanes * 256];
  __shared__ uint32_t s_max;
  for (uint32_t i = threadIdx.x; i < kPlanes * 256; i += blockDim.x) h[i] = 0;
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
    for (int j = 0; j < 4; ++j) {
      const uint32_t sym = (g >> (8 * j)) & 0xff;
      if (sym != 0) atomicAdd(&h[j * 256 + sym], 1u);
    }
    const uint64_t x = LoadWord(v + uint64_t{i} * c.width, c.width);
    for (uint32_t j = 0; j < c.width; ++j) {
      const uint32_t sym = static_cast<uint32_t>(x >> (8 * j)) & 0xff;
      if (sym != 0) atomicAdd(&h[(4 + j) * 256 + sym], 1u);
    }
  }
  atomicMax(&s_max, mx);
  __syncthreads();
  uint32_t* out = hist + uint64_t{chunk} * kPlanes * 256;
  for (uint32_t i = threadIdx.x; i < (4 + c.width) * 256; i += blockDim.x) {
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
            (sh < 64 ? uint64_t{gap} >> sh : val >> (sh - 64)) & 0xff);
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
  return launch(EncodeLanesKernel<kPlanes>, kPlanes);
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

using internal::EncChunk;
using internal::EncRange;
using internal::EncTable;

using internal::DeviceBuffer;
using internal::DeviceMemory;

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

const void* HostPtr(uint64_t a) {
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(a));
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
  std::vector<uint8_t> header;  // gw byte and model descriptions
  std::vector<EncTable> tables;
};

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
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.chunk_bytes == 0 || opt.chunk_bytes % kRangeHashSegment != 0) {
    return InvalidArgumentError("chunk size must be a positive multiple of 64 KiB");
  }
  if (opt.records_per_lane == 0) {
    return InvalidArgumentError("records_per_lane must be >= 1");
  }
  REFIT_CUDA_RETURN(cudaSetDevice(opt.device), "cudaSetDevice");
  int sm_count = 0;
  REFIT_CUDA_RETURN(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount,
                                        opt.device), "device attribute");
  const int threads = opt.host_threads > 0 ? opt.host_threads : DefaultThreads();
  GpuEncodeReport report;
  // Ranges as DiffTensorsToSink cuts them.
  std::vector<HostRange> ranges;
  std::vector<EncRange> dev_ranges;
  uint64_t segs = 0, mask_words = 0;
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
      d.mask_off = mask_words;
      mask_words += (r.count + 31) / 32;
      d.width = static_cast<uint32_t>(t.width);
      dev_ranges.push_back(d);
    }
  }
  report.chunk_ranges = ranges.size();
  if (ranges.empty()) return report;
  if (ranges.size() >= (uint64_t{1} << 32)) {
    return InvalidArgumentError("too many chunk ranges");
  }
  const uint32_t nranges = static_cast<uint32_t>(ranges.size());

  DeviceMemory mem;
  // Detection (st_detect) streams through both tensors and is never
  // waited for at once; the compactions (st_front) and the lanes' encoding
  // (st) are, so their blocks go first (stream priorities).
  int prio_low = 0, prio_high = 0;
  REFIT_CUDA_RETURN(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high), "priorities");
  cudaStream_t st = nullptr, st_front = nullptr, st_detect = nullptr;
  REFIT_CUDA_RETURN(cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, prio_high),
                 "stream");
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() {
      if (s) cudaStreamDestroy(s);
    }
  } guard{st};
  REFIT_CUDA_RETURN(cudaStreamCreateWithPriority(&st_front, cudaStreamNonBlocking, prio_high),
                 "stream");
  StreamGuard guard_front{st_front};
  REFIT_CUDA_RETURN(cudaStreamCreateWithPriority(&st_detect, cudaStreamNonBlocking, prio_low),
                 "stream");
  StreamGuard guard_detect{st_detect};

  // Per call: ranges, digests, counts, offsets, two windows' change masks.
  DeviceBuffer b_ranges(&mem), b_before(&mem), b_after(&mem), b_rbefore(&mem),
      b_rafter(&mem), b_counts(&mem), b_seg_rec(&mem);
  DeviceBuffer b_mask[2] = {DeviceBuffer(&mem), DeviceBuffer(&mem)};
  EncRange* d_ranges;
  uint64_t *d_before, *d_after, *d_rbefore, *d_rafter;
  uint32_t *d_counts, *d_seg_rec;
  REFIT_RETURN_IF_ERROR(b_ranges.Get(dev_ranges.size(), &d_ranges));
  REFIT_RETURN_IF_ERROR(b_before.Get(2 * segs, &d_before));
  REFIT_RETURN_IF_ERROR(b_after.Get(2 * segs, &d_after));
  REFIT_RETURN_IF_ERROR(b_rbefore.Get(2 * ranges.size(), &d_rbefore));
  REFIT_RETURN_IF_ERROR(b_rafter.Get(2 * ranges.size(), &d_rafter));
  REFIT_RETURN_IF_ERROR(b_counts.Get(segs, &d_counts));
  REFIT_RETURN_IF_ERROR(b_seg_rec.Get(segs, &d_seg_rec));
  // On st_detect, ahead of the first detection that reads them; the
  // compactions (st_front) read them after the host has waited for a
  // detection.
  REFIT_CUDA_RETURN(cudaMemcpyAsync(d_ranges, dev_ranges.data(),
                                 dev_ranges.size() * sizeof(EncRange),
                                 cudaMemcpyHostToDevice, st_detect), "copy ranges");
  // Range hashes and segment counts come back into page-locked memory (a
  // copy into pageable memory would block the host until the detection is
  // done).
  thread_local PinnedHost pinned_detect;
  REFIT_RETURN_IF_ERROR(pinned_detect.Reserve(ranges.size() * 32 + segs * 8));
  static_assert(sizeof(Hash128) == 16);
  const std::span<Hash128> before(reinterpret_cast<Hash128*>(pinned_detect.data()),
                                  ranges.size());
  const std::span<Hash128> after(before.data() + ranges.size(), ranges.size());
  const std::span<uint32_t> counts(reinterpret_cast<uint32_t*>(after.data() + ranges.size()),
                                   segs);
  // Per-segment record offsets go to the device from page-locked memory
  // too: a pageable source may make the copy wait for the stream.
  const std::span<uint32_t> seg_rec(counts.data() + segs, segs);
  // Each of the two masks holds half of mask_bytes.
  const uint64_t mask_cap_words = std::max<uint64_t>(opt.mask_bytes / 8, 1);

  // Step 1 for a window: the ranges from w0 whose change masks fit one
  // mask buffer (at least one range). Windows alternate between the two
  // buffers. A window's detection runs on st_detect, at low priority: it
  // is enqueued as soon as the window before has been detected, and waits
  // on the GPU only for the last compaction that read its mask buffer (the
  // window two before), so it runs while the window before is compacted
  // and encoded, and the host rarely waits for it when it forms the
  // window's first group. (At equal priority its blocks held the
  // multiprocessors that the lanes' encoding and the compactions wait for:
  // slower than detecting on st_front between windows.)
  struct Window {
    size_t w0 = 0, w1 = 0;     // its ranges
    uint64_t s0 = 0, s1 = 0;   // their segments
    uint64_t mask_base = 0;  // the window's first mask word
    uint32_t* d_mask = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr, ready = nullptr;
    // Recorded on st_front after each compaction that reads the mask.
    cudaEvent_t mask_read = nullptr;
  };
  Window windows[2];
  struct WindowEvents {
    Window* w;
    ~WindowEvents() {
      for (int i = 0; i < 2; ++i) {
        for (cudaEvent_t e : {w[i].e0, w[i].e1, w[i].ready, w[i].mask_read}) {
          if (e) cudaEventDestroy(e);
        }
      }
    }
  } window_events{windows};
  for (Window& w : windows) {
    REFIT_CUDA_RETURN(cudaEventCreate(&w.e0), "event");
    REFIT_CUDA_RETURN(cudaEventCreate(&w.e1), "event");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&w.ready, cudaEventDisableTiming), "event");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&w.mask_read, cudaEventDisableTiming), "event");
  }
  size_t detected_end = 0;  // ranges [0, detected_end) have counts
  int window_count = 0;
  Window* cur_window = nullptr;  // the window groups are formed in
  Window* pending = nullptr;     // enqueued, not yet finished
  // Mask words of ranges [0, i).
  auto mask_end = [&](size_t i) {
    return i == ranges.size() ? mask_words : dev_ranges[i].mask_off;
  };
  auto launch_detect = [&](size_t w0) -> Status {
    size_t w1 = w0 + 1;
    while (w1 < ranges.size() && mask_end(w1 + 1) - mask_end(w0) <= mask_cap_words) ++w1;
    const int slot = window_count++ % 2;
    Window& w = windows[slot];
    w.w0 = w0;
    w.w1 = w1;
    w.s0 = ranges[w0].seg_first;
    w.s1 = ranges[w1 - 1].seg_first + ranges[w1 - 1].segs;
    w.mask_base = mask_end(w0);
    // A reallocation waits for the device, so for the window that last
    // used this buffer too.
    REFIT_RETURN_IF_ERROR(b_mask[slot].Get(mask_end(w1) - w.mask_base, &w.d_mask));
    const uint64_t s0 = w.s0, s1 = w.s1;
    // The slot's last window has had all its compactions enqueued (groups
    // are formed in order); the last of them is the one waited for. An
    // event never recorded is no wait. (The compactions' range updates,
    // copied on st_front meanwhile, rewrite only fields this detection
    // does not read, and the others with their own values.)
    REFIT_CUDA_RETURN(cudaStreamWaitEvent(st_detect, w.mask_read, 0), "wait");
    REFIT_CUDA_RETURN(cudaEventRecord(w.e0, st_detect), "record");
    constexpr unsigned kSegsPerBlock = internal::kDetectThreads / 32;
    internal::DetectKernel<<<static_cast<unsigned>((s1 - s0 + kSegsPerBlock - 1) /
                                                   kSegsPerBlock),
                             internal::kDetectThreads, 0, st_detect>>>(
        d_ranges, nranges, s0, s1, w.d_mask, w.mask_base, d_before, d_after, d_counts);
    REFIT_CUDA_RETURN(cudaGetLastError(), "detect launch");
    internal::RangeDigestKernel<<<static_cast<unsigned>((w1 - w0 + 7) / 8), 256, 0,
                                  st_detect>>>(d_ranges, static_cast<uint32_t>(w0),
                                              static_cast<uint32_t>(w1), d_before, d_after,
                                              d_rbefore, d_rafter);
    REFIT_CUDA_RETURN(cudaGetLastError(), "range hash launch");
    REFIT_CUDA_RETURN(cudaEventRecord(w.e1, st_detect), "record");
    REFIT_CUDA_RETURN(cudaMemcpyAsync(before.data() + w0, d_rbefore + 2 * w0, 16 * (w1 - w0),
                                   cudaMemcpyDeviceToHost, st_detect), "copy hashes");
    REFIT_CUDA_RETURN(cudaMemcpyAsync(after.data() + w0, d_rafter + 2 * w0, 16 * (w1 - w0),
                                   cudaMemcpyDeviceToHost, st_detect), "copy hashes");
    REFIT_CUDA_RETURN(cudaMemcpyAsync(counts.data() + s0, d_counts + s0, 4 * (s1 - s0),
                                   cudaMemcpyDeviceToHost, st_detect), "copy counts");
    REFIT_CUDA_RETURN(cudaEventRecord(w.ready, st_detect), "record");
    pending = &w;
    return Status::Ok();
  };
  // Waits for the pending window's detection; per-range record counts and
  // per-segment record offsets.
  auto finish_detect = [&]() -> Status {
    Window& w = *pending;
    pending = nullptr;
    REFIT_CUDA_RETURN(cudaEventSynchronize(w.ready), "detect");
    float ms = 0;
    REFIT_CUDA_RETURN(cudaEventElapsedTime(&ms, w.e0, w.e1), "event time");
    report.detect_ms += ms;
    for (size_t i = w.w0; i < w.w1; ++i) {
      HostRange& r = ranges[i];
      uint64_t k = 0;
      for (uint32_t j = 0; j < r.segs; ++j) {
        seg_rec[r.seg_first + j] = static_cast<uint32_t>(k);
        k += counts[r.seg_first + j];
      }
      r.k = k;
      // EncodeChunkRange tries dense encodings from k * 16 >= count on.
      r.gpu = k > 0 && k * 16 < r.count;
    }
    REFIT_CUDA_RETURN(cudaMemcpyAsync(d_seg_rec + w.s0, seg_rec.data() + w.s0, 4 * (w.s1 - w.s0),
                                   cudaMemcpyHostToDevice, st_front), "copy offsets");
    detected_end = w.w1;
    cur_window = &w;
    // The next window's detection starts now, in the other mask buffer.
    if (w.w1 < ranges.size()) return launch_detect(w.w1);
    return Status::Ok();
  };

  std::vector<std::vector<uint8_t>> chunk_bytes(ranges.size());
  std::vector<ChunkHeader> headers(ranges.size());
  auto header_of = [&](size_t i) {
    const HostRange& r = ranges[i];
    ChunkHeader h;
    h.kind = codec::ChunkKind::kSparseXor;
    h.width = static_cast<uint8_t>(pairs[r.pair].width);
    h.version = opt.version;
    h.base_version = opt.base_version;
    h.tensor_id = pairs[r.pair].tensor_id;
    h.start = r.start;
    h.count = r.count;
    h.changed = r.k;
    h.before = before[i];
    h.after = after[i];
    return h;
  };

  // A group: consecutive ranges of one window whose records fit the
  // staging budget. Its compaction (steps 2a-b, "front") runs on st_front
  // in one of two buffer sets while the host chooses the previous group's
  // models; steps 4a-c ("back") run on st.
  struct FrontSet {
    explicit FrontSet(DeviceMemory* m)
        : pos(m), vals(m), chunks(m), hist(m), maxgap(m) {}
    DeviceBuffer pos, vals, chunks, hist, maxgap;
    cudaEvent_t done = nullptr;  // histograms and gaps are back
    cudaEvent_t t[3] = {};       // around the compaction and histograms
    // The lanes' encoding of the last group that used the set has read its
    // records (recorded on st; the next compaction into the set waits).
    cudaEvent_t lanes_done = nullptr;
    bool lanes_recorded = false;
  };
  FrontSet sets[2] = {FrontSet(&mem), FrontSet(&mem)};
  struct EventGuard {
    FrontSet* sets;
    ~EventGuard() {
      for (int i = 0; i < 2; ++i) {
        if (sets[i].done) cudaEventDestroy(sets[i].done);
        if (sets[i].lanes_done) cudaEventDestroy(sets[i].lanes_done);
        for (cudaEvent_t e : sets[i].t) {
          if (e) cudaEventDestroy(e);
        }
      }
    }
  } event_guard{sets};
  for (FrontSet& f : sets) {
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&f.done, cudaEventDisableTiming), "event");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&f.lanes_done, cudaEventDisableTiming), "event");
    for (cudaEvent_t& e : f.t) REFIT_CUDA_RETURN(cudaEventCreate(&e), "event");
  }
  // Elapsed GPU time between two completed events, added to *into.
  auto add_elapsed = [](cudaEvent_t a, cudaEvent_t b, double* into) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, a, b) == cudaSuccess) *into += ms;
  };
  // Waits for event e, adding the wait (host clock) to *wall_ms.
  auto wait_for = [](cudaEvent_t e, const char* what, double* wall_ms) -> Status {
    const auto w0 = std::chrono::steady_clock::now();
    REFIT_CUDA_RETURN(cudaEventSynchronize(e), what);
    *wall_ms += std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - w0).count();
    return Status::Ok();
  };
  thread_local PinnedHost pinned_hist[2], pinned_front[2];
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
  // Forms the group starting at range g0 (detecting its window first if
  // needed) and launches its front.
  auto start_group = [&](size_t g0, int set, Group* g) -> Status {
    if (g0 >= detected_end) {
      if (pending == nullptr) REFIT_RETURN_IF_ERROR(launch_detect(g0));
      REFIT_RETURN_IF_ERROR(finish_detect());
    }
    g->g0 = g0;
    g->set = set;
    uint64_t need = 0;
    size_t g1 = g0;
    for (; g1 < detected_end; ++g1) {
      const HostRange& r = ranges[g1];
      const uint64_t w = pairs[r.pair].width;
      // Records and values in both front sets, the lanes' words.
      const uint64_t more = r.gpu ? r.k * (2 * (4 + w) + 2 * (4 + w)) + 64 : 0;
      if (g1 > g0 && need + more > opt.staging_bytes) break;
      need += more;
    }
    g->g1 = g1;
    g->list.clear();
    uint64_t recs = 0, val_bytes = 0;
    for (size_t i = g0; i < g1; ++i) {
      const HostRange& r = ranges[i];
      if (!r.gpu) continue;
      g->list.push_back(static_cast<uint32_t>(i));
      recs += r.k;
      val_bytes += (r.k * pairs[r.pair].width + 15) / 16 * 16;
    }
    if (g->list.empty()) return Status::Ok();
    const uint32_t nchunks = static_cast<uint32_t>(g->list.size());
    FrontSet& f = sets[set];
    g->ec.assign(nchunks, EncChunk{});
    // The set's page-locked copy sources: its last copies (two groups ago)
    // were done when that group's histograms were waited for.
    REFIT_RETURN_IF_ERROR(pinned_front[set].Reserve((g1 - g0) * sizeof(EncRange) +
                                                   nchunks * sizeof(EncChunk)));
    EncRange* upd = reinterpret_cast<EncRange*>(pinned_front[set].data());
    std::copy(dev_ranges.begin() + static_cast<ptrdiff_t>(g0),
              dev_ranges.begin() + static_cast<ptrdiff_t>(g1), upd);
    EncChunk* ec_src = reinterpret_cast<EncChunk*>(upd + (g1 - g0));
    uint64_t ro = 0, vo = 0;
    for (uint32_t c = 0; c < nchunks; ++c) {
      const HostRange& r = ranges[g->list[c]];
      const uint32_t w = static_cast<uint32_t>(pairs[r.pair].width);
      EncChunk& e = g->ec[c];
      e.rec_off = ro;
      e.val_off = vo;
      e.k = static_cast<uint32_t>(r.k);
      e.width = w;
      upd[g->list[c] - g0].rec_off = ro;
      upd[g->list[c] - g0].val_off = vo;
      ro += r.k;
      vo += (r.k * w + 15) / 16 * 16;
    }
    uint32_t *d_hist, *d_maxgap;
    REFIT_RETURN_IF_ERROR(f.pos.Get(recs, &g->d_pos));
    REFIT_RETURN_IF_ERROR(f.vals.Get(val_bytes, &g->d_vals));
    REFIT_RETURN_IF_ERROR(f.chunks.Get(nchunks, &g->d_chunks));
    uint32_t* d_pos = g->d_pos;
    uint8_t* d_vals = g->d_vals;
    EncChunk* d_chunks = g->d_chunks;
    const uint64_t hist_n = uint64_t{nchunks} * internal::kPlanes * 256;
    REFIT_RETURN_IF_ERROR(f.hist.Get(hist_n, &d_hist));
    REFIT_RETURN_IF_ERROR(f.maxgap.Get(nchunks, &d_maxgap));
    std::copy(g->ec.begin(), g->ec.end(), ec_src);
    REFIT_CUDA_RETURN(cudaMemcpyAsync(d_ranges + g0, upd, (g1 - g0) * sizeof(EncRange),
                                   cudaMemcpyHostToDevice, st_front), "copy ranges");
    REFIT_CUDA_RETURN(cudaMemcpyAsync(d_chunks, ec_src, nchunks * sizeof(EncChunk),
                                   cudaMemcpyHostToDevice, st_front), "copy chunks");
    const uint64_t seg_begin = ranges[g0].seg_first;
    const uint64_t seg_end = ranges[g1 - 1].seg_first + ranges[g1 - 1].segs;
    if (f.lanes_recorded) {
      REFIT_CUDA_RETURN(cudaStreamWaitEvent(st_front, f.lanes_done, 0), "wait");
    }
    REFIT_CUDA_RETURN(cudaEventRecord(f.t[0], st_front), "record");
    internal::CompactKernel<<<static_cast<unsigned>((seg_end - seg_begin +
                                                     internal::kCompactWarps - 1) /
                                                    internal::kCompactWarps),
                              32 * internal::kCompactWarps, 0, st_front>>>(
        d_ranges, nranges, seg_begin, seg_end, cur_window->d_mask,
        cur_window->mask_base, d_seg_rec, d_pos, d_vals);
    REFIT_CUDA_RETURN(cudaGetLastError(), "compact launch");
    REFIT_CUDA_RETURN(cudaEventRecord(cur_window->mask_read, st_front), "record");
    REFIT_CUDA_RETURN(cudaEventRecord(f.t[1], st_front), "record");
    REFIT_CUDA_RETURN(cudaMemsetAsync(d_hist, 0, 4 * hist_n, st_front), "clear histograms");
    REFIT_CUDA_RETURN(cudaMemsetAsync(d_maxgap, 0, 4 * nchunks, st_front), "clear gaps");
    // Enough blocks to fill the device a few times over, in slices of at
    // least a few thousand records.
    const uint32_t slices = static_cast<uint32_t>(std::clamp<uint64_t>(
        std::min<uint64_t>((4 * sm_count + nchunks - 1) / nchunks, recs / nchunks / 4096),
        1, 64));
    internal::HistKernel<<<nchunks * slices, 256, 0, st_front>>>(d_chunks, slices, d_pos,
                                                                 d_vals, d_hist, d_maxgap);
    REFIT_CUDA_RETURN(cudaGetLastError(), "histogram launch");
    REFIT_CUDA_RETURN(cudaEventRecord(f.t[2], st_front), "record");
    // Into page-locked memory: a copy into pageable memory would block the
    // host here until the compaction and histograms are done.
    REFIT_RETURN_IF_ERROR(pinned_hist[set].Reserve(4 * (hist_n + nchunks)));
    uint32_t* hist_host = reinterpret_cast<uint32_t*>(pinned_hist[set].data());
    g->hist = std::span<const uint32_t>(hist_host, hist_n);
    g->maxgap = std::span<const uint32_t>(hist_host + hist_n, nchunks);
    REFIT_CUDA_RETURN(cudaMemcpyAsync(hist_host, d_hist, 4 * hist_n,
                                   cudaMemcpyDeviceToHost, st_front), "copy histograms");
    REFIT_CUDA_RETURN(cudaMemcpyAsync(hist_host + hist_n, d_maxgap, 4 * nchunks,
                                   cudaMemcpyDeviceToHost, st_front), "copy gaps");
    REFIT_CUDA_RETURN(cudaEventRecord(f.done, st_front), "record");
    return Status::Ok();
  };

  // Buffers of the back half, one set; chunk framing of group g runs on
  // the host while group g + 1 goes through the GPU; its streams sit in
  // page-locked buffer g % 2. At most one framing is in flight, and it is
  // waited for before any return (the future is destroyed before what it
  // writes).
  DeviceBuffer b_chunks(&mem), b_tables(&mem), b_syms(&mem), b_words(&mem), b_state(&mem),
      b_used(&mem), b_sizes(&mem), b_offs(&mem), b_temp(&mem), b_out(&mem);
  thread_local PinnedHost pinned_streams[2];
  // Framed chunks of a group, handed to the sink from here: kept per
  // calling thread across calls, so their pages are not faulted in again
  // for every call.
  thread_local std::vector<uint8_t> framed[2];
  WorkerPool model_pool(threads);
  WorkerPool frame_pool(std::max(1, threads / 4));
  std::future<Status> framing;
  struct FramingWait {
    std::future<Status>* f;
    ~FramingWait() {
      if (f->valid()) f->wait();
    }
  } framing_wait{&framing};
  // Frames group g's GPU chunks (model descriptions hc[c].header, streams
  // at offs[c], sizes[c]) into framed[g % 2], then gives the sink every
  // chunk of the group in range order (CPU-encoded ones from chunk_bytes).
  // Runs on its own thread while the next group goes through the GPU.
  auto launch_framing = [&](const Group& g, uint64_t index, std::span<const uint8_t> streams,
                            std::vector<HostChunk> hc, std::vector<uint64_t> offs,
                            std::vector<uint64_t> sizes) -> Status {
    if (framing.valid()) REFIT_RETURN_IF_ERROR(framing.get());
    // Taken here: inside the task, the name would be that thread's own.
    std::vector<uint8_t>* const out_buf = &framed[index % 2];
    framing = std::async(
        std::launch::async,
        [&, out_buf, streams, g0 = g.g0, g1 = g.g1, list = g.list, hc = std::move(hc),
         offs = std::move(offs), sizes = std::move(sizes)]() -> Status {
          const auto f0 = std::chrono::steady_clock::now();
          const size_t nchunks = list.size();
          std::vector<uint8_t>& buf = *out_buf;
          std::vector<uint64_t> at(nchunks + 1, 0), len(nchunks, 0);
          for (size_t c = 0; c < nchunks; ++c) {
            at[c + 1] = at[c] + ChunkSizeBound(hc[c].header.size() + sizes[c]);
          }
          if (buf.size() < at[nchunks]) buf.resize(at[nchunks]);
          frame_pool.ForEach(nchunks, [&](size_t c, int) {
            const uint32_t i = list[c];
            headers[i] = header_of(i);
            len[c] = SerializeChunkTo(headers[i], hc[c].header,
                                      streams.subspan(offs[c], sizes[c]), buf.data() + at[c]);
          });
          size_t c = 0;
          for (size_t i = g0; i < g1; ++i) {
            const HostRange& r = ranges[i];
            if (r.k == 0) continue;
            std::span<const uint8_t> bytes;
            if (c < nchunks && list[c] == i) {
              bytes = std::span<const uint8_t>(buf.data() + at[c], len[c]);
              ++c;
            } else {
              bytes = chunk_bytes[i];
            }
            ++report.chunks;
            report.changed_elements += r.k;
            report.chunk_bytes += bytes.size();
            Status delivered = sink(GpuChunkInfo{r.pair, headers[i]}, bytes);
            chunk_bytes[i] = {};
            if (!delivered.ok()) return delivered;
          }
          report.frame_ms += std::chrono::duration<double, std::milli>(
                                 std::chrono::steady_clock::now() - f0).count();
          return Status::Ok();
        });
    return Status::Ok();
  };
  // CPU fallback for a group's dense-prone ranges.
  auto encode_on_cpu = [&](const Group& g) -> Status {
    for (size_t i = g.g0; i < g.g1; ++i) {
      const HostRange& r = ranges[i];
      if (r.k == 0 || r.gpu) continue;
      const uint64_t w = pairs[r.pair].width;
      std::vector<uint8_t> a(r.count * w), b(r.count * w);
      REFIT_CUDA_RETURN(cudaMemcpy(a.data(), HostPtr(dev_ranges[i].a), a.size(),
                                cudaMemcpyDeviceToHost), "copy range");
      REFIT_CUDA_RETURN(cudaMemcpy(b.data(), HostPtr(dev_ranges[i].b), b.size(),
                                cudaMemcpyDeviceToHost), "copy range");
      ChunkHeader ids = header_of(i);
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
    return Status::Ok();
  };

  // Step 3: models, exactly as EncodeSparseW chooses them, into g.ec and
  // *hc (the model descriptions and tables).
  auto choose_models = [&](Group& g, std::vector<HostChunk>* hc) {
    const uint32_t nchunks = static_cast<uint32_t>(g.list.size());
    hc->assign(nchunks, HostChunk{});
    model_pool.ForEach(nchunks, [&](size_t c, int) {
      const HostRange& r = ranges[g.list[c]];
      const int w = pairs[r.pair].width;
      const uint32_t n = static_cast<uint32_t>(r.count);
      const uint32_t k = static_cast<uint32_t>(r.k);
      const int gw = codec::GapWidthFor(g.maxgap[c]);
      HostChunk& h = (*hc)[c];
      h.header.push_back(static_cast<uint8_t>(gw));
      EncChunk& e = g.ec[c];
      for (int j = 0; j < gw + w; ++j) {
        const bool is_gap = j < gw;
        const int plane = is_gap ? j : 4 + (j - gw);
        codec::Histogram hh;
        const uint32_t* src = g.hist.data() + (uint64_t{c} * internal::kPlanes + plane) * 256;
        uint64_t others = 0;
        for (int s = 1; s < 256; ++s) {
          hh[s] = src[s];
          others += src[s];
        }
        hh[0] = k - others;  // zero bytes are not counted on the GPU
        const codec::GapContext ctx{is_gap, n, k, is_gap ? j : 0};
        uint64_t cost;
        const codec::Model m = codec::ChooseModel(hh, ctx, &cost);
        codec::WriteModel(m, &h.header);
        if (!m.coded()) continue;
        EncTable t{};
        t.t = static_cast<uint32_t>(m.t);
        std::memcpy(t.f, m.f.data(), sizeof(t.f));
        h.tables.push_back(t);
        e.scale[e.coded] = static_cast<uint8_t>(m.t);
        e.shift[e.coded++] = static_cast<uint8_t>(is_gap ? 8 * j : 64 + 8 * (j - gw));
      }
      e.lanes = static_cast<uint32_t>(
          codec::ChooseLanes(k, opt.records_per_lane, e.coded > 0));
    });
  };

  // A group whose lanes are being encoded (steps 4a-b on st) while the host
  // chooses the next group's models; its gathering is enqueued during the
  // next group's turn and it is framed during the turn after (by then the
  // gathering and the copy back are done, so the host does not wait for
  // them). The back buffers are one set: on st, a group's gathering is
  // enqueued before the next group's encoding.
  struct Back {
    Group g;
    std::vector<HostChunk> hc;
    uint64_t index = 0;  // the group's place (parity of its host buffers)
  };
  std::optional<Back> back, in_gather;
  thread_local PinnedHost pinned_sizes[2];  // stream sizes, then offsets
  thread_local PinnedHost pinned_back[2];   // a group's chunks and tables
  cudaEvent_t bt[2][4] = {};  // per parity: around the lanes' encoding, the gathering
  cudaEvent_t sizes_ready[2] = {}, gathered[2] = {};
  struct BackEvents {
    cudaEvent_t (*bt)[4];
    cudaEvent_t* ready;
    cudaEvent_t* gathered;
    ~BackEvents() {
      for (int p = 0; p < 2; ++p) {
        for (int i = 0; i < 4; ++i) {
          if (bt[p][i]) cudaEventDestroy(bt[p][i]);
        }
        if (ready[p]) cudaEventDestroy(ready[p]);
        if (gathered[p]) cudaEventDestroy(gathered[p]);
      }
    }
  } back_events{bt, sizes_ready, gathered};
  for (int p = 0; p < 2; ++p) {
    for (cudaEvent_t& e : bt[p]) REFIT_CUDA_RETURN(cudaEventCreate(&e), "event");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&sizes_ready[p], cudaEventDisableTiming), "event");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&gathered[p], cudaEventDisableTiming), "event");
  }
  // The back half's buffers as the last lane encoding left them (read by
  // the gathering that follows it on st).
  EncChunk* d_back_chunks = nullptr;
  uint16_t* d_words = nullptr;
  uint32_t *d_state = nullptr, *d_used = nullptr;
  uint64_t *d_sizes = nullptr, *d_offs = nullptr;

  // Steps 4a-b: enqueues group g's lane encoding, stream sizes and offsets
  // (back into pinned_sizes[index % 2]).
  auto launch_encode = [&](Group& g, const std::vector<HostChunk>& hc,
                           uint64_t index) -> Status {
    const uint32_t nchunks = static_cast<uint32_t>(g.list.size());
    const int parity = static_cast<int>(index % 2);
    uint64_t words = 0, ntables = 0;
    uint32_t lanes = 0, max_coded = 0, max_lanes = 1;
    for (uint32_t c = 0; c < nchunks; ++c) {
      EncChunk& e = g.ec[c];
      e.table_first = static_cast<uint32_t>(ntables);
      ntables += hc[c].tables.size();
      e.word_off = words;
      words += uint64_t{e.k} * e.coded;
      e.lane_first = lanes;
      lanes += e.lanes;
      max_coded = std::max(max_coded, e.coded);
      max_lanes = std::max(max_lanes, e.lanes);
    }
    EncTable* d_tables;
    uint4* d_syms;
    REFIT_RETURN_IF_ERROR(b_chunks.Get(nchunks, &d_back_chunks));
    REFIT_RETURN_IF_ERROR(b_tables.Get(std::max<uint64_t>(ntables, 1), &d_tables));
    REFIT_RETURN_IF_ERROR(b_syms.Get(std::max<uint64_t>(ntables, 1) * 256, &d_syms));
    REFIT_RETURN_IF_ERROR(b_words.Get(words + 1, &d_words));
    REFIT_RETURN_IF_ERROR(b_state.Get(lanes, &d_state));
    REFIT_RETURN_IF_ERROR(b_used.Get(lanes, &d_used));
    REFIT_RETURN_IF_ERROR(b_sizes.Get(nchunks, &d_sizes));
    REFIT_RETURN_IF_ERROR(b_offs.Get(nchunks, &d_offs));
    // From page-locked memory (pageable sources may make a copy wait for
    // the stream, here the previous group's gathering). This parity's last
    // copies (two groups ago) were done when that group's sizes came back.
    const uint64_t ec_bytes = nchunks * sizeof(EncChunk);
    REFIT_RETURN_IF_ERROR(pinned_back[parity].Reserve(ec_bytes + ntables * sizeof(EncTable)));
    uint8_t* src = pinned_back[parity].data();
    std::memcpy(src, g.ec.data(), ec_bytes);
    EncTable* src_tables = reinterpret_cast<EncTable*>(src + ec_bytes);
    for (uint32_t c = 0; c < nchunks; ++c) {
      std::copy(hc[c].tables.begin(), hc[c].tables.end(), src_tables + g.ec[c].table_first);
    }
    REFIT_CUDA_RETURN(cudaMemcpyAsync(d_back_chunks, src, ec_bytes, cudaMemcpyHostToDevice, st),
                   "copy chunks");
    if (ntables > 0) {
      REFIT_CUDA_RETURN(cudaMemcpyAsync(d_tables, src_tables, ntables * sizeof(EncTable),
                                     cudaMemcpyHostToDevice, st), "copy tables");
    }
    REFIT_CUDA_RETURN(cudaEventRecord(bt[parity][0], st), "record");
    if (max_coded > 0) {
      internal::SymbolKernel<<<dim3(nchunks, max_coded), 256, 0, st>>>(d_back_chunks,
                                                                      d_tables, d_syms);
      REFIT_CUDA_RETURN(cudaGetLastError(), "symbol launch");
    }
    // A block per chunk, a thread per lane (<= 255).
    REFIT_CUDA_RETURN(internal::LaunchEncodeLanes(max_coded, nchunks, (max_lanes + 31) / 32 * 32,
                                               st, d_back_chunks, d_syms, g.d_pos,
                                               g.d_vals, d_words, d_state, d_used),
                   "encode launch");
    REFIT_CUDA_RETURN(cudaEventRecord(bt[parity][1], st), "record");
    // The front set's records are read: the compaction that reuses the set
    // (two groups on) waits for this point.
    REFIT_CUDA_RETURN(cudaEventRecord(sets[g.set].lanes_done, st), "record");
    sets[g.set].lanes_recorded = true;
    internal::StreamSizeKernel<<<(nchunks + 127) / 128, 128, 0, st>>>(
        d_back_chunks, nchunks, d_used, d_sizes);
    REFIT_CUDA_RETURN(cudaGetLastError(), "size launch");
    size_t temp_bytes = 0;
    REFIT_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, d_sizes,
                                                 d_offs, nchunks, st), "scan");
    uint8_t* d_temp;
    REFIT_RETURN_IF_ERROR(b_temp.Get(temp_bytes, &d_temp));
    REFIT_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(d_temp, temp_bytes, d_sizes,
                                                 d_offs, nchunks, st), "scan");
    REFIT_RETURN_IF_ERROR(pinned_sizes[parity].Reserve(16 * uint64_t{nchunks}));
    uint8_t* host = pinned_sizes[parity].data();
    REFIT_CUDA_RETURN(cudaMemcpyAsync(host, d_sizes, 8 * nchunks, cudaMemcpyDeviceToHost, st),
                   "copy sizes");
    REFIT_CUDA_RETURN(cudaMemcpyAsync(host + 8 * nchunks, d_offs, 8 * nchunks,
                                   cudaMemcpyDeviceToHost, st), "copy offsets");
    REFIT_CUDA_RETURN(cudaEventRecord(sizes_ready[parity], st), "record");
    return Status::Ok();
  };

  // Step 4c for the group in `back`: waits for its stream sizes, then
  // enqueues the gathering and the copy of its streams into
  // pinned_streams[index % 2] (the framing that last read that buffer, two
  // groups ago, was waited for when the previous group's framing started,
  // just before).
  std::vector<uint64_t> back_sizes, back_offs;
  std::span<const uint8_t> back_streams;
  auto launch_gather = [&]() -> Status {
    Back& bk = *back;
    const uint32_t nchunks = static_cast<uint32_t>(bk.g.list.size());
    const int parity = static_cast<int>(bk.index % 2);
    REFIT_RETURN_IF_ERROR(wait_for(sizes_ready[parity], "encode", &report.encode_ms));
    add_elapsed(bt[parity][0], bt[parity][1], &report.gpu_encode_ms);
    const uint64_t* host = reinterpret_cast<const uint64_t*>(pinned_sizes[parity].data());
    back_sizes.assign(host, host + nchunks);
    back_offs.assign(host + nchunks, host + 2 * nchunks);
    const uint64_t total = back_offs.back() + back_sizes.back();
    uint8_t* d_out;
    REFIT_RETURN_IF_ERROR(b_out.Get(total, &d_out));
    REFIT_CUDA_RETURN(cudaEventRecord(bt[parity][2], st), "record");
    internal::GatherKernel<<<nchunks, 256, 0, st>>>(d_back_chunks, d_words, d_state,
                                                    d_used, d_offs, d_out);
    REFIT_CUDA_RETURN(cudaGetLastError(), "gather launch");
    REFIT_CUDA_RETURN(cudaEventRecord(bt[parity][3], st), "record");
    PinnedHost& pinned = pinned_streams[parity];
    REFIT_RETURN_IF_ERROR(pinned.Reserve(total));
    back_streams = std::span<const uint8_t>(pinned.data(), total);
    REFIT_CUDA_RETURN(cudaMemcpyAsync(pinned.data(), d_out, total,
                                   cudaMemcpyDeviceToHost, st), "copy streams");
    REFIT_CUDA_RETURN(cudaEventRecord(gathered[parity], st), "record");
    return Status::Ok();
  };
  // Waits for the group in `in_gather` to be gathered and starts its
  // framing.
  auto frame_gathered = [&]() -> Status {
    Back& bk = *in_gather;
    const int parity = static_cast<int>(bk.index % 2);
    REFIT_RETURN_IF_ERROR(wait_for(gathered[parity], "gather", &report.gather_ms));
    add_elapsed(bt[parity][2], bt[parity][3], &report.gpu_gather_ms);
    Status st_frame = launch_framing(bk.g, bk.index, back_streams, std::move(bk.hc),
                                     std::move(back_offs), std::move(back_sizes));
    in_gather.reset();
    return st_frame;
  };
  // Enqueues the gathering of the group in `back`, which moves to
  // `in_gather`.
  auto gather_back = [&]() -> Status {
    REFIT_RETURN_IF_ERROR(launch_gather());
    in_gather = std::move(back);
    back.reset();
    return Status::Ok();
  };

  // The pipeline, per group i: its histograms are waited for; group i + 1's
  // compaction is launched; the host chooses group i's models while the GPU
  // compacts group i + 1, encodes group i - 1's lanes and gathers group
  // i - 2; group i - 2 is framed (its gathering is done by then, so the
  // host does not wait for it), group i - 1's gathering and group i's lanes
  // are enqueued.
  Group cur, next;
  uint64_t group_index = 0;
  REFIT_RETURN_IF_ERROR(start_group(0, 0, &cur));
  while (true) {
    ++report.groups;
    if (!cur.list.empty()) {
      REFIT_RETURN_IF_ERROR(wait_for(sets[cur.set].done, "histograms", &report.compact_ms));
      add_elapsed(sets[cur.set].t[0], sets[cur.set].t[1], &report.gpu_compact_ms);
      add_elapsed(sets[cur.set].t[1], sets[cur.set].t[2], &report.gpu_hist_ms);
    }
    const bool more = cur.g1 < ranges.size();
    if (more) REFIT_RETURN_IF_ERROR(start_group(cur.g1, cur.set ^ 1, &next));
    auto lap = std::chrono::steady_clock::now();
    REFIT_RETURN_IF_ERROR(encode_on_cpu(cur));
    const auto lap2 = std::chrono::steady_clock::now();
    report.cpu_fallback_ms += std::chrono::duration<double, std::milli>(lap2 - lap).count();
    std::vector<HostChunk> hc;
    if (!cur.list.empty()) choose_models(cur, &hc);
    report.models_ms += std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - lap2).count();
    if (in_gather) REFIT_RETURN_IF_ERROR(frame_gathered());
    if (back) REFIT_RETURN_IF_ERROR(gather_back());
    const uint64_t index = group_index++;
    if (!cur.list.empty()) REFIT_RETURN_IF_ERROR(launch_encode(cur, hc, index));
    if (cur.list.empty()) {
      // Chunks reach the sink in order: the groups before go first.
      if (in_gather) REFIT_RETURN_IF_ERROR(frame_gathered());
      REFIT_RETURN_IF_ERROR(launch_framing(cur, index, {}, {}, {}, {}));
    } else {
      back.emplace(Back{std::move(cur), std::move(hc), index});
    }
    if (!more) break;
    cur = std::move(next);
    next = Group{};
  }
  if (in_gather) REFIT_RETURN_IF_ERROR(frame_gathered());
  if (back) {
    REFIT_RETURN_IF_ERROR(gather_back());
    REFIT_RETURN_IF_ERROR(frame_gathered());
  }
  if (framing.valid()) REFIT_RETURN_IF_ERROR(framing.get());
  report.peak_device_bytes = mem.peak;
  report.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace refit::cuda
