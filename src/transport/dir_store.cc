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
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "transport/stores.h"

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
      return FailedPreconditionError(msg);
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

Status SyncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open directory", dir);
  int rc = fsync(fd);
  int e = errno;
  close(fd);
  if (rc != 0) return ErrnoError(e, "fsync failed on directory", dir);
  return Status();
}

// mkdir -p below an existing root; concurrent creators are fine.
Status MakeDirs(const std::string& root, std::string_view rel_dir) {
  std::string path = root;
  size_t start = 0;
  while (start < rel_dir.size()) {
    size_t slash = rel_dir.find('/', start);
    if (slash == std::string_view::npos) slash = rel_dir.size();
    path += '/';
    path.append(rel_dir.substr(start, slash - start));
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError(errno, "cannot create directory", path);
    }
    start = slash + 1;
  }
  return Status();
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

  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    std::string path = Path(key);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      if (e == ENOENT || e == ENOTDIR) return Absent(key);
      return ErrnoError(e, "cannot open", path);
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return Absent(key);
    }
    std::vector<uint8_t> out(static_cast<size_t>(st.st_size));
    size_t off = 0;
    for (;;) {
      if (off == out.size()) out.resize(out.size() + (64 << 10));
      ssize_t n = read(fd, out.data() + off, out.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        close(fd);
        return ErrnoError(e, "cannot read", path);
      }
      if (n == 0) break;
      off += static_cast<size_t>(n);
    }
    close(fd);
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
    REFIT_RETURN_IF_ERROR(Walk(rel, prefix, &out));
    std::sort(
        out.begin(), out.end(),
        [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  Status Delete(std::string_view key) override {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    std::string path = Path(key);
    if (unlink(path.c_str()) != 0) {
      int e = errno;
      if (e == ENOENT || e == ENOTDIR) return Status();
      if (e == EISDIR || e == EPERM) {
        struct stat st;
        if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
          return Status();  // a prefix, not an object
        }
      }
      return ErrnoError(e, "cannot delete", path);
    }
    return SyncDir(Parent(path));
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

  Status Write(std::string_view key, std::span<const uint8_t> data,
               bool replace) {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    size_t slash = key.rfind('/');
    if (slash != std::string_view::npos) {
      REFIT_RETURN_IF_ERROR(MakeDirs(root_, key.substr(0, slash)));
    }
    std::string path = Path(key);
    // Named apart from the key, so a 255-byte segment still fits NAME_MAX.
    std::string tmp = Parent(path) + "/" + TempName();
    REFIT_RETURN_IF_ERROR(WriteTemp(tmp, data));
    Status s;
    if (replace) {
      if (rename(tmp.c_str(), path.c_str()) != 0) {
        s = ErrnoError(errno, "cannot rename over", path);
      }
    } else {
      s = LinkNoReplace(tmp, path, key);
    }
    unlink(tmp.c_str());  // after link(2) the object keeps its own name
    if (!s.ok()) return s;
    return SyncDir(Parent(path));
  }

  Status LinkNoReplace(const std::string& tmp, const std::string& path,
                       std::string_view key) {
    int rc = link(tmp.c_str(), path.c_str());
    int e = errno;
    if (rc != 0 && (e == EPERM || e == EOPNOTSUPP || e == ENOSYS)) {
      // File systems without hard links (some FUSE and SMB mounts).
      rc = renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(),
                     RENAME_NOREPLACE);
      e = errno;
    }
    if (rc == 0) return Status();
    if (e == EEXIST) {
      // NFS may answer a retransmitted link(2) that succeeded with EEXIST;
      // the temporary's link count tells (open(2), O_EXCL notes).
      struct stat st;
      if (stat(tmp.c_str(), &st) == 0 && st.st_nlink == 2) return Status();
      return AlreadyExistsError("object '" + std::string(key) +
                                "' already exists in " + Describe());
    }
    return ErrnoError(e, "cannot create", path);
  }

  static Status WriteTemp(const std::string& tmp,
                          std::span<const uint8_t> data) {
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError(errno, "cannot create", tmp);
    size_t off = 0;
    Status s;
    while (off < data.size()) {
      ssize_t n = write(fd, data.data() + off, data.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        s = ErrnoError(errno, "cannot write", tmp);
        break;
      }
      off += static_cast<size_t>(n);
    }
    if (s.ok() && fsync(fd) != 0) s = ErrnoError(errno, "fsync failed on", tmp);
    if (close(fd) != 0 && s.ok()) s = ErrnoError(errno, "cannot close", tmp);
    if (!s.ok()) unlink(tmp.c_str());
    return s;
  }

  // Adds the objects under directory `rel` ("" = root) whose keys start
  // with `prefix`.
  Status Walk(const std::string& rel, std::string_view prefix,
              std::vector<ObjectInfo>* out) {
    std::string dir = rel.empty() ? root_ : root_ + "/" + rel;
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) {
      int e = errno;
      if (e == ENOENT || e == ENOTDIR) return Status();
      return ErrnoError(e, "cannot list", dir);
    }
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
      struct stat st;
      if (fstatat(dirfd(d), ent->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        continue;  // deleted meanwhile
      }
      if (S_ISDIR(st.st_mode)) {
        std::string as_dir = key + "/";
        // Descend only where keys can still match the prefix.
        if (as_dir.starts_with(prefix) || prefix.starts_with(as_dir)) {
          s = Walk(key, prefix, out);
          if (!s.ok()) break;
        }
      } else if (S_ISREG(st.st_mode) && key.starts_with(prefix)) {
        out->push_back({std::move(key), static_cast<uint64_t>(st.st_size)});
      }
    }
    closedir(d);
    return s;
  }

  std::string root_;
};

}  // namespace

Result<std::unique_ptr<ObjectStore>> OpenDirStore(const std::string& root) {
  if (root.empty()) return InvalidArgumentError("empty directory store path");
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  // mkdir -p of the root itself, any depth.
  for (size_t pos = 1; pos <= r.size(); ++pos) {
    if (pos == r.size() || r[pos] == '/') {
      std::string part = r.substr(0, pos);
      if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError(errno, "cannot create store directory", part);
      }
    }
  }
  struct stat st;
  if (stat(r.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgumentError("store path '" + r + "' is not a directory");
  }
  return std::unique_ptr<ObjectStore>(std::make_unique<DirStore>(r));
}

}  // namespace refit::internal
