#include "sync/staged_apply.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "base/hash.h"
#include "format/safetensors.h"
#include "sync/chunk_check.h"
#include "sync/apply_pool.h"
#include "sync/chunk_pack.h"
#include "sync/chunk_prefetch.h"
#include "sync/early_parts.h"

namespace refit::internal {
namespace {

using Clock = std::chrono::steady_clock;

// As VersionApply: in how many consecutive reads the store must return a
// chunk that fails its checks before the failure is the version's.
constexpr int kPersistentBadReads = 4;

int ElapsedMs(Clock::time_point since) {
  return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                              Clock::now() - since)
                              .count());
}

double SecondsSince(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

}  // namespace

Status StagedPrepare::CheckBase(bool* version_fault) {
  const Announcement& a = out_.chain.front();
  StagedTarget& target = *opt_.staged;
  const std::string of = "version " + std::to_string(a.base_version) +
                         ", the base of version " +
                         std::to_string(out_.chain.back().version);
  if (Status s = target.Check(a.tensors); !s.ok()) {
    *version_fault = true;
    return s;
  }
  REFIT_ASSIGN_OR_RETURN(auto hashes, target.Hashes(a.tensors));
  for (size_t t = 0; t < a.tensors.size(); ++t) {
    if (hashes[t] && *hashes[t] != a.tensors[t].before) {
      *version_fault = true;
      return FailedPreconditionError(
          "tensor '" + a.tensors[t].name + "' as held here does not hash to " +
          of +
          ": these tensors are not the model the version builds "
          "on; nothing was written");
    }
  }
  return Status();
}

