// Fuzz target: one chunk from arbitrary bytes, contiguous or strided
// region (docs/format.md §3). Parses it and applies it to a zero-filled
// tensor just large enough for its region. Beyond "no crash, no UB": an
// apply that fails must leave the tensor exactly as it was, and one that
// succeeds must leave the region at the chunk's "after" hash and every
// element outside the region untouched.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "delta/apply.h"
#include "delta/chunk.h"

namespace {

constexpr uint64_t kMaxBytes = 4 << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto chunk = refit::ParseChunk({data, size});
  if (!chunk.ok()) return 0;
  refit::ParsedChunk c = *chunk;
  // Move the region to the tensor's start so the tensor stays small.
  const uint64_t span = c.header.End() - c.header.start;
  if (span > kMaxBytes / c.header.width) return 0;
  c.header.start = 0;
  std::vector<uint8_t> tensor(span * c.header.width + 16, 0);
  const std::vector<uint8_t> before = tensor;
  refit::ApplyScratch scratch;
  refit::UndoRecord undo;
  refit::Status st = refit::ApplyChunkInPlace(c, tensor.data(), &scratch, nullptr, &undo);
  if (!st.ok()) {
    if (tensor != before) std::abort();
    return 0;
  }
  if (refit::RegionHash(c.header, tensor.data()) != c.header.after) std::abort();
  // Elements outside the region are never written.
  std::vector<bool> inside(span, false);
  for (uint64_t i = 0; i < c.header.count; ++i) inside[c.header.Element(i)] = true;
  for (uint64_t e = 0; e < span; ++e) {
    if (inside[e]) continue;
    for (uint64_t b = 0; b < c.header.width; ++b) {
      if (tensor[e * c.header.width + b] != 0) std::abort();
    }
  }
  if (!refit::UndoChunkInPlace(c, tensor.data(), &scratch, undo).ok()) std::abort();
  if (tensor != before) std::abort();
  return 0;
}
