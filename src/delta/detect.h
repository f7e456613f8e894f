// Bitwise change detection: which elements of a tensor differ between the
// trainer's previous and current copy. This is the trainer side's hot loop,
// run over every weight byte each step, so it is built to run at memory
// bandwidth: equal stretches cost about as much as memcmp and element indices
// are extracted only where some bit differs.
//
// Comparison is purely bitwise on width-byte elements: +0 and -0 differ, two
// NaNs with different payloads differ, and equal NaN bit patterns are equal.
// No floating-point semantics are applied.
//
// The kernels are compiled several ways (portable scalar, AVX2, AVX-512BW)
// and the best level the CPU supports is picked once, on first use. Every
// level produces identical output; the scalar level is the oracle for the
// vector ones (see internal::FindChangedAt).
//
// Ownership: the functions only read `a` and `b` (n * width bytes each, any
// alignment) and append to the caller's vector. Thread-safety: all functions
// are reentrant and may run concurrently on the same inputs, provided each
// call has its own output vector.
#ifndef REFIT_DELTA_DETECT_H_
#define REFIT_DELTA_DETECT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace refit {

// Appends to *out the indices i in [0, n), ascending, at which the
// width-byte element i of `a` differs from that of `b` in any bit. Returns the
// number of indices appended.
//
// Requires: width is 1, 2, 4 or 8; n < 2^32 (indices are uint32_t); `a` and
// `b` each hold n * width readable bytes (they may be null when n == 0).
// Violating the first two aborts the process: they are programming errors,
// and a silently truncated change list would corrupt the delta.
// Note 1: *out is appended to, never cleared; its old contents are kept.
// Note 2: the indices are relative to `a`/`b`; a caller scanning a slice of a
//         larger tensor adds the slice's offset itself.
size_t FindChanged(const uint8_t* a, const uint8_t* b, uint64_t n, int width,
                   std::vector<uint32_t>* out);

// The number of indices FindChanged would append, without producing them.
// Same requirements.
uint64_t CountChanged(const uint8_t* a, const uint8_t* b, uint64_t n,
                      int width);

// FindChanged over [0, n) split across up to `threads` threads (ParallelFor;
// threads <= 0 means DefaultThreads()). Appends exactly what FindChanged
// appends, in the same order. Small inputs run on the calling thread only,
// since starting threads would cost more than the scan. Same requirements.
size_t FindChangedParallel(const uint8_t* a, const uint8_t* b, uint64_t n,
                           int width, int threads, std::vector<uint32_t>* out);

namespace internal {

// Instruction-set levels of the detection kernels, lowest first.
enum class DetectLevel : int {
  kScalar = 0,  // portable: 8-byte words, any CPU
  kAvx2 = 1,    // x86 AVX2 + BMI1
  kAvx512 = 2,  // x86 AVX-512F + AVX-512BW + BMI1
};

// "scalar", "avx2" or "avx512".
const char* DetectLevelName(DetectLevel level);

// Whether this CPU (and this build) can run `level`.
bool DetectLevelSupported(DetectLevel level);

// The level the public functions use: the highest supported one.
DetectLevel BestDetectLevel();

// FindChanged and CountChanged forced to `level`, for tests and benchmarks
// that compare levels. Requires DetectLevelSupported(level) (aborts
// otherwise) and the public functions' requirements.
size_t FindChangedAt(DetectLevel level, const uint8_t* a, const uint8_t* b,
                     uint64_t n, int width, std::vector<uint32_t>* out);
uint64_t CountChangedAt(DetectLevel level, const uint8_t* a, const uint8_t* b,
                        uint64_t n, int width);

}  // namespace internal
}  // namespace refit

#endif  // REFIT_DELTA_DETECT_H_
