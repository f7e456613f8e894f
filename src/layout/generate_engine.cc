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

// Builds one engine rank's local tensors. Pieces map a block of whole-width
// rows, a column range, or (gpt-oss's experts, stored transposed in the
// checkpoint) canonical columns onto local rows; local column strides are 1.
class EngineRank {
 public:
  explicit EngineRank(std::string dtype) : dtype_(std::move(dtype)) {}

  // A local tensor; an empty dtype is the model's.
  void Add(std::string name, std::vector<uint64_t> shape, const std::string& dtype = "") {
    LocalTensor t;
    t.name = std::move(name);
    t.dtype = dtype.empty() ? dtype_ : dtype;
    t.shape = std::move(shape);
    tensors.push_back(std::move(t));
  }

  // Canonical rows [r0, r0 + n) of a tensor `width` wide, at local row `at`
  // of the last tensor (also `width` wide). 1-D tensors: width 1.
  void Rows(const std::string& canonical, uint64_t r0, uint64_t n, uint64_t width,
            uint64_t at) {
    if (n == 0) return;
    if (width == 1) {  // a run of a 1-D tensor: one row
      Strided(canonical, 1, n, at, n, r0, n, 1);
    } else {
      Strided(canonical, n, width, at * width, width, r0 * width, width, 1);
    }
  }

  // Columns [c0, c0 + n) of all `rows` rows of a canonical [rows, ccols]
  // tensor, at local element `at` of the last tensor ([rows, n] there): a
  // row-parallel shard.
  void Cols(const std::string& canonical, uint64_t rows, uint64_t c0, uint64_t n,
            uint64_t ccols, uint64_t at = 0) {
    Strided(canonical, rows, n, at, n, c0, ccols, 1);
  }

  // The general piece: `rows` x `cols` elements, local element (r, c) at
  // at + r * local_row_stride + c, canonical at
  // canon_offset + r * canon_row_stride + c * canon_col_stride.
  void Strided(const std::string& canonical, uint64_t rows, uint64_t cols, uint64_t at,
               uint64_t local_row_stride, uint64_t canon_offset, uint64_t canon_row_stride,
               uint64_t canon_col_stride) {
    tensors.back().pieces.push_back(Piece{canonical, rows, cols, at, local_row_stride, 1,
                                          canon_offset, canon_row_stride, canon_col_stride});
  }

