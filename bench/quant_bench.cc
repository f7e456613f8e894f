// Payload against the order-0 bound on quantized checkpoints
// (docs/benchmarks.md, "Quantized formats"): every fixture step is
// quantized with the residual conversions of src/trainer/convert.h (FP8 E4M3
// with 128 x 128 weight_scale_inv, NVFP4, MXFP4; embeddings, the output
// head and 1-D tensors stay BF16, as the serving checkpoints keep them), and
// each consecutive pair of steps is diffed like any checkpoint.
//   build/release/bench/refit_quant_bench --fixtures ../shared/fixtures/qwen2-tiny
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "refit/status.h"
#include "trainer/convert.h"

namespace refit {
namespace {

struct Tensor {
  std::string name, dtype;
  int width = 1;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};
using Model = std::vector<Tensor>;

Tensor Make(std::string name, std::string dtype, int width, std::vector<uint64_t> shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  Tensor t{std::move(name), std::move(dtype), width, std::move(shape), {}};
  t.bytes.resize(n * static_cast<uint64_t>(width));
  return t;
}

void PutF32(Tensor* t, uint64_t i, float x) { std::memcpy(&t->bytes[i * 4], &x, 4); }

// One step in `format`: "bf16", "fp8", "nvfp4" or "mxfp4".
// With `linear_only`, only the tensors a quantized format converts (the
// 2-D weights but embeddings and the head), in every format.
Result<Model> Quantize(const Checkpoint& ck, const std::string& format, bool linear_only) {
  Model out;
  for (size_t ti = 0; ti < ck.tensors().size(); ++ti) {
    const TensorInfo& info = ck.tensors()[ti];
    auto data = ck.Data(ti);
    const bool unconverted = info.shape.size() != 2 ||
                             info.name.find("embed_tokens") != std::string::npos ||
                             info.name.find("lm_head") != std::string::npos;
    if (unconverted && linear_only) continue;
    if (unconverted || format == "bf16") {
      Tensor t = Make(info.name, info.dtype, info.element_width, info.shape);
      std::copy(data.begin(), data.end(), t.bytes.begin());
      out.push_back(std::move(t));
      continue;
    }
    const uint64_t rows = info.shape[0], cols = info.shape[1];
    std::vector<float> x(rows * cols);
    float amax = 0;
    for (uint64_t i = 0; i < x.size(); ++i) {
      x[i] = trainer::LoadAsF32("BF16", data.data(), i);
      amax = std::max(amax, std::fabs(x[i]));
    }
    if (format == "fp8") {
      const uint64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
      Tensor q = Make(info.name, "F8_E4M3", 1, {rows, cols});
      Tensor s = Make(info.name + "_scale_inv", "F32", 4, {br, bc});
      for (uint64_t b = 0; b < br * bc; ++b) {
        const uint64_t r0 = b / bc * 128, c0 = b % bc * 128;
        float m = 0;
        for (uint64_t r = r0; r < std::min(rows, r0 + 128); ++r) {
          for (uint64_t c = c0; c < std::min(cols, c0 + 128); ++c) {
            m = std::max(m, std::fabs(x[r * cols + c]));
          }
        }
        const float inv = trainer::Fp8BlockScaleInv(m);
        PutF32(&s, b, inv);
        for (uint64_t r = r0; r < std::min(rows, r0 + 128); ++r) {
          for (uint64_t c = c0; c < std::min(cols, c0 + 128); ++c) {
            q.bytes[r * cols + c] = trainer::E4m3FromF32(x[r * cols + c] / inv);
          }
        }
      }
      out.push_back(std::move(q));
      out.push_back(std::move(s));
    } else if (format == "nvfp4") {
      Tensor q = Make(info.name, "U8", 1, {rows, cols / 2});
      Tensor s = Make(info.name + "_scale", "F8_E4M3", 1, {rows, cols / 16});
      Tensor s2 = Make(info.name + "_scale_2", "F32", 4, {});
      Tensor in = Make(info.name.substr(0, info.name.rfind('.')) + ".input_scale", "F32", 4, {});
      const float g = trainer::Nvfp4GlobalScale(amax);
      PutF32(&s2, 0, g);
      PutF32(&in, 0, 1.0f);  // calibration data: the same every step
      for (uint64_t r = 0; r < rows; ++r) {
        REFIT_RETURN_IF_ERROR(trainer::QuantizeNvfp4Row(
            std::span<const float>(x).subspan(r * cols, cols), g,
            std::span<uint8_t>(q.bytes).subspan(r * cols / 2, cols / 2),
            std::span<uint8_t>(s.bytes).subspan(r * cols / 16, cols / 16)));
      }
      for (Tensor* t : {&q, &s, &s2, &in}) out.push_back(std::move(*t));
    } else if (format == "mxfp4") {
      Tensor q = Make(info.name + "_blocks", "U8", 1, {rows, cols / 32, 16});
      Tensor s = Make(info.name + "_scales", "U8", 1, {rows, cols / 32});
      for (uint64_t r = 0; r < rows; ++r) {
        REFIT_RETURN_IF_ERROR(trainer::QuantizeMxfp4Row(
            std::span<const float>(x).subspan(r * cols, cols),
            std::span<uint8_t>(q.bytes).subspan(r * cols / 2, cols / 2),
            std::span<uint8_t>(s.bytes).subspan(r * cols / 32, cols / 32)));
      }
      out.push_back(std::move(q));
      out.push_back(std::move(s));
    } else {
      return InvalidArgumentError("unknown format " + format);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Tensor& a, const Tensor& b) { return a.name < b.name; });
  return out;
}

std::vector<TensorView> Views(const Model& m) {
  std::vector<TensorView> v;
  for (const Tensor& t : m) v.push_back({t.name, t.dtype, t.width, t.shape, t.bytes.data()});
  return v;
}

int Run(const std::string& fixtures, const std::string& scratch, bool linear_only) {
  fmt::print("refit_quant_bench --fixtures {}{}\n", fixtures,
             linear_only ? " --linear-only" : "");
  fmt::print("{:<7} {:<9} {:>10} {:>9} {:>8} {:>10} {:>10} {:>10} {:>8} {:>10} {:>9}\n",
             "format", "pair", "elements", "changed", "rate", "bound", "bound/t",
             "payload", "x bound", "full", "full/pay");
  for (const std::string format : {"bf16", "fp8", "nvfp4", "mxfp4"}) {
    std::vector<Model> steps;
    for (int s = 0; s < 4; ++s) {
      auto ck = Checkpoint::Open(fmt::format("{}/step{}.safetensors", fixtures, s),
                                 Checkpoint::Mode::kReadOnly);
      if (!ck.ok()) {
        fmt::print(stderr, "{}\n", ck.status().ToString());
        return 1;
      }
      auto m = Quantize(*ck, format, linear_only);
      if (!m.ok()) {
        fmt::print(stderr, "{}\n", m.status().ToString());
        return 1;
      }
      steps.push_back(*std::move(m));
    }
    for (int s = 0; s < 3; ++s) {
      const std::string path = scratch + "/pair.rfd";
      auto d = DiffTensors(Views(steps[s]), Views(steps[s + 1]), path, {});
      if (!d.ok()) {
        fmt::print(stderr, "{}\n", d.status().ToString());
        return 1;
      }
      auto info = Inspect(path);
      if (!info.ok()) {
        fmt::print(stderr, "{}\n", info.status().ToString());
        return 1;
      }
      double per_tensor = 0;
      for (const TensorInspect& t : info->tensors) per_tensor += t.bound_bytes;
      fmt::print("{:<7} {:<9} {:>10} {:>9} {:>7.2f}% {:>10.0f} {:>10.0f} {:>10} {:>8.3f} "
                 "{:>10} {:>9.1f}\n",
                 format, fmt::format("{}->{}", s, s + 1), info->total_elements,
                 info->changed_elements,
                 100.0 * static_cast<double>(info->changed_elements) /
                     static_cast<double>(info->total_elements),
                 info->bound_bytes, per_tensor, info->payload_bytes,
                 static_cast<double>(info->payload_bytes) / info->bound_bytes,
                 info->full_bytes,
                 static_cast<double>(info->full_bytes) /
                     static_cast<double>(info->payload_bytes));
    }
  }
  return 0;
}

}  // namespace
}  // namespace refit

int main(int argc, char** argv) {
  CLI::App app("payload against the order-0 bound on quantized fixture steps");
  std::string fixtures;
  app.add_option("--fixtures", fixtures, "directory with step0..3.safetensors (BF16)")
      ->required();
  bool linear_only = false;
  app.add_flag("--linear-only", linear_only,
               "only the tensors the formats convert (2-D weights but embeddings and head)");
  CLI11_PARSE(app, argc, argv);
  std::string scratch = (std::filesystem::temp_directory_path() /
                         fmt::format("refit-quant-bench-{}", ::getpid()))
                            .string();
  std::filesystem::create_directories(scratch);
  int rc = refit::Run(fixtures, scratch, linear_only);
  std::filesystem::remove_all(scratch);
  return rc;
}
