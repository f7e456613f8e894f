// The protocol's store layout (sync/keys.h): every maker's exact key, the
// parser as their exact inverse, and what it refuses.
#include "sync/keys.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/status_matchers.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

constexpr char kV7[] = "00000000000000000007";

TEST(KeysTest, MakersWriteTheDocumentedLayout) {
  const std::string v = kV7;
  EXPECT_EQ(IndexKey(7), "index/" + v);
  EXPECT_EQ(VersionPrefix(7), "v/" + v + "/");
  EXPECT_EQ(ManifestKey(7), "v/" + v + "/manifest");
  EXPECT_EQ(ChunkKey(7, 3), "v/" + v + "/chunk/00000003");
  EXPECT_EQ(ChunkKey(7, 123456789), "v/" + v + "/chunk/123456789");
  EXPECT_EQ(VotePrefix(7), "v/" + v + "/vote/");
  EXPECT_EQ(VoteKey(7, "r0"), "v/" + v + "/vote/r0");
  EXPECT_EQ(DoneKey(7, "r0"), "v/" + v + "/vote/r0/done");
  EXPECT_EQ(DecisionKey(7), "v/" + v + "/decision");
  EXPECT_EQ(RequestPrefix(7), "v/" + v + "/request/");
  EXPECT_EQ(RequestKey(7, "r0"), "v/" + v + "/request/r0");
  EXPECT_EQ(ResendPrefix(7), "v/" + v + "/resend/");
  EXPECT_EQ(ResendKey(7, "r0", 12, true), "v/" + v + "/resend/r0/12-a");
  EXPECT_EQ(ResendKey(7, "r0", 0, false), "v/" + v + "/resend/r0/0-b");
  EXPECT_EQ(SnapshotPrefix(7), "snap/" + v + "/");
  EXPECT_EQ(SnapshotIndexKey(7), "snap/" + v + "/index");
  EXPECT_EQ(SnapshotFileKey(7, 2), "snap/" + v + "/file/00000002");
  EXPECT_EQ(IndexKey(UINT64_MAX), "index/18446744073709551615");
  for (const std::string& k :
       {IndexKey(1), ManifestKey(1), ChunkKey(1, 1), VoteKey(1, "r0"),
        DoneKey(1, "r0"), ResendKey(1, "r0", 1, true), SnapshotFileKey(1, 1)}) {
    EXPECT_TRUE(ValidateKey(k).ok()) << k;
  }
}

TEST(KeysTest, ParseKeyIsTheMakersInverse) {
  const std::vector<std::string> keys = {
      kHeadKey,
      IndexKey(0),
      IndexKey(UINT64_MAX),
      ManifestKey(7),
      ChunkKey(7, 0),
      ChunkKey(7, 99999999),
      ChunkKey(7, UINT64_MAX),
      VoteKey(7, "r-1.x_2"),
      DoneKey(7, "r0"),
      DecisionKey(7),
      RequestKey(7, "r0"),
      ResendKey(7, "r0", 0, false),
      ResendKey(7, "r0", 1234, true),
      SnapshotIndexKey(7),
      SnapshotFileKey(7, 5),
  };
  for (const std::string& k : keys) {
    auto parsed = ParseKey(k);
    ASSERT_TRUE(parsed.has_value()) << k;
    EXPECT_EQ(KeyOf(*parsed), k);
  }
  auto r = ParseKey(ResendKey(9, "r3", 42, true));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, KeyInfo::Kind::kResend);
  EXPECT_EQ(r->version, 9u);
  EXPECT_EQ(r->member, "r3");
  EXPECT_EQ(r->index, 42u);
  EXPECT_TRUE(r->after);
  EXPECT_EQ(ParseKey(DoneKey(9, "r3"))->kind, KeyInfo::Kind::kDone);
}

TEST(KeysTest, ParseKeyRefusesWhatNoMakerWrites) {
  const std::string v = kV7;
  for (const std::string& bad : {
           std::string(""),
           std::string("heads"),
           std::string("index/7"),                     // not 20 digits
           std::string("index/18446744073709551616"),  // above 2^64 - 1
           "index/" + v + "/x",
           "v/" + v,
           "v/" + v + "/",
           "v/" + v + "/manifest/x",
           "v/" + v + "/chunk/3",          // not 8 digits
           "v/" + v + "/chunk/000000003",  // padded beyond 8
           "v/" + v + "/chunk/0000000a",
           "v/" + v + "/vote/",
           "v/" + v + "/vote/r0/",
           "v/" + v + "/vote/r0/other",
           "v/" + v + "/vote/a b",
           "v/" + v + "/vote/..",
           "v/" + v + "/request/r0/done",
           "v/" + v + "/resend/r0/12",
           "v/" + v + "/resend/r0/012-a",
           "v/" + v + "/resend/r0/-a",
           "v/" + v + "/resend/r0/1-c",
           "v/" + v + "/resend/r0/1-a/x",
           "v/" + v + "/other",
           "snap/" + v + "/file/1",
           "snap/" + v + "/files/00000001",
           "snap/" + v,
           "x/" + v + "/manifest",
       }) {
    EXPECT_FALSE(ParseKey(bad).has_value()) << bad;
    EXPECT_FALSE(IsMemberKey(bad)) << bad;
    EXPECT_FALSE(VersionOfKey(bad).has_value()) << bad;
  }
}

