#include "base/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

namespace refit {

Status ErrnoStatus(const std::string& what, const std::string& path) {
  int e = errno;
  std::string msg = what + " '" + path + "': " + std::strerror(e);
  switch (e) {
    case ENOENT: return NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS: return PermissionDeniedError(msg);
    case ENOSPC:
    case ENOMEM:
    case EDQUOT: return ResourceExhaustedError(msg);
    case EINTR:
    case EAGAIN:
    case EIO: return UnavailableError(msg);
    case ENAMETOOLONG: return InvalidArgumentError(msg);
    default: return InternalError(msg);
  }
}

namespace {

std::string DirName(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Stores through a shared mapping into a hole of a sparse file allocate
// blocks when the page is first written back or faulted; on a full file
// system the kernel then raises SIGBUS in whichever thread stores, which no
// caller can turn into an error. Allocating every hole before the file is
// mapped reports ENOSPC here instead, before anything is written. Holes read
// as zeros, so allocating them changes no byte. fallocate on an allocated
// range only walks the extent tree; where the file system cannot fallocate,
// each hole is filled with zeros by pwrite, which fails with ENOSPC too.
// A file with every block allocated is left alone: fallocate would change
// no block but would still set the file's modification time, by which a
// receiver tells that its checkpoint was written since it flushed it
// (and would then hash every tensor again).
Status ReserveHoles(int fd, size_t size, const std::string& path) {
  if (size == 0) return Status();
  struct stat st {};
  if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_blocks) * 512 >= size &&
      lseek(fd, 0, SEEK_HOLE) >= static_cast<off_t>(size)) {
    return Status();
  }
  if (fallocate(fd, 0, 0, static_cast<off_t>(size)) == 0) return Status();
  if (errno != EOPNOTSUPP && errno != ENOSYS) {
    return ErrnoStatus("cannot allocate the unallocated blocks (holes) of", path);
  }
  static const std::vector<uint8_t> zeros(1 << 16, 0);
  off_t pos = 0;
  const off_t end = static_cast<off_t>(size);
  while (pos < end) {
    off_t hole = lseek(fd, pos, SEEK_HOLE);
    if (hole < 0 || hole >= end) break;  // no SEEK_HOLE support, or no hole
    off_t data = lseek(fd, hole, SEEK_DATA);
    if (data < 0 || data > end) data = end;
    for (off_t at = hole; at < data;) {
      size_t n = std::min<size_t>(zeros.size(), static_cast<size_t>(data - at));
      ssize_t k = pwrite(fd, zeros.data(), n, at);
      if (k < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("cannot fill the holes of", path);
      }
      at += k;
    }
    pos = data;
  }
  return Status();
}

}  // namespace

Status SyncDirectoryOf(const std::string& path) {
  std::string dir = DirName(path);
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoStatus("cannot open directory", dir);
  int rc = fsync(dfd);
  close(dfd);
  if (rc != 0) return ErrnoStatus("fsync failed on directory", dir);
  return Status();
}

MappedFile::~MappedFile() { Reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)),
      writable_(other.writable_),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    writable_ = other.writable_;
    path_ = std::move(other.path_);
  }
  return *this;
}

void MappedFile::Reset() {
  if (data_ != nullptr && size_ > 0) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

Result<MappedFile> MappedFile::Open(const std::string& path, Mode mode) {
  MappedFile f;
  f.path_ = path;
  f.writable_ = mode == Mode::kReadWrite;
  f.fd_ = open(path.c_str(), (f.writable_ ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (f.fd_ < 0) return ErrnoStatus("cannot open", path);
  struct stat st;
  if (fstat(f.fd_, &st) != 0) return ErrnoStatus("cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError("'" + path + "' is not a regular file");
  }
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ == 0) return f;
  if (f.writable_) REFIT_RETURN_IF_ERROR(ReserveHoles(f.fd_, f.size_, path));
  int prot = PROT_READ | (f.writable_ ? PROT_WRITE : 0);
  void* p = mmap(nullptr, f.size_, prot, MAP_SHARED, f.fd_, 0);
  if (p == MAP_FAILED) {
    f.size_ = 0;
    return ErrnoStatus("cannot map", path);
  }
  f.data_ = static_cast<uint8_t*>(p);
  return f;
}

Status MappedFile::Sync(size_t offset, size_t length) {
  if (!writable_) return Status();
  if (size_ > 0 && offset < size_) {
    if (length > size_ - offset) length = size_ - offset;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t start = offset / page * page;
    if (msync(data_ + start, offset + length - start, MS_SYNC) != 0) {
      return ErrnoStatus("msync failed on", path_);
    }
  }
  if (fsync(fd_) != 0) return ErrnoStatus("fsync failed on", path_);
  return Status();
}

void MappedFile::AdviseSequential(size_t offset, size_t length) const {
  if (size_ == 0 || offset >= size_) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t start = offset / page * page;
  if (length > size_ - offset) length = size_ - offset;
  madvise(data_ + start, offset + length - start, MADV_WILLNEED);
}

Result<std::vector<uint8_t>> ReadFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", path);
  std::vector<uint8_t> out;
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    out.reserve(static_cast<size_t>(st.st_size));
  }
  uint8_t buf[1 << 16];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = ErrnoStatus("cannot read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  close(fd);
  return out;
}

Status WriteFileAtomic(const std::string& path, std::span<const uint8_t> data) {
  // Unique per process, thread and call, so concurrent writers of one path
  // never share a temp file; the last rename wins, whole.
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                    std::to_string(counter.fetch_add(1));
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", tmp);
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = ErrnoStatus("cannot write", tmp);
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    off += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    Status s = ErrnoStatus("fsync failed on", tmp);
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = ErrnoStatus("cannot rename over", path);
    unlink(tmp.c_str());
    return s;
  }
  return SyncDirectoryOf(path);
}

