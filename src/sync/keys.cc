#include "sync/keys.h"

#include <algorithm>
#include <cstdio>

namespace refit {
namespace {

constexpr int kVersionDigits = 20;

std::string Padded(uint64_t v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llu", digits,
                static_cast<unsigned long long>(v));
  return buf;
}

// Reads the decimal number `text` as the makers write it: only digits, at
// least `min_digits` of them, no leading zero beyond that padding, and no
// overflow of u64.
std::optional<uint64_t> ParseNumber(std::string_view text, size_t min_digits) {
  if (text.empty() || text.size() < min_digits) return std::nullopt;
  if (text.size() > min_digits && text.size() > 1 && text[0] == '0') {
    return std::nullopt;
  }
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

std::optional<uint64_t> ParseVersion(std::string_view text) {
  if (text.size() != static_cast<size_t>(kVersionDigits)) return std::nullopt;
  return ParseNumber(text, kVersionDigits);
}

// Splits off the part of `*rest` before the next '/' (all of it when there
// is none) and drops it and the '/' from `*rest`.
std::string_view Segment(std::string_view* rest) {
  const size_t slash = rest->find('/');
  std::string_view seg = rest->substr(0, slash);
  *rest = slash == std::string_view::npos ? std::string_view()
                                          : rest->substr(slash + 1);
  return seg;
}

bool IsMember(std::string_view text) {
  return ValidateMember(std::string(text)).ok();
}

// The rest of a key after "v/<V>/".
std::optional<KeyInfo> ParseVersionObject(uint64_t version,
                                          std::string_view rest) {
  KeyInfo k;
  k.version = version;
  const bool last = rest.find('/') == std::string_view::npos;
  std::string_view what = Segment(&rest);
  if (what == "manifest" && last) {
    k.kind = KeyInfo::Kind::kManifest;
    return k;
  }
  if (what == "decision" && last) {
    k.kind = KeyInfo::Kind::kDecision;
    return k;
  }
  if (last) return std::nullopt;
  if (what == "chunk") {
    auto i = ParseNumber(rest, 8);
    if (!i) return std::nullopt;
    k.kind = KeyInfo::Kind::kChunk;
    k.index = *i;
    return k;
  }
  if (what == "vote" || what == "request") {
    std::string_view member = Segment(&rest);
    if (!IsMember(member)) return std::nullopt;
    k.member = std::string(member);
    if (rest.empty()) {
      k.kind = what == "vote" ? KeyInfo::Kind::kVote : KeyInfo::Kind::kRequest;
      return k;
    }
    if (what == "vote" && rest == "done") {
      k.kind = KeyInfo::Kind::kDone;
      return k;
    }
    return std::nullopt;
  }
  if (what == "resend") {
    std::string_view member = Segment(&rest);
    if (!IsMember(member) || rest.size() < 3 ||
        rest.find('/') != std::string_view::npos) {
      return std::nullopt;
    }
    const std::string_view side = rest.substr(rest.size() - 2);
    if (side != "-a" && side != "-b") return std::nullopt;
    auto i = ParseNumber(rest.substr(0, rest.size() - 2), 1);
    if (!i) return std::nullopt;
    k.kind = KeyInfo::Kind::kResend;
    k.member = std::string(member);
    k.index = *i;
    k.after = side == "-a";
    return k;
  }
  return std::nullopt;
}

}  // namespace

std::string IndexKey(uint64_t v) {
  return kIndexPrefix + Padded(v, kVersionDigits);
}
std::string VersionPrefix(uint64_t v) {
  return "v/" + Padded(v, kVersionDigits) + "/";
}
std::string ManifestKey(uint64_t v) { return VersionPrefix(v) + "manifest"; }
std::string ChunkKey(uint64_t v, uint64_t i) {
  return VersionPrefix(v) + "chunk/" + Padded(i, 8);
}
std::string PartChunkKey(uint64_t v, uint32_t rank, uint64_t k) {
  return PartsPrefix(v) + Padded(rank, 10) + "/chunk/" + Padded(k, 10);
}
std::string PartListKey(uint64_t v, uint32_t rank) {
  return PartsPrefix(v) + Padded(rank, 10) + "/list";
}
std::string PartsPrefix(uint64_t v) { return "parts/" + Padded(v, kVersionDigits) + "/"; }

std::optional<PartChunkId> ParsePartChunkKey(std::string_view key) {
  std::string_view rest = key;
  if (Segment(&rest) != "parts") return std::nullopt;
  const auto v = ParseVersion(Segment(&rest));
  const std::string_view rank_text = Segment(&rest);
  const auto rank = rank_text.size() == 10 ? ParseNumber(rank_text, 10) : std::nullopt;
  if (!v || !rank || *rank > UINT32_MAX || Segment(&rest) != "chunk") return std::nullopt;
  const auto k = ParseNumber(rest, 10);
  if (!k || rest.find('/') != std::string_view::npos) return std::nullopt;
  return PartChunkId{*v, static_cast<uint32_t>(*rank), *k};
}
std::string VotePrefix(uint64_t v) { return VersionPrefix(v) + "vote/"; }
std::string VoteKey(uint64_t v, const std::string& m) {
  return VotePrefix(v) + m;
}
std::string DoneKey(uint64_t v, const std::string& m) {
  return VoteKey(v, m) + "/done";
}
std::string DecisionKey(uint64_t v) { return VersionPrefix(v) + "decision"; }
std::string RequestPrefix(uint64_t v) { return VersionPrefix(v) + "request/"; }
std::string RequestKey(uint64_t v, const std::string& m) {
  return RequestPrefix(v) + m;
}
std::string ResendPrefix(uint64_t v) { return VersionPrefix(v) + "resend/"; }
std::string ResendKey(uint64_t v, const std::string& m, uint64_t i,
                      bool after) {
  return ResendPrefix(v) + m + "/" + std::to_string(i) + (after ? "-a" : "-b");
}
std::string SnapshotPrefix(uint64_t v) {
  return kSnapshotsPrefix + Padded(v, kVersionDigits) + "/";
}
std::string SnapshotIndexKey(uint64_t v) { return SnapshotPrefix(v) + "index"; }
std::string SnapshotFileKey(uint64_t v, uint64_t i) {
  return SnapshotPrefix(v) + "file/" + Padded(i, 8);
}

Status ValidateMember(const std::string& m) {
  if (m.empty() || m.size() > 64) {
    return InvalidArgumentError("member name must be 1..64 characters");
  }
  for (char c : m) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return InvalidArgumentError(
          "member name '" + m +
          "' may only use letters, digits, '.', '_', '-'");
    }
  }
  if (m == "." || m == "..") return InvalidArgumentError("bad member name");
  return Status();
}

