// The byte planes of a sparse payload (docs/format.md §4.1) and the choice
// of their models (§5.2): one definition for every encoder and decoder of
// sparse payloads, the CPU codec (payload.cc), the GPU receiver's batch
// preparation and kernels (src/cuda/batch.cc, decode_apply.cu) and the GPU
// encoder (src/cuda/encode_plan.cc, encode.cu).
//
// A payload of gap width gw (1..4) and element width w has gw + w planes:
// plane j < gw holds byte j of each record's gap, plane gw + i byte i of its
// value (least significant first). Encoders count the symbols before they
// know gw, into 4 + w histograms: gap bytes 0..3, then value bytes 0..w-1
// (SparsePlane::histogram). Kernels hold a record's gap and value side by
// side and address a plane's byte by one shift (SparsePlane::shift): 8 * byte
// into the gap, or kSparseValueShift + 8 * byte into the value.
//
// The REFIT_HD functions compile for the host and, under nvcc, the device.
// Everything here is pure and thread-safe.
#ifndef REFIT_CODEC_SPARSE_PLANE_H_
#define REFIT_CODEC_SPARSE_PLANE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "base/host_device.h"
#include "codec/table.h"

namespace refit::codec {

// Bytes of a gap as the encoders count them (a gap is below 2^28).
inline constexpr int kSparseGapBytes = 4;
// Most planes of a sparse payload: four gap bytes and eight value bytes.
inline constexpr int kMaxSparsePlanes = kSparseGapBytes + 8;
// Shifts at or above this address value bytes (SparsePlane::shift).
inline constexpr uint32_t kSparseValueShift = 64;

struct SparsePlane {
  bool is_gap = false;  // a gap byte, else a value byte
  int byte = 0;         // which byte of the gap or value, 0 = lowest

  REFIT_HD static constexpr SparsePlane Gap(int byte) { return {true, byte}; }
  REFIT_HD static constexpr SparsePlane Value(int byte) {
    return {false, byte};
  }
  // Its histogram among the encoders' 4 + w.
  REFIT_HD constexpr int histogram() const {
    return is_gap ? byte : kSparseGapBytes + byte;
  }
  // The shift of its byte in a record held as (gap, value).
  REFIT_HD constexpr uint32_t shift() const {
    return (is_gap ? 0 : kSparseValueShift) + 8 * static_cast<uint32_t>(byte);
  }
};

// Plane j (0 <= j < gw + w) of a payload of gap width gw.
REFIT_HD constexpr SparsePlane SparsePlaneAt(int j, int gw) {
  return j < gw ? SparsePlane::Gap(j) : SparsePlane::Value(j - gw);
}

// Whether a SparsePlane::shift addresses a gap byte (else a value byte,
// at shift - kSparseValueShift).
REFIT_HD constexpr bool ShiftIsGap(uint32_t shift) {
  return shift < kSparseValueShift;
}

// The context plane j's model is chosen and read in: gap planes may use the
// geometric model of their byte (§5.2), value planes may not.
inline GapContext SparsePlaneContext(int j, int gw, uint32_t n, uint32_t k) {
  const SparsePlane p = SparsePlaneAt(j, gw);
  return GapContext{p.is_gap, n, k, p.is_gap ? p.byte : 0};
}

// Chooses the models of a sparse payload's planes, as every sparse encoder
// does, and appends the payload's header (the gap-width byte, then the
// gw + w model descriptions) to *header.
//   hist: the 4 + w plane histograms of the k records (SparsePlane::
//     histogram order), each summing to k >= 1; w is 1, 2, 4 or 8.
//   n: elements in the chunk; max_gap: the largest gap.
// Returns gw (GapWidthFor(max_gap)); *models receives the gw + w models.
int ChooseSparseModels(std::span<const Histogram> hist, uint32_t n, uint32_t k,
                       uint32_t max_gap, std::vector<Model>* models,
                       std::vector<uint8_t>* header);

}  // namespace refit::codec

#endif  // REFIT_CODEC_SPARSE_PLANE_H_
