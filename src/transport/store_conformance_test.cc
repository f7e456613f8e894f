// One conformance suite for every ObjectStore backend (object_store.h is the
// contract): the directory store, and the S3 store against a private
// moto_server. S3 cases skip, loudly, when moto_server is not on PATH.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <latch>
#include <random>
#include <thread>

#include "support/moto_testing.h"
#include "support/status_matchers.h"
#include "support/testing.h"
#include "transport/object_store.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using ::refit::testing::MotoServer;
using ::refit::testing::TempDir;

std::vector<uint8_t> Bytes(std::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr uint64_t kPartSize = 5 << 20;  // S3's (and moto's) minimum

  static void TearDownTestSuite() { moto_.reset(); }

  void SetUp() override {
    if (GetParam() == "s3") {
      if (!moto_) {
        auto started = MotoServer::Start();
        if (started.status().code() == StatusCode::kNotFound) {
          GTEST_SKIP() << "\n*** SKIPPED: moto_server is not on PATH, so the "
                          "S3 store is NOT tested. Install it with "
                          "`pip install 'moto[server]'`. ***\n";
        }
        ASSERT_OK(started);
        moto_ = std::move(*started);
      }
    }
    auto s = NewStore();
    ASSERT_OK(s);
    store_ = std::move(*s);
  }

  // A fresh store object on this test's namespace (each call on the same
  // data, as another process would see it).
  Result<std::unique_ptr<ObjectStore>> NewStore() {
    if (GetParam() == "dir") return OpenObjectStore(dir_.path() + "/store");
    std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
    }
    StoreOptions o = moto_->Options();
    o.multipart_threshold = kPartSize;
    return OpenObjectStore(std::string("s3://") + MotoServer::kBucket + "/" +
                               name + "-" + std::to_string(getpid()),
                           o);
  }

  static std::unique_ptr<MotoServer> moto_;
  TempDir dir_;
  std::unique_ptr<ObjectStore> store_;
};

std::unique_ptr<MotoServer> StoreTest::moto_;

TEST_P(StoreTest, PutGetOverwrite) {
  ASSERT_OK(store_->Put("a/b/c", Bytes("first")));
  auto got = store_->Get("a/b/c");
  ASSERT_OK(got);
  EXPECT_EQ(*got, Bytes("first"));
  ASSERT_OK(store_->Put("a/b/c", Bytes("second, longer")));
  got = store_->Get("a/b/c");
  ASSERT_OK(got);
  EXPECT_EQ(*got, Bytes("second, longer"));
  ASSERT_OK(store_->Put("a/b/c", Bytes("3")));
  EXPECT_EQ(*store_->Get("a/b/c"), Bytes("3"));
  // Another store object on the same location sees the same data.
  auto other = NewStore();
  ASSERT_OK(other);
  EXPECT_EQ(*(*other)->Get("a/b/c"), Bytes("3"));
  EXPECT_FALSE(store_->Describe().empty());
}

