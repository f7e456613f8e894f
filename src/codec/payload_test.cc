#include "codec/payload.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>

#include "base/hash.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit::codec {
namespace {

using ::refit::testing::StatusIs;

// XOR values like an RL step's BF16 deltas: mostly a few low mantissa bits.
uint64_t DrawXor(std::mt19937_64& rng, int w) {
  const uint32_t u = static_cast<uint32_t>(rng() % 100);
  uint64_t v;
  if (u < 44)
    v = 0x1;
  else if (u < 67)
    v = 0x3;
  else if (u < 78)
    v = 0x7;
  else if (u < 84)
    v = 0xf;
  else
    v = 1 + rng() % 0x3ff;
  if (w < 8) v &= (uint64_t{1} << (8 * w)) - 1;
  return v == 0 ? 1 : v;
}

struct Sparse {
  uint32_t n = 0;
  int w = 2;
  std::vector<uint32_t> positions;
  std::vector<uint8_t> values;
  uint32_t k() const { return static_cast<uint32_t>(positions.size()); }
};

Sparse MakeSparse(uint32_t n, int w, uint32_t per_mille, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Sparse s;
  s.n = n;
  s.w = w;
  for (uint32_t i = 0; i < n; ++i) {
    if (rng() % 1000 >= per_mille) continue;
    s.positions.push_back(i);
    const uint64_t v = DrawXor(rng, w);
    for (int b = 0; b < w; ++b)
      s.values.push_back(static_cast<uint8_t>(v >> (8 * b)));
  }
  if (s.positions.empty()) {
    s.positions.push_back(n - 1);
    for (int b = 0; b < w; ++b) s.values.push_back(b == 0);
  }
  return s;
}

std::vector<uint8_t> EncodeOk(const Sparse& s,
                              ChunkKind kind = ChunkKind::kSparseXor,
                              EncodeOptions opt = EncodeOptions()) {
  std::vector<uint8_t> out;
  const Status st =
      EncodeSparse(kind, s.n, s.w, s.positions, s.values.data(), opt, &out);
  EXPECT_OK(st);
  return out;
}

Status DecodeInto(const Sparse& s, std::span<const uint8_t> payload,
                  Sparse* got, ChunkKind kind = ChunkKind::kSparseXor) {
  got->n = s.n;
  got->w = s.w;
  got->positions.assign(s.k(), 0);
  got->values.assign(s.values.size(), 0);
  return DecodeSparse(payload, kind, s.n, s.w, s.k(), got->positions.data(),
                      got->values.data());
}

void ExpectRoundTrip(const Sparse& s, ChunkKind kind = ChunkKind::kSparseXor,
                     EncodeOptions opt = EncodeOptions()) {
  const std::vector<uint8_t> payload = EncodeOk(s, kind, opt);
  Sparse got;
  const Status st = DecodeInto(s, payload, &got, kind);
  ASSERT_OK(st);
  EXPECT_EQ(got.positions, s.positions);
  EXPECT_EQ(got.values, s.values);
  std::vector<uint8_t> again;
  ASSERT_TRUE(
      EncodeSparse(kind, s.n, s.w, s.positions, s.values.data(), opt, &again)
          .ok());
  EXPECT_EQ(again, payload) << "encoder is not deterministic";
}

int GapWidthOf(std::span<const uint8_t> payload) { return payload[0]; }

TEST(SparseTest, RoundTripWidthsAndDensities) {
  for (int w : {1, 2, 4, 8}) {
    for (uint32_t per_mille : {1u, 10u, 30u, 300u}) {
      SCOPED_TRACE("w=" + std::to_string(w) +
                   " rate=" + std::to_string(per_mille));
      ExpectRoundTrip(MakeSparse(50000, w, per_mille, w * 1000 + per_mille));
    }
  }
}

TEST(SparseTest, GapWidthsOneToFour) {
  const uint32_t gaps[] = {255, 65535, (1u << 24) - 1, (1u << 28) - 1};
  for (int gw = 1; gw <= 4; ++gw) {
    Sparse s;
    s.n = kMaxChunkElements;
    s.w = 2;
    // A few small gaps, then the widest gap of this width.
    uint32_t p = 0;
    for (int i = 0; i < 5 && gw < 4; ++i) {
      s.positions.push_back(p);
      p += 3;
    }
    const uint32_t wide = gaps[gw - 1];
    s.positions.push_back(s.positions.empty() ? wide
                                              : s.positions.back() + wide + 1);
    s.values.assign(2 * s.positions.size(), 0);
    for (size_t i = 0; i < s.positions.size(); ++i)
      s.values[2 * i] = static_cast<uint8_t>(i + 1);
    const std::vector<uint8_t> payload = EncodeOk(s);
    EXPECT_EQ(GapWidthOf(payload), gw);
    ExpectRoundTrip(s);
  }
}

TEST(SparseTest, SingleRecordAndAllChanged) {
  Sparse one;
  one.n = 1;
  one.positions = {0};
  one.values = {0x01, 0x00};
  ExpectRoundTrip(one);

  Sparse all = MakeSparse(4096, 2, 1000, 9);
  ASSERT_EQ(all.k(), all.n);
  ExpectRoundTrip(all);
  const std::vector<uint8_t> payload = EncodeOk(all);
  Result<PayloadInfo> info =
      DescribePayload(payload, ChunkKind::kSparseXor, all.n, 2, all.k());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->planes[0].model, "constant");  // every gap is 0

