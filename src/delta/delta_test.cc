// Round trips and hostile-input tests of the delta layer on generated data.
#include "refit/delta.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "base/bytes.h"
#include "base/hash.h"
#include "delta/chunk.h"
#include "delta/delta_file.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using testing::TempDir;

struct Tensor {
  std::string name;
  std::string dtype;
  int width;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
  uint64_t elements() const {
    uint64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

std::vector<TensorView> Views(const std::vector<Tensor>& ts) {
  std::vector<TensorView> v;
  for (const auto& t : ts) v.push_back({t.name, t.dtype, t.width, t.shape, t.bytes.data()});
  return v;
}

std::vector<MutableTensorView> MutViews(std::vector<Tensor>& ts) {
  std::vector<MutableTensorView> v;
  for (auto& t : ts) v.push_back({t.name, t.dtype, t.width, t.shape, t.bytes.data()});
  return v;
}

const char* DtypeFor(int w) {
  switch (w) {
    case 1: return "U8";
    case 2: return "BF16";
    case 4: return "F32";
    default: return "F64";
  }
}

Tensor RandomTensor(const std::string& name, int w, uint64_t n, std::mt19937_64& rng) {
  Tensor t{name, DtypeFor(w), w, {n}, std::vector<uint8_t>(n * w)};
  for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
  return t;
}

// Changes a fraction `rate` of elements by small ulp-like XORs.
void Mutate(Tensor* t, double rate, std::mt19937_64& rng, int random_in = 10) {
  std::uniform_real_distribution<double> u(0, 1);
  const int w = t->width;
  for (uint64_t i = 0; i < t->elements(); ++i) {
    if (u(rng) >= rate) continue;
    uint64_t mask = (uint64_t{1} << (1 + rng() % 4)) - 1;
    if (random_in > 0 && rng() % random_in == 0) mask = rng();
    if (w < 8) mask &= (uint64_t{1} << (8 * w)) - 1;
    if (mask == 0) mask = 1;
    uint8_t* p = t->bytes.data() + i * w;
    StoreLE(p, LoadLE(p, w) ^ mask, w);
  }
}

// Diffs base -> target, applies to a copy of base, checks bit-exactness.
DiffReport RoundTrip(const std::vector<Tensor>& base, const std::vector<Tensor>& target,
                     DiffOptions opts = {}) {
  TempDir dir;
  std::string path = dir.File("d.rfd");
  auto report = DiffTensors(Views(base), Views(target), path, opts);
  EXPECT_OK(report);
  if (!report.ok()) return {};
  std::vector<Tensor> work = base;
  auto applied = ApplyToTensors(path, MutViews(work), {});
  EXPECT_OK(applied);
  for (size_t i = 0; i < work.size(); ++i) {
    EXPECT_EQ(work[i].bytes, target[i].bytes) << work[i].name;
  }
  // A second apply is a no-op: every chunk is already at "after".
  auto again = ApplyToTensors(path, MutViews(work), {});
  EXPECT_OK(again);
  if (again.ok()) {
    EXPECT_EQ(again->chunks_applied, 0u);
  }
  for (size_t i = 0; i < work.size(); ++i) EXPECT_EQ(work[i].bytes, target[i].bytes);
  auto info = Inspect(path);
  EXPECT_OK(info);
  if (info.ok()) {
    EXPECT_EQ(info->changed_elements, report->changed_elements);
  }
  return *report;
}

TEST(DeltaTest, AllWidthsAndRates) {
  std::mt19937_64 rng(1);
  for (int w : {1, 2, 4, 8}) {
    for (double rate : {0.0, 0.001, 0.03, 0.5, 1.0}) {
      std::vector<Tensor> base = {RandomTensor("a", w, 70001, rng),
                                  RandomTensor("b", w, 333, rng)};
      auto target = base;
      for (auto& t : target) Mutate(&t, rate, rng);
      SCOPED_TRACE("w=" + std::to_string(w) + " rate=" + std::to_string(rate));
      DiffOptions opts;
      opts.chunk_bytes = 64 * 1024;  // several chunks per tensor
      RoundTrip(base, target, opts);
    }
  }
}

TEST(DeltaTest, FloatEdgeCasesAreBitPatterns) {
  // +0 -> -0, NaN payload changes, subnormals: all are changes.
  std::vector<float> a = {0.0f, 1.0f, std::nanf(""), 1e-45f, 3.0f};
  std::vector<float> b = a;
  b[0] = -0.0f;
  uint32_t nan_bits;
  std::memcpy(&nan_bits, &b[2], 4);
  nan_bits ^= 1;
  std::memcpy(&b[2], &nan_bits, 4);
  b[3] = 3e-45f;  // two denormal ulps up
  auto bytes = [](const std::vector<float>& v) {
    std::vector<uint8_t> out(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  };
  std::vector<Tensor> base = {{"f", "F32", 4, {5}, bytes(a)}};
  std::vector<Tensor> target = {{"f", "F32", 4, {5}, bytes(b)}};
  auto r = RoundTrip(base, target);
  EXPECT_EQ(r.changed_elements, 3u);
}

TEST(DeltaTest, EmptyScalarAndOneElementTensors) {
  std::vector<Tensor> base = {{"empty", "BF16", 2, {0}, {}},
                              {"one", "BF16", 2, {1}, {1, 2}},
                              {"scalar", "F32", 4, {}, {1, 2, 3, 4}}};
  auto target = base;
  target[1].bytes = {1, 3};
  target[2].bytes = {9, 2, 3, 4};
  auto r = RoundTrip(base, target);
  EXPECT_EQ(r.changed_elements, 2u);
  EXPECT_EQ(r.changed_tensors, 2u);
}

TEST(DeltaTest, FirstAndLastElementAndNoChange) {
  std::mt19937_64 rng(2);
  std::vector<Tensor> base = {RandomTensor("x", 2, 100000, rng)};
  auto target = base;
  target[0].bytes[0] ^= 1;
  target[0].bytes[target[0].bytes.size() - 1] ^= 0x80;
  auto r = RoundTrip(base, target);
  EXPECT_EQ(r.changed_elements, 2u);
  auto none = RoundTrip(base, base);
  EXPECT_EQ(none.chunks, 0u);
}

TEST(DeltaTest, HalfDenseStepStaysNearTheBound) {
  std::mt19937_64 rng(3);
  std::vector<Tensor> base = {RandomTensor("x", 2, 1 << 18, rng)};
  auto target = base;
  Mutate(&target[0], 0.5, rng, /*random_in=*/0);  // ulp-sized changes only
  TempDir dir;
  ASSERT_OK(DiffTensors(Views(base), Views(target), dir.File("d"), {}));
  auto info = Inspect(dir.File("d"));
  ASSERT_OK(info);
  ASSERT_TRUE(info->bound_valid);
  EXPECT_LT(static_cast<double>(info->payload_bytes), 1.05 * info->bound_bytes);
  RoundTrip(base, target);
}

TEST(DeltaTest, EncoderPicksDenseKindsWhereTheyWin) {
  std::mt19937_64 rng(8);
  // A tensor reset to zeros: the new bytes are constant, the XOR is not.
  std::vector<Tensor> base = {RandomTensor("x", 2, 1 << 17, rng)};
  auto zeros = base;
  std::fill(zeros[0].bytes.begin(), zeros[0].bytes.end(), 0);
  auto r = RoundTrip(base, zeros);
  EXPECT_EQ(r.chunks_by_kind["raw"], r.chunks);
  EXPECT_LT(r.payload_bytes, 1000u);
  // Every element changed by a repeating XOR pattern: order-0 coding of
  // records pays ~2 bits each, zstd on the dense XOR plane almost nothing.
  auto periodic = base;
  for (uint64_t i = 0; i < periodic[0].elements(); ++i) {
    uint8_t* p = periodic[0].bytes.data() + 2 * i;
    StoreLE(p, LoadLE(p, 2) ^ ((uint64_t{2} << (i % 4)) - 1), 2);
  }
  auto d = RoundTrip(base, periodic);
  EXPECT_EQ(d.chunks_by_kind["dense-xor"], d.chunks);
}

TEST(DeltaTest, SparseApplyTouchesFewPages) {
  std::mt19937_64 rng(9);
  std::vector<Tensor> base = {RandomTensor("x", 2, 1 << 22, rng)};  // 8 MiB
  auto target = base;
  for (int i = 0; i < 100; ++i) {
    target[0].bytes[2 * (rng() % (1 << 22))] ^= 1;
  }
  TempDir dir;
  ASSERT_OK(DiffTensors(Views(base), Views(target), dir.File("d"), {}));
  auto work = base;
  auto r = ApplyToTensors(dir.File("d"), MutViews(work), {});
  ASSERT_OK(r);
  EXPECT_LE(r->pages_written, 100u);
  EXPECT_EQ(work[0].bytes, target[0].bytes);
}

TEST(DeltaTest, OverwriteOnlyDeltasApplyWithoutXor) {
  std::mt19937_64 rng(4);
  std::vector<Tensor> base = {RandomTensor("x", 2, 50000, rng)};
  auto target = base;
  Mutate(&target[0], 0.02, rng);
  DiffOptions opts;
  opts.allow_xor = false;
  auto r = RoundTrip(base, target, opts);
  EXPECT_EQ(r.chunks_by_kind.count("sparse-xor"), 0u);
  EXPECT_EQ(r.chunks_by_kind.count("dense-xor"), 0u);
}

TEST(DeltaTest, EncodingIsDeterministic) {
  std::mt19937_64 rng(5);
  std::vector<Tensor> base = {RandomTensor("x", 2, 300000, rng),
                              RandomTensor("y", 4, 1000, rng)};
  auto target = base;
  for (auto& t : target) Mutate(&t, 0.03, rng);
  TempDir dir;
  for (int threads : {1, 2}) {
    DiffOptions opts;
    opts.threads = threads;
    opts.chunk_bytes = 128 * 1024;
    ASSERT_OK(DiffTensors(Views(base), Views(target), dir.File(std::to_string(threads)), opts));
  }
  ASSERT_OK(DiffTensors(Views(base), Views(target), dir.File("again"), {}));
  DiffOptions one;
  one.chunk_bytes = 128 * 1024;
  ASSERT_OK(DiffTensors(Views(base), Views(target), dir.File("1b"), one));
  EXPECT_EQ(testing::ReadBytes(dir.File("1")), testing::ReadBytes(dir.File("2")));
  EXPECT_EQ(testing::ReadBytes(dir.File("1")), testing::ReadBytes(dir.File("1b")));
}

class BadDeltaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(6);
    base_ = {RandomTensor("a", 2, 40000, rng), RandomTensor("b", 4, 5000, rng)};
    target_ = base_;
    for (auto& t : target_) Mutate(&t, 0.05, rng);
    path_ = dir_.File("d.rfd");
    DiffOptions opts;
    opts.chunk_bytes = 64 * 1024;
    ASSERT_OK(DiffTensors(Views(base_), Views(target_), path_, opts));
    good_ = testing::ReadBytes(path_);
  }

  // Applies `delta` bytes to a copy of base; the copy must be unchanged
  // whenever the apply fails.
  Status TryApply(const std::vector<uint8_t>& delta) {
    testing::WriteBytes(dir_.File("bad.rfd"), delta);
    auto work = base_;
    auto r = ApplyToTensors(dir_.File("bad.rfd"), MutViews(work), {});
    if (!r.ok()) {
      for (size_t i = 0; i < work.size(); ++i) {
        EXPECT_EQ(work[i].bytes, base_[i].bytes) << "failed apply wrote to " << work[i].name;
      }
      return r.status();
    }
    for (size_t i = 0; i < work.size(); ++i) EXPECT_EQ(work[i].bytes, target_[i].bytes);
    return Status();
  }

  TempDir dir_;
  std::string path_;
  std::vector<Tensor> base_, target_;
  std::vector<uint8_t> good_;
};

TEST_F(BadDeltaTest, EveryTruncationFails) {
  for (size_t len = 0; len < good_.size(); len += 1 + len / 50) {
    std::vector<uint8_t> cut(good_.begin(), good_.begin() + static_cast<long>(len));
    Status s = TryApply(cut);
    EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss))
        << len << ": " << s.ToString();
  }
}

