// Generated layouts of the frontier architectures from their published
// config.json files (DeepSeek-V3, Kimi-K2, gpt-oss with its MXFP4 experts,
// Qwen3-MoE, Llama 3, ModelOpt NVFP4 checkpoints): the canonical tensor set
// against the published checkpoints' tensor lists, coverage at the real
// parallel sizes, scaled-down models scattered to ranks and assembled back
// (packed FP4 ones through their BF16 twins), and refusal of architectures,
// config fields and splits the generator does not model.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "layout/generate.h"
#include "layout/layout.h"
#include "refit/checkpoint.h"
#include "support/frontier_configs.h"
#include "support/test_layout.h"
#include "support/testing.h"

namespace refit::layout {
namespace {

using testing::AssembleCanonical;
using testing::GptOss120bConfig;
using testing::kDeepSeekV3;
using testing::kKimiK2;
using testing::Replace;
using testing::kModelOptNvfp4Quant;
using testing::ScatterToRanks;
using testing::SmallGptOssMxfp4Config;
using testing::SmallQwen3MoeNvfp4Config;
using testing::TensorBytes;
using testing::UnpackedTwin;

// Qwen/Qwen3-30B-A3B config.json.
constexpr char kQwen3Moe[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "decoder_sparse_step": 1, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
  "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
  "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

// meta-llama/Llama-3.1-8B config.json.
constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 128256})";

ModelConfig Parse(const std::string& json) {
  Result<ModelConfig> m = ParseModelConfig(json);
  EXPECT_OK(m);
  return m.ok() ? *m : ModelConfig{};
}

std::map<std::string, const CanonicalTensor*> ByName(const Layout& l) {
  std::map<std::string, const CanonicalTensor*> out;
  for (const CanonicalTensor& c : l.canonical) out[c.name] = &c;
  return out;
}

// Expects canonical tensor `name` with `dtype` and `shape`.
void ExpectTensor(const std::map<std::string, const CanonicalTensor*>& by,
                  const std::string& name, const std::string& dtype,
                  std::vector<uint64_t> shape) {
  auto it = by.find(name);
  ASSERT_NE(it, by.end()) << name;
  EXPECT_EQ(it->second->dtype, dtype) << name;
  EXPECT_EQ(it->second->shape, shape) << name;
}

// Generates, validates, assigns ownership and proves coverage; returns the
// layout and the seconds that took.
Layout Covered(const ModelConfig& m, const Parallelism& p, double* seconds = nullptr) {
  auto t0 = std::chrono::steady_clock::now();
  Result<Layout> l = GenerateLayout(m, p);
  EXPECT_OK(l);
  if (!l.ok()) return {};
  EXPECT_EQ(l->ranks.size(), uint64_t{p.tp} * p.pp * p.dp * p.cp);
  Result<Ownership> o = AssignOwnership(*l);  // validates first
  EXPECT_OK(o);
  if (!o.ok()) return {};
  EXPECT_OK(CheckCoverage(*l, *o));
  if (seconds) {
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return *std::move(l);
}

// Expects GenerateLayout(m, p) to fail with kInvalidArgument, its message
// holding each of `says`.
void ExpectRefused(const ModelConfig& m, const Parallelism& p,
                   const std::vector<std::string>& says) {
  Result<Layout> l = GenerateLayout(m, p);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  for (const std::string& s : says) {
    EXPECT_NE(l.status().message().find(s), std::string_view::npos) << l.status().ToString();
  }
}

// Random canonical bytes of every non-derived tensor, at its dtype's width.
TensorBytes RandomBytes(const Layout& l, uint64_t seed) {
  std::mt19937_64 rng(seed);
  DTypeRegistry dtypes;
  TensorBytes out;
  for (const CanonicalTensor& c : l.canonical) {
    uint64_t n = static_cast<uint64_t>(*dtypes.ElementWidth(c.dtype));
    for (uint64_t d : c.shape) n *= d;
    std::vector<uint8_t>& b = out[c.name];
    b.resize(n);
    for (size_t i = 0; i < n; i += 8) {
      uint64_t x = rng();
      std::memcpy(&b[i], &x, std::min<size_t>(8, n - i));
    }
  }
  return out;
}

// Scatters random canonical bytes to the ranks and assembles them back.
void RoundTrip(const Layout& l, uint64_t seed) {
  TensorBytes canon = RandomBytes(l, seed);
  Result<std::vector<TensorBytes>> local = ScatterToRanks(l, canon);
  ASSERT_OK(local);
  Result<TensorBytes> again = AssembleCanonical(l, *local);
  ASSERT_OK(again);
  EXPECT_TRUE(*again == canon);
  Result<Layout> back = ParseLayout(LayoutToJson(l));
  ASSERT_OK(back);
  EXPECT_TRUE(*back == l);
}

uint64_t Count(const Layout& l, const std::string& needle) {
  return static_cast<uint64_t>(std::count_if(
      l.canonical.begin(), l.canonical.end(),
      [&](const CanonicalTensor& c) { return c.name.find(needle) != std::string::npos; }));
}

TEST(Frontier, DeepSeekV3MatchesThePublishedCheckpoint) {
  ModelConfig m = Parse(kDeepSeekV3);
  EXPECT_TRUE(m.mla);
  EXPECT_EQ(m.num_experts, 256u);
  EXPECT_EQ(m.num_nextn_predict_layers, 1u);
  EXPECT_EQ(m.fp8_block_rows, 128u);
  EXPECT_EQ(m.dense_layers, (std::vector<uint64_t>{0, 1, 2}));
  Result<Layout> l = GenerateLayout(m, Parallelism{});
  ASSERT_OK(l);
  // The published checkpoint's 163 files hold 91,991 tensors: 3 dense
  // layers, 58 MoE layers and the MTP layer 61 (a MoE layer with its
  // embedding, enorm, hnorm, eh_proj and shared head), FP8 linear weights
  // with FP32 weight_scale_inv.
  EXPECT_EQ(l->canonical.size(), 91991u);
  EXPECT_EQ(Count(*l, "weight_scale_inv"), 45808u);  // 62 x 5 + 3 x 3 + 59 x 771
  auto by = ByName(*l);
  const std::string p = "model.layers.5.", mtp = "model.layers.61.";
  ExpectTensor(by, p + "self_attn.q_a_proj.weight", "F8_E4M3", {1536, 7168});
  ExpectTensor(by, p + "self_attn.q_a_proj.weight_scale_inv", "F32", {12, 56});
  ExpectTensor(by, p + "self_attn.q_a_layernorm.weight", "BF16", {1536});
  ExpectTensor(by, p + "self_attn.q_b_proj.weight", "F8_E4M3", {24576, 1536});
  ExpectTensor(by, p + "self_attn.q_b_proj.weight_scale_inv", "F32", {192, 12});
  ExpectTensor(by, p + "self_attn.kv_a_proj_with_mqa.weight", "F8_E4M3", {576, 7168});
  ExpectTensor(by, p + "self_attn.kv_a_proj_with_mqa.weight_scale_inv", "F32", {5, 56});
  ExpectTensor(by, p + "self_attn.kv_a_layernorm.weight", "BF16", {512});
  ExpectTensor(by, p + "self_attn.kv_b_proj.weight", "F8_E4M3", {32768, 512});
  ExpectTensor(by, p + "self_attn.kv_b_proj.weight_scale_inv", "F32", {256, 4});
  ExpectTensor(by, p + "self_attn.o_proj.weight", "F8_E4M3", {7168, 16384});
  ExpectTensor(by, p + "self_attn.o_proj.weight_scale_inv", "F32", {56, 128});
  ExpectTensor(by, p + "mlp.gate.weight", "BF16", {256, 7168});
  ExpectTensor(by, p + "mlp.gate.e_score_correction_bias", "F32", {256});
  ExpectTensor(by, p + "mlp.experts.255.down_proj.weight", "F8_E4M3", {7168, 2048});
  ExpectTensor(by, p + "mlp.experts.255.down_proj.weight_scale_inv", "F32", {56, 16});
  ExpectTensor(by, p + "mlp.shared_experts.gate_proj.weight", "F8_E4M3", {2048, 7168});
  ExpectTensor(by, "model.layers.2.mlp.down_proj.weight", "F8_E4M3", {7168, 18432});
  ExpectTensor(by, "model.layers.2.mlp.down_proj.weight_scale_inv", "F32", {56, 144});
  EXPECT_EQ(by.count("model.layers.2.mlp.gate.weight"), 0u);
  EXPECT_EQ(by.count("model.layers.3.mlp.gate_proj.weight"), 0u);
  ExpectTensor(by, mtp + "mlp.experts.0.up_proj.weight", "F8_E4M3", {2048, 7168});
  ExpectTensor(by, mtp + "eh_proj.weight", "BF16", {7168, 14336});
  ExpectTensor(by, mtp + "embed_tokens.weight", "BF16", {129280, 7168});
  ExpectTensor(by, mtp + "enorm.weight", "BF16", {7168});
  ExpectTensor(by, mtp + "hnorm.weight", "BF16", {7168});
  ExpectTensor(by, mtp + "shared_head.head.weight", "BF16", {129280, 7168});
  ExpectTensor(by, mtp + "shared_head.norm.weight", "BF16", {7168});
  EXPECT_EQ(by.count("model.layers.62.input_layernorm.weight"), 0u);
  const CanonicalTensor* q = by.at(p + "self_attn.q_b_proj.weight");
  EXPECT_EQ(q->scale, p + "self_attn.q_b_proj.weight_scale_inv");
  EXPECT_EQ(q->scale_kind, "per_block");
  EXPECT_EQ(q->block_rows, 128u);
  EXPECT_EQ(q->block_cols, 128u);
  // Without quantization_config: the BF16 checkpoint, no scales.
  ModelConfig bf16 = m;
  bf16.fp8_block_rows = bf16.fp8_block_cols = 0;
  l = GenerateLayout(bf16, Parallelism{});
  ASSERT_OK(l);
  EXPECT_EQ(l->canonical.size(), 91991u - 45808u);
}

TEST(Frontier, DeepSeekV3CoveredAtPp16Dp64Ep64) {
  Parallelism p;
  p.pp = 16;
  p.dp = 64;
  p.ep = 64;
  double seconds = 0;
  Layout l = Covered(Parse(kDeepSeekV3), p, &seconds);
  ASSERT_EQ(l.ranks.size(), 1024u);
  // Stage 15 holds layers 58-60 (61 layers over 16 stages: the first 13
  // get 4) and the MTP layer; 4 of the 256 experts per layer on each
  // expert-parallel rank.
  const RankLayout& last = l.ranks.back();
  uint64_t experts = 0;
  bool mtp = false;
  for (const LocalTensor& t : last.tensors) {
    experts += t.name.find("linear_fc2") != std::string::npos &&
               t.name.find("local_experts") != std::string::npos;
    mtp |= t.name == "mtp.layers.0.eh_proj.weight";
  }
  EXPECT_EQ(experts, 4u * 4u);
  EXPECT_TRUE(mtp);
  std::printf("DeepSeek-V3 PP16 x DP64 x EP64: generate + own + cover %.1f s\n", seconds);
}

TEST(Frontier, KimiK2CoveredAtTp2Pp16Dp32Ep32) {
  ModelConfig m = Parse(kKimiK2);
  EXPECT_EQ(m.num_experts, 384u);
  EXPECT_EQ(m.dense_layers, (std::vector<uint64_t>{0}));
  Result<Layout> full = GenerateLayout(m, Parallelism{});
  ASSERT_OK(full);
  // 60 MoE layers x 384 experts x 3 projections: 69,120 expert weights,
  // each with its weight_scale_inv; 61 layers, no MTP.
  EXPECT_EQ(Count(*full, ".experts."), 2u * 69120u);
  EXPECT_EQ(full->canonical.size(), 3u + 20u + 60u * (14u + 2u + 384u * 6u + 6u));
  Parallelism p;
  p.tp = 2;
  p.pp = 16;
  p.dp = 32;
  p.ep = 32;
  double seconds = 0;
  Layout l = Covered(m, p, &seconds);
  EXPECT_EQ(l.ranks.size(), 1024u);
  std::printf("Kimi-K2 TP2 x PP16 x DP32 x EP32: generate + own + cover %.1f s\n", seconds);
}

// A DeepSeek-style model small enough to move bytes: MLA with and without
// q_lora_rank, a dense first layer, routed and shared experts, the router
// bias in FP32, an MTP layer; TP x PP x EP x DP, transposed storage.
TEST(Frontier, SmallMlaModelsRoundTrip) {
  for (uint64_t qlr : {24u, 0u}) {
    for (bool transposed : {false, true}) {
      ModelConfig m = Parse(R"({"model_type": "deepseek_v3", "hidden_size": 64,
          "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 300,
          "q_lora_rank": )" + std::to_string(qlr) + R"(, "kv_lora_rank": 16,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
          "n_routed_experts": 4, "n_shared_experts": 2, "first_k_dense_replace": 1,
          "num_nextn_predict_layers": 1, "topk_method": "noaux_tc"})");
      for (auto [tp, pp, ep, dp] : {std::array<uint32_t, 4>{1, 1, 1, 1},
                                    std::array<uint32_t, 4>{2, 2, 2, 2},
                                    std::array<uint32_t, 4>{3, 3, 4, 4}}) {
        Parallelism p;
        p.tp = tp;
        p.pp = pp;
        p.ep = ep;
        p.dp = dp;
        p.transposed = transposed;
        SCOPED_TRACE("q_lora_rank " + std::to_string(qlr) + " tp " + std::to_string(tp) +
                     " pp " + std::to_string(pp) + (transposed ? " transposed" : ""));
        Layout l = Covered(m, p);
        ASSERT_FALSE(HasFailure());
        RoundTrip(l, 7 * tp + qlr);
        ASSERT_FALSE(HasFailure());
        auto by = ByName(l);
        EXPECT_EQ(by.count("model.layers.3.shared_head.head.weight"), 1u);
        EXPECT_EQ(by.count("model.layers.0.mlp.gate_proj.weight"), 1u);
        EXPECT_EQ(by.count("model.layers.1.mlp.experts.3.down_proj.weight"), 1u);
        EXPECT_EQ(by.count("model.layers.1.self_attn.q_a_proj.weight"), qlr ? 1u : 0u);
        EXPECT_EQ(by.count("model.layers.1.self_attn.q_proj.weight"), qlr ? 0u : 1u);
        ExpectTensor(by, "model.layers.2.mlp.shared_experts.up_proj.weight", "BF16",
                     {64, 64});
        ExpectTensor(by, "model.layers.2.mlp.gate.e_score_correction_bias", "F32", {4});
      }
    }
  }
}

// An FP8 block-quantized small MLA model: the blocks of every tensor split
// over TP fall on block boundaries here, so every rank owns whole blocks.
TEST(Frontier, SmallFp8MlaModelCovered) {
  ModelConfig m = Parse(R"({"model_type": "kimi_k2", "hidden_size": 128,
      "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 300, "q_lora_rank": 64,
      "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
      "v_head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1,
      "first_k_dense_replace": 1, "torch_dtype": "bfloat16",
      "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                              "weight_block_size": [32, 32]}})");
  Parallelism p;
  p.tp = 2;
  p.dp = 2;
  p.ep = 2;
  Layout l = Covered(m, p);
  auto by = ByName(l);
  ExpectTensor(by, "model.layers.1.self_attn.kv_a_proj_with_mqa.weight", "F8_E4M3",
               {48, 128});
  ExpectTensor(by, "model.layers.1.self_attn.kv_a_proj_with_mqa.weight_scale_inv", "F32",
               {2, 4});  // 48 rows: the last block is zero-padded
  // The trainer's BF16 storage converts to FP8 on the residual path.
  EXPECT_EQ(l.ranks[0].tensors[1].dtype, "BF16");
}

TEST(Frontier, GptOssMatchesTheCheckpointNames) {
  Parallelism one;
  one.gate_up = GateUp::kInterleaved;
  one.gate_up_group = 1;
  // The published gpt-oss checkpoints store the experts as MXFP4: blocks
  // of the logical [E, 2I, H] and [E, H, I] with their E8M0 scales, 19
  // tensors a layer; attention, router, embeddings and head stay BF16.
  ModelConfig q = Parse(GptOss120bConfig(true));
  EXPECT_TRUE(q.mxfp4);
  EXPECT_FALSE(q.nvfp4);
  EXPECT_EQ(q.unquantized_modules.size(), 4u);
  Result<Layout> lq = GenerateLayout(q, one);
  ASSERT_OK(lq);
  EXPECT_EQ(lq->canonical.size(), 3u + 36u * 19u);
  auto qby = ByName(*lq);
  const std::string x = "model.layers.35.mlp.experts.";
  ExpectTensor(qby, x + "gate_up_proj_blocks", "U8", {128, 5760, 90, 16});
  ExpectTensor(qby, x + "gate_up_proj_scales", "U8", {128, 5760, 90});
  ExpectTensor(qby, x + "gate_up_proj_bias", "BF16", {128, 5760});
  ExpectTensor(qby, x + "down_proj_blocks", "U8", {128, 2880, 90, 16});
  ExpectTensor(qby, x + "down_proj_scales", "U8", {128, 2880, 90});
  ExpectTensor(qby, x + "down_proj_bias", "BF16", {128, 2880});
  ExpectTensor(qby, "model.layers.35.self_attn.q_proj.weight", "BF16", {4096, 2880});
  ExpectTensor(qby, "model.layers.35.mlp.router.weight", "BF16", {128, 2880});
  EXPECT_EQ(qby.count(x + "gate_up_proj"), 0u);
  EXPECT_EQ(qby.at(x + "down_proj_blocks")->scale_kind, "mxfp4");
  EXPECT_EQ(qby.at(x + "down_proj_blocks")->scale, x + "down_proj_scales");
  // Real sizes: TP 2 x PP 4 x DP 8 x EP 8 splits I = 2880 at column 1440,
  // block 45; TP 4 would split it at 720, inside block 22.
  Parallelism big = one;
  big.tp = 2;
  big.pp = 4;
  big.dp = 8;
  big.ep = 8;
  Covered(q, big);
  big.tp = 4;
  ExpectRefused(q, big,
                {"MXFP4 tensor 'model.layers.0.mlp.experts.down_proj_blocks' (logical [E, H, "
                 "I]) at column 720, inside a 32-element scale block"});
  // Without quantization_config: the BF16 checkpoint (gate_up_proj [E, H,
  // 2I], down_proj [E, I, H]).
  ModelConfig m = Parse(GptOss120bConfig(false));
  EXPECT_TRUE(m.gpt_oss);
  EXPECT_FALSE(m.mxfp4);
  EXPECT_EQ(m.num_experts, 128u);
  Result<Layout> l = GenerateLayout(m, one);
  ASSERT_OK(l);
  EXPECT_EQ(l->canonical.size(), 3u + 36u * 17u);
  auto by = ByName(*l);
  const std::string p = "model.layers.35.";
  ExpectTensor(by, p + "self_attn.sinks", "BF16", {64});
  ExpectTensor(by, p + "self_attn.o_proj.bias", "BF16", {2880});
  ExpectTensor(by, p + "self_attn.q_proj.weight", "BF16", {4096, 2880});
  ExpectTensor(by, p + "self_attn.k_proj.bias", "BF16", {512});
  ExpectTensor(by, p + "mlp.router.weight", "BF16", {128, 2880});
  ExpectTensor(by, p + "mlp.router.bias", "BF16", {128});
  ExpectTensor(by, p + "mlp.experts.gate_up_proj", "BF16", {128, 2880, 5760});
  ExpectTensor(by, p + "mlp.experts.gate_up_proj_bias", "BF16", {128, 5760});
  ExpectTensor(by, p + "mlp.experts.down_proj", "BF16", {128, 2880, 2880});
  ExpectTensor(by, p + "mlp.experts.down_proj_bias", "BF16", {128, 2880});
  // Real sizes: TP 4 x PP 4 x DP 8 x EP 8 (BF16 experts split anywhere).
  Covered(m, big);
  // Megatron's concatenated gate/up does not map onto interleaved columns.
  Result<Layout> concat = GenerateLayout(m, Parallelism{});
  ASSERT_FALSE(concat.ok());
  EXPECT_NE(concat.status().message().find("interleaves gate and up"),
            std::string_view::npos);
}

// Canonical element values = their flat index (as uint16).
TensorBytes IndexBytes(const Layout& l) {
  TensorBytes canon = RandomBytes(l, 1);
  for (auto& [name, bytes] : canon) {
    for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
      uint16_t v = static_cast<uint16_t>(i / 2);
      std::memcpy(&bytes[i], &v, 2);
    }
  }
  return canon;
}

