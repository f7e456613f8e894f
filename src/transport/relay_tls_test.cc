// Relay links over TLS (RelayOptions::tls) on loopback: a throwaway CA and
// leaf certificates are made at test time with OpenSSL's C API (EC P-256
// keys, X509 builder) in a temporary directory. A TLS tree delivers objects
// and votes bit-exactly; a certificate from another CA, a plaintext peer
// (either way round), garbage and a silent peer on a TLS port, and a
// tampered TLS stream are refused in bounded time; a silent TLS link is
// declared dead; flow control bounds queues; a killed node reconnects and
// gets its replay over TLS; name pinning works both ways. Also a
// throughput comparison with plaintext links (REFIT_RELAY_TLS_BENCH_MIB
// sets its size; 64 MiB by default). Every wait is bounded. With
// REFIT_RELAY_TEST_LOG set, endpoints log their link errors to stderr.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "support/relay_testing.h"
#include "support/status_matchers.h"
#include "support/testing.h"
#include "support/tls_testing.h"
#include "transport/relay_frame.h"
#include "transport/relay_store.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using namespace relay_testing;  // NOLINT(build/namespaces)
using namespace tls_testing;  // NOLINT(build/namespaces)
using internal::RelayFrameType;

bool Contains(const Status& s, std::string_view what) {
  return s.message().find(what) != std::string_view::npos;
}

RelayOptions FastTls(RelayTlsOptions tls) {
  RelayOptions o = Fast();
  o.tls = std::move(tls);
  return o;
}

// ---- Raw sockets ----

int ListenRaw(std::string* address) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  EXPECT_EQ(::listen(fd, 8), 0);
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *address = "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  return fd;
}

int AcceptRaw(int listener, int ms) {
  pollfd p{listener, POLLIN, 0};
  if (::poll(&p, 1, ms) <= 0) return -1;
  return ::accept(listener, nullptr, nullptr);
}

// A TCP proxy in front of `target` that meddles with its first connection
// at offset `at` of the downstream (target -> client) bytes: kFlip flips
// one bit there, kStall forwards nothing more either way (both ends see
// silence). Later connections pass unchanged.
class TamperingProxy {
 public:
  enum class Mode { kFlip, kStall };
  TamperingProxy(std::string target, size_t at, Mode mode = Mode::kFlip)
      : target_(std::move(target)), at_(at), mode_(mode) {
    listener_ = ListenRaw(&address_);
    thread_ = std::thread([this] { Run(); });
  }
  ~TamperingProxy() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  const std::string& address() const { return address_; }
  int connections() const { return connections_; }

