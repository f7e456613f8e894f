#include "codec/rans.h"

#include <gtest/gtest.h>

#include <random>

#include "base/bytes.h"
#include "support/status_matchers.h"

namespace refit::codec {
namespace {

using ::refit::testing::IsOk;
using ::refit::testing::StatusIs;

// Four planes covering every model mode: geometric, table, uniform,
// constant. Symbols are drawn so each model can code them.
struct Fixture {
  static constexpr int kPlanes = 4;
  uint32_t n;
  std::vector<std::array<uint8_t, kPlanes>> records;
  std::vector<Model> models;

  explicit Fixture(uint32_t count, uint32_t seed) : n(count), models(kPlanes) {
    std::mt19937 rng(seed);
    std::geometric_distribution<int> geo(0.05);
    records.resize(n);
    for (auto& r : records) {
      r[0] = static_cast<uint8_t>(std::min(geo(rng), 255));
      r[1] = static_cast<uint8_t>((rng() % 4 == 0) ? rng() % 256 : rng() % 4);
      r[2] = static_cast<uint8_t>(rng());
      r[3] = 9;
    }
    Histogram h1{};
    for (const auto& r : records) ++h1[r[1]];
    models[0].mode = ModelMode::kGeometric;
    models[0].t = 12;
    models[0].max_symbol = 255;
    EXPECT_TRUE(
        Normalize(GeometricWeights(1000, 50, 0, 255), 12, &models[0].f));
    models[1].mode = ModelMode::kTable;
    models[1].t = 10;
    EXPECT_TRUE(Normalize(h1, 10, &models[1].f));
    models[2].mode = ModelMode::kUniform;
    models[2].t = 8;
    models[2].f.fill(1);
    models[3].mode = ModelMode::kConstant;
    models[3].symbol = 9;
  }
};

std::vector<uint8_t> Encode(const Fixture& fx, int lanes) {
  std::vector<EncPlane> enc(Fixture::kPlanes);
  std::vector<int> index;
  std::vector<const EncPlane*> encs;
  for (int j = 0; j < Fixture::kPlanes; ++j) {
    if (!fx.models[j].coded()) continue;
    BuildEncPlane(fx.models[j], &enc[j]);
    index.push_back(j);
    encs.push_back(&enc[j]);
  }
  std::vector<uint8_t> out;
  EncodeStream(
      fx.n, lanes, index, encs,
      [&](uint32_t i, uint8_t* syms) {
        for (int j = 0; j < Fixture::kPlanes; ++j) syms[j] = fx.records[i][j];
      },
      &out);
  return out;
}

Status Decode(const Fixture& fx, std::span<const uint8_t> in,
              std::vector<std::array<uint8_t, Fixture::kPlanes>>* got) {
  std::vector<DecPlane> dec(Fixture::kPlanes);
  std::vector<int> index;
  std::vector<const DecPlane*> decs;
  uint8_t fixed[Fixture::kPlanes] = {};
  for (int j = 0; j < Fixture::kPlanes; ++j) {
    if (!fx.models[j].coded()) {
      fixed[j] = fx.models[j].symbol;
      continue;
    }
    BuildDecPlane(fx.models[j], &dec[j]);
    index.push_back(j);
    decs.push_back(&dec[j]);
  }
  got->assign(fx.n, {});
  return DecodeStream(in, fx.n, Fixture::kPlanes, fixed, index, decs,
                      [&](uint32_t i, const uint8_t* syms) -> const char* {
                        for (int j = 0; j < Fixture::kPlanes; ++j) {
                          (*got)[i][j] = syms[j];
                        }
                        return nullptr;
                      });
}

// The stream of section 5.3 written the plain way, as the oracle for
// EncodeStream (lanes side by side, branch-free renormalization, division
// by reciprocals): one record at a time from the back, a branch per
// renormalization, x / f and x % f by division.
std::vector<uint8_t> ReferenceEncode(const Fixture& fx, int lanes) {
  const uint32_t L = static_cast<uint32_t>(lanes);
  std::vector<uint32_t> state(L, kRansLow);
  std::vector<std::vector<uint16_t>> emitted(L);  // in emission order
  for (uint32_t i = fx.n; i-- > 0;) {
    const uint32_t j = i % L;
    uint64_t x = state[j];
    for (int plane = Fixture::kPlanes - 1; plane >= 0; --plane) {
      const Model& m = fx.models[plane];
      if (!m.coded()) continue;
      const uint8_t s = fx.records[i][plane];
      const uint64_t f = m.f[s];
      uint64_t c = 0;
      for (int below = 0; below < s; ++below) c += m.f[below];
      if (x >= f << (32 - m.t)) {
        emitted[j].push_back(static_cast<uint16_t>(x));
        x >>= 16;
      }
      x = ((x / f) << m.t) + x % f + c;
    }
    state[j] = static_cast<uint32_t>(x);
  }
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U8(static_cast<uint8_t>(L));
  for (uint32_t j = 0; j + 1 < L; ++j) w.Varint(4 + 2 * emitted[j].size());
  for (uint32_t j = 0; j < L; ++j) {
    w.U32(state[j]);
    for (size_t k = emitted[j].size(); k-- > 0;) {
      w.U8(static_cast<uint8_t>(emitted[j][k]));
      w.U8(static_cast<uint8_t>(emitted[j][k] >> 8));
    }
  }
  return out;
}

TEST(RansTest, MatchesReferenceEncoder) {
  // Lane counts below, at and above the records coded side by side, and
  // record counts that leave every remainder.
  for (uint32_t n : {1u, 3u, 4u, 5u, 7u, 8u, 9u, 33u, 1000u, 4099u}) {
    Fixture fx(n, n + 7);
    for (int lanes : {1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 255}) {
      ASSERT_EQ(Encode(fx, lanes), ReferenceEncode(fx, lanes))
          << "n=" << n << " L=" << lanes;
    }
  }
  // Skewed tables: words on almost every symbol of one plane, almost none
  // on another.
  Fixture fx(20000, 3);
  fx.models[1].mode = ModelMode::kTable;
  fx.models[1].t = 15;
  fx.models[1].f.fill(1);
  fx.models[1].f[0] = static_cast<uint16_t>(32768 - 255);
  for (auto& r : fx.records) r[1] = (r[2] % 5 == 0) ? r[2] : 0;
  for (int lanes : {1, 4, 6, 100}) {
    ASSERT_EQ(Encode(fx, lanes), ReferenceEncode(fx, lanes)) << lanes;
    std::vector<std::array<uint8_t, Fixture::kPlanes>> got;
    const std::vector<uint8_t> buf = Encode(fx, lanes);
    ASSERT_TRUE(Decode(fx, buf, &got).ok());
    EXPECT_EQ(got, fx.records);
  }
}

TEST(RansTest, RoundTripAllLaneCounts) {
  for (uint32_t n : {1u, 2u, 100u, 5000u}) {
    Fixture fx(n, n);
    for (int lanes = 1; lanes <= kMaxLanes; ++lanes) {
      const std::vector<uint8_t> buf = Encode(fx, lanes);
      ASSERT_EQ(buf[0], lanes);
      int parsed = 0;
      ASSERT_TRUE(ParseLanes(buf, &parsed).ok());
      EXPECT_EQ(parsed, lanes);
      std::vector<std::array<uint8_t, Fixture::kPlanes>> got;
      const Status s = Decode(fx, buf, &got);
      ASSERT_THAT(s, IsOk()) << " n=" << n << " L=" << lanes;
      ASSERT_EQ(got, fx.records) << "n=" << n << " L=" << lanes;
    }
  }
}

TEST(RansTest, ExtremeFrequencies) {
  // A symbol owning 2^15 - 1 slots next to one of a single slot exercises
  // the reciprocal at both ends.
  Fixture fx(20000, 5);
  fx.models[1].mode = ModelMode::kTable;
  fx.models[1].t = 15;
  fx.models[1].f.fill(1);
  fx.models[1].f[0] = static_cast<uint16_t>(32768 - 255);
  for (auto& r : fx.records) r[1] = (r[2] % 97 == 0) ? r[2] : 0;
  const std::vector<uint8_t> buf = Encode(fx, 3);
  std::vector<std::array<uint8_t, Fixture::kPlanes>> got;
  ASSERT_TRUE(Decode(fx, buf, &got).ok());
  EXPECT_EQ(got, fx.records);
}

TEST(RansTest, ReciprocalDivisionIsExact) {
  // Every frequency at t = 15 against states at the edges of the range the
  // encoder divides: [2^16, f << 17).
  for (int t : {1, 8, 15}) {
    for (uint32_t f = 1; f <= (1u << t); f += (t == 15 ? 7 : 1)) {
      const uint64_t rcp = ((uint64_t{1} << (32 + t)) + f - 1) / f;
      const uint64_t x_max = uint64_t{f} << (32 - t);
      for (uint64_t x : {uint64_t{kRansLow}, x_max - 1, x_max / 2 + 1,
                         x_max - f, x_max - f - 1}) {
        if (x < kRansLow || x >= x_max) continue;
        ASSERT_EQ((x * rcp) >> (32 + t), x / f) << f << " " << x;
      }
    }
  }
}

TEST(RansTest, CorruptStreamsFailCleanly) {
  // With 3 lanes records decode one at a time; with 9, side by side.
  for (int lanes : {3, 9}) {
    Fixture fx(3000, 11);
    const std::vector<uint8_t> buf = Encode(fx, lanes);
    std::vector<std::array<uint8_t, Fixture::kPlanes>> got;
    for (size_t cut = 0; cut < buf.size(); ++cut) {
      const Status s = Decode(fx, std::span(buf.data(), cut), &got);
      ASSERT_THAT(s, StatusIs(StatusCode::kDataLoss)) << cut;
    }
    std::vector<uint8_t> longer = buf;
    longer.push_back(0);
    EXPECT_FALSE(Decode(fx, longer, &got).ok());
    std::mt19937 rng(2);
    for (int i = 0; i < 2000; ++i) {
      std::vector<uint8_t> b = buf;
      b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      (void)Decode(fx, b, &got);  // must not crash or read out of bounds
    }
  }
}

}  // namespace
}  // namespace refit::codec