uint16_t At(const std::vector<uint8_t>& b, uint64_t i) {
  uint16_t v;
  std::memcpy(&v, &b[2 * i], 2);
  return v;
}

// gpt-oss sizes: gate and up interleaved one by one, dp = ep.
Parallelism GptOssSizes(uint32_t tp, uint32_t pp, uint32_t dp_ep, bool transposed) {
  Parallelism p;
  p.tp = tp;
  p.pp = pp;
  p.dp = p.ep = dp_ep;
  p.gate_up = GateUp::kInterleaved;
  p.gate_up_group = 1;
  p.transposed = transposed;
  return p;
}

// Local expert 1 of local layer 0 in `local` (one rank's tensors, canonical
// values = flat index) with n intermediate rows of H: linear_fc1 (r, h) holds
// canonical element fc1(r, h), linear_fc2 (h, j) fc2(h, j).
void ExpectExpertElements(const TensorBytes& local, uint64_t H, uint64_t n, bool transposed,
                          const std::function<uint64_t(uint64_t, uint64_t)>& fc1,
                          const std::function<uint64_t(uint64_t, uint64_t)>& fc2) {
  const std::string lp = "decoder.layers.0.mlp.experts.local_experts.1.";
  const std::vector<uint8_t>& w1 = local.at(lp + "linear_fc1.weight");
  const std::vector<uint8_t>& w2 = local.at(lp + "linear_fc2.weight");
  for (uint64_t r = 0; r < 2 * n; ++r) {
    for (uint64_t h = 0; h < H; ++h) {
      const uint64_t li = transposed ? h * 2 * n + r : r * H + h;
      ASSERT_EQ(At(w1, li), static_cast<uint16_t>(fc1(r, h))) << r << " " << h;
    }
  }
  for (uint64_t h = 0; h < H; ++h) {
    for (uint64_t j = 0; j < n; ++j) {
      const uint64_t li = transposed ? j * H + h : h * n + j;
      ASSERT_EQ(At(w2, li), static_cast<uint16_t>(fc2(h, j))) << h << " " << j;
    }
  }
}

