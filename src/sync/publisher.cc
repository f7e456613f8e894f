#include "sync/publisher.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <unordered_map>
#include <thread>

#include "base/bytes.h"
#include "base/file.h"
#include "base/hash.h"
#include "codec/payload.h"
#include "delta/chunk.h"
#include "delta/encoder.h"
#include "sync/chunk_pack.h"
#include "sync/keys.h"
#include "sync/resend.h"
#include "sync/supersede.h"
#include "sync/votes.h"
#include "transport/once_uploader.h"

namespace refit {

std::string_view DeadlinePolicyName(DeadlinePolicy policy) {
  return policy == DeadlinePolicy::kDrop ? "drop" : "abort";
}

Result<DeadlinePolicy> ParseDeadlinePolicy(std::string_view name) {
  for (DeadlinePolicy p : {DeadlinePolicy::kAbort, DeadlinePolicy::kDrop}) {
    if (name == DeadlinePolicyName(p)) return p;
  }
  return InvalidArgumentError("policy must be 'abort' or 'drop', not '" +
                              std::string(name) + "'");
}
namespace {

using Clock = std::chrono::steady_clock;

int ElapsedMs(Clock::time_point since) {
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

double SecondsSince(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Objects of an announced version never change: receivers apply chunks
// before the manifest exists, so a chunk once stored is final (PutOnce).
constexpr char kVersionConflict[] =
    "this version was started with other tensors, another baseline or another "
    "membership; publish them as a higher version (it aborts this one)";

Status PutOnce(ObjectStore* store, const std::string& key, std::span<const uint8_t> bytes) {
  return refit::PutOnce(store, key, bytes, kVersionConflict);
}

// Seals each chunk and uploads it on a small pool while the encoder goes
// on (OnceUploader: bounded, so encoding never runs far ahead of the
// link); records the manifest entries. Sealing and the SHA-256 of each
// sealed chunk (two passes over its bytes) run on the upload threads, not
// on the encoder's ordered AddChunk, which is one thread for all encoder
// threads. With pack_bytes, small chunks are sealed in AddChunk and
// gathered into packs (sync/chunk_pack.h) before they are uploaded.
class StoreSink : public ChunkSink {
 public:
  StoreSink(ObjectStore* store, const Authenticator& auth, uint64_t version,
            int threads, uint64_t pack_bytes)
      : auth_(auth),
        version_(version),
        pack_bytes_(pack_bytes),
        uploader_(store, threads, kVersionConflict) {}

  Status AddChunk(std::span<const uint8_t> chunk, const ChunkHeader& h) override {
    ManifestChunk mc;
    mc.tensor_id = h.tensor_id;
    mc.start = h.start;
    mc.count = h.count;
    mc.changed = h.changed;
    mc.kind = static_cast<uint8_t>(h.kind);
    const Clock::time_point t0 = Clock::now();
    if (chunk.size() < pack_bytes_) {
      // A small chunk: sealed here, in order, to be gathered into a pack.
      std::vector<uint8_t> sealed = auth_.Seal(chunk);
      mc.size = sealed.size();
      mc.sha256 = ComputeSha256(sealed);
      size_t index;
      {
        std::lock_guard<std::mutex> lock(mu_);
        index = chunks_.size();
      }
      if (sealed.size() < pack_bytes_) {
        if (!pack_.empty() &&
            (pack_size_ + sealed.size() > pack_bytes_ || pack_.size() >= kMaxPackChunks)) {
          REFIT_RETURN_IF_ERROR(FlushPack());
        }
        if (pack_.empty()) pack_first_ = index;
        mc.pack_offset = pack_.size();
        pack_size_ += sealed.size();
        pack_.push_back(std::move(sealed));
      } else {
        REFIT_RETURN_IF_ERROR(FlushPack());
        REFIT_RETURN_IF_ERROR(uploader_.Add(ChunkKey(version_, index), std::move(sealed)));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        chunks_.push_back(mc);
      }
      blocked_seconds_ += SecondsSince(t0);
      return Status();
    }
    REFIT_RETURN_IF_ERROR(FlushPack());
    size_t index;
    {
      std::lock_guard<std::mutex> lock(mu_);
      index = chunks_.size();
      chunks_.push_back(mc);  // size and sha256 once sealed
    }
    REFIT_RETURN_IF_ERROR(uploader_.Add(
        ChunkKey(version_, index), std::vector<uint8_t>(chunk.begin(), chunk.end()),
        [this, index](std::vector<uint8_t>* bytes) {
          *bytes = auth_.Seal(*bytes);
          const Sha256 sha = ComputeSha256(*bytes);
          std::lock_guard<std::mutex> lock(mu_);
          chunks_[index].size = bytes->size();
          chunks_[index].sha256 = sha;
        }));
    blocked_seconds_ += SecondsSince(t0);
    return Status();
  }

  Status Finish(const std::vector<TensorEntry>& tensors) override {
    tensors_ = tensors;
    const Clock::time_point t0 = Clock::now();
    Status s = FlushPack();
    if (s.ok()) s = uploader_.Finish();
    finish_seconds_ = SecondsSince(t0);
    return s;
  }

  // Complete once Finish returned OK.
  std::vector<ManifestChunk> chunks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return chunks_;
  }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  uint64_t bytes() const { return uploader_.bytes(); }
  // Seconds AddChunk waited for room in the upload queue, and Finish for
  // the last uploads.
  double blocked_seconds() const { return blocked_seconds_; }
  double finish_seconds() const { return finish_seconds_; }

 private:
  // One chunk gathered is stored as itself (its pack_offset is 0 either
  // way); more as a pack at the first one's key.
  Status FlushPack() {
    if (pack_.empty()) return Status();
    std::vector<uint8_t> object = pack_.size() == 1 ? std::move(pack_.front()) : EncodePack(pack_);
    pack_.clear();
    pack_size_ = 0;
    return uploader_.Add(ChunkKey(version_, pack_first_), std::move(object));
  }

  const Authenticator& auth_;
  uint64_t version_;
  uint64_t pack_bytes_;
  mutable std::mutex mu_;  // chunks_, which the upload threads complete
  std::vector<ManifestChunk> chunks_;
  OnceUploader uploader_;  // after chunks_ and mu_: its threads use them
  std::vector<TensorEntry> tensors_;
  std::vector<std::vector<uint8_t>> pack_;  // sealed chunks gathered, from pack_first_
  uint64_t pack_first_ = 0, pack_size_ = 0;
  double blocked_seconds_ = 0, finish_seconds_ = 0;
};

Status ValidateMembers(const std::vector<std::string>& members) {
  if (members.empty()) return InvalidArgumentError("a publisher needs at least one member");
  std::set<std::string> unique;
  for (const auto& m : members) {
    REFIT_RETURN_IF_ERROR(ValidateMember(m));
    if (!unique.insert(m).second) return InvalidArgumentError("member '" + m + "' listed twice");
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<Publisher>> Publisher::Open(ObjectStore* store,
                                                   const std::string& baseline,
                                                   PublisherOptions options) {
  REFIT_RETURN_IF_ERROR(ValidateMembers(options.members));
  FileBaselineOptions file_options;
  file_options.full_check_every = options.full_baseline_check_every;
  file_options.threads = options.diff.threads;
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<FileBaseline> file,
                         FileBaseline::Open(baseline, file_options));
  return Open(store, std::move(file), std::move(options));
}

Result<std::unique_ptr<Publisher>> Publisher::Open(ObjectStore* store,
                                                   std::unique_ptr<PublisherBaseline> baseline,
                                                   PublisherOptions options) {
  REFIT_RETURN_IF_ERROR(ValidateMembers(options.members));
  if (options.diff.allow_conditional && baseline->targets_on_device()) {
    return InvalidArgumentError(
        "conditional XOR chunks (kind 5) are encoded on the CPU only; a publisher "
        "whose baseline is in device memory cannot publish them (leave the "
        "conditional option off)");
  }
  std::unique_ptr<Publisher> p(new Publisher(store, std::move(options)));
  p->baseline_ = std::move(baseline);
  // Announcements carry the base's tensor hashes: hash the baseline once
  // here; commits keep them current from the manifests' after hashes.
  for (size_t i = 0; i < p->baseline_->tensors().size(); ++i) {
    REFIT_ASSIGN_OR_RETURN(Hash128 h, p->baseline_->HashTensor(i));
    p->baseline_hashes_.push_back(h);
    p->baseline_index_[p->baseline_->tensors()[i].name] = i;
  }
  auto head = store->Get(kHeadKey);
  if (head.ok()) {
    REFIT_ASSIGN_OR_RETURN(auto body, p->opt_.auth.Open(*head));
    REFIT_ASSIGN_OR_RETURN(p->committed_, DecodeHead(body));
  } else if (head.status().code() == StatusCode::kNotFound) {
    // The snapshot goes first: a publisher that dies in between finds no
    // head and starts the store over.
    if (p->opt_.snapshot_every > 0) REFIT_RETURN_IF_ERROR(p->WriteSnapshot(0));
    REFIT_RETURN_IF_ERROR(store->Put(kHeadKey, p->opt_.auth.Seal(EncodeHead(0))));
  } else {
    return head.status();
  }
  return p;
}

Result<PublishReport> Publisher::PublishCheckpoint(uint64_t version,
                                                   const std::string& target_path) {
  REFIT_ASSIGN_OR_RETURN(Checkpoint target,
                         Checkpoint::Open(target_path, Checkpoint::Mode::kReadOnly));
  return Publish(version, CheckpointViews(target));
}

Status Publisher::ServeRequests(uint64_t version, const std::vector<TensorEntry>& tensors,
                                const std::vector<TensorView>* target, uint64_t* served) {
  return ServeResends(
      store_, opt_.auth, version, &served_requests_,
      [&](uint64_t i, bool after) -> Result<std::optional<std::vector<uint8_t>>> {
        using Served = std::optional<std::vector<uint8_t>>;
        // The chunk names its range; chunks are final once stored, so this
        // works before the manifest exists (a version being aborted).
        auto object = FindChunkObject(store_, version, i, nullptr);
        if (!object.ok()) {
          // A damaged pack names no chunk either (below).
          const StatusCode code = object.status().code();
          if (code == StatusCode::kNotFound || code == StatusCode::kDataLoss) {
            return Served();
          }
          return object.status();
        }
        // A chunk object changed in the store names no range this publisher
        // can trust: nothing is served for it (the receiver's wait ends in
        // its deadline), and the coordinator goes on.
        auto chunk_body = opt_.auth.Open(*object);
        if (!chunk_body.ok()) return Served();
        auto parsed = ParseChunk(*chunk_body);
        if (!parsed.ok()) return Served();
        const ParsedChunk& original = *parsed;
        const ChunkHeader& h = original.header;
        if (h.tensor_id >= tensors.size() || h.version != version) return Served();
        const TensorEntry& e = tensors[h.tensor_id];
        if (h.width != e.width || h.start + h.count > e.num_elements) return Served();
        // The desired bytes: before a decision the target holds V and the
        // baseline the base; after it the baseline holds whichever won.
        const uint64_t offset = h.start * e.width, length = h.count * e.width;
        std::vector<uint8_t> desired(length);
        bool found = false;
        if (target && after) {
          for (const TensorView& v : *target) {
            if (v.name != e.name) continue;
            REFIT_RETURN_IF_ERROR(baseline_->ReadTarget(v, offset, length, desired.data()));
            found = true;
          }
        } else if (auto b = baseline_index_.find(e.name); b != baseline_index_.end()) {
          REFIT_RETURN_IF_ERROR(baseline_->Read(b->second, offset, length, desired.data()));
          found = true;
        }
        if (!found) return Served();
        REFIT_ASSIGN_OR_RETURN(auto resend, MakeResend(original, desired.data(), after));
        return Served(std::move(resend));
      },
      served);
}

Result<std::optional<std::vector<TensorEntry>>> Publisher::VersionTensors(uint64_t version) {
  auto bytes = store_->Get(ManifestKey(version));
  if (bytes.ok()) {
    REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*bytes));
    REFIT_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(body));
    if (m.version != version) return DataLossError("manifest names another version");
    return std::optional<std::vector<TensorEntry>>(std::move(m.tensors));
  }
  if (bytes.status().code() != StatusCode::kNotFound) return bytes.status();
  // Version 0 has no manifest; a snapshot records its hashes when the
  // store keeps snapshots.
  bytes = store_->Get(SnapshotIndexKey(version));
  if (bytes.ok()) {
    REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*bytes));
    REFIT_ASSIGN_OR_RETURN(SnapshotIndex index, DecodeSnapshotIndex(body));
    if (index.version != version) return DataLossError("snapshot index names another version");
    return std::optional<std::vector<TensorEntry>>(std::move(index.tensors));
  }
  if (bytes.status().code() != StatusCode::kNotFound) return bytes.status();
  return std::optional<std::vector<TensorEntry>>();
}

