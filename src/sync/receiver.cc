#include "sync/receiver.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hash.h"
#include "delta/apply.h"
#include "codec/payload.h"
#include "delta/chunk.h"
#include "refit/checkpoint.h"
#include "sync/crash_point.h"
#include "sync/journal.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

// In how many consecutive steps the store must return the same bytes for a
// chunk that fails its checks before the failure is the version's (the
// receiver votes failed): a damaged read differs from read to read, a
// damaged object does not.
constexpr int kPersistentBadReads = 4;

// Chunks of a version that may have been written: all of them.
constexpr uint64_t kAllChunks = UINT64_MAX;

// A chunk object that fails its checks (envelope, checksum, manifest hash,
// header) rather than one that could not be read.
bool FailsItsChecks(const Status& s) {
  return s.code() == StatusCode::kDataLoss || s.code() == StatusCode::kUnauthenticated;
}

int ElapsedMs(Clock::time_point since) {
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

// The tensors a version is applied to: a checkpoint's mapped tensors or
// the caller's memory, in the order of the version's tensor table.
struct Bound {
  std::optional<Checkpoint> ckpt;
  std::vector<uint8_t*> data;
  std::vector<uint64_t> bytes;
  std::vector<size_t> ckpt_index;  // table id -> checkpoint tensor index

  Status SyncRange(size_t t, uint64_t offset, uint64_t length) {
    return ckpt ? ckpt->SyncRange(ckpt_index[t], offset, length) : Status();
  }
  Status Sync() { return ckpt ? ckpt->Sync() : Status(); }
};

bool Describes(const TensorEntry& e, const std::string& dtype,
               const std::vector<uint64_t>& shape, int width) {
  return dtype == e.dtype && shape == e.shape && width == e.width;
}

Result<Bound> BindTensors(const ReceiverOptions& o, const std::vector<TensorEntry>& table,
                          uint64_t version) {
  Bound b;
  const std::string what = o.checkpoint.empty() ? "the receiver's in-memory tensors"
                                                : "checkpoint '" + o.checkpoint + "'";
  size_t have = o.tensors.size();
  if (!o.checkpoint.empty()) {
    REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt,
                           Checkpoint::Open(o.checkpoint, Checkpoint::Mode::kReadWrite));
    b.ckpt.emplace(std::move(ckpt));
    have = b.ckpt->tensors().size();
  }
  if (have != table.size()) {
    return FailedPreconditionError(what + " has " + std::to_string(have) +
                                   " tensors but version " + std::to_string(version) +
                                   " has " + std::to_string(table.size()) +
                                   "; it is not this model");
  }
  for (const TensorEntry& e : table) {
    uint8_t* data = nullptr;
    bool ok = false;
    if (b.ckpt) {
      const TensorInfo* t = b.ckpt->Find(e.name);
      if (t != nullptr && Describes(e, t->dtype, t->shape, t->element_width)) {
        size_t idx = *b.ckpt->IndexOf(e.name);
        b.ckpt_index.push_back(idx);
        data = b.ckpt->MutableData(idx).data();
        ok = true;
      }
    } else {
      for (const MutableTensorView& v : o.tensors) {
        if (v.name == e.name && Describes(e, v.dtype, v.shape, v.width) &&
            (v.data != nullptr || e.num_elements == 0)) {
          data = v.data;
          ok = true;
          break;
        }
      }
    }
    if (!ok) {
      return FailedPreconditionError(what + " lacks tensor '" + e.name + "' as version " +
                                     std::to_string(version) + " describes it");
    }
    b.data.push_back(data);
    b.bytes.push_back(e.num_elements * e.width);
  }
  return b;
}

Hash128 RangeOf(const Bound& b, size_t t, uint64_t offset, uint64_t length) {
  return RangeHash(b.data[t] + offset, length);
}

Hash128 TensorHash(const Bound& b, size_t t) { return RangeHash(b.data[t], b.bytes[t]); }

// Segment digests (64 KiB, docs/format.md "Range hash") of a version's
// base, hashed once per tensor, so a chunk's "before" range hash composes
// from them without reading the range again, and what is known of each
// tensor, so that the check of every tensor against the manifest reads
// only the tensors that need it (docs/protocol.md, "Hashing").
class Digests {
 public:
  explicit Digests(size_t tensors)
      : digests_(tensors), known_(tensors), stale_(tensors), covered_(tensors) {}

  // Hashes tensor t's segments (once). Returns the tensor's hash.
  Hash128 Ensure(const Bound& b, size_t t) {
    if (!known_[t]) {
      const uint64_t n = b.bytes[t];
      std::vector<Hash128>& d = digests_[t];
      uint64_t off = 0;
      do {
        uint64_t len = std::min<uint64_t>(kRangeHashSegment, n - off);
        d.push_back(HashBytes(b.data[t] + off, len));
        off += len;
      } while (off < n);
      known_[t] = true;
      stale_[t].assign(d.size(), false);
    }
    return HashSegmentDigests(digests_[t].data(), digests_[t].size());
  }
  // The range hash of [offset, offset + length) of tensor t: composed from
  // the digests when the range is made of whole segments of the tensor (the
  // last may be the tensor's short tail) none of which was written since
  // they were hashed; otherwise hashed from the bytes.
  Hash128 Range(const Bound& b, size_t t, uint64_t offset, uint64_t length) const {
    if (!known_[t] || length == 0 || offset % kRangeHashSegment != 0 ||
        (length % kRangeHashSegment != 0 && offset + length != b.bytes[t])) {
      return RangeOf(b, t, offset, length);
    }
    const size_t first = offset / kRangeHashSegment;
    const size_t n = (length + kRangeHashSegment - 1) / kRangeHashSegment;
    for (size_t i = first; i < first + n; ++i) {
      if (stale_[t][i]) return RangeOf(b, t, offset, length);
    }
    return HashSegmentDigests(digests_[t].data() + first, n);
  }
  // Bytes of tensor t were written: their digests no longer hold.
  void Written(size_t t, uint64_t offset, uint64_t length) {
    if (!known_[t] || length == 0) return;
    const size_t last = std::min<size_t>((offset + length - 1) / kRangeHashSegment,
                                         stale_[t].size() - 1);
    for (size_t i = offset / kRangeHashSegment; i <= last; ++i) stale_[t][i] = true;
  }
  // Covered: tensor t was checked at the base as a whole, and every write
  // since was a chunk whose range then hashed to the chunk's "after".
  void SetCovered(size_t t, bool covered) { covered_[t] = covered; }
  bool covered(size_t t) const { return covered_[t]; }

 private:
  std::vector<std::vector<Hash128>> digests_;
  std::vector<bool> known_;
  std::vector<std::vector<bool>> stale_;
  std::vector<bool> covered_;
};

// The one check of the base per step: tensors are hashed in order, once,
// before any chunk of them is applied in the step (chunks come in tensor
// order). In a fresh step each must be at the base; it is then covered.
// When resuming, earlier steps may have applied chunks: the tensor is not
// covered, and is checked from its bytes at the end.
class BaseCheck {
 public:
  // `of` names what `base_version` is the base of ("version 7"), for errors.
  BaseCheck(const Bound& b, Digests* digests, const std::vector<TensorEntry>& base,
            bool resume, uint64_t base_version, std::string of)
      : b_(b), digests_(digests), base_(base), resume_(resume),
        of_("version " + std::to_string(base_version) + ", the base of " + std::move(of)) {}

  // Checks tensors [next, upto].
  Status Through(size_t upto) {
    for (; next_ <= upto && next_ < base_.size(); ++next_) {
      const size_t t = next_;
      const bool at_base = digests_->Ensure(b_, t) == base_[t].before;
      if (!resume_ && !at_base) {
        return DataLossError("tensor '" + base_[t].name + "' is not at " + of_ +
                             " (it does not hash to the announced base): the local model "
                             "was changed (resync this receiver), or the publisher's "
                             "baseline is not that version");
      }
      digests_->SetCovered(t, at_base && !resume_);
    }
    return Status();
  }
  Status All() { return Through(base_.size()); }

 private:
  const Bound& b_;
  Digests* digests_;
  const std::vector<TensorEntry>& base_;
  const bool resume_;
  const std::string of_;
  size_t next_ = 0;
};