TEST_F(BadDeltaTest, BitFlipsAreDetected) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    auto bad = good_;
    size_t pos = rng() % bad.size();
    bad[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
    Status s = TryApply(bad);
    EXPECT_FALSE(s.ok()) << "flip at " << pos << " went unnoticed";
  }
}

TEST_F(BadDeltaTest, ReorderedChunksAreRejected) {
  auto reader = DeltaReader::FromBytes(good_);
  ASSERT_OK(reader);
  ASSERT_GE(reader->index().size(), 2u);
  const IndexEntry& a = reader->index()[0];
  const IndexEntry& b = reader->index()[1];
  // Swap the first two chunks' bytes in place (same total size).
  std::vector<uint8_t> bad(good_.begin(), good_.begin() + static_cast<long>(a.offset));
  bad.insert(bad.end(), good_.begin() + static_cast<long>(b.offset),
             good_.begin() + static_cast<long>(b.offset + b.size));
  bad.insert(bad.end(), good_.begin() + static_cast<long>(a.offset),
             good_.begin() + static_cast<long>(a.offset + a.size));
  bad.insert(bad.end(), good_.begin() + static_cast<long>(b.offset + b.size), good_.end());
  Status s = TryApply(bad);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
}

TEST_F(BadDeltaTest, WrongBaseFailsBeforeWriting) {
  auto other = base_;
  other[1].bytes[100] ^= 1;  // one bit off in a tensor the delta touches
  testing::WriteBytes(dir_.File("x.rfd"), good_);
  auto work = other;
  auto r = ApplyToTensors(dir_.File("x.rfd"), MutViews(work), {});
  EXPECT_THAT(r, StatusIs(StatusCode::kFailedPrecondition));
  for (size_t i = 0; i < work.size(); ++i) EXPECT_EQ(work[i].bytes, other[i].bytes);
  // A tensor set with a missing tensor is refused too.
  std::vector<Tensor> missing = {base_[0]};
  auto r2 = ApplyToTensors(dir_.File("x.rfd"), MutViews(missing), {});
  EXPECT_THAT(r2, StatusIs(StatusCode::kFailedPrecondition));
}

