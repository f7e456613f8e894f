#include "base/bytes.h"

#include <gtest/gtest.h>

#include "support/status_matchers.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

TEST(BytesTest, RoundTrip) {
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  w.U8(7);
  w.U16(0xBEEF);
  w.U32(0xDEADBEEF);
  w.U64(0x0123456789ABCDEFull);
  for (uint64_t v : {0ull, 1ull, 127ull, 128ull, 300ull, ~0ull}) w.Varint(v);
  w.String("hello");
  ByteReader r(buf);
  EXPECT_EQ(r.U8(), 7);
  EXPECT_EQ(r.U16(), 0xBEEF);
  EXPECT_EQ(r.U32(), 0xDEADBEEFu);
  EXPECT_EQ(r.U64(), 0x0123456789ABCDEFull);
  for (uint64_t v : {0ull, 1ull, 127ull, 128ull, 300ull, ~0ull}) {
    EXPECT_EQ(r.Varint(), v);
  }
  EXPECT_EQ(r.String(16), "hello");
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.remaining(), 0u);
}

TEST(BytesTest, TruncationLatches) {
  std::vector<uint8_t> buf = {1, 2, 3};
  ByteReader r(buf);
  EXPECT_EQ(r.U32(), 0u);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.U8(), 0u);  // stays failed
  EXPECT_THAT(r.status("header"), StatusIs(StatusCode::kDataLoss));
}

TEST(BytesTest, VarintRejectsOverlong) {
  std::vector<uint8_t> buf(11, 0xff);
  ByteReader r(buf);
  r.Varint();
  EXPECT_FALSE(r.ok());
  std::vector<uint8_t> big = {0xff, 0xff, 0xff, 0xff, 0xff,
                              0xff, 0xff, 0xff, 0xff, 0x02};
  ByteReader r2(big);
  r2.Varint();
  EXPECT_FALSE(r2.ok());
}

TEST(BytesTest, StringLimit) {
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  w.String("toolong");
  ByteReader r(buf);
  r.String(3);
  EXPECT_FALSE(r.ok());
}

TEST(BytesTest, OverflowSafeArithmetic) {
  EXPECT_TRUE(AddWithin(5, 5, 10));
  EXPECT_FALSE(AddWithin(5, 6, 10));
  EXPECT_FALSE(AddWithin(~0ull, 2, ~0ull));
  uint64_t out;
  EXPECT_FALSE(MulChecked(1ull << 40, 1ull << 40, &out));
  EXPECT_TRUE(MulChecked(3, 5, &out));
  EXPECT_EQ(out, 15u);
}

}  // namespace
}  // namespace refit
