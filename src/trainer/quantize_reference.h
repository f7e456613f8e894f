// Reference quantizers for tests, written from the published conventions
// rather than from src/trainer/convert.cc: E2M1 by nearest-value search over
// its eight magnitudes (ties to the even code), MXFP4 scales from log2 in
// double precision (OCP Microscaling v1.0, section 6.3), NVFP4 scales in
// ModelOpt's FP32 order of operations (docs/trainer.md, "Quantized
// formats"). Test-only; header-only.
#ifndef REFIT_TRAINER_QUANTIZE_REFERENCE_H_
#define REFIT_TRAINER_QUANTIZE_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "trainer/convert.h"

namespace refit::trainer::reference {

inline constexpr double kE2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

// Nearest of the eight magnitudes, ties to the even code, beyond 6 -> 6.
inline uint8_t RefE2m1(double x) {
  const double a = std::fabs(x);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - kE2m1[c]), db = std::fabs(a - kE2m1[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>((std::signbit(x) ? 8 : 0) | best);
}

// E4M3 decode from the bit layout (bias 7, subnormals below 2^-6).
inline double RefE4m3Value(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return (c & 0x80) ? -v : v;
}

// One row of MXFP4 by the OCP rule.
inline void RefMxfp4(const std::vector<float>& x, std::vector<uint8_t>* packed,
              std::vector<uint8_t>* scales) {
  for (size_t b = 0; b < x.size() / 32; ++b) {
    double amax = 0;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double{x[b * 32 + i]}));
    int shared = amax == 0 ? -127 : static_cast<int>(std::floor(std::log2(amax))) - 2;
    shared = std::max(-127, std::min(127, shared));
    scales->push_back(static_cast<uint8_t>(shared + 127));
    for (size_t i = 0; i < 32; i += 2) {
      const uint8_t lo = RefE2m1(x[b * 32 + i] / std::pow(2.0, shared));
      const uint8_t hi = RefE2m1(x[b * 32 + i + 1] / std::pow(2.0, shared));
      packed->push_back(static_cast<uint8_t>(lo | hi << 4));
    }
  }
}

// One row of NVFP4: ModelOpt's float32 scale arithmetic, then the E2M1
// reference on x / (e4m3 scale x global scale) taken in float32.
inline void RefNvfp4(const std::vector<float>& x, float global, std::vector<uint8_t>* packed,
              std::vector<uint8_t>* scales) {
  for (size_t b = 0; b < x.size() / 16; ++b) {
    float amax = 0;
    for (size_t i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[b * 16 + i]));
    const float per_block = amax / 6.0f;
    const uint8_t s = E4m3FromF32(amax == 0 ? 1.0f : per_block / global);
    scales->push_back(s);
    const float div = static_cast<float>(RefE4m3Value(s)) * global;
    for (size_t i = 0; i < 16; i += 2) {
      const uint8_t lo = RefE2m1(x[b * 16 + i] / div), hi = RefE2m1(x[b * 16 + i + 1] / div);
      packed->push_back(static_cast<uint8_t>(lo | hi << 4));
    }
  }
}

}  // namespace refit::trainer::reference

#endif  // REFIT_TRAINER_QUANTIZE_REFERENCE_H_
