// Relay tree tests on loopback (ephemeral ports): delivery down a tree of 1
// root + 7 nodes, votes up, the once-only decision, replay after a restart,
// flow control with a slow child, death of silent peers, hostile frames,
// eviction, and the ObjectStore contract at an endpoint. Every wait is
// bounded (WaitFor), and ctest bounds each test too.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "support/relay_testing.h"
#include "support/status_matchers.h"
#include "support/store_suite.h"
#include "support/testing.h"
#include "transport/relay_frame.h"
#include "transport/relay_store.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;
using ::refit::testing::StoreTest;

using namespace relay_testing;  // NOLINT(build/namespaces)
using internal::RelayFrameType;

// A tree of one root and `n` nodes with fan-out `f`; node i is "n<i>".
// Each node records the keys that arrive, in order.
class Tree {
 public:
  Tree(int n, int f, RelayOptions options = Fast())
      : options_(std::move(options)) {
    auto root = RelayStore::Root("127.0.0.1:0", options_);
    EXPECT_OK(root);
    root_ = std::move(*root);
    parents_ = *RelayTreeParents(n, f);
    arrivals_.resize(static_cast<size_t>(n));
    nodes_.resize(static_cast<size_t>(n));
    addresses_.resize(static_cast<size_t>(n), "127.0.0.1:0");
    for (int i = 0; i < n; ++i) StartNode(i);
  }

  // Endpoints go first: their I/O threads call back into arrivals_.
  ~Tree() {
    for (auto& n : nodes_) n.reset();
    root_.reset();
  }

  // (Re)creates node i on its previous address (port 0 the first time).
  void StartNode(int i, RelayOptions options) {
    const size_t k = static_cast<size_t>(i);
    options.on_arrival = [this, k](const std::string& key) {
      std::lock_guard<std::mutex> lock(mu_);
      arrivals_[k].push_back(key);
    };
    const int p = parents_[k];
    const std::string parent =
        p < 0 ? root_->listen_address()
              : nodes_[static_cast<size_t>(p)]->listen_address();
    auto node = RelayStore::Node("n" + std::to_string(i), parent, addresses_[k],
                                 options);
    ASSERT_OK(node);
    nodes_[k] = std::move(*node);
    addresses_[k] = nodes_[k]->listen_address();
  }
  void StartNode(int i) { StartNode(i, options_); }
  void StopNode(int i) { nodes_[static_cast<size_t>(i)].reset(); }

  RelayStore& root() { return *root_; }
  std::unique_ptr<RelayStore>& root_ptr() { return root_; }
  RelayStore& node(int i) { return *nodes_[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(nodes_.size()); }
  std::vector<std::string> arrivals(int i) {
    std::lock_guard<std::mutex> lock(mu_);
    return arrivals_[static_cast<size_t>(i)];
  }

  // Waits until every endpoint has all its children past their hello.
  bool WaitConnected() {
    return WaitFor([&] {
      std::vector<int> want(nodes_.size() + 1, 0);  // [0] = root
      for (int p : parents_) ++want[static_cast<size_t>(p + 1)];
      if (root_->status().children != want[0]) return false;
      for (size_t i = 0; i < nodes_.size(); ++i) {
        if (nodes_[i]->status().children != want[i + 1]) return false;
      }
      return true;
    });
  }

  // True when every node holds `key` with exactly `data`.
  bool AllHold(const std::string& key, const std::vector<uint8_t>& data) {
    for (auto& n : nodes_) {
      auto got = n->Get(key);
      if (!got.ok() || *got != data) return false;
    }
    return true;
  }

 private:
  RelayOptions options_;
  std::unique_ptr<RelayStore> root_;
  std::vector<int> parents_;
  std::vector<std::unique_ptr<RelayStore>> nodes_;
  std::vector<std::string> addresses_;
  std::mutex mu_;
  std::vector<std::vector<std::string>> arrivals_;
};

// ---- Raw sockets, to play a misbehaving peer ----

std::vector<uint8_t> Hello(const std::string& member) {
  uint8_t version[4];
  internal::StoreLe32(version, internal::kRelayProtocolVersion);
  return internal::EncodeRelayFrame(RelayFrameType::kHello, member, version);
}

// A listening socket on an ephemeral loopback port (a fake parent).
struct RawListener {
  RawListener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    EXPECT_EQ(::listen(fd, 8), 0);
    socklen_t len = sizeof sa;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    address = "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  }
  ~RawListener() { ::close(fd); }
  // Accepts one connection within `ms`, or -1.
  int Accept(int ms) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return -1;
    return ::accept(fd, nullptr, nullptr);
  }
  int fd;
  std::string address;
};

