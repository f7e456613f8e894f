// What every CUDA source of src/cuda shares: CUDA errors as Status, device
// allocations that free themselves, and (under nvcc) loads and stores of
// one element of 1, 2, 4 or 8 bytes, a chunk's element offsets and a rANS
// table's symbol search. Internal to src/cuda.
//
// DeviceBuffer is not thread-safe; CudaError and the element accessors are
// pure.
#ifndef REFIT_CUDA_CUDA_COMMON_H_
#define REFIT_CUDA_CUDA_COMMON_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "refit/status.h"

namespace refit::cuda::internal {

// kInternal, "CUDA <what>: <CUDA's description of e>".
inline Status CudaError(cudaError_t e, const char* what) {
  return InternalError(std::string("CUDA ") + what + ": " +
                       cudaGetErrorString(e));
}

// OK for cudaSuccess, else CudaError(e, what).
inline Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return CudaError(e, what.c_str());
}

// Milliseconds of the steady clock since t.
inline double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t)
      .count();
}

// Returns CudaError(e, what) from the calling function when the CUDA call
// `expr` gives an error e.
#define REFIT_CUDA_RETURN(expr, what)                      \
  do {                                                     \
    const cudaError_t e_ = (expr);                         \
    if (e_ != cudaSuccess) {                               \
      return ::refit::cuda::internal::CudaError(e_, what); \
    }                                                      \
  } while (0)

// Device memory that DeviceBuffers hold together, and the most they held.
struct DeviceMemory {
  uint64_t held = 0, peak = 0;
};

// One device allocation, freed on destruction. It is reallocated only when
// asked for more than it holds, so a buffer kept across calls or groups
// mostly costs no cudaMalloc or cudaFree (each cudaFree waits for the whole
// device). Its contents are not kept when it grows.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Counts the bytes it holds in *mem (which must outlive it).
  explicit DeviceBuffer(DeviceMemory* mem) : mem_(mem) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }

  // At least `bytes` bytes (at least 16 are allocated). On error the buffer
  // is empty.
  Status Reserve(uint64_t bytes) {
    if (bytes <= size_) return Status::Ok();
    if (p_) cudaFree(p_);
    if (mem_) mem_->held -= size_;
    p_ = nullptr;
    size_ = 0;
    REFIT_CUDA_RETURN(cudaMalloc(&p_, std::max<uint64_t>(bytes, 16)),
                      "cudaMalloc");
    size_ = bytes;
    if (mem_) {
      mem_->held += bytes;
      mem_->peak = std::max(mem_->peak, mem_->held);
    }
    return Status::Ok();
  }
  // Room for `count` T (at least 16 bytes), at *out.
  template <typename T>
  Status Get(uint64_t count, T** out) {
    REFIT_RETURN_IF_ERROR(Reserve(std::max<uint64_t>(count * sizeof(T), 16)));
    *out = static_cast<T*>(p_);
    return Status::Ok();
  }

  void* data() const { return p_; }
  uint8_t* bytes() const { return static_cast<uint8_t*>(p_); }
  uint64_t size() const { return size_; }  // as last reserved

 private:
  DeviceMemory* mem_ = nullptr;
  void* p_ = nullptr;
  uint64_t size_ = 0;
};

#if defined(__CUDACC__)
// The device pointer of an address held as an integer.
__device__ inline uint8_t* Addr(uint64_t a) {
  return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(a));
}

// Offset from a chunk's first canonical element of its element `pos`: the
// position itself for a contiguous range (run 0); for a strided region,
// rows of `run` elements `stride` apart (run < count < 2^32).
__device__ __forceinline__ uint64_t RegionOffset(uint64_t run, uint64_t stride, uint32_t pos) {
  if (run == 0) return pos;
  const uint32_t r = static_cast<uint32_t>(run);
  return uint64_t{pos / r} * stride + pos % r;
}

// A rANS table's symbol for `slot`: the largest symbol s with c[s] <= slot
// (fc[s] = f | c << 16, c ascending, 256 entries); it always has f[s] > 0
// since a zero-frequency symbol shares its c with the next one.
__device__ __forceinline__ uint32_t SearchSymbol(const uint32_t* fc, uint32_t slot) {
  uint32_t lo = 0;
  for (uint32_t step = 128; step > 0; step >>= 1) {
    if ((fc[lo + step] >> 16) <= slot) lo += step;
  }
  return lo;
}

// The w-byte element at p (w-aligned), zero-extended; w is 1, 2, 4 or 8.
__device__ inline uint64_t LoadWord(const uint8_t* p, uint32_t w) {
  switch (w) {
    case 1:
      return *p;
    case 2:
      return *reinterpret_cast<const uint16_t*>(p);
    case 4:
      return *reinterpret_cast<const uint32_t*>(p);
    default:
      return *reinterpret_cast<const uint64_t*>(p);
  }
}
// Stores the low w bytes of v at p (w-aligned).
__device__ inline void StoreWord(uint8_t* p, uint64_t v, uint32_t w) {
  switch (w) {
    case 1:
      *p = static_cast<uint8_t>(v);
      break;
    case 2:
      *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(v);
      break;
    case 4:
      *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(v);
      break;
    default:
      *reinterpret_cast<uint64_t*>(p) = v;
      break;
  }
}
#endif  // __CUDACC__

}  // namespace refit::cuda::internal

#endif  // REFIT_CUDA_CUDA_COMMON_H_
