// The geometric gap model of a conditional XOR class (docs/format.md
// §5.2, normalized by §5.1), which a GPU receiver builds on the device once
// it has counted the class's members in the base. Host and device code: a
// CPU test checks it against the codec's GeometricWeights and Normalize.
// The device's decoder computes the same steps with a warp per table
// (GeometricFreqsWarp in conditional_apply.cu), checked end to end by the
// GPU tests; this function is their host reference. Pure function,
// thread-safe.
#ifndef REFIT_CUDA_CONDITIONAL_TABLES_H_
#define REFIT_CUDA_CONDITIONAL_TABLES_H_

#include <cstdint>

#include "cuda/placement.h"  // REFIT_HOST_DEVICE

namespace refit::cuda {

inline constexpr uint32_t kCondMaxPrecision = 15;

// Frequencies of a geometric gap plane (docs/format.md §5.2, normalized by
// §5.1) for a class of m members and k changes, into f[0..255], exactly as
// codec::GeometricWeights and codec::Normalize compute them. The host
// checked 1 <= t <= 15 and max_symbol < 2^t; 1 <= k <= m here.
REFIT_HOST_DEVICE inline void GeometricFreqs(uint32_t m, uint32_t k, uint32_t plane,
                                             uint32_t max_symbol, uint32_t t, uint32_t* f) {
  const uint64_t one32 = uint64_t{1} << 32;
  uint64_t q = (m > 0 && k <= m) ? (uint64_t{m - k} << 32) / m : 0;
  q = q < 1 ? 1 : (q > one32 - 1 ? one32 - 1 : q);
  for (uint32_t b = 0; b < plane; ++b) {
    for (int i = 0; i < 8; ++i) q = (q * q) >> 32;
  }
  // Weights W[s] = max(x_s, 1), x_0 = 2^31, x_{s+1} = x_s * q / 2^32 (each
  // below 2^32, so the products fit 64 bits); their total below 2^40.
  uint64_t total = 0;
  uint64_t x = uint64_t{1} << 31;
  for (uint32_t s = 0; s <= max_symbol; ++s) {
    total += x > 1 ? x : 1;
    x = (x * q) >> 32;
  }
  int64_t sum = 0;
  uint32_t top = 0;
  x = uint64_t{1} << 31;
  for (uint32_t s = 0; s < 256; ++s) {
    if (s > max_symbol) {
      f[s] = 0;
      continue;
    }
    const uint64_t w = x > 1 ? x : 1;
    x = (x * q) >> 32;
    const uint64_t base = (w << kCondMaxPrecision) / total;  // floor(W 2^15 / T)
    const uint64_t v = base >> (kCondMaxPrecision - t);
    f[s] = static_cast<uint32_t>(v > 1 ? v : 1);
    sum += f[s];
    if (f[s] > f[top]) top = s;  // strict: the lowest symbol wins ties
  }
  int64_t d = (int64_t{1} << t) - sum;
  if (d > 0) f[top] += static_cast<uint32_t>(d);
  // d < 0: one unit at a time from the largest frequency, lowest symbol on
  // ties (|d| <= max_symbol + 1, as each max(1, .) adds at most one).
  for (; d < 0; ++d) {
    uint32_t best = 0;
    for (uint32_t s = 1; s <= max_symbol; ++s) {
      if (f[s] > f[best]) best = s;
    }
    --f[best];
  }
}

}  // namespace refit::cuda

#endif  // REFIT_CUDA_CONDITIONAL_TABLES_H_
