// Borrowing tensor memory from Python without copying it.
//
// A BorrowedTensor holds the memory of a Python object for as long as it
// lives: either through the buffer protocol (NumPy arrays, memoryviews,
// anything C-contiguous) or by consuming a DLPack capsule (PyTorch tensors,
// and NumPy's own __dlpack__). refit then reads or writes that memory in
// place; nothing is copied. Only host memory is accepted (DLPack devices
// kDLCPU and kDLCUDAHost); the Python layer stages device tensors itself.
//
// Thread safety: construct and destroy with the GIL held; data() may be used
// from any thread (with the GIL released) while the object is alive.
#ifndef REFIT_PYTHON_BORROW_H_
#define REFIT_PYTHON_BORROW_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "refit/delta.h"
#include "refit/status.h"

namespace refit::python {

// The subset of the DLPack ABI (dlpack.h, v0.8 legacy and v1.x versioned
// structs) a consumer of host tensors needs.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
inline constexpr int32_t kDLCPU = 1;
inline constexpr int32_t kDLCUDA = 2;
inline constexpr int32_t kDLCUDAHost = 3;
inline constexpr uint64_t kDLFlagReadOnly = 1;

class BorrowedTensor {
 public:
  // Borrows `obj` (a DLPack capsule or a buffer-protocol object) as tensor
  // `name` of safetensors dtype `dtype`. Errors (kInvalidArgument, naming
  // the tensor): an unknown dtype, an element size that differs from the
  // dtype's width, memory that is not C-contiguous, a device tensor, or (with
  // `writable`) read-only memory. A consumed capsule is renamed
  // "used_dltensor" and released when this object dies.
  // With `allow_cuda`, a DLPack tensor on a CUDA device is accepted too:
  // data() is then a device address on device_id().
  static Result<std::unique_ptr<BorrowedTensor>> Borrow(std::string name,
                                                        std::string dtype,
                                                        pybind11::handle obj,
                                                        bool writable,
                                                        bool allow_cuda = false);
  ~BorrowedTensor();
  BorrowedTensor(const BorrowedTensor&) = delete;
  BorrowedTensor& operator=(const BorrowedTensor&) = delete;

  const std::string& name() const { return name_; }
  const std::string& dtype() const { return dtype_; }
  int width() const { return width_; }
  const std::vector<uint64_t>& shape() const { return shape_; }
  uint8_t* data() const { return data_; }
  uint64_t byte_size() const { return byte_size_; }
  bool on_cuda() const { return device_type_ == kDLCUDA; }
  int device_id() const { return device_id_; }

  TensorView View() const { return {name_, dtype_, width_, shape_, data_}; }
  MutableTensorView MutableView() const { return {name_, dtype_, width_, shape_, data_}; }

 private:
  BorrowedTensor() = default;
  Status FromBuffer(pybind11::handle obj, bool writable);
  Status FromCapsule(pybind11::handle capsule, bool writable, bool allow_cuda);
  Status TakeDLTensor(const DLTensor& t, bool allow_cuda);

  std::string name_;
  std::string dtype_;
  int width_ = 0;
  std::vector<uint64_t> shape_;
  uint8_t* data_ = nullptr;
  uint64_t byte_size_ = 0;
  int32_t device_type_ = kDLCPU;
  int device_id_ = 0;

  bool has_buffer_ = false;
  Py_buffer buffer_{};
  DLManagedTensor* managed_ = nullptr;
  DLManagedTensorVersioned* managed_versioned_ = nullptr;
};

// Borrows a list of (name, dtype, object) triples.
Result<std::vector<std::unique_ptr<BorrowedTensor>>> BorrowAll(pybind11::handle triples,
                                                               bool writable,
                                                               bool allow_cuda = false);

}  // namespace refit::python

#endif  // REFIT_PYTHON_BORROW_H_
