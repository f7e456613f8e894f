// Receiver: follows the versions a publisher puts into an ObjectStore and
// keeps a local canonical checkpoint at exactly one committed version
// (docs/protocol.md, "Receiver").
//
// Per version: from its announcement on, apply every chunk in place at most
// once (range hashes decide) as it lands, while the publisher is still
// uploading; once the manifest closes the list, check every tensor, journal
// it, flush the checkpoint and the journal, vote, wait for
// the one decision, then activate (pointer file: temp, rename, fsync) or
// roll back. A receiver killed anywhere resumes from its journal and the
// range hashes on the next Step(), asking the publisher for overwrite
// re-sends of only the ranges it finds torn. A receiver several committed
// versions behind folds them: one pass applies each range's chunks of all
// of them in sequence and activates the last; a chunk that fails its
// checks rolls the fold back to the active version. Not thread-safe.
#ifndef REFIT_SYNC_RECEIVER_H_
#define REFIT_SYNC_RECEIVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "refit/delta.h"
#include "refit/status.h"
#include "sync/auth.h"
#include "sync/protocol.h"
#include "sync/staged_target.h"
#include "transport/object_store.h"

namespace refit {

namespace internal {
class FoldApply;
class StagedPrepare;
class VersionApply;
struct PreparedVersions;
struct KeptDigests;
}  // namespace internal

struct ReceiverOptions {
  std::string member;      // this receiver's name in the membership
  std::string checkpoint;  // safetensors file or checkpoint directory
  // Used when `checkpoint` is empty: the caller's tensors in host memory
  // (an inference worker's weights), applied in place. They must hold the
  // active version when the receiver opens (docs/protocol.md, "In-memory
  // receivers"); nothing makes them durable. The views must stay valid
  // while the receiver lives.
  std::vector<MutableTensorView> tensors;
  // Used when `checkpoint` and `tensors` are empty: a two-phase receiver
  // (docs/protocol.md, "Two-phase receivers") applying to these tensors,
  // e.g. an engine's weights in GPU memory (cuda/device_target.h). Same
  // precondition as `tensors`; Prepare() stages a version without
  // writing, ActivatePrepared() applies it in one pause.
  std::shared_ptr<StagedTarget> staged;
  std::string state_dir;   // holds "active" and "journal"
  Authenticator auth = Authenticator::None();
  int threads = 0;
  int poll_ms = 20;
  // How long Step() waits for a decision after voting, and for re-sends.
  int decision_timeout_ms = 60000;
  int resend_timeout_ms = 30000;
  // How long a version may go without a new chunk or its manifest while
  // the receiver applies it (the publisher stopped mid-upload).
  int chunk_timeout_ms = 60000;
  // Catch-up by folding (docs/protocol.md, "Catch-up by folding"): a step
  // that finds committed versions V1..Vk chained on the active version
  // applies up to this many of them in one pass over the model and
  // activates Vk directly. 1 (or less) applies them one by one.
  int max_fold_versions = 16;
  // Polled while a step waits (for chunks, re-sends, a decision) and
  // between its polls: when it returns true the step ends within one
  // poll_ms with CANCELLED, its work journaled as after any failure (the
  // next step resumes). Empty: never. Called on the stepping thread.
  std::function<bool()> stop;
  // The base check of a fresh version (docs/protocol.md, "Hashing") reads
  // every tensor, unless this receiver object kept the 64 KiB segment
  // digests of the version it activated last (those of the ranges it wrote
  // come from each chunk's after-check): then it composes each tensor's
  // hash from them without reading the model, except in every
  // `full_base_check_every`-th version, which hashes every tensor from its
  // bytes. A checkpoint receiver reuses them only while its files are
  // unchanged since its flush before the vote (size, inode, modification
  // and change times). 1: hash the base from the bytes in every version;
  // 0: never again once digests are kept.
  int full_base_check_every = 16;
  // Checkpoint receivers: start writing each applied range to disk while
  // the others are applied (sync_file_range), so the flush before the vote
  // finds little left. The price: each page written back while still mapped
  // is write-protected again, a TLB shootdown on every CPU running this
  // process, and a second fault when it is written again. false: the flush
  // before the vote writes everything. In-memory tensors: no effect.
  bool early_writeback = true;
  // A direct version (docs/protocol.md, "Versions from many ranks") is
  // announced before its ranks finish uploading: until its manifest is
  // stored, the receiver lists the ranks' chunk objects and reads and
  // checks up to this many bytes of them in the background (EarlyParts),
  // and stages or applies them once the manifest lists them. 0: read every
  // chunk after the manifest.
  uint64_t early_part_bytes = uint64_t{1} << 30;
};

struct StepResult {
  // kSnapshot: the checkpoint was replaced by the snapshot of `version`
  // (docs/protocol.md, "Snapshots and retention").
  // kPrepared (two-phase receivers, Receiver::Prepare): `version` is staged
  // and committed; ActivatePrepared() applies it.
  enum class Outcome {
    kIdle,
    kCommitted,
    kAborted,
    kCaughtUp,
    kSnapshot,
    kPrepared
  };
  Outcome outcome = Outcome::kIdle;
  uint64_t version = 0;
  uint64_t chunks_applied = 0;
  uint64_t chunks_skipped = 0;  // already applied (at "after")
  uint64_t chunks_resent = 0;   // repaired from overwrite re-sends
  uint64_t changed_elements = 0;
  uint64_t bytes_fetched = 0;
  // Chunks applied before the version's manifest was seen, i.e. while the
  // publisher was still uploading (docs/protocol.md, "Receiver").
  uint64_t chunks_before_manifest = 0;
  // A direct version's part chunks read and checked before its manifest
  // was stored, while the ranks were still uploading (EarlyParts); they
  // are staged or applied once the manifest lists them.
  uint64_t chunks_read_early = 0;
  double seconds = 0;
  // Committed versions this step brought the receiver through: k for a
  // fold of V1..Vk (then `version` is Vk and the counters and
  // `changed_tensors` cover all of them), 1 for a single version, 0 when
  // no version was applied (idle, snapshot, rollback of none).
  uint64_t versions_folded = 0;
  // From the manifest being seen (the publisher's upload done) to the vote
  // stored (member) or the version activated (catch-up): the part of the
  // step that the upload does not hide.
  double tail_seconds = 0;
  // kCommitted / kCaughtUp: the names of the tensors the version changed
  // (those with at least one changed element), in manifest order, so a
  // caller can reload just those into an engine.
  std::vector<std::string> changed_tensors;
  // kIdle because the next version has no decision yet and its members do
  // not include this receiver (it does not vote; it applies the version
  // once committed): that version. 0 otherwise.
  uint64_t not_member_of = 0;
  // kSnapshot taken because committed versions could not be applied as
  // deltas (a torn range nobody re-sent, or a local model off its base):
  // why. Empty otherwise.
  std::string recovered;
  // Two-phase receivers: the activation's pause (every staged chunk
  // applied in place and checked), and the staging memory the version
  // took (page-locked host and device bytes held while it was staged).
  double pause_seconds = 0;
  double pause_kernel_ms = 0;
  double pause_verify_ms = 0;
  uint64_t staged_host_bytes = 0;
  uint64_t staged_device_bytes = 0;
  // Two-phase receivers, in the prepare phase (before the vote): sealing
  // the staged chunks (parsed, placed and copied to their staging memory),
  // and, for a direct version, computing the tensors' hashes after it.
  double seal_seconds = 0;
  double after_hash_seconds = 0;
  // The version's base was checked from the digests the receiver kept
  // from the version before (ReceiverOptions::full_base_check_every)
  // instead of by reading every tensor.
  bool base_from_kept_digests = false;
  // Where a version's step spent its time (seconds), for benchmarks: wall
  // time of the stepping thread in each part, except apply_cpu, which sums
  // the apply workers' time (it overlaps the other parts). Filled by steps
  // that apply one version; zero otherwise. A two-phase receiver's prepare
  // fills base_check, fetch, chunk_wait, apply_cpu (there: handing chunks
  // to the target, StagedTarget::Add), vote and decision_wait (its sealing
  // and after-hashes are seal_seconds and after_hash_seconds, its pause
  // pause_seconds).
  struct Stages {
    double base_check = 0;     // hashing tensors to check the base
    double fetch = 0;          // reading and checking chunks and the manifest
    double chunk_wait = 0;     // waiting for chunks not stored yet
    double apply_wait = 0;     // waiting for the apply workers
    double apply_cpu = 0;      // decode, store, after-hash (worker seconds)
    double check = 0;          // every tensor against the manifest
    double flush = 0;          // the checkpoint and the journal made durable
    double vote = 0;           // the vote stored and journaled
    double decision_wait = 0;  // from the vote to the decision read
    double activate = 0;       // `active` written, the journal removed
  };
  Stages stages;
};

class Receiver {
 public:
  static Result<std::unique_ptr<Receiver>> Open(ObjectStore* store,
                                                ReceiverOptions options);
  ~Receiver();
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  uint64_t active_version() const { return active_; }

