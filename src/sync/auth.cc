#include "sync/auth.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/sha.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "base/file.h"

namespace refit {
namespace {

constexpr uint8_t kMagic[4] = {'R', 'F', 'A', 'E'};
constexpr uint8_t kSchemeNone = 0;
constexpr uint8_t kSchemeHmac = 1;
constexpr uint8_t kSchemeEd25519 = 2;
constexpr size_t kTagBytes = 32;
constexpr size_t kSignatureBytes = 64;

std::shared_ptr<void> Own(EVP_PKEY* key) {
  return std::shared_ptr<void>(key, [](void* k) { EVP_PKEY_free(static_cast<EVP_PKEY*>(k)); });
}
EVP_PKEY* Key(const std::shared_ptr<void>& k) { return static_cast<EVP_PKEY*>(k.get()); }

bool Sign(EVP_PKEY* key, std::span<const uint8_t> data, uint8_t* signature) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  size_t len = kSignatureBytes;
  bool ok = ctx != nullptr && EVP_DigestSignInit(ctx, nullptr, nullptr, nullptr, key) == 1 &&
            EVP_DigestSign(ctx, signature, &len, data.data(), data.size()) == 1 &&
            len == kSignatureBytes;
  EVP_MD_CTX_free(ctx);
  return ok;
}

bool Verify(EVP_PKEY* key, std::span<const uint8_t> data, const uint8_t* signature) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok = ctx != nullptr && EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, key) == 1 &&
            EVP_DigestVerify(ctx, signature, kSignatureBytes, data.data(), data.size()) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

Result<std::vector<uint8_t>> RawKey(EVP_PKEY* key, bool private_half) {
  std::vector<uint8_t> out(32);
  size_t len = out.size();
  int rc = private_half ? EVP_PKEY_get_raw_private_key(key, out.data(), &len)
                        : EVP_PKEY_get_raw_public_key(key, out.data(), &len);
  if (rc != 1 || len != 32) return InternalError("cannot read an Ed25519 key's raw bytes");
  return out;
}

// Reads an Ed25519 key from a PEM file, or 32 raw bytes.
Result<std::shared_ptr<void>> ReadKeyFile(const std::string& path, bool private_half) {
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> raw, ReadFile(path));
  const char* what = private_half ? "signing key" : "verify key";
  EVP_PKEY* key = nullptr;
  if (raw.size() == 32) {
    key = private_half
              ? EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, raw.data(), raw.size())
              : EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, raw.data(), raw.size());
  } else {
    BIO* bio = BIO_new_mem_buf(raw.data(), static_cast<int>(raw.size()));
    if (bio == nullptr) return InternalError("out of memory reading " + path);
    key = private_half ? PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr)
                       : PEM_read_bio_PUBKEY(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
  }
  if (key == nullptr) {
    return InvalidArgumentError(std::string(what) + " file '" + path +
                                "' is neither a PEM " +
                                (private_half ? "private" : "public") +
                                " key nor 32 raw bytes");
  }
  auto owned = Own(key);
  if (EVP_PKEY_get_base_id(key) != EVP_PKEY_ED25519) {
    return InvalidArgumentError(std::string(what) + " file '" + path +
                                "' holds a key of another algorithm; refit signs with Ed25519");
  }
  return owned;
}

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

Result<Authenticator> Authenticator::WithSigningKey(std::span<const uint8_t> private_key) const {
  if (private_key.size() != 32) return InvalidArgumentError("an Ed25519 private key is 32 bytes");
  EVP_PKEY* key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, private_key.data(),
                                               private_key.size());
  if (key == nullptr) return InvalidArgumentError("not an Ed25519 private key");
  Authenticator a = *this;
  a.sign_ = Own(key);
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> pub, RawKey(key, false));
  EVP_PKEY* verify = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, pub.data(), 32);
  if (verify == nullptr) return InternalError("cannot derive an Ed25519 public key");
  a.verify_ = Own(verify);
  return a;
}

Result<Authenticator> Authenticator::WithVerifyKey(std::span<const uint8_t> public_key) const {
  if (public_key.size() != 32) return InvalidArgumentError("an Ed25519 public key is 32 bytes");
  EVP_PKEY* key = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, public_key.data(),
                                              public_key.size());
  if (key == nullptr) return InvalidArgumentError("not an Ed25519 public key");
  Authenticator a = *this;
  a.verify_ = Own(key);
  return a;
}

Result<Authenticator> Authenticator::WithSigningKeyFile(const std::string& path) const {
  REFIT_ASSIGN_OR_RETURN(std::shared_ptr<void> key, ReadKeyFile(path, true));
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> raw, RawKey(Key(key), true));
  return WithSigningKey(raw);
}

