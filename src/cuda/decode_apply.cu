// Receiver kernels: fused decode + apply of sparse XOR chunks, sparse rANS
// decode of other sparse chunks (kernel A), gap scan + scatter apply
// (kernel B), dense apply, range-hash verification (docs/format.md §2-§5). The scalar CPU decoder in
// src/codec is the reference; these kernels accept and refuse exactly the
// payloads it does (the host side has already checked models and lane
// framing, see batch.cc) and produce the same bytes.
#include <cub/block/block_scan.cuh>

#include "cuda/cuda_common.h"
#include "cuda/kernels.h"
#include "cuda/lane_ring.cuh"
#include "cuda/xxh3.cuh"

namespace refit::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kRansLow = 1u << 16;
constexpr uint64_t kSegment = 64 * 1024;

// Stores (or, with undo, reverts) the decoded records of a chunk whose
// positions and values are in scratch. XOR is its own inverse; overwrite
// kinds save the bytes they replace and restore them on undo.
__device__ void StoreSparse(const BatchDevice& b, const DevChunk& c,
                            bool undo) {
  const DevicePlacement pl = b.placements[c.placement];
  const uint32_t* pos = reinterpret_cast<const uint32_t*>(b.scratch + c.records);
  const uint8_t* vals = b.scratch + c.values;
  uint8_t* old = b.scratch + c.undo;
  const int w = c.width;
  const bool xor_kind = c.kind == 1;
  for (uint32_t r = threadIdx.x; r < c.k; r += blockDim.x) {
    uint64_t a;
    if (!MapElement(pl, b.pieces, c.start + RegionOffset(c.run, c.stride, pos[r]), &a))
      continue;
    uint8_t* p = Addr(a);
    if (xor_kind) {
      StoreWord(p, LoadWord(p, w) ^ LoadWord(vals + uint64_t{r} * w, w), w);
    } else if (undo) {
      StoreWord(p, LoadWord(old + uint64_t{r} * w, w), w);
    } else {
      StoreWord(old + uint64_t{r} * w, LoadWord(p, w), w);
      StoreWord(p, LoadWord(vals + uint64_t{r} * w, w), w);
    }
  }
}

__device__ void StoreDense(const BatchDevice& b, const DevChunk& c, bool undo) {
  const DevicePlacement pl = b.placements[c.placement];
  const uint8_t* vals = b.payload + c.data;
  uint8_t* old = b.scratch + c.undo;
  const int w = c.width;
  const bool xor_kind = c.kind == 3;
  for (uint32_t i = threadIdx.x; i < c.n; i += blockDim.x) {
    uint64_t a;
    if (!MapElement(pl, b.pieces, c.start + RegionOffset(c.run, c.stride, i), &a)) continue;
    uint8_t* p = Addr(a);
    const uint64_t off = uint64_t{i} * w;
    if (xor_kind) {
      const uint64_t v = LoadWord(vals + off, w);
      if (v != 0) StoreWord(p, LoadWord(p, w) ^ v, w);
    } else if (undo) {
      StoreWord(p, LoadWord(old + off, w), w);
    } else {
      StoreWord(old + off, LoadWord(p, w), w);
      StoreWord(p, LoadWord(vals + off, w), w);
    }
  }
}

constexpr int kDecodeThreads = 128;  // >= the lanes of most chunks
constexpr int kApplyThreads = 256;
constexpr int kApplyItems = 4;       // consecutive records per thread
constexpr uint32_t kTileRecords = kApplyThreads * kApplyItems;

