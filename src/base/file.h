// File access: memory maps, positioned and whole-file reads, and atomic
// writes.
//
// This is the seam between refit and the file system: higher layers never
// call open/mmap/fsync themselves, so tests can reason about every write.
// A MappedFile owns its mapping and unmaps on destruction; it is movable,
// not copyable, and not thread-safe (the mapped bytes may be read from
// several threads).
#ifndef REFIT_BASE_FILE_H_
#define REFIT_BASE_FILE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "refit/status.h"

namespace refit {

class MappedFile {
 public:
  enum class Mode { kReadOnly, kReadWrite };

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Maps the whole file. kReadWrite maps it MAP_SHARED, so stores reach the
  // file; call Sync() to make them durable. An empty file maps to an empty
  // span. Note 1: kReadWrite first allocates the blocks of every hole of a
  // sparse file (changing no byte), so a full file system is reported here
  // as kResourceExhausted instead of raising SIGBUS at a later store.
  static Result<MappedFile> Open(const std::string& path, Mode mode);

  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() { return writable_ ? data_ : nullptr; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

  // msync(MS_SYNC) of [offset, offset+length) rounded out to pages, then
  // fsync of the file. With no arguments, the whole file.
  Status Sync(size_t offset = 0, size_t length = SIZE_MAX);

  // Tells the kernel the range will be read sequentially soon.
  void AdviseSequential(size_t offset, size_t length) const;

 private:
  void Reset();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
  bool writable_ = false;
  std::string path_;
};

Result<std::vector<uint8_t>> ReadFile(const std::string& path);

// A file opened for positioned reads (pread): for streaming a large file
// through a bounded buffer, where a mapping would make every page it
// touches count in the process's resident set. Owns its descriptor and
// closes it on destruction; movable, not copyable. ReadAt may be called
// from several threads at once.
class ReadOnlyFile {
 public:
  ReadOnlyFile() = default;
  ~ReadOnlyFile();
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  // Opens `path` read-only; the errors of open and fstat.
  static Result<ReadOnlyFile> Open(const std::string& path);

  // The file's size when it was opened.
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Fills `out` with bytes [offset, offset + out.size()). kDataLoss when the
  // file (now) ends before them, file-system errors otherwise.
  Status ReadAt(uint64_t offset, std::span<uint8_t> out) const;

  // Tells the kernel bytes [offset, offset + length) will be read once,
  // sequentially.
  void AdviseSequential(uint64_t offset, uint64_t length) const;

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
};

// Writes `data` to a temp file beside `path` (unique per call), fsyncs it, renames it over `path` and
// fsyncs the directory: readers see the old file or the new one, whole.
Status WriteFileAtomic(const std::string& path, std::span<const uint8_t> data);

// fsync of the directory that holds `path`, so a create, rename or unlink
// of `path` survives a crash.
Status SyncDirectoryOf(const std::string& path);

// An error for the failed system call `what` on `path`, its code chosen by
// errno (ENOENT kNotFound, EACCES kPermissionDenied, ENOSPC
// kResourceExhausted, ENAMETOOLONG kInvalidArgument, ...).
Status ErrnoStatus(const std::string& what, const std::string& path);

// Reads bytes [offset, offset + length) of a file; kDataLoss when the file
// ends before them.
Result<std::vector<uint8_t>> ReadFileRange(const std::string& path,
                                           uint64_t offset, uint64_t length);

// Overwrites bytes [offset, offset + data.size()) of an existing file in
// place, in one pwrite (repeated only on a short write), then fsyncs it when
// `sync`. Not atomic: a crash can leave any mix of old and new disk blocks
// in the range, so callers that need all-or-nothing keep a redo record.
// kOutOfRange when the range reaches past the end of the file (files never
// grow here).
Status WriteFileRange(const std::string& path, uint64_t offset,
                      std::span<const uint8_t> data, bool sync);

// Removes a file and, when `sync`, fsyncs its directory. OK if it is absent.
Status RemoveFile(const std::string& path, bool sync);

bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);

// What a path names, as the file system identifies it: two paths name the
// same file or directory, whatever their spelling and through any symbolic
// or hard link, exactly when their ids are equal.
struct FileId {
  uint64_t device = 0;
  uint64_t inode = 0;
  friend bool operator==(const FileId&, const FileId&) = default;
};

// The id of what `path` names, symbolic links followed; nullopt when nothing
// is there or it cannot be examined.
std::optional<FileId> GetFileId(const std::string& path);

// What stat() says of a file's identity, size and times: a file whose
// stamp is unchanged was not written, replaced or truncated since (writes
// through a shared mapping update the times when a clean page is first
// stored to, on file systems with page_mkwrite; tmpfs does not).
struct FileStamp {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  friend bool operator==(const FileStamp&, const FileStamp&) = default;
};

// The stamp of `path`; nullopt when it cannot be examined.
std::optional<FileStamp> GetFileStamp(const std::string& path);

// Whether `path`, existing or not, is the directory `dir` or lies anywhere
// under it: true when `path` or one of its ancestors (taken lexically from
// its absolute form, each looked up with symbolic links followed) has id
// `dir`.
bool IsWithinDirectory(const std::string& path, const FileId& dir);

}  // namespace refit

#endif  // REFIT_BASE_FILE_H_
