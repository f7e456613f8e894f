// Interleaved rANS lanes (docs/format.md, section 5.3): 32-bit states
// renormalized to [2^16, 2^32) with 16-bit words.
//
// A stream codes N records of P planes; record i belongs to lane i mod L and
// each lane codes its records' coded planes in plane order. Because
// consecutive records sit in different lanes, walking the records in order
// gives the CPU L independent dependency chains, with no reordering.
//
// EncPlane/DecPlane are immutable lookup tables built from a Model; they may
// be shared across threads. The stream functions keep all state on the
// stack (or in their own scratch) and are thread-safe.
#ifndef REFIT_CODEC_RANS_H_
#define REFIT_CODEC_RANS_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "codec/table.h"
#include "refit/status.h"

namespace refit::codec {

inline constexpr uint32_t kRansLow = uint32_t{1} << 16;
inline constexpr int kMaxLanes = 255;
inline constexpr int kMaxPlanes = 12;  // 4 gap bytes + 8 value bytes

inline uint32_t LoadLE32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
         uint32_t{p[3]} << 24;
}

// Per-symbol encoder constants. Division by f is a multiply by
// rcp = ceil(2^(32+t) / f) and a shift by 32 + t: exact for every state the
// encoder divides (x < f * 2^(32-t), so x * (rcp - 2^(32+t)/f) < 2^(32+t)/f)
// and the product stays below 2^64.
struct EncSymbol {
  uint64_t rcp;
  uint64_t x_max;  // f << (32 - t): a state at or above it must emit a word
  uint32_t bias;   // c[s]
  uint32_t cmpl;   // 2^t - f[s]
};

struct EncPlane {
  uint32_t shift = 0;  // 32 + t
  std::array<EncSymbol, 256> sym;
};

// Flat slot -> symbol lookup of 2^t entries, plus f and c per symbol.
struct DecPlane {
  uint32_t t = 0;
  uint32_t mask = 0;
  std::vector<uint8_t> slot_symbol;
  std::array<uint32_t, 256> fc{};  // f[s] | c[s] << 16
};

// `m` must be coded (not kConstant).
void BuildEncPlane(const Model& m, EncPlane* p);
void BuildDecPlane(const Model& m, DecPlane* p);

// Lanes the encoder uses for n records (section 5.3), given the
// records-per-lane setting (>= 1) and whether any plane is coded.
int ChooseLanes(uint32_t n_records, uint32_t records_per_lane, bool any_coded);

// Encodes a stream and appends it to *out. `coded` lists the coded planes in
// plane order with their tables; fill(i, syms) must write record i's symbols
// into syms[0 .. P-1] (only the coded entries are read).
template <typename Fill>
void EncodeStream(uint32_t n_records, int lanes, std::span<const int> coded,
                  std::span<const EncPlane* const> enc, Fill&& fill,
                  std::vector<uint8_t>* out) {
  const int nc = static_cast<int>(coded.size());
  const uint32_t L = static_cast<uint32_t>(lanes);
  // Each coded symbol emits at most one word (t <= 15), so lane j needs at
  // most records(j) * nc words; lanes fill their regions from the back.
  std::array<size_t, kMaxLanes + 1> region_end;
  size_t total_words = 0;
  for (uint32_t j = 0; j < L; ++j) {
    const uint64_t recs = n_records > j ? (n_records - j + L - 1) / L : 0;
    total_words += recs * static_cast<uint64_t>(nc);
    region_end[j] = total_words;
  }
  auto words = std::make_unique_for_overwrite<uint16_t[]>(total_words + 1);
  std::array<uint16_t*, kMaxLanes> ptr;
  std::array<uint32_t, kMaxLanes> state;
  for (uint32_t j = 0; j < L; ++j) {
    ptr[j] = words.get() + region_end[j];
    state[j] = kRansLow;
  }
  if (nc > 0 && n_records > 0) {
    std::array<uint8_t, kMaxPlanes> syms{};
    uint32_t j = (n_records - 1) % L;
    for (uint32_t i = n_records; i-- > 0;) {
      fill(i, syms.data());
      uint32_t x = state[j];
      uint16_t* p = ptr[j];
      for (int c = nc - 1; c >= 0; --c) {
        const EncPlane& ep = *enc[c];
        const EncSymbol& e = ep.sym[syms[coded[c]]];
        if (x >= e.x_max) {
          *--p = static_cast<uint16_t>(x);
          x >>= 16;
        }
        const uint64_t q = (x * e.rcp) >> ep.shift;
        x += e.bias + static_cast<uint32_t>(q) * e.cmpl;
      }
      state[j] = x;
      ptr[j] = p;
      j = j == 0 ? L - 1 : j - 1;
    }
  }
  ByteWriter w(out);
  w.U8(static_cast<uint8_t>(L));
  for (uint32_t j = 0; j + 1 < L; ++j) {
    const size_t used = words.get() + region_end[j] - ptr[j];
    w.Varint(4 + 2 * used);
  }
  for (uint32_t j = 0; j < L; ++j) {
    w.U32(state[j]);
    const size_t used = words.get() + region_end[j] - ptr[j];
    w.Bytes(ptr[j], 2 * used);  // little-endian host, as in base/bytes.h
  }
}