  // Chunks this object applied in place (from the base) since Open, across
  // failed and successful steps alike; for at-most-once checks.
  uint64_t chunks_applied_total() const { return chunks_applied_total_; }

  // Finishes or rolls back an interrupted version first; then handles the
  // next version whose base is the active one: applies and votes (member)
  // or applies a committed one (catch-up; committed versions chained on it
  // are folded into the same step, up to max_fold_versions and none above
  // `fold_limit`, so a step ends at most at fold_limit unless the next
  // version alone is above it). When no chain of versions leads
  // from the active version (they were deleted by retention, or the
  // checkpoint is absent) and no journal is in progress, replaces the
  // checkpoint with the newest snapshot at or below head instead
  // (kSnapshot); so does a checkpoint receiver whose catch-up through
  // committed versions fails for a torn range nobody re-sends or a local
  // model off its base (StepResult::recovered says why). kIdle when there
  // is nothing to do yet.
  // kDeadlineExceeded when no decision arrives in time (the journal keeps
  // the work; the next Step resumes).
  Result<StepResult> Step(uint64_t fold_limit = UINT64_MAX);

  // Stores a snapshot of the active version (snap/<V>/: the checkpoint's
  // files and the index, docs/protocol.md "Snapshots and retention") from
  // this checkpoint receiver's own files, for receivers that catch up
  // from it; the way versions published by many ranks get snapshots, as
  // no coordinator holds their model. Refused (FAILED_PRECONDITION) for
  // an in-memory or two-phase receiver, with a version in progress in the
  // journal, or when the store records no tensor table for the active
  // version; DATA_LOSS, with nothing stored, when a tensor of the
  // checkpoint does not hash to the version's record. The files go first
  // and the index last, and the active version and the journal are
  // checked again before the index is stored, so a receiver that moved
  // on meanwhile leaves no index naming a mixed set of files. Returns
  // false, storing nothing, when the store holds that snapshot already.
  // Call it between steps, never while another process steps the same
  // state directory.
  Result<bool> WriteSnapshot();

