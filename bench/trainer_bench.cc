// Trainer side, per rank (docs/benchmarks.md, "Trainer side"): detect +
// project + encode of one rank's owned shard with RankEncoder, against the
// baseline of assembling the canonical tensors from the tensor-parallel
// shards and diffing them (DiffTensorsToSink), in the same run, on a
// synthetic Llama-style model (TP x PP, BF16, a fraction of elements
// changed by ulp-sized XORs).
//
//   refit_trainer_bench [--size-gib 8] [--tp 4] [--pp 2] [--rate 0.03]
//                       [--threads N] [--repeat 3]
//
// The assembling baseline is timed two ways: the stage leader assembles and
// diffs every tensor of its pipeline stage (gather to one rank, the common
// export path), and the stage's tensors split over its TP ranks (each rank
// assembles and diffs 1/tp of them; the gather's network time is not
// counted, which favours the baseline). Memory is counted per path as the
// bytes each allocates beyond the trainer's own tensors.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/parallel.h"
#include "delta/encoder.h"
#include "layout/generate.h"
#include "refit/delta.h"
#include "trainer/rank_encoder.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;
using layout::Layout;
using layout::Piece;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Args {
  double size_gib = 8;
  uint32_t tp = 4, pp = 2;
  double rate = 0.03;
  int threads = 0;
  int repeat = 3;
};

// Counts chunks and bytes; keeps nothing.
class CountingSink : public ChunkSink {
 public:
  Status AddChunk(std::span<const uint8_t> chunk, const ChunkHeader&) override {
    bytes += chunk.size();
    ++chunks;
    return Status();
  }
  Status Finish(const std::vector<TensorEntry>&) override { return Status(); }
  uint64_t bytes = 0, chunks = 0;
};

uint64_t Elements(const std::vector<uint64_t>& s) {
  uint64_t n = 1;
  for (uint64_t d : s) n *= d;
  return n;
}

// Copies piece elements between local and canonical buffers, a row at a
// time where both sides are contiguous along the piece's columns.
template <bool kToLocal>
void CopyPiece(const Piece& p, uint8_t* local, uint8_t* canon, uint64_t w) {
  for (uint64_t r = 0; r < p.rows; ++r) {
    uint64_t li = p.local_offset + r * p.local_row_stride;
    uint64_t ci = p.canon_offset + r * p.canon_row_stride;
    if (p.local_col_stride == 1 && p.canon_col_stride == 1) {
      if (kToLocal) std::memcpy(local + li * w, canon + ci * w, p.cols * w);
      else std::memcpy(canon + ci * w, local + li * w, p.cols * w);
      continue;
    }
    for (uint64_t c = 0; c < p.cols; ++c) {
      uint8_t* a = local + (li + c * p.local_col_stride) * w;
      uint8_t* b = canon + (ci + c * p.canon_col_stride) * w;
      if (kToLocal) std::memcpy(a, b, w);
      else std::memcpy(b, a, w);
    }
  }
}