// Kernel A: decodes the lanes of one sparse chunk into scratch. Lane j
// writes record i = j + m * L to slot i (gaps at c.records, values at
// c.values), so a warp's stores are coalesced. Checks everything the CPU
// decoder checks: lane framing and final states, zero XOR values, and that
// the positions stay below n (sum of (gap + 1) <= n, positions being
// strictly ascending by construction). Sets the chunk's status on failure;
// kernel B applies only chunks still kStatusOk.
__global__ void __launch_bounds__(kDecodeThreads)
    DecodeLanesKernel(BatchDevice b) {
  const DevChunk& cg = b.chunks[blockIdx.x];
  if (cg.layout != kDevSparse || cg.fused || cg.conditional ||
      b.status[cg.status_index] != kStatusOk) {
    return;
  }
  const uint32_t k = cg.k, L = cg.lanes, coded = cg.coded;
  const uint32_t tid = threadIdx.x;
  using Scan = cub::BlockScan<uint32_t, kDecodeThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ uint32_t s_err;
  __shared__ unsigned long long s_total;
  __shared__ uint32_t s_t[kMaxCodedPlanes];
  __shared__ uint32_t s_shift[kMaxCodedPlanes];
  __shared__ uint32_t s_tab[kMaxCodedPlanes];  // byte offset of the lookup
  extern __shared__ __align__(16) uint8_t smem[];
  uint32_t* fc_all = reinterpret_cast<uint32_t*>(smem);
  uint8_t* tabs = smem + coded * 1024;
  if (tid == 0) {
    s_err = kStatusOk;
    s_total = 0;
    uint32_t off = 0;
    for (uint32_t p = 0; p < coded; ++p) {
      const uint32_t t = b.tables[cg.table_first + p].t;
      s_t[p] = t;
      s_shift[p] = cg.coded_shift[p];
      s_tab[p] = off;
      off += 1u << min(t, uint32_t{kSlotTableBits});
    }
  }
  // Cumulative frequencies (two symbols per thread).
  for (uint32_t p = 0; p < coded; ++p) {
    const DevTable& tb = b.tables[cg.table_first + p];
    uint32_t f[2] = {tb.f[2 * tid], tb.f[2 * tid + 1]};
    uint32_t c[2];
    Scan(temp).ExclusiveSum(f, c);
    fc_all[p * 256 + 2 * tid] = f[0] | c[0] << 16;
    fc_all[p * 256 + 2 * tid + 1] = f[1] | c[1] << 16;
    __syncthreads();
  }
  for (uint32_t p = 0; p < coded; ++p) {
    const uint32_t t = s_t[p];
    const uint32_t bits = min(t, uint32_t{kSlotTableBits});
    const uint32_t* fc = fc_all + p * 256;
    uint8_t* tab = tabs + s_tab[p];
    for (uint32_t e = tid; e < (1u << bits); e += kDecodeThreads) {
      tab[e] = static_cast<uint8_t>(SearchSymbol(fc, e << (t - bits)));
    }
  }
  __syncthreads();

  uint32_t* gaps = reinterpret_cast<uint32_t*>(b.scratch + cg.records);
  uint8_t* vals = b.scratch + cg.values;
  const bool xor_kind = cg.kind == 1;
  const int w = cg.width;
  const uint64_t fixed_gap = cg.fixed_gap, fixed_value = cg.fixed_value;
  const uint8_t* payload = b.payload;
  uint64_t total = 0;
  uint32_t err = kStatusOk;
  for (uint32_t lane = tid; lane < L; lane += kDecodeThreads) {
    const uint32_t beg = b.lanes[cg.lane_first + lane];
    const uint32_t end = b.lanes[cg.lane_first + lane + 1];
    uint32_t q = beg + 4;
    uint32_t x = Rd32(payload + beg);
    if (x < kRansLow) err = kStatusLaneEnd;
    LaneRing ring{0, 0, 0, 0};  // loads ahead of the renormalizations
    ring.Start(reinterpret_cast<const uint32_t*>(payload), q);
    for (uint32_t i = lane; i < k && err == kStatusOk; i += L) {
      uint64_t gap = fixed_gap, val = fixed_value;
      for (uint32_t p = 0; p < coded; ++p) {
        const uint32_t t = s_t[p];
        const uint32_t* fc = fc_all + p * 256;
        const uint32_t slot = x & ((1u << t) - 1);
        uint32_t s;
        if (t <= kSlotTableBits) {
          s = tabs[s_tab[p] + slot];
        } else {
          s = tabs[s_tab[p] + (slot >> (t - kSlotTableBits))];
          while (s < 255 && (fc[s + 1] >> 16) <= slot) ++s;
        }
        const uint32_t e = fc[s];
        x = (e & 0xffff) * (x >> t) + slot - (e >> 16);
        if (x < kRansLow) {
          if (end - q < 2) {
            err = kStatusLaneShort;
            break;
          }
          x = (x << 16) |
              ring.Take16(reinterpret_cast<const uint32_t*>(payload), q);
        }
        const uint32_t sh = s_shift[p];
        if (codec::ShiftIsGap(sh)) {
          gap |= uint64_t{s} << sh;
        } else {
          val |= uint64_t{s} << (sh - codec::kSparseValueShift);
        }
      }
      if (err != kStatusOk) break;
      if (xor_kind && val == 0) {
        err = kStatusZeroXor;
        break;
      }
      total += gap + 1;
      gaps[i] = static_cast<uint32_t>(gap);
      StoreWord(vals + uint64_t{i} * w, val, w);
    }
    if (err == kStatusOk && (q != end || x != kRansLow)) err = kStatusLaneEnd;
  }
  if (err != kStatusOk) atomicCAS(&s_err, kStatusOk, err);
  if (total != 0) atomicAdd(&s_total, static_cast<unsigned long long>(total));
  __syncthreads();
  if (tid == 0) {
    if (s_err != kStatusOk) {
      b.status[cg.status_index] = s_err;
    } else if (s_total > cg.n) {
      b.status[cg.status_index] = kStatusPosition;  // p_{k-1} = total - 1
    }
  }
}

// Dense planes (docs/format.md §4.2, modes 0-2): one block per plane job.
// Byte j of element i of the chunk goes to its decoded staging at
// DevChunk::data + i * w + j; kernel B then applies the chunk from there.
// An entropy plane decodes its n records one thread per lane (record i in
// lane i mod L) with the same checks as the codec's DecodeStream: start and
// final states, lane underrun, leftover bytes.
__global__ void __launch_bounds__(256) DenseDecodeKernel(BatchDevice b) {
  const DevDensePlane pj = b.planes[blockIdx.x];
  const DevChunk& cg = b.chunks[pj.chunk];
  if (b.status[cg.status_index] != kStatusOk) return;
  const uint32_t n = cg.n, w = cg.width, tid = threadIdx.x;
  // The decoded staging is this batch's own device memory.
  uint8_t* out = const_cast<uint8_t*>(b.payload) + cg.data + pj.j;
  if (pj.mode == kPlaneConstant) {
    const uint8_t sym = static_cast<uint8_t>(pj.src);
    for (uint32_t i = tid; i < n; i += blockDim.x) out[uint64_t{i} * w] = sym;
    return;
  }
  if (pj.mode == kPlaneVerbatim) {
    const uint8_t* src = b.payload + pj.src;
    for (uint32_t i = tid; i < n; i += blockDim.x) out[uint64_t{i} * w] = src[i];
    return;
  }
  using Scan = cub::BlockScan<uint32_t, 256>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ uint32_t fc[256];
  __shared__ uint8_t tab[1u << kSlotTableBits];
  const DevTable& tb = b.tables[pj.table];
  const uint32_t t = tb.t;
  {
    const uint32_t f = tb.f[tid];
    uint32_t c;
    Scan(temp).ExclusiveSum(f, c);
    fc[tid] = f | c << 16;
  }
  __syncthreads();
  const uint32_t bits = min(t, uint32_t{kSlotTableBits});
  for (uint32_t e = tid; e < (1u << bits); e += blockDim.x) {
    tab[e] = static_cast<uint8_t>(SearchSymbol(fc, e << (t - bits)));
  }
  __syncthreads();
  const uint32_t L = pj.lanes;
  if (tid >= L) return;
  const uint8_t* payload = b.payload;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  const uint32_t beg = b.lanes[pj.lane_first + tid];
  const uint32_t end = b.lanes[pj.lane_first + tid + 1];
  uint32_t x = Rd32(payload + beg);
  uint32_t q = beg + 4;
  uint32_t err = x < kRansLow ? kStatusLaneEnd : kStatusOk;
  LaneRing ring{0, 0, 0, 0};
  ring.Start(words, q);
  const uint32_t mask = (1u << t) - 1;
  for (uint32_t i = tid; i < n && err == kStatusOk; i += L) {
    const uint32_t slot = x & mask;
    uint32_t s;
    if (t <= kSlotTableBits) {
      s = tab[slot];
    } else {
      s = tab[slot >> (t - kSlotTableBits)];
      while (s < 255 && (fc[s + 1] >> 16) <= slot) ++s;
    }
    const uint32_t e = fc[s];
    x = (e & 0xffff) * (x >> t) + slot - (e >> 16);
    if (x < kRansLow) {
      if (end - q < 2) {
        err = kStatusLaneShort;
        break;
      }
      x = (x << 16) | ring.Take16(words, q);
    }
    out[uint64_t{i} * w] = static_cast<uint8_t>(s);
  }
  if (err == kStatusOk && (q != end || x != kRansLow)) err = kStatusLaneEnd;
  if (err != kStatusOk) atomicCAS(&b.status[cg.status_index], kStatusOk, err);
}

