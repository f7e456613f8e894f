// FoldApply: one step's catch-up by folding (docs/protocol.md, "Catch-up
// by folding"): committed versions V1..Vk, chained on the receiver's
// active version A, applied in one pass over the model, range by range,
// then Vk activated. Reads and checks the manifests and plans the fold
// (PlanFold), journals it, applies each cell's chunks in version order on
// an ApplyPool, repairs torn cells from re-sends, checks every tensor and
// activates Vk; a chunk that fails its checks rolls the fold back to A
// (step 6).
//
// Each step is a method; Run() calls them in order. An object folds one
// chain once, on the receiver's stepping thread, and lives only for that
// call: it borrows the receiver (store, options, counters) and the chain,
// and owns the bound tensors, the journal and the pool.
#ifndef REFIT_SYNC_FOLD_APPLY_H_
#define REFIT_SYNC_FOLD_APPLY_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "refit/status.h"
#include "sync/apply_pool.h"
#include "sync/bound_tensors.h"
#include "sync/chunk_pack.h"
#include "sync/fold_plan.h"
#include "sync/journal.h"
#include "sync/protocol.h"
#include "sync/receiver.h"

namespace refit::internal {

class FoldApply {
 public:
  // Folds `chain` (chain[0] builds on the receiver's active version, each
  // next one on the previous one; shas[j] is the SHA-256 of chain[j]'s
  // stored announcement) for `receiver`, whose journal is at
  // `journal_path`. With `resume`, the fold that journal holds.
  FoldApply(Receiver* receiver, const std::vector<Announcement>& chain,
            const std::vector<Sha256>& shas, bool resume, std::string journal_path);
  FoldApply(const FoldApply&) = delete;
  FoldApply& operator=(const FoldApply&) = delete;

  // Once. kCaughtUp at Vk; nullopt, having changed nothing, when the
  // chain does not fold (a fresh fold only; a resumed one that no longer
  // folds is DATA_LOSS). Errors as Receiver::Step.
  Result<std::optional<StepResult>> Run();

 private:
  using Clock = std::chrono::steady_clock;

  // Step 1: reads every manifest of the chain, checked against its
  // announcement, and plans the cells. False when the chain does not fold.
  Result<bool> ReadAndPlan();
  // Step 6, before anything is written: a chunk of this chain that failed
  // its checks in an earlier step is checked again; while it fails, the
  // step fails at once.
  Status RecheckBadChunk();
  // Step 2: begins the journal (fresh) or reopens it (resumed), then
  // binds the tensors.
  Status OpenJournalAndBind();
  // Step 3: every cell's chunks fetched, checked, and applied from the
  // first one not in place; torn cells are set aside for RepairTorn.
  Status ApplyCells();
  // Step 4: rebuilds the torn cells from overwrite re-sends.
  Status RepairTorn();
  // Step 5: every tensor at Vk's manifest "after" hash, flush, activate.
  Result<StepResult> CheckAndActivate();

  // Chunk i of chain[j], fetched into *object and checked (CheckChunk).
  Result<ParsedChunk> Fetch(size_t j, uint64_t i, std::vector<uint8_t>* object);
  // Fetch(), where a chunk that fails its checks is replaced by this
  // member's overwrite re-send of it at its version when the store holds
  // one that passes CheckChunk (*resent is then set): the re-send carries
  // the chunk's range hashes, and applying it checks its "after" as for
  // any chunk. Otherwise the chunk's own failure stands.
  Result<ParsedChunk> FetchOrResend(size_t j, uint64_t i, std::vector<uint8_t>* object,
                                    bool* resent);
  // Puts a request for an overwrite re-send of chunk i of chain[j] at its
  // version.
  Status RequestResend(size_t j, uint64_t i);
  // Journals each chunk the pool applied, with its pre-images, and counts
  // it. A job is a cell's chunks from the first one not in place on.
  Status Drain(bool all);
  // Drain(), where an apply that failed its checks refuses its chunk.
  Status DrainOrRefuse(bool all);
  // Step 6: stops the fold for chunk `r`, which failed its checks (`why`):
  // rolls back, requests a re-send, and returns DATA_LOSS.
  Status Refuse(const FoldRef& r, const Status& why);
  // Brings every range this fold wrote back to A from the journal, checks
  // every tensor at A and removes the journal.
  Status RollBack();
  // "version <V>" of chain[j], in messages.
  std::string VersionName(size_t j) const;

  Receiver& r_;
  const ReceiverOptions& opt_;
  const std::vector<Announcement>& chain_;
  const std::vector<Sha256>& shas_;
  const bool resume_;
  const std::string journal_path_;
  const Announcement& first_;
  const Announcement& last_;
  const size_t tensors_;
  const std::string what_;  // "the fold of versions V1..Vk onto version A"
  Clock::time_point t0_;
  StepResult result_;

  std::vector<Manifest> manifests_;
  // One per version of the chain: a pack is fetched once while the cells
  // walk its chunks.
  std::vector<ChunkObjectReader> readers_;
  std::vector<FoldCell> cells_;
  Journal journal_;
  std::optional<BoundTensors> b_;
  std::optional<Digests> digests_;
  std::optional<Flusher> flusher_;
  std::optional<BaseCheck> base_check_;
  // Destroyed before the tensors and the flusher: joins its workers.
  std::optional<ApplyPool> pool_;
  Status apply_error_;
  std::optional<FoldRef> failed_apply_;  // the chunk whose apply failed first
  struct Torn {
    size_t cell;
    Hash128 after;  // the cell's last chunk's "after": the range at Vk
  };
  std::vector<Torn> torn_;
};

}  // namespace refit::internal

#endif  // REFIT_SYNC_FOLD_APPLY_H_
