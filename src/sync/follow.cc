#include "sync/follow.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

// Sleeps `ms` in slices of at most 10 ms; false as soon as `stop` says so.
bool SleepUnlessStopped(int ms, const std::function<bool()>& stop) {
  const auto until = Clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    if (stop && stop()) return false;
    const auto now = Clock::now();
    if (now >= until) return true;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(until - now, std::chrono::milliseconds(10)));
  }
}

}  // namespace

std::string OutcomeName(StepResult::Outcome outcome, char separator) {
  switch (outcome) {
    case StepResult::Outcome::kIdle:
      return "idle";
    case StepResult::Outcome::kCommitted:
      return "committed";
    case StepResult::Outcome::kAborted:
      return "aborted";
    case StepResult::Outcome::kCaughtUp:
      return std::string("caught") + separator + "up";
    case StepResult::Outcome::kSnapshot:
      return "snapshot";
    case StepResult::Outcome::kPrepared:
      return "prepared";
  }
  return "unknown";
}

Result<FollowResult> Follow(Receiver& receiver, const FollowOptions& options) {
  const auto start = Clock::now();
  const uint64_t fold_limit = options.until.value_or(UINT64_MAX);
  auto reached = [&] {
    return options.until && receiver.active_version() >= *options.until;
  };
  FollowResult result;
  for (bool first = true;; first = false) {
    if (options.stop && options.stop()) {
      result.end = FollowEnd::kStopped;
      return result;
    }
    if (reached() && !(first && options.step_first)) {
      result.end = FollowEnd::kReached;
      return result;
    }
    Result<StepResult> step = receiver.Step(fold_limit);
    if (!step.ok()) {
      std::optional<int> retry_ms;
      if (options.on_error) retry_ms = options.on_error(step.status());
      if (!retry_ms) return step.status();
      SleepUnlessStopped(*retry_ms, options.stop);
      continue;
    }
    result.last = std::move(*step);
    const bool idle = result.last.outcome == StepResult::Outcome::kIdle;
    const auto& report = idle ? options.on_idle : options.on_step;
    if (report) report(result.last);
    if (!idle && options.once) {
      result.end = FollowEnd::kOnce;
      return result;
    }
    if (idle && options.until_idle) {
      result.end = FollowEnd::kIdle;
      return result;
    }
    if (reached()) {
      result.end = FollowEnd::kReached;
      return result;
    }
    const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
                             Clock::now() - start)
                             .count();
    if (options.timeout_ms >= 0 && elapsed > options.timeout_ms) {
      result.end = FollowEnd::kTimedOut;
      return result;
    }
    if (idle) SleepUnlessStopped(options.poll_ms, options.stop);
  }
}

}  // namespace refit