// ---------------------------------------------------------------------------
// Fused decode + apply for sparse XOR chunks (DevChunk::fused). One block per
// chunk, one thread per rANS lane (blockDim = the batch's widest chunk,
// rounded up to a warp). Row m holds records m * L .. m * L + L - 1, one per
// lane (docs/format.md §5.3 deals record i to lane i mod L). The lanes
// advance in lockstep over groups of kRowGroup rows: each lane decodes its
// kRowGroup records into registers, then one exchange turns the group's
// gaps into positions and each thread scatters its records. No record ever
// goes to staging memory, which is what bounded the two-kernel path
// (kernels A and B) to a few chunks per batch.
//
// Positions of a group: per row, a warp scan of (gap + 1) over the lanes
// (the group's kRowGroup scans are independent, so their shuffles overlap);
// with more than one warp, each warp's row sums go to shared memory, one
// block barrier, and every warp scans the group's warps x rows sums in
// record order itself. The exchange and its barrier are paid once per group
// instead of once per row.
//
// Checks (those of kernel A): lane framing and final state, zero XOR value,
// position >= n. A group is scattered only when every check of all its
// records passed: positions ascend, so "no position >= n" is "the group's
// last position < n", known to every thread after the exchange. A chunk
// that turns out corrupt may already have applied its earlier groups; the
// block then replays exactly those groups and XORs them again (XOR is its
// own inverse), so a refused chunk's range ends untouched, as on the
// two-kernel path. "After" mismatches are undone the same way by a second
// launch.
//
// The decode is kept cheap: plane parameters in registers for chunks of up
// to kRegPlanes coded planes; renormalization without branches (a lane
// reads its bytes through a window of three aligned words); 32-bit sums
// (saturating; n <= 2^28, docs/format.md §3); values in 32 bits unless the
// width is 8. Against the row-at-a-time kernel that cut the batches'
// summed kernel time by 20-32%, but at 1% and 3% the decode is no longer
// the bound: on an H200 with the 32 GiB BF16 benchmark (docs/benchmarks.md),
// a build of this kernel without its scatter takes 3.3 / 6.1 ms, scattering
// into a range that stays in L2 3.9 / 8.1 ms, and the real scatter 8.4 /
// 16.1 ms (pause, payload in HBM). Each record's RED makes
// L2 fetch its sector from DRAM and later write it back (~160 M / ~415 M
// distinct 32-byte sectors, in random order), and that traffic bounds the
// pause there. At 0.1% (5 lanes a chunk) a chunk's serial decode does:
// packing four such chunks into one warp (8 lanes each, segmented scans)
// measured slower (2.34 ms against 2.08), as the rows of a chunk still
// follow one another.
constexpr int kFusedMaxThreads = 256;  // lanes <= 255
constexpr int kFusedMaxWarps = kFusedMaxThreads / 32;
constexpr int kRowGroup = 4;           // rows decoded before one exchange
constexpr int kRegPlanes = 4;          // coded planes held in registers
// <= 64 registers a thread (a few bytes spill): more chunks resident,
// hence more scatters in flight, which the 1% and 3% deltas wait on (3%:
// 0.2-0.3 ms less than with 80 registers; 0.1%: 0.05 ms more).
constexpr int kFusedMinBlocks = 4;
constexpr uint32_t kScanSat = (1u << 31) - 1;  // a + b fits in 32 bits

__device__ inline uint32_t AddSat(uint32_t a, uint32_t b) {
  return min(a + b, kScanSat);
}

// XORs v into the w-byte element at p as a fire-and-forget reduction
// (RED.XOR at L2): the thread never waits for the element's old value,
// which is what bounded a load-then-store scatter to one DRAM latency per
// row. Widths 1 and 2 XOR the aligned 32-bit word holding the element,
// with zeros elsewhere; every other write to such a word is another atomic
// or, from another batch's kernels running at the same time on another
// stream (a neighbouring chunk), a store of its own bytes only, so no
// neighbouring byte is lost.
template <typename V>
__device__ inline void XorRed(uint8_t* p, V v, int w) {
  if (w == 8) {
    atomicXor(reinterpret_cast<unsigned long long*>(p),
              static_cast<unsigned long long>(v));
  } else if (w == 4) {
    atomicXor(reinterpret_cast<unsigned int*>(p), static_cast<unsigned int>(v));
  } else {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    atomicXor(reinterpret_cast<unsigned int*>(a & ~uintptr_t{3}),
              static_cast<unsigned int>(v) << (8 * (a & 3)));
  }
}

