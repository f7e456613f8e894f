// Conditional XOR chunks (kind 5) through the delta layer: the encoder's
// choice, file and in-memory applies, strided regions, undo, and refusal
// where the kind cannot be used.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <random>

#include "base/bytes.h"
#include "base/hash.h"
#include "delta/apply.h"
#include "delta/chunk.h"
#include "delta/encoder.h"
#include "refit/delta.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;
using testing::TempDir;

uint16_t Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

struct Weights {
  std::string name;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

// A BF16 weight tensor of n elements (normal, sigma 0.02).
Weights MakeWeights(const std::string& name, uint64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 0.02f);
  Weights w{name, {n}, std::vector<uint8_t>(2 * n)};
  for (uint64_t i = 0; i < n; ++i) StoreLE(w.bytes.data() + 2 * i, Bf16(d(rng)), 2);
  return w;
}

// An RL-like step: each element moves by a similar small amount, so it
// changes (by one unit in the last place, mostly) more often where its
// exponent, and so its rounding step, is small.
void Step(Weights* w, double scale, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  for (size_t i = 0; i < w->bytes.size(); i += 2) {
    const uint16_t b = static_cast<uint16_t>(LoadLE(w->bytes.data() + i, 2));
    const int e = (b >> 7) & 0xff;
    if (u(rng) >= std::min(1.0, scale * std::ldexp(1.0, 120 - e))) continue;
    const uint16_t nb = static_cast<uint16_t>(rng() % 2 ? b + 1 : b - 1);
    StoreLE(w->bytes.data() + i, nb, 2);
  }
}

std::vector<TensorView> Views(const std::vector<Weights>& ws) {
  std::vector<TensorView> v;
  for (const auto& w : ws) v.push_back({w.name, "BF16", 2, w.shape, w.bytes.data()});
  return v;
}
std::vector<MutableTensorView> MutViews(std::vector<Weights>& ws) {
  std::vector<MutableTensorView> v;
  for (auto& w : ws) v.push_back({w.name, "BF16", 2, w.shape, w.bytes.data()});
  return v;
}

TEST(ConditionalApplyTest, DiffPicksItAndTheDeltaApplies) {
  std::mt19937_64 rng(1);
  std::vector<Weights> base = {MakeWeights("a", 300000, rng), MakeWeights("b", 5000, rng)};
  auto target = base;
  for (auto& t : target) Step(&t, 0.003, rng);
  TempDir dir;
  DiffOptions plain;
  plain.chunk_bytes = 256 * 1024;
  DiffOptions cond = plain;
  cond.allow_conditional = true;
  auto r0 = DiffTensors(Views(base), Views(target), dir.File("plain.rfd"), plain);
  auto r1 = DiffTensors(Views(base), Views(target), dir.File("cond.rfd"), cond);
  ASSERT_OK(r0);
  ASSERT_OK(r1);
  EXPECT_EQ(r0->chunks_by_kind.count("conditional-xor"), 0u);
  EXPECT_GT(r1->chunks_by_kind["conditional-xor"], 0u);
  EXPECT_LT(r1->payload_bytes, r0->payload_bytes * 8 / 10)
      << r1->payload_bytes << " vs " << r0->payload_bytes;
  auto work = base;
  auto applied = ApplyToTensors(dir.File("cond.rfd"), MutViews(work), {});
  ASSERT_OK(applied);
  for (size_t i = 0; i < work.size(); ++i) EXPECT_EQ(work[i].bytes, target[i].bytes);
  // At "after": skipped, nothing decoded against the wrong base.
  auto again = ApplyToTensors(dir.File("cond.rfd"), MutViews(work), {});
  ASSERT_OK(again);
  EXPECT_EQ(again->chunks_applied, 0u);
  for (size_t i = 0; i < work.size(); ++i) EXPECT_EQ(work[i].bytes, target[i].bytes);
  // The same delta written twice is the same bytes.
  ASSERT_OK(DiffTensors(Views(base), Views(target), dir.File("cond2.rfd"), cond));
  EXPECT_EQ(testing::ReadBytes(dir.File("cond.rfd")), testing::ReadBytes(dir.File("cond2.rfd")));
  // Inspect checks the framing but gives no bound without the base.
  auto info = Inspect(dir.File("cond.rfd"));
  ASSERT_OK(info);
  EXPECT_FALSE(info->bound_valid);
  EXPECT_EQ(info->changed_elements, r1->changed_elements);
}

