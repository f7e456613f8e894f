// The conditional codec's kernels for AVX2 + BMI2 (conditional_kernels.h;
// CMakeLists.txt compiles this file with -mavx2 -mbmi -mbmi2). Everything
// here has internal linkage or is a kernel, and uses compiler builtins
// rather than inline library code, so nothing compiled with these flags can
// stand in for a baseline function at link time.
#include <immintrin.h>

#include "codec/conditional_kernels.h"

namespace refit::codec::internal {
namespace {

// The members of class c among the block's elements `valid`.
inline uint64_t MaskOf(const ConditionalBlock& b, uint32_t c, uint64_t valid) {
  const uint64_t f0 = (c & 1) ? 0 : ~uint64_t{0};
  const uint64_t f1 = (c & 2) ? 0 : ~uint64_t{0};
  const uint64_t f2 = (c & 4) ? 0 : ~uint64_t{0};
  return (b.bit[0] ^ f0) & (b.bit[1] ^ f1) & (b.bit[2] ^ f2) & valid;
}

}  // namespace

// 32 class bytes per step: exponents (bits 7..14 of each element) packed to
// bytes, less lo saturating at 0, clamped to 7; each class bit is moved to
// its byte's top for one movemask per plane. packus works per 128-bit
// lane, so a 64-bit permute restores element order.
void ClassifyAvx2(const uint8_t* base, uint32_t blocks, uint32_t lo,
                  ConditionalBlock* out) {
  const __m256i ff = _mm256_set1_epi16(0xff);
  const __m256i lov = _mm256_set1_epi8(static_cast<char>(lo));
  const __m256i top = _mm256_set1_epi8(7);
  for (uint32_t b = 0; b < blocks; ++b) {
    const uint8_t* p = base + 128 * static_cast<uint64_t>(b);
    uint64_t b0 = 0, b1 = 0, b2 = 0;
    for (int h = 0; h < 2; ++h) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h));
      const __m256i y =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + 32));
      __m256i cls = _mm256_packus_epi16(_mm256_and_si256(_mm256_srli_epi16(x, 7), ff),
                                        _mm256_and_si256(_mm256_srli_epi16(y, 7), ff));
      cls = _mm256_permute4x64_epi64(cls, 0xd8);
      cls = _mm256_min_epu8(_mm256_subs_epu8(cls, lov), top);
      const int s = 32 * h;
      b0 |= uint64_t{static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(cls, 7)))} << s;
      b1 |= uint64_t{static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(cls, 6)))} << s;
      b2 |= uint64_t{static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(cls, 5)))} << s;
    }
    out[b].bit[0] = b0;
    out[b].bit[1] = b1;
    out[b].bit[2] = b2;
  }
}

// Per block and class: the next popcount(mask) bits of `changed` at off[c]
// (a funnel shift of two words, cut by BZHI), deposited onto the members'
// positions by PDEP.
void PlaceBmi2(const ConditionalBlock* classes, uint32_t blocks,
               uint64_t valid_last, const uint64_t* changed, uint64_t off[8],
               uint64_t* hits) {
  uint64_t o[8];
  for (int c = 0; c < 8; ++c) o[c] = off[c];
  for (uint32_t b = 0; b < blocks; ++b) {
    const uint64_t valid = b + 1 == blocks ? valid_last : ~uint64_t{0};
    uint64_t h = 0;
    for (uint32_t c = 0; c < 8; ++c) {
      const uint64_t m = MaskOf(classes[b], c, valid);
      const uint64_t pc = static_cast<uint64_t>(__builtin_popcountll(m));
      const uint64_t w = o[c] >> 6;
      const uint32_t s = static_cast<uint32_t>(o[c] & 63);
      // (x << 1) << (63 - s): the high word's part without a shift by 64.
      const uint64_t bits = (changed[w] >> s) | ((changed[w + 1] << 1) << (63 - s));
      h |= _pdep_u64(_bzhi_u64(bits, static_cast<uint32_t>(pc)), m);
      o[c] += pc;
    }
    hits[b] = h;
  }
  for (int c = 0; c < 8; ++c) off[c] = o[c];
}

}  // namespace refit::codec::internal
