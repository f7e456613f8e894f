// The shared ObjectStore suite (store_suite.h): the fixture's backends and
// the contract's tests.
#include "support/store_suite.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <latch>
#include <thread>
#include <utility>
#include <vector>

#include "support/relay_testing.h"
#include "support/status_matchers.h"
#include "transport/relay_store.h"

namespace refit::testing {
namespace {

using ::refit::relay_testing::Bytes;
using ::refit::relay_testing::RandomBytes;

}  // namespace

std::unique_ptr<MotoServer> StoreTest::moto_;

void StoreTest::TearDownTestSuite() { moto_.reset(); }

void StoreTest::SetUp() {
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
  if (GetParam() == "relay") {
    auto root = RelayStore::Root("127.0.0.1:0", relay_testing::Fast());
    ASSERT_OK(root);
    relay_ = std::move(*root);
  }
  auto s = NewStore();
  ASSERT_OK(s);
  store_ = std::move(*s);
}

Result<std::unique_ptr<ObjectStore>> StoreTest::NewStore() {
  if (GetParam() == "dir") return OpenObjectStore(dir_.path() + "/store");
  if (GetParam() == "relay") {
    // Another handle on the same endpoint (its retries never fire: the
    // root's local map does not fail with kUnavailable).
    return NewRetryingStore(relay_);
  }
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

std::string StoreBackendName(
    const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

namespace {

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
  if (GetParam() == "s3" && !moto_->atomic_creates()) {
    GTEST_SKIP() << "\n*** SKIPPED: moto_server serves without the serial "
                    "launcher (python3 on PATH cannot import moto), and its "
                    "conditional creates are not atomic. ***\n";
  }
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

}  // namespace
}  // namespace refit::testing
