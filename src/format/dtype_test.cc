#include "format/dtype.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

TEST(FormatDTypeTest, SpecDTypesRoundTripWithWidths) {
  const std::pair<const char*, int> kExpected[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
  };
  ASSERT_EQ(std::size(kExpected), static_cast<size_t>(kNumDTypes));
  DTypeRegistry registry;
  for (const auto& [name, width] : kExpected) {
    std::optional<DType> d = ParseDType(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_EQ(DTypeName(*d), name);
    EXPECT_EQ(DTypeWidth(*d), width) << name;
    Result<int> w = registry.ElementWidth(name);
    ASSERT_OK(w);
    EXPECT_EQ(*w, width);
  }
  EXPECT_FALSE(ParseDType("bf16").has_value());  // the spec is case-sensitive
  EXPECT_FALSE(ParseDType("").has_value());
}

TEST(FormatDTypeTest, BuiltinExtras) {
  DTypeRegistry registry;
  EXPECT_EQ(*registry.ElementWidth("F8_E8M0"), 1);
  EXPECT_EQ(*registry.ElementWidth("F8_E4M3FNUZ"), 1);
  EXPECT_EQ(*registry.ElementWidth("F8_E5M2FNUZ"), 1);
  EXPECT_EQ(*registry.ElementWidth("C64"), 8);
  for (const char* name : {"C128", "F4", "F6_E2M3", "F6_E3M2"}) {
    Result<int> w = registry.ElementWidth(name);
    EXPECT_THAT(w, StatusIs(StatusCode::kUnimplemented)) << name;
    EXPECT_NE(w.status().message().find(name), std::string_view::npos);
  }
}

TEST(FormatDTypeTest, UnknownDTypeNeedsDeclaredWidth) {
  DTypeRegistry registry;
  Result<int> w = registry.ElementWidth("MY_F12");
  ASSERT_THAT(w, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(w.status().message().find("MY_F12"), std::string_view::npos);
  EXPECT_NE(w.status().message().find("--dtype-width MY_F12="),
            std::string_view::npos);

  ASSERT_OK(registry.RegisterFlag("MY_F12=2"));
  EXPECT_EQ(*registry.ElementWidth("MY_F12"), 2);
  ASSERT_OK(registry.Register("MY_F12", 4));  // redeclaring replaces
  EXPECT_EQ(*registry.ElementWidth("MY_F12"), 4);
}

TEST(FormatDTypeTest, RegisterRejectsBadDeclarations) {
  DTypeRegistry registry;
  const std::vector<std::pair<std::string, int>> refused = {
      {"X", 3},
      {"X", 16},
      {"X", 0},
      {"", 2},
      {"A=B", 2},
      // Built-ins keep their widths; restating the same width is harmless.
      {"BF16", 4},
      {"C128", 8}};
  for (const auto& [name, width] : refused) {
    EXPECT_THAT(registry.Register(name, width),
                StatusIs(StatusCode::kInvalidArgument))
        << name << " " << width;
  }
  EXPECT_OK(registry.Register("BF16", 2));
  for (const char* flag : {"X", "X=", "=2", "X=2x", "X=-1", "X=99999999999"}) {
    EXPECT_THAT(registry.RegisterFlag(flag),
                StatusIs(StatusCode::kInvalidArgument))
        << flag;
  }
  EXPECT_THAT(registry.ElementWidth("X"),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(FormatDTypeTest, HugeUnknownNameGivesShortMessage) {
  DTypeRegistry registry;
  std::string name(1 << 20, 'Q');
  Result<int> w = registry.ElementWidth(name);
  ASSERT_THAT(w, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_LT(w.status().message().size(), 1000u);
}

}  // namespace
}  // namespace refit
