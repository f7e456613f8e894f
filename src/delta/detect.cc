#include "delta/detect.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/parallel.h"

#if (defined(__x86_64__) || defined(_M_X64)) && \
    (defined(__GNUC__) || defined(__clang__))
#define REFIT_DETECT_X86 1
#include <immintrin.h>
#else
#define REFIT_DETECT_X86 0
#endif

namespace refit {
namespace internal {
namespace {

// Every kernel has this shape. It scans elements [0, n) of `a` and `b`
// (n * width bytes each). With kWrite it stores base + i for each changed
// element i to dst, ascending, and may scribble up to kSlack entries past the
// last one it reports, so dst must have room for n + kSlack entries; without
// kWrite dst and base are unused. Returns the number of changed elements.
using ScanFn = uint64_t (*)(const uint8_t* a, const uint8_t* b, size_t n,
                            uint32_t base, uint32_t* dst);

constexpr size_t kSlack = 8;

// FindRange hands kernels this many elements at a time so that their output
// lands in a stack buffer that stays in L1. A multiple of 256 so that every
// chunk but the last is whole vector blocks at every width.
constexpr size_t kChunkElems = 8192;

// Below this many bytes per buffer and thread, starting a thread costs more
// than scanning the bytes (~50 us at 10 GB/s), so FindChangedParallel uses
// fewer threads.
constexpr uint64_t kMinParallelBytes = uint64_t{256} << 10;

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "refit: change detection: %s\n", what);
  std::abort();
}

// Returns log2(width); aborts on a broken precondition (see detect.h).
int CheckArgs(uint64_t n, int width) {
  if (n >= (uint64_t{1} << 32)) Die("n >= 2^32 does not fit uint32 indices");
  switch (width) {
    case 1:
      return 0;
    case 2:
      return 1;
    case 4:
      return 2;
    case 8:
      return 3;
    default:
      Die("width must be 1, 2, 4 or 8");
  }
}

// ---------------------------------------------------------------------------
// Portable scalar level. Also the oracle the vector levels are tested against.

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Element loads are byte-order agnostic: both sides are loaded the same way
// and only compared for equality.
template <int W>
inline bool ElemDiffers(const uint8_t* a, const uint8_t* b, size_t i) {
  return std::memcmp(a + i * W, b + i * W, W) != 0;
}

template <int W, bool kWrite>
uint64_t ScanScalar(const uint8_t* a, const uint8_t* b, size_t n, uint32_t base,
                    uint32_t* dst) {
  const size_t bytes = n * W;
  uint32_t* p = dst;
  uint64_t count = 0;
  auto emit = [&](size_t i) {
    if constexpr (kWrite) {
      *p++ = base + static_cast<uint32_t>(i);
    } else {
      ++count;
    }
  };
  // W divides 8 and words start at multiples of 8, so a word holds whole
  // elements [off / W, (off + 8) / W).
  auto drill = [&](size_t off) {
    for (size_t i = off / W; i < (off + 8) / W; ++i) {
      if (ElemDiffers<W>(a, b, i)) emit(i);
    }
  };
  size_t off = 0;
  for (; off + 32 <= bytes; off += 32) {
    uint64_t x0 = Load64(a + off) ^ Load64(b + off);
    uint64_t x1 = Load64(a + off + 8) ^ Load64(b + off + 8);
    uint64_t x2 = Load64(a + off + 16) ^ Load64(b + off + 16);
    uint64_t x3 = Load64(a + off + 24) ^ Load64(b + off + 24);
    if ((x0 | x1 | x2 | x3) == 0) continue;
    if (x0 != 0) drill(off);
    if (x1 != 0) drill(off + 8);
    if (x2 != 0) drill(off + 16);
    if (x3 != 0) drill(off + 24);
  }
  for (; off + 8 <= bytes; off += 8) {
    if (Load64(a + off) != Load64(b + off)) drill(off);
  }
  for (size_t i = off / W; i < n; ++i) {
    if (ElemDiffers<W>(a, b, i)) emit(i);
  }
  if constexpr (kWrite) {
    return static_cast<uint64_t>(p - dst);
  } else {
    return count;
  }
}

#if REFIT_DETECT_X86

#define REFIT_AVX2 __attribute__((target("avx2,bmi,popcnt")))
#define REFIT_AVX512 __attribute__((target("avx512f,avx512bw,bmi,popcnt")))
#define REFIT_BMI_INLINE \
  __attribute__((target("bmi,popcnt"), always_inline)) inline

// Stores base + (bit position >> kShift) for each set bit of m, ascending, at
// dst and returns the new end. Writes four entries unconditionally (up to
// kSlack past the end; tzcnt(0) is a defined 64): at RL change rates most
// masks hold at most four bits, so the only branch is well predicted, where a
// plain tzcnt loop would mispredict its exit about once per mask.
template <int kShift>
REFIT_BMI_INLINE uint32_t* EmitBits(uint64_t m, uint32_t base, uint32_t* dst) {
  const int count = static_cast<int>(_mm_popcnt_u64(m));
  for (int k = 0; k < 4; ++k) {
    dst[k] = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift);
    m = _blsr_u64(m);
  }
  if (count > 4) {
    uint32_t* p = dst + 4;
    while (m != 0) {
      *p++ = base + static_cast<uint32_t>(_tzcnt_u64(m) >> kShift);
      m = _blsr_u64(m);
    }
  }
  return dst + count;
}

