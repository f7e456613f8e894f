#include "delta/chunk.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "codec/conditional.h"

namespace refit {
namespace {

constexpr uint8_t kChunkMagic[4] = {'R', 'F', 'C', 'K'};
constexpr uint8_t kFlagStrided = 1;

uint32_t Checksum(const uint8_t* p, size_t n) {
  return static_cast<uint32_t>(XXH3_64bits(p, n));
}

}  // namespace

const char* ChunkKindName(codec::ChunkKind kind) {
  switch (kind) {
    case codec::ChunkKind::kSparseXor: return "sparse-xor";
    case codec::ChunkKind::kSparseOverwrite: return "sparse-overwrite";
    case codec::ChunkKind::kDenseXor: return "dense-xor";
    case codec::ChunkKind::kRaw: return "raw";
    case codec::ChunkKind::kConditionalXor: return "conditional-xor";
  }
  return "unknown";
}

namespace {

// Appends the framed fields before the payload (magic through the payload
// length) to *out.
void FrameHeader(const ChunkHeader& h, uint64_t payload_size,
                 std::vector<uint8_t>* out) {
  ByteWriter w(out);
  w.Bytes(kChunkMagic, 4);
  w.U8(kFormatVersion);
  w.U8(static_cast<uint8_t>(h.kind));
  w.U8(h.width);
  w.U8(h.IsStrided() ? kFlagStrided : 0);
  w.Varint(h.version);
  w.Varint(h.base_version);
  w.Varint(h.tensor_id);
  w.Varint(h.start);
  w.Varint(h.count);
  if (h.IsStrided()) {
    w.Varint(h.run);
    w.Varint(h.stride);
  }
  w.Varint(h.changed);
  PutHash(w, h.before);
  PutHash(w, h.after);
  w.Varint(payload_size);
}

}  // namespace

void SerializeChunk(const ChunkHeader& h, std::span<const uint8_t> payload,
                    std::vector<uint8_t>* out) {
  SerializeChunk(h, payload, {}, out);
}

void SerializeChunk(const ChunkHeader& h, std::span<const uint8_t> head,
                    std::span<const uint8_t> tail, std::vector<uint8_t>* out) {
  const size_t begin = out->size();
  // Geometric growth kept for callers appending many chunks to one buffer.
  const size_t need = begin + ChunkSizeBound(head.size() + tail.size());
  if (need > out->capacity()) out->reserve(std::max(need, 2 * out->capacity()));
  FrameHeader(h, head.size() + tail.size(), out);
  ByteWriter w(out);
  w.Bytes(head);
  w.Bytes(tail);
  w.U32(Checksum(out->data() + begin, out->size() - begin));
}

size_t SerializeChunkTo(const ChunkHeader& h, std::span<const uint8_t> head,
                        std::span<const uint8_t> tail, uint8_t* dst) {
  std::vector<uint8_t> fields;
  fields.reserve(ChunkSizeBound(0));
  FrameHeader(h, head.size() + tail.size(), &fields);
  uint8_t* p = dst;
  std::memcpy(p, fields.data(), fields.size());
  p += fields.size();
  if (!head.empty()) std::memcpy(p, head.data(), head.size());
  p += head.size();
  if (!tail.empty()) std::memcpy(p, tail.data(), tail.size());
  p += tail.size();
  const uint32_t sum = Checksum(dst, static_cast<size_t>(p - dst));
  for (int i = 0; i < 4; ++i) *p++ = static_cast<uint8_t>(sum >> (8 * i));
  return static_cast<size_t>(p - dst);
}

namespace {

// ParseChunk's body; the checksum is verified when `checksum` is set.
Result<ParsedChunk> ParseFrame(std::span<const uint8_t> bytes, bool checksum) {
  ByteReader r(bytes);
  auto magic = r.Bytes(4);
  if (!r.ok() || std::memcmp(magic.data(), kChunkMagic, 4) != 0) {
    return DataLossError("not a refit chunk (bad magic)");
  }
  ParsedChunk c;
  ChunkHeader& h = c.header;
  uint8_t version = r.U8();
  uint8_t kind = r.U8();
  h.width = r.U8();
  uint8_t flags = r.U8();
  h.version = r.Varint();
  h.base_version = r.Varint();
  h.tensor_id = r.Varint();
  h.start = r.Varint();
  h.count = r.Varint();
  if (flags & kFlagStrided) {
    h.run = r.Varint();
    h.stride = r.Varint();
  }
  h.changed = r.Varint();
  h.before = GetHash(r);
  h.after = GetHash(r);
  uint64_t payload_size = r.Varint();
  REFIT_RETURN_IF_ERROR(r.status("chunk header"));
  if (version != kFormatVersion) {
    return DataLossError("chunk has format version " + std::to_string(version) +
                         "; this build reads version " +
                         std::to_string(kFormatVersion));
  }
  if (kind < 1 || kind > 5) {
    return DataLossError("chunk has unknown kind " + std::to_string(kind));
  }
  h.kind = static_cast<codec::ChunkKind>(kind);
  if ((flags & ~kFlagStrided) != 0) return DataLossError("chunk has unknown flags");
  if (h.width != 1 && h.width != 2 && h.width != 4 && h.width != 8) {
    return DataLossError("chunk has invalid element width " +
                         std::to_string(h.width));
  }
  if (h.kind == codec::ChunkKind::kConditionalXor &&
      h.width != codec::kConditionalWidth) {
    return DataLossError("conditional XOR chunk has element width " +
                         std::to_string(h.width) + "; the kind codes 2");
  }
  if (h.count == 0 || h.count > kMaxChunkElements) {
    return DataLossError("chunk element count " + std::to_string(h.count) +
                         " outside 1..2^28");
  }
  if (h.changed == 0 || h.changed > h.count) {
    return DataLossError("chunk changed count " + std::to_string(h.changed) +
                         " outside 1..count");
  }
  if (!AddWithin(h.start, h.count, uint64_t{1} << 62)) {
    return DataLossError("chunk range overflows");
  }
  if (h.IsStrided()) {
    // Canonical form: a strided region has at least two rows and gaps
    // between them (anything else is written as a contiguous range).
    if (h.run >= h.count || h.count % h.run != 0 || h.stride <= h.run) {
      return DataLossError("chunk region of " + std::to_string(h.count) +
                           " elements in rows of " + std::to_string(h.run) +
                           " at stride " + std::to_string(h.stride) +
                           " is not a strided region");
    }
    uint64_t span = 0;
    if (!MulChecked(h.count / h.run - 1, h.stride, &span) ||
        !AddWithin(h.start, span, uint64_t{1} << 62) ||
        !AddWithin(h.start + span, h.run, uint64_t{1} << 62)) {
      return DataLossError("chunk region overflows");
    }
  }
  if (payload_size > kMaxChunkPayload || payload_size + 4 > r.remaining()) {
    return DataLossError("chunk payload of " + std::to_string(payload_size) +
                         " bytes does not fit in the " +
                         std::to_string(r.remaining()) + " bytes left");
  }
  c.payload = r.Bytes(payload_size);
  size_t covered = static_cast<size_t>(r.position() - bytes.data());
  uint32_t stored = r.U32();
  REFIT_RETURN_IF_ERROR(r.status("chunk"));
  if (checksum && stored != Checksum(bytes.data(), covered)) {
    return DataLossError("chunk checksum mismatch (corrupted in transit?)");
  }
  c.size = covered + 4;
  return c;
}

}  // namespace

Result<ParsedChunk> ParseChunk(std::span<const uint8_t> bytes) {
  return ParseFrame(bytes, /*checksum=*/true);
}

Result<ChunkHeader> ParseChunkHeader(std::span<const uint8_t> bytes) {
  REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseFrame(bytes, /*checksum=*/false));
  return c.header;
}

