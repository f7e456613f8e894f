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
#include <type_traits>
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

// Flat slot lookups of 2^t entries: the symbol s owning each slot, and
// f[s] | (slot - c[s]) << 16 (both below 2^16 since t <= 15), so a decode
// step is one lookup away from the next state.
struct DecPlane {
  uint32_t t = 0;
  uint32_t mask = 0;
  std::vector<uint8_t> slot_symbol;
  std::vector<uint32_t> slot_entry;
};

// `m` must be coded (not kConstant).
void BuildEncPlane(const Model& m, EncPlane* p);
void BuildDecPlane(const Model& m, DecPlane* p);

// Lanes the encoder uses for n records (section 5.3), given the
// records-per-lane setting (>= 1) and whether any plane is coded.
int ChooseLanes(uint32_t n_records, uint32_t records_per_lane, bool any_coded);

namespace internal {

// Records coded side by side, in as many lanes, when a stream has that many.
inline constexpr uint32_t kRansGroup = 4;

// Codes symbol e onto state *x, whose lane's words end at *p. The word is
// stored whether or not renormalization keeps it: a branch here would
// mispredict on about every other record.
inline void EncStep(const EncSymbol& e, uint32_t shift, uint32_t* x,
                    uint16_t** p) {
  const uint32_t out = *x >= e.x_max;
  (*p)[-1] = static_cast<uint16_t>(*x);
  *p -= out;
  const uint32_t y = *x >> (out << 4);  // not a select: GCC makes it a branch
  const uint64_t q = (uint64_t{y} * e.rcp) >> shift;
  *x = y + e.bias + static_cast<uint32_t>(q) * e.cmpl;
}

// Decodes one symbol from state *x, refilling from *q without a branch; the
// caller guarantees two readable bytes at *q.
inline uint8_t DecStep(const uint8_t* symbol, const uint32_t* entry,
                       uint32_t t, uint32_t mask, uint32_t* x,
                       const uint8_t** q) {
  const uint32_t slot = *x & mask;
  const uint32_t e = entry[slot];
  uint32_t y = (e & 0xffff) * (*x >> t) + (e >> 16);
  const uint32_t refill = y < kRansLow;
  const uint32_t word = uint32_t{(*q)[0]} | uint32_t{(*q)[1]} << 8;
  y = (y << (refill << 4)) | (word & (0u - refill));
  *q += refill << 1;
  *x = y;
  return symbol[slot];
}

}  // namespace internal

// EncodeStream's `bulk` when nothing codes lanes in bulk.
struct NoBulkLanes {
  uint32_t operator()(uint32_t, uint16_t*, uint32_t*, uint16_t**) const {
    return 0;
  }
};

