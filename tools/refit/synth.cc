#include "synth.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

namespace refit::cli {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this writer copies memory");

uint16_t FloatToBf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// 65,536 BF16 patterns of normal(mean, stddev), in quantile order: indexing
// it with 16 uniform bits samples the distribution (tails cut near 4.3
// sigma, which a real checkpoint's weights rarely exceed).
std::vector<uint16_t> NormalTable(float mean, float stddev) {
  constexpr size_t kSize = 1 << 16;
  SplitMix64 rng(0x5EEDu);
  std::vector<double> samples(kSize);
  for (size_t i = 0; i < kSize; i += 2) {
    // Box-Muller; u1 in (0, 1] keeps the log finite.
    double u1 = 1.0 - rng.NextDouble();
    double u2 = rng.NextDouble();
    double r = std::sqrt(-2.0 * std::log(u1));
    samples[i] = r * std::cos(2.0 * M_PI * u2);
    samples[i + 1] = r * std::sin(2.0 * M_PI * u2);
  }
  std::sort(samples.begin(), samples.end());
  std::vector<uint16_t> table(kSize);
  for (size_t i = 0; i < kSize; ++i) {
    table[i] = FloatToBf16(static_cast<float>(mean + stddev * samples[i]));
  }
  return table;
}

void Fill(const std::vector<uint16_t>& table, SplitMix64* rng,
          std::vector<uint16_t>* data) {
  size_t n = data->size();
  uint16_t* out = data->data();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint64_t r = rng->Next();
    out[i] = table[r & 0xFFFF];
    out[i + 1] = table[(r >> 16) & 0xFFFF];
    out[i + 2] = table[(r >> 32) & 0xFFFF];
    out[i + 3] = table[r >> 48];
  }
  for (; i < n; ++i) out[i] = table[rng->Next() & 0xFFFF];
}

// Moves a BF16 pattern by `ulps` units of its magnitude, in the direction
// `up` (away from zero) when possible; stays finite and never returns the
// input.
uint16_t Nudge(uint16_t bits, int ulps, bool up) {
  uint16_t sign = bits & 0x8000;
  int magnitude = bits & 0x7FFF;
  constexpr int kInf = 0x7F80;
  if (magnitude >= kInf) return bits ^ 1;  // never generated; keep it changed
  int next = up ? magnitude + ulps : magnitude - ulps;
  if (next < 0 || next >= kInf) next = up ? magnitude - ulps : magnitude + ulps;
  if (next < 0) next = magnitude + ulps;
  return static_cast<uint16_t>(sign | next);
}

}  // namespace

uint64_t SynthModel::bytes() const { return elements() * 2; }

uint64_t SynthModel::elements() const {
  uint64_t n = 0;
  for (const SynthTensor& t : tensors) n += t.data.size();
  return n;
}

std::vector<TensorView> SynthModel::Views() const {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const SynthTensor& t : tensors) {
    TensorView v;
    v.name = t.name;
    v.dtype = "BF16";
    v.width = 2;
    v.shape = t.shape;
    v.data = reinterpret_cast<const uint8_t*>(t.data.data());
    views.push_back(std::move(v));
  }
  return views;
}

