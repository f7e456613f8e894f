// Chunk and manifest checks (sync/chunk_check.h): one set of checks for a
// chunk of a version, before and after its manifest, for an overwrite
// re-send of it, and for the versions of a fold.
#include "sync/chunk_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "delta/chunk.h"
#include "sync/chunk_pack.h"
#include "sync/early_parts.h"
#include "sync/keys.h"
#include "transport/memory_store.h"
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

// EarlyParts (sync/early_parts.h): a direct version's part chunks read
// before its manifest is stored are handed over only as the manifest's
// entries, each once; anything else stays behind for the caller to read.
ManifestChunk PartEntry(const std::vector<uint8_t>& object, const ChunkHeader& h,
                        uint32_t rank, uint64_t k, uint64_t pack_offset = 0) {
  ManifestChunk e = Entry(object, h);
  e.in_part = true;
  e.rank = rank;
  e.part_index = k;
  e.pack_offset = pack_offset;
  e.run = h.run;
  e.stride = h.stride;
  return e;
}

TEST(EarlyPartsTest, ChunksReadBeforeTheManifestAreHandedOverAsItsEntriesOnly) {
  const Announcement a = Version7();
  MemoryStore store;
  // Rank 0: two chunks and one whose object is replaced after being read.
  // Rank 1: a pack of two chunks, the second a strided region. Rank 2: an
  // object no manifest lists. A part list is not a chunk.
  const ChunkHeader h00 = Header(0, 0, 1024), h01 = Header(0, 1024, 1024),
                    h02 = Header(0, 3072, 1024), h10 = Header(1, 0, 500);
  ChunkHeader h11 = Header(0, 2048, 64);  // 4 rows of 16, 64 apart
  h11.run = 16;
  h11.stride = 64;
  const auto o00 = Object(h00), o01 = Object(h01), o02 = Object(h02), o10 = Object(h10),
             o11 = Object(h11), stray = Object(Header(1, 500, 500));
  ASSERT_OK(store.Put(PartChunkKey(7, 0, 0), o00));
  ASSERT_OK(store.Put(PartChunkKey(7, 0, 1), o01));
  ASSERT_OK(store.Put(PartChunkKey(7, 0, 2), o02));
  ASSERT_OK(store.Put(PartChunkKey(7, 1, 0), EncodePack({o10, o11})));
  ASSERT_OK(store.Put(PartChunkKey(7, 2, 0), stray));
  ASSERT_OK(store.Put(PartListKey(7, 0), std::vector<uint8_t>{1}));
  ASSERT_OK(store.Put(PartChunkKey(8, 0, 0), o00));  // another version's

  EarlyParts early(&store, a, Key(), 2, uint64_t{1} << 20);
  auto found = early.Scan();
  ASSERT_OK(found);
  EXPECT_EQ(*found, 5u);
  EXPECT_EQ(early.queued(), 5u);
  // Each object is queued once. (A scan within four times the last
  // listing's duration lists nothing: the sleep keeps this one out of it.)
  ASSERT_OK(store.Put(PartChunkKey(7, 3, 0), stray));
  ASSERT_OK(store.Put(PartChunkKey(7, 2, 0), stray));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  found = early.Scan();
  ASSERT_OK(found);
  EXPECT_EQ(*found, 1u);
  EXPECT_EQ(early.queued(), 6u);

  // The manifest: rank 0's third chunk was stored again with other bytes
  // (the object read early is not the one listed), and rank 2's object
  // is not listed.
  const auto o02_listed = Object(Header(0, 3072, 1024, codec::ChunkKind::kSparseOverwrite));
  const ChunkHeader h02_listed = Header(0, 3072, 1024, codec::ChunkKind::kSparseOverwrite);
  Manifest m = ManifestOf(a, {PartEntry(o00, h00, 0, 0), PartEntry(o01, h01, 0, 1),
                              PartEntry(o11, h11, 1, 1, 1), PartEntry(o02_listed, h02_listed, 0, 2),
                              PartEntry(o10, h10, 1, 0)});
  m.direct = true;
  const std::vector<bool> held = early.Held(m);
  EXPECT_EQ(held, std::vector<bool>(5, true));

  const std::vector<std::pair<uint64_t, const std::vector<uint8_t>*>> expected = {
      {0, &o00}, {1, &o01}, {2, &o11}, {4, &o10}};
  for (const auto& [i, object] : expected) {
    auto got = early.Take(m, i);
    ASSERT_TRUE(got.has_value()) << i;
    EXPECT_EQ(got->object, *object) << i;
    // As CheckChunk finds it, with the manifest.
    std::span<const uint8_t> bytes;
    auto c = CheckChunk(*object, ChunkSpec{&a, i, &m, false}, Key(), &bytes);
    ASSERT_OK(c);
    EXPECT_EQ(got->chunk.header.start, c->header.start);
    EXPECT_EQ(got->chunk.header.run, c->header.run);
    EXPECT_TRUE(std::equal(got->bytes.begin(), got->bytes.end(), bytes.begin(), bytes.end()));
    EXPECT_FALSE(early.Take(m, i).has_value()) << "handed over twice: " << i;
  }
  EXPECT_FALSE(early.Take(m, 3).has_value());  // not the object listed
  EXPECT_FALSE(early.Take(m, 5).has_value());  // no such entry

  // An entry that does not match the header read early: its strided region
  // listed as a range, or a chunk of another rank.
  EarlyParts again(&store, a, Key(), 1, uint64_t{1} << 20);
  ASSERT_OK(again.Scan());
  Manifest as_range = m;
  as_range.chunks[2].run = 0;
  as_range.chunks[2].stride = 0;
  EXPECT_FALSE(again.Take(as_range, 2).has_value());
  Manifest other_rank = m;
  other_rank.chunks[0].rank = 2;
  EXPECT_FALSE(again.Take(other_rank, 0).has_value());
  EXPECT_TRUE(again.Take(m, 1).has_value());
}

