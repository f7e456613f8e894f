// Packed FP4 checkpoints across ranks. MXFP4: a gpt-oss-style MoE layer
// whose expert weights the checkpoint stores as `*_blocks` U8 [E, R, C/32,
// 16] and `*_scales` E8M0 [E, R, C/32] while four ranks hold them as BF16,
// split by expert, by rows, by columns on block boundaries, in transposed
// storage, and replicated (ownership cuts the replicas between blocks).
// NVFP4: ModelOpt-style linear weights (`weight` U8 [N, K/2], `weight_scale`
// E4M3 [N, K/16], `weight_scale_2` F32, `input_scale` F32 sent as is), each
// whole on one rank (its global scale is the amax of the whole tensor), one
// stored transposed, one replicated. Every rank encodes from its own
// tensors over several versions, and the union of all ranks' chunks takes
// the reference-quantized checkpoint of each step to the next bit for bit,
// scales included; the reference quantizes whole canonical rows
// (trainer/quantize_reference.h). Layouts that split a scale block between
// ranks are refused by name. The same holds for the layouts `refit layout
// generate` writes for a gpt-oss MXFP4 and a ModelOpt NVFP4 config.json
// (their BF16 twins give the ranks' tensors). Tensors whose scale is the
// amax of the whole tensor (NVFP4's global scale, a per-tensor FP8 scale)
// split across ranks: every owner is given the whole tensor's amax, and the
// union of the chunks again gives the reference checkpoint; without that
// amax the split tensor's owners refuse to encode, naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "delta/apply.h"
#include "layout/generate.h"
#include "layout/layout.h"
#include "refit/checkpoint.h"
#include "support/status_matchers.h"
#include "support/test_layout.h"
#include "support/testing.h"
#include "trainer/convert.h"
#include "trainer/layout_test_steps.h"
#include "trainer/quantize_reference.h"
#include "trainer/rank_encoder.h"

