// Helpers for tests: fixture lookup and scratch directories.
#ifndef REFIT_TESTS_SUPPORT_TESTING_H_
#define REFIT_TESTS_SUPPORT_TESTING_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace refit::testing {

// The qwen2-tiny fixture folder (REFIT_FIXTURES_DIR, set by ctest), or ""
// when it is absent.
std::string FixturesDir();

// Skips the calling test, loudly, when the fixtures are absent.
#define REFIT_REQUIRE_FIXTURES()                                    \
  do {                                                              \
    if (::refit::testing::FixturesDir().empty())                    \
      GTEST_SKIP() << "fixtures not found: set REFIT_FIXTURES_DIR"; \
  } while (0)

// A fresh directory under $TMPDIR, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void WriteBytes(const std::string& path, const std::vector<uint8_t>& data);
std::vector<uint8_t> ReadBytes(const std::string& path);

}  // namespace refit::testing

#define ASSERT_OK(expr)                                     \
  do {                                                      \
    ::refit::Status s_ = ::refit::internal::ToStatus(expr); \
    ASSERT_TRUE(s_.ok()) << s_.ToString();                  \
  } while (0)
#define EXPECT_OK(expr)                                     \
  do {                                                      \
    ::refit::Status s_ = ::refit::internal::ToStatus(expr); \
    EXPECT_TRUE(s_.ok()) << s_.ToString();                  \
  } while (0)

#endif  // REFIT_TESTS_SUPPORT_TESTING_H_
