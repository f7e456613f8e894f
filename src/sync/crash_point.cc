#include "sync/crash_point.h"

#ifdef REFIT_CRASH_POINTS
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace refit {

void CrashPoint(const char* name) {
  // Read at every call, not once: a test process that runs receivers
  // itself and then forks a child that sets it must see the child obey.
  const char* spec = std::getenv("REFIT_CRASH_AT");
  if (spec == nullptr || *spec == '\0') return;
  static std::atomic<long> hits{0};
  std::string s(spec);
  long want = 1;
  auto colon = s.find(':');
  if (colon != std::string::npos) {
    want = std::atol(s.c_str() + colon + 1);
    s.resize(colon);
  }
  if (s != name) return;
  if (hits.fetch_add(1) + 1 == want) {
    kill(getpid(), SIGKILL);
    _exit(137);
  }
}

}  // namespace refit
#endif
