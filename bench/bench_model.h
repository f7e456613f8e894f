// A synthetic BF16 model for the benchmarks that publish through the
// library (catchup_bench.cc, many_tensors_bench.cc): named tensors of raw
// bits, a SplitMix64 generator to fill and step them, and TensorViews of
// them for the publisher.
#ifndef REFIT_BENCH_BENCH_MODEL_H_
#define REFIT_BENCH_BENCH_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "refit/delta.h"

namespace refit::bench {

struct SplitMix {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

struct Model {
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> data;  // BF16 bits

  std::vector<TensorView> Views() const {
    std::vector<TensorView> v;
    for (size_t i = 0; i < names.size(); ++i) {
      v.push_back({names[i], "BF16", 2, {data[i].size() / 2}, data[i].data()});
    }
    return v;
  }
};

}  // namespace refit::bench

#endif  // REFIT_BENCH_BENCH_MODEL_H_