namespace refit::trainer {
namespace {

using layout::CanonicalTensor;
using layout::Layout;
using layout::Piece;
using layout::testing::TensorBytes;
using ::refit::testing::StatusIs;

constexpr char kGateUp[] = "model.layers.0.mlp.experts.gate_up_proj_blocks";
constexpr char kDown[] = "model.layers.0.mlp.experts.down_proj_blocks";
constexpr char kShared[] = "model.layers.1.mlp.experts.gate_up_proj_blocks";
constexpr char kNorm[] = "model.norm.weight";
constexpr char kNvQ[] = "model.layers.0.self_attn.q_proj.weight";
constexpr char kNvO[] = "model.layers.0.self_attn.o_proj.weight";
constexpr char kNvDown[] = "model.layers.0.mlp.down_proj.weight";
constexpr char kNvInput[] = "model.layers.0.mlp.down_proj.input_scale";
constexpr char kFp8Up[] = "model.layers.0.mlp.up_proj.weight";

std::string ScalesOf(const std::string& blocks) {
  return blocks.substr(0, blocks.size() - 7) + "_scales";
}

Piece MakePiece(const std::string& canonical, uint64_t rows, uint64_t cols,
                std::vector<uint64_t> local, std::vector<uint64_t> canon) {
  Piece p;
  p.canonical = canonical;
  p.rows = rows;
  p.cols = cols;
  p.local_offset = local[0];
  p.local_row_stride = local[1];
  p.local_col_stride = local[2];
  p.canon_offset = canon[0];
  p.canon_row_stride = canon[1];
  p.canon_col_stride = canon[2];
  return p;
}

// Logical shapes [E, R, C] of the expert weights.
struct Expert {
  const char* name;
  uint64_t e, r, c;
};
constexpr Expert kExperts[] = {{kGateUp, 2, 4, 128}, {kDown, 2, 6, 64}, {kShared, 2, 256, 256}};

// Four ranks, rank = 2 * expert + half: gate_up split by rows, down_proj by
// columns at `split` (rank 3 stores its part transposed), the second
// layer's experts and the norm replicated on every rank. `quantized`: the
// checkpoint is MXFP4, else BF16 with the same logical shapes.
Layout MakeMxfp4Layout(bool quantized, uint64_t split) {
  Layout l;
  for (const Expert& x : kExperts) {
    CanonicalTensor c;
    c.name = x.name;
    if (quantized) {
      c.dtype = "U8";
      c.shape = {x.e, x.r, x.c / 32, 16};
      c.scale = ScalesOf(x.name);
      c.scale_kind = "mxfp4";
      l.canonical.push_back(c);
      l.canonical.push_back({ScalesOf(x.name), "U8", {x.e, x.r, x.c / 32}, "", "", 0, 0});
    } else {
      c.dtype = "BF16";
      c.shape = {x.e, x.r, x.c};
      l.canonical.push_back(c);
    }
  }
  l.canonical.push_back({kNorm, "BF16", {64}, "", "", 0, 0});
  for (uint32_t rank = 0; rank < 4; ++rank) {
    const uint64_t e = rank / 2, h = rank % 2;
    layout::RankLayout rl;
    rl.rank = rank;
    rl.tensors.push_back({"experts.fc1", "BF16", {2, 128},
                          {MakePiece(kGateUp, 2, 128, {0, 128, 1}, {e * 512 + h * 256, 128, 1})}});
    const uint64_t c0 = h ? split : 0, w = h ? 64 - split : split;
    if (rank == 3) {
      rl.tensors.push_back({"experts.fc2", "BF16", {w, 6},
                            {MakePiece(kDown, w, 6, {0, 6, 1}, {e * 384 + c0, 1, 64})}});
    } else {
      rl.tensors.push_back({"experts.fc2", "BF16", {6, w},
                            {MakePiece(kDown, 6, w, {0, w, 1}, {e * 384 + c0, 64, 1})}});
    }
    rl.tensors.push_back({"layer1.experts.fc1", "BF16", {512, 256},
                          {MakePiece(kShared, 512, 256, {0, 256, 1}, {0, 256, 1})}});
    rl.tensors.push_back({"norm", "BF16", {64}, {MakePiece(kNorm, 1, 64, {0, 0, 1}, {0, 0, 1})}});
    l.ranks.push_back(rl);
  }
  return l;
}

// Three linear weights [N, K]: q_proj on rank 0, o_proj on rank 1 stored
// transposed ([K, N] locally), down_proj replicated on ranks 2 and 3 (its
// owner computes its global scale), and down_proj's input_scale, an F32
// scalar every rank holds. `split_q`: q_proj's rows split over ranks 0 and
// 1 instead, which a global scale cannot follow.
Layout MakeNvfp4Layout(bool quantized, bool split_q) {
  struct Linear {
    const char* name;
    uint64_t n, k;
  };
  constexpr Linear kLinears[] = {{kNvQ, 32, 64}, {kNvO, 16, 32}, {kNvDown, 24, 48}};
  Layout l;
  for (const Linear& x : kLinears) {
    const std::string scale = std::string(x.name) + "_scale";
    if (quantized) {
      l.canonical.push_back({x.name, "U8", {x.n, x.k / 2}, scale, "nvfp4", 0, 0});
      l.canonical.push_back({scale, "F8_E4M3", {x.n, x.k / 16}, "", "", 0, 0});
      l.canonical.push_back({scale + "_2", "F32", {}, "", "", 0, 0});
    } else {
      l.canonical.push_back({x.name, "BF16", {x.n, x.k}, "", "", 0, 0});
    }
  }
  l.canonical.push_back({kNvInput, "F32", {}, "", "", 0, 0});
  for (uint32_t rank = 0; rank < 4; ++rank) {
    layout::RankLayout rl;
    rl.rank = rank;
    if (split_q && rank < 2) {
      rl.tensors.push_back({"q", "BF16", {16, 64},
                            {MakePiece(kNvQ, 16, 64, {0, 64, 1}, {rank * 1024, 64, 1})}});
    } else if (rank == 0) {
      rl.tensors.push_back(
          {"q", "BF16", {32, 64}, {MakePiece(kNvQ, 32, 64, {0, 64, 1}, {0, 64, 1})}});
    }
    if (rank == 1) {
      rl.tensors.push_back(
          {"o", "BF16", {32, 16}, {MakePiece(kNvO, 32, 16, {0, 16, 1}, {0, 1, 32})}});
    }
    if (rank >= 2) {
      rl.tensors.push_back(
          {"down", "BF16", {24, 48}, {MakePiece(kNvDown, 24, 48, {0, 48, 1}, {0, 48, 1})}});
    }
    rl.tensors.push_back(
        {"input_scale", "F32", {}, {MakePiece(kNvInput, 1, 1, {0, 0, 1}, {0, 0, 1})}});
    l.ranks.push_back(rl);
  }
  return l;
}

// Both [32, 64] (logical) and split four ways: an FP8 E4M3 tensor with a
// per-tensor scale (kFp8Up) and an NVFP4 tensor (kNvQ), each by rows (8 a
// rank) or by columns (16 a rank: whole NVFP4 blocks; rank 3 stores its
// columns transposed). Their scales are the amax of the whole tensor, which
// no rank holds.
Layout MakeSplitLayout(bool quantized, bool by_columns) {
  Layout l;
  for (const std::string name : {kFp8Up, kNvQ}) {
    const std::string scale = name + "_scale";
    if (!quantized) {
      l.canonical.push_back({name, "BF16", {32, 64}, "", "", 0, 0});
    } else if (name == kNvQ) {
      l.canonical.push_back({name, "U8", {32, 32}, scale, "nvfp4", 0, 0});
      l.canonical.push_back({scale, "F8_E4M3", {32, 4}, "", "", 0, 0});
      l.canonical.push_back({scale + "_2", "F32", {}, "", "", 0, 0});
    } else {
      l.canonical.push_back({name, "F8_E4M3", {32, 64}, scale, "per_tensor", 0, 0});
      l.canonical.push_back({scale, "F32", {}, "", "", 0, 0});
    }
  }
  for (uint32_t rank = 0; rank < 4; ++rank) {
    layout::RankLayout rl;
    rl.rank = rank;
    for (const std::string name : {kFp8Up, kNvQ}) {
      const std::string local = name == kNvQ ? "q" : "up";
      if (!by_columns) {
        rl.tensors.push_back(
            {local, "BF16", {8, 64}, {MakePiece(name, 8, 64, {0, 64, 1}, {rank * 512, 64, 1})}});
      } else if (rank == 3) {
        rl.tensors.push_back(
            {local, "BF16", {16, 32}, {MakePiece(name, 16, 32, {0, 32, 1}, {48, 1, 64})}});
      } else {
        rl.tensors.push_back({local, "BF16", {32, 16},
                              {MakePiece(name, 32, 16, {0, 16, 1}, {rank * 16, 64, 1})}});
      }
    }
    l.ranks.push_back(rl);
  }
  return l;
}

uint16_t Bf16Bits(const std::vector<uint8_t>& b, size_t i) {
  uint16_t x;
  std::memcpy(&x, &b[i * 2], 2);
  return x;
}

// The largest magnitude of BF16 values `v`.
float Amax(const std::vector<uint8_t>& v) {
  float amax = 0;
  for (size_t i = 0; i < v.size() / 2; ++i) {
    amax = std::max(amax, std::fabs(F32FromBf16(Bf16Bits(v, i))));
  }
  return amax;
}

// What the trainer would all-reduce: the whole amax of every quantized
// tensor of `q` whose scale is the amax of the whole tensor.
GlobalAmax WholeAmaxes(const Layout& q, const TensorBytes& values) {
  GlobalAmax out;
  for (const CanonicalTensor& c : q.canonical) {
    if (c.scale_kind == "per_tensor" || c.scale_kind == "nvfp4") {
      out[c.name] = Amax(values.at(c.name));
    }
  }
  return out;
}

// BF16 values of trained weights, with all-zero blocks (scale byte 0) and
// an outlier now and then (a larger scale).
TensorBytes RandomValues(const Layout& l, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  TensorBytes out;
  for (const CanonicalTensor& c : l.canonical) {
    uint64_t n = 1;
    for (uint64_t d : c.shape) n *= d;
    std::vector<uint8_t>& b = out[c.name];
    if (c.dtype == "F32") {  // an input_scale
      const float x = 0.5f + std::fabs(normal(rng));
      b.resize(4);
      std::memcpy(b.data(), &x, 4);
      continue;
    }
    b.resize(n * 2);
    for (uint64_t i = 0; i < n; ++i) {
      float x = (i / 32) % 7 == 3 ? 0.0f : normal(rng);
      if (rng() % 500 == 0) x *= 40.0f;
      const uint16_t v = Bf16FromF32(x);
      std::memcpy(&b[i * 2], &v, 2);
    }
  }
  return out;
}

// An RL step: ~3% of the elements move by a unit or two in the last
// place; one in a thousand doubles or halves; one element per tensor
// triples (its block's scale moves) and the largest grows by a quarter
// (NVFP4's global scale moves).
TensorBytes Step(const TensorBytes& a, std::mt19937_64& rng) {
  TensorBytes b = a;
  for (auto& [name, bytes] : b) {
    layout_test::MoveSomeElements(&bytes, &rng, 2);
    if (bytes.size() <= 4) continue;  // an F32 scalar
    const size_t i = rng() % (bytes.size() / 2);
    const uint16_t x = Bf16FromF32(3.0f * F32FromBf16(Bf16Bits(bytes, i)));
    std::memcpy(&bytes[i * 2], &x, 2);
    auto magnitude = [&](size_t k) { return std::fabs(F32FromBf16(Bf16Bits(bytes, k))); };
    size_t top = 0;
    for (size_t k = 0; k < bytes.size() / 2; ++k) {
      if (magnitude(k) > magnitude(top)) top = k;
    }
    const uint16_t y = Bf16FromF32(1.25f * F32FromBf16(Bf16Bits(bytes, top)));
    std::memcpy(&bytes[top * 2], &y, 2);
  }
  return b;
}

// Packed tensor `c` of the checkpoint from its BF16 logical values `v`, one
// logical row at a time, with its scales; an NVFP4 tensor's global scale
// from its whole amax, as ModelOpt computes it.
void QuantizeTensor(const CanonicalTensor& c, const std::vector<uint8_t>& v, TensorBytes* out) {
  const uint64_t cols = layout::LogicalShape(c).back(), n = v.size() / 2;
  const float amax = Amax(v);
  const float global = amax == 0 ? 1.0f : amax / (6.0f * 448.0f);
  if (c.scale_kind == "nvfp4") {
    (*out)[c.scale + "_2"].resize(4);
    std::memcpy((*out)[c.scale + "_2"].data(), &global, 4);
  }
  std::vector<uint8_t>& packed = (*out)[c.name];
  std::vector<uint8_t>& scales = (*out)[c.scale];
  for (uint64_t row = 0; row < n / cols; ++row) {
    std::vector<float> x(cols);
    for (uint64_t i = 0; i < cols; ++i) x[i] = F32FromBf16(Bf16Bits(v, row * cols + i));
    if (c.scale_kind == "mxfp4") {
      reference::RefMxfp4(x, &packed, &scales);
    } else {
      reference::RefNvfp4(x, global, &packed, &scales);
    }
  }
}

// FP8 E4M3 tensor `c` with a per-tensor scale from its BF16 values `v`,
// the reference cast: scale = amax / 448 (1 when all zero), e4m3(x / scale).
void QuantizePerTensor(const CanonicalTensor& c, const std::vector<uint8_t>& v,
                       TensorBytes* out) {
  const float amax = Amax(v);
  const float scale = amax > 0 ? amax / 448.0f : 1.0f;
  (*out)[c.scale].resize(4);
  std::memcpy((*out)[c.scale].data(), &scale, 4);
  std::vector<uint8_t>& q = (*out)[c.name];
  q.resize(v.size() / 2);
  for (size_t i = 0; i < q.size(); ++i) q[i] = E4m3FromF32(F32FromBf16(Bf16Bits(v, i)) / scale);
}

// The checkpoint of layout `q` from BF16 canonical `values`.
TensorBytes Reference(const Layout& q, const TensorBytes& values) {
  TensorBytes out = layout_test::Unquantized(q, values);
  for (const CanonicalTensor& c : q.canonical) {
    if (layout::PackedBlock(c) != 0) QuantizeTensor(c, values.at(c.name), &out);
    if (c.scale_kind == "per_tensor") QuantizePerTensor(c, values.at(c.name), &out);
  }
  return out;
}

// Encodes versions 1..3 of random steps on every rank of `lq` (the packed
// checkpoint; `lb` is its BF16 twin, same ranks) and checks that the
// chunks patch the reference checkpoint of each step into the next, and
// that some scale changes at every step. Every rank is given the whole
// amax of each tensor (WholeAmaxes); `split` are the tensors some rank
// owns only part of, which need it.
void CheckVersions(const Layout& lq, const Layout& lb, const std::set<std::string>& split = {}) {
  ASSERT_OK(layout::ValidateLayout(lq));
  ASSERT_EQ(lq.ranks, lb.ranks);
  for (bool overwrite : {false, true}) {
    SCOPED_TRACE(overwrite ? "overwrite" : "xor");
    std::mt19937_64 rng(overwrite ? 7 : 3);
    std::vector<TensorBytes> steps = {RandomValues(lb, rng)};
    for (int v = 1; v <= 3; ++v) steps.push_back(Step(steps.back(), rng));

    RankEncoderOptions opt;
    opt.chunk_bytes = 40;  // parts of rows: whole blocks of 16 bytes
    opt.threads = 2;
    opt.residual_overwrite = overwrite;
    std::vector<std::unique_ptr<RankEncoder>> encoders;
    std::set<std::string> need_amax;
    uint64_t owned = 0;
    for (size_t ri = 0; ri < lq.ranks.size(); ++ri) {
      auto enc = RankEncoder::Create(lq, lq.ranks[ri].rank, opt);
      ASSERT_OK(enc);
      for (const RankJob& j : (*enc)->jobs()) {
        const CanonicalTensor& c = (*enc)->canonical_tensors()[j.tensor_id];
        if (layout::PackedBlock(c) != 0) {  // converted, a byte an element
          EXPECT_FALSE(j.in_place) << c.name;
          EXPECT_EQ(j.width, 1) << c.name;
        }
      }
      auto local = layout::testing::ScatterToRanks(lb, steps[0]);
      ASSERT_OK(local);
      ASSERT_OK((*enc)->SetBaselineFromLocal(layout_test::RankViews(lq, ri, (*local)[ri]),
                                             WholeAmaxes(lq, steps[0])));
      for (const std::string& name : (*enc)->global_amax_tensors()) need_amax.insert(name);
      owned += (*enc)->owned_bytes();
      encoders.push_back(std::move(*enc));
    }
    EXPECT_EQ(need_amax, split);
    TensorBytes applied = Reference(lq, steps[0]);
    uint64_t canon_bytes = 0;
    for (const auto& [n, bytes] : applied) canon_bytes += bytes.size();
    EXPECT_EQ(owned, canon_bytes);  // every byte and scale owned once

    for (uint64_t v = 1; v < steps.size(); ++v) {
      SCOPED_TRACE("version " + std::to_string(v));
      const TensorBytes want = Reference(lq, steps[v]);
      bool scale_moved = false;
      for (const CanonicalTensor& c : lq.canonical) {
        if (!c.scale.empty()) scale_moved |= want.at(c.scale) != applied.at(c.scale);
        const std::string global = layout::GlobalScaleName(c);
        if (!global.empty()) {
          EXPECT_NE(want.at(global), applied.at(global)) << global;
        }
      }
      ASSERT_TRUE(scale_moved);
      auto local = layout::testing::ScatterToRanks(lb, steps[v]);
      ASSERT_OK(local);
      std::vector<std::vector<uint8_t>> chunks;
      uint64_t residual = 0;
      const GlobalAmax amax = WholeAmaxes(lq, steps[v]);
      for (size_t ri = 0; ri < encoders.size(); ++ri) {
        auto report = encoders[ri]->Encode(v, v - 1, layout_test::RankViews(lq, ri, (*local)[ri]),
                                           [&](std::span<const uint8_t> c, const ChunkHeader&) {
                                             chunks.emplace_back(c.begin(), c.end());
                                             return Status();
                                           },
                                           amax);
        ASSERT_OK(report);
        residual += report->changed_residual;
        ASSERT_OK(encoders[ri]->Commit());
      }
      EXPECT_GT(residual, 0u);
      std::vector<std::string> names;
      for (const CanonicalTensor& c : encoders[0]->canonical_tensors()) names.push_back(c.name);
      ASSERT_NO_FATAL_FAILURE(layout_test::ApplyAndCompare(chunks, names, &applied, want));
    }
  }
}

TEST(Fp4LayoutTest, RanksPatchTheReferenceMxfp4CheckpointEveryVersion) {
  CheckVersions(MakeMxfp4Layout(true, 32), MakeMxfp4Layout(false, 32));
}

TEST(Fp4LayoutTest, RanksPatchTheReferenceNvfp4CheckpointEveryVersion) {
  CheckVersions(MakeNvfp4Layout(true, false), MakeNvfp4Layout(false, false));
}

// The tensors of `l` whose scale is the amax of the whole tensor and that
// no rank maps whole.
std::set<std::string> SplitAcrossRanks(const Layout& l) {
  std::set<std::string> out;
  for (const CanonicalTensor& c : l.canonical) {
    if (c.scale_kind != "per_tensor" && c.scale_kind != "nvfp4") continue;
    uint64_t n = 1;
    for (uint64_t d : layout::LogicalShape(c)) n *= d;
    bool whole = false;
    for (const layout::RankLayout& r : l.ranks) {
      uint64_t mapped = 0;
      for (const layout::LocalTensor& t : r.tensors) {
        for (const Piece& p : t.pieces) mapped += p.canonical == c.name ? p.rows * p.cols : 0;
      }
      whole |= mapped == n;
    }
    if (!whole) out.insert(c.name);
  }
  return out;
}

// The layout generated from `config` over PP 2 x DP 2 x EP 2 and tp, with
// `interleaved` gate/up (groups of 1), plain and transposed, against its
// BF16 twin.
void CheckGenerated(const std::string& config, uint32_t tp, bool interleaved) {
  auto m = layout::ParseModelConfig(config);
  ASSERT_OK(m);
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "transposed" : "plain");
    layout::Parallelism par;
    par.tp = tp;
    par.pp = par.dp = par.ep = 2;
    if (interleaved) {
      par.gate_up = layout::GateUp::kInterleaved;
      par.gate_up_group = 1;
    }
    par.transposed = transposed;
    auto lq = layout::GenerateLayout(*m, par);
    ASSERT_OK(lq);
    uint64_t packed = 0, nvfp4 = 0;
    for (const CanonicalTensor& c : lq->canonical) {
      packed += layout::PackedBlock(c) != 0;
      nvfp4 += c.scale_kind == "nvfp4";
    }
    ASSERT_GT(packed, 0u);
    // TP splits every NVFP4 tensor in two.
    const std::set<std::string> split = SplitAcrossRanks(*lq);
    EXPECT_EQ(split.size(), tp > 1 ? nvfp4 : 0u);
    CheckVersions(*lq, layout::testing::UnpackedTwin(*lq), split);
  }
}