 private:
  void Run() {
    struct Pair {
      int client, server;
      size_t down = 0;
      bool tamper;
    };
    std::vector<Pair> pairs;
    while (!stop_) {
      std::vector<pollfd> fds;
      fds.push_back({listener_, POLLIN, 0});
      for (const Pair& p : pairs) {
        fds.push_back({p.client, POLLIN, 0});
        fds.push_back({p.server, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        int c = ::accept(listener_, nullptr, nullptr);
        int s = ConnectRaw(target_);
        if (c >= 0 && s >= 0) {
          pairs.push_back({c, s, 0, connections_ == 0});
          ++connections_;
        } else {
          if (c >= 0) ::close(c);
          if (s >= 0) ::close(s);
        }
        continue;  // fds no longer match pairs
      }
      std::vector<size_t> dead;
      for (size_t i = 0; i < pairs.size(); ++i) {
        Pair& p = pairs[i];
        for (int dir = 0; dir < 2; ++dir) {
          const pollfd& f = fds[1 + 2 * i + static_cast<size_t>(dir)];
          if (!(f.revents & (POLLIN | POLLHUP | POLLERR))) continue;
          uint8_t buf[16384];
          ssize_t n = ::recv(f.fd, buf, sizeof buf, 0);
          if (n <= 0) {
            dead.push_back(i);
            break;
          }
          const size_t got = static_cast<size_t>(n);
          if (dir == 1) {  // server -> client
            if (p.tamper && mode_ == Mode::kFlip && p.down <= at_ &&
                at_ < p.down + got) {
              buf[at_ - p.down] ^= 0x20;
            }
            p.down += got;
          }
          if (p.tamper && mode_ == Mode::kStall && p.down > at_) continue;
          SendRaw(dir == 0 ? p.server : p.client,
                  std::vector<uint8_t>(buf, buf + got));
        }
      }
      for (auto it = dead.rbegin(); it != dead.rend(); ++it) {
        ::close(pairs[*it].client);
        ::close(pairs[*it].server);
        pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(*it));
      }
    }
    for (const Pair& p : pairs) {
      ::close(p.client);
      ::close(p.server);
    }
  }

  std::string target_;
  size_t at_;
  Mode mode_;
  std::string address_;
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

class RelayTlsTest : public ::testing::Test {
 protected:
  RelayTlsTest() : ca_(dir_, "tree"), other_(dir_, "other") {}
  testing::TempDir dir_;
  TestCa ca_;
  TestCa other_;
};

// ---- Tests ----

TEST_F(RelayTlsTest, TreeDeliversObjectsAndVotesBitExactly) {
  // root <- n0, n1;  n0 <- n2.  Every certificate names its member and
  // 127.0.0.1, so both name checks are on.
  RelayOptions root_opts = FastTls(ca_.Issue("root", "DNS:root,IP:127.0.0.1"));
  root_opts.tls.child_names_are_members = true;
  auto root = RelayStore::Root("127.0.0.1:0", root_opts);
  ASSERT_OK(root);
  std::mutex mu;
  std::map<std::string, std::vector<std::string>> arrivals;
  std::vector<std::unique_ptr<RelayStore>> nodes;
  const std::vector<int> parents = {-1, -1, 0};
  for (int i = 0; i < 3; ++i) {
    const std::string member = "n" + std::to_string(i);
    RelayOptions o =
        FastTls(ca_.Issue(member, "DNS:" + member + ",IP:127.0.0.1"));
    o.tls.parent_name = "127.0.0.1";
    o.tls.child_names_are_members = true;
    o.on_arrival = [&mu, &arrivals, member](const std::string& key) {
      std::lock_guard<std::mutex> lock(mu);
      arrivals[member].push_back(key);
    };
    const std::string parent =
        parents[static_cast<size_t>(i)] < 0
            ? (*root)->listen_address()
            : nodes[static_cast<size_t>(parents[static_cast<size_t>(i)])]
                  ->listen_address();
    auto node =
        RelayStore::Node(member, parent, i == 0 ? "127.0.0.1:0" : "", o);
    ASSERT_OK(node);
    nodes.push_back(std::move(*node));
  }
  ASSERT_TRUE(WaitFor([&] {
    return (*root)->status().children == 2 && nodes[0]->status().children == 1;
  }));
  std::vector<std::string> keys;
  std::map<std::string, std::vector<uint8_t>> data;
  for (int i = 0; i < 12; ++i) {
    // Empty, small (one gathered record), over 16 KiB, over one read piece.
    const size_t n = i == 0 ? 0 : i == 5 ? (3u << 19) : size_t{1} << (i + 4);
    const std::string key = Key(1, "chunk/" + std::to_string(i));
    data[key] = RandomBytes(n, static_cast<uint64_t>(i));
    ASSERT_OK((*root)->Put(key, data[key]));
    keys.push_back(key);
  }
  const std::string decision = Key(1, "decision");
  ASSERT_OK((*root)->PutIfAbsent(decision, Bytes("commit")));
  data[decision] = Bytes("commit");
  keys.push_back(decision);
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < 3; ++i) {
      if (arrivals["n" + std::to_string(i)].size() < keys.size()) return false;
    }
    return true;
  })) << "not every node received every object";
  for (int i = 0; i < 3; ++i) {
    const std::string member = "n" + std::to_string(i);
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(arrivals[member], keys) << member;
    }
    for (const auto& [key, bytes] : data) {
      auto got = nodes[static_cast<size_t>(i)]->Get(key);
      ASSERT_OK(got);
      EXPECT_TRUE(*got == bytes) << member << " " << key;
    }
    ASSERT_OK(nodes[static_cast<size_t>(i)]->Put(Key(1, "vote/" + member),
                                                 Bytes("ready " + member)));
    RelayStatus s = nodes[static_cast<size_t>(i)]->status();
    EXPECT_TRUE(s.tls);
    EXPECT_TRUE(s.parent_connected);
    EXPECT_OK(s.last_error);
  }
  ASSERT_TRUE(WaitFor([&] {
    auto listed = (*root)->List(Key(1, "vote/"));
    return listed.ok() && listed->size() == 3;
  }));
  for (int i = 0; i < 3; ++i) {
    const std::string member = "n" + std::to_string(i);
    EXPECT_EQ(*(*root)->Get(Key(1, "vote/" + member)),
              Bytes("ready " + member));
  }
  EXPECT_TRUE((*root)->status().tls);
  EXPECT_OK((*root)->last_error());
  EXPECT_NE((*root)->Describe().find("TLS"), std::string::npos);
}