// Expert e's linear_fc1 row 2j is gate row i0 + j, row 2j + 1 up row
// i0 + j: gate_up_proj[e, h, 2(i0 + j)] and [.., 2(i0 + j) + 1]; linear_fc2
// (h, j) is down_proj[e, i0 + j, h]; checked element by element.
TEST(Frontier, GptOssExpertsFollowTheCheckpointOrder) {
  ModelConfig m = Parse(R"({"model_type": "gpt_oss", "hidden_size": 16,
      "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 50,
      "num_local_experts": 4})");
  for (bool transposed : {false, true}) {
    Layout l = Covered(m, GptOssSizes(3, 2, 2, transposed));
    ASSERT_FALSE(HasFailure());
    RoundTrip(l, transposed ? 3 : 4);
    ASSERT_FALSE(HasFailure());
    Result<std::vector<TensorBytes>> local = ScatterToRanks(l, IndexBytes(l));
    ASSERT_OK(local);
    const uint64_t H = 16, I = 12;
    // Rank t = 1, d = 1 (expert-parallel index 1: experts 2, 3), stage 1
    // (model layer 1, local layer 0).
    const uint64_t t = 1, rank = t + 3 * (1 + 2 * 1);
    auto [i0, i1] = SplitRange(I, 3, t);
    const uint64_t n = i1 - i0, e = 3;
    ExpectExpertElements(
        (*local)[rank], H, n, transposed,
        [&](uint64_t r, uint64_t h) { return e * H * 2 * I + h * 2 * I + 2 * i0 + r; },
        [&](uint64_t h, uint64_t j) { return e * I * H + (i0 + j) * H + h; });
  }
}

