// The directory store: key "a/b/c" is the file <root>/a/b/c.
//
// Atomicity (docs/protocol.md, "Object stores"): an object is written to a
// temporary file in its final directory and fsynced before it becomes
// visible, by rename(2) for Put (replaces) or link(2) for PutIfAbsent
// (fails with EEXIST, atomically across processes and, on POSIX file
// systems such as NFSv4 and Lustre, across hosts); the directory is fsynced
// after. Temporary names hold '~', which no key may hold, so List never
// shows them and they never collide with a key. A crash may leave
// temporaries behind; they are invisible and safe to delete.
//
// Limit: as on a file system, a key cannot also be a directory of other
// keys ("a/b" and "a/b/c" cannot both exist); such a Put fails with
// kFailedPrecondition.
//
// Links: the store never follows a symbolic link below its root. Paths are
// opened one component at a time relative to the parent's descriptor with
// O_NOFOLLOW, so a folder or file swapped for a link (even between a check
// and the use) is refused with kFailedPrecondition rather than read,
// written, listed or deleted through. The root itself may be a link: the
// caller chose it.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>

#include "transport/stores.h"
#include "transport/tree_watch.h"

namespace refit::internal {
namespace {

Status ErrnoError(int e, const std::string& what, const std::string& path) {
  std::string msg = what + " '" + path + "': " + std::strerror(e);
  switch (e) {
    case ENOENT:
      return NotFoundError(msg);
    case EEXIST:
      return AlreadyExistsError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return ResourceExhaustedError(msg);
    case ENOTDIR:
    case EISDIR:
    case ELOOP:
      return FailedPreconditionError(msg);
    case ENAMETOOLONG:
      // A name over 255 bytes or a path over PATH_MAX: the caller's path.
      return InvalidArgumentError(msg);
    case EINTR:
    case EAGAIN:
    case EIO:
    case ESTALE:
    case ETIMEDOUT:
      return UnavailableError(msg);
    default:
      return InternalError(msg);
  }
}

// Unique across threads (counter), processes (pid) and hosts sharing the
// directory (a random per-process nonce).
std::string TempName() {
  static const uint64_t nonce =
      std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  static std::atomic<uint64_t> counter{0};
  char buf[96];
  std::snprintf(buf, sizeof buf, "~tmp.%ld.%016llx.%llu",
                static_cast<long>(getpid()),
                static_cast<unsigned long long>(nonce),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return buf;
}

// An owned file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

// A link inside the store could point anywhere (a vote folder replaced by a
// link once sent a receiver's vote outside the store), so none is followed.
Status LinkRefused(const std::string& path) {
  return FailedPreconditionError(
      "'" + path +
      "' is a symbolic link; a directory store never follows links inside "
      "it: replace the link with a real directory or file");
}

bool IsLink(int dir_fd, const std::string& name) {
  struct stat st;
  return fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
         S_ISLNK(st.st_mode);
}

Status SyncDir(int dir_fd, const std::string& dir) {
  if (fsync(dir_fd) != 0) {
    return ErrnoError(errno, "fsync failed on directory", dir);
  }
  return Status();
}

// A key split at its last '/': the directory below the root ("" for the
// root itself) and the file name.
struct KeyPath {
  std::string_view dir;
  std::string name;
};

KeyPath SplitKey(std::string_view key) {
  size_t slash = key.rfind('/');
  if (slash == std::string_view::npos) return {std::string_view(), std::string(key)};
  return {key.substr(0, slash), std::string(key.substr(slash + 1))};
}

class DirStore final : public ObjectStore {
 public:
  explicit DirStore(std::string root) : root_(std::move(root)) {}

  std::string Describe() const override { return "dir:" + root_; }

  Status Put(std::string_view key, std::span<const uint8_t> data) override {
    return Write(key, data, /*replace=*/true);
  }

  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override {
    return Write(key, data, /*replace=*/false);
  }

  // Every writer's objects count where the tree can be watched
  // (tree_watch.h); otherwise this object's own, and other writers' are
  // found by the waiter's next poll.
  uint64_t ChangeCount() override {
    if (TreeWatch* w = Watch()) return w->Count();
    std::lock_guard<std::mutex> lock(change_mu_);
    return changes_;
  }

  void AwaitChange(uint64_t since, int timeout_ms) override {
    if (TreeWatch* w = Watch()) return w->Await(since, timeout_ms);
    std::unique_lock<std::mutex> lock(change_mu_);
    changed_.wait_for(lock, std::chrono::milliseconds(std::max(0, timeout_ms)),
                      [&] { return changes_ != since; });
  }

  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    const KeyPath kp = SplitKey(key);
    const std::string path = Path(key);
    bool absent = false;
    Result<Fd> dir = OpenDir(kp.dir, /*create=*/false, &absent);
    if (!dir.ok()) return absent ? Absent(key) : dir.status();
    // O_NONBLOCK: a FIFO planted in the store must not hang the reader.
    Fd fd(openat(dir->get(), kp.name.c_str(),
                 O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (fd.get() < 0) {
      int e = errno;
      if (e == ELOOP) return LinkRefused(path);
      if (e == ENOENT || e == ENOTDIR) return Absent(key);
      return ErrnoError(e, "cannot open", path);
    }
    struct stat st;
    if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return Absent(key);
    std::vector<uint8_t> out(static_cast<size_t>(st.st_size));
    size_t off = 0;
    for (;;) {
      if (off == out.size()) out.resize(out.size() + (64 << 10));
      ssize_t n = read(fd.get(), out.data() + off, out.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, "cannot read", path);
      }
      if (n == 0) break;
      off += static_cast<size_t>(n);
    }
    out.resize(off);
    return out;
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    REFIT_RETURN_IF_ERROR(ValidatePrefix(prefix));
    std::vector<ObjectInfo> out;
    // Start at the deepest directory the prefix names completely.
    size_t slash = prefix.rfind('/');
    std::string rel = slash == std::string_view::npos
                          ? ""
                          : std::string(prefix.substr(0, slash));
    bool absent = false;
    Result<Fd> dir = OpenDir(rel, /*create=*/false, &absent);
    if (!dir.ok()) {
      if (absent) return out;
      return dir.status();
    }
    REFIT_RETURN_IF_ERROR(Walk(std::move(*dir), rel, prefix, &out));
    std::sort(
        out.begin(), out.end(),
        [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  Status Delete(std::string_view key) override {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    const KeyPath kp = SplitKey(key);
    const std::string path = Path(key);
    bool absent = false;
    Result<Fd> dir = OpenDir(kp.dir, /*create=*/false, &absent);
    if (!dir.ok()) return absent ? Status() : dir.status();
    // unlink(2) would remove the link itself, not its target; refused all
    // the same, so that every operation treats a link alike.
    if (IsLink(dir->get(), kp.name)) return LinkRefused(path);
    if (unlinkat(dir->get(), kp.name.c_str(), 0) != 0) {
      int e = errno;
      if (e == ENOENT || e == ENOTDIR) return Status();
      if (e == EISDIR || e == EPERM) {
        struct stat st;
        if (fstatat(dir->get(), kp.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) ==
                0 &&
            S_ISDIR(st.st_mode)) {
          return Status();  // a prefix, not an object
        }
      }
      return ErrnoError(e, "cannot delete", path);
    }
    return SyncDir(dir->get(), Parent(path));
  }

 private:
  std::string Path(std::string_view key) const {
    return root_ + "/" + std::string(key);
  }

  static std::string Parent(const std::string& path) {
    return path.substr(0, path.find_last_of('/'));
  }

  Status Absent(std::string_view key) const {
    return NotFoundError("no object '" + std::string(key) + "' in " +
                         Describe());
  }

  // Opens directory `rel_dir` below the root ("" = the root) one component
  // at a time, each with O_NOFOLLOW relative to its parent, so no link on
  // the way is followed and a component swapped for a link meanwhile is
  // caught by the open itself. Creates missing components when `create`.
  // A link is kFailedPrecondition; a missing component, or one that is a
  // file, sets *absent (when given) besides the error.
  Result<Fd> OpenDir(std::string_view rel_dir, bool create,
                     bool* absent) const {
    // The root itself is the caller's choice and may be a link.
    Fd dir(open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.get() < 0) {
      int e = errno;
      if (absent != nullptr && (e == ENOENT || e == ENOTDIR)) *absent = true;
      return ErrnoError(e, "cannot open store directory", root_);
    }
    std::string path = root_;
    size_t start = 0;
    while (start < rel_dir.size()) {
      size_t slash = rel_dir.find('/', start);
      if (slash == std::string_view::npos) slash = rel_dir.size();
      const std::string name(rel_dir.substr(start, slash - start));
      path += '/';
      path += name;
      if (create && mkdirat(dir.get(), name.c_str(), 0755) != 0 &&
          errno != EEXIST) {
        return ErrnoError(errno, "cannot create directory", path);
      }
      Fd next(openat(dir.get(), name.c_str(),
                     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (next.get() < 0) {
        int e = errno;
        // Linux answers ELOOP for a link; ENOTDIR covers kernels that check
        // O_DIRECTORY first.
        if (e == ELOOP || (e == ENOTDIR && IsLink(dir.get(), name))) {
          return LinkRefused(path);
        }
        if (absent != nullptr && (e == ENOENT || e == ENOTDIR)) {
          *absent = true;
        }
        return ErrnoError(e, "cannot open directory", path);
      }
      dir = std::move(next);
      start = slash + 1;
    }
    return dir;
  }

  Status Write(std::string_view key, std::span<const uint8_t> data,
               bool replace) {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    const KeyPath kp = SplitKey(key);
    const std::string path = Path(key);
    REFIT_ASSIGN_OR_RETURN(Fd dir, OpenDir(kp.dir, /*create=*/true, nullptr));
    // rename(2) and link(2) never follow a link at the destination, but a
    // link there means someone tampered with the store: say so.
    if (IsLink(dir.get(), kp.name)) return LinkRefused(path);
    // Named apart from the key, so a 255-byte segment still fits NAME_MAX.
    const std::string tmp = TempName();
    const std::string tmp_path = Parent(path) + "/" + tmp;
    REFIT_RETURN_IF_ERROR(WriteTemp(dir.get(), tmp, tmp_path, data));
    Status s;
    if (replace) {
      if (renameat(dir.get(), tmp.c_str(), dir.get(), kp.name.c_str()) != 0) {
        s = ErrnoError(errno, "cannot rename over", path);
      }
    } else {
      s = LinkNoReplace(dir.get(), tmp, kp.name, path, key);
    }
    // After link(2) the object keeps its own name.
    unlinkat(dir.get(), tmp.c_str(), 0);
    if (!s.ok()) return s;
    Changed();  // visible now; the fsync below only makes it durable
    return SyncDir(dir.get(), Parent(path));
  }

  Status LinkNoReplace(int dir_fd, const std::string& tmp,
                       const std::string& name, const std::string& path,
                       std::string_view key) {
    int rc = linkat(dir_fd, tmp.c_str(), dir_fd, name.c_str(), 0);
    int e = errno;
    if (rc != 0 && (e == EPERM || e == EOPNOTSUPP || e == ENOSYS)) {
      // File systems without hard links (some FUSE and SMB mounts).
      rc = renameat2(dir_fd, tmp.c_str(), dir_fd, name.c_str(),
                     RENAME_NOREPLACE);
      e = errno;
    }
    if (rc == 0) return Status();
    if (e == EEXIST) {
      if (IsLink(dir_fd, name)) return LinkRefused(path);
      // NFS may answer a retransmitted link(2) that succeeded with EEXIST;
      // the temporary's link count tells (open(2), O_EXCL notes).
      struct stat st;
      if (fstatat(dir_fd, tmp.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          st.st_nlink == 2) {
        return Status();
      }
      return AlreadyExistsError("object '" + std::string(key) +
                                "' already exists in " + Describe());
    }
    return ErrnoError(e, "cannot create", path);
  }

  static Status WriteTemp(int dir_fd, const std::string& tmp,
                          const std::string& tmp_path,
                          std::span<const uint8_t> data) {
    int fd = openat(dir_fd, tmp.c_str(),
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError(errno, "cannot create", tmp_path);
    size_t off = 0;
    Status s;
    while (off < data.size()) {
      ssize_t n = write(fd, data.data() + off, data.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        s = ErrnoError(errno, "cannot write", tmp_path);
        break;
      }
      off += static_cast<size_t>(n);
    }
    if (s.ok() && fsync(fd) != 0) {
      s = ErrnoError(errno, "fsync failed on", tmp_path);
    }
    if (close(fd) != 0 && s.ok()) {
      s = ErrnoError(errno, "cannot close", tmp_path);
    }
    if (!s.ok()) unlinkat(dir_fd, tmp.c_str(), 0);
    return s;
  }

  // Adds the objects under directory `rel` ("" = root), open as `dir`,
  // whose keys start with `prefix`. A link whose key could match the prefix
  // fails the listing rather than being skipped silently.
  Status Walk(Fd dir, const std::string& rel, std::string_view prefix,
              std::vector<ObjectInfo>* out) {
    const std::string dir_path = rel.empty() ? root_ : root_ + "/" + rel;
    DIR* d = fdopendir(dir.get());
    if (d == nullptr) return ErrnoError(errno, "cannot list", dir_path);
    dir.release();  // closedir closes it
    Status s;
    while (dirent* ent = readdir(d)) {
      std::string_view name(ent->d_name);
      // Skips ".", "..", temporaries and foreign files alike.
      if (name == "." || name == ".." ||
          !std::all_of(name.begin(), name.end(), IsKeyChar)) {
        continue;
      }
      std::string key =
          rel.empty() ? std::string(name) : rel + "/" + std::string(name);
      const std::string as_dir = key + "/";
      // Descend only where keys can still match the prefix.
      const bool dir_matches =
          as_dir.starts_with(prefix) || prefix.starts_with(as_dir);
      struct stat st;
      if (fstatat(dirfd(d), ent->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        continue;  // deleted meanwhile
      }
      if (S_ISLNK(st.st_mode)) {
        if (dir_matches || key.starts_with(prefix)) {
          s = LinkRefused(root_ + "/" + key);
          break;
        }
      } else if (S_ISDIR(st.st_mode)) {
        if (!dir_matches) continue;
        Fd sub(openat(dirfd(d), ent->d_name,
                      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (sub.get() < 0) {
          int e = errno;
          if (e == ENOENT) continue;  // deleted meanwhile
          s = e == ELOOP || e == ENOTDIR
                  ? LinkRefused(root_ + "/" + key)  // swapped meanwhile
                  : ErrnoError(e, "cannot list", root_ + "/" + key);
          break;
        }
        s = Walk(std::move(sub), key, prefix, out);
        if (!s.ok()) break;
      } else if (S_ISREG(st.st_mode) && key.starts_with(prefix)) {
        out->push_back({std::move(key), static_cast<uint64_t>(st.st_size)});
      }
    }
    closedir(d);
    return s;
  }

  // Started by the first waiter, so that writers that never wait hold no
  // watch; null where the tree cannot be watched.
  TreeWatch* Watch() {
    std::call_once(watch_once_, [&] { watch_ = TreeWatch::For(root_); });
    return watch_.get();
  }

  // Objects stored through this object, for waiters without a watch.
  void Changed() {
    {
      std::lock_guard<std::mutex> lock(change_mu_);
      ++changes_;
    }
    changed_.notify_all();
  }

  std::string root_;
  std::mutex change_mu_;
  std::condition_variable changed_;
  uint64_t changes_ = 0;  // guarded by change_mu_
  std::once_flag watch_once_;
  std::shared_ptr<TreeWatch> watch_;
};

}  // namespace

Result<std::unique_ptr<ObjectStore>> OpenDirStore(const std::string& root,
                                                  bool create_if_missing) {
  if (root.empty()) return InvalidArgumentError("empty directory store path");
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  if (create_if_missing) {
    // mkdir -p of the root itself, any depth.
    for (size_t pos = 1; pos <= r.size(); ++pos) {
      if (pos == r.size() || r[pos] == '/') {
        std::string part = r.substr(0, pos);
        if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
          return ErrnoError(errno, "cannot create store directory", part);
        }
      }
    }
  }
  struct stat st;
  if (stat(r.c_str(), &st) != 0) {
    int e = errno;
    if (e == ENOENT && !create_if_missing) {
      return NotFoundError("no store at '" + r + "'");
    }
    return ErrnoError(e, "cannot open store directory", r);
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgumentError("store path '" + r + "' is not a directory");
  }
  return std::unique_ptr<ObjectStore>(std::make_unique<DirStore>(r));
}

}  // namespace refit::internal
