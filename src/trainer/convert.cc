#include "trainer/convert.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

namespace refit::trainer {

uint16_t Bf16FromF32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float F32FromBf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

uint8_t E4m3FromF32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7F);
  const double a = std::fabs(static_cast<double>(x));
  // 480 is halfway between 448 (the largest finite) and the next step.
  if (a >= 480.0) return static_cast<uint8_t>(sign | 0x7F);
  if (a < 0.015625) {  // below 2^-6: subnormals, steps of 2^-9
    const double q = std::nearbyint(a * 512.0);  // round half to even
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));  // q == 8: 2^-6
  }
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  double q = std::nearbyint((m * 2.0 - 1.0) * 8.0);
  int exp = e - 1;
  if (q >= 8.0) {
    q = 0;
    ++exp;
  }
  const int code = ((exp + 7) << 3) | static_cast<int>(q);
  if (code > 0x7E) return static_cast<uint8_t>(sign | 0x7F);
  return static_cast<uint8_t>(sign | code);
}

float F32FromE4m3(uint8_t code) {
  const int e = (code >> 3) & 0xF, m = code & 7;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (e == 0xF && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(8 + m), e - 10);
}

float Fp8BlockScaleInv(float amax) { return amax > 0 ? amax / 448.0f : 1.0f; }

uint8_t E2m1FromF32(float x) {
  const uint8_t sign = std::signbit(x) ? 0x8 : 0;
  const float a = std::fabs(x);
  // Magnitudes 0, 0.5, 1, 1.5 (steps of 0.5), 2, 3 (steps of 1), 4, 6
  // (steps of 2): round to nearest, ties to the even code.
  uint8_t code;
  if (a >= 4.0f) {
    code = a > 5.0f ? 7 : 6;  // 5 is the tie between 4 (code 6) and 6
  } else if (a >= 2.0f) {
    // 2 -> code 4, 3 -> 5, 4 -> 6; ties 2.5 -> 4, 3.5 -> 6.
    code = static_cast<uint8_t>(4 + std::nearbyint(a - 2.0f));
  } else {
    // 0, 0.5, 1, 1.5, (2): codes 0..4; ties to even code.
    code = static_cast<uint8_t>(std::nearbyint(a * 2.0f));
  }
  return static_cast<uint8_t>(sign | code);
}

float F32FromE2m1(uint8_t code) {
  static constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kValues[code & 7];
  return (code & 8) ? -v : v;
}

float Nvfp4GlobalScale(float tensor_amax) {
  return tensor_amax > 0 ? tensor_amax / (6.0f * 448.0f) : 1.0f;
}

Status QuantizeNvfp4Row(std::span<const float> x, float global_scale,
                        std::span<uint8_t> packed, std::span<uint8_t> scales) {
  const uint64_t k = x.size();
  if (k % kNvfp4Block != 0 || packed.size() != k / 2 || scales.size() != k / kNvfp4Block) {
    return InvalidArgumentError("NVFP4: a row of " + std::to_string(k) +
                                " elements is not whole blocks of 16, or the outputs "
                                "have the wrong size");
  }
  for (uint64_t b = 0; b < k / kNvfp4Block; ++b) {
    const float* v = x.data() + b * kNvfp4Block;
    float amax = 0;
    for (uint64_t i = 0; i < kNvfp4Block; ++i) {
      if (!std::isfinite(v[i])) return InvalidArgumentError("NVFP4: a NaN or infinity");
      amax = std::max(amax, std::fabs(v[i]));
    }
    const float block_scale = amax / 6.0f;
    const uint8_t s = E4m3FromF32(amax > 0 ? block_scale / global_scale : 1.0f);
    scales[b] = s;
    const float div = F32FromE4m3(s) * global_scale;
    for (uint64_t i = 0; i < kNvfp4Block; i += 2) {
      const uint8_t lo = E2m1FromF32(v[i] / div), hi = E2m1FromF32(v[i + 1] / div);
      packed[(b * kNvfp4Block + i) / 2] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
  return Status();
}

uint8_t Mxfp4ScaleFromAmax(float amax) {
  if (!(amax > 0)) return 0;
  int e = 0;
  std::frexp(amax, &e);  // amax = m * 2^e, m in [0.5, 1): floor(log2) = e - 1
  const int shared = std::clamp(e - 1 - 2, -127, 127);
  return static_cast<uint8_t>(shared + 127);
}

Status QuantizeMxfp4Row(std::span<const float> x, std::span<uint8_t> packed,
                        std::span<uint8_t> scales) {
  const uint64_t c = x.size();
  if (c % kMxfp4Block != 0 || packed.size() != c / 2 || scales.size() != c / kMxfp4Block) {
    return InvalidArgumentError("MXFP4: a row of " + std::to_string(c) +
                                " elements is not whole blocks of 32, or the outputs "
                                "have the wrong size");
  }
  for (uint64_t b = 0; b < c / kMxfp4Block; ++b) {
    const float* v = x.data() + b * kMxfp4Block;
    float amax = 0;
    for (uint64_t i = 0; i < kMxfp4Block; ++i) {
      if (!std::isfinite(v[i])) return InvalidArgumentError("MXFP4: a NaN or infinity");
      amax = std::max(amax, std::fabs(v[i]));
    }
    const uint8_t s = Mxfp4ScaleFromAmax(amax);
    scales[b] = s;
    const int shift = 127 - static_cast<int>(s);  // x / 2^(s - 127), exact in range
    for (uint64_t i = 0; i < kMxfp4Block; i += 2) {
      const uint8_t lo = E2m1FromF32(std::ldexp(v[i], shift));
      const uint8_t hi = E2m1FromF32(std::ldexp(v[i + 1], shift));
      packed[(b * kMxfp4Block + i) / 2] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
  return Status();
}

bool IsConvertibleSource(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16";
}

float LoadAsF32(const std::string& dtype, const uint8_t* data, uint64_t i) {
  if (dtype == "F32") {
    float x;
    std::memcpy(&x, data + i * 4, 4);
    return x;
  }
  uint16_t b;
  std::memcpy(&b, data + i * 2, 2);
  return F32FromBf16(b);
}

Status CheckConversion(const std::string& from, const std::string& to) {
  if (from == to) return Status();
  if (from == "F32" && to == "BF16") return Status();
  if (IsConvertibleSource(from) && to == "F8_E4M3") return Status();
  return InvalidArgumentError("no conversion from local dtype " + from +
                              " to checkpoint dtype " + to +
                              " (supported: F32 -> BF16, F32/BF16 -> F8_E4M3)");
}

}  // namespace refit::trainer
