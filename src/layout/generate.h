// Layouts of common training setups, generated from a model's Hugging Face
// config.json and the parallel sizes (docs/layout.md, "Generated layouts").
//
// Local tensors get Megatron-core names on every rank (per pipeline stage the
// layers are renumbered from 0); canonical tensors get the Hugging Face names
// of the architectures the generator models (kSupportedModelTypes): Llama,
// Mistral, Qwen2/Qwen3 dense, Mixtral, Qwen2-MoE/Qwen3-MoE, DeepSeek-V3 and
// Kimi-K2 (MLA attention, dense first layers, routed and shared experts,
// MTP layers, FP8 block-quantized checkpoints) and gpt-oss (attention sinks,
// fused expert tensors with biases, MXFP4 experts); ModelOpt NVFP4
// checkpoints of all but gpt-oss. A config.json of any other architecture,
// or one with a field that changes the tensor set in a way the generator
// does not model, is refused by name (docs/layout.md, "Generated layouts").
// GenerateEngineLayout writes the matching inference-engine side (vLLM's
// fused qkv_proj / gate_up_proj / fused_qkv_a_proj / FusedMoE w13 and w2
// parameters of each tensor-parallel rank) over the same canonical tensors
// (less the MTP layers', which the engine's main model does not load).
// Pure and thread-safe.
#ifndef REFIT_LAYOUT_GENERATE_H_
#define REFIT_LAYOUT_GENERATE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "layout/layout.h"
#include "refit/status.h"

namespace refit::layout {

// The fields of a Hugging Face config.json that decide tensor names and
// shapes.
struct ModelConfig {
  std::string model_type;  // "llama", "qwen2", "qwen3", "mixtral", "qwen2_moe", ...
  std::string dtype = "BF16";  // from "torch_dtype" / "dtype"; BF16 when absent
  uint64_t hidden_size = 0;
  uint64_t intermediate_size = 0;
  uint64_t num_hidden_layers = 0;
  uint64_t num_attention_heads = 0;
  uint64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  uint64_t head_dim = 0;             // defaults to hidden_size / heads
  uint64_t vocab_size = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases; always on for qwen2*
  bool qk_norm = false;         // q_norm / k_norm per head (qwen3*)
  // Mixture of experts: 0 experts = dense.
  uint64_t num_experts = 0;            // "num_experts" or "num_local_experts"
  uint64_t moe_intermediate_size = 0;  // defaults to intermediate_size
  uint64_t shared_expert_intermediate_size = 0;  // 0 = no shared expert
  bool mixtral_names = false;  // block_sparse_moe.experts.{e}.w1/w2/w3
  // Layers of an MoE model whose MLP is dense (intermediate_size), ascending:
  // DeepSeek's first_k_dense_replace / moe_layer_freq, Qwen-MoE's
  // mlp_only_layers / decoder_sparse_step. Empty: every layer is MoE.
  std::vector<uint64_t> dense_layers;

  // Multi-head latent attention (deepseek_v3, kimi_k2). q_lora_rank 0: a
  // plain q_proj instead of q_a_proj / q_a_layernorm / q_b_proj.
  bool mla = false;
  uint64_t q_lora_rank = 0;
  uint64_t kv_lora_rank = 0;
  uint64_t qk_nope_head_dim = 0;
  uint64_t qk_rope_head_dim = 0;
  uint64_t v_head_dim = 0;
  // DeepSeek-style MoE: mlp.shared_experts.* of n_shared_experts x
  // moe_intermediate_size rows (no shared gate), and the router's FP32
  // mlp.gate.e_score_correction_bias.
  uint64_t n_shared_experts = 0;
  bool e_score_correction_bias = false;
  // Multi-token prediction layers after the last layer (model.layers.{L+k}).
  uint64_t num_nextn_predict_layers = 0;

  // gpt-oss: o_proj bias, attention sinks, router bias, fused expert tensors
  // mlp.experts.gate_up_proj [E, H, 2I] (gate and up columns interleaved)
  // and down_proj [E, I, H], with biases.
  bool gpt_oss = false;

