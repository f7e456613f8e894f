// Tensor element types as safetensors names them (upstream spec:
// huggingface/safetensors README, "Format"). refit treats elements as opaque
// bit patterns; it needs a dtype's element width to lay out and diff a tensor,
// and the DType enum only where a later conversion (a cast, a quantization)
// must know the encoding. The element widths of other dtypes come from
// DTypeRegistry (refit/checkpoint.h). Everything here is pure and thread-safe.
#ifndef REFIT_FORMAT_DTYPE_H_
#define REFIT_FORMAT_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string_view>

#include "refit/checkpoint.h"

namespace refit {

// The dtypes of the safetensors spec.
enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

inline constexpr int kNumDTypes = 15;

// nullopt for a name outside the spec (matching is case-sensitive, as in
// the spec).
std::optional<DType> ParseDType(std::string_view name);
// The spec's name, e.g. "BF16".
std::string_view DTypeName(DType dtype);
// Bytes per element.
int DTypeWidth(DType dtype);

// The element widths the delta codec handles.
constexpr bool IsCodecWidth(int width) {
  return width == 1 || width == 2 || width == 4 || width == 8;
}

}  // namespace refit

#endif  // REFIT_FORMAT_DTYPE_H_