Result<std::optional<StepResult>> StagedPrepare::StageVersion(
    size_t k, bool* version_fault) {
  const Announcement& a = out_.chain[k];
  const std::string V = std::to_string(a.version);
  std::optional<Manifest> m;
  std::vector<Sha256> seen;
  auto read_manifest = [&]() -> Status {
    Sha256 sha;
    auto got = r_.ReadManifest(a.version, &sha);
    if (!got.ok())
      return got.status().code() == StatusCode::kNotFound ? Status()
                                                          : got.status();
    if (!ManifestMatches(a, *got) || got->chunks.size() < seen.size()) {
      return DataLossError("the manifest of version " + V +
                           " does not match its announcement");
    }
    for (size_t i = 0; i < seen.size(); ++i) {
      if (got->chunks[i].sha256 != seen[i]) {
        return DataLossError(
            "chunk " + std::to_string(i) + " of version " + V +
            " that this receiver staged is not the one its manifest lists");
      }
    }
    bool parts = got->direct;
    for (const ManifestChunk& c : got->chunks) parts = parts || c.run != 0 || c.in_part;
    if (parts && !opt_.staged->AppliesDirectVersions()) {
      *version_fault = true;  // a member votes failed at once
      return FailedPreconditionError(
          "version " + V + " was published by several trainer ranks (strided regions, "
          "chunks in the ranks' parts), which this two-phase receiver's target does not "
          "apply");
    }
    m = std::move(*got);
    return Status();
  };
  Clock::time_point fetching = Clock::now();
  REFIT_RETURN_IF_ERROR(read_manifest());
  result_.stages.fetch += SecondsSince(fetching);
  std::optional<Clock::time_point> manifest_seen;
  auto last_progress = Clock::now();
  int polls = 0, bad_reads = 0;
  ChunkObjectReader reader(r_.store_, a.version);
  // A direct version's part chunks are read and checked ahead, side by
  // side, once the manifest names their keys (as VersionApply does); the
  // prefetch borrows the manifest, so it ends before the manifest moves.
  std::optional<ChunkPrefetch> prefetch;
  // Before the manifest, a direct version's part chunks are read as the
  // ranks store them (EarlyParts) and staged as they are read, in that
  // order (staging writes nothing). Once the manifest is read, each must
  // be one of its entries (rank and index, object size and SHA-256,
  // header); if one is not, the staging starts over from the manifest.
  std::optional<EarlyParts> early;
  bool stage_early = out_.chain.size() == 1;  // a single version
  struct Early {
    uint64_t size;
    Sha256 sha;
    ParsedChunk chunk;  // its header (the payload is the target's now)
  };
  std::map<std::pair<uint32_t, uint64_t>, Early> staged_early;  // by rank, k
  std::vector<bool> done;  // manifest chunks staged before the manifest
  const int threads = ApplyThreads(opt_.threads);
  // Stages chunk i, checked: its stored object, its whole bytes there and
  // its header.
  auto stage = [&](uint64_t i, std::span<const uint8_t> object,
                   std::span<const uint8_t> bytes, const ChunkHeader& h) -> Status {
    result_.stages.fetch += SecondsSince(fetching);
    bad_reads = 0;
    seen.push_back(m ? m->chunks[i].sha256 : ComputeSha256(object));
    result_.bytes_fetched += object.size();
    const Clock::time_point adding = Clock::now();
    const Status s = opt_.staged->Add(k, a.tensors, bytes);
    result_.stages.apply_cpu += SecondsSince(adding);
    if (!s.ok()) {
      // A version the staging cannot hold, or whose chunks the target
      // does not decode (a GPU target and conditional XOR chunks of a
      // tensor it does not store contiguously), cannot be applied here.
      *version_fault = s.code() == StatusCode::kResourceExhausted ||
                       s.code() == StatusCode::kUnimplemented;
      return s;
    }
    result_.changed_elements += h.changed;
    last_progress = Clock::now();
    if (!m) ++result_.chunks_before_manifest;
    return Status();
  };
  // Drops what was staged (the target starts over): chunks staged early
  // that are not the version's.
  auto restart = [&]() -> Status {
    REFIT_RETURN_IF_ERROR(opt_.staged->Begin());
    staged_early.clear();
    seen.clear();
    result_.changed_elements = 0;
    result_.chunks_before_manifest = 0;
    return Status();
  };
  // With the manifest read: which chunks staged early are its entries.
  auto match_early = [&]() -> Status {
    if (staged_early.empty()) return Status();
    done.assign(m->chunks.size(), false);
    size_t matched = 0;
    for (uint64_t i = 0; i < m->chunks.size(); ++i) {
      const ManifestChunk& e = m->chunks[i];
      auto it = staged_early.find({e.rank, e.part_index});
      if (!e.in_part || it == staged_early.end()) continue;
      const Early& x = it->second;
      if (EarlyParts::MatchesEntry(a, *m, i, e.rank, e.part_index, x.size, x.sha, x.chunk)) {
        done[i] = true;
        ++matched;
      }
    }
    if (matched == staged_early.size()) {
      result_.chunks_read_early += matched;
      staged_early.clear();
      return Status();
    }
    // A chunk staged early is not in the manifest: start over (no chunk of
    // the version's own keys was staged, or the staging started over when
    // the first was found).
    done.assign(m->chunks.size(), false);
    return restart();
  };
  for (uint64_t i = 0;;) {
    if (m) {
      if (!manifest_seen) {
        manifest_seen = Clock::now();
        REFIT_RETURN_IF_ERROR(match_early());
      }
      if (i >= m->chunks.size()) break;
      if (i < done.size() && done[i]) {
        ++i;
        continue;
      }
    }
    fetching = Clock::now();
    // (Chunks staged early are among those EarlyParts holds.)
    if (m && m->direct && !prefetch && threads > 1) {
      prefetch.emplace(r_.store_, a, *m, opt_.auth, i, std::min(threads, 4),
                       early ? early->Held(*m) : std::vector<bool>());
    }
    if (early && m) {
      if (auto got = early->Take(*m, i)) {
        ++result_.chunks_read_early;
        REFIT_RETURN_IF_ERROR(stage(i, got->object, got->bytes, got->chunk.header));
        ++i;
        continue;
      }
    }
    if (prefetch) {
      if (auto ahead = prefetch->Take(i)) {
        REFIT_RETURN_IF_ERROR(stage(i, ahead->object, ahead->bytes, ahead->chunk.header));
        ++i;
        continue;
      }
    }
    const uint64_t since = r_.store_->ChangeCount();
    auto got = reader.Get(i, m ? &*m : nullptr);
    // A malformed pack is checked as an empty object: it fails the chunk's
    // checks, and is read again like any chunk that does.
    if (!got.ok() && got.status().code() == StatusCode::kDataLoss) got = std::vector<uint8_t>();
    if (got.ok()) {
      std::span<const uint8_t> bytes;
      auto c = CheckChunk(*got,
                          ChunkSpec{&a, i, m ? &*m : nullptr, /*resend=*/false},
                          opt_.auth, &bytes);
      if (!c.ok()) {
        result_.bytes_fetched += got->size();
        result_.stages.fetch += SecondsSince(fetching);
        if (!FailsItsChecks(c.status())) return c.status();
        // Read it again: damaged bytes in transit differ from read to
        // read; a damaged stored object is the version's fault.
        if (++bad_reads >= kPersistentBadReads) {
          *version_fault = true;
          return c.status();
        }
        REFIT_RETURN_IF_ERROR(
            r_.Pause("chunk " + std::to_string(i) + " of version " + V));
        continue;
      }
      if (i == 0 && early) {
        // The version has chunks of its own: one publisher's, not the
        // ranks' (whose parts an assembling coordinator may keep in this
        // store). What was read or staged from the parts is not its.
        early.reset();
        if (!staged_early.empty()) REFIT_RETURN_IF_ERROR(restart());
      }
      REFIT_RETURN_IF_ERROR(stage(i, *got, bytes, c->header));
      ++i;
      continue;
    }
    if (got.status().code() != StatusCode::kNotFound) return got.status();
    if (m) {
      return DataLossError("the manifest of version " + V + " lists chunk " +
                           std::to_string(i) +
                           " but the store does not hold it");
    }
    REFIT_RETURN_IF_ERROR(read_manifest());
    if (!m && i == 0 && opt_.early_part_bytes > 0) {
      if (!early) {
        early.emplace(r_.store_, a, opt_.auth, std::clamp(threads, 2, 4),
                      opt_.early_part_bytes);
      }
      // Objects appearing are progress: the ranks are uploading.
      REFIT_ASSIGN_OR_RETURN(const size_t found, early->Scan());
      if (found > 0) last_progress = Clock::now();
      for (EarlyParts::Ready& r : stage_early ? early->TakeReady()
                                              : std::vector<EarlyParts::Ready>()) {
        // A chunk the target refuses before the manifest says whether it is
        // the version's: staging early stops, and the chunk is read and
        // staged (or refused, the version's fault) after the manifest.
        const Clock::time_point adding = Clock::now();
        const bool added = opt_.staged->Add(k, a.tensors, r.chunk.bytes).ok();
        result_.stages.apply_cpu += SecondsSince(adding);
        if (!added) {
          REFIT_RETURN_IF_ERROR(restart());
          stage_early = false;
          break;
        }
        result_.bytes_fetched += r.chunk.object.size();
        result_.changed_elements += r.chunk.chunk.header.changed;
        r.chunk.chunk.payload = {};
        staged_early.emplace(std::pair(r.rank, r.k),
                             Early{r.chunk.object.size(), r.sha, std::move(r.chunk.chunk)});
      }
    }
    result_.stages.fetch += SecondsSince(fetching);
    if (m) continue;
    if (++polls % 8 == 0) {
      REFIT_ASSIGN_OR_RETURN(auto d, r_.ReadDecision(a.version));
      if (d && !d->commit) {
        result_.outcome = StepResult::Outcome::kAborted;
        return std::optional<StepResult>(result_);
      }
    }
    if (ElapsedMs(last_progress) > opt_.chunk_timeout_ms) {
      return DeadlineExceededError(
          "version " + V + ": neither chunk " + std::to_string(i) +
          " nor the manifest arrived within " +
          std::to_string(opt_.chunk_timeout_ms) +
          " ms; its publisher may have stopped; nothing was written");
    }
    const Clock::time_point waiting = Clock::now();
    REFIT_RETURN_IF_ERROR(
        r_.Pause("chunk " + std::to_string(i) + " of version " + V, since));
    result_.stages.chunk_wait += SecondsSince(waiting);
  }
  prefetch.reset();
  early.reset();
  if (k + 1 == out_.chain.size())
    result_.tail_seconds = SecondsSince(*manifest_seen);
  manifests_[k] = std::move(*m);
  return std::optional<StepResult>();
}

