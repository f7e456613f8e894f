// Conditional XOR chunks (kind 5, docs/format.md §4.3) on the GPU: decodes
// and applies each such chunk of a batch against its base, in device
// memory, leaving its records (positions and XOR values) in its scratch as
// a sparse XOR chunk's (batch.h, DevConditional), so that the "after"
// check undoes it as one. The CPU decoder (codec::DecodeConditional) is the
// reference: these kernels accept and refuse exactly the payloads it does
// (the host has checked the header, the models that do not depend on the
// base and the lane framing, batch.cc) and give the same records.
//
// Four kernels, launched only for batches that hold kind-5 chunks, so the
// other kernels keep their registers (decode_apply.cu). A tile is 256
// elements, 8 consecutive ones per lane of a warp; a run is kCondRunTiles
// tiles, one warp's work.
//   CondCountKernel   per run: the base elements' class counts.
//   CondDecodeKernel  one block per chunk: the runs' counts to exclusive
//                     prefixes per class (members m_c), k_c <= m_c, the gap
//                     and difference tables (geometric ones built here from
//                     m_c and k_c, section 5.2, a warp per plane), the rANS
//                     lanes (one thread per lane) into gaps and differences,
//                     then per class a scan of the gaps into ranks, each
//                     checked < m_c.
//   CondCursorKernel  per run and class: its first record (the first rank
//                     at or past the run's prefix).
//   CondApplyKernel   a warp per run, tile by tile: per class, the records
//                     whose ranks fall in the tile (the tile's counts bound
//                     them), each found among its class's members in the
//                     tile by one warp scan; the record's element gets
//                     old + unzigzag(d), and its rank and difference are
//                     replaced by its position and XOR value.
// A chunk found corrupt gets its status in the decode, before anything is
// written outside the batch's scratch; the apply kernel writes only chunks
// still kStatusOk. The base is read only by these kernels, which run on the
// batch's stream, and no other chunk of the apply writes the range
// (batch.cc refuses kind-5 chunks that share elements with another chunk
// of the same apply); within the apply kernel a tile's elements are read
// and written by one warp.
#include <cub/block/block_scan.cuh>

#include "cuda/conditional_tables.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels.h"
#include "cuda/lane_ring.cuh"
#include "cuda/xxh3.cuh"

namespace refit::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kWarps = kThreads / 32;
constexpr uint32_t kFull = 0xffffffffu;
static_assert(kCondTile == 32 * 8, "a tile is 8 elements per lane");
constexpr uint32_t kRansLow = 1u << 16;
// Blocks per chunk (grid y) over its runs in the count and apply kernels,
// and over its runs' classes in the cursor kernel.
constexpr uint32_t kTileBlocks = 64;
constexpr uint32_t kCursorBlocks = 8;
// The class nibble of an element past the chunk.
constexpr uint32_t kNoClass = 0xf;
// Slots of each plane's slot -> symbol lookup (the symbol of a slot's
// 2^(t - 8)-slot bucket, stepped forward from there).
constexpr uint32_t kSlotBits = 8;

// Address of element i of the chunk (its span is contiguous at
// linear_address: batch.cc refuses kind-5 chunks that are not).
__device__ __forceinline__ uint16_t* ElementAt(const DevChunk& c, uint32_t i) {
  return reinterpret_cast<uint16_t*>(
      Addr(c.linear_address + 2 * RegionOffset(c.run, c.stride, i)));
}

__device__ __forceinline__ uint32_t ClassOf(uint32_t x, uint32_t lo) {
  const uint32_t e = (x >> 7) & 0xffu;
  return e <= lo ? 0 : min(e - lo, uint32_t{kCondClasses - 1});
}

__device__ __forceinline__ uint32_t Unzigzag(uint32_t z) {
  return ((z >> 1) ^ (0u - (z & 1u))) & 0xffffu;
}

__device__ __forceinline__ const DevConditional& HeaderOf(const BatchDevice& b,
                                                          const DevChunk& c) {
  return *reinterpret_cast<const DevConditional*>(&b.tables[c.table_first]);
}

__device__ __forceinline__ bool Pending(const BatchDevice& b, const DevChunk& c) {
  return c.conditional && b.status[c.status_index] == kStatusOk;
}