namespace {

// Opens `path` with `flags` and returns the descriptor and the file's size.
Result<std::pair<int, uint64_t>> OpenWithSize(const std::string& path, int flags) {
  int fd = open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    Status s = ErrnoStatus("cannot stat", path);
    close(fd);
    return s;
  }
  return std::pair<int, uint64_t>(fd, static_cast<uint64_t>(st.st_size));
}

}  // namespace

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) close(fd_);
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

Result<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path) {
  REFIT_ASSIGN_OR_RETURN(auto opened, OpenWithSize(path, O_RDONLY));
  ReadOnlyFile f;
  f.fd_ = opened.first;
  f.size_ = opened.second;
  f.path_ = path;
  return f;
}

Status ReadOnlyFile::ReadAt(uint64_t offset, std::span<uint8_t> out) const {
  if (fd_ < 0) return FailedPreconditionError("read of a file that is not open");
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = pread(fd_, out.data() + done, out.size() - done,
                      static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("cannot read", path_);
    if (n == 0) {
      return DataLossError("'" + path_ + "' ends at byte " +
                           std::to_string(offset + done) + ", before bytes [" +
                           std::to_string(offset) + ", +" +
                           std::to_string(out.size()) + ")");
    }
    done += static_cast<size_t>(n);
  }
  return Status();
}

void ReadOnlyFile::AdviseSequential(uint64_t offset, uint64_t length) const {
  if (fd_ < 0) return;
  posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length),
                POSIX_FADV_SEQUENTIAL);
}

Result<std::vector<uint8_t>> ReadFileRange(const std::string& path,
                                           uint64_t offset, uint64_t length) {
  REFIT_ASSIGN_OR_RETURN(ReadOnlyFile f, ReadOnlyFile::Open(path));
  if (offset > f.size() || length > f.size() - offset) {
    return DataLossError("'" + path + "' has " + std::to_string(f.size()) +
                         " bytes, too few for bytes [" +
                         std::to_string(offset) + ", +" +
                         std::to_string(length) + ")");
  }
  std::vector<uint8_t> out(static_cast<size_t>(length));
  REFIT_RETURN_IF_ERROR(f.ReadAt(offset, out));
  return out;
}

Status WriteFileRange(const std::string& path, uint64_t offset,
                      std::span<const uint8_t> data, bool sync) {
  REFIT_ASSIGN_OR_RETURN(auto opened, OpenWithSize(path, O_WRONLY));
  const auto [fd, size] = opened;
  if (offset > size || data.size() > size - offset) {
    close(fd);
    return OutOfRangeError("bytes [" + std::to_string(offset) + ", +" +
                           std::to_string(data.size()) +
                           ") lie past the end of '" + path + "'");
  }
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = pwrite(fd, data.data() + done, data.size() - done,
                       static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = ErrnoStatus("cannot write", path);
      close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (sync && fsync(fd) != 0) {
    Status s = ErrnoStatus("fsync failed on", path);
    close(fd);
    return s;
  }
  close(fd);
  return Status();
}

Status RemoveFile(const std::string& path, bool sync) {
  if (unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return Status();
    return ErrnoStatus("cannot remove", path);
  }
  return sync ? SyncDirectoryOf(path) : Status();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::optional<FileId> GetFileId(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{.device = static_cast<uint64_t>(st.st_dev),
                .inode = static_cast<uint64_t>(st.st_ino)};
}

std::optional<FileStamp> GetFileStamp(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileStamp{
      .device = static_cast<uint64_t>(st.st_dev),
      .inode = static_cast<uint64_t>(st.st_ino),
      .size = static_cast<uint64_t>(st.st_size),
      .mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec,
      .ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec};
}

bool IsWithinDirectory(const std::string& path, const FileId& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) return false;
  // Every lexical prefix is looked up, so "a/link/../x" is examined through
  // "a/link/..", as the kernel resolves it, not as "a". "a/link" is examined
  // too, which errs towards true for a path that enters `dir` through a link
  // and leaves it again by "..".
  while (true) {
    if (GetFileId(p.string()) == dir) return true;
    std::filesystem::path parent = p.parent_path();
    if (parent == p || parent.empty()) return false;
    p = std::move(parent);
  }
}

}  // namespace refit