// Starts the write-back of applied ranges to the checkpoint's files while
// the next chunks are applied: a thread of its own hands each range to the
// kernel (sync_file_range, SYNC_FILE_RANGE_WRITE: start writing the range's
// dirty pages, do not wait for them), so the durable flush before the vote
// (msync + fsync of everything) finds little left to write, and the apply
// loop never blocks on the disk queue. A hint only: durability comes from
// that flush, and an error here only costs the overlap.
class Flusher {
 public:
  explicit Flusher(const Bound& b) : b_(b) {
    if (!b_.ckpt) return;
    for (const CheckpointFile& f : b_.ckpt->files()) {
      fds_.push_back(open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~Flusher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  Flusher(const Flusher&) = delete;
  Flusher& operator=(const Flusher&) = delete;

  void Add(size_t t, uint64_t offset, uint64_t length) {
    if (!b_.ckpt) return;
    const TensorInfo& info = b_.ckpt->tensors()[b_.ckpt_index[t]];
    if (info.file_index >= fds_.size() || fds_[info.file_index] < 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({fds_[info.file_index], info.offset + offset, length});
    cv_.notify_all();
  }

 private:
  struct Range {
    int fd;
    uint64_t offset, length;
  };
  void Run() {
    for (;;) {
      Range r;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty() || done_; });
        if (done_) return;  // what is left is written by the flush
        r = queue_.front();
        queue_.pop_front();
      }
      (void)sync_file_range(r.fd, static_cast<off64_t>(r.offset),
                            static_cast<off64_t>(r.length), SYNC_FILE_RANGE_WRITE);
    }
  }
  const Bound& b_;
  std::vector<int> fds_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Range> queue_;
  bool done_ = false;
  std::thread thread_;
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

// Applies chunks on worker threads while the caller fetches and checks
// the next ones (distinct chunks touch distinct ranges, docs/format.md §3,
// so they may be applied concurrently). With one thread, Submit applies at
// once on the caller's thread. The caller drains finished jobs and does
// the bookkeeping (journal, counters) itself, on its own thread.
class ApplyPool {
 public:
  // One range: a chunk of a version, or the chunks of several versions
  // for one range in version order (a fold), applied in sequence while
  // the range is in cache.
  struct Job {
    uint64_t index = 0;
    size_t tensor = 0;
    uint64_t offset = 0, length = 0;
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
    std::vector<UndoRecord> undo;  // one per applied chunk
    size_t applied = 0;  // chunks of the job applied, a prefix of them
  };

  explicit ApplyPool(int threads) : threads_(std::max(1, threads)) {
    if (threads_ == 1) return;
    for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~ApplyPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  ApplyPool(const ApplyPool&) = delete;
  ApplyPool& operator=(const ApplyPool&) = delete;

  // Blocks while 2 * threads jobs are in flight.
  void Submit(Job job) {
    if (workers_.empty()) {
      Done d{std::move(job), Status(), {}, 0};
      Run(&d, &scratch_);
      std::lock_guard<std::mutex> lock(mu_);
      ++in_flight_;
      pending_.push_back({d.job.tensor, d.job.offset, d.job.length});
      done_.push_back(std::move(d));
      return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    // Jobs finished but not drained do not count: the caller drains them.
    cv_.wait(lock, [&] {
      return in_flight_ - done_.size() < 2 * static_cast<size_t>(threads_);
    });
    ++in_flight_;
    pending_.push_back({job.tensor, job.offset, job.length});
    queue_.push_back(std::move(job));
    cv_.notify_all();
  }
  // Finished jobs, in any order; with `all`, waits until none is in flight.
  std::vector<Done> Drain(bool all) {
    std::unique_lock<std::mutex> lock(mu_);
    if (all) cv_.wait(lock, [&] { return in_flight_ == done_.size(); });
    std::vector<Done> out = std::move(done_);
    done_.clear();
    in_flight_ -= out.size();
    for (const Done& d : out) {
      auto it = std::find(pending_.begin(), pending_.end(),
                          Span{d.job.tensor, d.job.offset, d.job.length});
      if (it != pending_.end()) pending_.erase(it);
    }
    cv_.notify_all();
    return out;
  }
  // Whether a submitted job that was not drained yet (queued, running, or
  // finished) touches bytes of [offset, offset + length) of `tensor`. The
  // caller drains before it reads such a range: its hash (and the digests
  // the caller keeps) are known only once the job is drained, and two
  // applies of one range must never race (a chunk delivered twice, e.g.
  // under another chunk's key).
  bool Pending(size_t tensor, uint64_t offset, uint64_t length) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Span& p : pending_) {
      if (p.tensor == tensor && p.offset < offset + length && offset < p.offset + p.length) {
        return true;
      }
    }
    return false;
  }

 private:
  // Applies the job's chunks in order; each checks its own "after" hash,
  // which is the next one's "before". Stops at the first failure (the
  // range then holds the last applied chunk's "after").
  static void Run(Done* d, ApplyScratch* scratch) {
    for (const ParsedChunk& c : d->job.chunks) {
      UndoRecord undo;
      d->status = ApplyChunkInPlace(c, d->job.data, scratch, nullptr, &undo);
      if (!d->status.ok()) return;
      d->undo.push_back(std::move(undo));
      ++d->applied;
    }
  }
  void Work() {
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
      Done d{std::move(job), Status(), {}, 0};
      Run(&d, &scratch);
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(std::move(d));
      cv_.notify_all();
    }
  }
  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<Done> done_;
  size_t in_flight_ = 0;  // submitted and not yet drained
  struct Span {
    size_t tensor;
    uint64_t offset, length;
    bool operator==(const Span&) const = default;
  };
  std::vector<Span> pending_;  // the ranges of those jobs
  bool stop_ = false;
  ApplyScratch scratch_;  // the inline (one thread) case
};

std::string StatePath(const ReceiverOptions& o, const char* name) {
  return o.state_dir + "/" + name;
}

std::string Parent(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

Status SyncDirectory(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return UnavailableError("cannot open directory '" + dir + "' to fsync it");
  int rc = fsync(fd);
  close(fd);
  if (rc != 0) return UnavailableError("fsync failed on directory '" + dir + "'");
  return Status();
}

// A single-file checkpoint is a path that is a file, or names a
// .safetensors file that does not exist yet; anything else is a directory.
bool IsSingleFile(const std::string& path) {
  if (PathExists(path)) return !IsDirectory(path);
  return path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
}

bool CheckpointPresent(const std::string& path) {
  if (!PathExists(path)) return false;
  if (!IsDirectory(path)) return true;
  return PathExists(path + "/model.safetensors") ||
         PathExists(path + "/model.safetensors.index.json");
}

}  // namespace

Result<std::unique_ptr<Receiver>> Receiver::Open(ObjectStore* store,
                                                 ReceiverOptions options) {
  REFIT_RETURN_IF_ERROR(ValidateMember(options.member));
  if (options.checkpoint.empty() == options.tensors.empty()) {
    return InvalidArgumentError("receiver '" + options.member +
                                "' needs either a checkpoint path or in-memory tensors, "
                                "not both and not neither");
  }
  if (!IsDirectory(options.state_dir)) {
    return NotFoundError("receiver state directory '" + options.state_dir +
                         "' does not exist; create it first");
  }
  std::unique_ptr<Receiver> r(new Receiver(store, std::move(options)));
  const std::string active = StatePath(r->opt_, "active");
  if (PathExists(active)) {
    REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> text, ReadFile(active));
    std::string s(text.begin(), text.end());
    char* end = nullptr;
    unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (end == s.c_str()) return DataLossError("active pointer '" + active + "' is corrupt");
    r->active_ = v;
  }
  return r;
}

Status Receiver::Activate(uint64_t version) {
  CrashPoint("receiver.before-activate");
  std::string text = std::to_string(version) + "\n";
  REFIT_RETURN_IF_ERROR(WriteFileAtomic(
      StatePath(opt_, "active"),
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size())));
  active_ = version;
  CrashPoint("receiver.after-activate");
  return Journal::Remove(StatePath(opt_, "journal"));
}

Result<std::vector<uint64_t>> Receiver::ListVersions() {
  REFIT_ASSIGN_OR_RETURN(auto objects, store_->List("index/"));
  std::vector<uint64_t> out;
  for (const ObjectInfo& o : objects) {
    out.push_back(std::strtoull(o.key.c_str() + 6, nullptr, 10));
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::optional<Decision>> Receiver::ReadDecision(uint64_t version) {
  auto bytes = store_->Get(DecisionKey(version));
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) return std::optional<Decision>();
    return bytes.status();
  }
  REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*bytes));
  REFIT_ASSIGN_OR_RETURN(Decision d, DecodeDecision(body));
  if (d.version != version) return DataLossError("decision names another version");
  return std::optional<Decision>(d);
}

bool Receiver::HasModel() const {
  return opt_.checkpoint.empty() || CheckpointPresent(opt_.checkpoint);
}

Result<Announcement> Receiver::ReadAnnouncement(uint64_t version, Sha256* sha) {
  REFIT_ASSIGN_OR_RETURN(auto bytes, store_->Get(IndexKey(version)));
  *sha = ComputeSha256(bytes);
  REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(bytes));
  REFIT_ASSIGN_OR_RETURN(Announcement a, DecodeAnnouncement(body));
  if (a.version != version) return DataLossError("announcement names another version");
  return a;
}

Result<Manifest> Receiver::ReadManifest(uint64_t version, Sha256* sha) {
  REFIT_ASSIGN_OR_RETURN(auto bytes, store_->Get(ManifestKey(version)));
  *sha = ComputeSha256(bytes);
  REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(bytes));
  REFIT_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(body));
  if (m.version != version) return DataLossError("manifest names another version");
  return m;
}