TEST_F(BadDeltaTest, TargetIsNoOpAndVerifiedOk) {
  EXPECT_OK(TryApply(good_));
  auto work = target_;
  auto r = ApplyToTensors(path_, MutViews(work), {});
  ASSERT_OK(r);
  EXPECT_EQ(r->chunks_applied, 0u);
}

TEST(ChunkTest, HeaderRoundTripAndChecksum) {
  ChunkHeader h;
  h.kind = codec::ChunkKind::kSparseXor;
  h.width = 2;
  h.version = 7;
  h.base_version = 6;
  h.tensor_id = 3;
  h.start = 32768;
  h.count = 1000;
  h.changed = 10;
  h.before = Hash128{1, 2};
  h.after = Hash128{3, 4};
  std::vector<uint8_t> payload = {9, 8, 7};
  std::vector<uint8_t> buf;
  SerializeChunk(h, payload, &buf);
  auto c = ParseChunk(buf);
  ASSERT_OK(c);
  EXPECT_EQ(c->header.start, 32768u);
  EXPECT_EQ(c->header.after, (Hash128{3, 4}));
  EXPECT_EQ(std::vector<uint8_t>(c->payload.begin(), c->payload.end()), payload);
  for (size_t i = 0; i < buf.size(); ++i) {
    auto bad = buf;
    bad[i] ^= 0x01;
    EXPECT_FALSE(ParseChunk(bad).ok()) << i;
  }
  // The header alone: the same fields, and every check but the checksum's
  // (a flipped payload or checksum byte passes; a flipped magic does not).
  auto header = ParseChunkHeader(buf);
  ASSERT_OK(header);
  EXPECT_EQ(header->tensor_id, 3u);
  EXPECT_EQ(header->count, 1000u);
  EXPECT_EQ(header->before, (Hash128{1, 2}));
  auto flipped = buf;
  flipped[buf.size() - 5] ^= 0x01;  // the last payload byte
  EXPECT_TRUE(ParseChunkHeader(flipped).ok());
  flipped[buf.size() - 1] ^= 0x01;  // and the checksum's
  EXPECT_TRUE(ParseChunkHeader(flipped).ok());
  flipped[0] ^= 0x01;
  EXPECT_THAT(ParseChunkHeader(flipped), StatusIs(StatusCode::kDataLoss));
  EXPECT_FALSE(ParseChunkHeader(std::span(buf).first(buf.size() - 2)).ok());
}