// ---- Tests ----

TEST(RelayFrameTest, HeaderChecksComeBeforeAllocation) {
  auto frame =
      internal::EncodeRelayFrame(RelayFrameType::kPut, "a/b", Bytes("body"));
  auto h = internal::ParseRelayHeader(frame.data(), 100);
  ASSERT_OK(h);
  EXPECT_EQ(h->key_len, 3u);
  EXPECT_EQ(h->body_len, 4u);
  EXPECT_EQ(internal::RelayFrameCrc(frame.data(), "a/b", Bytes("body")),
            internal::LoadLe32(frame.data() + frame.size() - 4));
  uint8_t hdr[internal::kRelayHeaderBytes];
  internal::EncodeRelayHeader(RelayFrameType::kPut, 1025, 0, hdr);
  EXPECT_THAT(internal::ParseRelayHeader(hdr, 100),
              StatusIs(StatusCode::kDataLoss));
  internal::EncodeRelayHeader(RelayFrameType::kPut, 1, 101, hdr);
  EXPECT_THAT(internal::ParseRelayHeader(hdr, 100),
              StatusIs(StatusCode::kDataLoss));
  internal::EncodeRelayHeader(RelayFrameType::kPut, 1, ~uint64_t{0}, hdr);
  EXPECT_FALSE(internal::ParseRelayHeader(hdr, uint64_t{1} << 30).ok());
  internal::EncodeRelayHeader(RelayFrameType::kPut, 1, 1, hdr);
  hdr[4] = 9;
  EXPECT_FALSE(internal::ParseRelayHeader(hdr, 100).ok());
  hdr[4] = 2;
  hdr[0] ^= 1;
  EXPECT_NE(
      internal::ParseRelayHeader(hdr, 100).status().message().find("magic"),
      std::string_view::npos);
}

TEST(RelayTreeTest, ParentsAreBreadthFirst) {
  EXPECT_EQ(*RelayTreeParents(7, 2), (std::vector<int>{-1, -1, 0, 0, 1, 1, 2}));
  EXPECT_EQ(*RelayTreeParents(4, 3), (std::vector<int>{-1, -1, -1, 0}));
  EXPECT_EQ(*RelayTreeParents(3, 1), (std::vector<int>{-1, 0, 1}));
  EXPECT_TRUE(RelayTreeParents(0, 2)->empty());
  EXPECT_FALSE(RelayTreeParents(3, 0).ok());
}

