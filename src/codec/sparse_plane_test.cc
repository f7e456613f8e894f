#include "codec/sparse_plane.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "codec/payload.h"
#include "support/testing.h"

namespace refit::codec {
namespace {

TEST(SparsePlaneTest, GapBytesThenValueBytes) {
  for (int gw = 1; gw <= 4; ++gw) {
    for (int w : {1, 2, 4, 8}) {
      for (int j = 0; j < gw + w; ++j) {
        const SparsePlane p = SparsePlaneAt(j, gw);
        EXPECT_EQ(p.is_gap, j < gw);
        EXPECT_EQ(p.byte, j < gw ? j : j - gw);
        EXPECT_EQ(p.histogram(), j < gw ? j : 4 + (j - gw));
        EXPECT_EQ(p.shift(), j < gw ? 8u * j : 64u + 8u * (j - gw));
        EXPECT_EQ(ShiftIsGap(p.shift()), p.is_gap);
        const GapContext ctx = SparsePlaneContext(j, gw, 1000, 7);
        EXPECT_EQ(ctx.is_gap, p.is_gap);
        EXPECT_EQ(ctx.plane, p.is_gap ? j : 0);
        EXPECT_EQ(ctx.n, 1000u);
        EXPECT_EQ(ctx.k, 7u);
      }
    }
  }
  static_assert(SparsePlane::Value(7).shift() == 120);
  static_assert(SparsePlane::Gap(3).histogram() == 3);
  static_assert(SparsePlane::Value(0).histogram() == kSparseGapBytes);
}

// The header ChooseSparseModels writes is the front of EncodeSparse's
// payload, for every width and gap width.
TEST(SparsePlaneTest, ChosenModelsAreTheEncodersHeader) {
  std::mt19937_64 rng(11);
  for (int w : {1, 2, 4, 8}) {
    for (uint32_t spread : {50u, 20000u, 3000000u, 200000000u}) {
      const uint32_t n = kMaxChunkElements;
      std::vector<uint32_t> pos;
      std::vector<uint8_t> vals;
      std::vector<Histogram> hist(kSparseGapBytes + w, Histogram{});
      uint32_t max_gap = 0;
      uint64_t p = rng() % 3;
      for (uint64_t prev_end = 0; p < n && pos.size() < 5000;) {
        const uint32_t gap = static_cast<uint32_t>(p - prev_end);
        max_gap = std::max(max_gap, gap);
        for (int b = 0; b < kSparseGapBytes; ++b) {
          ++hist[SparsePlane::Gap(b).histogram()][(gap >> (8 * b)) & 0xff];
        }
        const bool small = rng() % 2 == 0;
        const uint64_t v = (rng() % (small ? 7 : 0xfff)) | 1;  // never zero
        for (int b = 0; b < w; ++b) {
          vals.push_back(static_cast<uint8_t>(v >> (8 * b)));
          ++hist[SparsePlane::Value(b).histogram()][(v >> (8 * b)) & 0xff];
        }
        pos.push_back(static_cast<uint32_t>(p));
        prev_end = p + 1;
        p += 1 + rng() % spread;
      }
      const uint32_t k = static_cast<uint32_t>(pos.size());
      std::vector<uint8_t> payload;
      ASSERT_OK(EncodeSparse(ChunkKind::kSparseXor, n, w, pos, vals.data(),
                             EncodeOptions(), &payload));
      std::vector<Model> models;
      std::vector<uint8_t> header;
      const int gw = ChooseSparseModels(hist, n, k, max_gap, &models, &header);
      EXPECT_EQ(gw, GapWidthFor(max_gap));
      EXPECT_EQ(models.size(), static_cast<size_t>(gw + w));
      ASSERT_LE(header.size(), payload.size());
      EXPECT_TRUE(std::equal(header.begin(), header.end(), payload.begin()))
          << "w " << w << " spread " << spread;
    }
  }
}

}  // namespace
}  // namespace refit::codec
