// Conversions from a trainer's storage dtype to a checkpoint's (the
// residual path of docs/layout.md): FP32 master weights to BF16, FP32 or
// BF16 to FP8 E4M3 with a scale. Each is bit-exact with the reference
// casts (round to nearest even; PyTorch's float -> bfloat16 and
// float -> float8_e4m3fn), so a receiver's bits equal a checkpoint written
// by the trainer framework. Pure functions, thread-safe.
#ifndef REFIT_TRAINER_CONVERT_H_
#define REFIT_TRAINER_CONVERT_H_

#include <cstdint>
#include <string>

#include "refit/status.h"

namespace refit::trainer {

// FP32 -> BF16, round to nearest even; every NaN becomes 0x7FC0.
uint16_t Bf16FromF32(float x);
float F32FromBf16(uint16_t b);

// FP32 -> FP8 E4M3 ("fn": no infinities, 0x7F/0xFF are NaN, max 448),
// round to nearest even; NaN and magnitudes that round beyond 448 become
// NaN (not saturated), as the reference cast does.
uint8_t E4m3FromF32(float x);

// Reads element i of a local tensor of dtype `dtype` as FP32 (F32, BF16;
// F16 is not supported as a source here).
bool IsConvertibleSource(const std::string& dtype);
float LoadAsF32(const std::string& dtype, const uint8_t* data, uint64_t i);

// Whether the residual path can produce canonical `to` from local `from`.
Status CheckConversion(const std::string& from, const std::string& to);

}  // namespace refit::trainer

#endif  // REFIT_TRAINER_CONVERT_H_
