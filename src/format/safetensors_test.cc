#include "format/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

// A file made by hand: the length prefix, `json` verbatim, then
// `data_size` bytes of data.
std::vector<uint8_t> RawFile(const std::string& json, size_t data_size = 0,
                             uint64_t declared_length = UINT64_MAX) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U64(declared_length == UINT64_MAX ? json.size() : declared_length);
  w.Bytes(json.data(), json.size());
  out.resize(out.size() + data_size, 0xAB);
  return out;
}

Status Parse(const std::vector<uint8_t>& file,
             const DTypeRegistry& dtypes = {}) {
  return ParseSafetensorsHeader(file, file.size(), dtypes).status();
}

// Expects `file` to be rejected with `code` and a message containing
// `fragment`.
void ExpectRejected(const std::vector<uint8_t>& file, StatusCode code,
                    std::string_view fragment) {
  Status s = Parse(file);
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(fragment), std::string_view::npos)
      << "message: " << s.message() << "\nexpected fragment: " << fragment;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(FormatSafetensorsTest, ParsesMinimalHeader) {
  auto file =
      RawFile(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
              R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
              R"("__metadata__":{"format":"pt"}})",
              12);
  Result<SafetensorsHeader> h = ParseSafetensorsHeader(file, file.size());
  ASSERT_OK(h);
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->data_start, 8 + h->header_size);
  EXPECT_EQ(h->tensors[0].offset, h->data_start);
  EXPECT_EQ(h->tensors[1].offset, h->data_start + 4);
  EXPECT_EQ(h->tensors[1].element_width, 4);
  EXPECT_EQ(h->tensors[1].num_elements, 2u);
  EXPECT_EQ(h->metadata.at("format"), "pt");
}

TEST(FormatSafetensorsTest, EmptyAndScalarTensors) {
  auto file = RawFile(
      R"({"empty":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
      R"("empty2":{"dtype":"I64","shape":[3,0,2],"data_offsets":[0,0]},)"
      R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
      R"("tail":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})",
      4);
  Result<SafetensorsHeader> h = ParseSafetensorsHeader(file, file.size());
  ASSERT_OK(h);
  ASSERT_EQ(h->tensors.size(), 4u);
  EXPECT_EQ(h->tensors[0].num_elements, 0u);
  EXPECT_EQ(h->tensors[1].num_elements, 0u);
  EXPECT_EQ(h->tensors[2].num_elements, 1u);
  EXPECT_TRUE(h->tensors[2].shape.empty());
  EXPECT_EQ(h->tensors[2].byte_size, 4u);
  // No tensors at all, no data: a valid (empty) checkpoint.
  EXPECT_OK(Parse(RawFile("{}")));
  EXPECT_OK(Parse(RawFile(R"({"__metadata__":{}}  )")));
}

TEST(FormatSafetensorsTest, RejectsBadLengths) {
  ExpectRejected({1, 2, 3}, StatusCode::kDataLoss, "too short");
  ExpectRejected(RawFile("{}", 0, 100'000'001), StatusCode::kDataLoss,
                 "exceeds the limit");
  ExpectRejected(RawFile("{}", 0, UINT64_MAX - 1), StatusCode::kDataLoss,
                 "exceeds the limit");
  ExpectRejected(RawFile("{}", 0, 3), StatusCode::kDataLoss, "past the end");
  // A prefix shorter than the header is the caller's mistake.
  auto file = RawFile("{}    ");
  Status s =
      ParseSafetensorsHeader(std::span(file).first(10), file.size()).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
}

TEST(FormatSafetensorsTest, RejectsBadJson) {
  ExpectRejected(RawFile(""), StatusCode::kDataLoss, "invalid JSON");
  ExpectRejected(RawFile("{\"a\":"), StatusCode::kDataLoss, "invalid JSON");
  ExpectRejected(RawFile("{} x"), StatusCode::kDataLoss, "invalid JSON");
  ExpectRejected(RawFile("{\"\xff\":1}"), StatusCode::kDataLoss,
                 "invalid JSON");
  ExpectRejected(RawFile(std::string("{\0}", 3)), StatusCode::kDataLoss,
                 "invalid JSON");
  ExpectRejected(RawFile("[]"), StatusCode::kDataLoss, "root is not an object");
  ExpectRejected(RawFile("\"x\""), StatusCode::kDataLoss,
                 "root is not an object");
  ExpectRejected(RawFile(std::string(100000, '[')), StatusCode::kDataLoss,
                 "nesting deeper");
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", 1),
      StatusCode::kDataLoss, "nesting deeper");
}

