// The receiver's durable journal of the version it is applying
// (docs/protocol.md, "Receiver").
//
// Records are appended to one RecordFile (base/record_file.h), so a record
// torn by a crash is detected and ignored with everything after it.
// Append() writes; Sync() makes all records so far durable (fdatasync).
// Not thread-safe.
//
// A journal begun with BeginFold() records a fold: committed versions
// V1..Vk applied in one step from the active version to Vk
// (docs/protocol.md, "Catch-up by folding"). Its first record names Vk,
// the active version as the base, and the chain, so that a restarted
// receiver resumes the same fold rather than treating Vk as a version
// built on the active one; FoldApplied() records follow, one per chunk
// applied, so that a fold stopped by a chunk that fails its checks can be
// rolled back to the active version.
#ifndef REFIT_SYNC_JOURNAL_H_
#define REFIT_SYNC_JOURNAL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/record_file.h"
#include "delta/apply.h"
#include "refit/status.h"
#include "sync/auth.h"

namespace refit {

struct JournalState {
  uint64_t version = 0;
  uint64_t base_version = 0;
  Sha256 announcement_sha256{};
  // Chunks known applied, with their undo records (overwrite kinds).
  std::map<uint64_t, UndoRecord> applied;
  bool voted = false;
  // The receiver voted failed on the version (docs/protocol.md, "Failed
  // votes"): it only waits for the decision and rolls back. Chunks at or
  // above `failed_bound` were never written in this version.
  bool failed = false;
  uint64_t failed_bound = UINT64_MAX;
  // A fold: the chain V1..Vk (k >= 2, ascending; Vk == version) with the
  // SHA-256 of each stored announcement. Empty for a single version.
  std::vector<uint64_t> fold_versions;
  std::vector<Sha256> fold_announcements;
  // A fold's chunks known applied, in the order they were journaled:
  // chunk `chunk` of fold_versions[position], with its undo record
  // (overwrite kinds).
  struct FoldChunk {
    uint64_t position = 0;
    uint64_t chunk = 0;
    UndoRecord undo;
  };
  std::vector<FoldChunk> fold_applied;
};

class Journal {
 public:
  // Reads an existing journal (nullopt state when absent or empty).
  static Result<std::optional<JournalState>> Load(const std::string& path);

  // Starts a fresh journal for `version`, replacing any old one;
  // `announcement` is the SHA-256 of the version's stored announcement.
  static Result<Journal> Begin(const std::string& path, uint64_t version,
                               uint64_t base_version, const Sha256& announcement);
  // Starts a fresh journal for a fold of `versions` (ascending, at least
  // two, each building on the previous one) onto `base_version`;
  // `announcements` holds the SHA-256 of each version's stored
  // announcement. One record, so a crash leaves either all of it or none.
  static Result<Journal> BeginFold(const std::string& path, uint64_t base_version,
                                   const std::vector<uint64_t>& versions,
                                   const std::vector<Sha256>& announcements);
  // Reopens for appending after Load().
  static Result<Journal> Reopen(const std::string& path);

  Journal() = default;  // closed; assign from Begin() or Reopen()

  Status Applied(uint64_t chunk, const UndoRecord& undo);
  // In a fold: chunk `chunk` of the chain's version at `position` (0 for
  // V1) was applied.
  Status FoldApplied(uint64_t position, uint64_t chunk, const UndoRecord& undo);
  Status Voted();
  // The receiver voted failed; chunks at or above `bound` were never
  // written (UINT64_MAX: any may have been).
  Status Failed(uint64_t bound);
  Status Sync();

  // Removes the journal file (after activation or rollback).
  static Status Remove(const std::string& path);

 private:
  // A fresh journal at `path` (replacing any old one) whose first record,
  // made durable, is `type` with `body`.
  static Result<Journal> Create(const std::string& path, uint8_t type,
                                const std::vector<uint8_t>& body);
  Status Append(uint8_t type, const std::vector<uint8_t>& body);
  RecordFile file_;
};

}  // namespace refit

#endif  // REFIT_SYNC_JOURNAL_H_
