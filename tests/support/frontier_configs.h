// Published config.json files of the frontier architectures, for the
// tests of the trainer and engine layout generators (src/layout).
// Header-only; for tests.
#ifndef REFIT_TESTS_SUPPORT_FRONTIER_CONFIGS_H_
#define REFIT_TESTS_SUPPORT_FRONTIER_CONFIGS_H_

#include <string>

namespace refit::layout::testing {

// deepseek-ai/DeepSeek-V3 config.json (as transformers saves it, with its
// head_dim / qk_head_dim additions).
inline constexpr char kDeepSeekV3[] = R"({
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
inline constexpr char kKimiK2[] = R"({
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
inline constexpr char kGptOss120b[] = R"({
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

// DeepSeek-V3 in small: MLA with q_lora_rank (0: a plain q_proj), a dense
// first layer, 8 routed experts and 2 shared ones, the score correction
// bias, and an MTP layer; `type` deepseek_v3 or kimi_k2.
inline std::string TinyDeepSeekV3Config(uint64_t q_lora_rank, const char* type = "deepseek_v3") {
  return std::string(R"({"model_type": ")") + type + R"(", "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 8,
      "vocab_size": 300, "kv_lora_rank": 16, "q_lora_rank": )" +
         (q_lora_rank ? std::to_string(q_lora_rank) : "null") + R"(, "qk_nope_head_dim": 8,
      "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 8, "n_shared_experts": 2,
      "moe_intermediate_size": 16, "first_k_dense_replace": 1,
      "num_nextn_predict_layers": 1, "topk_method": "noaux_tc"})";
}

// gpt-oss in small (BF16): 8 q heads, 4 KV heads, 4 experts of I = 32.
inline constexpr char kTinyGptOss[] = R"({"model_type": "gpt_oss", "hidden_size": 32,
    "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 8, "vocab_size": 100, "num_local_experts": 4})";

// `s` with its first `from` replaced by `to` (unchanged without one): the
// tests' edits of a config.
inline std::string Replace(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// openai/gpt-oss-120b's config.json: with `mxfp4` as published (MXFP4
// experts), else the BF16 checkpoint's (no quantization_config).
inline std::string GptOss120bConfig(bool mxfp4) {
  std::string types = "[";
  for (int i = 0; i < 36; ++i) {
    types += std::string(i ? ", " : "") +
             (i % 2 ? "\"full_attention\"" : "\"sliding_attention\"");
  }
  types += "]";
  std::string s = Replace(kGptOss120b, "LAYER_TYPES", types);
  const char* quant = R"(, "quantization_config": {"modules_to_not_convert": [
      "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
      "lm_head"], "quant_method": "mxfp4"})";
  return Replace(s, "QUANT", mxfp4 ? quant : "");
}

}  // namespace refit::layout::testing

#endif  // REFIT_TESTS_SUPPORT_FRONTIER_CONFIGS_H_
