#include "sync/journal.h"

#include <unistd.h>

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
  kFoldApplied = 6,
};
// A chain longer than this is not a fold any receiver writes.
constexpr uint64_t kMaxFoldVersions = 1u << 16;

Status Errno(const std::string& what, const std::string& path) {
  return UnavailableError(what + " '" + path + "': " + std::strerror(errno));
}

// The undo part of an applied record: varint n, u8 width, n varint
// positions, n * width pre-image bytes.
void WriteUndo(ByteWriter* w, const UndoRecord& undo) {
  w->Varint(undo.at.size());
  uint8_t width = undo.at.empty() ? 0 : static_cast<uint8_t>(undo.old.size() / undo.at.size());
  w->U8(width);
  for (uint32_t a : undo.at) w->Varint(a);
  w->Bytes(undo.old.data(), undo.old.size());
}

Result<UndoRecord> ReadUndo(ByteReader* b, size_t body_size) {
  UndoRecord undo;
  uint64_t n = b->Varint();
  uint8_t width = b->U8();
  if (n > body_size) return DataLossError("journal record malformed");
  for (uint64_t i = 0; i < n && b->ok(); ++i) undo.at.push_back(static_cast<uint32_t>(b->Varint()));
  auto old = b->Bytes(n * width);
  undo.old.assign(old.begin(), old.end());
  return undo;
}

}  // namespace

Result<std::optional<JournalState>> Journal::Load(const std::string& path) {
  if (!PathExists(path)) return std::optional<JournalState>();
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
  std::optional<JournalState> state;
  const Status read = RecordFile::ForEach(
      bytes, [&](uint8_t type, std::span<const uint8_t> body) -> Status {
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
      REFIT_ASSIGN_OR_RETURN(UndoRecord undo, ReadUndo(&b, body.size()));
      state->applied[chunk] = std::move(undo);
    } else if (type == kFoldApplied) {
      JournalState::FoldChunk c;
      c.position = b.Varint();
      c.chunk = b.Varint();
      REFIT_ASSIGN_OR_RETURN(c.undo, ReadUndo(&b, body.size()));
      if (b.ok() && c.position >= state->fold_versions.size()) {
        return DataLossError("journal '" + path + "': a fold chunk outside the fold");
      }
      state->fold_applied.push_back(std::move(c));
    } else if (type == kVoted) {
      state->voted = true;
    } else if (type == kFailed) {
      state->failed = true;
      state->failed_bound = b.U64();
    }
    return b.status("journal '" + path + "'");
  });
  REFIT_RETURN_IF_ERROR(read);
  return state;
}

Result<Journal> Journal::Create(const std::string& path, uint8_t type,
                                const std::vector<uint8_t>& body) {
  Journal j;
  REFIT_ASSIGN_OR_RETURN(j.file_, RecordFile::Create(path));
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
  REFIT_ASSIGN_OR_RETURN(j.file_, RecordFile::Reopen(path));
  return j;
}

Status Journal::Append(uint8_t type, const std::vector<uint8_t>& body) {
  return file_.Append(type, body);
}

Status Journal::Applied(uint64_t chunk, const UndoRecord& undo) {
  std::vector<uint8_t> body;
  ByteWriter w(&body);
  w.Varint(chunk);
  WriteUndo(&w, undo);
  return Append(kApplied, body);
}

Status Journal::FoldApplied(uint64_t position, uint64_t chunk, const UndoRecord& undo) {
  std::vector<uint8_t> body;
  ByteWriter w(&body);
  w.Varint(position);
  w.Varint(chunk);
  WriteUndo(&w, undo);
  return Append(kFoldApplied, body);
}

Status Journal::Voted() { return Append(kVoted, {}); }

Status Journal::Failed(uint64_t bound) {
  std::vector<uint8_t> body;
  ByteWriter w(&body);
  w.U64(bound);
  return Append(kFailed, body);
}

Status Journal::Sync() { return file_.Sync(); }

Status Journal::Remove(const std::string& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Errno("cannot remove journal", path);
  }
  return Status();
}

}  // namespace refit
