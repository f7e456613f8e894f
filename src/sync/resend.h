// Overwrite re-sends (docs/protocol.md, "Publisher" step 5 and "Versions
// from many ranks"): a receiver that finds a chunk's range torn (neither
// its "before" nor its "after" hash, as a kill inside the write leaves
// it) stores a request, v/<V>/request/<member>, naming the chunks and
// whether it needs each range at V ("after") or at the base; whoever holds
// those bytes stores, for each, an overwrite chunk of the same range at
// v/<V>/resend/<member>/<i>-a (or -b). The publisher serves every
// chunk of its versions; on a direct version each rank serves the chunks
// of its own part.
//
// MakeResend builds the re-send of `original` from `desired`, the range's
// bytes (count * width, in the chunk's element order: a strided region
// packed row after row) at V when `after`, else at the base: the same
// header with the hashes swapped for a re-send at the base, a sparse
// overwrite of the original's changed positions for sparse kinds, raw
// bytes otherwise.
//
// ServeResends reads the stored requests of `version` that changed since
// they were served (`served`: request key -> SHA-256 of the request as
// served last, kept by the caller between calls), ignores those that fail
// member authentication or decoding, and asks `resend(chunk, after)` for
// each requested chunk: the serialized re-send, or nullopt where this
// writer does not hold that chunk (another writer may). What it returns is
// sealed with `auth` and stored; `*count` counts the re-sends stored.
// Errors of the store and of `resend` end the call with that error.
#ifndef REFIT_SYNC_RESEND_H_
#define REFIT_SYNC_RESEND_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "delta/chunk.h"
#include "refit/auth.h"
#include "refit/status.h"
#include "sync/auth.h"
#include "transport/object_store.h"

namespace refit {

Result<std::vector<uint8_t>> MakeResend(const ParsedChunk& original, const uint8_t* desired,
                                        bool after);

using ResendFn =
    std::function<Result<std::optional<std::vector<uint8_t>>>(uint64_t chunk, bool after)>;

Status ServeResends(ObjectStore* store, const Authenticator& auth, uint64_t version,
                    std::map<std::string, Sha256>* served, const ResendFn& resend,
                    uint64_t* count);

}  // namespace refit

#endif  // REFIT_SYNC_RESEND_H_
