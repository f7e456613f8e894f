// Chunk packs (docs/protocol.md, "Chunk packs"): consecutive small chunks
// of one version stored as one object, so that a checkpoint of 10^5 small
// tensors is a few hundred stored objects rather than 10^5 (each one a
// PUT, or a file write with two fsyncs in a directory store).
//
// A pack holds the same sealed chunk objects that would otherwise be
// stored one per key; each stays independently decodable, is checked as
// before (envelope, checksum, announcement, manifest entry with its size
// and SHA-256) and is applied at most once. The pack of chunks i..i+m-1
// is stored at chunk i's key (v/<V>/chunk/<i>); keys i+1..i+m-1 hold
// nothing, and the manifest marks those chunks with their offset in the
// pack (ManifestChunk::pack_offset).
//
// Encoding (little-endian, varints as docs/format.md §1):
//   "RFPK" | varint m (1..kMaxPackChunks) | varint size[m] |
//   m objects concatenated | u64 XXH3-64 of every byte before it
// The framing is not sealed: every element is a sealed object of its own,
// bound to the manifest by its SHA-256; the checksum catches damage in
// transit. An element never starts with "RFPK" (it is an envelope, "RFAE").
//
// Pure functions except FindChunkObject (which reads a store);
// thread-safe.
#ifndef REFIT_SYNC_CHUNK_PACK_H_
#define REFIT_SYNC_CHUNK_PACK_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "refit/status.h"
#include "sync/protocol.h"
#include "transport/object_store.h"

namespace refit {

// `objects` (1..kMaxPackChunks sealed chunk objects) as one pack.
std::vector<uint8_t> EncodePack(const std::vector<std::vector<uint8_t>>& objects);

// Whether a stored chunk object is a pack (its first four bytes).
bool IsPack(std::span<const uint8_t> object);

// The pack's elements, as spans into `pack`. DATA_LOSS for a malformed
// pack: bad magic, no element or more than kMaxPackChunks, sizes that do
// not add up to the bytes present, a checksum mismatch.
Result<std::vector<std::span<const uint8_t>>> DecodePack(std::span<const uint8_t> pack);

// The stored (sealed) object of chunk `index` of `version`, taken out of
// its pack when it is in one. With the version's manifest, its entry names
// the key (ManifestChunkKey) and the offset in the pack; without one, the
// keys index, index - 1, ... are probed (at most kMaxPackChunks) for the
// object that holds the chunk. NOT_FOUND when nothing stored holds it;
// DATA_LOSS for a malformed pack, or one that the manifest says holds the
// chunk and does not; the store's errors as they are.
Result<std::vector<uint8_t>> FindChunkObject(ObjectStore* store, uint64_t version,
                                             uint64_t index, const Manifest* manifest);

// Reads the chunk objects of one version for a receiver walking its
// chunks in index order: the first chunk of a pack read fetches the pack,
// the others are taken from it. A direct version's manifest lists the
// chunks of several ranks' parts interleaved (tensor order), each rank's
// in its part's order, so the reader holds the packs it has not read out
// yet, up to kMaxHeldPacks (the oldest is dropped first and fetched again
// if needed); a pack is dropped once each of its chunks was taken. Not
// thread-safe; one per walk.
class ChunkObjectReader {
 public:
  static constexpr size_t kMaxHeldPacks = 64;

  ChunkObjectReader(ObjectStore* store, uint64_t version) : store_(store), version_(version) {}

  // The stored (sealed) object of chunk `index`. With `manifest` (when it
  // lists the chunk), its entry names the key (ManifestChunkKey) and the
  // offset in a pack; without, the chunk is at its own key or in a pack
  // held that starts below it. NOT_FOUND when the key holds nothing (the
  // publisher has not stored it yet); DATA_LOSS for a malformed pack or one
  // that the manifest says holds the chunk and does not; the store's
  // errors as they are. `key` (when given) receives the key read or last
  // read.
  Result<std::vector<uint8_t>> Get(uint64_t index, const Manifest* manifest,
                                   std::string* key = nullptr);

 private:
  struct HeldPack {
    std::string key;
    // The version's chunk index of element 0 when the pack is at a
    // v/<V>/chunk/<i> key (packs of a single publisher); unused for a
    // rank's part, whose elements are located by the manifest.
    uint64_t first = 0;
    std::vector<uint8_t> bytes;
    std::vector<std::span<const uint8_t>> elements;
    std::vector<bool> taken;
    size_t left = 0;  // elements not taken yet
  };
  // The held pack at `key`, or nullptr.
  HeldPack* Held(const std::string& key);
  // Element j of `pack` (j in range), dropping the pack once all are taken.
  std::vector<uint8_t> Take(HeldPack* pack, uint64_t j);

  ObjectStore* store_;
  uint64_t version_;
  std::vector<HeldPack> held_;  // oldest first
};

}  // namespace refit

#endif  // REFIT_SYNC_CHUNK_PACK_H_