__device__ __forceinline__ uint32_t Tiles(uint32_t n) {
  return (n + kCondTile - 1) / kCondTile;
}

// A chunk's kind-5 scratch (batch.h, CondScratchLayout).
struct CondView {
  uint32_t* ranks;    // gaps, then ranks, then positions
  uint16_t* values;   // differences, then XOR values
  uint32_t* members;  // m_c
  uint32_t* counts;   // [run][class]
  uint32_t* cursors;  // [run][class]
  __device__ CondView(const BatchDevice& b, const DevChunk& c) {
    const CondScratch l = CondScratchLayout(c.n, c.k);
    uint8_t* sc = b.scratch + c.records;
    ranks = reinterpret_cast<uint32_t*>(sc);
    values = reinterpret_cast<uint16_t*>(sc + l.values);
    members = reinterpret_cast<uint32_t*>(sc + l.members);
    counts = reinterpret_cast<uint32_t*>(sc + l.counts);
    cursors = reinterpret_cast<uint32_t*>(sc + l.cursors);
  }
};

// Elements 8 lane .. 8 lane + 7 of tile t: their bits into v[0..3] (two
// per word, the lower element in the low half; zero past the chunk).
__device__ __forceinline__ void LoadTile(const DevChunk& c, uint32_t t, uint32_t lane,
                                         uint32_t v[4]) {
  const uint32_t i0 = t * kCondTile + 8 * lane;
  if (c.run == 0 && (c.linear_address & 15) == 0 && i0 + 8 <= c.n) {
    const uint4 q = *reinterpret_cast<const uint4*>(Addr(c.linear_address + 2 * uint64_t{i0}));
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  } else {
#pragma unroll
    for (uint32_t j = 0; j < 4; ++j) {
      const uint32_t i = i0 + 2 * j;
      const uint32_t a = i < c.n ? *ElementAt(c, i) : 0;
      const uint32_t b = i + 1 < c.n ? *ElementAt(c, i + 1) : 0;
      v[j] = a | b << 16;
    }
  }
}

// The classes of LoadTile's elements, in the nibbles of the result
// (kNoClass past the chunk).
__device__ __forceinline__ uint32_t TileClasses(const DevChunk& c, uint32_t lo, uint32_t t,
                                                uint32_t lane, const uint32_t v[4]) {
  const uint32_t i0 = t * kCondTile + 8 * lane;
  uint32_t cls = 0;
#pragma unroll
  for (uint32_t e = 0; e < 8; ++e) {
    const uint32_t x = (v[e / 2] >> (16 * (e % 2))) & 0xffffu;
    cls |= (i0 + e < c.n ? ClassOf(x, lo) : kNoClass) << (4 * e);
  }
  return cls;
}

// Lane j < 8: the tile's count of class j (0 in the other lanes), from
// the class nibbles of each lane's elements.
__device__ __forceinline__ uint32_t TileCount(uint32_t cls, uint32_t lane) {
  uint32_t acc = 0;  // the lane's count of class j in nibble j (<= 8)
#pragma unroll
  for (uint32_t e = 0; e < 8; ++e) {
    const uint32_t cl = (cls >> (4 * e)) & 0xfu;
    acc += cl < kCondClasses ? 1u << (4 * cl) : 0u;
  }
  uint32_t mine = 0;
#pragma unroll
  for (uint32_t j = 0; j < kCondClasses / 2; ++j) {
    // Classes 2j and 2j + 1 in 16-bit halves (a tile has <= 256 each).
    const uint32_t pair = ((acc >> (8 * j)) & 0xfu) | ((acc >> (8 * j + 4)) & 0xfu) << 16;
    const uint32_t sum = __reduce_add_sync(kFull, pair);
    if (lane == 2 * j) mine = sum & 0xffffu;
    if (lane == 2 * j + 1) mine = sum >> 16;
  }
  return mine;
}