Result<StepResult> StagedPrepare::Chain(bool vote, bool* version_fault) {
  const auto t0 = Clock::now();
  const std::vector<Announcement>& chain = out_.chain;
  const uint64_t v = chain.back().version;
  result_.version = v;
  result_.versions_folded = chain.size();
  StagedTarget& target = *opt_.staged;
  REFIT_RETURN_IF_ERROR(target.Begin());
  const Clock::time_point checking = Clock::now();
  REFIT_RETURN_IF_ERROR(CheckBase(version_fault));
  result_.stages.base_check = SecondsSince(checking);
  manifests_.resize(chain.size());
  for (size_t k = 0; k < chain.size(); ++k) {
    if (k > 0) {
      const auto& prev = manifests_[k - 1].tensors;
      bool lined_up = prev.size() == chain[k].tensors.size();
      for (size_t t = 0; lined_up && t < prev.size(); ++t) {
        lined_up = SameTensor(prev[t], chain[k].tensors[t]) &&
                   prev[t].after == chain[k].tensors[t].before;
      }
      if (!lined_up) {
        return DataLossError("version " + std::to_string(chain[k].version) +
                             " does not build on version " +
                             std::to_string(chain[k - 1].version) +
                             " as its manifest records it");
      }
      REFIT_RETURN_IF_ERROR(target.Check(chain[k].tensors));
    }
    REFIT_ASSIGN_OR_RETURN(auto aborted, StageVersion(k, version_fault));
    if (aborted) {
      REFIT_RETURN_IF_ERROR(target.Begin());
      aborted->seconds = SecondsSince(t0);
      return std::move(*aborted);
    }
  }
  const Clock::time_point sealing = Clock::now();
  const Status sealed =
      vote && manifests_.back().direct ? target.SealDirect() : target.Seal();
  result_.seal_seconds = SecondsSince(sealing);
  if (!sealed.ok()) {
    *version_fault = sealed.code() == StatusCode::kResourceExhausted ||
                     sealed.code() == StatusCode::kUnimplemented;
    return sealed;
  }
  const StagingUsage usage = target.usage();
  result_.staged_host_bytes = usage.host_bytes;
  result_.staged_device_bytes = usage.device_bytes;
  if (vote) {
    Vote ready{true, "", {}};
    if (manifests_.back().direct) {
      // The hashes every member votes on a direct version, computed from
      // the held tensors and the staged chunks without writing (a chunk
      // that does not reach its "after" is the version's fault).
      const Clock::time_point hashing = Clock::now();
      auto after = target.HashesAfter(chain.back().tensors);
      result_.after_hash_seconds = SecondsSince(hashing);
      if (!after.ok()) {
        *version_fault = FailsItsChecks(after.status()) ||
                         after.status().code() == StatusCode::kUnimplemented;
        return after.status();
      }
      ready.tensors = std::move(*after);
    }
    const Clock::time_point voting = Clock::now();
    REFIT_RETURN_IF_ERROR(
        r_.store_->Put(VoteKey(v, opt_.member), opt_.auth.SealMember(EncodeVote(ready))));
    result_.stages.vote = SecondsSince(voting);
    const Clock::time_point waiting = Clock::now();
    std::optional<Decision> decision;
    REFIT_RETURN_IF_ERROR(r_.AwaitDecision(
        v, &decision, "ready for",
        "nothing was written and the next step prepares it again"));
    result_.stages.decision_wait = SecondsSince(waiting);
    if (!decision->commit) {
      REFIT_RETURN_IF_ERROR(target.Begin());
      result_.outcome = StepResult::Outcome::kAborted;
      result_.seconds = SecondsSince(t0);
      return result_;
    }
  }
  out_.outcome =
      vote ? StepResult::Outcome::kCommitted : StepResult::Outcome::kCaughtUp;
  std::vector<bool> touched(chain.front().tensors.size(), false);
  for (const Manifest& m : manifests_) {
    for (const ManifestChunk& c : m.chunks) {
      if (c.changed > 0 && c.tensor_id < touched.size())
        touched[c.tensor_id] = true;
    }
  }
  for (size_t t = 0; t < touched.size(); ++t) {
    if (touched[t])
      result_.changed_tensors.push_back(chain.front().tensors[t].name);
  }
  result_.outcome = StepResult::Outcome::kPrepared;
  result_.seconds = SecondsSince(t0);
  out_.result = result_;
  return result_;
}