std::optional<KeyInfo> ParseKey(std::string_view key) {
  // Valid keys have no empty segment, so a trailing '/' cannot hide below.
  if (!ValidateKey(key).ok()) return std::nullopt;
  if (key == kHeadKey) return KeyInfo{};
  std::string_view rest = key;
  const std::string_view top = Segment(&rest);
  if (top == "index") {
    auto v = ParseVersion(rest);
    if (!v) return std::nullopt;
    KeyInfo k;
    k.kind = KeyInfo::Kind::kIndex;
    k.version = *v;
    return k;
  }
  if (top != "v" && top != "snap") return std::nullopt;
  auto v = ParseVersion(Segment(&rest));
  if (!v || rest.empty()) return std::nullopt;
  if (top == "v") return ParseVersionObject(*v, rest);
  KeyInfo k;
  k.version = *v;
  if (rest == "index") {
    k.kind = KeyInfo::Kind::kSnapshotIndex;
    return k;
  }
  if (Segment(&rest) != "file") return std::nullopt;
  auto i = ParseNumber(rest, 8);
  if (!i) return std::nullopt;
  k.kind = KeyInfo::Kind::kSnapshotFile;
  k.index = *i;
  return k;
}

std::string KeyOf(const KeyInfo& k) {
  switch (k.kind) {
    case KeyInfo::Kind::kHead:
      return kHeadKey;
    case KeyInfo::Kind::kIndex:
      return IndexKey(k.version);
    case KeyInfo::Kind::kManifest:
      return ManifestKey(k.version);
    case KeyInfo::Kind::kChunk:
      return ChunkKey(k.version, k.index);
    case KeyInfo::Kind::kVote:
      return VoteKey(k.version, k.member);
    case KeyInfo::Kind::kDone:
      return DoneKey(k.version, k.member);
    case KeyInfo::Kind::kDecision:
      return DecisionKey(k.version);
    case KeyInfo::Kind::kRequest:
      return RequestKey(k.version, k.member);
    case KeyInfo::Kind::kResend:
      return ResendKey(k.version, k.member, k.index, k.after);
    case KeyInfo::Kind::kSnapshotIndex:
      return SnapshotIndexKey(k.version);
    case KeyInfo::Kind::kSnapshotFile:
      return SnapshotFileKey(k.version, k.index);
  }
  return "";
}

std::optional<uint64_t> ParseIndexKey(std::string_view key) {
  auto k = ParseKey(key);
  if (!k || k->kind != KeyInfo::Kind::kIndex) return std::nullopt;
  return k->version;
}

std::optional<uint64_t> ParseSnapshotIndexKey(std::string_view key) {
  auto k = ParseKey(key);
  if (!k || k->kind != KeyInfo::Kind::kSnapshotIndex) return std::nullopt;
  return k->version;
}

std::vector<uint64_t> VersionsOf(const std::vector<ObjectInfo>& listing) {
  std::vector<uint64_t> out;
  for (const ObjectInfo& o : listing) {
    if (auto v = ParseIndexKey(o.key)) out.push_back(*v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool IsMemberKey(std::string_view key) {
  auto k = ParseKey(key);
  return k &&
         (k->kind == KeyInfo::Kind::kVote || k->kind == KeyInfo::Kind::kDone ||
          k->kind == KeyInfo::Kind::kRequest);
}

std::optional<uint64_t> VersionOfKey(std::string_view key) {
  auto k = ParseKey(key);
  if (!k || k->kind == KeyInfo::Kind::kHead ||
      k->kind == KeyInfo::Kind::kSnapshotIndex ||
      k->kind == KeyInfo::Kind::kSnapshotFile) {
    return std::nullopt;
  }
  return k->version;
}

}  // namespace refit