Status Publisher::CheckBaseline() {
  REFIT_ASSIGN_OR_RETURN(auto head, VersionTensors(committed_));
  if (!head) return Status();  // nothing records the head's hashes
  std::unordered_map<std::string_view, const TensorEntry*> by_name;
  by_name.reserve(head->size());
  for (const TensorEntry& e : *head) by_name.emplace(e.name, &e);
  for (size_t i = 0; i < baseline_->tensors().size(); ++i) {
    const std::string& name = baseline_->tensors()[i].name;
    auto it = by_name.find(name);
    if (it == by_name.end() || it->second->after != baseline_hashes_[i] ||
        head->size() != baseline_->tensors().size()) {
      return FailedPreconditionError(
          baseline_->Describe() + " is not the store's head version " +
          std::to_string(committed_) + ": tensor '" + name + "' " +
          (it == by_name.end() ? "is not in" : "does not hash to") + " version " +
          std::to_string(committed_) + "'s manifest; receivers hold version " +
          std::to_string(committed_) + ", so a diff from this baseline cannot apply. Give "
          "the publisher a copy of version " + std::to_string(committed_) +
          " (the baseline of the publisher that committed it)");
    }
  }
  return Status();
}

Status Publisher::CheckPublished(uint64_t version, const std::vector<TensorView>& target) {
  auto bytes = store_->Get(ManifestKey(version));
  if (!bytes.ok()) {
    if (bytes.status().code() != StatusCode::kNotFound) return bytes.status();
    return NotFoundError("version " + std::to_string(version) +
                         " has no manifest (it was never completely published); the store's "
                         "head is version " + std::to_string(committed_) +
                         ": publish these weights as version " +
                         std::to_string(committed_ + 1) + " or higher");
  }
  REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*bytes));
  REFIT_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(body));
  return TargetMatches(m, target);
}

