// The quantized serving formats (docs/trainer.md, "Quantized formats")
// against reference quantizers written from the published conventions
// (trainer/quantize_reference.h), FP8 block scales as the DeepSeek-V3
// checkpoint defines weight_scale_inv; on hand-picked values and on every
// 2-D tensor of the fixture checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "refit/checkpoint.h"
#include "support/testing.h"
#include "trainer/convert.h"
#include "trainer/quantize_reference.h"

namespace refit::trainer {
namespace {

using reference::RefE2m1;
using reference::RefE4m3Value;
using reference::RefMxfp4;
using reference::RefNvfp4;

TEST(QuantizeTest, E2m1RoundsToNearestEvenAndSaturates) {
  struct Case {
    float x;
    uint8_t code;
  };
  for (Case c : {Case{0.0f, 0}, Case{0.25f, 0}, Case{0.26f, 1}, Case{0.75f, 2},
                 Case{1.25f, 2}, Case{1.75f, 4}, Case{2.5f, 4}, Case{2.51f, 5},
                 Case{3.5f, 6}, Case{4.9f, 6}, Case{5.0f, 6}, Case{5.01f, 7},
                 Case{6.0f, 7}, Case{1e30f, 7}, Case{-0.5f, 9}, Case{-6.5f, 15},
                 Case{-0.0f, 8}}) {
    EXPECT_EQ(E2m1FromF32(c.x), c.code) << c.x;
  }
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(E2m1FromF32(F32FromE2m1(c)), c);
  // Every BF16 magnitude from 2^-3 to 2^4, both signs, against the search.
  for (uint32_t bits = 0x3E00; bits <= 0x4180; ++bits) {
    for (uint32_t sign : {0u, 0x8000u}) {
      uint32_t u = (bits | sign) << 16;
      float x;
      std::memcpy(&x, &u, 4);
      ASSERT_EQ(E2m1FromF32(x), RefE2m1(x)) << x;
    }
  }
}

TEST(QuantizeTest, E4m3DecodeMatchesTheBitLayout) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(F32FromE4m3(static_cast<uint8_t>(c))));
      continue;
    }
    EXPECT_EQ(double{F32FromE4m3(static_cast<uint8_t>(c))},
              RefE4m3Value(static_cast<uint8_t>(c)));
    EXPECT_EQ(E4m3FromF32(F32FromE4m3(static_cast<uint8_t>(c))), c == 0x80 ? 0x80 : c);
  }
}

