// A DeepSeek-V3-style model (MLA, a dense first layer, routed and shared
// experts, the FP32 router bias, an MTP layer) whose checkpoint is FP8 E4M3
// with block weight_scale_inv, laid out by the generator over TP x PP x DP x
// EP: every rank encodes from its own BF16 tensors, and the union of all
// ranks' chunks takes the reference-quantized checkpoint of step A to the
// reference-quantized checkpoint of step B, bit for bit. The reference
// quantizes whole canonical tensors the DeepSeek-V3 way (weight_scale_inv
// = block amax / 448, element = e4m3(x / weight_scale_inv)).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "delta/apply.h"
#include "layout/generate.h"
#include "refit/checkpoint.h"
#include "support/test_layout.h"
#include "support/testing.h"
#include "trainer/convert.h"
#include "trainer/layout_test_steps.h"
#include "trainer/rank_encoder.h"

namespace refit::trainer {
namespace {

using layout::CanonicalTensor;
using layout::Layout;
using layout::ModelConfig;
using layout::Parallelism;
using layout::testing::TensorBytes;

constexpr char kConfig[] = R"({"model_type": "deepseek_v3", "hidden_size": 32,
    "intermediate_size": 32, "moe_intermediate_size": 16, "num_hidden_layers": 3,
    "num_attention_heads": 4, "vocab_size": 100, "q_lora_rank": 16,
    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
    "n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16" QUANT})";

std::string Config(bool fp8) {
  std::string s = kConfig;
  s.replace(s.find("QUANT"), 5,
            fp8 ? R"(, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                     "weight_block_size": [8, 8]})"
                : "");
  return s;
}

uint64_t Numel(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// Canonical tensors of the unquantized layout: BF16 values of a trained
// weight's scale (finite), F32 for the router bias.
TensorBytes RandomWeights(const Layout& l, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  TensorBytes out;
  for (const CanonicalTensor& c : l.canonical) {
    const uint64_t n = Numel(c.shape);
    std::vector<uint8_t>& b = out[c.name];
    if (c.dtype == "F32") {
      b.resize(n * 4);
      for (uint64_t i = 0; i < n; ++i) {
        float x = normal(rng);
        std::memcpy(&b[i * 4], &x, 4);
      }
      continue;
    }
    b.resize(n * 2);
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t x = Bf16FromF32(normal(rng));
      std::memcpy(&b[i * 2], &x, 2);
    }
  }
  return out;
}

// An RL step: ~3% of BF16 elements move by one to three units in the last
// place; a few by a lot (so some block amaxes, hence scales, change).
TensorBytes Step(const TensorBytes& a, std::mt19937_64& rng) {
  TensorBytes b = a;
  for (auto& [name, bytes] : b) {
    if (name.find("expert_bias") != std::string::npos ||
        name.find("e_score_correction_bias") != std::string::npos) {
      continue;  // F32: left as is
    }
    layout_test::MoveSomeElements(&bytes, &rng, 3);
  }
  return b;
}

// The checkpoint of `q` (the quantized layout) from BF16 / F32 canonical
// values, each FP8 tensor quantized whole per its blocks.
TensorBytes Reference(const Layout& q, const TensorBytes& values) {
  TensorBytes out = layout_test::Unquantized(q, values);
  for (const CanonicalTensor& c : q.canonical) {
    if (c.scale_kind.empty()) continue;
    const std::vector<uint8_t>& v = values.at(c.name);
    const uint64_t rows = c.shape[0], cols = c.shape[1];
    const uint64_t br = c.block_rows, bc = c.block_cols;
    const uint64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    std::vector<uint8_t>& w = out[c.name];
    std::vector<uint8_t>& s = out[c.scale];
    w.resize(rows * cols);
    s.resize(nbr * nbc * 4);
    for (uint64_t bi = 0; bi < nbr; ++bi) {
      for (uint64_t bj = 0; bj < nbc; ++bj) {
        float amax = 0;
        for (uint64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
          for (uint64_t k = bj * bc; k < std::min(cols, (bj + 1) * bc); ++k) {
            amax = std::max(amax, std::fabs(LoadAsF32("BF16", v.data(), r * cols + k)));
          }
        }
        const float inv = amax > 0 ? amax / 448.0f : 1.0f;
        std::memcpy(&s[(bi * nbc + bj) * 4], &inv, 4);
        for (uint64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
          for (uint64_t k = bj * bc; k < std::min(cols, (bj + 1) * bc); ++k) {
            w[r * cols + k] = E4m3FromF32(LoadAsF32("BF16", v.data(), r * cols + k) / inv);
          }
        }
      }
    }
  }
  return out;
}