TEST_F(RelayTlsTest, CertificatesFromAnotherCaAreRefusedBothWays) {
  auto root = RelayStore::Root("127.0.0.1:0", FastTls(ca_.Issue("root", "")));
  ASSERT_OK(root);
  ASSERT_OK((*root)->Put("head", Bytes("1")));
  // A node whose certificate another CA issued (it trusts the tree's CA).
  auto intruder =
      RelayStore::Node("intruder", (*root)->listen_address(), "",
                       FastTls(other_.Issue("intruder", "", /*trust=*/&ca_)));
  ASSERT_OK(intruder);
  ASSERT_TRUE(WaitFor([&] { return !(*root)->last_error().ok(); }, 3000));
  Status e = (*root)->last_error();
  EXPECT_TRUE(Contains(e, "TLS handshake with child at")) << e.ToString();
  EXPECT_TRUE(Contains(e, "not from our CA")) << e.ToString();
  ASSERT_TRUE(WaitFor([&] { return !(*intruder)->last_error().ok(); }, 3000));
  EXPECT_TRUE(Contains((*intruder)->last_error(), "TLS"))
      << (*intruder)->last_error().ToString();
  // A node that trusts only the other CA refuses the tree's root.
  auto wary = RelayStore::Node("wary", (*root)->listen_address(), "",
                               FastTls(other_.Issue("wary", "")));
  ASSERT_OK(wary);
  ASSERT_TRUE(WaitFor([&] { return !(*wary)->last_error().ok(); }, 3000));
  e = (*wary)->last_error();
  EXPECT_TRUE(Contains(e, "TLS handshake with parent")) << e.ToString();
  EXPECT_TRUE(Contains(e, "certificate verify failed")) << e.ToString();
  // Neither ever joins or receives anything.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ((*root)->status().children, 0);
  EXPECT_FALSE((*intruder)->Get("head").ok());
  EXPECT_FALSE((*wary)->Get("head").ok());
  EXPECT_GT((*root)->status().links_closed, 1u);
}

TEST_F(RelayTlsTest, PinnedNamesAreEnforced) {
  RelayOptions root_opts = FastTls(ca_.Issue("root", "DNS:root"));
  root_opts.tls.child_names_are_members = true;
  auto root = RelayStore::Root("127.0.0.1:0", root_opts);
  ASSERT_OK(root);
  ASSERT_OK((*root)->Put("head", Bytes("1")));
  // The parent's certificate does not carry the pinned IP.
  RelayOptions o = FastTls(ca_.Issue("n0", "DNS:n0"));
  o.tls.parent_name = "127.0.0.1";
  auto pinned = RelayStore::Node("n0", (*root)->listen_address(), "", o);
  ASSERT_OK(pinned);
  ASSERT_TRUE(WaitFor([&] { return !(*pinned)->last_error().ok(); }, 3000));
  EXPECT_TRUE(Contains((*pinned)->last_error(), "does not name '127.0.0.1'"))
      << (*pinned)->last_error().ToString();
  pinned->reset();
  // A member whose certificate names another member.
  auto impostor = RelayStore::Node("n1", (*root)->listen_address(), "",
                                   FastTls(ca_.Issue("n2", "DNS:n2")));
  ASSERT_OK(impostor);
  ASSERT_TRUE(WaitFor(
      [&] {
        return (*root)->last_error().code() == StatusCode::kPermissionDenied;
      },
      3000))
      << (*root)->last_error().ToString();
  Status e = (*root)->last_error();
  EXPECT_TRUE(Contains(e, "does not name that member")) << e.ToString();
  EXPECT_FALSE((*impostor)->Get("head").ok());
  impostor->reset();
  // The right names pass.
  o.tls.parent_name = "root";
  auto good = RelayStore::Node("n0", (*root)->listen_address(), "", o);
  ASSERT_OK(good);
  ASSERT_TRUE(WaitFor([&] { return (*good)->Get("head").ok(); }));
}

