// The public delta API (include/refit/delta.h) over checkpoints on disk.
#include <chrono>
#include <optional>
#include <string_view>

#include "base/file.h"
#include "delta/apply.h"
#include "delta/apply_journal.h"
#include "delta/delta_file.h"
#include "delta/encoder.h"
#include "delta/file_headers.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"

namespace refit {
namespace {

// The delta is written beside `out_path` and renamed over it once complete,
// so an `out_path` that names a file of an input checkpoint, by any path,
// would replace that input with the delta; one inside an input's directory
// would replace its index or shards, or leave a stray file that every copy
// of the checkpoint carries along. Both are refused before anything is
// written. `role` is "base" or "target", for the message.
Status CheckOutputSparesInput(const std::string& out_path,
                              const Checkpoint& input, std::string_view role) {
  const std::string output = "output '" + out_path + "' would ";
  if (IsDirectory(input.path())) {
    std::optional<FileId> dir = GetFileId(input.path());
    if (dir && IsWithinDirectory(out_path, *dir)) {
      return InvalidArgumentError(output + "be written inside the " +
                                  std::string(role) + " checkpoint '" +
                                  input.path() + "'");
    }
  }
  std::optional<FileId> out = GetFileId(out_path);
  if (!out) return Status();  // a new file, outside every input directory
  for (const CheckpointFile& f : input.files()) {
    if (GetFileId(f.path) == out) {
      return InvalidArgumentError(
          output + "overwrite the " + std::string(role) + " checkpoint '" +
          f.path + "'" + (f.path == out_path ? "" : " (the same file)"));
    }
  }
  return Status();
}

}  // namespace

std::vector<TensorView> CheckpointViews(const Checkpoint& ckpt) {
  std::vector<TensorView> out;
  out.reserve(ckpt.tensors().size());
  for (size_t i = 0; i < ckpt.tensors().size(); ++i) {
    const TensorInfo& t = ckpt.tensors()[i];
    out.push_back(TensorView{t.name, t.dtype, t.element_width, t.shape,
                             ckpt.Data(i).data()});
  }
  return out;
}

std::vector<MutableTensorView> MutableCheckpointViews(Checkpoint& ckpt) {
  std::vector<MutableTensorView> out;
  out.reserve(ckpt.tensors().size());
  for (size_t i = 0; i < ckpt.tensors().size(); ++i) {
    const TensorInfo& t = ckpt.tensors()[i];
    out.push_back(MutableTensorView{t.name, t.dtype, t.element_width, t.shape,
                                    ckpt.MutableData(i).data()});
  }
  return out;
}

namespace {

// A diff into a delta file carrying `headers` (none for tensors in memory).
Result<DiffReport> DiffToFile(const std::vector<TensorView>& base,
                              const std::vector<TensorView>& target,
                              std::vector<CarriedHeader> headers,
                              const std::string& out_path,
                              const DiffOptions& options) {
  REFIT_ASSIGN_OR_RETURN(auto writer, DeltaWriter::Create(out_path, options.version,
                                                          options.base_version));
  REFIT_RETURN_IF_ERROR(writer->SetCarriedHeaders(std::move(headers)));
  REFIT_ASSIGN_OR_RETURN(DiffReport report,
                         DiffTensorsToSink(base, target, options, writer.get()));
  report.file_bytes = writer->bytes_written();
  return report;
}

}  // namespace

Result<DiffReport> DiffTensors(const std::vector<TensorView>& base,
                               const std::vector<TensorView>& target,
                               const std::string& out_path,
                               const DiffOptions& options) {
  return DiffToFile(base, target, {}, out_path, options);
}

Result<DiffReport> Diff(const std::string& base_path,
                        const std::string& target_path,
                        const std::string& out_path, const DiffOptions& options) {
  REFIT_ASSIGN_OR_RETURN(Checkpoint base,
                         Checkpoint::Open(base_path, Checkpoint::Mode::kReadOnly));
  REFIT_ASSIGN_OR_RETURN(Checkpoint target,
                         Checkpoint::Open(target_path, Checkpoint::Mode::kReadOnly));
  REFIT_RETURN_IF_ERROR(CheckOutputSparesInput(out_path, base, "base"));
  REFIT_RETURN_IF_ERROR(CheckOutputSparesInput(out_path, target, "target"));
  REFIT_ASSIGN_OR_RETURN(std::vector<CarriedHeader> headers,
                         CollectCarriedHeaders(target));
  return DiffToFile(CheckpointViews(base), CheckpointViews(target),
                    std::move(headers), out_path, options);
}

Result<ApplyReport> ApplyToTensors(const std::string& delta_path,
                                   const std::vector<MutableTensorView>& tensors,
                                   const ApplyOptions& options) {
  REFIT_ASSIGN_OR_RETURN(DeltaReader delta, DeltaReader::Open(delta_path));
  return ApplyDelta(delta, tensors, options, nullptr);
}

namespace {

// A checkpoint opened for an apply or a rollback, with any journal an
// interrupted apply left: its pre-images are restored before anything else
// (and made durable before a new journal replaces it).
struct Recovered {
  std::vector<MutableTensorView> views;
  std::string journal_path;
  bool had_journal = false;
  uint64_t chunks_restored = 0;
};

Result<Recovered> Recover(const DeltaReader& delta, Checkpoint& ckpt,
                          const std::string& checkpoint_path,
                          const ApplyOptions& options) {
  Recovered r;
  r.views = MutableCheckpointViews(ckpt);
  r.journal_path = ApplyJournal::PathFor(checkpoint_path);
  REFIT_ASSIGN_OR_RETURN(auto journal, ApplyJournal::Load(r.journal_path));
  if (!journal) return r;
  if (journal->delta != IdentifyDelta(delta)) {
    return FailedPreconditionError(
        "an interrupted apply of another delta (version " +
        std::to_string(journal->delta.version) + " from " +
        std::to_string(journal->delta.base_version) + ") left its journal '" +
        r.journal_path + "': finish it (`refit apply THAT_DELTA " +
        checkpoint_path + "`) or undo it (`refit apply --rollback THAT_DELTA " +
        checkpoint_path + "`) first; nothing was written");
  }
  r.had_journal = true;
  REFIT_ASSIGN_OR_RETURN(r.chunks_restored,
                         RestorePreImages(delta, r.views, *journal, options.threads));
  REFIT_RETURN_IF_ERROR(ckpt.Sync());
  return r;
}

}  // namespace

Result<ApplyReport> Apply(const std::string& delta_path,
                          const std::string& checkpoint_path,
                          const ApplyOptions& options) {
  // The delta is fully validated before the checkpoint is opened for writing.
  REFIT_ASSIGN_OR_RETURN(DeltaReader delta, DeltaReader::Open(delta_path));
  // A header rewrite that a crash interrupted may have left a header torn
  // (unparsable), so it is finished before the checkpoint is parsed.
  REFIT_RETURN_IF_ERROR(RecoverHeaderJournal(checkpoint_path));
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(checkpoint_path,
                                                           Checkpoint::Mode::kReadWrite));
  REFIT_ASSIGN_OR_RETURN(Recovered r, Recover(delta, ckpt, checkpoint_path, options));
  ApplyJournal journal(r.journal_path, IdentifyDelta(delta));
  auto report = ApplyDelta(delta, r.views, options, [&](size_t tensor) {
    const TensorInfo& t = ckpt.tensors()[tensor];
    return ckpt.SyncRange(tensor, 0, t.byte_size);
  }, &journal);
  if (!report.ok()) {
    if (report.status().code() == StatusCode::kCancelled) return report.status();
    // Rolled back in memory: the checkpoint is the base again once synced.
    REFIT_RETURN_IF_ERROR(ckpt.Sync());
  }
  REFIT_RETURN_IF_ERROR(ApplyJournal::Remove(r.journal_path));
  if (!report.ok()) return report.status();
  report->chunks_restored = r.chunks_restored;
  // Only now is every tensor the target's (and synced): the header is the
  // last thing written, so a file never carries the target's header over
  // data that is not the target's.
  REFIT_RETURN_IF_ERROR(CarryHeaders(delta, ckpt, options.sync, &*report));
  return report;
}