// A small gpt-oss whose layer 0 experts are MXFP4 and layer 1's are listed
// in modules_to_not_convert (BF16): TP splits I = 64 at its block boundary,
// linear_fc1 row r of an expert is logical row 2 i0 + r of gate_up's [E, 2I,
// H], linear_fc2 (h, j) logical (h, i0 + j) of down's [E, H, I]; checked
// element by element through the BF16 twin, plain and transposed.
TEST(Frontier, SmallGptOssMxfp4ExpertsFollowTheBlocks) {
  ModelConfig m = Parse(SmallGptOssMxfp4Config(96));
  ASSERT_TRUE(m.mxfp4);
  const uint64_t H = 96, I = 64, E = 4;
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "transposed" : "plain");
    Layout l = Covered(m, GptOssSizes(2, 1, 2, transposed));
    ASSERT_FALSE(HasFailure());
    auto by = ByName(l);
    ExpectTensor(by, "model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", {E, 2 * I, 3, 16});
    ExpectTensor(by, "model.layers.0.mlp.experts.down_proj_scales", "U8", {E, H, 2});
    ExpectTensor(by, "model.layers.1.mlp.experts.gate_up_proj", "BF16", {E, H, 2 * I});
    EXPECT_EQ(by.count("model.layers.1.mlp.experts.gate_up_proj_blocks"), 0u);
    Result<Layout> back = ParseLayout(LayoutToJson(l));
    ASSERT_OK(back);
    EXPECT_TRUE(*back == l);
    const Layout twin = UnpackedTwin(l);
    RoundTrip(twin, transposed ? 5 : 6);
    ASSERT_FALSE(HasFailure());
    Result<std::vector<TensorBytes>> local = ScatterToRanks(twin, IndexBytes(twin));
    ASSERT_OK(local);
    // Rank t = 1, d = 1 (experts 2, 3): local expert 1 is expert 3.
    const uint64_t t = 1, rank = t + 2 * 1, e = 3, i0 = 32, n = 32;
    ExpectExpertElements(
        (*local)[rank], H, n, transposed,
        [&](uint64_t r, uint64_t h) { return (e * 2 * I + 2 * i0 + r) * H + h; },
        [&](uint64_t h, uint64_t j) { return (e * H + h) * I + i0 + j; });
  }
  // TP 3 splits I = 64 at 22, inside block 0; rows of 48 are not blocks.
  const Parallelism p3 = GptOssSizes(3, 1, 1, false);
  ExpectRefused(m, p3, {"experts.down_proj_blocks' (logical [E, H, I]) at column 22"});
  ExpectRefused(Parse(SmallGptOssMxfp4Config(48)), p3,
                {"'model.layers.0.mlp.experts.gate_up_proj_blocks' would have rows of 48 "
                 "elements"});
}