  // All changed by the same XOR: nothing left to code but the lane framing.
  Sparse flat = all;
  for (size_t i = 0; i < flat.values.size(); ++i) flat.values[i] = i % 2 == 0;
  const std::vector<uint8_t> tiny = EncodeOk(flat);
  EXPECT_LE(tiny.size(), 12u);
  ExpectRoundTrip(flat);
}

TEST(SparseTest, ConstantHighBytesAndOverwrite) {
  for (int w : {2, 4, 8}) {
    Sparse s = MakeSparse(20000, w, 30, 77);
    for (size_t r = 0; r < s.k(); ++r) {
      for (int b = 1; b < w; ++b) s.values[r * w + b] = 0;
      if (s.values[r * w] == 0) s.values[r * w] = 1;
    }
    ExpectRoundTrip(s);
    const std::vector<uint8_t> payload = EncodeOk(s);
    Result<PayloadInfo> info =
        DescribePayload(payload, ChunkKind::kSparseXor, s.n, w, s.k());
    ASSERT_TRUE(info.ok());
    for (int b = 1; b < w; ++b) {
      EXPECT_EQ(info->planes[info->gap_width + b].model, "constant");
    }
    // Overwrite values may be zero.
    Sparse o = s;
    for (size_t r = 0; r < o.k(); r += 3) o.values[r * w] = 0;
    ExpectRoundTrip(o, ChunkKind::kSparseOverwrite);
  }
}

TEST(SparseTest, LaneSettings) {
  const Sparse s = MakeSparse(200000, 2, 30, 5);
  for (uint32_t rpl : {1u, 7u, 1024u, 1u << 30}) {
    EncodeOptions opt;
    opt.records_per_lane = rpl;
    ExpectRoundTrip(s, ChunkKind::kSparseXor, opt);
  }
}