TEST_P(StoreTest, MissingKey) {
  EXPECT_THAT(store_->Get("nope"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(store_->Get("no/such/dir/key"), StatusIs(StatusCode::kNotFound));
  ASSERT_OK(store_->Put("dir/x", Bytes("x")));
  // A prefix is not an object.
  EXPECT_THAT(store_->Get("dir"), StatusIs(StatusCode::kNotFound));
  auto listed = store_->List("absent/");
  ASSERT_OK(listed);
  EXPECT_TRUE(listed->empty());
}

TEST_P(StoreTest, ListPrefixes) {
  const std::vector<std::string> keys = {"v1/a", "v1/b/c",   "v10/x",  "v2/a",
                                         "top",  "v1/b/d.e", ".hidden"};
  for (const auto& k : keys) ASSERT_OK(store_->Put(k, Bytes(k + "!")));
  auto keys_of = [](const std::vector<ObjectInfo>& v) {
    std::vector<std::string> out;
    for (const auto& o : v) out.push_back(o.key);
    return out;
  };
  auto all = store_->List("");
  ASSERT_OK(all);
  std::vector<std::string> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(keys_of(*all), sorted);
  for (const auto& o : *all) EXPECT_EQ(o.size, o.key.size() + 1) << o.key;

  auto v1 = store_->List("v1/");
  ASSERT_OK(v1);
  EXPECT_EQ(keys_of(*v1),
            (std::vector<std::string>{"v1/a", "v1/b/c", "v1/b/d.e"}));
  auto v1_partial = store_->List("v1");
  ASSERT_OK(v1_partial);
  EXPECT_EQ(keys_of(*v1_partial),
            (std::vector<std::string>{"v1/a", "v1/b/c", "v1/b/d.e", "v10/x"}));
  auto deep = store_->List("v1/b/d");
  ASSERT_OK(deep);
  EXPECT_EQ(keys_of(*deep), (std::vector<std::string>{"v1/b/d.e"}));
  auto exact = store_->List("top");
  ASSERT_OK(exact);
  EXPECT_EQ(keys_of(*exact), (std::vector<std::string>{"top"}));
}

TEST_P(StoreTest, ListManyKeys) {
  // More than one ListObjectsV2 page (1000 keys).
  constexpr int kKeys = 1234;
  std::atomic<int> next{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < kKeys;) {
        char key[32];
        std::snprintf(key, sizeof key, "many/k-%05d", i);
        if (!store_->Put(key, Bytes(std::to_string(i))).ok()) ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(errors.load(), 0);
  ASSERT_OK(store_->Put("manx", Bytes("not under many/")));
  auto listed = store_->List("many/");
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), static_cast<size_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) {
    char key[32];
    std::snprintf(key, sizeof key, "many/k-%05d", i);
    ASSERT_EQ((*listed)[static_cast<size_t>(i)].key, key);
    ASSERT_EQ((*listed)[static_cast<size_t>(i)].size, std::to_string(i).size());
  }
  auto some = store_->List("many/k-011");
  ASSERT_OK(some);
  EXPECT_EQ(some->size(), 100u);
}

TEST_P(StoreTest, Delete) {
  ASSERT_OK(store_->Put("d/one", Bytes("1")));
  ASSERT_OK(store_->Put("d/two", Bytes("2")));
  ASSERT_OK(store_->Delete("d/one"));
  EXPECT_THAT(store_->Get("d/one"), StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(*store_->Get("d/two"), Bytes("2"));
  auto listed = store_->List("d/");
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].key, "d/two");
  ASSERT_OK(store_->Delete("d/one"));      // absent: fine
  ASSERT_OK(store_->Delete("never/was"));  // absent: fine
}

TEST_P(StoreTest, BinaryDataAndEmptyObjects) {
  std::vector<uint8_t> all(512);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint8_t>(i);
  all.insert(all.end(), 1000, 0);  // trailing zeros
  ASSERT_OK(store_->Put("bin", all));
  EXPECT_EQ(*store_->Get("bin"), all);
  ASSERT_OK(store_->Put("zeros", std::vector<uint8_t>(4096, 0)));
  EXPECT_EQ(*store_->Get("zeros"), std::vector<uint8_t>(4096, 0));
  ASSERT_OK(store_->Put("empty", {}));
  auto empty = store_->Get("empty");
  ASSERT_OK(empty);
  EXPECT_TRUE(empty->empty());
  ASSERT_OK(store_->PutIfAbsent("empty2", {}));
  auto listed = store_->List("empty");
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].size, 0u);
}

TEST_P(StoreTest, BigObjectOverMultipartThreshold) {
  // Three parts: two of the minimum part size and a short tail.
  const std::vector<uint8_t> big = RandomBytes(2 * kPartSize + 12345, 7);
  ASSERT_OK(store_->Put("big/one", big));
  auto got = store_->Get("big/one");
  ASSERT_OK(got);
  EXPECT_TRUE(*got == big);
  auto listed = store_->List("big/");
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].size, big.size());
  if (GetParam() == "s3") {  // it really went up in parts
    std::string log = moto_->Log();
    EXPECT_NE(log.find("big/one?uploads="), std::string::npos);
    EXPECT_NE(log.find("big/one?partNumber=3&uploadId="), std::string::npos);
    EXPECT_EQ(log.find("big/one?partNumber=4&uploadId="), std::string::npos);
  }

  // Conditional create of a multipart object.
  const std::vector<uint8_t> other = RandomBytes(kPartSize + 1, 8);
  ASSERT_OK(store_->PutIfAbsent("big/two", other));
  EXPECT_THAT(store_->PutIfAbsent("big/two", big),
              StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(store_->PutIfAbsent("big/one", other),
              StatusIs(StatusCode::kAlreadyExists));
  EXPECT_TRUE(*store_->Get("big/two") == other);
  // Overwrite a big object with a small one.
  ASSERT_OK(store_->Put("big/one", Bytes("small")));
  EXPECT_EQ(*store_->Get("big/one"), Bytes("small"));
}

