// Internal to the library: what the protocol adds to the public object
// store interface (refit/store.h), which this header includes.
#ifndef REFIT_TRANSPORT_OBJECT_STORE_H_
#define REFIT_TRANSPORT_OBJECT_STORE_H_

#include <span>
#include <string>

#include "refit/status.h"
#include "refit/store.h"

namespace refit {

// Stores an object that must never change once written: PutIfAbsent, where
// a key already holding exactly `bytes` is success (a writer re-running
// the same deterministic work) and other bytes are kFailedPrecondition,
// with `on_conflict` (what to do about it) appended to the message.
Status PutOnce(ObjectStore* store, const std::string& key, std::span<const uint8_t> bytes,
               const std::string& on_conflict);

}  // namespace refit

#endif  // REFIT_TRANSPORT_OBJECT_STORE_H_
