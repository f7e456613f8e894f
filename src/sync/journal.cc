#include "sync/journal.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/bytes.h"
#include "base/file.h"

namespace refit {
namespace {

enum RecordType : uint8_t {
  kBegin = 1,
  kApplied = 2,
  kVoted = 3,
  kBeginFold = 4,
  kFailed = 5,
};
// A chain longer than this is not a fold any receiver writes.
constexpr uint64_t kMaxFoldVersions = 1u << 16;
constexpr uint32_t kMaxRecord = 1u << 30;

uint32_t Checksum(uint8_t type, const uint8_t* p, size_t n) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &type, 1);
  XXH3_64bits_update(st, p, n);
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return static_cast<uint32_t>(h);
}

Status Errno(const std::string& what, const std::string& path) {
  return UnavailableError(what + " '" + path + "': " + std::strerror(errno));
}

}  // namespace

Journal::Journal(Journal&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
Journal& Journal::operator=(Journal&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}
Journal::~Journal() {
  if (fd_ >= 0) close(fd_);
}

Result<std::optional<JournalState>> Journal::Load(const std::string& path) {
  if (!PathExists(path)) return std::optional<JournalState>();
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
  std::optional<JournalState> state;
  ByteReader r(bytes);
  while (r.remaining() >= 9) {
    uint32_t len = r.U32();
    uint8_t type = r.U8();
    if (len > kMaxRecord || r.remaining() < static_cast<size_t>(len) + 4) break;
    auto body = r.Bytes(len);
    uint32_t sum = r.U32();
    if (sum != Checksum(type, body.data(), body.size())) break;  // torn tail
    ByteReader b(body);
    if (type == kBegin) {
      state.emplace();
      state->version = b.U64();
      state->base_version = b.U64();
      auto h = b.Bytes(32);
      if (b.ok()) std::memcpy(state->announcement_sha256.data(), h.data(), 32);
    } else if (type == kBeginFold) {
      state.emplace();
      state->base_version = b.U64();
      const uint64_t n = b.Varint();
      if (n < 2 || n > kMaxFoldVersions || n * 40 > body.size()) {
        return DataLossError("journal '" + path + "': malformed fold record");
      }
      for (uint64_t i = 0; i < n && b.ok(); ++i) {
        state->fold_versions.push_back(b.U64());
        Sha256 sha{};
        auto h = b.Bytes(32);
        if (b.ok()) std::memcpy(sha.data(), h.data(), 32);
        state->fold_announcements.push_back(sha);
      }
      if (b.ok()) {
        state->version = state->fold_versions.back();
        state->announcement_sha256 = state->fold_announcements.back();
        uint64_t prev = state->base_version;
        for (uint64_t v : state->fold_versions) {
          if (v <= prev) return DataLossError("journal '" + path + "': fold versions out of order");
          prev = v;
        }
      }
    } else if (!state) {
      return DataLossError("journal '" + path + "' does not start with a begin record");
    } else if (type == kApplied) {
      uint64_t chunk = b.Varint();
      UndoRecord undo;
      uint64_t n = b.Varint();
      uint8_t width = b.U8();
      if (n > body.size()) return DataLossError("journal record malformed");
      for (uint64_t i = 0; i < n && b.ok(); ++i) undo.at.push_back(static_cast<uint32_t>(b.Varint()));
      auto old = b.Bytes(n * width);
      undo.old.assign(old.begin(), old.end());
      state->applied[chunk] = std::move(undo);
    } else if (type == kVoted) {
      state->voted = true;
    } else if (type == kFailed) {
      state->failed = true;
      state->failed_bound = b.U64();
    }
    REFIT_RETURN_IF_ERROR(b.status("journal '" + path + "'"));
  }
  return state;
}

Result<Journal> Journal::Create(const std::string& path, uint8_t type,
                                const std::vector<uint8_t>& body) {
  Journal j;
  j.path_ = path;
  j.fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (j.fd_ < 0) return Errno("cannot create journal", path);
  REFIT_RETURN_IF_ERROR(j.Append(type, body));
  REFIT_RETURN_IF_ERROR(j.Sync());
  return j;
}

Result<Journal> Journal::Begin(const std::string& path, uint64_t version,
                               uint64_t base_version, const Sha256& manifest) {
  std::vector<uint8_t> body;
  ByteWriter w(&body);
  w.U64(version);
  w.U64(base_version);
  w.Bytes(manifest.data(), manifest.size());
  return Create(path, kBegin, body);
}

Result<Journal> Journal::BeginFold(const std::string& path, uint64_t base_version,
                                   const std::vector<uint64_t>& versions,
                                   const std::vector<Sha256>& announcements) {
  if (versions.size() < 2 || versions.size() > kMaxFoldVersions ||
      announcements.size() != versions.size()) {
    return InvalidArgumentError("a fold journals at least two versions, each with its announcement");
  }
  std::vector<uint8_t> body;
  ByteWriter w(&body);
  w.U64(base_version);
  w.Varint(versions.size());
  for (size_t i = 0; i < versions.size(); ++i) {
    w.U64(versions[i]);
    w.Bytes(announcements[i].data(), announcements[i].size());
  }
  return Create(path, kBeginFold, body);
}

Result<Journal> Journal::Reopen(const std::string& path) {
  Journal j;
  j.path_ = path;
  j.fd_ = open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (j.fd_ < 0) return Errno("cannot reopen journal", path);
  return j;
}

Status Journal::Append(uint8_t type, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> rec;
  ByteWriter w(&rec);
  w.U32(static_cast<uint32_t>(body.size()));
  w.U8(type);
  w.Bytes(body.data(), body.size());
  w.U32(Checksum(type, body.data(), body.size()));
  const uint8_t* p = rec.data();
  size_t n = rec.size();
  while (n > 0) {
    ssize_t k = write(fd_, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot append to journal", path_);
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status();
}

Status Journal::Applied(uint64_t chunk, const UndoRecord& undo) {
  std::vector<uint8_t> body;
  ByteWriter w(&body);
  w.Varint(chunk);
  w.Varint(undo.at.size());
  uint8_t width = undo.at.empty() ? 0 : static_cast<uint8_t>(undo.old.size() / undo.at.size());
  w.U8(width);
  for (uint32_t a : undo.at) w.Varint(a);
  w.Bytes(undo.old.data(), undo.old.size());
  return Append(kApplied, body);
}

Status Journal::Voted() { return Append(kVoted, {}); }

Status Journal::Failed(uint64_t bound) {
  std::vector<uint8_t> body;
  ByteWriter w(&body);
  w.U64(bound);
  return Append(kFailed, body);
}

Status Journal::Sync() {
  if (fdatasync(fd_) != 0) return Errno("cannot sync journal", path_);
  return Status();
}

Status Journal::Remove(const std::string& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Errno("cannot remove journal", path);
  }
  return Status();
}

}  // namespace refit
