#include "refit/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "base/file.h"
#include "format/safetensors.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using refit::testing::TempDir;

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

void WriteText(const std::string& path, const std::string& text) {
  refit::testing::WriteBytes(path,
                             std::vector<uint8_t>(text.begin(), text.end()));
}

// A two-shard checkpoint in `dir`: shard 1 holds a and c, shard 2 holds b
// and d, so canonical order interleaves the files.
class FormatCheckpointShardedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(WriteSafetensors(
        dir_.File("model-00001-of-00002.safetensors"), {{"format", "pt"}},
        std::vector<SafetensorsTensorView>{{"a", "BF16", {2, 3}, a_},
                                           {"c", "F32", {}, c_}}));
    ASSERT_OK(WriteSafetensors(
        dir_.File("model-00002-of-00002.safetensors"), {{"shard", "2"}},
        std::vector<SafetensorsTensorView>{{"b", "U8", {5}, b_},
                                           {"d", "F8_E4M3", {0}, {}}}));
    WriteIndex(R"({"a":"model-00001-of-00002.safetensors",)"
               R"("b":"model-00002-of-00002.safetensors",)"
               R"("c":"model-00001-of-00002.safetensors",)"
               R"("d":"model-00002-of-00002.safetensors"})");
    WriteText(dir_.File("config.json"), R"({"model_type":"test"})");
  }

  void WriteIndex(const std::string& weight_map) {
    WriteText(
        dir_.File("model.safetensors.index.json"),
        R"({"metadata":{"total_size":23},"weight_map":)" + weight_map + "}");
  }

  StatusCode OpenCode() {
    return Checkpoint::Open(dir_.path(), Checkpoint::Mode::kReadOnly)
        .status()
        .code();
  }

  TempDir dir_;
  std::vector<uint8_t> a_ = Bytes(12, 1), b_ = Bytes(5, 2), c_ = Bytes(4, 3);
};

TEST_F(FormatCheckpointShardedTest, PresentsOneCanonicalList) {
  Result<Checkpoint> ckpt =
      Checkpoint::Open(dir_.path(), Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ckpt);
  EXPECT_TRUE(ckpt->sharded());
  ASSERT_EQ(ckpt->files().size(), 2u);
  EXPECT_EQ(ckpt->files()[0].path,
            dir_.File("model-00001-of-00002.safetensors"));
  EXPECT_EQ(ckpt->files()[0].metadata.at("format"), "pt");
  EXPECT_EQ(ckpt->files()[1].metadata.at("shard"), "2");
  const auto& t = ckpt->tensors();
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].name, "a");
  EXPECT_EQ(t[1].name, "b");
  EXPECT_EQ(t[2].name, "c");
  EXPECT_EQ(t[3].name, "d");
  EXPECT_EQ(t[0].file_index, 0u);
  EXPECT_EQ(t[1].file_index, 1u);
  EXPECT_EQ(t[2].file_index, 0u);
  EXPECT_EQ(t[0].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(t[0].num_elements, 6u);
  EXPECT_EQ(t[0].element_width, 2);
  EXPECT_EQ(t[2].num_elements, 1u);
  EXPECT_EQ(t[3].dtype, "F8_E4M3");
  EXPECT_EQ(t[3].byte_size, 0u);
  auto equal = [](std::span<const uint8_t> x, const std::vector<uint8_t>& y) {
    return std::equal(x.begin(), x.end(), y.begin(), y.end());
  };
  EXPECT_TRUE(equal(ckpt->Data(0), a_));
  EXPECT_TRUE(equal(ckpt->Data(1), b_));
  EXPECT_TRUE(equal(ckpt->Data(2), c_));
  EXPECT_TRUE(ckpt->Data(3).empty());
  EXPECT_EQ(ckpt->IndexOf("c"), 2u);
  EXPECT_EQ(ckpt->IndexOf("zz"), std::nullopt);
  EXPECT_EQ(ckpt->Find("b")->byte_size, 5u);
  EXPECT_EQ(ckpt->Find("e"), nullptr);
  // Read-only: no writable bytes, and syncing is a no-op.
  EXPECT_EQ(ckpt->MutableData(0).data(), nullptr);
  EXPECT_OK(ckpt->Sync());
  EXPECT_OK(ckpt->SyncRange(0, 0, 12));
}

