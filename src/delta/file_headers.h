// Carrying the target's safetensors headers (docs/format.md §6, §8).
//
// A delta's tensors make a patched file's data the target's; its header
// (the JSON with "__metadata__") stays the base's unless the delta carries
// the target's header and the apply rewrites it. This file collects headers
// at diff time, rewrites them after an apply, compares them for verify,
// and keeps the rewrite crash-safe with a redo record (the header journal):
//
//   1. every tensor is verified against the target and synced (ApplyDelta);
//   2. the journal - each file's old and new header bytes - is written
//      atomically (temp file, fsync, rename, fsync of the folder);
//   3. each header is overwritten in place in one pwrite, then fsynced;
//   4. the journal is removed.
//
// A header overwrite may be torn by a crash (disk blocks of old and new
// header mixed), which would leave the file unparsable. The next
// RecoverHeaderJournal (Apply calls it before opening the checkpoint) finds
// the journal and completes exactly those files whose header is such a
// mix; a file holding the old header, or anything else, is left to the
// normal apply. Every step is idempotent, so a re-run of apply after a crash
// anywhere ends with the target's bytes.
//
// Not thread-safe; one apply per checkpoint at a time (as for ApplyDelta).
#ifndef REFIT_DELTA_FILE_HEADERS_H_
#define REFIT_DELTA_FILE_HEADERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "delta/delta_file.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "refit/status.h"

namespace refit {

// The name a delta gives ckpt.files()[file_index] (docs/format.md §6): its
// path relative to the checkpoint directory, or "model.safetensors" for a
// checkpoint that is one file.
std::string CarriedFileName(const Checkpoint& ckpt, size_t file_index);

// Every file's header bytes, for DeltaWriter::SetCarriedHeaders.
Result<std::vector<CarriedHeader>> CollectCarriedHeaders(const Checkpoint& ckpt);

// Step 2-4 above for a checkpoint whose tensors ApplyDelta has just made
// the target's. Requires a read-write checkpoint. Counts and notes go into
// report->headers_*; errors are I/O errors on the checkpoint's files only (a
// header that cannot be carried, or a journal that cannot be written, e.g.
// in a read-only folder, is a note and no header is written). With sync
// false, no journal is kept and nothing is fsynced: a crash may then tear a
// header, as it may tear tensor data.
Status CarryHeaders(const DeltaReader& delta, const Checkpoint& ckpt,
                    bool sync, ApplyReport* report);

// Compares every file's header with the delta's (trailing padding ignored)
// into report->headers_checked / header_differs. A no-op for a delta that
// carries no headers.
Status CompareHeaders(const DeltaReader& delta, const Checkpoint& ckpt,
                      VerifyReport* report);

// Where the header journal of the checkpoint at `checkpoint_path` lives:
// "<dir>/.refit-header-journal" for a directory, "<file>.refit-header-journal"
// for a file.
std::string HeaderJournalPath(const std::string& checkpoint_path);

// One file's entry in the journal: `name` as CarriedFileName gives it; the
// old and new header bytes have the same length.
struct HeaderJournalEntry {
  std::string name;
  std::vector<uint8_t> old_json;
  std::vector<uint8_t> new_json;
};

// Writes the journal atomically.
Status WriteHeaderJournal(const std::string& checkpoint_path,
                          const std::vector<HeaderJournalEntry>& entries);

// Finishes an interrupted header rewrite, then removes the journal. OK when
// there is none. kDataLoss when the journal is damaged (it is written
// atomically, so something else wrote it); it is then left in place.
Status RecoverHeaderJournal(const std::string& checkpoint_path);

}  // namespace refit

#endif  // REFIT_DELTA_FILE_HEADERS_H_
