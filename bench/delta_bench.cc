// End-to-end delta encode and decode+apply in host memory, one thread:
// the per-core throughput of the CPU path without file-system costs
// (page faults of MAP_SHARED stores are measured by `refit bench`).
// Checkpoint bytes/s = bytes of the model processed per second.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <random>
#include <utility>
#include <vector>

#include "refit/delta.h"

namespace refit {
namespace {

constexpr uint64_t kElements = uint64_t{128} << 20;  // 256 MiB of BF16

struct Pair {
  std::vector<uint16_t> base, target;
  std::string delta;
};

// Delta files this process wrote, removed when it exits.
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const std::string& p : paths) std::remove(p.c_str());
  }
};

std::string TempPath(const std::string& suffix) {
  static TempFiles files;
  files.paths.push_back("/tmp/refit_delta_bench_" + std::to_string(getpid()) +
                        "_" + suffix + ".rfd");
  return files.paths.back();
}

// BF16-looking weights and a step moving `rate` of them by 1-3 ulps.
// conditional: the delta may use conditional XOR chunks (kind 5).
const Pair& MakePair(double rate, bool conditional) {
  static std::map<std::pair<double, bool>, Pair> cache;
  auto it = cache.find({rate, conditional});
  if (it != cache.end()) return it->second;
  Pair& p = cache[{rate, conditional}];
  std::mt19937_64 rng(1);
  std::normal_distribution<float> w(0.f, 0.02f);
  p.base.resize(kElements);
  for (auto& v : p.base) {
    float f = w(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = static_cast<uint16_t>(bits >> 16);
  }
  p.target = p.base;
  std::bernoulli_distribution change(rate);
  for (auto& v : p.target) {
    if (change(rng)) v = static_cast<uint16_t>(v + 1 + (rng() % 8 == 0));
  }
  // Per process, so concurrent runs (a baseline build beside this one) do
  // not overwrite each other's files.
  p.delta = TempPath(std::to_string(rate) + (conditional ? "c" : ""));
  DiffOptions opts;
  opts.threads = 1;
  opts.allow_conditional = conditional;
  (void)DiffTensors({{"w", "BF16", 2, {kElements}, reinterpret_cast<uint8_t*>(p.base.data())}},
                    {{"w", "BF16", 2, {kElements}, reinterpret_cast<uint8_t*>(p.target.data())}},
                    p.delta, opts);
  return p;
}

void BM_Encode(benchmark::State& state) {
  const double rate = static_cast<double>(state.range(0)) / 1000.0;
  const Pair& p = MakePair(rate, state.range(1) != 0);
  DiffOptions opts;
  opts.threads = 1;
  opts.allow_conditional = state.range(1) != 0;
  static const std::string out = TempPath("out");
  for (auto _ : state) {
    auto r = DiffTensors(
        {{"w", "BF16", 2, {kElements}, reinterpret_cast<const uint8_t*>(p.base.data())}},
        {{"w", "BF16", 2, {kElements}, reinterpret_cast<const uint8_t*>(p.target.data())}},
        out, opts);
    if (!r.ok()) state.SkipWithError(r.status().ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kElements * 2));
}

void BM_DecodeApply(benchmark::State& state) {
  const double rate = static_cast<double>(state.range(0)) / 1000.0;
  const Pair& p = MakePair(rate, state.range(1) != 0);
  std::vector<uint16_t> work = p.base;
  ApplyOptions opts;
  opts.threads = 1;
  opts.sync = false;
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(work.data(), p.base.data(), kElements * 2);
    state.ResumeTiming();
    auto r = ApplyToTensors(p.delta,
                            {{"w", "BF16", 2, {kElements}, reinterpret_cast<uint8_t*>(work.data())}},
                            opts);
    if (!r.ok()) state.SkipWithError(r.status().ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kElements * 2));
}

// Rates in thousandths: 1 = 0.1%, 10 = 1%, 30 = 3%; then 1 where the
// encoder may use conditional XOR chunks. The CPU column is the process's
// CPU time (every thread), which other work on a shared machine does not
// inflate; the iteration time is wall-clock.
BENCHMARK(BM_Encode)
    ->ArgsProduct({{1, 10, 30}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_DecodeApply)
    ->ArgsProduct({{1, 10, 30}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();

}  // namespace
}  // namespace refit
