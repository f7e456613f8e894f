#include "sync/chunk_prefetch.h"

#include <algorithm>
#include <utility>

#include "sync/chunk_check.h"
#include "sync/keys.h"

namespace refit::internal {

ChunkPrefetch::ChunkPrefetch(ObjectStore* store, const Announcement& a, const Manifest& m,
                             const Authenticator& auth, uint64_t from, int threads,
                             const std::vector<bool>& skip, size_t window, uint64_t max_bytes)
    : store_(store),
      a_(a),
      m_(m),
      auth_(auth),
      window_(std::max<size_t>(1, window)),
      max_bytes_(max_bytes),
      state_(m.chunks.size(), State::kNo),
      ready_(m.chunks.size()),
      next_(from),
      taken_(from) {
  // A rank whose part is packed is read by the pack (ChunkObjectReader).
  std::vector<bool> packed;
  for (const ManifestChunk& c : m.chunks) {
    if (!c.in_part || c.pack_offset == 0) continue;
    if (packed.size() <= c.rank) packed.resize(c.rank + 1, false);
    packed[c.rank] = true;
  }
  for (uint64_t i = from; i < m.chunks.size(); ++i) {
    const ManifestChunk& c = m.chunks[i];
    const bool rank_packed = c.rank < packed.size() && packed[c.rank];
    const bool skipped = i < skip.size() && skip[i];
    if (c.in_part && !rank_packed && !skipped) state_[i] = State::kQueued;
  }
  for (int t = 0; t < std::max(1, threads); ++t) workers_.emplace_back([this] { Work(); });
}

ChunkPrefetch::~ChunkPrefetch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ChunkPrefetch::Work() {
  for (;;) {
    uint64_t i = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        if (stop_) return true;
        while (next_ < state_.size() && state_[next_] != State::kQueued) ++next_;
        return next_ < state_.size() && next_ < taken_ + window_ &&
               (held_bytes_ < max_bytes_ || next_ == taken_);
      });
      if (stop_) return;
      i = next_++;
      state_[i] = State::kReading;
      held_bytes_ += m_.chunks[i].size;
    }
    std::optional<Checked> checked;
    auto got = store_->Get(ManifestChunkKey(m_, i));
    if (got.ok()) {
      std::span<const uint8_t> bytes;
      auto parsed = CheckChunk(*got, ChunkSpec{&a_, i, &m_, /*resend=*/false}, auth_, &bytes);
      // The chunk points into the object's buffer, which the move keeps.
      if (parsed.ok()) checked = Checked{std::move(*got), std::move(*parsed), bytes};
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (checked) {
      ready_[i] = std::move(checked);
      state_[i] = State::kReady;
    } else {
      state_[i] = State::kFailed;
      held_bytes_ -= m_.chunks[i].size;
    }
    cv_.notify_all();
  }
}

std::optional<ChunkPrefetch::Checked> ChunkPrefetch::Take(uint64_t i) {
  std::unique_lock<std::mutex> lock(mu_);
  if (i >= state_.size()) return std::nullopt;
  cv_.wait(lock, [&] { return state_[i] != State::kReading; });
  std::optional<Checked> out;
  if (state_[i] == State::kReady) {
    out = std::move(ready_[i]);
    ready_[i].reset();
    held_bytes_ -= m_.chunks[i].size;
  }
  // Not claimed yet (the workers are behind): the caller reads it.
  state_[i] = State::kNo;
  taken_ = std::max(taken_, i + 1);
  next_ = std::max(next_, taken_);
  cv_.notify_all();
  return out;
}

}  // namespace refit::internal
