// The public delta API (include/refit/delta.h) over checkpoints on disk.
#include <chrono>
#include <optional>
#include <string_view>

#include "base/file.h"
#include "delta/apply.h"
#include "delta/delta_file.h"
#include "delta/encoder.h"
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

Result<DiffReport> DiffTensors(const std::vector<TensorView>& base,
                               const std::vector<TensorView>& target,
                               const std::string& out_path,
                               const DiffOptions& options) {
  REFIT_ASSIGN_OR_RETURN(auto writer, DeltaWriter::Create(out_path, options.version,
                                                          options.base_version));
  REFIT_ASSIGN_OR_RETURN(DiffReport report,
                         DiffTensorsToSink(base, target, options, writer.get()));
  report.file_bytes = writer->bytes_written();
  return report;
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
  return DiffTensors(CheckpointViews(base), CheckpointViews(target), out_path, options);
}

Result<ApplyReport> ApplyToTensors(const std::string& delta_path,
                                   const std::vector<MutableTensorView>& tensors,
                                   const ApplyOptions& options) {
  REFIT_ASSIGN_OR_RETURN(DeltaReader delta, DeltaReader::Open(delta_path));
  return ApplyDelta(delta, tensors, options, nullptr);
}

Result<ApplyReport> Apply(const std::string& delta_path,
                          const std::string& checkpoint_path,
                          const ApplyOptions& options) {
  // The delta is fully validated before the checkpoint is opened for writing.
  REFIT_ASSIGN_OR_RETURN(DeltaReader delta, DeltaReader::Open(delta_path));
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt,
                         Checkpoint::Open(checkpoint_path,
                                          Checkpoint::Mode::kReadWrite));
  auto views = MutableCheckpointViews(ckpt);
  return ApplyDelta(delta, views, options, [&](size_t tensor) {
    const TensorInfo& t = ckpt.tensors()[tensor];
    return ckpt.SyncRange(tensor, 0, t.byte_size);
  });
}

Result<VerifyReport> Verify(const std::string& checkpoint_path,
                            const std::string& delta_path, int threads) {
  REFIT_ASSIGN_OR_RETURN(DeltaReader delta, DeltaReader::Open(delta_path));
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt,
                         Checkpoint::Open(checkpoint_path,
                                          Checkpoint::Mode::kReadOnly));
  return VerifyTensors(delta, CheckpointViews(ckpt), threads);
}

}  // namespace refit