  // The version this receiver voted failed on in its last Step(), which
  // then returned why (docs/protocol.md, "Failed votes"): the version
  // cannot be applied here (its announced base is not the model this
  // receiver holds, a chunk the store keeps returning fails its checks,
  // the model is not the one the version describes). The coordinator
  // aborts it; the next steps wait for that decision, roll back what was
  // applied and follow the next version. nullopt when the last step voted
  // no failure.
  std::optional<uint64_t> failed_vote() const { return failed_vote_; }
  // The last Step() failed on a chunk that failed its checks, too few
  // times in a row to tell a damaged read from a damaged object: the next
  // step reads it again (and votes failed once the store keeps returning
  // the same bytes).
  bool rereading() const { return reread_pending_; }

  // Step(version) until the active version is at least `version`, polling
  // while idle, up to timeout_ms (kDeadlineExceeded). Folds stop at
  // `version`, so a committed `version` is where the receiver ends.
  Result<StepResult> SyncTo(uint64_t version, int timeout_ms);

  // Two-phase receivers (ReceiverOptions::staged). Step() is Prepare()
  // then ActivatePrepared(); an engine that pauses itself calls them
  // apart. Prepare() does a step's work up to the activation without
  // writing any tensor: it checks the held tensors against the version's
  // base, fetches and checks every chunk (as they land) and stages them
  // in the target, votes ready (a member) and waits for the decision;
  // kPrepared once committed (then `version` is the version that
  // ActivatePrepared() activates: the last of a fold, or a snapshot's),
  // kAborted (nothing staged stays), kIdle. Prepare() again before
  // ActivatePrepared() returns the same preparation.
  Result<StepResult> Prepare(uint64_t fold_limit = UINT64_MAX);
  // The pause: applies what Prepare() staged and activates it (kCommitted,
  // kCaughtUp, kSnapshot). On failure the target restored every tensor
  // and the receiver stays at its active version (the error says so; the
  // next Prepare() stages the committed version again).
  // FAILED_PRECONDITION when nothing is prepared.
  Result<StepResult> ActivatePrepared();
  bool prepared() const { return prepared_ != nullptr; }

 private:
  // The parts of a step (sync/version_apply.h, sync/fold_apply.h) use the
  // store, the options and the counters below.
  friend class internal::FoldApply;
  friend class internal::StagedPrepare;
  friend class internal::VersionApply;

