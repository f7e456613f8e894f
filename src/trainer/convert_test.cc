// The residual path's casts against known values and the fixtures: the
// FP32 masters cast here must equal the BF16 and FP8 checkpoints the
// trainer framework wrote from them.
#include "trainer/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "refit/checkpoint.h"
#include "support/testing.h"

namespace refit::trainer {
namespace {

float F(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

TEST(ConvertTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(Bf16FromF32(1.0f), 0x3F80);
  EXPECT_EQ(Bf16FromF32(F(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(Bf16FromF32(F(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(Bf16FromF32(F(0x3F808001)), 0x3F81);
  EXPECT_EQ(Bf16FromF32(-0.0f), 0x8000);
  EXPECT_EQ(Bf16FromF32(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(Bf16FromF32(F(0x7F7FFFFF)), 0x7F80);  // rounds to +inf
  EXPECT_EQ(F32FromBf16(0x3F80), 1.0f);
}

TEST(ConvertTest, E4m3RoundsToNearestEvenWithoutSaturating) {
  EXPECT_EQ(E4m3FromF32(0.0f), 0x00);
  EXPECT_EQ(E4m3FromF32(-0.0f), 0x80);
  EXPECT_EQ(E4m3FromF32(1.0f), 0x38);
  EXPECT_EQ(E4m3FromF32(-2.0f), 0xC0);
  EXPECT_EQ(E4m3FromF32(448.0f), 0x7E);
  EXPECT_EQ(E4m3FromF32(464.0f), 0x7E);  // tie: 448 is even
  EXPECT_EQ(E4m3FromF32(465.0f), 0x7F);  // rounds past 448: NaN
  EXPECT_EQ(E4m3FromF32(1e6f), 0x7F);
  EXPECT_EQ(E4m3FromF32(-1e6f), 0xFF);
  EXPECT_EQ(E4m3FromF32(std::ldexp(1.0f, -9)), 0x01);   // smallest subnormal
  EXPECT_EQ(E4m3FromF32(std::ldexp(1.0f, -10)), 0x00);  // tie to even: 0
  EXPECT_EQ(E4m3FromF32(std::ldexp(3.0f, -10)), 0x02);  // 1.5 steps: tie to 2
  EXPECT_EQ(E4m3FromF32(std::ldexp(1.0f, -6)), 0x08);   // smallest normal
  EXPECT_EQ(E4m3FromF32(std::ldexp(15.9f, -10)), 0x08); // rounds up into normals
  EXPECT_EQ(E4m3FromF32(1.0625f), 0x38);                // tie between 1 and 1.125
  EXPECT_EQ(E4m3FromF32(1.1875f), 0x3A);                // tie between 1.125 and 1.25
  EXPECT_EQ(E4m3FromF32(std::numeric_limits<float>::quiet_NaN()), 0x7F);
}

// Every FP32 master of the fixture, cast, equals the BF16 snapshot and the
// FP8 checkpoint (x / scale, scale = amax / 448) of the same step.
TEST(ConvertTest, FixtureMastersCastToTheCheckpoints) {
  const std::string dir = testing::FixturesDir();
  REFIT_REQUIRE_FIXTURES();
  for (const char* step : {"step1", "step2"}) {
    auto f32 = Checkpoint::Open(dir + "/fp32/" + step + ".safetensors",
                                Checkpoint::Mode::kReadOnly);
    auto bf16 = Checkpoint::Open(dir + "/" + step + ".safetensors",
                                 Checkpoint::Mode::kReadOnly);
    auto fp8 = Checkpoint::Open(dir + "/fp8/" + step + ".safetensors",
                                Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(f32.ok() && bf16.ok() && fp8.ok());
    size_t checked_fp8 = 0;
    for (size_t t = 0; t < f32->tensors().size(); ++t) {
      const std::string& name = f32->tensors()[t].name;
      auto src = f32->Data(t);
      const size_t n = src.size() / 4;
      auto b = bf16->Data(*bf16->IndexOf(name));
      ASSERT_EQ(b.size(), n * 2) << name;
      float amax = 0;
      for (size_t i = 0; i < n; ++i) {
        float x = LoadAsF32("F32", src.data(), i);
        amax = std::max(amax, std::fabs(x));
        uint16_t want;
        std::memcpy(&want, b.data() + i * 2, 2);
        ASSERT_EQ(Bf16FromF32(x), want) << name << " element " << i;
      }
      auto qi = fp8->IndexOf(name);
      ASSERT_TRUE(qi.has_value()) << name;
      if (fp8->tensors()[*qi].dtype != "F8_E4M3") continue;
      auto q = fp8->Data(*qi);
      auto si = fp8->IndexOf(name + "_scale");
      ASSERT_TRUE(si.has_value()) << name;
      float scale = amax / 448.0f;
      float stored;
      std::memcpy(&stored, fp8->Data(*si).data(), 4);
      ASSERT_EQ(scale, stored) << name;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(E4m3FromF32(LoadAsF32("F32", src.data(), i) / scale), q[i])
            << name << " element " << i;
      }
      ++checked_fp8;
    }
    EXPECT_GT(checked_fp8, 20u);
  }
}

}  // namespace
}  // namespace refit::trainer
