// Inspect: decodes every chunk of a delta and reports sizes against the
// order-0 entropy bound (docs/benchmarks.md explains the bound).
#include <cmath>
#include <unordered_map>

#include "base/bytes.h"
#include "codec/conditional.h"
#include "delta/chunk.h"
#include "delta/delta_file.h"
#include "refit/delta.h"

namespace refit {
namespace {

double Log2Binomial(uint64_t n, uint64_t k) {
  if (k == 0 || k >= n) return 0;
  return (std::lgamma(static_cast<double>(n) + 1) -
          std::lgamma(static_cast<double>(k) + 1) -
          std::lgamma(static_cast<double>(n - k) + 1)) /
         std::log(2.0);
}

// Total bits of `count` symbols under their empirical order-0 distribution.
double EntropyBits(const std::unordered_map<uint64_t, uint64_t>& hist) {
  uint64_t total = 0;
  for (const auto& [v, c] : hist) total += c;
  double bits = 0;
  for (const auto& [v, c] : hist) {
    bits -= static_cast<double>(c) *
            std::log2(static_cast<double>(c) / static_cast<double>(total));
  }
  return bits;
}

}  // namespace

Result<InspectReport> Inspect(const std::string& delta_path) {
  REFIT_ASSIGN_OR_RETURN(DeltaReader delta, DeltaReader::Open(delta_path));
  InspectReport report;
  report.format_version = delta.format_version();
  report.version = delta.version();
  report.base_version = delta.base_version();
  report.file_bytes = delta.file_size();
  report.chunks = delta.index().size();
  report.bound_valid = true;

  std::unordered_map<uint64_t, uint64_t> all_values;
  std::vector<std::unordered_map<uint64_t, uint64_t>> tensor_values(
      delta.tensors().size());
  std::vector<bool> tensor_xor_only(delta.tensors().size(), true);
  for (const TensorEntry& e : delta.tensors()) {
    TensorInspect t;
    t.name = e.name;
    t.dtype = e.dtype;
    t.elements = e.num_elements;
    report.total_elements += e.num_elements;
    report.full_bytes += e.num_elements * e.width;
    report.tensors.push_back(std::move(t));
  }

  std::vector<uint32_t> positions;
  std::vector<uint8_t> values;
  for (size_t i = 0; i < delta.index().size(); ++i) {
    REFIT_ASSIGN_OR_RETURN(ParsedChunk c, delta.ReadChunk(i));
    const ChunkHeader& h = c.header;
    const int w = h.width;
    TensorInspect& t = report.tensors[h.tensor_id];
    ++t.chunks;
    t.changed += h.changed;
    t.payload_bytes += c.payload.size();
    t.chunk_bytes += c.size;
    ++t.kinds[ChunkKindName(h.kind)];
    ++report.kinds[ChunkKindName(h.kind)];
    report.changed_elements += h.changed;
    report.payload_bytes += c.payload.size();
    report.chunk_bytes += c.size;

    auto& hist = tensor_values[h.tensor_id];
    const uint32_t n = static_cast<uint32_t>(h.count);
    const uint32_t k = static_cast<uint32_t>(h.changed);
    if (h.IsConditional()) {
      // Coded given the base, which inspect does not hold: the framing is
      // checked, the records are not decoded, and no bound is given.
      auto info = codec::DescribeConditional(c.payload);
      if (!info.ok()) return info.status().WithContext("chunk " + std::to_string(i));
      tensor_xor_only[h.tensor_id] = false;
      report.bound_valid = false;
      continue;
    }
    if (h.IsSparse()) {
      positions.resize(k);
      values.resize(static_cast<size_t>(k) * w);
      Status s = codec::DecodeSparse(c.payload, h.kind, n, w, k,
                                     positions.data(), values.data());
      if (!s.ok()) return s.WithContext("chunk " + std::to_string(i));
      if (h.kind == codec::ChunkKind::kSparseXor) {
        for (uint32_t r = 0; r < k; ++r) ++hist[LoadLE(values.data() + r * w, w)];
      }
    } else {
      values.resize(static_cast<size_t>(n) * w);
      Status s = codec::DecodeDense(c.payload, n, w, values.data());
      if (!s.ok()) return s.WithContext("chunk " + std::to_string(i));
      if (h.kind == codec::ChunkKind::kDenseXor) {
        uint64_t nonzero = 0;
        for (uint32_t j = 0; j < n; ++j) {
          uint64_t v = LoadLE(values.data() + static_cast<uint64_t>(j) * w, w);
          if (v != 0) {
            ++hist[v];
            ++nonzero;
          }
        }
        if (nonzero != k) {
          return DataLossError("chunk " + std::to_string(i) +
                               " says " + std::to_string(k) +
                               " elements changed but its XOR plane has " +
                               std::to_string(nonzero));
        }
      }
    }
    if (!h.IsXor()) {
      tensor_xor_only[h.tensor_id] = false;
      report.bound_valid = false;
    }
  }
  for (size_t t = 0; t < report.tensors.size(); ++t) {
    TensorInspect& ti = report.tensors[t];
    if (tensor_xor_only[t] && ti.changed > 0) {
      ti.bound_bytes =
          (Log2Binomial(ti.elements, ti.changed) + EntropyBits(tensor_values[t])) / 8;
    }
    for (const auto& [v, c] : tensor_values[t]) all_values[v] += c;
  }
  if (report.bound_valid) {
    report.bound_bytes = (Log2Binomial(report.total_elements, report.changed_elements) +
                          EntropyBits(all_values)) / 8;
  }
  return report;
}

}  // namespace refit
