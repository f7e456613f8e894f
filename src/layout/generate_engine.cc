// Engine-side layouts: vLLM's parameters of each tensor-parallel rank
// (docs/layout.md, "Engine layouts"), mapped onto GenerateLayout's
// canonical tensors.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "layout/generate.h"

namespace refit::layout {
namespace {

// Builds one engine rank's local tensors. Every piece maps a block of
// whole-width rows or a column range of row-major tensors; local and
// canonical column strides are 1.
class EngineRank {
 public:
  explicit EngineRank(std::string dtype) : dtype_(std::move(dtype)) {}

  void Add(std::string name, std::vector<uint64_t> shape) {
    LocalTensor t;
    t.name = std::move(name);
    t.dtype = dtype_;
    t.shape = std::move(shape);
    tensors.push_back(std::move(t));
  }

  // Canonical rows [r0, r0 + n) of a tensor `width` wide, at local row `at`
  // of the last tensor (also `width` wide). 1-D tensors: width 1.
  void Rows(const std::string& canonical, uint64_t r0, uint64_t n, uint64_t width,
            uint64_t at) {
    if (n == 0) return;
    Piece p;
    p.canonical = canonical;
    if (width == 1) {  // a run of a 1-D tensor: one row
      p.rows = 1;
      p.cols = n;
      p.local_row_stride = p.canon_row_stride = n;
    } else {
      p.rows = n;
      p.cols = width;
      p.local_row_stride = p.canon_row_stride = width;
    }
    p.local_offset = at * width;
    p.canon_offset = r0 * width;
    p.local_col_stride = p.canon_col_stride = 1;
    tensors.back().pieces.push_back(std::move(p));
  }

  // Columns [c0, c0 + n) of all `rows` rows of a canonical [rows, ccols]
  // tensor, at local element `at` of the last tensor ([rows, n] there): a
  // row-parallel shard.
  void Cols(const std::string& canonical, uint64_t rows, uint64_t c0, uint64_t n,
            uint64_t ccols, uint64_t at = 0) {
    Piece p;
    p.canonical = canonical;
    p.rows = rows;
    p.cols = n;
    p.local_offset = at;
    p.local_row_stride = n;
    p.local_col_stride = 1;
    p.canon_offset = c0;
    p.canon_row_stride = ccols;
    p.canon_col_stride = 1;
    tensors.back().pieces.push_back(std::move(p));
  }

  // A replicated tensor of n elements (norms, routers): one piece.
  void Whole(const std::string& local, const std::string& canonical,
             std::vector<uint64_t> shape) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    Add(local, std::move(shape));
    Rows(canonical, 0, n, 1, 0);
  }

  std::vector<LocalTensor> tensors;

 private:
  std::string dtype_;
};

Status Divides(uint64_t n, uint64_t tp, const std::string& what) {
  if (n % tp == 0) return Status();
  return InvalidArgumentError("tp " + std::to_string(tp) + " does not divide " + what + " " +
                              std::to_string(n) +
                              " (vLLM splits it evenly over its tensor-parallel ranks)");
}

// Refuses what the vLLM generator does not model, by name.
Status CheckModelled(const ModelConfig& m) {
  if (m.mla) {
    return UnimplementedError(
        "engine layout: model_type \"" + m.model_type +
        "\" (multi-head latent attention: vLLM's fused_qkv_a_proj and MLA parameters) "
        "is not modelled by the vLLM engine generator");
  }
  if (m.gpt_oss) {
    return UnimplementedError(
        "engine layout: model_type \"gpt_oss\" (attention sinks and fused expert "
        "tensors with biases) is not modelled by the vLLM engine generator");
  }
  const char* quant = m.fp8_block_rows ? "fp8"
                      : m.mxfp4        ? "mxfp4"
                      : m.nvfp4        ? "modelopt (NVFP4)"
                      : m.fp8_kv_cache ? "an FP8 KV cache"
                                       : nullptr;
  if (quant) {
    return UnimplementedError(std::string("engine layout: quantized checkpoints (") + quant +
                              ", model_type \"" + m.model_type +
                              "\") are not modelled by the vLLM engine generator: an engine "
                              "holds repacked quantized weights and scales");
  }
  static const char* const kModelled[] = {"llama", "mistral",   "qwen2",    "qwen3",
                                          "mixtral", "qwen2_moe", "qwen3_moe"};
  for (const char* t : kModelled) {
    if (m.model_type == t) return Status();
  }
  return UnimplementedError("engine layout: model_type \"" + m.model_type +
                            "\" is not modelled by the vLLM engine generator (it models "
                            "llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe)");
}

}  // namespace

