#include "trainer/convert.h"

#include <cmath>
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