  // A replicated tensor of n elements (norms, routers): one piece.
  void Whole(const std::string& local, const std::string& canonical,
             std::vector<uint64_t> shape, const std::string& dtype = "") {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    Add(local, std::move(shape), dtype);
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
  const char* quant = m.fp8_block_rows ? "fp8"
                      : m.mxfp4        ? "mxfp4"
                      : m.nvfp4        ? "modelopt (NVFP4)"
                      : m.fp8_kv_cache ? "an FP8 KV cache"
                                       : nullptr;
  if (quant) {
    return UnimplementedError(std::string("engine layout: quantized checkpoints (") + quant +
                              ", model_type \"" + m.model_type +
                              "\") are not modelled by the vLLM engine generator: an engine "
                              "holds repacked quantized weights and scales (the BF16 "
                              "checkpoint of the same model is)");
  }
  if (m.gpt_oss && m.tie_word_embeddings) {
    return UnimplementedError(
        "engine layout: gpt_oss with tie_word_embeddings is not modelled (vLLM's gpt-oss "
        "lm_head is a parameter of its own, which its loader then skips)");
  }
  static const char* const kModelled[] = {"llama",     "mistral",     "qwen2",   "qwen3",
                                          "mixtral",   "qwen2_moe",   "qwen3_moe",
                                          "deepseek_v3", "kimi_k2",   "gpt_oss"};
  for (const char* t : kModelled) {
    if (m.model_type == t) return Status();
  }
  return UnimplementedError("engine layout: model_type \"" + m.model_type +
                            "\" is not modelled by the vLLM engine generator (it models "
                            "llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, "
                            "deepseek_v3, kimi_k2, gpt_oss)");
}

// The sizes every rank shares, checked against what vLLM accepts.
struct Sizes {
  uint64_t tp = 1, ep = 1;
  uint64_t H = 0, L = 0, nh = 0, nkv = 0, hd = 0;
  uint64_t E = 0, I = 0, Im = 0, Is = 0;  // experts; dense, expert, shared intermediate
  uint64_t Vp = 0;                        // padded vocabulary
  std::vector<bool> dense;                // per layer: a dense MLP
};

Result<Sizes> CheckSizes(const ModelConfig& m, const EngineParallelism& par) {
  Sizes s;
  s.tp = par.tp;
  s.ep = par.ep;
  const uint64_t tp = s.tp, ep = s.ep;
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
  s.H = m.hidden_size;
  s.hd = m.head_dim;
  s.L = m.num_hidden_layers;
  s.nh = m.num_attention_heads;
  s.nkv = m.num_key_value_heads;
  const bool moe = m.num_experts > 0;
  s.E = m.num_experts;
  s.I = m.intermediate_size;
  s.Im = moe ? m.moe_intermediate_size : 0;
  s.Is = !moe ? 0 : m.mla ? m.n_shared_experts * s.Im : m.shared_expert_intermediate_size;
  s.dense.assign(s.L, !moe);
  for (uint64_t i : m.dense_layers) {
    if (i < s.L) s.dense[i] = true;
  }
  const bool any_dense = std::find(s.dense.begin(), s.dense.end(), true) != s.dense.end();
  if (moe && ep > s.E) {
    return InvalidArgumentError("engine layout: ep " + std::to_string(ep) + " exceeds the " +
                                std::to_string(s.E) + " experts");
  }
  REFIT_RETURN_IF_ERROR(Divides(s.nh, tp, "num_attention_heads"));
  if (m.gpt_oss) {
    // OAIAttention sizes its k and v by num_key_value_heads / tp, and the
    // loader gives every EP rank num_local_experts / ep experts.
    if (s.nkv % tp != 0) {
      return InvalidArgumentError(
          "engine layout: tp " + std::to_string(tp) + " does not divide num_key_value_heads " +
          std::to_string(s.nkv) + " (vLLM's gpt-oss attention splits the KV heads; it "
          "does not replicate them)");
    }
    if (s.E % ep != 0) {
      return InvalidArgumentError("engine layout: ep " + std::to_string(ep) +
                                  " does not divide the " + std::to_string(s.E) +
                                  " experts (vLLM's gpt-oss loader gives each expert-"
                                  "parallel rank num_local_experts / ep of them)");
    }
    // MLPBlock asserts it whatever the expert parallelism.
    REFIT_RETURN_IF_ERROR(Divides(s.Im, tp, "intermediate_size"));
  } else if (!m.mla) {
    if (tp >= s.nkv) {
      if (tp % s.nkv != 0) {
        return InvalidArgumentError(
            "engine layout: num_key_value_heads " + std::to_string(s.nkv) +
            " does not divide tp " + std::to_string(tp) +
            " (vLLM replicates each KV head on tp / num_key_value_heads ranks)");
      }
    } else {
      REFIT_RETURN_IF_ERROR(Divides(s.nkv, tp, "num_key_value_heads"));
    }
  }
  if (any_dense) REFIT_RETURN_IF_ERROR(Divides(s.I, tp, "intermediate_size"));
  if (moe && ep == 1) REFIT_RETURN_IF_ERROR(Divides(s.Im, tp, "moe_intermediate_size"));
  if (s.Is) {
    REFIT_RETURN_IF_ERROR(Divides(s.Is, tp, m.mla ? "the shared experts' intermediate size"
                                                  : "shared_expert_intermediate_size"));
  }
  const uint64_t pad = par.vocab_padding;
  s.Vp = (m.vocab_size + pad - 1) / pad * pad;
  REFIT_RETURN_IF_ERROR(Divides(s.Vp, tp, "the padded vocabulary"));
  return s;
}

// The parameters of engine TP rank t, as vLLM's model classes name them.
class VllmRank {
 public:
  VllmRank(const ModelConfig& m, const Sizes& s, uint64_t t)
      : m_(m), s_(s), t_(t), b_(m.dtype), nq_(s.nh / s.tp), q0_(t * nq_) {
    const auto [e0, e1] = s.ep == 1 ? std::pair<uint64_t, uint64_t>{0, s.E}
                                    : SplitRange(s.E, s.ep, t);
    e0_ = e0;
    e1_ = e1;
    // FusedMoE: with ep == tp whole experts, else every expert with its TP
    // rows.
    n_ = s.ep == 1 ? s.Im / s.tp : s.Im;
    i0_ = s.ep == 1 ? t * n_ : 0;
  }