Result<Layout> GenerateEngineLayout(const ModelConfig& m, const EngineParallelism& par) {
  REFIT_RETURN_IF_ERROR(CheckModelled(m));
  const uint64_t tp = par.tp, ep = par.ep;
  if (tp == 0) return InvalidArgumentError("engine layout: tp must be at least 1");
  if (ep != 1 && ep != tp) {
    return InvalidArgumentError("engine layout: ep " + std::to_string(ep) +
                                " is neither 1 nor tp " + std::to_string(tp) +
                                " (vLLM's expert parallelism spreads the experts over the "
                                "tensor-parallel ranks of one replica)");
  }
  if (par.vocab_padding == 0) {
    return InvalidArgumentError("engine layout: vocab_padding must be at least 1");
  }
  // The canonical tensors (and the checks of the model's sizes) are the
  // trainer generator's at TP 1.
  REFIT_ASSIGN_OR_RETURN(Layout layout, GenerateLayout(m, Parallelism{}));
  layout.ranks.clear();

  const uint64_t H = m.hidden_size, hd = m.head_dim, L = m.num_hidden_layers;
  const uint64_t nh = m.num_attention_heads, nkv = m.num_key_value_heads;
  const bool moe = m.num_experts > 0;
  const uint64_t E = m.num_experts, I = m.intermediate_size;
  const uint64_t Im = moe ? m.moe_intermediate_size : 0;
  const uint64_t Is = moe ? m.shared_expert_intermediate_size : 0;
  std::vector<bool> dense(L, !moe);
  for (uint64_t i : m.dense_layers) {
    if (i < L) dense[i] = true;
  }
  bool any_dense = false;
  for (bool d : dense) any_dense |= d;
  if (moe && ep > E) {
    return InvalidArgumentError("engine layout: ep " + std::to_string(ep) + " exceeds the " +
                                std::to_string(E) + " experts");
  }
  REFIT_RETURN_IF_ERROR(Divides(nh, tp, "num_attention_heads"));
  if (tp >= nkv) {
    if (tp % nkv != 0) {
      return InvalidArgumentError(
          "engine layout: num_key_value_heads " + std::to_string(nkv) + " does not divide tp " +
          std::to_string(tp) + " (vLLM replicates each KV head on tp / num_key_value_heads "
          "ranks)");
    }
  } else {
    REFIT_RETURN_IF_ERROR(Divides(nkv, tp, "num_key_value_heads"));
  }
  if (any_dense) REFIT_RETURN_IF_ERROR(Divides(I, tp, "intermediate_size"));
  if (moe && ep == 1) REFIT_RETURN_IF_ERROR(Divides(Im, tp, "moe_intermediate_size"));
  if (Is) REFIT_RETURN_IF_ERROR(Divides(Is, tp, "shared_expert_intermediate_size"));
  const uint64_t pad = par.vocab_padding;
  const uint64_t Vp = (m.vocab_size + pad - 1) / pad * pad;
  REFIT_RETURN_IF_ERROR(Divides(Vp, tp, "the padded vocabulary"));

  const uint64_t nq = nh / tp;                  // q heads per rank
  const uint64_t nk = tp >= nkv ? 1 : nkv / tp;  // kv heads per rank
  const std::string moe_block = m.mixtral_names ? "block_sparse_moe." : "mlp.";
  for (uint64_t t = 0; t < tp; ++t) {
    EngineRank b(m.dtype);
    // QKVParallelLinear: q heads split; kv heads split, or each replicated on
    // tp / nkv consecutive ranks (rank t holds kv head t * nkv / tp).
    const uint64_t q0 = t * nq, k0 = tp >= nkv ? t * nkv / tp : t * nk;
    const uint64_t qkv_rows = (nq + 2 * nk) * hd;
    // VocabParallelEmbedding / ParallelLMHead: even shards of the padded
    // vocabulary.
    const uint64_t vrows = Vp / tp, v0 = t * vrows;
    const uint64_t vreal = v0 >= m.vocab_size ? 0 : std::min(vrows, m.vocab_size - v0);
    b.Add("model.embed_tokens.weight", {vrows, H});
    b.Rows("model.embed_tokens.weight", v0, vreal, H, 0);
    // MergedColumnParallelLinear gate_up_proj + RowParallelLinear down_proj.
    auto mlp = [&](const std::string& local, const std::string& hf, uint64_t inter) {
      const uint64_t n = inter / tp, i0 = t * n;
      b.Add(local + "gate_up_proj.weight", {2 * n, H});
      b.Rows(hf + "gate_proj.weight", i0, n, H, 0);
      b.Rows(hf + "up_proj.weight", i0, n, H, n);
      b.Add(local + "down_proj.weight", {H, n});
      b.Cols(hf + "down_proj.weight", H, i0, n, inter);
    };
    for (uint64_t i = 0; i < L; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      b.Whole(p + "input_layernorm.weight", p + "input_layernorm.weight", {H});
      const std::string sa = p + "self_attn.";
      for (bool bias : {false, true}) {
        if (bias && !m.attention_bias) continue;
        const std::string suffix = bias ? "bias" : "weight";
        const uint64_t W = bias ? 1 : H;
        b.Add(sa + "qkv_proj." + suffix,
              bias ? std::vector<uint64_t>{qkv_rows} : std::vector<uint64_t>{qkv_rows, H});
        b.Rows(sa + "q_proj." + suffix, q0 * hd, nq * hd, W, 0);
        b.Rows(sa + "k_proj." + suffix, k0 * hd, nk * hd, W, nq * hd);
        b.Rows(sa + "v_proj." + suffix, k0 * hd, nk * hd, W, (nq + nk) * hd);
      }
      b.Add(sa + "o_proj.weight", {H, nq * hd});
      b.Cols(sa + "o_proj.weight", H, q0 * hd, nq * hd, nh * hd);
      if (m.qk_norm) {
        b.Whole(sa + "q_norm.weight", sa + "q_norm.weight", {hd});
        b.Whole(sa + "k_norm.weight", sa + "k_norm.weight", {hd});
      }
      b.Whole(p + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight",
              {H});
      if (dense[i]) {
        mlp(p + "mlp.", p + "mlp.", I);
        continue;
      }
      // FusedMoE: w13_weight [E_local, 2 n, H] (per expert its gate rows,
      // then its up rows), w2_weight [E_local, H, n]; with ep == tp whole
      // experts (n = I), else every expert with its TP rows (n = I / tp).
      const std::string mb = p + moe_block;
      b.Whole(mb + "gate.weight", mb + "gate.weight", {E, H});
      const auto [e0, e1] = ep == 1 ? std::pair<uint64_t, uint64_t>{0, E}
                                    : SplitRange(E, ep, t);
      const uint64_t n = ep == 1 ? Im / tp : Im, i0 = ep == 1 ? t * n : 0;
      auto expert = [&](uint64_t e, const char* which) {
        const std::string x = mb + "experts." + std::to_string(e) + ".";
        if (!m.mixtral_names) return x + which + "_proj.weight";
        const std::string w(which);
        return x + (w == "gate" ? "w1" : w == "up" ? "w3" : "w2") + ".weight";
      };
      b.Add(mb + "experts.w13_weight", {e1 - e0, 2 * n, H});
      for (uint64_t e = e0; e < e1; ++e) {
        const uint64_t j = e - e0;
        b.Rows(expert(e, "gate"), i0, n, H, j * 2 * n);
        b.Rows(expert(e, "up"), i0, n, H, j * 2 * n + n);
      }
      b.Add(mb + "experts.w2_weight", {e1 - e0, H, n});
      for (uint64_t e = e0; e < e1; ++e) {
        b.Cols(expert(e, "down"), H, i0, n, Im, (e - e0) * H * n);
      }
      if (Is) {
        mlp(p + "mlp.shared_expert.", p + "mlp.shared_expert.", Is);
        b.Whole(p + "mlp.shared_expert_gate.weight", p + "mlp.shared_expert_gate.weight",
                {1, H});
      }
    }
    b.Whole("model.norm.weight", "model.norm.weight", {H});
    // Tied embeddings: vLLM's lm_head is the embedding module itself, one
    // parameter.
    if (!m.tie_word_embeddings) {
      b.Add("lm_head.weight", {vrows, H});
      b.Rows("lm_head.weight", v0, vreal, H, 0);
    }
    RankLayout r;
    r.rank = static_cast<uint32_t>(t);
    r.tensors = std::move(b.tensors);
    layout.ranks.push_back(std::move(r));
  }
  return layout;
}

}  // namespace refit::layout