Status Publisher::TargetMatches(const Manifest& m, const std::vector<TensorView>& target) {
  auto refuse = [&](const std::string& what) {
    return FailedPreconditionError(
        "version " + std::to_string(m.version) + " was published with other weights (" + what +
        "); a version number is used once. The store's head is version " +
        std::to_string(committed_) + ": publish these weights as version " +
        std::to_string(std::max(committed_, m.version) + 1) + " or higher");
  };
  if (target.size() != m.tensors.size()) {
    return refuse("it has " + std::to_string(m.tensors.size()) + " tensors, the target " +
                  std::to_string(target.size()));
  }
  std::unordered_map<std::string_view, const TensorView*> by_name;
  by_name.reserve(target.size());
  for (const TensorView& v : target) by_name.emplace(v.name, &v);
  for (const TensorEntry& e : m.tensors) {
    auto found = by_name.find(e.name);
    if (found == by_name.end()) return refuse("the target lacks tensor '" + e.name + "'");
    const TensorView* it = found->second;
    if (it->dtype != e.dtype || it->width != e.width || it->shape != e.shape) {
      return refuse("tensor '" + e.name + "' differs from its manifest");
    }
    REFIT_ASSIGN_OR_RETURN(Hash128 h, baseline_->HashTarget(*it));
    if (h != e.after) return refuse("tensor '" + e.name + "' differs from its manifest");
  }
  return Status();
}

