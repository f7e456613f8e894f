#include "sync/protocol.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <xxhash.h>

#include "base/bytes.h"
#include "delta/chunk.h"

namespace refit {
namespace {

constexpr char kManifestMagic[8] = {'R', 'F', 'M', 'A', 'N', 'I', 'F', '1'};
constexpr char kManifestMagic2[8] = {'R', 'F', 'M', 'A', 'N', 'I', 'F', '2'};
constexpr char kVoteMagic2[4] = {'R', 'F', 'V', '2'};
constexpr char kDecisionMagic2[4] = {'R', 'F', 'D', '2'};
constexpr uint64_t kMaxTensorHashes = uint64_t{1} << 24;
constexpr char kAnnounceMagic[8] = {'R', 'F', 'A', 'N', 'N', 'O', 'U', '1'};
constexpr char kVoteMagic[4] = {'R', 'F', 'V', '1'};
constexpr char kDecisionMagic[4] = {'R', 'F', 'D', '1'};
constexpr char kRequestMagic[4] = {'R', 'F', 'Q', '1'};
constexpr char kHeadMagic[4] = {'R', 'F', 'H', '1'};
constexpr char kSnapshotMagic[8] = {'R', 'F', 'S', 'N', 'A', 'P', 'I', '1'};
constexpr uint64_t kMaxSnapshotFiles = 1 << 16;
constexpr uint64_t kMaxFileName = 1024;
constexpr uint64_t kMaxMembers = 1 << 16;
constexpr uint64_t kMaxMessage = 4096;

// Every protocol object ends in the XXH3-64 of the bytes before it, so a
// damaged object is refused even where no key authenticates the links.
std::vector<uint8_t> Sealed(std::vector<uint8_t> body) {
  uint64_t h = XXH3_64bits(body.data(), body.size());
  ByteWriter(&body).U64(h);
  return body;
}

Result<std::span<const uint8_t>> Checked(std::span<const uint8_t> bytes, const char* what) {
  if (bytes.size() < 8) return DataLossError(std::string(what) + " truncated");
  auto body = bytes.first(bytes.size() - 8);
  uint64_t want = LoadLE(bytes.data() + body.size(), 8);
  if (XXH3_64bits(body.data(), body.size()) != want) {
    return DataLossError(std::string(what) + " checksum mismatch (damaged in transit?)");
  }
  return body;
}

bool Magic(ByteReader& r, const char* magic, size_t n) {
  auto b = r.Bytes(n);
  return r.ok() && std::memcmp(b.data(), magic, n) == 0;
}

// An announcement and a manifest both begin with their 8-byte magic, the
// version, its base and the members.
void WriteVersionHead(ByteWriter& w, const char* magic, uint64_t version, uint64_t base,
                      const std::vector<std::string>& members) {
  w.Bytes(magic, 8);
  w.U64(version);
  w.U64(base);
  w.Varint(members.size());
  for (const auto& s : members) w.String(s);
}

Status ReadVersionHead(ByteReader& r, const char* magic, const std::string& what,
                       uint64_t* version, uint64_t* base, std::vector<std::string>* members) {
  if (!Magic(r, magic, 8)) return DataLossError("not a refit " + what);
  *version = r.U64();
  *base = r.U64();
  uint64_t n = r.Varint();
  if (n > kMaxMembers || n > r.remaining()) {
    return DataLossError(what + " lists an implausible number of members");
  }
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    members->push_back(r.String(64));
    if (r.ok() && !ValidateMember(members->back()).ok()) {
      return DataLossError(what + " lists a malformed member name");
    }
  }
  return Status();
}

// What every decoder of an announcement or a manifest checks last.
Status CheckVersionTail(const ByteReader& r, const std::string& what, uint64_t version,
                        uint64_t base) {
  REFIT_RETURN_IF_ERROR(r.status(what));
  if (r.remaining() != 0) return DataLossError(what + " has trailing bytes");
  if (version <= base) return DataLossError(what + " version is not above its base");
  return Status();
}

void WriteHashes(ByteWriter& w, const std::vector<Hash128>& hashes) {
  w.Varint(hashes.size());
  for (const Hash128& h : hashes) PutHash(w, h);
}

Status ReadHashes(ByteReader& r, const char* what, std::vector<Hash128>* out) {
  uint64_t n = r.Varint();
  if (n > kMaxTensorHashes || n > r.remaining() / 16) {
    REFIT_RETURN_IF_ERROR(r.status(what));
    return DataLossError(std::string(what) + " lists an implausible number of tensor hashes");
  }
  out->resize(n);
  for (uint64_t i = 0; i < n; ++i) (*out)[i] = GetHash(r);
  return r.status(what);
}

}  // namespace