TEST(QuantizeTest, Mxfp4ScalesAndCodes) {
  EXPECT_EQ(Mxfp4ScaleFromAmax(0.0f), 0);
  EXPECT_EQ(Mxfp4ScaleFromAmax(6.0f), 127);   // floor(log2 6) = 2
  EXPECT_EQ(Mxfp4ScaleFromAmax(4.0f), 127);
  EXPECT_EQ(Mxfp4ScaleFromAmax(3.99f), 126);
  EXPECT_EQ(Mxfp4ScaleFromAmax(1.0f), 125);
  EXPECT_EQ(Mxfp4ScaleFromAmax(1e-30f), 25);  // 2^-99.7: -100 - 2 + 127
  EXPECT_EQ(Mxfp4ScaleFromAmax(1e-40f), 0);   // clamped at 2^-127
  // A block whose amax scales to 7.5: saturates at 6.
  std::vector<float> x(32, 0.0f);
  x[0] = 7.5f;
  x[1] = -1.0f;
  x[2] = 0.25f;
  std::vector<uint8_t> packed(16), scales(1);
  ASSERT_OK(QuantizeMxfp4Row(x, packed, scales));
  EXPECT_EQ(scales[0], 127);
  EXPECT_EQ(packed[0], 0x7 | 0xA << 4);  // 6 | -1 in the high nibble
  EXPECT_EQ(packed[1], 0x0);             // 0.25 ties to 0
  x[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(QuantizeMxfp4Row(x, packed, scales).ok());
  std::vector<float> odd(48, 1.0f);
  std::vector<uint8_t> p2(24), s2(1);
  EXPECT_FALSE(QuantizeMxfp4Row(odd, p2, s2).ok());
}

TEST(QuantizeTest, Nvfp4Scales) {
  EXPECT_EQ(Nvfp4GlobalScale(2688.0f), 1.0f);  // 6 x 448
  EXPECT_EQ(Nvfp4GlobalScale(0.0f), 1.0f);
  // Block amax = tensor amax: its scale is e4m3(448) = 0x7E, and the largest
  // element becomes 6.
  std::vector<float> x(16, 0.0f);
  x[5] = -3.0f;
  x[6] = 1.0f;
  const float g = Nvfp4GlobalScale(3.0f);
  std::vector<uint8_t> packed(8), scales(1);
  ASSERT_OK(QuantizeNvfp4Row(x, g, packed, scales));
  EXPECT_EQ(scales[0], 0x7E);
  EXPECT_EQ(packed[2] >> 4, 0xF);   // element 5: -6, high nibble
  EXPECT_EQ(packed[3] & 0xF, 0x4);  // element 6: 1/3 x 6 = 2, low nibble
  std::fill(x.begin(), x.end(), 0.0f);
  ASSERT_OK(QuantizeNvfp4Row(x, g, packed, scales));
  EXPECT_EQ(scales[0], E4m3FromF32(1.0f));  // an all-zero block
}

// Every 2-D tensor of the fixture steps, row by row, both formats, against
// the references; FP8 block scales against the DeepSeek-V3 definition.
TEST(QuantizeTest, FixtureTensorsMatchTheReferences) {
  REFIT_REQUIRE_FIXTURES();
  auto ck = Checkpoint::Open(refit::testing::FixturesDir() + "/step2.safetensors",
                             Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  size_t tensors = 0;
  for (size_t t = 0; t < ck->tensors().size(); ++t) {
    const TensorInfo& info = ck->tensors()[t];
    if (info.shape.size() != 2) continue;
    const uint64_t rows = info.shape[0], cols = info.shape[1];
    auto data = ck->Data(t);
    std::vector<float> all(rows * cols);
    float amax = 0;
    for (uint64_t i = 0; i < rows * cols; ++i) {
      all[i] = LoadAsF32("BF16", data.data(), i);
      amax = std::max(amax, std::fabs(all[i]));
    }
    const float g = Nvfp4GlobalScale(amax);
    EXPECT_EQ(g, amax / 2688.0f);
    for (uint64_t r = 0; r < rows; ++r) {
      std::vector<float> x(all.begin() + r * cols, all.begin() + (r + 1) * cols);
      std::vector<uint8_t> mp(cols / 2), ms(cols / 32), np(cols / 2), ns(cols / 16);
      ASSERT_OK(QuantizeMxfp4Row(x, mp, ms));
      ASSERT_OK(QuantizeNvfp4Row(x, g, np, ns));
      std::vector<uint8_t> rmp, rms, rnp, rns;
      RefMxfp4(x, &rmp, &rms);
      RefNvfp4(x, g, &rnp, &rns);
      ASSERT_EQ(mp, rmp) << info.name << " row " << r;
      ASSERT_EQ(ms, rms) << info.name << " row " << r;
      ASSERT_EQ(np, rnp) << info.name << " row " << r;
      ASSERT_EQ(ns, rns) << info.name << " row " << r;
    }
    // FP8 128 x 128 blocks, zero-padded at the edges: dequantized =
    // e4m3 x weight_scale_inv with weight_scale_inv = block amax / 448.
    for (uint64_t br = 0; br < (rows + 127) / 128; ++br) {
      for (uint64_t bc = 0; bc < (cols + 127) / 128; ++bc) {
        float bamax = 0;
        for (uint64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r) {
          for (uint64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
            bamax = std::max(bamax, std::fabs(all[r * cols + c]));
          }
        }
        const float s = Fp8BlockScaleInv(bamax);
        ASSERT_EQ(s, bamax / 448.0f);
        const uint64_t r0 = br * 128, c0 = bc * 128;
        const uint8_t q = E4m3FromF32(all[r0 * cols + c0] / s);
        // |dequantized - x| is within half an E4M3 step of x / s.
        const double back = RefE4m3Value(q) * s, x = all[r0 * cols + c0];
        EXPECT_LE(std::fabs(back - x), std::fabs(x) / 16 + s * std::pow(2.0, -10));
      }
    }
    ++tensors;
  }
  EXPECT_GT(tensors, 20u);
}

}  // namespace
}  // namespace refit::trainer