// Every lane kernel writes the portable code's bytes: widths, densities and
// value spreads that make every plane mode appear, lane counts below,
// at and between multiples of eight, a last round of every fill, and wide
// gaps (gap planes 2 and 3 coded).
TEST(SparseTest, LaneKernelsAgreeWithThePortableCode) {
  using internal::LaneKernel;
  if (!internal::LaneKernelSupported(LaneKernel::kAvx2)) {
    GTEST_SKIP() << "no AVX2 on this CPU";
  }
  const auto expect_same = [](const Sparse& s, ChunkKind kind, uint32_t rpl) {
    SCOPED_TRACE("w=" + std::to_string(s.w) + " k=" + std::to_string(s.k()) +
                 " records_per_lane=" + std::to_string(rpl));
    EncodeOptions opt;
    opt.records_per_lane = rpl;
    std::vector<uint8_t> portable, avx2;
    ASSERT_OK(internal::EncodeSparseWith(LaneKernel::kPortable, kind, s.n, s.w,
                                         s.positions, s.values.data(), opt, &portable));
    ASSERT_OK(internal::EncodeSparseWith(LaneKernel::kAvx2, kind, s.n, s.w,
                                         s.positions, s.values.data(), opt, &avx2));
    EXPECT_EQ(avx2, portable);
  };
  uint64_t seed = 1;
  for (int w : {1, 2, 4, 8}) {
    for (uint32_t per_mille : {3u, 30u, 300u, 1000u}) {
      const Sparse s = MakeSparse(30011, w, per_mille, seed++);
      for (uint32_t rpl : {1u, 3u, 8u, 61u, 1024u}) {
        expect_same(s, ChunkKind::kSparseXor, rpl);
      }
      // Values spread over every byte: uniform and table models.
      Sparse wide = s;
      std::mt19937_64 rng(seed++);
      for (size_t i = 0; i < wide.values.size(); ++i) {
        wide.values[i] = static_cast<uint8_t>(rng());
      }
      expect_same(wide, ChunkKind::kSparseOverwrite, 5);
    }
  }
  // One wide gap among small ones: 3 and 4 gap bytes.
  for (uint32_t wide_gap : {(1u << 20) + 7, (1u << 28) - 200000}) {
    Sparse s;
    s.n = kMaxChunkElements;
    s.w = 2;
    std::mt19937_64 rng(seed++);
    uint64_t p = 0;
    for (int r = 0; r < 4000; ++r) {
      p += r == 3000 ? wide_gap : rng() % 40;
      s.positions.push_back(static_cast<uint32_t>(p++));
      const uint64_t v = DrawXor(rng, 2);
      s.values.push_back(static_cast<uint8_t>(v));
      s.values.push_back(static_cast<uint8_t>(v >> 8));
    }
    for (uint32_t rpl : {1u, 9u, 100u}) expect_same(s, ChunkKind::kSparseXor, rpl);
  }
}

TEST(SparseTest, RejectsBadArguments) {
  const Sparse s = MakeSparse(1000, 2, 30, 1);
  std::vector<uint8_t> out;
  const EncodeOptions opt;
  auto code = [&](ChunkKind kind, uint32_t n, int w,
                  std::span<const uint32_t> pos, const uint8_t* vals) {
    return EncodeSparse(kind, n, w, pos, vals, opt, &out).code();
  };
  EXPECT_EQ(code(ChunkKind::kDenseXor, s.n, 2, s.positions, s.values.data()),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ChunkKind::kSparseXor, s.n, 3, s.positions, s.values.data()),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ChunkKind::kSparseXor, 0, 2, {}, s.values.data()),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ChunkKind::kSparseXor, kMaxChunkElements + 1, 2, s.positions,
                 s.values.data()),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ChunkKind::kSparseXor, s.n, 2, {}, s.values.data()),
            StatusCode::kInvalidArgument);
  std::vector<uint32_t> dup = {3, 3};
  std::vector<uint8_t> vals = {1, 0, 1, 0};
  EXPECT_EQ(code(ChunkKind::kSparseXor, 10, 2, dup, vals.data()),
            StatusCode::kInvalidArgument);
  std::vector<uint32_t> past = {3, 10};
  EXPECT_EQ(code(ChunkKind::kSparseXor, 10, 2, past, vals.data()),
            StatusCode::kInvalidArgument);
  std::vector<uint32_t> ok = {3, 4};
  std::vector<uint8_t> zero = {1, 0, 0, 0};
  EXPECT_EQ(code(ChunkKind::kSparseXor, 10, 2, ok, zero.data()),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(code(ChunkKind::kSparseOverwrite, 10, 2, ok, zero.data()),
            StatusCode::kOk);

  uint32_t p[2];
  uint8_t v[4];
  EXPECT_THAT(DecodeSparse(out, ChunkKind::kSparseXor, 10, 2, 0, p, v),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(DecodeSparse(out, ChunkKind::kSparseXor, 10, 2, 11, p, v),
              StatusIs(StatusCode::kInvalidArgument));
}

void CheckCorruption(const Sparse& s, ChunkKind kind, uint64_t seed) {
  const std::vector<uint8_t> payload = EncodeOk(s, kind);
  Sparse got;
  for (size_t cut = 0; cut < payload.size(); ++cut) {
    const Status st = DecodeInto(s, std::span(payload.data(), cut), &got, kind);
    ASSERT_THAT(st, StatusIs(StatusCode::kDataLoss)) << "cut " << cut;
    ASSERT_FALSE(st.message().empty());
  }
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> b = payload;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f)
      b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    const Status st = DecodeInto(s, b, &got, kind);
    if (st.ok()) {
      for (size_t r = 0; r < got.k(); ++r) {
        ASSERT_LT(got.positions[r], s.n);
        if (r > 0) {
          ASSERT_GT(got.positions[r], got.positions[r - 1]);
        }
      }
    } else {
      ASSERT_THAT(st, StatusIs(StatusCode::kDataLoss));
    }
    (void)DescribePayload(b, kind, s.n, s.w, s.k());
  }
  // Random garbage of every small length.
  for (size_t len = 0; len < 64; ++len) {
    std::vector<uint8_t> junk(len);
    for (auto& x : junk) x = static_cast<uint8_t>(rng());
    (void)DecodeInto(s, junk, &got, kind);
  }
}

