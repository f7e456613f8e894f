#include "sync/apply_pool.h"

#include "base/parallel.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace refit::internal {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

}  // namespace

ApplyPool::Span ApplyPool::SpanOf(const Job& j) {
  return Span{j.tensor, j.offset, j.length, j.run, j.stride};
}

int ApplyThreads(int requested) {
  return requested > 0 ? requested : DefaultThreads();
}

ApplyPool::ApplyPool(int threads) : threads_(std::max(1, threads)) {
  if (threads_ == 1) return;
  for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
}

ApplyPool::~ApplyPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ApplyPool::Submit(Job job) {
  if (workers_.empty()) {
    Done d;
    d.job = std::move(job);
    Run(&d, &scratch_);
    std::lock_guard<std::mutex> lock(mu_);
    ++in_flight_;
    pending_.push_back(SpanOf(d.job));
    done_.push_back(std::move(d));
    return;
  }
  const Clock::time_point t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  // Jobs finished but not drained do not count: the caller drains them.
  cv_.wait(lock, [&] {
    return in_flight_ - done_.size() < 2 * static_cast<size_t>(threads_);
  });
  wait_seconds_ += SecondsSince(t0);
  ++in_flight_;
  pending_.push_back(SpanOf(job));
  queue_.push_back(std::move(job));
  cv_.notify_all();
}

std::vector<ApplyPool::Done> ApplyPool::Drain(bool all) {
  const Clock::time_point t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (all) cv_.wait(lock, [&] { return in_flight_ == done_.size(); });
  wait_seconds_ += SecondsSince(t0);
  std::vector<Done> out = std::move(done_);
  done_.clear();
  in_flight_ -= out.size();
  for (const Done& d : out) {
    auto it = std::find(pending_.begin(), pending_.end(), SpanOf(d.job));
    if (it != pending_.end()) pending_.erase(it);
  }
  cv_.notify_all();
  return out;
}

bool ApplyPool::Span::Overlaps(const Span& o) const {
  if (tensor != o.tensor || offset >= o.offset + o.length || o.offset >= offset + length) {
    return false;
  }
  // Two strided regions of one stride whose rows do not wrap share bytes
  // only where both their rows and their columns meet; anything else is
  // taken to overlap where the byte spans do.
  if (stride == 0 || stride != o.stride || offset % stride + run > stride ||
      o.offset % stride + o.run > stride) {
    return true;
  }
  const uint64_t col = offset % stride, ocol = o.offset % stride;
  return col < ocol + o.run && ocol < col + run;
}

bool ApplyPool::Pending(size_t tensor, uint64_t offset, uint64_t length, uint64_t run,
                        uint64_t stride) {
  const Span s{tensor, offset, length, run, stride};
  std::lock_guard<std::mutex> lock(mu_);
  for (const Span& p : pending_) {
    if (p.Overlaps(s)) return true;
  }
  return false;
}

void ApplyPool::Run(Done* d, ApplyScratch* scratch) {
  const Clock::time_point t0 = Clock::now();
  if (d->job.classify && !d->job.chunks.empty()) {
    const ChunkHeader& h = d->job.chunks.front().header;
    d->state = ClassifyRange(h, RegionHash(h, d->job.data));
    if (d->state != RangeState::kBefore) {
      d->seconds = SecondsSince(t0);
      return;
    }
  }
  for (const ParsedChunk& c : d->job.chunks) {
    UndoRecord undo;
    d->status = ApplyChunkInPlace(c, d->job.data, scratch, nullptr, &undo,
                                  &d->after_digests);
    if (!d->status.ok()) {
      d->after_digests.clear();
      break;
    }
    d->undo.push_back(std::move(undo));
    ++d->applied;
  }
  d->seconds = SecondsSince(t0);
}

void ApplyPool::Work() {
  ApplyScratch scratch;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || stop_; });
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Done d;
    d.job = std::move(job);
    Run(&d, &scratch);
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(std::move(d));
    cv_.notify_all();
  }
}

}  // namespace refit::internal
