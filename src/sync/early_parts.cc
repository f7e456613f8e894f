#include "sync/early_parts.h"

#include <algorithm>

#include "sync/chunk_check.h"
#include "sync/chunk_pack.h"
#include "sync/keys.h"

namespace refit::internal {

EarlyParts::EarlyParts(ObjectStore* store, const Announcement& a, const Authenticator& auth,
                       int threads, uint64_t max_bytes)
    : store_(store), a_(a), auth_(auth), threads_(std::max(1, threads)), max_bytes_(max_bytes) {}

EarlyParts::~EarlyParts() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

Result<size_t> EarlyParts::Scan() {
  const auto start = std::chrono::steady_clock::now();
  if (start < next_scan_) return size_t{0};
  REFIT_ASSIGN_OR_RETURN(auto listed, store_->List(PartsPrefix(a_.version)));
  next_scan_ = std::chrono::steady_clock::now();
  next_scan_ += 4 * (next_scan_ - start);
  std::lock_guard<std::mutex> lock(mu_);
  size_t queued = 0;
  for (const ObjectInfo& o : listed) {
    const auto id = ParsePartChunkKey(o.key);
    if (!id || id->version != a_.version) continue;  // part lists, strays
    const Id key{id->rank, id->k};
    if (objects_.count(key) != 0) continue;
    if (held_bytes_ + o.size > max_bytes_) break;
    held_bytes_ += o.size;
    objects_.emplace(key, State::kQueued);
    queue_.push_back(key);
    ++queued;
  }
  if (queued == 0) return queued;
  // The threads start with the first object found: a version published by
  // one publisher (no parts) costs a listing per poll and nothing else.
  while (workers_.size() < static_cast<size_t>(threads_)) {
    workers_.emplace_back([this] { Work(); });
  }
  cv_.notify_all();
  return queued;
}

uint64_t EarlyParts::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return objects_.size();
}

std::vector<std::pair<EarlyParts::Id, EarlyParts::Chunk>> EarlyParts::Read(Id key) const {
  std::vector<std::pair<Id, Chunk>> out;
  auto got = store_->Get(PartChunkKey(a_.version, key.first, key.second));
  if (!got.ok()) return out;
  std::vector<std::span<const uint8_t>> elements{std::span<const uint8_t>(*got)};
  if (IsPack(*got)) {
    auto pack = DecodePack(*got);
    if (!pack.ok()) return out;
    elements = std::move(*pack);
  }
  for (size_t j = 0; j < elements.size(); ++j) {
    Chunk c;
    c.object.assign(elements[j].begin(), elements[j].end());
    auto body = auth_.Open(c.object);
    if (!body.ok()) continue;
    auto parsed = ParseChunk(*body);
    if (!parsed.ok()) continue;
    ChunkSpec spec{&a_, 0, nullptr, /*resend=*/false};
    spec.before_manifest = true;
    if (!CheckParsedChunk(*parsed, spec).ok()) continue;
    c.chunk = std::move(*parsed);
    c.bytes = body->first(c.chunk.size);
    c.sha = ComputeSha256(c.object);
    out.emplace_back(Id{key.first, key.second + j}, std::move(c));
  }
  return out;
}

void EarlyParts::Work() {
  for (;;) {
    Id key;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      key = queue_.front();
      queue_.pop_front();
      objects_[key] = State::kReading;
    }
    // The chunk and its spans point into `object`'s buffer, which moves
    // with it.
    auto read = Read(key);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, c] : read) chunks_.emplace(id, std::move(c));
    objects_[key] = State::kDone;
    cv_.notify_all();
  }
}

std::optional<EarlyParts::Id> EarlyParts::ObjectOf(const ManifestChunk& e) {
  if (!e.in_part || e.pack_offset > e.part_index) return std::nullopt;
  return Id{e.rank, e.part_index - e.pack_offset};
}

std::optional<EarlyParts::Checked> EarlyParts::Take(const Manifest& m, uint64_t i) {
  if (i >= m.chunks.size()) return std::nullopt;
  const ManifestChunk& e = m.chunks[i];
  const auto object = ObjectOf(e);
  if (!object) return std::nullopt;
  std::unique_lock<std::mutex> lock(mu_);
  auto o = objects_.find(*object);
  if (o == objects_.end()) return std::nullopt;
  cv_.wait(lock, [&] { return stop_ || o->second == State::kDone; });
  auto c = chunks_.find(Id{e.rank, e.part_index});
  if (c == chunks_.end()) return std::nullopt;
  Chunk chunk = std::move(c->second);
  chunks_.erase(c);
  lock.unlock();
  if (!MatchesEntry(a_, m, i, e.rank, e.part_index, chunk.object.size(), chunk.sha,
                    chunk.chunk)) {
    return std::nullopt;
  }
  return Checked{std::move(chunk.object), std::move(chunk.chunk), chunk.bytes};
}

bool EarlyParts::MatchesEntry(const Announcement& a, const Manifest& m, uint64_t i,
                              uint32_t rank, uint64_t k, uint64_t size, const Sha256& sha,
                              const ParsedChunk& c) {
  if (i >= m.chunks.size()) return false;
  const ManifestChunk& e = m.chunks[i];
  // The object the manifest lists, and a chunk that is its entry.
  return e.in_part && e.rank == rank && e.part_index == k && size == e.size &&
         sha == e.sha256 && CheckParsedChunk(c, ChunkSpec{&a, i, &m, /*resend=*/false}).ok();
}

std::vector<EarlyParts::Ready> EarlyParts::TakeReady() {
  std::vector<Ready> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, c] : chunks_) {
    out.push_back(Ready{id.first, id.second, c.sha,
                        Checked{std::move(c.object), std::move(c.chunk), c.bytes}});
  }
  chunks_.clear();
  return out;
}

std::vector<bool> EarlyParts::Held(const Manifest& m) const {
  std::vector<bool> held(m.chunks.size(), false);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < m.chunks.size(); ++i) {
    const auto object = ObjectOf(m.chunks[i]);
    held[i] = object && objects_.count(*object) != 0;
  }
  return held;
}

}  // namespace refit::internal