Result<Authenticator> Authenticator::WithVerifyKeyFile(const std::string& path) const {
  REFIT_ASSIGN_OR_RETURN(std::shared_ptr<void> key, ReadKeyFile(path, false));
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> raw, RawKey(Key(key), false));
  return WithVerifyKey(raw);
}

Result<std::pair<std::vector<uint8_t>, std::vector<uint8_t>>> Authenticator::GenerateEd25519() {
  EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (key == nullptr) return InternalError("Ed25519 key generation failed");
  auto owned = Own(key);
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> priv, RawKey(key, true));
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> pub, RawKey(key, false));
  return std::make_pair(std::move(priv), std::move(pub));
}

Status Authenticator::WriteEd25519KeyFiles(const std::string& private_pem,
                                           const std::string& public_pem) {
  for (const std::string& path : {private_pem, public_pem}) {
    struct stat st;
    if (lstat(path.c_str(), &st) == 0) {
      return FailedPreconditionError("key file '" + path +
                                     "' exists; an existing key file is never overwritten");
    }
  }
  EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (key == nullptr) return InternalError("Ed25519 key generation failed");
  auto owned = Own(key);
  auto write = [&](const std::string& path, bool private_half) -> Status {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                  private_half ? 0600 : 0644);
    if (fd < 0) {
      return FailedPreconditionError("cannot create '" + path + "': " + std::strerror(errno) +
                                     " (an existing key file is never overwritten)");
    }
    FILE* f = fdopen(fd, "w");
    if (f == nullptr) {
      close(fd);
      return UnavailableError("cannot write '" + path + "'");
    }
    int ok = private_half ? PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr)
                          : PEM_write_PUBKEY(f, key);
    bool synced = fflush(f) == 0 && fsync(fileno(f)) == 0;
    fclose(f);
    if (ok != 1 || !synced) return UnavailableError("cannot write the key to '" + path + "'");
    return Status();
  };
  REFIT_RETURN_IF_ERROR(write(private_pem, true));
  return write(public_pem, false);
}

std::vector<uint8_t> Authenticator::Seal(std::span<const uint8_t> body) const {
  return SealWith(body, /*allow_sign=*/true);
}

std::vector<uint8_t> Authenticator::SealMember(std::span<const uint8_t> body) const {
  return SealWith(body, /*allow_sign=*/false);
}

Result<std::span<const uint8_t>> Authenticator::Open(std::span<const uint8_t> env) const {
  return OpenWith(env, /*publisher=*/true);
}

Result<std::span<const uint8_t>> Authenticator::OpenMember(std::span<const uint8_t> env) const {
  return OpenWith(env, /*publisher=*/false);
}

std::vector<uint8_t> Authenticator::SealWith(std::span<const uint8_t> body,
                                             bool allow_sign) const {
  if (allow_sign && sign_) {
    std::vector<uint8_t> out(5 + body.size() + kSignatureBytes);
    std::memcpy(out.data(), kMagic, 4);
    out[4] = kSchemeEd25519;
    if (!body.empty()) std::memcpy(out.data() + 5, body.data(), body.size());
    if (!Sign(Key(sign_), std::span<const uint8_t>(out.data(), 5 + body.size()),
              out.data() + 5 + body.size())) {
      // Signing with a valid key does not fail; should it, the zero
      // signature is refused by every verifier (never silently accepted).
      std::memset(out.data() + 5 + body.size(), 0, kSignatureBytes);
    }
    return out;
  }
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

Result<std::span<const uint8_t>> Authenticator::OpenWith(std::span<const uint8_t> env,
                                                         bool publisher) const {
  if (env.size() < 5 || std::memcmp(env.data(), kMagic, 4) != 0) {
    return DataLossError("not a refit envelope (bad magic or truncated)");
  }
  const uint8_t scheme = env[4];
  if (scheme == kSchemeEd25519) {
    if (!publisher) {
      return UnauthenticatedError("a member's object carries a publisher signature");
    }
    if (!verify_) {
      return UnauthenticatedError(
          "object is signed (Ed25519) but this node has no verify key; pass the "
          "publisher's public key (--verify-key)");
    }
    if (env.size() < 5 + kSignatureBytes) return DataLossError("envelope truncated");
    auto signed_part = env.first(env.size() - kSignatureBytes);
    if (!Verify(Key(verify_), signed_part, env.data() + env.size() - kSignatureBytes)) {
      return UnauthenticatedError("Ed25519 signature mismatch: the object was tampered "
                                  "with or signed with another key");
    }
    return env.subspan(5, env.size() - 5 - kSignatureBytes);
  }
  if (publisher && verify_) {
    return UnauthenticatedError(
        "object is not signed but this node requires the publisher's Ed25519 "
        "signature; the publisher was started without --sign-key");
  }
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