  RankLayout Build() {
    Vocab(m_.gpt_oss ? "model.embedding.weight" : "model.embed_tokens.weight",
          "model.embed_tokens.weight");
    for (uint64_t i = 0; i < s_.L; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      b_.Whole(p + "input_layernorm.weight", p + "input_layernorm.weight", {s_.H});
      b_.Whole(p + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight",
               {s_.H});
      if (m_.mla) {
        Mla(p);
      } else {
        Attention(p);
      }
      if (s_.dense[i]) {
        Mlp(p + "mlp.", s_.I);
      } else if (m_.gpt_oss) {
        GptOssExperts(p);
      } else {
        Experts(p);
      }
    }
    b_.Whole("model.norm.weight", "model.norm.weight", {s_.H});
    // Tied embeddings: vLLM's lm_head is the embedding module itself, one
    // parameter.
    if (!m_.tie_word_embeddings) Vocab("lm_head.weight", "lm_head.weight");
    RankLayout r;
    r.rank = static_cast<uint32_t>(t_);
    r.tensors = std::move(b_.tensors);
    return r;
  }

 private:
  // VocabParallelEmbedding / ParallelLMHead: even shards of the padded
  // vocabulary.
  void Vocab(const std::string& local, const std::string& canonical) {
    const uint64_t vrows = s_.Vp / s_.tp, v0 = t_ * vrows;
    const uint64_t vreal = v0 >= m_.vocab_size ? 0 : std::min(vrows, m_.vocab_size - v0);
    b_.Add(local, {vrows, s_.H});
    b_.Rows(canonical, v0, vreal, s_.H, 0);
  }

  // QKVParallelLinear: q heads split; kv heads split, or each replicated on
  // tp / nkv consecutive ranks (rank t holds kv head t * nkv / tp).
  // gpt-oss's module is `attn`, with o_proj's bias and the sinks.
  void Attention(const std::string& p) {
    const uint64_t tp = s_.tp, nkv = s_.nkv, hd = s_.hd, H = s_.H;
    const uint64_t nk = tp >= nkv ? 1 : nkv / tp;
    const uint64_t k0 = tp >= nkv ? t_ * nkv / tp : t_ * nk;
    const uint64_t qkv_rows = (nq_ + 2 * nk) * hd;
    const std::string sa = p + (m_.gpt_oss ? "attn." : "self_attn.");
    const std::string hsa = p + "self_attn.";
    for (bool bias : {false, true}) {
      if (bias && !m_.attention_bias) continue;
      const std::string suffix = bias ? "bias" : "weight";
      const uint64_t W = bias ? 1 : H;
      b_.Add(sa + "qkv_proj." + suffix,
             bias ? std::vector<uint64_t>{qkv_rows} : std::vector<uint64_t>{qkv_rows, H});
      b_.Rows(hsa + "q_proj." + suffix, q0_ * hd, nq_ * hd, W, 0);
      b_.Rows(hsa + "k_proj." + suffix, k0 * hd, nk * hd, W, nq_ * hd);
      b_.Rows(hsa + "v_proj." + suffix, k0 * hd, nk * hd, W, (nq_ + nk) * hd);
    }
    b_.Add(sa + "o_proj.weight", {H, nq_ * hd});
    b_.Cols(hsa + "o_proj.weight", H, q0_ * hd, nq_ * hd, s_.nh * hd);
    if (m_.gpt_oss) {
      // RowParallelLinear loads its bias whole on every rank (rank 0 adds it).
      b_.Whole(sa + "o_proj.bias", hsa + "o_proj.bias", {H});
      b_.Add(sa + "sinks", {nq_});
      b_.Rows(hsa + "sinks", q0_, nq_, 1, 0);
    }
    if (m_.qk_norm) {
      b_.Whole(sa + "q_norm.weight", hsa + "q_norm.weight", {hd});
      b_.Whole(sa + "k_norm.weight", hsa + "k_norm.weight", {hd});
    }
  }

