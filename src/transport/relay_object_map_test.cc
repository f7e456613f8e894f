// The relay endpoint's object map without sockets (relay_object_map.h):
// replacement and once-only conflicts, the version window and the byte
// cap, the logs' replay order, and each child's queue accounting.
#include "transport/relay_object_map.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace refit::internal {
namespace {

using Result = RelayObjectMap::InsertResult;

std::vector<uint8_t> Bytes(std::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

RelayObjectPtr Down(const std::string& key, std::string_view data,
                    std::optional<uint64_t> version = std::nullopt,
                    bool once = false) {
  return MakeRelayObject(key, Bytes(data),
                         once ? RelayFrameType::kPutOnce : RelayFrameType::kPut,
                         /*up=*/false, version);
}

RelayObjectPtr Up(const std::string& key, std::string_view data) {
  return MakeRelayObject(key, Bytes(data), RelayFrameType::kPut, /*up=*/true,
                         std::nullopt);
}

std::vector<std::string> DownLog(const RelayObjectMap& m) {
  std::vector<std::string> keys;
  for (RelayObjectPtr o = m.NextDown(0); o; o = m.NextDown(o->seq)) {
    keys.push_back(o->key);
  }
  return keys;
}

TEST(RelayObjectMapTest, ReplacesDeduplicatesAndRefusesOnceOnlyConflicts) {
  RelayObjectMap m("root", /*up_log=*/false, 4, 1 << 20);
  std::string why;
  EXPECT_EQ(m.Insert(Down("a", "1"), false, &why), Result::kInserted);
  EXPECT_EQ(m.Insert(Down("b", "2"), false, &why), Result::kInserted);
  EXPECT_EQ(m.Insert(Down("a", "1"), false, &why), Result::kDuplicate);
  // A replaced object leaves its place in the log: replay is in write order.
  EXPECT_EQ(m.Insert(Down("a", "3"), false, &why), Result::kInserted);
  EXPECT_EQ(DownLog(m), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(m.Find("a")->data, Bytes("3"));
  EXPECT_EQ(m.objects(), 2u);
  EXPECT_EQ(m.bytes(), 2u);

  EXPECT_EQ(m.Insert(Down("d", "x", std::nullopt, true), false, &why),
            Result::kInserted);
  EXPECT_EQ(m.Insert(Down("d", "y", std::nullopt, true), false, &why),
            Result::kConflict);
  EXPECT_NE(why.find("relay root: refused a second, different object for "
                     "once-only key 'd'"),
            std::string::npos)
      << why;
  EXPECT_EQ(m.Find("d")->data, Bytes("x"));
  // A write at this endpoint may replace it.
  EXPECT_EQ(m.Insert(Down("d", "y", std::nullopt, true), true, &why),
            Result::kInserted);

  m.Erase("a");
  m.Erase("absent");
  EXPECT_EQ(m.Find("a"), nullptr);
  EXPECT_EQ(DownLog(m), (std::vector<std::string>{"b", "d"}));
  const std::vector<ObjectInfo> listed = m.List("");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].key, "b");
  EXPECT_EQ(listed[1].size, 1u);
}

TEST(RelayObjectMapTest, KeepsTheNewestVersionsAndRefusesOlderOnes) {
  RelayObjectMap m("node n0", /*up_log=*/true, 2, 1 << 20);
  std::string why;
  EXPECT_EQ(m.Insert(Down("head", "h"), false, &why), Result::kInserted);
  EXPECT_EQ(m.Insert(Down("v1/a", "a", 1), false, &why), Result::kInserted);
  EXPECT_EQ(m.Insert(Down("v1/b", "b", 1), false, &why), Result::kInserted);
  EXPECT_EQ(m.Insert(Down("v2/a", "a", 2), false, &why), Result::kInserted);
  EXPECT_EQ(m.evicted(), 0u);
  // Version 3 opens a third version: version 1 goes, unversioned keys stay.
  EXPECT_EQ(m.Insert(Down("v3/a", "a", 3), false, &why), Result::kInserted);
  EXPECT_EQ(m.evicted(), 2u);
  EXPECT_EQ(m.Find("v1/a"), nullptr);
  EXPECT_NE(m.Find("head"), nullptr);
  EXPECT_EQ(DownLog(m), (std::vector<std::string>{"head", "v2/a", "v3/a"}));
  // Older than every kept version.
  EXPECT_EQ(m.Insert(Down("v1/c", "c", 1), false, &why), Result::kStale);
  EXPECT_EQ(m.Find("v1/c"), nullptr);
  // A kept version takes more objects without evicting.
  EXPECT_EQ(m.Insert(Down("v2/b", "b", 2), false, &why), Result::kInserted);
  EXPECT_EQ(m.evicted(), 2u);
}

TEST(RelayObjectMapTest, CapsTheBytesHeld) {
  RelayObjectMap m("root", false, 4, 10);
  std::string why;
  EXPECT_EQ(m.Insert(Down("a", "123456"), false, &why), Result::kInserted);
  EXPECT_EQ(m.Insert(Down("b", "12345"), false, &why), Result::kOverCap);
  EXPECT_NE(why.find("over max_store_bytes 10"), std::string::npos) << why;
  // Replacing counts the old object's bytes out first.
  EXPECT_EQ(m.Insert(Down("a", "1234567890"), false, &why), Result::kInserted);
  EXPECT_EQ(m.bytes(), 10u);
}

TEST(RelayObjectMapTest, UpObjectsHaveTheirOwnLogAtNodesOnly) {
  RelayObjectMap node("node n0", /*up_log=*/true, 4, 1 << 20);
  RelayObjectMap root("root", /*up_log=*/false, 4, 1 << 20);
  std::string why;
  for (RelayObjectMap* m : {&node, &root}) {
    EXPECT_EQ(m->Insert(Down("d", "1"), false, &why), Result::kInserted);
    EXPECT_EQ(m->Insert(Up("u", "2"), false, &why), Result::kInserted);
    EXPECT_EQ(DownLog(*m), std::vector<std::string>{"d"});
    EXPECT_NE(m->Find("u"), nullptr);
  }
  ASSERT_NE(node.NextUp(0), nullptr);
  EXPECT_EQ(node.NextUp(0)->key, "u");
  EXPECT_EQ(node.NextUp(node.NextUp(0)->seq), nullptr);
  EXPECT_EQ(root.NextUp(0), nullptr);
}

TEST(RelayObjectMapTest, ChildQueuesCountLiveBytesNotReplay) {
  RelayObjectMap m("root", false, 4, 1 << 20);
  std::string why;
  ASSERT_EQ(m.Insert(Down("old", "12345"), false, &why), Result::kInserted);
  RelayChildFlow fast, slow;
  m.AddChild(&fast, "child fast");
  m.AddChild(&slow, "child slow");
  EXPECT_EQ(m.children(), 2);
  // What was held at the hello is replay: it costs no queue bytes.
  EXPECT_EQ(slow.queued, 0u);
  ASSERT_EQ(m.Insert(Down("new", "123"), false, &why), Result::kInserted);
  ASSERT_EQ(m.Insert(Down("newer", "1234"), false, &why), Result::kInserted);
  EXPECT_EQ(slow.queued, 7u);
  EXPECT_EQ(m.max_child_queue_bytes(), 7u);
  EXPECT_TRUE(m.AnyChildOver(6));
  EXPECT_FALSE(m.AnyChildOver(7));

  // The fast child is sent everything, replay first.
  for (RelayObjectPtr o = m.NextDown(fast.cursor); o;
       o = m.NextDown(fast.cursor)) {
    m.Sent(&fast, o, /*child=*/true);
  }
  EXPECT_EQ(fast.queued, 0u);
  ASSERT_NE(m.Slowest(), nullptr);
  EXPECT_EQ(m.Slowest()->name, "child slow");

  // An object dropped before it was sent leaves the queue with it.
  m.Erase("new");
  EXPECT_EQ(slow.queued, 4u);
  EXPECT_EQ(fast.queued, 0u);
  // A replaced object, sent late, no longer counts: its replacement does.
  RelayObjectPtr stale = m.Find("newer");
  ASSERT_EQ(m.Insert(Down("newer", "12"), false, &why), Result::kInserted);
  EXPECT_EQ(slow.queued, 2u);
  m.Sent(&slow, stale, /*child=*/true);
  EXPECT_EQ(slow.queued, 2u);

  m.RemoveChild(&slow);
  m.RemoveChild(&slow);
  EXPECT_EQ(m.children(), 1);
  EXPECT_FALSE(slow.registered);
  ASSERT_EQ(m.Insert(Down("last", "1"), false, &why), Result::kInserted);
  EXPECT_EQ(slow.queued, 2u);  // no longer counted
  EXPECT_EQ(fast.queued, 3u);  // the replacement and "last"
}

}  // namespace
}  // namespace refit::internal