// Each run's class counts into counts[8 run + class].
__global__ void __launch_bounds__(kThreads) CondCountKernel(BatchDevice b) {
  const DevChunk& c = b.chunks[blockIdx.x];
  if (!Pending(b, c)) return;
  const uint32_t lo = HeaderOf(b, c).lo;
  uint32_t* counts = CondView(b, c).counts;
  const uint32_t tiles = Tiles(c.n), runs = static_cast<uint32_t>(CondRuns(c.n));
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warps = gridDim.y * kWarps;
  for (uint32_t w = blockIdx.y * kWarps + threadIdx.x / 32; w < runs; w += warps) {
    uint32_t total = 0;
    const uint32_t t_end = min(tiles, (w + 1) * kCondRunTiles);
    // Four tiles' loads in flight at a time.
    for (uint32_t t = w * kCondRunTiles; t < t_end; t += 4) {
      uint32_t v[4][4];
#pragma unroll
      for (uint32_t u = 0; u < 4; ++u) {
        if (t + u < t_end) LoadTile(c, t + u, lane, v[u]);
      }
#pragma unroll
      for (uint32_t u = 0; u < 4; ++u) {
        if (t + u < t_end) total += TileCount(TileClasses(c, lo, t + u, lane, v[u]), lane);
      }
    }
    if (lane < kCondClasses) counts[kCondClasses * w + lane] = total;
  }
}