  // DeepseekV2MLAAttention: the down projections (fused_qkv_a_proj = q_a
  // rows then kv_a rows, or kv_a_proj_with_mqa alone without q_lora_rank)
  // and their norms replicated; q_b_proj (q_proj), kv_b_proj split by heads
  // along their rows, o_proj by heads along its columns.
  void Mla(const std::string& p) {
    const uint64_t H = s_.H, qlr = m_.q_lora_rank, kvl = m_.kv_lora_rank;
    const uint64_t rope = m_.qk_rope_head_dim, vd = m_.v_head_dim;
    const uint64_t qkh = m_.qk_nope_head_dim + rope, kvh = m_.qk_nope_head_dim + vd;
    const std::string sa = p + "self_attn.";
    if (qlr) {
      b_.Add(sa + "fused_qkv_a_proj.weight", {qlr + kvl + rope, H});
      b_.Rows(sa + "q_a_proj.weight", 0, qlr, H, 0);
      b_.Rows(sa + "kv_a_proj_with_mqa.weight", 0, kvl + rope, H, qlr);
      b_.Whole(sa + "q_a_layernorm.weight", sa + "q_a_layernorm.weight", {qlr});
      b_.Add(sa + "q_b_proj.weight", {nq_ * qkh, qlr});
      b_.Rows(sa + "q_b_proj.weight", q0_ * qkh, nq_ * qkh, qlr, 0);
    } else {
      b_.Add(sa + "q_proj.weight", {nq_ * qkh, H});
      b_.Rows(sa + "q_proj.weight", q0_ * qkh, nq_ * qkh, H, 0);
      b_.Whole(sa + "kv_a_proj_with_mqa.weight", sa + "kv_a_proj_with_mqa.weight",
               {kvl + rope, H});
    }
    b_.Whole(sa + "kv_a_layernorm.weight", sa + "kv_a_layernorm.weight", {kvl});
    b_.Add(sa + "kv_b_proj.weight", {nq_ * kvh, kvl});
    b_.Rows(sa + "kv_b_proj.weight", q0_ * kvh, nq_ * kvh, kvl, 0);
    b_.Add(sa + "o_proj.weight", {H, nq_ * vd});
    b_.Cols(sa + "o_proj.weight", H, q0_ * vd, nq_ * vd, s_.nh * vd);
  }

  // MergedColumnParallelLinear gate_up_proj + RowParallelLinear down_proj
  // (local and canonical names alike).
  void Mlp(const std::string& prefix, uint64_t inter) {
    const uint64_t H = s_.H, n = inter / s_.tp, i0 = t_ * n;
    b_.Add(prefix + "gate_up_proj.weight", {2 * n, H});
    b_.Rows(prefix + "gate_proj.weight", i0, n, H, 0);
    b_.Rows(prefix + "up_proj.weight", i0, n, H, n);
    b_.Add(prefix + "down_proj.weight", {H, n});
    b_.Cols(prefix + "down_proj.weight", H, i0, n, inter);
  }

  // FusedMoE from per-expert tensors: w13_weight [E_local, 2 n, H] (per
  // expert its gate rows, then its up rows), w2_weight [E_local, H, n]; the
  // router and DeepSeek's FP32 score correction bias replicated; the shared
  // experts as a dense MLP.
  void Experts(const std::string& p) {
    const uint64_t H = s_.H, n = n_;
    const std::string mb = p + (m_.mixtral_names ? "block_sparse_moe." : "mlp.");
    b_.Whole(mb + "gate.weight", mb + "gate.weight", {s_.E, H});
    if (m_.e_score_correction_bias) {
      b_.Whole(mb + "gate.e_score_correction_bias", mb + "gate.e_score_correction_bias",
               {s_.E}, "F32");
    }
    auto expert = [&](uint64_t e, const char* which) {
      const std::string x = mb + "experts." + std::to_string(e) + ".";
      if (!m_.mixtral_names) return x + which + "_proj.weight";
      const std::string w(which);
      return x + (w == "gate" ? "w1" : w == "up" ? "w3" : "w2") + ".weight";
    };
    b_.Add(mb + "experts.w13_weight", {e1_ - e0_, 2 * n, H});
    for (uint64_t e = e0_; e < e1_; ++e) {
      const uint64_t j = e - e0_;
      b_.Rows(expert(e, "gate"), i0_, n, H, j * 2 * n);
      b_.Rows(expert(e, "up"), i0_, n, H, j * 2 * n + n);
    }
    b_.Add(mb + "experts.w2_weight", {e1_ - e0_, H, n});
    for (uint64_t e = e0_; e < e1_; ++e) {
      b_.Cols(expert(e, "down"), H, i0_, n, s_.Im, (e - e0_) * H * n);
    }
    if (!s_.Is) return;
    if (m_.mla) {
      Mlp(p + "mlp.shared_experts.", s_.Is);
      return;
    }
    Mlp(p + "mlp.shared_expert.", s_.Is);
    b_.Whole(p + "mlp.shared_expert_gate.weight", p + "mlp.shared_expert_gate.weight",
             {1, H});
  }

