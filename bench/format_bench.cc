// Micro-benchmarks for opening a checkpoint's metadata: ParseSafetensorsHeader
// (src/format/safetensors.h) on the header of a file with N tensors.
//
// Inputs: a header as the reference writer lays it out, N BF16 tensors of
// shape [4, 8] named like the experts of an MoE checkpoint
// ("model.layers.L.mlp.experts.E.wK.weight"), in name order, tiling a data
// buffer of N * 64 bytes (the data itself is not read, so it is not
// allocated: the parser is given the file size). Real MoE checkpoints hold
// ~7 * 10^4 tensors, ~10^5 with scales. Reports tensors/s; the time per
// iteration should grow linearly with N.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "format/safetensors.h"

namespace refit {
namespace {

constexpr uint64_t kTensorBytes = 64;  // BF16 [4, 8]

// The first 8 + N bytes of the file, cached per N.
const std::vector<uint8_t>& HeaderPrefix(int64_t tensors) {
  static auto* cache = new std::map<int64_t, std::vector<uint8_t>>();
  std::vector<uint8_t>& out = (*cache)[tensors];
  if (!out.empty()) return out;
  std::vector<std::string> names;
  names.reserve(static_cast<size_t>(tensors));
  for (int64_t i = 0; i < tensors; ++i) {
    names.push_back("model.layers." + std::to_string(i / 2000) +
                    ".mlp.experts." + std::to_string(i / 2 % 1000) + ".w" +
                    std::to_string(1 + i % 2) + ".weight");
  }
  std::sort(names.begin(), names.end());
  std::string json = "{";
  uint64_t offset = 0;
  for (const std::string& name : names) {
    if (offset > 0) json += ',';
    json += "\"" + name + "\":{\"dtype\":\"BF16\",\"shape\":[4,8],"
            "\"data_offsets\":[" + std::to_string(offset) + "," +
            std::to_string(offset + kTensorBytes) + "]}";
    offset += kTensorBytes;
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  ByteWriter w(&out);
  w.U64(json.size());
  w.Bytes(json.data(), json.size());
  return out;
}

void BM_ParseSafetensorsHeader(benchmark::State& state) {
  const int64_t tensors = state.range(0);
  const std::vector<uint8_t>& prefix = HeaderPrefix(tensors);
  const uint64_t file_size =
      prefix.size() + static_cast<uint64_t>(tensors) * kTensorBytes;
  for (auto _ : state) {
    Result<SafetensorsHeader> h = ParseSafetensorsHeader(prefix, file_size);
    if (!h.ok() || h->tensors.size() != static_cast<size_t>(tensors)) {
      state.SkipWithError("header did not parse");
      break;
    }
    benchmark::DoNotOptimize(h->tensors.data());
  }
  state.SetItemsProcessed(state.iterations() * tensors);
  state.counters["header_bytes"] = static_cast<double>(prefix.size() - 8);
}
BENCHMARK(BM_ParseSafetensorsHeader)
    ->Arg(10'000)
    ->Arg(100'000)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace refit