Result<StepResult> Receiver::Step(uint64_t fold_limit) {
  failed_vote_.reset();
  reread_pending_ = false;
  // A snapshot that was being put in place comes first: until it is
  // active, the checkpoint may be any mix of old and new files.
  if (PathExists(StatePath(opt_, "snapshot"))) {
    REFIT_ASSIGN_OR_RETURN(auto snap, NewestSnapshot());
    if (!snap || *snap < active_) {
      return FailedPreconditionError("a snapshot was being installed but the store holds "
                                     "none at or above the active version");
    }
    return CatchUpFromSnapshot(*snap);
  }
  // Then an interrupted version.
  REFIT_ASSIGN_OR_RETURN(auto journal, Journal::Load(StatePath(opt_, "journal")));
  if (journal && journal->version > active_ && !journal->fold_versions.empty()) {
    // An interrupted fold: finish the same fold (its ranges may hold any
    // of the chain's versions, so it cannot go on one version at a time).
    if (journal->base_version != active_) {
      return DataLossError("the journal holds a fold onto version " +
                           std::to_string(journal->base_version) + " but the active version is " +
                           std::to_string(active_));
    }
    std::vector<Announcement> chain;
    std::vector<Sha256> shas;
    for (size_t j = 0; j < journal->fold_versions.size(); ++j) {
      const uint64_t v = journal->fold_versions[j];
      Sha256 sha;
      auto announced = ReadAnnouncement(v, &sha);
      if (!announced.ok() && announced.status().code() == StatusCode::kNotFound &&
          !opt_.checkpoint.empty()) {
        REFIT_ASSIGN_OR_RETURN(auto snap, NewestSnapshot());
        if (snap && *snap >= journal->version) return CatchUpFromSnapshot(*snap);
      }
      REFIT_ASSIGN_OR_RETURN(Announcement a, std::move(announced));
      if (sha != journal->fold_announcements[j]) {
        return DataLossError("the stored announcement of version " + std::to_string(v) +
                             " differs from the one this receiver journaled");
      }
      REFIT_ASSIGN_OR_RETURN(auto decision, ReadDecision(v));
      if (!decision || !decision->commit) {
        return DataLossError("the journaled fold names version " + std::to_string(v) +
                             ", which is not committed");
      }
      chain.push_back(std::move(a));
      shas.push_back(sha);
    }
    auto folded = Fold(chain, shas, /*resume=*/true);
    if (!folded.ok()) return OrSnapshot(folded.status());
    if (!*folded) return InternalError("a journaled fold could not be resumed");
    return std::move(**folded);
  }
  if (journal && journal->version > active_) {
    Sha256 sha;
    auto announced = ReadAnnouncement(journal->version, &sha);
    if (!announced.ok() && announced.status().code() == StatusCode::kNotFound &&
        !opt_.checkpoint.empty()) {
      // Retention deleted the version while this receiver was inside it. A
      // snapshot at or above it replaces every file, torn or not.
      REFIT_ASSIGN_OR_RETURN(auto snap, NewestSnapshot());
      if (snap && *snap >= journal->version) return CatchUpFromSnapshot(*snap);
    }
    REFIT_ASSIGN_OR_RETURN(Announcement a, std::move(announced));
    if (sha != journal->announcement_sha256) {
      return DataLossError("the stored announcement of version " +
                           std::to_string(journal->version) +
                           " differs from the one this receiver journaled");
    }
    bool member = std::find(a.members.begin(), a.members.end(), opt_.member) != a.members.end();
    REFIT_ASSIGN_OR_RETURN(auto decision, ReadDecision(a.version));
    Result<StepResult> step = ProcessVersion(a, sha, member, /*resume=*/true);
    // A committed version this receiver only catches up with.
    return decision && decision->commit ? OrSnapshot(std::move(step)) : step;
  }
  REFIT_ASSIGN_OR_RETURN(auto versions, ListVersions());
  REFIT_ASSIGN_OR_RETURN(bool broken, ChainBroken(versions));
  if (broken) {
    REFIT_ASSIGN_OR_RETURN(auto snap, NewestSnapshot());
    if (snap && (*snap > active_ || !HasModel())) {
      return CatchUpFromSnapshot(*snap);
    }
    if (!snap && !HasModel()) {
      return StepResult{};  // the publisher has not stored a snapshot yet
    }
    return FailedPreconditionError(
        "receiver '" + opt_.member + "' at version " + std::to_string(active_) +
        " has no chain of versions to follow and no newer snapshot to take");
  }
  for (uint64_t v : versions) {
    if (v <= active_) continue;
    Sha256 sha;
    REFIT_ASSIGN_OR_RETURN(Announcement a, ReadAnnouncement(v, &sha));
    if (a.base_version != active_) {
      // Based on a version we skipped (aborted) or do not have yet.
      if (a.base_version > active_) {
        REFIT_ASSIGN_OR_RETURN(auto d, ReadDecision(v));
        if (!d) return StepResult{};  // wait for the chain to settle
      }
      continue;
    }
    REFIT_ASSIGN_OR_RETURN(auto decision, ReadDecision(v));
    if (decision && !decision->commit) continue;  // aborted: not ours to apply
    bool member = std::find(a.members.begin(), a.members.end(), opt_.member) != a.members.end();
    if (!decision && !member) {  // not ours; wait for its decision
      StepResult idle;
      idle.not_member_of = v;
      return idle;
    }
    if (decision && opt_.max_fold_versions > 1) {
      // Committed: extend it with the committed versions that follow, each
      // built on the previous one (aborted ones are passed over; an
      // undecided one ends the chain).
      std::vector<Announcement> chain{a};
      std::vector<Sha256> shas{sha};
      for (auto it = std::upper_bound(versions.begin(), versions.end(), v);
           it != versions.end() && *it <= fold_limit &&
           chain.size() < static_cast<size_t>(opt_.max_fold_versions);
           ++it) {
        REFIT_ASSIGN_OR_RETURN(auto d, ReadDecision(*it));
        if (!d) break;
        if (!d->commit) continue;
        Sha256 next_sha;
        REFIT_ASSIGN_OR_RETURN(Announcement next, ReadAnnouncement(*it, &next_sha));
        if (next.base_version != chain.back().version) break;
        chain.push_back(std::move(next));
        shas.push_back(next_sha);
      }
      if (chain.size() >= 2) {
        auto folded = Fold(chain, shas, /*resume=*/false);
        if (!folded.ok()) return OrSnapshot(folded.status());
        if (*folded) return std::move(**folded);
      }
    }
    Result<StepResult> step = ProcessVersion(a, sha, member && !decision, /*resume=*/false);
    return decision ? OrSnapshot(std::move(step)) : step;
  }
  return StepResult{};
}

Result<bool> Receiver::ChainBroken(const std::vector<uint64_t>& versions) {
  if (!HasModel()) return true;
  // Retention deletes the oldest versions first, so the chain from the
  // active version exists iff the first version above it builds on it (or
  // on an older one: a version whose base we skipped is passed over).
  auto next = std::upper_bound(versions.begin(), versions.end(), active_);
  if (next == versions.end()) return false;
  Sha256 sha;
  REFIT_ASSIGN_OR_RETURN(Announcement a, ReadAnnouncement(*next, &sha));
  return a.base_version > active_;
}

Result<std::optional<uint64_t>> Receiver::NewestSnapshot() {
  auto head_bytes = store_->Get(kHeadKey);
  if (!head_bytes.ok()) {
    if (head_bytes.status().code() == StatusCode::kNotFound) return std::optional<uint64_t>();
    return head_bytes.status();
  }
  REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*head_bytes));
  REFIT_ASSIGN_OR_RETURN(uint64_t head, DecodeHead(body));
  REFIT_ASSIGN_OR_RETURN(auto objects, store_->List(kSnapshotsPrefix));
  std::optional<uint64_t> best;
  for (const ObjectInfo& o : objects) {
    auto v = ParseSnapshotIndexKey(o.key);
    if (v && *v <= head && (!best || *v > *best)) best = v;
  }
  return best;
}

Result<StepResult> Receiver::CatchUpFromSnapshot(uint64_t version) {
  if (opt_.checkpoint.empty()) {
    return FailedPreconditionError(
        "receiver '" + opt_.member + "' holds its tensors in memory and is at version " +
        std::to_string(active_) + ", which the store can no longer bring forward by "
        "deltas; load snapshot " + std::to_string(version) +
        " into memory and reopen the receiver at it");
  }
  auto t0 = Clock::now();
  StepResult result;
  result.version = version;
  REFIT_ASSIGN_OR_RETURN(auto index_bytes, store_->Get(SnapshotIndexKey(version)));
  result.bytes_fetched += index_bytes.size();
  REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(index_bytes));
  REFIT_ASSIGN_OR_RETURN(SnapshotIndex index, DecodeSnapshotIndex(body));
  if (index.version != version) return DataLossError("snapshot index names another version");

  std::string ckpt = opt_.checkpoint;
  while (ckpt.size() > 1 && ckpt.back() == '/') ckpt.pop_back();
  const bool single = IsSingleFile(ckpt);
  if (single && index.files.size() != 1) {
    return FailedPreconditionError("snapshot " + std::to_string(version) + " has " +
                                   std::to_string(index.files.size()) +
                                   " files but checkpoint '" + ckpt + "' is a single file");
  }
  auto destination = [&](size_t i) {
    if (single) return ckpt;
    // A single-file snapshot becomes the directory's model.safetensors.
    return ckpt + "/" + (index.files.size() == 1 ? "model.safetensors" : index.files[i].name);
  };

  // Download and check every file into a directory beside the checkpoint
  // (same file system, so the renames below are atomic per file).
  const std::string tmp = ckpt + ".refit-snapshot";
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  std::filesystem::create_directories(tmp, ec);
  if (ec) return UnavailableError("cannot create '" + tmp + "': " + ec.message());
  for (size_t i = 0; i < index.files.size(); ++i) {
    const SnapshotFile& f = index.files[i];
    REFIT_ASSIGN_OR_RETURN(auto bytes, store_->Get(SnapshotFileKey(version, i)));
    result.bytes_fetched += bytes.size();
    if (bytes.size() != f.size || ComputeSha256(bytes) != f.sha256) {
      return DataLossError("snapshot " + std::to_string(version) + " file '" + f.name +
                           "' does not match its SHA-256 in the index");
    }
    REFIT_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/" + std::to_string(i), bytes));
  }

  // From here until activation the checkpoint is a mix; the marker makes a
  // restarted receiver finish the job before anything else.
  const std::string marker = StatePath(opt_, "snapshot");
  std::string text = std::to_string(version) + "\n";
  REFIT_RETURN_IF_ERROR(WriteFileAtomic(
      marker, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size())));
  for (size_t i = 0; i < index.files.size(); ++i) {
    const std::string dst = destination(i);
    std::filesystem::create_directories(Parent(dst), ec);
    if (ec) return UnavailableError("cannot create '" + Parent(dst) + "': " + ec.message());
    if (std::rename((tmp + "/" + std::to_string(i)).c_str(), dst.c_str()) != 0) {
      return UnavailableError("cannot rename a snapshot file over '" + dst + "'");
    }
    REFIT_RETURN_IF_ERROR(SyncDirectory(Parent(dst)));
  }
  std::filesystem::remove_all(tmp, ec);

  // Every tensor must be the snapshot's version, bit for bit.
  {
    REFIT_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::Open(ckpt, Checkpoint::Mode::kReadOnly));
    if (ck.tensors().size() != index.tensors.size()) {
      return DataLossError("checkpoint from snapshot " + std::to_string(version) + " has " +
                           std::to_string(ck.tensors().size()) + " tensors, the index " +
                           std::to_string(index.tensors.size()));
    }
    for (const TensorEntry& e : index.tensors) {
      const TensorInfo* t = ck.Find(e.name);
      if (t == nullptr || t->dtype != e.dtype || t->shape != e.shape ||
          t->element_width != e.width) {
        return DataLossError("checkpoint from snapshot " + std::to_string(version) +
                             " lacks tensor '" + e.name + "' as the index describes it");
      }
      auto d = ck.Data(*ck.IndexOf(e.name));
      if (RangeHash(d.data(), d.size()) != e.after) {
        return DataLossError("tensor '" + e.name + "' from snapshot " +
                             std::to_string(version) + " does not hash to the index");
      }
    }
  }
  REFIT_RETURN_IF_ERROR(Activate(version));
  std::filesystem::remove(marker, ec);
  result.outcome = StepResult::Outcome::kSnapshot;
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