// Loads from shared memory by 32-bit shared-window address. Through a
// generic pointer the compiler rebuilt the window base (S2UR of the CTA's
// cluster id, then ULEA) for every table lookup, on the decode's chain.
// Not volatile: only for the decode tables, which do not change once built
// (a barrier separates building from decoding).
__device__ __forceinline__ uint32_t LdsU8(uint32_t a) {
  uint32_t v;
  asm("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t LdsU32(uint32_t a) {
  uint32_t v;
  asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
  return v;
}
// The shared-window address of p, computed once (volatile: not rebuilt at
// each use).
__device__ __forceinline__ uint32_t SharedAddr(const void* p) {
  uint64_t a;
  asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return static_cast<uint32_t>(a);
}

struct FusedShared {
  // Per coded plane: t, shared-window address of its slot lookup, bit
  // shift of its byte (codec::SparsePlane::shift), shared-window address of
  // its f | c << 16 table.
  uint4 plane[kMaxCodedPlanes];
  // Per group parity, per row of the group and warp: the warp's sum of
  // (gap + 1) over the row, bit 31 set when a lane of the warp failed a
  // check. Two buffers: a warp writes group g + 1's sums while others may
  // still read group g's.
  uint32_t sums[2][kRowGroup * kFusedMaxWarps];
  uint32_t code;
};

// Builds the chunk's per-plane tables in shared memory (any block size that
// is a multiple of 32): fc = f | c << 16, then the slot -> symbol lookup.
__device__ void BuildTablesAnyBlock(const BatchDevice& b, const DevChunk& cg,
                                    FusedShared& sh, uint8_t* smem) {
  const uint32_t coded = cg.coded, tid = threadIdx.x;
  const uint32_t warp = tid / 32, lane = tid % 32, warps = blockDim.x / 32;
  uint32_t* fc_all = reinterpret_cast<uint32_t*>(smem);
  const uint32_t sbase = SharedAddr(smem);
  if (tid == 0) {
    uint32_t off = coded * 1024;
    for (uint32_t p = 0; p < coded; ++p) {
      const uint32_t t = b.tables[cg.table_first + p].t;
      sh.plane[p] = make_uint4(t, sbase + off, cg.coded_shift[p], sbase + 1024 * p);
      off += 1u << min(t, uint32_t{kSlotTableBits});
    }
    sh.code = kStatusOk;
  }
  for (uint32_t p = warp; p < coded; p += warps) {
    const DevTable& tb = b.tables[cg.table_first + p];
    uint32_t f[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      f[j] = tb.f[lane * 8 + j];
      sum += f[j];
    }
    uint32_t incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= static_cast<uint32_t>(o)) incl += v;
    }
    uint32_t c = incl - sum;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      fc_all[p * 256 + lane * 8 + j] = f[j] | c << 16;
      c += f[j];
    }
  }
  __syncthreads();
  for (uint32_t p = 0; p < coded; ++p) {
    const uint32_t t = sh.plane[p].x;
    const uint32_t bits = min(t, uint32_t{kSlotTableBits});
    const uint32_t* fc = fc_all + p * 256;
    uint8_t* tab = smem + (sh.plane[p].y - sbase);
    for (uint32_t e = tid; e < (1u << bits); e += blockDim.x) {
      tab[e] = static_cast<uint8_t>(SearchSymbol(fc, e << (t - bits)));
    }
  }
  __syncthreads();
}

// One rANS lane of a fused chunk: state, read position, end, and the lane's
// bytes around the read position as three aligned words (lo holds byte q,
// hi and nx the next two words; nx is loaded ahead, so a renormalization
// waits for memory only if the lane outruns two of them; a deeper queue of
// words measured the same). Loads may read up to 40 bytes past the lane's
// last byte (a short lane is stopped at the end of its record, at most
// kMaxCodedPlanes renormalizations on); payload slots are padded for that
// (kPayloadPad, kernels.h), and the check on q never lets such bytes be
// used.
struct FusedLane {
  uint32_t x, q, end, lo, hi, nx;

  __device__ void Start(const uint8_t* payload, uint32_t beg, uint32_t e) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
    x = Rd32(payload + beg);
    q = beg + 4;
    end = e;
    lo = __ldg(words + (q >> 2));
    hi = __ldg(words + (q >> 2) + 1);
    nx = __ldg(words + (q >> 2) + 2);
  }

  // Decodes one symbol of the plane whose slot lookup is at shared address
  // tab and whose f | c << 16 at fc; t <= 15, mask = 2^t - 1. Sets err (if
  // still ok) when the lane runs out of bytes.
  __device__ __forceinline__ uint32_t Symbol(const uint32_t* words, uint32_t tab,
                                             uint32_t fc, uint32_t t,
                                             uint32_t mask, uint32_t& err) {
    const uint32_t slot = x & mask;
    uint32_t s;
    if (t <= kSlotTableBits) {  // uniform: every lane has the chunk's table
      s = LdsU8(tab + slot);
    } else {
      s = LdsU8(tab + (slot >> (t - kSlotTableBits)));
      while (s < 255 && (LdsU32(fc + 4 * (s + 1)) >> 16) <= slot) ++s;
    }
    const uint32_t e = LdsU32(fc + 4 * s);
    x = (e & 0xffffu) * (x >> t) + slot - (e >> 16);
    // Renormalization, at most one per symbol (t <= 16), without a branch.
    const bool rn = x < kRansLow;
    if (rn && end - q < 2 && err == kStatusOk) err = kStatusLaneShort;
    const uint32_t v = __funnelshift_r(lo, hi, 8 * (q & 3)) & 0xffffu;
    x = rn ? (x << 16 | v) : x;
    const uint32_t q2 = rn ? q + 2 : q;
    const bool step = ((q2 ^ q) & 4) != 0;  // the word at q is used up
    lo = step ? hi : lo;
    hi = step ? nx : hi;
    LoadIf(step, nx, words + (q2 >> 2) + 2);
    q = q2;
    return s;
  }
};

