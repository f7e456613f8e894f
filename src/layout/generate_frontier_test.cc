// Generated layouts of the frontier architectures from their published
// config.json files (DeepSeek-V3, Kimi-K2, gpt-oss, Qwen3-MoE, Llama 3):
// the canonical tensor set against the published checkpoints' tensor lists,
// coverage at the real parallel sizes, scaled-down models scattered to ranks
// and assembled back, and refusal of architectures and config fields the
// generator does not model.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "layout/generate.h"
#include "layout/layout.h"
#include "refit/checkpoint.h"
#include "support/test_layout.h"
#include "support/testing.h"

namespace refit::layout {
namespace {

using testing::AssembleCanonical;
using testing::ScatterToRanks;
using testing::TensorBytes;

// deepseek-ai/DeepSeek-V3 config.json (as transformers saves it, with its
// head_dim / qk_head_dim additions).
constexpr char kDeepSeekV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0,
  "dtype": "bfloat16", "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
  "head_dim": 64, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1,
  "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1,
  "q_lora_rank": 1536, "qk_head_dim": 192, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                          "quant_method": "fp8", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06, "rope_interleave": true,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 40.0, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "rope_type": "yarn", "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 4,
  "topk_method": "noaux_tc", "use_cache": true, "v_head_dim": 128,
  "vocab_size": 129280})";

// moonshotai/Kimi-K2-Instruct config.json (the fields of the architecture).
constexpr char kKimiK2[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 131072,
  "model_type": "kimi_k2", "moe_intermediate_size": 2048, "moe_layer_freq": 1,
  "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 64, "num_nextn_predict_layers": 0, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                          "quant_method": "fp8", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06, "rope_theta": 50000.0, "routed_scaling_factor": 2.827,
  "scoring_func": "sigmoid", "tie_word_embeddings": false, "topk_group": 1,
  "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128,
  "vocab_size": 163840})";

// openai/gpt-oss-120b config.json; LAYER_TYPES and QUANT are filled in.
constexpr char kGptOss120b[] = R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true,
  "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4,
  "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
  "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
  "layer_types": LAYER_TYPES, "max_position_embeddings": 131072, "model_type": "gpt_oss",
  "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36,
  "num_key_value_heads": 8, "num_local_experts": 128, "output_router_logits": false,
  "pad_token_id": 199999 QUANT, "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                   "original_max_position_embeddings": 4096, "rope_type": "yarn",
                   "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
  "swiglu_limit": 7.0, "tie_word_embeddings": false, "use_cache": true,
  "vocab_size": 201088})";

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

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

std::string GptOss(bool mxfp4) {
  std::string types = "[";
  for (int i = 0; i < 36; ++i) {
    types += std::string(i ? ", " : "") +
             (i % 2 ? "\"full_attention\"" : "\"sliding_attention\"");
  }
  types += "]";
  std::string s = Replace(kGptOss120b, "LAYER_TYPES", types);
  return Replace(s, "QUANT",
                 mxfp4 ? R"(, "quantization_config": {"modules_to_not_convert": [
                   "model.layers.*.self_attn", "model.layers.*.mlp.router",
                   "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"})"
                       : "");
}

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
  // The published gpt-oss checkpoints store the experts as MXFP4, which the
  // generator refuses by name; without quantization_config it writes the
  // BF16 checkpoint (gate_up_proj [E, H, 2I], down_proj [E, I, H]).
  Result<ModelConfig> q = ParseModelConfig(GptOss(true));
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(q.status().message().find("\"mxfp4\""), std::string_view::npos)
      << q.status().ToString();
  ModelConfig m = Parse(GptOss(false));
  EXPECT_TRUE(m.gpt_oss);
  EXPECT_EQ(m.num_experts, 128u);
  Parallelism one;
  one.gate_up = GateUp::kInterleaved;
  one.gate_up_group = 1;
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
  // Real sizes: TP 4 x PP 4 x DP 8 x EP 8.
  Parallelism p4 = one;
  p4.tp = 4;
  p4.pp = 4;
  p4.dp = 8;
  p4.ep = 8;
  Covered(m, p4);
  // Megatron's concatenated gate/up does not map onto interleaved columns.
  Result<Layout> concat = GenerateLayout(m, Parallelism{});
  ASSERT_FALSE(concat.ok());
  EXPECT_NE(concat.status().message().find("interleaves gate and up"),
            std::string_view::npos);
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
    Parallelism p;
    p.tp = 3;
    p.pp = 2;
    p.dp = 2;
    p.ep = 2;
    p.gate_up = GateUp::kInterleaved;
    p.gate_up_group = 1;
    p.transposed = transposed;
    Layout l = Covered(m, p);
    ASSERT_FALSE(HasFailure());
    RoundTrip(l, transposed ? 3 : 4);
    ASSERT_FALSE(HasFailure());
    // Canonical element values = their flat index (as uint16).
    TensorBytes canon = RandomBytes(l, 1);
    for (auto& [name, bytes] : canon) {
      for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
        uint16_t v = static_cast<uint16_t>(i / 2);
        std::memcpy(&bytes[i], &v, 2);
      }
    }
    Result<std::vector<TensorBytes>> local = ScatterToRanks(l, canon);
    ASSERT_OK(local);
    const uint64_t H = 16, I = 12;
    // Rank t = 1, d = 1 (expert-parallel index 1: experts 2, 3), stage 1
    // (model layer 1, local layer 0).
    const uint64_t t = 1, rank = t + 3 * (1 + 2 * 1);
    auto [i0, i1] = SplitRange(I, 3, t);
    const uint64_t n = i1 - i0, e = 3;
    const std::string lp = "decoder.layers.0.mlp.experts.local_experts.1.";
    const std::vector<uint8_t>& fc1 = (*local)[rank].at(lp + "linear_fc1.weight");
    const std::vector<uint8_t>& fc2 = (*local)[rank].at(lp + "linear_fc2.weight");
    auto at = [](const std::vector<uint8_t>& b, uint64_t i) {
      uint16_t v;
      std::memcpy(&v, &b[2 * i], 2);
      return v;
    };
    for (uint64_t r = 0; r < 2 * n; ++r) {
      for (uint64_t h = 0; h < H; ++h) {
        uint64_t li = transposed ? h * 2 * n + r : r * H + h;
        uint64_t ci = e * H * 2 * I + h * 2 * I + 2 * i0 + r;
        ASSERT_EQ(at(fc1, li), static_cast<uint16_t>(ci)) << r << " " << h;
      }
    }
    for (uint64_t h = 0; h < H; ++h) {
      for (uint64_t j = 0; j < n; ++j) {
        uint64_t li = transposed ? j * H + h : h * n + j;
        uint64_t ci = e * I * H + (i0 + j) * H + h;
        ASSERT_EQ(at(fc2, li), static_cast<uint16_t>(ci)) << h << " " << j;
      }
    }
  }
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

// An architecture the generator does not model is refused by name, and so
// is a field that changes the tensor set of one it does.
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
       "quant_method \"modelopt\" is not modelled"},
      {GptOss(true), "quant_method \"mxfp4\""},
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
