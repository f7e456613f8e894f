// The protocol on a relay tree (sync/relay_tree.h), on loopback: the
// protocol's key classifier, and the publisher's root store written through
// to a directory store: seeding a fresh root in publisher order, the
// durable store deciding once-only objects, reads falling back to it, and
// members' votes and requests mirrored into it.
#include "sync/relay_tree.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/status_matchers.h"
#include "support/testing.h"
#include "sync/keys.h"
#include "transport/object_store.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using testing::TempDir;

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

bool WaitFor(const std::function<bool()>& pred, int ms = 10000) {
  const auto start = std::chrono::steady_clock::now();
  while (!pred()) {
    if (std::chrono::steady_clock::now() - start >
        std::chrono::milliseconds(ms)) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

RelayOptions Fast() {
  RelayOptions o;
  o.heartbeat_ms = 50;
  o.dead_after_ms = 1000;
  o.reconnect_min_ms = 10;
  o.reconnect_max_ms = 100;
  o.log_to_stderr = false;
  return o;
}

// Every object a publisher and two members write for `v`; `complete`:
// with its manifest and decision.
void WriteVersion(ObjectStore* s, uint64_t v, bool complete) {
  ASSERT_OK(s->Put(IndexKey(v), Bytes("announce " + std::to_string(v))));
  ASSERT_OK(s->Put(ChunkKey(v, 0), Bytes("c0")));
  ASSERT_OK(s->Put(ChunkKey(v, 1), Bytes("c1")));
  ASSERT_OK(s->Put(ResendKey(v, "r0", 1, true), Bytes("re")));
  ASSERT_OK(s->Put(VoteKey(v, "r0"), Bytes("vote")));
  ASSERT_OK(s->Put(RequestKey(v, "r0"), Bytes("request")));
  if (complete) {
    ASSERT_OK(s->Put(ManifestKey(v), Bytes("manifest")));
    ASSERT_OK(s->PutIfAbsent(DecisionKey(v), Bytes("decision")));
  }
}

TEST(ProtocolRelayKeysTest, ClassifyMembersKeysAndVersions) {
  auto keys = ProtocolRelayKeys();
  ASSERT_NE(keys, nullptr);
  EXPECT_TRUE(keys->IsUpward(VoteKey(3, "r0")));
  EXPECT_TRUE(keys->IsUpward(DoneKey(3, "r0")));
  EXPECT_TRUE(keys->IsUpward(RequestKey(3, "r0")));
  EXPECT_FALSE(keys->IsUpward(DecisionKey(3)));
  EXPECT_FALSE(keys->IsUpward(ResendKey(3, "r0", 0, true)));
  EXPECT_FALSE(keys->IsUpward(kHeadKey));
  EXPECT_EQ(keys->VersionOf(IndexKey(3)), 3u);
  EXPECT_EQ(keys->VersionOf(ChunkKey(3, 0)), 3u);
  EXPECT_FALSE(keys->VersionOf(kHeadKey).has_value());
  EXPECT_FALSE(keys->VersionOf(SnapshotIndexKey(3)).has_value());
}

// A fresh root is seeded with the durable store's head and newest
// versions, members' objects left out, in the order a publisher writes a
// version: a node that joins receives them in that order.
TEST(RelayRootStoreTest, SeedCopiesTheNewestVersionsInPublisherOrder) {
  TempDir dir;
  auto durable = OpenObjectStore(dir.File("store"));
  ASSERT_OK(durable);
  ASSERT_OK((*durable)->Put(kHeadKey, Bytes("head")));
  for (uint64_t v = 1; v <= 3; ++v) WriteVersion(durable->get(), v, true);
  WriteVersion(durable->get(), 4, /*complete=*/false);  // its publisher stopped

  auto root = RelayRootStore::Open("127.0.0.1:0", dir.File("store"), Fast());
  ASSERT_OK(root);
  EXPECT_NE((*root)->Describe().find("written through to dir:"),
            std::string::npos)
      << (*root)->Describe();
  ASSERT_OK((*root)->Seed(2));
  RelayStore* r = (*root)->root();
  EXPECT_TRUE(r->Get(kHeadKey).ok());
  EXPECT_FALSE(r->Get(IndexKey(2)).ok());
  for (uint64_t v : {3, 4}) {
    EXPECT_TRUE(r->Get(IndexKey(v)).ok()) << v;
    EXPECT_TRUE(r->Get(ChunkKey(v, 1)).ok()) << v;
    EXPECT_TRUE(r->Get(ResendKey(v, "r0", 1, true)).ok()) << v;
    EXPECT_FALSE(r->Get(VoteKey(v, "r0")).ok()) << v;
    EXPECT_FALSE(r->Get(RequestKey(v, "r0")).ok()) << v;
  }
  EXPECT_TRUE(r->Get(DecisionKey(3)).ok());
  EXPECT_FALSE(r->Get(DecisionKey(4)).ok());
  // Reads of what the root does not hold fall back to the durable store.
  auto old = (*root)->Get(ManifestKey(1));
  ASSERT_OK(old);
  EXPECT_EQ(*old, Bytes("manifest"));

  std::mutex mu;
  std::vector<std::string> arrived;
  RelayOptions o = Fast();
  o.keys = ProtocolRelayKeys();
  o.on_arrival = [&](const std::string& key) {
    std::lock_guard<std::mutex> lock(mu);
    arrived.push_back(key);
  };
  auto node = RelayStore::Node("r0", r->listen_address(), "", o);
  ASSERT_OK(node);
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mu);
    return arrived.size() >= 11;  // head, 6 of version 3, 4 of version 4
  }));
  const std::vector<std::string> want = {
      kHeadKey,
      IndexKey(3),
      ChunkKey(3, 0),
      ChunkKey(3, 1),
      ResendKey(3, "r0", 1, true),
      ManifestKey(3),
      DecisionKey(3),
      IndexKey(4),
      ChunkKey(4, 0),
      ChunkKey(4, 1),
      ResendKey(4, "r0", 1, true),
  };
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(arrived, want);
}

