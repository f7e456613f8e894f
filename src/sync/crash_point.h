// Named crash points for fault-injection tests (RocksDB-style sync points).
//
// CrashPoint("receiver.after-apply") kills the process with SIGKILL when
// the environment variable REFIT_CRASH_AT names that point, optionally as
// "name:N" to die on the N-th hit (1-based); the variable is read at every
// call (a forked test child may set it). Compiled to nothing unless
// REFIT_CRASH_POINTS is defined (not in release builds).
#ifndef REFIT_SYNC_CRASH_POINT_H_
#define REFIT_SYNC_CRASH_POINT_H_

namespace refit {

#ifdef REFIT_CRASH_POINTS
void CrashPoint(const char* name);
#else
inline void CrashPoint(const char*) {}
#endif

}  // namespace refit

#endif  // REFIT_SYNC_CRASH_POINT_H_
