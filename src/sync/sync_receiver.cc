// The public receiver (include/refit/receiver.h) over the library's own
// (sync/receiver.h).
#include <utility>

#include "refit/receiver.h"
#include "sync/follow.h"
#include "sync/receiver.h"

namespace refit {
namespace {

SyncStep ToPublic(StepResult r) {
  SyncStep s;
  switch (r.outcome) {
    case StepResult::Outcome::kIdle:
      s.outcome = SyncStep::Outcome::kIdle;
      break;
    case StepResult::Outcome::kCommitted:
      s.outcome = SyncStep::Outcome::kCommitted;
      break;
    case StepResult::Outcome::kAborted:
      s.outcome = SyncStep::Outcome::kAborted;
      break;
    case StepResult::Outcome::kCaughtUp:
      s.outcome = SyncStep::Outcome::kCaughtUp;
      break;
    case StepResult::Outcome::kSnapshot:
      s.outcome = SyncStep::Outcome::kSnapshot;
      break;
    case StepResult::Outcome::kPrepared:
      s.outcome = SyncStep::Outcome::kPrepared;
      break;
  }
  s.version = r.version;
  s.versions_folded = r.versions_folded;
  s.chunks_applied = r.chunks_applied;
  s.bytes_fetched = r.bytes_fetched;
  s.seconds = r.seconds;
  s.changed_tensors = std::move(r.changed_tensors);
  return s;
}

}  // namespace

struct SyncReceiver::Impl {
  std::unique_ptr<Receiver> receiver;
};

std::string SyncOutcomeName(SyncStep::Outcome outcome) {
  static_assert(static_cast<int>(SyncStep::Outcome::kSnapshot) ==
                static_cast<int>(StepResult::Outcome::kSnapshot));
  // The enumerators match StepResult::Outcome's one for one.
  return OutcomeName(static_cast<StepResult::Outcome>(outcome));
}

Result<std::unique_ptr<SyncReceiver>> SyncReceiver::Open(
    ObjectStore* store, SyncReceiverOptions options) {
  ReceiverOptions o;
  o.member = std::move(options.member);
  o.checkpoint = std::move(options.checkpoint);
  o.tensors = std::move(options.tensors);
  o.state_dir = std::move(options.state_dir);
  o.auth = std::move(options.auth);
  o.threads = options.threads;
  o.poll_ms = options.poll_ms;
  o.decision_timeout_ms = options.decision_timeout_ms;
  o.resend_timeout_ms = options.resend_timeout_ms;
  o.chunk_timeout_ms = options.chunk_timeout_ms;
  o.max_fold_versions = options.max_fold_versions;
  o.stop = std::move(options.stop);
  auto impl = std::make_unique<Impl>();
  REFIT_ASSIGN_OR_RETURN(impl->receiver, Receiver::Open(store, std::move(o)));
  return std::unique_ptr<SyncReceiver>(new SyncReceiver(std::move(impl)));
}

SyncReceiver::SyncReceiver(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
SyncReceiver::~SyncReceiver() = default;

uint64_t SyncReceiver::active_version() const {
  return impl_->receiver->active_version();
}

Result<SyncStep> SyncReceiver::Step() {
  REFIT_ASSIGN_OR_RETURN(StepResult r, impl_->receiver->Step());
  return ToPublic(std::move(r));
}

Result<SyncStep> SyncReceiver::SyncTo(uint64_t version, int timeout_ms) {
  REFIT_ASSIGN_OR_RETURN(StepResult r,
                         impl_->receiver->SyncTo(version, timeout_ms));
  return ToPublic(std::move(r));
}

}  // namespace refit
