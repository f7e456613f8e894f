#include "codec/conditional.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <memory>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "base/bytes.h"
#include "codec/conditional_kernels.h"
#include "codec/rans.h"
#include "codec/table.h"

namespace refit::codec {
namespace {

constexpr int C = kConditionalClasses;
// Elements per block: a block's class masks are 64-bit words.
constexpr uint32_t kBlock = 64;
// Blocks per span of the encoder's passes: 64 Ki elements, whose classes
// and counts (56 bytes per block) stay in the first-level caches.
constexpr uint32_t kSpanBlocks = 1024;
constexpr int kValuePlanes = 2;
constexpr int kMaxRecordPlanes = 4 + kValuePlanes;
// Records coded or decoded side by side in as many lanes (rans.h).
constexpr uint32_t G = internal::kRansGroup;

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

using internal::ConditionalBlock;

// Bit j set: element j of the block is a member of class c. `valid`: the
// block's elements (all ones for a full block); the planes read elements
// past a block's end as class 0.
inline uint64_t MaskOf(const ConditionalBlock& b, uint32_t c, uint64_t valid) {
  const uint64_t f0 = (c & 1) ? 0 : ~uint64_t{0};
  const uint64_t f1 = (c & 2) ? 0 : ~uint64_t{0};
  const uint64_t f2 = (c & 4) ? 0 : ~uint64_t{0};
  return (b.bit[0] ^ f0) & (b.bit[1] ^ f1) & (b.bit[2] ^ f2) & valid;
}
inline uint32_t ClassAt(const ConditionalBlock& b, uint32_t j) {
  return static_cast<uint32_t>(((b.bit[0] >> j) & 1) | ((b.bit[1] >> j) & 1) << 1 |
                               ((b.bit[2] >> j) & 1) << 2);
}

inline uint64_t ValidMask(uint32_t m) {
  return m == kBlock ? ~uint64_t{0} : (uint64_t{1} << m) - 1;
}

// The classes of the m <= 64 elements at p.
inline ConditionalBlock ClassifyTail(const uint8_t* p, uint32_t m, uint32_t lo) {
  ConditionalBlock b{};
  for (uint32_t j = 0; j < m; ++j) {
    const uint64_t c = ClassOf(Load16(p + 2 * j), lo);
    b.bit[0] |= (c & 1) << j;
    b.bit[1] |= ((c >> 1) & 1) << j;
    b.bit[2] |= (c >> 2) << j;
  }
  return b;
}

// Members per class from seven popcounts per block (inclusion-exclusion
// over the three planes) rather than eight masks.
struct ClassCounter {
  uint64_t n = 0, a = 0, b = 0, c = 0, ab = 0, ac = 0, bc = 0, abc = 0;
  void Add(const ConditionalBlock& k, uint32_t m) {
    const uint64_t x = k.bit[0], y = k.bit[1], z = k.bit[2];
    n += m;
    a += std::popcount(x);
    b += std::popcount(y);
    c += std::popcount(z);
    ab += std::popcount(x & y);
    ac += std::popcount(x & z);
    bc += std::popcount(y & z);
    abc += std::popcount(x & y & z);
  }
  std::array<uint32_t, C> Counts() const {
    std::array<uint64_t, C> m;
    m[7] = abc;
    m[3] = ab - abc;
    m[5] = ac - abc;
    m[6] = bc - abc;
    m[1] = a - ab - ac + abc;
    m[2] = b - ab - bc + abc;
    m[4] = c - ac - bc + abc;
    m[0] = n - (m[1] + m[2] + m[3] + m[4] + m[5] + m[6] + m[7]);
    std::array<uint32_t, C> out;
    for (int i = 0; i < C; ++i) out[i] = static_cast<uint32_t>(m[i]);
    return out;
  }
};

// For each byte value v and r < popcount(v): the position of v's r-th set
// bit.
constexpr std::array<std::array<uint8_t, 8>, 256> MakeSelectTable() {
  std::array<std::array<uint8_t, 8>, 256> t{};
  for (int v = 0; v < 256; ++v) {
    int r = 0;
    for (int j = 0; j < 8; ++j) {
      if (v >> j & 1) t[v][r++] = static_cast<uint8_t>(j);
    }
  }
  return t;
}
constexpr std::array<std::array<uint8_t, 8>, 256> kSelectInByte = MakeSelectTable();

// The position of the r-th (from 0) set bit of m; r < popcount(m). Byte
// popcounts and their prefix sums in one word find the byte (no BMI2 in the
// baseline instruction set), a table the bit within it.
inline uint32_t Select64(uint64_t m, uint32_t r) {
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  uint64_t s = m - ((m >> 1) & 0x5555555555555555ull);
  s = (s & 0x3333333333333333ull) + ((s >> 2) & 0x3333333333333333ull);
  s = (s + (s >> 4)) & 0x0f0f0f0f0f0f0f0full;
  const uint64_t prefix = s * kOnes;  // byte b: set bits in bytes 0..b (<= 64)
  // Top bit of byte b set where prefix_b >= r + 1 (no borrows: 128 + prefix_b > r + 1).
  const uint64_t ge =
      ((prefix | 0x8080808080808080ull) - uint64_t{r + 1} * kOnes) & 0x8080808080808080ull;
  const uint32_t byte = static_cast<uint32_t>(std::countr_zero(ge)) >> 3;
  const uint32_t before =
      byte == 0 ? 0 : static_cast<uint32_t>(prefix >> (8 * byte - 8)) & 0xff;
  return 8 * byte + kSelectInByte[(m >> (8 * byte)) & 0xff][r - before];
}

}  // namespace

namespace internal {

// 16 class bytes per step: exponents (bits 7..14 of each element) packed to
// bytes, less lo saturating at 0, clamped to 7; each class bit is moved to
// its byte's top for one movemask per plane.
void ClassifyBaseline(const uint8_t* base, uint32_t blocks, uint32_t lo,
                      ConditionalBlock* out) {
#if defined(__SSE2__)
  const __m128i ff = _mm_set1_epi16(0xff);
  const __m128i lov = _mm_set1_epi8(static_cast<char>(lo));
  const __m128i top = _mm_set1_epi8(C - 1);
  for (uint32_t b = 0; b < blocks; ++b) {
    const uint8_t* p = base + 2 * size_t{b} * kBlock;
    uint64_t b0 = 0, b1 = 0, b2 = 0;
    for (int q = 0; q < 4; ++q) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 * q));
      const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 * q + 16));
      __m128i cls = _mm_packus_epi16(_mm_and_si128(_mm_srli_epi16(x, 7), ff),
                                     _mm_and_si128(_mm_srli_epi16(y, 7), ff));
      cls = _mm_min_epu8(_mm_subs_epu8(cls, lov), top);
      const int s = 16 * q;
      b0 |= uint64_t{static_cast<uint16_t>(_mm_movemask_epi8(_mm_slli_epi16(cls, 7)))} << s;
      b1 |= uint64_t{static_cast<uint16_t>(_mm_movemask_epi8(_mm_slli_epi16(cls, 6)))} << s;
      b2 |= uint64_t{static_cast<uint16_t>(_mm_movemask_epi8(_mm_slli_epi16(cls, 5)))} << s;
    }
    out[b].bit[0] = b0;
    out[b].bit[1] = b1;
    out[b].bit[2] = b2;
  }
