#include "sync/version_apply.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "base/hash.h"
#include "delta/chunk.h"
#include "sync/chunk_check.h"
#include "sync/crash_point.h"

namespace refit::internal {
namespace {

using Clock = std::chrono::steady_clock;

// In how many consecutive steps the store must return the same bytes for a
// chunk that fails its checks before the failure is the version's (the
// receiver votes failed): a damaged read differs from read to read, a
// damaged object does not.
constexpr int kPersistentBadReads = 4;

// Chunks of a version that may have been written: all of them.
constexpr uint64_t kAllChunks = UINT64_MAX;

int ElapsedMs(Clock::time_point since) {
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

double SecondsSince(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Adds the time its scope takes to *total (StepResult::stages).
class Timed {
 public:
  explicit Timed(double* total) : total_(total), t0_(Clock::now()) {}
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;
  ~Timed() { *total_ += SecondsSince(t0_); }

 private:
  double* total_;
  Clock::time_point t0_;
};

}  // namespace

VersionApply::VersionApply(Receiver* receiver, const Announcement& a,
                           const Sha256& announcement_sha, bool vote, bool resume,
                           std::string journal_path, Receiver::VersionFailure* failure)
    : r_(*receiver),
      opt_(receiver->opt_),
      a_(a),
      announcement_sha_(announcement_sha),
      vote_(vote),
      resume_(resume),
      journal_path_(std::move(journal_path)),
      failure_(failure),
      V_(std::to_string(a.version)) {
  reader_.emplace(r_.store_, a.version);
}

Result<StepResult> VersionApply::Run() {
  t0_ = Clock::now();
  result_.version = a_.version;
  result_.versions_folded = 1;
  kept_ = std::move(r_.kept_);
  if (!resume_) REFIT_RETURN_IF_ERROR(CheckAnnouncedBase());
  REFIT_RETURN_IF_ERROR(OpenJournalAndBind());
  REFIT_ASSIGN_OR_RETURN(decision_, r_.ReadDecision(a_.version));
  digests_.emplace(a_.tensors.size(), ApplyThreads(opt_.threads));
  result_.base_from_kept_digests = SeedDigests();
  if (opt_.early_writeback) flusher_.emplace(*b_);
  if (decision_ && !decision_->commit) return Aborted();
  if (state_->failed) return AfterFailedVote();

  base_check_.emplace(*b_, &*digests_, a_.tensors, resume_, a_.base_version, "version " + V_);
  pool_.emplace(ApplyThreads(opt_.threads));
  // Whatever way this step ends, chunks applied by the workers are counted
  // and journaled (with their pre-images) before it returns.
  const OnExit drain_on_exit([this] { (void)Drain(true); });
  CrashPoint("receiver.before-apply");
  REFIT_ASSIGN_OR_RETURN(auto aborted, StreamChunks());
  if (aborted) return std::move(*aborted);
  REFIT_RETURN_IF_ERROR(Drain(true));
  result_.stages.apply_wait = pool_->wait_seconds();
  REFIT_RETURN_IF_ERROR(Repair(torn_, /*after=*/true));
  CrashPoint("receiver.after-apply");
  REFIT_RETURN_IF_ERROR(CheckTensors());
  {
    Timed timed(&result_.stages.flush);
    REFIT_RETURN_IF_ERROR(b_->Sync());
    CrashPoint("receiver.after-flush");
    REFIT_RETURN_IF_ERROR(journal_.Sync());
    if (opt_.full_base_check_every != 1) flushed_ = StampFiles(*b_);
  }
  CrashPoint("receiver.after-journal");
  return VoteAndDecide();
}

Status VersionApply::CheckAnnouncedBase() {
  // A version diffed from another baseline cannot apply, and nothing of it
  // is journaled or written.
  REFIT_ASSIGN_OR_RETURN(auto held, r_.ActiveTensors());
  if (!held) return Status();
  std::unordered_map<std::string_view, const TensorEntry*> by_name;
  by_name.reserve(held->size());
  for (const TensorEntry& h : *held) by_name.emplace(h.name, &h);
  for (size_t t = 0; t < a_.tensors.size(); ++t) {
    const TensorEntry& e = a_.tensors[t];
    auto it = by_name.find(e.name);
    if (it != by_name.end() && it->second->after != e.before) {
      const std::string base = std::to_string(a_.base_version);
      failure_->set = true;
      failure_->bound = 0;
      return FailedPreconditionError(
          "version " + V_ + " is announced on base version " + base + " with tensor '" +
          e.name + "' not as version " + base + "'s manifest records it: its publisher's "
          "baseline is not version " + base + ", which this receiver holds; it cannot apply");
    }
  }
  return Status();
}

// Kept digests stand for a read of the model when they describe the
// version this one builds on, in this table, nothing wrote a checkpoint's
// files since they were flushed, and no full check is due
// (docs/protocol.md, "Hashing").
bool VersionApply::SeedDigests() {
  const int every = opt_.full_base_check_every;
  if (resume_ || !kept_ || every == 1 || kept_->version != a_.base_version ||
      kept_->names.size() != a_.tensors.size()) {
    return false;
  }
  if (every > 1 && kept_->reused + 1 >= every) return false;
  for (size_t t = 0; t < a_.tensors.size(); ++t) {
    if (kept_->names[t] != a_.tensors[t].name) return false;
  }
  if (kept_->files != StampFiles(*b_)) return false;
  for (size_t t = 0; t < a_.tensors.size(); ++t) {
    // A tensor whose digests were not all known is hashed from its bytes.
    if (!kept_->digests[t].empty())
      digests_->Seed(t, std::move(kept_->digests[t]));
  }
  return true;
}

void VersionApply::KeepDigests() {
  if (opt_.full_base_check_every == 1) return;
  auto kept = std::make_shared<KeptDigests>();
  kept->version = a_.version;
  kept->files = std::move(flushed_);
  kept->reused = result_.base_from_kept_digests ? kept_->reused + 1 : 0;
  for (size_t t = 0; t < a_.tensors.size(); ++t) {
    kept->names.push_back(a_.tensors[t].name);
    kept->digests.push_back(digests_->Current(t));
  }
  r_.kept_ = std::move(kept);
}

Status VersionApply::OpenJournalAndBind() {
  if (resume_) {
    REFIT_ASSIGN_OR_RETURN(state_, Journal::Load(journal_path_));
    REFIT_ASSIGN_OR_RETURN(journal_, Journal::Reopen(journal_path_));
  } else {
    REFIT_ASSIGN_OR_RETURN(journal_, Journal::Begin(journal_path_, a_.version, a_.base_version,
                                                    announcement_sha_));
    state_.emplace();
    CrashPoint("receiver.after-begin");
  }
  failure_->journaled = true;
  auto bound = BindTensors(opt_.checkpoint, opt_.tensors, a_.tensors, a_.version);
  if (!bound.ok()) {
    MarkFailure(0);
    return bound.status();
  }
  b_.emplace(std::move(*bound));
  return Status();
}

void VersionApply::MarkFailure(uint64_t bound) {
  if (state_->voted) return;
  failure_->set = true;
  failure_->bound = resume_ ? kAllChunks : bound;
}

Status VersionApply::ReadManifestIfStored() {
  Sha256 sha;
  auto got = r_.ReadManifest(a_.version, &sha);
  if (!got.ok()) {
    return got.status().code() == StatusCode::kNotFound ? Status() : got.status();
  }
  const Manifest& m = *got;
  if (!ManifestMatches(a_, m) || m.chunks.size() < seen_.size()) {
    return DataLossError("the manifest of version " + V_ + " does not match its announcement");
  }
  for (size_t i = 0; i < seen_.size(); ++i) {
    if (m.chunks[i].sha256 != seen_[i]) {
      return DataLossError("chunk " + std::to_string(i) + " of version " + V_ +
                           " that this receiver applied is not the one its manifest lists");
    }
  }
  manifest_ = std::move(*got);
  return Status();
}

Result<ParsedChunk> VersionApply::CheckFetched(uint64_t i, bool original) {
  result_.bytes_fetched += object_.size();
  return CheckChunk(object_,
                    ChunkSpec{&a_, i, manifest_ ? &*manifest_ : nullptr, /*resend=*/!original},
                    opt_.auth);
}

Result<ParsedChunk> VersionApply::FetchOriginal(uint64_t i) {
  REFIT_ASSIGN_OR_RETURN(object_, reader_->Get(i, manifest_ ? &*manifest_ : nullptr));
  return CheckFetched(i, /*original=*/true);
}

Result<ParsedChunk> VersionApply::Fetch(const std::string& key, uint64_t i, bool original) {
  REFIT_ASSIGN_OR_RETURN(object_, r_.store_->Get(key));
  return CheckFetched(i, original);
}

std::pair<uint64_t, uint64_t> VersionApply::ByteRange(const ChunkHeader& h) const {
  const uint64_t w = a_.tensors[h.tensor_id].width;
  return {h.start * w, (h.End() - h.start) * w};
}

std::string VersionApply::KeyOf(uint64_t i) const {
  return manifest_ && i < manifest_->chunks.size() ? ManifestChunkKey(*manifest_, i)
                                                   : ChunkKey(a_.version, i);
}

std::string VersionApply::BadReadKey(uint64_t i) const {
  // The chunks of a pack share its key: a good chunk read from it says
  // nothing of another that fails.
  return KeyOf(i) + "#" + std::to_string(i);
}

Status VersionApply::Repair(const std::vector<uint64_t>& torn, bool after) {
  if (torn.empty()) return Status();
  ResendRequest q;
  for (uint64_t i : torn) {
    q.chunks.push_back(i);
    q.after.push_back(after);
  }
  REFIT_RETURN_IF_ERROR(r_.store_->Put(RequestKey(a_.version, opt_.member),
                                       opt_.auth.SealMember(EncodeRequest(q))));
  auto start = Clock::now();
  for (uint64_t i : torn) {
    for (;;) {
      const uint64_t since = r_.store_->ChangeCount();
      auto c = Fetch(ResendKey(a_.version, opt_.member, i, after), i, /*original=*/false);
      if (c.ok()) {
        UndoRecord undo;
        const size_t t = c->header.tensor_id;
        REFIT_RETURN_IF_ERROR(ApplyChunkInPlace(*c, b_->data[t], &scratch_, nullptr, &undo));
        auto [off, len] = ByteRange(c->header);
        digests_->Written(t, off, len);
        digests_->SetCovered(t, false);  // checked from its bytes at the end
        if (flusher_) flusher_->Add(t, off, len);
        ++result_.chunks_resent;
        break;
      }
      if (c.status().code() != StatusCode::kNotFound) return c.status();
      if (ElapsedMs(start) > opt_.resend_timeout_ms) {
        return DeadlineExceededError("no re-send of chunk " + std::to_string(i) +
                                     " of version " + V_ + " within " +
                                     std::to_string(opt_.resend_timeout_ms) +
                                     " ms; is the publisher running?");
      }
      REFIT_RETURN_IF_ERROR(r_.Pause(
          "a re-send of chunk " + std::to_string(i) + " of version " + V_,
          since));
    }
  }
  return Status();
}

// Chunks are final once stored (the publisher writes them once), so the
// chunks in the store are the ones that were applied; without a manifest
// they are probed in order up to the first missing one (chunks are applied
// in order). After a failed vote, only chunks below the journaled bound
// were written, and only the tensors they belong to are checked at the
// end: the others were never touched in this version (their state is the
// receiver's, whatever the announcement says of it).
Status VersionApply::RollBack() {
  if (!manifest_) REFIT_RETURN_IF_ERROR(ReadManifestIfStored());
  const uint64_t bound = state_->failed ? state_->failed_bound : kAllChunks;
  std::vector<bool> probed(a_.tensors.size(), false);
  uint64_t last_journaled = 0;
  for (const auto& [i, undo] : state_->applied) last_journaled = std::max(last_journaled, i + 1);
  std::vector<uint64_t> torn;
  for (uint64_t i = 0; i < bound; ++i) {
    if (manifest_ && i >= manifest_->chunks.size()) break;
    auto c = FetchOriginal(i);
    if (!c.ok()) {
      const StatusCode code = c.status().code();
      if (!manifest_ && code == StatusCode::kNotFound && i >= last_journaled) break;
      // A chunk is applied only after it passed these checks, and a
      // stored chunk never changes: one that fails them now (changed in
      // the store) was not applied, unless journaled. The final check
      // of the tensors catches the one case left (applied, not yet
      // journaled, then changed in the store).
      if (FailsItsChecks(c.status()) && state_->applied.count(i) == 0) continue;
      return c.status();
    }
    const size_t t = c->header.tensor_id;
    probed[t] = true;
    const auto [off, len] = ByteRange(c->header);
    const Hash128 h =
        c->header.IsStrided() ? RegionHash(c->header, b_->data[t]) : b_->Range(t, off, len);
    if (h == c->header.before) continue;
    if (h == c->header.after) {
      auto it = state_->applied.find(i);
      // XOR records toggle back, except conditional ones: they decode only
      // against the base, so they are undone from the old bytes the
      // journal kept, or re-sent when the journal has none.
      if (c->header.IsXor() && !c->header.IsConditional()) {
        REFIT_RETURN_IF_ERROR(UndoChunkInPlace(*c, b_->data[t], &scratch_, {}));
      } else if (it != state_->applied.end()) {
        REFIT_RETURN_IF_ERROR(UndoChunkInPlace(*c, b_->data[t], &scratch_, it->second));
      } else {
        torn.push_back(i);
      }
      continue;
    }
    torn.push_back(i);
  }
  REFIT_RETURN_IF_ERROR(Repair(torn, /*after=*/false));
  for (size_t t = 0; t < a_.tensors.size(); ++t) {
    if ((bound == kAllChunks || probed[t]) && b_->Tensor(t) != a_.tensors[t].before) {
      return DataLossError("rollback of version " + V_ + " left tensor '" + a_.tensors[t].name +
                           "' off its base; resync this receiver from a snapshot");
    }
  }
  REFIT_RETURN_IF_ERROR(b_->Sync());
  result_.outcome = StepResult::Outcome::kAborted;
  return Journal::Remove(journal_path_);
}

Result<StepResult> VersionApply::Aborted() {
  REFIT_RETURN_IF_ERROR(RollBack());
  result_.seconds = SecondsSince(t0_);
  return result_;
}

Status VersionApply::WaitForDecision(const std::string& voted, const std::string& then) {
  return r_.AwaitDecision(a_.version, &decision_, voted, then);
}

Result<StepResult> VersionApply::AfterFailedVote() {
  REFIT_RETURN_IF_ERROR(WaitForDecision("failed on", "the next step waits again"));
  if (!decision_->commit) return Aborted();
  return DataLossError("version " + V_ + " was committed although this receiver voted "
                       "failed on it; resync this receiver from a snapshot");
}

Status VersionApply::Drain(bool all) {
  for (ApplyPool::Done& d : pool_->Drain(all)) {
    if (!d.status.ok()) {
      if (apply_error_.ok()) apply_error_ = d.status;
      continue;
    }
    const ApplyPool::Job& job = d.job;
    result_.stages.apply_cpu += d.seconds;
    if (d.state != RangeState::kBefore) {
      Classified(job.index, job.tensor, d.state);  // found by its worker: nothing applied
      continue;
    }
    ++r_.chunks_applied_total_;
    REFIT_RETURN_IF_ERROR(journal_.Applied(job.index, d.undo.front()));
    // The journal as a reload would read it: a rollback in this same step
    // restores overwrite and conditional chunks from these pre-images
    // rather than asking for re-sends.
    state_->applied[job.index] = std::move(d.undo.front());
    ++result_.chunks_applied;
    result_.changed_elements += job.chunks.front().header.changed;
    // ApplyChunkInPlace re-hashed the range to the chunk's "after": the
    // tensor stays covered, and the range's digests are those it hashed.
    digests_->Rewritten(*b_, job.tensor, job.offset, job.length,
                        std::move(d.after_digests));
    if (flusher_) flusher_->Add(job.tensor, job.offset, job.length);
    if (job.early) ++result_.chunks_before_manifest;
    CrashPoint("receiver.after-chunk");
    if (job.early) CrashPoint("receiver.after-early-chunk");
  }
  return apply_error_;
}

Result<std::optional<StepResult>> VersionApply::StreamChunks() {
  last_progress_ = Clock::now();
  int polls = 0;
  REFIT_RETURN_IF_ERROR(ReadManifestIfStored());  // present already when catching up
  const OnExit stop_prefetch([this] {
    prefetch_.reset();
    early_.reset();
  });
  for (uint64_t i = 0;;) {
    if (manifest_) {
      if (!manifest_seen_) manifest_seen_ = Clock::now();
      if (i >= manifest_->chunks.size()) break;
    }
    Clock::time_point fetching = Clock::now();
    // A direct version's part chunks are read and checked ahead, side by
    // side, once the manifest names their keys.
    if (manifest_ && manifest_->direct && !prefetch_) {
      if (const int threads = ApplyThreads(opt_.threads); threads > 1) {
        prefetch_.emplace(r_.store_, a_, *manifest_, opt_.auth, i, std::min(threads, 4),
                          early_ ? early_->Held(*manifest_) : std::vector<bool>());
      }
    }
    // Chunks read while the ranks were uploading (before the manifest).
    if (early_ && manifest_) {
      if (auto ahead = early_->Take(*manifest_, i)) {
        ++result_.chunks_read_early;
        object_ = std::move(ahead->object);  // the chunk points into its buffer
        REFIT_RETURN_IF_ERROR(TakeChunk(i, fetching, std::move(ahead->chunk)));
        ++i;
        continue;
      }
    }
    if (prefetch_) {
      if (auto ahead = prefetch_->Take(i)) {
        object_ = std::move(ahead->object);  // the chunk points into its buffer
        REFIT_RETURN_IF_ERROR(TakeChunk(i, fetching, std::move(ahead->chunk)));
        ++i;
        continue;
      }
    }
    const uint64_t since = r_.store_->ChangeCount();
    auto got = reader_->Get(i, manifest_ ? &*manifest_ : nullptr);
    // The version has chunks of its own: what the ranks' parts (an
    // assembling coordinator's, in this store) held is not its.
    if (got.ok() && i == 0) early_.reset();
    if (got.ok() || got.status().code() == StatusCode::kDataLoss) {
      // A malformed pack is checked as an empty object: it fails the
      // chunk's checks, and fails them alike in consecutive steps when it
      // is the stored object (TakeChunk).
      object_ = got.ok() ? std::move(*got) : std::vector<uint8_t>();
      REFIT_RETURN_IF_ERROR(TakeChunk(i, fetching));
      ++i;
      continue;
    }
    if (got.status().code() != StatusCode::kNotFound) return got.status();
    if (manifest_) {
      return DataLossError("the manifest of version " + V_ + " lists chunk " +
                           std::to_string(i) + " but the store does not hold it");
    }
    REFIT_RETURN_IF_ERROR(ReadManifestIfStored());
    if (!manifest_ && i == 0 && opt_.early_part_bytes > 0) {
      // No chunk at the version's own keys yet: a direct version's ranks
      // may be uploading theirs.
      if (!early_) {
        early_.emplace(r_.store_, a_, opt_.auth,
                       std::clamp(ApplyThreads(opt_.threads), 2, 4), opt_.early_part_bytes);
      }
      // Objects appearing are progress: the ranks are uploading.
      REFIT_ASSIGN_OR_RETURN(const size_t found, early_->Scan());
      if (found > 0) last_progress_ = Clock::now();
    }
    result_.stages.fetch += SecondsSince(fetching);
    if (manifest_) continue;
    // The publisher is still uploading (or stopped): an abort decision
    // ends the wait, and so does the deadline.
    REFIT_RETURN_IF_ERROR(Drain(false));
    if (++polls % 8 == 0) {
      REFIT_ASSIGN_OR_RETURN(decision_, r_.ReadDecision(a_.version));
      if (decision_ && !decision_->commit) {
        REFIT_RETURN_IF_ERROR(Drain(true));
        REFIT_ASSIGN_OR_RETURN(StepResult aborted, Aborted());
        return std::optional<StepResult>(std::move(aborted));
      }
    }
    if (ElapsedMs(last_progress_) > opt_.chunk_timeout_ms) {
      return DeadlineExceededError(
          "version " + V_ + ": neither chunk " + std::to_string(i) +
          " nor the manifest arrived within " + std::to_string(opt_.chunk_timeout_ms) +
          " ms; its publisher may have stopped (publishing a later version aborts it); "
          "the work is journaled and resumes on the next step");
    }
    Timed timed(&result_.stages.chunk_wait);
    REFIT_RETURN_IF_ERROR(
        r_.Pause("chunk " + std::to_string(i) + " of version " + V_, since));
  }
  return std::optional<StepResult>();
}

Status VersionApply::TakeChunk(uint64_t i, Clock::time_point fetched_from,
                               std::optional<ParsedChunk> checked) {
  Result<ParsedChunk> parsed = ParsedChunk{};
  if (checked) {
    result_.bytes_fetched += object_.size();
    parsed = std::move(*checked);
  } else {
    parsed = CheckFetched(i, /*original=*/true);
  }
  result_.stages.fetch += SecondsSince(fetched_from);
  Receiver::BadRead& bad_read = r_.bad_read_;
  if (!parsed.ok()) {
    // The same bytes in consecutive steps are the stored object: the
    // version cannot be applied here (a re-send would come from the same
    // publisher that stored it; the version is aborted instead).
    const std::string key = BadReadKey(i);
    const Sha256 bad = ComputeSha256(object_);
    if (bad_read.key == key && bad_read.sha == bad) {
      ++bad_read.reads;
    } else {
      bad_read = Receiver::BadRead{key, bad, 1};
    }
    if (bad_read.reads >= kPersistentBadReads) {
      MarkFailure(i);
    } else {
      r_.reread_pending_ = true;
    }
    return parsed.status();
  }
  if (bad_read.key == BadReadKey(i)) bad_read = Receiver::BadRead{};
  ParsedChunk c = std::move(*parsed);
  const Sha256 sha = manifest_ ? manifest_->chunks[i].sha256 : ComputeSha256(object_);
  last_progress_ = Clock::now();
  const size_t t = c.header.tensor_id;
  Clock::time_point checking = Clock::now();
  Status base = base_check_->Through(t);
  result_.stages.base_check += SecondsSince(checking);
  if (!base.ok()) {
    MarkFailure(i);
    return base;
  }
  auto [off, len] = ByteRange(c.header);
  const uint64_t w = a_.tensors[t].width;
  const bool strided = c.header.IsStrided();
  const uint64_t run = strided ? c.header.run * w : 0;
  const uint64_t stride = strided ? c.header.stride * w : 0;
  if (pool_->Pending(t, off, len, run, stride)) REFIT_RETURN_IF_ERROR(Drain(true));
  // A strided region's hash is read from its bytes: its worker reads them
  // (classify), not this thread. A range's composes from the digests.
  const RangeState state = strided ? RangeState::kBefore
                                   : ClassifyRange(c.header, digests_->Range(*b_, t, off, len));
  if (state == RangeState::kBefore) {
    ApplyPool::Job job;
    job.index = i;
    job.tensor = t;
    job.offset = off;
    job.length = len;
    job.run = run;
    job.stride = stride;
    job.classify = strided;
    job.early = !manifest_;
    job.chunks.push_back(c);  // points into `object_`'s buffer, which moves along
    job.objects.push_back(std::move(object_));
    job.resent.push_back(false);
    job.data = b_->data[t];
    pool_->Submit(std::move(job));
    REFIT_RETURN_IF_ERROR(Drain(false));
  } else {
    Classified(i, t, state);
  }
  seen_.push_back(sha);
  return Status();
}

void VersionApply::Classified(uint64_t i, size_t t, RangeState state) {
  if (state == RangeState::kAfter) {
    ++result_.chunks_skipped;
  } else if (state == RangeState::kNeither) {
    torn_.push_back(i);
    digests_->SetCovered(t, false);
  }
}

// A covered tensor was at the base as a whole and each of its chunks'
// ranges now hashes to that chunk's "after"; the bytes outside the chunks
// are the base's, which the manifest's chunk list (authenticated, and
// bound to the chunks by their SHA-256) states are unchanged: the tensor
// is the manifest's "after" without reading it again (docs/protocol.md,
// "Hashing"). A covered tensor without chunks must then be unchanged by
// the manifest's own account. Any other tensor is hashed from its bytes.
Status VersionApply::CheckTensors() {
  Clock::time_point checking = Clock::now();
  Status base = base_check_->All();
  result_.stages.base_check += SecondsSince(checking);
  if (!base.ok()) {
    MarkFailure(kAllChunks);
    return base;
  }
  Timed timed(&result_.stages.check);
  std::vector<bool> has_chunks(a_.tensors.size(), false);
  for (const ManifestChunk& mc : manifest_->chunks) has_chunks[mc.tensor_id] = true;
  for (size_t t = 0; t < a_.tensors.size(); ++t) {
    // A direct version's tensor with chunks has no "after" hash until its
    // commit records the one the members voted: an uncovered one is
    // hashed for the vote, where the coordinator compares it with every
    // other member's (docs/protocol.md, "Versions from many ranks").
    const bool unknown = manifest_->direct && has_chunks[t] &&
                         manifest_->tensors[t].after == Hash128{};
    const bool ok = digests_->covered(t)
                        ? has_chunks[t] || manifest_->tensors[t].after == a_.tensors[t].before
                        : unknown || b_->Tensor(t) == manifest_->tensors[t].after;
    if (!ok) {
      MarkFailure(kAllChunks);
      return DataLossError("after applying version " + V_ + ", tensor '" + a_.tensors[t].name +
                           "' does not hash to the manifest; the local model "
                           "was not at the base; resync this receiver");
    }
  }
  return Status();
}

Result<StepResult> VersionApply::VoteAndDecide() {
  if (vote_) {
    Clock::time_point voting = Clock::now();
    Vote ready{true, "", {}};
    if (manifest_->direct) {
      // Every tensor's hash after the version, which the coordinator
      // records on commit when all members agree: the segments strided
      // regions wrote are hashed again (in parallel), and the digests are
      // then whole for the next version's base check.
      digests_->Refresh(*b_);
      for (size_t t = 0; t < a_.tensors.size(); ++t) {
        ready.tensors.push_back(digests_->Range(*b_, t, 0, b_->bytes[t]));
      }
    }
    REFIT_RETURN_IF_ERROR(r_.store_->Put(VoteKey(a_.version, opt_.member),
                                         opt_.auth.SealMember(EncodeVote(ready))));
    result_.tail_seconds = SecondsSince(*manifest_seen_);
    REFIT_RETURN_IF_ERROR(journal_.Voted());
    REFIT_RETURN_IF_ERROR(journal_.Sync());
    result_.stages.vote = SecondsSince(voting);
    CrashPoint("receiver.after-vote");
    Timed timed(&result_.stages.decision_wait);
    REFIT_RETURN_IF_ERROR(
        WaitForDecision("ready for", "the work is journaled and resumes on the next step"));
  } else if (!decision_) {
    return FailedPreconditionError("version " + V_ + " has no decision and names no vote from '" +
                                   opt_.member + "'");
  }
  if (!decision_->commit) {
    REFIT_RETURN_IF_ERROR(RollBack());
  } else {
    Clock::time_point activating = Clock::now();
    REFIT_RETURN_IF_ERROR(r_.Activate(a_.version));
    KeepDigests();
    result_.stages.activate = SecondsSince(activating);
    if (!vote_) result_.tail_seconds = SecondsSince(*manifest_seen_);
    result_.outcome = vote_ ? StepResult::Outcome::kCommitted : StepResult::Outcome::kCaughtUp;
    std::vector<bool> touched(a_.tensors.size(), false);
    for (const ManifestChunk& c : manifest_->chunks) {
      if (c.changed > 0 && c.tensor_id < touched.size()) touched[c.tensor_id] = true;
    }
    for (size_t t = 0; t < touched.size(); ++t) {
      if (touched[t]) result_.changed_tensors.push_back(a_.tensors[t].name);
    }
  }
  result_.seconds = SecondsSince(t0_);
  return result_;
}

}  // namespace refit::internal
