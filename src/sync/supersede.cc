#include "sync/supersede.h"

#include <string>

#include "sync/keys.h"
#include "sync/protocol.h"

namespace refit {

Status AbortSuperseded(ObjectStore* store, const Authenticator& auth,
                       uint64_t committed, uint64_t version,
                       std::string_view writer) {
  REFIT_ASSIGN_OR_RETURN(auto indexes, store->List(kIndexPrefix));
  for (const uint64_t w : VersionsOf(indexes)) {
    if (w <= committed || w >= version) continue;
    Decision d;
    d.version = w;
    d.commit = false;
    d.reason = "superseded by version " + std::to_string(version) +
               " before it was decided (its " + std::string(writer) + " stopped)";
    Status s = store->PutIfAbsent(DecisionKey(w), auth.Seal(EncodeDecision(d)));
    if (!s.ok() && s.code() != StatusCode::kAlreadyExists) return s;
  }
  return Status();
}

}  // namespace refit
