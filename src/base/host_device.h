// REFIT_HD marks a function that nvcc compiles for both the host and the
// device; to every other compiler it is nothing. Headers whose rules the
// CPU code and the CUDA kernels share (codec/sparse_plane.h) use it, so one
// definition serves both.
#ifndef REFIT_BASE_HOST_DEVICE_H_
#define REFIT_BASE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define REFIT_HD __host__ __device__
#else
#define REFIT_HD
#endif

#endif  // REFIT_BASE_HOST_DEVICE_H_