TEST(SparseTest, CorruptPayloadsFailCleanly) {
  CheckCorruption(MakeSparse(3000, 2, 30, 21), ChunkKind::kSparseXor, 1);
  CheckCorruption(MakeSparse(5000, 8, 100, 22), ChunkKind::kSparseOverwrite, 2);
  CheckCorruption(MakeSparse(400, 1, 500, 23), ChunkKind::kSparseXor, 3);
  EncodeOptions many;
  many.records_per_lane = 4;
  const Sparse s = MakeSparse(3000, 2, 30, 24);
  std::vector<uint8_t> payload;
  ASSERT_TRUE(EncodeSparse(ChunkKind::kSparseXor, s.n, 2, s.positions,
                           s.values.data(), many, &payload)
                  .ok());
  Sparse got;
  for (size_t cut = 0; cut < payload.size(); ++cut) {
    ASSERT_THAT(DecodeInto(s, std::span(payload.data(), cut), &got),
                StatusIs(StatusCode::kDataLoss));
  }
}

TEST(SparseTest, DecoderChecksPositionsAgainstN) {
  // A payload for n = 1000 decoded as n = 10 must fail, not write past.
  const Sparse s = MakeSparse(1000, 2, 30, 4);
  const std::vector<uint8_t> payload = EncodeOk(s);
  std::vector<uint32_t> p(s.k());
  std::vector<uint8_t> v(s.values.size());
  const uint32_t small_n = std::max<uint32_t>(s.k(), s.positions.back() / 2);
  EXPECT_THAT(DecodeSparse(payload, ChunkKind::kSparseXor, small_n, 2, s.k(),
                           p.data(), v.data()),
              StatusIs(StatusCode::kDataLoss));
}

