#include "transport/tree_watch.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <vector>

namespace refit::internal {
namespace {

constexpr uint32_t kMask = IN_CREATE | IN_MOVED_TO | IN_ONLYDIR | IN_DONT_FOLLOW;

}  // namespace

std::shared_ptr<TreeWatch> TreeWatch::For(const std::string& root) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<TreeWatch>> watches;
  std::lock_guard<std::mutex> lock(mu);
  std::weak_ptr<TreeWatch>& slot = watches[root];
  if (std::shared_ptr<TreeWatch> w = slot.lock()) return w;
  const int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) return nullptr;
  std::shared_ptr<TreeWatch> w(new TreeWatch(root, fd));
  {
    std::lock_guard<std::mutex> wlock(w->mu_);
    w->AddTree("");
    if (w->dirs_.empty()) return nullptr;  // the root cannot be watched
  }
  slot = w;
  // Forget expired entries, so that a process opening many folders keeps
  // the map small.
  std::erase_if(watches, [](const auto& e) { return e.second.expired(); });
  return w;
}

TreeWatch::~TreeWatch() { close(fd_); }

void TreeWatch::AddTree(const std::string& rel) {
  const std::string path = rel.empty() ? root_ : root_ + "/" + rel;
  const int wd = inotify_add_watch(fd_, path.c_str(), kMask);
  if (wd < 0) return;  // gone meanwhile, not a directory, or no watch left
  dirs_[wd] = rel;
  // Directories made before the watch: their names were not seen.
  int dfd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return;
  DIR* d = fdopendir(dfd);
  if (d == nullptr) {
    close(dfd);
    return;
  }
  std::vector<std::string> subdirs;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || name.find('~') != std::string::npos) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode)) {
      subdirs.push_back(rel.empty() ? name : rel + "/" + name);
    }
  }
  closedir(d);
  for (const std::string& s : subdirs) AddTree(s);
}

void TreeWatch::Drain() {
  alignas(inotify_event) char buf[16 << 10];
  for (;;) {
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) return;  // EAGAIN: nothing more
    for (ssize_t at = 0; at < n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buf + at);
      at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      if (e->mask & IN_Q_OVERFLOW) {
        // Events were lost, directory creations among them: watch again
        // (a directory watched twice keeps one watch) and wake everyone.
        AddTree("");
        ++count_;
        continue;
      }
      if (e->mask & IN_IGNORED) {
        dirs_.erase(e->wd);  // the directory was removed
        continue;
      }
      if (e->len == 0 || std::strchr(e->name, '~') != nullptr) continue;
      auto dir = dirs_.find(e->wd);
      if (dir == dirs_.end()) continue;
      if (e->mask & IN_ISDIR) {
        // Its files may have appeared before its watch did: count it too.
        AddTree(dir->second.empty() ? std::string(e->name)
                                    : dir->second + "/" + e->name);
      }
      ++count_;
    }
  }
}

uint64_t TreeWatch::Count() {
  std::lock_guard<std::mutex> lock(mu_);
  Drain();
  return count_;
}

void TreeWatch::Await(uint64_t since, int timeout_ms) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(0, timeout_ms));
  for (;;) {
    if (Count() != since) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    // Several waiters may poll at once; whoever reads the events counts
    // them for all, and the others see the count move on their next look.
    pollfd p{fd_, POLLIN, 0};
    poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
  }
}

}  // namespace refit::internal