// One pass over the chunk's rows. check: verify everything and stop at the
// first group in which any check fails (that group is not scattered);
// returns the number of rows scattered and leaves the failure in sh.code.
// Replay (check == false): decode and scatter the first `row_limit` rows,
// the same records a checking pass scattered (row_limit is a multiple of
// kRowGroup or every row). kP > 0: at most kP coded planes, their
// parameters in registers; kP == 0: any number, read from shared memory.
// V holds a value: uint32_t for widths 1, 2 and 4, uint64_t for 8.
// Longer than our other functions (~160 lines) on purpose: its four steps
// per group of rows (decode into registers, the warps' scan of the gaps,
// the checks, the scatter) share the lanes' rANS states, the group's
// values and the running position in registers across the steps; cut into
// functions, those would pass through memory unless every piece is forced
// inline, and this hot loop's register use and speed could only be
// re-measured on a GPU (docs/benchmarks.md).
template <int kP, typename V>
__device__ uint32_t FusedPass(const BatchDevice& b, const DevChunk& cg,
                              FusedShared& sh, const uint8_t* smem, bool check,
                              uint32_t row_limit) {
  const uint32_t k = cg.k, L = cg.lanes, coded = cg.coded;
  const uint32_t tid = threadIdx.x, warp = tid / 32, wl = tid % 32;
  const uint32_t warps = blockDim.x / 32;
  const uint8_t* payload = b.payload;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  const int w = cg.width;
  const uint32_t n = cg.n;
  const uint64_t start = cg.start, linear = cg.linear_address;
  const uint64_t run = cg.run, stride = cg.stride;
  const uint32_t fixed_gap = static_cast<uint32_t>(cg.fixed_gap);
  const V fixed_value = static_cast<V>(cg.fixed_value);
  const DevicePlacement* pl = b.placements + cg.placement;
  uint4 reg_plane[kP > 0 ? kP : 1];
#pragma unroll
  for (int p = 0; p < kP; ++p) {
    reg_plane[p] = p < static_cast<int>(coded) ? sh.plane[p]
                                               : make_uint4(0, 0, 0, 0);
  }
  const bool has_lane = tid < L;
  FusedLane ln{};
  ln.x = kRansLow;
  if (has_lane) {
    ln.Start(payload, b.lanes[cg.lane_first + tid],
             b.lanes[cg.lane_first + tid + 1]);
  }
  uint32_t err = kStatusOk;
  if (check && ln.x < kRansLow) err = kStatusLaneEnd;
  uint32_t carry = 0;  // sum of (gap + 1) over the groups done (saturating)
  uint32_t m0 = 0;
  bool failed = false;
  for (uint32_t g = 0; m0 < row_limit; ++g, m0 += kRowGroup) {
    // 1. Decode this lane's records of the group.
    uint32_t inc[kRowGroup];  // gap + 1, 0 for no record; then the scan
    V val[kRowGroup];
#pragma unroll
    for (int j = 0; j < kRowGroup; ++j) {
      inc[j] = 0;
      val[j] = 0;
      const uint32_t i = tid + (m0 + j) * L;
      if (has_lane && i < k && m0 + j < row_limit && err == kStatusOk) {
        uint32_t gap = fixed_gap;
        V v = fixed_value;
        // Plane p's symbol into its byte of the gap or the value.
        auto plane = [&](const uint4& pp, uint32_t p) {
          const uint32_t s = ln.Symbol(words, pp.y, pp.w, pp.x, (1u << pp.x) - 1, err);
          if (codec::ShiftIsGap(pp.z)) {
            gap |= s << pp.z;
          } else {
            v |= static_cast<V>(s) << (pp.z - codec::kSparseValueShift);
          }
        };
        if constexpr (kP > 0) {
#pragma unroll
          for (int p = 0; p < kP; ++p) {
            if (p < static_cast<int>(coded)) plane(reg_plane[p], p);
          }
        } else {
          for (uint32_t p = 0; p < coded; ++p) plane(sh.plane[p], p);
        }
        if (v == 0 && err == kStatusOk) err = kStatusZeroXor;
        inc[j] = min(gap, kScanSat - 1) + 1;
        val[j] = v;
      }
    }
    // 2. Positions: per row, the warp's inclusive scan of (gap + 1).
    uint32_t present = 0;
#pragma unroll
    for (int j = 0; j < kRowGroup; ++j) present |= (inc[j] != 0 ? 1u : 0u) << j;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
      for (int j = 0; j < kRowGroup; ++j) {
        const uint32_t u = __shfl_up_sync(0xffffffffu, inc[j], o);
        if (wl >= static_cast<uint32_t>(o)) inc[j] = AddSat(inc[j], u);
      }
    }
    bool any_err = __any_sync(0xffffffffu, err != kStatusOk);
    uint32_t before[kRowGroup];  // (gap + 1) of the records ahead of this
                                 // warp's row j, earlier groups included
    uint32_t group_end;
    if (warps == 1) {
      uint32_t run = carry;
#pragma unroll
      for (int j = 0; j < kRowGroup; ++j) {
        before[j] = run;
        run = AddSat(run, __shfl_sync(0xffffffffu, inc[j], 31));
      }
      group_end = run;
    } else {
      uint32_t* buf = sh.sums[g & 1];
      if (wl == 31) {
        const uint32_t flag = any_err ? 0x80000000u : 0u;
#pragma unroll
        for (int j = 0; j < kRowGroup; ++j) buf[j * warps + warp] = inc[j] | flag;
      }
      __syncthreads();
      // Item j * warps + v: warp v's sum over row j, in record order.
      const uint32_t items = kRowGroup * warps;  // <= 64
      uint32_t a = wl < items ? buf[wl] : 0;
      uint32_t c = wl + 32 < items ? buf[wl + 32] : 0;
      any_err = __any_sync(0xffffffffu, ((a | c) >> 31) != 0);
      a &= 0x7fffffffu;
      c &= 0x7fffffffu;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t ua = __shfl_up_sync(0xffffffffu, a, o);
        const uint32_t uc = __shfl_up_sync(0xffffffffu, c, o);
        if (wl >= static_cast<uint32_t>(o)) {
          a = AddSat(a, ua);
          c = AddSat(c, uc);
        }
      }
      c = AddSat(c, __shfl_sync(0xffffffffu, a, 31));
      // Exclusive prefix of item j * warps + warp: the inclusive one of the
      // item before it (the index is the same for the whole warp).
#pragma unroll
      for (int j = 0; j < kRowGroup; ++j) {
        const uint32_t idx = j * warps + warp;
        const uint32_t src = idx - 1;
        const uint32_t e =
            __shfl_sync(0xffffffffu, src < 32 ? a : c, src & 31);
        before[j] = AddSat(carry, idx == 0 ? 0 : e);
      }
      const uint32_t last = items - 1;
      group_end = AddSat(
          carry, __shfl_sync(0xffffffffu, last < 32 ? a : c, last & 31));
    }
    // 3. Every check of the group passed (the same answer in every thread),
    // or nothing of it is scattered.
    if (check && (any_err || group_end > n)) {
      failed = true;
      if (!any_err && tid == 0) sh.code = kStatusPosition;
      break;
    }
    // 4. Scatter.
