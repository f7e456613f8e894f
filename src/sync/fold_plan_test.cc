// The fold planner (sync/fold_plan.h), without a store: which chains of
// committed versions fold, and the cells of those that do.
#include "sync/fold_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit::internal {
namespace {

using ::refit::testing::StatusIs;

TensorEntry Tensor(const std::string& name, uint64_t elements) {
  TensorEntry e;
  e.name = name;
  e.dtype = "BF16";
  e.width = 2;
  e.shape = {elements};
  e.num_elements = elements;
  return e;
}

Hash128 State(uint64_t version, size_t tensor) { return Hash128{version, tensor}; }

// A chain of versions first..first+k-1 on base first-1, each built on the
// previous one, over tensors "a" (4096 elements) and "b" (1000); every
// tensor's hash at version v is State(v, t).
struct Chain {
  std::vector<Announcement> versions;
  std::vector<Manifest> manifests;

  Chain(uint64_t first, size_t k) {
    for (uint64_t v = first; v < first + k; ++v) {
      Announcement a;
      a.version = v;
      a.base_version = v - 1;
      a.members = {"r0"};
      a.tensors = {Tensor("a", 4096), Tensor("b", 1000)};
      for (size_t t = 0; t < a.tensors.size(); ++t) a.tensors[t].before = State(v - 1, t);
      Manifest m;
      m.version = v;
      m.base_version = v - 1;
      m.members = a.members;
      m.tensors = a.tensors;
      for (size_t t = 0; t < m.tensors.size(); ++t) m.tensors[t].after = State(v, t);
      versions.push_back(std::move(a));
      manifests.push_back(std::move(m));
    }
  }
  // Version at position j lists a chunk of [start, start + count) of tensor t.
  Chain& Add(size_t j, uint64_t t, uint64_t start, uint64_t count) {
    ManifestChunk mc;
    mc.tensor_id = t;
    mc.start = start;
    mc.count = count;
    mc.changed = 1;
    manifests[j].chunks.push_back(mc);
    return *this;
  }
  // The same for a strided region: count / run rows of `run`, `stride`
  // apart (a rank's block of a matrix).
  Chain& AddStrided(size_t j, uint64_t t, uint64_t start, uint64_t count, uint64_t run,
                    uint64_t stride) {
    Add(j, t, start, count);
    manifests[j].chunks.back().run = run;
    manifests[j].chunks.back().stride = stride;
    return *this;
  }
  Result<std::optional<std::vector<FoldCell>>> Plan() const {
    return PlanFold(versions, manifests);
  }
};

// The cells of a chain that must fold (empty, with a failure, otherwise).
std::vector<FoldCell> CellsOf(const Chain& c) {
  auto plan = c.Plan();
  if (!plan.ok() || !plan->has_value()) {
    ADD_FAILURE() << "the chain does not fold: " << plan.status().ToString();
    return {};
  }
  return **plan;
}

TEST(FoldPlanTest, CellsGroupEachRangesChunksInVersionOrder) {
  Chain c(5, 3);
  c.Add(0, 0, 0, 2048).Add(0, 0, 2048, 2048).Add(0, 1, 0, 1000);  // version 5
  c.Add(1, 0, 2048, 2048);                                           // version 6
  c.Add(2, 1, 0, 1000).Add(2, 0, 0, 2048).Add(2, 0, 2048, 2048);     // version 7
  auto plan = c.Plan();
  ASSERT_OK(plan);
  ASSERT_TRUE(plan->has_value());
  const std::vector<FoldCell>& cells = **plan;
  ASSERT_EQ(cells.size(), 3u);
  // Tensor and range order, whatever order the manifests list them in.
  EXPECT_EQ(cells[0].tensor, 0u);
  EXPECT_EQ(cells[0].start, 0u);
  EXPECT_EQ(cells[0].count, 2048u);
  EXPECT_EQ(cells[0].chunks, (std::vector<FoldRef>{{0, 0}, {2, 1}}));
  EXPECT_EQ(cells[1].start, 2048u);
  EXPECT_EQ(cells[1].chunks, (std::vector<FoldRef>{{0, 1}, {1, 0}, {2, 2}}));
  EXPECT_EQ(cells[2].tensor, 1u);
  EXPECT_EQ(cells[2].chunks, (std::vector<FoldRef>{{0, 2}, {2, 0}}));
}

TEST(FoldPlanTest, AChainWhoseVersionsDoNotLineUpDoesNotFold) {
  {
    Chain c(1, 3);
    c.versions[2].base_version = 1;  // 3 built on 1, not on 2
    c.manifests[2].base_version = 1;
    auto plan = c.Plan();
    ASSERT_OK(plan);
    EXPECT_FALSE(plan->has_value());
  }
  {
    Chain c(1, 2);
    c.versions[1].tensors[1].before = State(7, 1);  // not where 1 ended
    c.manifests[1].tensors[1].before = State(7, 1);
    auto plan = c.Plan();
    ASSERT_OK(plan);
    EXPECT_FALSE(plan->has_value());
  }
  {
    Chain c(1, 2);
    for (TensorEntry* e : {&c.versions[1].tensors[0], &c.manifests[1].tensors[0]}) {
      e->dtype = "F16";  // another tensor table
    }
    auto plan = c.Plan();
    ASSERT_OK(plan);
    EXPECT_FALSE(plan->has_value());
  }
  {
    Chain c(1, 2);  // the chunk grid changed: 2048 then 1024 elements
    c.Add(0, 0, 0, 2048).Add(1, 0, 0, 1024).Add(1, 0, 1024, 1024);
    auto plan = c.Plan();
    ASSERT_OK(plan);
    EXPECT_FALSE(plan->has_value());
  }
  {
    Chain c(1, 2);  // overlapping ranges that start apart
    c.Add(0, 0, 0, 2048).Add(1, 0, 1024, 2048);
    auto plan = c.Plan();
    ASSERT_OK(plan);
    EXPECT_FALSE(plan->has_value());
  }
}

TEST(FoldPlanTest, ManifestsThatContradictThemselvesAreDataLoss) {
  {
    Chain c(1, 2);
    c.Add(0, 0, 0, 2048).Add(1, 0, 0, 2048).Add(1, 0, 0, 2048);
    auto plan = c.Plan();
    EXPECT_THAT(plan, StatusIs(StatusCode::kDataLoss));
    EXPECT_EQ(plan.status().message(), "the manifest of version 2 lists one range twice");
  }
  {
    Chain c(1, 2);
    c.Add(1, 1, 500, 501);  // past the end of "b"
    auto plan = c.Plan();
    EXPECT_THAT(plan, StatusIs(StatusCode::kDataLoss));
    EXPECT_EQ(plan.status().message(), "the manifest of version 2 does not match its announcement");
    EXPECT_THAT(CheckFoldManifest(c.versions[1], c.manifests[1]),
                StatusIs(StatusCode::kDataLoss));
    EXPECT_OK(CheckFoldManifest(c.versions[0], c.manifests[0]));
  }
  {
    Chain c(1, 2);
    c.manifests[0].members = {"r0", "r1"};
    EXPECT_EQ(c.Plan().status().message(),
              "the manifest of version 1 does not match its announcement");
  }
  {
    Chain c(1, 2);
    c.manifests.pop_back();
    EXPECT_THAT(c.Plan(), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(PlanFold({}, {}), StatusIs(StatusCode::kInvalidArgument));
  }
}

TEST(FoldPlanTest, VersionsWithoutChunksFoldToNoCells) {
  Chain c(1, 2);
  auto plan = c.Plan();
  ASSERT_OK(plan);
  ASSERT_TRUE(plan->has_value());
  EXPECT_TRUE((*plan)->empty());
}

// Versions published by several ranks: tensor "a" as 64 rows of 64
// elements, its columns split between two ranks (blocks of 32 and 32 at
// stride 64), each block cut into chunks of 16 rows. The blocks of one
// rows interleave without sharing an element: they fold, each region a
// cell of its own in start order.
TEST(FoldPlanTest, InterleavedStridedRegionsFold) {
  Chain c(1, 2);
  for (size_t j = 0; j < 2; ++j) {
    for (uint64_t q = 0; q < 4; ++q) {
      c.AddStrided(j, 0, q * 16 * 64, 16 * 32, 32, 64);       // rank 0's columns
      c.AddStrided(j, 0, q * 16 * 64 + 32, 16 * 32, 32, 64);  // rank 1's
    }
    c.Add(j, 1, 0, 1000);
  }
  const std::vector<FoldCell> cells = CellsOf(c);
  ASSERT_EQ(cells.size(), 9u);
  EXPECT_EQ(cells[0].start, 0u);
  EXPECT_EQ(cells[1].start, 32u);
  EXPECT_EQ(cells[1].run, 32u);
  EXPECT_EQ(cells[1].stride, 64u);
  EXPECT_EQ(cells[1].End(), 15u * 64 + 64);
  EXPECT_EQ(cells[1].chunks.size(), 2u);
}

// A region that changes shape between versions, or that shares elements
// with another one, does not fold (applied one version at a time).
TEST(FoldPlanTest, StridedRegionsThatOverlapDoNotFold) {
  {
    Chain c(1, 2);  // the layout changed: same start, another run
    c.AddStrided(0, 0, 0, 16 * 32, 32, 64);
    c.AddStrided(1, 0, 0, 16 * 16, 16, 64);
    auto plan = c.Plan();
    ASSERT_OK(plan);
    EXPECT_FALSE(plan->has_value());
  }
  {
    Chain c(1, 2);  // a column block against rows it crosses
    c.AddStrided(0, 0, 0, 16 * 32, 32, 64);
    c.Add(1, 0, 64 * 3 + 10, 10);
    auto plan = c.Plan();
    ASSERT_OK(plan);
    EXPECT_FALSE(plan->has_value());
  }
  {
    Chain c(1, 2);  // ... and a range that fits between its rows
    c.AddStrided(0, 0, 0, 16 * 32, 32, 64);
    c.Add(1, 0, 64 * 3 + 32, 32);
    auto plan = c.Plan();
    ASSERT_OK(plan);
    EXPECT_TRUE(plan->has_value());
  }
}

TEST(FoldPlanTest, RegionsDisjointIsExactForOneStride) {
  auto region = [](uint64_t start, uint64_t count, uint64_t run, uint64_t stride) {
    return FoldCell{0, start, count, run, stride, {}};
  };
  // Brute force over small regions of stride 8 against every range and
  // every other region of stride 8.
  auto elements = [](const FoldCell& x) {
    std::vector<bool> in(256, false);
    for (uint64_t i = 0; i < x.count; ++i) {
      in[x.run == 0 ? x.start + i : x.start + (i / x.run) * x.stride + i % x.run] = true;
    }
    return in;
  };
  std::vector<FoldCell> all;
  for (uint64_t start = 0; start < 20; ++start) {
    for (uint64_t run = 1; run < 8; ++run) {
      for (uint64_t rows = 2; rows < 4; ++rows) all.push_back(region(start, run * rows, run, 8));
    }
    for (uint64_t count = 1; count < 20; count += 3) all.push_back(region(start, count, 0, 0));
  }
  for (const FoldCell& x : all) {
    const auto ex = elements(x);
    for (const FoldCell& y : all) {
      const auto ey = elements(y);
      bool shared = false;
      for (size_t e = 0; e < ex.size(); ++e) shared = shared || (ex[e] && ey[e]);
      EXPECT_EQ(RegionsDisjoint(x, y), !shared)
          << x.start << "/" << x.count << "/" << x.run << " vs " << y.start << "/" << y.count
          << "/" << y.run;
    }
  }
  // Different strides whose spans overlap are not proven disjoint.
  EXPECT_FALSE(RegionsDisjoint(region(0, 4, 2, 8), region(2, 4, 2, 6)));
}

}  // namespace
}  // namespace refit::internal
