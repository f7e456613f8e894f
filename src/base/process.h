// Starting child processes: the refit CLI's demo and the tests that drive
// the built binary spawn `refit receive` and friends the same way.
#ifndef REFIT_BASE_PROCESS_H_
#define REFIT_BASE_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "refit/status.h"

namespace refit {

// Spawns argv[0] (a path) with `argv`, standard input from /dev/null and
// standard output and error appended to the files `out` and `err` (created
// when missing). The child inherits this process's environment except
// REFIT_CRASH_AT, which it gets only as `crash_at` when that is not empty
// (a crash point for the child, never one inherited by accident). Returns
// the child's pid; the caller reaps it.
Result<pid_t> SpawnLogged(const std::vector<std::string>& argv, const std::string& out,
                          const std::string& err, const std::string& crash_at = "");

}  // namespace refit

#endif  // REFIT_BASE_PROCESS_H_