TEST(ConditionalApplyTest, ChunkAppliesInPlaceAndUndoesFromItsRecord) {
  std::mt19937_64 rng(2);
  Weights base = MakeWeights("w", 100000, rng);
  Weights target = base;
  Step(&target, 0.003, rng);
  ChunkHeader ids;
  ids.version = 2;
  ids.base_version = 1;
  ids.width = 2;
  ChunkEncodeOptions opts;
  opts.allow_conditional = true;
  EncodeScratch scratch;
  ChunkResult result;
  ASSERT_OK(EncodeChunkRange(ids, base.bytes.data(), target.bytes.data(), 0, 100000, opts,
                             &scratch, &result));
  auto parsed = ParseChunk(result.chunk);
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->header.kind, codec::ChunkKind::kConditionalXor);
  EXPECT_TRUE(parsed->header.IsXor());
  Weights work = base;
  ApplyScratch as;
  UndoRecord undo;
  ASSERT_OK(ApplyChunkInPlace(*parsed, work.bytes.data(), &as, nullptr, &undo));
  EXPECT_EQ(work.bytes, target.bytes);
  EXPECT_EQ(undo.at.size(), parsed->header.changed);
  // Without the recorded old bytes there is nothing to undo from: the
  // records were coded given the base, which the range no longer holds.
  EXPECT_THAT(UndoChunkInPlace(*parsed, work.bytes.data(), &as, {}),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(work.bytes, target.bytes);
  ASSERT_OK(UndoChunkInPlace(*parsed, work.bytes.data(), &as, undo));
  EXPECT_EQ(work.bytes, base.bytes);
  // Against another base the chunk is refused (and nothing is written).
  Weights other = MakeWeights("w", 100000, rng);
  const auto before = other.bytes;
  EXPECT_FALSE(ApplyChunkInPlace(*parsed, other.bytes.data(), &as, nullptr, nullptr).ok());
  EXPECT_EQ(other.bytes, before);
}

TEST(ConditionalApplyTest, StridedRegionDecodesAgainstItsRows) {
  std::mt19937_64 rng(3);
  const uint64_t rows = 64, cols = 300;
  Weights base = MakeWeights("m", rows * cols, rng);
  Weights target = base;
  Step(&target, 0.01, rng);
  // Columns [100, 250) of every row.
  const uint64_t c0 = 100, c1 = 250;
  std::vector<uint8_t> a, b;
  for (uint64_t r = 0; r < rows; ++r) {
    a.insert(a.end(), base.bytes.begin() + 2 * (r * cols + c0),
             base.bytes.begin() + 2 * (r * cols + c1));
    b.insert(b.end(), target.bytes.begin() + 2 * (r * cols + c0),
             target.bytes.begin() + 2 * (r * cols + c1));
  }
  ChunkHeader ids;
  ids.version = 1;
  ids.width = 2;
  ChunkEncodeOptions opts;
  opts.allow_conditional = true;
  EncodeScratch scratch;
  ChunkResult result;
  ASSERT_OK(EncodeRegionChunk(ids, a.data(), b.data(), c0, rows * (c1 - c0), c1 - c0, cols,
                              opts, &scratch, &result));
  auto parsed = ParseChunk(result.chunk);
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->header.kind, codec::ChunkKind::kConditionalXor);
  Weights work = base;
  ApplyScratch as;
  ASSERT_OK(ApplyChunkInPlace(*parsed, work.bytes.data(), &as, nullptr, nullptr));
  Weights expected = base;
  for (uint64_t r = 0; r < rows; ++r) {
    std::memcpy(expected.bytes.data() + 2 * (r * cols + c0),
                target.bytes.data() + 2 * (r * cols + c0), 2 * (c1 - c0));
  }
  EXPECT_EQ(work.bytes, expected.bytes);
}

