#include "sync/receiver.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hash.h"
#include "delta/apply.h"
#include "delta/chunk.h"
#include "refit/checkpoint.h"
#include "sync/crash_point.h"
#include "sync/journal.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

int ElapsedMs(Clock::time_point since) {
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

// A checkpoint bound to a manifest's tensor table.
struct Bound {
  Checkpoint ckpt;
  std::vector<size_t> index;  // manifest tensor id -> checkpoint tensor index
};

Result<Bound> BindCheckpoint(const std::string& path, const Manifest& m) {
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt,
                         Checkpoint::Open(path, Checkpoint::Mode::kReadWrite));
  if (ckpt.tensors().size() != m.tensors.size()) {
    return FailedPreconditionError(
        "checkpoint '" + path + "' has " + std::to_string(ckpt.tensors().size()) +
        " tensors but version " + std::to_string(m.version) + " has " +
        std::to_string(m.tensors.size()) + "; it is not this model");
  }
  Bound b{std::move(ckpt), {}};
  for (const TensorEntry& e : m.tensors) {
    const TensorInfo* t = b.ckpt.Find(e.name);
    if (t == nullptr || t->dtype != e.dtype || t->shape != e.shape ||
        t->element_width != e.width) {
      return FailedPreconditionError("checkpoint '" + path + "' lacks tensor '" +
                                     e.name + "' as version " +
                                     std::to_string(m.version) + " describes it");
    }
    b.index.push_back(*b.ckpt.IndexOf(e.name));
  }
  return b;
}

Hash128 ChunkRangeHash(Bound& b, const Manifest& m, const ManifestChunk& c) {
  const TensorEntry& e = m.tensors[c.tensor_id];
  const uint8_t* data = b.ckpt.Data(b.index[c.tensor_id]).data();
  return RangeHash(data + c.start * e.width, c.count * e.width);
}

Hash128 TensorHash(Bound& b, size_t tensor_id) {
  auto d = b.ckpt.Data(b.index[tensor_id]);
  return RangeHash(d.data(), d.size());
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

std::string IndexKey(uint64_t version) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "index/%020llu", static_cast<unsigned long long>(version));
  return buf;
}

Result<std::unique_ptr<Receiver>> Receiver::Open(ObjectStore* store,
                                                 ReceiverOptions options) {
  REFIT_RETURN_IF_ERROR(ValidateMember(options.member));
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

Result<Manifest> Receiver::ReadManifest(uint64_t version, Sha256* sha) {
  REFIT_ASSIGN_OR_RETURN(auto bytes, store_->Get(ManifestKey(version)));
  *sha = ComputeSha256(bytes);
  REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(bytes));
  REFIT_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(body));
  if (m.version != version) return DataLossError("manifest names another version");
  return m;
}

