// Fuzz target: the version protocol's object decoders (sync/protocol.h,
// docs/protocol.md) and the authentication envelope they arrive in
// (sync/auth.h). Beyond "no crash, no UB", every object a decoder accepts
// must survive a round trip: its encoding decodes to the same object, the
// encoder is deterministic and stable (encode(decode(encode(o))) is
// byte-equal to encode(o)), and the encoding is never longer than the
// accepted input (a decoder may accept non-minimal varints and trailing
// bytes, but never drop or invent content), and every member name it
// carries (members, dropped members) is a valid one. An envelope that
// opens must be exactly what Seal makes of its body (each scheme is
// canonical).
//
// Input: one selector byte, then the object.
//   bits 0-2  the decoder: 0 announcement, 1 manifest, 2 vote, 3 decision,
//             4 re-send request, 5 snapshot index, 6 head, 7 key parsing
//             (sync/keys.h)
//   bits 3-4  the envelope: 0 none (the bytes are the decoder's input),
//             1 opened with Authenticator::None(), 2 with a fixed HMAC key,
//             3 with the HMAC key and a fixed Ed25519 signing key
//   bit 5     append the object's XXH3-64 seal to the bytes, so mutations
//             reach the parser behind the checksum
//   bit 6     seal the bytes in the envelope here (with envelope mode > 0),
//             so mutations reach the parser behind the tag
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "sync/auth.h"
#include "sync/keys.h"
#include "sync/protocol.h"

namespace {

using refit::Result;

void Check(bool ok) {
  if (!ok) std::abort();
}

bool SameTensors(const std::vector<refit::TensorEntry>& a,
                 const std::vector<refit::TensorEntry>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const refit::TensorEntry& x = a[i];
    const refit::TensorEntry& y = b[i];
    if (x.name != y.name || x.dtype != y.dtype || x.width != y.width ||
        x.shape != y.shape || x.num_elements != y.num_elements ||
        !(x.before == y.before) || !(x.after == y.after)) {
      return false;
    }
  }
  return true;
}

bool Same(const refit::Announcement& a, const refit::Announcement& b) {
  return a.version == b.version && a.base_version == b.base_version &&
         a.members == b.members && SameTensors(a.tensors, b.tensors);
}

bool Same(const refit::Manifest& a, const refit::Manifest& b) {
  if (a.version != b.version || a.base_version != b.base_version ||
      a.members != b.members || !SameTensors(a.tensors, b.tensors) ||
      a.direct != b.direct || a.chunks.size() != b.chunks.size()) {
    return false;
  }
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    const refit::ManifestChunk& x = a.chunks[i];
    const refit::ManifestChunk& y = b.chunks[i];
    if (x.size != y.size || x.sha256 != y.sha256 || x.tensor_id != y.tensor_id ||
        x.start != y.start || x.count != y.count || x.changed != y.changed ||
        x.kind != y.kind || x.run != y.run || x.stride != y.stride ||
        x.in_part != y.in_part || x.rank != y.rank || x.part_index != y.part_index ||
        x.pack_offset != y.pack_offset) {
      return false;
    }
  }
  return true;
}

bool Same(const refit::Vote& a, const refit::Vote& b) {
  if (a.ready != b.ready || a.message != b.message || a.tensors.size() != b.tensors.size()) {
    return false;
  }
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (!(a.tensors[i] == b.tensors[i])) return false;
  }
  return true;
}

bool Same(const refit::Decision& a, const refit::Decision& b) {
  return a.version == b.version && a.commit == b.commit &&
         a.dropped == b.dropped && a.reason == b.reason;
}

bool Same(const refit::ResendRequest& a, const refit::ResendRequest& b) {
  return a.chunks == b.chunks && a.after == b.after;
}

bool Same(const refit::SnapshotIndex& a, const refit::SnapshotIndex& b) {
  if (a.version != b.version || a.files.size() != b.files.size() ||
      !SameTensors(a.tensors, b.tensors)) {
    return false;
  }
  for (size_t i = 0; i < a.files.size(); ++i) {
    if (a.files[i].name != b.files[i].name || a.files[i].size != b.files[i].size ||
        a.files[i].sha256 != b.files[i].sha256) {
      return false;
    }
  }
  return true;
}

bool Same(uint64_t a, uint64_t b) { return a == b; }

// Member names an accepted object carries are valid member names: they
// key votes and requests (sync/keys.h).
bool NamesValid(const std::vector<std::string>& names) {
  for (const std::string& m : names) {
    if (!refit::ValidateMember(m).ok()) return false;
  }
  return true;
}
bool Valid(const refit::Announcement& a) { return NamesValid(a.members); }
bool Valid(const refit::Manifest& m) { return NamesValid(m.members); }
bool Valid(const refit::Decision& d) { return NamesValid(d.dropped); }
template <typename T>
bool Valid(const T&) {
  return true;
}

