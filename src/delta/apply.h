// Applying deltas in place (docs/format.md §3, "Apply rule").
//
// ApplyChunkInPlace applies one chunk whose range is known to hold the
// chunk's "before" bytes: it decodes into bounded scratch, stores only the
// changed elements (so only their pages are dirtied), re-hashes the range
// and undoes its stores if the result is not exactly "after". ApplyDelta
// runs the whole protocol over a set of tensors: check every tensor against
// the base first (nothing is written unless every tensor is exactly the
// base or already the target), apply chunks in parallel (journaling each
// chunk's pre-image first when given a journal), verify the target hashes,
// and roll every stored chunk back when anything fails.
// Distinct chunks touch distinct ranges, so chunks may be applied
// concurrently; everything else is single-caller.
#ifndef REFIT_DELTA_APPLY_H_
#define REFIT_DELTA_APPLY_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "delta/apply_journal.h"
#include "delta/chunk.h"
#include "delta/delta_file.h"
#include "refit/delta.h"
#include "refit/status.h"

namespace refit {


enum class RangeState { kBefore, kAfter, kNeither };

RangeState ClassifyRange(const ChunkHeader& h, const Hash128& range_hash);

// What it takes to undo an applied overwrite chunk: the element indices
// (relative to the chunk start) and old bytes it replaced. XOR chunks need
// nothing: applying them again undoes them.
struct UndoRecord {
  std::vector<uint32_t> at;
  std::vector<uint8_t> old;
};

struct ApplyScratch {
  std::vector<uint32_t> positions;
  std::vector<uint8_t> values;
  std::vector<uint8_t> dense;
  std::vector<uint8_t> pre_image;
  UndoRecord undo;
};

// Requires: tensor_data + h.start * h.width holds the chunk's "before"
// bytes. On success the range holds "after" and, for overwrite kinds,
// *undo (if not null) receives the replaced bytes; on failure the range is
// restored byte for byte. *pages_written (if not null) grows by the pages
// stored to. *after_digests (if not null) receives the 64 KiB segment
// digests of a contiguous range as applied (the check against "after"
// hashes them anyway), and is left empty for a strided region.
Status ApplyChunkInPlace(const ParsedChunk& chunk, uint8_t* tensor_data,
                         ApplyScratch* scratch, uint64_t* pages_written,
                         UndoRecord* undo,
                         std::vector<Hash128>* after_digests = nullptr);

// Reverts a chunk applied by ApplyChunkInPlace.
Status UndoChunkInPlace(const ParsedChunk& chunk, uint8_t* tensor_data,
                        ApplyScratch* scratch, const UndoRecord& undo);

// Called once per tensor that the apply changed, with the tensor's index in
// the caller's list, after all chunks are applied and verified.
using SyncRangeFn = std::function<Status(size_t tensor)>;

// Errors: kFailedPrecondition when a tensor is neither the base nor the
// target (nothing written); kCancelled when options.cancel was set: without
// a journal every stored chunk is rolled back first, with one the stored
// chunks stay and the journal records them (RestorePreImages undoes them);
// otherwise the first chunk's error, after rolling every chunk back.
Result<ApplyReport> ApplyDelta(const DeltaReader& delta,
                               const std::vector<MutableTensorView>& tensors,
                               const ApplyOptions& options,
                               const SyncRangeFn& sync,
                               ApplyJournal* journal = nullptr);

// Writes every pre-image of `journal` (an interrupted apply of `delta`)
// back into `tensors`, which then hold the delta's base wherever that apply
// stored; returns the number of chunks restored. Idempotent. kDataLoss when
// the journal does not fit the delta.
Result<uint64_t> RestorePreImages(const DeltaReader& delta,
                                  const std::vector<MutableTensorView>& tensors,
                                  const ApplyJournalState& journal, int threads);

// Range hashes of every tensor in `tensors` compared with the delta's
// tensor table.
Result<VerifyReport> VerifyTensors(const DeltaReader& delta,
                                   const std::vector<TensorView>& tensors,
                                   int threads);

}  // namespace refit

#endif  // REFIT_DELTA_APPLY_H_