TEST(KeysTest, IndexAndSnapshotKeysAndListings) {
  EXPECT_EQ(ParseIndexKey(IndexKey(42)), 42u);
  EXPECT_FALSE(ParseIndexKey(ManifestKey(42)).has_value());
  EXPECT_EQ(ParseSnapshotIndexKey(SnapshotIndexKey(42)), 42u);
  EXPECT_FALSE(ParseSnapshotIndexKey(SnapshotFileKey(42, 0)).has_value());
  EXPECT_FALSE(
      ParseSnapshotIndexKey("snap/18446744073709551616/index").has_value());
  const std::vector<ObjectInfo> listing = {
      {IndexKey(3), 1}, {"index/junk", 1}, {IndexKey(1), 1}, {IndexKey(20), 1}};
  EXPECT_EQ(VersionsOf(listing), (std::vector<uint64_t>{1, 3, 20}));
}

TEST(KeysTest, PartChunkKeysReadBack) {
  for (const PartChunkId id : {PartChunkId{1, 0, 0}, PartChunkId{42, 7, 123},
                               PartChunkId{UINT64_MAX, UINT32_MAX, 12345678901}}) {
    const std::string key = PartChunkKey(id.version, id.rank, id.k);
    EXPECT_EQ(key.rfind(PartsPrefix(id.version), 0), 0u) << key;
    auto back = ParsePartChunkKey(key);
    ASSERT_TRUE(back.has_value()) << key;
    EXPECT_EQ(back->version, id.version);
    EXPECT_EQ(back->rank, id.rank);
    EXPECT_EQ(back->k, id.k);
  }
  const std::string good = PartChunkKey(3, 2, 1);
  for (const std::string& bad :
       {PartListKey(3, 2), ChunkKey(3, 1), good + "/x", good.substr(0, good.size() - 1),
        std::string("parts/00000000000000000003/0000000002/chunk/00000000001"),
        std::string("parts/00000000000000000003/4294967296/chunk/0000000001"),
        std::string("parts/00000000000000000003/000000002/chunk/0000000001"),
        std::string("parts/00000000000000000003/0000000002/chunks/0000000001")}) {
    EXPECT_FALSE(ParsePartChunkKey(bad).has_value()) << bad;
  }
}

// Members' keys flow up a relay tree; the rest flow down.
TEST(KeysTest, MemberKeysAndVersionsOfKeys) {
  EXPECT_TRUE(IsMemberKey("v/00000000000000000001/vote/r1"));
  EXPECT_TRUE(IsMemberKey("v/00000000000000000001/request/r1"));
  EXPECT_FALSE(IsMemberKey("v/00000000000000000001/decision"));
  EXPECT_FALSE(IsMemberKey("head"));
  EXPECT_TRUE(IsMemberKey(DoneKey(1, "r1")));
  EXPECT_FALSE(IsMemberKey(ResendKey(1, "r1", 0, true)));
  EXPECT_FALSE(IsMemberKey(IndexKey(1)));

  EXPECT_EQ(VersionOfKey(IndexKey(5)), 5u);
  EXPECT_EQ(VersionOfKey(ChunkKey(5, 1)), 5u);
  EXPECT_EQ(VersionOfKey(VoteKey(5, "r0")), 5u);
  EXPECT_FALSE(VersionOfKey(kHeadKey).has_value());
  EXPECT_FALSE(VersionOfKey(SnapshotIndexKey(5)).has_value());
  EXPECT_FALSE(VersionOfKey(SnapshotFileKey(5, 0)).has_value());
}

TEST(KeysTest, MemberNames) {
  EXPECT_TRUE(ValidateMember("r0").ok());
  EXPECT_TRUE(ValidateMember(std::string(64, 'a')).ok());
  for (const std::string& bad :
       {std::string(""), std::string(65, 'a'), std::string("."),
        std::string(".."), std::string("../x"), std::string("a b"),
        std::string("r0/done")}) {
    EXPECT_THAT(ValidateMember(bad), StatusIs(StatusCode::kInvalidArgument))
        << bad;
  }
}

}  // namespace
}  // namespace refit
