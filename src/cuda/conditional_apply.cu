// Conditional XOR chunks (kind 5, docs/format.md §4.3) on the GPU: decodes
// each such chunk of a batch against its base, in device memory, into a
// dense XOR plane (batch.h, DevConditional), which kernel B then applies
// as a dense XOR chunk. The CPU decoder (codec::DecodeConditional) is the
// reference: these kernels accept and refuse exactly the payloads it does
// (the host has checked the header, the models that do not depend on the
// base and the lane framing, batch.cc) and give the same XOR values.
//
// Three kernels, launched only for batches that hold kind-5 chunks, so the
// other kernels keep their registers (decode_apply.cu):
//   CondCountKernel   per tile of kCondTile elements: the base elements'
//                     class counts; clears the member differences.
//   CondDecodeKernel  one block per chunk: the tiles' counts to exclusive
//                     prefixes per class (members m_c, class offsets M_c),
//                     k_c <= m_c, the gap and difference tables (geometric
//                     ones built here from m_c and k_c, section 5.2), the
//                     rANS lanes (one thread per lane) into gaps and
//                     differences, then per class a scan of the gaps into
//                     ranks, each checked < m_c, and each record's
//                     difference stored at its member index M_c + rank.
//   CondPlaneKernel   per tile: each element's class and rank among its
//                     class's members (tile prefix, then the warps' ballots)
//                     gives its member index, whose difference d (0:
//                     unchanged) makes its XOR value old ^ (old + unzigzag(d)).
// A chunk found corrupt gets its status before anything is written outside
// the batch's scratch and staging: kernel B applies only chunks still
// kStatusOk. The base is only read here, in kernels that run on the batch's
// stream before kernel B writes the range; no other chunk of the apply
// writes it (batch.cc refuses kind-5 chunks that share elements with
// another chunk of the same apply).
#include <cub/block/block_scan.cuh>

#include "cuda/conditional_tables.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels.h"