Result<StepResult> Receiver::OrSnapshot(Result<StepResult> step) {
  if (step.ok() || opt_.checkpoint.empty()) return step;
  const StatusCode code = step.status().code();
  if (code != StatusCode::kDeadlineExceeded && code != StatusCode::kDataLoss) return step;
  auto snap = NewestSnapshot();
  if (!snap.ok() || !*snap || **snap <= active_) return step;
  // The snapshot replaces every file, whatever the failed step left in
  // them, and its activation ends the journal.
  auto taken = CatchUpFromSnapshot(**snap);
  if (!taken.ok()) {
    return taken.status().WithContext(step.status().ToString() +
                                      "; resyncing from snapshot " + std::to_string(**snap));
  }
  taken->recovered = step.status().ToString();
  return taken;
}

Result<StepResult> Receiver::SyncTo(uint64_t version, int timeout_ms) {
  auto start = Clock::now();
  StepResult last;
  while (active_ < version) {
    REFIT_ASSIGN_OR_RETURN(last, Step(/*fold_limit=*/version));
    if (active_ >= version) break;
    if (ElapsedMs(start) > timeout_ms) {
      return DeadlineExceededError("receiver '" + opt_.member + "' did not reach version " +
                                   std::to_string(version) + " within " +
                                   std::to_string(timeout_ms) + " ms (active " +
                                   std::to_string(active_) + ")");
    }
    if (last.outcome == StepResult::Outcome::kIdle) {
      REFIT_RETURN_IF_ERROR(Pause("version " + std::to_string(version)));
    }
  }
  return last;
}

Status Receiver::Pause(const std::string& waiting_for) {
  auto stopped = [&] {
    return CancelledError("stopped while waiting for " + waiting_for +
                          "; what was done is journaled and resumes on the next step");
  };
  if (opt_.stop && opt_.stop()) return stopped();
  std::this_thread::sleep_for(std::chrono::milliseconds(opt_.poll_ms));
  if (opt_.stop && opt_.stop()) return stopped();
  return Status();
}

Result<std::optional<std::vector<TensorEntry>>> Receiver::ActiveTensors() {
  Sha256 sha;
  auto m = ReadManifest(active_, &sha);
  if (m.ok()) return std::optional<std::vector<TensorEntry>>(std::move(m->tensors));
  if (m.status().code() != StatusCode::kNotFound) return m.status();
  // Version 0 has no manifest; a snapshot records its hashes when the
  // store keeps snapshots.
  auto bytes = store_->Get(SnapshotIndexKey(active_));
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) {
      return std::optional<std::vector<TensorEntry>>();
    }
    return bytes.status();
  }
  REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*bytes));
  REFIT_ASSIGN_OR_RETURN(SnapshotIndex index, DecodeSnapshotIndex(body));
  if (index.version != active_) return DataLossError("snapshot index names another version");
  return std::optional<std::vector<TensorEntry>>(std::move(index.tensors));
}

Result<StepResult> Receiver::ProcessVersion(const Announcement& a,
                                            const Sha256& announcement_sha, bool vote,
                                            bool resume) {
  VersionFailure failure;
  Result<StepResult> step = ApplyVersion(a, announcement_sha, vote, resume, &failure);
  if (step.ok() || !vote || !failure.set) return step;
  // The version cannot be applied here: say so at once, so the coordinator
  // aborts it without waiting for its deadline (docs/protocol.md, "Failed
  // votes"). The journal then holds nothing more to do than the rollback.
  const std::string V = std::to_string(a.version);
  Status put = store_->Put(VoteKey(a.version, opt_.member),
                           opt_.auth.SealMember(EncodeVote(Vote{false, step.status().ToString()})));
  if (!put.ok()) return put.WithContext(step.status().ToString() + "; voting failed on version " + V);
  if (failure.journaled) {
    REFIT_ASSIGN_OR_RETURN(Journal journal, Journal::Reopen(StatePath(opt_, "journal")));
    REFIT_RETURN_IF_ERROR(journal.Failed(failure.bound));
    REFIT_RETURN_IF_ERROR(journal.Sync());
  }
  failed_vote_ = a.version;
  return Status(step.status().code(),
                std::string(step.status().message()) + "; voted failed on version " + V +
                    " (its coordinator aborts it; the next step rolls it back)");
}

