// Test support: a private moto_server (https://github.com/getmoto/moto) on
// 127.0.0.1 for tests of the S3 store. Linked into test binaries only.
//
// The server runs in its own process group, is killed with that group when
// the MotoServer is destroyed, and dies with the test process
// (PR_SET_PDEATHSIG) even when the test crashes, so no server outlives it.
#ifndef REFIT_TESTS_SUPPORT_MOTO_TESTING_H_
#define REFIT_TESTS_SUPPORT_MOTO_TESTING_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "transport/object_store.h"

namespace refit::testing {

class MotoServer {
 public:
  // The bucket Start() creates.
  static constexpr const char* kBucket = "refit-test";

  // Starts moto_server on a free port, waits (at most ~60 s) until it
  // answers and creates kBucket. kNotFound when moto_server is not on PATH.
  static Result<std::unique_ptr<MotoServer>> Start();
  ~MotoServer();

  const std::string& endpoint() const { return endpoint_; }
  // Options that reach this server (fake credentials, us-east-1).
  StoreOptions Options() const;
  // The server's output so far, one line per request served.
  std::string Log() const;
  // Whether conditional creates (PutIfAbsent) are atomic, as on S3: true
  // when the server runs behind the serial launcher, false when plain
  // moto_server serves (its check and write can interleave).
  bool atomic_creates() const { return atomic_creates_; }

 private:
  MotoServer() = default;
  // Starts argv (moto_server, or python3 -c launcher) on a free port;
  // *exited tells a server that quit during start-up from a slow one.
  static Result<std::unique_ptr<MotoServer>> Launch(
      std::vector<std::string> argv, bool* exited);
  void Stop();

  pid_t pid_ = -1;
  std::string endpoint_;
  std::string log_path_;
  bool atomic_creates_ = false;
};

}  // namespace refit::testing

#endif  // REFIT_TESTS_SUPPORT_MOTO_TESTING_H_
