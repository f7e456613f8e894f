#include "delta/apply_journal.h"

#include <cstring>
#include <utility>
#include <vector>

#include "base/bytes.h"

namespace refit {
namespace {

enum RecordType : uint8_t { kBegin = 1, kPreImage = 2 };
constexpr char kMagic[8] = {'R', 'F', 'A', 'P', 'P', 'L', 'Y', '1'};

}  // namespace

DeltaIdentity IdentifyDelta(const DeltaReader& delta) {
  std::vector<uint8_t> bytes;
  ByteWriter w(&bytes);
  w.U64(delta.version());
  w.U64(delta.base_version());
  for (const TensorEntry& t : delta.tensors()) {
    w.String(t.name);
    w.U64(t.before.lo);
    w.U64(t.before.hi);
    w.U64(t.after.lo);
    w.U64(t.after.hi);
  }
  for (const IndexEntry& e : delta.index()) {
    w.U64(e.size);
    w.U64(e.tensor_id);
    w.U64(e.start);
    w.U64(e.count);
    w.U8(static_cast<uint8_t>(e.kind));
  }
  return DeltaIdentity{delta.version(), delta.base_version(),
                       HashBytes(bytes.data(), bytes.size())};
}

std::string ApplyJournal::PathFor(const std::string& checkpoint_path) {
  std::string p = checkpoint_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (IsDirectory(p)) return p + "/.refit-apply";
  return p + ".refit-apply";
}

Status ApplyJournal::Start() {
  REFIT_ASSIGN_OR_RETURN(file_, RecordFile::Create(path_));
  std::vector<uint8_t> body;
  ByteWriter w(&body);
  w.Bytes(kMagic, sizeof(kMagic));
  w.U64(delta_.version);
  w.U64(delta_.base_version);
  w.U64(delta_.digest.lo);
  w.U64(delta_.digest.hi);
  REFIT_RETURN_IF_ERROR(file_.Append(kBegin, body));
  REFIT_RETURN_IF_ERROR(file_.Sync());
  return SyncDirectoryOf(path_);
}

Status ApplyJournal::Record(uint64_t chunk, std::span<const uint8_t> pre_image) {
  std::vector<uint8_t> body;
  body.reserve(pre_image.size() + 10);
  ByteWriter w(&body);
  w.Varint(chunk);
  w.Bytes(pre_image);
  return file_.Append(kPreImage, body);
}

Result<std::optional<ApplyJournalState>> ApplyJournal::Load(const std::string& path) {
  if (!PathExists(path)) return std::optional<ApplyJournalState>();
  ApplyJournalState state;
  REFIT_ASSIGN_OR_RETURN(state.file, MappedFile::Open(path, MappedFile::Mode::kReadOnly));
  bool begun = false;
  const std::string what = "apply journal '" + path + "'";
  const Status read = RecordFile::ForEach(
      state.file.bytes(), [&](uint8_t type, std::span<const uint8_t> body) -> Status {
        ByteReader r(body);
        if (!begun) {
          auto magic = r.Bytes(sizeof(kMagic));
          if (type != kBegin || !r.ok() ||
              std::memcmp(magic.data(), kMagic, sizeof(kMagic)) != 0) {
            return DataLossError(what + " does not start with a begin record");
          }
          state.delta.version = r.U64();
          state.delta.base_version = r.U64();
          state.delta.digest.lo = r.U64();
          state.delta.digest.hi = r.U64();
          begun = true;
          return r.status(what);
        }
        if (type != kPreImage) return DataLossError(what + ": unknown record type");
        const uint64_t chunk = r.Varint();
        REFIT_RETURN_IF_ERROR(r.status(what));
        // Each run journals a chunk once, in a journal of its own.
        state.pre_images.emplace(chunk, body.subspan(body.size() - r.remaining()));
        return Status();
      });
  REFIT_RETURN_IF_ERROR(read);
  if (!begun) return std::optional<ApplyJournalState>();
  return std::optional<ApplyJournalState>(std::move(state));
}

}  // namespace refit
