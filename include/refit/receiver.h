// SyncReceiver: follows the versions a publisher puts into an ObjectStore
// and keeps a local model, a checkpoint file or the caller's tensors in
// memory, at exactly one committed version (docs/protocol.md, "Receiver").
// A step applies each chunk in place at most once as it lands, votes (a
// member), waits for the decision, then activates the version or rolls it
// back; a receiver killed anywhere resumes from its state directory.
// Several committed versions behind, one step folds them into one pass.
//
// This is the library's receiver behind a stable interface: what it holds
// stays private to the library. Not thread-safe; the store must outlive
// the receiver.
#ifndef REFIT_RECEIVER_H_
#define REFIT_RECEIVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "refit/auth.h"
#include "refit/delta.h"
#include "refit/status.h"
#include "refit/store.h"

namespace refit {

struct SyncReceiverOptions {
  std::string member;      // this receiver's name in the membership
  std::string checkpoint;  // safetensors file or checkpoint directory
  // Used when `checkpoint` is empty: the caller's tensors in host memory,
  // applied in place. They must hold the active version when the receiver
  // opens; nothing makes them durable. They must outlive the receiver.
  std::vector<MutableTensorView> tensors;
  std::string state_dir;  // the receiver's state (active version, journal)
  Authenticator auth = Authenticator::None();
  int threads = 0;  // 0 = all cores
  int poll_ms = 20;
  int decision_timeout_ms = 60000;
  int resend_timeout_ms = 30000;
  int chunk_timeout_ms = 60000;
  // Committed versions folded into one pass at most (1 = one by one).
  int max_fold_versions = 16;
  // Polled while a step waits: true ends it with kCancelled, its work kept
  // for the next step. Empty: never.
  std::function<bool()> stop;
};

// What one step did.
struct SyncStep {
  // kPrepared: a two-phase receiver staged the version and has yet to
  // activate it (docs/protocol.md, "Two-phase receivers").
  enum class Outcome { kIdle, kCommitted, kAborted, kCaughtUp, kSnapshot, kPrepared };
  Outcome outcome = Outcome::kIdle;
  uint64_t version = 0;          // the version the step ended at
  uint64_t versions_folded = 0;  // committed versions it went through
  uint64_t chunks_applied = 0;
  uint64_t bytes_fetched = 0;
  double seconds = 0;
  // Committed / caught up: the tensors the versions changed, in manifest
  // order, so an engine can reload just those.
  std::vector<std::string> changed_tensors;
};

// "idle", "committed", "aborted", "caught-up" or "snapshot".
std::string SyncOutcomeName(SyncStep::Outcome outcome);

class SyncReceiver {
 public:
  // Opens the receiver's state (resuming an interrupted version on the
  // next step). kInvalidArgument for options that do not fit together.
  static Result<std::unique_ptr<SyncReceiver>> Open(
      ObjectStore* store, SyncReceiverOptions options);
  ~SyncReceiver();
  SyncReceiver(const SyncReceiver&) = delete;
  SyncReceiver& operator=(const SyncReceiver&) = delete;

  uint64_t active_version() const;

  // Handles the next version whose base is the active one, or resumes an
  // interrupted one; kIdle when there is nothing to do yet.
  // kDeadlineExceeded when no decision arrives in time (the next step
  // resumes).
  Result<SyncStep> Step();

  // Steps until the active version is at least `version`, polling while
  // idle, up to timeout_ms (kDeadlineExceeded). Folds stop at `version`.
  Result<SyncStep> SyncTo(uint64_t version, int timeout_ms);

 private:
  struct Impl;
  explicit SyncReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit

#endif  // REFIT_RECEIVER_H_