// A payload in two parts, framed into a vector or into raw memory, gives
// the bytes of the one-part SerializeChunk, within ChunkSizeBound, for
// strided headers and the largest field values too; appending keeps what
// the vector held.
TEST(ChunkTest, TwoPartAndRawFramingEqualOnePart) {
  ChunkHeader h;
  h.kind = codec::ChunkKind::kSparseOverwrite;
  h.width = 8;
  h.version = ~uint64_t{0};
  h.base_version = ~uint64_t{0} - 1;
  h.tensor_id = ~uint64_t{0};
  h.start = ~uint64_t{0} >> 1;
  h.count = ~uint64_t{0} >> 2;
  h.run = ~uint64_t{0} >> 3;
  h.stride = ~uint64_t{0} >> 4;
  h.changed = ~uint64_t{0} >> 5;
  h.before = Hash128{~uint64_t{0}, 1};
  h.after = Hash128{2, ~uint64_t{0}};
  ASSERT_TRUE(h.IsStrided());
  for (size_t split : {size_t{0}, size_t{1}, size_t{500}, size_t{1000}}) {
    std::vector<uint8_t> payload(1000);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
    const std::span<const uint8_t> all(payload);
    std::vector<uint8_t> one, two = {42};
    SerializeChunk(h, all, &one);
    SerializeChunk(h, all.first(split), all.subspan(split), &two);
    ASSERT_EQ(two.size(), one.size() + 1);
    EXPECT_EQ(two[0], 42);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), two.begin() + 1));
    EXPECT_LE(one.size(), ChunkSizeBound(payload.size()));
    std::vector<uint8_t> raw(ChunkSizeBound(payload.size()) + 1, 0xee);
    const size_t n = SerializeChunkTo(h, all.first(split), all.subspan(split), raw.data());
    ASSERT_EQ(n, one.size());
    EXPECT_TRUE(std::equal(one.begin(), one.end(), raw.begin()));
    EXPECT_EQ(raw.back(), 0xee);
  }
}

}  // namespace
}  // namespace refit

