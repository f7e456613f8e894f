// Frequency tables and plane models (docs/format.md, sections 5.1, 5.2 and
// 5.4): normalization, the geometric gap model, the table bit format, and
// the encoder's exact-cost model choice.
//
// Everything here is plain data and pure functions; there is no shared
// mutable state except a lazily built, immutable log2 table, so all of it is
// thread-safe. Costs are integer fixed point (kCostOne per bit) so that every
// platform, and a future GPU encoder using the same table, makes the same
// choices.
#ifndef REFIT_CODEC_TABLE_H_
#define REFIT_CODEC_TABLE_H_

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "refit/status.h"

namespace refit::codec {

inline constexpr int kMaxPrecision = 15;
inline constexpr int kCostFracBits = 16;
inline constexpr uint64_t kCostOne = uint64_t{1} << kCostFracBits;

using Histogram = std::array<uint64_t, 256>;
using Freqs = std::array<uint16_t, 256>;  // f[s]; sum is 2^t

// floor(log2(f) * kCostOne) for 1 <= f <= 2^15, from a table computed once
// with integer arithmetic only (so it is identical everywhere).
uint32_t Log2Fixed(uint32_t f);

// Section 5.1 normalization of `weights` at precision t (1..15) into *f.
// Returns false (leaving *f unspecified) when the total is zero, a weight
// is 2^48 or more, or more than 2^t symbols have weight.
bool Normalize(const Histogram& weights, int t, Freqs* f);

// Section 5.2 geometric weights for gap plane `plane` of a sparse payload
// with n elements and k records; symbols above max_symbol get weight 0.
Histogram GeometricWeights(uint32_t n, uint32_t k, int plane,
                           uint8_t max_symbol);

// Section 5.4: bits of the table description, before byte padding.
uint64_t TableBits(const Freqs& f);
// Appends the padded table description.
void WriteTable(int t, const Freqs& f, std::vector<uint8_t>* out);
// Parses a table from the front of `in`; on success sets *t, *f and
// *consumed (bytes, padding included). Corrupt input: kDataLoss.
Status ReadTable(std::span<const uint8_t> in, int* t, Freqs* f,
                 size_t* consumed);

enum class ModelMode : uint8_t {
  kConstant = 0,
  kUniform = 1,
  kTable = 2,
  kGeometric = 3,
};

// A plane's model (section 5.2). For every mode but kConstant, `f` holds the
// normalized frequencies at precision `t` (uniform: t = 8, all ones).
struct Model {
  ModelMode mode = ModelMode::kConstant;
  uint8_t symbol = 0;      // kConstant
  uint8_t max_symbol = 0;  // kGeometric
  int t = 0;
  Freqs f{};
  bool coded() const { return mode != ModelMode::kConstant; }
};

// Where a plane sits, for the geometric model (only sparse gap planes may
// use it).
struct GapContext {
  bool is_gap = false;
  uint32_t n = 0;
  uint32_t k = 0;
  int plane = 0;
};

// Picks the model of least exact cost (description bits plus
// sum count[s] * (t - log2 f[s]), fixed point) for a plane whose symbol
// counts are `hist` (at least one symbol present). Ties go to the earlier
// mode, then the smaller t. *cost receives the cost in kCostOne units.
Model ChooseModel(const Histogram& hist, const GapContext& gap, uint64_t* cost);

// Appends the model description (mode byte first).
void WriteModel(const Model& m, std::vector<uint8_t>* out);
// Parses a model from the front of `in`, rebuilding geometric tables;
// kDataLoss on corruption or a geometric model outside a gap plane.
Status ReadModel(std::span<const uint8_t> in, const GapContext& gap, Model* m,
                 size_t* consumed);

const char* ModelName(ModelMode mode);

}  // namespace refit::codec

#endif  // REFIT_CODEC_TABLE_H_
