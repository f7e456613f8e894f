// The sparse encoder's rANS lanes (docs/format.md, section 5.3) coded eight
// at a time: AVX2 in rans_avx2.cc (built with -mavx2, chosen at run time, as
// conditional_kernels.h does). The portable EncodeStream in rans.h is the
// oracle: a kernel leaves exactly the states and words it would, so the
// payload bytes never depend on the kernel chosen.
//
// Internal to src/codec. A kernel is a pure function of its job and writes
// only the job's state, end and words; it is thread-safe. Only plain data
// and function declarations live here, so no inline code is compiled with
// two sets of flags.
#ifndef REFIT_CODEC_RANS_KERNELS_H_
#define REFIT_CODEC_RANS_KERNELS_H_

#include <cstdint>

namespace refit::codec::internal {

// One coded plane of a sparse payload, laid out for lookups of eight
// symbols at once: fb[s] = f[s] | c[s] << 16 (both below 2^15; the rest of
// EncSymbol follows from them and t).
struct SparseLanePlane {
  uint32_t fb[256];
  uint32_t t;      // precision bits, 1 .. 15
  uint32_t shift;  // SparsePlane::shift of the plane's byte
};

// Lanes [0, 8 * groups) of a stream of `lanes` lanes, each coding rounds
// [0, rounds) of its records (record r * lanes + j is lane j's record r),
// the last round first, as EncodeStream would after the records past
// rounds * lanes. Requires 8 * groups <= lanes and rounds * lanes <= the
// number of records.
struct SparseLaneJob {
  const uint32_t* positions;  // the records' positions, ascending
  const uint8_t* values;      // w bytes per record
  int w;                      // 1, 2, 4 or 8
  uint32_t lanes;
  uint32_t rounds;
  uint32_t groups;
  int planes;                    // coded planes, >= 1
  const SparseLanePlane* plane;  // the coded planes, in plane order
  uint32_t* state;               // per lane
  uint32_t* end;                 // per lane: its words start at words + end
  uint16_t* words;               // the lanes' regions, as EncodeStream's
};

using SparseLanesFn = void (*)(const SparseLaneJob& job);

#if defined(REFIT_CODEC_X86)
void EncodeSparseLanesAvx2(const SparseLaneJob& job);
#endif

}  // namespace refit::codec::internal

#endif  // REFIT_CODEC_RANS_KERNELS_H_