// The reference reader (huggingface/safetensors) requires the header to
// begin with '{' and allows only JSON whitespace after it; nlohmann alone would
// skip a byte order mark and stop at the first NUL.
TEST(FormatSafetensorsTest, HeaderIsOneObjectPaddedWithSpaces) {
  ExpectRejected(RawFile("\xEF\xBB\xBF{}"), StatusCode::kDataLoss,
                 "byte order mark");
  ExpectRejected(RawFile(" {}"), StatusCode::kDataLoss, "begin with '{'");
  ExpectRejected(RawFile("\n{}"), StatusCode::kDataLoss, "begin with '{'");
  ExpectRejected(RawFile(std::string("{}\0\0\0\0\0\0", 8)),
                 StatusCode::kDataLoss, "NUL byte at offset 2");
  ExpectRejected(RawFile(std::string("{}  \0junk", 9)), StatusCode::kDataLoss,
                 "NUL byte at offset 4");
  ExpectRejected(RawFile("{}  x"), StatusCode::kDataLoss, "invalid JSON");
  ExpectRejected(RawFile("{}\n\x0c"), StatusCode::kDataLoss, "invalid JSON");
  ExpectRejected(
      RawFile(std::string(R"({"a":{"dtype":"U8","shape":[1],)"
                          R"("data_offsets":[0,1]}})") +
                  std::string(1, '\0') + R"({"b":1})",
              1),
      StatusCode::kDataLoss, "NUL byte");
  // JSON whitespace after the JSON (as the reference's serde_json allows),
  // and inside it, is fine.
  EXPECT_OK(Parse(RawFile("{}      ")));
  EXPECT_OK(Parse(RawFile("{}\n")));
  EXPECT_OK(Parse(RawFile("{} \t\r\n ")));
  EXPECT_OK(Parse(RawFile("{ \"__metadata__\" :\n{\t} }  ")));
}

TEST(FormatSafetensorsTest, RejectsWrongTypes) {
  const std::pair<std::string, std::string> kCases[] = {
      {R"({"a":[1]})", "not an object"},
      {R"({"a":{"shape":[1],"data_offsets":[0,1]}})", "needs dtype"},
      {R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", "needs dtype"},
      {R"({"a":{"dtype":"U8","shape":[1]}})", "needs dtype"},
      {R"({"a":{"dtype":1,"shape":[1],"data_offsets":[0,1]}})",
       "dtype is not a string"},
      {R"({"a":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})",
       "shape is not an array"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}})",
       "two offsets"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":{"0":1}}})",
       "two offsets"},
      {R"({"a":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}})",
       "not a number"},
      {R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "negative"},
      {R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})",
       "not an integer"},
      {R"({"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})",
       "not an integer"},
      {R"({"a":{"dtype":"U8","shape":[1e30],"data_offsets":[0,1]}})",
       "not an integer"},
      {R"({"a":{"dtype":"U8","shape":[18446744073709551616],)"
       R"("data_offsets":[0,1]}})",
       "not an integer"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", "negative"},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,null]}})",
       "not a number"},
      {R"({"__metadata__":[],"a":{"dtype":"U8","shape":[1],)"
       R"("data_offsets":[0,1]}})",
       "__metadata__ is not an object"},
      {R"({"__metadata__":{"k":1},"a":{"dtype":"U8","shape":[1],)"
       R"("data_offsets":[0,1]}})",
       "is not a string"},
      {R"({"__metadata__":{"k":{"x":"y"}}})", "is not a string"},
      {R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
       "empty tensor name"},
  };
  for (const auto& [json, fragment] : kCases) {
    SCOPED_TRACE(json);
    ExpectRejected(RawFile(json, 1), StatusCode::kDataLoss, fragment);
  }
}

