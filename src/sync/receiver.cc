#include "sync/receiver.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "base/file.h"
#include "base/hash.h"
#include "refit/checkpoint.h"
#include "sync/crash_point.h"
#include "sync/fold_apply.h"
#include "sync/follow.h"
#include "sync/journal.h"
#include "sync/publisher_baseline.h"
#include "sync/staged_apply.h"
#include "sync/version_apply.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

// A step or SyncTo ended by options.stop while waiting for `waiting_for`.
Status StoppedError(const std::string& waiting_for) {
  return CancelledError(
      "stopped while waiting for " + waiting_for +
      "; what was done is journaled and resumes on the next step");
}

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
  const int targets = !options.checkpoint.empty() + !options.tensors.empty() +
                      (options.staged != nullptr);
  if (targets != 1) {
    return InvalidArgumentError(
        "receiver '" + options.member +
        "' needs exactly one of a checkpoint path, in-memory tensors "
        "and a two-phase target");
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

Receiver::Receiver(ObjectStore* store, ReceiverOptions options)
    : store_(store), opt_(std::move(options)) {}

Receiver::~Receiver() = default;

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

Status Receiver::AwaitDecision(uint64_t version,
                               std::optional<Decision>* decision,
                               const std::string& voted,
                               const std::string& then) {
  const auto start = Clock::now();
  const std::string V = std::to_string(version);
  uint64_t since = store_->ChangeCount();
  if (!*decision) {
    REFIT_ASSIGN_OR_RETURN(*decision, ReadDecision(version));
  }
  while (!*decision) {
    if (std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start)
            .count() > opt_.decision_timeout_ms) {
      return DeadlineExceededError("voted " + voted + " version " + V +
                                   " but no decision arrived within " +
                                   std::to_string(opt_.decision_timeout_ms) + " ms; " + then);
    }
    REFIT_RETURN_IF_ERROR(Pause("the decision on version " + V, since));
    since = store_->ChangeCount();
    REFIT_ASSIGN_OR_RETURN(*decision, ReadDecision(version));
  }
  return Status();
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
  if (m.direct) {
    // The tensor hashes after a version published by several ranks are
    // those its members voted, recorded in the commit decision.
    REFIT_ASSIGN_OR_RETURN(auto d, ReadDecision(version));
    if (d && d->commit) {
      if (d->tensors.size() != m.tensors.size()) {
        return DataLossError("the commit of version " + std::to_string(version) +
                             " does not record its tensors' hashes");
      }
      for (size_t t = 0; t < m.tensors.size(); ++t) m.tensors[t].after = d->tensors[t];
    }
  }
  return m;
}

Result<StepResult> Receiver::Step(uint64_t fold_limit) {
  if (opt_.staged) {
    REFIT_ASSIGN_OR_RETURN(StepResult prepared, Prepare(fold_limit));
    if (prepared.outcome != StepResult::Outcome::kPrepared) return prepared;
    return ActivatePrepared();
  }
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
  return Next(fold_limit);
}

Result<StepResult> Receiver::Next(uint64_t fold_limit) {
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
      if (chain.size() >= 2 && opt_.staged)
        return OrSnapshot(PrepareChain(chain, /*vote=*/false));
      if (chain.size() >= 2) {
        auto folded = Fold(chain, shas, /*resume=*/false);
        if (!folded.ok()) return OrSnapshot(folded.status());
        if (*folded) return std::move(**folded);
      }
    }
    Result<StepResult> step = opt_.staged
                                  ? PrepareChain({a}, member && !decision)
                                  : ProcessVersion(a, sha, member && !decision,
                                                   /*resume=*/false);
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

