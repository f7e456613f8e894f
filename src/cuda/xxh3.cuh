// XXH3-128 (seed 0, default secret) on the GPU, bit for bit equal to
// libxxhash's XXH3_128bits (xxHash 0.8 spec). Used for the range hashes of
// docs/format.md §2.
//
// Short inputs (<= 240 bytes) are hashed by one thread (Xxh3Short). Long
// inputs are hashed by one warp (Xxh3LongWarp): XXH3's long loop adds each
// stripe's contribution into 8 accumulators and only scrambles them every
// 1024-byte block, so the 64 lanes-by-stripes contributions of a block are
// summed in parallel (addition mod 2^64 is associative) and the scramble,
// which is cheap, stays serial. Each thread loads 16 bytes at a time, a
// pair of accumulator lanes (i, i ^ 1), so XXH3's lane swap stays inside
// the thread.
#ifndef REFIT_CUDA_XXH3_CUH_
#define REFIT_CUDA_XXH3_CUH_

#include <cstdint>

namespace refit::cuda::internal {

inline constexpr uint64_t kP32_1 = 0x9E3779B1U;
inline constexpr uint64_t kP32_2 = 0x85EBCA77U;
inline constexpr uint64_t kP32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kP64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kP64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kP64_3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kP64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kP64_5 = 0x27D4EB2F165667C5ULL;

static __constant__ uint8_t kSecret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c,
    0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb,
    0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e,
    0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
    0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb,
    0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97,
    0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7,
    0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
    0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83,
    0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26,
    0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc,
    0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
    0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

struct H128 {
  uint64_t lo, hi;
};

__device__ inline uint64_t Rd64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
__device__ inline uint32_t Rd32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
         uint32_t{p[3]} << 24;
}
__device__ inline uint64_t Sec64(int off) { return Rd64(kSecret + off); }
__device__ inline uint32_t Sec32(int off) { return Rd32(kSecret + off); }

__device__ inline uint64_t Fold64(uint64_t a, uint64_t b) {
  return a * b ^ __umul64hi(a, b);
}
__device__ inline uint64_t Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}
__device__ inline uint64_t Xxh64Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP64_2;
  h ^= h >> 29;
  h *= kP64_3;
  return h ^ (h >> 32);
}
__device__ inline uint64_t Mix16(const uint8_t* in, int sec) {
  return Fold64(Rd64(in) ^ Sec64(sec), Rd64(in + 8) ^ Sec64(sec + 8));
}
__device__ inline void Mix32(H128* acc, const uint8_t* a, const uint8_t* b,
                             int sec) {
  acc->lo += Mix16(a, sec);
  acc->lo ^= Rd64(b) + Rd64(b + 8);
  acc->hi += Mix16(b, sec + 16);
  acc->hi ^= Rd64(a) + Rd64(a + 8);
}
__device__ inline H128 Finish128(H128 acc, uint64_t len) {
  H128 h;
  h.lo = Avalanche(acc.lo + acc.hi);
  h.hi = 0 - Avalanche(acc.lo * kP64_1 + acc.hi * kP64_4 + len * kP64_2);
  return h;
}