TEST(RelayTreeTest, BadOptionsAndAddressesAreRefused) {
  RelayOptions o = Fast();
  o.dead_after_ms = o.heartbeat_ms;
  EXPECT_THAT(RelayStore::Root("127.0.0.1:0", o),
              StatusIs(StatusCode::kInvalidArgument));
  RelayOptions no_keys = Fast();
  no_keys.keys = nullptr;
  EXPECT_THAT(RelayStore::Root("127.0.0.1:0", no_keys),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(RelayStore::Root("nohost", Fast()),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(RelayStore::Root("example.com:1", Fast()),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(RelayStore::Node("bad name", "127.0.0.1:1", "", Fast()),
              StatusIs(StatusCode::kInvalidArgument));
  auto root = RelayStore::Root("127.0.0.1:0", Fast());
  ASSERT_OK(root);
  // The port is taken.
  EXPECT_THAT(RelayStore::Root((*root)->listen_address(), Fast()),
              StatusIs(StatusCode::kUnavailable));
}

TEST(RelayTreeTest, ObjectsReachEveryNodeInOrderByteExact) {
  Tree tree(7, 2);
  std::vector<std::string> keys;
  std::map<std::string, std::vector<uint8_t>> data;
  auto put = [&](const std::string& key, std::vector<uint8_t> bytes) {
    ASSERT_OK(tree.root().Put(key, bytes));
    keys.push_back(key);
    data[key] = std::move(bytes);
  };
  for (uint64_t v = 1; v <= 2; ++v) {
    for (int i = 0; i < 20; ++i) {
      char rest[32];
      std::snprintf(rest, sizeof rest, "chunk/%08d", i);
      // Sizes from empty to 1.5 MiB (more than one read piece).
      size_t n =
          i == 0 ? 0 : (i == 7 ? (3u << 19) : static_cast<size_t>(i) * 4099);
      put(Key(v, rest), RandomBytes(n, v * 100 + static_cast<uint64_t>(i)));
    }
    put(Key(v, "manifest"), RandomBytes(777, v));
    put(IndexKeyOf(v), {});
  }
  put("head", Bytes("2"));
  ASSERT_TRUE(WaitFor([&] {
    for (int i = 0; i < tree.size(); ++i) {
      if (tree.arrivals(i).size() < keys.size()) return false;
    }
    return true;
  })) << "not every node received every object";
  for (int i = 0; i < tree.size(); ++i) {
    EXPECT_EQ(tree.arrivals(i), keys) << "node " << i << " saw another order";
    for (const auto& [key, bytes] : data) {
      auto got = tree.node(i).Get(key);
      ASSERT_OK(got);
      ASSERT_TRUE(*got == bytes) << "node " << i << " key " << key;
    }
    auto listed = tree.node(i).List(Key(1, "chunk/"));
    ASSERT_OK(listed);
    EXPECT_EQ(listed->size(), 20u);
    RelayStatus s = tree.node(i).status();
    EXPECT_TRUE(s.parent_connected);
    EXPECT_OK(s.last_error);
  }
  EXPECT_EQ(tree.root().status().children, 2);
  EXPECT_EQ(tree.node(0).status().children, 2);
  EXPECT_EQ(tree.node(2).status().children, 1);  // n6
  EXPECT_EQ(tree.node(6).status().children, 0);
  // A key that has not arrived is kNotFound, as in every store.
  EXPECT_THAT(tree.node(3).Get(Key(3, "manifest")),
              StatusIs(StatusCode::kNotFound));
}

TEST(RelayTreeTest, VotesFromLeavesReachTheRoot) {
  Tree tree(7, 2);
  for (int i = 0; i < tree.size(); ++i) {
    const std::string member = "n" + std::to_string(i);
    ASSERT_OK(
        tree.node(i).Put(Key(1, "vote/" + member), Bytes("ready " + member)));
  }
  ASSERT_OK(tree.node(5).Put(Key(1, "request/n5"), Bytes("chunks 1 2")));
  ASSERT_TRUE(WaitFor([&] {
    auto listed = tree.root().List(Key(1, "vote/"));
    return listed.ok() && listed->size() == 7;
  }));
  for (int i = 0; i < tree.size(); ++i) {
    const std::string member = "n" + std::to_string(i);
    EXPECT_EQ(*tree.root().Get(Key(1, "vote/" + member)),
              Bytes("ready " + member));
  }
  ASSERT_TRUE(
      WaitFor([&] { return tree.root().Get(Key(1, "request/n5")).ok(); }));
  // A re-put request replaces the earlier one at the root.
  ASSERT_OK(tree.node(5).Put(Key(1, "request/n5"), Bytes("chunks 3")));
  ASSERT_TRUE(WaitFor([&] {
    return *tree.root().Get(Key(1, "request/n5")) == Bytes("chunks 3");
  }));
  // Up objects do not flow down to siblings.
  EXPECT_THAT(tree.node(6).Get(Key(1, "vote/n5")),
              StatusIs(StatusCode::kNotFound));
  // Nodes write only upward keys.
  EXPECT_THAT(tree.node(3).Put(Key(1, "decision"), Bytes("x")),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(tree.node(3).Put("head", Bytes("x")),
              StatusIs(StatusCode::kFailedPrecondition));
}

TEST(RelayTreeTest, DecisionIsOnceOnlyAtTheRootAndReachesEveryNode) {
  Tree tree(7, 2);
  const std::string key = Key(1, "decision");
  constexpr int kWriters = 8;
  std::atomic<int> wins{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      Status s =
          tree.root().PutIfAbsent(key, Bytes("commit by " + std::to_string(w)));
      if (s.ok()) {
        ++wins;
      } else {
        EXPECT_THAT(s, StatusIs(StatusCode::kAlreadyExists));
      }
    });
  }
  for (auto& t : writers) t.join();
  ASSERT_EQ(wins.load(), 1);
  auto winner = tree.root().Get(key);
  ASSERT_OK(winner);
  ASSERT_TRUE(WaitFor([&] { return tree.AllHold(key, *winner); }));
  // The root overwrites it with Put (not the protocol's way): the root's
  // children refuse the different copy of a once-only object and keep the
  // first; nothing reaches their subtrees.
  ASSERT_OK(tree.root().Put(key, Bytes("forged")));
  ASSERT_TRUE(WaitFor([&] {
    return tree.node(0).status().refused == 1 &&
           tree.node(1).status().refused == 1;
  }));
  EXPECT_TRUE(tree.AllHold(key, *winner));
  EXPECT_NE(tree.node(0).last_error().message().find("once-only"),
            std::string_view::npos);
  // PutIfAbsent at a node is honoured there (for its own upward keys).
  ASSERT_OK(tree.node(4).PutIfAbsent(Key(1, "vote/n4"), Bytes("ready")));
  EXPECT_THAT(tree.node(4).PutIfAbsent(Key(1, "vote/n4"), Bytes("failed")),
              StatusIs(StatusCode::kAlreadyExists));
}

TEST(RelayTreeTest, RestartedNodeGetsAReplayAndItsChildrenReconnect) {
  Tree tree(7, 2);
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK(tree.root().Put(Key(1, "chunk/" + std::to_string(i)),
                              RandomBytes(5000, 1)));
  }
  ASSERT_OK(tree.root().Put(Key(1, "manifest"), Bytes("m1")));
  ASSERT_TRUE(
      WaitFor([&] { return tree.AllHold(Key(1, "manifest"), Bytes("m1")); }));
  // Kill n0 (parent of n2, n3) and publish while it is down.
  const uint64_t reconnects_n2 = tree.node(2).status().reconnects;
  tree.StopNode(0);
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK(tree.root().Put(Key(2, "chunk/" + std::to_string(i)),
                              RandomBytes(7000, 2)));
  }
  ASSERT_OK(tree.root().Put(Key(2, "manifest"), Bytes("m2")));
  ASSERT_OK(tree.root().PutIfAbsent(Key(2, "decision"), Bytes("commit")));
  // n2 notices the loss and retries against the dead address meanwhile.
  ASSERT_TRUE(WaitFor([&] { return !tree.node(2).status().parent_connected; }));
  EXPECT_FALSE(tree.node(2).Get(Key(2, "manifest")).ok());
  // The restarted n0 (same address) gets a replay of everything, in order,
  // and n2 / n3 reconnect to it and get what they missed.
  tree.StartNode(0);
  ASSERT_TRUE(WaitFor(
      [&] { return tree.AllHold(Key(2, "decision"), Bytes("commit")); }));
  auto replay = tree.arrivals(0);
  std::vector<std::string> tail(replay.end() - 12, replay.end());
  EXPECT_EQ(tail.front(), Key(2, "chunk/0"));
  EXPECT_EQ(tail.back(), Key(2, "decision"));
  EXPECT_EQ(*tree.node(0).Get(Key(1, "chunk/3")), RandomBytes(5000, 1));
  EXPECT_EQ(*tree.node(3).Get(Key(2, "chunk/9")), RandomBytes(7000, 2));
  EXPECT_GT(tree.node(2).status().reconnects, reconnects_n2);
}