// Sum and argmax (lowest symbol on ties) over a warp, each lane holding 8
// consecutive symbols' values.
__device__ __forceinline__ uint64_t WarpSum64(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ uint32_t WarpArgMax(const uint32_t f[8], uint32_t lane,
                                               uint32_t max_symbol) {
  uint32_t best = 0, at = 0xffffu;
#pragma unroll
  for (uint32_t j = 0; j < 8; ++j) {
    const uint32_t s = 8 * lane + j;
    if (s <= max_symbol && (at == 0xffffu || f[j] > best)) {
      best = f[j];
      at = s;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t ob = __shfl_xor_sync(kFull, best, o);
    const uint32_t oa = __shfl_xor_sync(kFull, at, o);
    if (oa != 0xffffu && (at == 0xffffu || ob > best || (ob == best && oa < at))) {
      best = ob;
      at = oa;
    }
  }
  return at;
}

// GeometricFreqs (conditional_tables.h) by a warp: lane l computes the
// frequencies of symbols 8 l .. 8 l + 7 into f, with the same integer
// steps, so the table is the same bit for bit.
__device__ void GeometricFreqsWarp(uint32_t m, uint32_t k, uint32_t plane, uint32_t max_symbol,
                                   uint32_t t, uint32_t lane, uint32_t f[8]) {
  const uint64_t one32 = uint64_t{1} << 32;
  uint64_t q = (m > 0 && k <= m) ? (uint64_t{m - k} << 32) / m : 0;
  q = q < 1 ? 1 : (q > one32 - 1 ? one32 - 1 : q);
  for (uint32_t b = 0; b < plane; ++b) {
    for (int i = 0; i < 8; ++i) q = (q * q) >> 32;
  }
  uint64_t x = uint64_t{1} << 31;
  for (uint32_t s = 0; s < 8 * lane; ++s) x = (x * q) >> 32;
  uint64_t w[8];
  uint64_t total = 0;
#pragma unroll
  for (uint32_t j = 0; j < 8; ++j) {
    w[j] = x > 1 ? x : 1;
    x = (x * q) >> 32;
    if (8 * lane + j <= max_symbol) total += w[j];
  }
  total = WarpSum64(total);
  uint32_t sum = 0;
#pragma unroll
  for (uint32_t j = 0; j < 8; ++j) {
    if (8 * lane + j > max_symbol) {
      f[j] = 0;
      continue;
    }
    const uint64_t v = ((w[j] << kCondMaxPrecision) / total) >> (kCondMaxPrecision - t);
    f[j] = static_cast<uint32_t>(v > 1 ? v : 1);
    sum += f[j];
  }
  sum = __reduce_add_sync(kFull, sum);
  int32_t d = static_cast<int32_t>(1u << t) - static_cast<int32_t>(sum);
  if (d > 0) {
    const uint32_t top = WarpArgMax(f, lane, max_symbol);
#pragma unroll
    for (uint32_t j = 0; j < 8; ++j) {
      if (8 * lane + j == top) f[j] += static_cast<uint32_t>(d);
    }
  }
  for (; d < 0; ++d) {
    const uint32_t best = WarpArgMax(f, lane, max_symbol);
#pragma unroll
    for (uint32_t j = 0; j < 8; ++j) {
      if (8 * lane + j == best) --f[j];
    }
  }
}

struct DecodeShared {
  uint32_t fc[kCondPlanes][256];          // f | c << 16 of each coded plane
  uint8_t slot[kCondPlanes][1 << kSlotBits];  // bucket -> first symbol
  DevConditional h;
  uint32_t m[kCondClasses];               // members per class
  uint32_t err;
};

// One block per kind-5 chunk (see the file comment).
__global__ void __launch_bounds__(kThreads) CondDecodeKernel(BatchDevice b) {
  const DevChunk& c = b.chunks[blockIdx.x];
  if (!Pending(b, c)) return;
  using Scan64 = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename Scan64::TempStorage temp;
  __shared__ DecodeShared sh;
  const CondView cv(b, c);
  const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) sh.h = HeaderOf(b, c);

  // 1. The runs' counts to exclusive prefixes, two classes per scan (a
  // step of 256 runs adds less than 2^32 to each); the members.
  const uint32_t runs = static_cast<uint32_t>(CondRuns(c.n));
  uint32_t carry[kCondClasses];
#pragma unroll
  for (int k = 0; k < kCondClasses; ++k) carry[k] = 0;
  for (uint32_t t0 = 0; t0 < runs; t0 += kThreads) {
    const uint32_t t = t0 + tid;
    uint4 lo4 = make_uint4(0, 0, 0, 0), hi4 = lo4;
    uint4* at = reinterpret_cast<uint4*>(cv.counts + kCondClasses * t);
    if (t < runs) {
      lo4 = at[0];
      hi4 = at[1];
    }
    uint32_t v[kCondClasses] = {lo4.x, lo4.y, lo4.z, lo4.w, hi4.x, hi4.y, hi4.z, hi4.w};
#pragma unroll
    for (int j = 0; j < kCondClasses / 2; ++j) {
      const unsigned long long pair = v[2 * j] | uint64_t{v[2 * j + 1]} << 32;
      unsigned long long ex, agg;
      Scan64(temp).ExclusiveSum(pair, ex, agg);
      __syncthreads();
      v[2 * j] = carry[2 * j] + static_cast<uint32_t>(ex);
      v[2 * j + 1] = carry[2 * j + 1] + static_cast<uint32_t>(ex >> 32);
      carry[2 * j] += static_cast<uint32_t>(agg);
      carry[2 * j + 1] += static_cast<uint32_t>(agg >> 32);
    }
    if (t < runs) {
      at[0] = make_uint4(v[0], v[1], v[2], v[3]);
      at[1] = make_uint4(v[4], v[5], v[6], v[7]);
    }
  }
  if (tid == 0) {
    sh.err = kStatusOk;
    for (int k = 0; k < kCondClasses; ++k) {
      sh.m[k] = carry[k];
      cv.members[k] = carry[k];
      if (sh.h.k[k] > carry[k]) sh.err = kStatusClassCount;
    }
  }
  __syncthreads();
  if (sh.err != kStatusOk) {
    if (tid == 0) b.status[c.status_index] = sh.err;
    return;
  }

  // 2. Decode tables, a warp per plane: lane l holds symbols 8 l .. 8 l + 7.
  for (uint32_t p = warp; p < kCondPlanes; p += kWarps) {
    const DevConditionalPlane pl = sh.h.plane[p];
    if (pl.mode != kCondUniform && pl.mode != kCondTable && pl.mode != kCondGeometric) continue;
    uint32_t f[8];
    if (pl.mode == kCondUniform) {
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = 1;
    } else if (pl.mode == kCondTable) {
      const DevTable& tb = b.tables[c.table_first + 1 + pl.table];
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = tb.f[8 * lane + j];
    } else {
      const uint32_t cl = p / 4;  // geometric planes are gap planes
      GeometricFreqsWarp(sh.m[cl], sh.h.k[cl], p % 4, pl.symbol, pl.t, lane, f);
    }
    uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) mine += f[j];
    uint32_t inc = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(kFull, inc, o);
      if (lane >= static_cast<uint32_t>(o)) inc += y;
    }
    uint32_t cum = inc - mine;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      sh.fc[p][8 * lane + j] = f[j] | cum << 16;
      cum += f[j];
    }
    __syncwarp();
    const uint32_t bits = min(uint32_t{pl.t}, kSlotBits);
    for (uint32_t e = lane; e < (1u << bits); e += 32) {
      sh.slot[p][e] = static_cast<uint8_t>(SearchSymbol(sh.fc[p], e << (pl.t - bits)));
    }
  }
  __syncthreads();

  // 3. The lanes: record r (class-major) in lane r mod L codes its class's
  // gap planes, then the two difference planes, constant planes skipped.
  const uint32_t L = c.lanes, k_all = c.k;
  uint32_t err = kStatusOk;
  if (tid < L) {
    const uint8_t* pay = b.payload;
    const uint32_t* words = reinterpret_cast<const uint32_t*>(pay);
    const uint32_t beg = b.lanes[c.lane_first + tid];
    const uint32_t end = b.lanes[c.lane_first + tid + 1];
    uint32_t x = Rd32(pay + beg);
    uint32_t q = beg + 4;
    if (x < kRansLow) err = kStatusLaneEnd;
    LaneRing ring{0, 0, 0, 0};
    ring.Start(words, q);
    uint32_t cl = 0;
    for (uint32_t r = tid; r < k_all && err == kStatusOk; r += L) {
      while (r >= sh.h.first[cl] + sh.h.k[cl]) ++cl;  // r < k: some class holds it
      const uint32_t gw = sh.h.gw[cl];
      uint32_t gap = 0, d = 0;
      for (uint32_t j = 0; j < gw + 2; ++j) {
        const uint32_t p = j < gw ? 4 * cl + j : 4 * kCondClasses + (j - gw);
        const DevConditionalPlane pl = sh.h.plane[p];
        uint32_t s;
        if (pl.mode == kCondConstant) {
          s = pl.symbol;
        } else {
          const uint32_t t = pl.t;
          const uint32_t* fc = sh.fc[p];
          const uint32_t slot = x & ((1u << t) - 1);
          const uint32_t shift = t > kSlotBits ? t - kSlotBits : 0;
          s = sh.slot[p][slot >> shift];
          while (s < 255 && (fc[s + 1] >> 16) <= slot) ++s;
          const uint32_t e = fc[s];
          x = (e & 0xffffu) * (x >> t) + slot - (e >> 16);
          if (x < kRansLow) {
            if (end - q < 2) {
              err = kStatusLaneShort;
              break;
            }
            x = (x << 16) | ring.Take16(words, q);
          }
        }
        if (j < gw) {
          gap |= s << (8 * j);
        } else {
          d |= s << (8 * (j - gw));
        }
      }
      if (err != kStatusOk) break;
      if (d == 0) {
        err = kStatusZeroXor;
        break;
      }
      cv.ranks[r] = gap;
      cv.values[r] = static_cast<uint16_t>(d);
    }
    if (err == kStatusOk && (q != end || x != kRansLow)) err = kStatusLaneEnd;
  }
  if (err != kStatusOk) atomicCAS(&sh.err, kStatusOk, err);
  __syncthreads();
  if (sh.err != kStatusOk) {
    if (tid == 0) b.status[c.status_index] = sh.err;
    return;
  }

  // 4. Per class: ranks = running sums of (gap + 1) - 1, ascending, each
  // below m_c, in place of the gaps.
  for (int cl = 0; cl < kCondClasses; ++cl) {
    const uint32_t first = sh.h.first[cl], last = first + sh.h.k[cl];
    const uint64_t m = sh.m[cl];
    unsigned long long run = 0;
    for (uint32_t r0 = first; r0 < last; r0 += kThreads) {
      const uint32_t r = r0 + tid;
      const unsigned long long v = r < last ? uint64_t{cv.ranks[r]} + 1 : 0;
      unsigned long long inc, agg;
      Scan64(temp).InclusiveSum(v, inc, agg);
      __syncthreads();
      if (r < last) {
        const uint64_t rank = run + inc - 1;
        if (rank >= m) {
          err = kStatusPosition;
        } else {
          cv.ranks[r] = static_cast<uint32_t>(rank);
        }
      }
      run += agg;
    }
  }
  if (err != kStatusOk) atomicCAS(&sh.err, kStatusOk, err);
  __syncthreads();
  if (tid == 0 && sh.err != kStatusOk) b.status[c.status_index] = sh.err;
}