TEST(FormatSafetensorsTest, RejectsDuplicateKeys) {
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
              R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
              2),
      StatusCode::kDataLoss, "duplicate key 'a'");
  ExpectRejected(RawFile(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],)"
                         R"("data_offsets":[0,1]}})",
                         1),
                 StatusCode::kDataLoss, "duplicate key 'dtype'");
  ExpectRejected(RawFile(R"({"__metadata__":{"k":"1","k":"2"}})"),
                 StatusCode::kDataLoss, "duplicate key 'k'");
  // Equal keys in different objects are fine.
  EXPECT_OK(
      Parse(RawFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                    R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                    2)));
}

TEST(FormatSafetensorsTest, RejectsSizeOverflow) {
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],)"
              R"("data_offsets":[0,0]}})"),
      StatusCode::kDataLoss, "element count overflows");
  ExpectRejected(RawFile(R"({"a":{"dtype":"F64","shape":[4611686018427387904],)"
                         R"("data_offsets":[0,0]}})"),
                 StatusCode::kDataLoss, "byte size overflows");
  // A zero dimension after a huge product is still an overflow-free 0.
  EXPECT_OK(Parse(RawFile(R"({"a":{"dtype":"U8","shape":[0,4294967296,)"
                          R"(4294967296],"data_offsets":[0,0]}})")));
}

TEST(FormatSafetensorsTest, RejectsBadOffsets) {
  // Out of the buffer (which is 4 bytes here).
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 4),
      StatusCode::kDataLoss, "past the data buffer");
  ExpectRejected(RawFile(R"({"a":{"dtype":"U8","shape":[1],)"
                         R"("data_offsets":[18446744073709551615,0]}})",
                         4),
                 StatusCode::kDataLoss, "end before begin");
  ExpectRejected(RawFile(R"({"a":{"dtype":"U8","shape":[1],)"
                         R"("data_offsets":[3,18446744073709551615]}})",
                         4),
                 StatusCode::kDataLoss, "past the data buffer");
  // Size disagrees with shape * width.
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,2]}})", 2),
      StatusCode::kDataLoss, "need 4");
  // Overlap.
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
              R"("b":{"dtype":"U8","shape":[3],"data_offsets":[2,5]}})",
              5),
      StatusCode::kDataLoss, "overlap");
  // Two tensors on the same bytes.
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
              R"("b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
              2),
      StatusCode::kDataLoss, "overlap");
  // Hole between tensors, at the start, and after the last.
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
              R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
              5),
      StatusCode::kDataLoss, "hole of 1 bytes at data offset 2");
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3),
      StatusCode::kDataLoss, "hole of 1 bytes at data offset 0");
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 3),
      StatusCode::kDataLoss, "not covered");
  ExpectRejected(RawFile("{}", 1), StatusCode::kDataLoss, "not covered");
}

// Zero-size tensors occupy no bytes, but the reference still orders every
// tensor by its offsets and requires each to begin where the previous one
// ended: an empty tensor may sit only at the start of the buffer, at its end,
// or between two tensors, never inside one.
TEST(FormatSafetensorsTest, ZeroSizeTensorsSitBetweenTensors) {
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
              R"("e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})",
              4),
      StatusCode::kDataLoss, "zero-size tensor 'e' at data offset 2 lies "
                             "inside tensor 'a'");
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
              R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
              R"("e":{"dtype":"F32","shape":[3,0],"data_offsets":[3,3]}})",
              4),
      StatusCode::kDataLoss, "inside tensor 'b'");
  // Past the end of the buffer is out of it, as before.
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
              R"("e":{"dtype":"U8","shape":[0],"data_offsets":[5,5]}})",
              4),
      StatusCode::kDataLoss, "past the data buffer");
  // At the start, between tensors, at the end, several at one offset, and
  // with no other tensor at all.
  EXPECT_OK(Parse(
      RawFile(R"({"e0":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
              R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
              R"("e1":{"dtype":"BF16","shape":[0,5],"data_offsets":[2,2]},)"
              R"("e2":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
              R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
              R"("e3":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})",
              4)));
  EXPECT_OK(Parse(
      RawFile(R"({"e":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})")));
}

