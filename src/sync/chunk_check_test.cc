// Chunk and manifest checks (sync/chunk_check.h): one set of checks for a
// chunk of a version, before and after its manifest, for an overwrite
// re-send of it, and for the versions of a fold.
#include "sync/chunk_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "delta/chunk.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit::internal {
namespace {

using ::refit::testing::StatusIs;

Authenticator Key() { return *Authenticator::Hmac(std::vector<uint8_t>(32, 7)); }

TensorEntry Tensor(const std::string& name, uint64_t elements) {
  TensorEntry e;
  e.name = name;
  e.dtype = "BF16";
  e.width = 2;
  e.shape = {elements};
  e.num_elements = elements;
  e.before.lo = elements;
  return e;
}

// Version 7 on base 6: tensors "a" (4096 elements) and "b" (1000).
Announcement Version7() {
  Announcement a;
  a.version = 7;
  a.base_version = 6;
  a.members = {"r0"};
  a.tensors = {Tensor("a", 4096), Tensor("b", 1000)};
  return a;
}

ChunkHeader Header(uint64_t tensor, uint64_t start, uint64_t count,
                   codec::ChunkKind kind = codec::ChunkKind::kSparseXor) {
  ChunkHeader h;
  h.kind = kind;
  h.width = 2;
  h.version = 7;
  h.base_version = 6;
  h.tensor_id = tensor;
  h.start = start;
  h.count = count;
  h.changed = 1;
  h.before.lo = 1;
  h.after.lo = 2;
  return h;
}

// A sealed chunk object with a few payload bytes (not decoded here).
std::vector<uint8_t> Object(const ChunkHeader& h) {
  std::vector<uint8_t> bytes;
  SerializeChunk(h, std::vector<uint8_t>{1, 2, 3, 4}, &bytes);
  return Key().Seal(bytes);
}

ManifestChunk Entry(const std::vector<uint8_t>& object, const ChunkHeader& h) {
  ManifestChunk mc;
  mc.size = object.size();
  mc.sha256 = ComputeSha256(object);
  mc.tensor_id = h.tensor_id;
  mc.start = h.start;
  mc.count = h.count;
  mc.changed = h.changed;
  mc.kind = static_cast<uint8_t>(h.kind);
  return mc;
}

Manifest ManifestOf(const Announcement& a, std::vector<ManifestChunk> chunks) {
  Manifest m;
  m.version = a.version;
  m.base_version = a.base_version;
  m.members = a.members;
  m.tensors = a.tensors;
  m.chunks = std::move(chunks);
  return m;
}

// The message of a failed check, or "ok".
std::string Check(const std::vector<uint8_t>& object, const Announcement& a, uint64_t i,
                  const Manifest* m, bool resend = false) {
  auto c = CheckChunk(object, ChunkSpec{&a, i, m, resend}, Key());
  return c.ok() ? "ok" : std::string(c.status().message());
}

TEST(ChunkCheckTest, AChunkPassesBeforeAndAfterItsManifest) {
  const Announcement a = Version7();
  const ChunkHeader h = Header(0, 2048, 2048);
  const auto object = Object(h);
  auto c = CheckChunk(object, ChunkSpec{&a, 1, nullptr, false}, Key());
  ASSERT_OK(c);
  EXPECT_EQ(c->header.start, 2048u);
  EXPECT_EQ(c->payload.size(), 4u);
  const Manifest m = ManifestOf(a, {Entry(Object(Header(0, 0, 2048)), Header(0, 0, 2048)),
                                    Entry(object, h)});
  EXPECT_EQ(Check(object, a, 1, &m), "ok");
}

TEST(ChunkCheckTest, EachCheckNamesTheChunkAndWhatFails) {
  const Announcement a = Version7();
  const ChunkHeader h = Header(0, 0, 2048);
  const auto object = Object(h);
  const Manifest m = ManifestOf(a, {Entry(object, h)});

  // 1. Another object than the manifest lists, or none listed.
  EXPECT_EQ(Check(Object(Header(0, 0, 1024)), a, 0, &m),
            "chunk 0 of version 7 does not match its manifest hash");
  EXPECT_EQ(Check(object, a, 1, &m), "chunk 1 of version 7 does not match its manifest hash");
  // 2. Strided regions.
  ChunkHeader strided = Header(0, 0, 8);
  strided.run = 2;
  strided.stride = 16;
  EXPECT_EQ(Check(Object(strided), a, 0, nullptr),
            "chunk 0 of version 7 is a strided region its manifest does not list");
  {
    // Listed as a strided region, it passes; as a range, or with another
    // stride, it does not.
    const auto so = Object(strided);
    ManifestChunk e = Entry(so, strided);
    const Manifest as_range = ManifestOf(a, {e});
    EXPECT_EQ(Check(so, a, 0, &as_range),
              "chunk 0 of version 7 is a strided region its manifest does not list");
    e.run = 2;
    e.stride = 16;
    const Manifest listed = ManifestOf(a, {e});
    EXPECT_EQ(Check(so, a, 0, &listed), "ok");
    e.stride = 32;
    const Manifest other = ManifestOf(a, {e});
    EXPECT_EQ(Check(so, a, 0, &other), "chunk 0 of version 7 does not match its manifest entry");
  }
  // 3. Ranges outside the announced tensors, or of another width.
  EXPECT_EQ(Check(Object(Header(1, 900, 101)), a, 0, nullptr),
            "chunk 0 of version 7 names a range outside the announced tensors");
  EXPECT_EQ(Check(Object(Header(2, 0, 1)), a, 0, nullptr),
            "chunk 0 of version 7 names a range outside the announced tensors");
  ChunkHeader wide = Header(0, 0, 1024);
  wide.width = 4;
  EXPECT_EQ(Check(Object(wide), a, 0, nullptr),
            "chunk 0 of version 7 names a range outside the announced tensors");
  // 4. Another version or base.
  ChunkHeader replayed = Header(0, 0, 2048);
  replayed.version = 6;
  replayed.base_version = 5;
  EXPECT_EQ(Check(Object(replayed), a, 0, nullptr),
            "chunk 0 of version 7 belongs to another version");
  ChunkHeader rebased = Header(0, 0, 2048);
  rebased.base_version = 5;
  EXPECT_EQ(Check(Object(rebased), a, 0, nullptr),
            "chunk 0 of version 7 belongs to another version");
  // 5. A listed object that is not its entry's tensor, range or kind.
  Manifest moved = m;
  moved.chunks[0].start = 1;
  EXPECT_EQ(Check(object, a, 0, &moved), "chunk 0 of version 7 does not match its manifest entry");
  Manifest rekinded = m;
  rekinded.chunks[0].kind = static_cast<uint8_t>(codec::ChunkKind::kRaw);
  EXPECT_EQ(Check(object, a, 0, &rekinded),
            "chunk 0 of version 7 does not match its manifest entry");
  // The envelope is opened before anything is parsed.
  auto forged = object;
  forged[forged.size() / 2] ^= 1;
  auto c = CheckChunk(forged, ChunkSpec{&a, 0, nullptr, false}, Key());
  EXPECT_THAT(c, StatusIs(StatusCode::kUnauthenticated));
  EXPECT_TRUE(FailsItsChecks(c.status()));
  EXPECT_THAT(CheckChunk(forged, ChunkSpec{&a, 0, &m, false}, Key()),
              StatusIs(StatusCode::kDataLoss));
}

TEST(ChunkCheckTest, AResendIsAnOverwriteOfTheChunksRange) {
  const Announcement a = Version7();
  const ChunkHeader h = Header(1, 0, 1000);
  const Manifest m = ManifestOf(a, {Entry(Object(h), h)});
  // Its bytes and kind are not the manifest's; its range is.
  for (codec::ChunkKind kind : {codec::ChunkKind::kRaw, codec::ChunkKind::kSparseOverwrite}) {
    EXPECT_EQ(Check(Object(Header(1, 0, 1000, kind)), a, 0, &m, /*resend=*/true), "ok");
    EXPECT_EQ(Check(Object(Header(1, 0, 1000, kind)), a, 0, nullptr, /*resend=*/true), "ok");
  }
  EXPECT_EQ(Check(Object(Header(1, 0, 1000)), a, 0, &m, /*resend=*/true),
            "the re-send of chunk 0 of version 7 is not an overwrite");
  EXPECT_EQ(Check(Object(Header(1, 0, 999, codec::ChunkKind::kRaw)), a, 0, &m, /*resend=*/true),
            "the re-send of chunk 0 of version 7 does not match its manifest entry");
  EXPECT_EQ(Check(Object(Header(1, 0, 1000, codec::ChunkKind::kRaw)), a, 1, &m, /*resend=*/true),
            "ok");  // no entry 1 to hold it to: the announcement decides
}

TEST(ChunkCheckTest, FailuresOfTheChecksAreNotFailuresToRead) {
  EXPECT_TRUE(FailsItsChecks(DataLossError("x")));
  EXPECT_TRUE(FailsItsChecks(UnauthenticatedError("x")));
  EXPECT_FALSE(FailsItsChecks(Status()));
  EXPECT_FALSE(FailsItsChecks(NotFoundError("x")));
  EXPECT_FALSE(FailsItsChecks(UnavailableError("x")));
}

TEST(ChunkCheckTest, ManifestMatchesItsAnnouncement) {
  const Announcement a = Version7();
  const Manifest m = ManifestOf(a, {});
  EXPECT_TRUE(ManifestMatches(a, m));
  Manifest other = m;
  other.members = {"r1"};
  EXPECT_FALSE(ManifestMatches(a, other));
  other = m;
  other.base_version = 5;
  EXPECT_FALSE(ManifestMatches(a, other));
  other = m;
  other.tensors[1].before.hi = 9;
  EXPECT_FALSE(ManifestMatches(a, other));
  other = m;
  other.tensors[1].shape = {10, 100};
  EXPECT_FALSE(ManifestMatches(a, other));
  other = m;
  other.tensors.pop_back();
  EXPECT_FALSE(ManifestMatches(a, other));
  other = m;
  other.tensors[0].after.lo = 3;  // "after" is the manifest's own
  EXPECT_TRUE(ManifestMatches(a, other));

  EXPECT_TRUE(SameTensor(a.tensors[0], a.tensors[0]));
  EXPECT_FALSE(SameTensor(a.tensors[0], a.tensors[1]));
  EXPECT_TRUE(RangeInside(a.tensors, 1, 0, 1000));
  EXPECT_TRUE(RangeInside(a.tensors, 1, 999, 1));
  EXPECT_FALSE(RangeInside(a.tensors, 1, 999, 2));
  EXPECT_FALSE(RangeInside(a.tensors, 1, 0, 0));
  EXPECT_FALSE(RangeInside(a.tensors, 2, 0, 1));
  EXPECT_FALSE(RangeInside(a.tensors, 0, UINT64_MAX, 2));
}

}  // namespace
}  // namespace refit::internal