#pragma unroll
    for (int j = 0; j < kRowGroup; ++j) {
      if ((present >> j & 1) == 0) continue;
      const uint32_t pos = AddSat(before[j], inc[j]) - 1;
      if (pos >= n) continue;  // a checked group has none
      const uint64_t e = RegionOffset(run, stride, pos);
      if (linear != 0) {
        XorRed(Addr(linear + e * w), val[j], w);
      } else {
        uint64_t a = 0;
        if (MapElement(*pl, b.pieces, start + e, &a)) {
          XorRed(Addr(a), val[j], w);
        }
      }
    }
    carry = group_end;
  }
  if (check) {
    if (!failed && has_lane && err == kStatusOk &&
        (ln.q != ln.end || ln.x != kRansLow)) {
      err = kStatusLaneEnd;
    }
    if (err != kStatusOk) atomicCAS(&sh.code, kStatusOk, err);
  }
  return min(m0, row_limit);
}

template <int kP, typename V>
__device__ void FusedChunk(const BatchDevice& b, const DevChunk& cg,
                           FusedShared& sh, const uint8_t* smem, int undo) {
  const uint32_t rows = cg.k == 0 ? 0 : (cg.k - 1) / cg.lanes + 1;
  if (undo) {
    FusedPass<kP, V>(b, cg, sh, smem, false, rows);
    return;
  }
  const uint32_t done = FusedPass<kP, V>(b, cg, sh, smem, true, rows);
  __syncthreads();
  if (sh.code == kStatusOk) return;
  // Corrupt: put back the groups already scattered, then report.
  FusedPass<kP, V>(b, cg, sh, smem, false, done);
  if (threadIdx.x == 0) b.status[cg.status_index] = sh.code;
}

__global__ void __launch_bounds__(kFusedMaxThreads, kFusedMinBlocks)
    FusedXorKernel(BatchDevice b, int undo) {
  const DevChunk& cg = b.chunks[blockIdx.x];
  if (!cg.fused) return;
  const uint32_t st = b.status[cg.status_index];
  if (undo ? st != kStatusAfterMismatch : st != kStatusOk) return;
  __shared__ FusedShared sh;
  extern __shared__ __align__(16) uint8_t smem[];
  if (cg.lanes > blockDim.x) {  // the launch is sized from the batch
    if (threadIdx.x == 0 && !undo) b.status[cg.status_index] = kStatusLaneEnd;
    return;
  }
  BuildTablesAnyBlock(b, cg, sh, smem);
  // The same choice in every thread of the block.
  if (cg.width == 8) {
    if (cg.coded <= kRegPlanes) {
      FusedChunk<kRegPlanes, uint64_t>(b, cg, sh, smem, undo);
    } else {
      FusedChunk<0, uint64_t>(b, cg, sh, smem, undo);
    }
  } else if (cg.coded <= kRegPlanes) {
    FusedChunk<kRegPlanes, uint32_t>(b, cg, sh, smem, undo);
  } else {
    FusedChunk<0, uint32_t>(b, cg, sh, smem, undo);
  }
}

// Launches the fused kernel, one thread per lane of the batch's widest
// chunk (rounded up to a warp).
cudaError_t LaunchFused(const BatchDevice& b, int undo, cudaStream_t stream) {
  static bool attr_set = false;  // the first call raises the dynamic limit
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(
        FusedXorKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(kMaxDecodeSmem));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  const uint32_t threads = (b.fused_lanes + 31) / 32 * 32;
  if (threads > kFusedMaxThreads) return cudaErrorInvalidValue;
  FusedXorKernel<<<b.num_chunks, threads, b.smem, stream>>>(b, undo);
  return cudaGetLastError();
}

// Scatters one thread's kApplyItems consecutive records (positions in
// pos[], absent ones as ~0u): every load is issued before any store, so
// the read-modify-writes overlap. linear != 0: the range (the region's
// span) is contiguous there; otherwise each position goes through the
// placement.
__device__ inline void ScatterItems(const BatchDevice& b,
                                    const DevicePlacement* pl, uint64_t linear,
                                    uint64_t start, uint64_t run, uint64_t stride,
                                    const uint32_t* pos,
                                    uint32_t first, const uint8_t* vals,
                                    uint8_t* old, int w, bool xor_kind) {
  uint8_t* dst[kApplyItems];
  uint64_t cur[kApplyItems], val[kApplyItems];
#pragma unroll
  for (int j = 0; j < kApplyItems; ++j) {
    dst[j] = nullptr;
    cur[j] = 0;
    val[j] = 0;
    if (pos[j] == ~0u) continue;
    const uint64_t e = RegionOffset(run, stride, pos[j]);
    if (linear != 0) {
      dst[j] = Addr(linear + e * w);
    } else {
      uint64_t a = 0;
      if (MapElement(*pl, b.pieces, start + e, &a)) dst[j] = Addr(a);
    }
  }
#pragma unroll
  for (int j = 0; j < kApplyItems; ++j) {
    if (dst[j] == nullptr) continue;
    cur[j] = LoadWord(dst[j], w);
    val[j] = LoadWord(vals + uint64_t{first + j} * w, w);
  }
#pragma unroll
  for (int j = 0; j < kApplyItems; ++j) {
    if (dst[j] == nullptr) continue;
    if (xor_kind) {
      StoreWord(dst[j], cur[j] ^ val[j], w);
    } else {
      StoreWord(old + uint64_t{first + j} * w, cur[j], w);
      StoreWord(dst[j], val[j], w);
    }
  }
}

