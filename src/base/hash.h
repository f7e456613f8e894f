// Hashes used by the delta format (docs/format.md, section "Hashes").
//
// Hash128 is XXH3-128. RangeHash is the format's two-level hash of a byte
// range: the range is cut into 64 KiB segments, each segment is hashed with
// XXH3-128, and the concatenated segment digests are hashed again. Segments
// are independent, so a GPU or several threads can hash one range in
// parallel and still agree with the scalar reference bit for bit.
// All functions are pure and thread-safe.
#ifndef REFIT_BASE_HASH_H_
#define REFIT_BASE_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace refit {

struct Hash128 {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const Hash128&, const Hash128&) = default;
  // 32 lowercase hex digits, high half first (as xxhsum prints XXH128).
  std::string Hex() const;
};

inline constexpr size_t kRangeHashSegment = 64 * 1024;

Hash128 HashBytes(const void* data, size_t size);

// docs/format.md "Range hash". Equal to HashBytes over the segment digests
// (each 16 bytes: lo then hi, little-endian) of the 64 KiB segments.
Hash128 RangeHash(const void* data, size_t size);

// XXH3-128 over the 16-byte serializations of `n` segment digests: the outer
// step of RangeHash, so range hashes compose from cached segment digests.
Hash128 HashSegmentDigests(const Hash128* digests, size_t n);

// The number of segments of a range of `bytes` bytes: at least one (an
// empty range has one empty segment).
uint64_t SegmentCount(uint64_t bytes);

// The SegmentCount(bytes) segment digests of `bytes` bytes at p, to out.
void SegmentDigests(const uint8_t* p, uint64_t bytes, Hash128* out);

// Incremental form of RangeHash: feed bytes in any split, then Finish().
class RangeHasher {
 public:
  RangeHasher();
  ~RangeHasher();
  RangeHasher(const RangeHasher&) = delete;
  RangeHasher& operator=(const RangeHasher&) = delete;
  void Update(const void* data, size_t size);
  Hash128 Finish();

 private:
  void FlushSegment();
  void* segment_state_;  // XXH3_state_t*
  void* outer_state_;    // XXH3_state_t*
  size_t in_segment_ = 0;
  bool any_segment_ = false;
};

}  // namespace refit

#endif  // REFIT_BASE_HASH_H_