#else
  for (uint32_t b = 0; b < blocks; ++b) {
    out[b] = ClassifyTail(base + 2 * size_t{b} * kBlock, kBlock, lo);
  }
#endif
}

// Without PDEP: each changed member found by its rank in the block.
void PlaceBaseline(const ConditionalBlock* classes, uint32_t blocks,
                   uint64_t valid_last, const uint64_t* changed, uint64_t off[8],
                   uint64_t* hits) {
  for (uint32_t b = 0; b < blocks; ++b) {
    const uint64_t valid = b + 1 == blocks ? valid_last : ~uint64_t{0};
    uint64_t h = 0;
    for (uint32_t c = 0; c < C; ++c) {
      const uint64_t m = MaskOf(classes[b], c, valid);
      const uint32_t pc = static_cast<uint32_t>(std::popcount(m));
      const uint64_t w = off[c] >> 6;
      const uint32_t s = static_cast<uint32_t>(off[c] & 63);
      uint64_t bits = (changed[w] >> s) | ((changed[w + 1] << 1) << (63 - s));
      bits &= ((uint64_t{1} << (pc & 63)) - 1) | (0 - uint64_t{pc >> 6});
      while (bits) {
        h |= uint64_t{1} << Select64(m, static_cast<uint32_t>(std::countr_zero(bits)));
        bits &= bits - 1;
      }
      off[c] += pc;
    }
    hits[b] = h;
  }
}

}  // namespace internal

namespace {

// The kernels this CPU runs (conditional_kernels.h), picked on first use.
struct Kernels {
  internal::ClassifyFn classify;
  internal::PlaceFn place;
};

Kernels PickKernels() {
  Kernels k{&internal::ClassifyBaseline, &internal::PlaceBaseline};
#if defined(REFIT_CODEC_X86)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) k.classify = &internal::ClassifyAvx2;
  // PDEP is microcoded (hundreds of cycles) on AMD before Zen 3.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
      !__builtin_cpu_is("amdfam15h") && !__builtin_cpu_is("znver1") &&
      !__builtin_cpu_is("znver2")) {
    k.place = &internal::PlaceBmi2;
  }
#endif
  return k;
}

const Kernels& GetKernels() {
  static const Kernels kernels = PickKernels();
  return kernels;
}