TEST(FormatSafetensorsTest, UnknownDTypeWithAndWithoutRegistry) {
  auto file = RawFile(
      R"({"a":{"dtype":"MY_F24","shape":[2],"data_offsets":[0,8]}})", 8);
  Status s = Parse(file);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(s.message().find("--dtype-width MY_F24="), std::string_view::npos);
  DTypeRegistry registry;
  ASSERT_OK(registry.Register("MY_F24", 4));
  Result<SafetensorsHeader> h =
      ParseSafetensorsHeader(file, file.size(), registry);
  ASSERT_OK(h);
  EXPECT_EQ(h->tensors[0].element_width, 4);
  EXPECT_EQ(h->tensors[0].dtype, "MY_F24");

  // Known but unsupported widths fail cleanly.
  auto c128 = RawFile(
      R"({"a":{"dtype":"C128","shape":[1],"data_offsets":[0,16]}})", 16);
  EXPECT_THAT(Parse(c128), StatusIs(StatusCode::kUnimplemented));
}

TEST(FormatSafetensorsTest, AllDTypesRoundTrip) {
  refit::testing::TempDir dir;
  const std::vector<std::string> kDTypes = {
      "BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
      "BF16", "I32", "U32", "F32",     "F64",     "I64", "U64"};
  DTypeRegistry registry;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<SafetensorsTensorView> views;
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    // Odd sizes put later tensors at unaligned offsets; the format allows it.
    std::vector<uint64_t> shape = {i + 1, 3};
    int width = *registry.ElementWidth(kDTypes[i]);
    storage.push_back(RandomBytes((i + 1) * 3 * static_cast<size_t>(width),
                                  static_cast<uint32_t>(i)));
    // Names in reverse order so the writer has to sort.
    views.push_back(
        {"t" + std::to_string(99 - i), kDTypes[i], shape, storage.back()});
  }
  views.push_back({"zero", "F32", {0}, {}});
  storage.push_back({1, 2, 3, 4, 5, 6, 7, 8});
  views.push_back({"scalar", "F64", {}, storage.back()});
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "7"}, {"note", "quote \" and \xc3\xa9"}};
  const std::string path = dir.File("all.safetensors");
  ASSERT_OK(WriteSafetensors(path, metadata, views));

  // Header layout matches the reference writer.
  std::vector<uint8_t> raw = refit::testing::ReadBytes(path);
  uint64_t n = LoadLE(raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  std::string header(raw.begin() + 8, raw.begin() + 8 + static_cast<long>(n));
  EXPECT_EQ(header.rfind("{\"__metadata__\":{", 0), 0u) << header;
  EXPECT_NE(header.find(R"("t88":{"dtype":"F32","shape":[12,3],)"
                        R"("data_offsets":[)"),
            std::string::npos)
      << header;

  Result<SafetensorsFile> f =
      SafetensorsFile::Open(path, MappedFile::Mode::kReadOnly);
  ASSERT_OK(f);
  EXPECT_EQ(f->metadata(), metadata);
  ASSERT_EQ(f->tensors().size(), views.size());
  for (size_t i = 1; i < f->tensors().size(); ++i) {
    EXPECT_LT(f->tensors()[i - 1].name, f->tensors()[i].name);
  }
  // Written in name order, contiguous.
  uint64_t expected_offset = f->header().data_start;
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    EXPECT_EQ(f->tensors()[i].offset, expected_offset);
    expected_offset += f->tensors()[i].byte_size;
  }
  EXPECT_EQ(expected_offset, f->size());
  for (const SafetensorsTensorView& v : views) {
    SCOPED_TRACE(v.name);
    const SafetensorsTensor* t = f->Find(v.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, v.dtype);
    EXPECT_EQ(t->shape, v.shape);
    EXPECT_EQ(t->byte_size, v.data.size());
    EXPECT_EQ(t->element_width, *registry.ElementWidth(v.dtype));
    size_t index = static_cast<size_t>(t - f->tensors().data());
    std::span<const uint8_t> got = f->Data(index);
    EXPECT_TRUE(
        std::equal(got.begin(), got.end(), v.data.begin(), v.data.end()));
  }
  EXPECT_EQ(f->Find("scalar")->num_elements, 1u);
  EXPECT_EQ(f->Find("zero")->num_elements, 0u);
  EXPECT_EQ(f->Find("nope"), nullptr);

  // Writing is deterministic.
  ASSERT_OK(WriteSafetensors(dir.File("again.safetensors"), metadata, views));
  EXPECT_EQ(refit::testing::ReadBytes(dir.File("again.safetensors")), raw);
}

