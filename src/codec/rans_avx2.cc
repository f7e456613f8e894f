// The sparse encoder's rANS lanes for AVX2 (rans_kernels.h; CMakeLists.txt
// compiles this file with -mavx2). Everything here has internal linkage or
// is a kernel, and uses compiler builtins rather than inline library code,
// so nothing compiled with these flags can stand in for a baseline function
// at link time.
//
// Eight consecutive lanes hold eight consecutive records in every round, so
// their gaps and values load as vectors, and one vector step codes a plane's
// symbol in all eight lanes: the same states and words as internal::EncStep,
// with the division by f[s] done in doubles (exact, see CodeGroups).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "codec/rans_kernels.h"

namespace refit::codec::internal {
namespace {

// The gaps of records [i0, i0 + 8) in src[0], their values' low 32 bits in
// src[1] and, for w == 8, the high 32 bits in src[2].
template <int W>
inline void LoadRecords(const uint32_t* pos, const uint8_t* values, uint32_t i0,
                        __m256i src[3]) {
  const __m256i p =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pos + i0));
  __m256i prev;
  if (i0 > 0) {
    prev = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pos + i0 - 1));
  } else {
    // Record 0's gap is its position: as if a record sat at -1.
    prev = _mm256_permutevar8x32_epi32(
        p, _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6));
    prev = _mm256_blend_epi32(prev, _mm256_set1_epi32(-1), 1);
  }
  src[0] = _mm256_sub_epi32(_mm256_sub_epi32(p, prev), _mm256_set1_epi32(1));
  const uint8_t* v = values + size_t{i0} * W;
  if constexpr (W == 1) {
    src[1] = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v)));
  } else if constexpr (W == 2) {
    src[1] = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(v)));
  } else if constexpr (W == 4) {
    src[1] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
  } else {
    // Records 0-3 and 4-7; the shuffles give dword halves in the order
    // 0 1 4 5 | 2 3 6 7, which the 64-bit permute puts right.
    const __m256 a = _mm256_castsi256_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)));
    const __m256 b = _mm256_castsi256_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 32)));
    src[1] = _mm256_permute4x64_epi64(
        _mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))),
        _MM_SHUFFLE(3, 1, 2, 0));
    src[2] = _mm256_permute4x64_epi64(
        _mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))),
        _MM_SHUFFLE(3, 1, 2, 0));
  }
}

