// A receiver's apply of strided regions against contiguous ranges of the
// same bytes (docs/benchmarks.md, "Versions from many ranks"): one BF16
// matrix of 4096 x 8192 (64 MiB) with 3% of its elements moved by 1-2
// ulps, cut into chunks of 128 Ki elements either as row blocks (16 whole
// rows: what a single publisher's encoder emits) or as column blocks of a
// 4-way tensor-parallel split (64 rows of 2048 elements at stride 8192:
// what a rank emits for its shard). One thread. Each iteration applies
// every chunk from the base to the target and then every chunk back, as
// a receiver does: the region's hash against the chunk's "before", then
// ApplyChunkInPlace (decode, stores, the hash against "after"). Bytes/s
// count the matrix twice per iteration.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "delta/apply.h"
#include "delta/chunk.h"
#include "delta/encoder.h"

namespace refit {
namespace {

constexpr uint64_t kRows = 4096, kCols = 8192, kTp = 4;
constexpr uint64_t kChunk = 128 * 1024;  // elements

struct Chunks {
  std::vector<uint16_t> base;
  std::vector<std::vector<uint8_t>> forward, back;  // serialized chunks
};

// The region's elements in order (rows of `run` at `stride`; run == 0:
// contiguous).
std::vector<uint16_t> Gather(const std::vector<uint16_t>& m, uint64_t start, uint64_t count,
                             uint64_t run, uint64_t stride) {
  std::vector<uint16_t> out(count);
  const uint64_t r = run == 0 ? count : run, s = run == 0 ? count : stride;
  for (uint64_t i = 0; i < count; ++i) out[i] = m[start + (i / r) * s + i % r];
  return out;
}

const Chunks& MakeChunks(bool strided) {
  static Chunks cache[2];
  Chunks& c = cache[strided ? 1 : 0];
  if (!c.base.empty()) return c;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> w(0.f, 0.02f);
  c.base.resize(kRows * kCols);
  for (auto& v : c.base) {
    float f = w(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = static_cast<uint16_t>(bits >> 16);
  }
  std::vector<uint16_t> target = c.base;
  std::bernoulli_distribution change(0.03);
  for (auto& v : target) {
    if (change(rng)) v = static_cast<uint16_t>(v + 1 + (rng() % 8 == 0));
  }
  ChunkHeader ids;
  ids.width = 2;
  ids.version = 2;
  ids.base_version = 1;
  ChunkEncodeOptions opts;
  EncodeScratch scratch;
  auto add = [&](uint64_t start, uint64_t count, uint64_t run, uint64_t stride) {
    const auto old_region = Gather(c.base, start, count, run, stride);
    const auto new_region = Gather(target, start, count, run, stride);
    for (int dir = 0; dir < 2; ++dir) {
      ChunkResult r;
      const auto* from = reinterpret_cast<const uint8_t*>(dir == 0 ? old_region.data()
                                                                   : new_region.data());
      const auto* to = reinterpret_cast<const uint8_t*>(dir == 0 ? new_region.data()
                                                                 : old_region.data());
      if (!EncodeRegionChunk(ids, from, to, start, count, run, stride, opts, &scratch, &r).ok() ||
          r.chunk.empty()) {
        std::abort();
      }
      (dir == 0 ? c.forward : c.back).push_back(std::move(r.chunk));
    }
  };
  if (strided) {
    const uint64_t cols = kCols / kTp, rows = kChunk / cols;
    for (uint64_t r = 0; r < kRows; r += rows) {
      for (uint64_t q = 0; q < kTp; ++q) add(r * kCols + q * cols, rows * cols, cols, kCols);
    }
  } else {
    for (uint64_t e = 0; e < kRows * kCols; e += kChunk) add(e, kChunk, 0, 0);
  }
  return c;
}

void BM_ApplyRegions(benchmark::State& state) {
  const Chunks& c = MakeChunks(state.range(0) != 0);
  std::vector<ParsedChunk> forward, back;
  for (const auto& b : c.forward) forward.push_back(*ParseChunk(b));
  for (const auto& b : c.back) back.push_back(*ParseChunk(b));
  std::vector<uint16_t> work = c.base;
  auto* data = reinterpret_cast<uint8_t*>(work.data());
  ApplyScratch scratch;
  for (auto _ : state) {
    for (const auto* pass : {&forward, &back}) {
      for (const ParsedChunk& p : *pass) {
        if (ClassifyRange(p.header, RegionHash(p.header, data)) != RangeState::kBefore ||
            !ApplyChunkInPlace(p, data, &scratch, nullptr, nullptr).ok()) {
          state.SkipWithError("a chunk did not apply");
          return;
        }
      }
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * kRows * kCols * 2));
  state.counters["chunks"] = static_cast<double>(forward.size());
}

// Where the time goes: the region hashes alone (one per chunk), as the
// check against "before" takes them.
void BM_HashRegions(benchmark::State& state) {
  const Chunks& c = MakeChunks(state.range(0) != 0);
  std::vector<ParsedChunk> forward;
  for (const auto& b : c.forward) forward.push_back(*ParseChunk(b));
  const auto* data = reinterpret_cast<const uint8_t*>(c.base.data());
  for (auto _ : state) {
    for (const ParsedChunk& p : forward) benchmark::DoNotOptimize(RegionHash(p.header, data));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kRows * kCols * 2));
}

// 0: row blocks (contiguous ranges); 1: column blocks (strided regions).
BENCHMARK(BM_ApplyRegions)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_HashRegions)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace refit