// Encodes a stream and appends it to *out. `coded` lists the coded planes in
// plane order with their tables; fill(i, syms) must write record i's symbols
// into syms[0 .. P-1] (only the coded entries are read).
//
// bulk(rounds, words, state, ptr) may code a prefix of the lanes in one go
// (a vector kernel, rans_kernels.h): lanes [0, m) for the m it returns, each
// its records r * L + j for r < rounds (the rounds in which every lane has a
// record), last round first, updating state[j] and ptr[j] (the lane's words
// start at ptr[j], inside `words`) exactly as the loops below would. It is
// called once, after the records past rounds * L; returning 0 leaves every
// record to the loops.
template <typename Fill, typename Bulk = NoBulkLanes>
void EncodeStream(uint32_t n_records, int lanes, std::span<const int> coded,
                  std::span<const EncPlane* const> enc, Fill&& fill,
                  std::vector<uint8_t>* out, Bulk&& bulk = Bulk()) {
  const int nc = static_cast<int>(coded.size());
  const uint32_t L = static_cast<uint32_t>(lanes);
  // Each coded symbol emits at most one word (t <= 15), so lane j needs at
  // most records(j) * nc words; lanes fill their regions from the back.
  // Every region has one spare word below it: renormalization stores its
  // word before knowing whether it keeps it (no branch to mispredict), and
  // a kept word later overwrites a discarded one.
  std::array<size_t, kMaxLanes + 1> region_end;
  size_t total_words = 0;
  for (uint32_t j = 0; j < L; ++j) {
    const uint64_t recs = n_records > j ? (n_records - j + L - 1) / L : 0;
    total_words += 1 + recs * static_cast<uint64_t>(nc);
    region_end[j] = total_words;
  }
  auto words = std::make_unique_for_overwrite<uint16_t[]>(total_words);
  std::array<uint16_t*, kMaxLanes> ptr;
  std::array<uint32_t, kMaxLanes> state;
  for (uint32_t j = 0; j < L; ++j) {
    ptr[j] = words.get() + region_end[j];
    state[j] = kRansLow;
  }
  if (nc > 0 && n_records > 0) {
    // Local copies, so the compiler sees no aliasing with the output.
    std::array<const EncSymbol*, kMaxPlanes> sym;
    std::array<uint32_t, kMaxPlanes> shift;
    std::array<int, kMaxPlanes> index;
    for (int c = 0; c < nc; ++c) {
      sym[c] = enc[c]->sym.data();
      shift[c] = enc[c]->shift;
      index[c] = coded[c];
    }
    constexpr uint32_t G = internal::kRansGroup;
    std::array<std::array<uint8_t, kMaxPlanes>, G> syms{};
    // One record, alone in its chain.
    const auto code_one = [&](uint32_t rec, uint32_t lane) {
      fill(rec, syms[0].data());
      uint32_t x = state[lane];
      uint16_t* p = ptr[lane];
      for (int c = nc - 1; c >= 0; --c) {
        internal::EncStep(sym[c][syms[0][index[c]]], shift[c], &x, &p);
      }
      state[lane] = x;
      ptr[lane] = p;
    };
    uint32_t i = n_records;            // records [0, i) are left
    uint32_t j = (n_records - 1) % L;  // the lane of record i - 1
    if constexpr (!std::is_same_v<std::remove_cvref_t<Bulk>, NoBulkLanes>) {
      const uint32_t rounds = n_records / L;
      if (rounds > 0) {
        // The records past the full rounds are the last of their lanes.
        for (; i > rounds * L; --i) code_one(i - 1, i - 1 - rounds * L);
        j = L - 1;
        const uint32_t done = bulk(rounds, words.get(), state.data(), ptr.data());
        if (done > 0) {
          // The other lanes round by round: each lane is one chain, and
          // the lanes of a round overlap.
          for (uint32_t r = rounds; r-- > 0;) {
            for (uint32_t lane = done; lane < L; ++lane) code_one(r * L + lane, lane);
          }
          i = 0;
        }
      }
    }
    // G consecutive records sit in G distinct lanes: coding them plane by
    // plane side by side hands the CPU G independent chains at once.
    if (L >= G) {
      while (i >= G) {
        std::array<uint32_t, G> lane, x;
        std::array<uint16_t*, G> p;
        // Unrolled so that the G states and pointers live in registers: a
        // loop over arrays keeps them in memory, and every step of a chain
        // then waits for a store to forward.
#pragma GCC unroll 4
        for (uint32_t r = 0; r < G; ++r) {
          lane[r] = j >= r ? j - r : j + L - r;
          fill(i - 1 - r, syms[r].data());
          x[r] = state[lane[r]];
          p[r] = ptr[lane[r]];
        }
        for (int c = nc - 1; c >= 0; --c) {
#pragma GCC unroll 4
          for (uint32_t r = 0; r < G; ++r) {
            internal::EncStep(sym[c][syms[r][index[c]]], shift[c], &x[r],
                              &p[r]);
          }
        }
#pragma GCC unroll 4
        for (uint32_t r = 0; r < G; ++r) {
          state[lane[r]] = x[r];
          ptr[lane[r]] = p[r];
        }
        i -= G;
        j = lane[G - 1] == 0 ? L - 1 : lane[G - 1] - 1;
      }
    }
    for (; i > 0; --i) {
      code_one(i - 1, j);
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
  std::array<const uint8_t*, kMaxPlanes> symbol_of;
  std::array<const uint32_t*, kMaxPlanes> entry_of;
  std::array<uint32_t, kMaxPlanes> tbits, mask;
  std::array<int, kMaxPlanes> index;
  for (int c = 0; c < nc; ++c) {
    symbol_of[c] = dec[c]->slot_symbol.data();
    entry_of[c] = dec[c]->slot_entry.data();
    tbits[c] = dec[c]->t;
    mask[c] = dec[c]->mask;
    index[c] = coded[c];
  }
  // A record reads at most one word per coded plane; lanes with that many
  // bytes left decode without per-word bounds checks.
  const ptrdiff_t record_bytes = 2 * nc;
  constexpr uint32_t G = internal::kRansGroup;
  std::array<std::array<uint8_t, kMaxPlanes>, G> syms;
  for (auto& row : syms) std::memcpy(row.data(), fixed, static_cast<size_t>(P));
  uint32_t i = 0;
  uint32_t j = 0;  // the lane of record i
  while (i < n_records) {
    // A single coded plane (dense payloads) decodes faster one record at a
    // time: its renormalization branch is mostly predictable, and the
    // bookkeeping of G lanes would cost more than the one symbol it serves.
    if (nc >= 2 && L >= G && n_records - i >= G) {
      // As in EncodeStream: G records in G distinct lanes, side by side.
      std::array<uint32_t, G> lane;
      bool fast = true;
      for (uint32_t g = 0; g < G; ++g) {
        lane[g] = j + g < L ? j + g : j + g - L;
        fast &= end[lane[g]] - ptr[lane[g]] >= record_bytes;
      }
      if (fast) {
        std::array<uint32_t, G> x;
        std::array<const uint8_t*, G> q;
        for (uint32_t g = 0; g < G; ++g) {
          x[g] = state[lane[g]];
          q[g] = ptr[lane[g]];
        }
        for (int c = 0; c < nc; ++c) {
          for (uint32_t g = 0; g < G; ++g) {
            syms[g][index[c]] = internal::DecStep(
                symbol_of[c], entry_of[c], tbits[c], mask[c], &x[g], &q[g]);
          }
        }
        for (uint32_t g = 0; g < G; ++g) {
          state[lane[g]] = x[g];
          ptr[lane[g]] = q[g];
          if (const char* err = emit(i + g, syms[g].data())) {
            return DataLossError(std::string(err) + " at record " +
                                 std::to_string(i + g));
          }
        }
        i += G;
        j = lane[G - 1] + 1 == L ? 0 : lane[G - 1] + 1;
        continue;
      }
    }
    // One record, every word read checked against its lane's end.
    uint32_t x = state[j];
    const uint8_t* q = ptr[j];
    for (int c = 0; c < nc; ++c) {
      const uint32_t slot = x & mask[c];
      const uint32_t e = entry_of[c][slot];
      syms[0][index[c]] = symbol_of[c][slot];
      x = (e & 0xffff) * (x >> tbits[c]) + (e >> 16);
      if (x < kRansLow) {
        if (end[j] - q < 2) {
          return DataLossError("lane " + std::to_string(j) +
                               " ran out of bytes at record " +
                               std::to_string(i));
        }
        x = (x << 16) | (uint32_t{q[0]} | uint32_t{q[1]} << 8);
        q += 2;
      }
    }
    state[j] = x;
    ptr[j] = q;
    if (const char* err = emit(i, syms[0].data())) {
      return DataLossError(std::string(err) + " at record " +
                           std::to_string(i));
    }
    ++i;
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
