// Append-only files of framed records, for journals that must survive a
// crash at any point.
//
// Each record is `u32 length | u8 type | body | u32 checksum` (checksum =
// low 32 bits of XXH3-64 of type and body, little-endian). A record torn by
// a crash, and everything after it, is ignored on reading. Append() writes
// one record with one write() call; Sync() makes all records so far
// durable (fdatasync). Append() and Sync() may be called from several
// threads at once; everything else is single-caller.
#ifndef REFIT_BASE_RECORD_FILE_H_
#define REFIT_BASE_RECORD_FILE_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>

#include "refit/status.h"

namespace refit {

// The largest record body a reader accepts (and a writer writes).
inline constexpr uint32_t kMaxRecordBody = 1u << 30;

class RecordFile {
 public:
  // A fresh file at `path` (replacing any old one), empty.
  static Result<RecordFile> Create(const std::string& path);
  // An existing file, opened for appending.
  static Result<RecordFile> Reopen(const std::string& path);

  RecordFile() = default;  // closed
  RecordFile(RecordFile&&) noexcept;
  RecordFile& operator=(RecordFile&&) noexcept;
  ~RecordFile();

  Status Append(uint8_t type, std::span<const uint8_t> body);
  Status Sync();
  const std::string& path() const { return path_; }

  // Calls fn(type, body) for each intact record of `bytes` in order,
  // stopping silently at the first torn or corrupt one, or with fn's error.
  static Status ForEach(std::span<const uint8_t> bytes,
                        const std::function<Status(uint8_t type,
                                                   std::span<const uint8_t> body)>& fn);

  // Removes the file at `path` (OK if absent) and syncs its directory, so
  // the removal survives a crash.
  static Status Remove(const std::string& path);

 private:
  int fd_ = -1;
  std::string path_;
  std::mutex mu_;  // one record's bytes are written by one write() at a time
};

}  // namespace refit

#endif  // REFIT_BASE_RECORD_FILE_H_
