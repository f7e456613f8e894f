#include "cuda/conditional_tables.h"

#include <gtest/gtest.h>

#include <random>

#include "codec/table.h"

namespace refit::cuda {
namespace {

// The host reference of the device's geometric gap tables (which
// conditional_apply.cu builds with a warp from the members it counts)
// equals the codec's, which the CPU decoder uses.
TEST(ConditionalTables, GeometricFreqsEqualTheCodecs) {
  std::mt19937_64 rng(3);
  int checked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    uint32_t m;
    switch (trial % 4) {
      case 0: m = 1 + static_cast<uint32_t>(rng() % 100); break;
      case 1: m = 1 + static_cast<uint32_t>(rng() % 100000); break;
      default: m = 1 + static_cast<uint32_t>(rng() % (uint32_t{1} << 28)); break;
    }
    uint32_t k;
    switch (trial % 5) {
      case 0: k = m; break;
      case 1: k = 1; break;
      case 2: k = 1 + static_cast<uint32_t>(rng() % m); break;
      case 3: k = 1 + static_cast<uint32_t>(rng() % (m / 1000 + 1)); break;
      default: k = m - static_cast<uint32_t>(rng() % std::min<uint32_t>(m, 4)); break;
    }
    const uint32_t plane = static_cast<uint32_t>(rng() % 4);
    const uint32_t max_symbol = trial % 3 == 0 ? 255 : static_cast<uint32_t>(rng() % 256);
    uint32_t t_min = 1;
    while ((uint32_t{1} << t_min) < max_symbol + 1) ++t_min;
    for (uint32_t t = t_min; t <= kCondMaxPrecision; ++t) {
      codec::Freqs want;
      ASSERT_TRUE(codec::Normalize(
          codec::GeometricWeights(m, k, static_cast<int>(plane), static_cast<uint8_t>(max_symbol)),
          static_cast<int>(t), &want));
      uint32_t got[256];
      GeometricFreqs(m, k, plane, max_symbol, t, got);
      for (int s = 0; s < 256; ++s) {
        ASSERT_EQ(got[s], want[s]) << "m " << m << " k " << k << " plane " << plane
                                   << " max " << max_symbol << " t " << t << " s " << s;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 10000);
}

}  // namespace
}  // namespace refit::cuda