TEST(FormatSafetensorsTest, WriterRejectsBadInput) {
  refit::testing::TempDir dir;
  const std::string path = dir.File("x.safetensors");
  std::vector<uint8_t> four(4);
  auto write = [&](std::vector<SafetensorsTensorView> views) {
    return WriteSafetensors(path, {}, views);
  };
  EXPECT_THAT(write({{"a", "F32", {2}, four}}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(write({{"a", "F32", {1}, four}, {"a", "F32", {1}, four}}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(write({{"", "F32", {1}, four}}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(write({{"__metadata__", "F32", {1}, four}}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(write({{"a", "NOPE", {1}, four}}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(write({{"\xff", "F32", {1}, four}}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(write({{"a", "U8", {1ull << 32, 1ull << 32}, four}}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(PathExists(path));
  // No tensors and no metadata: still a valid file.
  ASSERT_OK(write({}));
  EXPECT_OK(SafetensorsFile::Open(path, MappedFile::Mode::kReadOnly));
}

TEST(FormatSafetensorsTest, ReadWriteMappingReachesTheFile) {
  refit::testing::TempDir dir;
  const std::string path = dir.File("rw.safetensors");
  std::vector<uint8_t> a = RandomBytes(64, 1), b = RandomBytes(32, 2);
  std::vector<SafetensorsTensorView> views = {{"a", "BF16", {32}, a},
                                              {"b", "U8", {32}, b}};
  ASSERT_OK(WriteSafetensors(path, {}, views));
  {
    Result<SafetensorsFile> ro =
        SafetensorsFile::Open(path, MappedFile::Mode::kReadOnly);
    ASSERT_OK(ro);
    EXPECT_EQ(ro->MutableData(0).data(), nullptr);
    EXPECT_OK(ro->Sync());
  }
  {
    Result<SafetensorsFile> rw =
        SafetensorsFile::Open(path, MappedFile::Mode::kReadWrite);
    ASSERT_OK(rw);
    std::span<uint8_t> bytes = rw->MutableData(1);
    ASSERT_NE(bytes.data(), nullptr);
    ASSERT_EQ(bytes.size(), 32u);
    for (uint8_t& x : bytes) x ^= 0xFF;
    ASSERT_OK(rw->Sync(rw->tensors()[1].offset, 32));
    ASSERT_OK(rw->Sync());
  }
  Result<SafetensorsFile> again =
      SafetensorsFile::Open(path, MappedFile::Mode::kReadOnly);
  ASSERT_OK(again);
  std::span<const uint8_t> got = again->Data(1);
  for (size_t i = 0; i < 32; ++i) EXPECT_EQ(got[i], b[i] ^ 0xFF);
  std::span<const uint8_t> untouched = again->Data(0);
  EXPECT_TRUE(std::equal(untouched.begin(), untouched.end(), a.begin()));
}

TEST(FormatSafetensorsTest, OpenReportsPathOnCorruptFile) {
  refit::testing::TempDir dir;
  const std::string path = dir.File("bad.safetensors");
  refit::testing::WriteBytes(path, RawFile("{]"));
  Result<SafetensorsFile> f =
      SafetensorsFile::Open(path, MappedFile::Mode::kReadOnly);
  EXPECT_THAT(f, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(f.status().message().find(path), std::string_view::npos);
  EXPECT_THAT(
      SafetensorsFile::Open(dir.File("missing"), MappedFile::Mode::kReadOnly),
      StatusIs(StatusCode::kNotFound));
  refit::testing::WriteBytes(dir.File("empty"), {});
  EXPECT_THAT(
      SafetensorsFile::Open(dir.File("empty"), MappedFile::Mode::kReadOnly),
      StatusIs(StatusCode::kDataLoss));
}

}  // namespace
}  // namespace refit
