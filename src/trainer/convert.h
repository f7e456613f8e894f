// Conversions from a trainer's storage dtype to a checkpoint's (the
// residual path of docs/layout.md): FP32 master weights to BF16, FP32 or
// BF16 to FP8 E4M3 with a scale, and to packed MXFP4 or NVFP4 rows (the
// rank encoder's "mxfp4" / "nvfp4" tensors). Each is bit-exact with the
// reference casts (round to nearest even; PyTorch's float -> bfloat16 and
// float -> float8_e4m3fn) and quantizers, so a receiver's bits equal a
// checkpoint written by the trainer framework. Pure functions, thread-safe.
#ifndef REFIT_TRAINER_CONVERT_H_
#define REFIT_TRAINER_CONVERT_H_

#include <cstdint>
#include <span>
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

float F32FromE4m3(uint8_t code);

// FP8 E4M3 with block scales, the DeepSeek-V3 checkpoint convention
// (docs/trainer.md, "Quantized formats"): weight_scale_inv = amax / 448 over
// the block (1 for an all-zero block), element = e4m3(x / weight_scale_inv);
// dequantized weight = element x weight_scale_inv.
float Fp8BlockScaleInv(float amax);

// FP4 E2M1 (OCP Microscaling Formats v1.0, section 5.3.3): sign, 2 exponent
// bits (bias 1), 1 mantissa bit; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
// Rounds to nearest, ties to even, and saturates at +-6 (the format has no
// infinity or NaN); the caller refuses NaN. Returns the 4-bit code.
uint8_t E2m1FromF32(float x);
float F32FromE2m1(uint8_t code);

// NVFP4 as NVIDIA ModelOpt writes it (docs/trainer.md, "Quantized
// formats"), for a row-major [N, K] weight, K a multiple of 16:
//   weight_scale_2 = amax(|W|) / (6 * 448)            (FP32, one per tensor;
//                                                     1 for an all-zero W)
//   weight_scale[n, b] = e4m3((amax of the block / 6) / weight_scale_2)
//                                                    (E4M3, per 16 elements;
//                                                     e4m3(1) for a zero block)
//   code = e2m1(x / (f32(weight_scale[n, b]) * weight_scale_2))
//   weight[n, j] = code[n, 2j] | code[n, 2j + 1] << 4 (uint8 [N, K/2]: even
//                                                     column, low nibble)
// input_scale is activation calibration, not derived from the weight.
inline constexpr uint64_t kNvfp4Block = 16;
float Nvfp4GlobalScale(float tensor_amax);
// One row: `x` has K elements; writes K/2 bytes to `packed` and K/16
// E4M3 codes to `scales`. kInvalidArgument on NaN or infinity, or when K is
// not a multiple of 16.
Status QuantizeNvfp4Row(std::span<const float> x, float global_scale,
                        std::span<uint8_t> packed, std::span<uint8_t> scales);

// MXFP4 as gpt-oss stores its experts (OCP Microscaling Formats v1.0,
// section 6.3, scale rule of section 6.3 "shared exponent"): per 32
// elements an E8M0 scale byte s = clamp(floor(log2(amax)) - 2, -127, 127) +
// 127 (2 is E2M1's largest exponent; byte 0 for an all-zero block), codes
// e2m1(x / 2^(s - 127)) saturating at +-6, packed two per byte with the even
// element in the low nibble: `*_blocks` uint8 [..., R, C/32, 16],
// `*_scales` uint8 [..., R, C/32].
inline constexpr uint64_t kMxfp4Block = 32;
uint8_t Mxfp4ScaleFromAmax(float amax);
// One row of C elements (C a multiple of 32): C/2 bytes to `packed`, C/32
// bytes to `scales`. kInvalidArgument on NaN or infinity, or a bad C.
Status QuantizeMxfp4Row(std::span<const float> x, std::span<uint8_t> packed,
                        std::span<uint8_t> scales);

// Reads element i of a local tensor of dtype `dtype` as FP32 (F32, BF16;
// F16 is not supported as a source here).
bool IsConvertibleSource(const std::string& dtype);
float LoadAsF32(const std::string& dtype, const uint8_t* data, uint64_t i);

// Whether the residual path can produce canonical `to` from local `from`.
Status CheckConversion(const std::string& from, const std::string& to);

}  // namespace refit::trainer

#endif  // REFIT_TRAINER_CONVERT_H_