TEST(EarlyPartsTest, ReadsNoMoreThanItsByteBoundAndNothingOfOtherKeys) {
  const Announcement a = Version7();
  MemoryStore store;
  const auto o0 = Object(Header(0, 0, 1024)), o1 = Object(Header(0, 1024, 1024));
  ASSERT_OK(store.Put(ChunkKey(7, 0), o0));  // a version of one publisher
  EarlyParts none(&store, a, Key(), 2, uint64_t{1} << 20);
  ASSERT_OK(none.Scan());
  EXPECT_EQ(none.queued(), 0u);
  ASSERT_OK(store.Put(PartChunkKey(7, 0, 0), o0));
  ASSERT_OK(store.Put(PartChunkKey(7, 0, 1), o1));
  EarlyParts bounded(&store, a, Key(), 2, o0.size() + o1.size() - 1);
  ASSERT_OK(bounded.Scan());
  EXPECT_EQ(bounded.queued(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_OK(bounded.Scan());
  EXPECT_EQ(bounded.queued(), 1u);
  // A damaged object is read and dropped: the caller reads it again.
  std::vector<uint8_t> damaged = o1;
  damaged.back() ^= 1;
  ASSERT_OK(store.Put(PartChunkKey(7, 0, 1), damaged));
  EarlyParts wide(&store, a, Key(), 2, uint64_t{1} << 20);
  ASSERT_OK(wide.Scan());
  EXPECT_EQ(wide.queued(), 2u);
  Manifest m = ManifestOf(a, {PartEntry(o0, Header(0, 0, 1024), 0, 0),
                              PartEntry(damaged, Header(0, 1024, 1024), 0, 1)});
  m.direct = true;
  EXPECT_TRUE(wide.Take(m, 0).has_value());
  EXPECT_FALSE(wide.Take(m, 1).has_value());
}

}  // namespace
}  // namespace refit::internal