std::string ManifestChunkKey(const Manifest& m, uint64_t i) {
  const ManifestChunk& c = m.chunks[i];
  return c.in_part
             ? PartChunkKey(m.version, c.rank, c.part_index - std::min(c.part_index, c.pack_offset))
             : ChunkKey(m.version, i - std::min(i, c.pack_offset));
}

std::vector<uint8_t> EncodeManifest(const Manifest& m) {
  bool v2 = m.direct;
  for (const ManifestChunk& c : m.chunks) {
    v2 = v2 || c.run != 0 || c.in_part || c.pack_offset != 0;
  }
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  WriteVersionHead(w, v2 ? kManifestMagic2 : kManifestMagic, m.version, m.base_version,
                   m.members);
  WriteTensorTable(m.tensors, &out);
  if (v2) w.U8(m.direct ? 1 : 0);
  w.Varint(m.chunks.size());
  for (const ManifestChunk& c : m.chunks) {
    w.Varint(c.size);
    w.Bytes(c.sha256.data(), c.sha256.size());
    w.Varint(c.tensor_id);
    w.Varint(c.start);
    w.Varint(c.count);
    w.Varint(c.changed);
    w.U8(c.kind);
    if (!v2) continue;
    w.U8((c.run != 0 ? 1 : 0) | (c.in_part ? 2 : 0) | (c.pack_offset != 0 ? 4 : 0));
    if (c.run != 0) {
      w.Varint(c.run);
      w.Varint(c.stride);
    }
    if (c.in_part) {
      w.Varint(c.rank);
      w.Varint(c.part_index);
    }
    if (c.pack_offset != 0) w.Varint(c.pack_offset);
  }
  return Sealed(std::move(out));
}

Result<Manifest> DecodeManifest(std::span<const uint8_t> body) {
  REFIT_ASSIGN_OR_RETURN(auto checked, Checked(body, "manifest"));
  ByteReader r(checked);
  Manifest m;
  const bool v2 = checked.size() >= 8 && std::memcmp(checked.data(), kManifestMagic2, 8) == 0;
  REFIT_RETURN_IF_ERROR(ReadVersionHead(r, v2 ? kManifestMagic2 : kManifestMagic, "manifest",
                                        &m.version, &m.base_version, &m.members));
  REFIT_RETURN_IF_ERROR(ReadTensorTable(&r, &m.tensors));
  if (v2) {
    const uint8_t flags = r.U8();
    if (r.ok() && flags > 1) return DataLossError("manifest has unknown flags");
    m.direct = flags == 1;
  }
  uint64_t chunks = r.Varint();
  if (chunks > r.remaining() / 38) {
    REFIT_RETURN_IF_ERROR(r.status("manifest"));
    return DataLossError("manifest lists an implausible number of chunks");
  }
  m.chunks.resize(chunks);
  for (uint64_t i = 0; i < chunks && r.ok(); ++i) {
    ManifestChunk& c = m.chunks[i];
    c.size = r.Varint();
    auto h = r.Bytes(32);
    if (r.ok()) std::memcpy(c.sha256.data(), h.data(), 32);
    c.tensor_id = r.Varint();
    c.start = r.Varint();
    c.count = r.Varint();
    c.changed = r.Varint();
    c.kind = r.U8();
    uint8_t flags = 0;
    if (v2) {
      flags = r.U8();
      if (flags & 1) {
        c.run = r.Varint();
        c.stride = r.Varint();
      }
      if (flags & 2) {
        c.in_part = true;
        const uint64_t rank = r.Varint();
        c.part_index = r.Varint();
        if (rank > UINT32_MAX) flags = 0xff;
        c.rank = static_cast<uint32_t>(rank);
      }
      if (flags & 4) c.pack_offset = r.Varint();
    }
    if (!r.ok()) break;
    // The region's last element: a strided region in canonical form
    // (docs/format.md §3), whose rows end inside the tensor.
    uint64_t span = c.count;
    // A packed chunk of a single publisher follows the previous chunk of
    // its pack (packs are runs of consecutive chunks at the first one's
    // key). A packed part chunk is element pack_offset of the pack at part
    // chunk part_index - pack_offset of its rank; the manifest interleaves
    // the ranks' chunks, so its neighbour may be another rank's.
    bool region_ok = flags <= 7;
    if (flags & 4) {
      region_ok = region_ok && c.pack_offset > 0 && c.pack_offset < kMaxPackChunks;
      if (c.in_part) {
        region_ok = region_ok && c.pack_offset <= c.part_index;
      } else {
        region_ok = region_ok && i > 0 && m.chunks[i - 1].pack_offset == c.pack_offset - 1 &&
                    !m.chunks[i - 1].in_part;
      }
    }
    if (c.run != 0) {
      region_ok = region_ok && c.run < c.count && c.count % c.run == 0 && c.stride > c.run &&
                  c.count / c.run - 1 <= (uint64_t{1} << 62) / c.stride;
      if (region_ok) span = (c.count / c.run - 1) * c.stride + c.run;
    }
    if (!region_ok || c.tensor_id >= m.tensors.size() || c.count == 0 ||
        !AddWithin(c.start, span, m.tensors[c.tensor_id].num_elements) ||
        c.kind < 1 || c.kind > 5) {
      return DataLossError("manifest chunk " + std::to_string(i) + " is malformed");
    }
  }
  REFIT_RETURN_IF_ERROR(CheckVersionTail(r, "manifest", m.version, m.base_version));
  return m;
}

