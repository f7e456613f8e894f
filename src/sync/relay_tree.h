// The version protocol on a relay tree (docs/protocol.md, "Relay tree"):
// the key classifier every relay endpoint of the protocol needs.
// Thread-safe.
#ifndef REFIT_SYNC_RELAY_TREE_H_
#define REFIT_SYNC_RELAY_TREE_H_

#include <memory>

#include "transport/relay_store.h"

namespace refit {

// The protocol's keys (sync/keys.h) for RelayOptions::keys: members' keys
// (votes, done reports, re-send requests) flow up; index/<V> and v/<V>/...
// belong to version V; head and snapshots are never evicted.
std::shared_ptr<const RelayKeyClassifier> ProtocolRelayKeys();

}  // namespace refit

#endif  // REFIT_SYNC_RELAY_TREE_H_