TEST(RelayTreeTest, NodesResendTheirVotesToARestartedRoot) {
  Tree tree(7, 2);
  for (int i = 0; i < tree.size(); ++i) {
    ASSERT_OK(
        tree.node(i).Put(Key(1, "vote/n" + std::to_string(i)), Bytes("ready")));
  }
  ASSERT_TRUE(
      WaitFor([&] { return tree.root().List(Key(1, "vote/"))->size() == 7; }));
  const std::string address = tree.root().listen_address();
  tree.root_ptr().reset();
  auto root = RelayStore::Root(address, Fast());
  ASSERT_OK(root);
  tree.root_ptr() = std::move(*root);
  ASSERT_TRUE(WaitFor([&] {
    return tree.root().List(Key(1, "vote/"))->size() == 7;
  })) << "the new root did not get every vote back";
}

TEST(RelayTreeTest, SlowChildDoesNotStallItsSiblingWithinTheBound) {
  RelayOptions fast = Fast();
  fast.child_queue_bytes = 32 << 20;  // more than the whole publication
  auto root = RelayStore::Root("127.0.0.1:0", fast);
  ASSERT_OK(root);
  RelayOptions slow_opts = fast;
  slow_opts.test_read_delay_ms = 25;  // per frame
  auto slow =
      RelayStore::Node("slow", (*root)->listen_address(), "", slow_opts);
  auto quick = RelayStore::Node("quick", (*root)->listen_address(), "", fast);
  ASSERT_OK(slow);
  ASSERT_OK(quick);
  ASSERT_TRUE(WaitFor([&] { return (*root)->status().children == 2; }));
  constexpr int kObjects = 40;
  const auto start = Clock::now();
  for (int i = 0; i < kObjects; ++i) {
    ASSERT_OK((*root)->Put(Key(1, "chunk/" + std::to_string(i)),
                           RandomBytes(64 << 10, 9)));
  }
  const std::string last = Key(1, "chunk/" + std::to_string(kObjects - 1));
  ASSERT_TRUE(WaitFor([&] { return (*quick)->Get(last).ok(); }));
  const int64_t quick_ms = MsSince(start);
  ASSERT_TRUE(WaitFor([&] { return (*slow)->Get(last).ok(); }, 20000));
  const int64_t slow_ms = MsSince(start);
  std::printf(
      "relay slow-child: quick sibling done in %lld ms, slow child in %lld "
      "ms\n",
      static_cast<long long>(quick_ms), static_cast<long long>(slow_ms));
  EXPECT_GE(slow_ms,
            (kObjects - 1) * 25);  // a delay after each frame but the last
  EXPECT_LT(quick_ms * 3, slow_ms);
  EXPECT_OK((*slow)->status().last_error);
}