SynthModel GenerateModel(uint64_t target_bytes, uint64_t seed) {
  // Parameters of a decoder with hidden size h, L layers, MLP width 3h and
  // vocabulary 8h: L * 13h^2 (+ norms) + 16h^2 for embed_tokens and
  // lm_head. Pick h for L = 4, then the L that lands nearest the target.
  double params = static_cast<double>(target_bytes) / 2.0;
  uint64_t h =
      static_cast<uint64_t>(std::sqrt(params / 68.0) / 32.0 + 0.5) * 32;
  h = std::max<uint64_t>(h, 32);
  double per_layer = 13.0 * static_cast<double>(h * h);
  double fixed = 16.0 * static_cast<double>(h * h);
  uint64_t layers = static_cast<uint64_t>(
      std::max(1.0, std::round((params - fixed) / per_layer)));
  uint64_t inter = 3 * h;
  uint64_t vocab = 8 * h;

  std::vector<std::pair<std::string, std::vector<uint64_t>>> layout;
  layout.push_back({"model.embed_tokens.weight", {vocab, h}});
  layout.push_back({"lm_head.weight", {vocab, h}});
  layout.push_back({"model.norm.weight", {h}});
  for (uint64_t l = 0; l < layers; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    layout.push_back({p + "input_layernorm.weight", {h}});
    layout.push_back({p + "post_attention_layernorm.weight", {h}});
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      layout.push_back({p + "self_attn." + proj + ".weight", {h, h}});
    }
    layout.push_back({p + "mlp.gate_proj.weight", {inter, h}});
    layout.push_back({p + "mlp.up_proj.weight", {inter, h}});
    layout.push_back({p + "mlp.down_proj.weight", {h, inter}});
  }
  std::sort(layout.begin(), layout.end());

  std::vector<uint16_t> weights = NormalTable(0.0f, 0.02f);
  std::vector<uint16_t> norms = NormalTable(1.0f, 0.05f);
  SplitMix64 rng(seed);
  SynthModel model;
  for (auto& [name, shape] : layout) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    SynthTensor t;
    t.name = name;
    t.shape = shape;
    t.data.resize(n);
    Fill(shape.size() == 1 ? norms : weights, &rng, &t.data);
    model.tensors.push_back(std::move(t));
  }
  return model;
}

uint64_t EvolveModel(SynthModel* model, double rate, uint64_t seed) {
  SplitMix64 rng(seed ^ 0xA5A5A5A5DEADBEEFULL);
  rate = std::clamp(rate, 0.0, 1.0);
  // Compare 32 random bits with the threshold: 2 Bernoulli draws per call.
  uint64_t threshold = static_cast<uint64_t>(rate * 4294967296.0);
  uint64_t changed = 0;
  auto maybe_change = [&](uint16_t* element, uint32_t draw) {
    if (draw >= threshold) return;
    uint64_t r = rng.Next();
    uint32_t pick = static_cast<uint32_t>(r % 100);
    int ulps = pick < 80 ? 1 : (pick < 95 ? 2 : 3);
    *element = Nudge(*element, ulps, ((r >> 32) & 1) != 0);
    ++changed;
  };
  for (SynthTensor& t : model->tensors) {
    size_t n = t.data.size();
    uint16_t* data = t.data.data();
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
      uint64_t r = rng.Next();
      maybe_change(&data[i], static_cast<uint32_t>(r));
      maybe_change(&data[i + 1], static_cast<uint32_t>(r >> 32));
    }
    if (i < n) maybe_change(&data[i], static_cast<uint32_t>(rng.Next()));
  }
  return changed;
}

Status WriteModel(const SynthModel& model, const std::string& path,
                  const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SynthTensor& t : model.tensors) {
    uint64_t size = t.data.size() * 2;
    header[t.name] = {{"dtype", "BF16"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> file(std::fopen(path.c_str(), "wb"));
  if (!file) {
    int e = errno;
    std::string msg =
        fmt::format("cannot create '{}': {}", path, std::strerror(e));
    return e == ENOENT ? NotFoundError(msg) : UnavailableError(msg);
  }
  uint64_t n = text.size();
  std::array<uint8_t, 8> prefix;
  for (int i = 0; i < 8; ++i) {
    prefix[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  }
  bool ok = std::fwrite(prefix.data(), 1, 8, file.get()) == 8 &&
            std::fwrite(text.data(), 1, text.size(), file.get()) == text.size();
  for (const SynthTensor& t : model.tensors) {
    if (!ok) break;
    ok = std::fwrite(t.data.data(), 2, t.data.size(), file.get()) ==
         t.data.size();
  }
  if (!ok || std::fflush(file.get()) != 0) {
    return UnavailableError(
        fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  }
  if (std::fclose(file.release()) != 0) {
    return UnavailableError(fmt::format("cannot close '{}'", path));
  }
  return Status::Ok();
}

}  // namespace refit::cli