// XXH3_128bits of len <= 240 bytes, one thread, any alignment.
__device__ inline H128 Xxh3Short(const uint8_t* in, uint64_t len) {
  H128 h;
  if (len == 0) {
    h.lo = Xxh64Avalanche(Sec64(64) ^ Sec64(72));
    h.hi = Xxh64Avalanche(Sec64(80) ^ Sec64(88));
    return h;
  }
  if (len <= 3) {
    const uint32_t c1 = in[0], c2 = in[len >> 1], c3 = in[len - 1];
    const uint32_t cl = (c1 << 16) | (c2 << 24) | c3 |
                        (static_cast<uint32_t>(len) << 8);
    const uint32_t ch = __funnelshift_l(__byte_perm(cl, 0, 0x0123),
                                        __byte_perm(cl, 0, 0x0123), 13);
    h.lo = Xxh64Avalanche(uint64_t{cl} ^ (uint64_t{Sec32(0) ^ Sec32(4)}));
    h.hi = Xxh64Avalanche(uint64_t{ch} ^ (uint64_t{Sec32(8) ^ Sec32(12)}));
    return h;
  }
  if (len <= 8) {
    const uint64_t in64 = uint64_t{Rd32(in)} + (uint64_t{Rd32(in + len - 4)} << 32);
    const uint64_t keyed = in64 ^ (Sec64(16) ^ Sec64(24));
    const uint64_t m = kP64_1 + (len << 2);
    uint64_t lo = keyed * m;
    uint64_t hi = __umul64hi(keyed, m);
    hi += lo << 1;
    lo ^= hi >> 3;
    lo ^= lo >> 35;
    lo *= 0x9FB21C651E98DF25ULL;
    lo ^= lo >> 28;
    h.lo = lo;
    h.hi = Avalanche(hi);
    return h;
  }
  if (len <= 16) {
    const uint64_t fl = Sec64(32) ^ Sec64(40);
    const uint64_t fh = Sec64(48) ^ Sec64(56);
    const uint64_t ilo = Rd64(in);
    uint64_t ihi = Rd64(in + len - 8);
    const uint64_t a = ilo ^ ihi ^ fl;
    uint64_t mlo = a * kP64_1;
    uint64_t mhi = __umul64hi(a, kP64_1);
    mlo += (len - 1) << 54;
    ihi ^= fh;
    mhi += ihi + uint64_t{static_cast<uint32_t>(ihi)} * (kP32_2 - 1);
    mlo ^= __byte_perm(0, 0, 0) + __brevll(0) + 0;  // keeps the form below
    mlo ^= (static_cast<uint64_t>(__byte_perm(static_cast<uint32_t>(mhi), 0, 0x0123)) << 32) |
           __byte_perm(static_cast<uint32_t>(mhi >> 32), 0, 0x0123);
    uint64_t hlo = mlo * kP64_2;
    uint64_t hhi = __umul64hi(mlo, kP64_2) + mhi * kP64_2;
    h.lo = Avalanche(hlo);
    h.hi = Avalanche(hhi);
    return h;
  }
  H128 acc{len * kP64_1, 0};
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) Mix32(&acc, in + 48, in + len - 64, 96);
        Mix32(&acc, in + 32, in + len - 48, 64);
      }
      Mix32(&acc, in + 16, in + len - 32, 32);
    }
    Mix32(&acc, in, in + len - 16, 0);
    return Finish128(acc, len);
  }
  const int rounds = static_cast<int>(len / 32);
  for (int i = 0; i < 4; ++i) Mix32(&acc, in + 32 * i, in + 32 * i + 16, 32 * i);
  acc.lo = Avalanche(acc.lo);
  acc.hi = Avalanche(acc.hi);
  for (int i = 4; i < rounds; ++i) {
    Mix32(&acc, in + 32 * i, in + 32 * i + 16, 3 + 32 * (i - 4));
  }
  Mix32(&acc, in + len - 16, in + len - 32, 136 - 17 - 16);
  return Finish128(acc, len);
}

// Loads 16 bytes (two little-endian words); kAligned: p is 16-byte aligned;
// kPlain: an ordinary load (p may be shared memory), else through the
// read-only cache.
template <bool kAligned, bool kPlain = false>
__device__ inline void Load16(const uint8_t* p, uint64_t* a, uint64_t* b) {
  if constexpr (kAligned && kPlain) {
    const ulonglong2 v = *reinterpret_cast<const ulonglong2*>(p);
    *a = v.x;
    *b = v.y;
  } else if constexpr (kAligned) {
    const ulonglong2 v = __ldg(reinterpret_cast<const ulonglong2*>(p));
    *a = v.x;
    *b = v.y;
  } else {
    *a = Rd64(p);
    *b = Rd64(p + 8);
  }
}

// The running state of one warp's XXH3_128bits of a long input (> 240
// bytes): each thread t holds accumulator lanes 2 * (t & 3) and + 1 of
// stripes t / 4 and t / 4 + 8 of every 1024-byte block. Block() adds one
// full block (all but the last, which Finish() takes), given the 16-byte
// pairs the thread loaded at byte 16 * t and 512 + 16 * t of the block, so
// a caller that reads the bytes anyway (the encoder's change detection)
// hashes them without a second read.
struct Xxh3LongState {
  uint64_t key[2][2];  // secret words of the thread's stripes and lanes
  uint64_t scr0, scr1;  // scramble words
  uint64_t a0, a1;      // accumulator lanes l0, l0 + 1 (partial sums)
  int l0;

