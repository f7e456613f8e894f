#include "base/record_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "base/bytes.h"
#include "base/file.h"

namespace refit {
namespace {

uint32_t Checksum(uint8_t type, std::span<const uint8_t> body) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &type, 1);
  XXH3_64bits_update(st, body.data(), body.size());
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return static_cast<uint32_t>(h);
}

}  // namespace

RecordFile::RecordFile(RecordFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}

RecordFile& RecordFile::operator=(RecordFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

RecordFile::~RecordFile() {
  if (fd_ >= 0) close(fd_);
}

Result<RecordFile> RecordFile::Create(const std::string& path) {
  RecordFile f;
  f.path_ = path;
  f.fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd_ < 0) return ErrnoStatus("cannot create", path);
  return f;
}

Result<RecordFile> RecordFile::Reopen(const std::string& path) {
  RecordFile f;
  f.path_ = path;
  f.fd_ = open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (f.fd_ < 0) return ErrnoStatus("cannot reopen", path);
  return f;
}

Status RecordFile::Append(uint8_t type, std::span<const uint8_t> body) {
  if (body.size() > kMaxRecordBody) {
    return InvalidArgumentError("record of " + std::to_string(body.size()) +
                                " bytes is over the limit for '" + path_ + "'");
  }
  std::vector<uint8_t> rec;
  rec.reserve(body.size() + 9);
  ByteWriter w(&rec);
  w.U32(static_cast<uint32_t>(body.size()));
  w.U8(type);
  w.Bytes(body.data(), body.size());
  w.U32(Checksum(type, body));
  std::lock_guard<std::mutex> lock(mu_);
  const uint8_t* p = rec.data();
  size_t n = rec.size();
  while (n > 0) {
    ssize_t k = write(fd_, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("cannot append to", path_);
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status();
}

Status RecordFile::Sync() {
  if (fdatasync(fd_) != 0) return ErrnoStatus("cannot sync", path_);
  return Status();
}

Status RecordFile::ForEach(
    std::span<const uint8_t> bytes,
    const std::function<Status(uint8_t, std::span<const uint8_t>)>& fn) {
  ByteReader r(bytes);
  while (r.remaining() >= 9) {
    const uint32_t len = r.U32();
    const uint8_t type = r.U8();
    if (len > kMaxRecordBody || r.remaining() < static_cast<size_t>(len) + 4) break;
    auto body = r.Bytes(len);
    if (r.U32() != Checksum(type, body)) break;  // torn tail
    REFIT_RETURN_IF_ERROR(fn(type, body));
  }
  return Status();
}

Status RecordFile::Remove(const std::string& path) {
  return RemoveFile(path, /*sync=*/true);
}

}  // namespace refit