TEST_F(FormatCheckpointShardedTest, IndexMustMatchShards) {
  // A tensor the index does not list.
  WriteIndex(R"({"a":"model-00001-of-00002.safetensors",)"
             R"("c":"model-00001-of-00002.safetensors",)"
             R"("d":"model-00002-of-00002.safetensors"})");
  EXPECT_EQ(OpenCode(), StatusCode::kDataLoss);
  // A tensor the index puts in the wrong shard.
  WriteIndex(R"({"a":"model-00001-of-00002.safetensors",)"
             R"("b":"model-00001-of-00002.safetensors",)"
             R"("c":"model-00001-of-00002.safetensors",)"
             R"("d":"model-00002-of-00002.safetensors"})");
  EXPECT_EQ(OpenCode(), StatusCode::kDataLoss);
  // A tensor the index names but no shard holds.
  WriteIndex(R"({"a":"model-00001-of-00002.safetensors",)"
             R"("b":"model-00002-of-00002.safetensors",)"
             R"("c":"model-00001-of-00002.safetensors",)"
             R"("d":"model-00002-of-00002.safetensors",)"
             R"("e":"model-00002-of-00002.safetensors"})");
  EXPECT_EQ(OpenCode(), StatusCode::kDataLoss);
  // A shard that does not exist.
  WriteIndex(R"({"a":"model-00001-of-00002.safetensors",)"
             R"("b":"model-00002-of-00002.safetensors",)"
             R"("c":"model-00001-of-00002.safetensors",)"
             R"("d":"model-00002-of-00002.safetensors",)"
             R"("e":"model-00003-of-00002.safetensors"})");
  EXPECT_EQ(OpenCode(), StatusCode::kNotFound);
  // Duplicate keys, wrong types, no weight_map, bad JSON.
  WriteIndex(R"({"a":"model-00001-of-00002.safetensors",)"
             R"("a":"model-00001-of-00002.safetensors"})");
  EXPECT_EQ(OpenCode(), StatusCode::kDataLoss);
  WriteIndex(R"({"a":1})");
  EXPECT_EQ(OpenCode(), StatusCode::kDataLoss);
  WriteIndex(R"([])");
  EXPECT_EQ(OpenCode(), StatusCode::kDataLoss);
  WriteText(dir_.File("model.safetensors.index.json"), R"({"metadata":{}})");
  EXPECT_EQ(OpenCode(), StatusCode::kDataLoss);
  WriteText(dir_.File("model.safetensors.index.json"), R"({"weight_map":)");
  EXPECT_EQ(OpenCode(), StatusCode::kDataLoss);
}

TEST_F(FormatCheckpointShardedTest, RejectsShardPathsOutsideTheDirectory) {
  for (const char* shard : {"../model-00001-of-00002.safetensors",
                            "/etc/passwd", "a/../../x", "..", ""}) {
    SCOPED_TRACE(shard);
    WriteIndex(std::string(R"({"a":")") + shard + "\"}");
    Result<Checkpoint> c =
        Checkpoint::Open(dir_.path(), Checkpoint::Mode::kReadOnly);
    EXPECT_THAT(c, StatusIs(StatusCode::kDataLoss));
    EXPECT_NE(c.status().message().find("relative path"),
              std::string_view::npos);
  }
}

TEST_F(FormatCheckpointShardedTest, RejectsTensorInTwoShards) {
  ASSERT_OK(WriteSafetensors(
      dir_.File("extra.safetensors"), {},
      std::vector<SafetensorsTensorView>{{"a", "BF16", {2, 3}, a_}}));
  WriteIndex(R"({"a":"extra.safetensors",)"
             R"("b":"model-00002-of-00002.safetensors",)"
             R"("c":"model-00001-of-00002.safetensors",)"
             R"("d":"model-00002-of-00002.safetensors"})");
  EXPECT_EQ(OpenCode(), StatusCode::kDataLoss);
}

