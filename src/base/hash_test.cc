#include "base/hash.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace refit {
namespace {

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(HashTest, StreamingMatchesOneShotAtAnySplit) {
  for (size_t n : {size_t{0}, size_t{1}, kRangeHashSegment - 1,
                   kRangeHashSegment, kRangeHashSegment + 1,
                   3 * kRangeHashSegment, 3 * kRangeHashSegment + 77}) {
    auto v = Random(n, static_cast<uint32_t>(n));
    Hash128 want = RangeHash(v.data(), v.size());
    for (size_t step : {size_t{1000}, size_t{4096}, kRangeHashSegment,
                        size_t{100000}}) {
      RangeHasher h;
      for (size_t off = 0; off < n; off += step) {
        h.Update(v.data() + off, std::min(step, n - off));
      }
      EXPECT_EQ(h.Finish(), want) << "n=" << n << " step=" << step;
    }
  }
}

TEST(HashTest, SensitiveToEveryBit) {
  auto v = Random(200000, 1);
  Hash128 base = RangeHash(v.data(), v.size());
  v[150000] ^= 0x10;
  EXPECT_NE(RangeHash(v.data(), v.size()), base);
}

TEST(HashTest, GoldenValues) {
  // Frozen: the format depends on these never changing.
  std::vector<uint8_t> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ(RangeHash(v.data(), v.size()).Hex(),
            "3b49324677c6ea9b5f8428cf45e0bd64");
  EXPECT_EQ(RangeHash(nullptr, 0), RangeHash(v.data(), 0));
}

}  // namespace
}  // namespace refit