// The classes of blocks [b0, b0 + count) of the n elements at base.
void ClassifyBlocks(const uint8_t* base, uint32_t n, uint32_t lo, uint32_t b0,
                    uint32_t count, ConditionalBlock* out) {
  const uint32_t full_blocks = n / kBlock;
  const uint32_t full = b0 >= full_blocks ? 0 : std::min(count, full_blocks - b0);
  if (full > 0) GetKernels().classify(base + 2 * size_t{b0} * kBlock, full, lo, out);
  if (full < count) {
    const uint32_t i = (b0 + full) * kBlock;
    out[full] = ClassifyTail(base + 2 * size_t{i}, n - i, lo);
  }
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

// Exponent counts, in interleaved tables: the exponents of a tensor crowd
// into a few values, and one table would chain every increment through
// memory.
using ExponentCounts = std::array<std::array<uint32_t, 256>, 4>;

// Counts the exponents of every 8th element of [i, end) (i a multiple of 8).
inline void SampleExponents(const uint8_t* base, uint32_t i, uint32_t end,
                            ExponentCounts* sampled) {
  for (; i + 24 < end; i += 32) {
    ++(*sampled)[0][Exponent(Load16(base + 2 * size_t{i}))];
    ++(*sampled)[1][Exponent(Load16(base + 2 * size_t{i + 8}))];
    ++(*sampled)[2][Exponent(Load16(base + 2 * size_t{i + 16}))];
    ++(*sampled)[3][Exponent(Load16(base + 2 * size_t{i + 24}))];
  }
  for (; i < end; i += 8) ++(*sampled)[0][Exponent(Load16(base + 2 * size_t{i}))];
}

// The class window: the lo minimizing the flag cost, from the exponents of
// every 8th element (`sampled`, scaled by 8) and of the changed elements
// (`changes`, per exponent). Sets k[c] to the changes per class under that
// window.
uint32_t ChooseLo(const ExponentCounts& sampled, const std::array<uint64_t, 256>& changes,
                  std::array<uint32_t, C>* k) {
  // Prefix sums over exponents: pm[e], pk[e] sum exponents below e.
  std::array<uint64_t, 257> pm{}, pk{};
  for (int e = 0; e < 256; ++e) {
    uint64_t members = 8 * (uint64_t{sampled[0][e]} + sampled[1][e] + sampled[2][e] +
                            sampled[3][e]);
    members = std::max(members, changes[e]);
    pm[e + 1] = pm[e] + members;
    pk[e + 1] = pk[e] + changes[e];
  }
  uint32_t best_lo = 0;
  uint64_t best = UINT64_MAX;
  for (uint32_t lo = 0; lo + C <= 256; ++lo) {
    // Class 0: exponents <= lo; 1..6: lo + c; 7: >= lo + 7.
    uint64_t cost = FlagCost(pm[lo + 1], pk[lo + 1]);
    for (uint32_t c = 1; c + 1 < C; ++c) {
      cost += FlagCost(pm[lo + c + 1] - pm[lo + c], pk[lo + c + 1] - pk[lo + c]);
    }
    cost += FlagCost(pm[256] - pm[lo + C - 1], pk[256] - pk[lo + C - 1]);
    if (cost < best) {
      best = cost;
      best_lo = lo;
    }
  }
  const uint32_t lo = best_lo;
  (*k)[0] = static_cast<uint32_t>(pk[lo + 1]);
  for (uint32_t c = 1; c + 1 < C; ++c) {
    (*k)[c] = static_cast<uint32_t>(pk[lo + c + 1] - pk[lo + c]);
  }
  (*k)[C - 1] = static_cast<uint32_t>(pk[256] - pk[lo + C - 1]);
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

// A record's symbols as one word: gap bytes 0..3 in bits 0..31, difference
// bytes 0..1 in bits 32..47, so coded plane idx (0..3 gap byte, 4..5
// difference byte) is the byte at 8 * idx.
inline uint64_t RecordWord(uint32_t gap, uint16_t zz) {
  return gap | uint64_t{zz} << 32;
}

// A class's coded planes in record order: its gap planes, then the
// difference planes, constant planes left out.
struct ClassPlan {
  int planes = 0;
  std::array<int, kMaxRecordPlanes> index{};  // 0..3 gap byte, 4..5 value byte
  // The constant planes' symbols, in place in a record word.
  uint64_t fixed = 0;
};

ClassPlan PlanOf(const Header& h, int c) {
  ClassPlan p;
  for (int b = 0; b < h.gw[c]; ++b) {
    if (h.gap[c][b].coded()) {
      p.index[p.planes++] = b;
    } else {
      p.fixed |= uint64_t{h.gap[c][b].symbol} << (8 * b);
    }
  }
  for (int b = 0; b < kValuePlanes; ++b) {
    if (h.value[b].coded()) {
      p.index[p.planes++] = 4 + b;
    } else {
      p.fixed |= uint64_t{h.value[b].symbol} << (8 * (4 + b));
    }
  }
  return p;
}

// A decoder's slot lookup (section 5.3) in one table: symbol | (slot -
// c[s]) << 8 per slot, the frequencies beside it (a small table), so a
// step reads one entry of the large table where DecPlane reads two.
struct SlotTable {
  uint32_t t = 0;
  uint32_t mask = 0;
  std::vector<uint32_t> slot;
  std::array<uint32_t, 256> freq{};
};

void BuildSlotTable(const Model& m, SlotTable* p) {
  p->t = static_cast<uint32_t>(m.t);
  p->mask = (uint32_t{1} << m.t) - 1;
  p->slot.resize(size_t{1} << m.t);
  uint32_t c = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    const uint32_t f = m.f[s];
    p->freq[s] = f;
    for (uint32_t q = 0; q < f; ++q) p->slot[c + q] = s | q << 8;
    c += f;
  }
}

// Buffers above this size are given back when a call ends; smaller ones
// stay with the thread for its next chunk.
constexpr size_t kKeptBufferBytes = size_t{16} << 20;

// An uninitialized array that keeps its memory from one call to the next.
template <typename T>
class Reused {
 public:
  T* Get(size_t n) {
    if (n > capacity_) {
      data_.reset();
      data_ = std::make_unique_for_overwrite<T[]>(n);
      capacity_ = n;
    }
    return data_.get();
  }
  void Trim() {
    if (capacity_ * sizeof(T) > kKeptBufferBytes) {
      data_.reset();
      capacity_ = 0;
    }
  }

 private:
  std::unique_ptr<T[]> data_;
  size_t capacity_ = 0;
};

// The working memory of one thread's encodes and decodes. Chunks are coded
// one after another on each worker thread, and memory fresh from the system
// for every chunk (a few MiB at 3% change) costs a page fault per 4 KiB,
// about as much as the coding itself; so each thread keeps its buffers.
struct Scratch {
  Reused<uint32_t> rank;
  Reused<uint16_t> zz;
  // Encoder.
  Reused<ConditionalBlock> span_classes;
  Reused<std::array<uint32_t, C>> before;
  Reused<uint16_t> words;
  std::array<EncPlane, C * 4 + kValuePlanes> enc;
  // Decoder.
  Reused<ConditionalBlock> classes;
  Reused<uint64_t> changed;
  Reused<uint64_t> hits;
  std::array<SlotTable, C * 4 + kValuePlanes> dec;

  void Trim() {
    rank.Trim();
    zz.Trim();
    words.Trim();
    classes.Trim();
    changed.Trim();
    hits.Trim();
  }
};

// The calling thread's scratch, trimmed when the call returns.
class ScratchLease {
 public:
  ScratchLease() : s_(Get()) {}
  ~ScratchLease() { s_->Trim(); }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  Scratch* operator->() const { return s_; }

 private:
  static Scratch* Get() {
    thread_local std::unique_ptr<Scratch> scratch = std::make_unique<Scratch>();
    return scratch.get();
  }
  Scratch* s_;
};

}  // namespace