TEST_F(RelayTlsTest, PlaintextNodeAgainstTlsRootIsRefusedQuickly) {
  auto root = RelayStore::Root("127.0.0.1:0", FastTls(ca_.Issue("root", "")));
  ASSERT_OK(root);
  ASSERT_OK((*root)->Put("head", Bytes("1")));
  const auto start = Clock::now();
  auto node = RelayStore::Node("plain", (*root)->listen_address(), "", Fast());
  ASSERT_OK(node);
  ASSERT_TRUE(WaitFor([&] { return !(*root)->last_error().ok(); }, 3000));
  ASSERT_TRUE(WaitFor([&] { return !(*node)->last_error().ok(); }, 3000));
  const int64_t ms = MsSince(start);
  std::printf("relay tls: plaintext node refused after %lld ms\n",
              static_cast<long long>(ms));
  EXPECT_LT(ms, 1000);  // well before dead_after_ms would matter
  Status e = (*root)->last_error();
  EXPECT_TRUE(Contains(e, "does not speak TLS")) << e.ToString();
  EXPECT_TRUE(Contains((*node)->last_error(), "parent"))
      << (*node)->last_error().ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ((*root)->status().children, 0);
  EXPECT_FALSE((*node)->Get("head").ok());
}

TEST_F(RelayTlsTest, TlsNodeAgainstPlaintextRootIsRefusedQuickly) {
  auto root = RelayStore::Root("127.0.0.1:0", Fast());
  ASSERT_OK(root);
  ASSERT_OK((*root)->Put("head", Bytes("1")));
  const auto start = Clock::now();
  auto node = RelayStore::Node("secure", (*root)->listen_address(), "",
                               FastTls(ca_.Issue("secure", "")));
  ASSERT_OK(node);
  ASSERT_TRUE(WaitFor([&] { return !(*root)->last_error().ok(); }, 3000));
  ASSERT_TRUE(WaitFor([&] { return !(*node)->last_error().ok(); }, 3000));
  const int64_t ms = MsSince(start);
  std::printf("relay tls: TLS node at a plaintext root refused after %lld ms\n",
              static_cast<long long>(ms));
  EXPECT_LT(ms, 1000);
  Status e = (*root)->last_error();
  EXPECT_TRUE(Contains(e, "it uses TLS and this endpoint does not"))
      << e.ToString();
  e = (*node)->last_error();
  EXPECT_TRUE(Contains(e, "TLS handshake with parent")) << e.ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ((*root)->status().children, 0);
  EXPECT_FALSE((*node)->Get("head").ok());
}

