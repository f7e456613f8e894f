// The ObjectStore contract (object_store.h) on the directory store and the
// S3 store against a private moto_server (the shared suite,
// tests/support/store_suite.h; S3 cases skip, loudly, when moto_server is
// not on PATH), then what is particular to the directory store.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support/status_matchers.h"
#include "support/store_suite.h"
#include "support/testing.h"
#include "transport/object_store.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using ::refit::testing::StoreTest;
using ::refit::testing::TempDir;

std::vector<uint8_t> Bytes(std::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

// The ObjectStore contract (tests/support/store_suite.cc) on the directory
// and S3 stores.
INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values("dir", "s3"),
                         ::refit::testing::StoreBackendName);

// Directory-store specifics: what the file system shows.
TEST(DirStoreTest, TemporariesAndForeignFilesAreInvisible) {
  TempDir dir;
  auto store = OpenObjectStore("file://" + dir.path() + "/s");
  ASSERT_OK(store);
  ASSERT_OK((*store)->Put("v/a", Bytes("a")));
  // What a crashed writer leaves behind, and files that are not objects.
  std::ofstream(dir.path() + "/s/v/~tmp.1.2.3") << "torn";
  std::ofstream(dir.path() + "/s/v/not a key") << "x";
  auto listed = (*store)->List("");
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].key, "v/a");
  // No temporaries remain after successful writes.
  ASSERT_OK((*store)->PutIfAbsent("v/b", Bytes("b")));
  EXPECT_THAT((*store)->PutIfAbsent("v/b", Bytes("c")),
              StatusIs(StatusCode::kAlreadyExists));
  int files = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(dir.path() + "/s/v")) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 4);  // a, b and the two planted files
}

// The race again with processes, which is what link(2) is there for.
TEST(DirStoreTest, PutIfAbsentRaceAcrossProcesses) {
  TempDir dir;
  constexpr int kWriters = 8;
  for (int round = 0; round < 20; ++round) {
    const std::string key = "race/p-" + std::to_string(round);
    std::vector<pid_t> pids;
    for (int w = 0; w < kWriters; ++w) {
      pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        auto store = OpenObjectStore(dir.path() + "/s");
        if (!store.ok()) _exit(2);
        Status s =
            (*store)->PutIfAbsent(key, Bytes("writer " + std::to_string(w)));
        _exit(s.ok() ? 0 : s.code() == StatusCode::kAlreadyExists ? 1 : 2);
      }
      pids.push_back(pid);
    }
    int winners = 0;
    int winner = -1;
    for (int w = 0; w < kWriters; ++w) {
      int wstatus = 0;
      ASSERT_EQ(waitpid(pids[static_cast<size_t>(w)], &wstatus, 0),
                pids[static_cast<size_t>(w)]);
      ASSERT_TRUE(WIFEXITED(wstatus));
      ASSERT_NE(WEXITSTATUS(wstatus), 2) << "writer " << w << " failed";
      if (WEXITSTATUS(wstatus) == 0) {
        ++winners;
        winner = w;
      }
    }
    ASSERT_EQ(winners, 1) << "round " << round;
    auto store = OpenObjectStore(dir.path() + "/s");
    ASSERT_OK(store);
    EXPECT_EQ(*(*store)->Get(key), Bytes("writer " + std::to_string(winner)));
  }
}

