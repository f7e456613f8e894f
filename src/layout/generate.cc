#include "layout/generate.h"

#include <algorithm>
#include <array>
#include <tuple>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "base/file.h"
#include "format/json.h"

namespace refit::layout {
namespace {

using Json = nlohmann::json;

Result<uint64_t> ConfigInt(const Json& j, const char* key, bool required,
                           uint64_t fallback = 0) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) {
      return InvalidArgumentError(std::string("config.json: missing \"") + key + "\"");
    }
    return fallback;
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    return InvalidArgumentError(std::string("config.json: \"") + key +
                                "\" is not a non-negative integer");
  }
  return static_cast<uint64_t>(it->get<int64_t>());
}

Result<bool> ConfigBool(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return InvalidArgumentError(std::string("config.json: \"") + key +
                                "\" is not true or false");
  }
  return it->get<bool>();
}

// Builds one rank's local tensors.
class RankBuilder {
 public:
  RankBuilder(const Parallelism& par, std::string dtype)
      : par_(par), dtype_(std::move(dtype)) {}

  // A local tensor whose logical (untransposed) shape is [rows, cols]; cols
  // == 0 for 1-D tensors. Transposed when `transposable` and par.transposed.
  LocalTensor* Add(std::string name, uint64_t rows, uint64_t cols,
                   bool transposable = true) {
    LocalTensor t;
    t.name = std::move(name);
    t.dtype = dtype_;
    bool tr = cols > 0 && transposable && par_.transposed;
    if (cols == 0) {
      t.shape = {rows};
    } else {
      t.shape = tr ? std::vector<uint64_t>{cols, rows}
                   : std::vector<uint64_t>{rows, cols};
    }
    tensors.push_back(std::move(t));
    transposed_.push_back(tr);
    return &tensors.back();
  }

  // Maps `groups` repeats of an n x w rectangle: repeat j covers logical
  // local rows [lr0 + j*lstep, +n), cols [lc0, +w) and canonical rows
  // [cr0 + j*cstep, +n), cols [cc0, +w). Local logical width `lcols`,
  // canonical width `ccols` (both 1 for 1-D tensors).
  void Rect(const std::string& canonical, uint64_t groups, uint64_t n,
            uint64_t w, uint64_t lr0, uint64_t lstep, uint64_t lc0,
            uint64_t cr0, uint64_t cstep, uint64_t cc0, uint64_t ccols) {
    if (groups == 0 || n == 0 || w == 0) return;
    LocalTensor& t = tensors.back();
    bool one_d = t.shape.size() == 1;
    uint64_t lrows = one_d ? t.shape[0] : (transposed_.back() ? t.shape[1] : t.shape[0]);
    uint64_t lcols = one_d ? 1 : (transposed_.back() ? t.shape[0] : t.shape[1]);
    Piece p;
    p.canonical = canonical;
    if (!transposed_.back()) {
      if (w == lcols && w == ccols && lc0 == 0 && cc0 == 0 && (groups > 1 || one_d)) {
        // Whole rows: each repeat is one contiguous run on both sides.
        p.rows = groups;
        p.cols = n * w;
        p.local_offset = lr0 * lcols;
        p.local_row_stride = groups > 1 ? lstep * lcols : n * w;
        p.local_col_stride = 1;
        p.canon_offset = cr0 * ccols;
        p.canon_row_stride = groups > 1 ? cstep * ccols : n * w;
        p.canon_col_stride = 1;
        t.pieces.push_back(p);
        return;
      }
      for (uint64_t j = 0; j < groups; ++j) {
        p.rows = n;
        p.cols = w;
        p.local_offset = (lr0 + j * lstep) * lcols + lc0;
        p.local_row_stride = lcols;
        p.local_col_stride = 1;
        p.canon_offset = (cr0 + j * cstep) * ccols + cc0;
        p.canon_row_stride = ccols;
        p.canon_col_stride = 1;
        t.pieces.push_back(p);
      }
      return;
    }
    // Stored [lcols, lrows]: block row r is logical column lc0 + r, block
    // column c is logical row; canonical runs go down its columns.
    for (uint64_t j = 0; j < groups; ++j) {
      p.rows = w;
      p.cols = n;
      p.local_offset = lc0 * lrows + lr0 + j * lstep;
      p.local_row_stride = lrows;
      p.local_col_stride = 1;
      p.canon_offset = (cr0 + j * cstep) * ccols + cc0;
      p.canon_row_stride = 1;
      p.canon_col_stride = ccols;
      t.pieces.push_back(p);
    }
  }

