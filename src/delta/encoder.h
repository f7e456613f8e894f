// The delta encoder: finds the changed elements of one chunk range, hashes
// it, and picks the smallest encoding (docs/format.md §3-4).
//
// EncodeChunkRange is pure (no I/O) and thread-safe for distinct scratch
// objects; DiffTensorsToWriter runs it over every chunk of every tensor on
// several threads and streams the chunks, in order, into a DeltaWriter.
#ifndef REFIT_DELTA_ENCODER_H_
#define REFIT_DELTA_ENCODER_H_

#include <cstdint>
#include <vector>

#include "base/hash.h"
#include "codec/conditional.h"
#include "codec/payload.h"
#include "delta/chunk.h"
#include "delta/delta_file.h"
#include "refit/delta.h"
#include "refit/status.h"

namespace refit {

struct ChunkEncodeOptions {
  codec::EncodeOptions codec;
  bool allow_xor = true;
  // Also try conditional XOR (kind 5, BF16-width ranges), which receivers
  // decode given the base; off for receivers that cannot decode it.
  bool allow_conditional = false;
  // The 64 KiB segment digests (docs/format.md "Range hash") of the range's
  // old bytes, one per segment from the range's first byte (which must
  // start a segment), when the caller keeps them: each segment's "before"
  // digest is taken from here instead of hashing the old bytes. The caller
  // vouches for them; nothing here checks them against the bytes. Null:
  // hash the old bytes.
  const Hash128* base_digests = nullptr;
};

// Per-thread buffers reused across chunks.
struct EncodeScratch {
  std::vector<uint32_t> positions;
  std::vector<uint8_t> values;
  std::vector<uint8_t> dense;
  std::vector<uint8_t> candidate;
  std::vector<uint8_t> best;
  codec::ConditionalSample sample;  // conditional XOR's exponent counts
};

struct ChunkResult {
  // Digests of the range's 64 KiB segments before and after; equal vectors
  // when nothing changed.
  std::vector<Hash128> before_digests;
  std::vector<Hash128> after_digests;
  ChunkHeader header;          // valid when `chunk` is not empty
  std::vector<uint8_t> chunk;  // the serialized chunk; empty if unchanged
  uint64_t payload_bytes = 0;
  // CPU seconds of the range's pass over base and target, and of coding
  // and framing it (DiffReport's scan_seconds and code_seconds).
  double scan_seconds = 0;
  double code_seconds = 0;
};

// Encodes elements [start, start + count) of a tensor whose old and new
// bytes begin at old_data and new_data (the tensor's start). `ids` supplies
// version, base_version, tensor_id and width.
Status EncodeChunkRange(const ChunkHeader& ids, const uint8_t* old_data,
                        const uint8_t* new_data, uint64_t start, uint64_t count,
                        const ChunkEncodeOptions& options,
                        EncodeScratch* scratch, ChunkResult* out);

// Encodes a region of a tensor whose elements the caller holds gathered in
// region order (e.g. a tensor-parallel shard): old_region and new_region
// hold `count` elements; in the tensor they are rows of `run` elements
// starting `stride` elements apart from element `start` (run == 0 or
// stride == run: one contiguous range). The chunk's hashes are over the
// gathered bytes, which is how receivers hash the region (RegionHash).
Status EncodeRegionChunk(const ChunkHeader& ids, const uint8_t* old_region,
                         const uint8_t* new_region, uint64_t start, uint64_t count,
                         uint64_t run, uint64_t stride,
                         const ChunkEncodeOptions& options, EncodeScratch* scratch,
                         ChunkResult* out);

// Validates and pairs base and target by name (sorted), and builds the
// trailer's tensor table (hashes are filled in by the diff).
Result<std::vector<TensorEntry>> MatchTensors(
    const std::vector<TensorView>& base, const std::vector<TensorView>& target,
    std::vector<size_t>* base_order, std::vector<size_t>* target_order);

// Encodes every chunk of every tensor on several threads and hands the
// chunks, in order, to `sink` as they are ready, then Finish()es it. The
// sink's AddChunk runs on the calling thread and may block (back-pressure):
// at most 2 * threads chunks are held in memory.
//
// `base_digests`, when not null, holds for each tensor of `base` (same
// index) its 64 KiB segment digests, which the caller keeps (a publisher's
// baseline: docs/protocol.md, "Publisher"): the table's "before" hashes and
// the chunks' are composed from them and the base's bytes are not hashed.
// A tensor whose digest count does not match its size is hashed.
Result<DiffReport> DiffTensorsToSink(
    const std::vector<TensorView>& base, const std::vector<TensorView>& target,
    const DiffOptions& options, ChunkSink* sink,
    const std::vector<std::vector<Hash128>>* base_digests = nullptr);

}  // namespace refit

#endif  // REFIT_DELTA_ENCODER_H_
