#include "sync/fold_apply.h"

#include <cstring>
#include <map>
#include <utility>

#include "base/hash.h"
#include "codec/payload.h"
#include "delta/apply.h"
#include "delta/chunk.h"
#include "sync/chunk_check.h"
#include "sync/crash_point.h"

// Committed versions never abort: whatever state a crash leaves a range
// in, the way out is forward to Vk. Each range (a cell) only ever holds
// one of its chunks' "before"/"after" states, or a torn mix inside the
// chunk being applied; its range hash tells which, so a resumed fold
// re-applies exactly the chunks not in place, and a torn cell is repaired
// with overwrite re-sends. The one way back is a chunk that fails its
// checks: the fold is then rolled back to the active version from the
// pre-images it journals.
namespace refit::internal {
namespace {

using Clock = std::chrono::steady_clock;

int ElapsedMs(Clock::time_point since) {
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

}  // namespace

FoldApply::FoldApply(Receiver* receiver, const std::vector<Announcement>& chain,
                     const std::vector<Sha256>& shas, bool resume, std::string journal_path)
    : r_(*receiver),
      opt_(receiver->opt_),
      chain_(chain),
      shas_(shas),
      resume_(resume),
      journal_path_(std::move(journal_path)),
      first_(chain.front()),
      last_(chain.back()),
      tensors_(chain.front().tensors.size()),
      what_("the fold of versions " + std::to_string(first_.version) + ".." +
            std::to_string(last_.version) + " onto version " +
            std::to_string(first_.base_version)) {}

std::string FoldApply::VersionName(size_t j) const {
  return "version " + std::to_string(chain_[j].version);
}

Result<std::optional<StepResult>> FoldApply::Run() {
  t0_ = Clock::now();
  result_.version = last_.version;
  if (first_.base_version != r_.active_) {
    return DataLossError(what_ + " does not start at the active version " +
                         std::to_string(r_.active_));
  }
  REFIT_ASSIGN_OR_RETURN(bool folds, ReadAndPlan());
  if (!folds) {
    if (resume_) return DataLossError(what_ + " was journaled but its versions no longer fold");
    return std::optional<StepResult>();
  }
  if (!resume_) REFIT_RETURN_IF_ERROR(RecheckBadChunk());
  REFIT_RETURN_IF_ERROR(OpenJournalAndBind());
  pool_.emplace(ApplyThreads(opt_.threads));
  const OnExit drain_on_exit([this] { (void)Drain(true); });
  CrashPoint("receiver.before-apply");
  REFIT_RETURN_IF_ERROR(ApplyCells());
  REFIT_RETURN_IF_ERROR(RepairTorn());
  CrashPoint("receiver.after-apply");
  REFIT_RETURN_IF_ERROR(base_check_->All());
  REFIT_ASSIGN_OR_RETURN(StepResult done, CheckAndActivate());
  return std::optional<StepResult>(std::move(done));
}

Result<bool> FoldApply::ReadAndPlan() {
  for (const Announcement& a : chain_) {
    Sha256 sha;
    // A direct version's manifest comes with the tensor hashes its commit
    // records (Receiver::ReadManifest): they are its "after" hashes.
    REFIT_ASSIGN_OR_RETURN(Manifest m, r_.ReadManifest(a.version, &sha));
    REFIT_RETURN_IF_ERROR(CheckFoldManifest(a, m));
    manifests_.push_back(std::move(m));
  }
  REFIT_ASSIGN_OR_RETURN(auto plan, PlanFold(chain_, manifests_));
  if (!plan) return false;
  cells_ = std::move(*plan);
  for (const Announcement& a : chain_) readers_.emplace_back(r_.store_, a.version);
  return true;
}

Result<ParsedChunk> FoldApply::Fetch(size_t j, uint64_t i, std::vector<uint8_t>* object) {
  REFIT_ASSIGN_OR_RETURN(*object, readers_[j].Get(i, &manifests_[j]));
  result_.bytes_fetched += object->size();
  return CheckChunk(*object, ChunkSpec{&chain_[j], i, &manifests_[j], /*resend=*/false},
                    opt_.auth);
}

Result<ParsedChunk> FoldApply::FetchOrResend(size_t j, uint64_t i, std::vector<uint8_t>* object,
                                             bool* resent) {
  *resent = false;
  auto c = Fetch(j, i, object);
  if (c.ok() || !FailsItsChecks(c.status())) return c;
  auto got = r_.store_->Get(ResendKey(chain_[j].version, opt_.member, i, /*after=*/true));
  if (!got.ok()) return c.status();
  result_.bytes_fetched += got->size();
  std::vector<uint8_t> bytes = std::move(*got);
  auto resend =
      CheckChunk(bytes, ChunkSpec{&chain_[j], i, &manifests_[j], /*resend=*/true}, opt_.auth);
  if (!resend.ok()) return c.status();
  *object = std::move(bytes);  // the buffer `resend` points into moves along
  *resent = true;
  return resend;
}

Status FoldApply::RequestResend(size_t j, uint64_t i) {
  ResendRequest q;
  q.chunks.push_back(i);
  q.after.push_back(true);
  return r_.store_->Put(RequestKey(chain_[j].version, opt_.member),
                        opt_.auth.SealMember(EncodeRequest(q)));
}

Status FoldApply::RecheckBadChunk() {
  if (!r_.bad_fold_chunk_) return Status();
  const auto [bad_version, bad_index] = *r_.bad_fold_chunk_;
  for (size_t j = 0; j < chain_.size(); ++j) {
    if (chain_[j].version != bad_version || bad_index >= manifests_[j].chunks.size()) continue;
    std::vector<uint8_t> object;
    bool resent = false;
    auto c = FetchOrResend(j, bad_index, &object, &resent);
    if (!c.ok() && FailsItsChecks(c.status())) {
      const Status asked = RequestResend(j, bad_index);
      return DataLossError(std::string(c.status().message()) + "; nothing of " + what_ +
                           " was written" +
                           (asked.ok() ? "; a re-send of the chunk was requested"
                                       : "; requesting a re-send of the chunk failed (" +
                                             asked.ToString() + ")"));
    }
    REFIT_RETURN_IF_ERROR(c.status());
  }
  r_.bad_fold_chunk_.reset();
  return Status();
}

Status FoldApply::OpenJournalAndBind() {
  if (!resume_) {
    std::vector<uint64_t> versions;
    for (const Announcement& a : chain_) versions.push_back(a.version);
    REFIT_ASSIGN_OR_RETURN(journal_,
                           Journal::BeginFold(journal_path_, first_.base_version, versions, shas_));
    CrashPoint("receiver.after-begin");
  } else {
    REFIT_ASSIGN_OR_RETURN(journal_, Journal::Reopen(journal_path_));
  }
  result_.versions_folded = chain_.size();
  REFIT_ASSIGN_OR_RETURN(BoundTensors b,
                         BindTensors(opt_.checkpoint, opt_.tensors, first_.tensors, last_.version));
  b_.emplace(std::move(b));
  digests_.emplace(tensors_);
  if (opt_.early_writeback) flusher_.emplace(*b_);
  // The one check of the base A, as for a single version (cells come in
  // tensor order).
  base_check_.emplace(*b_, &*digests_, first_.tensors, resume_, first_.base_version, what_);
  return Status();
}

Status FoldApply::Drain(bool all) {
  for (ApplyPool::Done& d : pool_->Drain(all)) {
    const FoldCell& cell = cells_[d.job.index];
    const size_t from = cell.chunks.size() - d.job.chunks.size();
    for (size_t q = 0; q < d.applied; ++q) {
      const FoldRef& r = cell.chunks[from + q];
      REFIT_RETURN_IF_ERROR(journal_.FoldApplied(r.position, r.chunk, d.undo[q]));
      if (d.job.resent[q]) {
        ++result_.chunks_resent;
      } else {
        ++r_.chunks_applied_total_;
        ++result_.chunks_applied;
      }
      result_.changed_elements += d.job.chunks[q].header.changed;
    }
    if (d.applied > 0) {
      digests_->Written(d.job.tensor, d.job.offset, d.job.length);
      if (flusher_) flusher_->Add(d.job.tensor, d.job.offset, d.job.length);
    }
    if (!d.status.ok()) {
      // The range holds the last applied chunk's "after" (or is as it
      // was).
      if (apply_error_.ok()) {
        apply_error_ = d.status;
        failed_apply_ = cell.chunks[from + d.applied];
      }
      continue;
    }
    CrashPoint("receiver.after-fold-cell");
  }
  return apply_error_;
}

Status FoldApply::DrainOrRefuse(bool all) {
  Status s = Drain(all);
  if (!s.ok() && failed_apply_ && FailsItsChecks(s)) return Refuse(*failed_apply_, s);
  return s;
}

// The chunks the journal records applied are undone newest first (XOR
// chunks by applying them again, overwrite chunks from their pre-images),
// each only when its range holds the chunk's "after" (at its "before" it
// is not in place); then every tensor must hash to A, and the journal is
// removed. A range in neither state (torn by a crash, or whose chunk was
// applied but not journaled when the process died) cannot be brought
// back: DATA_LOSS, the journal kept (the next step resumes the fold).
Status FoldApply::RollBack() {
  REFIT_ASSIGN_OR_RETURN(auto state, Journal::Load(journal_path_));
  if (!state) return DataLossError("the journal of " + what_ + " is gone");
  ApplyScratch scratch;
  for (auto it = state->fold_applied.rbegin(); it != state->fold_applied.rend(); ++it) {
    if (it->position >= chain_.size() ||
        it->chunk >= manifests_[it->position].chunks.size()) {
      return DataLossError("the journal of " + what_ + " names a chunk outside it");
    }
    std::vector<uint8_t> object;
    bool resent = false;
    REFIT_ASSIGN_OR_RETURN(ParsedChunk c,
                           FetchOrResend(it->position, it->chunk, &object, &resent));
    const ChunkHeader& h = c.header;
    const size_t t = h.tensor_id;
    const uint64_t off = h.start * h.width, len = (h.End() - h.start) * h.width;
    const Hash128 now = RegionHash(h, b_->data[t]);
    if (now == h.before) continue;
    const std::string name = "chunk " + std::to_string(it->chunk) + " of " +
                             VersionName(it->position) + " (tensor '" +
                             first_.tensors[t].name + "')";
    if (now != h.after) {
      return DataLossError("the range of " + name + " holds neither side of it");
    }
    REFIT_RETURN_IF_ERROR(UndoChunkInPlace(c, b_->data[t], &scratch, it->undo));
    if (flusher_) flusher_->Add(t, off, len);
    if (RegionHash(h, b_->data[t]) != h.before) {
      return DataLossError("undoing " + name + " did not restore its range");
    }
  }
  for (size_t t = 0; t < tensors_; ++t) {
    if (b_->Tensor(t) != first_.tensors[t].before) {
      return DataLossError("tensor '" + first_.tensors[t].name + "' is not at version " +
                           std::to_string(first_.base_version));
    }
  }
  REFIT_RETURN_IF_ERROR(b_->Sync());
  return Journal::Remove(journal_path_);
}

// After the rollback, a checkpoint receiver resyncs from a snapshot when
// the store holds one (Receiver::OrSnapshot takes the DATA_LOSS).
Status FoldApply::Refuse(const FoldRef& r, const Status& why) {
  r_.bad_fold_chunk_.emplace(chain_[r.position].version, r.chunk);
  (void)Drain(true);
  const Status back = RollBack();
  const Status asked = RequestResend(r.position, r.chunk);
  std::string message(why.message());
  if (back.ok()) {
    message += "; " + what_ + " was rolled back to version " + std::to_string(first_.base_version);
  } else {
    message += "; rolling back " + what_ + " failed (" + back.ToString() +
               "); the journal keeps the fold and the next step resumes it";
  }
  message += asked.ok() ? "; a re-send of the chunk was requested"
                        : "; requesting a re-send of the chunk failed (" + asked.ToString() + ")";
  return DataLossError(message);
}

Status FoldApply::ApplyCells() {
  for (size_t n = 0; n < cells_.size(); ++n) {
    const FoldCell& cell = cells_[n];
    const size_t t = cell.tensor;
    const uint64_t w = first_.tensors[t].width;
    // The bytes the region spans (a strided region: from its first row's
    // start to its last row's end; other cells' rows may lie between).
    const uint64_t off = cell.start * w, len = (cell.End() - cell.start) * w;
    // The cell's chunks, fetched now (one cell's worth of payload in
    // memory per job in flight), each starting where the previous ended.
    ApplyPool::Job job;
    job.index = n;
    job.tensor = t;
    job.offset = off;
    job.length = len;
    job.data = b_->data[t];
    for (const FoldRef& r : cell.chunks) {
      std::vector<uint8_t> object;
      bool resent = false;
      auto c = FetchOrResend(r.position, r.chunk, &object, &resent);
      if (!c.ok()) return FailsItsChecks(c.status()) ? Refuse(r, c.status()) : c.status();
      if (!job.chunks.empty() && job.chunks.back().header.after != c->header.before) {
        return Refuse(r, DataLossError(
            "chunk " + std::to_string(r.chunk) + " of " + VersionName(r.position) +
            " does not start where the previous version's chunk of its range "
            "ends (tensor '" + first_.tensors[t].name + "', elements " +
            std::to_string(cell.start) + ".." + std::to_string(cell.start + cell.count) + ")"));
      }
      job.chunks.push_back(*c);  // points into `object`'s buffer, which moves along
      job.objects.push_back(std::move(object));
      job.resent.push_back(resent);
    }
    REFIT_RETURN_IF_ERROR(base_check_->Through(t));
    // Cells share no element (PlanFold), so a strided region is hashed
    // over its rows while workers write other cells' rows between them.
    const Hash128 h = cell.run != 0 ? RegionHash(job.chunks.back().header, b_->data[t])
                                    : digests_->Range(*b_, t, off, len);
    const size_t m = job.chunks.size();
    if (h == job.chunks.back().header.after) {
      result_.chunks_skipped += m;
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
      torn_.push_back({n, job.chunks.back().header.after});
      digests_->SetCovered(t, false);
      continue;
    }
    result_.chunks_skipped += from;
    const auto skip = static_cast<std::ptrdiff_t>(from);
    job.chunks.erase(job.chunks.begin(), job.chunks.begin() + skip);
    job.objects.erase(job.objects.begin(), job.objects.begin() + skip);
    job.resent.erase(job.resent.begin(), job.resent.begin() + skip);
    pool_->Submit(std::move(job));
    REFIT_RETURN_IF_ERROR(DrainOrRefuse(false));
  }
  return DrainOrRefuse(true);
}

// Torn cells: a crash inside one of the cell's chunks. Every chunk of the
// cell is asked for again as an overwrite re-send at its version (one
// request per version); together they name every element any of them
// changed, and the cell is rebuilt in scratch from its bytes (the rest of
// the range is the base's, which no version changed) with the re-sent
// values applied in version order. It is written back only when it hashes
// to the last chunk's "after". A publisher answers a re-send from its
// committed baseline, so this holds when that baseline has the range as at
// Vk: always while Vk is the head.
Status FoldApply::RepairTorn() {
  if (torn_.empty()) return Status();
  std::map<size_t, ResendRequest> requests;  // by chain position
  for (const Torn& x : torn_) {
    for (const FoldRef& r : cells_[x.cell].chunks) {
      requests[r.position].chunks.push_back(r.chunk);
      requests[r.position].after.push_back(true);
    }
  }
  for (const auto& [j, q] : requests) {
    REFIT_RETURN_IF_ERROR(r_.store_->Put(RequestKey(chain_[j].version, opt_.member),
                                         opt_.auth.SealMember(EncodeRequest(q))));
  }
  auto start = Clock::now();
  std::vector<uint32_t> positions;
  std::vector<uint8_t> values;
  for (const Torn& x : torn_) {
    const FoldCell& cell = cells_[x.cell];
    const size_t t = cell.tensor;
    const int w = first_.tensors[t].width;
    const uint64_t off = cell.start * static_cast<uint64_t>(w);
    const uint64_t len = cell.count * static_cast<uint64_t>(w);
    const uint32_t n = static_cast<uint32_t>(cell.count);
    // The region's elements in order (a strided region's rows gathered),
    // as re-sends and range hashes number them.
    const uint64_t run = cell.run != 0 ? cell.run : cell.count;
    const uint64_t stride = cell.run != 0 ? cell.stride : cell.count;
    const uint64_t row_bytes = run * static_cast<uint64_t>(w);
    auto row_at = [&](uint64_t r) { return b_->data[t] + off + r * stride * w; };
    std::vector<uint8_t> range(len);
    for (uint64_t r = 0; r < cell.count / run; ++r) {
      std::memcpy(range.data() + r * row_bytes, row_at(r), row_bytes);
    }
    for (const FoldRef& r : cell.chunks) {
      const std::string name =
          "the re-send of chunk " + std::to_string(r.chunk) + " of " + VersionName(r.position);
      std::vector<uint8_t> object;
      for (;;) {
        auto got =
            r_.store_->Get(ResendKey(chain_[r.position].version, opt_.member, r.chunk, true));
        if (got.ok()) {
          object = std::move(*got);
          break;
        }
        if (got.status().code() != StatusCode::kNotFound) return got.status();
        if (ElapsedMs(start) > opt_.resend_timeout_ms) {
          return DeadlineExceededError(
              "no " + name + " within " + std::to_string(opt_.resend_timeout_ms) + " ms (" +
              what_ + " found its range torn); a publisher must serve re-sends "
              "of that version; the work is journaled and resumes on the next step");
        }
        REFIT_RETURN_IF_ERROR(r_.Pause(name));
      }
      result_.bytes_fetched += object.size();
      REFIT_ASSIGN_OR_RETURN(
          ParsedChunk c,
          CheckChunk(object, ChunkSpec{&chain_[r.position], r.chunk, &manifests_[r.position],
                                       /*resend=*/true},
                     opt_.auth));
      const ChunkHeader& h = c.header;
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
      ++result_.chunks_resent;
    }
    if (RangeHash(range.data(), len) != x.after) {
      return DataLossError(
          "the re-sends of tensor '" + first_.tensors[t].name + "' elements " +
          std::to_string(cell.start) + ".." + std::to_string(cell.start + cell.count) +
          " do not bring it to " + VersionName(cell.chunks.back().position) +
          "; the serving publisher's baseline no longer holds that range as at version " +
          std::to_string(last_.version) + "; resync this receiver from a snapshot");
    }
    for (uint64_t r = 0; r < cell.count / run; ++r) {
      std::memcpy(row_at(r), range.data() + r * row_bytes, row_bytes);
    }
    const uint64_t span = (cell.End() - cell.start) * static_cast<uint64_t>(w);
    digests_->Written(t, off, span);
    if (flusher_) flusher_->Add(t, off, span);
  }
  return Status();
}

// A covered tensor was at the base A as a whole and every cell of it now
// hashes to its last chunk's "after", the range at Vk; its bytes outside
// all cells are A's, and no version of the chain changed them (each
// manifest's chunk list covers every range its version changed). Other
// tensors are hashed.
Result<StepResult> FoldApply::CheckAndActivate() {
  const Manifest& mk = manifests_.back();
  std::vector<bool> has_chunks(tensors_, false), touched(tensors_, false);
  for (const Manifest& m : manifests_) {
    for (const ManifestChunk& mc : m.chunks) {
      has_chunks[mc.tensor_id] = true;
      if (mc.changed > 0) touched[mc.tensor_id] = true;
    }
  }
  for (size_t t = 0; t < tensors_; ++t) {
    const bool ok = digests_->covered(t)
                        ? has_chunks[t] || mk.tensors[t].after == first_.tensors[t].before
                        : b_->Tensor(t) == mk.tensors[t].after;
    if (!ok) {
      return DataLossError("after " + what_ + ", tensor '" + first_.tensors[t].name +
                           "' does not hash to the manifest of version " +
                           std::to_string(last_.version) +
                           "; the local model was not at the base; resync this receiver");
    }
  }
  REFIT_RETURN_IF_ERROR(b_->Sync());
  CrashPoint("receiver.after-flush");
  REFIT_RETURN_IF_ERROR(r_.Activate(last_.version));
  result_.outcome = StepResult::Outcome::kCaughtUp;
  for (size_t t = 0; t < tensors_; ++t) {
    if (touched[t]) result_.changed_tensors.push_back(first_.tensors[t].name);
  }
  result_.seconds = std::chrono::duration<double>(Clock::now() - t0_).count();
  result_.tail_seconds = result_.seconds;
  return result_;
}

}  // namespace refit::internal
