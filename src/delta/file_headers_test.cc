// Carrying the target's safetensors headers through diff and apply
// (docs/format.md §6, §8): patched files byte-identical to the target,
// headers that cannot be carried, verify's header-only report, older
// deltas, and the header journal's crash recovery.
#include "delta/file_headers.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/file.h"
#include "base/hash.h"
#include "delta/delta_file.h"
#include "format/safetensors.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

struct Model {
  std::map<std::string, std::vector<uint8_t>> tensors;  // BF16, 1-D
};

Model MakeModel(uint32_t seed, size_t elements) {
  Model m;
  for (const char* name : {"a.weight", "b.weight", "c.bias"}) {
    std::vector<uint8_t>& bytes = m.tensors[name];
    bytes.resize(elements * 2);
    for (auto& b : bytes) {
      seed = seed * 1664525u + 1013904223u;
      b = static_cast<uint8_t>(seed >> 24);
    }
  }
  return m;
}

// Flips the low bit of every `every`-th element.
Model Step(Model m, size_t every) {
  for (auto& [name, bytes] : m.tensors) {
    for (size_t i = 0; i < bytes.size(); i += 2 * every) bytes[i] ^= 1;
  }
  return m;
}

void Write(const std::string& path, const Model& m,
           const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensorView> views;
  for (const auto& [name, bytes] : m.tensors) {
    views.push_back({name, "BF16", {bytes.size() / 2}, bytes});
  }
  ASSERT_OK(WriteSafetensors(path, metadata, views));
}

void ExpectSameTensors(const std::string& a_path, const std::string& b_path) {
  auto a = Checkpoint::Open(a_path, Checkpoint::Mode::kReadOnly);
  auto b = Checkpoint::Open(b_path, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (size_t i = 0; i < a->tensors().size(); ++i) {
    auto da = a->Data(i);
    auto db = b->Data(i);
    ASSERT_EQ(da.size(), db.size());
    EXPECT_TRUE(std::equal(da.begin(), da.end(), db.begin()))
        << a->tensors()[i].name;
  }
}

class HeaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = MakeModel(7, 50000);
    base_ = dir_.File("base.safetensors");
    target_ = dir_.File("target.safetensors");
    work_ = dir_.File("work.safetensors");
    delta_ = dir_.File("d.rfd");
    Write(base_, model_, {{"format", "pt"}, {"step", "0"}});
  }

  TempDir dir_;
  Model model_;
  std::string base_, target_, work_, delta_;
};

TEST_F(HeaderTest, PatchedFileIsByteIdenticalToTheTarget) {
  Write(target_, Step(model_, 37), {{"format", "pt"}, {"step", "1"}});
  auto diff = Diff(base_, target_, delta_, {});
  ASSERT_OK(diff);
  auto reader = DeltaReader::Open(delta_);
  ASSERT_OK(reader);
  EXPECT_EQ(reader->format_version(), kDeltaFormatVersion);
  ASSERT_EQ(reader->headers().size(), 1u);
  EXPECT_EQ(reader->headers()[0].name, "model.safetensors");

  ASSERT_OK(CopyCheckpoint(base_, work_));
  auto applied = Apply(delta_, work_, {});
  ASSERT_OK(applied);
  EXPECT_EQ(applied->headers_written, 1u);
  EXPECT_TRUE(applied->headers_not_carried.empty());
  EXPECT_EQ(ReadBytes(work_), ReadBytes(target_));
  EXPECT_FALSE(PathExists(HeaderJournalPath(work_)));

  auto verify = Verify(work_, delta_);
  ASSERT_OK(verify);
  EXPECT_TRUE(verify->matches_target);
  EXPECT_TRUE(verify->headers_checked);
  EXPECT_TRUE(verify->header_differs.empty());

  // A second apply writes nothing: tensors and header are the target's.
  auto again = Apply(delta_, work_, {});
  ASSERT_OK(again);
  EXPECT_EQ(again->chunks_applied, 0u);
  EXPECT_EQ(again->headers_written, 0u);
  EXPECT_EQ(again->headers_unchanged, 1u);
  EXPECT_EQ(ReadBytes(work_), ReadBytes(target_));
}

TEST_F(HeaderTest, MetadataOnlyChangeIsCarried) {
  Write(target_, model_, {{"format", "pt"}, {"step", "9"}});
  ASSERT_OK(Diff(base_, target_, delta_, {}));
  ASSERT_OK(CopyCheckpoint(base_, work_));
  auto applied = Apply(delta_, work_, {});
  ASSERT_OK(applied);
  EXPECT_EQ(applied->chunks, 0u);
  EXPECT_EQ(applied->headers_written, 1u);
  EXPECT_EQ(ReadBytes(work_), ReadBytes(target_));
}

