// Micro-benchmarks for bitwise change detection (src/delta/detect.h).
//
// Inputs: two 256 MiB buffers of BF16 (width 2) elements; `a` is random, `b`
// is a copy of `a` in which a given fraction of elements has its lowest
// mantissa bit flipped, spread evenly at random (the shape of one small RL
// optimizer step). Baseline, in the same run: memcmp over two equal buffers,
// which is as fast as reading both can be.
//
// Every benchmark reports bytes/s counting both buffers
// (iterations * 2 * 256 MiB) and wall time, so single- and multi-threaded
// rows compare directly. Run with --benchmark_repetitions=3 on a quiet
// machine and quote medians.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "base/parallel.h"
#include "delta/detect.h"

namespace refit {
namespace {

constexpr uint64_t kBytes = uint64_t{256} << 20;
constexpr int kWidth = 2;  // BF16
constexpr uint64_t kElems = kBytes / kWidth;

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
  return z ^ (z >> 31);
}

const uint8_t* BaseBuffer() {
  static const uint8_t* buf = [] {
    auto* p = new uint8_t[kBytes];
    uint64_t state = 1;
    for (uint64_t i = 0; i < kBytes; i += 8) {
      const uint64_t v = SplitMix(&state);
      std::memcpy(p + i, &v, 8);
    }
    return p;
  }();
  return buf;
}

// A copy of BaseBuffer() with about `basis_points` / 10000 of its elements
// changed, built once per rate. Gaps between changes are uniform in
// [1, 2 / rate - 1], so the rate is exact on average and changes never land
// twice on one element.
const uint8_t* ChangedBuffer(int64_t basis_points) {
  static auto* cache = new std::map<int64_t, std::unique_ptr<uint8_t[]>>();
  auto& slot = (*cache)[basis_points];
  if (slot == nullptr) {
    slot.reset(new uint8_t[kBytes]);
    std::memcpy(slot.get(), BaseBuffer(), kBytes);
    if (basis_points > 0) {
      const uint64_t max_gap =
          2 * 10000 / static_cast<uint64_t>(basis_points) - 1;
      uint64_t state = 2;
      for (uint64_t i = SplitMix(&state) % max_gap; i < kElems;
           i += 1 + SplitMix(&state) % max_gap) {
        slot[i * kWidth] ^= 1;  // low mantissa bit of a little-endian BF16
      }
    }
  }
  return slot.get();
}

void Finish(benchmark::State& state, uint64_t changed) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 *
                          static_cast<int64_t>(kBytes));
  state.counters["changed_pct"] =
      100.0 * static_cast<double>(changed) / static_cast<double>(kElems);
}

void BM_Memcmp(benchmark::State& state) {
  const uint8_t* a = BaseBuffer();
  const uint8_t* b = ChangedBuffer(0);
  for (auto _ : state) {
    int r = std::memcmp(a, b, kBytes);
    benchmark::DoNotOptimize(r);
  }
  Finish(state, 0);
}
BENCHMARK(BM_Memcmp)->Unit(benchmark::kMillisecond)->UseRealTime();

// memcmp on each half from its own thread: what memory allows two threads,
// the ceiling for FindChangedParallel's scaling. Arg: threads.
void BM_MemcmpParallel(benchmark::State& state) {
  const uint8_t* a = BaseBuffer();
  const uint8_t* b = ChangedBuffer(0);
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    ParallelFor(kBytes, 4096, threads, [&](size_t begin, size_t end) {
      int r = std::memcmp(a + begin, b + begin, end - begin);
      benchmark::DoNotOptimize(r);
    });
  }
  Finish(state, 0);
}
BENCHMARK(BM_MemcmpParallel)
    ->ArgName("threads")
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Arg: change rate in basis points.
void BM_CountChanged(benchmark::State& state) {
  const uint8_t* a = BaseBuffer();
  const uint8_t* b = ChangedBuffer(state.range(0));
  uint64_t changed = 0;
  for (auto _ : state) {
    changed = CountChanged(a, b, kElems, kWidth);
    benchmark::DoNotOptimize(changed);
  }
  Finish(state, changed);
}
BENCHMARK(BM_CountChanged)
    ->ArgName("bp")
    ->Arg(0)
    ->Arg(100)
    ->Arg(300)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Args: change rate in basis points. The output vector is reused across
// iterations, as a trainer reuses it across steps.
void BM_FindChanged(benchmark::State& state) {
  const uint8_t* a = BaseBuffer();
  const uint8_t* b = ChangedBuffer(state.range(0));
  std::vector<uint32_t> out;
  for (auto _ : state) {
    out.clear();
    FindChanged(a, b, kElems, kWidth, &out);
    benchmark::DoNotOptimize(out.data());
  }
  Finish(state, out.size());
}
BENCHMARK(BM_FindChanged)
    ->ArgName("bp")
    ->Arg(0)
    ->Arg(100)
    ->Arg(300)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Args: change rate in basis points, threads.
void BM_FindChangedParallel(benchmark::State& state) {
  const uint8_t* a = BaseBuffer();
  const uint8_t* b = ChangedBuffer(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  std::vector<uint32_t> out;
  for (auto _ : state) {
    out.clear();
    FindChangedParallel(a, b, kElems, kWidth, threads, &out);
    benchmark::DoNotOptimize(out.data());
  }
  Finish(state, out.size());
}
BENCHMARK(BM_FindChangedParallel)
    ->ArgNames({"bp", "threads"})
    ->Args({0, 2})
    ->Args({100, 2})
    ->Args({300, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Each dispatch level forced: what the runtime dispatch buys.
// Args: internal::DetectLevel, change rate in basis points.
void BM_FindChangedAtLevel(benchmark::State& state) {
  const auto level = static_cast<internal::DetectLevel>(state.range(0));
  if (!internal::DetectLevelSupported(level)) {
    state.SkipWithError("level not supported on this CPU");
    return;
  }
  state.SetLabel(internal::DetectLevelName(level));
  const uint8_t* a = BaseBuffer();
  const uint8_t* b = ChangedBuffer(state.range(1));
  std::vector<uint32_t> out;
  for (auto _ : state) {
    out.clear();
    internal::FindChangedAt(level, a, b, kElems, kWidth, &out);
    benchmark::DoNotOptimize(out.data());
  }
  Finish(state, out.size());
}
BENCHMARK(BM_FindChangedAtLevel)
    ->ArgNames({"level", "bp"})
    ->ArgsProduct({{static_cast<int>(internal::DetectLevel::kScalar),
                    static_cast<int>(internal::DetectLevel::kAvx2),
                    static_cast<int>(internal::DetectLevel::kAvx512)},
                   {0, 100}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace refit
