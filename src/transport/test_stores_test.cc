// The test doubles and the retrying wrapper, over a directory store.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "support/faulty_store.h"
#include "support/status_matchers.h"
#include "support/testing.h"
#include "transport/memory_store.h"
#include "transport/throttled_store.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using ::refit::testing::TempDir;
using Clock = std::chrono::steady_clock;

std::vector<uint8_t> Bytes(std::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::shared_ptr<ObjectStore> DirStore(const TempDir& dir) {
  auto s = OpenObjectStore(dir.path() + "/store");
  EXPECT_OK(s);
  return std::shared_ptr<ObjectStore>(std::move(*s));
}

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                               start)
      .count();
}

TEST(MemoryStoreTest, StoresListsAndRefusesASecondPutIfAbsent) {
  MemoryStore store;
  ASSERT_OK(store.Put("v/1/a", Bytes("x")));
  ASSERT_OK(store.PutIfAbsent("v/1/b", Bytes("y")));
  EXPECT_EQ(store.PutIfAbsent("v/1/b", Bytes("z")).code(),
            StatusCode::kAlreadyExists);
  ASSERT_OK(store.Put("w", Bytes("w")));
  auto b = store.Get("v/1/b");
  ASSERT_OK(b);
  EXPECT_EQ(*b, Bytes("y"));
  auto listed = store.List("v/1/");
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, "v/1/a");
  EXPECT_EQ((*listed)[1].key, "v/1/b");
  ASSERT_OK(store.Delete("v/1/a"));
  EXPECT_EQ(store.Get("v/1/a").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store.Put("../x", Bytes("x")).code(), StatusCode::kInvalidArgument);
}

// A waiter wakes when an object is stored after it took the count, and at
// once when one was stored before it began to wait; otherwise it times out.
TEST(MemoryStoreTest, AwaitChangeWakesOnAPut) {
  MemoryStore store;
  uint64_t since = store.ChangeCount();
  auto start = Clock::now();
  store.AwaitChange(since, 30);
  EXPECT_GE(MsSince(start), 25);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_OK(store.Put("k", Bytes("v")));
  });
  start = Clock::now();
  store.AwaitChange(since, 10000);
  EXPECT_LT(MsSince(start), 5000);
  writer.join();
  start = Clock::now();
  store.AwaitChange(since, 10000);  // the put is already counted
  EXPECT_LT(MsSince(start), 1000);
  // Forwarded through the wrappers, and by the directory store for the
  // puts through the same object.
  TempDir dir;
  std::shared_ptr<ObjectStore> d = DirStore(dir);
  ThrottledStore link(d, 1e9);
  since = link.ChangeCount();
  ASSERT_OK(d->Put("k", Bytes("v")));
  start = Clock::now();
  link.AwaitChange(since, 10000);
  EXPECT_LT(MsSince(start), 1000);
}

// A directory store's waiter wakes for objects that another process
// stores, in directories that did not exist when it began to wait and in
// ones that did; a wait with nothing stored lasts its timeout.
TEST(DirStoreTest, AwaitChangeWakesForAnotherProcessesObjects) {
  TempDir dir;
  std::shared_ptr<ObjectStore> waiter = DirStore(dir);
  auto put_from_child = [&](const std::string& key) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      auto s = OpenObjectStore(dir.path() + "/store");
      _exit(s.ok() && (*s)->Put(key, Bytes("x")).ok() ? 0 : 1);
    }
    return pid;
  };
  for (const std::string key : {"v/00000000000000000001/chunk/0",
                                "v/00000000000000000001/chunk/1", "head"}) {
    const uint64_t since = waiter->ChangeCount();
    const pid_t pid = put_from_child(key);
    ASSERT_GT(pid, 0);
    const auto start = Clock::now();
    waiter->AwaitChange(since, 20000);
    EXPECT_LT(MsSince(start), 5000) << key;
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << key;
    EXPECT_OK(waiter->Get(key));
  }
  const uint64_t since = waiter->ChangeCount();
  const auto start = Clock::now();
  waiter->AwaitChange(since, 60);
  EXPECT_GE(MsSince(start), 50);
}

