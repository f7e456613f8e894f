#include "format/dtype.h"

#include <charconv>
#include <string>

#include "format/json.h"

namespace refit {
namespace {

struct SpecDType {
  DType dtype;
  std::string_view name;
  int width;
};

// Indexed by DType.
constexpr SpecDType kSpec[kNumDTypes] = {
    {DType::kBool, "BOOL", 1},      {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},          {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},        {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},      {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},        {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},        {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
};

// Dtypes outside the spec that newer writers (safetensors >= 0.5, ml_dtypes)
// emit. Width 0 marks packed sub-byte types, whose byte size is not
// num_elements * width; those, and 16-byte C128, are known but outside what
// the codec handles, so they get a precise kUnimplemented instead of the
// "declare its width" advice.
struct ExtraDType {
  std::string_view name;
  int width;
};
constexpr ExtraDType kExtra[] = {
    {"F8_E8M0", 1}, {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1}, {"C64", 8},
    {"C128", 16},   {"F4", 0},          {"F6_E2M3", 0},     {"F6_E3M2", 0},
};

// nullopt when `name` is not built in; otherwise its width (maybe 0 or 16).
std::optional<int> BuiltinWidth(std::string_view name) {
  if (auto d = ParseDType(name)) return DTypeWidth(*d);
  for (const ExtraDType& e : kExtra) {
    if (e.name == name) return e.width;
  }
  return std::nullopt;
}

}  // namespace

std::optional<DType> ParseDType(std::string_view name) {
  for (const SpecDType& s : kSpec) {
    if (s.name == name) return s.dtype;
  }
  return std::nullopt;
}

std::string_view DTypeName(DType dtype) {
  return kSpec[static_cast<int>(dtype)].name;
}

int DTypeWidth(DType dtype) { return kSpec[static_cast<int>(dtype)].width; }

Status DTypeRegistry::Register(std::string_view name, int width) {
  if (name.empty() || name.find('=') != std::string_view::npos) {
    return InvalidArgumentError("invalid dtype name " +
                                internal::QuoteForMessage(name));
  }
  if (!IsCodecWidth(width)) {
    return InvalidArgumentError(
        "dtype " + internal::QuoteForMessage(name) + ": element width " +
        std::to_string(width) +
        " is not supported; refit's delta codec handles 1, 2, 4 or 8-byte "
        "elements");
  }
  if (std::optional<int> builtin = BuiltinWidth(name)) {
    if (*builtin == width) return Status();
    return InvalidArgumentError("dtype " + std::string(name) +
                                " is built in and cannot be redeclared with "
                                "width " +
                                std::to_string(width));
  }
  widths_.insert_or_assign(std::string(name), width);
  return Status();
}

Status DTypeRegistry::RegisterFlag(std::string_view flag) {
  size_t eq = flag.find('=');
  int width = 0;
  if (eq != std::string_view::npos) {
    std::string_view digits = flag.substr(eq + 1);
    auto [end, ec] =
        std::from_chars(digits.data(), digits.data() + digits.size(), width);
    if (ec != std::errc() || end != digits.data() + digits.size() ||
        digits.empty()) {
      eq = std::string_view::npos;
    }
  }
  if (eq == std::string_view::npos) {
    return InvalidArgumentError(
        "--dtype-width expects NAME=N (N = 1, 2, 4 or 8 bytes), got " +
        internal::QuoteForMessage(flag));
  }
  return Register(flag.substr(0, eq), width);
}

Result<int> DTypeRegistry::ElementWidth(std::string_view dtype) const {
  if (std::optional<int> builtin = BuiltinWidth(dtype)) {
    if (IsCodecWidth(*builtin)) return *builtin;
    std::string what = *builtin == 0
                           ? "packed sub-byte elements"
                           : std::to_string(*builtin) + "-byte elements";
    return UnimplementedError("dtype " + std::string(dtype) + " has " + what +
                              "; refit's delta codec handles 1, 2, 4 or "
                              "8-byte elements only");
  }
  if (auto it = widths_.find(dtype); it != widths_.end()) return it->second;
  std::string flag_name = dtype.size() <= 80 ? std::string(dtype) : "NAME";
  return InvalidArgumentError(
      "unknown dtype " + internal::QuoteForMessage(dtype) +
      ": declare its element width with --dtype-width " + flag_name +
      "=N (N = 1, 2, 4 or 8 bytes) or DTypeRegistry::Register");
}

}  // namespace refit
