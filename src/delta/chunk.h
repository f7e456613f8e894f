// Chunk framing: the self-describing unit of a delta (docs/format.md §3).
//
// A chunk names one canonical region of one tensor - a contiguous range, or
// a strided region of equal rows (a block of a matrix that a tensor-parallel
// rank owns) - carries the region's range hash before and after, and an
// entropy-coded payload (§4). This file
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
  uint64_t start = 0;    // first element of the region
  uint64_t count = 0;    // elements in the region
  uint64_t changed = 0;  // elements whose bits differ
  // Strided regions (docs/format.md §3): count / run rows of `run`
  // elements, row r starting at start + r * stride. run == 0: contiguous.
  uint64_t run = 0;
  uint64_t stride = 0;
  Hash128 before;
  Hash128 after;

  bool IsStrided() const { return run != 0; }
  // The tensor element of the region's i-th element.
  uint64_t Element(uint64_t i) const {
    return run == 0 ? start + i : start + (i / run) * stride + i % run;
  }
  // One past the last tensor element the region touches.
  uint64_t End() const {
    return run == 0 ? start + count : start + (count / run - 1) * stride + run;
  }

  // XOR records: applying the chunk twice restores the range.
  bool IsXor() const {
    return kind == codec::ChunkKind::kSparseXor ||
           kind == codec::ChunkKind::kDenseXor ||
           kind == codec::ChunkKind::kConditionalXor;
  }
  // Coded given the base's elements (docs/format.md §4.3): decoding needs
  // the range's base bytes, so a range already at "after" cannot be decoded
  // again; its undo needs the recorded old bytes.
  bool IsConditional() const {
    return kind == codec::ChunkKind::kConditionalXor;
  }
  // Decodes to k records (positions and values) rather than n elements.
  bool HasRecords() const { return IsSparse() || IsConditional(); }
  bool IsSparse() const {
    return kind == codec::ChunkKind::kSparseXor ||
           kind == codec::ChunkKind::kSparseOverwrite;
  }
};

// Appends the framed chunk (header, payload, checksum) to *out.
void SerializeChunk(const ChunkHeader& header, std::span<const uint8_t> payload,
                    std::vector<uint8_t>* out);
// The same with the payload in two parts (head, then tail); *out grows at
// most once.
void SerializeChunk(const ChunkHeader& header, std::span<const uint8_t> head,
                    std::span<const uint8_t> tail, std::vector<uint8_t>* out);
// Most bytes a framed chunk with a payload of `payload_bytes` takes.
inline constexpr size_t ChunkSizeBound(size_t payload_bytes) {
  // magic, version, kind, width, flags; 8 varints; two hashes; the payload
  // length; the checksum.
  return 8 + 8 * 10 + 2 * 16 + 10 + payload_bytes + 4;
}
// Writes the framed chunk of payload head + tail to dst (at least
// ChunkSizeBound(head.size() + tail.size()) bytes); returns its size. The
// bytes are SerializeChunk's.
size_t SerializeChunkTo(const ChunkHeader& header, std::span<const uint8_t> head,
                        std::span<const uint8_t> tail, uint8_t* dst);

struct ParsedChunk {
  ChunkHeader header;
  std::span<const uint8_t> payload;  // points into the parsed bytes
  size_t size = 0;                   // bytes of the whole chunk
};

// Parses one chunk at the start of `bytes` (trailing bytes are ignored and
// reported through `size`). Verifies magic, version, flags, limits and the
// checksum before returning anything; kDataLoss on any defect.
Result<ParsedChunk> ParseChunk(std::span<const uint8_t> bytes);
// The header of a chunk, with every check of ParseChunk but the
// checksum's: for bytes whose checksum is verified elsewhere (cheap: the
// payload is not read).
Result<ChunkHeader> ParseChunkHeader(std::span<const uint8_t> bytes);

const char* ChunkKindName(codec::ChunkKind kind);

// Range hash (docs/format.md §2) of the chunk's region of a tensor whose
// bytes begin at tensor_data, the rows of a strided region concatenated.
Hash128 RegionHash(const ChunkHeader& h, const uint8_t* tensor_data);

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
