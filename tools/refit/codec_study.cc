// `refit codec-study BASE TARGET`: measures what coding the changes of a
// BF16 checkpoint pair conditioned on the base would save (issue: code the
// changes given the base the receiver holds). For every chunk range (the
// encoder's 8 MiB ranges) it prices candidate schemes with the codec's own
// model costs (codec::ChooseModel: transmitted tables or the parametric
// geometric gap model, description bits included), so each figure is the
// size of an independently decodable chunk, not a plug-in entropy:
//
//   positions: gaps among all elements (today) vs gaps among the members of
//     a class of the base element (its exponent; exponent + top mantissa
//     bit; the exponent clamped to B buckets), each class a geometric model
//     from its change count (sent) and member count (the receiver counts);
//     and the same with adaptive Krichevsky-Trofimov change flags per class.
//   values: the XOR (today) vs the integer difference new - old of the bit
//     patterns (zigzag), per-chunk tables; and plug-in entropies over the
//     whole checkpoint, what a version-level shared model could reach.
// Totals are compared with the order-0 bound that `refit inspect` reports.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "codec/payload.h"
#include "codec/table.h"
#include "commands.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "cli_util.h"
#include "scratch_dir.h"

namespace refit::cli {
namespace {

using codec::GapContext;
using codec::Histogram;

double Log2Binomial(double n, double k) {
  if (k <= 0 || k >= n) return 0;
  return (std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1)) /
         std::log(2.0);
}

// Bits of n binary flags with k ones under the adaptive KT estimator.
double KtBits(double n, double k) {
  if (n <= 0) return 0;
  const double lp = std::lgamma(k + 0.5) + std::lgamma(n - k + 0.5) -
                    std::log(M_PI) - std::lgamma(n + 1);
  return -lp / std::log(2.0);
}

double EntropyBits(const std::map<uint64_t, uint64_t>& hist) {
  double total = 0, bits = 0;
  for (const auto& [v, c] : hist) total += static_cast<double>(c);
  for (const auto& [v, c] : hist) {
    bits -= static_cast<double>(c) * std::log2(static_cast<double>(c) / total);
  }
  return bits;
}

// Cost in bits of coding `syms` (one byte plane) with the codec's best
// model, description included.
double PlaneBits(const std::vector<uint8_t>& syms, const GapContext& gap) {
  if (syms.empty()) return 0;
  Histogram h{};
  for (uint8_t s : syms) ++h[s];
  uint64_t cost = 0;
  (void)codec::ChooseModel(h, gap, &cost);
  // The model's mode byte and table are in `cost` as bits; add the mode.
  return static_cast<double>(cost) / static_cast<double>(codec::kCostOne) + 8;
}

// Cost of gaps g (among m class members, k = g.size() changes) as the
// sparse kinds code them: per-byte planes, geometric models where they win.
double GapBits(uint32_t members, const std::vector<uint32_t>& gaps) {
  if (gaps.empty()) return 0;
  uint32_t max_gap = *std::max_element(gaps.begin(), gaps.end());
  const int gw = codec::GapWidthFor(max_gap);
  double bits = 8;  // gap width
  std::vector<uint8_t> plane(gaps.size());
  for (int b = 0; b < gw; ++b) {
    for (size_t i = 0; i < gaps.size(); ++i) plane[i] = uint8_t(gaps[i] >> (8 * b));
    GapContext ctx{true, members, static_cast<uint32_t>(gaps.size()), b};
    bits += PlaneBits(plane, ctx);
  }
  return bits;
}

double VarintBits(uint64_t v) {
  int n = 1;
  while (v >= 128) {
    v >>= 7;
    ++n;
  }
  return 8.0 * n;
}

struct Scheme {
  std::string name;
  double bits = 0;
};

struct Totals {
  double today_payload = 0;  // bytes of today's kinds
  uint64_t n = 0, k = 0;
  std::map<uint64_t, uint64_t> xor_all, diff_all;
  std::map<uint64_t, uint64_t> xor_by_exp, diff_by_exp, exp_count;
  std::map<uint64_t, uint64_t> diff_by_sign;
  std::map<uint64_t, uint64_t> sign_count;
  std::map<std::string, double> pos, val;  // bits
};

uint16_t Zigzag16(uint16_t oldv, uint16_t newv) {
  const int16_t d = static_cast<int16_t>(static_cast<uint16_t>(newv - oldv));
  return static_cast<uint16_t>((static_cast<uint16_t>(d) << 1) ^
                               static_cast<uint16_t>(d >> 15));
}

// Class functions of the base element's 16 bits.
uint32_t Exponent(uint16_t x) { return (x >> 7) & 0xff; }

void StudyRange(const uint16_t* a, const uint16_t* b, uint32_t n, Totals* t) {
  std::vector<uint32_t> pos;
  for (uint32_t i = 0; i < n; ++i) if (a[i] != b[i]) pos.push_back(i);
  const uint32_t k = static_cast<uint32_t>(pos.size());
  if (k == 0) return;
  t->n += n;
  t->k += k;
  // Positions, today: gaps among all elements.
  {
    std::vector<uint32_t> gaps(k);
    for (uint32_t r = 0; r < k; ++r) gaps[r] = pos[r] - (r ? pos[r - 1] + 1 : 0);
    t->pos["gaps, all elements (today)"] += GapBits(n, gaps);
    t->pos["log2 C(n,k) (order-0 flags)"] += Log2Binomial(n, k);
  }
  // Positions given a class of the base element.
  auto by_class = [&](const std::string& name, int classes, auto&& cls) {
    std::vector<uint32_t> members(classes, 0), last(classes, 0);
    std::vector<std::vector<uint32_t>> gaps(classes);
    size_t r = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t c = cls(a[i]);
      if (r < k && pos[r] == i) {
        gaps[c].push_back(members[c] - last[c]);
        last[c] = members[c] + 1;
        ++r;
      }
      ++members[c];
    }
    double geo = 0, kt = 0, plug = 0;
    for (int c = 0; c < classes; ++c) {
      if (members[c] == 0) continue;
      geo += VarintBits(gaps[c].size()) + GapBits(members[c], gaps[c]);
      kt += KtBits(members[c], static_cast<double>(gaps[c].size()));
      plug += Log2Binomial(members[c], static_cast<double>(gaps[c].size()));
    }
    t->pos[name + ": geometric gaps per class, k_c sent"] += geo;
    t->pos[name + ": adaptive KT flags per class"] += kt;
    t->pos[name + ": plug-in (no model cost)"] += plug;
  };
  by_class("exponent", 256, [](uint16_t x) { return Exponent(x); });
  by_class("exponent + top mantissa bit", 512,
           [](uint16_t x) { return (x >> 6) & 0x1ff; });
  // Buckets: the exponent clamped to [lo, lo + B - 1]; lo picked per chunk
  // (one byte sent) as the best of the candidates around the changes.
  for (int B : {2, 4, 8, 16}) {
    double best = 1e300;
    std::string name = fmt::format("{} exponent buckets", B);
    for (uint32_t lo = 100; lo < 130; ++lo) {
      Totals scratch;
      auto cls = [lo, B](uint16_t x) {
        const uint32_t e = Exponent(x);
        return e <= lo ? 0u : std::min<uint32_t>(e - lo, B - 1);
      };
      std::vector<uint32_t> members(B, 0), last(B, 0);
      std::vector<std::vector<uint32_t>> gaps(B);
      size_t r = 0;
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t c = cls(a[i]);
        if (r < k && pos[r] == i) {
          gaps[c].push_back(members[c] - last[c]);
          last[c] = members[c] + 1;
          ++r;
        }
        ++members[c];
      }
      double geo = 8;
      for (int c = 0; c < B; ++c) {
        if (members[c]) geo += VarintBits(gaps[c].size()) + GapBits(members[c], gaps[c]);
      }
      best = std::min(best, geo);
    }
    t->pos[name + ": geometric gaps per class, k_c + lo sent"] += best;
  }
  // Values.
  std::vector<uint8_t> x0(k), x1(k), d0(k), d1(k);
  for (uint32_t r = 0; r < k; ++r) {
    const uint16_t o = a[pos[r]], nw = b[pos[r]];
    const uint16_t x = o ^ nw, z = Zigzag16(o, nw);
    x0[r] = uint8_t(x), x1[r] = uint8_t(x >> 8);
    d0[r] = uint8_t(z), d1[r] = uint8_t(z >> 8);
    ++t->xor_all[x];
    ++t->diff_all[z];
    ++t->xor_by_exp[uint64_t{Exponent(o)} << 16 | x];
    ++t->diff_by_exp[uint64_t{Exponent(o)} << 16 | z];
    ++t->exp_count[Exponent(o)];
    ++t->diff_by_sign[uint64_t(o >> 15) << 16 | z];
    ++t->sign_count[uint64_t(o >> 15)];
  }
  t->val["XOR, per-chunk tables (today)"] += PlaneBits(x0, {}) + PlaneBits(x1, {});
  t->val["new - old (zigzag), per-chunk tables"] += PlaneBits(d0, {}) + PlaneBits(d1, {});
}

}  // namespace