TEST(RelayTreeTest, SlowChildQueueStaysWithinTheBound) {
  // root -> mid -> {slow, quick}: mid's queue for slow is bounded; beyond
  // the bound mid stops reading from the root, so the root's queue for mid
  // fills and the root's Put waits: memory stays bounded everywhere.
  std::vector<std::unique_ptr<RelayStore>> tree;
  CheckSlowChildQueueBound([](const std::string&) { return Fast(); }, 256 << 10, 64 << 10,
                           &tree);
}

TEST(RelayTreeTest, SilentChildIsDeclaredDead) {
  RelayOptions o = Fast();
  o.dead_after_ms = 300;
  auto root = RelayStore::Root("127.0.0.1:0", o);
  ASSERT_OK(root);
  int fd = ConnectRaw((*root)->listen_address());
  ASSERT_GE(fd, 0);
  SendRaw(fd, Hello("mute"));
  ASSERT_TRUE(WaitFor([&] { return (*root)->status().children == 1; }));
  const auto start = Clock::now();
  EXPECT_TRUE(WaitClosedRaw(fd, 3000));
  const int64_t ms = MsSince(start);
  std::printf(
      "relay dead-peer: silent child closed after %lld ms (dead_after_ms "
      "300)\n",
      static_cast<long long>(ms));
  EXPECT_GE(ms, 250);
  EXPECT_LT(ms, 1500);  // about dead_after_ms; slack for a loaded machine
  EXPECT_EQ((*root)->status().children, 0);
  Status e = (*root)->last_error();
  EXPECT_NE(e.message().find("child mute"), std::string_view::npos)
      << e.ToString();
  EXPECT_NE(e.message().find("declared dead"), std::string_view::npos)
      << e.ToString();
  ::close(fd);
}

