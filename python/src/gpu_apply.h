// The CUDA half of refit._native (gpu_apply.cc), compiled only with the
// CUDA module.
#ifndef REFIT_PYTHON_GPU_APPLY_H_
#define REFIT_PYTHON_GPU_APPLY_H_

#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "refit/delta.h"
#include "refit/status.h"
#include "sync/publisher_baseline.h"

namespace refit::python {

// Adds apply_cuda and GpuApplyReport to `m`; `raise` throws a Status as the
// module's exception.
void BindCuda(pybind11::module_& m, void (*raise)(const Status&));

// A publisher baseline in device memory (or page-locked host memory with
// `pinned_host`) holding a copy of `initial`, tensors on one CUDA device.
Result<std::unique_ptr<PublisherBaseline>> MakeDeviceBaseline(
    const std::vector<TensorView>& initial, int device, bool pinned_host);

}  // namespace refit::python

#endif  // REFIT_PYTHON_GPU_APPLY_H_
