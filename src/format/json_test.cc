#include "format/json.h"

#include <gtest/gtest.h>

#include <ctime>
#include <string>

#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit::internal {
namespace {

using ::refit::testing::StatusIs;

Status Parse(std::string_view text, int max_depth = 8) {
  return ParseJsonStrict(text, max_depth, "test").status();
}

void ExpectRejected(std::string_view text, std::string_view fragment,
                    int max_depth = 8) {
  Status s = Parse(text, max_depth);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(s.message().find(fragment), std::string_view::npos)
      << "message: " << s.message() << "\nexpected fragment: " << fragment;
}

TEST(FormatJsonTest, BuildsTheValue) {
  Result<nlohmann::json> j = ParseJsonStrict(
      R"( {"b":[1,-2,3.5,"s",null,true,{}],"a":{"x":18446744073709551615}} )",
      8, "test");
  ASSERT_OK(j);
  EXPECT_EQ(j->size(), 2u);
  const nlohmann::json& b = (*j)["b"];
  ASSERT_EQ(b.size(), 7u);
  EXPECT_TRUE(b[0].is_number_unsigned());
  EXPECT_TRUE(b[1].is_number_integer() && !b[1].is_number_unsigned());
  EXPECT_TRUE(b[2].is_number_float());
  EXPECT_EQ(b[3], "s");
  EXPECT_TRUE(b[4].is_null());
  EXPECT_EQ(b[5], true);
  EXPECT_TRUE(b[6].is_object() && b[6].empty());
  EXPECT_EQ((*j)["a"]["x"].get<uint64_t>(), UINT64_MAX);
  Result<nlohmann::json> scalar = ParseJsonStrict("7", 1, "test");
  ASSERT_OK(scalar);
  EXPECT_EQ(*scalar, 7);
}

TEST(FormatJsonTest, RejectsDuplicateKeysAtEveryDepth) {
  ExpectRejected(R"({"a":1,"a":2})", "duplicate key 'a'");
  ExpectRejected(R"({"a":{"k":1,"j":2,"k":3}})", "duplicate key 'k'");
  ExpectRejected(R"([{"a":1},{"b":1,"b":2}])", "duplicate key 'b'");
  EXPECT_OK(Parse(R"({"a":{"a":{"a":1}},"b":{"a":1},"c":[{"a":1},{"a":2}]})"));
}

TEST(FormatJsonTest, RejectsDeepNesting) {
  EXPECT_OK(Parse("[[[]]]", 3));
  ExpectRejected("[[[[]]]]", "nesting deeper than 3", 3);
  ExpectRejected(R"({"a":{"b":{"c":{}}}})", "nesting deeper than 3", 3);
  ExpectRejected(std::string(100000, '['), "nesting deeper");
}

TEST(FormatJsonTest, RejectsMalformedInput) {
  ExpectRejected("", "invalid JSON");
  ExpectRejected("{} x", "invalid JSON");
  ExpectRejected("{\"\xff\":1}", "invalid JSON");
  ExpectRejected("{\"a\":1,}", "invalid JSON");
  // nlohmann's lexer ends the input at a NUL byte, which would silently drop
  // whatever follows it.
  ExpectRejected(std::string_view("{}\0garbage", 10), "NUL byte at offset 2");
  ExpectRejected(std::string_view("{\"a\":\"\0\"}", 9), "invalid JSON");
}

// An object with one member per tensor is what a checkpoint header is; a
// parse that is quadratic in the member count takes minutes at this size.
TEST(FormatJsonTest, LargeObjectParsesInLinearTime) {
  constexpr int kMembers = 100'000;
  std::string text = "{";
  for (int i = 0; i < kMembers; ++i) {
    if (i > 0) text += ',';
    text += "\"model.layers." + std::to_string(i) +
            ".weight\":{\"dtype\":\"BF16\",\"shape\":[4,8],"
            "\"data_offsets\":[0,64]}";
  }
  text += '}';
  // CPU time of this (single-threaded) process, so a loaded machine does not
  // make the test flaky.
  std::clock_t start = std::clock();
  Result<nlohmann::json> j = ParseJsonStrict(text, 3, "test");
  double seconds =
      static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
  ASSERT_OK(j);
  EXPECT_EQ(j->size(), static_cast<size_t>(kMembers));
  // About 0.3 s of CPU on a 2-core dev box; the bound leaves room for
  // sanitizer builds, and the quadratic parse this replaced took minutes.
  EXPECT_LT(seconds, 10.0);
  // The duplicate check still covers every member.
  text.back() = ',';
  text += "\"model.layers.77.weight\":{}}";
  ExpectRejected(text, "duplicate key 'model.layers.77.weight'", 3);
}

}  // namespace
}  // namespace refit::internal
