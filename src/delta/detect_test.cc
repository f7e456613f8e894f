#include "delta/detect.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace refit {
namespace internal {
// Names the level in gtest messages and ctest names.
void PrintTo(DetectLevel level, std::ostream* os) {
  *os << DetectLevelName(level);
}
}  // namespace internal

namespace {

using internal::DetectLevel;

constexpr int kWidths[] = {1, 2, 4, 8};

// The oracle: one memcmp per element.
std::vector<uint32_t> NaiveChanged(const uint8_t* a, const uint8_t* b,
                                   uint64_t n, int width) {
  std::vector<uint32_t> out;
  for (uint64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i * width, b + i * width, width) != 0) {
      out.push_back(static_cast<uint32_t>(i));
    }
  }
  return out;
}

// A heap block of exactly offset + size bytes, so that AddressSanitizer
// flags any read past the end; data() is `offset` bytes in, to test
// unaligned inputs.
class Buffer {
 public:
  Buffer(size_t size, size_t offset)
      : block_(new uint8_t[offset + size]), data_(block_.get() + offset) {}
  uint8_t* data() { return data_; }

 private:
  std::unique_ptr<uint8_t[]> block_;
  uint8_t* data_;
};

// Two buffers of n width-byte elements: `a` random, `b` a copy of `a` in
// which each element differs with probability `rate`.
struct Pair {
  Pair(uint64_t elems, int elem_width, double rate, uint64_t seed,
       size_t offset_a = 0, size_t offset_b = 0)
      : n(elems),
        width(elem_width),
        bytes(static_cast<size_t>(n) * static_cast<size_t>(width)),
        a_buf(bytes, offset_a),
        b_buf(bytes, offset_b) {
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < bytes; ++i) a()[i] = static_cast<uint8_t>(rng());
    std::memcpy(b(), a(), bytes);
    std::bernoulli_distribution change(rate);
    for (uint64_t i = 0; i < n; ++i) {
      if (change(rng)) FlipRandomBit(i, &rng);
    }
  }
  uint8_t* a() { return a_buf.data(); }
  uint8_t* b() { return b_buf.data(); }
  void FlipBit(uint64_t elem, int bit) {
    b()[elem * width + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  void FlipRandomBit(uint64_t elem, std::mt19937_64* rng) {
    FlipBit(elem, static_cast<int>((*rng)() % (8 * width)));
  }
  std::vector<uint32_t> Expected() { return NaiveChanged(a(), b(), n, width); }

  uint64_t n;
  int width;
  size_t bytes;
  Buffer a_buf;
  Buffer b_buf;
};

// Tests run once per dispatch level, each forced explicitly; a level the CPU
// lacks is skipped, loudly.
class DetectTest : public ::testing::TestWithParam<DetectLevel> {
 protected:
  void SetUp() override {
    if (!internal::DetectLevelSupported(GetParam())) {
      GTEST_SKIP() << internal::DetectLevelName(GetParam())
                   << " not supported on this CPU";
    }
  }

  // Checks FindChangedAt and CountChangedAt against the oracle.
  void ExpectMatches(Pair& p, const std::string& what) {
    SCOPED_TRACE(what + " width=" + std::to_string(p.width) +
                 " n=" + std::to_string(p.n));
    const std::vector<uint32_t> expected = p.Expected();
    std::vector<uint32_t> got;
    EXPECT_EQ(
        internal::FindChangedAt(GetParam(), p.a(), p.b(), p.n, p.width, &got),
        expected.size());
    EXPECT_EQ(got, expected);
    EXPECT_EQ(internal::CountChangedAt(GetParam(), p.a(), p.b(), p.n, p.width),
              expected.size());
  }
};

TEST_P(DetectTest, RandomChangeRates) {
  uint64_t seed = 1;
  for (int width : kWidths) {
    for (double rate : {0.0, 0.001, 0.03, 0.5, 1.0}) {
      // Spans several FindRange chunks and ends mid-block.
      Pair p(100'003, width, rate, seed++);
      ExpectMatches(p, "rate=" + std::to_string(rate));
    }
  }
}

TEST_P(DetectTest, EveryLengthUpTo300) {
  uint64_t seed = 100;
  for (int width : kWidths) {
    for (uint64_t n = 0; n <= 300; ++n) {
      Pair p(n, width, 0.1, seed++);
      ExpectMatches(p, "rate=0.1");
      Pair all(n, width, 1.0, seed++);
      ExpectMatches(all, "rate=1");
    }
  }
}

TEST_P(DetectTest, FirstAndLastElement) {
  for (int width : kWidths) {
    for (uint64_t n :
         {1,   2,   3,   31,  32,   33,   63,   64,   65,   127,  128,
          129, 255, 256, 257, 1023, 4097, 8191, 8192, 8193, 20001}) {
      Pair first(n, width, 0.0, n);
      first.FlipBit(0, 0);
      ExpectMatches(first, "first");
      Pair last(n, width, 0.0, n);
      last.FlipBit(n - 1, 8 * width - 1);
      ExpectMatches(last, "last");
      Pair both(n, width, 0.0, n);
      both.FlipBit(0, 8 * width - 1);
      both.FlipBit(n - 1, 0);
      ExpectMatches(both, "first+last");
    }
  }
}

// A change in any byte of an element, not just its first, must count: the
// AVX2 level reduces byte masks to one bit per element.
TEST_P(DetectTest, EveryBitOfEveryElementPosition) {
  for (int width : kWidths) {
    const uint64_t n = 512 / width + 3;  // two vector blocks plus a tail
    for (uint64_t elem = 0; elem < n; ++elem) {
      for (int bit = 0; bit < 8 * width; bit += 7) {
        Pair p(n, width, 0.0, elem);
        p.FlipBit(elem, bit);
        ExpectMatches(
            p, "elem=" + std::to_string(elem) + " bit=" + std::to_string(bit));
      }
    }
  }
}

TEST_P(DetectTest, UnalignedPointers) {
  uint64_t seed = 500;
  for (int width : kWidths) {
    for (size_t off_a = 0; off_a < 8; ++off_a) {
      for (size_t off_b : {size_t{0}, size_t{3}, off_a}) {
        for (uint64_t n : {uint64_t{7}, uint64_t{301}, uint64_t{5003}}) {
          Pair p(n, width, 0.03, seed++, off_a, off_b);
          ExpectMatches(p, "offsets=" + std::to_string(off_a) + "," +
                               std::to_string(off_b));
        }
      }
    }
  }
}

// Floating-point equality would call +0 == -0 and NaN != NaN; the contract
// is bitwise.
TEST_P(DetectTest, SignedZeroAndNanPayloadsAreBitwise) {
  struct Case {
    int width;
    uint64_t x;
    uint64_t y;
    bool differ;
  };
  const Case cases[] = {
      {2, 0x0000, 0x8000, true},  // bf16 +0 / -0
      {2, 0x7FC0, 0x7FC1, true},  // bf16 NaN payloads
      {2, 0x7FC0, 0x7FC0, false},
      {4, std::bit_cast<uint32_t>(0.0f), std::bit_cast<uint32_t>(-0.0f), true},
      {4, 0x7FC00000, 0x7FC00001, true},
      {4, 0x7FC00000, 0xFFC00000, true},
      {4, 0x7FC00000, 0x7FC00000, false},
      {8, std::bit_cast<uint64_t>(0.0), std::bit_cast<uint64_t>(-0.0), true},
      {8, 0x7FF8000000000000, 0x7FF8000000000001, true},
      {8, 0x7FF8000000000000, 0x7FF8000000000000, false},
  };
  for (const Case& c : cases) {
    for (uint64_t n : {1, 37, 300}) {
      Pair p(n, c.width, 0.0, 7);
      // Plant the pair at every third element, the rest left equal.
      for (uint64_t i = 0; i < n; i += 3) {
        std::memcpy(p.a() + i * c.width, &c.x, c.width);
        std::memcpy(p.b() + i * c.width, &c.y, c.width);
      }
      std::vector<uint32_t> got;
      internal::FindChangedAt(GetParam(), p.a(), p.b(), n, c.width, &got);
      EXPECT_EQ(got.size(), c.differ ? (n + 2) / 3 : 0)
          << "width=" << c.width << " x=" << c.x << " y=" << c.y;
      ExpectMatches(p, "special values");
    }
  }
}

TEST_P(DetectTest, AppendsKeepingOldContents) {
  Pair p(1000, 2, 0.05, 9);
  std::vector<uint32_t> got = {42, 7};
  const size_t added =
      internal::FindChangedAt(GetParam(), p.a(), p.b(), p.n, p.width, &got);
  std::vector<uint32_t> expected = {42, 7};
  for (uint32_t i : p.Expected()) expected.push_back(i);
  EXPECT_EQ(added, expected.size() - 2);
  EXPECT_EQ(got, expected);
}

INSTANTIATE_TEST_SUITE_P(
    Levels, DetectTest,
    ::testing::Values(DetectLevel::kScalar, DetectLevel::kAvx2,
                      DetectLevel::kAvx512),
    [](const ::testing::TestParamInfo<DetectLevel>& level) {
      return std::string(internal::DetectLevelName(level.param));
    });

TEST(DetectPublicTest, UsesTheBestLevelAndMatchesOracle) {
  const DetectLevel best = internal::BestDetectLevel();
  EXPECT_TRUE(internal::DetectLevelSupported(best));
  std::cout << "[ INFO     ] best detection level: "
            << internal::DetectLevelName(best) << "\n";
  for (int width : kWidths) {
    Pair p(30'001, width, 0.03, 11, 1, 2);
    std::vector<uint32_t> got;
    const size_t added = FindChanged(p.a(), p.b(), p.n, width, &got);
    EXPECT_EQ(added, got.size());
    EXPECT_EQ(got, p.Expected());
    EXPECT_EQ(CountChanged(p.a(), p.b(), p.n, width), got.size());
  }
}

TEST(DetectPublicTest, EmptyInputsMayBeNull) {
  std::vector<uint32_t> got;
  EXPECT_EQ(FindChanged(nullptr, nullptr, 0, 4, &got), 0u);
  EXPECT_EQ(CountChanged(nullptr, nullptr, 0, 4), 0u);
  EXPECT_EQ(FindChangedParallel(nullptr, nullptr, 0, 4, 4, &got), 0u);
  EXPECT_TRUE(got.empty());
}

TEST(DetectPublicTest, ParallelMatchesSerial) {
  uint64_t seed = 900;
  // Sizes below, at and well above the point where a second thread starts,
  // and ones that split into uneven pieces.
  for (int width : kWidths) {
    for (uint64_t n :
         {uint64_t{0}, uint64_t{1}, uint64_t{5000},
          (uint64_t{1} << 20) / width + 777, (uint64_t{3} << 20) / width + 1}) {
      for (double rate : {0.0, 0.01, 0.5}) {
        Pair p(n, width, rate, seed++, 3, 5);
        std::vector<uint32_t> serial;
        FindChanged(p.a(), p.b(), n, width, &serial);
        for (int threads = 1; threads <= 4; ++threads) {
          std::vector<uint32_t> parallel = {1, 2, 3};
          EXPECT_EQ(
              FindChangedParallel(p.a(), p.b(), n, width, threads, &parallel),
              serial.size());
          parallel.erase(parallel.begin(), parallel.begin() + 3);
          EXPECT_EQ(parallel, serial)
              << "width=" << width << " n=" << n << " rate=" << rate
              << " threads=" << threads;
        }
      }
    }
  }
}

TEST(DetectDeathTest, BrokenPreconditionsAbort) {
  uint8_t a[24] = {};
  uint8_t b[24] = {};
  std::vector<uint32_t> out;
  EXPECT_DEATH(FindChanged(a, b, 1, 3, &out), "width must be");
  EXPECT_DEATH(CountChanged(a, b, 1, 16), "width must be");
  EXPECT_DEATH(FindChanged(a, b, uint64_t{1} << 32, 1, &out), "2\\^32");
}

}  // namespace
}  // namespace refit