  __device__ void Init() {
    const int t = static_cast<int>(threadIdx.x & 31);
    l0 = 2 * (t & 3);
    for (int m = 0; m < 2; ++m) {
      const int s = t / 4 + 8 * m;
      key[m][0] = Sec64(8 * (s + l0));
      key[m][1] = Sec64(8 * (s + l0 + 1));
    }
    scr0 = Sec64(128 + 8 * l0);
    scr1 = Sec64(128 + 8 * l0 + 8);
    const uint64_t init[8] = {kP32_3, kP64_1, kP64_2, kP64_3,
                              kP64_4, kP32_2, kP64_5, kP32_1};
    a0 = init[l0];
    a1 = init[l0 + 1];
  }

  static __device__ uint64_t Reduce(uint64_t v) {
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 16);
    return v;
  }

  __device__ void Block(const uint64_t d[2][2]) {
    uint64_t s0 = 0, s1 = 0;
    for (int m = 0; m < 2; ++m) {
      const uint64_t k0 = d[m][0] ^ key[m][0], k1 = d[m][1] ^ key[m][1];
      s0 += d[m][1] + (k0 & 0xffffffffu) * (k0 >> 32);
      s1 += d[m][0] + (k1 & 0xffffffffu) * (k1 >> 32);
    }
    a0 += Reduce(s0);
    a1 += Reduce(s1);
    a0 = ((a0 ^ (a0 >> 47)) ^ scr0) * kP32_1;
    a1 = ((a1 ^ (a1 >> 47)) ^ scr1) * kP32_1;
  }

  // The last (partial) block of in[0, len), which starts at byte
  // 1024 * ((len - 1) / 1024), and the merge; every thread gets the hash.
  template <bool kAligned, bool kPlain = false>
  __device__ H128 Finish(const uint8_t* in, uint64_t len) {
    return FinishAt<kAligned, kPlain>(in + (len - 1) / 1024 * 1024, in + len - 64, len);
  }

  // Finish, given the last block's bytes at `blk` and the input's last 64
  // bytes at `last`.
  template <bool kAligned, bool kPlain = false>
  __device__ H128 FinishAt(const uint8_t* blk, const uint8_t* last, uint64_t len) {
    const int t = static_cast<int>(threadIdx.x & 31);
    const uint64_t nb_blocks = (len - 1) / 1024;
    {
      // Whole stripes, no scramble.
      const uint64_t stripes = ((len - 1) - 1024 * nb_blocks) / 64;
      uint64_t s0 = 0, s1 = 0;
      for (int m = 0; m < 2; ++m) {
        const int q = t + 32 * m;  // 16-byte pair index; stripe q / 4
        if (static_cast<uint64_t>(q / 4) < stripes) {
          uint64_t x0, x1;
          Load16<kAligned, kPlain>(blk + 16 * q, &x0, &x1);
          const uint64_t k0 = x0 ^ key[m][0], k1 = x1 ^ key[m][1];
          s0 += x1 + (k0 & 0xffffffffu) * (k0 >> 32);
          s1 += x0 + (k1 & 0xffffffffu) * (k1 >> 32);
        }
      }
      a0 += Reduce(s0);
      a1 += Reduce(s1);
      // Last stripe: the input's final 64 bytes, secret at offset 121.
      const uint8_t* p = last;
      const uint64_t x0 = Rd64(p + 8 * l0), x1 = Rd64(p + 8 * l0 + 8);
      const uint64_t k0 = x0 ^ Sec64(121 + 8 * l0);
      const uint64_t k1 = x1 ^ Sec64(121 + 8 * l0 + 8);
      a0 += x1 + (k0 & 0xffffffffu) * (k0 >> 32);
      a1 += x0 + (k1 & 0xffffffffu) * (k1 >> 32);
    }
    // Gather the 8 accumulators (threads 0..3 hold lanes 0..7).
    uint64_t acc[8];
    for (int j = 0; j < 4; ++j) {
      acc[2 * j] = __shfl_sync(0xffffffffu, a0, j);
      acc[2 * j + 1] = __shfl_sync(0xffffffffu, a1, j);
    }
    auto merge = [&](int sec, uint64_t start) {
      uint64_t r = start;
      for (int j = 0; j < 4; ++j) {
        r += Fold64(acc[2 * j] ^ Sec64(sec + 16 * j),
                    acc[2 * j + 1] ^ Sec64(sec + 16 * j + 8));
      }
      return Avalanche(r);
    };
    H128 h;
    h.lo = merge(11, len * kP64_1);
    h.hi = merge(192 - 64 - 11, ~(len * kP64_2));
    return h;
  }
};