TEST(Frontier, ModuleListsMatchModulesAndWhatIsUnderThem) {
  EXPECT_TRUE(ModuleListed({"lm_head"}, "lm_head"));
  EXPECT_TRUE(ModuleListed({"model.layers.*.self_attn"}, "model.layers.3.self_attn.q_proj"));
  EXPECT_TRUE(ModuleListed({"model.layers.30.self_attn*"}, "model.layers.30.self_attn.o_proj"));
  EXPECT_FALSE(ModuleListed({"model.layers.30.self_attn*"}, "model.layers.3.self_attn.o_proj"));
  EXPECT_FALSE(ModuleListed({"model.layers.2.mlp.gate"}, "model.layers.2.mlp.gate_proj"));
  EXPECT_TRUE(ModuleListed({"model.layers.2.mlp.gate"}, "model.layers.2.mlp.gate"));
  EXPECT_TRUE(ModuleListed({"x", "*.experts"}, "model.layers.1.mlp.experts.7.up_proj"));
  EXPECT_FALSE(ModuleListed({}, "lm_head"));
}

// ModelOpt NVFP4 (config.json's quantization_config as hf_quant_config.json
// has it): each linear weight of the layers not excluded is `weight` U8
// [N, K/2], `weight_scale` E4M3 [N, K/16], `weight_scale_2` and
// `input_scale` F32 scalars; excluded modules, routers, embeddings, norms
// and the head stay BF16. Each local tensor holding NVFP4 weights gets an
// F32 `input_scale` of one element per weight. Covered without TP at PP x
// DP x EP; TP 2 splits NVFP4 tensors along whole 16-element blocks (their
// owners take the global scale's amax from the trainer); TP 4 would cut a
// block (K = 96 or 32 in four) and is refused, naming the tensor.
TEST(Frontier, ModelOptNvfp4Layouts) {
  const std::string quant = kModelOptNvfp4Quant;
  const std::string llama = R"({"model_type": "llama", "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 100, )" + quant + "}";
  const std::string qwen3_moe = SmallQwen3MoeNvfp4Config();
  const std::string deepseek = R"({"model_type": "deepseek_v3", "hidden_size": 64,
      "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 100, "q_lora_rank": 32,
      "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
      "v_head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1,
      "first_k_dense_replace": 1, "num_nextn_predict_layers": 1, )" + quant + "}";
  for (const std::string& json : {llama, qwen3_moe, deepseek}) {
    ModelConfig m = Parse(json);
    SCOPED_TRACE(m.model_type);
    EXPECT_TRUE(m.nvfp4);
    EXPECT_EQ(m.unquantized_modules.size(), 3u);
    const bool moe = m.num_experts > 0;
    Parallelism p;
    p.pp = 2;
    p.dp = 2;
    p.ep = moe ? 2 : 1;
    Layout l = Covered(m, p);
    ASSERT_FALSE(HasFailure());
    auto by = ByName(l);
    const std::string a0 = "model.layers.0.self_attn.", a1 = "model.layers.1.self_attn.";
    const std::string o0 = a0 + "o_proj.", o1 = a1 + "o_proj.";
    const uint64_t o_in = m.mla ? 4 * 16 : 64;  // heads x v_head_dim, or H
    ExpectTensor(by, o0 + "weight", "U8", {64, o_in / 2});
    ExpectTensor(by, o0 + "weight_scale", "F8_E4M3", {64, o_in / 16});
    ExpectTensor(by, o0 + "weight_scale_2", "F32", {});
    ExpectTensor(by, o0 + "input_scale", "F32", {});
    EXPECT_EQ(by.at(o0 + "weight")->scale_kind, "nvfp4");
    EXPECT_EQ(by.at(o0 + "weight")->scale, o0 + "weight_scale");
    ExpectTensor(by, o1 + "weight", "BF16", {64, o_in});  // excluded
    EXPECT_EQ(by.count(o1 + "weight_scale"), 0u);
    ExpectTensor(by, "lm_head.weight", "BF16", {100, 64});
    ExpectTensor(by, "model.layers.0.mlp.down_proj.weight", "U8", {64, 48});
    if (moe) {
      ExpectTensor(by, "model.layers.1.mlp.gate.weight", "BF16", {4, 64});
      ExpectTensor(by, "model.layers.1.mlp.experts.3.up_proj.weight", "U8", {32, 32});
    }
    if (m.mla) {
      ExpectTensor(by, "model.layers.2.mlp.shared_experts.down_proj.weight", "U8", {64, 16});
      ExpectTensor(by, "model.layers.2.eh_proj.weight", "BF16", {64, 128});
    }
    // Rank 0 (stage 0) holds layer 0 whole: its fused QKV (or MLA's q down
    // projection) carries the input scales of its weights.
    const RankLayout& r0 = l.ranks[0];
    const std::string in = m.mla ? "decoder.layers.0.self_attention.linear_q_down_proj.input_scale"
                                 : "decoder.layers.0.self_attention.linear_qkv.input_scale";
    auto it = std::find_if(r0.tensors.begin(), r0.tensors.end(),
                           [&](const LocalTensor& t) { return t.name == in; });
    ASSERT_NE(it, r0.tensors.end()) << in;
    EXPECT_EQ(it->dtype, "F32");
    const std::vector<std::string> want =
        m.mla ? std::vector<std::string>{a0 + "q_a_proj.input_scale"}
              : std::vector<std::string>{a0 + "q_proj.input_scale", a0 + "k_proj.input_scale",
                                         a0 + "v_proj.input_scale"};
    ASSERT_EQ(it->shape, std::vector<uint64_t>{want.size()});
    for (size_t j = 0; j < want.size(); ++j) {
      EXPECT_EQ(it->pieces[j].canonical, want[j]);
      EXPECT_EQ(it->pieces[j].local_offset, j);
    }
    Result<Layout> back = ParseLayout(LayoutToJson(l));
    ASSERT_OK(back);
    EXPECT_TRUE(*back == l);
    RoundTrip(UnpackedTwin(l), 11);
    ASSERT_FALSE(HasFailure());
    Parallelism tp2 = p;
    tp2.tp = 2;
    EXPECT_OK(GenerateLayout(m, tp2).status());
    Parallelism tp4 = p;
    tp4.tp = 4;
    ExpectRefused(m, tp4,
                  {" would hold logical columns ", " of NVFP4 tensor 'model.layers.",
                   "cutting a 16-element scale block", "multiples of 16 columns"});
  }
  // The compressed-tensors-style form newer ModelOpt versions write.
  ModelConfig groups = Parse(Replace(llama, quant, R"("quantization_config": {
      "quant_method": "modelopt", "quant_algo": "NVFP4", "producer": {"name": "modelopt"},
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4,
          "type": "float", "group_size": 16}, "input_activations": {"num_bits": 4,
          "type": "float", "group_size": 16}}},
      "ignore": ["lm_head"], "kv_cache_scheme": null})"));
  EXPECT_TRUE(groups.nvfp4);
  EXPECT_EQ(groups.unquantized_modules, std::vector<std::string>{"lm_head"});
  // ModelOpt's FP8 KV cache: a k and a v scale per layer, F32 scalars,
  // replicated on the TP ranks of the layer's stage and owned by one.
  {
    ModelConfig kv =
        Parse(Replace(llama, "\"kv_cache_quant_algo\": null", "\"kv_cache_quant_algo\": \"FP8\""));
    ASSERT_TRUE(kv.fp8_kv_cache);
    Parallelism p;
    p.tp = 2;
    p.pp = 2;
    Layout l = Covered(kv, p);
    ASSERT_FALSE(HasFailure());
    auto by = ByName(l);
    Result<Ownership> owners = AssignOwnership(l);
    ASSERT_OK(owners);
    for (int layer = 0; layer < 2; ++layer) {
      for (const char* kind : {"k", "v"}) {
        const std::string name = "model.layers." + std::to_string(layer) + ".self_attn." + kind +
                                 "_proj." + kind + "_scale";
        ExpectTensor(by, name, "F32", {});
        // Mapped by both TP ranks of stage `layer` (ranks tp * layer ..), as
        // decoder.layers.0.self_attention.<kind>_scale [1] of their stage.
        int mapped = 0, owned = 0;
        for (size_t ri = 0; ri < l.ranks.size(); ++ri) {
          for (const LocalTensor& t : l.ranks[ri].tensors) {
            for (const Piece& piece : t.pieces) {
              if (piece.canonical != name) continue;
              ++mapped;
              EXPECT_EQ(t.name, std::string("decoder.layers.0.self_attention.") + kind + "_scale");
              EXPECT_EQ(t.dtype, "F32");
              EXPECT_EQ(t.shape, std::vector<uint64_t>{1});
              EXPECT_EQ(ri / p.tp, static_cast<size_t>(layer));
            }
          }
          for (const OwnedPiece& o : (*owners)[ri]) owned += o.piece.canonical == name;
        }
        EXPECT_EQ(mapped, 2) << name;
        EXPECT_EQ(owned, 1) << name;
      }
    }
    Result<Layout> back = ParseLayout(LayoutToJson(l));
    ASSERT_OK(back);
    EXPECT_TRUE(*back == l);
    RoundTrip(UnpackedTwin(l), 13);
  }
  // K not a multiple of 16: refused, naming the tensor.
  ExpectRefused(
      Parse(Replace(llama, "\"intermediate_size\": 96", "\"intermediate_size\": 40")),
      Parallelism{},
      {"NVFP4 tensor 'model.layers.0.mlp.down_proj.weight' would have rows of 40 elements"});
}

