// The CUDA half of refit._native (gpu_apply.cc), compiled only with the
// CUDA module.
#ifndef REFIT_PYTHON_GPU_APPLY_H_
#define REFIT_PYTHON_GPU_APPLY_H_

#include <pybind11/pybind11.h>

#include "refit/status.h"

namespace refit::python {

// Adds apply_cuda and GpuApplyReport to `m`; `raise` throws a Status as the
// module's exception.
void BindCuda(pybind11::module_& m, void (*raise)(const Status&));

}  // namespace refit::python

#endif  // REFIT_PYTHON_GPU_APPLY_H_