TEST(RelayTreeTest, SilentParentIsDeclaredDeadAndTheNodeReconnects) {
  RawListener fake;
  RelayOptions o = Fast();
  o.dead_after_ms = 300;
  auto node = RelayStore::Node("n0", fake.address, "", o);
  ASSERT_OK(node);
  int first = fake.Accept(3000);
  ASSERT_GE(first, 0);
  const auto start = Clock::now();
  // Never answer; the node must give up on us within ~dead_after_ms.
  int second = fake.Accept(3000);
  ASSERT_GE(second, 0) << "the node did not reconnect";
  const int64_t ms = MsSince(start);
  EXPECT_GE(ms, 250);
  EXPECT_LT(ms, 1000);
  Status e = (*node)->last_error();
  EXPECT_NE(e.message().find("parent " + fake.address), std::string_view::npos)
      << e.ToString();
  EXPECT_NE(e.message().find("silent"), std::string_view::npos) << e.ToString();
  ::close(first);
  ::close(second);
}

TEST(RelayTreeTest, CorruptFramesCloseTheLinkWithAnError) {
  auto root = RelayStore::Root("127.0.0.1:0", Fast());
  ASSERT_OK(root);
  struct Case {
    const char* name;
    std::function<std::vector<uint8_t>()> frame;
    const char* error;
    bool hello = true;  // say hello first
  };
  const std::vector<Case> cases = {
      {"bad crc",
       [] {
         auto f = internal::EncodeRelayFrame(RelayFrameType::kPut,
                                             Key(1, "vote/x"), Bytes("ok"));
         f[f.size() - 1] ^= 0xff;
         return f;
       },
       "crc mismatch"},
      {"flipped body bit",
       [] {
         auto f = internal::EncodeRelayFrame(RelayFrameType::kPut,
                                             Key(1, "vote/x"), Bytes("ok"));
         f[f.size() - 5] ^= 0x01;
         return f;
       },
       "crc mismatch"},
      {"oversized body",
       [] {
         std::vector<uint8_t> f(internal::kRelayHeaderBytes);
         internal::EncodeRelayHeader(RelayFrameType::kPut, 4, uint64_t{1} << 40,
                                     f.data());
         return f;
       },
       "over the limit"},
      {"oversized key",
       [] {
         std::vector<uint8_t> f(internal::kRelayHeaderBytes);
         internal::EncodeRelayHeader(RelayFrameType::kPut, 5000, 1, f.data());
         return f;
       },
       "key length 5000"},
      {"bad magic", [] { return Bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"); },
       "magic", false},
      {"object before hello",
       [] {
         return internal::EncodeRelayFrame(RelayFrameType::kPut,
                                           Key(1, "vote/x"), {});
       },
       "first frame must be its hello", false},
      {"downward key from a child",
       [] {
         return internal::EncodeRelayFrame(RelayFrameType::kPut, "head",
                                           Bytes("9"));
       },
       "not an upward key"},
      {"invalid key",
       [] {
         return internal::EncodeRelayFrame(RelayFrameType::kPut, "a//b",
                                           Bytes("9"));
       },
       "key"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const uint64_t closed = (*root)->status().links_closed;
    int fd = ConnectRaw((*root)->listen_address());
    ASSERT_GE(fd, 0);
    if (c.hello) SendRaw(fd, Hello("evil"));
    SendRaw(fd, c.frame());
    EXPECT_TRUE(WaitClosedRaw(fd, 3000)) << "link not closed";
    ::close(fd);
    ASSERT_TRUE(
        WaitFor([&] { return (*root)->status().links_closed > closed; }));
    Status e = (*root)->last_error();
    EXPECT_NE(e.message().find(c.error), std::string_view::npos)
        << e.ToString();
  }
  // The root is unharmed: nothing was stored and it still works.
  EXPECT_FALSE((*root)->Get(Key(1, "vote/x")).ok());
  auto node = RelayStore::Node("good", (*root)->listen_address(), "", Fast());
  ASSERT_OK(node);
  ASSERT_OK((*root)->Put("head", Bytes("1")));
  ASSERT_TRUE(WaitFor([&] { return (*node)->Get("head").ok(); }));
}

TEST(RelayTreeTest, CorruptFrameFromParentClosesAndTheNodeReconnects) {
  RawListener fake;
  auto node = RelayStore::Node("n0", fake.address, "", Fast());
  ASSERT_OK(node);
  int fd = fake.Accept(3000);
  ASSERT_GE(fd, 0);
  auto f = internal::EncodeRelayFrame(RelayFrameType::kPut, "head", Bytes("1"));
  f[f.size() - 2] ^= 0x10;
  SendRaw(fd, f);
  int again = fake.Accept(3000);
  EXPECT_GE(again, 0) << "the node did not reconnect";
  EXPECT_NE((*node)->last_error().message().find("crc mismatch"),
            std::string_view::npos)
      << (*node)->last_error().ToString();
  EXPECT_FALSE((*node)->Get("head").ok());
  ::close(fd);
  if (again >= 0) ::close(again);
}

TEST(RelayTreeTest, OldVersionsAreEvictedAndTheByteCapHolds) {
  RelayOptions o = Fast();
  o.keep_versions = 2;
  o.max_store_bytes = 1 << 20;
  Tree tree(3, 2, o);
  ASSERT_TRUE(
      tree.WaitConnected());  // so every node sees version 1 come and go
  ASSERT_OK(tree.root().Put("head", Bytes("0")));
  for (uint64_t v = 1; v <= 3; ++v) {
    ASSERT_OK(tree.root().Put(Key(v, "chunk/0"), RandomBytes(1000, v)));
    ASSERT_OK(tree.root().Put(IndexKeyOf(v), {}));
    // Else the root may evict version 1 before sending it: nodes would
    // never see it (which is fine, but not what this test checks).
    ASSERT_TRUE(WaitFor([&] { return tree.AllHold(IndexKeyOf(v), {}); }));
  }
  for (RelayStore* s : {&tree.root(), &tree.node(0), &tree.node(2)}) {
    EXPECT_THAT(s->Get(Key(1, "chunk/0")), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(s->Get(IndexKeyOf(1)), StatusIs(StatusCode::kNotFound));
    EXPECT_OK(s->Get(Key(2, "chunk/0")));
    EXPECT_OK(s->Get("head"));
    EXPECT_EQ(s->status().evicted, 2u);
  }
  // A version below the window is refused at the root.
  EXPECT_THAT(tree.root().Put(Key(1, "chunk/0"), Bytes("x")),
              StatusIs(StatusCode::kFailedPrecondition));
  // Beyond max_store_bytes a Put fails clearly.
  Status big = tree.root().Put(Key(3, "chunk/1"), RandomBytes(1 << 20, 1));
  EXPECT_THAT(big, StatusIs(StatusCode::kResourceExhausted));
  EXPECT_NE(big.message().find("max_store_bytes"), std::string_view::npos)
      << big.ToString();
}

// The ObjectStore contract (tests/support/store_suite.h) at an endpoint:
// Put / Get / List / Delete / PutIfAbsent on the root's local map.
INSTANTIATE_TEST_SUITE_P(Endpoint, StoreTest, ::testing::Values("relay"),
                         ::refit::testing::StoreBackendName);

}  // namespace
}  // namespace refit
