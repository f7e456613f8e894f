#include "base/parallel.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace refit {

int DefaultThreads() {
  // The CPUs the calling thread may run on (taskset, a container's cpuset),
  // not every CPU of the host: more threads than that only contend.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ParallelFor(size_t n, size_t grain, int threads,
                 const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  if (grain == 0) grain = 1;
  if (threads <= 0) threads = DefaultThreads();
  size_t units = (n + grain - 1) / grain;
  size_t t = std::min<size_t>(static_cast<size_t>(threads), units);
  if (t <= 1) {
    fn(0, n);
    return;
  }
  size_t per = (units + t - 1) / t * grain;
  std::vector<std::thread> pool;
  pool.reserve(t - 1);
  for (size_t i = 1; i < t; ++i) {
    size_t b = i * per;
    if (b >= n) break;
    size_t e = std::min(n, b + per);
    pool.emplace_back([&fn, b, e] { fn(b, e); });
  }
  fn(0, std::min(n, per));
  for (auto& th : pool) th.join();
}

void ParallelForEach(size_t n, int threads,
                     const std::function<void(size_t, int)>& fn) {
  if (n == 0) return;
  if (threads <= 0) threads = DefaultThreads();
  WorkerPool(static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), n))).ForEach(n, fn);
}

WorkerPool::WorkerPool(int threads) {
  if (threads <= 0) threads = DefaultThreads();
  for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { Work(w); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& th : workers_) th.join();
}

void WorkerPool::Work(int worker) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* fn = fn_;
    const size_t n = n_;
    lock.unlock();
    for (size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) (*fn)(i, worker);
    lock.lock();
    if (--busy_ == 0) done_.notify_one();
  }
}

void WorkerPool::ForEach(size_t n, const std::function<void(size_t, int)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0);
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_.notify_all();
  for (size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) fn(i, 0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return busy_ == 0; });
}

}  // namespace refit
