#include "sync/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <cstring>

#include "base/file.h"

namespace refit {
namespace {

constexpr uint8_t kMagic[4] = {'R', 'F', 'A', 'E'};
constexpr uint8_t kSchemeNone = 0;
constexpr uint8_t kSchemeHmac = 1;
constexpr size_t kTagBytes = 32;

std::array<uint8_t, 32> HmacTag(const std::vector<uint8_t>& key,
                                std::span<const uint8_t> data) {
  std::array<uint8_t, 32> tag{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), data.data(),
       data.size(), tag.data(), &len);
  return tag;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Sha256 ComputeSha256(std::span<const uint8_t> data) {
  Sha256 out{};
  SHA256(data.data(), data.size(), out.data());
  return out;
}

std::string HexOf(std::span<const uint8_t> bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

Result<Authenticator> Authenticator::Hmac(std::vector<uint8_t> key) {
  if (key.size() < 16) {
    return InvalidArgumentError("HMAC key must be at least 16 bytes");
  }
  Authenticator a;
  a.key_ = std::move(key);
  return a;
}

Result<Authenticator> Authenticator::FromKeyFile(const std::string& path) {
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> raw, ReadFile(path));
  std::string text(raw.begin(), raw.end());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' ||
                           text.back() == ' ')) {
    text.pop_back();
  }
  bool hex = text.size() >= 64 && text.size() % 2 == 0;
  for (char c : text) hex = hex && HexValue(c) >= 0;
  if (hex) {
    std::vector<uint8_t> key;
    for (size_t i = 0; i < text.size(); i += 2) {
      key.push_back(static_cast<uint8_t>(HexValue(text[i]) * 16 + HexValue(text[i + 1])));
    }
    return Hmac(std::move(key));
  }
  return Hmac(std::move(raw));
}

std::vector<uint8_t> Authenticator::Seal(std::span<const uint8_t> body) const {
  const size_t tag = enabled() ? kTagBytes : 0;
  std::vector<uint8_t> out(5 + body.size() + tag);
  std::memcpy(out.data(), kMagic, 4);
  out[4] = enabled() ? kSchemeHmac : kSchemeNone;
  if (!body.empty()) std::memcpy(out.data() + 5, body.data(), body.size());
  if (enabled()) {
    auto t = HmacTag(key_, std::span<const uint8_t>(out.data(), 5 + body.size()));
    std::memcpy(out.data() + 5 + body.size(), t.data(), kTagBytes);
  }
  return out;
}

Result<std::span<const uint8_t>> Authenticator::Open(
    std::span<const uint8_t> env) const {
  if (env.size() < 5 || std::memcmp(env.data(), kMagic, 4) != 0) {
    return DataLossError("not a refit envelope (bad magic or truncated)");
  }
  const uint8_t scheme = env[4];
  if (scheme == kSchemeNone) {
    if (enabled()) {
      return UnauthenticatedError(
          "object carries no authentication tag but this node requires HMAC; "
          "the sender was started without the shared key");
    }
    return env.subspan(5);
  }
  if (scheme != kSchemeHmac) {
    return DataLossError("envelope has unknown scheme " + std::to_string(scheme));
  }
  if (!enabled()) {
    return UnauthenticatedError(
        "object is HMAC-authenticated but this node has no key; pass the "
        "shared key (--key-file)");
  }
  if (env.size() < 5 + kTagBytes) return DataLossError("envelope truncated");
  auto signed_part = env.first(env.size() - kTagBytes);
  auto tag = HmacTag(key_, signed_part);
  if (CRYPTO_memcmp(tag.data(), env.data() + env.size() - kTagBytes, kTagBytes) != 0) {
    return UnauthenticatedError("authentication tag mismatch: the object was "
                                "tampered with or signed with another key");
  }
  return env.subspan(5, env.size() - 5 - kTagBytes);
}

}  // namespace refit
