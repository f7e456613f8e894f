// Chunk payload codec (docs/format.md, section 4, with the entropy stage of
// section 5): turns a chunk's changed elements into payload bytes and back.
//
// Sparse payloads (kinds 1, 2) carry k records (gap, value), each split into
// byte planes coded by static per-plane models and interleaved rANS lanes.
// Dense payloads (kinds 3, 4) carry all n elements as w byte planes, each
// constant, verbatim, entropy-coded or zstd-compressed.
//
// Ownership: inputs are borrowed for the duration of a call; encoders append
// to a caller-owned vector; decoders write into caller-owned buffers of the
// stated sizes. All functions are stateless and thread-safe.
//
// Encoders are deterministic: the same input and options give the same bytes
// on every platform (model and precision choices use integer fixed-point
// costs only; zstd output depends on the linked libzstd version).
//
// Decoders treat the payload as hostile: any corruption or truncation yields
// kDataLoss with a message naming the problem; they never read outside the
// payload or write outside the output buffers. Output buffers may hold
// partial results after an error.
#ifndef REFIT_CODEC_PAYLOAD_H_
#define REFIT_CODEC_PAYLOAD_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "refit/status.h"

namespace refit::codec {

enum class ChunkKind : uint8_t {
  kSparseXor = 1,
  kSparseOverwrite = 2,
  kDenseXor = 3,
  kRaw = 4,
  // Sparse XOR records coded given the base elements (conditional.h).
  kConditionalXor = 5,
};

// Limits from docs/format.md, section 7.
inline constexpr uint32_t kMaxChunkElements = uint32_t{1} << 28;

struct EncodeOptions {
  // Records per rANS lane before another lane is added (>= 1); more lanes
  // mean more parallel decode work and 4-6 more bytes each.
  uint32_t records_per_lane = 1024;
  int zstd_level = 3;
  // Dense planes may try zstd (mode 3); GPU decoders leave those to the CPU.
  bool allow_zstd = true;
};

// Encodes a sparse payload (section 4.1) and appends it to *out.
//   kind: kSparseXor or kSparseOverwrite.
//   n: elements in the chunk, 1 .. 2^28; w: element width 1, 2, 4 or 8.
//   positions: the k changed positions, strictly ascending, each < n,
//     1 <= k <= n.
//   values: k * w bytes; record r's value (little-endian element bits) at
//     values + r * w. For kSparseXor no value may be all zero.
// Returns kInvalidArgument (appending nothing) when any of that fails.
Status EncodeSparse(ChunkKind kind, uint32_t n, int w,
                    std::span<const uint32_t> positions, const uint8_t* values,
                    const EncodeOptions& opt, std::vector<uint8_t>* out);

// Decodes a sparse payload of k records into positions[0 .. k-1] and
// values[0 .. k*w - 1]. Arguments outside the limits above give
// kInvalidArgument; a corrupt payload gives kDataLoss. Notes:
//   1. Decoded positions are checked to be ascending and < n.
//   2. For kSparseXor a zero value is corruption.
Status DecodeSparse(std::span<const uint8_t> payload, ChunkKind kind,
                    uint32_t n, int w, uint32_t k, uint32_t* positions,
                    uint8_t* values);

// Encodes a dense payload (section 4.2): `data` holds n * w bytes, the XOR
// plane (kind 3) or the new bytes (kind 4); the codec does not care which.
Status EncodeDense(uint32_t n, int w, const uint8_t* data,
                   const EncodeOptions& opt, std::vector<uint8_t>* out);

// Decodes a dense payload into out[0 .. n*w - 1].
Status DecodeDense(std::span<const uint8_t> payload, uint32_t n, int w,
                   uint8_t* out);

// Bytes per gap in a sparse payload whose largest gap is max_gap (1-4; the
// encoder's choice, docs/format.md).
int GapWidthFor(uint32_t max_gap);

// What a payload spends its bytes on, for `refit inspect`.
struct PlaneInfo {
  std::string role;        // "gap0", "value1" (sparse); "plane0" (dense)
  std::string model;       // "constant", "uniform", "table", "geometric",
                           // "verbatim", "zstd"
  int precision_bits = 0;  // t; 0 where no rANS model applies
  uint64_t symbols = 0;    // symbols in the plane (k or n)
  uint64_t bytes = 0;      // dense planes: bytes the plane takes, mode
                           // included; sparse planes share lanes: 0
};

struct PayloadInfo {
  int gap_width = 0;  // sparse only
  int lanes = 0;      // sparse: the stream's lanes; dense: the most of any
                      // entropy-coded plane (0 if none)
  std::vector<PlaneInfo> planes;
  uint64_t table_bytes = 0;  // bytes spent on model descriptions
};

namespace internal {

// How EncodeSparse codes its rANS lanes: the portable code (the oracle), or
// eight lanes at a time with AVX2 where the CPU has it. Every kernel gives
// the same bytes; EncodeSparse uses the best one this CPU supports.
enum class LaneKernel : int { kPortable = 0, kAvx2 = 1 };

// Whether this CPU (and this build) can run `kernel`.
bool LaneKernelSupported(LaneKernel kernel);

// EncodeSparse with the lanes coded by `kernel`, for tests and benchmarks
// that compare kernels. Requires LaneKernelSupported(kernel) (else
// kInvalidArgument) and EncodeSparse's requirements.
Status EncodeSparseWith(LaneKernel kernel, ChunkKind kind, uint32_t n, int w,
                        std::span<const uint32_t> positions,
                        const uint8_t* values, const EncodeOptions& opt,
                        std::vector<uint8_t>* out);

}  // namespace internal

// Parses a payload's structure (models and lane framing, not the symbols).
// kind selects sparse or dense; k is ignored for dense kinds.
Result<PayloadInfo> DescribePayload(std::span<const uint8_t> payload,
                                    ChunkKind kind, uint32_t n, int w,
                                    uint32_t k);

}  // namespace refit::codec

#endif  // REFIT_CODEC_PAYLOAD_H_