TEST_F(RelayTlsTest, GarbageAndSilenceOnTheTlsPortAreRefused) {
  RelayOptions o = FastTls(ca_.Issue("root", ""));
  o.dead_after_ms = 300;
  auto root = RelayStore::Root("127.0.0.1:0", o);
  ASSERT_OK(root);
  const std::vector<std::vector<uint8_t>> garbage = {
      Bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
      RandomBytes(4096, 7),
      // A TLS record header announcing a huge handshake message.
      {0x16, 0x03, 0x01, 0xff, 0xff, 0x01, 0xff, 0xff, 0xff},
  };
  for (size_t i = 0; i < garbage.size(); ++i) {
    SCOPED_TRACE(i);
    const uint64_t closed = (*root)->status().links_closed;
    int fd = ConnectRaw((*root)->listen_address());
    ASSERT_GE(fd, 0);
    SendRaw(fd, garbage[i]);
    EXPECT_TRUE(WaitClosedRaw(fd, 3000)) << "link not closed";
    ::close(fd);
    ASSERT_TRUE(
        WaitFor([&] { return (*root)->status().links_closed > closed; }));
    EXPECT_TRUE(Contains((*root)->last_error(), "TLS handshake with child"))
        << (*root)->last_error().ToString();
  }
  // A peer that connects and says nothing is cut off after dead_after_ms.
  int fd = ConnectRaw((*root)->listen_address());
  ASSERT_GE(fd, 0);
  const auto start = Clock::now();
  EXPECT_TRUE(WaitClosedRaw(fd, 3000));
  const int64_t ms = MsSince(start);
  EXPECT_GE(ms, 250);
  EXPECT_LT(ms, 1000);
  EXPECT_TRUE(Contains((*root)->last_error(), "not done after"))
      << (*root)->last_error().ToString();
  ::close(fd);
  EXPECT_EQ((*root)->status().children, 0);
  // The root still serves a proper node.
  ASSERT_OK((*root)->Put("head", Bytes("1")));
  auto node = RelayStore::Node("good", (*root)->listen_address(), "",
                               FastTls(ca_.Issue("good", "")));
  ASSERT_OK(node);
  ASSERT_TRUE(WaitFor([&] { return (*node)->Get("head").ok(); }));
}

TEST_F(RelayTlsTest, SilentTlsParentIsLeftAndRetried) {
  std::string address;
  int listener = ListenRaw(&address);
  RelayOptions o = FastTls(ca_.Issue("n0", ""));
  o.dead_after_ms = 300;
  auto node = RelayStore::Node("n0", address, "", o);
  ASSERT_OK(node);
  int first = AcceptRaw(listener, 3000);
  ASSERT_GE(first, 0);
  const auto start = Clock::now();
  int second = AcceptRaw(listener, 3000);  // we never answer its hello
  ASSERT_GE(second, 0) << "the node did not give up and reconnect";
  const int64_t ms = MsSince(start);
  EXPECT_GE(ms, 250);
  EXPECT_LT(ms, 1000);
  EXPECT_TRUE(Contains((*node)->last_error(), "TLS handshake with parent"))
      << (*node)->last_error().ToString();
  ::close(first);
  ::close(second);
  ::close(listener);
}

TEST_F(RelayTlsTest, TamperedTlsStreamIsRefusedAndTheNodeRecovers) {
  auto root = RelayStore::Root("127.0.0.1:0", FastTls(ca_.Issue("root", "")));
  ASSERT_OK(root);
  const std::vector<uint8_t> body = RandomBytes(256 << 10, 5);
  ASSERT_OK((*root)->Put(Key(1, "chunk/0"), body));
  // Past the handshake (a few KiB), inside the object's records.
  TamperingProxy proxy((*root)->listen_address(), 64 << 10);
  auto node =
      RelayStore::Node("n0", proxy.address(), "", FastTls(ca_.Issue("n0", "")));
  ASSERT_OK(node);
  ASSERT_TRUE(WaitFor([&] { return (*node)->Get(Key(1, "chunk/0")).ok(); }));
  EXPECT_TRUE(*(*node)->Get(Key(1, "chunk/0")) == body);
  EXPECT_GE(proxy.connections(), 2);
  Status e = (*node)->last_error();
  EXPECT_TRUE(Contains(e, "read failed: TLS")) << e.ToString();
  EXPECT_GE((*node)->status().reconnects, 2u);
}

TEST_F(RelayTlsTest, SilentTlsLinkIsDeclaredDeadAndTheNodeRecovers) {
  // The link goes silent after the handshake and part of an object: the
  // root hears no heartbeat and declares the child dead (the node waits
  // longer); the node then reconnects and gets the object.
  auto root = RelayStore::Root("127.0.0.1:0", FastTls(ca_.Issue("root", "")));
  ASSERT_OK(root);
  const std::vector<uint8_t> body = RandomBytes(256 << 10, 6);
  ASSERT_OK((*root)->Put(Key(1, "chunk/0"), body));
  TamperingProxy proxy((*root)->listen_address(), 64 << 10,
                       TamperingProxy::Mode::kStall);
  RelayOptions o = FastTls(ca_.Issue("n0", ""));
  o.dead_after_ms = 3000;
  auto node = RelayStore::Node("n0", proxy.address(), "", o);
  ASSERT_OK(node);
  ASSERT_TRUE(
      WaitFor([&] { return (*node)->Get(Key(1, "chunk/0")).ok(); }, 15000));
  EXPECT_TRUE(*(*node)->Get(Key(1, "chunk/0")) == body);
  EXPECT_GE(proxy.connections(), 2);
  Status e = (*root)->last_error();
  EXPECT_TRUE(Contains(e, "child n0")) << e.ToString();
  EXPECT_TRUE(Contains(e, "declared dead")) << e.ToString();
}

