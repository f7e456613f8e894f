#include "codec/table.h"

#include <algorithm>
#include <bit>
#include <string>

#include "codec/bitio.h"

namespace refit::codec {
namespace {

constexpr uint32_t kMaxFreq = uint32_t{1} << kMaxPrecision;
// Weights stay below 2^48 so that W * 2^15 and the total fit in 64 bits,
// which makes step 1 of section 5.1 exact without 128-bit arithmetic.
constexpr uint64_t kMaxWeight = uint64_t{1} << 48;

// Bits needed to give every one of `count` symbols a distinct slot.
int CeilLog2(uint32_t count) {
  return count <= 1 ? 0 : 32 - std::countl_zero(count - 1);
}

// The precision-independent part of normalization: the present symbols and
// floor(W[s] * 2^15 / T). Because floor(floor(a) / 2^j) == floor(a / 2^j),
// step 1 of section 5.1 at any t <= 15 is max(1, base[s] >> (15 - t)), so
// one division per symbol serves all precisions.
struct Prepared {
  int m = 0;
  std::array<uint8_t, 256> symbols{};
  std::array<uint64_t, 256> base{};
};

bool Prepare(const Histogram& w, Prepared* p) {
  uint64_t total = 0;  // < 2^56: 256 weights below 2^48
  p->m = 0;
  for (int s = 0; s < 256; ++s) {
    if (w[s] >= kMaxWeight) return false;
    if (w[s] != 0) {
      p->symbols[p->m++] = static_cast<uint8_t>(s);
      total += w[s];
    }
  }
  if (p->m == 0) return false;
  for (int i = 0; i < p->m; ++i) {
    const int s = p->symbols[i];
    p->base[s] = (w[s] << kMaxPrecision) / total;
  }
  return true;
}

// Section 5.1 at precision t from prepared weights.
bool NormalizePrepared(const Prepared& p, int t, Freqs* f) {
  const uint32_t total = uint32_t{1} << t;
  if (static_cast<uint32_t>(p.m) > total) return false;
  f->fill(0);
  int64_t sum = 0;
  int top = p.symbols[0];
  for (int i = 0; i < p.m; ++i) {
    const int s = p.symbols[i];
    const uint64_t v = std::max<uint64_t>(1, p.base[s] >> (kMaxPrecision - t));
    (*f)[s] = static_cast<uint16_t>(v);
    sum += static_cast<int64_t>(v);
    if ((*f)[s] > (*f)[top]) top = s;  // strict: lowest symbol wins ties
  }
  int64_t d = static_cast<int64_t>(total) - sum;
  if (d > 0) {
    (*f)[top] = static_cast<uint16_t>((*f)[top] + d);
    return true;
  }
  if (d == 0) return true;
  // d < 0: take one unit at a time from the largest frequency, lowest
  // symbol on ties. A max-heap keyed (f, 255 - s) replays exactly that
  // order in O(|d| log m). Since m <= 2^t the largest is >= 2 while the
  // sum exceeds 2^t, so no frequency reaches zero.
  std::array<uint32_t, 256> heap;
  for (int i = 0; i < p.m; ++i) {
    const int s = p.symbols[i];
    heap[i] = (uint32_t{(*f)[s]} << 8) | static_cast<uint32_t>(255 - s);
  }
  std::make_heap(heap.begin(), heap.begin() + p.m);
  for (; d < 0; ++d) {
    std::pop_heap(heap.begin(), heap.begin() + p.m);
    heap[p.m - 1] -= 1u << 8;
    std::push_heap(heap.begin(), heap.begin() + p.m);
  }
  for (int i = 0; i < p.m; ++i) {
    (*f)[255 - (heap[i] & 0xff)] = static_cast<uint16_t>(heap[i] >> 8);
  }
  return true;
}

// sum over present symbols of count[s] * (t - log2 f[s]), fixed point.
uint64_t CodedCost(const Histogram& count, const Prepared& present, int t,
                   const Freqs& f) {
  uint64_t cost = 0;
  const uint64_t tq = static_cast<uint64_t>(t) << kCostFracBits;
  for (int i = 0; i < present.m; ++i) {
    const int s = present.symbols[i];
    cost += count[s] * (tq - Log2Fixed(f[s]));
  }
  return cost;
}

std::vector<uint32_t> BuildLog2Table() {
  std::vector<uint32_t> table(kMaxFreq + 1, 0);
  for (uint32_t f = 1; f <= kMaxFreq; ++f) {
    const int e = 31 - std::countl_zero(f);
    uint64_t y = uint64_t{f} << (31 - e);  // f / 2^e in Q31, in [1, 2)
    uint32_t frac = 0;
    for (int i = 0; i < kCostFracBits; ++i) {
      y = (y * y) >> 31;
      frac <<= 1;
      if (y >= (uint64_t{1} << 32)) {
        y >>= 1;
        frac |= 1;
      }
    }
    table[f] = (static_cast<uint32_t>(e) << kCostFracBits) | frac;
  }
  return table;
}

}  // namespace

uint32_t Log2Fixed(uint32_t f) {
  static const std::vector<uint32_t> table = BuildLog2Table();
  return table[f];
}

bool Normalize(const Histogram& weights, int t, Freqs* f) {
  if (t < 1 || t > kMaxPrecision) return false;
  Prepared p;
  if (!Prepare(weights, &p)) return false;
  return NormalizePrepared(p, t, f);
}

Histogram GeometricWeights(uint32_t n, uint32_t k, int plane,
                           uint8_t max_symbol) {
  const uint64_t kOne32 = uint64_t{1} << 32;
  uint64_t q = 0;
  if (n > 0 && k <= n) q = (static_cast<uint64_t>(n - k) << 32) / n;
  q = std::clamp<uint64_t>(q, 1, kOne32 - 1);
  for (int b = 0; b < plane; ++b) {
    for (int i = 0; i < 8; ++i) q = (q * q) >> 32;
  }
  Histogram w{};
  uint64_t x = uint64_t{1} << 31;
  for (int s = 0; s <= max_symbol; ++s) {
    w[s] = std::max<uint64_t>(x, 1);
    x = (x * q) >> 32;
  }
  return w;
}

uint64_t TableBits(const Freqs& f) {
  uint64_t bits = 4 + 8 + 8;
  int prev = -1;
  int last = -1;
  for (int s = 0; s < 256; ++s) {
    if (f[s] == 0) continue;
    if (prev >= 0) bits += GammaBits(static_cast<uint32_t>(s - prev));
    prev = s;
    last = s;
  }
  for (int s = 0; s < last; ++s) {
    if (f[s] != 0) bits += GammaBits(f[s]);
  }
  return bits;
}

void WriteTable(int t, const Freqs& f, std::vector<uint8_t>* out) {
  std::array<uint8_t, 256> symbols;
  int m = 0;
  for (int s = 0; s < 256; ++s) {
    if (f[s] != 0) symbols[m++] = static_cast<uint8_t>(s);
  }
  BitWriter bw(out);
  bw.Put(static_cast<uint32_t>(t - 1), 4);
  bw.Put(static_cast<uint32_t>(m - 1), 8);
  bw.Put(symbols[0], 8);
  for (int i = 1; i < m; ++i) bw.Gamma(symbols[i] - symbols[i - 1]);
  for (int i = 0; i + 1 < m; ++i) bw.Gamma(f[symbols[i]]);
}

Status ReadTable(std::span<const uint8_t> in, int* t, Freqs* f,
                 size_t* consumed) {
  BitReader br(in);
  const int tt = static_cast<int>(br.Get(4)) + 1;
  const uint32_t m = br.Get(8) + 1;
  uint32_t s = br.Get(8);
  if (!br.ok()) return DataLossError("frequency table truncated");
  if (tt > kMaxPrecision) return DataLossError("table precision 16 is invalid");
  const uint32_t total = uint32_t{1} << tt;
  if (m > total) {
    return DataLossError("table has " + std::to_string(m) +
                         " symbols, more than 2^" + std::to_string(tt));
  }
  std::array<uint8_t, 256> symbols;
  symbols[0] = static_cast<uint8_t>(s);
  for (uint32_t i = 1; i < m; ++i) {
    s += br.Gamma(8);
    if (!br.ok() || s > 255) {
      return DataLossError("table symbol gap corrupt or past 255");
    }
    symbols[i] = static_cast<uint8_t>(s);
  }
  f->fill(0);
  uint32_t sum = 0;
  for (uint32_t i = 0; i + 1 < m; ++i) {
    const uint32_t v = br.Gamma(kMaxPrecision);
    if (!br.ok() || v >= total - sum) {
      return DataLossError("table frequency corrupt or overflowing 2^t");
    }
    (*f)[symbols[i]] = static_cast<uint16_t>(v);
    sum += v;
  }
  (*f)[symbols[m - 1]] = static_cast<uint16_t>(total - sum);
  *t = tt;
  *consumed = br.bytes_used();
  return Status::Ok();
}

Model ChooseModel(const Histogram& hist, const GapContext& gap,
                  uint64_t* cost) {
  Prepared present;
  Prepare(hist, &present);  // the caller guarantees a symbol is present
  uint64_t n = 0;
  for (int i = 0; i < present.m; ++i) n += hist[present.symbols[i]];

  Model best;
  uint64_t best_cost = ~uint64_t{0};
  auto consider = [&](const Model& m, uint64_t c) {
    if (c < best_cost) {
      best = m;
      best_cost = c;
    }
  };

  if (present.m == 1) {
    Model m;
    m.mode = ModelMode::kConstant;
    m.symbol = present.symbols[0];
    consider(m, 16 * kCostOne);
  }
  {
    Model m;
    m.mode = ModelMode::kUniform;
    m.t = 8;
    m.f.fill(1);
    consider(m, (8 + 8 * n) * kCostOne);
  }
  {
    // Symbol-gap bits do not depend on t; frequency bits do.
    uint64_t fixed_bits = 4 + 8 + 8;
    for (int i = 1; i < present.m; ++i) {
      fixed_bits += GammaBits(
          static_cast<uint32_t>(present.symbols[i] - present.symbols[i - 1]));
    }
    Model m;
    m.mode = ModelMode::kTable;
    for (int t = std::max(1, CeilLog2(static_cast<uint32_t>(present.m)));
         t <= kMaxPrecision; ++t) {
      if (!NormalizePrepared(present, t, &m.f)) continue;
      uint64_t bits = fixed_bits;
      for (int i = 0; i + 1 < present.m; ++i) {
        bits += GammaBits(m.f[present.symbols[i]]);
      }
      const uint64_t desc = 8 + (bits + 7) / 8 * 8;
      m.t = t;
      consider(m, desc * kCostOne + CodedCost(hist, present, t, m.f));
    }
  }
  if (gap.is_gap) {
    Model m;
    m.mode = ModelMode::kGeometric;
    m.max_symbol = present.symbols[present.m - 1];
    Prepared geo;
    Prepare(GeometricWeights(gap.n, gap.k, gap.plane, m.max_symbol), &geo);
    for (int t = std::max(1, CeilLog2(uint32_t{m.max_symbol} + 1));
         t <= kMaxPrecision; ++t) {
      if (!NormalizePrepared(geo, t, &m.f)) continue;
      m.t = t;
      consider(m, 24 * kCostOne + CodedCost(hist, present, t, m.f));
    }
  }
  *cost = best_cost;
  return best;
}

void WriteModel(const Model& m, std::vector<uint8_t>* out) {
  out->push_back(static_cast<uint8_t>(m.mode));
  switch (m.mode) {
    case ModelMode::kConstant:
      out->push_back(m.symbol);
      break;
    case ModelMode::kUniform:
      break;
    case ModelMode::kTable:
      WriteTable(m.t, m.f, out);
      break;
    case ModelMode::kGeometric:
      out->push_back(static_cast<uint8_t>(m.t));
      out->push_back(m.max_symbol);
      break;
  }
}

Status ReadModel(std::span<const uint8_t> in, const GapContext& gap, Model* m,
                 size_t* consumed) {
  if (in.empty()) return DataLossError("model truncated");
  *m = Model();
  switch (in[0]) {
    case 0:
      if (in.size() < 2) return DataLossError("constant model truncated");
      m->mode = ModelMode::kConstant;
      m->symbol = in[1];
      *consumed = 2;
      return Status::Ok();
    case 1:
      m->mode = ModelMode::kUniform;
      m->t = 8;
      m->f.fill(1);
      *consumed = 1;
      return Status::Ok();
    case 2: {
      m->mode = ModelMode::kTable;
      size_t used = 0;
      REFIT_RETURN_IF_ERROR(ReadTable(in.subspan(1), &m->t, &m->f, &used));
      *consumed = 1 + used;
      return Status::Ok();
    }
    case 3: {
      if (!gap.is_gap) {
        return DataLossError("geometric model outside a sparse gap plane");
      }
      if (in.size() < 3) return DataLossError("geometric model truncated");
      m->mode = ModelMode::kGeometric;
      m->t = in[1];
      m->max_symbol = in[2];
      if (m->t < 1 || m->t > kMaxPrecision ||
          uint32_t{m->max_symbol} + 1 > (uint32_t{1} << m->t)) {
        return DataLossError("geometric model precision " +
                             std::to_string(m->t) + " invalid for max symbol " +
                             std::to_string(m->max_symbol));
      }
      if (!Normalize(GeometricWeights(gap.n, gap.k, gap.plane, m->max_symbol),
                     m->t, &m->f)) {
        return DataLossError("geometric model cannot be normalized");
      }
      *consumed = 3;
      return Status::Ok();
    }
    default:
      return DataLossError("unknown model mode " + std::to_string(in[0]));
  }
}

const char* ModelName(ModelMode mode) {
  switch (mode) {
    case ModelMode::kConstant:
      return "constant";
    case ModelMode::kUniform:
      return "uniform";
    case ModelMode::kTable:
      return "table";
    case ModelMode::kGeometric:
      return "geometric";
  }
  return "unknown";
}

}  // namespace refit::codec