  // gpt-oss's FusedMoE from the checkpoint's fused tensors, as its loader
  // fills them: w13_weight [E_local, 2 n, H] is gate_up_proj [E, H, 2 I]
  // narrowed to columns [2 i0, 2 i0 + 2 n) and transposed (gate and up rows
  // stay interleaved, as the swigluoai activation reads them), w2_weight
  // [E_local, H, n] is down_proj [E, I, H] narrowed to rows [i0, i0 + n)
  // and transposed, w13_bias [E_local, 2 n] likewise; w2_bias [E_local, H]
  // is the experts' down_proj_bias with EP, and without it rank 0's alone
  // (the loader zeroes the other ranks', since the row-parallel sum would
  // add it tp times): there it maps nothing.
  void GptOssExperts(const std::string& p) {
    const uint64_t H = s_.H, Im = s_.Im, n = n_, el = e1_ - e0_;
    const std::string x = p + "mlp.experts.";
    b_.Whole(p + "mlp.router.weight", p + "mlp.router.weight", {s_.E, H});
    b_.Whole(p + "mlp.router.bias", p + "mlp.router.bias", {s_.E});
    b_.Add(x + "w13_weight", {el, 2 * n, H});
    for (uint64_t e = e0_; e < e1_; ++e) {
      b_.Strided(x + "gate_up_proj", 2 * n, H, (e - e0_) * 2 * n * H, H,
                 e * H * 2 * Im + 2 * i0_, 1, 2 * Im);
    }
    b_.Add(x + "w13_bias", {el, 2 * n});
    for (uint64_t e = e0_; e < e1_; ++e) {
      b_.Rows(x + "gate_up_proj_bias", e * 2 * Im + 2 * i0_, 2 * n, 1, (e - e0_) * 2 * n);
    }
    b_.Add(x + "w2_weight", {el, H, n});
    for (uint64_t e = e0_; e < e1_; ++e) {
      b_.Strided(x + "down_proj", H, n, (e - e0_) * H * n, n, e * Im * H + i0_ * H, 1, H);
    }
    b_.Add(x + "w2_bias", {el, H});
    if (s_.ep > 1 || t_ == 0) b_.Rows(x + "down_proj_bias", e0_, el, H, 0);
  }

  const ModelConfig& m_;
  const Sizes& s_;
  const uint64_t t_;
  EngineRank b_;
  const uint64_t nq_, q0_;  // q heads of this rank, the first one
  uint64_t e0_ = 0, e1_ = 0, n_ = 0, i0_ = 0;  // local experts; their rows
};

}  // namespace

Result<Layout> GenerateEngineLayout(const ModelConfig& m, const EngineParallelism& par) {
  REFIT_RETURN_IF_ERROR(CheckModelled(m));
  REFIT_ASSIGN_OR_RETURN(Sizes s, CheckSizes(m, par));
  // The canonical tensors (and the checks of the model's sizes) are the
  // trainer generator's at TP 1, without the MTP layers: vLLM's main model
  // skips them (a speculative-decoding draft model loads them), and a
  // layout's canonical tensors must all be mapped.
  ModelConfig main = m;
  main.num_nextn_predict_layers = 0;
  Parallelism trainer;
  if (m.gpt_oss) {  // the trainer generator's one form of gpt-oss's experts
    trainer.gate_up = GateUp::kInterleaved;
    trainer.gate_up_group = 1;
  }
  REFIT_ASSIGN_OR_RETURN(Layout layout, GenerateLayout(main, trainer));
  layout.ranks.clear();
  for (uint64_t t = 0; t < s.tp; ++t) layout.ranks.push_back(VllmRank(m, s, t).Build());
  return layout;
}

}  // namespace refit::layout
