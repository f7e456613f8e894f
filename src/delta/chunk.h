// Chunk framing: the self-describing unit of a delta (docs/format.md §3).
//
// A chunk names one contiguous canonical range of one tensor, carries the
// range hash before and after, and an entropy-coded payload (§4). This file
// only frames and unframes; it does no I/O and never allocates more than the
// chunk itself, so it can be fuzzed in memory. Thread-compatible.
#ifndef REFIT_DELTA_CHUNK_H_
#define REFIT_DELTA_CHUNK_H_

#include <cstdint>
#include <span>
#include <vector>

#include "base/bytes.h"
#include "base/hash.h"
#include "codec/payload.h"
#include "refit/status.h"

namespace refit {

inline constexpr uint8_t kFormatVersion = 1;
inline constexpr uint64_t kMaxChunkElements = uint64_t{1} << 28;
inline constexpr uint64_t kMaxChunkPayload = uint64_t{1} << 31;

struct ChunkHeader {
  codec::ChunkKind kind = codec::ChunkKind::kSparseXor;
  uint8_t width = 0;
  uint64_t version = 0;
  uint64_t base_version = 0;
  uint64_t tensor_id = 0;
  uint64_t start = 0;    // first element of the range
  uint64_t count = 0;    // elements in the range
  uint64_t changed = 0;  // elements whose bits differ
  Hash128 before;
  Hash128 after;

  bool IsXor() const {
    return kind == codec::ChunkKind::kSparseXor ||
           kind == codec::ChunkKind::kDenseXor;
  }
  bool IsSparse() const {
    return kind == codec::ChunkKind::kSparseXor ||
           kind == codec::ChunkKind::kSparseOverwrite;
  }
};

// Appends the framed chunk (header, payload, checksum) to *out.
void SerializeChunk(const ChunkHeader& header, std::span<const uint8_t> payload,
                    std::vector<uint8_t>* out);

struct ParsedChunk {
  ChunkHeader header;
  std::span<const uint8_t> payload;  // points into the parsed bytes
  size_t size = 0;                   // bytes of the whole chunk
};

// Parses one chunk at the start of `bytes` (trailing bytes are ignored and
// reported through `size`). Verifies magic, version, flags, limits and the
// checksum before returning anything; kDataLoss on any defect.
Result<ParsedChunk> ParseChunk(std::span<const uint8_t> bytes);

const char* ChunkKindName(codec::ChunkKind kind);

// hash128 fields (docs/format.md §1): low half, then high half.
inline void PutHash(ByteWriter& w, const Hash128& h) {
  w.U64(h.lo);
  w.U64(h.hi);
}
inline Hash128 GetHash(ByteReader& r) {
  Hash128 h;
  h.lo = r.U64();
  h.hi = r.U64();
  return h;
}

}  // namespace refit

#endif  // REFIT_DELTA_CHUNK_H_
