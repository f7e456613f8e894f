// ApplyPool: applies chunks in place on worker threads while the
// receiver's own thread fetches and checks the next ones
// (docs/protocol.md, "Receiver", "Parallel apply"). Distinct chunks touch
// distinct ranges (docs/format.md §3), so they may be applied
// concurrently; the caller keeps two applies of one range from racing by
// asking Pending() before it reads a range, and drains finished jobs to do
// its bookkeeping (journal, counters) on its own thread. With one thread,
// Submit applies at once on the caller's thread.
//
// Thread-safety: Submit, Drain and Pending are called from one thread (the
// stepping one); the workers only run jobs. The pool owns the jobs' bytes
// until they are drained; the tensors they write belong to the caller and
// must outlive the pool.
#ifndef REFIT_SYNC_APPLY_POOL_H_
#define REFIT_SYNC_APPLY_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "delta/apply.h"
#include "delta/chunk.h"
#include "refit/status.h"

namespace refit::internal {

// ReceiverOptions::threads as a worker count: `requested` when positive,
// else one per core (at least one).
int ApplyThreads(int requested);

class ApplyPool {
 public:
  // One range: a chunk of a version, or the chunks of several versions
  // for one range in version order (a fold), applied in sequence while
  // the range is in cache.
  struct Job {
    // The caller's: a version's chunk index, or a fold's cell index.
    uint64_t index = 0;
    size_t tensor = 0;
    uint64_t offset = 0, length = 0;
    // A strided region's row length and stride in bytes (0: contiguous):
    // regions of one tensor's distinct columns interleave in the same
    // bytes without sharing any (Pending).
    uint64_t run = 0, stride = 0;
    // The worker hashes the region first (the first chunk's) and applies
    // only at its "before"; Done::state says what it found. For regions
    // whose hash is read from their bytes (strided ones), which the
    // caller's thread would otherwise read one region at a time.
    bool classify = false;
    bool early = false;             // submitted before the manifest was seen
    std::vector<std::vector<uint8_t>> objects;  // own the bytes `chunks` point into
    std::vector<ParsedChunk> chunks;
    // Per chunk: an overwrite re-send in place of a stored chunk (a fold).
    std::vector<bool> resent;
    uint8_t* data = nullptr;        // the tensor's first byte
  };
  struct Done {
    Job job;
    Status status;
    RangeState state = RangeState::kBefore;  // a `classify` job's finding
    std::vector<UndoRecord> undo;  // one per applied chunk
    size_t applied = 0;  // chunks of the job applied, a prefix of them
    double seconds = 0;  // the worker's time on the job
    // The segment digests of the range as the last applied chunk left it
    // (empty for a strided region or a failed job).
    std::vector<Hash128> after_digests;
  };

  explicit ApplyPool(int threads);
  ~ApplyPool();
  ApplyPool(const ApplyPool&) = delete;
  ApplyPool& operator=(const ApplyPool&) = delete;

  // Blocks while 2 * threads jobs are in flight.
  void Submit(Job job);
  // Finished jobs, in any order; with `all`, waits until none is in flight.
  std::vector<Done> Drain(bool all);
  // Whether a submitted job that was not drained yet (queued, running, or
  // finished) touches bytes of [offset, offset + length) of `tensor`, or
  // with `stride` > 0 the rows of `run` bytes every `stride` bytes from
  // `offset` within it (a strided region). The
  // caller drains before it reads such a range: its hash (and the digests
  // the caller keeps) are known only once the job is drained, and two
  // applies of one range must never race (a chunk delivered twice, e.g.
  // under another chunk's key).
  bool Pending(size_t tensor, uint64_t offset, uint64_t length, uint64_t run = 0,
               uint64_t stride = 0);
  // Seconds the caller spent blocked in Submit and in Drain(true).
  double wait_seconds() const { return wait_seconds_; }

 private:
  // Applies the job's chunks in order; each checks its own "after" hash,
  // which is the next one's "before". Stops at the first failure (the
  // range then holds the last applied chunk's "after").
  static void Run(Done* d, ApplyScratch* scratch);
  void Work();

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<Done> done_;
  size_t in_flight_ = 0;  // submitted and not yet drained
  struct Span {
    size_t tensor;
    uint64_t offset, length, run, stride;
    bool operator==(const Span&) const = default;
    bool Overlaps(const Span& o) const;
  };
  static Span SpanOf(const Job& j);
  std::vector<Span> pending_;  // the ranges of those jobs
  bool stop_ = false;
  double wait_seconds_ = 0;  // the caller's only
  ApplyScratch scratch_;  // the inline (one thread) case
};

// Runs `f` when the scope ends, however it ends.
class OnExit {
 public:
  explicit OnExit(std::function<void()> f) : f_(std::move(f)) {}
  OnExit(const OnExit&) = delete;
  OnExit& operator=(const OnExit&) = delete;
  ~OnExit() { f_(); }

 private:
  std::function<void()> f_;
};

}  // namespace refit::internal

#endif  // REFIT_SYNC_APPLY_POOL_H_