// First index in [first, last) whose rank is >= v (ranks ascending there).
__device__ __forceinline__ uint32_t LowerBound(const uint32_t* ranks, uint32_t first,
                                               uint32_t last, uint32_t v) {
  while (first < last) {
    const uint32_t mid = first + (last - first) / 2;
    if (ranks[mid] < v) {
      first = mid + 1;
    } else {
      last = mid;
    }
  }
  return first;
}

// Per run and class, the first of the class's records at or past the
// run's prefix: cursors[8 run + class].
__global__ void __launch_bounds__(kThreads) CondCursorKernel(BatchDevice b) {
  const DevChunk& c = b.chunks[blockIdx.x];
  if (!Pending(b, c)) return;
  const DevConditional& h = HeaderOf(b, c);
  const CondView cv(b, c);
  const uint32_t items = kCondClasses * static_cast<uint32_t>(CondRuns(c.n));
  for (uint32_t i = blockIdx.y * kThreads + threadIdx.x; i < items; i += gridDim.y * kThreads) {
    const uint32_t cl = i % kCondClasses;
    cv.cursors[i] = LowerBound(cv.ranks, h.first[cl], h.first[cl] + h.k[cl], cv.counts[i]);
  }
}

// A warp per run, tile by tile (see the file comment). Lane c < 8 walks
// class c's records of the run, [cursor, next run's cursor): the records
// are read and rewritten only by their run's warp. kWrite false maps the
// records (positions and XOR values into scratch) without writing an
// element: Receiver::MapConditional, before the pause.
template <bool kWrite>
__global__ void __launch_bounds__(kThreads) CondApplyKernel(BatchDevice b) {
  const DevChunk& c = b.chunks[blockIdx.x];
  if (!Pending(b, c)) return;
  const DevConditional& h = HeaderOf(b, c);
  const uint32_t lo = h.lo;
  const CondView cv(b, c);
  const uint32_t tiles = Tiles(c.n), runs = static_cast<uint32_t>(CondRuns(c.n));
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warps = gridDim.y * kWarps;
  for (uint32_t w = blockIdx.y * kWarps + threadIdx.x / 32; w < runs; w += warps) {
    uint32_t ptr = 0, stop = 0, next = ~0u, prefix = 0;
    if (lane < kCondClasses) {
      ptr = cv.cursors[kCondClasses * w + lane];
      stop = w + 1 < runs ? cv.cursors[kCondClasses * (w + 1) + lane] : h.first[lane] + h.k[lane];
      prefix = cv.counts[kCondClasses * w + lane];
      if (ptr < stop) next = cv.ranks[ptr];
    }
    const uint32_t t_begin = w * kCondRunTiles, t_end = min(tiles, t_begin + kCondRunTiles);
    uint32_t ahead[4];  // the next tile's elements, loaded a tile ahead
    LoadTile(c, t_begin, lane, ahead);
    for (uint32_t t = t_begin; t < t_end; ++t) {
      uint32_t v[4] = {ahead[0], ahead[1], ahead[2], ahead[3]};
      if (t + 1 < t_end) LoadTile(c, t + 1, lane, ahead);
      const uint32_t cls = TileClasses(c, lo, t, lane, v);
      // Lane c < 8: class c's records in this tile, [beg, ptr).
      const uint32_t end = prefix + TileCount(cls, lane);
      const uint32_t beg = ptr;
      while (next < end) {
        ++ptr;
        next = ptr < stop ? cv.ranks[ptr] : ~0u;
      }
      uint32_t busy = __ballot_sync(kFull, lane < kCondClasses && ptr > beg);
      while (busy != 0) {
        const uint32_t cl = __ffs(busy) - 1;
        busy &= busy - 1;
        const uint32_t r0 = __shfl_sync(kFull, beg, cl);
        const uint32_t r1 = __shfl_sync(kFull, ptr, cl);
        const uint32_t base = __shfl_sync(kFull, prefix, cl);
        // The lane's members of class cl (bit e: element 8 lane + e), and
        // those of the lanes up to it.
        uint32_t mine = 0;
#pragma unroll
        for (uint32_t e = 0; e < 8; ++e) {
          mine |= (((cls >> (4 * e)) & 0xfu) == cl ? 1u : 0u) << e;
        }
        const uint32_t count = __popc(mine);
        uint32_t inc = count;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const uint32_t y = __shfl_up_sync(kFull, inc, o);
          if (lane >= static_cast<uint32_t>(o)) inc += y;
        }
        const uint32_t excl = inc - count;
        for (uint32_t r = r0; r < r1; ++r) {
          const uint32_t j = cv.ranks[r] - base;  // < the tile's members of cl
          __syncwarp();  // every lane has read the rank before it is replaced
          if (j < excl || j >= inc) continue;
          uint32_t left = mine;  // its (j - excl)-th member is the record's
          for (uint32_t skip = excl; skip < j; ++skip) left &= left - 1;
          const uint32_t e = __ffs(left) - 1;
          const uint32_t word = e < 4 ? (e < 2 ? v[0] : v[1]) : (e < 6 ? v[2] : v[3]);
          const uint32_t old = (word >> (16 * (e % 2))) & 0xffffu;
          const uint32_t now = (old + Unzigzag(cv.values[r])) & 0xffffu;
          const uint32_t i = t * kCondTile + 8 * lane + e;
          if (kWrite) *ElementAt(c, i) = static_cast<uint16_t>(now);
          cv.ranks[r] = i;
          cv.values[r] = static_cast<uint16_t>(old ^ now);
        }
      }
      if (lane < kCondClasses) prefix = end;
    }
  }
}