void SampleConditional(const uint8_t* base, uint32_t first, uint32_t end,
                       std::span<const uint32_t> positions, ConditionalSample* sample) {
  SampleExponents(base, first, end, &sample->sampled);
  uint32_t r = 0;
  for (const uint32_t p : positions) {
    ++sample->changed[r++ & 3][Exponent(Load16(base + 2 * size_t{p}))];
  }
}

Status EncodeConditional(uint32_t n, const uint8_t* base,
                         std::span<const uint32_t> positions,
                         const uint8_t* xor_values, const EncodeOptions& opt,
                         std::vector<uint8_t>* out, const ConditionalSample* sample) {
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
  if (sample != nullptr && (sample->from % 8 != 0 || positions[0] < sample->from)) {
    return InvalidArgumentError("the exponent sample starts past a record");
  }
  ScratchLease scratch;
  // One pass over spans of the base: the sampled exponents, then the
  // span's records (validated) and their exponents, while the span is in
  // cache. With the caller's sample, only the records are validated and
  // the elements below sample->from sampled.
  ExponentCounts sampled{}, changed{};
  if (sample != nullptr) {
    sampled = sample->sampled;
    changed = sample->changed;
    SampleExponents(base, 0, std::min(n, sample->from), &sampled);
  }
  {
    uint32_t r = 0;
    for (uint32_t i = 0; i < n; i += kSpanBlocks * kBlock) {
      const uint32_t end = std::min(n, i + kSpanBlocks * kBlock);
      if (sample != nullptr) {
        for (; r < k && positions[r] < end; ++r) {
          if (r > 0 && positions[r] <= positions[r - 1]) break;
          if (Load16(xor_values + 2 * size_t{r}) == 0) {
            return InvalidArgumentError("a sparse XOR value is zero");
          }
        }
        continue;
      }
      SampleExponents(base, i, end, &sampled);
      for (; r < k && positions[r] < end; ++r) {
        if (r > 0 && positions[r] <= positions[r - 1]) break;
        if (Load16(xor_values + 2 * size_t{r}) == 0) {
          return InvalidArgumentError("a sparse XOR value is zero");
        }
        ++changed[r & 3][Exponent(Load16(base + 2 * size_t{positions[r]}))];
      }
    }
    if (r < k) {
      return InvalidArgumentError("position " + std::to_string(positions[r]) +
                                  " of record " + std::to_string(r) +
                                  " is not ascending or not below n");
    }
  }
  std::array<uint64_t, 256> changes;
  uint64_t total_changes = 0;
  for (int e = 0; e < 256; ++e) {
    changes[e] = uint64_t{changed[0][e]} + changed[1][e] + changed[2][e] + changed[3][e];
    total_changes += changes[e];
  }
  if (total_changes != k) {
    return InvalidArgumentError("the exponent sample counts " + std::to_string(total_changes) +
                                " changes, the records are " + std::to_string(k));
  }
  Header h;
  h.lo = ChooseLo(sampled, changes, &h.k);
  for (int c = 1; c < C; ++c) h.first[c] = h.first[c - 1] + h.k[c - 1];
  // Records in class-major order: each record's rank among its class's
  // members (from the block's class masks), and its difference.
  uint32_t* const rank = scratch->rank.Get(k);
  uint16_t* const zz = scratch->zz.Get(k);
  // Spans of kSpanBlocks blocks: the blocks' classes and members per class
  // before each block (in cache), then the span's records, each one's rank
  // its class's members before its block plus those below it in the block.
  std::array<uint32_t, C> fill = h.first;
  std::array<uint32_t, C> class_end;
  for (int c = 0; c < C; ++c) class_end[c] = h.first[c] + h.k[c];
  std::array<uint32_t, C> members{};  // members before the span's next block
  const uint32_t blocks = (n + kBlock - 1) / kBlock;
  const uint32_t span_blocks = std::min(blocks, kSpanBlocks);
  ConditionalBlock* const classes = scratch->span_classes.Get(span_blocks);
  std::array<uint32_t, C>* const before = scratch->before.Get(span_blocks);
  uint32_t r = 0;
  for (uint32_t b0 = 0; b0 < blocks; b0 += kSpanBlocks) {
    const uint32_t nb = std::min(kSpanBlocks, blocks - b0);
    ClassifyBlocks(base, n, h.lo, b0, nb, classes);
    for (uint32_t b = 0; b < nb; ++b) {
      before[b] = members;
      const uint64_t valid = ValidMask(std::min(kBlock, n - (b0 + b) * kBlock));
      for (uint32_t c = 0; c < C; ++c) {
        members[c] += static_cast<uint32_t>(std::popcount(MaskOf(classes[b], c, valid)));
      }
    }
    const uint32_t span_end = std::min(n, (b0 + nb) * kBlock);
    for (; r < k && positions[r] < span_end; ++r) {
      const uint32_t p = positions[r];
      const uint32_t b = p / kBlock - b0;
      const uint32_t bit = p % kBlock;
      const uint32_t c = ClassAt(classes[b], bit);
      // Elements below `bit` are in the block, so no validity mask is needed.
      const uint64_t below = MaskOf(classes[b], c, (uint64_t{1} << bit) - 1);
      const uint32_t at = fill[c]++;
      // Holds unless a caller's sample miscounted the class's changes.
      if (at >= class_end[c]) {
        return InvalidArgumentError("the exponent sample does not match the records");
      }
      rank[at] = before[b][c] + static_cast<uint32_t>(std::popcount(below));
      const uint16_t old = Load16(base + 2 * size_t{p});
      zz[at] = Zigzag(old, old ^ Load16(xor_values + 2 * size_t{r}));
    }
  }
  // Models: per class, gap planes with the geometric context of its members
  // and changes; values shared by every record. Gap bytes 1..3 and the
  // difference's high byte are mostly zero: only their other values are
  // counted, the zeros derived.
  // The records are valid: from here on nothing fails, and the header goes
  // straight to *out.
  ByteWriter w(out);
  w.U8(static_cast<uint8_t>(h.lo));
  for (int c = 0; c < C; ++c) w.Varint(h.k[c]);
  for (int c = 0; c < C; ++c) {
    if (h.k[c] == 0) continue;
    std::array<Histogram, 4> hist{};
    std::array<uint64_t, 4> nonzero{};
    uint32_t max_gap = 0;
    uint32_t next_rank = 0;  // the previous record's rank + 1
    for (uint32_t j = h.first[c]; j < h.first[c] + h.k[c]; ++j) {
      const uint32_t g = rank[j] - next_rank;
      next_rank = rank[j] + 1;
      rank[j] = g;  // from here on: the gap
      max_gap = std::max(max_gap, g);
      ++hist[0][g & 0xff];
      if (g >> 8) {
        for (int b = 1; b < 4; ++b) {
          const uint32_t s = (g >> (8 * b)) & 0xff;
          ++hist[b][s];
          nonzero[b] += s != 0;
        }
      }
    }
    for (int b = 1; b < 4; ++b) hist[b][0] = h.k[c] - nonzero[b];
    h.gw[c] = GapWidthFor(max_gap);
    w.U8(static_cast<uint8_t>(h.gw[c]));
    for (int b = 0; b < h.gw[c]; ++b) {
      uint64_t cost = 0;
      h.gap[c][b] = ChooseModel(hist[b], GapContext{true, members[c], h.k[c], b}, &cost);
      WriteModel(h.gap[c][b], out);
    }
  }
  {
    std::array<Histogram, kValuePlanes> vhist{};
    std::array<std::array<uint32_t, 256>, 2> low{};
    uint64_t high_nonzero = 0;
    for (uint32_t j = 0; j < k; ++j) {
      const uint16_t z = zz[j];
      ++low[j & 1][z & 0xff];
      if (z >> 8) {
        ++vhist[1][z >> 8];
        ++high_nonzero;
      }
    }
    for (int s = 0; s < 256; ++s) vhist[0][s] = uint64_t{low[0][s]} + low[1][s];
    vhist[1][0] = k - high_nonzero;
    for (int b = 0; b < kValuePlanes; ++b) {
      uint64_t cost = 0;
      h.value[b] = ChooseModel(vhist[b], GapContext{}, &cost);
      WriteModel(h.value[b], out);
    }
  }
  // Encoder tables per class and plane.
  std::array<EncPlane, C * 4 + kValuePlanes>& enc = scratch->enc;
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
  const uint32_t L = static_cast<uint32_t>(ChooseLanes(k, opt.records_per_lane, any_coded));
  // Lane j's words fill its region from the back (as in EncodeStream), one
  // spare word below it for the branchless renormalization store.
  std::array<size_t, kMaxLanes> region_end;
  size_t total_words = 0;
  for (uint32_t j = 0; j < L; ++j) {
    const uint64_t recs = k > j ? (k - j + L - 1) / L : 0;
    total_words += 1 + recs * kMaxRecordPlanes;
    region_end[j] = total_words;
  }
  uint16_t* const words = scratch->words.Get(total_words);
  std::array<uint16_t*, kMaxLanes> ptr;
  std::array<uint32_t, kMaxLanes> state;
  for (uint32_t j = 0; j < L; ++j) {
    ptr[j] = words + region_end[j];
    state[j] = kRansLow;
  }
  // Records from the last to the first, each record's planes in reverse;
  // record r is in lane r mod L.
  for (int c = C - 1; c >= 0 && any_coded; --c) {
    if (h.k[c] == 0) continue;
    const ClassPlan pl = PlanOf(h, c);
    if (pl.planes == 0) continue;
    std::array<const EncSymbol*, kMaxRecordPlanes> sym;
    std::array<uint32_t, kMaxRecordPlanes> shift, at;
    for (int q = 0; q < pl.planes; ++q) {
      const int idx = pl.index[q];
      const EncPlane& ep = idx < 4 ? enc[c * 4 + idx] : enc[C * 4 + idx - 4];
      sym[q] = ep.sym.data();
      shift[q] = ep.shift;
      at[q] = 8 * static_cast<uint32_t>(idx);
    }
    const uint32_t lo_r = h.first[c];
    uint32_t rr = h.first[c] + h.k[c];  // records [lo_r, rr) are left
    uint32_t j = (rr - 1) % L;          // the lane of record rr - 1
    while (rr > lo_r) {
      if (L >= G && rr - lo_r >= G) {
        std::array<uint32_t, G> lane, x;
        std::array<uint16_t*, G> p;
        std::array<uint64_t, G> v;
        for (uint32_t g = 0; g < G; ++g) {
          lane[g] = j >= g ? j - g : j + L - g;
          v[g] = RecordWord(rank[rr - 1 - g], zz[rr - 1 - g]);
          x[g] = state[lane[g]];
          p[g] = ptr[lane[g]];
        }
        for (int q = pl.planes - 1; q >= 0; --q) {
          for (uint32_t g = 0; g < G; ++g) {
            internal::EncStep(sym[q][(v[g] >> at[q]) & 0xff], shift[q], &x[g], &p[g]);
          }
        }
        for (uint32_t g = 0; g < G; ++g) {
          state[lane[g]] = x[g];
          ptr[lane[g]] = p[g];
        }
        rr -= G;
        j = lane[G - 1] == 0 ? L - 1 : lane[G - 1] - 1;
        continue;
      }
      const uint64_t v = RecordWord(rank[rr - 1], zz[rr - 1]);
      uint32_t x = state[j];
      uint16_t* p = ptr[j];
      for (int q = pl.planes - 1; q >= 0; --q) {
        internal::EncStep(sym[q][(v >> at[q]) & 0xff], shift[q], &x, &p);
      }
      state[j] = x;
      ptr[j] = p;
      --rr;
      j = j == 0 ? L - 1 : j - 1;
    }
  }
  ByteWriter o(out);
  o.U8(static_cast<uint8_t>(L));
  for (uint32_t j = 0; j + 1 < L; ++j) {
    o.Varint(4 + 2 * static_cast<uint64_t>(words + region_end[j] - ptr[j]));
  }
  for (uint32_t j = 0; j < L; ++j) {
    o.U32(state[j]);
    const size_t used = static_cast<size_t>(words + region_end[j] - ptr[j]);
    o.Bytes(ptr[j], 2 * used);  // little-endian host, as in base/bytes.h
  }
  return Status::Ok();
}

