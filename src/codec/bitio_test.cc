#include "codec/bitio.h"

#include <gtest/gtest.h>

#include <random>

namespace refit::codec {
namespace {

TEST(BitIoTest, BitsRoundTripLsbFirst) {
  std::vector<uint8_t> buf;
  {
    BitWriter w(&buf);
    w.Put(1, 1);
    w.Put(0, 1);
    w.Put(0x5, 3);
    w.Put(0xABCDEF12, 32);
  }
  ASSERT_EQ(buf.size(), 5u);       // 37 bits, padded
  EXPECT_EQ(buf[0] & 0x1f, 0x15);  // 1, 0, then 101 from bit 2
  BitReader r(buf);
  EXPECT_EQ(r.Get(1), 1u);
  EXPECT_EQ(r.Get(1), 0u);
  EXPECT_EQ(r.Get(3), 5u);
  EXPECT_EQ(r.Get(32), 0xABCDEF12u);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.Get(3), 0u);  // padding
  EXPECT_TRUE(r.ok());
  r.Get(1);
  EXPECT_FALSE(r.ok());
}

TEST(BitIoTest, GammaCodes) {
  // gamma(1) = 1, gamma(2) = 010, gamma(5) = 00101.
  std::vector<uint8_t> buf;
  {
    BitWriter w(&buf);
    w.Gamma(1);
    w.Gamma(2);
    w.Gamma(5);
  }
  // Bits in stream order: 1 010 00101 -> LSB first.
  ASSERT_EQ(buf.size(), 2u);
  EXPECT_EQ(buf[0], 0b01000101);
  EXPECT_EQ(buf[1], 0b1);
  EXPECT_EQ(GammaBits(1), 1);
  EXPECT_EQ(GammaBits(5), 5);
  EXPECT_EQ(GammaBits(32768), 31);

  std::mt19937 rng(1);
  std::vector<uint32_t> vals;
  for (int i = 0; i < 1000; ++i) {
    vals.push_back(static_cast<uint32_t>(1 + rng() % (1u << (rng() % 16))));
  }
  vals.push_back(65535);
  buf.clear();
  {
    BitWriter w(&buf);
    for (uint32_t v : vals) w.Gamma(v);
  }
  BitReader r(buf);
  for (uint32_t v : vals) EXPECT_EQ(r.Gamma(16), v);
  EXPECT_TRUE(r.ok());
}

TEST(BitIoTest, GammaRejectsLongAndTruncated) {
  std::vector<uint8_t> buf;
  {
    BitWriter w(&buf);
    w.Gamma(256);  // 9 significant bits
  }
  BitReader r(buf);
  r.Gamma(8);
  EXPECT_FALSE(r.ok());
  std::vector<uint8_t> zeros(8, 0);
  BitReader z(zeros);
  EXPECT_EQ(z.Gamma(32), 0u);
  EXPECT_FALSE(z.ok());
  BitReader e(std::span<const uint8_t>{});
  e.Gamma(8);
  EXPECT_FALSE(e.ok());
}

}  // namespace
}  // namespace refit::codec
