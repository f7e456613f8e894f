#include "delta/file_headers.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "base/bytes.h"
#include "base/file.h"
#include "format/safetensors.h"

namespace refit {
namespace {

constexpr char kJournalMagic[8] = {'R', 'F', 'H', 'D', 'R', 'J', 'N', 'L'};
constexpr std::string_view kSingleFileName = "model.safetensors";
// The unit in which a crash may tear a write: a disk sector. Pages are
// whole sectors, so comparing by sector also covers page-sized tears.
constexpr uint64_t kTearBlock = 512;

// The JSON of a header without its trailing padding (safetensors pads with
// spaces).
std::span<const uint8_t> Trimmed(std::span<const uint8_t> json) {
  size_t n = json.size();
  while (n > 0 && json[n - 1] == ' ') --n;
  return json.first(n);
}

bool SameBytes(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

const CarriedHeader* FindCarried(const DeltaReader& delta,
                                 const std::string& name) {
  const auto& hs = delta.headers();
  auto it = std::lower_bound(
      hs.begin(), hs.end(), name,
      [](const CarriedHeader& h, const std::string& n) { return h.name < n; });
  return it == hs.end() || it->name != name ? nullptr : &*it;
}

// The file a journal or delta name refers to in the checkpoint at `path`.
// Names come from a journal we wrote, but are still kept inside the
// checkpoint directory.
Result<std::string> ResolveName(const std::string& checkpoint_path,
                                const std::string& name) {
  if (!IsDirectory(checkpoint_path)) {
    if (name != kSingleFileName) {
      return DataLossError("header journal names '" + name +
                           "' for a single-file checkpoint");
    }
    return checkpoint_path;
  }
  if (name.empty() || name.front() == '/' || name == ".." ||
      name.starts_with("../") || name.find("/../") != std::string::npos ||
      name.ends_with("/..")) {
    return DataLossError("header journal names a path outside the checkpoint");
  }
  return checkpoint_path + "/" + name;
}

// What the target's header `carried` becomes in a file whose header is
// `current` (same length N, padded with spaces), or why it cannot be
// carried: it must fit in N bytes and describe the file's tensors at the
// same offsets.
Result<std::vector<uint8_t>> PlanHeader(const Checkpoint& ckpt,
                                        size_t file_index,
                                        std::span<const uint8_t> carried,
                                        std::span<const uint8_t> current,
                                        std::string* why_not) {
  std::span<const uint8_t> json = Trimmed(carried);
  if (json.size() > current.size()) {
    *why_not = "the target's header is " + std::to_string(json.size()) +
               " bytes and this file's header area " +
               std::to_string(current.size());
    return std::vector<uint8_t>{};
  }
  std::vector<uint8_t> out(json.begin(), json.end());
  out.resize(current.size(), ' ');
  // Parsed as the file would be with the new header: the parser checks it
  // as hostile input and places every tensor against this file's size.
  std::vector<uint8_t> prefix;
  ByteWriter w(&prefix);
  w.U64(out.size());
  w.Bytes(out);
  const CheckpointFile& file = ckpt.files()[file_index];
  auto parsed = ParseSafetensorsHeader(prefix, file.size);
  if (!parsed.ok()) {
    *why_not = "the target's header does not fit this file: " +
               std::string(parsed.status().message());
    return std::vector<uint8_t>{};
  }
  // Both lists are sorted by name.
  size_t k = 0;
  for (const TensorInfo& t : ckpt.tensors()) {
    if (t.file_index != file_index) continue;
    if (k >= parsed->tensors.size() || parsed->tensors[k].name != t.name ||
        parsed->tensors[k].dtype != t.dtype ||
        parsed->tensors[k].shape != t.shape ||
        parsed->tensors[k].offset != t.offset ||
        parsed->tensors[k].byte_size != t.byte_size) {
      *why_not = "the target's header places tensor '" + t.name +
                 "' differently";
      return std::vector<uint8_t>{};
    }
    ++k;
  }
  if (k != parsed->tensors.size()) {
    *why_not = "the target's header names tensors this file does not hold";
    return std::vector<uint8_t>{};
  }
  return out;
}

uint64_t JournalChecksum(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

// Whether `current` is a torn write of `new_json` over `old_json`: every
// disk block of the header (blocks aligned in the file, the header starting
// at byte 8) is the old or the new one's.
bool IsTornMix(std::span<const uint8_t> current,
               std::span<const uint8_t> old_json,
               std::span<const uint8_t> new_json) {
  const uint64_t n = current.size();
  for (uint64_t file_off = 0; file_off < 8 + n; file_off += kTearBlock) {
    const uint64_t begin = file_off < 8 ? 0 : file_off - 8;
    const uint64_t end = std::min<uint64_t>(n, file_off + kTearBlock - 8);
    if (begin >= end) continue;
    auto cur = current.subspan(begin, end - begin);
    if (!SameBytes(cur, old_json.subspan(begin, end - begin)) &&
        !SameBytes(cur, new_json.subspan(begin, end - begin))) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string CarriedFileName(const Checkpoint& ckpt, size_t file_index) {
  const std::string& path = ckpt.files()[file_index].path;
  if (!IsDirectory(ckpt.path())) return std::string(kSingleFileName);
  const std::string prefix = ckpt.path() + "/";
  if (path.starts_with(prefix)) return path.substr(prefix.size());
  return path;
}

Result<std::vector<CarriedHeader>> CollectCarriedHeaders(
    const Checkpoint& ckpt) {
  std::vector<CarriedHeader> out;
  out.reserve(ckpt.files().size());
  for (size_t i = 0; i < ckpt.files().size(); ++i) {
    REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> json,
                           ReadSafetensorsHeaderBytes(ckpt.files()[i].path));
    out.push_back(CarriedHeader{CarriedFileName(ckpt, i), std::move(json)});
  }
  return out;
}

Status CarryHeaders(const DeltaReader& delta, const Checkpoint& ckpt,
                    bool sync, ApplyReport* report) {
  if (delta.headers().empty()) return Status();
  std::vector<HeaderJournalEntry> plan;
  std::vector<std::string> paths;
  for (size_t i = 0; i < ckpt.files().size(); ++i) {
    const std::string& path = ckpt.files()[i].path;
    const std::string name = CarriedFileName(ckpt, i);
    const CarriedHeader* carried = FindCarried(delta, name);
    if (carried == nullptr) {
      report->headers_not_carried.push_back(
          path + ": the delta carries no header for '" + name +
          "' (the target's files are laid out differently)");
      continue;
    }
    REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> current,
                           ReadSafetensorsHeaderBytes(path));
    std::string why_not;
    REFIT_ASSIGN_OR_RETURN(
        std::vector<uint8_t> next,
        PlanHeader(ckpt, i, carried->json, current, &why_not));
    if (!why_not.empty()) {
      report->headers_not_carried.push_back(path + ": " + why_not);
      continue;
    }
    if (next == current) {
      ++report->headers_unchanged;
      continue;
    }
    plan.push_back(HeaderJournalEntry{name, std::move(current), std::move(next)});
    paths.push_back(path);
  }
  if (plan.empty()) return Status();
  if (sync) {
    // Without a redo record a torn header could not be repaired, so no
    // header is written; the tensors are the target's all the same.
    Status journaled = WriteHeaderJournal(ckpt.path(), plan);
    if (!journaled.ok()) {
      for (const std::string& path : paths) {
        report->headers_not_carried.push_back(
            path + ": the header journal could not be written (" +
            std::string(journaled.message()) + ")");
      }
      return Status();
    }
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    REFIT_RETURN_IF_ERROR(
        WriteSafetensorsHeaderInPlace(paths[i], plan[i].new_json, sync));
    ++report->headers_written;
  }
  // Once every header is durable the journal has nothing left to redo; a
  // journal that outlives a crash here finds the new headers and is dropped.
  if (sync) REFIT_RETURN_IF_ERROR(RemoveFile(HeaderJournalPath(ckpt.path()), true));
  return Status();
}

Status CompareHeaders(const DeltaReader& delta, const Checkpoint& ckpt,
                      VerifyReport* report) {
  if (delta.headers().empty()) return Status();
  report->headers_checked = true;
  for (size_t i = 0; i < ckpt.files().size(); ++i) {
    const std::string& path = ckpt.files()[i].path;
    const std::string name = CarriedFileName(ckpt, i);
    const CarriedHeader* carried = FindCarried(delta, name);
    if (carried == nullptr) {
      report->header_differs.push_back(
          path + ": the delta carries no header for '" + name + "'");
      continue;
    }
    REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> current,
                           ReadSafetensorsHeaderBytes(path));
    if (!SameBytes(Trimmed(current), Trimmed(carried->json))) {
      report->header_differs.push_back(
          path + ": its safetensors header differs from the target's");
    }
  }
  return Status();
}

std::string HeaderJournalPath(const std::string& checkpoint_path) {
  return IsDirectory(checkpoint_path)
             ? checkpoint_path + "/.refit-header-journal"
             : checkpoint_path + ".refit-header-journal";
}

// Journal layout (little-endian, private to this file's readers):
//   magic "RFHDRJNL", varint count, per entry: string name, varint n, n old
//   bytes, n new bytes; then u64 XXH3-64 of everything before it.
Status WriteHeaderJournal(const std::string& checkpoint_path,
                          const std::vector<HeaderJournalEntry>& entries) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(kJournalMagic, 8);
  w.Varint(entries.size());
  for (const HeaderJournalEntry& e : entries) {
    if (e.old_json.size() != e.new_json.size()) {
      return InvalidArgumentError("header journal entry '" + e.name +
                                  "' changes the header's length");
    }
    w.String(e.name);
    w.Varint(e.new_json.size());
    w.Bytes(e.old_json);
    w.Bytes(e.new_json);
  }
  w.U64(JournalChecksum(out));
  return WriteFileAtomic(HeaderJournalPath(checkpoint_path), out);
}

Status RecoverHeaderJournal(const std::string& checkpoint_path) {
  const std::string journal = HeaderJournalPath(checkpoint_path);
  if (!PathExists(journal)) return Status();
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(journal));
  auto damaged = [&](const std::string& why) {
    return DataLossError("header journal '" + journal + "' is damaged (" +
                         why +
                         "); check the checkpoint's headers with `refit "
                         "verify`, then remove it");
  };
  if (bytes.size() < 8 + 1 + 8 ||
      std::memcmp(bytes.data(), kJournalMagic, 8) != 0) {
    return damaged("bad magic");
  }
  const size_t body = bytes.size() - 8;
  if (JournalChecksum(std::span<const uint8_t>(bytes).first(body)) !=
      LoadLE(bytes.data() + body, 8)) {
    return damaged("checksum mismatch");
  }
  ByteReader r(bytes.data() + 8, body - 8);
  const uint64_t count = r.Varint();
  if (!r.ok() || count > kMaxCarriedFiles || count > r.remaining() / 2) {
    return damaged("implausible entry count");
  }
  std::vector<HeaderJournalEntry> entries(count);
  for (HeaderJournalEntry& e : entries) {
    e.name = r.String(kMaxNameBytes);
    const uint64_t n = r.Varint();
    if (!r.ok() || n > kMaxCarriedHeaderBytes || n > r.remaining() / 2) {
      return damaged("entry out of bounds");
    }
    auto old_json = r.Bytes(n);
    auto new_json = r.Bytes(n);
    e.old_json.assign(old_json.begin(), old_json.end());
    e.new_json.assign(new_json.begin(), new_json.end());
  }
  if (!r.ok() || r.remaining() != 0) return damaged("bad length");

  for (const HeaderJournalEntry& e : entries) {
    REFIT_ASSIGN_OR_RETURN(std::string path,
                           ResolveName(checkpoint_path, e.name));
    // A file that was replaced since (another length, or gone) is not this
    // journal's to repair.
    auto current = ReadSafetensorsHeaderBytes(path);
    if (!current.ok() || current->size() != e.new_json.size()) continue;
    if (*current == e.new_json || *current == e.old_json) continue;
    if (!IsTornMix(*current, e.old_json, e.new_json)) continue;
    REFIT_RETURN_IF_ERROR(
        WriteSafetensorsHeaderInPlace(path, e.new_json, /*sync=*/true));
  }
  return RemoveFile(journal, /*sync=*/true);
}

}  // namespace refit