Result<StepResult> Receiver::ApplyVersion(const Announcement& a,
                                          const Sha256& announcement_sha, bool vote,
                                          bool resume, VersionFailure* failure) {
  auto t0 = Clock::now();
  StepResult result;
  result.version = a.version;
  result.versions_folded = 1;
  const std::string V = std::to_string(a.version);
  const std::string journal_path = StatePath(opt_, "journal");
  if (!resume) {
    // The announced base must be the version this receiver holds, as the
    // store records it: a version diffed from another baseline cannot
    // apply, and nothing of it is journaled or written.
    REFIT_ASSIGN_OR_RETURN(auto held, ActiveTensors());
    for (size_t t = 0; held && t < a.tensors.size(); ++t) {
      const TensorEntry& e = a.tensors[t];
      auto it = std::find_if(held->begin(), held->end(),
                             [&](const TensorEntry& h) { return h.name == e.name; });
      if (it != held->end() && it->after != e.before) {
        const std::string base = std::to_string(a.base_version);
        failure->set = true;
        failure->bound = 0;
        return FailedPreconditionError(
            "version " + V + " is announced on base version " + base + " with tensor '" +
            e.name + "' not as version " + base + "'s manifest records it: its publisher's "
            "baseline is not version " + base + ", which this receiver holds; it cannot apply");
      }
    }
  }
  std::optional<JournalState> state;
  Journal journal;
  if (resume) {
    REFIT_ASSIGN_OR_RETURN(state, Journal::Load(journal_path));
    REFIT_ASSIGN_OR_RETURN(journal, Journal::Reopen(journal_path));
  } else {
    REFIT_ASSIGN_OR_RETURN(journal, Journal::Begin(journal_path, a.version, a.base_version,
                                                    announcement_sha));
    state.emplace();
    CrashPoint("receiver.after-begin");
  }
  failure->journaled = true;
  // Marks a failure as the version's (see ProcessVersion); chunks at or
  // above `bound` were not written in it. A receiver that voted ready
  // already stands by that vote.
  auto version_failure = [&](uint64_t bound) {
    if (state->voted) return;
    failure->set = true;
    failure->bound = resume ? kAllChunks : bound;
  };
  auto bound_tensors = BindTensors(opt_, a.tensors, a.version);
  if (!bound_tensors.ok()) {
    version_failure(0);
    return bound_tensors.status();
  }
  Bound b = std::move(*bound_tensors);
  REFIT_ASSIGN_OR_RETURN(auto decision, ReadDecision(a.version));
  ApplyScratch scratch;

  // The manifest closes the chunk list; until it is seen, chunks are
  // checked against the announcement alone (docs/protocol.md, "Receiver").
  std::optional<Manifest> manifest;
  std::vector<Sha256> seen;  // SHA-256 of chunk objects 0..seen.size()-1
  auto read_manifest = [&]() -> Status {
    Sha256 sha;
    auto got = ReadManifest(a.version, &sha);
    if (!got.ok()) {
      return got.status().code() == StatusCode::kNotFound ? Status() : got.status();
    }
    const Manifest& m = *got;
    bool same = m.base_version == a.base_version && m.members == a.members &&
                m.tensors.size() == a.tensors.size() && m.chunks.size() >= seen.size();
    for (size_t t = 0; same && t < m.tensors.size(); ++t) {
      const TensorEntry& x = m.tensors[t];
      const TensorEntry& y = a.tensors[t];
      same = x.name == y.name && x.dtype == y.dtype && x.width == y.width &&
             x.shape == y.shape && x.before == y.before;
    }
    if (!same) {
      return DataLossError("the manifest of version " + V +
                           " does not match its announcement");
    }
    for (size_t i = 0; i < seen.size(); ++i) {
      if (m.chunks[i].sha256 != seen[i]) {
        return DataLossError("chunk " + std::to_string(i) + " of version " + V +
                             " that this receiver applied is not the one its manifest lists");
      }
    }
    manifest = std::move(*got);
    return Status();
  };

  // Fetches, authenticates and parses chunk i (or a re-send of it).
  std::vector<uint8_t> object;
  auto parse = [&](uint64_t i, bool original) -> Result<ParsedChunk> {
    result.bytes_fetched += object.size();
    if (original && manifest &&
        (i >= manifest->chunks.size() || object.size() != manifest->chunks[i].size ||
         ComputeSha256(object) != manifest->chunks[i].sha256)) {
      return DataLossError("chunk " + std::to_string(i) + " of version " + V +
                           " does not match its manifest hash");
    }
    REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(object));
    REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(body));
    const ChunkHeader& h = c.header;
    if (h.IsStrided()) {
      // Versions carry contiguous ranges (ranks' strided regions are
      // assembled by the coordinator, docs/trainer.md).
      return DataLossError("chunk " + std::to_string(i) + " of version " + V +
                           " is a strided region, which versions do not carry");
    }
    if (h.tensor_id >= a.tensors.size() || h.width != a.tensors[h.tensor_id].width ||
        h.count == 0 || h.start > a.tensors[h.tensor_id].num_elements ||
        h.count > a.tensors[h.tensor_id].num_elements - h.start) {
      return DataLossError("chunk " + std::to_string(i) + " of version " + V +
                           " names a range outside the announced tensors");
    }
    if (h.version != a.version || h.base_version != a.base_version) {
      return DataLossError("chunk " + std::to_string(i) + " belongs to another version");
    }
    if (manifest && i < manifest->chunks.size()) {
      const ManifestChunk& mc = manifest->chunks[i];
      if (h.tensor_id != mc.tensor_id || h.start != mc.start || h.count != mc.count ||
          (original && h.kind != static_cast<codec::ChunkKind>(mc.kind))) {
        return DataLossError("chunk " + std::to_string(i) + " does not match its manifest entry");
      }
    }
    return c;
  };
  auto fetch = [&](const std::string& key, uint64_t i, bool original) -> Result<ParsedChunk> {
    REFIT_ASSIGN_OR_RETURN(object, store_->Get(key));
    return parse(i, original);
  };
  auto range_of = [&](const ChunkHeader& h) {
    const uint64_t w = a.tensors[h.tensor_id].width;
    return std::pair<uint64_t, uint64_t>(h.start * w, h.count * w);
  };

  Digests digests(a.tensors.size());
  Flusher flusher(b);

  // Asks for overwrite re-sends of `torn` chunks (at V if `after`, else at
  // the base) and applies them as they arrive.
  auto repair = [&](const std::vector<uint64_t>& torn, bool after) -> Status {
    if (torn.empty()) return Status();
    ResendRequest q;
    for (uint64_t i : torn) {
      q.chunks.push_back(i);
      q.after.push_back(after);
    }
    REFIT_RETURN_IF_ERROR(store_->Put(RequestKey(a.version, opt_.member),
                                      opt_.auth.SealMember(EncodeRequest(q))));
    auto start = Clock::now();
    for (uint64_t i : torn) {
      for (;;) {
        auto c = fetch(ResendKey(a.version, opt_.member, i, after), i, /*original=*/false);
        if (c.ok()) {
          if (c->header.kind != codec::ChunkKind::kSparseOverwrite &&
              c->header.kind != codec::ChunkKind::kRaw) {
            return DataLossError("re-send of chunk " + std::to_string(i) + " is not an overwrite");
          }
          UndoRecord undo;
          const size_t t = c->header.tensor_id;
          REFIT_RETURN_IF_ERROR(ApplyChunkInPlace(*c, b.data[t], &scratch, nullptr, &undo));
          auto [off, len] = range_of(c->header);
          digests.Written(t, off, len);
          digests.SetCovered(t, false);  // checked from its bytes at the end
          flusher.Add(t, off, len);
          ++result.chunks_resent;
          break;
        }
        if (c.status().code() != StatusCode::kNotFound) return c.status();
        if (ElapsedMs(start) > opt_.resend_timeout_ms) {
          return DeadlineExceededError("no re-send of chunk " + std::to_string(i) +
                                       " of version " + V + " within " +
                                       std::to_string(opt_.resend_timeout_ms) +
                                       " ms; is the publisher running?");
        }
        REFIT_RETURN_IF_ERROR(Pause("a re-send of chunk " + std::to_string(i) + " of version " + V));
      }
    }
    return Status();
  };

  // Undoes whatever of the version is in place. Chunks are final once
  // stored (the publisher writes them once), so the chunks in the store are
  // the ones that were applied; without a manifest they are probed in
  // order up to the first missing one (chunks are applied in order).
  // After a failed vote, only chunks below the journaled bound were
  // written, and only the tensors they belong to are checked at the end:
  // the others were never touched in this version (their state is the
  // receiver's, whatever the announcement says of it).
  auto roll_back = [&]() -> Status {
    if (!manifest) REFIT_RETURN_IF_ERROR(read_manifest());
    const uint64_t bound = state->failed ? state->failed_bound : kAllChunks;
    std::vector<bool> probed(a.tensors.size(), false);
    uint64_t last_journaled = 0;
    for (const auto& [i, undo] : state->applied) last_journaled = std::max(last_journaled, i + 1);
    std::vector<uint64_t> torn;
    for (uint64_t i = 0; i < bound; ++i) {
      if (manifest && i >= manifest->chunks.size()) break;
      auto c = fetch(ChunkKey(a.version, i), i, /*original=*/true);
      if (!c.ok()) {
        const StatusCode code = c.status().code();
        if (!manifest && code == StatusCode::kNotFound && i >= last_journaled) break;
        // A chunk is applied only after it passed these checks, and a
        // stored chunk never changes: one that fails them now (changed in
        // the store) was not applied, unless journaled. The final check
        // of the tensors catches the one case left (applied, not yet
        // journaled, then changed in the store).
        if ((code == StatusCode::kDataLoss || code == StatusCode::kUnauthenticated) &&
            state->applied.count(i) == 0) {
          continue;
        }
        return c.status();
      }
      auto [off, len] = range_of(c->header);
      const size_t t = c->header.tensor_id;
      probed[t] = true;
      Hash128 h = RangeOf(b, t, off, len);
      if (h == c->header.before) continue;
      if (h == c->header.after) {
        auto it = state->applied.find(i);
        if (c->header.IsXor()) {
          REFIT_RETURN_IF_ERROR(UndoChunkInPlace(*c, b.data[t], &scratch, {}));
        } else if (it != state->applied.end()) {
          REFIT_RETURN_IF_ERROR(UndoChunkInPlace(*c, b.data[t], &scratch, it->second));
        } else {
          torn.push_back(i);
        }
        continue;
      }
      torn.push_back(i);
    }
    REFIT_RETURN_IF_ERROR(repair(torn, /*after=*/false));
    for (size_t t = 0; t < a.tensors.size(); ++t) {
      if ((bound == kAllChunks || probed[t]) && TensorHash(b, t) != a.tensors[t].before) {
        return DataLossError("rollback of version " + V + " left tensor '" +
                             a.tensors[t].name +
                             "' off its base; resync this receiver from a snapshot");
      }
    }
    REFIT_RETURN_IF_ERROR(b.Sync());
    result.outcome = StepResult::Outcome::kAborted;
    return Journal::Remove(journal_path);
  };
  auto aborted = [&]() -> Result<StepResult> {
    REFIT_RETURN_IF_ERROR(roll_back());
    result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return result;
  };

  if (decision && !decision->commit) return aborted();
  if (state->failed) {
    // This receiver voted failed: nothing more is applied; the
    // coordinator aborts the version (any failed vote aborts).
    auto start = Clock::now();
    while (!decision) {
      if (ElapsedMs(start) > opt_.decision_timeout_ms) {
        return DeadlineExceededError(
            "voted failed on version " + V + " but no decision arrived within " +
            std::to_string(opt_.decision_timeout_ms) + " ms; the next step waits again");
      }
      REFIT_RETURN_IF_ERROR(Pause("the decision on version " + V));
      REFIT_ASSIGN_OR_RETURN(decision, ReadDecision(a.version));
    }
    if (!decision->commit) return aborted();
    return DataLossError("version " + V + " was committed although this receiver voted "
                         "failed on it; resync this receiver from a snapshot");
  }

  BaseCheck base_check(b, &digests, a.tensors, resume, a.base_version, "version " + V);

  // Apply every chunk at most once, as it lands.
  const int threads = opt_.threads > 0 ? opt_.threads
                                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ApplyPool pool(threads);
  Status apply_error;
  auto drain = [&](bool all) -> Status {
    for (ApplyPool::Done& d : pool.Drain(all)) {
      if (!d.status.ok()) {
        if (apply_error.ok()) apply_error = d.status;
        continue;
      }
      const ApplyPool::Job& job = d.job;
      ++chunks_applied_total_;
      REFIT_RETURN_IF_ERROR(journal.Applied(job.index, d.undo.front()));
      ++result.chunks_applied;
      result.changed_elements += job.chunks.front().header.changed;
      // ApplyChunkInPlace re-hashed the range to the chunk's "after": the
      // tensor stays covered.
      digests.Written(job.tensor, job.offset, job.length);
      flusher.Add(job.tensor, job.offset, job.length);
      if (job.early) ++result.chunks_before_manifest;
      CrashPoint("receiver.after-chunk");
      if (job.early) CrashPoint("receiver.after-early-chunk");
    }
    return apply_error;
  };
  // Whatever way this step ends, chunks applied by the workers are counted
  // and journaled (with their pre-images) before it returns.
  const OnExit drain_on_exit([&] { (void)drain(true); });
  CrashPoint("receiver.before-apply");
  std::vector<uint64_t> torn;
  auto last_progress = Clock::now();
  std::optional<Clock::time_point> manifest_seen;
  int polls = 0;
  REFIT_RETURN_IF_ERROR(read_manifest());  // present already when catching up
  for (uint64_t i = 0;;) {
    if (manifest) {
      if (!manifest_seen) manifest_seen = Clock::now();
      if (i >= manifest->chunks.size()) break;
    }
    auto got = store_->Get(ChunkKey(a.version, i));
    if (!got.ok()) {
      if (got.status().code() != StatusCode::kNotFound) return got.status();
      if (manifest) {
        return DataLossError("the manifest of version " + V + " lists chunk " +
                             std::to_string(i) + " but the store does not hold it");
      }
      REFIT_RETURN_IF_ERROR(read_manifest());
      if (manifest) continue;
      // The publisher is still uploading (or stopped): an abort decision
      // ends the wait, and so does the deadline.
      REFIT_RETURN_IF_ERROR(drain(false));
      if (++polls % 8 == 0) {
        REFIT_ASSIGN_OR_RETURN(decision, ReadDecision(a.version));
        if (decision && !decision->commit) {
          REFIT_RETURN_IF_ERROR(drain(true));
          return aborted();
        }
      }
      if (ElapsedMs(last_progress) > opt_.chunk_timeout_ms) {
        return DeadlineExceededError(
            "version " + V + ": neither chunk " + std::to_string(i) +
            " nor the manifest arrived within " + std::to_string(opt_.chunk_timeout_ms) +
            " ms; its publisher may have stopped (publishing a later version aborts it); "
            "the work is journaled and resumes on the next step");
      }
      REFIT_RETURN_IF_ERROR(Pause("chunk " + std::to_string(i) + " of version " + V));
      continue;
    }
    object = std::move(*got);
    auto parsed = parse(i, /*original=*/true);
    if (!parsed.ok()) {
      // The same bytes in consecutive steps are the stored object: the
      // version cannot be applied here (a re-send would come from the same
      // publisher that stored it; the version is aborted instead).
      const std::string key = ChunkKey(a.version, i);
      const Sha256 bad = ComputeSha256(object);
      if (bad_read_.key == key && bad_read_.sha == bad) {
        ++bad_read_.reads;
      } else {
        bad_read_ = BadRead{key, bad, 1};
      }
      if (bad_read_.reads >= kPersistentBadReads) {
        version_failure(i);
      } else {
        reread_pending_ = true;
      }
      return parsed.status();
    }
    if (bad_read_.key == ChunkKey(a.version, i)) bad_read_ = BadRead{};
    ParsedChunk c = std::move(*parsed);
    const Sha256 sha = manifest ? manifest->chunks[i].sha256 : ComputeSha256(object);
    last_progress = Clock::now();
    const size_t t = c.header.tensor_id;
    if (Status s = base_check.Through(t); !s.ok()) {
      version_failure(i);
      return s;
    }
    auto [off, len] = range_of(c.header);
    if (pool.Pending(t, off, len)) REFIT_RETURN_IF_ERROR(drain(true));
    const Hash128 h = digests.Range(b, t, off, len);
    switch (ClassifyRange(c.header, h)) {
      case RangeState::kAfter:
        ++result.chunks_skipped;
        break;
      case RangeState::kBefore: {
        ApplyPool::Job job;
        job.index = i;
        job.tensor = t;
        job.offset = off;
        job.length = len;
        job.early = !manifest;
        job.chunks.push_back(c);  // points into `object`'s buffer, which moves along
        job.objects.push_back(std::move(object));
        job.data = b.data[t];
        pool.Submit(std::move(job));
        REFIT_RETURN_IF_ERROR(drain(false));
        break;
      }
      case RangeState::kNeither:
        torn.push_back(i);
        digests.SetCovered(t, false);
        break;
    }
    seen.push_back(sha);
    ++i;
  }
  REFIT_RETURN_IF_ERROR(drain(true));
  REFIT_RETURN_IF_ERROR(repair(torn, /*after=*/true));
  CrashPoint("receiver.after-apply");
  if (Status s = base_check.All(); !s.ok()) {
    version_failure(kAllChunks);
    return s;
  }
  // Every tensor at the manifest's after hash. A covered tensor was at
  // the base as a whole and each of its chunks' ranges now hashes to that
  // chunk's "after"; the bytes outside the chunks are the base's, which
  // the manifest's chunk list (authenticated, and bound to the chunks by
  // their SHA-256) states are unchanged: the tensor is the manifest's
  // "after" without reading it again (docs/protocol.md, "Hashing"). A
  // covered tensor without chunks must then be unchanged by the manifest's
  // own account. Any other tensor is hashed from its bytes.
  std::vector<bool> has_chunks(a.tensors.size(), false);
  for (const ManifestChunk& mc : manifest->chunks) has_chunks[mc.tensor_id] = true;
  for (size_t t = 0; t < a.tensors.size(); ++t) {
    const bool ok = digests.covered(t)
                        ? has_chunks[t] || manifest->tensors[t].after == a.tensors[t].before
                        : TensorHash(b, t) == manifest->tensors[t].after;
    if (!ok) {
      version_failure(kAllChunks);
      return DataLossError("after applying version " + V + ", tensor '" +
                           a.tensors[t].name +
                           "' does not hash to the manifest; the local model "
                           "was not at the base; resync this receiver");
    }
  }
  REFIT_RETURN_IF_ERROR(b.Sync());
  CrashPoint("receiver.after-flush");
  REFIT_RETURN_IF_ERROR(journal.Sync());
  CrashPoint("receiver.after-journal");

  if (vote) {
    REFIT_RETURN_IF_ERROR(store_->Put(VoteKey(a.version, opt_.member),
                                      opt_.auth.SealMember(EncodeVote(Vote{true, ""}))));
    result.tail_seconds = std::chrono::duration<double>(Clock::now() - *manifest_seen).count();
    REFIT_RETURN_IF_ERROR(journal.Voted());
    REFIT_RETURN_IF_ERROR(journal.Sync());
    CrashPoint("receiver.after-vote");
    auto start = Clock::now();
    while (!decision) {
      if (ElapsedMs(start) > opt_.decision_timeout_ms) {
        return DeadlineExceededError(
            "voted ready for version " + V + " but no decision arrived within " +
            std::to_string(opt_.decision_timeout_ms) +
            " ms; the work is journaled and resumes on the next step");
      }
      REFIT_RETURN_IF_ERROR(Pause("the decision on version " + V));
      REFIT_ASSIGN_OR_RETURN(decision, ReadDecision(a.version));
    }
  } else if (!decision) {
    return FailedPreconditionError("version " + V + " has no decision and names no vote from '" +
                                   opt_.member + "'");
  }
  if (!decision->commit) {
    REFIT_RETURN_IF_ERROR(roll_back());
  } else {
    REFIT_RETURN_IF_ERROR(Activate(a.version));
    if (!vote) {
      result.tail_seconds =
          std::chrono::duration<double>(Clock::now() - *manifest_seen).count();
    }
    result.outcome = vote ? StepResult::Outcome::kCommitted : StepResult::Outcome::kCaughtUp;
    std::vector<bool> touched(a.tensors.size(), false);
    for (const ManifestChunk& c : manifest->chunks) {
      if (c.changed > 0 && c.tensor_id < touched.size()) touched[c.tensor_id] = true;
    }
    for (size_t t = 0; t < touched.size(); ++t) {
      if (touched[t]) result.changed_tensors.push_back(a.tensors[t].name);
    }
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

// Catch-up by folding (docs/protocol.md, "Catch-up by folding").
//
// Committed versions never abort: whatever state a crash leaves a range
// in, the way out is forward to Vk. Each range (a cell) only ever holds
// one of its chunks' "before"/"after" states, or a torn mix inside the
// chunk being applied; its range hash tells which, so a resumed fold
// re-applies exactly the chunks not in place, and a torn cell is repaired
// with overwrite re-sends. The one way back is a chunk that fails its
// checks: the fold is then rolled back to the active version from the
// pre-images it journals.
Result<std::optional<StepResult>> Receiver::Fold(const std::vector<Announcement>& chain,
                                                 const std::vector<Sha256>& shas,
                                                 bool resume) {
  auto t0 = Clock::now();
  const size_t k = chain.size();
  const Announcement& first = chain.front();
  const Announcement& last = chain.back();
  const size_t tensors = first.tensors.size();
  StepResult result;
  result.version = last.version;
  const std::string what = "the fold of versions " + std::to_string(first.version) + ".." +
                           std::to_string(last.version) + " onto version " +
                           std::to_string(first.base_version);
  auto vname = [&](size_t j) { return "version " + std::to_string(chain[j].version); };
  if (first.base_version != active_) {
    return DataLossError(what + " does not start at the active version " +
                         std::to_string(active_));
  }

  // Every version's manifest, checked against its announcement.
  std::vector<Manifest> manifests;
  for (size_t j = 0; j < k; ++j) {
    const Announcement& a = chain[j];
    Sha256 sha;
    REFIT_ASSIGN_OR_RETURN(Manifest m, ReadManifest(a.version, &sha));
    bool same = m.base_version == a.base_version && m.members == a.members &&
                m.tensors.size() == a.tensors.size();
    for (size_t t = 0; same && t < m.tensors.size(); ++t) {
      const TensorEntry& x = m.tensors[t];
      const TensorEntry& y = a.tensors[t];
      same = x.name == y.name && x.dtype == y.dtype && x.width == y.width &&
             x.shape == y.shape && x.before == y.before;
    }
    for (size_t i = 0; same && i < m.chunks.size(); ++i) {
      const ManifestChunk& mc = m.chunks[i];
      same = mc.tensor_id < tensors && mc.count > 0 &&
             mc.start <= a.tensors[mc.tensor_id].num_elements &&
             mc.count <= a.tensors[mc.tensor_id].num_elements - mc.start;
    }
    if (!same) {
      return DataLossError("the manifest of " + vname(j) + " does not match its announcement");
    }
    manifests.push_back(std::move(m));
  }

  // Foldable: one tensor table throughout, each version starting where
  // the previous one ended, and chunk ranges that are equal or disjoint
  // across versions (one chunk grid).
  bool foldable = true;
  for (size_t j = 1; foldable && j < k; ++j) {
    const Announcement& a = chain[j];
    foldable = a.base_version == chain[j - 1].version && a.tensors.size() == tensors;
    for (size_t t = 0; foldable && t < tensors; ++t) {
      const TensorEntry& x = a.tensors[t];
      const TensorEntry& y = first.tensors[t];
      foldable = x.name == y.name && x.dtype == y.dtype && x.width == y.width &&
                 x.shape == y.shape && x.before == manifests[j - 1].tensors[t].after;
    }
  }
  // Cells: the chunks of all versions grouped by range, in version order.
  struct Ref {
    size_t j;    // position in the chain
    uint64_t i;  // chunk index in that version
  };
  struct Cell {
    size_t tensor;
    uint64_t start, count;
    std::vector<Ref> chunks;
  };
  std::vector<Cell> cells;
  if (foldable) {
    std::map<std::pair<uint64_t, uint64_t>, Cell> by_range;  // (tensor, start)
    for (size_t j = 0; foldable && j < k; ++j) {
      for (uint64_t i = 0; i < manifests[j].chunks.size(); ++i) {
        const ManifestChunk& mc = manifests[j].chunks[i];
        auto [it, fresh] = by_range.try_emplace(
            {mc.tensor_id, mc.start}, Cell{static_cast<size_t>(mc.tensor_id), mc.start, mc.count, {}});
        if (!fresh && it->second.count != mc.count) {
          foldable = false;
          break;
        }
        if (!fresh && it->second.chunks.back().j == j) {
          return DataLossError("the manifest of " + vname(j) + " lists one range twice");
        }
        it->second.chunks.push_back({j, i});
      }
    }
    for (auto& [key, cell] : by_range) {
      if (!cells.empty() && cells.back().tensor == cell.tensor &&
          cells.back().start + cells.back().count > cell.start) {
        foldable = false;  // the chunk size changed between versions
      }
      cells.push_back(std::move(cell));
    }
  }
  if (!foldable) {
    if (resume) {
      return DataLossError(what + " was journaled but its versions no longer fold");
    }
    return std::optional<StepResult>();
  }

  // Fetches chunk i of chain[j] and checks it against its manifest entry,
  // its announcement and its version.
  auto fetch = [&](size_t j, uint64_t i, std::vector<uint8_t>* object) -> Result<ParsedChunk> {
    const Announcement& a = chain[j];
    const ManifestChunk& mc = manifests[j].chunks[i];
    const std::string name = "chunk " + std::to_string(i) + " of " + vname(j);
    REFIT_ASSIGN_OR_RETURN(*object, store_->Get(ChunkKey(a.version, i)));
    result.bytes_fetched += object->size();
    if (object->size() != mc.size || ComputeSha256(*object) != mc.sha256) {
      return DataLossError(name + " does not match its manifest hash");
    }
    REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*object));
    REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(body));
    const ChunkHeader& h = c.header;
    if (h.IsStrided()) {
      return DataLossError(name + " is a strided region, which versions do not carry");
    }
    if (h.tensor_id != mc.tensor_id || h.start != mc.start || h.count != mc.count ||
        h.kind != static_cast<codec::ChunkKind>(mc.kind) ||
        h.width != a.tensors[h.tensor_id].width) {
      return DataLossError(name + " does not match its manifest entry");
    }
    if (h.version != a.version || h.base_version != a.base_version) {
      return DataLossError(name + " belongs to another version");
    }
    return c;
  };
  // A stored chunk that fails its checks is replaced by this member's
  // overwrite re-send of it at its version, when the store holds one that
  // names the chunk's range (*resent is then set): the re-send carries the
  // chunk's range hashes, and applying it checks its "after" as for any
  // chunk. Otherwise the chunk's own failure stands.
  auto fetch_or_resend = [&](size_t j, uint64_t i, std::vector<uint8_t>* object,
                             bool* resent) -> Result<ParsedChunk> {
    *resent = false;
    auto c = fetch(j, i, object);
    if (c.ok() || !FailsItsChecks(c.status())) return c;
    auto got = store_->Get(ResendKey(chain[j].version, opt_.member, i, /*after=*/true));
    if (!got.ok()) return c.status();
    result.bytes_fetched += got->size();
    std::vector<uint8_t> bytes = std::move(*got);
    auto body = opt_.auth.Open(bytes);
    if (!body.ok()) return c.status();
    auto parsed = ParseChunk(*body);
    if (!parsed.ok()) return c.status();
    const ChunkHeader& h = parsed->header;
    const ManifestChunk& mc = manifests[j].chunks[i];
    if (h.IsStrided() || h.tensor_id != mc.tensor_id || h.start != mc.start ||
        h.count != mc.count || h.width != chain[j].tensors[mc.tensor_id].width ||
        h.version != chain[j].version || h.base_version != chain[j].base_version ||
        (h.kind != codec::ChunkKind::kSparseOverwrite && h.kind != codec::ChunkKind::kRaw)) {
      return c.status();
    }
    *object = std::move(bytes);  // the buffer `parsed` points into moves along
    *resent = true;
    return parsed;
  };
  auto request_resend = [&](size_t j, uint64_t i) -> Status {
    ResendRequest q;
    q.chunks.push_back(i);
    q.after.push_back(true);
    return store_->Put(RequestKey(chain[j].version, opt_.member),
                       opt_.auth.SealMember(EncodeRequest(q)));
  };

  // A chunk that failed its checks in an earlier step is checked again
  // before anything is written: while it fails, the step fails at once.
  if (!resume && bad_fold_chunk_) {
    const auto [bad_version, bad_index] = *bad_fold_chunk_;
    for (size_t j = 0; j < k; ++j) {
      if (chain[j].version != bad_version || bad_index >= manifests[j].chunks.size()) continue;
      std::vector<uint8_t> object;
      bool resent = false;
      auto c = fetch_or_resend(j, bad_index, &object, &resent);
      if (!c.ok() && FailsItsChecks(c.status())) {
        const Status asked = request_resend(j, bad_index);
        return DataLossError(std::string(c.status().message()) + "; nothing of " + what +
                             " was written" +
                             (asked.ok() ? "; a re-send of the chunk was requested"
                                         : "; requesting a re-send of the chunk failed (" +
                                               asked.ToString() + ")"));
      }
      REFIT_RETURN_IF_ERROR(c.status());
    }
    bad_fold_chunk_.reset();
  }

  const std::string journal_path = StatePath(opt_, "journal");
  Journal journal;
  if (!resume) {
    std::vector<uint64_t> versions;
    for (const Announcement& a : chain) versions.push_back(a.version);
    REFIT_ASSIGN_OR_RETURN(journal,
                           Journal::BeginFold(journal_path, first.base_version, versions, shas));
    CrashPoint("receiver.after-begin");
  } else {
    REFIT_ASSIGN_OR_RETURN(journal, Journal::Reopen(journal_path));
  }
  result.versions_folded = k;
  REFIT_ASSIGN_OR_RETURN(Bound b, BindTensors(opt_, first.tensors, last.version));
  Digests digests(tensors);
  Flusher flusher(b);

  // The one check of the base A, as for a single version (cells come in
  // tensor order).
  BaseCheck base_check(b, &digests, first.tensors, resume, first.base_version, what);

  const int threads = opt_.threads > 0 ? opt_.threads
                                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ApplyPool pool(threads);
  Status apply_error;
  std::optional<Ref> failed_apply;  // the chunk whose apply failed first
  // Journals each applied chunk with its pre-images (a job is a cell's
  // chunks from the first one not in place on), and counts it.
  auto drain = [&](bool all) -> Status {
    for (ApplyPool::Done& d : pool.Drain(all)) {
      const Cell& cell = cells[d.job.index];
      const size_t from = cell.chunks.size() - d.job.chunks.size();
      for (size_t q = 0; q < d.applied; ++q) {
        const Ref& r = cell.chunks[from + q];
        REFIT_RETURN_IF_ERROR(journal.FoldApplied(r.j, r.i, d.undo[q]));
        if (d.job.resent[q]) {
          ++result.chunks_resent;
        } else {
          ++chunks_applied_total_;
          ++result.chunks_applied;
        }
        result.changed_elements += d.job.chunks[q].header.changed;
      }
      if (d.applied > 0) {
        digests.Written(d.job.tensor, d.job.offset, d.job.length);
        flusher.Add(d.job.tensor, d.job.offset, d.job.length);
      }
      if (!d.status.ok()) {
        // The range holds the last applied chunk's "after" (or is as it
        // was).
        if (apply_error.ok()) {
          apply_error = d.status;
          failed_apply = cell.chunks[from + d.applied];
        }
        continue;
      }
      CrashPoint("receiver.after-fold-cell");
    }
    return apply_error;
  };
  const OnExit drain_on_exit([&] { (void)drain(true); });

  // Brings every range this fold wrote back to A: the chunks the journal
  // records applied are undone newest first (XOR chunks by applying them
  // again, overwrite chunks from their pre-images), each only when its
  // range holds the chunk's "after" (at its "before" it is not in place);
  // then every tensor must hash to A, and the journal is removed. A range
  // in neither state (torn by a crash, or whose chunk was applied but not
  // journaled when the process died) cannot be brought back: DATA_LOSS,
  // the journal kept (the next step resumes the fold).
  auto roll_back = [&]() -> Status {
    REFIT_ASSIGN_OR_RETURN(auto state, Journal::Load(journal_path));
    if (!state) return DataLossError("the journal of " + what + " is gone");
    ApplyScratch scratch;
    for (auto it = state->fold_applied.rbegin(); it != state->fold_applied.rend(); ++it) {
      if (it->position >= k || it->chunk >= manifests[it->position].chunks.size()) {
        return DataLossError("the journal of " + what + " names a chunk outside it");
      }
      std::vector<uint8_t> object;
      bool resent = false;
      REFIT_ASSIGN_OR_RETURN(ParsedChunk c,
                             fetch_or_resend(it->position, it->chunk, &object, &resent));
      const ChunkHeader& h = c.header;
      const size_t t = h.tensor_id;
      const uint64_t off = h.start * h.width, len = h.count * h.width;
      const Hash128 now = RangeOf(b, t, off, len);
      if (now == h.before) continue;
      const std::string name = "chunk " + std::to_string(it->chunk) + " of " +
                               vname(it->position) + " (tensor '" + first.tensors[t].name + "')";
      if (now != h.after) {
        return DataLossError("the range of " + name + " holds neither side of it");
      }
      REFIT_RETURN_IF_ERROR(UndoChunkInPlace(c, b.data[t], &scratch, it->undo));
      flusher.Add(t, off, len);
      if (RangeOf(b, t, off, len) != h.before) {
        return DataLossError("undoing " + name + " did not restore its range");
      }
    }
    for (size_t t = 0; t < tensors; ++t) {
      if (TensorHash(b, t) != first.tensors[t].before) {
        return DataLossError("tensor '" + first.tensors[t].name + "' is not at version " +
                             std::to_string(first.base_version));
      }
    }
    REFIT_RETURN_IF_ERROR(b.Sync());
    return Journal::Remove(journal_path);
  };
  // A chunk that fails its checks (`why`) stops the fold (docs/protocol.md,
  // "Catch-up by folding", 6): what it wrote is rolled back to A, a re-send
  // of the chunk is requested, and the step fails with DATA_LOSS, after
  // which a checkpoint receiver resyncs from a snapshot when the store
  // holds one (OrSnapshot).
  auto refuse = [&](const Ref& r, const Status& why) -> Status {
    bad_fold_chunk_.emplace(chain[r.j].version, r.i);
    (void)drain(true);
    const Status back = roll_back();
    const Status asked = request_resend(r.j, r.i);
    std::string message(why.message());
    if (back.ok()) {
      message += "; " + what + " was rolled back to version " + std::to_string(first.base_version);
    } else {
      message += "; rolling back " + what + " failed (" + back.ToString() +
                 "); the journal keeps the fold and the next step resumes it";
    }
    message += asked.ok() ? "; a re-send of the chunk was requested"
                          : "; requesting a re-send of the chunk failed (" + asked.ToString() + ")";
    return DataLossError(message);
  };
  // drain(), where an apply that failed its checks refuses its chunk.
  auto drain_or_refuse = [&](bool all) -> Status {
    Status s = drain(all);
    if (!s.ok() && failed_apply && FailsItsChecks(s)) return refuse(*failed_apply, s);
    return s;
  };
  CrashPoint("receiver.before-apply");

  struct Torn {
    size_t cell;
    Hash128 after;  // the cell's last chunk's "after": the range at Vk
  };
  std::vector<Torn> torn;
  for (size_t n = 0; n < cells.size(); ++n) {
    const Cell& cell = cells[n];
    const size_t t = cell.tensor;
    const uint64_t w = first.tensors[t].width;
    const uint64_t off = cell.start * w, len = cell.count * w;
    // The cell's chunks, fetched now (one cell's worth of payload in
    // memory per job in flight), each starting where the previous ended.
    ApplyPool::Job job;
    job.index = n;
    job.tensor = t;
    job.offset = off;
    job.length = len;
    job.data = b.data[t];
    for (const Ref& r : cell.chunks) {
      std::vector<uint8_t> object;
      bool resent = false;
      auto c = fetch_or_resend(r.j, r.i, &object, &resent);
      if (!c.ok()) return FailsItsChecks(c.status()) ? refuse(r, c.status()) : c.status();
      if (!job.chunks.empty() && job.chunks.back().header.after != c->header.before) {
        return refuse(r, DataLossError(
            "chunk " + std::to_string(r.i) + " of " + vname(r.j) +
            " does not start where the previous version's chunk of its range "
            "ends (tensor '" + first.tensors[t].name + "', elements " +
            std::to_string(cell.start) + ".." + std::to_string(cell.start + cell.count) + ")"));
      }
      job.chunks.push_back(*c);  // points into `object`'s buffer, which moves along
      job.objects.push_back(std::move(object));
      job.resent.push_back(resent);
    }
    REFIT_RETURN_IF_ERROR(base_check.Through(t));
    const Hash128 h = digests.Range(b, t, off, len);
    const size_t m = job.chunks.size();
    if (h == job.chunks.back().header.after) {
      result.chunks_skipped += m;
      continue;
    }
    // The latest chunk whose "before" the range holds (equal states are
    // equal bytes, so the latest is the shortest way to Vk).
    size_t from = m;
    for (size_t q = m; q-- > 0;) {
      if (h == job.chunks[q].header.before) {
        from = q;
        break;
      }
    }
    if (from == m) {
      torn.push_back({n, job.chunks.back().header.after});
      digests.SetCovered(t, false);
      continue;
    }
    result.chunks_skipped += from;
    const auto skip = static_cast<std::ptrdiff_t>(from);
    job.chunks.erase(job.chunks.begin(), job.chunks.begin() + skip);
    job.objects.erase(job.objects.begin(), job.objects.begin() + skip);
    job.resent.erase(job.resent.begin(), job.resent.begin() + skip);
    pool.Submit(std::move(job));
    REFIT_RETURN_IF_ERROR(drain_or_refuse(false));
  }
  REFIT_RETURN_IF_ERROR(drain_or_refuse(true));

  // Torn cells: a crash inside one of the cell's chunks. Every chunk of
  // the cell is asked for again as an overwrite re-send at its version
  // (one request per version); together they name every element any of
  // them changed, and the cell is rebuilt in scratch from its bytes (the
  // rest of the range is the base's, which no version changed) with the
  // re-sent values applied in version order. It is written back only when
  // it hashes to the last chunk's "after". A publisher answers a re-send
  // from its committed baseline, so this holds when that baseline has the
  // range as at Vk: always while Vk is the head.
  if (!torn.empty()) {
    std::map<size_t, ResendRequest> requests;  // by chain position
    for (const Torn& x : torn) {
      for (const Ref& r : cells[x.cell].chunks) {
        requests[r.j].chunks.push_back(r.i);
        requests[r.j].after.push_back(true);
      }
    }
    for (const auto& [j, q] : requests) {
      REFIT_RETURN_IF_ERROR(store_->Put(RequestKey(chain[j].version, opt_.member),
                                        opt_.auth.SealMember(EncodeRequest(q))));
    }
    auto start = Clock::now();
    std::vector<uint32_t> positions;
    std::vector<uint8_t> values;
    for (const Torn& x : torn) {
      const Cell& cell = cells[x.cell];
      const size_t t = cell.tensor;
      const int w = first.tensors[t].width;
      const uint64_t off = cell.start * static_cast<uint64_t>(w);
      const uint64_t len = cell.count * static_cast<uint64_t>(w);
      const uint32_t n = static_cast<uint32_t>(cell.count);
      std::vector<uint8_t> range(b.data[t] + off, b.data[t] + off + len);
      for (const Ref& r : cell.chunks) {
        const std::string name = "the re-send of chunk " + std::to_string(r.i) + " of " + vname(r.j);
        std::vector<uint8_t> object;
        for (;;) {
          auto got = store_->Get(ResendKey(chain[r.j].version, opt_.member, r.i, true));
          if (got.ok()) {
            object = std::move(*got);
            break;
          }
          if (got.status().code() != StatusCode::kNotFound) return got.status();
          if (ElapsedMs(start) > opt_.resend_timeout_ms) {
            return DeadlineExceededError(
                "no " + name + " within " + std::to_string(opt_.resend_timeout_ms) +
                " ms (" + what + " found its range torn); a publisher must serve re-sends "
                "of that version; the work is journaled and resumes on the next step");
          }
          REFIT_RETURN_IF_ERROR(Pause(name));
        }
        result.bytes_fetched += object.size();
        REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(object));
        REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(body));
        const ChunkHeader& h = c.header;
        if (h.IsStrided() || h.tensor_id != t || h.start != cell.start ||
            h.count != cell.count || h.width != w || h.version != chain[r.j].version) {
          return DataLossError(name + " does not name its range");
        }
        if (h.kind == codec::ChunkKind::kRaw) {
          REFIT_RETURN_IF_ERROR(codec::DecodeDense(c.payload, n, w, range.data()));
        } else if (h.kind == codec::ChunkKind::kSparseOverwrite && h.changed <= n) {
          const uint32_t changed = static_cast<uint32_t>(h.changed);
          positions.resize(changed);
          values.resize(static_cast<size_t>(changed) * static_cast<size_t>(w));
          REFIT_RETURN_IF_ERROR(codec::DecodeSparse(c.payload, h.kind, n, w, changed,
                                                    positions.data(), values.data()));
          const size_t ws = static_cast<size_t>(w);
          for (size_t q = 0; q < changed; ++q) {
            std::memcpy(range.data() + positions[q] * ws, values.data() + q * ws, ws);
          }
        } else {
          return DataLossError(name + " is not an overwrite");
        }
        ++result.chunks_resent;
      }
      if (RangeHash(range.data(), len) != x.after) {
        return DataLossError(
            "the re-sends of tensor '" + first.tensors[t].name + "' elements " +
            std::to_string(cell.start) + ".." + std::to_string(cell.start + cell.count) +
            " do not bring it to " + vname(cell.chunks.back().j) +
            "; the serving publisher's baseline no longer holds that range as at version " +
            std::to_string(last.version) + "; resync this receiver from a snapshot");
      }
      std::memcpy(b.data[t] + off, range.data(), len);
      digests.Written(t, off, len);
      flusher.Add(t, off, len);
    }
  }
  CrashPoint("receiver.after-apply");
  REFIT_RETURN_IF_ERROR(base_check.All());

  // Every tensor at Vk's manifest "after" hash. A covered tensor was at
  // the base A as a whole and every cell of it now hashes to its last
  // chunk's "after", the range at Vk; its bytes outside all cells are A's,
  // and no version of the chain changed them (each manifest's chunk list
  // covers every range its version changed). Other tensors are hashed.
  const Manifest& mk = manifests.back();
  std::vector<bool> has_chunks(tensors, false), touched(tensors, false);
  for (const Manifest& m : manifests) {
    for (const ManifestChunk& mc : m.chunks) {
      has_chunks[mc.tensor_id] = true;
      if (mc.changed > 0) touched[mc.tensor_id] = true;
    }
  }
  for (size_t t = 0; t < tensors; ++t) {
    const bool ok = digests.covered(t)
                        ? has_chunks[t] || mk.tensors[t].after == first.tensors[t].before
                        : TensorHash(b, t) == mk.tensors[t].after;
    if (!ok) {
      return DataLossError("after " + what + ", tensor '" + first.tensors[t].name +
                           "' does not hash to the manifest of version " +
                           std::to_string(last.version) +
                           "; the local model was not at the base; resync this receiver");
    }
  }
  REFIT_RETURN_IF_ERROR(b.Sync());
  CrashPoint("receiver.after-flush");
  REFIT_RETURN_IF_ERROR(Activate(last.version));
  result.outcome = StepResult::Outcome::kCaughtUp;
  for (size_t t = 0; t < tensors; ++t) {
    if (touched[t]) result.changed_tensors.push_back(first.tensors[t].name);
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  result.tail_seconds = result.seconds;
  return std::optional<StepResult>(std::move(result));
}

}  // namespace refit
