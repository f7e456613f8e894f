// Authentication of everything that crosses the transport
// (docs/protocol.md, "Authentication").
//
// An envelope is `magic "RFAE" | u8 scheme | body | tag`. Scheme 0 carries
// no tag (for trusted links and tests); scheme 1 carries HMAC-SHA256 of
// magic, scheme and body under a shared key. Open() checks the tag before
// returning the body, so nothing unauthenticated is ever parsed.
// Authenticator is immutable after construction and thread-safe.
#ifndef REFIT_SYNC_AUTH_H_
#define REFIT_SYNC_AUTH_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "refit/status.h"

namespace refit {

using Sha256 = std::array<uint8_t, 32>;

Sha256 ComputeSha256(std::span<const uint8_t> data);
std::string HexOf(std::span<const uint8_t> bytes);

class Authenticator {
 public:
  // No authentication: envelopes carry no tag and any untagged envelope is
  // accepted; tagged ones are refused.
  static Authenticator None() { return Authenticator(); }
  // HMAC-SHA256 with `key` (at least 16 bytes).
  static Result<Authenticator> Hmac(std::vector<uint8_t> key);
  // Reads a key file (raw bytes, or 64+ hex digits on one line).
  static Result<Authenticator> FromKeyFile(const std::string& path);

  bool enabled() const { return !key_.empty(); }

  // Wraps `body` in an envelope.
  std::vector<uint8_t> Seal(std::span<const uint8_t> body) const;
  // Returns the body of an envelope after checking its tag; kUnauthenticated
  // for a missing, wrong or unexpected tag, kDataLoss for a malformed one.
  Result<std::span<const uint8_t>> Open(std::span<const uint8_t> envelope) const;

 private:
  Authenticator() = default;
  std::vector<uint8_t> key_;
};

}  // namespace refit

#endif  // REFIT_SYNC_AUTH_H_
