// The journal of an apply into a checkpoint on disk (docs/format.md §9,
// "Interrupted applies").
//
// XOR chunks are not idempotent, so a process killed in the middle of a
// chunk's stores leaves a range that hashes to neither "before" nor
// "after" and that no re-run could classify. Before the first store of a
// chunk, the apply appends the chunk's pre-image to this journal: the old
// bytes of every element the chunk may store to (sparse kinds: the
// elements at its positions, in order; dense kinds: its whole range). A
// later run restores every journaled pre-image, which returns the
// checkpoint to the delta's base exactly (chunks touch disjoint ranges and
// nothing is stored before it is journaled), and then applies the delta
// from the start or, for a rollback, stops there. Records are framed by
// base/record_file.h, so a record torn by the kill is ignored: its chunk
// had not been stored to yet.
//
// The journal lives beside the checkpoint (PathFor) and is removed once
// the apply has been verified and synced. Record() is thread-safe.
#ifndef REFIT_DELTA_APPLY_JOURNAL_H_
#define REFIT_DELTA_APPLY_JOURNAL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>

#include "base/file.h"
#include "base/hash.h"
#include "base/record_file.h"
#include "delta/delta_file.h"
#include "refit/status.h"

namespace refit {

// What identifies a delta to its journal: its versions, tensor hashes and
// chunk index.
struct DeltaIdentity {
  uint64_t version = 0;
  uint64_t base_version = 0;
  Hash128 digest;
  friend bool operator==(const DeltaIdentity&, const DeltaIdentity&) = default;
};
DeltaIdentity IdentifyDelta(const DeltaReader& delta);

// A journal read back: pre-images are views into `file`'s mapping.
struct ApplyJournalState {
  DeltaIdentity delta;
  MappedFile file;
  std::map<uint64_t, std::span<const uint8_t>> pre_images;  // by chunk index
};

class ApplyJournal {
 public:
  // The journal's path for the checkpoint at `checkpoint_path`: beside a
  // .safetensors file (`model.safetensors.refit-apply`), inside a
  // checkpoint directory (`DIR/.refit-apply`).
  static std::string PathFor(const std::string& checkpoint_path);

  // A journal for `delta` at `path`, not yet on disk: Start() creates it.
  ApplyJournal(std::string path, const DeltaIdentity& delta)
      : path_(std::move(path)), delta_(delta) {}
  // Creates the journal (replacing any old one) and makes its existence
  // durable; an apply calls it once it has checked everything and is about
  // to store, so a journal on disk means stores may have begun.
  Status Start();
  // The journal at `path`: nullopt when there is none, or when a crash
  // tore its first record (then nothing was stored either). kDataLoss for
  // a journal that is not one.
  static Result<std::optional<ApplyJournalState>> Load(const std::string& path);
  static Status Remove(const std::string& path) { return RecordFile::Remove(path); }

  // Appends chunk `chunk`'s pre-image. Sync() makes every record so far
  // durable; a chunk's stores may reach the disk any time after they are
  // made, so an apply that must survive a power loss syncs between the
  // records and the stores.
  // Requires Start().
  Status Record(uint64_t chunk, std::span<const uint8_t> pre_image);
  Status Sync() { return file_.Sync(); }

 private:
  std::string path_;
  DeltaIdentity delta_;
  RecordFile file_;
};

}  // namespace refit

#endif  // REFIT_DELTA_APPLY_JOURNAL_H_
