// Opens the qwen2-tiny fixture checkpoints (written by the official
// safetensors library) through the public API only, as the CLI does.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "refit/checkpoint.h"
#include "support/testing.h"

namespace refit {
namespace {

using refit::testing::FixturesDir;

constexpr uint64_t kParams = 3'198'144;

Checkpoint OpenOrDie(const std::string& path) {
  Result<Checkpoint> c = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
  EXPECT_OK(c);
  return std::move(c).value();
}

TEST(CheckpointFixtureTest, Bf16StepsHaveAllParameters) {
  REFIT_REQUIRE_FIXTURES();
  for (int step = 0; step <= 3; ++step) {
    SCOPED_TRACE(step);
    Result<Checkpoint> c = Checkpoint::Open(
        FixturesDir() + "/step" + std::to_string(step) + ".safetensors",
        Checkpoint::Mode::kReadOnly);
    ASSERT_OK(c);
    EXPECT_EQ(c->tensors().size(), 51u);
    uint64_t params = 0;
    for (const TensorInfo& t : c->tensors()) {
      EXPECT_EQ(t.dtype, "BF16");
      EXPECT_EQ(t.element_width, 2);
      EXPECT_EQ(t.byte_size, t.num_elements * 2);
      params += t.num_elements;
    }
    EXPECT_EQ(params, kParams);
    ASSERT_EQ(c->files().size(), 1u);
    EXPECT_EQ(c->files()[0].metadata.at("step"), std::to_string(step));
    const TensorInfo* embed = c->Find("model.embed_tokens.weight");
    ASSERT_NE(embed, nullptr);
    EXPECT_EQ(embed->shape, (std::vector<uint64_t>{4096, 192}));
  }
}

TEST(CheckpointFixtureTest, ShardedStep3MatchesSingleFile) {
  REFIT_REQUIRE_FIXTURES();
  Checkpoint single = OpenOrDie(FixturesDir() + "/step3.safetensors");
  Checkpoint sharded = OpenOrDie(FixturesDir() + "/sharded_step3");
  EXPECT_TRUE(sharded.sharded());
  ASSERT_EQ(sharded.files().size(), 2u);
  EXPECT_EQ(sharded.files()[0].metadata.at("format"), "pt");
  ASSERT_EQ(sharded.tensors().size(), single.tensors().size());
  std::map<size_t, int> per_file;
  for (size_t i = 0; i < single.tensors().size(); ++i) {
    const TensorInfo& a = single.tensors()[i];
    const TensorInfo& b = sharded.tensors()[i];
    SCOPED_TRACE(a.name);
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.byte_size, b.byte_size);
    std::span<const uint8_t> x = single.Data(i), y = sharded.Data(i);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
    ++per_file[b.file_index];
  }
  EXPECT_EQ(per_file[0], 25);
  EXPECT_EQ(per_file[1], 26);
}

TEST(CheckpointFixtureTest, Fp8HasScalesAndMixedDTypes) {
  REFIT_REQUIRE_FIXTURES();
  Checkpoint c = OpenOrDie(FixturesDir() + "/fp8/step1.safetensors");
  ASSERT_EQ(c.tensors().size(), 81u);
  std::map<std::string, int> dtypes;
  for (const TensorInfo& t : c.tensors()) ++dtypes[t.dtype];
  EXPECT_EQ(dtypes["F8_E4M3"], 30);
  EXPECT_EQ(dtypes["F32"], 30);
  EXPECT_EQ(dtypes["BF16"], 21);
  for (const TensorInfo& t : c.tensors()) {
    if (t.dtype != "F8_E4M3") continue;
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.element_width, 1);
    EXPECT_EQ(t.shape.size(), 2u);
    const TensorInfo* scale = c.Find(t.name + "_scale");
    ASSERT_NE(scale, nullptr);
    EXPECT_EQ(scale->dtype, "F32");
    EXPECT_EQ(scale->element_width, 4);
    EXPECT_EQ(scale->num_elements, 1u);
  }
}

}  // namespace
}  // namespace refit