std::vector<uint8_t> EncodeAnnouncement(const Announcement& a) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  WriteVersionHead(w, kAnnounceMagic, a.version, a.base_version, a.members);
  std::vector<TensorEntry> tensors = a.tensors;
  for (TensorEntry& e : tensors) e.after = Hash128{};
  WriteTensorTable(tensors, &out);
  return Sealed(std::move(out));
}

Result<Announcement> DecodeAnnouncement(std::span<const uint8_t> body) {
  REFIT_ASSIGN_OR_RETURN(auto checked, Checked(body, "announcement"));
  ByteReader r(checked);
  Announcement a;
  REFIT_RETURN_IF_ERROR(ReadVersionHead(r, kAnnounceMagic, "announcement", &a.version,
                                        &a.base_version, &a.members));
  REFIT_RETURN_IF_ERROR(ReadTensorTable(&r, &a.tensors));
  REFIT_RETURN_IF_ERROR(CheckVersionTail(r, "announcement", a.version, a.base_version));
  // The "after" hashes are not known when a version is announced; the
  // encoder writes zeros, and anything else is not an announcement we wrote.
  for (const TensorEntry& t : a.tensors) {
    if (!(t.after == Hash128{})) {
      return DataLossError("announcement tensor '" + t.name + "' has an after hash");
    }
  }
  return a;
}

std::vector<uint8_t> EncodeVote(const Vote& v) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(v.tensors.empty() ? kVoteMagic : kVoteMagic2, 4);
  w.U8(v.ready ? 1 : 2);
  w.String(v.message.substr(0, kMaxMessage));
  if (!v.tensors.empty()) WriteHashes(w, v.tensors);
  return Sealed(std::move(out));
}

Result<Vote> DecodeVote(std::span<const uint8_t> body) {
  REFIT_ASSIGN_OR_RETURN(auto checked, Checked(body, "vote"));
  ByteReader r(checked);
  const bool v2 = checked.size() >= 4 && std::memcmp(checked.data(), kVoteMagic2, 4) == 0;
  if (!Magic(r, v2 ? kVoteMagic2 : kVoteMagic, 4)) return DataLossError("not a refit vote");
  Vote v;
  uint8_t s = r.U8();
  v.message = r.String(kMaxMessage);
  if (v2) REFIT_RETURN_IF_ERROR(ReadHashes(r, "vote", &v.tensors));
  REFIT_RETURN_IF_ERROR(r.status("vote"));
  if (v2 && r.remaining() != 0) return DataLossError("vote has trailing bytes");
  if (s != 1 && s != 2) return DataLossError("vote has unknown state");
  v.ready = s == 1;
  return v;
}

std::vector<uint8_t> EncodeDecision(const Decision& d) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(d.tensors.empty() ? kDecisionMagic : kDecisionMagic2, 4);
  w.U64(d.version);
  w.U8(d.commit ? 1 : 2);
  w.Varint(d.dropped.size());
  for (const auto& m : d.dropped) w.String(m);
  w.String(d.reason.substr(0, kMaxMessage));
  if (!d.tensors.empty()) WriteHashes(w, d.tensors);
  return Sealed(std::move(out));
}

Result<Decision> DecodeDecision(std::span<const uint8_t> body) {
  REFIT_ASSIGN_OR_RETURN(auto checked, Checked(body, "decision"));
  ByteReader r(checked);
  const bool v2 = checked.size() >= 4 && std::memcmp(checked.data(), kDecisionMagic2, 4) == 0;
  if (!Magic(r, v2 ? kDecisionMagic2 : kDecisionMagic, 4)) {
    return DataLossError("not a refit decision");
  }
  Decision d;
  d.version = r.U64();
  uint8_t s = r.U8();
  uint64_t n = r.Varint();
  if (n > kMaxMembers || n > r.remaining()) return DataLossError("decision malformed");
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    d.dropped.push_back(r.String(64));
    // Dropped names are members' names, which key their votes.
    if (r.ok() && !ValidateMember(d.dropped.back()).ok()) {
      return DataLossError("decision lists a malformed member name");
    }
  }
  d.reason = r.String(kMaxMessage);
  if (v2) REFIT_RETURN_IF_ERROR(ReadHashes(r, "decision", &d.tensors));
  REFIT_RETURN_IF_ERROR(r.status("decision"));
  if (v2 && s != 1) return DataLossError("an abort decision carries tensor hashes");
  if (s != 1 && s != 2) return DataLossError("decision has unknown outcome");
  d.commit = s == 1;
  return d;
}