Result<ApplyReport> Rollback(const std::string& delta_path,
                             const std::string& checkpoint_path,
                             const ApplyOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  REFIT_ASSIGN_OR_RETURN(DeltaReader delta, DeltaReader::Open(delta_path));
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(checkpoint_path,
                                                           Checkpoint::Mode::kReadWrite));
  REFIT_ASSIGN_OR_RETURN(Recovered r, Recover(delta, ckpt, checkpoint_path, options));
  std::vector<TensorView> views;
  for (const MutableTensorView& v : r.views) {
    views.push_back(TensorView{v.name, v.dtype, v.width, v.shape, v.data});
  }
  REFIT_ASSIGN_OR_RETURN(VerifyReport check, VerifyTensors(delta, views, options.threads));
  if (!check.matches_base) {
    return FailedPreconditionError(
        r.had_journal
            ? "after restoring the journal's pre-images the checkpoint is "
              "not the delta's base; it was changed by something else"
            : "there is no interrupted apply to roll back (no journal '" +
                  r.journal_path + "'), and the checkpoint is not the delta's "
                  "base" + (check.matches_target ? " but its target: a completed "
                                                   "apply keeps no pre-images"
                                                 : ""));
  }
  REFIT_RETURN_IF_ERROR(ApplyJournal::Remove(r.journal_path));
  ApplyReport report;
  report.chunks = delta.index().size();
  report.chunks_restored = r.chunks_restored;
  for (const MutableTensorView& v : r.views) {
    uint64_t n = 1;
    for (uint64_t d : v.shape) n *= d;
    report.checkpoint_bytes += n * static_cast<uint64_t>(v.width);
  }
  report.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - t0).count();
  return report;
}

Result<VerifyReport> Verify(const std::string& checkpoint_path,
                            const std::string& delta_path, int threads) {
  REFIT_ASSIGN_OR_RETURN(DeltaReader delta, DeltaReader::Open(delta_path));
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt,
                         Checkpoint::Open(checkpoint_path,
                                          Checkpoint::Mode::kReadOnly));
  REFIT_ASSIGN_OR_RETURN(VerifyReport report,
                         VerifyTensors(delta, CheckpointViews(ckpt), threads));
  REFIT_RETURN_IF_ERROR(CompareHeaders(delta, ckpt, &report));
  return report;
}

}  // namespace refit