TEST(ConditionalApplyTest, ParserRefusesOtherWidthsAndUnknownKinds) {
  ChunkHeader h;
  h.kind = codec::ChunkKind::kConditionalXor;
  h.width = 4;
  h.count = 10;
  h.changed = 1;
  std::vector<uint8_t> bytes;
  const uint8_t payload[1] = {0};
  SerializeChunk(h, payload, &bytes);
  EXPECT_THAT(ParseChunk(bytes), StatusIs(StatusCode::kDataLoss));
  // A kind this build does not know (as kind 5 is to builds before it).
  h.width = 2;
  bytes.clear();
  SerializeChunk(h, payload, &bytes);
  ASSERT_OK(ParseChunk(bytes));
  bytes[5] = 6;  // the kind byte; the checksum fails first unless refreshed
  const uint32_t sum = static_cast<uint32_t>(
      XXH3_64bits(bytes.data(), bytes.size() - 4));
  StoreLE(bytes.data() + bytes.size() - 4, sum, 4);
  auto bad = ParseChunk(bytes);
  EXPECT_THAT(bad, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(bad.status().message().find("unknown kind"), std::string::npos);
}

// Golden: a fixed BF16 step's delta with conditional chunks never changes
// within format version 2.
TEST(GoldenTest, ConditionalDeltaBytesAreFrozen) {
  std::vector<Weights> base, target;
  for (int t = 0; t < 2; ++t) {
    Weights x{"t" + std::to_string(t), {30000}, std::vector<uint8_t>(60000)};
    uint32_t s = 777u + static_cast<uint32_t>(t);
    for (size_t i = 0; i < 30000; ++i) {
      s = s * 1664525u + 1013904223u;
      // Exponents 116..123 and a random mantissa: weights of 2^-11 .. 2^-4.
      const uint16_t v = static_cast<uint16_t>((s >> 31) << 15 | (116 + (s >> 8) % 8) << 7 |
                                               (s >> 12) % 128);
      StoreLE(x.bytes.data() + 2 * i, v, 2);
    }
    Weights y = x;
    for (size_t i = 0; i < 30000; ++i) {
      s = s * 1664525u + 1013904223u;
      const uint16_t v = static_cast<uint16_t>(LoadLE(x.bytes.data() + 2 * i, 2));
      const uint32_t e = (v >> 7) & 0xff;
      if ((s >> 16) % 1024 >= (1u << (124 - e))) continue;
      StoreLE(y.bytes.data() + 2 * i, static_cast<uint16_t>(s % 2 ? v + 1 : v - 1), 2);
    }
    base.push_back(x);
    target.push_back(y);
  }
  TempDir dir;
  DiffOptions opts;
  opts.version = 2;
  opts.base_version = 1;
  opts.chunk_bytes = 64 * 1024;
  opts.allow_conditional = true;
  auto r = DiffTensors(Views(base), Views(target), dir.File("g.rfd"), opts);
  ASSERT_OK(r);
  EXPECT_EQ(r->chunks_by_kind["conditional-xor"], 2u);
  auto bytes = testing::ReadBytes(dir.File("g.rfd"));
  EXPECT_EQ(HashBytes(bytes.data(), bytes.size()).Hex(), "0e431ea946d1a3de9753e9d3c6573c0f");
  // It is also the fuzz corpus's fuzz/corpus/delta/conditional.rfd (and its
  // first chunk fuzz/corpus/chunk/conditional.chunk).
  EXPECT_EQ(bytes, testing::ReadBytes(std::string(REFIT_FUZZ_CORPUS) + "/delta/conditional.rfd"));
  auto work = base;
  ASSERT_OK(ApplyToTensors(dir.File("g.rfd"), MutViews(work), {}));
  for (size_t i = 0; i < work.size(); ++i) EXPECT_EQ(work[i].bytes, target[i].bytes);
}

}  // namespace
}  // namespace refit