TEST(ThrottledStoreTest, PutAndGetTakeSizeOverRate) {
  TempDir dir;
  ThrottledStore store(DirStore(dir), 10e6);  // 10 MB/s
  const std::vector<uint8_t> mb(1000000, 0x5a);
  auto start = Clock::now();
  ASSERT_OK(store.Put("one-mb", mb));
  int64_t put_ms = MsSince(start);
  EXPECT_GE(put_ms, 90);
  EXPECT_LT(put_ms, 2000);
  start = Clock::now();
  auto got = store.Get("one-mb");
  ASSERT_OK(got);
  EXPECT_EQ(got->size(), mb.size());
  EXPECT_GE(MsSince(start), 90);
  // Control calls are not charged: a list and a delete made while another
  // caller's 10 MB (a second of the link) is on its way return before it
  // does (an order, not a time: the machine may be loaded).
  std::atomic<bool> put_done{false};
  std::thread big([&] {
    EXPECT_OK(store.Put("ten-mb", std::vector<uint8_t>(10000000, 1)));
    put_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_OK(store.List(""));
  ASSERT_OK(store.Delete("one-mb"));
  EXPECT_FALSE(put_done.load()) << "a control call waited for the link";
  big.join();
}

TEST(ThrottledStoreTest, ConcurrentCallsShareTheLink) {
  TempDir dir;
  ThrottledStore store(DirStore(dir), 10e6);
  const std::vector<uint8_t> half(500000, 1);
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(
        [&, i] { EXPECT_OK(store.Put("part-" + std::to_string(i), half)); });
  }
  for (auto& t : threads) t.join();
  EXPECT_GE(MsSince(start), 180);  // 2 MB at 10 MB/s, minus slack
}

TEST(ThrottledStoreTest, BurstIsFree) {
  // Over a memory store: the bound is the throttle's, not a disk's fsync.
  ThrottledStore store(std::make_shared<MemoryStore>(), 1e6, /*burst_bytes=*/1 << 20);
  auto start = Clock::now();
  ASSERT_OK(store.Put("k", std::vector<uint8_t>(500000, 1)));
  EXPECT_LT(MsSince(start), 400);
}

TEST(FaultyStoreTest, FailNext) {
  TempDir dir;
  FaultyStore store(DirStore(dir), 1);
  store.FailNext(2);
  EXPECT_THAT(store.Put("k", Bytes("v")), StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(store.Get("k"), StatusIs(StatusCode::kUnavailable));
  ASSERT_OK(store.Put("k", Bytes("v")));
  EXPECT_EQ(*store.Get("k"), Bytes("v"));
  store.FailNext(1, StatusCode::kPermissionDenied);
  EXPECT_THAT(store.Delete("k"), StatusIs(StatusCode::kPermissionDenied));
  EXPECT_EQ(store.calls(), 5);
  EXPECT_EQ(store.injected_failures(), 3);
}

TEST(FaultyStoreTest, DropPuts) {
  TempDir dir;
  auto inner = DirStore(dir);
  FaultyStore store(inner, 1);
  store.DropPutsMatching("chunk-7");
  ASSERT_OK(store.Put("v1/chunk-7", Bytes("lost")));
  ASSERT_OK(store.PutIfAbsent("v1/chunk-7b", Bytes("lost too")));
  ASSERT_OK(store.Put("v1/chunk-8", Bytes("kept")));
  EXPECT_THAT(inner->Get("v1/chunk-7"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(inner->Get("v1/chunk-7b"), StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(*inner->Get("v1/chunk-8"), Bytes("kept"));
  EXPECT_EQ(store.dropped_puts(), 2);
  // Dropping still validates keys, as a real store would.
  EXPECT_THAT(store.Put("chunk-7/../x", Bytes("x")),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(FaultyStoreTest, CorruptGetsFlipOneBit) {
  TempDir dir;
  FaultyStore store(DirStore(dir), 42);
  const std::vector<uint8_t> data(1000, 0);
  ASSERT_OK(store.Put("v/manifest", data));
  ASSERT_OK(store.Put("v/empty", {}));
  store.CorruptGetsMatching("v/");
  for (int i = 0; i < 10; ++i) {
    auto got = store.Get("v/manifest");
    ASSERT_OK(got);
    ASSERT_EQ(got->size(), data.size());
    int bits = 0;
    for (uint8_t b : *got) bits += __builtin_popcount(b);
    EXPECT_EQ(bits, 1);
  }
  EXPECT_NE(*store.Get("v/empty"), std::vector<uint8_t>());
  store.CorruptGetsMatching("");
  EXPECT_EQ(*store.Get("v/manifest"), data);
  EXPECT_EQ(store.corrupted_gets(), 11);
}

TEST(FaultyStoreTest, RandomFailuresAreSeeded) {
  auto run = [](uint64_t seed) {
    TempDir dir;
    FaultyStore store(DirStore(dir), seed);
    store.SetFailureRate(0.5);
    std::string pattern;
    for (int i = 0; i < 64; ++i) {
      pattern += store.Put("k", Bytes("v")).ok() ? '.' : 'x';
    }
    return pattern;
  };
  std::string a = run(7);
  EXPECT_EQ(a, run(7));
  EXPECT_NE(a.find('x'), std::string::npos);
  EXPECT_NE(a.find('.'), std::string::npos);
}

TEST(FaultyStoreTest, Delay) {
  // Over a memory store: an undelayed put takes no disk time.
  FaultyStore store(std::make_shared<MemoryStore>(), 1);
  store.SetDelay(std::chrono::milliseconds(300), "slow");
  auto start = Clock::now();
  ASSERT_OK(store.Put("fast", Bytes("x")));
  EXPECT_LT(MsSince(start), 300);
  start = Clock::now();
  ASSERT_OK(store.Put("slow/key", Bytes("x")));
  EXPECT_GE(MsSince(start), 295);
}

StoreOptions FastRetries(int attempts) {
  StoreOptions o;
  o.max_attempts = attempts;
  o.backoff_ms = 5;
  return o;
}

TEST(RetryingStoreTest, RetriesUnavailableThroughFaults) {
  TempDir dir;
  auto faulty = std::make_shared<FaultyStore>(DirStore(dir), 3);
  auto store = NewRetryingStore(faulty, FastRetries(3));
  faulty->FailNext(2);
  ASSERT_OK(store->Put("k", Bytes("v")));
  EXPECT_EQ(faulty->calls(), 3);
  faulty->FailNext(2);
  auto got = store->Get("k");
  ASSERT_OK(got);
  EXPECT_EQ(*got, Bytes("v"));
  faulty->FailNext(2);
  ASSERT_OK(store->List(""));
  faulty->FailNext(2);
  ASSERT_OK(store->Delete("k"));
}

TEST(RetryingStoreTest, GivesUpAfterMaxAttempts) {
  TempDir dir;
  auto faulty = std::make_shared<FaultyStore>(DirStore(dir), 3);
  auto store = NewRetryingStore(faulty, FastRetries(3));
  faulty->FailNext(10);
  Status s = store->Put("k", Bytes("v"));
  EXPECT_THAT(s, StatusIs(StatusCode::kUnavailable));
  EXPECT_NE(s.message().find("after 3 attempts"), std::string_view::npos)
      << s.ToString();
  EXPECT_EQ(faulty->calls(), 3);
  EXPECT_THAT(store->Get("k"), StatusIs(StatusCode::kUnavailable));
  EXPECT_EQ(faulty->calls(), 6);
}

TEST(RetryingStoreTest, OtherErrorsAreNotRetried) {
  TempDir dir;
  auto faulty = std::make_shared<FaultyStore>(DirStore(dir), 3);
  auto store = NewRetryingStore(faulty, FastRetries(5));
  faulty->FailNext(3, StatusCode::kPermissionDenied);
  EXPECT_THAT(store->Put("k", Bytes("v")),
              StatusIs(StatusCode::kPermissionDenied));
  EXPECT_THAT(store->Get("absent"), StatusIs(StatusCode::kPermissionDenied));
  EXPECT_EQ(faulty->calls(), 2);
}

TEST(RetryingStoreTest, LostPutIfAbsentResponseIsResolved) {
  TempDir dir;
  auto inner = DirStore(dir);
  auto faulty = std::make_shared<FaultyStore>(inner, 3);
  auto store = NewRetryingStore(faulty, FastRetries(3));
  // Our create lands, its answer is lost, the retry finds our own bytes.
  faulty->LoseNextResponses(1);
  ASSERT_OK(store->PutIfAbsent("decision", Bytes("mine")));
  // A lost answer while someone else holds the key: still lost.
  ASSERT_OK(inner->Put("decision2", Bytes("theirs")));
  faulty->LoseNextResponses(1);
  EXPECT_THAT(store->PutIfAbsent("decision2", Bytes("mine")),
              StatusIs(StatusCode::kAlreadyExists));
  // Without ambiguity a plain loser is told so.
  EXPECT_THAT(store->PutIfAbsent("decision", Bytes("mine")),
              StatusIs(StatusCode::kAlreadyExists));
}

}  // namespace
}  // namespace refit