// Records mask m, whose bit 0 stands for element `base`: its indices go to
// *p with kWrite, its population to *count otherwise.
template <int kShift, bool kWrite>
REFIT_BMI_INLINE void Emit(uint64_t m, uint32_t base, uint32_t** p,
                           uint64_t* count) {
  if constexpr (kWrite) {
    *p = EmitBits<kShift>(m, base, *p);
  } else {
    *count += _mm_popcnt_u64(m);
  }
}

// ---------------------------------------------------------------------------
// AVX2 level: 256 bytes (eight vectors) per iteration. XOR, OR together and
// one vptest decide the common all-equal case; only a block with a difference
// computes per-element masks.

template <int W>
REFIT_AVX2 inline __m256i CmpEqZero256(__m256i x) {
  const __m256i zero = _mm256_setzero_si256();
  if constexpr (W == 1) return _mm256_cmpeq_epi8(x, zero);
  if constexpr (W == 2) return _mm256_cmpeq_epi16(x, zero);
  if constexpr (W == 4) return _mm256_cmpeq_epi32(x, zero);
  if constexpr (W == 8) return _mm256_cmpeq_epi64(x, zero);
}

// One bit per byte of a 32-byte XOR vector, set at the first byte of each
// element that differs.
template <int W>
REFIT_AVX2 inline uint64_t DiffBits256(__m256i x) {
  constexpr uint32_t kFirstByte = W == 1   ? 0xFFFFFFFFu
                                  : W == 2 ? 0x55555555u
                                  : W == 4 ? 0x11111111u
                                           : 0x01010101u;
  const uint32_t eq =
      static_cast<uint32_t>(_mm256_movemask_epi8(CmpEqZero256<W>(x)));
  return ~eq & kFirstByte;
}