int RunCodecStudy(const std::string& base_path, const std::string& target_path) {
  auto base = Checkpoint::Open(base_path, Checkpoint::Mode::kReadOnly);
  auto target = Checkpoint::Open(target_path, Checkpoint::Mode::kReadOnly);
  if (!base.ok() || !target.ok()) {
    fmt::print(stderr, "refit codec-study: {}\n",
               (!base.ok() ? base.status() : target.status()).ToString());
    return 1;
  }
  Totals t;
  const uint32_t per = 4u << 20;  // 8 MiB of BF16, the encoder's default
  for (size_t i = 0; i < base->tensors().size(); ++i) {
    const TensorInfo& ti = base->tensors()[i];
    if (ti.dtype != "BF16") continue;
    auto j = target->IndexOf(ti.name);
    if (!j) continue;
    auto da = base->Data(i);
    auto db = target->Data(*j);
    if (da.size() != db.size()) continue;
    const auto* a = reinterpret_cast<const uint16_t*>(da.data());
    const auto* b = reinterpret_cast<const uint16_t*>(db.data());
    const uint64_t n = da.size() / 2;
    for (uint64_t s = 0; s < n; s += per) {
      StudyRange(a + s, b + s, static_cast<uint32_t>(std::min<uint64_t>(per, n - s)), &t);
    }
  }
  // Today's payload, as the encoder writes it.
  auto dir = ScratchDir::Create("refit-study-");
  if (!dir.ok()) {
    fmt::print(stderr, "refit codec-study: {}\n", dir.status().ToString());
    return 1;
  }
  auto report = Diff(base_path, target_path, dir->File("delta"), DiffOptions{});
  if (!report.ok()) {
    fmt::print(stderr, "refit codec-study: {}\n", report.status().ToString());
    return 1;
  }
  const double bound_bits = Log2Binomial(static_cast<double>(t.n), static_cast<double>(t.k)) +
                            EntropyBits(t.xor_all);
  const double today = static_cast<double>(report->payload_bytes) * 8;
  fmt::print("elements {} changed {} ({:.2f}%)\n", t.n, t.k,
             100.0 * static_cast<double>(t.k) / static_cast<double>(t.n));
  fmt::print("order-0 bound {:.0f} B; today's payload {:.0f} B = {:.3f}x bound\n",
             bound_bits / 8, today / 8, today / bound_bits);
  const double kk = static_cast<double>(t.k);
  fmt::print("\npositions (bits per changed element; bound: {:.2f})\n",
             Log2Binomial(static_cast<double>(t.n), kk) / kk);
  for (const auto& [name, bits] : t.pos) fmt::print("  {:<70} {:6.2f}\n", name, bits / kk);
  fmt::print("\nvalues (bits per changed element; bound: {:.2f})\n", EntropyBits(t.xor_all) / kk);
  for (const auto& [name, bits] : t.val) fmt::print("  {:<70} {:6.2f}\n", name, bits / kk);
  auto cond = [](const std::map<uint64_t, uint64_t>& joint,
                 const std::map<uint64_t, uint64_t>& ctx) {
    return EntropyBits(joint) - EntropyBits(ctx);
  };
  fmt::print("  {:<70} {:6.2f}\n", "shared over the version, plug-in: XOR", EntropyBits(t.xor_all) / kk);
  fmt::print("  {:<70} {:6.2f}\n", "shared, plug-in: new - old", EntropyBits(t.diff_all) / kk);
  fmt::print("  {:<70} {:6.2f}\n", "shared, plug-in: XOR given exponent",
             cond(t.xor_by_exp, t.exp_count) / kk);
  fmt::print("  {:<70} {:6.2f}\n", "shared, plug-in: new - old given exponent",
             cond(t.diff_by_exp, t.exp_count) / kk);
  fmt::print("  {:<70} {:6.2f}\n", "shared, plug-in: new - old given sign",
             cond(t.diff_by_sign, t.sign_count) / kk);
  return 0;
}

}  // namespace refit::cli