std::vector<uint8_t> DenseXor(uint32_t n, int w, uint32_t per_mille,
                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> d(size_t{n} * w, 0);
  for (uint32_t i = 0; i < n; ++i) {
    if (rng() % 1000 >= per_mille) continue;
    const uint64_t v = DrawXor(rng, w);
    for (int b = 0; b < w; ++b)
      d[size_t{i} * w + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  return d;
}

std::vector<uint8_t> DenseRoundTrip(const std::vector<uint8_t>& data,
                                    uint32_t n, int w,
                                    EncodeOptions opt = EncodeOptions()) {
  std::vector<uint8_t> payload;
  EXPECT_TRUE(EncodeDense(n, w, data.data(), opt, &payload).ok());
  std::vector<uint8_t> back(data.size(), 0xEE);
  const Status st = DecodeDense(payload, n, w, back.data());
  EXPECT_OK(st);
  EXPECT_EQ(back, data);
  std::vector<uint8_t> again;
  EXPECT_TRUE(EncodeDense(n, w, data.data(), opt, &again).ok());
  EXPECT_EQ(again, payload);
  return payload;
}

std::vector<std::string> DenseModels(std::span<const uint8_t> payload,
                                     uint32_t n, int w) {
  Result<PayloadInfo> info =
      DescribePayload(payload, ChunkKind::kDenseXor, n, w, 0);
  EXPECT_OK(info);
  std::vector<std::string> m;
  if (info.ok()) {
    for (const PlaneInfo& p : info->planes) m.push_back(p.model);
  }
  return m;
}

TEST(DenseTest, RoundTripsAndModes) {
  const uint32_t n = 30000;
  for (int w : {1, 2, 4, 8}) {
    DenseRoundTrip(DenseXor(n, w, 500, w), n, w);
  }
  // Plane 0 skewed (table), plane 1 all zero (constant), plane 2 random
  // (verbatim), plane 3 long runs (zstd).
  std::mt19937_64 rng(8);
  std::vector<uint8_t> d(size_t{n} * 4);
  uint8_t run = 0;
  for (uint32_t i = 0; i < n; ++i) {
    d[4 * i] = static_cast<uint8_t>(rng() % 4 == 0 ? rng() : rng() % 3);
    d[4 * i + 1] = 0;
    d[4 * i + 2] = static_cast<uint8_t>(rng());
    if (i % 500 == 0) run = static_cast<uint8_t>(rng());
    d[4 * i + 3] = run;
  }
  std::vector<uint8_t> payload = DenseRoundTrip(d, n, 4);
  EXPECT_EQ(
      DenseModels(payload, n, 4),
      (std::vector<std::string>{"table", "constant", "verbatim", "zstd"}));
  EncodeOptions no_zstd;
  no_zstd.allow_zstd = false;
  payload = DenseRoundTrip(d, n, 4, no_zstd);
  EXPECT_NE(DenseModels(payload, n, 4)[3], "zstd");
  DenseRoundTrip(std::vector<uint8_t>(8, 0x5a), 1, 8);
}

TEST(DenseTest, CorruptPayloadsFailCleanly) {
  const uint32_t n = 2000;
  std::mt19937_64 rng(12);
  std::vector<uint8_t> d(size_t{n} * 4);
  for (uint32_t i = 0; i < n; ++i) {
    d[4 * i] = static_cast<uint8_t>(rng() % 5);
    d[4 * i + 1] = 7;
    d[4 * i + 2] = static_cast<uint8_t>(rng());
    d[4 * i + 3] = static_cast<uint8_t>(i / 200);
  }
  std::vector<uint8_t> payload;
  ASSERT_TRUE(EncodeDense(n, 4, d.data(), EncodeOptions(), &payload).ok());
  std::vector<uint8_t> out(d.size());
  for (size_t cut = 0; cut < payload.size(); ++cut) {
    ASSERT_THAT(DecodeDense(std::span(payload.data(), cut), n, 4, out.data()),
                StatusIs(StatusCode::kDataLoss))
        << cut;
  }
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> b = payload;
    b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    const Status st = DecodeDense(b, n, 4, out.data());
    if (!st.ok()) {
      ASSERT_THAT(st, StatusIs(StatusCode::kDataLoss));
    }
    (void)DescribePayload(b, ChunkKind::kRaw, n, 4, 0);
  }
  EXPECT_THAT(DecodeDense(payload, n, 3, out.data()),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(DescribeTest, SparseSummary) {
  const Sparse s = MakeSparse(100000, 2, 10, 31);
  const std::vector<uint8_t> payload = EncodeOk(s);
  Result<PayloadInfo> info =
      DescribePayload(payload, ChunkKind::kSparseXor, s.n, 2, s.k());
  ASSERT_OK(info);
  EXPECT_EQ(info->gap_width, 2);
  EXPECT_EQ(info->lanes, static_cast<int>((s.k() + 1023) / 1024));
  ASSERT_EQ(info->planes.size(), 4u);
  EXPECT_EQ(info->planes[0].role, "gap0");
  EXPECT_EQ(info->planes[0].model, "geometric");
  EXPECT_EQ(info->planes[2].role, "value0");
  EXPECT_EQ(info->planes[2].model, "table");
  EXPECT_EQ(info->planes[2].symbols, s.k());
  EXPECT_GT(info->table_bytes, 0u);
  EXPECT_LT(info->table_bytes, 200u);
}

std::string Hex(std::span<const uint8_t> b) {
  std::string s;
  char buf[3];
  for (uint8_t x : b) {
    std::snprintf(buf, sizeof buf, "%02x", x);
    s += buf;
  }
  return s;
}

// Frozen encodings: a change here is a format (or encoder policy) change and
// must come with a new format version or a deliberate golden update.
TEST(GoldenTest, FrozenPayloads) {
  Sparse s;
  s.n = 300;
  s.w = 2;
  const uint16_t xors[] = {1, 3, 1, 7, 1, 1, 0x3f, 3, 1, 0x101, 3, 1};
  uint32_t p = 2;
  for (size_t i = 0; i < std::size(xors); ++i) {
    s.positions.push_back(p);
    s.values.push_back(static_cast<uint8_t>(xors[i]));
    s.values.push_back(static_cast<uint8_t>(xors[i] >> 8));
    p += 1 + static_cast<uint32_t>((i * 37) % 29);
  }
  EncodeOptions opt;
  opt.records_per_lane = 5;
  const std::vector<uint8_t> sparse = EncodeOk(s, ChunkKind::kSparseXor, opt);
  EXPECT_EQ(Hex(sparse),
            "0103051b02321020020ea2021100d0030606069cb19717af428c0e05c92c0c0d29"
            "03fafa");
  std::vector<uint8_t> d(64);
  for (size_t i = 0; i < d.size(); ++i)
    d[i] = static_cast<uint8_t>(i % 2 ? 0 : (i * i) % 5);
  std::vector<uint8_t> dense;
  ASSERT_TRUE(EncodeDense(32, 2, d.data(), EncodeOptions(), &dense).ok());
  EXPECT_EQ(Hex(dense), "02022300d0e60b01c20e03006cf58e3856790000");
  Sparse got;
  ASSERT_TRUE(DecodeInto(s, sparse, &got).ok());
  EXPECT_EQ(got.values, s.values);
}

// Sparse payloads over every width, gap width 1-4, XOR and overwrite values
// and several lane settings, digested: the encoder's model, precision and
// lane choices must never change these bytes.
TEST(GoldenTest, SyntheticSparsePayloadsAreFrozen) {
  std::vector<uint8_t> all;
  auto add = [&](const Sparse& s, ChunkKind kind, uint32_t per_lane) {
    EncodeOptions opt;
    opt.records_per_lane = per_lane;
    const std::vector<uint8_t> payload = EncodeOk(s, kind, opt);
    const uint64_t size = payload.size();
    for (int b = 0; b < 8; ++b) all.push_back(static_cast<uint8_t>(size >> (8 * b)));
    all.insert(all.end(), payload.begin(), payload.end());
  };
  for (int w : {1, 2, 4, 8}) {
    for (uint32_t per_mille : {1u, 20u, 300u, 1000u}) {
      const Sparse s = MakeSparse(20000, w, per_mille, 77 * w + per_mille);
      for (uint32_t per_lane : {1u, 7u, 64u, 1024u}) {
        add(s, ChunkKind::kSparseXor, per_lane);
      }
      // Overwrite values: whole random elements, zeros included.
      Sparse o = s;
      std::mt19937_64 rng(per_mille * 31 + static_cast<uint64_t>(w));
      for (uint8_t& v : o.values) v = static_cast<uint8_t>(rng() >> 56);
      add(o, ChunkKind::kSparseOverwrite, 64);
    }
    // Gaps of every byte width up to the chunk limit.
    Sparse wide;
    wide.n = kMaxChunkElements;
    wide.w = w;
    std::mt19937_64 rng(900 + static_cast<uint64_t>(w));
    for (uint64_t p = rng() % 5; p < wide.n;) {
      wide.positions.push_back(static_cast<uint32_t>(p));
      const uint64_t v = DrawXor(rng, w);
      for (int b = 0; b < w; ++b) wide.values.push_back(static_cast<uint8_t>(v >> (8 * b)));
      const uint64_t r = rng() % 100;
      p += 1 + (r < 70 ? rng() % 200 : r < 95 ? rng() % 70000 : rng() % (uint64_t{1} << 25));
    }
    add(wide, ChunkKind::kSparseXor, 16);
    add(wide, ChunkKind::kSparseXor, 1024);
  }
  EXPECT_EQ(HashBytes(all.data(), all.size()).Hex(), "467baa1abb8d9dc4053fa32a98721de9");
}

}  // namespace
}  // namespace refit::codec