namespace {

// One class's coded planes, in record order.
struct ClassTables {
  int planes = 0;
  uint64_t fixed = 0;  // the constant planes' symbols, in place
  std::array<const uint32_t*, kMaxRecordPlanes> slot;
  std::array<const uint32_t*, kMaxRecordPlanes> freq;
  std::array<uint32_t, kMaxRecordPlanes> t, mask, at;
};

struct Lanes {
  uint32_t count;
  std::array<const uint8_t*, kMaxLanes>& ptr;
  std::array<const uint8_t*, kMaxLanes>& end;
  std::array<uint32_t, kMaxLanes>& state;
};

// One decode step of plane q without a branch (as internal::DecStep); the
// caller guarantees two readable bytes at *p.
inline uint32_t Step(const ClassTables& tab, int q, uint32_t* x, const uint8_t** p) {
  const uint32_t e = tab.slot[q][*x & tab.mask[q]];
  const uint32_t s = e & 0xff;
  uint32_t y = tab.freq[q][s] * (*x >> tab.t[q]) + (e >> 8);
  const uint32_t refill = y < kRansLow;
  const uint32_t word = uint32_t{(*p)[0]} | uint32_t{(*p)[1]} << 8;
  y = (y << (refill << 4)) | (word & (0u - refill));
  *p += refill << 1;
  *x = y;
  return s;
}

// Decodes the k_c records [first, first + k_c) of one class; *j is the lane
// of record `first` on entry and of the record after the class on return.
// Sets *last_end to the class's last rank + 1 and counts zero differences.
// Groups of Gn consecutive records decode side by side (Gn distinct lanes),
// without bounds checks when each lane holds a word per plane.
template <uint32_t Gn>
Status DecodeClassG(const ClassTables& tab, uint32_t first, uint32_t kc, Lanes* ln,
                    uint32_t* j_io, uint32_t* rank, uint16_t* zz, uint64_t* last_end,
                    uint32_t* zero_differences) {
  const uint32_t L = ln->count;
  const ptrdiff_t record_bytes = 2 * tab.planes;
  uint64_t next_rank = 0;  // the previous record's rank + 1
  uint32_t zeros = 0;
  uint32_t j = *j_io;
  const uint32_t last = first + kc;
  uint32_t rr = first;
  while (rr < last) {
    if (Gn > 1 && L >= Gn && last - rr >= Gn) {
      std::array<uint32_t, Gn> lane;
      bool fast = true;
      for (uint32_t g = 0; g < Gn; ++g) {
        lane[g] = j + g < L ? j + g : j + g - L;
        fast &= ln->end[lane[g]] - ln->ptr[lane[g]] >= record_bytes;
      }
      if (fast) {
        std::array<uint32_t, Gn> x;
        std::array<const uint8_t*, Gn> q;
        std::array<uint64_t, Gn> v;
        for (uint32_t g = 0; g < Gn; ++g) {
          x[g] = ln->state[lane[g]];
          q[g] = ln->ptr[lane[g]];
          v[g] = tab.fixed;
        }
        for (int t = 0; t < tab.planes; ++t) {
          for (uint32_t g = 0; g < Gn; ++g) {
            v[g] |= uint64_t{Step(tab, t, &x[g], &q[g])} << tab.at[t];
          }
        }
        for (uint32_t g = 0; g < Gn; ++g) {
          ln->state[lane[g]] = x[g];
          ln->ptr[lane[g]] = q[g];
          // Planes past the gap width are zero in v.
          next_rank += static_cast<uint32_t>(v[g]);
          rank[rr + g] = static_cast<uint32_t>(next_rank);
          ++next_rank;
          const uint16_t d = static_cast<uint16_t>(v[g] >> 32);
          zz[rr + g] = d;
          zeros += d == 0;
        }
        rr += Gn;
        j = lane[Gn - 1] + 1 == L ? 0 : lane[Gn - 1] + 1;
        continue;
      }
    }
    // One record, every word read checked against its lane's end.
    uint32_t x = ln->state[j];
    const uint8_t* q = ln->ptr[j];
    uint64_t v = tab.fixed;
    for (int t = 0; t < tab.planes; ++t) {
      const uint32_t e = tab.slot[t][x & tab.mask[t]];
      v |= uint64_t{e & 0xff} << tab.at[t];
      x = tab.freq[t][e & 0xff] * (x >> tab.t[t]) + (e >> 8);
      if (x < kRansLow) {
        if (ln->end[j] - q < 2) {
          return DataLossError("lane " + std::to_string(j) + " ran out of bytes");
        }
        x = (x << 16) | (uint32_t{q[0]} | uint32_t{q[1]} << 8);
        q += 2;
      }
    }
    ln->state[j] = x;
    ln->ptr[j] = q;
    next_rank += static_cast<uint32_t>(v);
    rank[rr] = static_cast<uint32_t>(next_rank);
    ++next_rank;
    const uint16_t d = static_cast<uint16_t>(v >> 32);
    zz[rr] = d;
    zeros += d == 0;
    ++rr;
    if (++j == L) j = 0;
  }
  *j_io = j;
  *last_end = next_rank;
  *zero_differences += zeros;
  return Status::Ok();
}

Status DecodeClass(const ClassTables& tab, uint32_t first, uint32_t kc, Lanes* ln,
                   uint32_t* j, uint32_t* rank, uint16_t* zz, uint64_t* last_end,
                   uint32_t* zero_differences) {
  if (ln->count >= 8) {
    return DecodeClassG<8>(tab, first, kc, ln, j, rank, zz, last_end, zero_differences);
  }
  return DecodeClassG<G>(tab, first, kc, ln, j, rank, zz, last_end, zero_differences);
}

Status ReadHeader(ByteReader* r, uint32_t k, Header* h) {
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
  REFIT_RETURN_IF_ERROR(ReadHeader(&r, k, &h));
  ScratchLease scratch;
  // One pass over the base: each block's classes, kept for placing the
  // records below (24 bytes per 64 elements), and the members per class,
  // which the gap models need before a symbol is decoded.
  const uint32_t blocks = (n + kBlock - 1) / kBlock;
  ConditionalBlock* const classes = scratch->classes.Get(blocks);
  std::array<uint32_t, C> members;
  {
    ClassifyBlocks(base, n, h.lo, 0, blocks, classes);
    ClassCounter counter;
    for (uint32_t b = 0; b + 1 < blocks; ++b) counter.Add(classes[b], kBlock);
    counter.Add(classes[blocks - 1], n - (blocks - 1) * kBlock);
    members = counter.Counts();
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
  std::array<SlotTable, C * 4 + kValuePlanes>& dec = scratch->dec;
  for (int c = 0; c < C; ++c) {
    for (int b = 0; b < h.gw[c]; ++b) {
      if (h.gap[c][b].coded()) BuildSlotTable(h.gap[c][b], &dec[c * 4 + b]);
    }
  }
  for (int b = 0; b < kValuePlanes; ++b) {
    if (h.value[b].coded()) BuildSlotTable(h.value[b], &dec[C * 4 + b]);
  }
  // Lanes.
  ByteReader sr(payload.subspan(off));
  const uint32_t L = sr.U8();
  if (!sr.ok() || L == 0) return DataLossError("conditional stream has no lanes");
  std::array<uint64_t, kMaxLanes> size;
  for (uint32_t j = 0; j + 1 < L; ++j) size[j] = sr.Varint();
  REFIT_RETURN_IF_ERROR(sr.status("lane sizes"));
  std::array<const uint8_t*, kMaxLanes> ptr, end;
  std::array<uint32_t, kMaxLanes> state;
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
  // Records, class-major: member ranks and value differences. Record r is
  // in lane r mod L.
  uint32_t* const rank = scratch->rank.Get(k);
  uint16_t* const zz = scratch->zz.Get(k);
  Lanes lanes{L, ptr, end, state};
  uint32_t zero_differences = 0;
  uint32_t j = 0;  // the lane of the class's first record
  for (int c = 0; c < C; ++c) {
    if (h.k[c] == 0) continue;
    const ClassPlan pl = PlanOf(h, c);
    ClassTables tab;
    tab.planes = pl.planes;
    tab.fixed = pl.fixed;
    for (int q = 0; q < pl.planes; ++q) {
      const int idx = pl.index[q];
      const SlotTable& st = idx < 4 ? dec[c * 4 + idx] : dec[C * 4 + idx - 4];
      tab.slot[q] = st.slot.data();
      tab.freq[q] = st.freq.data();
      tab.t[q] = st.t;
      tab.mask[q] = st.mask;
      tab.at[q] = 8 * static_cast<uint32_t>(idx);
    }
    uint64_t last_end = 0;  // the class's last rank + 1
    REFIT_RETURN_IF_ERROR(DecodeClass(tab, h.first[c], h.k[c], &lanes, &j, rank, zz,
                                      &last_end, &zero_differences));
    // Ranks ascend within a class (gaps are below 2^32 each, so the sum
    // fits 64 bits): the last one bounds them all.
    if (last_end > members[c]) {
      return DataLossError("class " + std::to_string(c) +
                           " has a record past its last member");
    }
  }
  for (uint32_t jj = 0; jj < L; ++jj) {
    if (ptr[jj] != end[jj] || state[jj] != kRansLow) {
      return DataLossError("lane " + std::to_string(jj) +
                           (ptr[jj] != end[jj] ? " has leftover bytes"
                                               : " ends in a wrong state"));
    }
  }
  if (zero_differences != 0) return DataLossError("a value difference is zero");
  // Positions. Class c's members are numbered from M_c = m_0 + .. +
  // m_{c-1} on in one bit array, whose set bits are the changed ones (the
  // ranks). The kernel deposits each block's share onto its members, which
  // gives the block's changed elements; walking those in order, a changed
  // element of class c is that class's next record (ranks ascend).
  const size_t words = size_t{n} / 64 + 2;
  uint64_t* const changed = scratch->changed.Get(words);
  std::fill_n(changed, words, 0);
  std::array<uint64_t, C> member_off;
  {
    uint64_t m_before = 0;
    for (int c = 0; c < C; ++c) {
      member_off[c] = m_before;
      for (uint32_t rr = h.first[c]; rr < h.first[c] + h.k[c]; ++rr) {
        const uint64_t bit = m_before + rank[rr];
        changed[bit >> 6] |= uint64_t{1} << (bit & 63);
      }
      m_before += members[c];
    }
  }
  // One spare word past the last block: the walk below reads it.
  uint64_t* const hits = scratch->hits.Get(size_t{blocks} + 1);
  hits[blocks] = 0;
  GetKernels().place(classes, blocks, ValidMask(n - (blocks - 1) * kBlock), changed,
                     member_off.data(), hits);
  std::array<uint32_t, C> next = h.first;  // each class's next record
  uint32_t out_r = 0;
  uint32_t b = 0;
  uint64_t word = hits[0];
  // Every rank is below its class's members (checked above) and ranks are
  // distinct, so exactly k hits are set; the bound on b guards the walk
  // all the same.
  while (word == 0 && b + 1 < blocks) word = hits[++b];
  // The XOR needs the base element under the record. Where records are
  // sparse (below one per 48 elements), the base's lines left the cache
  // since the class pass and the walk would stall on each load: the walk
  // leaves the difference in the XOR slot, and a pass of its own loads the
  // base elements, prefetched some records ahead. Denser records share
  // lines, which the walk loads in order.
  const bool gather_apart = uint64_t{k} * 48 < n;
  for (; out_r < k && word != 0; ++out_r) {
    const uint32_t bit = static_cast<uint32_t>(std::countr_zero(word));
    word &= word - 1;
    const uint32_t c = ClassAt(classes[b], bit);
    const uint32_t pos = b * kBlock + bit;
    uint16_t x = zz[next[c]++];
    if (!gather_apart) {
      const uint16_t old = Load16(base + 2 * size_t{pos});
      x = static_cast<uint16_t>(old ^ static_cast<uint16_t>(old + Unzigzag(x)));
    }
    positions[out_r] = pos;
    xor_values[2 * size_t{out_r}] = static_cast<uint8_t>(x);
    xor_values[2 * size_t{out_r} + 1] = static_cast<uint8_t>(x >> 8);
    // The next block without a branch on most records (a block holds a
    // few changes); a run of empty blocks takes the loop.
    const bool empty = word == 0;
    b += empty;
    word = empty ? hits[b] : word;
    while (word == 0 && b + 1 < blocks) word = hits[++b];
  }
  if (out_r != k) return DataLossError("conditional records do not all land in the range");
  constexpr uint32_t kAhead = 16;
  for (uint32_t rr = 0; rr < k && gather_apart; ++rr) {
    __builtin_prefetch(base + 2 * size_t{positions[std::min(rr + kAhead, k - 1)]});
    const uint16_t old = Load16(base + 2 * size_t{positions[rr]});
    const uint16_t nw = static_cast<uint16_t>(old + Unzigzag(Load16(xor_values + 2 * size_t{rr})));
    const uint16_t x = static_cast<uint16_t>(old ^ nw);
    xor_values[2 * size_t{rr}] = static_cast<uint8_t>(x);
    xor_values[2 * size_t{rr} + 1] = static_cast<uint8_t>(x >> 8);
  }
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
