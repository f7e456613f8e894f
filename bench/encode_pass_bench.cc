// The publisher's encode pass on the CPU (DiffTensorsToSink, as
// FileBaseline::Diff runs it) against what memory allows the same threads.
//
// Inputs: a 512 MiB BF16 model in 16 tensors of 32 MiB (random bits) and a
// target in which a given share of the elements moved by 1-3 ulps at
// uniformly random positions (the shape of `refit bench sync`'s steps).
// The sink takes the chunks and drops them: what is timed is the diff's
// pass over baseline and target, hashing and entropy coding included,
// without sealing and uploading.
//
// Floors, the same threads over buffers of the same size: BM_ReadFloor reads
// two (what one pass over baseline and target costs at the least),
// BM_CopyFloor copies the target into another buffer (one read, one write).
//
// Times are the process's CPU time (all threads), so "bytes_per_second" is
// model bytes (one buffer's size, as the benchmark tables count them: a pass
// reads two) per CPU second, i.e. per busy thread: the number that stays put
// when other work shares the cores. "wall_per_thread" is the same per wall
// second and thread (lower when threads wait or the cores are shared).
// Compare rows of one run only.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/parallel.h"
#include "delta/encoder.h"

namespace refit {
namespace {

constexpr uint64_t kTensors = 16;
constexpr uint64_t kTensorElements = uint64_t{16} << 20;  // 32 MiB of BF16
constexpr uint64_t kBytes = kTensors * kTensorElements * 2;

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
  return z ^ (z >> 31);
}

// Random bits, written on all threads so that every page is touched by the
// thread count the benchmarks use most.
uint8_t* NewFilled(uint64_t seed) {
  auto* p = new uint8_t[kBytes];
  ParallelFor(kBytes, 1 << 20, 0, [&](size_t begin, size_t end) {
    uint64_t state = seed ^ begin;
    for (size_t i = begin; i < end; i += 8) {
      const uint64_t v = SplitMix(&state);
      std::memcpy(p + i, &v, 8);
    }
  });
  return p;
}

const uint8_t* Base() {
  static const uint8_t* base = NewFilled(1);
  return base;
}

// Base() with `basis_points` / 10000 of its elements moved by 1-3 ulps
// (the magnitude's low bits; a BF16's sign and exponent mostly stay).
const uint8_t* Target(int64_t basis_points) {
  static auto* cache = new std::map<int64_t, std::unique_ptr<uint8_t[]>>();
  auto& slot = (*cache)[basis_points];
  if (slot == nullptr) {
    slot.reset(new uint8_t[kBytes]);
    std::memcpy(slot.get(), Base(), kBytes);
    const uint64_t threshold =
        static_cast<uint64_t>(basis_points) * (uint64_t{1} << 32) / 10000;
    uint64_t state = 7;
    uint16_t* e = reinterpret_cast<uint16_t*>(slot.get());
    for (uint64_t i = 0; i < kBytes / 2; ++i) {
      const uint64_t r = SplitMix(&state);
      if ((r & 0xffffffff) >= threshold) continue;
      const uint16_t ulps = static_cast<uint16_t>(1 + ((r >> 32) % 100 >= 80) +
                                                  ((r >> 32) % 100 >= 95));
      e[i] = (r >> 40) & 1 ? static_cast<uint16_t>(e[i] + ulps)
                           : static_cast<uint16_t>(e[i] - ulps);
    }
  }
  return slot.get();
}

std::vector<TensorView> Views(const uint8_t* data) {
  std::vector<TensorView> v;
  for (uint64_t t = 0; t < kTensors; ++t) {
    v.push_back(TensorView{"t" + std::to_string(100 + t), "BF16", 2, {kTensorElements},
                           data + t * kTensorElements * 2});
  }
  return v;
}

class DropSink final : public ChunkSink {
 public:
  Status AddChunk(std::span<const uint8_t> chunk, const ChunkHeader&) override {
    bytes += chunk.size();
    return Status();
  }
  Status Finish(const std::vector<TensorEntry>&) override { return Status(); }
  uint64_t bytes = 0;
};

using Clock = std::chrono::steady_clock;

// `start`: when the timed loop began.
void Finish(benchmark::State& state, int threads, Clock::time_point start) {
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  state.counters["wall_per_thread"] = benchmark::Counter(
      static_cast<double>(state.iterations() * kBytes) / threads / wall);
}

// Args: change rate in basis points, threads.
void BM_EncodePass(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(1));
  const std::vector<TensorView> base = Views(Base());
  const std::vector<TensorView> target = Views(Target(state.range(0)));
  DiffOptions opt;
  opt.threads = threads;
  uint64_t payload = 0;
  const Clock::time_point start = Clock::now();
  for (auto _ : state) {
    DropSink sink;
    Result<DiffReport> r = DiffTensorsToSink(base, target, opt, &sink);
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      return;
    }
    payload = sink.bytes;
  }
  state.counters["payload_MB"] = static_cast<double>(payload) / 1e6;
  Finish(state, threads, start);
}
BENCHMARK(BM_EncodePass)
    ->ArgNames({"bp", "threads"})
    ->ArgsProduct({{100, 300}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime();

// Arg: threads. memcmp of two equal buffers reads both to the end with the
// C library's vector code.
void BM_ReadFloor(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const uint8_t* a = Base();
  static const uint8_t* b = [] {
    auto* p = new uint8_t[kBytes];
    std::memcpy(p, Base(), kBytes);
    return p;
  }();
  const Clock::time_point start = Clock::now();
  for (auto _ : state) {
    ParallelFor(kBytes, 1 << 20, threads, [&](size_t begin, size_t end) {
      int r = std::memcmp(a + begin, b + begin, end - begin);
      benchmark::DoNotOptimize(r);
    });
  }
  Finish(state, threads, start);
}
BENCHMARK(BM_ReadFloor)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();

// Arg: threads.
void BM_CopyFloor(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const uint8_t* b = Target(100);
  static uint8_t* out = NewFilled(3);
  const Clock::time_point start = Clock::now();
  for (auto _ : state) {
    ParallelFor(kBytes, 1 << 20, threads, [&](size_t begin, size_t end) {
      std::memcpy(out + begin, b + begin, end - begin);
    });
    benchmark::ClobberMemory();
  }
  Finish(state, threads, start);
}
BENCHMARK(BM_CopyFloor)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();

}  // namespace
}  // namespace refit