template <int W, bool kWrite>
REFIT_AVX2 uint64_t ScanAvx2(const uint8_t* a, const uint8_t* b, size_t n,
                             uint32_t base, uint32_t* dst) {
  constexpr int kShift = std::countr_zero(static_cast<unsigned>(W));
  const size_t bytes = n * W;
  uint32_t* p = dst;
  uint64_t count = 0;
  // Index of the element at byte offset off.
  const auto elem = [base](size_t off) {
    return base + static_cast<uint32_t>(off / W);
  };
  size_t off = 0;
  for (; off + 256 <= bytes; off += 256) {
    __m256i x[8];
    for (int k = 0; k < 8; ++k) {
      x[k] = _mm256_xor_si256(
          _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(a + off + 32 * k)),
          _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(b + off + 32 * k)));
    }
    const __m256i any =
        _mm256_or_si256(_mm256_or_si256(_mm256_or_si256(x[0], x[1]),
                                        _mm256_or_si256(x[2], x[3])),
                        _mm256_or_si256(_mm256_or_si256(x[4], x[5]),
                                        _mm256_or_si256(x[6], x[7])));
    // Only the find path skips equal blocks. At 1-3% change rates most
    // 256-byte blocks hold a change, so the skip branch is close to a coin
    // flip; counting the masks costs less than its mispredicts. Extracting
    // indices costs more, so find keeps the skip for the 0% case.
    if (kWrite && _mm256_testz_si256(any, any)) continue;
    for (int k = 0; k < 4; ++k) {
      // One bit per byte of the 64 bytes from off + 64 * k.
      Emit<kShift, kWrite>(
          DiffBits256<W>(x[2 * k]) | DiffBits256<W>(x[2 * k + 1]) << 32,
          elem(off + 64 * static_cast<size_t>(k)), &p, &count);
    }
  }
  for (; off + 32 <= bytes; off += 32) {
    const __m256i x = _mm256_xor_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + off)),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + off)));
    Emit<kShift, kWrite>(DiffBits256<W>(x), elem(off), &p, &count);
  }
  // Fewer than 32 bytes are left: not worth a masked path.
  const size_t i0 = off / W;
  const uint64_t rest = ScanScalar<W, kWrite>(
      a + off, b + off, n - i0, base + static_cast<uint32_t>(i0), p);
  if constexpr (kWrite) {
    return static_cast<uint64_t>(p - dst) + rest;
  } else {
    return count + rest;
  }
}

// ---------------------------------------------------------------------------
// AVX-512BW level: 256 bytes (four vectors) per iteration. vpcmpneq yields
// one mask bit per element directly; masked loads handle the tail without a
// scalar loop and without reading past the buffers.

template <int W>
REFIT_AVX512 inline uint64_t NeMask512(__m512i a, __m512i b) {
  if constexpr (W == 1) return _mm512_cmpneq_epi8_mask(a, b);
  if constexpr (W == 2) return _mm512_cmpneq_epi16_mask(a, b);
  if constexpr (W == 4) return _mm512_cmpneq_epi32_mask(a, b);
  if constexpr (W == 8) return _mm512_cmpneq_epi64_mask(a, b);
}

template <int W, bool kWrite>
REFIT_AVX512 uint64_t ScanAvx512(const uint8_t* a, const uint8_t* b, size_t n,
                                 uint32_t base, uint32_t* dst) {
  constexpr int kPerVec = 64 / W;  // elements per vector and per mask
  const size_t bytes = n * W;
  uint32_t* p = dst;
  uint64_t count = 0;
  // Index of the element at byte offset off.
  const auto elem = [base](size_t off) {
    return base + static_cast<uint32_t>(off / W);
  };
  size_t off = 0;
  for (; off + 256 <= bytes; off += 256) {
    uint64_t m[4];
    for (int k = 0; k < 4; ++k) {
      m[k] = NeMask512<W>(_mm512_loadu_si512(a + off + 64 * k),
                          _mm512_loadu_si512(b + off + 64 * k));
    }
    // As in ScanAvx2, only the find path skips equal blocks.
    if (kWrite && (m[0] | m[1] | m[2] | m[3]) == 0) continue;
    // Pack the four masks into as few 64-bit words as hold them.
    if constexpr (kPerVec == 64) {
      for (int k = 0; k < 4; ++k) {
        Emit<0, kWrite>(m[k], elem(off + 64 * static_cast<size_t>(k)), &p,
                        &count);
      }
    } else if constexpr (kPerVec == 32) {
      Emit<0, kWrite>(m[0] | m[1] << 32, elem(off), &p, &count);
      Emit<0, kWrite>(m[2] | m[3] << 32, elem(off + 128), &p, &count);
    } else {
      Emit<0, kWrite>(m[0] | m[1] << kPerVec | m[2] << (2 * kPerVec) |
                          m[3] << (3 * kPerVec),
                      elem(off), &p, &count);
    }
  }
  for (; off < bytes; off += 64) {
    const size_t left = bytes - off;
    const __mmask64 k = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
    // Masked-off bytes load as zero on both sides and so compare equal.
    Emit<0, kWrite>(NeMask512<W>(_mm512_maskz_loadu_epi8(k, a + off),
                                 _mm512_maskz_loadu_epi8(k, b + off)),
                    elem(off), &p, &count);
  }
  if constexpr (kWrite) {
    return static_cast<uint64_t>(p - dst);
  } else {
    return count;
  }
}