// Kernel B: one block per chunk. Sparse chunks: tiles of 1024 records, 4
// consecutive ones per thread; a block scan turns gaps into positions and
// each thread scatters its records. Positions are written back where
// "after" verification may need to undo. Dense chunks: one element per
// thread and step.
__global__ void __launch_bounds__(kApplyThreads)
    ScanApplyKernel(BatchDevice b) {
  const DevChunk& cg = b.chunks[blockIdx.x];
  if (cg.fused || cg.conditional || b.status[cg.status_index] != kStatusOk) return;
  if (cg.layout == kDevDense) {
    StoreDense(b, cg, false);
    return;
  }
  using Scan = cub::BlockScan<uint32_t, kApplyThreads>;
  __shared__ typename Scan::TempStorage temp;
  const uint32_t k = cg.k;
  const int w = cg.width;
  const bool xor_kind = cg.kind == 1;
  const bool keep_positions = cg.range_address != 0;
  const uint64_t linear = cg.linear_address;
  const uint64_t start = cg.start;
  const DevicePlacement* pl = b.placements + cg.placement;
  uint32_t* recs = reinterpret_cast<uint32_t*>(b.scratch + cg.records);
  const uint8_t* vals = b.scratch + cg.values;
  uint8_t* old = b.scratch + cg.undo;
  uint32_t carry = 0;  // sum of (gap + 1) so far; <= n (checked by kernel A)
  for (uint32_t base = 0; base < k; base += kTileRecords) {
    const uint32_t first = base + threadIdx.x * kApplyItems;
    uint32_t g[kApplyItems];
    const bool full = first + kApplyItems <= k;
    if (full) {
      const uint4 v = *reinterpret_cast<const uint4*>(recs + first);
      g[0] = v.x; g[1] = v.y; g[2] = v.z; g[3] = v.w;
    } else {
#pragma unroll
      for (int j = 0; j < kApplyItems; ++j) {
        g[j] = first + j < k ? recs[first + j] : 0;
      }
    }
    uint32_t local = 0;
#pragma unroll
    for (int j = 0; j < kApplyItems; ++j) {
      if (first + j < k) local += g[j] + 1;
    }
    uint32_t excl, tile_total;
    Scan(temp).ExclusiveSum(local, excl, tile_total);
    uint32_t run = carry + excl;
#pragma unroll
    for (int j = 0; j < kApplyItems; ++j) {
      if (first + j < k) {
        run += g[j] + 1;
        g[j] = run - 1;
      } else {
        g[j] = ~0u;
      }
    }
    if (keep_positions) {
      if (full) {
        *reinterpret_cast<uint4*>(recs + first) = make_uint4(g[0], g[1], g[2], g[3]);
      } else {
#pragma unroll
        for (int j = 0; j < kApplyItems; ++j) {
          if (first + j < k) recs[first + j] = g[j];
        }
      }
    }
    ScatterItems(b, pl, linear, start, cg.run, cg.stride, g, first, vals, old, w,
                 xor_kind);
    carry += tile_total;
    __syncthreads();  // temp is reused by the next tile's scan
  }
}

// kDigestBlocks blocks per chunk (blockIdx.y), their warps over its 64 KiB
// segments: one block of 8 warps per chunk left most of the GPU idle while
// a batch's ranges were hashed (a batch holds tens of chunks of megabytes).
constexpr uint32_t kDigestBlocks = 16;

// Digests of a batch chunk's 64 KiB segments (those this block's warps
// own), each hash(c, offset, length) stored by the warp's lane 0; chunks of
// the other shape (strided or contiguous), without a range here, or already
// failed are left alone.
template <class Hash>
__device__ __forceinline__ void DigestSegments(const BatchDevice& b, bool strided,
                                               Hash hash) {
  const DevChunk& c = b.chunks[blockIdx.x];
  if (c.range_address == 0 || (c.run != 0) != strided ||
      b.status[c.status_index] != kStatusOk) {
    return;
  }
  const uint64_t bytes = uint64_t{c.n} * c.width;
  uint64_t* dig = reinterpret_cast<uint64_t*>(b.scratch) + 2 * c.seg_first;
  const uint32_t warps = gridDim.y * (blockDim.x / 32);
  const uint32_t warp = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  for (uint32_t s = warp; s < c.segments; s += warps) {
    const uint64_t off = uint64_t{s} * kSegment;
    const uint64_t len = bytes - off < kSegment ? bytes - off : kSegment;
    const H128 h = hash(c, off, len);
    if ((threadIdx.x & 31) == 0) {
      dig[2 * s] = h.lo;
      dig[2 * s + 1] = h.hi;
    }
  }
}

// The contiguous ranges' digests. Strided regions are hashed by
// RegionDigestKernel: gathering them in this kernel took it from 128 to 170
// registers, half the blocks per SM, and slowed the hash of every range.
__global__ void __launch_bounds__(kThreads) SegmentDigestKernel(BatchDevice b) {
  DigestSegments(b, /*strided=*/false,
                 [](const DevChunk& c, uint64_t off, uint64_t len) {
                   return Xxh3Warp(Addr(c.range_address) + off, len);
                 });
}

// The strided regions' digests: a region hashes as its rows laid end to
// end (docs/format.md §2); each warp gathers them a block at a time into
// shared memory (segments and blocks hold whole elements).
__global__ void __launch_bounds__(kThreads) RegionDigestKernel(BatchDevice b) {
  __shared__ alignas(16) uint8_t s_gather[kThreads / 32][kGatherBuffer];
  const uint32_t lane = threadIdx.x & 31;
  DigestSegments(b, /*strided=*/true, [&](const DevChunk& c, uint64_t off, uint64_t len) {
    const uint8_t* base = Addr(c.range_address);
    const int w = c.width;
    return Xxh3WarpGathered(
        s_gather[threadIdx.x / 32], len, [&](uint64_t o, uint64_t n, uint8_t* dst) {
          const uint32_t first = static_cast<uint32_t>((off + o) / w);
          for (uint32_t i = lane; i < n / w; i += 32) {
            const uint64_t e = RegionOffset(c.run, c.stride, first + i);
            StoreWord(dst + uint64_t{i} * w, LoadWord(base + e * w, w), w);
          }
        });
  });
}

