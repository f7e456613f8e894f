// Little-endian byte writing and bounds-checked reading, plus LEB128
// varints (docs/format.md, "Conventions").
//
// ByteReader treats its input as hostile: every getter checks the remaining
// length first and, on failure, latches an error so callers can read a whole
// header and check once. Neither class is thread-safe.
#ifndef REFIT_BASE_BYTES_H_
#define REFIT_BASE_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(v); }
  void U16(uint16_t v) { Fixed(v, 2); }
  void U32(uint32_t v) { Fixed(v, 4); }
  void U64(uint64_t v) { Fixed(v, 8); }
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    out_->push_back(static_cast<uint8_t>(v));
  }
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  void Bytes(std::span<const uint8_t> s) { Bytes(s.data(), s.size()); }
  // Varint length, then the bytes.
  void String(std::string_view s) {
    Varint(s.size());
    Bytes(s.data(), s.size());
  }
  size_t size() const { return out_->size(); }
  std::vector<uint8_t>* buffer() { return out_; }

 private:
  void Fixed(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_->push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t>* out_;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  explicit ByteReader(std::span<const uint8_t> s)
      : ByteReader(s.data(), s.size()) {}

  // Each getter returns 0 / empty once the reader has failed.
  uint8_t U8() { return static_cast<uint8_t>(Fixed(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Fixed(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Fixed(4)); }
  uint64_t U64() { return Fixed(8); }
  uint64_t Varint();
  // A view of the next n bytes (no copy).
  std::span<const uint8_t> Bytes(uint64_t n);
  std::string String(uint64_t max_len);

  size_t remaining() const { return failed_ ? 0 : static_cast<size_t>(end_ - p_); }
  const uint8_t* position() const { return p_; }
  bool ok() const { return !failed_; }
  // OK, or kDataLoss naming `what` and the first failure.
  Status status(std::string_view what) const;
  void Fail(std::string reason) {
    if (!failed_) {
      failed_ = true;
      reason_ = std::move(reason);
    }
  }

 private:
  uint64_t Fixed(int n) {
    if (failed_ || end_ - p_ < n) {
      Fail("truncated");
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p_[i]) << (8 * i);
    p_ += n;
    return v;
  }
  const uint8_t* p_;
  const uint8_t* end_;
  bool failed_ = false;
  std::string reason_;
};

// Overflow-safe a + b <= limit for offsets and lengths.
inline bool AddWithin(uint64_t a, uint64_t b, uint64_t limit) {
  return a <= limit && b <= limit - a;
}

// Overflow-safe product; false on overflow.
inline bool MulChecked(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

inline uint64_t LoadLE(const uint8_t* p, int width) {
  uint64_t v = 0;
  std::memcpy(&v, p, static_cast<size_t>(width));  // little-endian host
  return v;
}
inline void StoreLE(uint8_t* p, uint64_t v, int width) {
  std::memcpy(p, &v, static_cast<size_t>(width));
}

}  // namespace refit

#endif  // REFIT_BASE_BYTES_H_
