// Reading sealed protocol objects back (sync/object_reader.h) from a
// directory store: absent objects, the version check, and which step
// fails for another key or a damaged object.
#include "sync/object_reader.h"

#include <gtest/gtest.h>

#include "support/status_matchers.h"
#include "support/testing.h"
#include "sync/keys.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using testing::TempDir;

Authenticator Key(uint8_t fill) {
  return *Authenticator::Hmac(std::vector<uint8_t>(32, fill));
}

class ObjectReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = OpenObjectStore(dir_.File("store"));
    ASSERT_OK(s);
    store_ = std::move(*s);
  }
  void Put(const std::string& key, const std::vector<uint8_t>& bytes) {
    ASSERT_OK(store_->Put(key, bytes));
  }

  TempDir dir_;
  std::unique_ptr<ObjectStore> store_;
  Authenticator auth_ = Key(7);
};

TEST_F(ObjectReaderTest, ReadsWhatThePublisherAndMembersWrote) {
  ObjectReader reader(store_.get(), auth_);
  auto no_head = reader.ReadHead();
  ASSERT_OK(no_head);
  EXPECT_FALSE(no_head->has_value());

  Put(kHeadKey, auth_.Seal(EncodeHead(2)));
  Announcement a;
  a.version = 3;
  a.base_version = 2;
  a.members = {"r0", "r1"};
  const std::vector<uint8_t> sealed = auth_.Seal(EncodeAnnouncement(a));
  Put(IndexKey(3), sealed);
  Put(IndexKey(1),
      auth_.Seal(EncodeAnnouncement(Announcement{1, 0, {"r0"}, {}})));
  Put("index/junk", {1});
  Put(DecisionKey(3), auth_.Seal(EncodeDecision(Decision{3, false, {}, "no", {}})));
  Put(VoteKey(3, "r0"), auth_.SealMember(EncodeVote(Vote{true, "", {}})));

  EXPECT_EQ(**reader.ReadHead(), 2u);
  EXPECT_EQ(*reader.ListVersions(), (std::vector<uint64_t>{1, 3}));
  Sha256 sha{};
  auto read = reader.ReadAnnouncement(3, &sha);
  ASSERT_OK(read);
  EXPECT_EQ(read->members, a.members);
  EXPECT_EQ(sha, ComputeSha256(sealed));
  auto manifest = reader.ReadManifest(3);
  ASSERT_OK(manifest);
  EXPECT_FALSE(manifest->has_value());  // still uploading
  auto decision = reader.ReadDecision(3);
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->has_value());
  EXPECT_FALSE((*decision)->commit);
  EXPECT_EQ((*decision)->reason, "no");
  auto vote = reader.ReadVote(3, "r0");
  ASSERT_OK(vote);
  ASSERT_TRUE(vote->has_value());
  EXPECT_TRUE((*vote)->ready);
  EXPECT_FALSE(reader.ReadVote(3, "r1")->has_value());
  // An announcement is read because it was listed: absent is an error.
  EXPECT_THAT(reader.ReadAnnouncement(4), StatusIs(StatusCode::kNotFound));
}

TEST_F(ObjectReaderTest, AnObjectNamingAnotherVersionIsRefused) {
  ObjectReader reader(store_.get(), auth_);
  Put(IndexKey(4),
      auth_.Seal(EncodeAnnouncement(Announcement{3, 2, {"r0"}, {}})));
  Put(DecisionKey(4), auth_.Seal(EncodeDecision(Decision{3, true, {}, "", {}})));
  auto a = reader.ReadAnnouncement(4);
  EXPECT_THAT(a, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(a.status().message().find("announcement names another version"),
            std::string::npos);
  EXPECT_THAT(reader.ReadDecision(4), StatusIs(StatusCode::kDataLoss));
}

TEST_F(ObjectReaderTest, StepSaysWhetherTheKeyOrTheObjectIsWrong) {
  ObjectReader reader(store_.get(), auth_);
  ObjectReader other_key(store_.get(), Key(9));
  Put(kHeadKey, auth_.Seal(EncodeHead(5)));
  ObjectReader::Step step = ObjectReader::Step::kFetch;
  auto head = other_key.ReadHead(&step);
  EXPECT_THAT(head, StatusIs(StatusCode::kUnauthenticated));
  EXPECT_EQ(step, ObjectReader::Step::kOpen);

  // A sealed vote whose body is not a vote.
  const std::vector<uint8_t> not_a_vote = {'n', 'o', 'p', 'e'};
  Put(VoteKey(1, "r0"), auth_.SealMember(not_a_vote));
  auto vote = reader.ReadVote(1, "r0", &step);
  EXPECT_THAT(vote, StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ(step, ObjectReader::Step::kDecode);

  auto fine = reader.ReadHead(&step);
  ASSERT_OK(fine);
  EXPECT_EQ(step, ObjectReader::Step::kDecode);
}

}  // namespace
}  // namespace refit