namespace refit {
namespace {

// The fixed input of the golden deltas: three tensors and a sparse step.
void GoldenTensors(std::vector<Tensor>* base, std::vector<Tensor>* target) {
  for (int t = 0; t < 3; ++t) {
    const int w = t == 2 ? 4 : 2;
    Tensor x{"t" + std::to_string(t), w == 2 ? "BF16" : "F32", w, {40000}, {}};
    x.bytes.resize(40000 * static_cast<size_t>(w));
    uint32_t s = 12345u + static_cast<uint32_t>(t);
    for (auto& b : x.bytes) {
      s = s * 1664525u + 1013904223u;
      b = static_cast<uint8_t>(s >> 24);
    }
    Tensor y = x;
    for (size_t i = 0; i < 40000; i += 7 + static_cast<size_t>(t)) {
      y.bytes[i * static_cast<size_t>(w)] ^= static_cast<uint8_t>(1u << (i % 3));
    }
    base->push_back(x);
    target->push_back(y);
  }
}

// Golden: a fixed input's delta bytes never change within format version 2
// (docs/format.md). If this fails, the encoder's output drifted: either
// restore it or bump the format version and freeze a new golden.
TEST(GoldenTest, FormatVersion2DeltaBytesAreFrozen) {
  std::vector<Tensor> base, target;
  GoldenTensors(&base, &target);
  TempDir dir;
  DiffOptions opts;
  opts.version = 2;
  opts.base_version = 1;
  opts.chunk_bytes = 64 * 1024;
  ASSERT_OK(DiffTensors(Views(base), Views(target), dir.File("g.rfd"), opts));
  auto bytes = testing::ReadBytes(dir.File("g.rfd"));
  EXPECT_EQ(bytes.size(), 2955u);
  EXPECT_EQ(HashBytes(bytes.data(), bytes.size()).Hex(),
            "01bffa3f6ddabaf9242f0551f556e0ce");
}

// The version 1 golden, frozen as a file when version 2 came: the same
// input's delta as version 1 wrote it (no file headers). It must keep
// reading and applying.
TEST(GoldenTest, FormatVersion1DeltaStillApplies) {
  const std::string path = std::string(REFIT_DELTA_TESTDATA) + "/golden_v1.rfd";
  auto bytes = testing::ReadBytes(path);
  ASSERT_EQ(bytes.size(), 2954u);
  EXPECT_EQ(HashBytes(bytes.data(), bytes.size()).Hex(),
            "8bc701f032de025f5aa7c12b87ea8996");
  auto reader = DeltaReader::Open(path);
  ASSERT_OK(reader);
  EXPECT_EQ(reader->format_version(), 1);
  EXPECT_TRUE(reader->headers().empty());
  std::vector<Tensor> base, target;
  GoldenTensors(&base, &target);
  auto applied = ApplyToTensors(path, MutViews(base), {});
  ASSERT_OK(applied);
  EXPECT_GT(applied->chunks_applied, 0u);
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_EQ(base[i].bytes, target[i].bytes) << base[i].name;
  }
  auto info = Inspect(path);
  ASSERT_OK(info);
  EXPECT_EQ(info->format_version, 1u);
}

}  // namespace
}  // namespace refit
