// A fresh directory under $TMPDIR (or /tmp), removed with its contents on
// destruction, and also when the process is ended by SIGINT or SIGTERM
// (where those signals still have their default action: the first Create
// installs a handler that removes every live scratch directory, then lets
// the signal end the process). Used by demo and bench for generated
// checkpoints, deltas and scratch copies. Not copyable.
#ifndef REFIT_TOOLS_REFIT_SCRATCH_DIR_H_
#define REFIT_TOOLS_REFIT_SCRATCH_DIR_H_

#include <string>

#include "refit/status.h"

namespace refit::cli {

class ScratchDir {
 public:
  // kUnavailable when the directory cannot be created.
  static Result<ScratchDir> Create(const std::string& prefix);

  ScratchDir(ScratchDir&& other) noexcept : path_(std::move(other.path_)) {
    other.path_.clear();
  }
  ScratchDir& operator=(ScratchDir&&) = delete;
  ScratchDir(const ScratchDir&) = delete;
  ~ScratchDir();

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace refit::cli

#endif  // REFIT_TOOLS_REFIT_SCRATCH_DIR_H_