TEST_F(RelayTlsTest, SlowChildQueueStaysWithinTheBoundOverTls) {
  // root -> mid -> {slow, quick}, as relay_test's plaintext case.
  std::vector<std::unique_ptr<RelayStore>> tree;
  ASSERT_NO_FATAL_FAILURE(CheckSlowChildQueueBound(
      [&](const std::string& name) { return FastTls(ca_.Issue(name, "")); }, 256 << 10,
      64 << 10, &tree));
  for (const auto& s : tree) {
    EXPECT_OK(s->last_error());
  }
}

TEST_F(RelayTlsTest, KilledNodeReconnectsAndGetsItsReplay) {
  // root <- n0 <- n1; n0 is destroyed while the root publishes version 2.
  auto root = RelayStore::Root("127.0.0.1:0", FastTls(ca_.Issue("root", "")));
  ASSERT_OK(root);
  const RelayOptions o0 = FastTls(ca_.Issue("n0", ""));
  auto n0 =
      RelayStore::Node("n0", (*root)->listen_address(), "127.0.0.1:0", o0);
  ASSERT_OK(n0);
  const std::string n0_address = (*n0)->listen_address();
  auto n1 =
      RelayStore::Node("n1", n0_address, "", FastTls(ca_.Issue("n1", "")));
  ASSERT_OK(n1);
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK((*root)->Put(Key(1, "chunk/" + std::to_string(i)),
                           RandomBytes(70000, static_cast<uint64_t>(i))));
  }
  ASSERT_TRUE(WaitFor([&] { return (*n1)->Get(Key(1, "chunk/4")).ok(); }));
  ASSERT_OK((*n1)->Put(Key(1, "vote/n1"), Bytes("ready")));
  ASSERT_TRUE(WaitFor([&] { return (*root)->Get(Key(1, "vote/n1")).ok(); }));
  const uint64_t reconnects = (*n1)->status().reconnects;
  n0->reset();
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK((*root)->Put(Key(2, "chunk/" + std::to_string(i)),
                           RandomBytes(90000, 10 + static_cast<uint64_t>(i))));
  }
  ASSERT_OK((*root)->PutIfAbsent(Key(2, "decision"), Bytes("commit")));
  ASSERT_TRUE(WaitFor([&] { return !(*n1)->status().parent_connected; }));
  auto again =
      RelayStore::Node("n0", (*root)->listen_address(), n0_address, o0);
  ASSERT_OK(again);
  ASSERT_TRUE(WaitFor([&] { return (*n1)->Get(Key(2, "decision")).ok(); }));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(*(*n1)->Get(Key(2, "chunk/" + std::to_string(i))),
              RandomBytes(90000, 10 + static_cast<uint64_t>(i)));
    EXPECT_EQ(*(*again)->Get(Key(1, "chunk/" + std::to_string(i))),
              RandomBytes(70000, static_cast<uint64_t>(i)));
  }
  EXPECT_GT((*n1)->status().reconnects, reconnects);
  // n1's vote reached the restarted n0 again (nodes re-send up objects).
  ASSERT_TRUE(WaitFor([&] { return (*again)->Get(Key(1, "vote/n1")).ok(); }));
}

TEST_F(RelayTlsTest, BadTlsOptionsAreRefusedAtStart) {
  RelayTlsOptions good = ca_.Issue("root", "");
  RelayTlsOptions t = good;
  t.ca_file.clear();
  Status s = RelayStore::Root("127.0.0.1:0", FastTls(t)).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Contains(s, "all three")) << s.ToString();
  t = good;
  t.cert_file = dir_.File("missing.crt");
  s = RelayStore::Root("127.0.0.1:0", FastTls(t)).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Contains(s, "missing.crt")) << s.ToString();
  t = good;
  t.key_file = ca_.Issue("other", "").key_file;
  s = RelayStore::Root("127.0.0.1:0", FastTls(t)).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Contains(s, "private key")) << s.ToString();
  RelayOptions names_only = Fast();
  names_only.tls.parent_name = "root";
  EXPECT_THAT(RelayStore::Node("n0", "127.0.0.1:1", "", names_only),
              StatusIs(StatusCode::kInvalidArgument));
}