Result<bool> Receiver::WriteSnapshot() {
  const std::string V = std::to_string(active_);
  if (opt_.checkpoint.empty() || opt_.staged != nullptr) {
    return FailedPreconditionError("receiver '" + opt_.member +
                                   "' holds no checkpoint to write a snapshot from");
  }
  auto idle = [&]() -> Status {
    REFIT_ASSIGN_OR_RETURN(auto journal, Journal::Load(StatePath(opt_, "journal")));
    if (journal && journal->version > active_) {
      return FailedPreconditionError("receiver '" + opt_.member + "' is inside version " +
                                     std::to_string(journal->version) +
                                     " (journaled); step it to the end first");
    }
    return Status();
  };
  REFIT_RETURN_IF_ERROR(idle());
  auto existing = store_->Get(SnapshotIndexKey(active_));
  if (existing.ok()) return false;
  if (existing.status().code() != StatusCode::kNotFound) return existing.status();
  REFIT_ASSIGN_OR_RETURN(auto record, ActiveTensors());
  if (!record) {
    return FailedPreconditionError("the store records no tensor table for version " + V +
                                   "; no snapshot is written from receiver '" + opt_.member +
                                   "'");
  }
  for (const TensorEntry& e : *record) {
    if (e.after == Hash128{}) {
      return FailedPreconditionError("version " + V + " is not committed with its tensors' "
                                     "hashes; no snapshot is written");
    }
  }
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<FileBaseline> files,
                         FileBaseline::Open(opt_.checkpoint));
  const std::vector<TensorView>& views = files->tensors();
  if (views.size() != record->size()) {
    return DataLossError("receiver '" + opt_.member + "' holds " +
                         std::to_string(views.size()) + " tensors, version " + V + " has " +
                         std::to_string(record->size()) + "; no snapshot is written");
  }
  std::vector<TensorEntry> table;
  for (const TensorEntry& e : *record) {
    auto it = std::find_if(views.begin(), views.end(),
                           [&](const TensorView& v) { return v.name == e.name; });
    if (it == views.end()) {
      return DataLossError("receiver '" + opt_.member + "' has no tensor '" + e.name +
                           "' of version " + V + "; no snapshot is written");
    }
    REFIT_ASSIGN_OR_RETURN(Hash128 h,
                           files->HashTensor(static_cast<size_t>(it - views.begin())));
    if (h != e.after) {
      return DataLossError("receiver '" + opt_.member + "' holds tensor '" + e.name +
                           "' not as version " + V + " records it; no snapshot is written "
                           "(resync this receiver)");
    }
    TensorEntry t = e;
    t.before = t.after;
    table.push_back(std::move(t));
  }
  const uint64_t version = active_;
  SnapshotIndex index;
  index.version = version;
  index.tensors = std::move(table);
  REFIT_RETURN_IF_ERROR(files->ForEachSnapshotFile(
      [&](const std::string& name, std::span<const uint8_t> bytes) -> Status {
        const size_t i = index.files.size();
        index.files.push_back(SnapshotFile{name, bytes.size(), ComputeSha256(bytes)});
        return store_->Put(SnapshotFileKey(version, i), bytes);
      }));
  // Nothing may have written the files since they were hashed: no
  // version began (journal) or was activated meanwhile.
  REFIT_RETURN_IF_ERROR(idle());
  if (PathExists(StatePath(opt_, "active"))) {
    REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> text, ReadFile(StatePath(opt_, "active")));
    if (std::strtoull(std::string(text.begin(), text.end()).c_str(), nullptr, 10) != version) {
      return AbortedError("receiver '" + opt_.member + "' moved past version " + V +
                          " while its snapshot was written; no index was stored");
    }
  }
  Status put = store_->PutIfAbsent(SnapshotIndexKey(version),
                                   opt_.auth.Seal(EncodeSnapshotIndex(index)));
  if (put.code() == StatusCode::kAlreadyExists) return false;
  REFIT_RETURN_IF_ERROR(put);
  return true;
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
  if (opt_.staged) return PrepareSnapshot(version);
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
  if (step.ok() || (opt_.checkpoint.empty() && !opt_.staged)) return step;
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
  FollowOptions follow;
  follow.until = version;
  follow.timeout_ms = timeout_ms;
  follow.poll_ms = opt_.poll_ms;
  follow.stop = opt_.stop;
  REFIT_ASSIGN_OR_RETURN(FollowResult r, Follow(*this, follow));
  if (r.end == FollowEnd::kTimedOut) {
    return DeadlineExceededError(
        "receiver '" + opt_.member + "' did not reach version " +
        std::to_string(version) + " within " + std::to_string(timeout_ms) +
        " ms (active " + std::to_string(active_) + ")");
  }
  if (r.end == FollowEnd::kStopped)
    return StoppedError("version " + std::to_string(version));
  return r.last;
}

Status Receiver::Pause(const std::string& waiting_for,
                       std::optional<uint64_t> since) {
  if (opt_.stop && opt_.stop()) return StoppedError(waiting_for);
  if (since) {
    store_->AwaitChange(*since, opt_.poll_ms);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(opt_.poll_ms));
  }
  if (opt_.stop && opt_.stop()) return StoppedError(waiting_for);
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
  Status put = PutFailedVote(a.version, step.status());
  if (!put.ok()) return put;
  if (failure.journaled) {
    REFIT_ASSIGN_OR_RETURN(Journal journal, Journal::Reopen(StatePath(opt_, "journal")));
    REFIT_RETURN_IF_ERROR(journal.Failed(failure.bound));
    REFIT_RETURN_IF_ERROR(journal.Sync());
  }
  return VotedFailed(a.version, step.status(), "the next step rolls it back");
}

Status Receiver::PutFailedVote(uint64_t version, const Status& why) {
  Status put = store_->Put(
      VoteKey(version, opt_.member),
      opt_.auth.SealMember(EncodeVote(Vote{false, why.ToString(), {}})));
  if (!put.ok()) {
    return put.WithContext(why.ToString() + "; voting failed on version " +
                           std::to_string(version));
  }
  return Status();
}

Status Receiver::VotedFailed(uint64_t version, const Status& why,
                             const std::string& then) {
  failed_vote_ = version;
  return Status(why.code(), std::string(why.message()) +
                                "; voted failed on version " +
                                std::to_string(version) +
                                " (its coordinator aborts it; " + then + ")");
}

Result<StepResult> Receiver::ApplyVersion(const Announcement& a,
                                          const Sha256& announcement_sha, bool vote,
                                          bool resume, VersionFailure* failure) {
  return internal::VersionApply(this, a, announcement_sha, vote, resume,
                                StatePath(opt_, "journal"), failure)
      .Run();
}

// Catch-up by folding (docs/protocol.md, "Catch-up by folding").
Result<std::optional<StepResult>> Receiver::Fold(const std::vector<Announcement>& chain,
                                                 const std::vector<Sha256>& shas,
                                                 bool resume) {
  return internal::FoldApply(this, chain, shas, resume, StatePath(opt_, "journal")).Run();
}

}  // namespace refit
