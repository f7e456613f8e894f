#include "sync/chunk_pack.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "base/bytes.h"

namespace refit {
namespace {

constexpr uint8_t kPackMagic[4] = {'R', 'F', 'P', 'K'};

}  // namespace

std::vector<uint8_t> EncodePack(const std::vector<std::vector<uint8_t>>& objects) {
  std::vector<uint8_t> out;
  size_t total = 0;
  for (const auto& o : objects) total += o.size();
  out.reserve(total + 16 + 3 * objects.size());
  ByteWriter w(&out);
  w.Bytes(kPackMagic, sizeof kPackMagic);
  w.Varint(objects.size());
  for (const auto& o : objects) w.Varint(o.size());
  for (const auto& o : objects) w.Bytes(o.data(), o.size());
  w.U64(XXH3_64bits(out.data(), out.size()));
  return out;
}

bool IsPack(std::span<const uint8_t> object) {
  return object.size() >= sizeof kPackMagic &&
         std::memcmp(object.data(), kPackMagic, sizeof kPackMagic) == 0;
}

Result<std::vector<std::span<const uint8_t>>> DecodePack(std::span<const uint8_t> pack) {
  if (!IsPack(pack) || pack.size() < sizeof kPackMagic + 8) {
    return DataLossError("chunk pack: bad magic or truncated");
  }
  const auto body = pack.first(pack.size() - 8);
  if (XXH3_64bits(body.data(), body.size()) != LoadLE(pack.data() + body.size(), 8)) {
    return DataLossError("chunk pack: checksum mismatch (damaged in transit?)");
  }
  ByteReader r(body.subspan(sizeof kPackMagic));
  const uint64_t m = r.Varint();
  if (r.ok() && (m == 0 || m > kMaxPackChunks || m > r.remaining())) {
    return DataLossError("chunk pack: " + std::to_string(m) + " elements, outside 1.." +
                         std::to_string(kMaxPackChunks));
  }
  std::vector<uint64_t> sizes(r.ok() ? m : 0);
  uint64_t total = 0;
  for (uint64_t& s : sizes) {
    s = r.Varint();
    if (!r.ok() || s == 0 || !AddWithin(total, s, r.remaining())) {
      REFIT_RETURN_IF_ERROR(r.status("chunk pack"));
      return DataLossError("chunk pack: element sizes exceed the pack");
    }
    total += s;
  }
  REFIT_RETURN_IF_ERROR(r.status("chunk pack"));
  if (total != r.remaining()) {
    return DataLossError("chunk pack: element sizes do not add up to its bytes");
  }
  std::vector<std::span<const uint8_t>> out;
  out.reserve(sizes.size());
  for (uint64_t s : sizes) out.push_back(r.Bytes(s));
  return out;
}

Result<std::vector<uint8_t>> FindChunkObject(ObjectStore* store, uint64_t version,
                                             uint64_t index, const Manifest* manifest) {
  const std::string name = "chunk " + std::to_string(index) + " of version " +
                           std::to_string(version);
  if (manifest && index < manifest->chunks.size()) {
    const uint64_t offset = manifest->chunks[index].pack_offset;
    REFIT_ASSIGN_OR_RETURN(auto object, store->Get(ManifestChunkKey(*manifest, index)));
    if (!IsPack(object)) {
      if (offset == 0) return object;
      return DataLossError(name + ": its manifest places it in a pack, and the object "
                           "at the pack's key is not one");
    }
    REFIT_ASSIGN_OR_RETURN(auto elements, DecodePack(object));
    if (offset >= elements.size()) {
      return DataLossError(name + ": its pack holds " + std::to_string(elements.size()) +
                           " chunks, and the manifest places it at " + std::to_string(offset));
    }
    return std::vector<uint8_t>(elements[offset].begin(), elements[offset].end());
  }
  for (uint64_t back = 0; back < kMaxPackChunks && back <= index; ++back) {
    auto got = store->Get(ChunkKey(version, index - back));
    if (!got.ok()) {
      if (got.status().code() == StatusCode::kNotFound) continue;
      return got.status();
    }
    if (!IsPack(*got)) {
      if (back == 0) return std::move(*got);
      break;  // a chunk of its own before `index`: no pack reaches it
    }
    REFIT_ASSIGN_OR_RETURN(auto elements, DecodePack(*got));
    if (back >= elements.size()) break;
    return std::vector<uint8_t>(elements[back].begin(), elements[back].end());
  }
  return NotFoundError(name + " is not stored");
}

ChunkObjectReader::HeldPack* ChunkObjectReader::Held(const std::string& key) {
  for (HeldPack& p : held_) {
    if (p.key == key) return &p;
  }
  return nullptr;
}

std::vector<uint8_t> ChunkObjectReader::Take(HeldPack* pack, uint64_t j) {
  std::vector<uint8_t> out(pack->elements[j].begin(), pack->elements[j].end());
  if (!pack->taken[j]) {
    pack->taken[j] = true;
    if (--pack->left == 0) held_.erase(held_.begin() + (pack - held_.data()));
  }
  return out;
}

Result<std::vector<uint8_t>> ChunkObjectReader::Get(uint64_t index, const Manifest* manifest,
                                                     std::string* key) {
  const bool listed = manifest && index < manifest->chunks.size();
  const uint64_t offset = listed ? manifest->chunks[index].pack_offset : 0;
  const std::string name =
      "chunk " + std::to_string(index) + " of version " + std::to_string(version_);
  const std::string k = listed ? ManifestChunkKey(*manifest, index) : ChunkKey(version_, index);
  HeldPack* pack = nullptr;
  uint64_t j = offset;
  if (listed) {
    if (key) *key = k;
    pack = Held(k);
  } else {
    // Before the manifest: chunk i is in a held pack of chunks first.. or
    // at its own key.
    for (HeldPack& p : held_) {
      if (index >= p.first && index - p.first < p.elements.size() &&
          p.key == ChunkKey(version_, p.first)) {
        pack = &p;
        j = index - p.first;
        if (key) *key = p.key;
        break;
      }
    }
    if (!pack && key) *key = k;
  }
  if (!pack) {
    REFIT_ASSIGN_OR_RETURN(auto object, store_->Get(k));
    if (!IsPack(object)) {
      if (offset == 0) return object;
      return DataLossError(name +
                           ": its manifest places it in a pack, and the object at "
                           "the pack's key is not one");
    }
    HeldPack p;
    p.key = k;
    p.bytes = std::move(object);
    REFIT_ASSIGN_OR_RETURN(p.elements, DecodePack(p.bytes));
    p.first = listed ? index - std::min(index, offset) : index;
    p.taken.assign(p.elements.size(), false);
    p.left = p.elements.size();
    if (held_.size() >= kMaxHeldPacks) held_.erase(held_.begin());
    held_.push_back(std::move(p));
    pack = &held_.back();
  }
  if (j >= pack->elements.size()) {
    return DataLossError(name + ": the pack at '" + pack->key + "' holds " +
                         std::to_string(pack->elements.size()) + " chunks, and the manifest " +
                         "places it at " + std::to_string(offset));
  }
  return Take(pack, j);
}

}  // namespace refit
