#include "base/hash.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "base/xxh3_kernels.h"

namespace refit {
namespace {

using Kernel = internal::Xxh3Digest (*)(const void*, size_t);

Kernel PickKernel() {
#if defined(REFIT_XXH3_X86)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    return &internal::Xxh3Avx512;
  }
  if (__builtin_cpu_supports("avx2")) return &internal::Xxh3Avx2;
#endif
  return &internal::Xxh3Baseline;
}

// Picked on first use (not during static initialization, when another
// translation unit might already hash).
Kernel Xxh3() {
  static const Kernel kernel = PickKernel();
  return kernel;
}

void PutDigest(uint64_t lo, uint64_t hi, uint8_t out[16]) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(lo >> (8 * i));
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<uint8_t>(hi >> (8 * i));
}

}  // namespace

std::string Hash128::Hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx",
                static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

Hash128 HashBytes(const void* data, size_t size) {
  internal::Xxh3Digest d = Xxh3()(data, size);
  return Hash128{d.lo, d.hi};
}

Hash128 HashSegmentDigests(const Hash128* digests, size_t n) {
  // The digests' bytes go to XXH3 in blocks of up to kBlock (in one call
  // when they fit): the same hash as one update per digest, without the
  // per-call overhead (an 8 MiB range has 128 digests).
  constexpr size_t kBlock = 256;
  uint8_t buf[16 * kBlock];
  auto fill = [&](size_t first, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      PutDigest(digests[first + i].lo, digests[first + i].hi, buf + 16 * i);
    }
  };
  if (n <= kBlock) {
    fill(0, n);
    const XXH128_hash_t h = XXH3_128bits(buf, 16 * n);
    return Hash128{h.low64, h.high64};
  }
  XXH3_state_t* outer = XXH3_createState();
  XXH3_128bits_reset(outer);
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t count = std::min(kBlock, n - i);
    fill(i, count);
    XXH3_128bits_update(outer, buf, 16 * count);
  }
  XXH128_hash_t h = XXH3_128bits_digest(outer);
  XXH3_freeState(outer);
  return Hash128{h.low64, h.high64};
}

Hash128 RangeHash(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  XXH3_state_t* outer = XXH3_createState();
  XXH3_128bits_reset(outer);
  size_t off = 0;
  do {
    size_t n = size - off < kRangeHashSegment ? size - off : kRangeHashSegment;
    uint8_t d[16];
    const Hash128 h = HashBytes(p + off, n);
    PutDigest(h.lo, h.hi, d);
    XXH3_128bits_update(outer, d, sizeof d);
    off += n;
  } while (off < size);
  XXH128_hash_t h = XXH3_128bits_digest(outer);
  XXH3_freeState(outer);
  return Hash128{h.low64, h.high64};
}

uint64_t SegmentCount(uint64_t bytes) {
  return bytes == 0 ? 1 : (bytes + kRangeHashSegment - 1) / kRangeHashSegment;
}

void SegmentDigests(const uint8_t* p, uint64_t bytes, Hash128* out) {
  uint64_t i = 0;
  for (uint64_t off = 0; off < bytes; off += kRangeHashSegment, ++i) {
    out[i] = HashBytes(p + off, std::min<uint64_t>(kRangeHashSegment, bytes - off));
  }
  if (bytes == 0) out[0] = HashBytes(p, 0);
}

RangeHasher::RangeHasher()
    : segment_state_(XXH3_createState()), outer_state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(segment_state_));
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(outer_state_));
}

RangeHasher::~RangeHasher() {
  XXH3_freeState(static_cast<XXH3_state_t*>(segment_state_));
  XXH3_freeState(static_cast<XXH3_state_t*>(outer_state_));
}

void RangeHasher::FlushSegment() {
  auto* seg = static_cast<XXH3_state_t*>(segment_state_);
  uint8_t d[16];
  const XXH128_hash_t h = XXH3_128bits_digest(seg);
  PutDigest(h.low64, h.high64, d);
  XXH3_128bits_update(static_cast<XXH3_state_t*>(outer_state_), d, sizeof d);
  XXH3_128bits_reset(seg);
  in_segment_ = 0;
  any_segment_ = true;
}

void RangeHasher::Update(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  auto* seg = static_cast<XXH3_state_t*>(segment_state_);
  while (size > 0) {
    if (in_segment_ == kRangeHashSegment) FlushSegment();
    size_t n = kRangeHashSegment - in_segment_;
    if (n > size) n = size;
    XXH3_128bits_update(seg, p, n);
    in_segment_ += n;
    p += n;
    size -= n;
  }
}

Hash128 RangeHasher::Finish() {
  // An empty range still hashes one (empty) segment, as RangeHash does; a
  // full final segment is flushed here rather than eagerly in Update.
  if (in_segment_ > 0 || !any_segment_) FlushSegment();
  XXH128_hash_t h =
      XXH3_128bits_digest(static_cast<XXH3_state_t*>(outer_state_));
  return Hash128{h.low64, h.high64};
}

}  // namespace refit
