// VersionApply: one step's work on one version of a receiver
// (docs/protocol.md, "Receiver", steps 0-6): check the announced base,
// journal, apply every chunk at most once as it lands (on an ApplyPool),
// repair torn ranges from re-sends, check every tensor, flush, vote, wait
// for the decision, then activate or roll back. Resumes a journaled
// version the same way (`resume`).
//
// Each step is a method; Run() calls them in order. An object applies one
// version once, on the receiver's stepping thread, and lives only for
// that call: it borrows the receiver (store, options, counters) and the
// announcement, and owns the bound tensors, the journal and the pool.
#ifndef REFIT_SYNC_VERSION_APPLY_H_
#define REFIT_SYNC_VERSION_APPLY_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "delta/apply.h"
#include "refit/status.h"
#include "sync/apply_pool.h"
#include "sync/bound_tensors.h"
#include "sync/chunk_pack.h"
#include "sync/chunk_prefetch.h"
#include "sync/early_parts.h"
#include "sync/journal.h"
#include "sync/protocol.h"
#include "sync/receiver.h"

namespace refit::internal {

class VersionApply {
 public:
  // Applies `a` (voting when `vote`) for `receiver`, whose journal is at
  // `journal_path`. When the failure is the version's (it cannot be
  // applied here, docs/protocol.md "Failed votes"), *failure says so.
  VersionApply(Receiver* receiver, const Announcement& a, const Sha256& announcement_sha,
               bool vote, bool resume, std::string journal_path,
               Receiver::VersionFailure* failure);
  VersionApply(const VersionApply&) = delete;
  VersionApply& operator=(const VersionApply&) = delete;

  // Once. kCommitted, kCaughtUp or kAborted; errors as Receiver::Step.
  Result<StepResult> Run();

 private:
  using Clock = std::chrono::steady_clock;

  // Step 0: the announced base is the version this receiver holds, as the
  // store records it (fresh versions only; nothing is journaled or
  // written when it is not).
  Status CheckAnnouncedBase();
  // Step 1: begins the journal (fresh) or reopens it (resumed), then
  // binds the tensors.
  Status OpenJournalAndBind();
  // This receiver voted failed on the version earlier: nothing more is
  // applied; waits for the decision (the coordinator aborts) and rolls
  // back.
  Result<StepResult> AfterFailedVote();
  // Step 2: every chunk as it lands, up to the manifest's last. A value
  // when the version was aborted meanwhile (and rolled back).
  Result<std::optional<StepResult>> StreamChunks();
  // Step 2 for chunk i, fetched into object_ (its Get began at
  // `fetched_from`): checked, then skipped, submitted to the pool or found
  // torn.
  // `checked`: chunk i as ChunkPrefetch read and checked it (object_
  // holds its object); otherwise object_ is checked here.
  Status TakeChunk(uint64_t i, Clock::time_point fetched_from,
                   std::optional<ParsedChunk> checked = std::nullopt);
  // Step 4's check: every tensor at the manifest's "after" hash.
  Status CheckTensors();
  // Steps 4-6 from the vote on: vote (a member), wait for the decision,
  // activate or roll back.
  Result<StepResult> VoteAndDecide();

  // Marks a failure as the version's; chunks at or above `bound` were not
  // written in it. A receiver that voted ready already stands by that vote.
  void MarkFailure(uint64_t bound);
  // Reads the manifest when the store holds it (it closes the chunk list),
  // checked against the announcement and the chunks checked so far.
  Status ReadManifestIfStored();
  // Fetches chunk i (or a re-send of it, not `original`) into object_ and
  // checks it (CheckChunk).
  Result<ParsedChunk> Fetch(const std::string& key, uint64_t i, bool original);
  Result<ParsedChunk> CheckFetched(uint64_t i, bool original);
  // Fetches stored chunk i, alone or out of its pack (ChunkObjectReader),
  // into object_ and checks it.
  Result<ParsedChunk> FetchOriginal(uint64_t i);
  // The bytes of a chunk's tensor that its region spans (a strided
  // region: from its first row's start to its last row's end).
  std::pair<uint64_t, uint64_t> ByteRange(const ChunkHeader& h) const;
  // Chunk i's region (of tensor t) was found at `state` other than
  // "before": counted as skipped (at "after") or kept for repair (neither).
  void Classified(uint64_t i, size_t t, RangeState state);
  // Where chunk i is stored: v/<V>/chunk/<i>, or a rank's part object when
  // the manifest (seen) says so.
  std::string KeyOf(uint64_t i) const;
  // What Receiver::BadRead records of chunk i: its key and its index.
  std::string BadReadKey(uint64_t i) const;
  // Step 3: asks for overwrite re-sends of `torn` chunks (at V if `after`,
  // else at the base) and applies them as they arrive.
  Status Repair(const std::vector<uint64_t>& torn, bool after);
  // Step 6's abort: undoes whatever of the version is in place.
  Status RollBack();
  Result<StepResult> Aborted();
  // Journals and counts the chunks the pool applied.
  Status Drain(bool all);
  // Waits for the decision after a vote (`voted`: "ready for", "failed
  // on"), up to the decision timeout, after which the error says `then`.
  Status WaitForDecision(const std::string& voted, const std::string& then);
  // The base check from the digests the receiver kept from the version
  // this one builds on, when they may be used (ReceiverOptions::
  // full_base_check_every): seeds digests_ with them. Whether it did.
  bool SeedDigests();
  // After activation: keeps this version's digests for the next one.
  void KeepDigests();

  Receiver& r_;
  const ReceiverOptions& opt_;
  const Announcement& a_;
  const Sha256& announcement_sha_;
  const bool vote_, resume_;
  const std::string journal_path_;
  Receiver::VersionFailure* failure_;
  const std::string V_;  // the version, in messages
  Clock::time_point t0_;
  StepResult result_;

  std::optional<JournalState> state_;
  Journal journal_;
  std::optional<BoundTensors> b_;
  std::optional<Decision> decision_;
  ApplyScratch scratch_;
  // The manifest closes the chunk list; until it is seen, chunks are
  // checked against the announcement alone (docs/protocol.md, "Receiver").
  std::optional<Manifest> manifest_;
  std::optional<Clock::time_point> manifest_seen_;
  std::vector<Sha256> seen_;  // SHA-256 of chunk objects 0..seen_.size()-1
  std::vector<uint8_t> object_;  // the chunk (or re-send) being checked
  // The version's chunk objects in index order, a pack fetched once.
  std::optional<ChunkObjectReader> reader_;
  Clock::time_point last_progress_;  // the last chunk that passed its checks
  std::optional<Digests> digests_;
  std::optional<Flusher> flusher_;
  std::optional<BaseCheck> base_check_;
  // Destroyed before the tensors and the flusher: joins its workers.
  std::optional<ApplyPool> pool_;
  std::optional<ChunkPrefetch> prefetch_;  // a direct version's, in StreamChunks
  std::optional<EarlyParts> early_;        // its chunks read before the manifest
  Status apply_error_;
  std::vector<uint64_t> torn_;
  // Taken from the receiver at the start, so that a step that does not
  // activate its version leaves none behind.
  std::shared_ptr<KeptDigests> kept_;
  std::vector<FileStamp> flushed_;  // the checkpoint's files after the flush
};

}  // namespace refit::internal

#endif  // REFIT_SYNC_VERSION_APPLY_H_