Status Publisher::Serve(uint64_t version, int ms) {
  // The announcement's tensor table serves versions that never got a
  // manifest (their publisher died; they are aborted) as well.
  REFIT_ASSIGN_OR_RETURN(auto bytes, store_->Get(IndexKey(version)));
  REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(bytes));
  REFIT_ASSIGN_OR_RETURN(Announcement a, DecodeAnnouncement(body));
  auto start = Clock::now();
  uint64_t served = 0;
  do {
    const uint64_t since = store_->ChangeCount();
    REFIT_RETURN_IF_ERROR(ServeRequests(version, a.tensors, nullptr, &served));
    store_->AwaitChange(
        since, std::min(opt_.poll_ms, std::max(0, ms - ElapsedMs(start))));
  } while (ElapsedMs(start) < ms);
  return Status();
}

Status Publisher::AdvanceBaseline(const Manifest& m, const std::vector<TensorView>& target) {
  return baseline_->Advance(m, target);
}

Status Publisher::WriteSnapshot(uint64_t version) {
  SnapshotIndex index;
  index.version = version;
  REFIT_RETURN_IF_ERROR(baseline_->ForEachSnapshotFile(
      [&](const std::string& name, std::span<const uint8_t> bytes) -> Status {
        const size_t i = index.files.size();
        index.files.push_back(SnapshotFile{name, bytes.size(), ComputeSha256(bytes)});
        return store_->Put(SnapshotFileKey(version, i), bytes);
      }));
  const auto& views = baseline_->tensors();
  for (size_t t = 0; t < views.size(); ++t) {
    const TensorView& v = views[t];
    TensorEntry e;
    e.name = v.name;
    e.dtype = v.dtype;
    e.width = static_cast<uint8_t>(v.width);
    e.shape = v.shape;
    e.num_elements = v.width > 0 ? TensorBytes(v) / static_cast<uint64_t>(v.width) : 0;
    // Kept current by Open and every commit (Advance checked them).
    e.before = e.after = baseline_hashes_[t];
    index.tensors.push_back(std::move(e));
  }
  return store_->Put(SnapshotIndexKey(version), opt_.auth.Seal(EncodeSnapshotIndex(index)));
}

