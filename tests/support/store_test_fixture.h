// A test fixture parameterized over the two kinds of object store the
// protocol runs on: "dir" (a directory) and "s3" (an S3-compatible store: a
// moto_server the suite starts on 127.0.0.1). Test-only.
#ifndef REFIT_TESTS_SUPPORT_STORE_TEST_FIXTURE_H_
#define REFIT_TESTS_SUPPORT_STORE_TEST_FIXTURE_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "support/moto_testing.h"
#include "support/testing.h"
#include "transport/object_store.h"

namespace refit::testing {

class AnyStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    auto moto = MotoServer::Start();
    if (moto.ok()) moto_ = std::move(*moto).release();
  }
  static void TearDownTestSuite() {
    delete moto_;
    moto_ = nullptr;
  }

  // An S3 test whose moto_server could not be started (SetUp skips it).
  bool S3Missing() const { return GetParam() == "s3" && moto_ == nullptr; }

  // A fresh, empty store of this test's kind; `tag` names it.
  std::unique_ptr<ObjectStore> NewStore(const std::string& tag) {
    static int counter = 0;
    const std::string name = tag + std::to_string(++counter);
    auto s =
        GetParam() == "s3"
            ? OpenObjectStore(std::string("s3://") + MotoServer::kBucket + "/" +
                                  std::to_string(getpid()) + "-" + name,
                              moto_->Options())
            : OpenObjectStore(dir_.File(name));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  int PollMs() const { return GetParam() == "s3" ? 10 : 2; }

  inline static MotoServer* moto_ = nullptr;
  TempDir dir_;
};

}  // namespace refit::testing

#endif  // REFIT_TESTS_SUPPORT_STORE_TEST_FIXTURE_H_