Hash128 RegionHash(const ChunkHeader& h, const uint8_t* tensor_data) {
  const uint64_t w = h.width;
  if (!h.IsStrided()) return RangeHash(tensor_data + h.start * w, h.count * w);
  // The rows are gathered one 64 KiB segment at a time and each segment
  // hashed in one call, as RangeHash hashes a contiguous range: feeding
  // the rows to a streaming hasher one by one was about 4x slower.
  thread_local std::vector<uint8_t> segment(kRangeHashSegment);
  std::vector<Hash128> digests;
  digests.reserve((h.count * w + kRangeHashSegment - 1) / kRangeHashSegment);
  const uint64_t row_bytes = h.run * w;
  uint64_t row = 0, in_row = 0;  // the next byte to gather
  const uint64_t total = h.count * w;
  for (uint64_t done = 0; done < total;) {
    const uint64_t n = std::min<uint64_t>(kRangeHashSegment, total - done);
    for (uint64_t filled = 0; filled < n;) {
      const uint64_t take = std::min(n - filled, row_bytes - in_row);
      std::memcpy(segment.data() + filled, tensor_data + (h.start + row * h.stride) * w + in_row,
                  take);
      filled += take;
      in_row += take;
      if (in_row == row_bytes) {
        ++row;
        in_row = 0;
      }
    }
    digests.push_back(HashBytes(segment.data(), n));
    done += n;
  }
  return HashSegmentDigests(digests.data(), digests.size());
}

}  // namespace refit
