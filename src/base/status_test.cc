#include "refit/status.h"

#include <gtest/gtest.h>

namespace refit {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  REFIT_ASSIGN_OR_RETURN(int h, Half(x));
  REFIT_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status Check(int x) {
  REFIT_RETURN_IF_ERROR(Half(x));
  return Status();
}

TEST(StatusTest, OkIsDefaultAndCheap) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(sizeof(Status), sizeof(void*));
}

TEST(StatusTest, ErrorCarriesCodeAndContext) {
  Status s = DataLossError("chunk 3 truncated").WithContext("delta.rfd");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.ToString(), "DATA_LOSS: delta.rfd: chunk 3 truncated");
  Status copy = s;
  EXPECT_EQ(copy, s);
}

TEST(StatusTest, MacrosPropagate) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Check(2).ok());
  EXPECT_FALSE(Check(3).ok());
}

TEST(StatusTest, ResultFromOkStatusIsInternalError) {
  Result<int> r{Status()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace refit