// The pause of mapped chunks: each record's element XORed with its value
// (records of one chunk have distinct positions; chunks do not overlap).
__global__ void __launch_bounds__(kThreads) CondXorKernel(BatchDevice b) {
  const DevChunk& c = b.chunks[blockIdx.x];
  if (!Pending(b, c)) return;
  const CondView cv(b, c);
  for (uint32_t r = blockIdx.y * kThreads + threadIdx.x; r < c.k; r += gridDim.y * kThreads) {
    uint16_t* p = ElementAt(c, cv.ranks[r]);
    *p = static_cast<uint16_t>(*p ^ cv.values[r]);
  }
}

void LaunchDecodeAndMap(const BatchDevice& b, bool write, cudaStream_t stream) {
  CondCountKernel<<<dim3(b.num_chunks, kTileBlocks), kThreads, 0, stream>>>(b);
  CondDecodeKernel<<<b.num_chunks, kThreads, 0, stream>>>(b);
  CondCursorKernel<<<dim3(b.num_chunks, kCursorBlocks), kThreads, 0, stream>>>(b);
  if (write) {
    CondApplyKernel<true><<<dim3(b.num_chunks, kTileBlocks), kThreads, 0, stream>>>(b);
  } else {
    CondApplyKernel<false><<<dim3(b.num_chunks, kTileBlocks), kThreads, 0, stream>>>(b);
  }
}

}  // namespace

cudaError_t LaunchConditional(const BatchDevice& b, cudaStream_t stream) {
  if (b.num_chunks == 0 || b.conditional == 0) return cudaSuccess;
  if (b.conditional_mapped != 0) {
    CondXorKernel<<<dim3(b.num_chunks, kTileBlocks), kThreads, 0, stream>>>(b);
  } else {
    LaunchDecodeAndMap(b, /*write=*/true, stream);
  }
  return cudaGetLastError();
}

cudaError_t LaunchConditionalMap(const BatchDevice& b, cudaStream_t stream) {
  if (b.num_chunks == 0 || b.conditional == 0) return cudaSuccess;
  LaunchDecodeAndMap(b, /*write=*/false, stream);
  return cudaGetLastError();
}

}  // namespace refit::cuda::internal