TEST_F(HeaderTest, LongerTargetHeaderIsNotCarriedButTensorsAre) {
  Write(target_, Step(model_, 11),
        {{"format", "pt"}, {"step", "1"}, {"note", std::string(300, 'x')}});
  ASSERT_OK(Diff(base_, target_, delta_, {}));
  ASSERT_OK(CopyCheckpoint(base_, work_));
  const auto base_header = ReadSafetensorsHeaderBytes(work_);
  ASSERT_OK(base_header);

  auto applied = Apply(delta_, work_, {});
  ASSERT_OK(applied);
  EXPECT_EQ(applied->headers_written, 0u);
  ASSERT_EQ(applied->headers_not_carried.size(), 1u);
  EXPECT_NE(applied->headers_not_carried[0].find("header area"),
            std::string::npos)
      << applied->headers_not_carried[0];
  ExpectSameTensors(work_, target_);
  EXPECT_EQ(*ReadSafetensorsHeaderBytes(work_), *base_header);

  // verify: the tensors are the target's; only the header differs, and
  // that is reported on its own, not as a mismatch.
  auto verify = Verify(work_, delta_);
  ASSERT_OK(verify);
  EXPECT_TRUE(verify->matches_target);
  EXPECT_TRUE(verify->mismatched.empty());
  EXPECT_TRUE(verify->headers_checked);
  EXPECT_EQ(verify->header_differs.size(), 1u);
}

TEST_F(HeaderTest, ShorterTargetHeaderIsPaddedIntoTheHeaderArea) {
  // The base's header is longer; the target's fits with room to spare.
  Write(base_, model_, {{"step", "0"}, {"note", std::string(100, 'y')}});
  Write(target_, Step(model_, 5), {{"step", "1"}});
  ASSERT_OK(Diff(base_, target_, delta_, {}));
  ASSERT_OK(CopyCheckpoint(base_, work_));
  auto applied = Apply(delta_, work_, {});
  ASSERT_OK(applied);
  EXPECT_EQ(applied->headers_written, 1u);
  EXPECT_EQ(ReadBytes(work_).size(), ReadBytes(base_).size());
  auto ckpt = Checkpoint::Open(work_, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ckpt);
  EXPECT_EQ(ckpt->files()[0].metadata,
            (std::map<std::string, std::string>{{"step", "1"}}));
  ExpectSameTensors(work_, target_);
  auto verify = Verify(work_, delta_);
  ASSERT_OK(verify);
  EXPECT_TRUE(verify->header_differs.empty());
}

TEST_F(HeaderTest, HeaderOnlyDifferenceIsNotAMismatch) {
  Write(target_, Step(model_, 3), {{"format", "pt"}, {"step", "1"}});
  ASSERT_OK(Diff(base_, target_, delta_, {}));
  // The target's tensors under the base's header.
  const std::string other = dir_.File("other.safetensors");
  Write(other, Step(model_, 3), {{"format", "pt"}, {"step", "0"}});
  auto verify = Verify(other, delta_);
  ASSERT_OK(verify);
  EXPECT_TRUE(verify->matches_target);
  EXPECT_TRUE(verify->mismatched.empty());
  ASSERT_EQ(verify->header_differs.size(), 1u);
  EXPECT_NE(verify->header_differs[0].find(other), std::string::npos);
}

TEST_F(HeaderTest, ShardedCheckpointCarriesEveryShardsHeader) {
  const std::string base_dir = dir_.File("base");
  const std::string target_dir = dir_.File("target");
  const std::string work_dir = dir_.File("work");
  const Model target_model = Step(model_, 13);
  const std::string index =
      R"({"metadata":{"total_size":0},"weight_map":{"a.weight":"s1.safetensors",)"
      R"("b.weight":"s2.safetensors","c.bias":"s2.safetensors"}})";
  for (const auto& [dir, m, step] :
       {std::tuple{base_dir, model_, "0"}, std::tuple{target_dir, target_model, "1"}}) {
    std::filesystem::create_directories(dir);
    Model s1, s2;
    s1.tensors["a.weight"] = m.tensors.at("a.weight");
    s2.tensors["b.weight"] = m.tensors.at("b.weight");
    s2.tensors["c.bias"] = m.tensors.at("c.bias");
    Write(dir + "/s1.safetensors", s1, {{"step", step}});
    Write(dir + "/s2.safetensors", s2, {{"shard", "2"}, {"step", step}});
    WriteBytes(dir + "/model.safetensors.index.json",
               std::vector<uint8_t>(index.begin(), index.end()));
  }
  ASSERT_OK(Diff(base_dir, target_dir, delta_, {}));
  ASSERT_OK(CopyCheckpoint(base_dir, work_dir));
  auto applied = Apply(delta_, work_dir, {});
  ASSERT_OK(applied);
  EXPECT_EQ(applied->headers_written, 2u);
  for (const char* shard : {"/s1.safetensors", "/s2.safetensors"}) {
    EXPECT_EQ(ReadBytes(work_dir + shard), ReadBytes(target_dir + shard)) << shard;
  }
  EXPECT_FALSE(PathExists(HeaderJournalPath(work_dir)));

  // A single file is not laid out like the shards: tensors apply, the
  // headers are reported as not carried.
  Model whole = model_;
  Write(base_, whole, {{"step", "0"}});
  ASSERT_OK(CopyCheckpoint(base_, work_));
  auto single = Apply(delta_, work_, {});
  ASSERT_OK(single);
  EXPECT_EQ(single->headers_written, 0u);
  EXPECT_EQ(single->headers_not_carried.size(), 1u);
  ExpectSameTensors(work_, target_dir);
}