Status Publisher::DeletePrefix(const std::string& prefix) {
  REFIT_ASSIGN_OR_RETURN(auto objects, store_->List(prefix));
  for (const ObjectInfo& o : objects) REFIT_RETURN_IF_ERROR(store_->Delete(o.key));
  return Status();
}

Status Publisher::Retain(PublishReport* report) {
  REFIT_ASSIGN_OR_RETURN(auto objects, store_->List(kSnapshotsPrefix));
  std::vector<uint64_t> snaps;  // sorted: keys sort by version
  for (const ObjectInfo& o : objects) {
    auto v = ParseSnapshotIndexKey(o.key);
    if (v && *v <= committed_) snaps.push_back(*v);
  }
  // Without a snapshot a deleted version could never be caught up with.
  if (snaps.empty()) return Status();
  const uint64_t newest = snaps.back();
  REFIT_ASSIGN_OR_RETURN(auto indexes, store_->List(kIndexPrefix));
  const std::vector<uint64_t> versions = VersionsOf(indexes);
  if (versions.size() > opt_.keep_versions) {
    const uint64_t keep_from = versions[versions.size() - opt_.keep_versions];
    for (uint64_t w : versions) {
      // Versions above the newest snapshot are how receivers get from it to
      // head; undecided ones may still be voted on.
      if (w >= keep_from || w > newest) break;
      auto d = store_->Get(DecisionKey(w));
      if (!d.ok()) {
        if (d.status().code() == StatusCode::kNotFound) continue;
        return d.status();
      }
      // The marker goes first, so receivers stop considering the version
      // before its objects disappear.
      REFIT_RETURN_IF_ERROR(store_->Delete(IndexKey(w)));
      REFIT_RETURN_IF_ERROR(DeletePrefix(VersionPrefix(w)));
      ++report->versions_deleted;
    }
  }
  for (size_t i = 0; i + 2 < snaps.size(); ++i) {
    REFIT_RETURN_IF_ERROR(store_->Delete(SnapshotIndexKey(snaps[i])));
    REFIT_RETURN_IF_ERROR(DeletePrefix(SnapshotPrefix(snaps[i])));
    ++report->snapshots_deleted;
  }
  return Status();
}