Result<StepResult> Receiver::Step() {
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
  if (journal && journal->version > active_) {
    Sha256 sha;
    auto manifest = ReadManifest(journal->version, &sha);
    if (!manifest.ok() && manifest.status().code() == StatusCode::kNotFound) {
      // Retention deleted the version while this receiver was inside it. A
      // snapshot at or above it replaces every file, torn or not.
      REFIT_ASSIGN_OR_RETURN(auto snap, NewestSnapshot());
      if (snap && *snap >= journal->version) return CatchUpFromSnapshot(*snap);
    }
    REFIT_ASSIGN_OR_RETURN(Manifest m, std::move(manifest));
    if (sha != journal->manifest_sha256) {
      return DataLossError("the stored manifest of version " +
                           std::to_string(journal->version) +
                           " differs from the one this receiver journaled");
    }
    bool member = std::find(m.members.begin(), m.members.end(), opt_.member) != m.members.end();
    return ProcessVersion(m, sha, member, /*resume=*/true);
  }
  REFIT_ASSIGN_OR_RETURN(auto versions, ListVersions());
  REFIT_ASSIGN_OR_RETURN(bool broken, ChainBroken(versions));
  if (broken) {
    REFIT_ASSIGN_OR_RETURN(auto snap, NewestSnapshot());
    if (snap && (*snap > active_ || !CheckpointPresent(opt_.checkpoint))) {
      return CatchUpFromSnapshot(*snap);
    }
    if (!snap && !CheckpointPresent(opt_.checkpoint)) {
      return StepResult{};  // the publisher has not stored a snapshot yet
    }
    return FailedPreconditionError(
        "receiver '" + opt_.member + "' at version " + std::to_string(active_) +
        " has no chain of versions to follow and no newer snapshot to take");
  }
  for (uint64_t v : versions) {
    if (v <= active_) continue;
    Sha256 sha;
    REFIT_ASSIGN_OR_RETURN(Manifest m, ReadManifest(v, &sha));
    if (m.base_version != active_) {
      // Based on a version we skipped (aborted) or do not have yet.
      if (m.base_version > active_) {
        REFIT_ASSIGN_OR_RETURN(auto d, ReadDecision(v));
        if (!d) return StepResult{};  // wait for the chain to settle
      }
      continue;
    }
    REFIT_ASSIGN_OR_RETURN(auto decision, ReadDecision(v));
    if (decision && !decision->commit) continue;  // aborted: not ours to apply
    bool member = std::find(m.members.begin(), m.members.end(), opt_.member) != m.members.end();
    if (!decision && !member) return StepResult{};  // not ours; wait for its decision
    return ProcessVersion(m, sha, member && !decision, /*resume=*/false);
  }
  return StepResult{};
}