  std::vector<LocalTensor> tensors;

 private:
  const Parallelism& par_;
  std::string dtype_;
  std::vector<bool> transposed_;
};

struct AttentionShard {
  uint64_t g0 = 0, g1 = 0;  // local query groups
  uint64_t qa = 0, qb = 0;  // q heads of each local group, within the group
};

Result<AttentionShard> ShardAttention(const ModelConfig& m, uint64_t tp,
                                      uint64_t t) {
  uint64_t groups = m.num_key_value_heads;
  uint64_t hpg = m.num_attention_heads / groups;
  AttentionShard s;
  if (tp <= groups) {
    std::tie(s.g0, s.g1) = SplitRange(groups, tp, t);
    s.qa = 0;
    s.qb = hpg;
    return s;
  }
  // More ranks than KV heads: ranks share a query group (and replicate its
  // KV head), splitting its q heads.
  uint64_t g = t * groups / tp;
  uint64_t first = (g * tp + groups - 1) / groups;
  uint64_t last = ((g + 1) * tp + groups - 1) / groups;
  uint64_t m_ranks = last - first;
  if (hpg < m_ranks) {
    return InvalidArgumentError(
        "tp " + std::to_string(tp) + " is too large: " + std::to_string(m_ranks) +
        " ranks would share a query group of " + std::to_string(hpg) +
        " q heads");
  }
  s.g0 = g;
  s.g1 = g + 1;
  std::tie(s.qa, s.qb) = SplitRange(hpg, m_ranks, t - first);
  return s;
}

}  // namespace