TEST_F(HeaderTest, TensorDeltasInMemoryCarryNoHeaders) {
  std::vector<uint8_t> a(1000, 1), b(1000, 2);
  std::vector<TensorView> base = {{"t", "U8", 1, {1000}, a.data()}};
  std::vector<TensorView> target = {{"t", "U8", 1, {1000}, b.data()}};
  ASSERT_OK(DiffTensors(base, target, delta_, {}));
  auto reader = DeltaReader::Open(delta_);
  ASSERT_OK(reader);
  EXPECT_EQ(reader->format_version(), 2);
  EXPECT_TRUE(reader->headers().empty());
}

// A crash during the in-place header write can leave disk blocks of the old
// and new header mixed; the journal lets the next apply finish the write.
TEST_F(HeaderTest, TornHeaderWriteIsFinishedByTheNextApply) {
  // Metadata whose difference sits in the first 512-byte block, with
  // headers spanning several blocks.
  const std::string pad(1200, 'z');
  Write(base_, model_, {{"a_step", "0"}, {"pad", pad}});
  Write(target_, Step(model_, 17), {{"a_step", "1"}, {"pad", pad}});
  ASSERT_OK(Diff(base_, target_, delta_, {}));
  ASSERT_OK(CopyCheckpoint(base_, work_));
  auto old_json = ReadSafetensorsHeaderBytes(base_);
  auto new_json = ReadSafetensorsHeaderBytes(target_);
  ASSERT_OK(old_json);
  ASSERT_OK(new_json);
  ASSERT_EQ(old_json->size(), new_json->size());
  ASSERT_GT(new_json->size(), 1024u);

  // The state a crash leaves: tensors applied and synced, the journal
  // written, the header's later blocks new and its first block old.
  ASSERT_OK(Apply(delta_, work_, {}));
  ASSERT_EQ(ReadBytes(work_), ReadBytes(target_));
  ASSERT_OK(WriteHeaderJournal(
      work_, {HeaderJournalEntry{"model.safetensors", *old_json, *new_json}}));
  ASSERT_OK(WriteFileRange(work_, 8,
                           std::span<const uint8_t>(*old_json).first(512 - 8),
                           true));
  ASSERT_NE(ReadBytes(work_), ReadBytes(target_));

  auto again = Apply(delta_, work_, {});
  ASSERT_OK(again);
  EXPECT_EQ(again->chunks_applied, 0u);
  EXPECT_EQ(ReadBytes(work_), ReadBytes(target_));
  EXPECT_FALSE(PathExists(HeaderJournalPath(work_)));
}

TEST_F(HeaderTest, JournalLeavesFilesItDidNotTear) {
  const std::string pad(1200, 'z');
  Write(base_, model_, {{"a_step", "0"}, {"pad", pad}});
  ASSERT_OK(CopyCheckpoint(base_, work_));
  auto old_json = ReadSafetensorsHeaderBytes(base_);
  ASSERT_OK(old_json);
  std::vector<uint8_t> new_json = *old_json;
  new_json[20] ^= 1;
  // A header that is neither old, new, nor a block-wise mix of them (the
  // file was replaced after the crash) is not the journal's to rewrite.
  std::vector<uint8_t> foreign = *old_json;
  foreign[700] = foreign[700] == 'z' ? 'q' : 'z';
  ASSERT_OK(WriteFileRange(work_, 8, foreign, true));
  const auto before = ReadBytes(work_);
  ASSERT_OK(WriteHeaderJournal(
      work_, {HeaderJournalEntry{"model.safetensors", *old_json, new_json}}));
  ASSERT_OK(RecoverHeaderJournal(work_));
  EXPECT_EQ(ReadBytes(work_), before);
  EXPECT_FALSE(PathExists(HeaderJournalPath(work_)));

  // A damaged journal is refused and kept.
  WriteBytes(HeaderJournalPath(work_), {'R', 'F', 'H', 'D', 'R', 'J', 'N', 'L',
                                        0, 0, 0, 0, 0, 0, 0, 0, 0});
  EXPECT_THAT(RecoverHeaderJournal(work_), StatusIs(StatusCode::kDataLoss));
  EXPECT_TRUE(PathExists(HeaderJournalPath(work_)));
}