int Run(const Args& a) {
  // Llama-7B-like widths; layers chosen for the requested size.
  layout::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.hidden_size = 4096;
  cfg.intermediate_size = 11008;
  cfg.num_attention_heads = 32;
  cfg.num_key_value_heads = 8;
  cfg.head_dim = 128;
  cfg.vocab_size = 32000;
  const double layer_bytes = 2.0 * (4096.0 * (4096 + 2 * 1024 + 4096) + 3.0 * 4096 * 11008);
  const double embed_bytes = 2.0 * 2 * 32000 * 4096;
  cfg.num_hidden_layers = static_cast<uint64_t>(
      std::max(1.0, (a.size_gib * (1 << 30) - embed_bytes) / layer_bytes));
  layout::Parallelism par;
  par.tp = a.tp;
  par.pp = a.pp;
  auto gen = layout::GenerateLayout(cfg, par);
  if (!gen.ok()) {
    fmt::print(stderr, "layout: {}\n", gen.status().ToString());
    return 1;
  }
  const Layout& l = *gen;
  uint64_t model_bytes = 0;
  std::map<std::string, const layout::CanonicalTensor*> canon_by_name;
  for (const auto& c : l.canonical) {
    model_bytes += Elements(c.shape) * 2;
    canon_by_name[c.name] = &c;
  }
  // Pipeline stage 0: ranks 0..tp-1 (rank = t + tp * (... + dp * p)).
  std::vector<size_t> stage;
  for (size_t i = 0; i < l.ranks.size(); ++i) {
    if (l.ranks[i].rank < a.tp) stage.push_back(i);
  }
  std::map<std::string, bool> in_stage;
  for (size_t ri : stage) {
    for (const auto& t : l.ranks[ri].tensors) {
      for (const auto& p : t.pieces) in_stage[p.canonical] = true;
    }
  }
  uint64_t stage_bytes = 0;
  for (const auto& [n, _] : in_stage) stage_bytes += Elements(canon_by_name[n]->shape) * 2;
  fmt::print("model: {} layers, {} tensors, {:.2f} GB canonical BF16; TP {} x PP {}, {} ranks\n",
             cfg.num_hidden_layers, l.canonical.size(), static_cast<double>(model_bytes) / 1e9, a.tp, a.pp,
             l.ranks.size());
  fmt::print("stage 0: {} canonical tensors, {:.2f} GB; change rate {:.1f}%, threads {}\n",
             in_stage.size(), static_cast<double>(stage_bytes) / 1e9, a.rate * 100,
             a.threads > 0 ? a.threads : DefaultThreads());

  // Canonical base and target of stage 0 (the target only to scatter).
  std::mt19937_64 rng(1);
  std::map<std::string, std::vector<uint8_t>> base;
  for (const auto& [n, _] : in_stage) {
    std::vector<uint8_t> b(Elements(canon_by_name[n]->shape) * 2);
    uint64_t* w = reinterpret_cast<uint64_t*>(b.data());
    for (size_t i = 0; i < b.size() / 8; ++i) w[i] = rng() & 0x3F7F3F7F3F7F3F7FULL;
    base[n] = std::move(b);
  }
  // The TP ranks' local tensors at the new step: the base scattered, then
  // a fraction of canonical elements flipped (the same in every replica).
  std::vector<std::map<std::string, std::vector<uint8_t>>> local(stage.size());
  for (size_t k = 0; k < stage.size(); ++k) {
    for (const auto& t : l.ranks[stage[k]].tensors) {
      std::vector<uint8_t> b(Elements(t.shape) * 2, 0);
      for (const auto& p : t.pieces) {
        CopyPiece<true>(p, b.data(), base[p.canonical].data(), 2);
      }
      local[k][t.name] = std::move(b);
    }
  }
  const uint64_t thresh = static_cast<uint64_t>(a.rate * 4294967296.0);
  for (size_t k = 0; k < stage.size(); ++k) {
    std::mt19937_64 r2(100 + k);
    for (auto& [n, b] : local[k]) {
      for (size_t i = 0; i < b.size(); i += 2) {
        if ((r2() & 0xFFFFFFFF) < thresh) b[i] ^= static_cast<uint8_t>(1 + (i >> 1) % 3);
      }
    }
  }
  auto local_views = [&](size_t k) {
    std::vector<TensorView> v;
    for (const auto& t : l.ranks[stage[k]].tensors) {
      v.push_back({t.name, t.dtype, 2, t.shape, local[k].at(t.name).data()});
    }
    return v;
  };
  auto canon_views = [&](const std::map<std::string, std::vector<uint8_t>>& m,
                         const std::vector<std::string>& names) {
    std::vector<TensorView> v;
    for (const auto& n : names) {
      v.push_back({n, "BF16", 2, canon_by_name[n]->shape, m.at(n).data()});
    }
    return v;
  };

  // Path A: RankEncoder on rank 0 (baseline from the canonical base).
  trainer::RankEncoderOptions opt;
  opt.threads = a.threads;
  auto enc = trainer::RankEncoder::Create(l, l.ranks[stage[0]].rank, opt);
  if (!enc.ok()) {
    fmt::print(stderr, "rank encoder: {}\n", enc.status().ToString());
    return 1;
  }
  std::vector<std::string> all_names;
  for (const auto& [n, _] : in_stage) all_names.push_back(n);
  Status st = (*enc)->SetBaseline(canon_views(base, all_names));
  if (!st.ok()) {
    fmt::print(stderr, "baseline: {}\n", st.ToString());
    return 1;
  }
  uint64_t local_bytes = 0;
  for (const auto& [n, b] : local[0]) local_bytes += b.size();

  struct Row {
    double best = 1e30;
    uint64_t payload = 0, chunks = 0, extra_bytes = 0, touched = 0;
  };
  Row refit_row, leader_row, split_row;
  for (int rep = 0; rep < a.repeat; ++rep) {
    auto t0 = Clock::now();
    uint64_t bytes = 0, chunks = 0;
    auto report = (*enc)->Encode(1, 0, local_views(0),
                                 [&](std::span<const uint8_t> c, const ChunkHeader&) {
                                   bytes += c.size();
                                   ++chunks;
                                   return Status();
                                 });
    double t = Since(t0);
    if (!report.ok()) {
      fmt::print(stderr, "encode: {}\n", report.status().ToString());
      return 1;
    }
    (*enc)->Abort();
    refit_row.best = std::min(refit_row.best, t);
    refit_row.payload = bytes;
    refit_row.chunks = chunks;
    refit_row.extra_bytes = (*enc)->owned_bytes() + report->peak_scratch_bytes;
    refit_row.touched = (*enc)->owned_bytes() + local_bytes;  // baseline + current
  }

  // Path B: assemble canonical tensors from the TP shards, then diff.
  // `names` is the set one rank assembles.
  // The assembled tensors' buffers are allocated and touched once, outside
  // the timed region, and reused (the cheapest the baseline can be).
  std::map<std::string, std::vector<uint8_t>> full;
  auto assemble_and_diff = [&](const std::vector<std::string>& names, Row* row) -> Status {
    std::map<std::string, bool> want;
    for (const auto& n : names) want[n] = true;
    uint64_t full_bytes = 0;
    for (const auto& n : names) {
      full[n].resize(Elements(canon_by_name[n]->shape) * 2);
      full_bytes += full[n].size();
    }
    auto t0 = Clock::now();
    for (size_t k = 0; k < stage.size(); ++k) {
      for (const auto& t : l.ranks[stage[k]].tensors) {
        for (const auto& p : t.pieces) {
          if (!want.count(p.canonical)) continue;
          CopyPiece<false>(p, local[k][t.name].data(), full[p.canonical].data(), 2);
        }
      }
    }
    CountingSink sink;
    DiffOptions d;
    d.threads = a.threads;
    REFIT_ASSIGN_OR_RETURN(DiffReport r, DiffTensorsToSink(canon_views(base, names),
                                                           canon_views(full, names), d, &sink));
    (void)r;
    double t = Since(t0);
    row->best = std::min(row->best, t);
    row->payload = sink.bytes;
    row->chunks = sink.chunks;
    // The assembled tensors plus the canonical baseline of the same
    // tensors, which the assembling rank must hold to diff against.
    uint64_t base_bytes = 0;
    for (const auto& n : names) base_bytes += base.at(n).size();
    row->extra_bytes = full_bytes + base_bytes;
    row->touched = full_bytes * 2 + base_bytes;
    return Status();
  };
  // The TP ranks' split of the stage's tensors: round robin by bytes.
  std::vector<std::string> share;
  {
    std::vector<std::pair<uint64_t, std::string>> by_size;
    for (const auto& n : all_names) by_size.push_back({Elements(canon_by_name[n]->shape), n});
    std::sort(by_size.rbegin(), by_size.rend());
    std::vector<uint64_t> load(a.tp, 0);
    for (const auto& [sz, n] : by_size) {
      size_t k = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[k] += sz;
      if (k == 0) share.push_back(n);
    }
  }
  for (int rep = 0; rep < a.repeat; ++rep) {
    if (Status s = assemble_and_diff(share, &split_row); !s.ok()) {
      fmt::print(stderr, "assemble: {}\n", s.ToString());
      return 1;
    }
    if (Status s = assemble_and_diff(all_names, &leader_row); !s.ok()) {
      fmt::print(stderr, "assemble: {}\n", s.ToString());
      return 1;
    }
  }

  const double owned = static_cast<double>((*enc)->owned_bytes());
  fmt::print("rank 0 owns {:.3f} GB (its whole TP shard of stage 0; dp = 1)\n", owned / 1e9);
  fmt::print("| path | data per rank GB | best of {} s | vs refit | payload MB | chunks | extra memory GB | extra / owned |\n",
             a.repeat);
  fmt::print("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  auto line = [&](const char* name, const Row& r, double data) {
    fmt::print("| {} | {:.3f} | {:.3f} | {:.2f}x | {:.2f} | {} | {:.3f} | {:.3f} |\n", name,
               data / 1e9, r.best, r.best / refit_row.best,
               static_cast<double>(r.payload) / 1e6, r.chunks,
               static_cast<double>(r.extra_bytes) / 1e9,
               static_cast<double>(r.extra_bytes) / owned);
  };
  uint64_t share_bytes = 0;
  for (const auto& n : share) share_bytes += base.at(n).size();
  line("refit: detect + project + encode (rank 0)", refit_row, owned);
  line("assemble + diff, stage split over TP ranks (rank 0's share)", split_row,
       static_cast<double>(share_bytes));
  line("assemble + diff, whole stage on its leader", leader_row, static_cast<double>(stage_bytes));
  return 0;
}

}  // namespace
}  // namespace refit

int main(int argc, char** argv) {
  refit::Args a;
  CLI::App app{"Trainer side per rank: RankEncoder against assembling canonical tensors and "
               "diffing them, same run (docs/benchmarks.md)"};
  app.add_option("--size-gib", a.size_gib, "canonical model size")->capture_default_str();
  app.add_option("--tp", a.tp, "tensor-parallel size")->capture_default_str();
  app.add_option("--pp", a.pp, "pipeline-parallel size")->capture_default_str();
  app.add_option("--rate", a.rate, "fraction of elements changed")->capture_default_str();
  app.add_option("--threads", a.threads, "encoder threads; 0 = all cores")
      ->capture_default_str();
  app.add_option("--repeat", a.repeat, "runs of each path")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return refit::Run(a);
}
