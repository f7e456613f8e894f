// Fuzz target: a whole delta file from arbitrary bytes. Parses it, decodes
// every chunk, parses every carried safetensors header as an apply would,
// and applies it to zero-filled tensors shaped like its trailer (when small
// enough). Beyond "no crash, no UB": an apply that
// fails must leave the tensors exactly as they were.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "delta/apply.h"
#include "delta/delta_file.h"
#include "format/safetensors.h"

namespace {

constexpr uint64_t kMaxBytes = 8 << 20;  // tensors and decode buffers

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto reader = refit::DeltaReader::FromBytes({data, size});
  if (!reader.ok()) return 0;

  for (const auto& h : reader->headers()) {
    std::vector<uint8_t> prefix(8);
    for (int i = 0; i < 8; ++i) {
      prefix[static_cast<size_t>(i)] = static_cast<uint8_t>(h.json.size() >> (8 * i));
    }
    prefix.insert(prefix.end(), h.json.begin(), h.json.end());
    (void)refit::ParseSafetensorsHeader(prefix, prefix.size());
  }

  uint64_t total = 0;
  for (const auto& t : reader->tensors()) {
    uint64_t bytes = t.num_elements * t.width;
    if (bytes > kMaxBytes || total + bytes > kMaxBytes) return 0;
    total += bytes;
  }
  refit::ApplyScratch scratch;
  for (size_t i = 0; i < reader->index().size(); ++i) {
    auto chunk = reader->ReadChunk(i);
    if (!chunk.ok()) continue;
    const auto& h = chunk->header;
    if (h.count * h.width > kMaxBytes) continue;
    std::vector<uint8_t> range(h.count * h.width, 0);
    // ApplyChunkInPlace's contract needs "before" bytes; on anything else
    // it must still decode safely and roll back.
    std::vector<uint8_t> copy = range;
    refit::ParsedChunk local = *chunk;
    local.header.start = 0;  // the range stands alone here
    refit::Status s =
        refit::ApplyChunkInPlace(local, range.data(), &scratch, nullptr, nullptr);
    if (!s.ok() && range != copy) std::abort();
  }

  std::vector<std::vector<uint8_t>> storage;
  std::vector<refit::MutableTensorView> views;
  storage.reserve(reader->tensors().size());
  for (const auto& t : reader->tensors()) {
    storage.emplace_back(t.num_elements * t.width, 0);
    views.push_back({t.name, t.dtype, t.width, t.shape, storage.back().data()});
  }
  auto before = storage;
  refit::ApplyOptions opts;
  opts.threads = 1;
  auto r = refit::ApplyDelta(*reader, views, opts, nullptr);
  if (!r.ok() && storage != before) std::abort();
  return 0;
}