#endif  // REFIT_DETECT_X86

// ---------------------------------------------------------------------------
// Dispatch.

struct KernelSet {
  ScanFn find[4];   // by log2(width)
  ScanFn count[4];  // by log2(width)
};

constexpr KernelSet kScalarKernels = {
    {&ScanScalar<1, true>, &ScanScalar<2, true>, &ScanScalar<4, true>,
     &ScanScalar<8, true>},
    {&ScanScalar<1, false>, &ScanScalar<2, false>, &ScanScalar<4, false>,
     &ScanScalar<8, false>}};

#if REFIT_DETECT_X86
constexpr KernelSet kAvx2Kernels = {{&ScanAvx2<1, true>, &ScanAvx2<2, true>,
                                     &ScanAvx2<4, true>, &ScanAvx2<8, true>},
                                    {&ScanAvx2<1, false>, &ScanAvx2<2, false>,
                                     &ScanAvx2<4, false>, &ScanAvx2<8, false>}};

constexpr KernelSet kAvx512Kernels = {
    {&ScanAvx512<1, true>, &ScanAvx512<2, true>, &ScanAvx512<4, true>,
     &ScanAvx512<8, true>},
    {&ScanAvx512<1, false>, &ScanAvx512<2, false>, &ScanAvx512<4, false>,
     &ScanAvx512<8, false>}};
#endif

const KernelSet& KernelsFor(DetectLevel level) {
  if (!DetectLevelSupported(level)) Die("detection level not supported here");
  switch (level) {
#if REFIT_DETECT_X86
    case DetectLevel::kAvx512:
      return kAvx512Kernels;
    case DetectLevel::kAvx2:
      return kAvx2Kernels;
#endif
    default:
      return kScalarKernels;
  }
}

// Picked once: the public entry points run per tensor, so they must not
// re-query the CPU.
const KernelSet& BestKernels() {
  static const KernelSet& kernels = KernelsFor(BestDetectLevel());
  return kernels;
}

// Appends the changed indices in [begin, end) (absolute, not relative to
// begin) to *out.
size_t FindRange(const KernelSet& kernels, int log_width, const uint8_t* a,
                 const uint8_t* b, uint64_t begin, uint64_t end,
                 std::vector<uint32_t>* out) {
  const ScanFn find = kernels.find[log_width];
  uint32_t buf[kChunkElems + kSlack];
  const size_t old_size = out->size();
  for (uint64_t i = begin; i < end; i += kChunkElems) {
    const size_t len =
        static_cast<size_t>(std::min<uint64_t>(kChunkElems, end - i));
    const size_t off = static_cast<size_t>(i << log_width);
    const auto found = static_cast<size_t>(
        find(a + off, b + off, len, static_cast<uint32_t>(i), buf));
    out->insert(out->end(), buf, buf + found);
  }
  return out->size() - old_size;
}

}  // namespace