// Rewrites a delta's trailer checksum after an edit, so that the reader's
// own checks, not the checksum, must catch the edit.
std::vector<uint8_t> Resign(std::vector<uint8_t> d) {
  const size_t foot = d.size() - kDeltaFooterSize;
  const uint64_t trailer_offset = LoadLE(d.data() + foot, 8);
  std::vector<uint8_t> covered(d.begin(), d.begin() + kDeltaHeaderSize);
  covered.insert(covered.end(), d.begin() + static_cast<long>(trailer_offset),
                 d.begin() + static_cast<long>(foot));
  StoreLE(d.data() + foot + 8, XXH3_64bits(covered.data(), covered.size()), 8);
  return d;
}

// Damaged file-header sections are refused with kDataLoss: truncations,
// and counts, names and lengths that do not fit the trailer even under a
// valid checksum.
TEST_F(HeaderTest, HostileHeaderSectionsAreRejected) {
  Write(target_, Step(model_, 37), {{"format", "pt"}, {"step", "1"}});
  ASSERT_OK(Diff(base_, target_, delta_, {}));
  const std::vector<uint8_t> good = ReadBytes(delta_);
  auto reader = DeltaReader::FromBytes(good);
  ASSERT_OK(reader);
  ASSERT_OK(DeltaReader::FromBytes(Resign(good)));
  for (size_t len = 0; len < good.size(); len += 1 + len / 40) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<long>(len));
    EXPECT_FALSE(DeltaReader::FromBytes(cut).ok()) << len;
  }
  // The section ends the trailer: count (1 byte), name length, name, json
  // length (a 2-byte varint here), json.
  const size_t n = reader->headers()[0].json.size();
  ASSERT_TRUE(n >= 128 && n < 16384);
  const size_t json_at = good.size() - kDeltaFooterSize - n;
  const size_t len_at = json_at - 2;
  const size_t name_at = len_at - 17;
  ASSERT_EQ(good[name_at - 1], 17);  // "model.safetensors"
  const size_t count_at = name_at - 2;
  ASSERT_EQ(good[count_at], 1);

  auto expect_refused = [&](std::vector<uint8_t> bad, const char* what) {
    auto r = DeltaReader::FromBytes(Resign(std::move(bad)));
    EXPECT_THAT(r, StatusIs(StatusCode::kDataLoss)) << what;
  };
  std::vector<uint8_t> bad = good;
  bad[count_at] = 2;  // one more file than the trailer holds
  expect_refused(bad, "count");
  bad = good;
  bad[len_at] = static_cast<uint8_t>(bad[len_at] + 1);  // json past the end
  expect_refused(bad, "length");
  bad = good;
  bad[len_at] = 0x80;  // a 0 length: below the 2-byte minimum
  bad[len_at + 1] = 0x00;
  expect_refused(bad, "short");
  bad = good;
  bad[name_at - 1] = 0;  // empty name
  expect_refused(bad, "name");
}

// Golden: a delta with a file-header section, from files written by the
// deterministic safetensors writer; frozen within format version 2. It is
// also the fuzz corpus's fuzz/corpus/delta/headers.rfd.
TEST(HeaderGoldenTest, FormatVersion2HeadersDeltaIsFrozen) {
  TempDir dir;
  const Model base = MakeModel(3, 3000);
  Write(dir.File("b.safetensors"), base, {{"step", "0"}});
  Write(dir.File("t.safetensors"), Step(base, 9), {{"step", "1"}});
  DiffOptions opts;
  opts.version = 2;
  opts.base_version = 1;
  ASSERT_OK(Diff(dir.File("b.safetensors"), dir.File("t.safetensors"),
                 dir.File("g.rfd"), opts));
  auto bytes = ReadBytes(dir.File("g.rfd"));
  EXPECT_EQ(bytes.size(), 693u);
  EXPECT_EQ(HashBytes(bytes.data(), bytes.size()).Hex(),
            "d015050c5bebd61ac09d6d9c77d218a1");
  EXPECT_EQ(bytes, ReadBytes(std::string(REFIT_FUZZ_CORPUS) + "/delta/headers.rfd"));
}

}  // namespace
}  // namespace refit
