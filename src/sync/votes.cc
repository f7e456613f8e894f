#include "sync/votes.h"

#include <chrono>

#include "sync/keys.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

int64_t ElapsedMs(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
}

}  // namespace

Result<CollectedVotes> CollectVotes(ObjectStore* store, const Authenticator& auth,
                                    uint64_t version, const std::vector<std::string>& members,
                                    const VoteWait& wait,
                                    const std::function<Status()>& each_round) {
  const auto start = Clock::now();
  CollectedVotes out;
  while (out.votes.size() < members.size() && !out.any_failed &&
         ElapsedMs(start) <= wait.timeout_ms) {
    // Taken before looking: a vote stored from here on ends the wait.
    const uint64_t since = store->ChangeCount();
    for (const std::string& member : members) {
      if (out.votes.count(member)) continue;
      auto v = store->Get(VoteKey(version, member));
      if (!v.ok()) {
        if (v.status().code() != StatusCode::kNotFound) return v.status();
        continue;
      }
      auto body = auth.OpenMember(*v);
      if (!body.ok()) continue;  // forged or damaged: not a vote
      auto vote = DecodeVote(*body);
      if (!vote.ok()) continue;
      out.any_failed = out.any_failed || !vote->ready;
      out.votes[member] = std::move(*vote);
    }
    if (each_round) REFIT_RETURN_IF_ERROR(each_round());
    if (out.votes.size() < members.size() && !out.any_failed) {
      store->AwaitChange(since, wait.poll_ms);
    }
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

Result<Decision> WriteDecision(ObjectStore* store, const Authenticator& auth, const Decision& d) {
  Status put = store->PutIfAbsent(DecisionKey(d.version), auth.Seal(EncodeDecision(d)));
  if (put.code() != StatusCode::kAlreadyExists) {
    REFIT_RETURN_IF_ERROR(put);
    return d;
  }
  REFIT_ASSIGN_OR_RETURN(auto bytes, store->Get(DecisionKey(d.version)));
  REFIT_ASSIGN_OR_RETURN(auto body, auth.Open(bytes));
  return DecodeDecision(body);
}

}  // namespace refit