// table[s] for each lane's s (< 256). Scalar loads: AVX2's gathers cost
// more on some CPUs than eight loads and inserts.
inline __m256i Lookup(const uint32_t* table, __m256i s) {
  alignas(32) uint32_t i[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(i), s);
  __m128i lo = _mm_cvtsi32_si128(static_cast<int>(table[i[0]]));
  __m128i hi = _mm_cvtsi32_si128(static_cast<int>(table[i[4]]));
  lo = _mm_insert_epi32(lo, static_cast<int>(table[i[1]]), 1);
  hi = _mm_insert_epi32(hi, static_cast<int>(table[i[5]]), 1);
  lo = _mm_insert_epi32(lo, static_cast<int>(table[i[2]]), 2);
  hi = _mm_insert_epi32(hi, static_cast<int>(table[i[6]]), 2);
  lo = _mm_insert_epi32(lo, static_cast<int>(table[i[3]]), 3);
  hi = _mm_insert_epi32(hi, static_cast<int>(table[i[7]]), 3);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// Codes round r of groups [g, g + K) (lanes 8g .. 8(g + K) - 1).
template <int W, int K>
inline void CodeGroups(const SparseLaneJob& job, const int* source,
                       const __m128i* bit, uint32_t r, uint32_t g) {
  const __m256i byte_mask = _mm256_set1_epi32(0xff);
  const __m256i low16 = _mm256_set1_epi32(0xffff);
  const __m256d two31 = _mm256_set1_pd(2147483648.0);
  __m256i src[K][3];
  __m256i x[K];
  __m256i end[K];
#pragma GCC unroll 2
  for (int k = 0; k < K; ++k) {
    const uint32_t lane0 = 8 * (g + static_cast<uint32_t>(k));
    LoadRecords<W>(job.positions, job.values, r * job.lanes + lane0, src[k]);
    x[k] =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(job.state + lane0));
    end[k] =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(job.end + lane0));
  }
  for (int c = job.planes - 1; c >= 0; --c) {
    const SparseLanePlane& pl = job.plane[c];
    const int t = static_cast<int>(pl.t);
    const __m128i x_max_shift = _mm_cvtsi32_si128(32 - t);
#pragma GCC unroll 2
    for (int k = 0; k < K; ++k) {
      const __m256i s = _mm256_and_si256(
          _mm256_srl_epi32(src[k][source[c]], bit[c]), byte_mask);
      const __m256i fb = Lookup(pl.fb, s);
      const __m256i f = _mm256_and_si256(fb, low16);
      // 1 / f[s] in doubles, raised by 4 units in the last place: then
      // y * rcp, rounded, lies in [y / f, y / f + 2^-17) for every y < 2^32,
      // and y / f, when not whole, stays at least 1 / f >= 2^-15 below the
      // next whole number, so truncation gives EncStep's q = y / f rounded
      // down. It depends on the symbols only, off the chain of states.
      const __m256i four = _mm256_set1_epi64x(4);
      const __m256d rcp0 = _mm256_castsi256_pd(
          _mm256_add_epi64(_mm256_castpd_si256(_mm256_div_pd(
                               _mm256_set1_pd(1.0),
                               _mm256_cvtepi32_pd(_mm256_castsi256_si128(f)))),
                           four));
      const __m256d rcp1 = _mm256_castsi256_pd(_mm256_add_epi64(
          _mm256_castpd_si256(_mm256_div_pd(
              _mm256_set1_pd(1.0),
              _mm256_cvtepi32_pd(_mm256_extracti128_si256(f, 1)))),
          four));
      // x >= x_max = f << (32 - t): the lane emits its low word.
      const __m256i x_max = _mm256_sll_epi32(f, x_max_shift);
      const __m256i out =
          _mm256_cmpeq_epi32(_mm256_max_epu32(x[k], x_max), x[k]);
      // As EncStep: every lane stores at end - 1, only emitting ones keep
      // it (the word below a lane's words is always its own spare).
      if (_mm256_movemask_ps(_mm256_castsi256_ps(out)) != 0) {
        alignas(32) uint32_t at[8];
        alignas(32) uint32_t word[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(at),
                           _mm256_sub_epi32(end[k], _mm256_set1_epi32(1)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(word), x[k]);
        for (int l = 0; l < 8; ++l)
          job.words[at[l]] = static_cast<uint16_t>(word[l]);
      }
      end[k] = _mm256_add_epi32(end[k], out);
      const __m256i y =
          _mm256_blendv_epi8(x[k], _mm256_srli_epi32(x[k], 16), out);
      // y as doubles, exactly (y - 2^31 fits a signed int).
      const __m256i y_signed =
          _mm256_xor_si256(y, _mm256_set1_epi32(INT32_MIN));
      const __m256d y0 = _mm256_add_pd(
          _mm256_cvtepi32_pd(_mm256_castsi256_si128(y_signed)), two31);
      const __m256d y1 = _mm256_add_pd(
          _mm256_cvtepi32_pd(_mm256_extracti128_si256(y_signed, 1)), two31);
      // q < 2^(32 - t) <= 2^31 fits the signed conversion.
      const __m256i q = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm256_cvttpd_epi32(_mm256_mul_pd(y0, rcp0))),
          _mm256_cvttpd_epi32(_mm256_mul_pd(y1, rcp1)), 1);
      // x = y + c[s] + q * (2^t - f[s]), modulo 2^32 as in EncStep.
      const __m256i cmpl = _mm256_sub_epi32(_mm256_set1_epi32(1 << t), f);
      x[k] = _mm256_add_epi32(_mm256_add_epi32(y, _mm256_srli_epi32(fb, 16)),
                              _mm256_mullo_epi32(q, cmpl));
    }
  }
#pragma GCC unroll 2
  for (int k = 0; k < K; ++k) {
    const uint32_t lane0 = 8 * (g + static_cast<uint32_t>(k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(job.state + lane0), x[k]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(job.end + lane0), end[k]);
  }
}

template <int W>
void EncodeLanes(const SparseLaneJob& job) {
  // Where each coded plane's symbol sits: which of LoadRecords' words, and
  // its bit offset there.
  int source[16];
  __m128i bit[16];
  for (int c = 0; c < job.planes; ++c) {
    const uint32_t shift = job.plane[c].shift;
    uint32_t b = shift;
    int s = 0;
    if (shift >= 64) {
      b = shift - 64;
      s = 1;
      if (b >= 32) {
        b -= 32;
        s = 2;
      }
    }
    source[c] = s;
    bit[c] = _mm_cvtsi32_si128(static_cast<int>(b));
  }
  uint32_t g = 0;
  for (uint32_t r = job.rounds; r-- > 0;) {
    // Two groups side by side: each plane's step waits on the one before
    // (a division, a multiply and conversions), so two independent chains
    // keep more of the core busy.
    for (g = 0; g + 2 <= job.groups; g += 2) {
      CodeGroups<W, 2>(job, source, bit, r, g);
    }
    if (g < job.groups) CodeGroups<W, 1>(job, source, bit, r, g);
  }
}
}  // namespace

void EncodeSparseLanesAvx2(const SparseLaneJob& job) {
  switch (job.w) {
    case 1:
      return EncodeLanes<1>(job);
    case 2:
      return EncodeLanes<2>(job);
    case 4:
      return EncodeLanes<4>(job);
    default:
      return EncodeLanes<8>(job);
  }
}

}  // namespace refit::codec::internal
