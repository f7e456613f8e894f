// Helpers shared by the relay tree tests (plaintext and TLS): payloads,
// bounded waits, the protocol's keys, fast liveness options, and raw
// sockets to play a misbehaving peer. Test-only, so everything is inline.
#ifndef REFIT_TESTS_SUPPORT_RELAY_TESTING_H_
#define REFIT_TESTS_SUPPORT_RELAY_TESTING_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/testing.h"
#include "transport/relay_store.h"

namespace refit::relay_testing {

using Clock = std::chrono::steady_clock;

inline std::vector<uint8_t> Bytes(std::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

inline int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t)
      .count();
}

// Polls `pred` every 2 ms for up to `ms`.
inline bool WaitFor(const std::function<bool()>& pred, int ms = 10000) {
  const auto start = Clock::now();
  while (!pred()) {
    if (MsSince(start) > ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// v/<V>/<rest>, as the protocol names a version's objects.
inline std::string Key(uint64_t version, const std::string& rest) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "v/%020llu/",
                static_cast<unsigned long long>(version));
  return buf + rest;
}

inline std::string IndexKeyOf(uint64_t version) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "index/%020llu",
                static_cast<unsigned long long>(version));
  return buf;
}

// The protocol's key layout as these tests write it (the transport does
// not link the protocol, whose classifier is sync/relay_tree.h):
// "v/<V>/vote/..." and "v/<V>/request/..." flow up; v/<V>/... and
// index/<V> belong to version V.
class TestKeys final : public RelayKeyClassifier {
 public:
  bool IsUpward(std::string_view key) const override {
    if (!key.starts_with("v/")) return false;
    const size_t slash = key.find('/', 2);
    if (slash == std::string_view::npos) return false;
    std::string_view rest = key.substr(slash + 1);
    return rest.starts_with("vote/") || rest.starts_with("request/");
  }
  std::optional<uint64_t> VersionOf(std::string_view key) const override {
    std::string_view digits;
    if (key.starts_with("v/")) {
      digits = key.substr(2);
      digits = digits.substr(0, digits.find('/'));
    } else if (key.starts_with("index/")) {
      digits = key.substr(6);
    } else {
      return std::nullopt;
    }
    if (digits.empty() || digits.size() > 20) return std::nullopt;
    uint64_t v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return std::nullopt;
      const uint64_t d = static_cast<uint64_t>(c - '0');
      if (v > (UINT64_MAX - d) / 10) return std::nullopt;
      v = v * 10 + d;
    }
    return v;
  }
};

// Liveness in tens of milliseconds, so dead peers are found quickly. With
// REFIT_RELAY_TEST_LOG set, endpoints log their link errors to stderr.
inline RelayOptions Fast() {
  RelayOptions o;
  o.keys = std::make_shared<TestKeys>();
  o.heartbeat_ms = 50;
  o.dead_after_ms = 400;
  o.reconnect_min_ms = 10;
  o.reconnect_max_ms = 100;
  o.log_to_stderr = std::getenv("REFIT_RELAY_TEST_LOG") != nullptr;
  return o;
}

inline uint16_t PortOf(const std::string& address) {
  return static_cast<uint16_t>(
      std::stoi(address.substr(address.rfind(':') + 1)));
}

// A TCP connection to 127.0.0.1:<port of address>; -1 when refused.
inline int ConnectRaw(const std::string& address) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(PortOf(address));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline void SendRaw(int fd, const std::vector<uint8_t>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n =
        ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;  // the peer closed: the test checks that separately
    done += static_cast<size_t>(n);
  }
}

// Drains `fd` until the peer closes it (true) or `ms` pass (false).
inline bool WaitClosedRaw(int fd, int ms) {
  const auto start = Clock::now();
  uint8_t buf[4096];
  while (MsSince(start) < ms) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
  return false;
}

// root -> mid -> {slow, quick}, every endpoint with child queues of
// `bound` bytes and `opts(name)` otherwise; "slow" reads each frame 5 ms
// late. The root puts 200 objects of `object` bytes (far above the bound)
// and every queue must stay within the bound plus one object: beyond the
// bound mid stops reading from the root, so the root's queue for mid fills
// and the root's Put waits. The four endpoints are left in `tree` (quick,
// slow, mid, root) for further checks.
inline void CheckSlowChildQueueBound(
    const std::function<RelayOptions(const std::string&)>& opts, uint64_t bound,
    size_t object, std::vector<std::unique_ptr<RelayStore>>* tree) {
  auto options = [&](const std::string& name) {
    RelayOptions o = opts(name);
    o.child_queue_bytes = bound;
    return o;
  };
  auto root = RelayStore::Root("127.0.0.1:0", options("root"));
  ASSERT_OK(root);
  auto mid = RelayStore::Node("mid", (*root)->listen_address(), "127.0.0.1:0",
                              options("mid"));
  ASSERT_OK(mid);
  RelayOptions slow_opts = options("slow");
  slow_opts.test_read_delay_ms = 5;
  auto slow = RelayStore::Node("slow", (*mid)->listen_address(), "", slow_opts);
  auto quick =
      RelayStore::Node("quick", (*mid)->listen_address(), "", options("quick"));
  ASSERT_OK(slow);
  ASSERT_OK(quick);
  ASSERT_TRUE(WaitFor([&] { return (*mid)->status().children == 2; }));
  constexpr int kObjects = 200;
  for (int i = 0; i < kObjects; ++i) {
    ASSERT_OK((*root)->Put(Key(1, "chunk/" + std::to_string(i)),
                           RandomBytes(object, 3)));
  }
  const std::string last = Key(1, "chunk/" + std::to_string(kObjects - 1));
  ASSERT_TRUE(WaitFor(
      [&] { return (*quick)->Get(last).ok() && (*slow)->Get(last).ok(); },
      30000));
  EXPECT_LE((*mid)->status().max_child_queue_bytes, bound + object);
  EXPECT_LE((*root)->status().max_child_queue_bytes, bound + object);
  EXPECT_TRUE(*(*slow)->Get(Key(1, "chunk/17")) == RandomBytes(object, 3));
  // Leaves first (the vector is destroyed first element to last): no
  // endpoint should outlive its parent.
  tree->push_back(std::move(*quick));
  tree->push_back(std::move(*slow));
  tree->push_back(std::move(*mid));
  tree->push_back(std::move(*root));
}

}  // namespace refit::relay_testing

#endif  // REFIT_TESTS_SUPPORT_RELAY_TESTING_H_
