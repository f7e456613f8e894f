#include "codec/conditional.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "base/bytes.h"
#include "codec/rans.h"
#include "codec/table.h"

namespace refit::codec {
namespace {

constexpr int C = kConditionalClasses;
constexpr uint32_t kBlock = 16;
constexpr int kValuePlanes = 2;
constexpr int kMaxRecordPlanes = 4 + kValuePlanes;

inline uint16_t Load16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}
inline uint32_t Exponent(uint16_t x) { return (x >> 7) & 0xffu; }
inline uint32_t ClassOf(uint16_t x, uint32_t lo) {
  const uint32_t e = Exponent(x);
  return e <= lo ? 0 : std::min<uint32_t>(e - lo, C - 1);
}
inline uint16_t Zigzag(uint16_t oldv, uint16_t newv) {
  const uint16_t d = static_cast<uint16_t>(newv - oldv);
  return static_cast<uint16_t>((d << 1) ^ (0u - (d >> 15)));
}
inline uint16_t Unzigzag(uint16_t z) {
  return static_cast<uint16_t>((z >> 1) ^ (0u - (z & 1u)));
}

// mask[c] bit j: element i + j (of the block of 16 at `p`) is in class c.
inline void ClassMasks(const uint8_t* p, uint32_t lo, uint32_t* mask) {
#if defined(__SSE2__)
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  const __m128i ff = _mm_set1_epi16(0xff);
  const __m128i ea = _mm_and_si128(_mm_srli_epi16(a, 7), ff);
  const __m128i eb = _mm_and_si128(_mm_srli_epi16(b, 7), ff);
  __m128i cls = _mm_packus_epi16(ea, eb);
  cls = _mm_subs_epu8(cls, _mm_set1_epi8(static_cast<char>(lo)));
  cls = _mm_min_epu8(cls, _mm_set1_epi8(C - 1));
  for (int c = 0; c < C; ++c) {
    mask[c] = static_cast<uint32_t>(
        _mm_movemask_epi8(_mm_cmpeq_epi8(cls, _mm_set1_epi8(static_cast<char>(c)))));
  }
#else
  for (int c = 0; c < C; ++c) mask[c] = 0;
  for (uint32_t j = 0; j < kBlock; ++j) {
    mask[ClassOf(Load16(p + 2 * j), lo)] |= 1u << j;
  }
#endif
}

// The same for a last block of m < 16 elements.
inline void ClassMasksTail(const uint8_t* p, uint32_t m, uint32_t lo,
                           uint32_t* mask) {
  for (int c = 0; c < C; ++c) mask[c] = 0;
  for (uint32_t j = 0; j < m; ++j) mask[ClassOf(Load16(p + 2 * j), lo)] |= 1u << j;
}

// The r-th (from 0) set bit of m.
inline uint32_t SelectBit(uint32_t m, uint32_t r) {
  for (uint32_t i = 0; i < r; ++i) m &= m - 1;
  return static_cast<uint32_t>(std::countr_zero(m));
}

// Fixed-point bits of coding m members of which k changed, as flags:
// k log(m / k) + (m - k) log(m / (m - k)) (kCostOne units, approximate).
uint64_t FlagCost(uint64_t m, uint64_t k) {
  if (k == 0 || k >= m) return 0;
  auto lg = [](uint64_t v) -> uint64_t {  // log2(v) * kCostOne, v >= 1
    const int shift = std::max(0, 64 - std::countl_zero(v) - 15);
    return uint64_t(shift) * kCostOne + Log2Fixed(static_cast<uint32_t>(v >> shift));
  };
  const uint64_t lm = lg(m);
  return k * (lm - lg(k)) + (m - k) * (lm - lg(m - k));
}

// The class window: the lo minimizing the flag cost, from the exponents of
// the changed elements and of every 8th element (scaled).
uint32_t ChooseLo(uint32_t n, const uint8_t* base,
                  std::span<const uint32_t> positions) {
  std::array<uint64_t, 256> members{}, changes{};
  for (uint32_t i = 0; i < n; i += 8) members[Exponent(Load16(base + 2 * size_t{i}))] += 8;
  for (uint32_t p : positions) ++changes[Exponent(Load16(base + 2 * size_t{p}))];
  for (int e = 0; e < 256; ++e) members[e] = std::max(members[e], changes[e]);
  uint32_t best_lo = 0;
  uint64_t best = UINT64_MAX;
  for (uint32_t lo = 0; lo + C <= 256; ++lo) {
    std::array<uint64_t, C> m{}, k{};
    for (uint32_t e = 0; e < 256; ++e) {
      const uint32_t c = e <= lo ? 0 : std::min<uint32_t>(e - lo, C - 1);
      m[c] += members[e];
      k[c] += changes[e];
    }
    uint64_t cost = 0;
    for (int c = 0; c < C; ++c) cost += FlagCost(m[c], k[c]);
    if (cost < best) {
      best = cost;
      best_lo = lo;
    }
  }
  return best_lo;
}

struct Header {
  uint32_t lo = 0;
  std::array<uint32_t, C> k{};      // changes per class
  std::array<uint32_t, C> first{};  // first record of each class
  std::array<int, C> gw{};
  std::array<std::array<Model, 4>, C> gap;
  std::array<Model, kValuePlanes> value;
};

// Per-record list of coded planes: the class's gap planes, then the value
// planes, constant planes left out.
struct ClassPlan {
  int planes = 0;
  std::array<int, kMaxRecordPlanes> index{};  // 0..3 gap byte, 4..5 value byte
};

ClassPlan PlanOf(const Header& h, int c) {
  ClassPlan p;
  for (int b = 0; b < h.gw[c]; ++b) {
    if (h.gap[c][b].coded()) p.index[p.planes++] = b;
  }
  for (int b = 0; b < kValuePlanes; ++b) {
    if (h.value[b].coded()) p.index[p.planes++] = 4 + b;
  }
  return p;
}

}  // namespace

