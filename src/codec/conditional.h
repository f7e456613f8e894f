// Conditional XOR payloads (kind 5, docs/format.md section 4.3): the
// changes of a chunk of 16-bit elements coded given the base elements the
// receiver already holds.
//
// Elements are split into 8 classes by the 8 bits below the sign of their
// base pattern (the exponent of BF16), clamped to a window [lo, lo + 7]
// that the encoder picks. Each class's changed elements are coded as gaps
// among that class's members (the decoder counts members in the base it
// holds), with the geometric model of section 5.2 built from the class's
// member and change counts, so a class costs only its change count to
// describe. Values are the difference new - old of the 16-bit patterns
// (zigzag), which for a step of one unit in the last place is +-1 whatever
// the low mantissa bits, where the XOR depends on them. Decoders return the
// same records as a sparse XOR payload: ascending positions and XOR values.
//
// Thread-safe. Each thread keeps its working memory from one call to the
// next (a few MiB per 4 Mi-element chunk at 3% change; buffers above 16 MiB
// are released when the call returns). Decoders treat the payload as
// hostile (kDataLoss on any defect, never reading or writing out of
// bounds).
#ifndef REFIT_CODEC_CONDITIONAL_H_
#define REFIT_CODEC_CONDITIONAL_H_

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/payload.h"
#include "refit/status.h"

namespace refit::codec {

inline constexpr int kConditionalClasses = 8;
// The only element width kind 5 codes.
inline constexpr int kConditionalWidth = 2;

// Exponent counts of a chunk's base that the encoder's caller gathers
// while the base is in its cache anyway (the delta encoder's pass that
// finds the changes), so that EncodeConditional does not read the whole
// base once more for them. Only the encoder's choice of class window reads
// them; the payload is the same with or without.
struct ConditionalSample {
  // Elements [from, n) of the chunk were counted; from is a multiple of 8.
  uint32_t from = 0;
  // The exponents (bits 7..14) of elements from, from + 8, from + 16, ...,
  // spread over four tables (only their sums matter).
  std::array<std::array<uint32_t, 256>, 4> sampled{};
  // The exponents of the changed elements' base values, likewise; every
  // changed element is at or past `from`.
  std::array<std::array<uint32_t, 256>, 4> changed{};
};

// Counts into *sample elements [first, end) of the chunk whose n base
// elements are at base: first must be a multiple of 8 and at least
// sample->from; positions[0 .. k-1] are the range's changed elements.
// Calls cover consecutive ranges in order.
void SampleConditional(const uint8_t* base, uint32_t first, uint32_t end,
                       std::span<const uint32_t> positions, ConditionalSample* sample);

// Encodes a kind-5 payload and appends it to *out.
//   n: elements in the chunk, 1 .. 2^28.
//   base: the chunk's n base elements (2 bytes each, little-endian), in
//     range order.
//   positions, xor_values: the k sparse XOR records (as EncodeSparse with
//     kSparseXor, w = 2: ascending positions < n, non-zero values).
//   sample: null, or the counts of SampleConditional over elements
//     [sample->from, n) with every record among them.
// kInvalidArgument (appending nothing) when the records are not valid.
Status EncodeConditional(uint32_t n, const uint8_t* base,
                         std::span<const uint32_t> positions,
                         const uint8_t* xor_values, const EncodeOptions& opt,
                         std::vector<uint8_t>* out,
                         const ConditionalSample* sample = nullptr);

// Decodes a kind-5 payload of k records against the chunk's n base
// elements into positions[0 .. k-1] (ascending) and XOR values
// xor_values[0 .. 2k-1].
Status DecodeConditional(std::span<const uint8_t> payload, uint32_t n,
                         const uint8_t* base, uint32_t k, uint32_t* positions,
                         uint8_t* xor_values);

// The class window's low end and per-class change counts of a payload, for
// `refit inspect`.
struct ConditionalInfo {
  int lo = 0;
  uint32_t changes[kConditionalClasses] = {};
  int lanes = 0;
};
Result<ConditionalInfo> DescribeConditional(std::span<const uint8_t> payload);

}  // namespace refit::codec

#endif  // REFIT_CODEC_CONDITIONAL_H_
