// Authentication of everything that crosses the transport
// (docs/protocol.md, "Authentication").
//
// An envelope is `magic "RFAE" | u8 scheme | body | tag`. Scheme 0 carries
// no tag (for trusted links and tests); scheme 1 carries HMAC-SHA256 of
// magic, scheme and body under a shared key; scheme 2 carries an Ed25519
// signature of magic, scheme and body by the publisher's private key,
// checked with its public key. Open() checks the tag before returning the
// body, so nothing unauthenticated is ever parsed.
//
// Objects the publisher writes (announcements, chunks, manifests,
// decisions, head, re-sends, snapshot indexes) go through Seal / Open:
// signed when the node holds a signing key, and required to be signed when
// it holds a verify key. Objects members write (votes, requests, done
// reports) go through SealMember / OpenMember: members hold no private key,
// so these use the shared HMAC key when there is one, else no tag.
// Authenticator is immutable after construction and thread-safe.
#ifndef REFIT_AUTH_H_
#define REFIT_AUTH_H_

#include <array>
#include <cstdint>
#include <memory>
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

  // The same with Ed25519 signatures of publisher objects: a signing key
  // (the publisher: signs, and verifies with its public half) or a verify
  // key (receivers). Keys are 32 raw bytes, or PEM files as
  // `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` write.
  Result<Authenticator> WithSigningKey(
      std::span<const uint8_t> private_key) const;
  Result<Authenticator> WithVerifyKey(
      std::span<const uint8_t> public_key) const;
  Result<Authenticator> WithSigningKeyFile(const std::string& pem_path) const;
  Result<Authenticator> WithVerifyKeyFile(const std::string& pem_path) const;
  // A fresh key pair: {private, public}, 32 raw bytes each.
  static Result<std::pair<std::vector<uint8_t>, std::vector<uint8_t>>>
  GenerateEd25519();
  // Writes a fresh key pair as PEM files (private: mode 0600).
  static Status WriteEd25519KeyFiles(const std::string& private_pem,
                                     const std::string& public_pem);

  bool enabled() const { return !key_.empty(); }
  bool signs() const { return sign_ != nullptr; }
  bool verifies() const { return verify_ != nullptr; }

  // Publisher objects: wraps `body` in an envelope (scheme 2 with a
  // signing key, else 1 with a shared key, else 0).
  std::vector<uint8_t> Seal(std::span<const uint8_t> body) const;
  // Returns the body of a publisher object after checking its tag (a node
  // with a verify key accepts only scheme 2); kUnauthenticated for a
  // missing, wrong or unexpected tag, kDataLoss for a malformed one.
  Result<std::span<const uint8_t>> Open(
      std::span<const uint8_t> envelope) const;
  // Member objects: scheme 1 with a shared key, else 0.
  std::vector<uint8_t> SealMember(std::span<const uint8_t> body) const;
  Result<std::span<const uint8_t>> OpenMember(
      std::span<const uint8_t> envelope) const;

 private:
  Authenticator() = default;
  std::vector<uint8_t> SealWith(std::span<const uint8_t> body,
                                bool allow_sign) const;
  Result<std::span<const uint8_t>> OpenWith(std::span<const uint8_t> envelope,
                                            bool publisher) const;
  std::vector<uint8_t> key_;
  std::shared_ptr<void> sign_;    // EVP_PKEY* (Ed25519 private key)
  std::shared_ptr<void> verify_;  // EVP_PKEY* (Ed25519 public key)
};

}  // namespace refit

#endif  // REFIT_AUTH_H_
