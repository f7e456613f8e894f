// The version protocol's objects (docs/protocol.md): their encodings and
// decoders. Where each lives in a store is sync/keys.h (included here for
// callers of both): the head at `head`, an Announcement at index/<V>, a
// Manifest, Votes, the Decision and ResendRequests under v/<V>/, a
// SnapshotIndex at snap/<V>/index. All objects are sealed by an
// Authenticator before they are stored, and opened (tag checked) before
// they are parsed. Every decoder treats its input as hostile: kDataLoss
// for anything malformed. Pure functions: thread-safe.
#ifndef REFIT_SYNC_PROTOCOL_H_
#define REFIT_SYNC_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "delta/delta_file.h"
#include "refit/status.h"
#include "sync/auth.h"
#include "sync/keys.h"

namespace refit {

// Chunks per pack (sync/chunk_pack.h); bounds the keys a lookup without a
// manifest probes.
inline constexpr uint64_t kMaxPackChunks = 4096;

struct ManifestChunk {
  uint64_t size = 0;  // bytes of the stored (sealed) object
  Sha256 sha256{};    // of the stored object
  uint64_t tensor_id = 0;
  uint64_t start = 0;
  uint64_t count = 0;
  uint64_t changed = 0;
  uint8_t kind = 0;
  // A strided region (docs/format.md §3): count / run rows of `run`
  // elements, `stride` apart. run == 0: the contiguous range.
  uint64_t run = 0;
  uint64_t stride = 0;
  // Versions published by several trainer ranks: the chunk is object k =
  // `part_index` of rank `rank`'s part (PartChunkKey), not v/<V>/chunk/<i>.
  bool in_part = false;
  uint32_t rank = 0;
  uint64_t part_index = 0;
  // Chunk packs (sync/chunk_pack.h): > 0 when the chunk is element
  // `pack_offset` of the pack stored at chunk (index - pack_offset)'s key,
  // or, in a part, at part chunk (part_index - pack_offset)'s key; 0 when
  // its object is at its own key (alone, or first in its pack).
  uint64_t pack_offset = 0;
};

// The opening of a version, stored at index/<V> before its first chunk
// (docs/protocol.md, "Publisher"): what a receiver needs to start applying
// chunks while the rest are still being uploaded. Tensors carry the base's
// hashes in `before`; `after` is not known yet and is zero.
struct Announcement {
  uint64_t version = 0;
  uint64_t base_version = 0;
  std::vector<std::string> members;
  std::vector<TensorEntry> tensors;
};

std::vector<uint8_t> EncodeAnnouncement(const Announcement& a);
Result<Announcement> DecodeAnnouncement(std::span<const uint8_t> body);

// `direct`: the version was published by several trainer ranks and its
// chunks are theirs (docs/protocol.md, "Versions from many ranks"): the
// coordinator that wrote the manifest never held the tensors, so a tensor
// with chunks has a zero "after" hash here (tensors without chunks have
// after == before), and the hashes the members voted, all equal, are
// recorded in the commit decision. Manifests with direct set, or with a
// strided, part or packed chunk, are encoded as format 2 ("RFMANIF2");
// others as format 1, which every decoder reads as before.
struct Manifest {
  uint64_t version = 0;
  uint64_t base_version = 0;
  std::vector<std::string> members;
  std::vector<TensorEntry> tensors;
  std::vector<ManifestChunk> chunks;
  bool direct = false;
};

// The key of the object holding manifest chunk i of version V (its own,
// its pack's, or its rank's part chunk).
std::string ManifestChunkKey(const Manifest& m, uint64_t i);

std::vector<uint8_t> EncodeManifest(const Manifest& m);
Result<Manifest> DecodeManifest(std::span<const uint8_t> body);

struct Vote {
  bool ready = false;
  std::string message;  // why not ready
  // A ready vote on a direct version: the hash of every tensor of the
  // table after applying it (docs/protocol.md, "Versions from many
  // ranks"); empty otherwise. Encoded as vote format 2 when not empty.
  std::vector<Hash128> tensors;
};
std::vector<uint8_t> EncodeVote(const Vote& v);
Result<Vote> DecodeVote(std::span<const uint8_t> body);

struct Decision {
  uint64_t version = 0;
  bool commit = false;
  std::vector<std::string> dropped;  // members left out of a commit
  std::string reason;
  // A commit of a direct version: every tensor's hash after it, as every
  // member voted (the manifest's "after" hashes of its tensors with
  // chunks are zero). Empty otherwise; decision format 2 when not empty.
  std::vector<Hash128> tensors;
};
std::vector<uint8_t> EncodeDecision(const Decision& d);
// kDataLoss for a damaged or truncated decision, an unknown outcome, more
// than 65536 dropped members or a dropped name that is not a member name
// (ValidateMember).
Result<Decision> DecodeDecision(std::span<const uint8_t> body);

struct ResendRequest {
  // Chunk indices and, for each, whether the member needs the range at V
  // (true) or at the base (false).
  std::vector<uint64_t> chunks;
  std::vector<bool> after;
};
std::vector<uint8_t> EncodeRequest(const ResendRequest& r);
Result<ResendRequest> DecodeRequest(std::span<const uint8_t> body);

// A full copy of a committed version's checkpoint (docs/protocol.md,
// "Snapshots and retention"). File names are relative paths as in the
// checkpoint directory (or the single file's name); tensors carry
// before == after == the version's tensor hashes.
struct SnapshotFile {
  std::string name;
  uint64_t size = 0;
  Sha256 sha256{};
};
struct SnapshotIndex {
  uint64_t version = 0;
  std::vector<SnapshotFile> files;
  std::vector<TensorEntry> tensors;
};
std::vector<uint8_t> EncodeSnapshotIndex(const SnapshotIndex& s);
// Caps: at most 65536 files; names 1..1024 bytes of relative path
// segments, none empty, "." or "..".
Result<SnapshotIndex> DecodeSnapshotIndex(std::span<const uint8_t> body);

std::vector<uint8_t> EncodeHead(uint64_t version);
Result<uint64_t> DecodeHead(std::span<const uint8_t> body);

}  // namespace refit

#endif  // REFIT_SYNC_PROTOCOL_H_