// Every chunk's segment digests: the contiguous ranges', then (when the
// batch has any) the strided regions'.
void LaunchSegmentDigests(const BatchDevice& b, cudaStream_t stream) {
  SegmentDigestKernel<<<dim3(b.num_chunks, kDigestBlocks), kThreads, 0,
                        stream>>>(b);
  if (b.regions != 0) {
    RegionDigestKernel<<<dim3(b.num_chunks, kDigestBlocks), kThreads, 0,
                         stream>>>(b);
  }
}

// mode 0: verify "after" and undo on mismatch; mode 1: classify.
__global__ void __launch_bounds__(kThreads)
    CheckKernel(BatchDevice b, int mode, uint8_t* state) {
  const DevChunk& c = b.chunks[blockIdx.x];
  if (c.range_address == 0) {
    if (mode == 1 && threadIdx.x == 0) state[c.status_index] = 3;
    return;
  }
  if (b.status[c.status_index] != kStatusOk) return;
  __shared__ uint64_t s_h[2];
  if (threadIdx.x < 32) {
    const uint8_t* dig = b.scratch + 16 * c.seg_first;
    const H128 h = Xxh3Warp(dig, 16 * uint64_t{c.segments});
    if (threadIdx.x == 0) {
      s_h[0] = h.lo;
      s_h[1] = h.hi;
    }
  }
  __syncthreads();
  const bool is_after = s_h[0] == c.after_lo && s_h[1] == c.after_hi;
  if (mode == 1) {
    if (threadIdx.x == 0) {
      const bool is_before = s_h[0] == c.before_lo && s_h[1] == c.before_hi;
      state[c.status_index] = is_after ? 1 : is_before ? 0 : 2;
    }
    return;
  }
  if (is_after) return;
  if (c.fused) {
    // FusedXorKernel's undo launch decodes and XORs the chunk again.
  } else if (c.layout == kDevDense) {
    StoreDense(b, c, true);
  } else {
    StoreSparse(b, c, true);
  }
  if (threadIdx.x == 0) b.status[c.status_index] = kStatusAfterMismatch;
}

__global__ void HashSpansKernel(const uint8_t* data, const uint64_t* offsets,
                                const uint64_t* lens, uint32_t n,
                                uint64_t* out) {
  const uint32_t item = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (item >= n) return;  // whole warps leave together
  const H128 h = Xxh3Warp(data + offsets[item], lens[item]);
  if ((threadIdx.x & 31) == 0) {
    out[2 * item] = h.lo;
    out[2 * item + 1] = h.hi;
  }
}

__global__ void RangeDigestKernel(const uint8_t* data, uint64_t len,
                                  uint64_t segments, uint64_t* dig) {
  const uint64_t s = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  if (s >= segments) return;
  const uint64_t off = s * kSegment;
  const uint64_t l = len - off < kSegment ? len - off : kSegment;
  const H128 h = Xxh3Warp(data + off, len == 0 ? 0 : l);
  if ((threadIdx.x & 31) == 0) {
    dig[2 * s] = h.lo;
    dig[2 * s + 1] = h.hi;
  }
}

__global__ void RangeCombineKernel(const uint8_t* dig, uint64_t segments,
                                   uint64_t* out) {
  const H128 h = Xxh3Warp(dig, 16 * segments);
  if (threadIdx.x == 0) {
    out[0] = h.lo;
    out[1] = h.hi;
  }
}

}  // namespace

cudaError_t LaunchDecode(const BatchDevice& b, cudaStream_t stream) {
  if (b.num_chunks == 0) return cudaSuccess;
  if (b.smem > kMaxDecodeSmem) return cudaErrorInvalidValue;
  static bool attr_set = false;  // first call raises the dynamic limit
  if (!attr_set) {
    cudaError_t e = cudaFuncSetAttribute(
        DecodeLanesKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(kMaxDecodeSmem));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  if (b.fused_lanes != 0) {
    const cudaError_t e = LaunchFused(b, 0, stream);
    if (e != cudaSuccess) return e;
  }
  if (b.unfused != 0) {
    DecodeLanesKernel<<<b.num_chunks, kDecodeThreads, b.smem, stream>>>(b);
  }
  if (b.num_planes != 0) {
    DenseDecodeKernel<<<b.num_planes, 256, 0, stream>>>(b);
  }
  if (b.conditional != 0) {
    const cudaError_t e = LaunchConditional(b, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaGetLastError();
}

cudaError_t LaunchApply(const BatchDevice& b, cudaStream_t stream) {
  if (b.num_chunks == 0 || b.unfused == 0) return cudaSuccess;
  ScanApplyKernel<<<b.num_chunks, kApplyThreads, 0, stream>>>(b);
  return cudaGetLastError();
}

cudaError_t LaunchVerifyAfter(const BatchDevice& b, cudaStream_t stream) {
  if (b.num_chunks == 0) return cudaSuccess;
  LaunchSegmentDigests(b, stream);
  CheckKernel<<<b.num_chunks, kThreads, 0, stream>>>(b, 0, nullptr);
  if (b.fused_lanes != 0) {
    const cudaError_t e = LaunchFused(b, 1, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaGetLastError();
}

cudaError_t LaunchClassify(const BatchDevice& b, uint8_t* state,
                           cudaStream_t stream) {
  if (b.num_chunks == 0) return cudaSuccess;
  LaunchSegmentDigests(b, stream);
  CheckKernel<<<b.num_chunks, kThreads, 0, stream>>>(b, 1, state);
  return cudaGetLastError();
}

cudaError_t LaunchHashSpans(const uint8_t* data, const uint64_t* offsets,
                            const uint64_t* lens, uint32_t n, uint64_t* out,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const uint32_t blocks = (n + 7) / 8;
  HashSpansKernel<<<blocks, 256, 0, stream>>>(data, offsets, lens, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchRangeHash(const uint8_t* data, uint64_t len,
                            uint8_t* digests, uint64_t* out,
                            cudaStream_t stream) {
  const uint64_t segments = len == 0 ? 1 : (len + kSegment - 1) / kSegment;
  const uint64_t blocks = (segments + 7) / 8;
  RangeDigestKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      data, len, segments, reinterpret_cast<uint64_t*>(digests));
  RangeCombineKernel<<<1, 32, 0, stream>>>(digests, segments, out);
  return cudaGetLastError();
}

}  // namespace refit::cuda::internal
