// Fuzz target: a trainer rank's part list (docs/trainer.md, "Part list";
// format 2, "RFPART02", and format 3, "RFPART03", with chunk packs) from
// arbitrary bytes. The input is decoded as it is and, so that mutations
// reach past the checksum, once more with its last 8 bytes replaced by the
// checksum of the rest. Beyond "no crash, no UB": a list that decodes
// re-encodes to bytes that decode to the same list, in format 3 exactly
// when a chunk is packed, and encoding that list again gives the same
// bytes.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "ranks/parts.h"

namespace {

bool SameEntry(const refit::ranks::PartEntry& a, const refit::ranks::PartEntry& b) {
  return a.size == b.size && a.sha256 == b.sha256 && a.tensor_id == b.tensor_id &&
         a.start == b.start && a.count == b.count && a.run == b.run && a.stride == b.stride &&
         a.changed == b.changed && a.kind == b.kind && a.pack_offset == b.pack_offset;
}

bool SameList(const refit::ranks::PartList& a, const refit::ranks::PartList& b) {
  if (a.version != b.version || a.base_version != b.base_version || a.rank != b.rank ||
      a.tensor_count != b.tensor_count || a.names_hash != b.names_hash ||
      a.chunks.size() != b.chunks.size()) {
    return false;
  }
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    if (!SameEntry(a.chunks[i], b.chunks[i])) return false;
  }
  return true;
}

void Check(std::span<const uint8_t> body) {
  auto list = refit::ranks::DecodePartList(body);
  if (!list.ok()) return;
  const std::vector<uint8_t> bytes = refit::ranks::EncodePartList(*list);
  auto back = refit::ranks::DecodePartList(bytes);
  if (!back.ok() || !SameList(*list, *back)) std::abort();
  bool packed = false;
  for (const refit::ranks::PartEntry& e : list->chunks) packed = packed || e.pack_offset != 0;
  if (std::memcmp(bytes.data(), packed ? "RFPART03" : "RFPART02", 8) != 0) std::abort();
  if (refit::ranks::EncodePartList(*back) != bytes) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Check({data, size});
  if (size >= 16) {
    std::vector<uint8_t> fixed(data, data + size);
    const uint64_t sum = XXH3_64bits(fixed.data(), size - 8);
    for (int i = 0; i < 8; ++i) fixed[size - 8 + i] = static_cast<uint8_t>(sum >> (8 * i));
    Check(fixed);
  }
  return 0;
}