Status EncodeConditional(uint32_t n, const uint8_t* base,
                         std::span<const uint32_t> positions,
                         const uint8_t* xor_values, const EncodeOptions& opt,
                         std::vector<uint8_t>* out) {
  const uint32_t k = static_cast<uint32_t>(positions.size());
  if (n == 0 || n > kMaxChunkElements || k == 0 || k > n) {
    return InvalidArgumentError("conditional payload needs 1 <= k <= n <= 2^28");
  }
  if (base == nullptr || xor_values == nullptr || out == nullptr) {
    return InvalidArgumentError("null base, values or output");
  }
  if (opt.records_per_lane == 0) {
    return InvalidArgumentError("records_per_lane must be >= 1");
  }
  for (uint32_t r = 0; r < k; ++r) {
    if (positions[r] >= n || (r > 0 && positions[r] <= positions[r - 1])) {
      return InvalidArgumentError("position " + std::to_string(positions[r]) +
                                  " of record " + std::to_string(r) +
                                  " is not ascending or not below n");
    }
    if (Load16(xor_values + 2 * size_t{r}) == 0) {
      return InvalidArgumentError("a sparse XOR value is zero");
    }
  }
  Header h;
  h.lo = ChooseLo(n, base, positions);
  // Records in class-major order: each record's rank among its class's
  // members, found block by block from the class masks.
  for (uint32_t p : positions) ++h.k[ClassOf(Load16(base + 2 * size_t{p}), h.lo)];
  for (int c = 1; c < C; ++c) h.first[c] = h.first[c - 1] + h.k[c - 1];
  std::vector<uint32_t> rank(k);   // class-major
  std::vector<uint16_t> zz(k);     // class-major
  std::array<uint32_t, C> fill = h.first;
  std::array<uint32_t, C> members{};
  uint32_t mask[C];
  uint32_t r = 0;
  for (uint32_t i = 0; i < n; i += kBlock) {
    const uint32_t m = std::min(kBlock, n - i);
    if (m == kBlock) {
      ClassMasks(base + 2 * size_t{i}, h.lo, mask);
    } else {
      ClassMasksTail(base + 2 * size_t{i}, m, h.lo, mask);
    }
    for (; r < k && positions[r] < i + m; ++r) {
      const uint32_t bit = positions[r] - i;
      const uint16_t old = Load16(base + 2 * size_t{positions[r]});
      const uint32_t c = ClassOf(old, h.lo);
      const uint32_t at = fill[c]++;
      rank[at] = members[c] + static_cast<uint32_t>(
                                  std::popcount(mask[c] & ((1u << bit) - 1)));
      zz[at] = Zigzag(old, old ^ Load16(xor_values + 2 * size_t{r}));
    }
    for (int c = 0; c < C; ++c) members[c] += static_cast<uint32_t>(std::popcount(mask[c]));
  }
  // Models: per class, gap planes with the geometric context of its members
  // and changes; values shared by every record.
  std::vector<uint8_t> header;
  ByteWriter w(&header);
  w.U8(static_cast<uint8_t>(h.lo));
  for (int c = 0; c < C; ++c) w.Varint(h.k[c]);
  for (int c = 0; c < C; ++c) {
    if (h.k[c] == 0) continue;
    std::array<Histogram, 4> hist{};
    uint32_t max_gap = 0;
    uint32_t next_rank = 0;  // the previous record's rank + 1
    for (uint32_t j = h.first[c]; j < h.first[c] + h.k[c]; ++j) {
      const uint32_t g = rank[j] - next_rank;
      next_rank = rank[j] + 1;
      rank[j] = g;  // from here on: the gap
      max_gap = std::max(max_gap, g);
      for (int b = 0; b < 4; ++b) ++hist[b][(g >> (8 * b)) & 0xff];
    }
    h.gw[c] = GapWidthFor(max_gap);
    w.U8(static_cast<uint8_t>(h.gw[c]));
    for (int b = 0; b < h.gw[c]; ++b) {
      uint64_t cost = 0;
      h.gap[c][b] = ChooseModel(hist[b], GapContext{true, members[c], h.k[c], b}, &cost);
      WriteModel(h.gap[c][b], &header);
    }
  }
  std::array<Histogram, kValuePlanes> vhist{};
  for (uint16_t z : zz) {
    ++vhist[0][z & 0xff];
    ++vhist[1][z >> 8];
  }
  for (int b = 0; b < kValuePlanes; ++b) {
    uint64_t cost = 0;
    h.value[b] = ChooseModel(vhist[b], GapContext{}, &cost);
    WriteModel(h.value[b], &header);
  }
  // Encoder tables per class and plane.
  std::vector<EncPlane> enc(C * 4 + kValuePlanes);
  bool any_coded = false;
  for (int c = 0; c < C; ++c) {
    for (int b = 0; b < h.gw[c]; ++b) {
      if (h.gap[c][b].coded()) {
        BuildEncPlane(h.gap[c][b], &enc[c * 4 + b]);
        any_coded = true;
      }
    }
  }
  for (int b = 0; b < kValuePlanes; ++b) {
    if (h.value[b].coded()) {
      BuildEncPlane(h.value[b], &enc[C * 4 + b]);
      any_coded = true;
    }
  }
  std::array<ClassPlan, C> plan;
  for (int c = 0; c < C; ++c) plan[c] = PlanOf(h, c);
  std::vector<uint8_t> cls(k);
  for (int c = 0; c < C; ++c) {
    std::fill(cls.begin() + h.first[c], cls.begin() + h.first[c] + h.k[c],
              static_cast<uint8_t>(c));
  }
  const uint32_t L = static_cast<uint32_t>(ChooseLanes(k, opt.records_per_lane, any_coded));
  // Each lane's records in reverse, each record's planes in reverse.
  std::vector<std::vector<uint16_t>> words(L);
  std::vector<uint32_t> state(L, kRansLow);
  for (uint32_t j = 0; j < L && any_coded; ++j) {
    if (j >= k) continue;
    uint32_t x = kRansLow;
    auto& wv = words[j];
    for (uint32_t rr = j + (k - 1 - j) / L * L;; rr -= L) {
      const int c = cls[rr];
      const ClassPlan& pl = plan[c];
      for (int q = pl.planes - 1; q >= 0; --q) {
        const int idx = pl.index[q];
        const EncPlane& ep = idx < 4 ? enc[c * 4 + idx] : enc[C * 4 + idx - 4];
        const uint8_t s = idx < 4 ? static_cast<uint8_t>(rank[rr] >> (8 * idx))
                                  : static_cast<uint8_t>(zz[rr] >> (8 * (idx - 4)));
        const EncSymbol& e = ep.sym[s];
        if (x >= e.x_max) {
          wv.push_back(static_cast<uint16_t>(x));
          x >>= 16;
        }
        const uint64_t qq = (uint64_t{x} * e.rcp) >> ep.shift;
        x = x + e.bias + static_cast<uint32_t>(qq) * e.cmpl;
      }
      if (rr < L) break;
    }
    state[j] = x;
  }
  out->insert(out->end(), header.begin(), header.end());
  ByteWriter o(out);
  o.U8(static_cast<uint8_t>(L));
  for (uint32_t j = 0; j + 1 < L; ++j) o.Varint(4 + 2 * words[j].size());
  for (uint32_t j = 0; j < L; ++j) {
    o.U32(state[j]);
    for (size_t q = words[j].size(); q-- > 0;) o.U16(words[j][q]);
  }
  return Status::Ok();
}

