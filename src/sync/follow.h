// Following a publisher: the one loop that steps a Receiver until it has
// reached a version, gone idle, done one version, or been told to stop
// (docs/protocol.md, "Receiver"). Receiver::SyncTo, `refit receive` and
// the Python module's Receiver.sync all run it; they differ only in the
// options below and in what they tell their users, which stays theirs.
// Also the names of step outcomes, spelled once for every front end.
//
// Follow runs on the calling thread and calls the callbacks there; it is as
// thread-safe as the Receiver it steps (not at all).
#ifndef REFIT_SYNC_FOLLOW_H_
#define REFIT_SYNC_FOLLOW_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "refit/status.h"
#include "sync/receiver.h"

namespace refit {

// The name users see for a step outcome: "idle", "committed", "aborted",
// "caught-up" or "snapshot", with `separator` between the words of
// "caught up": the CLI prints '-' ("caught-up"), the Python module '_'
// ("caught_up", python/refit/_native.pyi).
std::string OutcomeName(StepResult::Outcome outcome, char separator = '-');

struct FollowOptions {
  // Stop once the receiver's active version is at least `until`; steps fold
  // no version above it (Receiver::Step's fold_limit). nullopt: no target.
  std::optional<uint64_t> until;
  // Take one step even when `until` is already reached at the start.
  bool step_first = false;
  // Stop after the first step that finds nothing to do.
  bool until_idle = false;
  // Stop after the first step that does something.
  bool once = false;
  // End with FollowEnd::kTimedOut after a step that does not end the loop
  // otherwise, once this many milliseconds have passed since the start.
  // Negative: never.
  int timeout_ms = -1;
  // How long to sleep after an idle step.
  int poll_ms = 20;
  // Asked before every step and every 10 ms of a sleep: true ends the loop
  // with FollowEnd::kStopped. Empty: never.
  std::function<bool()> stop;
  // Called with every step that did something, and with every idle step.
  std::function<void(const StepResult&)> on_step;
  std::function<void(const StepResult&)> on_idle;
  // Called when a step fails: the milliseconds to wait before stepping
  // again, or nullopt to end the loop with that error. Empty: every error
  // ends the loop.
  std::function<std::optional<int>(const Status&)> on_error;
};

enum class FollowEnd { kReached, kIdle, kOnce, kStopped, kTimedOut };

struct FollowResult {
  FollowEnd end = FollowEnd::kReached;
  // The last step that succeeded (idle or not); a default StepResult when
  // the loop took none.
  StepResult last;
};

// Steps `receiver` as `options` say until one of their ends is met. The
// error of a failed step, unless options.on_error asks for another try.
Result<FollowResult> Follow(Receiver& receiver, const FollowOptions& options);

}  // namespace refit

#endif  // REFIT_SYNC_FOLLOW_H_