// Decodes `bytes`; on success checks the round trip described above.
template <typename T>
void RoundTrip(std::span<const uint8_t> bytes,
               Result<T> (*decode)(std::span<const uint8_t>),
               std::vector<uint8_t> (*encode)(const T&)) {
  Result<T> obj = decode(bytes);
  if (!obj.ok()) {
    Check(!obj.status().message().empty());
    return;
  }
  Check(Valid(*obj));
  const std::vector<uint8_t> e1 = encode(*obj);
  Check(e1.size() <= bytes.size());
  Check(encode(*obj) == e1);
  Result<T> again = decode(e1);
  Check(again.ok());
  Check(Same(*obj, *again));
  Check(encode(*again) == e1);
}

std::vector<uint8_t> EncodeHeadOf(const uint64_t& v) { return refit::EncodeHead(v); }

// Key helpers that parse strings (sync/keys.h): a key that parses must be
// the one its maker makes of the parsed fields, and member names that
// validate must stay within their documented alphabet and length.
void CheckKeys(std::span<const uint8_t> bytes) {
  const std::string text(bytes.begin(), bytes.end());
  if (auto v = refit::ParseSnapshotIndexKey(text)) {
    Check(refit::SnapshotIndexKey(*v) == text);
  }
  if (auto v = refit::ParseIndexKey(text)) Check(refit::IndexKey(*v) == text);
  if (auto k = refit::ParseKey(text)) {
    Check(refit::KeyOf(*k) == text);
    Check(refit::IsMemberKey(text) == (k->kind == refit::KeyInfo::Kind::kVote ||
                                       k->kind == refit::KeyInfo::Kind::kDone ||
                                       k->kind == refit::KeyInfo::Kind::kRequest));
  } else {
    Check(!refit::IsMemberKey(text) && !refit::VersionOfKey(text));
  }
  if (refit::ValidateMember(text).ok()) {
    Check(!text.empty() && text.size() <= 64 && text != "." && text != "..");
  }
}

const refit::Authenticator& Auth(int mode) {
  static const refit::Authenticator none = refit::Authenticator::None();
  static const refit::Authenticator hmac = [] {
    auto a = refit::Authenticator::Hmac(std::vector<uint8_t>(32, 0x5a));
    if (!a.ok()) std::abort();
    return *a;
  }();
  static const refit::Authenticator signer = [] {
    auto a = hmac.WithSigningKey(std::vector<uint8_t>(32, 0x3c));
    if (!a.ok()) std::abort();
    return *a;
  }();
  if (mode == 1) return none;
  if (mode == 2) return hmac;
  return signer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  const int kind = selector & 7;
  const int envelope = (selector >> 3) & 3;
  const bool add_seal = (selector >> 5) & 1;
  const bool wrap = (selector >> 6) & 1;

  std::vector<uint8_t> bytes(data + 1, data + size);
  if (kind == 7) {
    CheckKeys(bytes);
    return 0;
  }
  if (add_seal) {
    const uint64_t h = XXH3_64bits(bytes.data(), bytes.size());
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(h >> (8 * i)));
  }

  // Votes and re-send requests are member objects; the rest the publisher's.
  const bool member = kind == 2 || kind == 4;
  std::vector<uint8_t> body_copy;
  std::span<const uint8_t> body(bytes);
  if (envelope != 0) {
    const refit::Authenticator& auth = Auth(envelope);
    auto seal = [&](std::span<const uint8_t> b) {
      return member ? auth.SealMember(b) : auth.Seal(b);
    };
    auto open = [&](std::span<const uint8_t> env) {
      return member ? auth.OpenMember(env) : auth.Open(env);
    };
    std::vector<uint8_t> env = wrap ? seal(bytes) : bytes;
    auto opened = open(env);
    if (wrap) Check(opened.ok());
    if (!opened.ok()) {
      Check(!opened.status().message().empty());
      return 0;
    }
    body_copy.assign(opened->begin(), opened->end());
    Check(seal(body_copy) == env);
    if (wrap) Check(body_copy == bytes);
    body = body_copy;
  }

  switch (kind) {
    case 0:
      RoundTrip<refit::Announcement>(body, refit::DecodeAnnouncement,
                                     refit::EncodeAnnouncement);
      break;
    case 1:
      RoundTrip<refit::Manifest>(body, refit::DecodeManifest, refit::EncodeManifest);
      break;
    case 2:
      RoundTrip<refit::Vote>(body, refit::DecodeVote, refit::EncodeVote);
      break;
    case 3:
      RoundTrip<refit::Decision>(body, refit::DecodeDecision, refit::EncodeDecision);
      break;
    case 4:
      RoundTrip<refit::ResendRequest>(body, refit::DecodeRequest, refit::EncodeRequest);
      break;
    case 5:
      RoundTrip<refit::SnapshotIndex>(body, refit::DecodeSnapshotIndex,
                                      refit::EncodeSnapshotIndex);
      break;
    case 6:
      RoundTrip<uint64_t>(body, refit::DecodeHead, EncodeHeadOf);
      break;
  }
  return 0;
}