Result<ModelConfig> ParseModelConfig(std::string_view json) {
  REFIT_ASSIGN_OR_RETURN(Json j, internal::ParseJsonStrict(json, 64, "config.json"));
  if (!j.is_object()) return InvalidArgumentError("config.json: not an object");
  ModelConfig m;
  try {
    if (auto it = j.find("model_type"); it != j.end() && it->is_string()) {
      m.model_type = it->get<std::string>();
    }
    for (const char* key : {"torch_dtype", "dtype"}) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_string()) continue;
      static const std::map<std::string, std::string> kDtypes = {
          {"bfloat16", "BF16"}, {"float16", "F16"}, {"float32", "F32"}};
      auto d = kDtypes.find(it->get<std::string>());
      if (d == kDtypes.end()) {
        return InvalidArgumentError("config.json: dtype " + it->get<std::string>() +
                                    " is not bfloat16, float16 or float32");
      }
      m.dtype = d->second;
    }
    REFIT_ASSIGN_OR_RETURN(m.hidden_size, ConfigInt(j, "hidden_size", true));
    REFIT_ASSIGN_OR_RETURN(m.intermediate_size, ConfigInt(j, "intermediate_size", true));
    REFIT_ASSIGN_OR_RETURN(m.num_hidden_layers, ConfigInt(j, "num_hidden_layers", true));
    REFIT_ASSIGN_OR_RETURN(m.num_attention_heads,
                           ConfigInt(j, "num_attention_heads", true));
    REFIT_ASSIGN_OR_RETURN(m.num_key_value_heads,
                           ConfigInt(j, "num_key_value_heads", false,
                                     m.num_attention_heads));
    REFIT_ASSIGN_OR_RETURN(m.vocab_size, ConfigInt(j, "vocab_size", true));
    if (m.num_attention_heads == 0 || m.hidden_size == 0) {
      return InvalidArgumentError("config.json: hidden_size and num_attention_heads "
                                  "must be positive");
    }
    REFIT_ASSIGN_OR_RETURN(m.head_dim, ConfigInt(j, "head_dim", false,
                                                 m.hidden_size / m.num_attention_heads));
    REFIT_ASSIGN_OR_RETURN(m.tie_word_embeddings,
                           ConfigBool(j, "tie_word_embeddings", false));
    bool qwen2 = m.model_type.rfind("qwen2", 0) == 0;
    bool qwen3 = m.model_type.rfind("qwen3", 0) == 0;
    REFIT_ASSIGN_OR_RETURN(m.attention_bias, ConfigBool(j, "attention_bias", qwen2));
    m.qk_norm = qwen3;
    REFIT_ASSIGN_OR_RETURN(uint64_t e1, ConfigInt(j, "num_experts", false));
    REFIT_ASSIGN_OR_RETURN(uint64_t e2, ConfigInt(j, "num_local_experts", false));
    m.num_experts = e1 ? e1 : e2;
    REFIT_ASSIGN_OR_RETURN(m.moe_intermediate_size,
                           ConfigInt(j, "moe_intermediate_size", false,
                                     m.intermediate_size));
    REFIT_ASSIGN_OR_RETURN(m.shared_expert_intermediate_size,
                           ConfigInt(j, "shared_expert_intermediate_size", false));
    m.mixtral_names = m.model_type == "mixtral";
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("config.json: ") + e.what());
  }
  return m;
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
  Result<ModelConfig> m = ParseModelConfig(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!m.ok()) return m.status().WithContext(path);
  return m;
}