TEST_F(FormatCheckpointShardedTest, CopyThenPatchInPlace) {
  TempDir scratch;
  const std::string copy = scratch.File("ckpt");
  ASSERT_OK(CopyCheckpoint(dir_.path(), copy));
  EXPECT_TRUE(PathExists(copy + "/config.json"));
  EXPECT_TRUE(PathExists(copy + "/model.safetensors.index.json"));
  {
    Result<Checkpoint> rw =
        Checkpoint::Open(copy, Checkpoint::Mode::kReadWrite);
    ASSERT_OK(rw);
    size_t b = *rw->IndexOf("b");
    std::span<uint8_t> bytes = rw->MutableData(b);
    ASSERT_NE(bytes.data(), nullptr);
    ASSERT_EQ(bytes.size(), 5u);
    bytes[3] ^= 0x5A;
    ASSERT_OK(rw->SyncRange(b, 3, 1));
    ASSERT_OK(rw->SyncRange(b, 0, 5));
    ASSERT_OK(rw->SyncRange(b, 5, 0));
    EXPECT_THAT(rw->SyncRange(b, 3, 3), StatusIs(StatusCode::kOutOfRange));
    EXPECT_THAT(rw->SyncRange(b, UINT64_MAX, 2),
                StatusIs(StatusCode::kOutOfRange));
    EXPECT_THAT(rw->SyncRange(99, 0, 0), StatusIs(StatusCode::kOutOfRange));
    ASSERT_OK(rw->Sync());
  }
  Result<Checkpoint> patched =
      Checkpoint::Open(copy, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(patched);
  std::vector<uint8_t> want = b_;
  want[3] ^= 0x5A;
  std::span<const uint8_t> got = patched->Data(*patched->IndexOf("b"));
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
  // The source is untouched.
  Result<Checkpoint> src =
      Checkpoint::Open(dir_.path(), Checkpoint::Mode::kReadOnly);
  ASSERT_OK(src);
  got = src->Data(*src->IndexOf("b"));
  EXPECT_TRUE(std::equal(got.begin(), got.end(), b_.begin(), b_.end()));
}

// LayOutSafetensors places every tensor where WriteSafetensors writes it,
// unsorted input included.
TEST(FormatCheckpointTest, LayoutMatchesTheWriter) {
  TempDir dir;
  std::vector<uint8_t> a = Bytes(12, 1), b = Bytes(4, 2), c = Bytes(0, 3);
  const std::vector<SafetensorsTensorView> views = {
      {"z.weight", "BF16", {2, 3}, a}, {"a.bias", "F32", {1}, b},
      {"m.empty", "F16", {0}, c}};
  const std::map<std::string, std::string> meta = {{"version", "00000000000000000007"}};
  ASSERT_OK(WriteSafetensors(dir.File("w.safetensors"), meta, views));
  const std::vector<uint8_t> file = refit::testing::ReadBytes(dir.File("w.safetensors"));
  std::vector<SafetensorsEntry> entries;
  for (const auto& v : views) entries.push_back({v.name, v.dtype, v.shape});
  Result<SafetensorsLayout> layout = LayOutSafetensors(meta, entries);
  ASSERT_OK(layout);
  ASSERT_EQ(layout->file_size, file.size());
  ASSERT_LE(layout->prefix.size(), file.size());
  EXPECT_TRUE(std::equal(layout->prefix.begin(), layout->prefix.end(), file.begin()));
  for (size_t i = 0; i < views.size(); ++i) {
    ASSERT_EQ(layout->sizes[i], views[i].data.size());
    EXPECT_TRUE(std::equal(views[i].data.begin(), views[i].data.end(),
                           file.begin() + static_cast<ptrdiff_t>(layout->offsets[i])))
        << views[i].name;
  }
  EXPECT_THAT(LayOutSafetensors(meta, std::vector<SafetensorsEntry>{{"x", "NOPE", {1}}}),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(FormatCheckpointTest, SingleFileAndDirectory) {
  TempDir dir;
  std::vector<uint8_t> x = Bytes(8, 9);
  ASSERT_OK(WriteSafetensors(
      dir.File("model.safetensors"), {{"step", "1"}},
      std::vector<SafetensorsTensorView>{{"x", "F64", {1}, x}}));
  for (const std::string& path : {dir.File("model.safetensors"), dir.path()}) {
    SCOPED_TRACE(path);
    Result<Checkpoint> c = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
    ASSERT_OK(c);
    EXPECT_FALSE(c->sharded());
    ASSERT_EQ(c->files().size(), 1u);
    EXPECT_EQ(c->files()[0].metadata.at("step"), "1");
    EXPECT_EQ(c->files()[0].size,
              std::filesystem::file_size(dir.File("model.safetensors")));
    ASSERT_EQ(c->tensors().size(), 1u);
    EXPECT_EQ(c->tensors()[0].offset + 8, c->files()[0].size);
  }
  // A plain file copies to a file.
  ASSERT_OK(CopyCheckpoint(dir.File("model.safetensors"), dir.File("copy")));
  EXPECT_EQ(refit::testing::ReadBytes(dir.File("copy")),
            refit::testing::ReadBytes(dir.File("model.safetensors")));
  EXPECT_THAT(CopyCheckpoint(dir.File("model.safetensors"), dir.path()),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(CopyCheckpoint(dir.File("missing"), dir.File("x")),
              StatusIs(StatusCode::kNotFound));
}

TEST(FormatCheckpointTest, NotFound) {
  TempDir dir;
  EXPECT_THAT(Checkpoint::Open(dir.path(), Checkpoint::Mode::kReadOnly),
              StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(Checkpoint::Open(dir.File("nope.safetensors"),
                               Checkpoint::Mode::kReadOnly),
              StatusIs(StatusCode::kNotFound));
}

TEST(FormatCheckpointTest, UnknownDTypeNeedsRegistry) {
  TempDir dir;
  std::vector<uint8_t> x = Bytes(4, 9);
  DTypeRegistry registry;
  ASSERT_OK(registry.Register("MX9", 2));
  ASSERT_OK(WriteSafetensors(
      dir.File("m.safetensors"), {},
      std::vector<SafetensorsTensorView>{{"x", "MX9", {2}, x}}, registry));
  Result<Checkpoint> plain =
      Checkpoint::Open(dir.File("m.safetensors"), Checkpoint::Mode::kReadOnly);
  EXPECT_THAT(plain, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(plain.status().message().find("--dtype-width"),
            std::string_view::npos);
  Result<Checkpoint> declared = Checkpoint::Open(
      dir.File("m.safetensors"), Checkpoint::Mode::kReadOnly, registry);
  ASSERT_OK(declared);
  EXPECT_EQ(declared->tensors()[0].element_width, 2);
}

}  // namespace
}  // namespace refit
