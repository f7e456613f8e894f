// Helpers for tests that drive the built `refit` binary as processes
// (REFIT_CLI_PATH): spawning and reaping, reading their output, and small
// synthetic checkpoints that step like training does. Test-only; included
// by one test file each, so everything here is inline.
#ifndef REFIT_TESTS_CLI_PROCESS_H_
#define REFIT_TESTS_CLI_PROCESS_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/process.h"
#include "refit/checkpoint.h"
#include "support/safetensors_builder.h"
#include "support/testing.h"
#include "sync/auth.h"

#ifndef REFIT_CLI_PATH
#error "REFIT_CLI_PATH must name the refit binary"
#endif

namespace refit::testing {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A child process running `refit ARGS`, stdout and stderr appended to files.
class Proc {
 public:
  Proc() = default;
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;
  ~Proc() { Kill(); }

  void Start(const std::vector<std::string>& args, const std::string& out,
             const std::string& err, const std::string& crash_at = "") {
    ASSERT_LE(pid_, 0) << "already running";
    std::vector<std::string> all = {REFIT_CLI_PATH};
    all.insert(all.end(), args.begin(), args.end());
    Result<pid_t> pid = SpawnLogged(all, out, err, crash_at);
    ASSERT_TRUE(pid.ok()) << pid.status().ToString();
    pid_ = *pid;
    status_.reset();
    started_ = Clock::now();
  }

  bool running() {
    Poll();
    return pid_ > 0;
  }
  // The wait status once ended.
  std::optional<int> status() {
    Poll();
    return status_;
  }
  bool killed_by_signal() {
    Poll();
    return status_ && WIFSIGNALED(*status_);
  }
  // The exit code, or -1 when killed or still running.
  int exit_code() {
    Poll();
    return status_ && WIFEXITED(*status_) ? WEXITSTATUS(*status_) : -1;
  }
  // SIGKILLs the process and reaps it, so status() is known at once.
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
      status_ = st;
      pid_ = -1;
    }
  }
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  // Waits up to `seconds` for the end; kills on timeout (and returns false).
  bool Wait(double seconds) {
    auto t0 = Clock::now();
    while (running()) {
      if (SecondsSince(t0) > seconds) {
        Kill();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
  double seconds_since_start() const { return SecondsSince(started_); }

 private:
  void Poll() {
    if (pid_ <= 0) return;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = st;
      pid_ = -1;
    }
  }
  pid_t pid_ = -1;
  std::optional<int> status_;
  Clock::time_point started_;
};

inline std::string ReadText(const std::string& path) {
  std::vector<uint8_t> b = ReadBytes(path);
  return std::string(b.begin(), b.end());
}

inline std::vector<Json> JsonLines(const std::string& path) {
  std::vector<Json> out;
  std::string text = ReadText(path);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    Json j = Json::parse(text.substr(pos, nl - pos), nullptr, false);
    if (!j.is_discarded() && j.is_object()) out.push_back(j);
    pos = nl + 1;
  }
  return out;
}

inline std::string Tail(const std::string& path, size_t n = 2000) {
  std::string t = ReadText(path);
  return t.size() > n ? t.substr(t.size() - n) : t;
}

// A TCP port on 127.0.0.1 that was free a moment ago.
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

using Tensor = TestTensor;

// About 1.3 MB times `scale`: sparse changes in the BF16 weights (sparse
// XOR chunks), dense ones in the F32 scale (dense chunks).
inline std::vector<Tensor> BaseModel(uint64_t scale) {
  std::mt19937_64 rng(42);
  auto make = [&](std::string name, std::string dtype, int width,
                  std::vector<uint64_t> shape) {
    Tensor t{std::move(name), std::move(dtype), std::move(shape), {}};
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    t.data.resize(n * static_cast<uint64_t>(width));
    for (uint8_t& b : t.data) b = static_cast<uint8_t>(rng());
    return t;
  };
  return {make("a.weight", "BF16", 2, {512 * scale, 1024}),
          make("b.weight", "BF16", 2, {128 * scale, 1024}),
          make("c.bias", "BF16", 2, {1000}),
          make("d.scale", "F32", 4, {8192 * scale})};
}

inline std::vector<Tensor> NextVersion(std::vector<Tensor> m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (Tensor& t : m) {
    const bool f32 = t.dtype == "F32";  // the other tensors are BF16
    const double rate = f32 ? 0.5 : 0.02;
    for (size_t i = 0; i < t.data.size(); i += f32 ? 4 : 2) {
      if (u(rng) < rate) t.data[i] ^= static_cast<uint8_t>(1 + rng() % 7);
    }
  }
  return m;
}

using Digests = std::map<std::string, Sha256>;

inline Digests TensorDigests(const std::string& path) {
  Digests d;
  auto ck = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
  if (!ck.ok()) return d;
  for (size_t i = 0; i < ck->tensors().size(); ++i) {
    d[ck->tensors()[i].name] = ComputeSha256(ck->Data(i));
  }
  return d;
}

}  // namespace refit::testing

#endif  // REFIT_TESTS_CLI_PROCESS_H_