Result<Layout> GenerateLayout(const ModelConfig& m, const Parallelism& par) {
  const uint64_t H = m.hidden_size, hd = m.head_dim, L = m.num_hidden_layers;
  const uint64_t nh = m.num_attention_heads, nkv = m.num_key_value_heads;
  const uint64_t tp = par.tp, pp = par.pp, dp = par.dp, cp = par.cp, ep = par.ep;
  if (tp == 0 || pp == 0 || dp == 0 || cp == 0 || ep == 0) {
    return InvalidArgumentError("tp, pp, ep, dp and cp must be at least 1");
  }
  if (H == 0 || hd == 0 || L == 0 || nh == 0 || nkv == 0 || m.vocab_size == 0 ||
      m.intermediate_size == 0) {
    return InvalidArgumentError("model config has a zero size");
  }
  if (nh % nkv != 0) {
    return InvalidArgumentError("num_attention_heads " + std::to_string(nh) +
                                " is not a multiple of num_key_value_heads " +
                                std::to_string(nkv));
  }
  if (pp > L) {
    return InvalidArgumentError("pp " + std::to_string(pp) + " exceeds the " +
                                std::to_string(L) + " layers");
  }
  if (dp % ep != 0) {
    return InvalidArgumentError("ep " + std::to_string(ep) + " does not divide dp " +
                                std::to_string(dp));
  }
  if (par.gate_up == GateUp::kInterleaved && par.gate_up_group == 0) {
    return InvalidArgumentError("interleaved gate/up needs a group size > 0");
  }
  const bool moe = m.num_experts > 0;
  if (moe && ep > m.num_experts) {
    return InvalidArgumentError("ep " + std::to_string(ep) + " exceeds the " +
                                std::to_string(m.num_experts) + " experts");
  }
  const uint64_t I = m.intermediate_size;
  const uint64_t Im = moe ? m.moe_intermediate_size : 0;
  const uint64_t Is = moe ? m.shared_expert_intermediate_size : 0;
  for (uint64_t n : {moe ? Im : I, Is}) {
    if (n != 0 && n < tp) {
      return InvalidArgumentError("tp " + std::to_string(tp) + " exceeds an "
                                  "intermediate size of " + std::to_string(n));
    }
  }
  const uint64_t vmul = std::max<uint64_t>(1, par.vocab_multiple) * tp;
  const uint64_t Vp = (m.vocab_size + vmul - 1) / vmul * vmul;
  const std::string local_dtype = par.local_dtype.empty() ? m.dtype : par.local_dtype;

  Layout layout;
  auto canon = [&](std::string name, std::vector<uint64_t> shape) {
    layout.canonical.push_back({std::move(name), m.dtype, std::move(shape), "", "", 0, 0});
  };
  // Canonical names.
  const std::string embed = "model.embed_tokens.weight";
  canon(embed, {m.vocab_size, H});
  if (!m.tie_word_embeddings) canon("lm_head.weight", {m.vocab_size, H});
  canon("model.norm.weight", {H});
  auto mlp_names = [&](const std::string& prefix, bool mixtral) {
    return mixtral ? std::array<std::string, 3>{prefix + "w1.weight", prefix + "w3.weight",
                                                prefix + "w2.weight"}
                   : std::array<std::string, 3>{prefix + "gate_proj.weight",
                                                prefix + "up_proj.weight",
                                                prefix + "down_proj.weight"};
  };
  const std::string moe_block = m.mixtral_names ? "block_sparse_moe." : "mlp.";
  for (uint64_t i = 0; i < L; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    canon(p + "input_layernorm.weight", {H});
    canon(p + "post_attention_layernorm.weight", {H});
    canon(p + "self_attn.q_proj.weight", {nh * hd, H});
    canon(p + "self_attn.k_proj.weight", {nkv * hd, H});
    canon(p + "self_attn.v_proj.weight", {nkv * hd, H});
    canon(p + "self_attn.o_proj.weight", {H, nh * hd});
    if (m.attention_bias) {
      canon(p + "self_attn.q_proj.bias", {nh * hd});
      canon(p + "self_attn.k_proj.bias", {nkv * hd});
      canon(p + "self_attn.v_proj.bias", {nkv * hd});
    }
    if (m.qk_norm) {
      canon(p + "self_attn.q_norm.weight", {hd});
      canon(p + "self_attn.k_norm.weight", {hd});
    }
    if (!moe) {
      auto n = mlp_names(p + "mlp.", false);
      canon(n[0], {I, H});
      canon(n[1], {I, H});
      canon(n[2], {H, I});
      continue;
    }
    canon(p + moe_block + "gate.weight", {m.num_experts, H});
    for (uint64_t e = 0; e < m.num_experts; ++e) {
      auto n = mlp_names(p + moe_block + "experts." + std::to_string(e) + ".",
                         m.mixtral_names);
      canon(n[0], {Im, H});
      canon(n[1], {Im, H});
      canon(n[2], {H, Im});
    }
    if (Is) {
      auto n = mlp_names(p + "mlp.shared_expert.", false);
      canon(n[0], {Is, H});
      canon(n[1], {Is, H});
      canon(n[2], {H, Is});
      canon(p + "mlp.shared_expert_gate.weight", {1, H});
    }
  }
  std::sort(layout.canonical.begin(), layout.canonical.end(),
            [](const CanonicalTensor& a, const CanonicalTensor& b) { return a.name < b.name; });

  const uint64_t hpg = nh / nkv;
  for (uint64_t stage = 0; stage < pp; ++stage) {
    auto [l0, l1] = SplitRange(L, pp, stage);
    for (uint64_t d = 0; d < dp; ++d) {
      uint64_t e_idx = d % ep;
      for (uint64_t c = 0; c < cp; ++c) {
        for (uint64_t t = 0; t < tp; ++t) {
          RankBuilder b(par, local_dtype);
          REFIT_ASSIGN_OR_RETURN(AttentionShard a, ShardAttention(m, tp, t));
          const uint64_t ng = a.g1 - a.g0, nqg = a.qb - a.qa;
          const uint64_t q0 = a.g0 * hpg + a.qa;  // first local q head (contiguous)
          const uint64_t nq = ng * nqg;
          const uint64_t vrows = Vp / tp, v0 = t * vrows;
          const uint64_t vreal =
              v0 >= m.vocab_size ? 0 : std::min(vrows, m.vocab_size - v0);
          if (stage == 0) {
            b.Add("embedding.word_embeddings.weight", vrows, H, false);
            b.Rect(embed, 1, vreal, H, 0, 0, 0, v0, 0, 0, H);
          }
          // A fused or plain MLP of intermediate size `inter`, TP-split.
          auto mlp = [&](const std::string& local, const std::array<std::string, 3>& hf,
                         uint64_t inter) {
            auto [i0, i1] = SplitRange(inter, tp, t);
            uint64_t n = i1 - i0;
            if (par.gate_up == GateUp::kSeparate) {
              b.Add(local + "linear_fc1_gate.weight", n, H);
              b.Rect(hf[0], 1, n, H, 0, 0, 0, i0, 0, 0, H);
              b.Add(local + "linear_fc1_up.weight", n, H);
              b.Rect(hf[1], 1, n, H, 0, 0, 0, i0, 0, 0, H);
            } else if (par.gate_up == GateUp::kConcat) {
              b.Add(local + "linear_fc1.weight", 2 * n, H);
              b.Rect(hf[0], 1, n, H, 0, 0, 0, i0, 0, 0, H);
              b.Rect(hf[1], 1, n, H, n, 0, 0, i0, 0, 0, H);
            } else {
              uint64_t N = par.gate_up_group, full = n / N, tail = n % N;
              b.Add(local + "linear_fc1.weight", 2 * n, H);
              b.Rect(hf[0], full, N, H, 0, 2 * N, 0, i0, N, 0, H);
              b.Rect(hf[1], full, N, H, N, 2 * N, 0, i0, N, 0, H);
              b.Rect(hf[0], 1, tail, H, 2 * N * full, 0, 0, i0 + N * full, 0, 0, H);
              b.Rect(hf[1], 1, tail, H, 2 * N * full + tail, 0, 0, i0 + N * full, 0, 0,
                     H);
            }
            b.Add(local + "linear_fc2.weight", H, n);
            b.Rect(hf[2], 1, H, n, 0, 0, 0, 0, 0, i0, inter);
          };
          for (uint64_t i = l0; i < l1; ++i) {
            std::string lp = "decoder.layers." + std::to_string(i - l0) + ".";
            std::string hp = "model.layers." + std::to_string(i) + ".";
            b.Add(lp + "input_layernorm.weight", H, 0);
            b.Rect(hp + "input_layernorm.weight", 1, H, 1, 0, 0, 0, 0, 0, 0, 1);
            b.Add(lp + "pre_mlp_layernorm.weight", H, 0);
            b.Rect(hp + "post_attention_layernorm.weight", 1, H, 1, 0, 0, 0, 0, 0, 0, 1);
            // Attention.
            const std::string sa = lp + "self_attention.", hsa = hp + "self_attn.";
            for (bool bias : {false, true}) {
              if (bias && !m.attention_bias) continue;
              const std::string suffix = bias ? "bias" : "weight";
              const uint64_t W = bias ? 1 : H;
              const uint64_t ccols = bias ? 1 : H;
              uint64_t cols = bias ? 0 : H;
              if (par.fused_qkv) {
                uint64_t per = (nqg + 2) * hd;
                b.Add(sa + "linear_qkv." + suffix, ng * per, cols);
                b.Rect(hsa + "q_proj." + suffix, ng, nqg * hd, W, 0, per, 0, q0 * hd,
                       hpg * hd, 0, ccols);
                b.Rect(hsa + "k_proj." + suffix, ng, hd, W, nqg * hd, per, 0, a.g0 * hd,
                       hd, 0, ccols);
                b.Rect(hsa + "v_proj." + suffix, ng, hd, W, (nqg + 1) * hd, per, 0,
                       a.g0 * hd, hd, 0, ccols);
              } else {
                b.Add(sa + "linear_q." + suffix, nq * hd, cols);
                b.Rect(hsa + "q_proj." + suffix, 1, nq * hd, W, 0, 0, 0, q0 * hd, 0, 0,
                       ccols);
                b.Add(sa + "linear_k." + suffix, ng * hd, cols);
                b.Rect(hsa + "k_proj." + suffix, 1, ng * hd, W, 0, 0, 0, a.g0 * hd, 0, 0,
                       ccols);
                b.Add(sa + "linear_v." + suffix, ng * hd, cols);
                b.Rect(hsa + "v_proj." + suffix, 1, ng * hd, W, 0, 0, 0, a.g0 * hd, 0, 0,
                       ccols);
              }
            }
            if (m.qk_norm) {
              b.Add(sa + "q_layernorm.weight", hd, 0);
              b.Rect(hsa + "q_norm.weight", 1, hd, 1, 0, 0, 0, 0, 0, 0, 1);
              b.Add(sa + "k_layernorm.weight", hd, 0);
              b.Rect(hsa + "k_norm.weight", 1, hd, 1, 0, 0, 0, 0, 0, 0, 1);
            }
            b.Add(sa + "linear_proj.weight", H, nq * hd);
            b.Rect(hsa + "o_proj.weight", 1, H, nq * hd, 0, 0, 0, 0, 0, q0 * hd, nh * hd);
            // MLP.
            if (!moe) {
              mlp(lp + "mlp.", mlp_names(hp + "mlp.", false), I);
              continue;
            }
            b.Add(lp + "mlp.router.weight", m.num_experts, H);
            b.Rect(hp + moe_block + "gate.weight", 1, m.num_experts, H, 0, 0, 0, 0, 0, 0,
                   H);
            auto [e0, e1] = SplitRange(m.num_experts, ep, e_idx);
            for (uint64_t e = e0; e < e1; ++e) {
              mlp(lp + "mlp.experts.local_experts." + std::to_string(e - e0) + ".",
                  mlp_names(hp + moe_block + "experts." + std::to_string(e) + ".",
                            m.mixtral_names),
                  Im);
            }
            if (Is) {
              mlp(lp + "mlp.shared_experts.", mlp_names(hp + "mlp.shared_expert.", false),
                  Is);
              b.Add(lp + "mlp.shared_experts.gate_weight", 1, H);
              b.Rect(hp + "mlp.shared_expert_gate.weight", 1, 1, H, 0, 0, 0, 0, 0, 0, H);
            }
          }
          if (stage == pp - 1) {
            b.Add("decoder.final_layernorm.weight", H, 0);
            b.Rect("model.norm.weight", 1, H, 1, 0, 0, 0, 0, 0, 0, 1);
            if (!m.tie_word_embeddings || pp > 1) {
              b.Add("output_layer.weight", vrows, H, false);
              b.Rect(m.tie_word_embeddings ? embed : "lm_head.weight", 1, vreal, H, 0, 0,
                     0, v0, 0, 0, H);
            }
          }
          RankLayout r;
          r.rank = static_cast<uint32_t>(t + tp * (c + cp * (d + dp * stage)));
          r.tensors = std::move(b.tensors);
          layout.ranks.push_back(std::move(r));
        }
      }
    }
  }
  std::sort(layout.ranks.begin(), layout.ranks.end(),
            [](const RankLayout& a, const RankLayout& b) { return a.rank < b.rank; });
  return layout;
}

}  // namespace refit::layout
