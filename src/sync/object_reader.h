// ObjectReader: reads the version protocol's sealed objects back from a
// store (docs/protocol.md, "Store layout", "Authentication"). Each read
// gets the object at its key (sync/keys.h), opens its envelope (Open for
// the publisher's objects, OpenMember for members'), decodes it
// (sync/protocol.h) and checks that it names the version it was read for,
// so every reader of a store applies the same checks.
//
// Errors: the store's (kUnavailable, ...), the envelope's (kUnauthenticated
// for a tag of another key or none, kDataLoss for a malformed envelope) or
// the decoder's (kDataLoss), and kDataLoss for an object that names another
// version. `step`, when given, says which of fetch, open and decode failed,
// for callers whose advice differs (another key, or a damaged object).
// Absent objects are nullopt, except where the caller listed the key
// (announcements), whose absence is the store's kNotFound.
//
// Borrows the store (which must outlive the reader) and copies the
// Authenticator. As thread-safe as the store.
#ifndef REFIT_SYNC_OBJECT_READER_H_
#define REFIT_SYNC_OBJECT_READER_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "refit/status.h"
#include "sync/auth.h"
#include "sync/protocol.h"
#include "transport/object_store.h"

namespace refit {

class ObjectReader {
 public:
  enum class Step { kFetch, kOpen, kDecode };

  ObjectReader(ObjectStore* store, Authenticator auth)
      : store_(store), auth_(std::move(auth)) {}

  // The committed version `head` records; nullopt when there is no head.
  Result<std::optional<uint64_t>> ReadHead(Step* step = nullptr) const;
  // The versions the store announces (its index/ keys), ascending.
  Result<std::vector<uint64_t>> ListVersions() const;
  // `sha`, when given, receives the SHA-256 of the stored bytes.
  Result<Announcement> ReadAnnouncement(uint64_t version, Sha256* sha = nullptr,
                                        Step* step = nullptr) const;
  Result<std::optional<Manifest>> ReadManifest(uint64_t version,
                                               Sha256* sha = nullptr,
                                               Step* step = nullptr) const;
  Result<std::optional<Decision>> ReadDecision(uint64_t version,
                                               Step* step = nullptr) const;
  Result<std::optional<Vote>> ReadVote(uint64_t version,
                                       const std::string& member,
                                       Step* step = nullptr) const;

 private:
  // The opened body of the object at `key`, or nullopt when it is absent.
  Result<std::optional<std::vector<uint8_t>>> Open(const std::string& key,
                                                   bool member, Sha256* sha,
                                                   Step* step) const;

  ObjectStore* store_;
  Authenticator auth_;
};

}  // namespace refit

#endif  // REFIT_SYNC_OBJECT_READER_H_
