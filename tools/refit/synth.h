// A synthetic checkpoint generator for `refit demo --synthetic` and
// `refit bench`, in the spirit of zstd's datagen: deterministic for a seed,
// shaped like a real model, fast enough to make hundreds of MB per second.
//
// GenerateModel lays out a Qwen2-like decoder (embeddings, per-layer
// attention and MLP projections, RMSNorm weights, lm_head) of about the
// requested size, all BF16. Matrix weights are drawn from normal(0, 0.02)
// and norm weights from normal(1, 0.05), each rounded to BF16 with
// round-to-nearest-even, by inverse-CDF lookup in a 64 Ki-entry table.
//
// EvolveModel imitates one RL step at a low learning rate: each element
// changes with probability `rate`, by +-1 unit in the last place of its bit
// pattern (80%), 2 ulps (15%) or 3 ulps (5%), never into Inf/NaN. That gives
// the XOR spectrum the qwen2-tiny fixtures show (mostly 0x1, 0x3, 0x7, ...).
//
// Models are plain values; nothing here is shared between threads.
#ifndef REFIT_TOOLS_REFIT_SYNTH_H_
#define REFIT_TOOLS_REFIT_SYNTH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "refit/delta.h"
#include "refit/status.h"

namespace refit::cli {

struct SynthTensor {
  std::string name;
  std::vector<uint64_t> shape;
  std::vector<uint16_t> data;  // BF16 bit patterns
};

struct SynthModel {
  std::vector<SynthTensor> tensors;  // sorted by name

  uint64_t bytes() const;
  uint64_t elements() const;
  // Read-only views of every tensor, for DiffTensors.
  std::vector<TensorView> Views() const;
};

// About `target_bytes` of BF16 weights (never less than ~100 KB).
SynthModel GenerateModel(uint64_t target_bytes, uint64_t seed);

// Changes about `rate` (0..1) of all elements in place, as described above;
// returns how many changed.
uint64_t EvolveModel(SynthModel* model, double rate, uint64_t seed);

// Writes `model` as a safetensors file (spec: huggingface/safetensors
// README), streaming tensor data straight from memory. Not atomic and not
// fsynced: meant for scratch files. Errors: kUnavailable / kNotFound etc.
// from the file system.
Status WriteModel(const SynthModel& model, const std::string& path,
                  const std::map<std::string, std::string>& metadata);

// A deterministic 64-bit generator (splitmix64).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace refit::cli

#endif  // REFIT_TOOLS_REFIT_SYNTH_H_
