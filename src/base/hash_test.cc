#include "base/hash.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "base/xxh3_kernels.h"

namespace refit {
namespace {

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(HashTest, StreamingMatchesOneShotAtAnySplit) {
  for (size_t n : {size_t{0}, size_t{1}, kRangeHashSegment - 1,
                   kRangeHashSegment, kRangeHashSegment + 1,
                   3 * kRangeHashSegment, 3 * kRangeHashSegment + 77}) {
    auto v = Random(n, static_cast<uint32_t>(n));
    Hash128 want = RangeHash(v.data(), v.size());
    for (size_t step : {size_t{1000}, size_t{4096}, kRangeHashSegment,
                        size_t{100000}}) {
      RangeHasher h;
      for (size_t off = 0; off < n; off += step) {
        h.Update(v.data() + off, std::min(step, n - off));
      }
      EXPECT_EQ(h.Finish(), want) << "n=" << n << " step=" << step;
    }
  }
}

// HashSegmentDigests is the XXH3-128 of the digests' bytes (lo then hi,
// little-endian), fed one digest at a time or in blocks alike.
TEST(HashTest, SegmentDigestsHashTheirBytes) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{128}, size_t{255}, size_t{256},
                   size_t{257}, size_t{600}}) {
    std::vector<Hash128> d(n);
    const auto bytes = Random(16 * n, static_cast<uint32_t>(n) + 3);
    for (size_t i = 0; i < n; ++i) {
      for (int j = 0; j < 8; ++j) {
        d[i].lo |= uint64_t{bytes[16 * i + j]} << (8 * j);
        d[i].hi |= uint64_t{bytes[16 * i + 8 + j]} << (8 * j);
      }
    }
    const XXH128_hash_t want = XXH3_128bits(bytes.data(), bytes.size());
    EXPECT_EQ(HashSegmentDigests(d.data(), n), (Hash128{want.low64, want.high64})) << n;
  }
}

TEST(HashTest, SensitiveToEveryBit) {
  auto v = Random(200000, 1);
  Hash128 base = RangeHash(v.data(), v.size());
  v[150000] ^= 0x10;
  EXPECT_NE(RangeHash(v.data(), v.size()), base);
}

TEST(HashTest, GoldenValues) {
  // Frozen: the format depends on these never changing.
  std::vector<uint8_t> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ(RangeHash(v.data(), v.size()).Hex(),
            "3b49324677c6ea9b5f8428cf45e0bd64");
  EXPECT_EQ(RangeHash(nullptr, 0), RangeHash(v.data(), 0));
}


// Every XXH3 kernel this CPU can run gives the library's digests, at every
// size class (short inputs, the 240-byte boundary, stripes, blocks, and
// whole 64 KiB segments) and alignment.
TEST(HashTest, InlineKernelsMatchTheLibrary) {
  const std::vector<uint8_t> buf = Random(kRangeHashSegment + 64, 11);
  std::vector<internal::Xxh3Digest (*)(const void*, size_t)> kernels = {&internal::Xxh3Baseline};
#if defined(REFIT_XXH3_X86)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) kernels.push_back(&internal::Xxh3Avx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    kernels.push_back(&internal::Xxh3Avx512);
  }
#endif
  for (size_t size : {size_t{0}, size_t{1}, size_t{3}, size_t{16}, size_t{17}, size_t{128},
                      size_t{129}, size_t{240}, size_t{241}, size_t{1024}, size_t{1025},
                      size_t{4096}, size_t{60000}, kRangeHashSegment}) {
    for (size_t align : {size_t{0}, size_t{1}, size_t{7}}) {
      XXH128_hash_t want = XXH3_128bits(buf.data() + align, size);
      for (auto k : kernels) {
        internal::Xxh3Digest got = k(buf.data() + align, size);
        EXPECT_EQ(got.lo, want.low64) << size << " " << align;
        EXPECT_EQ(got.hi, want.high64) << size << " " << align;
      }
      Hash128 h = HashBytes(buf.data() + align, size);
      EXPECT_EQ(h.lo, want.low64);
      EXPECT_EQ(h.hi, want.high64);
    }
  }
}

}  // namespace
}  // namespace refit
