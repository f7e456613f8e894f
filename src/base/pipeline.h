// RunOrdered: a bounded, ordered parallel pipeline.
//
// Items 0..n-1 are produced by `threads` worker threads in any order and
// consumed on the calling thread strictly in index order. At most `window`
// items are in flight (produced but not yet consumed), which bounds memory
// to `window` results whatever n is. The first failing produce or consume
// stops the pipeline; its Status is returned and no later item is consumed.
//
// produce(i, worker) -> Result<T> runs on worker threads (worker in
// [0, threads), so callers can keep per-worker scratch) and must be
// thread-safe;
// consume(i, T&&) -> Status runs on the calling thread only.
#ifndef REFIT_BASE_PIPELINE_H_
#define REFIT_BASE_PIPELINE_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/parallel.h"
#include "refit/status.h"

namespace refit {

template <typename T, typename Produce, typename Consume>
Status RunOrdered(size_t n, int threads, size_t window, Produce produce,
                  Consume consume) {
  if (n == 0) return Status();
  if (threads <= 0) threads = DefaultThreads();
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), n));
  window = std::max<size_t>(window, static_cast<size_t>(threads));

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::optional<Result<T>>> slots(window);
  size_t next_item = 0;   // next index a worker will take
  size_t consumed = 0;    // items consumed so far
  bool stop = false;

  auto worker = [&](int worker_index) {
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || next_item >= n || next_item < consumed + window; });
        if (stop || next_item >= n) return;
        i = next_item++;
      }
      Result<T> r = produce(i, worker_index);
      {
        std::lock_guard<std::mutex> lock(mu);
        slots[i % window].emplace(std::move(r));
      }
      cv.notify_all();
    }
  };

  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);

  Status status;
  while (consumed < n) {
    std::optional<Result<T>> item;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return slots[consumed % window].has_value(); });
      item.swap(slots[consumed % window]);
    }
    if (!item->ok()) {
      status = item->status();
    } else {
      status = consume(consumed, std::move(**item));
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      ++consumed;
      if (!status.ok()) stop = true;
    }
    cv.notify_all();
    if (!status.ok()) break;
  }
  for (auto& th : pool) th.join();
  return status;
}

}  // namespace refit

#endif  // REFIT_BASE_PIPELINE_H_