TEST(DirStoreTest, KeyCannotBeBothObjectAndDirectory) {
  TempDir dir;
  auto store = OpenObjectStore(dir.path() + "/s");
  ASSERT_OK(store);
  ASSERT_OK((*store)->Put("a/b", Bytes("object")));
  EXPECT_THAT((*store)->Put("a/b/c", Bytes("x")),
              StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_OK((*store)->Put("x/y/z", Bytes("object")));
  Status s = (*store)->Put("x/y", Bytes("x"));
  EXPECT_FALSE(s.ok());
  EXPECT_OK((*store)->Delete("x/y"));  // a directory is no object: no-op
  EXPECT_EQ(*(*store)->Get("x/y/z"), Bytes("object"));
}

TEST(DirStoreTest, CreatesRootAndRejectsFiles) {
  TempDir dir;
  EXPECT_OK(OpenObjectStore(dir.path() + "/deep/er/root"));
  std::ofstream(dir.path() + "/file") << "x";
  EXPECT_FALSE(OpenObjectStore(dir.path() + "/file").ok());
  EXPECT_THAT(OpenObjectStore("file://relative/x"),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(OpenObjectStore("gs://bucket/x"),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(OpenObjectStore(""), StatusIs(StatusCode::kInvalidArgument));
}

// Readers must not create a store, so a mistyped path is an error rather
// than an empty store.
TEST(DirStoreTest, OpeningForReadingDoesNotCreate) {
  TempDir dir;
  StoreOptions read_only;
  read_only.create_if_missing = false;
  auto missing = OpenObjectStore(dir.path() + "/typo/stor", read_only);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing, StatusIs(StatusCode::kNotFound));
  EXPECT_NE(missing.status().message().find("no store at"), std::string::npos)
      << missing.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/typo"));
  EXPECT_THAT(OpenObjectStore("file://" + dir.path() + "/nope", read_only),
              StatusIs(StatusCode::kNotFound));
  ASSERT_OK(OpenObjectStore(dir.path() + "/s"));  // writers create it
  EXPECT_OK(OpenObjectStore(dir.path() + "/s", read_only));
}

// A path over the file system's limit is the caller's mistake, not a bug.
TEST(DirStoreTest, OverlongPathIsInvalidArgument) {
  TempDir dir;
  auto store = OpenObjectStore(dir.path() + "/" + std::string(300, 'a'));
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store, StatusIs(StatusCode::kInvalidArgument));
}

// A link inside the store (here planted where a receiver's vote goes) must
// never be followed: every operation through it is refused, and nothing
// outside the store is read, written, listed or removed.
TEST(DirStoreTest, RefusesSymbolicLinksInsideTheStore) {
  TempDir dir;
  const std::string root = dir.path() + "/s";
  const std::string outside = dir.path() + "/outside";
  std::filesystem::create_directories(outside);
  std::ofstream(outside + "/secret") << "outside";
  auto store = OpenObjectStore(root);
  ASSERT_OK(store);
  ObjectStore* s = store->get();
  ASSERT_OK(s->Put("votes/1/r1", Bytes("yes")));

  // A key's folder replaced by a link to a folder outside.
  std::filesystem::create_directory_symlink(outside, root + "/votes/2");
  auto is_refused = [](const Status& st) {
    return st.code() == StatusCode::kFailedPrecondition &&
           st.message().find("symbolic link") != std::string_view::npos;
  };
  EXPECT_PRED1(is_refused, s->Put("votes/2/r0", Bytes("yes")));
  EXPECT_PRED1(is_refused, s->PutIfAbsent("votes/2/r0", Bytes("yes")));
  EXPECT_PRED1(is_refused, s->Put("votes/2/deeper/r0", Bytes("yes")));
  EXPECT_PRED1(is_refused, s->Get("votes/2/secret").status());
  EXPECT_PRED1(is_refused, s->Delete("votes/2/secret"));
  EXPECT_PRED1(is_refused, s->List("votes/2/").status());
  EXPECT_PRED1(is_refused, s->List("").status());
  EXPECT_PRED1(is_refused, s->List("votes/").status());

  // A key's file replaced by a link to a file outside.
  std::filesystem::remove(root + "/votes/2");
  ASSERT_OK(s->Put("votes/3/r1", Bytes("yes")));
  std::filesystem::create_symlink(outside + "/secret", root + "/votes/3/r0");
  EXPECT_PRED1(is_refused, s->Get("votes/3/r0").status());
  EXPECT_PRED1(is_refused, s->Put("votes/3/r0", Bytes("yes")));
  EXPECT_PRED1(is_refused, s->PutIfAbsent("votes/3/r0", Bytes("yes")));
  EXPECT_PRED1(is_refused, s->Delete("votes/3/r0"));
  EXPECT_PRED1(is_refused, s->List("votes/3/").status());
  // Untouched: the link still points outside and the target kept its bytes.
  EXPECT_TRUE(std::filesystem::is_symlink(root + "/votes/3/r0"));
  std::ifstream in(outside + "/secret");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "outside");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(outside),
                          std::filesystem::directory_iterator()),
            1);

  // Objects beside the links are still served.
  EXPECT_EQ(*s->Get("votes/3/r1"), Bytes("yes"));
  EXPECT_EQ(*s->Get("votes/1/r1"), Bytes("yes"));
  std::filesystem::remove(root + "/votes/3/r0");
  auto listed = s->List("votes/");
  ASSERT_OK(listed);
  EXPECT_EQ(listed->size(), 2u);
}

}  // namespace
}  // namespace refit
