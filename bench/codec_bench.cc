// Micro-benchmarks of the chunk payload codec (src/codec/payload.h) on
// synthetic BF16-like deltas: a chunk of n = 2^24 elements (32 MiB of BF16)
// where a given share changed, with XOR values drawn like an RL step's
// (0x1 44%, 0x3 23%, 0x7 11%, 0xf 6%, the rest spread over 1..0x3ff).
//
// "bytes_per_second" is checkpoint bytes (n * w) per second, the number the
// 2 GB/s-per-core target is stated in; "records/s" counts changed elements.
// Record numbers from the release preset only.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "codec/conditional.h"
#include "codec/payload.h"

namespace refit::codec {
namespace {

constexpr uint32_t kElements = uint32_t{1} << 24;
constexpr int kWidth = 2;

uint16_t DrawXor(std::mt19937_64& rng) {
  const uint32_t u = static_cast<uint32_t>(rng() % 100);
  if (u < 44) return 0x1;
  if (u < 67) return 0x3;
  if (u < 78) return 0x7;
  if (u < 84) return 0xf;
  return static_cast<uint16_t>(1 + rng() % 0x3ff);
}

struct SparseInput {
  std::vector<uint32_t> positions;
  std::vector<uint8_t> values;
};

// `per_mille` of kElements changed, at uniformly random positions.
const SparseInput& Sparse(int per_mille) {
  static std::vector<SparseInput> cache(1001);
  SparseInput& in = cache[per_mille];
  if (in.positions.empty()) {
    std::mt19937_64 rng(per_mille);
    for (uint32_t i = 0; i < kElements; ++i) {
      if (rng() % 1000 >= static_cast<uint64_t>(per_mille)) continue;
      const uint16_t v = DrawXor(rng);
      in.positions.push_back(i);
      in.values.push_back(static_cast<uint8_t>(v));
      in.values.push_back(static_cast<uint8_t>(v >> 8));
    }
  }
  return in;
}

void SetCounters(benchmark::State& state, uint64_t records,
                 size_t payload_bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kElements *
                          kWidth);
  state.counters["records/s"] = benchmark::Counter(
      static_cast<double>(records) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["payload_bits/record"] =
      8.0 * static_cast<double>(payload_bytes) / static_cast<double>(records);
}

void BM_EncodeSparse(benchmark::State& state) {
  const SparseInput& in = Sparse(static_cast<int>(state.range(0)));
  std::vector<uint8_t> out;
  for (auto _ : state) {
    out.clear();
    const Status s =
        EncodeSparse(ChunkKind::kSparseXor, kElements, kWidth, in.positions,
                     in.values.data(), EncodeOptions(), &out);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  SetCounters(state, in.positions.size(), out.size());
}

// Arg 0: per mille changed; arg 1: the lane kernel (internal::LaneKernel,
// 0 portable, 1 AVX2): the kernels side by side in one run.
void BM_EncodeSparseWith(benchmark::State& state) {
  const SparseInput& in = Sparse(static_cast<int>(state.range(0)));
  const auto kernel = static_cast<internal::LaneKernel>(state.range(1));
  if (!internal::LaneKernelSupported(kernel)) {
    state.SkipWithError("lane kernel not supported on this CPU");
    return;
  }
  std::vector<uint8_t> out;
  for (auto _ : state) {
    out.clear();
    const Status s = internal::EncodeSparseWith(kernel, ChunkKind::kSparseXor, kElements, kWidth,
                                                in.positions, in.values.data(), EncodeOptions(),
                                                &out);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  SetCounters(state, in.positions.size(), out.size());
}

// Times decode(payload, positions, values) of the k records that encode(out)
// wrote; `elements` per iteration.
template <typename EncodeFn, typename DecodeFn>
void TimeDecode(benchmark::State& state, uint32_t elements, uint32_t k, EncodeFn&& encode,
                DecodeFn&& decode) {
  std::vector<uint8_t> payload;
  if (!encode(&payload).ok()) {
    state.SkipWithError("encode failed");
    return;
  }
  std::vector<uint32_t> positions(k);
  std::vector<uint8_t> values(size_t{k} * kWidth);
  for (auto _ : state) {
    const Status s = decode(payload, positions.data(), values.data());
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(values.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * elements * kWidth);
  state.counters["payload_bits/record"] =
      8.0 * static_cast<double>(payload.size()) / static_cast<double>(k);
}

void BM_DecodeSparse(benchmark::State& state) {
  const SparseInput& in = Sparse(static_cast<int>(state.range(0)));
  const uint32_t k = static_cast<uint32_t>(in.positions.size());
  TimeDecode(
      state, kElements, k,
      [&](std::vector<uint8_t>* out) {
        return EncodeSparse(ChunkKind::kSparseXor, kElements, kWidth, in.positions,
                            in.values.data(), EncodeOptions(), out);
      },
      [&](std::span<const uint8_t> payload, uint32_t* positions, uint8_t* values) {
        return DecodeSparse(payload, ChunkKind::kSparseXor, kElements, kWidth, k, positions,
                            values);
      });
  state.counters["records/s"] = benchmark::Counter(
      static_cast<double>(k) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

// A dense XOR plane where `per_mille` of elements changed (zeros elsewhere).
std::vector<uint8_t> Dense(int per_mille) {
  std::mt19937_64 rng(1000 + per_mille);
  std::vector<uint8_t> d(size_t{kElements} * kWidth, 0);
  for (uint32_t i = 0; i < kElements; ++i) {
    if (rng() % 1000 >= static_cast<uint64_t>(per_mille)) continue;
    const uint16_t v = DrawXor(rng);
    d[2 * size_t{i}] = static_cast<uint8_t>(v);
    d[2 * size_t{i} + 1] = static_cast<uint8_t>(v >> 8);
  }
  return d;
}

void BM_EncodeDense(benchmark::State& state) {
  const std::vector<uint8_t> data = Dense(static_cast<int>(state.range(0)));
  std::vector<uint8_t> out;
  for (auto _ : state) {
    out.clear();
    const Status s =
        EncodeDense(kElements, kWidth, data.data(), EncodeOptions(), &out);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  SetCounters(state, kElements, out.size());
}

void BM_DecodeDense(benchmark::State& state) {
  const std::vector<uint8_t> data = Dense(static_cast<int>(state.range(0)));
  std::vector<uint8_t> payload;
  if (!EncodeDense(kElements, kWidth, data.data(), EncodeOptions(), &payload)
           .ok()) {
    state.SkipWithError("encode failed");
    return;
  }
  std::vector<uint8_t> out(data.size());
  for (auto _ : state) {
    const Status s = DecodeDense(payload, kElements, kWidth, out.data());
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  SetCounters(state, kElements, payload.size());
}

// One chunk of the end-to-end benchmarks (delta_bench.cc): 4 Mi BF16
// elements of N(0, 0.02) weights, `per_mille` of them moved by 1-2 units in
// the last place, coded as kind 1 (sparse XOR) or kind 5 (conditional XOR,
// given the base). Kind 1 on the same chunk is the ratio's baseline.
constexpr uint32_t kChunkElements = uint32_t{1} << 22;

struct StepInput {
  std::vector<uint8_t> base;
  std::vector<uint32_t> positions;
  std::vector<uint8_t> values;  // XOR
};

const StepInput& Step(int per_mille) {
  static std::vector<StepInput> cache(1001);
  StepInput& in = cache[per_mille];
  if (in.base.empty()) {
    std::mt19937_64 rng(per_mille);
    std::normal_distribution<float> w(0.f, 0.02f);
    in.base.resize(size_t{kChunkElements} * kWidth);
    for (uint32_t i = 0; i < kChunkElements; ++i) {
      const float f = w(rng);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t b = static_cast<uint16_t>(bits >> 16);
      in.base[2 * size_t{i}] = static_cast<uint8_t>(b);
      in.base[2 * size_t{i} + 1] = static_cast<uint8_t>(b >> 8);
      if (rng() % 1000 >= static_cast<uint64_t>(per_mille)) continue;
      const uint16_t x = static_cast<uint16_t>(b ^ (b + 1 + (rng() % 8 == 0)));
      in.positions.push_back(i);
      in.values.push_back(static_cast<uint8_t>(x));
      in.values.push_back(static_cast<uint8_t>(x >> 8));
    }
  }
  return in;
}

// Kind 1 or kind 5 (conditional) of one step's chunk, appended to *out.
Status EncodeStep(const StepInput& in, bool conditional, std::vector<uint8_t>* out) {
  return conditional ? EncodeConditional(kChunkElements, in.base.data(), in.positions,
                                         in.values.data(), EncodeOptions(), out)
                     : EncodeSparse(ChunkKind::kSparseXor, kChunkElements, kWidth,
                                    in.positions, in.values.data(), EncodeOptions(), out);
}

// Arguments: per mille changed, then the kind (1 or 5).
void BM_EncodeStep(benchmark::State& state) {
  const StepInput& in = Step(static_cast<int>(state.range(0)));
  const bool conditional = state.range(1) == 5;
  std::vector<uint8_t> out;
  for (auto _ : state) {
    out.clear();
    const Status s = EncodeStep(in, conditional, &out);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kChunkElements *
                          kWidth);
  state.counters["payload_bits/record"] =
      8.0 * static_cast<double>(out.size()) / static_cast<double>(in.positions.size());
}

void BM_DecodeStep(benchmark::State& state) {
  const StepInput& in = Step(static_cast<int>(state.range(0)));
  const bool conditional = state.range(1) == 5;
  const uint32_t k = static_cast<uint32_t>(in.positions.size());
  TimeDecode(
      state, kChunkElements, k,
      [&](std::vector<uint8_t>* out) { return EncodeStep(in, conditional, out); },
      [&](std::span<const uint8_t> payload, uint32_t* positions, uint8_t* values) {
        return conditional ? DecodeConditional(payload, kChunkElements, in.base.data(), k,
                                               positions, values)
                           : DecodeSparse(payload, ChunkKind::kSparseXor, kChunkElements,
                                          kWidth, k, positions, values);
      });
}

// Arguments are the change rate in per mille.
BENCHMARK(BM_EncodeSparse)->Arg(10)->Arg(30)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeSparseWith)
    ->ArgNames({"per_mille", "kernel"})
    ->ArgsProduct({{10, 30}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeSparse)->Arg(10)->Arg(30)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeDense)->Arg(500)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeDense)->Arg(500)->Unit(benchmark::kMillisecond);
// Process CPU time: the development machine is shared, and time other work
// takes from the benchmark's core does not count.
BENCHMARK(BM_EncodeStep)
    ->ArgsProduct({{10, 30}, {1, 5}})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime();
BENCHMARK(BM_DecodeStep)
    ->ArgsProduct({{10, 30}, {1, 5}})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime();

}  // namespace
}  // namespace refit::codec
