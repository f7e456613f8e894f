#include "borrow.h"

#include <utility>

#include "refit/checkpoint.h"

namespace py = pybind11;

namespace refit::python {
namespace {

std::string Quoted(const std::string& name) { return "tensor '" + name + "'"; }

std::string PythonErrorText() {
  // Fetches and clears the pending Python error, returning its text.
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  std::string text = "unknown error";
  if (value != nullptr) {
    PyObject* s = PyObject_Str(value);
    if (s != nullptr) {
      const char* utf8 = PyUnicode_AsUTF8(s);
      if (utf8 != nullptr) text = utf8;
      Py_DECREF(s);
    }
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return text;
}

}  // namespace

Result<std::unique_ptr<BorrowedTensor>> BorrowedTensor::Borrow(std::string name,
                                                               std::string dtype,
                                                               py::handle obj,
                                                               bool writable,
                                                               bool allow_cuda) {
  std::unique_ptr<BorrowedTensor> t(new BorrowedTensor());
  t->name_ = std::move(name);
  t->dtype_ = std::move(dtype);
  DTypeRegistry registry;
  auto width = registry.ElementWidth(t->dtype_);
  if (!width.ok()) return width.status().WithContext(Quoted(t->name_));
  t->width_ = *width;
  if (PyCapsule_CheckExact(obj.ptr())) {
    REFIT_RETURN_IF_ERROR(t->FromCapsule(obj, writable, allow_cuda));
  } else {
    REFIT_RETURN_IF_ERROR(t->FromBuffer(obj, writable));
  }
  return t;
}

BorrowedTensor::~BorrowedTensor() {
  if (has_buffer_) PyBuffer_Release(&buffer_);
  if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
  if (managed_versioned_ != nullptr && managed_versioned_->deleter != nullptr) {
    managed_versioned_->deleter(managed_versioned_);
  }
}

Status BorrowedTensor::FromBuffer(py::handle obj, bool writable) {
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
  if (writable) flags |= PyBUF_WRITABLE;
  if (PyObject_GetBuffer(obj.ptr(), &buffer_, flags) != 0) {
    std::string why = PythonErrorText();
    return InvalidArgumentError(
        Quoted(name_) + " cannot be used in place (" + why + "); refit needs " +
        (writable ? "writable, " : "") + "C-contiguous host memory (numpy.ascontiguousarray, "
        "or a tensor with __dlpack__)");
  }
  has_buffer_ = true;
  if (buffer_.itemsize != width_) {
    return InvalidArgumentError(Quoted(name_) + " has " + std::to_string(buffer_.itemsize) +
                                "-byte items but dtype " + dtype_ + " has " +
                                std::to_string(width_) + "-byte elements");
  }
  uint64_t elements = 1;
  for (int i = 0; i < buffer_.ndim; ++i) {
    shape_.push_back(static_cast<uint64_t>(buffer_.shape[i]));
    elements *= static_cast<uint64_t>(buffer_.shape[i]);
  }
  data_ = static_cast<uint8_t*>(buffer_.buf);
  byte_size_ = elements * static_cast<uint64_t>(width_);
  if (byte_size_ != static_cast<uint64_t>(buffer_.len)) {
    return InternalError(Quoted(name_) + ": buffer length disagrees with its shape");
  }
  return Status();
}

Status BorrowedTensor::FromCapsule(py::handle capsule, bool writable, bool allow_cuda) {
  PyObject* c = capsule.ptr();
  if (PyCapsule_IsValid(c, "dltensor")) {
    managed_ = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
    // From here on this object owns the tensor and calls its deleter.
    PyCapsule_SetName(c, "used_dltensor");
    return TakeDLTensor(managed_->dl_tensor, allow_cuda);
  }
  if (PyCapsule_IsValid(c, "dltensor_versioned")) {
    managed_versioned_ = static_cast<DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(c, "dltensor_versioned"));
    PyCapsule_SetName(c, "used_dltensor_versioned");
    if (managed_versioned_->version.major != 1) {
      return InvalidArgumentError(Quoted(name_) + ": DLPack major version " +
                                  std::to_string(managed_versioned_->version.major) +
                                  " is not supported (1 is)");
    }
    if (writable && (managed_versioned_->flags & kDLFlagReadOnly) != 0) {
      return InvalidArgumentError(Quoted(name_) + " is read-only; refit must write it in place");
    }
    return TakeDLTensor(managed_versioned_->dl_tensor, allow_cuda);
  }
  return InvalidArgumentError(Quoted(name_) +
                              ": a capsule that is not an unused DLPack tensor "
                              "(each __dlpack__() capsule can be consumed once)");
}

Status BorrowedTensor::TakeDLTensor(const DLTensor& t, bool allow_cuda) {
  device_type_ = t.device.device_type == kDLCUDAHost ? kDLCPU : t.device.device_type;
  device_id_ = t.device.device_id;
  const bool cuda_ok = allow_cuda && t.device.device_type == kDLCUDA;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost && !cuda_ok) {
    return InvalidArgumentError(
        Quoted(name_) + " lives on DLPack device type " + std::to_string(t.device.device_type) +
        (t.device.device_type == kDLCUDA ? " (CUDA)" : "") +
        "; refit's native calls take host memory (copy it to the CPU first)");
  }
  if (t.dtype.lanes != 1 || t.dtype.bits % 8 != 0 || t.dtype.bits / 8 != width_) {
    return InvalidArgumentError(Quoted(name_) + " has " + std::to_string(t.dtype.bits) +
                                "-bit elements (lanes " + std::to_string(t.dtype.lanes) +
                                ") but dtype " + dtype_ + " has " + std::to_string(width_) +
                                "-byte elements");
  }
  if (t.ndim < 0) return InvalidArgumentError(Quoted(name_) + ": negative ndim");
  uint64_t elements = 1;
  for (int32_t i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return InvalidArgumentError(Quoted(name_) + ": negative dimension");
    shape_.push_back(static_cast<uint64_t>(t.shape[i]));
    elements *= static_cast<uint64_t>(t.shape[i]);
  }
  if (t.strides != nullptr && elements > 0) {
    // Row-major in elements; dimensions of size 1 may carry any stride.
    int64_t expected = 1;
    for (int32_t i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expected) {
        return InvalidArgumentError(Quoted(name_) +
                                    " is not C-contiguous; call .contiguous() first");
      }
      expected *= t.shape[i];
    }
  }
  data_ = static_cast<uint8_t*>(t.data) + t.byte_offset;
  byte_size_ = elements * static_cast<uint64_t>(width_);
  return Status();
}

Result<std::vector<std::unique_ptr<BorrowedTensor>>> BorrowAll(py::handle triples,
                                                               bool writable,
                                                               bool allow_cuda) {
  std::vector<std::unique_ptr<BorrowedTensor>> out;
  for (py::handle item : triples) {
    auto tuple = py::reinterpret_borrow<py::tuple>(item);
    if (tuple.size() != 3) {
      return InvalidArgumentError("expected (name, dtype, tensor) triples");
    }
    REFIT_ASSIGN_OR_RETURN(auto t, BorrowedTensor::Borrow(tuple[0].cast<std::string>(),
                                                         tuple[1].cast<std::string>(),
                                                         tuple[2], writable, allow_cuda));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace refit::python