Status Publisher::AbortSuperseded(uint64_t version) {
  return refit::AbortSuperseded(store_, opt_.auth, committed_, version, "publisher");
}

// Votes, with re-sends served while they come in, then the one decision
// (docs/protocol.md, "Publisher", steps 5-6): the one written, or the one
// another coordinator wrote first.
Result<Decision> Publisher::VoteAndDecide(uint64_t version, const Manifest& m,
                                          const std::vector<TensorView>& target,
                                          PublishReport* report) {
  REFIT_ASSIGN_OR_RETURN(
      CollectedVotes collected,
      CollectVotes(store_, opt_.auth, version, opt_.members,
                   VoteWait{opt_.vote_timeout_ms, opt_.poll_ms}, [&]() {
                     return ServeRequests(version, m.tensors, &target, &report->resends_served);
                   }));
  const std::map<std::string, Vote>& votes = collected.votes;
  report->stages.vote_wait = collected.seconds;
  const Clock::time_point decided = Clock::now();
  Decision d;
  d.version = version;
  std::vector<std::string> missing, failed;
  for (const std::string& member : opt_.members) {
    auto it = votes.find(member);
    if (it == votes.end()) {
      missing.push_back(member);
    } else if (!it->second.ready) {
      failed.push_back(member + ": " + it->second.message);
    }
  }
  if (missing.empty() && failed.empty()) {
    d.commit = true;
  } else if (opt_.policy == DeadlinePolicy::kDrop && failed.empty() &&
             missing.size() < opt_.members.size()) {
    d.commit = true;
    d.dropped = missing;
    d.reason = "dropped after the vote deadline: " + std::to_string(missing.size()) +
               " member(s)";
  } else {
    d.commit = false;
    d.reason = !failed.empty() ? "member failed: " + failed.front()
                               : "no vote from " + std::to_string(missing.size()) +
                                     " member(s) by the deadline, first '" +
                                     missing.front() + "'";
  }
  REFIT_ASSIGN_OR_RETURN(d, WriteDecision(store_, opt_.auth, d));
  report->stages.decision = SecondsSince(decided);
  return d;
}

