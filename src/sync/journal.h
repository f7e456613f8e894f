// The receiver's durable journal of the version it is applying
// (docs/protocol.md, "Receiver").
//
// Records are appended to one file, each framed as
// `u32 length | u8 type | body | u32 checksum` (checksum = low 32 bits of
// XXH3-64 of type and body), so a record torn by a crash is detected and
// ignored with everything after it. Append() writes; Sync() makes all
// records so far durable (fdatasync). Not thread-safe.
#ifndef REFIT_SYNC_JOURNAL_H_
#define REFIT_SYNC_JOURNAL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

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
};

class Journal {
 public:
  // Reads an existing journal (nullopt state when absent or empty).
  static Result<std::optional<JournalState>> Load(const std::string& path);

  // Starts a fresh journal for `version`, replacing any old one;
  // `announcement` is the SHA-256 of the version's stored announcement.
  static Result<Journal> Begin(const std::string& path, uint64_t version,
                               uint64_t base_version, const Sha256& announcement);
  // Reopens for appending after Load().
  static Result<Journal> Reopen(const std::string& path);

  Journal() = default;  // closed; assign from Begin() or Reopen()
  Journal(Journal&&) noexcept;
  Journal& operator=(Journal&&) noexcept;
  ~Journal();

  Status Applied(uint64_t chunk, const UndoRecord& undo);
  Status Voted();
  Status Sync();

  // Removes the journal file (after activation or rollback).
  static Status Remove(const std::string& path);

 private:
  Status Append(uint8_t type, const std::vector<uint8_t>& body);
  int fd_ = -1;
  std::string path_;
};

}  // namespace refit

#endif  // REFIT_SYNC_JOURNAL_H_