  Receiver(ObjectStore* store, ReceiverOptions options);
  // Step()'s choice of what to do next; a two-phase receiver prepares it.
  Result<StepResult> Next(uint64_t fold_limit);
  // Two-phase receivers: stages the chain (one version, voting when
  // `vote`, or committed versions to fold), or the snapshot `version`.
  Result<StepResult> PrepareChain(const std::vector<Announcement>& chain,
                                  bool vote);
  Result<StepResult> PrepareSnapshot(uint64_t version);
  // Stores this member's vote that `version` failed for `why`; then
  // VotedFailed() records it and says so, with what happens `then`.
  Status PutFailedVote(uint64_t version, const Status& why);
  Status VotedFailed(uint64_t version, const Status& why,
                     const std::string& then);
  // Applies version `a` (voting when `vote`); when it cannot be applied
  // here, votes failed first (a member) and returns why.
  Result<StepResult> ProcessVersion(const Announcement& a, const Sha256& announcement_sha,
                                    bool vote, bool resume);
  // Why ApplyVersion failed, when the failure is the version's (it cannot
  // be applied here) rather than a transient one.
  struct VersionFailure {
    bool set = false;
    bool journaled = false;  // a journal of the version exists
    // Chunks at or above this index were not written in this version.
    uint64_t bound = UINT64_MAX;
  };
  Result<StepResult> ApplyVersion(const Announcement& a, const Sha256& announcement_sha,
                                  bool vote, bool resume, VersionFailure* failure);
  // The tensor table recording the active version's hashes ("after"): its
  // manifest or its snapshot index; nullopt when the store holds neither.
  Result<std::optional<std::vector<TensorEntry>>> ActiveTensors();
  // Sleeps poll_ms, unless options.stop says to stop: CANCELLED naming
  // what the step was waiting for. With `since` (the store's ChangeCount
  // taken before the caller last looked), wakes as soon as the store
  // changed instead (ObjectStore::AwaitChange).
  Status Pause(const std::string& waiting_for,
               std::optional<uint64_t> since = std::nullopt);
  // Applies the committed chain V1..Vk (chain[0] builds on the active
  // version, each next one on the previous one) in one pass and activates
  // Vk. nullopt, having changed nothing, when the chain cannot be folded
  // (tensor tables or hashes that do not line up, chunk ranges that
  // overlap without being equal): the caller applies them one by one.
  // With `resume`, a fold journaled by an earlier step is finished. A
  // chunk that fails its checks rolls the fold back to the active version
  // and requests a re-send of it (DATA_LOSS).
  Result<std::optional<StepResult>> Fold(const std::vector<Announcement>& chain,
                                         const std::vector<Sha256>& shas, bool resume);
  Result<Announcement> ReadAnnouncement(uint64_t version, Sha256* sha);
  // True when the receiver has a model to apply to (in memory, or a
  // checkpoint that exists).
  bool HasModel() const;
  Result<std::vector<uint64_t>> ListVersions();
  Result<std::optional<Decision>> ReadDecision(uint64_t version);
  // Waits, after this receiver voted, until `version` has a decision in
  // *decision (read first when it holds none), pausing between reads
  // (Pause, woken by store changes). DEADLINE_EXCEEDED after
  // decision_timeout_ms: "voted <voted> version V but no decision arrived
  // within N ms; <then>" (what the next step does about it).
  Status AwaitDecision(uint64_t version, std::optional<Decision>* decision,
                       const std::string& voted, const std::string& then);
  Result<Manifest> ReadManifest(uint64_t version, Sha256* sha);
  Status Activate(uint64_t version);
  // True when the checkpoint cannot be brought forward by deltas.
  Result<bool> ChainBroken(const std::vector<uint64_t>& versions);
  // The newest snapshot at or below head; nullopt when there is none.
  Result<std::optional<uint64_t>> NewestSnapshot();
  Result<StepResult> CatchUpFromSnapshot(uint64_t version);
  // `step` catches up through committed versions. When it failed with
  // DEADLINE_EXCEEDED (no re-send of a torn range came) or DATA_LOSS (the
  // re-sends or the local model do not lead to the versions' hashes), a
  // checkpoint receiver resyncs from the newest snapshot above the active
  // version, if the store holds one; otherwise the failure stands.
  Result<StepResult> OrSnapshot(Result<StepResult> step);

  ObjectStore* store_;
  ReceiverOptions opt_;
  uint64_t active_ = 0;
  uint64_t chunks_applied_total_ = 0;
  std::optional<uint64_t> failed_vote_;
  bool reread_pending_ = false;
  // The last chunk object that failed its checks, and in how many
  // consecutive steps the store returned exactly these bytes for it: a
  // stored object that fails is the version's fault, bytes damaged in
  // transit differ from read to read.
  struct BadRead {
    std::string key;
    Sha256 sha{};
    int reads = 0;
  };
  BadRead bad_read_;
  // The chunk (version, index) that stopped the last fold that met one
  // failing its checks: the next fold through that version checks it
  // again before writing anything.
  std::optional<std::pair<uint64_t, uint64_t>> bad_fold_chunk_;
  // Two-phase receivers: what Prepare() staged, until ActivatePrepared().
  std::unique_ptr<internal::PreparedVersions> prepared_;
  // The active version's segment digests, from the step that activated it
  // (ReceiverOptions::full_base_check_every); null when none are kept.
  std::shared_ptr<internal::KeptDigests> kept_;
};

}  // namespace refit

#endif  // REFIT_SYNC_RECEIVER_H_
