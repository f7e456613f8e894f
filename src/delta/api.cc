// The public delta API (include/refit/delta.h) over checkpoints on disk.
#include <chrono>

#include "delta/apply.h"
#include "delta/delta_file.h"
#include "delta/encoder.h"
#include "delta/file_headers.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"

namespace refit {

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

Result<ApplyReport> Apply(const std::string& delta_path,
                          const std::string& checkpoint_path,
                          const ApplyOptions& options) {
  // The delta is fully validated before the checkpoint is opened for writing.
  REFIT_ASSIGN_OR_RETURN(DeltaReader delta, DeltaReader::Open(delta_path));
  // A header rewrite that a crash interrupted may have left a header torn
  // (unparsable), so it is finished before the checkpoint is parsed.
  REFIT_RETURN_IF_ERROR(RecoverHeaderJournal(checkpoint_path));
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt,
                         Checkpoint::Open(checkpoint_path,
                                          Checkpoint::Mode::kReadWrite));
  auto views = MutableCheckpointViews(ckpt);
  REFIT_ASSIGN_OR_RETURN(
      ApplyReport report, ApplyDelta(delta, views, options, [&](size_t tensor) {
        const TensorInfo& t = ckpt.tensors()[tensor];
        return ckpt.SyncRange(tensor, 0, t.byte_size);
      }));
  // Only now is every tensor the target's (and synced): the header is the
  // last thing written, so a file never carries the target's header over
  // data that is not the target's.
  REFIT_RETURN_IF_ERROR(CarryHeaders(delta, ckpt, options.sync, &report));
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
