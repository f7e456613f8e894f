// Bit-exact round trips on the real fixture checkpoints: every step pair,
// the FP8 variant, and the sharded checkpoint, through the public API on
// files (diff, apply in place, verify, inspect).
#include <gtest/gtest.h>

#include <filesystem>

#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using testing::FixturesDir;
using testing::TempDir;

// Every tensor of `a` equals the same-named tensor of `b`, byte for byte.
void ExpectSameTensors(const std::string& a_path, const std::string& b_path) {
  auto a = Checkpoint::Open(a_path, Checkpoint::Mode::kReadOnly);
  auto b = Checkpoint::Open(b_path, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (size_t i = 0; i < a->tensors().size(); ++i) {
    const auto& name = a->tensors()[i].name;
    auto j = b->IndexOf(name);
    ASSERT_TRUE(j.has_value()) << name;
    auto da = a->Data(i);
    auto db = b->Data(*j);
    ASSERT_EQ(da.size(), db.size()) << name;
    EXPECT_TRUE(std::equal(da.begin(), da.end(), db.begin())) << name;
  }
}

// `a` and `b` hold the same safetensors files, byte for byte.
void ExpectSameFiles(const std::string& a, const std::string& b) {
  if (!std::filesystem::is_directory(a)) {
    EXPECT_EQ(testing::ReadBytes(a), testing::ReadBytes(b)) << a;
    return;
  }
  for (const auto& entry : std::filesystem::directory_iterator(b)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".safetensors")) continue;
    EXPECT_EQ(testing::ReadBytes(a + "/" + name),
              testing::ReadBytes(entry.path().string()))
        << name;
  }
}

struct Pair {
  const char* base;
  const char* target;
};

class FixturePairTest : public ::testing::TestWithParam<Pair> {};

TEST_P(FixturePairTest, RoundTripIsBitExact) {
  REFIT_REQUIRE_FIXTURES();
  const std::string dir = FixturesDir();
  const std::string base = dir + "/" + GetParam().base;
  const std::string target = dir + "/" + GetParam().target;
  TempDir tmp;
  const std::string delta = tmp.File("d.rfd");
  auto diff = Diff(base, target, delta, {});
  ASSERT_OK(diff);
  EXPECT_GT(diff->changed_elements, 0u);

  // Apply in place to a scratch copy of the base (file or directory).
  const std::string work = tmp.File("work");
  ASSERT_OK(CopyCheckpoint(base, work));
  auto applied = Apply(delta, work, {});
  ASSERT_OK(applied);
  EXPECT_EQ(applied->chunks_applied, diff->chunks);
  // At 1-3% change nearly every 4 KiB page holds a change; the count may
  // exceed the checkpoint's pages only by pages shared between chunks.
  EXPECT_LE(applied->pages_written * applied->page_size,
            applied->checkpoint_bytes + (diff->chunks + 1) * applied->page_size);
  ExpectSameTensors(work, target);
  // The target's headers travel with the delta: where the layouts match
  // (the fixtures' headers all fit their base's), the patched files are the
  // target's byte for byte; otherwise the apply says which header it left.
  const bool same_layout = std::filesystem::is_directory(base) ==
                           std::filesystem::is_directory(target);
  if (same_layout) {
    EXPECT_TRUE(applied->headers_not_carried.empty());
    ExpectSameFiles(work, target);
  } else {
    EXPECT_FALSE(applied->headers_not_carried.empty());
  }

  auto verify = Verify(work, delta);
  ASSERT_OK(verify);
  EXPECT_TRUE(verify->matches_target);
  EXPECT_TRUE(verify->headers_checked);
  EXPECT_EQ(verify->header_differs.size(), applied->headers_not_carried.size());
  auto verify_base = Verify(base, delta);
  ASSERT_OK(verify_base);
  EXPECT_FALSE(verify_base->matches_target);
  EXPECT_TRUE(verify_base->matches_base);

  // Applying again changes nothing (at most once).
  auto again = Apply(delta, work, {});
  ASSERT_OK(again);
  EXPECT_EQ(again->chunks_applied, 0u);
  ExpectSameTensors(work, target);

  auto info = Inspect(delta);
  ASSERT_OK(info);
  EXPECT_EQ(info->changed_elements, diff->changed_elements);
  if (info->bound_valid) {
    // A loose regression guard; docs/benchmarks.md records the real ratio.
    EXPECT_LT(static_cast<double>(info->payload_bytes), 1.10 * info->bound_bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, FixturePairTest,
    ::testing::Values(Pair{"step0.safetensors", "step1.safetensors"},
                      Pair{"step1.safetensors", "step2.safetensors"},
                      Pair{"step2.safetensors", "step3.safetensors"},
                      Pair{"step0.safetensors", "step3.safetensors"},
                      Pair{"fp8/step1.safetensors", "fp8/step2.safetensors"},
                      Pair{"fp32/step1.safetensors", "fp32/step2.safetensors"},
                      Pair{"step2.safetensors", "sharded_step3"},
                      Pair{"sharded_step3", "step0.safetensors"}));

TEST(FixtureTest, WrongBaseLeavesCheckpointByteIdentical) {
  REFIT_REQUIRE_FIXTURES();
  const std::string dir = FixturesDir();
  TempDir tmp;
  ASSERT_OK(Diff(dir + "/step1.safetensors", dir + "/step2.safetensors",
                 tmp.File("d.rfd"), {}));
  ASSERT_OK(CopyCheckpoint(dir + "/sharded_step3", tmp.File("work")));
  auto before = testing::ReadBytes(tmp.File("work/model-00001-of-00002.safetensors"));
  auto r = Apply(tmp.File("d.rfd"), tmp.File("work"), {});
  EXPECT_THAT(r, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(testing::ReadBytes(tmp.File("work/model-00001-of-00002.safetensors")), before);
}

}  // namespace
}  // namespace refit
