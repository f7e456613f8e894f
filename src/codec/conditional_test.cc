#include "codec/conditional.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/hash.h"
#include "codec/conditional_kernels.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit::codec {
namespace {

using ::refit::testing::StatusIs;

uint16_t Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

struct Case {
  uint32_t n = 0;
  std::vector<uint8_t> base;  // n * 2 bytes
  std::vector<uint32_t> positions;
  std::vector<uint8_t> xors;  // k * 2 bytes
};

// A BF16 weight tensor and an RL-like step: small values change more often
// (their rounding step is smaller), mostly by one unit in the last place.
Case MakeStep(uint32_t n, double scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> weight(0.0f, 0.02f);
  std::uniform_real_distribution<double> u(0, 1);
  Case c;
  c.n = n;
  c.base.resize(2 * size_t{n});
  for (uint32_t i = 0; i < n; ++i) {
    const uint16_t b = Bf16(weight(rng));
    c.base[2 * i] = static_cast<uint8_t>(b);
    c.base[2 * i + 1] = static_cast<uint8_t>(b >> 8);
    const int e = (b >> 7) & 0xff;
    const double p = std::min(1.0, scale * std::ldexp(1.0, 120 - e));
    if (u(rng) < p) {
      const uint16_t d = rng() % 8 == 0 ? static_cast<uint16_t>(rng() % 5 + 2) : 1;
      const uint16_t nw = rng() % 2 ? static_cast<uint16_t>(b + d) : static_cast<uint16_t>(b - d);
      const uint16_t x = static_cast<uint16_t>(b ^ nw);
      if (x == 0) continue;
      c.positions.push_back(i);
      c.xors.push_back(static_cast<uint8_t>(x));
      c.xors.push_back(static_cast<uint8_t>(x >> 8));
    }
  }
  return c;
}

void RoundTrip(const Case& c, const EncodeOptions& opt = {}) {
  std::vector<uint8_t> payload;
  ASSERT_OK(EncodeConditional(c.n, c.base.data(), c.positions, c.xors.data(), opt,
                              &payload));
  const uint32_t k = static_cast<uint32_t>(c.positions.size());
  std::vector<uint32_t> pos(k);
  std::vector<uint8_t> vals(2 * size_t{k});
  ASSERT_OK(DecodeConditional(payload, c.n, c.base.data(), k, pos.data(), vals.data()));
  EXPECT_EQ(pos, c.positions);
  EXPECT_EQ(vals, c.xors);
}

TEST(ConditionalTest, RoundTripsRlLikeSteps) {
  for (uint32_t n : {1u, 15u, 16u, 17u, 1000u, 65536u, 300001u}) {
    for (double scale : {0.0005, 0.02, 0.5}) {
      Case c = MakeStep(n, scale, n * 31 + static_cast<uint64_t>(scale * 1e4));
      if (c.positions.empty()) continue;
      SCOPED_TRACE(::testing::Message() << "n " << n << " scale " << scale);
      RoundTrip(c);
      EncodeOptions few;
      few.records_per_lane = 7;
      RoundTrip(c, few);
    }
  }
}

TEST(ConditionalTest, RoundTripsEveryElementAndArbitraryValues) {
  std::mt19937_64 rng(5);
  Case c;
  c.n = 4099;
  for (uint32_t i = 0; i < c.n; ++i) {
    const uint16_t b = static_cast<uint16_t>(rng());
    c.base.push_back(static_cast<uint8_t>(b));
    c.base.push_back(static_cast<uint8_t>(b >> 8));
    uint16_t x = static_cast<uint16_t>(rng());
    if (x == 0) x = 0x8000;  // a sign flip: the difference wraps
    c.positions.push_back(i);
    c.xors.push_back(static_cast<uint8_t>(x));
    c.xors.push_back(static_cast<uint8_t>(x >> 8));
  }
  RoundTrip(c);
}

TEST(ConditionalTest, BeatsSparseXorOnRlLikeSteps) {
  Case c = MakeStep(1 << 20, 0.02, 9);
  std::vector<uint8_t> cond, sparse;
  ASSERT_OK(EncodeConditional(c.n, c.base.data(), c.positions, c.xors.data(), {}, &cond));
  ASSERT_OK(EncodeSparse(ChunkKind::kSparseXor, c.n, 2, c.positions, c.xors.data(), {},
                         &sparse));
  EXPECT_LT(cond.size(), sparse.size() * 8 / 10)
      << cond.size() << " vs " << sparse.size();
}

TEST(ConditionalTest, IsDeterministic) {
  Case c = MakeStep(200000, 0.02, 3);
  std::vector<uint8_t> a, b;
  ASSERT_OK(EncodeConditional(c.n, c.base.data(), c.positions, c.xors.data(), {}, &a));
  ASSERT_OK(EncodeConditional(c.n, c.base.data(), c.positions, c.xors.data(), {}, &b));
  EXPECT_EQ(a, b);
}

TEST(ConditionalTest, RejectsInvalidRecords) {
  Case c = MakeStep(1000, 0.5, 4);
  ASSERT_GE(c.positions.size(), 2u);
  std::vector<uint8_t> out;
  std::vector<uint32_t> bad = c.positions;
  std::swap(bad[0], bad[1]);
  EXPECT_THAT(EncodeConditional(c.n, c.base.data(), bad, c.xors.data(), {}, &out),
              StatusIs(StatusCode::kInvalidArgument));
  std::vector<uint8_t> zero = c.xors;
  zero[0] = zero[1] = 0;
  EXPECT_THAT(EncodeConditional(c.n, c.base.data(), c.positions, zero.data(), {}, &out),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(out.empty());
}

TEST(ConditionalTest, TruncatedOrCorruptPayloadsNeverCrash) {
  Case c = MakeStep(5000, 0.05, 8);
  std::vector<uint8_t> payload;
  ASSERT_OK(EncodeConditional(c.n, c.base.data(), c.positions, c.xors.data(), {}, &payload));
  const uint32_t k = static_cast<uint32_t>(c.positions.size());
  std::vector<uint32_t> pos(k);
  std::vector<uint8_t> vals(2 * size_t{k});
  for (size_t len = 0; len < payload.size(); ++len) {
    EXPECT_THAT(DecodeConditional(std::span(payload.data(), len), c.n, c.base.data(), k,
                                  pos.data(), vals.data()),
                StatusIs(StatusCode::kDataLoss))
        << len;
  }
  std::mt19937_64 rng(1);
  for (int t = 0; t < 2000; ++t) {
    std::vector<uint8_t> bad = payload;
    bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    Status s = DecodeConditional(bad, c.n, c.base.data(), k, pos.data(), vals.data());
    if (s.ok()) {
      for (uint32_t r = 0; r < k; ++r) {
        ASSERT_LT(pos[r], c.n);
        if (r) {
          ASSERT_LT(pos[r - 1], pos[r]);
        }
      }
    }
  }
  // The wrong count of records is refused.
  EXPECT_THAT(DecodeConditional(payload, c.n, c.base.data(), k - 1, pos.data(), vals.data()),
              StatusIs(StatusCode::kDataLoss));
}

// The kernels for other instruction sets return what the baseline does
// (the payload must never depend on the CPU).
TEST(ConditionalKernelTest, EveryKernelAgreesWithTheBaseline) {
#if defined(REFIT_CODEC_X86)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("bmi2")) {
    GTEST_SKIP() << "this CPU has no AVX2 + BMI2";
  }
  using internal::ConditionalBlock;
  std::mt19937_64 rng(17);
  const uint32_t blocks = 3000;
  std::vector<uint8_t> base(2 * 64 * size_t{blocks});
  for (size_t i = 0; i < base.size(); i += 2) {
    // Exponents around 120, and every other value now and then.
    const uint16_t e = rng() % 8 == 0 ? static_cast<uint16_t>(rng() % 256)
                                      : static_cast<uint16_t>(114 + rng() % 12);
    const uint16_t v = static_cast<uint16_t>((rng() & 0x807f) | e << 7);
    base[i] = static_cast<uint8_t>(v);
    base[i + 1] = static_cast<uint8_t>(v >> 8);
  }
  for (uint32_t lo : {0u, 110u, 117u, 248u}) {
    std::vector<ConditionalBlock> a(blocks), b(blocks);
    internal::ClassifyBaseline(base.data(), blocks, lo, a.data());
    internal::ClassifyAvx2(base.data(), blocks, lo, b.data());
    for (uint32_t i = 0; i < blocks; ++i) {
      for (int p = 0; p < 3; ++p) ASSERT_EQ(a[i].bit[p], b[i].bit[p]) << lo << " " << i;
    }
    // Members numbered class by class; a random share of them changed.
    const uint64_t valid_last = (uint64_t{1} << 37) - 1;
    uint64_t off_a[8], off_b[8];
    uint64_t m = 0;
    for (int c = 0; c < 8; ++c) {
      off_a[c] = off_b[c] = m;
      m += static_cast<uint64_t>(blocks) * 64;  // room for any class's members
    }
    std::vector<uint64_t> changed(m / 64 + 2);
    for (auto& w : changed) w = rng() & rng();
    std::vector<uint64_t> ha(blocks), hb(blocks);
    internal::PlaceBaseline(a.data(), blocks, valid_last, changed.data(), off_a, ha.data());
    internal::PlaceBmi2(a.data(), blocks, valid_last, changed.data(), off_b, hb.data());
    EXPECT_EQ(ha, hb) << lo;
    for (int c = 0; c < 8; ++c) EXPECT_EQ(off_a[c], off_b[c]) << lo << " class " << c;
    EXPECT_EQ(hb.back() & ~valid_last, 0u);
  }
#else
  GTEST_SKIP() << "only the baseline kernels are built for this CPU";
#endif
}

}  // namespace
}  // namespace refit::codec