const char* DetectLevelName(DetectLevel level) {
  switch (level) {
    case DetectLevel::kScalar:
      return "scalar";
    case DetectLevel::kAvx2:
      return "avx2";
    case DetectLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool DetectLevelSupported(DetectLevel level) {
  switch (level) {
    case DetectLevel::kScalar:
      return true;
#if REFIT_DETECT_X86
    // libgcc's and compiler-rt's checks include the OS (XGETBV) having
    // enabled the YMM/ZMM register state, not just CPUID.
    case DetectLevel::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi");
    case DetectLevel::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("bmi");
#endif
    default:
      return false;
  }
}

DetectLevel BestDetectLevel() {
  static const DetectLevel best = [] {
    for (DetectLevel level : {DetectLevel::kAvx512, DetectLevel::kAvx2}) {
      if (DetectLevelSupported(level)) return level;
    }
    return DetectLevel::kScalar;
  }();
  return best;
}

size_t FindChangedAt(DetectLevel level, const uint8_t* a, const uint8_t* b,
                     uint64_t n, int width, std::vector<uint32_t>* out) {
  const int log_width = CheckArgs(n, width);
  return FindRange(KernelsFor(level), log_width, a, b, 0, n, out);
}

uint64_t CountChangedAt(DetectLevel level, const uint8_t* a, const uint8_t* b,
                        uint64_t n, int width) {
  const int log_width = CheckArgs(n, width);
  if (n == 0) return 0;
  return KernelsFor(level).count[log_width](a, b, static_cast<size_t>(n), 0,
                                            nullptr);
}

}  // namespace internal

size_t FindChanged(const uint8_t* a, const uint8_t* b, uint64_t n, int width,
                   std::vector<uint32_t>* out) {
  const int log_width = internal::CheckArgs(n, width);
  return internal::FindRange(internal::BestKernels(), log_width, a, b, 0, n,
                             out);
}

uint64_t CountChanged(const uint8_t* a, const uint8_t* b, uint64_t n,
                      int width) {
  const int log_width = internal::CheckArgs(n, width);
  if (n == 0) return 0;
  return internal::BestKernels().count[log_width](a, b, static_cast<size_t>(n),
                                                  0, nullptr);
}

size_t FindChangedParallel(const uint8_t* a, const uint8_t* b, uint64_t n,
                           int width, int threads, std::vector<uint32_t>* out) {
  using internal::kChunkElems;
  const int log_width = internal::CheckArgs(n, width);
  if (threads <= 0) threads = DefaultThreads();
  const uint64_t bytes = n << log_width;
  const uint64_t by_size =
      std::max<uint64_t>(1, bytes / internal::kMinParallelBytes);
  // Pieces are whole chunks, so each scans the same vector blocks that the
  // serial call would (an invariant for speed, not for correctness).
  const uint64_t chunks = (n + kChunkElems - 1) / kChunkElems;
  const uint64_t pieces_wanted =
      std::min<uint64_t>({static_cast<uint64_t>(threads), by_size, chunks});
  if (pieces_wanted <= 1) return FindChanged(a, b, n, width, out);
  const uint64_t per =
      (chunks + pieces_wanted - 1) / pieces_wanted * kChunkElems;
  const uint64_t pieces = (n + per - 1) / per;

  // Piece 0 appends straight to *out, whose capacity a caller reuses across
  // steps; the others fill their own vectors, joined in order afterwards.
  // The join copies only changed indices, a few percent of the bytes scanned
  // at RL change rates, so it stays on one thread.
  std::vector<std::vector<uint32_t>> parts(pieces - 1);
  const internal::KernelSet& kernels = internal::BestKernels();
  size_t first_count = 0;
  ParallelFor(static_cast<size_t>(pieces), 1, static_cast<int>(pieces),
              [&](size_t first, size_t last) {
                for (size_t p = first; p < last; ++p) {
                  const uint64_t begin = p * per;
                  const uint64_t end = std::min(n, begin + per);
                  if (p == 0) {
                    first_count = internal::FindRange(kernels, log_width, a, b,
                                                      begin, end, out);
                  } else {
                    internal::FindRange(kernels, log_width, a, b, begin, end,
                                        &parts[p - 1]);
                  }
                }
              });
  size_t rest = 0;
  for (const auto& part : parts) rest += part.size();
  out->reserve(out->size() + rest);
  for (const auto& part : parts)
    out->insert(out->end(), part.begin(), part.end());
  return first_count + rest;
}

}  // namespace refit
