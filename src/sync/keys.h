// Where the version protocol's objects live in a store (docs/protocol.md,
// "Store layout"): every key the protocol writes, and the parsers that read
// keys back. No other code builds or takes apart a protocol key.
//
//   head                             u64: the latest committed version
//   index/<V>                        announcement of version V (written
//                                    first, so receivers list versions)
//   v/<V>/manifest                   manifest of V (written last)
//   v/<V>/chunk/<i>                  chunk i of V (docs/format.md §3)
//   v/<V>/vote/<member>              a member's vote on V
//   v/<V>/vote/<member>/done         relay trees only: the member finished
//                                    V (activated or rolled it back); the
//                                    publisher serves the tree until every
//                                    member's is in (a directory store
//                                    cannot hold it: the vote is a file)
//   v/<V>/decision                   the decision on V, written once
//   v/<V>/request/<member>           chunks a member needs re-sent
//   v/<V>/resend/<member>/<i>-<a|b>  overwrite re-send of chunk i's range at
//                                    V ("a"fter) or at its base ("b"efore)
//   parts/<V>/<rank>/chunk/<k>       chunk k of trainer rank <rank>'s part
//   parts/<V>/<rank>/list            that rank's part list (written last)
//   snap/<V>/index                   snapshot index of committed V
//   snap/<V>/file/<i>                file i of that snapshot, raw
//
// <V> is the version in exactly 20 decimal digits (so keys sort by
// version); chunk and snapshot file indices have at least 8 digits, re-send
// indices none to spare; members are ValidateMember names. Votes, done
// reports and requests are the keys members write; everything else is
// the publisher's. Pure functions: thread-safe.
#ifndef REFIT_SYNC_KEYS_H_
#define REFIT_SYNC_KEYS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"
#include "transport/object_store.h"

namespace refit {

inline constexpr char kHeadKey[] = "head";
inline constexpr char kIndexPrefix[] = "index/";     // every IndexKey
inline constexpr char kSnapshotsPrefix[] = "snap/";  // every snapshot key

std::string IndexKey(uint64_t version);
std::string VersionPrefix(uint64_t version);  // "v/<V>/": V's objects
std::string ManifestKey(uint64_t version);
std::string ChunkKey(uint64_t version, uint64_t index);
std::string VotePrefix(uint64_t version);  // "v/<V>/vote/"
std::string VoteKey(uint64_t version, const std::string& member);
std::string DoneKey(uint64_t version, const std::string& member);
std::string DecisionKey(uint64_t version);
std::string RequestPrefix(uint64_t version);  // "v/<V>/request/"
std::string RequestKey(uint64_t version, const std::string& member);
std::string ResendPrefix(uint64_t version);  // "v/<V>/resend/"
std::string ResendKey(uint64_t version, const std::string& member,
                      uint64_t index, bool after);
// The parts of a version published by several trainer ranks
// (docs/trainer.md, "Versions from many ranks"): each rank's sealed chunks
// and, last, its sealed part list. A version published this way names
// these chunk objects in its manifest, and receivers read them there.
std::string PartChunkKey(uint64_t version, uint32_t rank, uint64_t k);
std::string PartListKey(uint64_t version, uint32_t rank);
std::string PartsPrefix(uint64_t version);  // "parts/<V>/"
// A part chunk key as PartChunkKey makes it, read back; nullopt for any
// other key.
struct PartChunkId {
  uint64_t version = 0;
  uint32_t rank = 0;
  uint64_t k = 0;
};
std::optional<PartChunkId> ParsePartChunkKey(std::string_view key);
std::string SnapshotPrefix(uint64_t version);  // "snap/<V>/"
std::string SnapshotIndexKey(uint64_t version);
std::string SnapshotFileKey(uint64_t version, uint64_t index);

// Member names: 1..64 characters of [A-Za-z0-9._-], not "." or "..".
// kInvalidArgument otherwise.
Status ValidateMember(const std::string& member);

// What a key names, as ParseKey reads it.
struct KeyInfo {
  enum class Kind {
    kHead,
    kIndex,
    kManifest,
    kChunk,
    kVote,
    kDone,
    kDecision,
    kRequest,
    kResend,
    kSnapshotIndex,
    kSnapshotFile,
  };
  Kind kind = Kind::kHead;
  uint64_t version = 0;  // every kind but kHead
  std::string member;    // kVote, kDone, kRequest, kResend
  uint64_t index = 0;    // kChunk, kResend, kSnapshotFile
  bool after = false;    // kResend
};

// The object `key` names, or nullopt for any key the functions above do
// not make (a version of other than 20 digits or above 2^64 - 1, a bad
// member name, an index with padding it would not have, trailing parts).
// Note 1: exact inverse of the makers: for every result r,
// KeyOf(r) == key.
std::optional<KeyInfo> ParseKey(std::string_view key);
// The key of `k`, by the maker of its kind.
std::string KeyOf(const KeyInfo& k);

// The version of an announcement key (index/<V>), else nullopt.
std::optional<uint64_t> ParseIndexKey(std::string_view key);
// The version of a snapshot index key (snap/<V>/index), else nullopt.
std::optional<uint64_t> ParseSnapshotIndexKey(std::string_view key);

// The versions of the announcement keys in `listing` (a List of
// kIndexPrefix), ascending; other keys are passed over.
std::vector<uint64_t> VersionsOf(const std::vector<ObjectInfo>& listing);

// Keys members write, which flow up a relay tree to the publisher: votes,
// done reports and re-send requests.
bool IsMemberKey(std::string_view key);

// The version whose objects `key` is one of (index/<V> and v/<V>/...), for
// windows over the newest versions; nullopt for head, snapshots and keys
// the protocol does not make.
std::optional<uint64_t> VersionOfKey(std::string_view key);

}  // namespace refit

#endif  // REFIT_SYNC_KEYS_H_