TEST_P(StoreTest, KeyValidation) {
  const std::vector<std::string> bad = {"",
                                        "/a",
                                        "a/",
                                        "a//b",
                                        ".",
                                        "..",
                                        "./a",
                                        "a/../b",
                                        "a/./b",
                                        "a b",
                                        "a\\b",
                                        "a\nb",
                                        "caf\xc3\xa9",
                                        "a~tmp",
                                        "a?b",
                                        "a%2f",
                                        std::string("a\0b", 3),
                                        std::string(1025, 'k'),
                                        std::string(256, 's'),
                                        "a/" + std::string(256, 's')};
  for (const auto& k : bad) {
    SCOPED_TRACE("key: '" + k + "'");
    EXPECT_THAT(ValidateKey(k), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->Put(k, Bytes("x")),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->PutIfAbsent(k, Bytes("x")),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->Get(k), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->Delete(k), StatusIs(StatusCode::kInvalidArgument));
  }
  for (const std::string p : {"../", "a//", "/", "a b", "x/../"}) {
    EXPECT_THAT(store_->List(p), StatusIs(StatusCode::kInvalidArgument)) << p;
  }
  // The longest key, and every allowed character.
  const std::string seg(255, 's');
  std::string longest =
      seg + "/" + seg + "/" + seg + "/" + std::string(254, 't') + "/u";
  ASSERT_EQ(longest.size(), 1024u);
  ASSERT_OK(store_->Put(longest, Bytes("long")));
  EXPECT_EQ(*store_->Get(longest), Bytes("long"));
  const std::string chars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
  ASSERT_OK(store_->Put("c/" + chars + "/..." + "/.x", Bytes("chars")));
  EXPECT_EQ(*store_->Get("c/" + chars + "/.../.x"), Bytes("chars"));
}

TEST_P(StoreTest, PutIfAbsentSemantics) {
  ASSERT_OK(store_->PutIfAbsent("decision/v1", Bytes("commit by A")));
  Status again = store_->PutIfAbsent("decision/v1", Bytes("abort by B"));
  EXPECT_THAT(again, StatusIs(StatusCode::kAlreadyExists));
  EXPECT_EQ(*store_->Get("decision/v1"), Bytes("commit by A"));
  // Existing objects written by Put count as present too.
  ASSERT_OK(store_->Put("decision/v2", Bytes("p")));
  EXPECT_THAT(store_->PutIfAbsent("decision/v2", Bytes("q")),
              StatusIs(StatusCode::kAlreadyExists));
  // After a delete the key is free again; Put still replaces.
  ASSERT_OK(store_->Delete("decision/v1"));
  ASSERT_OK(store_->PutIfAbsent("decision/v1", Bytes("second")));
  ASSERT_OK(store_->Put("decision/v1", Bytes("replaced")));
  EXPECT_EQ(*store_->Get("decision/v1"), Bytes("replaced"));
}

// THE RACE: concurrent writers, each with its own store object (as separate
// processes would be), create the same key; exactly one may win, and every
// reader must see the winner's bytes.
TEST_P(StoreTest, PutIfAbsentRace) {
  constexpr int kWriters = 8;
  constexpr int kRounds = 50;
  std::vector<std::unique_ptr<ObjectStore>> stores;
  for (int w = 0; w < kWriters; ++w) {
    auto s = NewStore();
    ASSERT_OK(s);
    stores.push_back(std::move(*s));
  }
  for (int round = 0; round < kRounds; ++round) {
    const std::string key = "race/decision-" + std::to_string(round);
    std::vector<Status> results(kWriters);
    std::latch start(kWriters);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
      threads.emplace_back([&, w] {
        start.arrive_and_wait();
        results[static_cast<size_t>(w)] =
            stores[static_cast<size_t>(w)]->PutIfAbsent(
                key, Bytes("writer " + std::to_string(w) + " of round " +
                           std::to_string(round)));
      });
    }
    for (auto& t : threads) t.join();
    int winners = 0;
    int winner = -1;
    for (int w = 0; w < kWriters; ++w) {
      const Status& s = results[static_cast<size_t>(w)];
      if (s.ok()) {
        ++winners;
        winner = w;
      } else {
        EXPECT_THAT(s, StatusIs(StatusCode::kAlreadyExists));
      }
    }
    ASSERT_EQ(winners, 1) << "round " << round;
    auto got = store_->Get(key);
    ASSERT_OK(got);
    ASSERT_EQ(*got, Bytes("writer " + std::to_string(winner) + " of round " +
                          std::to_string(round)))
        << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values("dir", "s3"),
                         [](const auto& param_info) {
                           return param_info.param;
                         });

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
