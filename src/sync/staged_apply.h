// The preparation of a two-phase receiver (docs/protocol.md, "Two-phase
// receivers"; ReceiverOptions::staged): a chain of versions (one version,
// voted on, or committed versions folded into one pause) or a snapshot is
// fetched, checked and staged in the receiver's StagedTarget without
// writing any tensor; PreparedVersions keeps what ActivatePrepared() needs.
//
// StagedPrepare borrows the receiver (store, options) for one call on its
// stepping thread, like VersionApply.
#ifndef REFIT_SYNC_STAGED_APPLY_H_
#define REFIT_SYNC_STAGED_APPLY_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "refit/status.h"
#include "sync/protocol.h"
#include "sync/receiver.h"

namespace refit::internal {

// What Prepare() staged.
struct PreparedVersions {
  StepResult result;  // kPrepared, with the counters of the preparation
  // The outcome the activation reports: kCommitted (voted), kCaughtUp or
  // kSnapshot.
  StepResult::Outcome outcome = StepResult::Outcome::kCaughtUp;
  // The tensor tables the staged chunks index (the target refers to them).
  std::vector<Announcement> chain;
  // A snapshot: its tensors and their bytes, loaded in the pause.
  std::vector<TensorEntry> snapshot_tensors;
  std::vector<std::vector<uint8_t>> snapshot_bytes;
};

class StagedPrepare {
 public:
  StagedPrepare(Receiver* receiver, PreparedVersions* out)
      : r_(*receiver), opt_(receiver->opt_), out_(*out) {}

  // Stages `out->chain` (set by the caller; `shas` are its announcements'
  // SHA-256), voting when `vote` (a single undecided version). kPrepared,
  // or kAborted when the version was aborted meanwhile. When the failure
  // is the version's (not this receiver's base, a chunk the store keeps
  // returning damaged), *version_fault is set.
  Result<StepResult> Chain(bool vote, bool* version_fault);
  // Fetches and checks snapshot `version` into out->snapshot_*.
  Result<StepResult> Snapshot(uint64_t version);

 private:
  using Clock = std::chrono::steady_clock;
  // The held tensors are the chain's base (the announced "before" hashes).
  Status CheckBase(bool* version_fault);
  // Stages every chunk of chain[k] as it lands and reads its manifest. A
  // value when the version was aborted meanwhile (vote: undecided).
  Result<std::optional<StepResult>> StageVersion(size_t k, bool* version_fault);

  Receiver& r_;
  const ReceiverOptions& opt_;
  PreparedVersions& out_;
  std::vector<Manifest> manifests_;
  StepResult result_;
};

}  // namespace refit::internal

#endif  // REFIT_SYNC_STAGED_APPLY_H_
