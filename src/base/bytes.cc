#include "base/bytes.h"

namespace refit {

uint64_t ByteReader::Varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (failed_ || p_ == end_) {
      Fail("truncated varint");
      return 0;
    }
    uint8_t b = *p_++;
    if (shift == 63 && b > 1) {
      Fail("varint overflows 64 bits");
      return 0;
    }
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  Fail("varint longer than 10 bytes");
  return 0;
}

std::span<const uint8_t> ByteReader::Bytes(uint64_t n) {
  if (failed_ || static_cast<uint64_t>(end_ - p_) < n) {
    Fail("truncated: " + std::to_string(n) + " bytes wanted, " +
         std::to_string(failed_ ? 0 : end_ - p_) + " left");
    return {};
  }
  std::span<const uint8_t> s(p_, static_cast<size_t>(n));
  p_ += n;
  return s;
}

std::string ByteReader::String(uint64_t max_len) {
  uint64_t n = Varint();
  if (n > max_len) {
    Fail("string of " + std::to_string(n) + " bytes exceeds the limit of " +
         std::to_string(max_len));
    return {};
  }
  auto s = Bytes(n);
  return std::string(s.begin(), s.end());
}

Status ByteReader::status(std::string_view what) const {
  if (!failed_) return Status();
  return DataLossError(std::string(what) + ": " + reason_);
}

}  // namespace refit
