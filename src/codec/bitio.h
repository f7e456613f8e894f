// LSB-first bit streams and Elias gamma codes (docs/format.md, sections 1
// and 5.4), used for frequency-table descriptions.
//
// BitWriter appends to a caller-owned vector; BitReader reads a borrowed
// byte span and treats it as hostile: reads past the end latch a failure and
// return zeros, so a caller may parse a whole table and check once. Neither
// class is thread-safe.
#ifndef REFIT_CODEC_BITIO_H_
#define REFIT_CODEC_BITIO_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace refit::codec {

// Bits of gamma(v), v >= 1: 2 * floor(log2 v) + 1.
inline int GammaBits(uint32_t v) { return 2 * (31 - std::countl_zero(v)) + 1; }

class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>* out) : out_(out) {}
  ~BitWriter() { Flush(); }
  BitWriter(const BitWriter&) = delete;
  BitWriter& operator=(const BitWriter&) = delete;

  // Appends the low `bits` (0..32) bits of `v`, least significant first.
  void Put(uint32_t v, int bits) {
    acc_ |= static_cast<uint64_t>(v & Mask(bits)) << fill_;
    fill_ += bits;
    while (fill_ >= 8) {
      out_->push_back(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      fill_ -= 8;
    }
  }

  // Elias gamma, v >= 1: floor(log2 v) zeros, then v's bits from the most
  // significant down (so the leading 1 ends the zero run).
  void Gamma(uint32_t v) {
    const int len = 31 - std::countl_zero(v);
    Put(0, len);
    for (int i = len; i >= 0; --i) Put((v >> i) & 1, 1);
  }

  // Pads the last byte with zeros; further Puts start a new byte.
  void Flush() {
    if (fill_ > 0) {
      out_->push_back(static_cast<uint8_t>(acc_));
      acc_ = 0;
      fill_ = 0;
    }
  }

 private:
  static uint32_t Mask(int bits) { return bits >= 32 ? ~0u : (1u << bits) - 1; }
  std::vector<uint8_t>* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

class BitReader {
 public:
  explicit BitReader(std::span<const uint8_t> in) : in_(in) {}

  // The next `bits` (0..32) bits; 0 and a latched failure past the end.
  uint32_t Get(int bits) {
    uint32_t v = 0;
    for (int i = 0; i < bits; ++i) v |= Bit() << i;
    return v;
  }

  // A gamma code whose value has at most `max_bits` significant bits
  // (max_bits <= 32). Longer codes latch a failure: the caller's range is
  // known, so a long zero run is corruption, not a big number.
  uint32_t Gamma(int max_bits) {
    int zeros = 0;
    while (Bit() == 0) {
      if (failed_ || ++zeros >= max_bits) {
        failed_ = true;
        return 0;
      }
    }
    uint32_t v = 1;
    for (int i = 0; i < zeros; ++i) v = (v << 1) | Bit();
    return failed_ ? 0 : v;
  }

  bool ok() const { return !failed_; }
  // Bytes consumed so far, counting a partly read byte as whole.
  size_t bytes_used() const { return (pos_ + 7) / 8; }

 private:
  uint32_t Bit() {
    if (pos_ >= in_.size() * 8) {
      failed_ = true;
      return 0;
    }
    const uint32_t b = (in_[pos_ >> 3] >> (pos_ & 7)) & 1;
    ++pos_;
    return b;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace refit::codec

#endif  // REFIT_CODEC_BITIO_H_
