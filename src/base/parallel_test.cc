#include "base/parallel.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <thread>
#include <vector>

namespace refit {
namespace {

// The default thread count follows the calling thread's CPU mask: a thread
// limited to one CPU (taskset, a container's cpuset) gets one thread.
TEST(DefaultThreadsTest, FollowsTheCallersCpuMask) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(DefaultThreads(), CPU_COUNT(&all));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  int seen = 0;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof(one), &one) == 0) seen = DefaultThreads();
  });
  t.join();
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(DefaultThreads(), CPU_COUNT(&all));  // this thread's mask is unchanged
}

// Every item runs exactly once per ForEach, on a worker index in range,
// across many short jobs on the same threads (and none for n = 0).
TEST(WorkerPoolTest, EveryItemOnceAcrossManyJobs) {
  WorkerPool pool(4);
  EXPECT_EQ(pool.threads(), 4);
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{100}, size_t{1000}}) {
    for (int job = 0; job < 50; ++job) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<bool> bad_worker{false};
      pool.ForEach(n, [&](size_t i, int worker) {
        hits[i].fetch_add(1);
        if (worker < 0 || worker >= pool.threads()) bad_worker = true;
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
      EXPECT_FALSE(bad_worker.load());
    }
  }
}

// Two pools used from two threads at once do not share work.
TEST(WorkerPoolTest, TwoPoolsFromTwoThreads) {
  WorkerPool a(3), b(2);
  std::atomic<long> sum_a{0}, sum_b{0};
  std::thread t([&] {
    for (int job = 0; job < 200; ++job) {
      b.ForEach(64, [&](size_t i, int) { sum_b += static_cast<long>(i); });
    }
  });
  for (int job = 0; job < 200; ++job) {
    a.ForEach(64, [&](size_t i, int) { sum_a += static_cast<long>(i); });
  }
  t.join();
  EXPECT_EQ(sum_a.load(), 200L * 64 * 63 / 2);
  EXPECT_EQ(sum_b.load(), 200L * 64 * 63 / 2);
}

TEST(WorkerPoolTest, OneThreadRunsOnTheCaller) {
  WorkerPool pool(1);
  EXPECT_EQ(pool.threads(), 1);
  const auto self = std::this_thread::get_id();
  int count = 0;
  pool.ForEach(10, [&](size_t, int worker) {
    EXPECT_EQ(worker, 0);
    EXPECT_EQ(std::this_thread::get_id(), self);
    ++count;
  });
  EXPECT_EQ(count, 10);
}

}  // namespace
}  // namespace refit
