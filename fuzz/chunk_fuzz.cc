// Fuzz target: one chunk from arbitrary bytes, contiguous or strided
// region (docs/format.md §3). Parses it and applies it to a zero-filled
// tensor just large enough for its region. Beyond "no crash, no UB": an
// apply that fails must leave the tensor exactly as it was, and one that
// succeeds must leave the region at the chunk's "after" hash and every
// element outside the region untouched. A conditional XOR payload (kind 5)
// is also decoded against a base whose elements fill every class, so its
// records decode beyond the class counts; a decode that succeeds must give
// ascending positions inside the range and non-zero XOR values.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "codec/conditional.h"
#include "delta/apply.h"
#include "delta/chunk.h"

namespace {

constexpr uint64_t kMaxBytes = 4 << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto chunk = refit::ParseChunk({data, size});
  if (!chunk.ok()) return 0;
  refit::ParsedChunk c = *chunk;
  if (c.header.IsConditional() && c.header.count <= kMaxBytes / 2) {
    const uint32_t n = static_cast<uint32_t>(c.header.count);
    const uint32_t k = static_cast<uint32_t>(c.header.changed);
    std::vector<uint8_t> base(2 * size_t{n});
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t v = (112 + i % 16) << 7 | (i * 37) % 128;
      base[2 * size_t{i}] = static_cast<uint8_t>(v);
      base[2 * size_t{i} + 1] = static_cast<uint8_t>(v >> 8);
    }
    std::vector<uint32_t> pos(k);
    std::vector<uint8_t> values(2 * size_t{k});
    if (refit::codec::DecodeConditional(c.payload, n, base.data(), k, pos.data(),
                                        values.data())
            .ok()) {
      for (uint32_t r = 0; r < k; ++r) {
        if (pos[r] >= n || (r > 0 && pos[r] <= pos[r - 1])) std::abort();
        if (values[2 * size_t{r}] == 0 && values[2 * size_t{r} + 1] == 0) std::abort();
      }
    }
  }
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