// XXH3_128bits of len > 240 bytes by the 32 threads of one warp (all must
// call it with the same arguments); every thread gets the result.
template <bool kAligned>
__device__ inline H128 Xxh3LongWarp(const uint8_t* in, uint64_t len) {
  const int t = static_cast<int>(threadIdx.x & 31);
  Xxh3LongState st;
  st.Init();
  const uint64_t nb_blocks = (len - 1) / 1024;
  for (uint64_t b = 0; b < nb_blocks; ++b) {
    const uint8_t* blk = in + b * 1024;
    uint64_t d[2][2];
    for (int m = 0; m < 2; ++m) Load16<kAligned>(blk + 16 * (t + 32 * m), &d[m][0], &d[m][1]);
    st.Block(d);
  }
  return st.template Finish<kAligned>(in, len);
}

// XXH3_128bits of any length by one warp; every thread gets the result.
__device__ inline H128 Xxh3Warp(const uint8_t* in, uint64_t len) {
  if (len <= 240) {
    H128 h{0, 0};
    if ((threadIdx.x & 31) == 0) h = Xxh3Short(in, len);
    h.lo = __shfl_sync(0xffffffffu, h.lo, 0);
    h.hi = __shfl_sync(0xffffffffu, h.hi, 0);
    return h;
  }
  if ((reinterpret_cast<uintptr_t>(in) & 15) == 0) {
    return Xxh3LongWarp<true>(in, len);
  }
  return Xxh3LongWarp<false>(in, len);
}

// XXH3_128bits of `len` bytes that one warp gathers piece by piece (a
// strided region's rows laid end to end, docs/format.md §2): all 32 lanes
// call gather(off, n, dst) together to copy input bytes [off, off + n) to
// dst, then read them from there. `buf` is the warp's own 16-byte aligned
// buffer of kGatherBuffer bytes (shared memory); every thread gets the hash.
inline constexpr uint32_t kGatherBuffer = 1024 + 64;
template <typename Gather>
__device__ inline H128 Xxh3WarpGathered(uint8_t* buf, uint64_t len, Gather gather) {
  if (len <= 240) {
    gather(0, len, buf);
    __syncwarp();
    H128 h{0, 0};
    if ((threadIdx.x & 31) == 0) h = Xxh3Short(buf, len);
    h.lo = __shfl_sync(0xffffffffu, h.lo, 0);
    h.hi = __shfl_sync(0xffffffffu, h.hi, 0);
    __syncwarp();
    return h;
  }
  const int t = static_cast<int>(threadIdx.x & 31);
  Xxh3LongState st;
  st.Init();
  const uint64_t nb_blocks = (len - 1) / 1024;
  for (uint64_t b = 0; b < nb_blocks; ++b) {
    gather(b * 1024, 1024, buf);
    __syncwarp();
    uint64_t d[2][2];
    for (int m = 0; m < 2; ++m) {
      Load16<true, true>(buf + 16 * (t + 32 * m), &d[m][0], &d[m][1]);
    }
    __syncwarp();
    st.Block(d);
  }
  // The last block and the 64 bytes before it (the last stripe may reach
  // back into the previous block).
  const uint64_t first = nb_blocks == 0 ? 0 : nb_blocks * 1024 - 64;
  gather(first, len - first, buf);
  __syncwarp();
  const H128 h = st.template FinishAt<true, true>(buf + (nb_blocks * 1024 - first),
                                                  buf + (len - 64 - first), len);
  __syncwarp();
  return h;
}

}  // namespace refit::cuda::internal

#endif  // REFIT_CUDA_XXH3_CUH_
