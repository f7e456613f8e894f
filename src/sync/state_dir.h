// A receiver's state directory (docs/protocol.md, "Receiver"): the small
// files beside a checkpoint that say which version it holds and what is
// in flight. The receiver writes them; `refit status` and `refit demo`
// read them, through this one description of the layout.
//
//   active      the active version: decimal digits and "\n", replaced
//               atomically (temp, rename, fsync). Absent: version 0.
//   journal     the journal of the version being applied (sync/journal.h);
//               absent when none is.
//   snapshot    present while a snapshot is being put in place.
//   last_error  `refit receive`'s record of its last failure, one JSON
//               object and "\n": time, code, message, transient.
//
// StateDir only names paths and reads or writes "active"; it holds no
// file open. Thread-compatible (a value).
#ifndef REFIT_SYNC_STATE_DIR_H_
#define REFIT_SYNC_STATE_DIR_H_

#include <cstdint>
#include <string>
#include <utility>

#include "refit/status.h"

namespace refit {

class StateDir {
 public:
  explicit StateDir(std::string dir) : dir_(std::move(dir)) {}

  const std::string& path() const { return dir_; }
  std::string active_path() const { return dir_ + "/active"; }
  std::string journal_path() const { return dir_ + "/journal"; }
  std::string snapshot_path() const { return dir_ + "/snapshot"; }
  std::string last_error_path() const { return dir_ + "/last_error"; }

  // The active version: 0 when "active" is absent; kDataLoss naming the
  // file when it does not start with a decimal number; the read's error
  // when it cannot be read.
  Result<uint64_t> ReadActive() const;
  // Replaces "active" with `version` atomically.
  Status WriteActive(uint64_t version) const;

 private:
  std::string dir_;
};

}  // namespace refit

#endif  // REFIT_SYNC_STATE_DIR_H_