Result<StepResult> StagedPrepare::Snapshot(uint64_t version) {
  const auto t0 = Clock::now();
  const std::string V = std::to_string(version);
  result_.version = version;
  REFIT_ASSIGN_OR_RETURN(auto index_bytes,
                         r_.store_->Get(SnapshotIndexKey(version)));
  result_.bytes_fetched += index_bytes.size();
  REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(index_bytes));
  REFIT_ASSIGN_OR_RETURN(SnapshotIndex index, DecodeSnapshotIndex(body));
  if (index.version != version)
    return DataLossError("snapshot index names another version");
  REFIT_RETURN_IF_ERROR(opt_.staged->Check(index.tensors));
  std::vector<std::optional<std::span<const uint8_t>>> found(
      index.tensors.size());
  std::vector<std::vector<uint8_t>> files;
  for (size_t i = 0; i < index.files.size(); ++i) {
    const SnapshotFile& f = index.files[i];
    REFIT_ASSIGN_OR_RETURN(auto bytes,
                           r_.store_->Get(SnapshotFileKey(version, i)));
    result_.bytes_fetched += bytes.size();
    if (bytes.size() != f.size || ComputeSha256(bytes) != f.sha256) {
      return DataLossError("snapshot " + V + " file '" + f.name +
                           "' does not match its SHA-256 in the index");
    }
    files.push_back(std::move(bytes));
  }
  std::unordered_multimap<std::string_view, size_t> by_name;
  by_name.reserve(index.tensors.size());
  for (size_t t = 0; t < index.tensors.size(); ++t) by_name.emplace(index.tensors[t].name, t);
  for (const std::vector<uint8_t>& file : files) {
    REFIT_ASSIGN_OR_RETURN(SafetensorsHeader h,
                           ParseSafetensorsHeader(file, file.size()));
    for (const SafetensorsTensor& st : h.tensors) {
      auto [first, last] = by_name.equal_range(st.name);
      for (auto it = first; it != last; ++it) {
        found[it->second] = std::span<const uint8_t>(file).subspan(st.offset, st.byte_size);
      }
    }
  }
  for (size_t t = 0; t < index.tensors.size(); ++t) {
    const TensorEntry& e = index.tensors[t];
    if (!found[t] ||
        found[t]->size() != e.num_elements * static_cast<uint64_t>(e.width) ||
        RangeHash(found[t]->data(), found[t]->size()) != e.after) {
      return DataLossError("tensor '" + e.name + "' of snapshot " + V +
                           " is missing or does not hash to the index");
    }
    out_.snapshot_bytes.emplace_back(found[t]->begin(), found[t]->end());
  }
  out_.snapshot_tensors = std::move(index.tensors);
  out_.outcome = StepResult::Outcome::kSnapshot;
  result_.outcome = StepResult::Outcome::kPrepared;
  for (const TensorEntry& e : out_.snapshot_tensors)
    result_.changed_tensors.push_back(e.name);
  result_.seconds = SecondsSince(t0);
  out_.result = result_;
  return result_;
}

}  // namespace refit::internal

