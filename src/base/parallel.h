// ParallelFor: runs fn(begin, end) over [0, n) split into contiguous pieces
// on up to `threads` threads (the caller's thread included). Pieces are
// multiples of `grain`, so callers can align work to cache lines or chunks.
// threads <= 0 means DefaultThreads().
#ifndef REFIT_BASE_PARALLEL_H_
#define REFIT_BASE_PARALLEL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace refit {

// The CPUs the calling thread may run on (its affinity mask: taskset, a
// container's cpuset), at least 1; the host's count where the mask is
// unknown.
int DefaultThreads();

void ParallelFor(size_t n, size_t grain, int threads,
                 const std::function<void(size_t begin, size_t end)>& fn);

// Runs fn(item, worker) for every item in [0, n) on up to `threads` threads
// that take items one at a time (dynamic scheduling, for items of uneven
// cost). `worker` is in [0, threads), for per-thread scratch.
void ParallelForEach(size_t n, int threads,
                     const std::function<void(size_t item, int worker)>& fn);

// ParallelForEach on threads started once: for a loop of many short
// ForEach calls, which would otherwise start and join threads each time.
// `threads` counts the caller's thread, which works too (<= 0: the default).
// One ForEach at a time per pool.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void ForEach(size_t n, const std::function<void(size_t item, int worker)>& fn);
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void Work(int worker);

  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(size_t, int)>* fn_ = nullptr;  // the current job
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  uint64_t generation_ = 0;  // jobs started
  int busy_ = 0;             // workers not yet through the current job
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace refit

#endif  // REFIT_BASE_PARALLEL_H_
