// GoogleMock matchers for Status and Result<T> (include/refit/status.h):
//
//   EXPECT_THAT(store->Get("nope"), StatusIs(StatusCode::kNotFound));
//   ASSERT_THAT(Receiver::Open(store, options), IsOk());
//
// Both accept a Status or any Result<T>; a mismatch prints the status that
// was there ("DATA_LOSS: message"), so tests need not stream ToString()
// themselves. Test-only.
#ifndef REFIT_TESTS_SUPPORT_STATUS_MATCHERS_H_
#define REFIT_TESTS_SUPPORT_STATUS_MATCHERS_H_

#include <gmock/gmock.h>

#include <ostream>

#include "refit/status.h"

namespace refit {

// How GoogleTest prints a Status or Result in a failure message.
inline void PrintTo(const Status& s, std::ostream* os) { *os << s.ToString(); }
template <typename T>
void PrintTo(const Result<T>& r, std::ostream* os) {
  *os << (r.ok() ? std::string("a value") : r.status().ToString());
}

namespace testing {

// The matcher behind StatusIs and IsOk.
class StatusIsMatcher {
 public:
  explicit StatusIsMatcher(StatusCode code) : code_(code) {}

  template <typename T>
  bool MatchAndExplain(const T& value,
                       ::testing::MatchResultListener* listener) const {
    const Status s = ::refit::internal::ToStatus(value);
    *listener << "which is " << s.ToString();
    return s.code() == code_;
  }
  void DescribeTo(std::ostream* os) const {
    *os << "has status " << StatusCodeName(code_);
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not have status " << StatusCodeName(code_);
  }

 private:
  StatusCode code_;
};

// Matches a Status, or a Result's status, whose code is `code`.
inline ::testing::PolymorphicMatcher<StatusIsMatcher> StatusIs(
    StatusCode code) {
  return ::testing::MakePolymorphicMatcher(StatusIsMatcher(code));
}

// Matches an OK Status, or a Result that holds a value.
inline ::testing::PolymorphicMatcher<StatusIsMatcher> IsOk() {
  return StatusIs(StatusCode::kOk);
}

}  // namespace testing
}  // namespace refit

#endif  // REFIT_TESTS_SUPPORT_STATUS_MATCHERS_H_