// gpt-oss with MXFP4 experts in layer 0 (layer 1's listed in
// modules_to_not_convert stay BF16): TP 2 splits I = 64 between its two
// blocks, experts over EP, layers over PP.
TEST(Fp4LayoutTest, GeneratedGptOssMxfp4LayoutPatchesTheReferenceCheckpoint) {
  CheckGenerated(layout::testing::SmallGptOssMxfp4Config(64), 2, true);
}

// Qwen3-MoE in ModelOpt NVFP4 (a dense layer 0, experts in layer 1, layer
// 1's attention and lm_head excluded): without TP, each NVFP4 tensor is
// whole on its ranks and replicated over DP (transposed, its fused QKV maps
// each NVFP4 weight with one piece per query group).
TEST(Fp4LayoutTest, GeneratedNvfp4LayoutPatchesTheReferenceCheckpoint) {
  CheckGenerated(layout::testing::SmallQwen3MoeNvfp4Config(), 1, false);
}

// The same over TP 2: every NVFP4 weight of layer 0 and every expert's is
// split between two ranks along whole blocks, its global scale from the
// amax the ranks are given.
TEST(Fp4LayoutTest, GeneratedTensorParallelNvfp4LayoutPatchesTheReferenceCheckpoint) {
  CheckGenerated(layout::testing::SmallQwen3MoeNvfp4Config(), 2, false);
}