TEST(Fp8BlockLayoutTest, RanksPatchTheReferenceCheckpoint) {
  auto mq = layout::ParseModelConfig(Config(true));
  auto mb = layout::ParseModelConfig(Config(false));
  ASSERT_OK(mq);
  ASSERT_OK(mb);
  struct Sizes {
    uint32_t tp, pp, dp, ep;
  };
  for (Sizes z : {Sizes{1, 1, 1, 1}, Sizes{2, 2, 2, 2}, Sizes{2, 1, 4, 4}}) {
    for (bool overwrite : {false, true}) {
      Parallelism par;
      par.tp = z.tp;
      par.pp = z.pp;
      par.dp = z.dp;
      par.ep = z.ep;
      SCOPED_TRACE("tp " + std::to_string(z.tp) + " pp " + std::to_string(z.pp) + " dp " +
                   std::to_string(z.dp) + " ep " + std::to_string(z.ep) +
                   (overwrite ? " overwrite" : " xor"));
      auto lq = layout::GenerateLayout(*mq, par);
      auto lb = layout::GenerateLayout(*mb, par);
      ASSERT_OK(lq);
      ASSERT_OK(lb);
      // Same local tensors; only the checkpoint differs.
      ASSERT_EQ(lq->ranks, lb->ranks);
      std::mt19937_64 rng(z.tp * 100 + z.dp + overwrite);
      TensorBytes a = RandomWeights(*lb, rng);
      TensorBytes b = Step(a, rng);
      auto local_a = layout::testing::ScatterToRanks(*lb, a);
      auto local_b = layout::testing::ScatterToRanks(*lb, b);
      ASSERT_OK(local_a);
      ASSERT_OK(local_b);
      const TensorBytes ref_a = Reference(*lq, a), ref_b = Reference(*lq, b);
      ASSERT_NE(ref_a, ref_b);

      RankEncoderOptions opt;
      opt.chunk_bytes = 256;
      opt.threads = 2;
      opt.residual_overwrite = overwrite;
      std::vector<std::vector<uint8_t>> chunks;
      std::vector<std::string> names;
      uint64_t owned = 0, residual = 0;
      for (size_t ri = 0; ri < lq->ranks.size(); ++ri) {
        auto enc = RankEncoder::Create(*lq, lq->ranks[ri].rank, opt);
        ASSERT_OK(enc);
        ASSERT_OK((*enc)->SetBaselineFromLocal(layout_test::RankViews(*lq, ri, (*local_a)[ri])));
        owned += (*enc)->owned_bytes();
        auto report = (*enc)->Encode(1, 0, layout_test::RankViews(*lq, ri, (*local_b)[ri]),
                                     [&](std::span<const uint8_t> c, const ChunkHeader&) {
                                       chunks.emplace_back(c.begin(), c.end());
                                       return Status();
                                     });
        ASSERT_OK(report);
        residual += report->changed_residual;
        if (names.empty()) {
          for (const auto& c : (*enc)->canonical_tensors()) names.push_back(c.name);
        }
      }
      uint64_t canon_bytes = 0;
      for (const auto& [n, bytes] : ref_a) canon_bytes += bytes.size();
      EXPECT_EQ(owned, canon_bytes);  // every element and scale owned once
      EXPECT_GT(residual, 0u);
      TensorBytes applied = ref_a;
      ASSERT_NO_FATAL_FAILURE(layout_test::ApplyAndCompare(chunks, names, &applied, ref_b));
    }
  }
}

}  // namespace
}  // namespace refit::trainer
