#include "cuda/placement.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

namespace refit::cuda {
namespace {

// Every element of a placement, mapped by Map and by the kernel routine.
void ExpectSameAsDevice(const TensorPlacement& p) {
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(p).ok());
  std::vector<DevicePlacement> d;
  std::vector<DevicePiece> pieces;
  plan.Flatten(&d, &pieces);
  ASSERT_EQ(d.size(), 1u);
  for (uint64_t i = 0; i < p.rows * p.cols; ++i) {
    uint64_t a = 0;
    const bool present = MapElement(d[0], pieces.data(), i, &a);
    auto m = p.Map(i);
    ASSERT_EQ(present, m.has_value()) << i;
    if (present) {
      EXPECT_EQ(a, p.base + *m * p.width) << i;
    }
  }
}

TEST(Placement, WholeIsIdentity) {
  auto p = WholePlacement("w", 2, 5, 7, 0x1000);
  ASSERT_TRUE(ValidatePlacement(p).ok());
  for (uint64_t i = 0; i < 35; ++i) EXPECT_EQ(*p.Map(i), i);
  ExpectSameAsDevice(p);
  EXPECT_EQ(*ContiguousAddress(p, 7, 20), 0x1000u + 14);
}

TEST(Placement, TransposedSwapsAxes) {
  auto p = TransposedPlacement("w", 4, 3, 5, 0);
  ASSERT_TRUE(ValidatePlacement(p).ok());
  for (uint64_t r = 0; r < 3; ++r) {
    for (uint64_t c = 0; c < 5; ++c) EXPECT_EQ(*p.Map(r * 5 + c), c * 3 + r);
  }
  EXPECT_FALSE(ContiguousAddress(p, 0, 2).has_value());
  EXPECT_TRUE(ContiguousAddress(p, 0, 1).has_value());
  ExpectSameAsDevice(p);
}

TEST(Placement, UnevenRowShard) {
  // 10 rows over 3 GPUs as 4/3/3: this GPU holds rows [4, 7).
  auto p = RowShardPlacement("w", 2, 10, 6, 4, 7, 0);
  ASSERT_TRUE(ValidatePlacement(p).ok());
  EXPECT_EQ(p.dst_elements, 18u);
  EXPECT_FALSE(p.Map(3 * 6 + 5).has_value());
  EXPECT_EQ(*p.Map(4 * 6), 0u);
  EXPECT_EQ(*p.Map(6 * 6 + 5), 17u);
  EXPECT_FALSE(p.Map(7 * 6).has_value());
  EXPECT_TRUE(Intersects(p, 3 * 6, 7));
  EXPECT_FALSE(Intersects(p, 0, 4 * 6));
  EXPECT_FALSE(Intersects(p, 7 * 6, 18));
  EXPECT_EQ(*ContiguousAddress(p, 4 * 6 + 1, 12), 2u);
  EXPECT_FALSE(ContiguousAddress(p, 3 * 6, 12).has_value());  // partly absent
  ExpectSameAsDevice(p);
}

TEST(Placement, UnevenColumnShard) {
  auto p = ColShardPlacement("w", 1, 4, 9, 5, 9, 0);
  ASSERT_TRUE(ValidatePlacement(p).ok());
  for (uint64_t r = 0; r < 4; ++r) {
    for (uint64_t c = 0; c < 9; ++c) {
      auto m = p.Map(r * 9 + c);
      if (c < 5) {
        EXPECT_FALSE(m.has_value());
      } else {
        EXPECT_EQ(*m, r * 4 + (c - 5));
      }
    }
  }
  EXPECT_FALSE(Intersects(p, 9, 5));
  EXPECT_TRUE(Intersects(p, 9, 6));
  ExpectSameAsDevice(p);
}

// Builds the fused QKV row order naively and checks the placements.
TEST(Placement, FusedQkvMegatronGroups) {
  QkvLayout l{8, 4, 3, 1, 3};  // 2 q heads per group; holds groups 1, 2
  const uint64_t cols = 5;
  // fused_rows[i] = (part, canonical row) for the rows this GPU holds.
  std::vector<std::pair<char, uint64_t>> fused;
  for (uint64_t g = l.g0; g < l.g1; ++g) {
    for (uint64_t r = 0; r < 2 * 3; ++r) fused.push_back({'q', g * 6 + r});
    for (uint64_t r = 0; r < 3; ++r) fused.push_back({'k', g * 3 + r});
    for (uint64_t r = 0; r < 3; ++r) fused.push_back({'v', g * 3 + r});
  }
  for (char part : {'q', 'k', 'v'}) {
    auto p = FusedQkvPlacement("x", 2, l, part, cols, 0);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(ValidatePlacement(*p).ok());
    EXPECT_EQ(p->dst_elements, fused.size() * cols);
    for (uint64_t row = 0; row < p->rows; ++row) {
      uint64_t want = UINT64_MAX;
      for (size_t f = 0; f < fused.size(); ++f) {
        if (fused[f] == std::make_pair(part, row)) want = f;
      }
      for (uint64_t c = 0; c < cols; ++c) {
        auto m = p->Map(row * cols + c);
        if (want == UINT64_MAX) {
          EXPECT_FALSE(m.has_value());
        } else {
          EXPECT_EQ(*m, want * cols + c) << part << row;
        }
      }
    }
    ExpectSameAsDevice(*p);
  }
  EXPECT_FALSE(FusedQkvPlacement("x", 2, {8, 3, 3, 0, 3}, 'q', 4, 0).ok());
}

TEST(Placement, FusedGateUpConcatenatedAndInterleaved) {
  const uint64_t inter = 8, cols = 3, a = 4, b = 8;
  for (uint64_t group : {uint64_t{0}, uint64_t{2}}) {
    std::vector<std::pair<char, uint64_t>> fused;
    if (group == 0) {
      for (uint64_t r = a; r < b; ++r) fused.push_back({'g', r});
      for (uint64_t r = a; r < b; ++r) fused.push_back({'u', r});
    } else {
      for (uint64_t r = a; r < b; r += group) {
        for (uint64_t j = 0; j < group; ++j) fused.push_back({'g', r + j});
        for (uint64_t j = 0; j < group; ++j) fused.push_back({'u', r + j});
      }
    }
    for (char part : {'g', 'u'}) {
      auto p = FusedGateUpPlacement("x", 2, inter, cols, a, b, group, part, 0);
      ASSERT_TRUE(p.ok());
      ASSERT_TRUE(ValidatePlacement(*p).ok());
      for (uint64_t row = 0; row < inter; ++row) {
        uint64_t want = UINT64_MAX;
        for (size_t f = 0; f < fused.size(); ++f) {
          if (fused[f] == std::make_pair(part, row)) want = f;
        }
        auto m = p->Map(row * cols);
        if (want == UINT64_MAX) {
          EXPECT_FALSE(m.has_value());
        } else {
          EXPECT_EQ(*m, want * cols);
        }
      }
      ExpectSameAsDevice(*p);
    }
  }
  EXPECT_FALSE(FusedGateUpPlacement("x", 2, 8, 3, 3, 8, 2, 'g', 0).ok());
}

TEST(Placement, ValidateRejectsWritesOutsideTheDestination) {
  auto p = WholePlacement("w", 2, 4, 4, 0);
  p.dst_elements = 15;
  EXPECT_FALSE(ValidatePlacement(p).ok());
  p = WholePlacement("w", 2, 4, 4, 0);
  p.row_map.pieces = {{0, 3, 0, 0, 0}, {2, 4, 3, 0, 0}};  // overlapping
  EXPECT_FALSE(ValidatePlacement(p).ok());
  p = WholePlacement("w", 3, 4, 4, 0);
  EXPECT_FALSE(ValidatePlacement(p).ok());
  PlacementPlan plan;
  EXPECT_FALSE(plan.Add(p).ok());
}

TEST(Placement, ApplyCpuXorAndOverwriteThroughShard) {
  std::vector<uint16_t> dst(2 * 4, 0);
  auto p = RowShardPlacement("w", 2, 4, 4, 1, 3,
                             reinterpret_cast<uintptr_t>(dst.data()));
  // Records at canonical 0 (absent), 5, 10 (present), 15 (absent).
  std::vector<uint32_t> pos = {0, 5, 10, 15};
  std::vector<uint16_t> val = {1, 2, 3, 4};
  ApplyPlacementCpu(p, 0, pos, reinterpret_cast<const uint8_t*>(val.data()),
                    true);
  EXPECT_EQ(dst[1], 2);
  EXPECT_EQ(dst[6], 3);
  EXPECT_EQ(std::accumulate(dst.begin(), dst.end(), 0), 5);
  ApplyPlacementCpu(p, 0, pos, reinterpret_cast<const uint8_t*>(val.data()),
                    false);
  EXPECT_EQ(dst[1], 2);
  ApplyPlacementCpu(p, 0, pos, reinterpret_cast<const uint8_t*>(val.data()),
                    true);
  EXPECT_EQ(dst[1], 0);
}

TEST(Placement, PlanFindsEveryPlacementOfATensor) {
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(WholePlacement("a", 2, 2, 2, 0)).ok());
  ASSERT_TRUE(plan.Add(TransposedPlacement("a", 2, 2, 2, 64)).ok());
  EXPECT_EQ(plan.Find("a").size(), 2u);
  EXPECT_TRUE(plan.Find("b").empty());
}

}  // namespace
}  // namespace refit::cuda