// The same with ModelOpt's FP8 KV cache: each layer's k and v scale (F32
// scalars) is replicated on the TP ranks of its stage, owned by one, and
// patched like any tensor.
TEST(Fp4LayoutTest, GeneratedNvfp4LayoutWithFp8KvCacheScalesPatchesTheReferenceCheckpoint) {
  std::string config = layout::testing::SmallQwen3MoeNvfp4Config();
  const std::string null_kv = "\"kv_cache_quant_algo\": null";
  const size_t at = config.find(null_kv);
  ASSERT_NE(at, std::string::npos);
  config.replace(at, null_kv.size(), "\"kv_cache_quant_algo\": \"FP8\"");
  CheckGenerated(config, 2, false);
}

TEST(Fp4LayoutTest, ASplitScaleBlockIsRefusedByName) {
  // down_proj split at column 16: ranks 0 and 1 would share block 0 of
  // every row of expert 0.
  const Layout lq = MakeMxfp4Layout(true, 16);
  ASSERT_OK(layout::ValidateLayout(lq));
  auto enc = RankEncoder::Create(lq, 0, RankEncoderOptions{});
  ASSERT_FALSE(enc.ok());
  const std::string msg = enc.status().ToString();
  EXPECT_NE(msg.find(kDown), std::string::npos) << msg;
  EXPECT_NE(msg.find("scale block 0 "), std::string::npos) << msg;
  // The other half of the block, from the other side.
  auto other = RankEncoder::Create(lq, 1, RankEncoderOptions{});
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().ToString().find("scale block 0 "), std::string::npos);
}

