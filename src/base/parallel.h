// ParallelFor: runs fn(begin, end) over [0, n) split into contiguous pieces
// on up to `threads` threads (the caller's thread included). Pieces are
// multiples of `grain`, so callers can align work to cache lines or chunks.
// threads <= 0 means std::thread::hardware_concurrency().
#ifndef REFIT_BASE_PARALLEL_H_
#define REFIT_BASE_PARALLEL_H_

#include <cstddef>
#include <functional>

namespace refit {

int DefaultThreads();

void ParallelFor(size_t n, size_t grain, int threads,
                 const std::function<void(size_t begin, size_t end)>& fn);

// Runs fn(item, worker) for every item in [0, n) on up to `threads` threads
// that take items one at a time (dynamic scheduling, for items of uneven
// cost). `worker` is in [0, threads), for per-thread scratch.
void ParallelForEach(size_t n, int threads,
                     const std::function<void(size_t item, int worker)>& fn);

}  // namespace refit

#endif  // REFIT_BASE_PARALLEL_H_
