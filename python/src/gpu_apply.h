// The CUDA half of refit._native (gpu_apply.cc), compiled only with the
// CUDA module.
#ifndef REFIT_PYTHON_GPU_APPLY_H_
#define REFIT_PYTHON_GPU_APPLY_H_

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "refit/delta.h"
#include "refit/status.h"
#include "sync/publisher_baseline.h"
#include "sync/staged_target.h"
#include "trainer/rank_encoder.h"

namespace refit::python {

// Adds apply_cuda and GpuApplyReport to `m`; `raise` throws a Status as the
// module's exception.
void BindCuda(pybind11::module_& m, void (*raise)(const Status&));

// The durable baseline file's state (cuda::DurableState).
struct DurableInfo {
  bool loaded = false;
  uint64_t loaded_version = 0;
  uint64_t written_version = 0;
  uint64_t writes = 0;
  double last_write_ms = 0;
  std::string error;
};

// A publisher baseline in device memory (or page-locked host memory with
// `pinned_host`) holding a copy of `initial`, tensors on one CUDA device;
// with `durable_path`, also written to that file after each commit, and
// started from it when it exists (cuda/device_baseline.h). `durable` and
// `flush` read and wait for that file while the baseline lives.
struct DeviceBaselineMade {
  std::unique_ptr<PublisherBaseline> baseline;
  std::function<DurableInfo()> durable;
  std::function<Status()> flush;
};
Result<DeviceBaselineMade> MakeDeviceBaseline(const std::vector<TensorView>& initial, int device,
                                              bool pinned_host, const std::string& durable_path);

// A trainer rank's encoder on the GPU (cuda/device_rank_encoder.h) on CUDA
// device `device`, its baseline from `initial_local` (this rank's local
// tensors) or, when that is empty, from the canonical checkpoint views
// `initial_canonical`. kUnimplemented for a layout the GPU encoder does not
// take (converted or transposed pieces).
Result<std::unique_ptr<trainer::RankEncoderInterface>> MakeDeviceRankEncoder(
    const layout::Layout& layout, uint32_t rank, const trainer::RankEncoderOptions& options,
    int device, const std::vector<TensorView>& initial_local,
    const std::vector<TensorView>& initial_canonical);

// Staging bounds of a GPU receiver (cuda/device_target.h).
struct DeviceStaging {
  uint64_t device_bytes = uint64_t{512} << 20;
  uint64_t host_bytes = uint64_t{8} << 30;
  uint64_t apply_bytes = uint64_t{128} << 20;
};

// The tensors of a two-phase GPU receiver: `tensors` (CUDA memory, one
// device) are the canonical tensors themselves when `layout_json` is empty;
// otherwise they are rank `rank`'s local tensors of that layout
// (docs/layout.md), e.g. an engine's fused parameters.
class BorrowedTensor;
Result<std::shared_ptr<StagedTarget>> MakeDeviceTarget(
    const std::vector<const BorrowedTensor*>& tensors,
    const std::string& layout_json, uint32_t rank,
    const DeviceStaging& staging);

}  // namespace refit::python

#endif  // REFIT_PYTHON_GPU_APPLY_H_