// q_proj's rows split over ranks 0 and 1: its global scale comes from the
// amax the ranks are given.
TEST(Fp4LayoutTest, AnNvfp4TensorSplitBetweenTwoRanksPatchesTheReferenceCheckpoint) {
  CheckVersions(MakeNvfp4Layout(true, true), MakeNvfp4Layout(false, true), {kNvQ});
}

// Four ranks own a quarter each of a per-tensor FP8 tensor and of an
// NVFP4 tensor, by rows and by columns (one rank transposed).
TEST(Fp4LayoutTest, TensorsSplitFourWaysPatchTheReferenceCheckpointGivenTheirAmax) {
  for (bool by_columns : {false, true}) {
    SCOPED_TRACE(by_columns ? "by columns" : "by rows");
    CheckVersions(MakeSplitLayout(true, by_columns), MakeSplitLayout(false, by_columns),
                  {kFp8Up, kNvQ});
  }
}

TEST(Fp4LayoutTest, ASplitTensorWithoutItsAmaxIsRefusedByName) {
  const Layout lq = MakeSplitLayout(true, false), lb = MakeSplitLayout(false, false);
  std::mt19937_64 rng(5);
  const TensorBytes values = RandomValues(lb, rng);
  auto local = layout::testing::ScatterToRanks(lb, values);
  ASSERT_OK(local);
  for (uint32_t rank = 0; rank < 4; ++rank) {
    auto enc = RankEncoder::Create(lq, rank, RankEncoderOptions{});
    ASSERT_OK(enc);
    const std::vector<TensorView> views = layout_test::RankViews(lq, rank, (*local)[rank]);
    GlobalAmax amax = WholeAmaxes(lq, values);
    // Without kFp8Up's amax (then kNvQ's): refused, naming the tensor and
    // its scale.
    for (const char* missing : {kFp8Up, kNvQ}) {
      GlobalAmax partial = amax;
      partial.erase(missing);
      const Status st = (*enc)->SetBaselineFromLocal(views, partial);
      EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
      const std::string msg = st.ToString();
      EXPECT_NE(msg.find(std::string("'") + missing + "' is split across ranks (rank " +
                         std::to_string(rank) + " owns 512 of its 2048 elements)"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find(std::string(missing) + (std::string(missing) == kNvQ ? "_scale_2'" : "_scale'")),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("must pass the tensor's global amax"), std::string::npos) << msg;
    }
    // An amax below the rank's own elements' cannot be the whole tensor's.
    GlobalAmax low = amax;
    low[kNvQ] = 0;
    EXPECT_THAT((*enc)->SetBaselineFromLocal(views, low), StatusIs(StatusCode::kInvalidArgument));
    ASSERT_OK((*enc)->SetBaselineFromLocal(views, amax));
    auto ignore = [](std::span<const uint8_t>, const ChunkHeader&) { return Status(); };
    EXPECT_THAT((*enc)->Encode(1, 0, views, ignore), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_EQ((*enc)->pending_chunks(), 0u);
    ASSERT_OK((*enc)->Encode(1, 0, views, ignore, amax));
  }
}

}  // namespace
}  // namespace refit::trainer
