// Vote collection and the one decision, shared by every writer of
// decisions: the publisher (which serves overwrite re-sends while it
// waits) and the direct coordinator of versions from many ranks
// (docs/protocol.md, "Publisher" steps 5-6 and "Versions from many ranks").
//
// CollectVotes reads vote/<version>/<member> for each member until every
// member voted, one voted not ready, or the deadline passed; a vote that
// fails authentication or decoding is not a vote (it stays missing).
// Between rounds it calls `each_round` (the publisher's re-sends) and then
// waits for the store to change, at most `poll_ms`. Errors of the store
// other than NOT_FOUND, and errors of `each_round`, end it with that error.
//
// WriteDecision stores `d` sealed under decision/<version> unless one is
// stored already, and returns the decision that stands: `d`, or the one
// another writer stored first.
#ifndef REFIT_SYNC_VOTES_H_
#define REFIT_SYNC_VOTES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "refit/status.h"
#include "sync/auth.h"
#include "sync/protocol.h"
#include "transport/object_store.h"

namespace refit {

struct VoteWait {
  int timeout_ms = 60000;  // from the call, for all members together
  int poll_ms = 20;        // the longest wait for a store change per round
};

struct CollectedVotes {
  std::map<std::string, Vote> votes;  // by member; only those that voted
  bool any_failed = false;            // some member voted not ready
  double seconds = 0;                 // spent waiting
};

Result<CollectedVotes> CollectVotes(ObjectStore* store, const Authenticator& auth,
                                    uint64_t version, const std::vector<std::string>& members,
                                    const VoteWait& wait,
                                    const std::function<Status()>& each_round = nullptr);

Result<Decision> WriteDecision(ObjectStore* store, const Authenticator& auth, const Decision& d);

}  // namespace refit

#endif  // REFIT_SYNC_VOTES_H_