// Decodes a stream occupying exactly `in`. `fixed` holds P symbols with the
// constant planes' values (the coded entries are overwritten); for each
// record in order, emit(i, syms) receives all P symbols and returns nullptr
// to continue or a message that makes the decode fail with kDataLoss.
template <typename Emit>
Status DecodeStream(std::span<const uint8_t> in, uint32_t n_records, int P,
                    const uint8_t* fixed, std::span<const int> coded,
                    std::span<const DecPlane* const> dec, Emit&& emit) {
  ByteReader r(in);
  const uint32_t L = r.U8();
  if (!r.ok()) return DataLossError("stream truncated before the lane count");
  if (L == 0) return DataLossError("stream has zero lanes");
  std::array<const uint8_t*, kMaxLanes> ptr;
  std::array<const uint8_t*, kMaxLanes> end;
  std::array<uint32_t, kMaxLanes> state;
  std::array<uint64_t, kMaxLanes> size;
  for (uint32_t j = 0; j + 1 < L; ++j) size[j] = r.Varint();
  if (!r.ok()) return DataLossError("stream lane sizes truncated");
  const uint8_t* p = r.position();
  uint64_t left = r.remaining();
  for (uint32_t j = 0; j < L; ++j) {
    if (j + 1 == L) size[j] = left;
    if (size[j] > left || size[j] < 4) {
      return DataLossError("lane " + std::to_string(j) + " size " +
                           std::to_string(size[j]) +
                           " is below 4 or past the stream end");
    }
    state[j] = LoadLE32(p);
    if (state[j] < kRansLow) {
      return DataLossError("lane " + std::to_string(j) +
                           " starts below the rANS state range");
    }
    ptr[j] = p + 4;
    end[j] = p + size[j];
    p += size[j];
    left -= size[j];
  }
  const int nc = static_cast<int>(coded.size());
  std::array<uint8_t, kMaxPlanes> syms{};
  std::memcpy(syms.data(), fixed, static_cast<size_t>(P));
  uint32_t j = 0;
  for (uint32_t i = 0; i < n_records; ++i) {
    uint32_t x = state[j];
    const uint8_t* q = ptr[j];
    for (int c = 0; c < nc; ++c) {
      const DecPlane& d = *dec[c];
      const uint32_t slot = x & d.mask;
      const uint8_t s = d.slot_symbol[slot];
      const uint32_t e = d.fc[s];
      x = (e & 0xffff) * (x >> d.t) + slot - (e >> 16);
      if (x < kRansLow) {
        if (end[j] - q < 2) {
          return DataLossError("lane " + std::to_string(j) +
                               " ran out of bytes at record " +
                               std::to_string(i));
        }
        x = (x << 16) | (uint32_t{q[0]} | uint32_t{q[1]} << 8);
        q += 2;
      }
      syms[coded[c]] = s;
    }
    state[j] = x;
    ptr[j] = q;
    if (const char* err = emit(i, syms.data())) {
      return DataLossError(std::string(err) + " at record " +
                           std::to_string(i));
    }
    if (++j == L) j = 0;
  }
  for (uint32_t jj = 0; jj < L; ++jj) {
    if (ptr[jj] != end[jj] || state[jj] != kRansLow) {
      return DataLossError("lane " + std::to_string(jj) +
                           (ptr[jj] != end[jj] ? " has leftover bytes"
                                               : " ends in a wrong state"));
    }
  }
  return Status::Ok();
}

// Validates a stream's lane framing without decoding; sets *lanes.
Status ParseLanes(std::span<const uint8_t> in, int* lanes);

}  // namespace refit::codec

#endif  // REFIT_CODEC_RANS_H_