  // quantization_config {"quant_method": "fp8", "weight_block_size": [r, c]}:
  // the layers' linear weights are F8_E4M3 with an FP32 `weight_scale_inv`
  // per r x c block (the DeepSeek-V3 checkpoint convention). 0: not quantized.
  uint64_t fp8_block_rows = 0, fp8_block_cols = 0;
  // quantization_config {"quant_method": "mxfp4"} (gpt-oss): the experts are
  // mlp.experts.{gate_up,down}_proj_blocks U8 [E, R, C/32, 16] with E8M0
  // `*_scales` U8 [E, R, C/32] (scale_kind "mxfp4"), gate_up in its logical
  // [E, 2I, H] orientation (rows: gate and up interleaved), down [E, H, I].
  bool mxfp4 = false;
  // quantization_config {"quant_method": "modelopt", "quant_algo": "NVFP4"}:
  // the layers' linear weights are `weight` U8 [N, K/2] (scale_kind
  // "nvfp4"), `weight_scale` F8_E4M3 [N, K/16], `weight_scale_2` and
  // `input_scale` F32 scalars (NVIDIA ModelOpt's convention).
  bool nvfp4 = false;
  // ModelOpt's "kv_cache_quant_algo": "FP8" (attention that is not MLA): each
  // layer also has `self_attn.k_proj.k_scale` and `self_attn.v_proj.v_scale`,
  // F32 scalars (the FP8 KV cache's calibrated scales), which the layout maps
  // as replicated tensors (`self_attention.k_scale`, `.v_scale`, F32 [1]) of
  // the ranks that hold the layer: calibration the trainer keeps and sends
  // as it is, owned by one of them.
  bool fp8_kv_cache = false;
  // Module name patterns whose weights stay unquantized: mxfp4's
  // modules_to_not_convert, ModelOpt's exclude_modules / ignore. `*` matches
  // any run of characters; a pattern names a module and everything under it.
  std::vector<std::string> unquantized_modules;
};

// Whether module `module` (a Hugging Face name without ".weight") is
// listed in `patterns` (ModelConfig::unquantized_modules): some pattern
// matches it or one of its dotted prefixes.
bool ModuleListed(const std::vector<std::string>& patterns, const std::string& module);

// The model_type values GenerateLayout models.
inline constexpr const char* kSupportedModelTypes[] = {
    "llama", "mistral",   "qwen2",       "qwen3",   "mixtral",
    "qwen2_moe", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss"};

// Reads a config.json. Fails with kInvalidArgument naming the missing or
// mistyped field; with kUnimplemented naming the model_type when it is not
// in kSupportedModelTypes, and naming the field when the config sets one
// that changes the tensor set (MLA ranks, expert counts, dense-layer
// schedules, MTP layers, mlp_bias, a quantization_config) in a way its
// architecture's generator does not model.
Result<ModelConfig> ParseModelConfig(std::string_view json);
Result<ModelConfig> LoadModelConfig(const std::string& path);

enum class GateUp {
  kSeparate,     // two local tensors per rank
  kConcat,       // one: the rank's gate rows, then its up rows (Megatron)
  kInterleaved,  // one: groups of `gate_up_group` gate rows, then as many up rows
};

struct Parallelism {
  uint32_t tp = 1;  // tensor parallel: heads, intermediate and vocab split
  uint32_t pp = 1;  // pipeline stages: layers split, renumbered from 0
  uint32_t ep = 1;  // expert parallel: experts split; must divide dp
  uint32_t dp = 1;  // data parallel replicas
  uint32_t cp = 1;  // context parallel: replicas of the weights too
  bool fused_qkv = true;  // Megatron linear_qkv: per query group q, k, v rows
  GateUp gate_up = GateUp::kConcat;
  uint64_t gate_up_group = 64;  // rows per group with kInterleaved
  bool transposed = false;      // 2-D linear weights stored [in, out]
  // The vocabulary is padded to a multiple of vocab_multiple * tp rows;
  // padding rows map to nothing.
  uint64_t vocab_multiple = 1;
  std::string local_dtype;  // dtype of local storage; empty: the model's
};

// The layout of `config` trained with `par`: tp*cp*dp*pp ranks, rank =
// t + tp*(c + cp*(d + dp*p)) (Megatron's default order). Uneven splits are
// allowed: a dimension of n over k ranks gives the first n % k ranks one
// more. With tp above the number of KV heads, each KV head is replicated on
// the ranks that share its query group. Fails with kInvalidArgument when a
// rank would get no heads, rows or layers, or when ep does not divide dp;
// with packed FP4 checkpoints also, naming the tensor, when its last
// dimension is not whole scale blocks, when a tensor-parallel split would
// cut an MXFP4 scale block, or when it would split an NVFP4 tensor between
// ranks at all (its global scale is the amax of the whole tensor, which the
// rank encoder needs on one rank: generate those with tp 1).
Result<Layout> GenerateLayout(const ModelConfig& config, const Parallelism& par);

// Engine-side layouts (docs/layout.md, "Engine layouts"): the parameters of
// an inference engine's tensor-parallel ranks, under the engine's own names
// and shapes, mapped to the same canonical tensors as GenerateLayout's, so
// one generator serves the trainer and the receivers.
enum class Engine {
  kVllm,  // vLLM's fused parameters (qkv_proj, gate_up_proj, fused_qkv_a_proj,
          // FusedMoE w13/w2)
};

struct EngineParallelism {
  Engine engine = Engine::kVllm;
  uint32_t tp = 1;  // tensor-parallel size: one layout rank per TP rank
  // Expert parallelism: 1 (every rank holds every expert, its intermediate
  // rows split over TP) or tp (vLLM's --enable-expert-parallel on one
  // data-parallel replica: rank t holds whole experts, a contiguous range,
  // the first E % tp ranks one more; gpt-oss needs E % tp == 0).
  uint32_t ep = 1;
  // The vocabulary is padded to a multiple of this (vLLM's
  // DEFAULT_VOCAB_PADDING_SIZE), then split evenly over TP; padding rows map
  // to nothing.
  uint64_t vocab_padding = 64;
};

// The layout of `config` loaded by an engine with `par`: par.tp ranks, rank
// t = the engine's TP rank, local tensors named and shaped as the engine's
// parameters (vLLM: model.named_parameters() of a model built from
// `config`), in the canonical dtype. Canonical tensors are GenerateLayout's
// but for the multi-token prediction layers (num_nextn_predict_layers),
// which vLLM's main model does not load: a layout maps every canonical
// element it lists, so they are left out of it. Requires what the engine
// requires: num_attention_heads, the intermediate sizes and the padded
// vocabulary divisible by tp; num_key_value_heads divisible by tp, or (but
// for gpt-oss) tp divisible by it (each KV head replicated on
// tp / num_key_value_heads ranks). Fails with kUnimplemented naming the
// model_type or the quantization for what the engine generator does not
// model: quantized checkpoints (fp8, mxfp4, NVFP4, an FP8 KV cache),
// gpt-oss with tied embeddings, other architectures; with
// kInvalidArgument for a split the engine would refuse, or an ep other
// than 1 or tp.
Result<Layout> GenerateEngineLayout(const ModelConfig& config, const EngineParallelism& par);

// [begin, end) of part i when n items are split over `parts` (the first
// n % parts parts get one more).
inline std::pair<uint64_t, uint64_t> SplitRange(uint64_t n, uint64_t parts,
                                                uint64_t i) {
  uint64_t base = n / parts, extra = n % parts;
  uint64_t b = i * base + (i < extra ? i : extra);
  return {b, b + base + (i < extra ? 1 : 0)};
}

}  // namespace refit::layout

#endif  // REFIT_LAYOUT_GENERATE_H_