namespace refit {

Result<StepResult> Receiver::PrepareChain(
    const std::vector<Announcement>& chain, bool vote) {
  auto p = std::make_unique<internal::PreparedVersions>();
  p->chain = chain;
  bool fault = false;
  Result<StepResult> step =
      internal::StagedPrepare(this, p.get()).Chain(vote, &fault);
  if (!step.ok()) {
    (void)opt_.staged->Begin();  // drops what was staged
    if (vote && fault) {
      REFIT_RETURN_IF_ERROR(PutFailedVote(chain.back().version, step.status()));
      return VotedFailed(chain.back().version, step.status(),
                         "nothing was written");
    }
    return step;
  }
  if (step->outcome == StepResult::Outcome::kPrepared) prepared_ = std::move(p);
  return step;
}

Result<StepResult> Receiver::PrepareSnapshot(uint64_t version) {
  auto p = std::make_unique<internal::PreparedVersions>();
  REFIT_ASSIGN_OR_RETURN(
      StepResult step,
      internal::StagedPrepare(this, p.get()).Snapshot(version));
  prepared_ = std::move(p);
  return step;
}

Result<StepResult> Receiver::Prepare(uint64_t fold_limit) {
  if (!opt_.staged) {
    return FailedPreconditionError("receiver '" + opt_.member +
                                   "' is not a two-phase receiver; use Step()");
  }
  if (prepared_) return prepared_->result;
  failed_vote_.reset();
  reread_pending_ = false;
  return Next(fold_limit);
}

Result<StepResult> Receiver::ActivatePrepared() {
  if (!prepared_) {
    return FailedPreconditionError(
        "receiver '" + opt_.member +
        "' has nothing prepared to activate; call Prepare() first");
  }
  std::unique_ptr<internal::PreparedVersions> p = std::move(prepared_);
  StepResult result = p->result;
  const std::string stays = "; receiver '" + opt_.member +
                            "' stays at version " + std::to_string(active_);
  const auto t0 = std::chrono::steady_clock::now();
  if (p->outcome == StepResult::Outcome::kSnapshot) {
    for (size_t t = 0; t < p->snapshot_tensors.size(); ++t) {
      Status s =
          opt_.staged->Load(p->snapshot_tensors[t], p->snapshot_bytes[t]);
      if (!s.ok()) {
        return DataLossError(
            s.ToString() + "; loading snapshot " +
            std::to_string(result.version) +
            " stopped midway: the tensors hold parts of both versions; "
            "load them again");
      }
    }
  } else {
    auto applied = opt_.staged->Apply();
    if (!applied.ok()) {
      return Status(applied.status().code(),
                    std::string(applied.status().message()) + stays);
    }
    result.chunks_applied = applied->chunks;
    result.pause_kernel_ms = applied->kernel_ms;
    result.pause_verify_ms = applied->verify_ms;
    chunks_applied_total_ += applied->chunks;
  }
  result.pause_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  REFIT_RETURN_IF_ERROR(Activate(result.version));
  result.seconds += result.pause_seconds;
  result.outcome = p->outcome;
  return result;
}

}  // namespace refit
