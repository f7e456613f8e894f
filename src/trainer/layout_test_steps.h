// Test-only helpers shared by the cross-rank layout tests
// (fp8_block_layout_test.cc, fp4_layout_test.cc): an RL step's changes to
// BF16 bytes, a rank's local tensors as views, and the union of all ranks'
// chunks applied to a canonical checkpoint. Header-only.
#ifndef REFIT_TRAINER_LAYOUT_TEST_STEPS_H_
#define REFIT_TRAINER_LAYOUT_TEST_STEPS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "delta/apply.h"
#include "layout/layout.h"
#include "refit/checkpoint.h"
#include "support/test_layout.h"
#include "support/testing.h"

namespace refit::trainer::layout_test {

using layout::testing::TensorBytes;

// ~3% of the BF16 elements move by 1 to max_ulps units in the last place,
// one in a thousand of them also doubles or halves (exponent +-1); zeros
// stay zero (a step below zero would be a NaN pattern).
inline void MoveSomeElements(std::vector<uint8_t>* bf16, std::mt19937_64* rng, int max_ulps) {
  std::uniform_real_distribution<double> u(0, 1);
  for (size_t i = 0; i + 1 < bf16->size(); i += 2) {
    const double r = u(*rng);
    uint16_t x;
    std::memcpy(&x, bf16->data() + i, 2);
    if (r >= 0.03 || x == 0) continue;
    const int sign = (*rng)() % 2 ? 1 : -1;
    x = static_cast<uint16_t>(x + sign * static_cast<int>(1 + (*rng)() % uint64_t(max_ulps)));
    if (r < 0.001) x = static_cast<uint16_t>(x ^ 0x0080);
    std::memcpy(bf16->data() + i, &x, 2);
  }
}

// Rank `ri`'s local tensors of `l` (F32 or BF16) over `bytes`.
inline std::vector<TensorView> RankViews(const layout::Layout& l, size_t ri,
                                         const TensorBytes& bytes) {
  std::vector<TensorView> v;
  for (const layout::LocalTensor& t : l.ranks[ri].tensors) {
    v.push_back({t.name, t.dtype, t.dtype == "F32" ? 4 : 2, t.shape, bytes.at(t.name).data()});
  }
  return v;
}

// The tensors of checkpoint layout `q` that are not quantized, copied from
// `values` (a quantized tensor's reference quantizer adds the rest).
inline TensorBytes Unquantized(const layout::Layout& q, const TensorBytes& values) {
  TensorBytes out;
  for (const layout::CanonicalTensor& c : q.canonical) {
    if (c.scale_kind.empty() && values.count(c.name)) out[c.name] = values.at(c.name);
  }
  return out;
}

// Applies every chunk (tensor ids index `names`) to `applied`, each to a
// region still at its base, then checks that `applied` equals `want`.
inline void ApplyAndCompare(const std::vector<std::vector<uint8_t>>& chunks,
                            const std::vector<std::string>& names, TensorBytes* applied,
                            const TensorBytes& want) {
  ApplyScratch scratch;
  for (const auto& c : chunks) {
    auto parsed = ParseChunk(c);
    ASSERT_OK(parsed);
    auto& t = applied->at(names[parsed->header.tensor_id]);
    ASSERT_EQ(ClassifyRange(parsed->header, RegionHash(parsed->header, t.data())),
              RangeState::kBefore);
    ASSERT_OK(ApplyChunkInPlace(*parsed, t.data(), &scratch, nullptr, nullptr));
  }
  for (const auto& [name, bytes] : want) ASSERT_TRUE(applied->at(name) == bytes) << name;
}

}  // namespace refit::trainer::layout_test

#endif  // REFIT_TRAINER_LAYOUT_TEST_STEPS_H_