std::vector<uint8_t> EncodeRequest(const ResendRequest& q) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(kRequestMagic, 4);
  w.Varint(q.chunks.size());
  for (size_t i = 0; i < q.chunks.size(); ++i) {
    w.Varint(q.chunks[i]);
    w.U8(q.after[i] ? 1 : 0);
  }
  return Sealed(std::move(out));
}

Result<ResendRequest> DecodeRequest(std::span<const uint8_t> body) {
  REFIT_ASSIGN_OR_RETURN(auto checked, Checked(body, "request"));
  ByteReader r(checked);
  if (!Magic(r, kRequestMagic, 4)) return DataLossError("not a refit request");
  ResendRequest q;
  uint64_t n = r.Varint();
  if (n > r.remaining() / 2) return DataLossError("request malformed");
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    q.chunks.push_back(r.Varint());
    q.after.push_back(r.U8() != 0);
  }
  REFIT_RETURN_IF_ERROR(r.status("request"));
  return q;
}

std::vector<uint8_t> EncodeSnapshotIndex(const SnapshotIndex& s) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(kSnapshotMagic, 8);
  w.U64(s.version);
  w.Varint(s.files.size());
  for (const SnapshotFile& f : s.files) {
    w.String(f.name);
    w.Varint(f.size);
    w.Bytes(f.sha256.data(), f.sha256.size());
  }
  WriteTensorTable(s.tensors, &out);
  return Sealed(std::move(out));
}

namespace {
// A relative path that stays inside the checkpoint directory.
bool SafeRelativeName(const std::string& name) {
  if (name.empty() || name.size() > kMaxFileName) return false;
  size_t start = 0;
  for (;;) {
    size_t slash = name.find('/', start);
    std::string seg = name.substr(start, slash == std::string::npos ? slash : slash - start);
    if (seg.empty() || seg == "." || seg == ".." || seg.find('\0') != std::string::npos) {
      return false;
    }
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}
}  // namespace

Result<SnapshotIndex> DecodeSnapshotIndex(std::span<const uint8_t> body) {
  REFIT_ASSIGN_OR_RETURN(auto checked, Checked(body, "snapshot index"));
  ByteReader r(checked);
  if (!Magic(r, kSnapshotMagic, 8)) return DataLossError("not a refit snapshot index");
  SnapshotIndex s;
  s.version = r.U64();
  uint64_t files = r.Varint();
  if (files > kMaxSnapshotFiles || files > r.remaining() / 34) {
    REFIT_RETURN_IF_ERROR(r.status("snapshot index"));
    return DataLossError("snapshot index lists an implausible number of files");
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < files && r.ok(); ++i) {
    SnapshotFile f;
    f.name = r.String(kMaxFileName);
    f.size = r.Varint();
    auto h = r.Bytes(32);
    if (!r.ok()) break;
    std::memcpy(f.sha256.data(), h.data(), 32);
    if (!SafeRelativeName(f.name)) {
      return DataLossError("snapshot index names an unsafe file path");
    }
    if (!names.insert(f.name).second) {
      return DataLossError("snapshot index lists a file twice");
    }
    s.files.push_back(std::move(f));
  }
  REFIT_RETURN_IF_ERROR(r.status("snapshot index"));
  REFIT_RETURN_IF_ERROR(ReadTensorTable(&r, &s.tensors));
  REFIT_RETURN_IF_ERROR(r.status("snapshot index"));
  if (r.remaining() != 0) return DataLossError("snapshot index has trailing bytes");
  if (s.files.empty()) return DataLossError("snapshot index lists no files");
  return s;
}

std::vector<uint8_t> EncodeHead(uint64_t version) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(kHeadMagic, 4);
  w.U64(version);
  return Sealed(std::move(out));
}

Result<uint64_t> DecodeHead(std::span<const uint8_t> body) {
  REFIT_ASSIGN_OR_RETURN(auto checked, Checked(body, "head"));
  ByteReader r(checked);
  if (!Magic(r, kHeadMagic, 4)) return DataLossError("not a refit head");
  uint64_t v = r.U64();
  REFIT_RETURN_IF_ERROR(r.status("head"));
  return v;
}

}  // namespace refit