namespace {

Status ReadHeader(ByteReader* r, std::span<const uint8_t> payload, uint32_t k,
                  Header* h) {
  h->lo = r->U8();
  uint64_t total = 0;
  for (int c = 0; c < C; ++c) {
    const uint64_t v = r->Varint();
    if (v > k) return DataLossError("class change count above the chunk's");
    h->k[c] = static_cast<uint32_t>(v);
    h->first[c] = static_cast<uint32_t>(total);
    total += v;
  }
  REFIT_RETURN_IF_ERROR(r->status("conditional header"));
  if (total != k) {
    return DataLossError("class change counts sum to " + std::to_string(total) +
                         ", the chunk says " + std::to_string(k));
  }
  (void)payload;
  return Status::Ok();
}

}  // namespace

Status DecodeConditional(std::span<const uint8_t> payload, uint32_t n,
                         const uint8_t* base, uint32_t k, uint32_t* positions,
                         uint8_t* xor_values) {
  if (n == 0 || n > kMaxChunkElements || k == 0 || k > n) {
    return InvalidArgumentError("conditional payload needs 1 <= k <= n <= 2^28");
  }
  ByteReader r(payload);
  Header h;
  REFIT_RETURN_IF_ERROR(ReadHeader(&r, payload, k, &h));
  // Members per class: one pass over the base (the decoder needs them for
  // the gap models before it decodes a symbol).
  std::array<uint32_t, C> members{};
  {
    uint32_t mask[C];
    for (uint32_t i = 0; i < n; i += kBlock) {
      const uint32_t m = std::min(kBlock, n - i);
      if (m == kBlock) {
        ClassMasks(base + 2 * size_t{i}, h.lo, mask);
      } else {
        ClassMasksTail(base + 2 * size_t{i}, m, h.lo, mask);
      }
      for (int c = 0; c < C; ++c) members[c] += static_cast<uint32_t>(std::popcount(mask[c]));
    }
  }
  size_t off = static_cast<size_t>(r.position() - payload.data());
  for (int c = 0; c < C; ++c) {
    if (h.k[c] == 0) continue;
    if (h.k[c] > members[c]) {
      return DataLossError("class " + std::to_string(c) + " has " +
                           std::to_string(h.k[c]) + " changes but " +
                           std::to_string(members[c]) + " members");
    }
    if (off >= payload.size()) return DataLossError("conditional models truncated");
    h.gw[c] = payload[off++];
    if (h.gw[c] < 1 || h.gw[c] > 4) return DataLossError("gap width outside 1..4");
    for (int b = 0; b < h.gw[c]; ++b) {
      size_t used = 0;
      Status s = ReadModel(payload.subspan(off), GapContext{true, members[c], h.k[c], b},
                           &h.gap[c][b], &used);
      if (!s.ok()) return s.WithContext("class " + std::to_string(c) + " gap plane");
      off += used;
    }
  }
  for (int b = 0; b < kValuePlanes; ++b) {
    size_t used = 0;
    Status s = ReadModel(payload.subspan(off), GapContext{}, &h.value[b], &used);
    if (!s.ok()) return s.WithContext("value plane");
    off += used;
  }
  std::vector<DecPlane> dec(C * 4 + kValuePlanes);
  for (int c = 0; c < C; ++c) {
    for (int b = 0; b < h.gw[c]; ++b) {
      if (h.gap[c][b].coded()) BuildDecPlane(h.gap[c][b], &dec[c * 4 + b]);
    }
  }
  for (int b = 0; b < kValuePlanes; ++b) {
    if (h.value[b].coded()) BuildDecPlane(h.value[b], &dec[C * 4 + b]);
  }
  std::array<ClassPlan, C> plan;
  for (int c = 0; c < C; ++c) plan[c] = PlanOf(h, c);
  // Lanes.
  ByteReader sr(payload.subspan(off));
  const uint32_t L = sr.U8();
  if (!sr.ok() || L == 0) return DataLossError("conditional stream has no lanes");
  std::vector<uint64_t> size(L);
  for (uint32_t j = 0; j + 1 < L; ++j) size[j] = sr.Varint();
  REFIT_RETURN_IF_ERROR(sr.status("lane sizes"));
  std::vector<const uint8_t*> ptr(L), end(L);
  std::vector<uint32_t> state(L);
  const uint8_t* p = sr.position();
  uint64_t left = sr.remaining();
  for (uint32_t j = 0; j < L; ++j) {
    if (j + 1 == L) size[j] = left;
    if (size[j] > left || size[j] < 4) {
      return DataLossError("lane " + std::to_string(j) + " size is below 4 or past the end");
    }
    state[j] = LoadLE32(p);
    if (state[j] < kRansLow) return DataLossError("lane starts below the rANS range");
    ptr[j] = p + 4;
    end[j] = p + size[j];
    p += size[j];
    left -= size[j];
  }
  // Records, class-major: member ranks and value differences.
  std::vector<uint32_t> rank(k);
  std::vector<uint16_t> zz(k);
  {
    int c = 0;
    uint32_t j = 0;
    uint64_t next_rank = 0;
    for (uint32_t rr = 0; rr < k; ++rr) {
      while (rr >= h.first[c] + h.k[c]) ++c;
      if (rr == h.first[c]) next_rank = 0;
      const ClassPlan& pl = plan[c];
      uint32_t x = state[j];
      const uint8_t* q = ptr[j];
      std::array<uint8_t, 6> sym{};
      for (int b = 0; b < h.gw[c]; ++b) {
        if (!h.gap[c][b].coded()) sym[b] = h.gap[c][b].symbol;
      }
      for (int b = 0; b < kValuePlanes; ++b) {
        if (!h.value[b].coded()) sym[4 + b] = h.value[b].symbol;
      }
      for (int t = 0; t < pl.planes; ++t) {
        const int idx = pl.index[t];
        const DecPlane& dp = idx < 4 ? dec[c * 4 + idx] : dec[C * 4 + idx - 4];
        const uint32_t slot = x & dp.mask;
        const uint32_t e = dp.slot_entry[slot];
        sym[idx] = dp.slot_symbol[slot];
        x = (e & 0xffff) * (x >> dp.t) + (e >> 16);
        if (x < kRansLow) {
          if (end[j] - q < 2) {
            return DataLossError("lane " + std::to_string(j) + " ran out of bytes");
          }
          x = (x << 16) | (uint32_t{q[0]} | uint32_t{q[1]} << 8);
          q += 2;
        }
      }
      state[j] = x;
      ptr[j] = q;
      if (++j == L) j = 0;
      const uint64_t gap = uint64_t{sym[0]} | uint64_t{sym[1]} << 8 |
                           uint64_t{sym[2]} << 16 | uint64_t{sym[3]} << 24;
      next_rank += gap;
      if (next_rank >= members[c]) {
        return DataLossError("record " + std::to_string(rr) +
                             " lies past its class's last member");
      }
      rank[rr] = static_cast<uint32_t>(next_rank);
      ++next_rank;
      zz[rr] = static_cast<uint16_t>(sym[4] | sym[5] << 8);
      if (zz[rr] == 0) return DataLossError("a value difference is zero");
    }
  }
  for (uint32_t j = 0; j < L; ++j) {
    if (ptr[j] != end[j] || state[j] != kRansLow) {
      return DataLossError("lane " + std::to_string(j) +
                           (ptr[j] != end[j] ? " has leftover bytes"
                                             : " ends in a wrong state"));
    }
  }
  // Positions: one pass over the base's class masks, each class's next
  // record found by its rank; hits within a block are sorted by position.
  std::array<uint32_t, C> next = h.first;  // each class's next record
  std::array<uint32_t, C> seen{};          // members before the block
  uint32_t out_r = 0;
  uint32_t mask[C];
  for (uint32_t i = 0; i < n && out_r < k; i += kBlock) {
    const uint32_t m = std::min(kBlock, n - i);
    if (m == kBlock) {
      ClassMasks(base + 2 * size_t{i}, h.lo, mask);
    } else {
      ClassMasksTail(base + 2 * size_t{i}, m, h.lo, mask);
    }
    uint32_t hits = 0;  // bit j: element i + j changed
    std::array<uint32_t, kBlock> rec;
    for (int c = 0; c < C; ++c) {
      const uint32_t pc = static_cast<uint32_t>(std::popcount(mask[c]));
      const uint32_t lim = h.first[c] + h.k[c];
      while (next[c] < lim && rank[next[c]] < seen[c] + pc) {
        const uint32_t bit = SelectBit(mask[c], rank[next[c]] - seen[c]);
        hits |= 1u << bit;
        rec[bit] = next[c]++;
      }
      seen[c] += pc;
    }
    while (hits) {
      const uint32_t bit = static_cast<uint32_t>(std::countr_zero(hits));
      hits &= hits - 1;
      const uint32_t pos = i + bit;
      const uint16_t old = Load16(base + 2 * size_t{pos});
      const uint16_t nw = static_cast<uint16_t>(old + Unzigzag(zz[rec[bit]]));
      const uint16_t x = static_cast<uint16_t>(old ^ nw);
      positions[out_r] = pos;
      xor_values[2 * size_t{out_r}] = static_cast<uint8_t>(x);
      xor_values[2 * size_t{out_r} + 1] = static_cast<uint8_t>(x >> 8);
      ++out_r;
    }
  }
  if (out_r != k) return DataLossError("conditional records do not all land in the range");
  return Status::Ok();
}

Result<ConditionalInfo> DescribeConditional(std::span<const uint8_t> payload) {
  ByteReader r(payload);
  ConditionalInfo info;
  info.lo = r.U8();
  for (int c = 0; c < C; ++c) info.changes[c] = static_cast<uint32_t>(r.Varint());
  REFIT_RETURN_IF_ERROR(r.status("conditional header"));
  return info;
}

}  // namespace refit::codec
