// Superseded versions: a publisher or coordinator that starts version V
// while earlier versions above the last committed one were announced but
// never decided (their writer stopped) decides each of them "abort", so
// that no receiver waits on them (docs/protocol.md, "Publisher").
#ifndef REFIT_SYNC_SUPERSEDE_H_
#define REFIT_SYNC_SUPERSEDE_H_

#include <cstdint>
#include <string_view>

#include "refit/status.h"
#include "sync/auth.h"
#include "transport/object_store.h"

namespace refit {

// Writes an abort decision, sealed by `auth`, for every announced version
// in (committed, version) that has none; `writer` names who stopped
// ("publisher", "coordinator") in the decision's reason. A decision another
// writer made first stands.
Status AbortSuperseded(ObjectStore* store, const Authenticator& auth,
                       uint64_t committed, uint64_t version,
                       std::string_view writer);

}  // namespace refit

#endif  // REFIT_SYNC_SUPERSEDE_H_
