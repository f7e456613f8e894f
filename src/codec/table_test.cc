#include "codec/table.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "support/status_matchers.h"

namespace refit::codec {
namespace {

using ::refit::testing::StatusIs;

uint32_t Sum(const Freqs& f) { return std::accumulate(f.begin(), f.end(), 0u); }

TEST(TableTest, Log2FixedIsExactAtPowersAndMonotone) {
  for (int e = 0; e <= 15; ++e) {
    EXPECT_EQ(Log2Fixed(1u << e), static_cast<uint32_t>(e) << kCostFracBits);
  }
  for (uint32_t f = 2; f <= 32768; ++f)
    ASSERT_GT(Log2Fixed(f), Log2Fixed(f - 1));
  // log2(3) = 1.58496...
  EXPECT_NEAR(Log2Fixed(3) / 65536.0, 1.5849625, 1.0 / 65536);
}

TEST(TableTest, NormalizationInvariants) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    Histogram w{};
    const int present = 1 + static_cast<int>(rng() % 256);
    for (int i = 0; i < present; ++i) {
      const uint64_t mag = uint64_t{1} << (rng() % 40);
      w[rng() % 256] = 1 + rng() % mag;
    }
    int m = 0;
    for (uint64_t x : w) m += x != 0;
    for (int t = 1; t <= kMaxPrecision; ++t) {
      Freqs f;
      const bool ok = Normalize(w, t, &f);
      ASSERT_EQ(ok, m <= (1 << t)) << "t=" << t << " m=" << m;
      if (!ok) continue;
      ASSERT_EQ(Sum(f), 1u << t);
      for (int s = 0; s < 256; ++s) ASSERT_EQ(f[s] != 0, w[s] != 0) << s;
    }
  }
}

TEST(TableTest, NormalizationFollowsSpec) {
  // Step 1 floors; the shortfall goes to the largest (lowest on ties).
  Histogram w{};
  w[3] = 5;
  w[7] = 5;
  w[9] = 1;
  Freqs f;
  ASSERT_TRUE(Normalize(w, 4, &f));  // 80/11 = 7.27, 1.45 -> 7, 7, 1; d = 1
  EXPECT_EQ(f[3], 8);
  EXPECT_EQ(f[7], 7);
  EXPECT_EQ(f[9], 1);
  // Too many raised to 1: units come off the largest, lowest on ties.
  Histogram v{};
  v[0] = 1000;
  v[1] = 1000;
  for (int s = 2; s < 8; ++s) v[s] = 1;
  ASSERT_TRUE(Normalize(v, 3, &f));  // 3, 3, then six 1s: d = -4
  EXPECT_EQ(f[0], 1);
  EXPECT_EQ(f[1], 1);
  for (int s = 2; s < 8; ++s) EXPECT_EQ(f[s], 1);
  Histogram empty{};
  EXPECT_FALSE(Normalize(empty, 8, &f));
}

TEST(TableTest, TableRoundTrip) {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 500; ++iter) {
    Histogram w{};
    const int present = 1 + static_cast<int>(rng() % 256);
    for (int i = 0; i < present; ++i) w[rng() % 256] = 1 + rng() % 100000;
    int m = 0;
    for (uint64_t x : w) m += x != 0;
    const int t = std::max(1, static_cast<int>(rng() % 16));
    Freqs f;
    if (!Normalize(w, t, &f)) continue;
    std::vector<uint8_t> buf;
    WriteTable(t, f, &buf);
    EXPECT_EQ(buf.size(), (TableBits(f) + 7) / 8);
    buf.push_back(0xAA);  // trailing bytes are not the table's
    int t2 = 0;
    Freqs f2;
    size_t used = 0;
    ASSERT_TRUE(ReadTable(buf, &t2, &f2, &used).ok());
    EXPECT_EQ(t2, t);
    EXPECT_EQ(f2, f);
    EXPECT_EQ(used, buf.size() - 1);
    for (size_t cut = 0; cut + 1 < buf.size(); ++cut) {
      ASSERT_FALSE(ReadTable(std::span(buf.data(), cut), &t2, &f2, &used).ok());
    }
  }
}

TEST(TableTest, ReadTableRejectsBadTables) {
  int t;
  Freqs f;
  size_t used;
  std::vector<uint8_t> bad_t = {0x0f, 0, 0};  // t - 1 = 15
  EXPECT_THAT(ReadTable(bad_t, &t, &f, &used), StatusIs(StatusCode::kDataLoss));
  // t = 1 with m = 3 symbols.
  std::vector<uint8_t> too_many = {0x20, 0x00, 0xff, 0xff};
  EXPECT_FALSE(ReadTable(too_many, &t, &f, &used).ok());
}

TEST(TableTest, GeometricWeightsDecay) {
  const Histogram w = GeometricWeights(1000, 30, 0, 255);
  EXPECT_EQ(w[0], uint64_t{1} << 31);
  for (int s = 1; s < 256; ++s) EXPECT_LE(w[s], w[s - 1]);
  for (int s = 0; s < 256; ++s) EXPECT_GE(w[s], 1u);
  const Histogram hi = GeometricWeights(1000, 30, 1, 3);
  EXPECT_LT(hi[1], w[1]);
  EXPECT_EQ(hi[4], 0u);
  const Histogram all = GeometricWeights(10, 10, 0, 2);  // q clamps to 1
  EXPECT_EQ(all[1], 1u);
}

TEST(TableTest, ChooseModelPicksCheapest) {
  uint64_t cost;
  Histogram one{};
  one[42] = 1000;
  Model m = ChooseModel(one, GapContext{}, &cost);
  EXPECT_EQ(m.mode, ModelMode::kConstant);
  EXPECT_EQ(m.symbol, 42);
  EXPECT_EQ(cost, 16 * kCostOne);

  Histogram flat{};
  for (auto& c : flat) c = 10;
  m = ChooseModel(flat, GapContext{}, &cost);
  EXPECT_EQ(m.mode, ModelMode::kUniform);

  Histogram skew{};
  skew[1] = 4400;
  skew[3] = 2300;
  skew[7] = 1100;
  skew[15] = 600;
  skew[0] = 1600;
  m = ChooseModel(skew, GapContext{}, &cost);
  EXPECT_EQ(m.mode, ModelMode::kTable);
  EXPECT_EQ(Sum(m.f), 1u << m.t);

  // Gaps drawn from the geometric model itself choose it.
  Histogram gaps = GeometricWeights(100000, 3000, 0, 255);
  for (auto& c : gaps) c = c >> 20;
  m = ChooseModel(gaps, GapContext{true, 100000, 3000, 0}, &cost);
  EXPECT_EQ(m.mode, ModelMode::kGeometric);

  // The written model reads back identically.
  std::vector<uint8_t> buf;
  WriteModel(m, &buf);
  Model back;
  size_t used;
  ASSERT_TRUE(
      ReadModel(buf, GapContext{true, 100000, 3000, 0}, &back, &used).ok());
  EXPECT_EQ(used, buf.size());
  EXPECT_EQ(back.f, m.f);
  EXPECT_EQ(back.t, m.t);
  EXPECT_FALSE(ReadModel(buf, GapContext{}, &back, &used).ok());
}

}  // namespace
}  // namespace refit::codec