// Writes go to the durable store first; its PutIfAbsent decides, and the
// tree gets the winner's bytes.
TEST(RelayRootStoreTest, TheDurableStoreDecidesOnceOnlyObjects) {
  TempDir dir;
  auto root = RelayRootStore::Open("127.0.0.1:0", dir.File("store"), Fast());
  ASSERT_OK(root);
  ObjectStore* durable = (*root)->durable();
  ASSERT_NE(durable, nullptr);

  ASSERT_OK((*root)->Put(IndexKey(1), Bytes("a")));
  EXPECT_EQ(*durable->Get(IndexKey(1)), Bytes("a"));
  EXPECT_EQ(*(*root)->root()->Get(IndexKey(1)), Bytes("a"));

  ASSERT_OK(durable->PutIfAbsent(DecisionKey(1), Bytes("earlier writer")));
  Status lost = (*root)->PutIfAbsent(DecisionKey(1), Bytes("this writer"));
  EXPECT_THAT(lost, StatusIs(StatusCode::kAlreadyExists));
  EXPECT_EQ(*(*root)->root()->Get(DecisionKey(1)), Bytes("earlier writer"));
  ASSERT_OK((*root)->PutIfAbsent(DecisionKey(2), Bytes("first")));
  EXPECT_EQ(*durable->Get(DecisionKey(2)), Bytes("first"));
  EXPECT_EQ(*(*root)->root()->Get(DecisionKey(2)), Bytes("first"));

  ASSERT_OK((*root)->Delete(IndexKey(1)));
  EXPECT_FALSE(durable->Get(IndexKey(1)).ok());
  EXPECT_FALSE((*root)->root()->Get(IndexKey(1)).ok());
}

// Members' votes and requests reach the root over the tree and are copied
// to the durable store; done reports stay at the root.
TEST(RelayRootStoreTest, MirrorUpwardCopiesVotesAndRequests) {
  TempDir dir;
  auto root = RelayRootStore::Open("127.0.0.1:0", dir.File("store"), Fast());
  ASSERT_OK(root);
  RelayOptions o = Fast();
  o.keys = ProtocolRelayKeys();
  auto node = RelayStore::Node("r0", (*root)->root()->listen_address(), "", o);
  ASSERT_OK(node);
  ASSERT_OK((*node)->Put(VoteKey(5, "r0"), Bytes("ready")));
  ASSERT_OK((*node)->Put(RequestKey(5, "r0"), Bytes("chunks")));
  ASSERT_OK((*node)->Put(DoneKey(5, "r0"), Bytes("done")));
  // Nodes write members' keys only.
  EXPECT_THAT((*node)->Put(DecisionKey(5), Bytes("x")),
              StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_TRUE(WaitFor([&] { return (*root)->Get(DoneKey(5, "r0")).ok(); }));
  ASSERT_TRUE(WaitFor([&] { return (*root)->Get(RequestKey(5, "r0")).ok(); }));
  ObjectStore* durable = (*root)->durable();
  EXPECT_FALSE(durable->Get(VoteKey(5, "r0")).ok());
  ASSERT_OK((*root)->MirrorUpward(5));
  EXPECT_EQ(*durable->Get(VoteKey(5, "r0")), Bytes("ready"));
  EXPECT_EQ(*durable->Get(RequestKey(5, "r0")), Bytes("chunks"));
  auto listed = durable->List(VersionPrefix(5));
  ASSERT_OK(listed);
  EXPECT_EQ(listed->size(), 2u);
}

TEST(RelayRootStoreTest, RootAloneWithoutADurableStore) {
  auto root = RelayRootStore::Open("127.0.0.1:0", "", Fast());
  ASSERT_OK(root);
  EXPECT_EQ((*root)->durable(), nullptr);
  ASSERT_OK((*root)->Seed(4));  // nothing to seed from
  ASSERT_OK((*root)->Put(kHeadKey, Bytes("h")));
  EXPECT_EQ(*(*root)->Get(kHeadKey), Bytes("h"));
  EXPECT_THAT((*root)->Get(IndexKey(1)), StatusIs(StatusCode::kNotFound));
  ASSERT_OK((*root)->MirrorUpward(1));
}

}  // namespace
}  // namespace refit
