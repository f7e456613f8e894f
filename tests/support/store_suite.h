// The ObjectStore contract (transport/object_store.h) as one test suite,
// run by every backend: "dir" (a directory store), "s3" (the S3 store
// against a private moto_server; skipped, loudly, when moto_server is not
// on PATH) and "relay" (one relay tree endpoint, the root, on loopback).
// A test binary runs it on the backends it names:
//
//   INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values("dir",
//   "s3"),
//                            ::refit::testing::StoreBackendName);
//
// and links the refit_store_suite object library. Test-only.
#ifndef REFIT_TESTS_SUPPORT_STORE_SUITE_H_
#define REFIT_TESTS_SUPPORT_STORE_SUITE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "support/moto_testing.h"
#include "support/testing.h"
#include "transport/object_store.h"

namespace refit::testing {

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr uint64_t kPartSize = 5 << 20;  // S3's (and moto's) minimum

  static void TearDownTestSuite();
  void SetUp() override;

  // A fresh store object on this test's namespace (each call on the same
  // data, as another process would see it; for the relay, another handle
  // on the same endpoint).
  Result<std::unique_ptr<ObjectStore>> NewStore();

  static std::unique_ptr<MotoServer> moto_;
  TempDir dir_;
  std::shared_ptr<ObjectStore> relay_;  // the "relay" backend's endpoint
  std::unique_ptr<ObjectStore> store_;
};

// The test name suffix of a backend: its name.
std::string StoreBackendName(const ::testing::TestParamInfo<std::string>& info);

}  // namespace refit::testing

#endif  // REFIT_TESTS_SUPPORT_STORE_SUITE_H_