Result<PublishReport> Publisher::Publish(uint64_t version,
                                         const std::vector<TensorView>& target) {
  auto t0 = Clock::now();
  PublishReport report;
  report.version = version;
  report.base_version = committed_;
  if (version <= committed_) {
    return InvalidArgumentError("version " + std::to_string(version) +
                                " is not above the committed version " +
                                std::to_string(committed_));
  }
  Manifest m;
  m.version = version;
  m.base_version = committed_;
  m.members = opt_.members;

  // A decision from an earlier incarnation is final.
  std::optional<Decision> decision;
  if (auto d = store_->Get(DecisionKey(version)); d.ok()) {
    REFIT_ASSIGN_OR_RETURN(auto body, opt_.auth.Open(*d));
    REFIT_ASSIGN_OR_RETURN(Decision dd, DecodeDecision(body));
    decision = dd;
    REFIT_ASSIGN_OR_RETURN(auto mb, store_->Get(ManifestKey(version)));
    REFIT_ASSIGN_OR_RETURN(auto mbody, opt_.auth.Open(mb));
    REFIT_ASSIGN_OR_RETURN(m, DecodeManifest(mbody));
    // Following the decision is resuming only for the tensors it decided.
    REFIT_RETURN_IF_ERROR(TargetMatches(m, target));
  } else if (d.status().code() != StatusCode::kNotFound) {
    return d.status();
  }

  if (!decision) {
    // Before anything is written: the announcement carries the baseline's
    // hashes as the base every receiver must hold.
    REFIT_RETURN_IF_ERROR(CheckBaseline());
    // Versions started before this one and never decided (their publisher
    // died) can no longer commit: their base is not this version's base's
    // successor chain. Abort them, so receivers inside one roll back.
    REFIT_RETURN_IF_ERROR(AbortSuperseded(version));
    const std::vector<TensorView>& base_views = baseline_->tensors();
    // The announcement first (docs/protocol.md, "Publisher"): receivers
    // start applying chunks as they land instead of after the manifest.
    Announcement a;
    a.version = version;
    a.base_version = committed_;
    a.members = opt_.members;
    {
      std::vector<size_t> base_order, target_order;
      REFIT_ASSIGN_OR_RETURN(a.tensors,
                             MatchTensors(base_views, target, &base_order, &target_order));
      for (size_t t = 0; t < a.tensors.size(); ++t) {
        a.tensors[t].before = baseline_hashes_[base_order[t]];
        a.tensors[t].after = Hash128{};
      }
    }
    std::vector<uint8_t> announcement = opt_.auth.Seal(EncodeAnnouncement(a));
    report.bytes_uploaded += announcement.size();
    REFIT_RETURN_IF_ERROR(PutOnce(store_, IndexKey(version), announcement));

    report.stages.prepare = SecondsSince(t0);
    StoreSink sink(store_, opt_.auth, version, opt_.upload_threads, opt_.pack_bytes);
    DiffOptions diff = opt_.diff;
    diff.version = version;
    diff.base_version = committed_;
    Clock::time_point stage = Clock::now();
    REFIT_ASSIGN_OR_RETURN(report.diff, baseline_->Diff(target, diff, &sink));
    report.base_hashed = baseline_->last_diff_hashed_base();
    report.stages.upload_drain = sink.finish_seconds();
    report.stages.encode = SecondsSince(stage) - report.stages.upload_drain;
    report.stages.encode_blocked = sink.blocked_seconds();
    m.tensors = sink.tensors();
    m.chunks = sink.chunks();
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      if (t >= a.tensors.size() || m.tensors[t].name != a.tensors[t].name ||
          m.tensors[t].before != a.tensors[t].before) {
        return DataLossError("the publisher's baseline changed while version " +
                             std::to_string(version) + " was encoded (tensor '" +
                             m.tensors[t].name + "'); it will not be completed");
      }
    }
    report.bytes_uploaded += sink.bytes();
    stage = Clock::now();
    std::vector<uint8_t> manifest = opt_.auth.Seal(EncodeManifest(m));
    report.bytes_uploaded += manifest.size();
    REFIT_RETURN_IF_ERROR(PutOnce(store_, ManifestKey(version), manifest));
    report.stages.manifest = SecondsSince(stage);
    report.encode_upload_seconds =
        std::chrono::duration<double>(Clock::now() - t0).count();

    auto t1 = Clock::now();
    REFIT_ASSIGN_OR_RETURN(Decision d, VoteAndDecide(version, m, target, &report));
    decision = d;
    report.commit_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  }

  report.committed = decision->commit;
  report.dropped = decision->dropped;
  report.reason = decision->reason;
  if (decision->commit) {
    Clock::time_point stage = Clock::now();
    REFIT_RETURN_IF_ERROR(AdvanceBaseline(m, target));
    report.stages.advance = SecondsSince(stage);
    const PublisherBaseline::AdvanceStages adv = baseline_->last_advance();
    report.stages.advance_sync = adv.sync;
    report.advance_compared_bytes = adv.compared_bytes;
    report.advance_stored_bytes = adv.stored_bytes;
    stage = Clock::now();
    committed_ = version;
    for (const TensorEntry& e : m.tensors) {
      if (auto b = baseline_index_.find(e.name); b != baseline_index_.end()) {
        baseline_hashes_[b->second] = e.after;
      }
    }
    // The snapshot is stored before head names the version, so receivers
    // (which take snapshots at or below head) never see a partial one, and
    // a failed upload is redone when Publish(version) is run again.
    if (opt_.snapshot_every > 0 && version % opt_.snapshot_every == 0) {
      REFIT_RETURN_IF_ERROR(WriteSnapshot(version));
      report.snapshot = true;
    }
    REFIT_RETURN_IF_ERROR(store_->Put(kHeadKey, opt_.auth.Seal(EncodeHead(version))));
    if (opt_.keep_versions > 0) {
      Status s = Retain(&report);
      if (!s.ok()) report.retention_error = s.ToString();
    }
    report.stages.finish = SecondsSince(stage);
  }
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return report;
}

}  // namespace refit