Result<bool> Receiver::ChainBroken(const std::vector<uint64_t>& versions) {
  if (!CheckpointPresent(opt_.checkpoint)) return true;
  // Retention deletes the oldest versions first, so the chain from the
  // active version exists iff the first version above it builds on it (or
  // on an older one: a version whose base we skipped is passed over).
  auto next = std::upper_bound(versions.begin(), versions.end(), active_);
  if (next == versions.end()) return false;
  Sha256 sha;
  REFIT_ASSIGN_OR_RETURN(Manifest m, ReadManifest(*next, &sha));
  return m.base_version > active_;
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

Result<StepResult> Receiver::SyncTo(uint64_t version, int timeout_ms) {
  auto start = Clock::now();
  StepResult last;
  while (active_ < version) {
    REFIT_ASSIGN_OR_RETURN(last, Step());
    if (active_ >= version) break;
    if (ElapsedMs(start) > timeout_ms) {
      return DeadlineExceededError("receiver '" + opt_.member + "' did not reach version " +
                                   std::to_string(version) + " within " +
                                   std::to_string(timeout_ms) + " ms (active " +
                                   std::to_string(active_) + ")");
    }
    if (last.outcome == StepResult::Outcome::kIdle) {
      std::this_thread::sleep_for(std::chrono::milliseconds(opt_.poll_ms));
    }
  }
  return last;
}

Result<StepResult> Receiver::ProcessVersion(const Manifest& m, const Sha256& manifest_sha,
                                            bool vote, bool resume) {
  auto t0 = Clock::now();
  StepResult result;
  result.version = m.version;
  const std::string journal_path = StatePath(opt_, "journal");
  std::optional<JournalState> state;
  Journal journal;
  if (resume) {
    REFIT_ASSIGN_OR_RETURN(state, Journal::Load(journal_path));
    REFIT_ASSIGN_OR_RETURN(journal, Journal::Reopen(journal_path));
  } else {
    REFIT_ASSIGN_OR_RETURN(journal, Journal::Begin(journal_path, m.version,
                                                    m.base_version, manifest_sha));
    state.emplace();
  }
  REFIT_ASSIGN_OR_RETURN(Bound b, BindCheckpoint(opt_.checkpoint, m));
  REFIT_ASSIGN_OR_RETURN(auto decision, ReadDecision(m.version));
  ApplyScratch scratch;

  // Fetches, authenticates and parses chunk i (or a re-send of it).
  std::vector<uint8_t> object;
  auto fetch = [&](const std::string& key, const ManifestChunk* expect,
                   uint64_t i) -> Result<ParsedChunk> {
    REFIT_ASSIGN_OR_RETURN(object, store_->Get(key));
    result.bytes_fetched += object.size();
    if (expect && (object.size() != expect->size || ComputeSha256(object) != expect->sha256)) {
      return DataLossError("chunk " + std::to_string(i) + " of version " +
                           std::to_string(m.version) + " does not match its manifest hash");
    }
    REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(object));
    REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(body));
    const ManifestChunk& mc = m.chunks[i];
    if (c.header.tensor_id != mc.tensor_id || c.header.start != mc.start ||
        c.header.count != mc.count || c.header.width != m.tensors[mc.tensor_id].width) {
      return DataLossError("chunk " + std::to_string(i) + " does not match its manifest entry");
    }
    if (expect && (c.header.version != m.version || c.header.base_version != m.base_version ||
                   c.header.kind != static_cast<codec::ChunkKind>(mc.kind))) {
      return DataLossError("chunk " + std::to_string(i) + " belongs to another version");
    }
    return c;
  };
  auto tensor_data = [&](uint64_t tensor_id) {
    return b.ckpt.MutableData(b.index[tensor_id]).data();
  };

  // Asks for overwrite re-sends of `torn` chunks (at V if `after`, else at
  // the base) and applies them as they arrive.
  auto repair = [&](const std::vector<uint64_t>& torn, bool after) -> Status {
    if (torn.empty()) return Status();
    ResendRequest q;
    for (uint64_t i : torn) {
      q.chunks.push_back(i);
      q.after.push_back(after);
    }
    REFIT_RETURN_IF_ERROR(store_->Put(RequestKey(m.version, opt_.member),
                                      opt_.auth.Seal(EncodeRequest(q))));
    auto start = Clock::now();
    for (uint64_t i : torn) {
      for (;;) {
        auto c = fetch(ResendKey(m.version, opt_.member, i, after), nullptr, i);
        if (c.ok()) {
          if (c->header.kind != codec::ChunkKind::kSparseOverwrite &&
              c->header.kind != codec::ChunkKind::kRaw) {
            return DataLossError("re-send of chunk " + std::to_string(i) + " is not an overwrite");
          }
          UndoRecord undo;
          REFIT_RETURN_IF_ERROR(ApplyChunkInPlace(*c, tensor_data(m.chunks[i].tensor_id),
                                                  &scratch, nullptr, &undo));
          ++result.chunks_resent;
          break;
        }
        if (c.status().code() != StatusCode::kNotFound) return c.status();
        if (ElapsedMs(start) > opt_.resend_timeout_ms) {
          return DeadlineExceededError("no re-send of chunk " + std::to_string(i) +
                                       " of version " + std::to_string(m.version) +
                                       " within " + std::to_string(opt_.resend_timeout_ms) +
                                       " ms; is the publisher running?");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(opt_.poll_ms));
      }
    }
    return Status();
  };

  auto roll_back = [&]() -> Status {
    std::vector<uint64_t> torn;
    for (size_t i = 0; i < m.chunks.size(); ++i) {
      const ManifestChunk& mc = m.chunks[i];
      // Chunk headers carry the range hashes; fetch to learn them.
      REFIT_ASSIGN_OR_RETURN(ParsedChunk c, fetch(ChunkKey(m.version, i), &mc, i));
      Hash128 h = ChunkRangeHash(b, m, mc);
      if (h == c.header.before) continue;
      if (h == c.header.after) {
        auto it = state->applied.find(i);
        if (c.header.IsXor()) {
          REFIT_RETURN_IF_ERROR(UndoChunkInPlace(c, tensor_data(mc.tensor_id), &scratch, {}));
        } else if (it != state->applied.end()) {
          REFIT_RETURN_IF_ERROR(
              UndoChunkInPlace(c, tensor_data(mc.tensor_id), &scratch, it->second));
        } else {
          torn.push_back(i);
        }
        continue;
      }
      torn.push_back(i);
    }
    REFIT_RETURN_IF_ERROR(repair(torn, /*after=*/false));
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      if (TensorHash(b, t) != m.tensors[t].before) {
        return DataLossError("rollback of version " + std::to_string(m.version) +
                             " left tensor '" + m.tensors[t].name +
                             "' off its base; resync this receiver from a snapshot");
      }
    }
    REFIT_RETURN_IF_ERROR(b.ckpt.Sync());
    result.outcome = StepResult::Outcome::kAborted;
    return Journal::Remove(journal_path);
  };

  if (decision && !decision->commit) {
    REFIT_RETURN_IF_ERROR(roll_back());
    result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return result;
  }

  // Apply every chunk at most once.
  CrashPoint("receiver.before-apply");
  std::vector<uint64_t> torn;
  for (size_t i = 0; i < m.chunks.size(); ++i) {
    const ManifestChunk& mc = m.chunks[i];
    REFIT_ASSIGN_OR_RETURN(ParsedChunk c, fetch(ChunkKey(m.version, i), &mc, i));
    switch (ClassifyRange(c.header, ChunkRangeHash(b, m, mc))) {
      case RangeState::kAfter:
        ++result.chunks_skipped;
        break;
      case RangeState::kBefore: {
        UndoRecord undo;
        REFIT_RETURN_IF_ERROR(
            ApplyChunkInPlace(c, tensor_data(mc.tensor_id), &scratch, nullptr, &undo));
        ++chunks_applied_total_;
        REFIT_RETURN_IF_ERROR(journal.Applied(i, undo));
        ++result.chunks_applied;
        result.changed_elements += c.header.changed;
        CrashPoint("receiver.after-chunk");
        break;
      }
      case RangeState::kNeither:
        torn.push_back(i);
        break;
    }
  }
  REFIT_RETURN_IF_ERROR(repair(torn, /*after=*/true));
  CrashPoint("receiver.after-apply");
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    if (TensorHash(b, t) != m.tensors[t].after) {
      return DataLossError("after applying version " + std::to_string(m.version) +
                           ", tensor '" + m.tensors[t].name +
                           "' does not hash to the manifest; the local checkpoint "
                           "was not at the base; resync this receiver");
    }
  }
  REFIT_RETURN_IF_ERROR(b.ckpt.Sync());
  CrashPoint("receiver.after-flush");
  REFIT_RETURN_IF_ERROR(journal.Sync());
  CrashPoint("receiver.after-journal");

  if (vote) {
    REFIT_RETURN_IF_ERROR(store_->Put(VoteKey(m.version, opt_.member),
                                      opt_.auth.Seal(EncodeVote(Vote{true, ""}))));
    REFIT_RETURN_IF_ERROR(journal.Voted());
    REFIT_RETURN_IF_ERROR(journal.Sync());
    CrashPoint("receiver.after-vote");
    auto start = Clock::now();
    while (!decision) {
      if (ElapsedMs(start) > opt_.decision_timeout_ms) {
        return DeadlineExceededError(
            "voted ready for version " + std::to_string(m.version) +
            " but no decision arrived within " + std::to_string(opt_.decision_timeout_ms) +
            " ms; the work is journaled and resumes on the next step");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(opt_.poll_ms));
      REFIT_ASSIGN_OR_RETURN(decision, ReadDecision(m.version));
    }
  } else if (!decision) {
    return FailedPreconditionError("version " + std::to_string(m.version) +
                                   " has no decision and names no vote from '" +
                                   opt_.member + "'");
  }
  if (!decision->commit) {
    REFIT_RETURN_IF_ERROR(roll_back());
  } else {
    REFIT_RETURN_IF_ERROR(Activate(m.version));
    result.outcome = vote ? StepResult::Outcome::kCommitted : StepResult::Outcome::kCaughtUp;
    std::vector<bool> touched(m.tensors.size(), false);
    for (const ManifestChunk& c : m.chunks) {
      if (c.changed > 0 && c.tensor_id < touched.size()) touched[c.tensor_id] = true;
    }
    for (size_t t = 0; t < touched.size(); ++t) {
      if (touched[t]) result.changed_tensors.push_back(m.tensors[t].name);
    }
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

}  // namespace refit
