#include "scratch_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

namespace refit::cli {
namespace {

// Interrupt cleanup. A benchmark's scratch directory holds generated
// checkpoints of hundreds of MB; Ctrl-C (or a SIGTERM from a job runner)
// ends the process without running destructors, so a handler removes the
// live scratch directories and then dies of the signal as before (the
// parent still sees "killed by SIGINT"). The handler may use only
// async-signal-safe calls: it walks the tree with openat, getdents64 and
// unlinkat, and reads the paths from fixed slots written before they are
// published.

constexpr int kMaxLive = 8;
constexpr size_t kMaxPath = 4096;

struct Slot {
  std::atomic<bool> in_use{false};
  char path[kMaxPath] = {};
};

Slot g_slots[kMaxLive];
std::mutex g_slots_mu;  // serializes claiming and releasing, never taken in the handler
pid_t g_owner = 0;      // a child forked without exec must not clean up

bool IsDots(const char* name) {
  return name[0] == '.' &&
         (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

// Removes the contents of directory `fd`. Passes repeat while entries were
// removed, as threads still running may add files meanwhile (bounded, so a
// busy writer cannot keep the handler here).
void RemoveContents(int fd, int depth) {
  if (depth > 16) return;  // scratch trees are two levels deep
  alignas(8) char buf[4096];
  for (int pass = 0; pass < 8; ++pass) {
    bool removed = false;
    if (lseek(fd, 0, SEEK_SET) != 0) return;
    for (;;) {
      ssize_t n = getdents64(fd, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        auto* entry = reinterpret_cast<struct dirent64*>(buf + off);
        off += entry->d_reclen;
        if (IsDots(entry->d_name)) continue;
        if (unlinkat(fd, entry->d_name, 0) == 0) {
          removed = true;
          continue;
        }
        if (errno != EISDIR && errno != EPERM) continue;
        int sub = openat(fd, entry->d_name,
                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) continue;
        RemoveContents(sub, depth + 1);
        close(sub);
        if (unlinkat(fd, entry->d_name, AT_REMOVEDIR) == 0) removed = true;
      }
    }
    if (!removed) return;
  }
}

extern "C" void OnInterrupt(int sig) {
  const int saved_errno = errno;
  if (getpid() == g_owner) {
    for (Slot& slot : g_slots) {
      if (!slot.in_use.load(std::memory_order_acquire)) continue;
      int fd = open(slot.path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) continue;
      RemoveContents(fd, 0);
      close(fd);
      rmdir(slot.path);
    }
  }
  // Die of the same signal: it is blocked while this handler runs, so it
  // is delivered, with the default action, on return.
  signal(sig, SIG_DFL);
  raise(sig);
  errno = saved_errno;
}

// Installs the handler for SIGINT and SIGTERM where they still have their
// default action (a command with its own handling, like `receive`, keeps
// it; an ignored signal stays ignored).
void InstallHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_owner = getpid();
    struct sigaction sa {};
    sa.sa_handler = OnInterrupt;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    for (int sig : {SIGINT, SIGTERM}) {
      struct sigaction old {};
      if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
          (old.sa_flags & SA_SIGINFO) == 0) {
        sigaction(sig, &sa, nullptr);
      }
    }
  });
}

void Register(const std::string& path) {
  if (path.size() >= kMaxPath) return;  // not cleaned on interrupt
  std::lock_guard<std::mutex> lock(g_slots_mu);
  for (Slot& slot : g_slots) {
    if (slot.in_use.load(std::memory_order_relaxed)) continue;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.in_use.store(true, std::memory_order_release);
    return;
  }
}

void Unregister(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_slots_mu);
  for (Slot& slot : g_slots) {
    if (slot.in_use.load(std::memory_order_relaxed) && path == slot.path) {
      slot.in_use.store(false, std::memory_order_release);
      return;
    }
  }
}

}  // namespace

Result<ScratchDir> ScratchDir::Create(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      fmt::format("{}/{}-XXXXXX", tmp && *tmp ? tmp : "/tmp", prefix);
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  InstallHandlers();
  if (mkdtemp(buffer.data()) == nullptr) {
    return UnavailableError(
        fmt::format("cannot create a directory like '{}': {}", pattern,
                    std::strerror(errno)));
  }
  // Absolute, so the handler finds it whatever the working directory is
  // by then.
  std::error_code ec;
  std::string path = std::filesystem::absolute(buffer.data(), ec).string();
  if (ec) path = buffer.data();
  Register(path);
  return ScratchDir(std::move(path));
}

ScratchDir::~ScratchDir() {
  if (path_.empty()) return;
  Unregister(path_);
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace refit::cli