TEST(Frontier, Qwen3MoeAndDenseLayerSchedules) {
  ModelConfig m = Parse(kQwen3Moe);
  EXPECT_TRUE(m.qk_norm);
  EXPECT_TRUE(m.dense_layers.empty());
  Result<Layout> l = GenerateLayout(m, Parallelism{});
  ASSERT_OK(l);
  // 48 layers x (2 norms + q/k/v/o + q/k norms + router + 128 x 3) + 3.
  EXPECT_EQ(l->canonical.size(), 3u + 48u * 393u);
  Parallelism p;
  p.tp = 4;
  p.pp = 4;
  p.dp = 16;
  p.ep = 16;
  Covered(m, p);
  // mlp_only_layers and decoder_sparse_step make dense layers.
  std::string sched = Replace(kQwen3Moe, R"("mlp_only_layers": [])", R"("mlp_only_layers": [0])");
  sched = Replace(sched, R"("decoder_sparse_step": 1)", R"("decoder_sparse_step": 2)");
  sched = Replace(sched, R"("num_hidden_layers": 48)", R"("num_hidden_layers": 6)");
  ModelConfig s = Parse(sched);
  EXPECT_EQ(s.dense_layers, (std::vector<uint64_t>{0, 2, 4}));
  l = GenerateLayout(s, Parallelism{});
  ASSERT_OK(l);
  auto by = ByName(*l);
  ExpectTensor(by, "model.layers.0.mlp.gate_proj.weight", "BF16", {6144, 2048});
  ExpectTensor(by, "model.layers.2.mlp.down_proj.weight", "BF16", {2048, 6144});
  ExpectTensor(by, "model.layers.3.mlp.experts.127.down_proj.weight", "BF16", {2048, 768});
  EXPECT_EQ(by.count("model.layers.1.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(by.count("model.layers.4.mlp.gate.weight"), 0u);
}

TEST(Frontier, Llama31) {
  ModelConfig m = Parse(kLlama31);
  Result<Layout> l = GenerateLayout(m, Parallelism{});
  ASSERT_OK(l);
  EXPECT_EQ(l->canonical.size(), 291u);  // 32 layers x 9 + 3
  Parallelism p;
  p.tp = 8;
  p.pp = 4;
  p.dp = 4;
  Covered(m, p);
}

// A ModelOpt quantization_config with `quant_algo` and more fields.
std::string Modelopt(const std::string& algo, const std::string& more) {
  return R"("quantization_config": {"quant_method": "modelopt", "quant_algo": )" + algo + more +
         "}";
}

// An architecture the generator does not model is refused by name, and so
// is a field that changes the tensor set of one it does, and a quantization
// it does not write.
TEST(Frontier, RefusesWhatItDoesNotModel) {
  struct Case {
    std::string json;
    std::string says;
  };
  const std::string llama(kLlama31);
  const std::vector<Case> cases = {
      {Replace(kDeepSeekV3, "\"deepseek_v3\"", "\"deepseek_v2\""),
       "model_type \"deepseek_v2\" is not an architecture the generator models"},
      {Replace(llama, "\"llama\"", "\"llama4\""), "model_type \"llama4\""},
      {Replace(llama, "\"model_type\": \"llama\",", ""), "no \"model_type\""},
      // A Llama config carrying DeepSeek's fields: not silently dense.
      {Replace(llama, "\"mlp_bias\": false", "\"mlp_bias\": false, \"n_routed_experts\": 8"),
       "\"n_routed_experts\": 8 changes the tensor set"},
      {Replace(llama, "\"mlp_bias\": false", "\"mlp_bias\": false, \"q_lora_rank\": 1536"),
       "\"q_lora_rank\""},
      {Replace(llama, "\"mlp_bias\": false", "\"mlp_bias\": true"), "\"mlp_bias\": true"},
      {Replace(llama, "\"mlp_bias\": false",
               "\"mlp_bias\": false, \"num_nextn_predict_layers\": 1"),
       "\"num_nextn_predict_layers\""},
      {Replace(llama, "\"mlp_bias\": false", "\"mlp_bias\": false, \"num_experts\": 16"),
       "\"num_experts\""},
      {Replace(kQwen3Moe, "\"num_experts\": 128",
               "\"num_experts\": 128, \"shared_expert_intermediate_size\": 512"),
       "\"shared_expert_intermediate_size\""},
      {Replace(kQwen3Moe, "\"num_experts\": 128",
               "\"num_experts\": 128, \"quantization_config\": {\"quant_method\": \"fp8\"}"),
       "\"quantization_config\""},
      {Replace(kDeepSeekV3, "\"weight_block_size\": [128, 128]", "\"foo\": 1"),
       "without a weight_block_size"},
      {Replace(kDeepSeekV3, "\"quant_method\": \"fp8\"", "\"quant_method\": \"modelopt\""),
       "quant_algo \"\" is not modelled"},
      {Replace(GptOss120bConfig(true), "\"mxfp4\"", "\"modelopt\", \"quant_algo\": \"NVFP4\""),
       "quant_method \"modelopt\" is not modelled for gpt_oss"},
      {Replace(llama, "\"mlp_bias\": false",
               "\"mlp_bias\": false, \"quantization_config\": {\"quant_method\": \"mxfp4\"}"),
       "quant_method \"mxfp4\" is not modelled for llama"},
      {Replace(llama, "\"mlp_bias\": false", "\"mlp_bias\": false, " + Modelopt("\"FP8\"", "")),
       "quant_algo \"FP8\" is not modelled"},
      {Replace(llama, "\"mlp_bias\": false",
               "\"mlp_bias\": false, " + Modelopt("\"NVFP4\"", ", \"group_size\": 32")),
       "group_size 32 is not NVFP4's 16"},
      {Replace(llama, "\"mlp_bias\": false",
               "\"mlp_bias\": false, " + Modelopt("\"NVFP4\"",
                                                  ", \"config_groups\": {\"g\": {\"weights\": "
                                                  "{\"group_size\": 32}}}")),
       "config_groups \"g\" weights group_size 32"},
      {Replace(
           llama, "\"mlp_bias\": false",
           "\"mlp_bias\": false, " + Modelopt("\"NVFP4\"", ", \"kv_cache_quant_algo\": \"NVFP4\"")),
       "\"kv_cache_quant_algo\": \"NVFP4\" is not modelled"},
      {Replace(llama, "\"mlp_bias\": false",
               "\"mlp_bias\": false, " + Modelopt("\"NVFP4\"",
                                                  ", \"kv_cache_scheme\": {\"num_bits\": 8, "
                                                  "\"type\": \"float\"}")),
       "\"kv_cache_scheme\": {\"num_bits\":8,\"type\":\"float\"} adds KV-cache scale tensors"},
      {Replace(kDeepSeekV3, "\"quant_method\": \"fp8\"",
               "\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", "
               "\"kv_cache_quant_algo\": \"FP8\""),
       "\"kv_cache_quant_algo\": \"FP8\" on multi-head latent attention"},
  };
  for (const Case& c : cases) {
    Result<ModelConfig> m = ParseModelConfig(c.json);
    ASSERT_FALSE(m.ok()) << c.says;
    EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented) << m.status().ToString();
    EXPECT_NE(m.status().message().find(c.says), std::string_view::npos)
        << m.status().ToString();
  }
  // Neutral values of those fields are fine.
  ASSERT_OK(ParseModelConfig(Replace(llama, "\"mlp_bias\": false",
                                     "\"mlp_bias\": false, \"num_experts\": 0, "
                                     "\"quantization_config\": null")));
}

}  // namespace
}  // namespace refit::layout