// Root -> one node over loopback, TLS and plaintext in the same run:
// REFIT_RELAY_TLS_BENCH_MIB MiB (default 64) of 8 MiB objects, 8 objects a
// version (the root keeps 4 versions: more than its child queue, so no
// object is evicted before it is sent). Reports MiB/s from the first Put
// to the last arrival, and the process's CPU seconds (both endpoints).
TEST_F(RelayTlsTest, ThroughputAgainstPlaintext) {
  size_t mib = 64;
  if (const char* env = std::getenv("REFIT_RELAY_TLS_BENCH_MIB")) {
    mib = static_cast<size_t>(std::strtoull(env, nullptr, 10));
  }
  constexpr size_t kObject = size_t{8} << 20;
  const size_t objects = std::max<size_t>(1, mib / 8);
  std::vector<uint8_t> base = RandomBytes(kObject, 42);
  auto object = [&](size_t i) {
    std::vector<uint8_t> b = base;
    for (size_t k = 0; k < 8; ++k) b[k] = static_cast<uint8_t>(i >> (8 * k));
    return b;
  };
  struct Run {
    double mib_per_s = 0;
    double cpu_s = 0;
  };
  auto run = [&](bool tls) -> Run {
    RelayOptions ro = tls ? FastTls(ca_.Issue("root", "")) : Fast();
    RelayOptions no = tls ? FastTls(ca_.Issue("n0", "")) : Fast();
    ro.dead_after_ms = no.dead_after_ms = 5000;
    std::atomic<size_t> arrived{0};
    no.on_arrival = [&arrived](const std::string&) { ++arrived; };
    auto root = RelayStore::Root("127.0.0.1:0", ro);
    EXPECT_TRUE(root.ok());
    if (!root.ok()) return {};
    auto node = RelayStore::Node("n0", (*root)->listen_address(), "", no);
    EXPECT_TRUE(node.ok());
    if (!node.ok()) return {};
    EXPECT_TRUE(WaitFor([&] { return (*root)->status().children == 1; }));
    std::vector<std::vector<uint8_t>> bodies;
    for (size_t i = 0; i < objects; ++i) bodies.push_back(object(i));
    const auto start = Clock::now();
    const std::clock_t cpu_start = std::clock();
    for (size_t i = 0; i < objects; ++i) {
      EXPECT_OK((*root)->Put(Key(1 + i / 8, "chunk/" + std::to_string(i % 8)),
                             bodies[i]));
    }
    EXPECT_TRUE(WaitFor([&] { return arrived == objects; }, 120000));
    const double seconds = static_cast<double>(MsSince(start)) / 1000.0;
    const double cpu =
        static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    const size_t last = objects - 1;
    auto got =
        (*node)->Get(Key(1 + last / 8, "chunk/" + std::to_string(last % 8)));
    EXPECT_TRUE(got.ok() && *got == bodies[last]);
    EXPECT_OK((*node)->last_error());
    EXPECT_EQ((*node)->status().tls, tls);
    return {static_cast<double>(objects * kObject) / (1 << 20) / seconds, cpu};
  };
  const Run plain = run(false);
  const Run tls = run(true);
  std::printf(
      "relay tls throughput: %zu MiB in %zu objects of 8 MiB, root -> node "
      "on loopback: plaintext %.0f MiB/s (%.2f CPU s), TLS %.0f MiB/s (%.2f "
      "CPU s)\n",
      objects * 8, objects, plain.mib_per_s, plain.cpu_s, tls.mib_per_s,
      tls.cpu_s);
  EXPECT_GT(plain.mib_per_s, 0);
  EXPECT_GT(tls.mib_per_s, 0);
}

}  // namespace
}  // namespace refit