namespace refit::cuda::internal {
namespace {

constexpr int kThreads = 256;  // one element of a tile, or one lane, each
static_assert(kCondTile == kThreads, "a tile is one element per thread");
constexpr int kWarps = kThreads / 32;
constexpr uint32_t kRansLow = 1u << 16;
// Blocks per chunk (grid y) over its tiles in the two tile kernels.
constexpr uint32_t kTileBlocks = 64;

__device__ inline const uint8_t* Addr(uint64_t a) {
  return reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(a));
}

// Offset from the chunk's first canonical element of its element i (as in
// decode_apply.cu).
__device__ __forceinline__ uint64_t RegionOffset(uint64_t run, uint64_t stride, uint32_t i) {
  if (run == 0) return i;
  const uint32_t r = static_cast<uint32_t>(run);
  return uint64_t{i / r} * stride + i % r;
}

// Base element i of the chunk (its span is contiguous at linear_address:
// batch.cc refuses kind-5 chunks that are not).
__device__ __forceinline__ uint32_t BaseAt(const DevChunk& c, uint32_t i) {
  return *reinterpret_cast<const uint16_t*>(
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

// The tile's class counts: per warp one ballot per class, one shared add
// per warp and class.
__global__ void __launch_bounds__(kThreads) CondCountKernel(BatchDevice b) {
  const DevChunk& c = b.chunks[blockIdx.x];
  if (!Pending(b, c)) return;
  const uint32_t lo = HeaderOf(b, c).lo;
  const CondScratch layout = CondScratchLayout(c.n, c.k);
  uint8_t* sc = b.scratch + c.records;
  uint32_t* counts = reinterpret_cast<uint32_t*>(sc + layout.counts);
  uint16_t* member_zz = reinterpret_cast<uint16_t*>(sc + layout.member_zz);
  __shared__ uint32_t s_count[kCondClasses];
  const uint32_t tiles = (c.n + kCondTile - 1) / kCondTile;
  const uint32_t lane = threadIdx.x % 32;
  for (uint32_t t = blockIdx.y; t < tiles; t += gridDim.y) {
    if (threadIdx.x < kCondClasses) s_count[threadIdx.x] = 0;
    __syncthreads();
    const uint32_t i = t * kCondTile + threadIdx.x;
    uint32_t cl = kCondClasses;  // none: past the chunk
    if (i < c.n) {
      cl = ClassOf(BaseAt(c, i), lo);
      member_zz[i] = 0;  // member indices cover [0, n) as elements do
    }
#pragma unroll
    for (uint32_t k = 0; k < kCondClasses; ++k) {
      const uint32_t m = __ballot_sync(0xffffffffu, cl == k);
      if (lane == 0 && m != 0) atomicAdd(&s_count[k], static_cast<uint32_t>(__popc(m)));
    }
    __syncthreads();
    if (threadIdx.x < kCondClasses) counts[kCondClasses * t + threadIdx.x] = s_count[threadIdx.x];
    __syncthreads();  // s_count is cleared for the next tile
  }
}

// Largest symbol s with c[s] <= slot (fc[s] = f | c << 16); it has f > 0.
__device__ __forceinline__ uint32_t SearchSymbol(const uint32_t* fc, uint32_t slot) {
  uint32_t lo = 0;
  for (uint32_t step = 128; step > 0; step >>= 1) {
    if ((fc[lo + step] >> 16) <= slot) lo += step;
  }
  return lo;
}

struct DecodeShared {
  uint32_t fc[kCondPlanes][256];  // f | c << 16 of each coded plane
  uint32_t m[kCondClasses];       // members per class
  uint32_t offset[kCondClasses];  // M_c: members of the classes before c
  uint32_t err;
};

// One block per kind-5 chunk (see the file comment).
__global__ void __launch_bounds__(kThreads) CondDecodeKernel(BatchDevice b) {
  const DevChunk& c = b.chunks[blockIdx.x];
  if (!Pending(b, c)) return;
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  using Scan64 = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ union {
    typename Scan::TempStorage s32;
    typename Scan64::TempStorage s64;
  } temp;
  __shared__ DecodeShared sh;
  const DevConditional& h = HeaderOf(b, c);
  const CondScratch layout = CondScratchLayout(c.n, c.k);
  uint8_t* sc = b.scratch + c.records;
  uint32_t* info = reinterpret_cast<uint32_t*>(sc);  // m[8], then M[8]
  uint32_t* counts = reinterpret_cast<uint32_t*>(sc + layout.counts);
  uint16_t* member_zz = reinterpret_cast<uint16_t*>(sc + layout.member_zz);
  uint32_t* gaps = reinterpret_cast<uint32_t*>(sc + layout.gaps);
  uint16_t* zz = reinterpret_cast<uint16_t*>(sc + layout.zz);
  const uint32_t tid = threadIdx.x;

  // 1. The tiles' counts to exclusive prefixes, per class; the members.
  const uint32_t tiles = (c.n + kCondTile - 1) / kCondTile;
  uint32_t carry[kCondClasses];
#pragma unroll
  for (int k = 0; k < kCondClasses; ++k) carry[k] = 0;
  for (uint32_t t0 = 0; t0 < tiles; t0 += kThreads) {
    const uint32_t t = t0 + tid;
#pragma unroll
    for (int k = 0; k < kCondClasses; ++k) {
      const uint32_t v = t < tiles ? counts[kCondClasses * t + k] : 0;
      uint32_t ex, agg;
      Scan(temp.s32).ExclusiveSum(v, ex, agg);
      __syncthreads();
      if (t < tiles) counts[kCondClasses * t + k] = carry[k] + ex;
      carry[k] += agg;
    }
  }
  if (tid == 0) {
    sh.err = kStatusOk;
    uint32_t before = 0;
    for (int k = 0; k < kCondClasses; ++k) {
      sh.m[k] = carry[k];
      sh.offset[k] = before;
      info[k] = carry[k];
      info[kCondClasses + k] = before;
      before += carry[k];
      if (h.k[k] > carry[k]) sh.err = kStatusClassCount;
    }
  }
  __syncthreads();
  if (sh.err != kStatusOk) {
    if (tid == 0) b.status[c.status_index] = sh.err;
    return;
  }

  // 2. Decode tables, one thread per plane.
  if (tid < kCondPlanes) {
    const DevConditionalPlane pl = h.plane[tid];
    uint32_t* fc = sh.fc[tid];
    if (pl.mode == kCondUniform) {
      for (uint32_t s = 0; s < 256; ++s) fc[s] = 1;
    } else if (pl.mode == kCondTable) {
      const DevTable& tb = b.tables[c.table_first + 1 + pl.table];
      for (uint32_t s = 0; s < 256; ++s) fc[s] = tb.f[s];
    } else if (pl.mode == kCondGeometric) {
      const uint32_t cl = tid / 4;  // geometric planes are gap planes
      GeometricFreqs(sh.m[cl], h.k[cl], tid % 4, pl.symbol, pl.t, fc);
    }
    if (pl.mode == kCondUniform || pl.mode == kCondTable || pl.mode == kCondGeometric) {
      uint32_t cum = 0;
      for (uint32_t s = 0; s < 256; ++s) {
        const uint32_t f = fc[s];
        fc[s] = f | cum << 16;
        cum += f;
      }
    }
  }
  __syncthreads();

  // 3. The lanes: record r (class-major) in lane r mod L codes its class's
  // gap planes, then the two difference planes, constant planes skipped.
  const uint32_t L = c.lanes, k_all = c.k;
  uint32_t err = kStatusOk;
  if (tid < L) {
    const uint8_t* pay = b.payload;
    const uint32_t beg = b.lanes[c.lane_first + tid];
    const uint32_t end = b.lanes[c.lane_first + tid + 1];
    uint32_t x = uint32_t{pay[beg]} | uint32_t{pay[beg + 1]} << 8 |
                 uint32_t{pay[beg + 2]} << 16 | uint32_t{pay[beg + 3]} << 24;
    uint32_t q = beg + 4;
    if (x < kRansLow) err = kStatusLaneEnd;
    uint32_t cl = 0;
    for (uint32_t r = tid; r < k_all && err == kStatusOk; r += L) {
      while (r >= h.first[cl] + h.k[cl]) ++cl;  // r < k: some class holds it
      const uint32_t gw = h.gw[cl];
      uint32_t gap = 0, d = 0;
      for (uint32_t j = 0; j < gw + 2 && err == kStatusOk; ++j) {
        const uint32_t p = j < gw ? 4 * cl + j : 4 * kCondClasses + (j - gw);
        const DevConditionalPlane pl = h.plane[p];
        uint32_t s;
        if (pl.mode == kCondConstant) {
          s = pl.symbol;
        } else {
          const uint32_t t = pl.t;
          const uint32_t* fc = sh.fc[p];
          const uint32_t slot = x & ((1u << t) - 1);
          s = SearchSymbol(fc, slot);
          const uint32_t e = fc[s];
          x = (e & 0xffffu) * (x >> t) + slot - (e >> 16);
          if (x < kRansLow) {
            if (end - q < 2) {
              err = kStatusLaneShort;
              break;
            }
            x = (x << 16) | uint32_t{pay[q]} | uint32_t{pay[q + 1]} << 8;
            q += 2;
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
      gaps[r] = gap;
      zz[r] = static_cast<uint16_t>(d);
    }
    if (err == kStatusOk && (q != end || x != kRansLow)) err = kStatusLaneEnd;
  }
  if (err != kStatusOk) atomicCAS(&sh.err, kStatusOk, err);
  __syncthreads();
  if (sh.err != kStatusOk) {
    if (tid == 0) b.status[c.status_index] = sh.err;
    return;
  }

  // 4. Per class: ranks = running sums of (gap + 1) - 1, ascending; each
  // below m_c, its difference stored at member index M_c + rank (distinct
  // ranks: distinct slots, all inside [0, n)).
  for (int cl = 0; cl < kCondClasses; ++cl) {
    const uint32_t first = h.first[cl], last = first + h.k[cl];
    const uint64_t m = sh.m[cl];
    unsigned long long run = 0;
    for (uint32_t r0 = first; r0 < last; r0 += kThreads) {
      const uint32_t r = r0 + tid;
      const unsigned long long v = r < last ? uint64_t{gaps[r]} + 1 : 0;
      unsigned long long inc, agg;
      Scan64(temp.s64).InclusiveSum(v, inc, agg);
      __syncthreads();
      if (r < last) {
        const uint64_t rank = run + inc - 1;
        if (rank >= m) {
          err = kStatusPosition;
        } else {
          member_zz[sh.offset[cl] + rank] = zz[r];
        }
      }
      run += agg;
    }
  }
  if (err != kStatusOk) atomicCAS(&sh.err, kStatusOk, err);
  __syncthreads();
  if (tid == 0 && sh.err != kStatusOk) b.status[c.status_index] = sh.err;
}

// Each element's XOR value into the chunk's dense plane (see the file
// comment).
__global__ void __launch_bounds__(kThreads) CondPlaneKernel(BatchDevice b) {
  const DevChunk& c = b.chunks[blockIdx.x];
  if (!Pending(b, c)) return;
  const uint32_t lo = HeaderOf(b, c).lo;
  const CondScratch layout = CondScratchLayout(c.n, c.k);
  const uint8_t* sc = b.scratch + c.records;
  const uint32_t* offset = reinterpret_cast<const uint32_t*>(sc) + kCondClasses;
  const uint32_t* counts = reinterpret_cast<const uint32_t*>(sc + layout.counts);
  const uint16_t* member_zz = reinterpret_cast<const uint16_t*>(sc + layout.member_zz);
  // The chunk's decoded staging is this batch's own device memory.
  uint16_t* plane = reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(b.payload) + c.data);
  __shared__ uint32_t s_warp[kWarps][kCondClasses];  // members per warp
  const uint32_t tiles = (c.n + kCondTile - 1) / kCondTile;
  const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t below = (1u << lane) - 1;
  for (uint32_t t = blockIdx.y; t < tiles; t += gridDim.y) {
    const uint32_t i = t * kCondTile + threadIdx.x;
    uint32_t x = 0, cl = kCondClasses;
    if (i < c.n) {
      x = BaseAt(c, i);
      cl = ClassOf(x, lo);
    }
    uint32_t in_warp = 0;
#pragma unroll
    for (uint32_t k = 0; k < kCondClasses; ++k) {
      const uint32_t m = __ballot_sync(0xffffffffu, cl == k);
      if (cl == k) in_warp = __popc(m & below);
      if (lane == 0) s_warp[warp][k] = __popc(m);
    }
    __syncthreads();
    if (i < c.n) {
      uint32_t rank = counts[kCondClasses * t + cl] + in_warp;
      for (uint32_t v = 0; v < warp; ++v) rank += s_warp[v][cl];
      const uint32_t d = member_zz[offset[cl] + rank];
      plane[i] = static_cast<uint16_t>(d == 0 ? 0 : x ^ ((x + Unzigzag(d)) & 0xffffu));
    }
    __syncthreads();  // s_warp is rewritten for the next tile
  }
}

}  // namespace

cudaError_t LaunchConditional(const BatchDevice& b, cudaStream_t stream) {
  if (b.num_chunks == 0 || b.conditional == 0) return cudaSuccess;
  CondCountKernel<<<dim3(b.num_chunks, kTileBlocks), kThreads, 0, stream>>>(b);
  CondDecodeKernel<<<b.num_chunks, kThreads, 0, stream>>>(b);
  CondPlaneKernel<<<dim3(b.num_chunks, kTileBlocks), kThreads, 0, stream>>>(b);
  return cudaGetLastError();
}

}  // namespace refit::cuda::internal
