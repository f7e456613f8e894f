// Engine layouts (vLLM): coverage at many TP / EP sizes, every rank's
// local tensors filled through the layout compared byte for byte with a
// reference that slices and concatenates the canonical tensors the way
// vLLM's weight loaders do (dense and MoE models, DeepSeek-V3 / Kimi-K2's
// multi-head latent attention, gpt-oss's fused experts and sinks), refusal
// of what the generator does not model, and real-size Qwen3-MoE,
// DeepSeek-V3, Kimi-K2 and gpt-oss.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "layout/generate.h"
#include "layout/layout.h"
#include "support/frontier_configs.h"
#include "support/test_layout.h"
#include "support/testing.h"

namespace refit::layout {
namespace {

using testing::GptOss120bConfig;
using testing::kDeepSeekV3;
using testing::kKimiK2;
using testing::kTinyGptOss;
using testing::RandomCanonical;
using testing::ScatterToRanks;
using testing::TensorBytes;
using testing::TinyDeepSeekV3Config;

constexpr uint8_t kPad = 0xA5;

ModelConfig Llama() {
  ModelConfig m;
  m.model_type = "llama";
  m.hidden_size = 64;
  m.intermediate_size = 96;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 8;
  m.num_key_value_heads = 2;
  m.head_dim = 8;
  m.vocab_size = 300;  // padded to 320
  return m;
}

ModelConfig Qwen2() {
  ModelConfig m = Llama();
  m.model_type = "qwen2";
  m.attention_bias = true;
  return m;
}

ModelConfig Qwen3Tied() {
  ModelConfig m = Llama();
  m.model_type = "qwen3";
  m.qk_norm = true;
  m.tie_word_embeddings = true;
  return m;
}

ModelConfig Mixtral() {
  ModelConfig m = Llama();
  m.model_type = "mixtral";
  m.mixtral_names = true;
  m.num_experts = 6;
  m.moe_intermediate_size = 32;
  return m;
}

ModelConfig Qwen3Moe() {
  ModelConfig m = Qwen3Tied();
  m.model_type = "qwen3_moe";
  m.tie_word_embeddings = false;
  m.num_experts = 8;
  m.moe_intermediate_size = 16;
  m.num_hidden_layers = 3;
  return m;
}

// Qwen2-MoE with a shared expert and a dense first layer (mlp_only_layers).
ModelConfig Qwen2Moe() {
  ModelConfig m = Qwen2();
  m.model_type = "qwen2_moe";
  m.num_experts = 4;
  m.moe_intermediate_size = 16;
  m.shared_expert_intermediate_size = 48;
  m.num_hidden_layers = 3;
  m.dense_layers = {0};
  return m;
}

ModelConfig Parse(const std::string& json) {
  Result<ModelConfig> m = ParseModelConfig(json);
  EXPECT_OK(m);
  return m.ok() ? *m : ModelConfig{};
}

ModelConfig DeepSeekV3(uint64_t q_lora_rank, const char* type = "deepseek_v3") {
  return Parse(TinyDeepSeekV3Config(q_lora_rank, type));
}

ModelConfig GptOss() { return Parse(kTinyGptOss); }

// The reference: rank t's parameters as vLLM's loaders fill them from the
// canonical tensors, written from vLLM's formulas, not the generator's.
// Elements are BF16 but for DeepSeek's FP32 score correction bias, which is
// only copied whole.
class VllmReference {
 public:
  VllmReference(const ModelConfig& m, const TensorBytes& canon, uint64_t tp, uint64_t ep,
                uint64_t t)
      : m_(m), c_(canon), tp_(tp), ep_(ep), t_(t) {}

  std::map<std::string, std::vector<uint8_t>> Build() {
    const uint64_t H = m_.hidden_size;
    // VocabParallelEmbedding: pad_vocab_size(V, 64), divide(padded, tp).
    const uint64_t padded = (m_.vocab_size + 63) / 64 * 64, per = padded / tp_;
    auto vocab = [&](const std::string& name) {
      std::vector<uint8_t> out(per * H * 2, kPad);
      for (uint64_t r = 0; r < per; ++r) {
        uint64_t v = t_ * per + r;
        if (v >= m_.vocab_size) break;
        std::memcpy(&out[r * H * 2], &c_.at(name)[v * H * 2], H * 2);
      }
      return out;
    };
    // gpt-oss's WeightsMapper: embed_tokens -> embedding, self_attn -> attn.
    out_[m_.gpt_oss ? "model.embedding.weight" : "model.embed_tokens.weight"] =
        vocab("model.embed_tokens.weight");
    if (!m_.tie_word_embeddings) out_["lm_head.weight"] = vocab("lm_head.weight");
    Copy("model.norm.weight");
    for (uint64_t i = 0; i < m_.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      Copy(p + "input_layernorm.weight");
      Copy(p + "post_attention_layernorm.weight");
      if (m_.mla) {
        Mla(p + "self_attn.");
      } else {
        Attention(p);
      }
      bool dense = m_.num_experts == 0;
      for (uint64_t d : m_.dense_layers) dense |= d == i;
      if (dense) {
        Mlp(p + "mlp.", m_.intermediate_size);
      } else if (m_.gpt_oss) {
        GptOssExperts(p + "mlp.");
      } else {
        FusedMoe(p);
      }
    }
    return out_;
  }

 private:
  void Copy(const std::string& name) { out_[name] = c_.at(name); }
  static void Append(std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
  }
  // Rows [r0, r0 + n) of a canonical tensor `width` elements wide.
  std::vector<uint8_t> RowSlice(const std::string& name, uint64_t width, uint64_t r0,
                                uint64_t n) {
    const std::vector<uint8_t>& b = c_.at(name);
    return {b.begin() + static_cast<long>(r0 * width * 2),
            b.begin() + static_cast<long>((r0 + n) * width * 2)};
  }
  // Columns [c0, c0 + n) of a [rows, cols] canonical tensor.
  std::vector<uint8_t> ColSlice(const std::string& name, uint64_t rows, uint64_t cols,
                                uint64_t c0, uint64_t n) {
    const std::vector<uint8_t>& b = c_.at(name);
    std::vector<uint8_t> out;
    for (uint64_t r = 0; r < rows; ++r) {
      auto at = b.begin() + static_cast<long>((r * cols + c0) * 2);
      out.insert(out.end(), at, at + static_cast<long>(n * 2));
    }
    return out;
  }
  // Expert e of a canonical [E, rows, cols] tensor narrowed to rows
  // [r0, r0 + nr) and columns [c0, c0 + nc), then transposed: [nc, nr]
  // (torch's narrowing and permute(0, 2, 1)).
  std::vector<uint8_t> NarrowT(const std::string& name, uint64_t e, uint64_t rows,
                               uint64_t cols, uint64_t r0, uint64_t nr, uint64_t c0,
                               uint64_t nc) {
    const std::vector<uint8_t>& b = c_.at(name);
    std::vector<uint8_t> out;
    for (uint64_t c = c0; c < c0 + nc; ++c) {
      for (uint64_t r = r0; r < r0 + nr; ++r) {
        auto at = b.begin() + static_cast<long>(((e * rows + r) * cols + c) * 2);
        out.insert(out.end(), at, at + 2);
      }
    }
    return out;
  }

  // QKVParallelLinear.
  void Attention(const std::string& p) {
    const uint64_t H = m_.hidden_size, hd = m_.head_dim;
    const uint64_t heads = m_.num_attention_heads, kv = m_.num_key_value_heads;
    const uint64_t q_heads = heads / tp_;
    const uint64_t kv_heads = tp_ >= kv ? 1 : kv / tp_;
    const uint64_t replicas = tp_ >= kv ? tp_ / kv : 1;
    const uint64_t kv_shard = t_ / replicas;  // weight_loader's shard_id
    const std::string a = p + "self_attn.", local = p + (m_.gpt_oss ? "attn." : "self_attn.");
    for (std::string s : {"weight", "bias"}) {
      if (s == "bias" && !m_.attention_bias) continue;
      const uint64_t w = s == "bias" ? 1 : H;
      std::vector<uint8_t>& qkv = out_[local + "qkv_proj." + s];
      Append(qkv, RowSlice(a + "q_proj." + s, w, t_ * q_heads * hd, q_heads * hd));
      Append(qkv, RowSlice(a + "k_proj." + s, w, kv_shard * kv_heads * hd, kv_heads * hd));
      Append(qkv, RowSlice(a + "v_proj." + s, w, kv_shard * kv_heads * hd, kv_heads * hd));
    }
    out_[local + "o_proj.weight"] =
        ColSlice(a + "o_proj.weight", H, heads * hd, t_ * q_heads * hd, q_heads * hd);
    if (m_.qk_norm) {
      Copy(a + "q_norm.weight");
      Copy(a + "k_norm.weight");
    }
    if (m_.gpt_oss) {
      out_[local + "o_proj.bias"] = c_.at(a + "o_proj.bias");
      // weight.narrow(0, head_start, heads_per_rank)
      out_[local + "sinks"] = RowSlice(a + "sinks", 1, t_ * q_heads, q_heads);
    }
  }

  // DeepseekV2MLAAttention: stacked_params_mapping's fused_qkv_a_proj
  // (shard 0 q_a_proj, shard 1 kv_a_proj_with_mqa, disable_tp);
  // ColumnParallelLinear q_b_proj / q_proj / kv_b_proj, RowParallelLinear
  // o_proj.
  void Mla(const std::string& a) {
    const uint64_t H = m_.hidden_size, heads = m_.num_attention_heads, local = heads / tp_;
    const uint64_t qk = m_.qk_nope_head_dim + m_.qk_rope_head_dim;
    const uint64_t kvh = m_.qk_nope_head_dim + m_.v_head_dim, vd = m_.v_head_dim;
    if (m_.q_lora_rank) {
      std::vector<uint8_t>& fused = out_[a + "fused_qkv_a_proj.weight"];
      Append(fused, c_.at(a + "q_a_proj.weight"));
      Append(fused, c_.at(a + "kv_a_proj_with_mqa.weight"));
      Copy(a + "q_a_layernorm.weight");
      out_[a + "q_b_proj.weight"] =
          RowSlice(a + "q_b_proj.weight", m_.q_lora_rank, t_ * local * qk, local * qk);
    } else {
      out_[a + "q_proj.weight"] = RowSlice(a + "q_proj.weight", H, t_ * local * qk, local * qk);
      Copy(a + "kv_a_proj_with_mqa.weight");
    }
    Copy(a + "kv_a_layernorm.weight");
    out_[a + "kv_b_proj.weight"] =
        RowSlice(a + "kv_b_proj.weight", m_.kv_lora_rank, t_ * local * kvh, local * kvh);
    out_[a + "o_proj.weight"] =
        ColSlice(a + "o_proj.weight", H, heads * vd, t_ * local * vd, local * vd);
  }

  // FusedMoE's expert range on this rank and its TP split: with EP,
  // determine_expert_map's contiguous ranges and tp_size 1 for the experts.
  void ExpertRange(uint64_t* first, uint64_t* count, uint64_t* etp, uint64_t* erank) const {
    const uint64_t E = m_.num_experts;
    *first = 0, *count = E, *etp = tp_, *erank = t_;
    if (ep_ > 1) {
      const uint64_t base = E / ep_, rem = E % ep_;
      *count = base + (t_ < rem ? 1 : 0);
      *first = t_ * base + std::min(t_, rem);
      *etp = 1;
      *erank = 0;
    }
  }

  void FusedMoe(const std::string& p) {
    const uint64_t H = m_.hidden_size;
    const std::string mb = p + (m_.mixtral_names ? "block_sparse_moe." : "mlp.");
    Copy(mb + "gate.weight");
    if (m_.e_score_correction_bias) Copy(mb + "gate.e_score_correction_bias");
    const uint64_t I = m_.moe_intermediate_size;
    uint64_t first, count, etp, erank;
    ExpertRange(&first, &count, &etp, &erank);
    const uint64_t shard = I / etp;
    std::vector<uint8_t>& w13 = out_[mb + "experts.w13_weight"];
    std::vector<uint8_t>& w2 = out_[mb + "experts.w2_weight"];
    for (uint64_t e = first; e < first + count; ++e) {
      const std::string x = mb + "experts." + std::to_string(e) + ".";
      const std::string w1 = x + (m_.mixtral_names ? "w1" : "gate_proj") + ".weight";
      const std::string w3 = x + (m_.mixtral_names ? "w3" : "up_proj") + ".weight";
      const std::string w2n = x + (m_.mixtral_names ? "w2" : "down_proj") + ".weight";
      Append(w13, RowSlice(w1, H, erank * shard, shard));
      Append(w13, RowSlice(w3, H, erank * shard, shard));
      Append(w2, ColSlice(w2n, H, I, erank * shard, shard));
    }
    if (m_.shared_expert_intermediate_size) {
      Mlp(p + "mlp.shared_expert.", m_.shared_expert_intermediate_size);
      Copy(p + "mlp.shared_expert_gate.weight");
    }
    if (m_.n_shared_experts) {
      Mlp(p + "mlp.shared_experts.", m_.n_shared_experts * I);
    }
  }

  // GptOssModel._load_weights_other: tp_rank_start = rank * cdiv(I, tp);
  // with EP experts [rank * E / ep, (rank + 1) * E / ep), whole.
  void GptOssExperts(const std::string& mlp) {
    const uint64_t H = m_.hidden_size, I = m_.moe_intermediate_size, E = m_.num_experts;
    Copy(mlp + "router.weight");
    Copy(mlp + "router.bias");
    const std::string x = mlp + "experts.";
    const bool use_ep = ep_ > 1;
    const uint64_t per = (I + tp_ - 1) / tp_;
    const uint64_t start = use_ep ? 0 : t_ * per, end = use_ep ? I : std::min(start + per, I);
    const uint64_t e0 = use_ep ? t_ * (E / ep_) : 0, e1 = use_ep ? e0 + E / ep_ : E;
    for (uint64_t e = e0; e < e1; ++e) {
      const uint64_t n = end - start;
      // gate_up_proj [E, H, 2I][:, :, 2 start : 2 end].permute(0, 2, 1)
      Append(out_[x + "w13_weight"], NarrowT(x + "gate_up_proj", e, H, 2 * I, 0, H,
                                             2 * start, 2 * n));
      // down_proj [E, I, H][:, start : end, :].permute(0, 2, 1)
      Append(out_[x + "w2_weight"], NarrowT(x + "down_proj", e, I, H, start, n, 0, H));
      Append(out_[x + "w13_bias"],
             RowSlice(x + "gate_up_proj_bias", 1, e * 2 * I + 2 * start, 2 * n));
      // w2_bias: the EP slice; without EP the whole bias on rank 0, zeroes
      // on the others (padding here: nothing is written there).
      if (use_ep || t_ == 0) {
        Append(out_[x + "w2_bias"], RowSlice(x + "down_proj_bias", H, e, 1));
      } else {
        Append(out_[x + "w2_bias"], std::vector<uint8_t>(H * 2, kPad));
      }
    }
  }

  // MergedColumnParallelLinear gate_up_proj, RowParallelLinear down_proj.
  void Mlp(const std::string& prefix, uint64_t inter) {
    const uint64_t H = m_.hidden_size, n = inter / tp_;
    std::vector<uint8_t>& gu = out_[prefix + "gate_up_proj.weight"];
    Append(gu, RowSlice(prefix + "gate_proj.weight", H, t_ * n, n));
    Append(gu, RowSlice(prefix + "up_proj.weight", H, t_ * n, n));
    out_[prefix + "down_proj.weight"] =
        ColSlice(prefix + "down_proj.weight", H, inter, t_ * n, n);
  }

  const ModelConfig& m_;
  const TensorBytes& c_;
  uint64_t tp_, ep_, t_;
  std::map<std::string, std::vector<uint8_t>> out_;
};

// The trainer generator's one form of gpt-oss (gate and up interleaved one
// by one); the defaults for the others.
Parallelism TrainerParallelism(const ModelConfig& m) {
  Parallelism p;
  if (m.gpt_oss) {
    p.gate_up = GateUp::kInterleaved;
    p.gate_up_group = 1;
  }
  return p;
}

// N of "model.layers.N.*", -1 for other names.
int64_t LayerOf(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::stoll(name.substr(prefix.size()));
}

// Generates, validates, owns and proves coverage; with `bytes`, fills every
// rank's tensors through the layout and compares them with the reference.
void Check(const ModelConfig& m, uint32_t tp, uint32_t ep, bool bytes = true) {
  SCOPED_TRACE(m.model_type + " tp " + std::to_string(tp) + " ep " + std::to_string(ep));
  EngineParallelism par;
  par.tp = tp;
  par.ep = ep;
  Result<Layout> l = GenerateEngineLayout(m, par);
  ASSERT_OK(l);
  ASSERT_EQ(l->ranks.size(), tp);
  ASSERT_OK(ValidateLayout(*l));
  Result<Ownership> o = AssignOwnership(*l);
  ASSERT_OK(o);
  ASSERT_OK(CheckCoverage(*l, *o));
  Result<Layout> back = ParseLayout(LayoutToJson(*l));
  ASSERT_OK(back);
  EXPECT_TRUE(*back == *l);
  // The trainer generator's canonical tensors but the MTP layers' (which
  // vLLM's main model does not load).
  Result<Layout> trainer = GenerateLayout(m, TrainerParallelism(m));
  ASSERT_OK(trainer);
  std::vector<CanonicalTensor> main;
  for (const CanonicalTensor& c : trainer->canonical) {
    if (LayerOf(c.name) < static_cast<int64_t>(m.num_hidden_layers)) main.push_back(c);
  }
  EXPECT_TRUE(main == l->canonical);
  if (!bytes) return;
  TensorBytes canon = RandomCanonical(*l, tp * 10 + ep);
  Result<std::vector<TensorBytes>> local = ScatterToRanks(*l, canon, kPad);
  ASSERT_OK(local);
  for (uint32_t t = 0; t < tp; ++t) {
    SCOPED_TRACE("rank " + std::to_string(t));
    ASSERT_EQ(l->ranks[t].rank, t);
    std::map<std::string, std::vector<uint8_t>> want =
        VllmReference(m, canon, tp, ep, t).Build();
    const TensorBytes& got = (*local)[t];
    std::set<std::string> got_names, want_names;
    for (const auto& [name, b] : got) got_names.insert(name);
    for (const auto& [name, b] : want) want_names.insert(name);
    ASSERT_EQ(got_names, want_names);
    for (const auto& [name, b] : want) {
      EXPECT_TRUE(got.at(name) == b) << name;
    }
  }
}

const LocalTensor* Find(const RankLayout& r, const std::string& name) {
  for (const LocalTensor& t : r.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

TEST(GenerateEngine, LlamaGqaAtEveryTp) {
  // 8 q heads, 2 KV heads: tp 4 and 8 replicate each KV head.
  for (uint32_t tp : {1u, 2u, 4u, 8u}) {
    Check(Llama(), tp, 1);
    if (HasFailure()) return;
  }
  // 100 tokens padded to 128: rank 7's 16 rows are all padding.
  ModelConfig small_vocab = Llama();
  small_vocab.vocab_size = 100;
  Check(small_vocab, 8, 1);
  Result<Layout> l = GenerateEngineLayout(Llama(), {Engine::kVllm, 8, 1, 64});
  ASSERT_OK(l);
  const LocalTensor* qkv = Find(l->ranks[5], "model.layers.1.self_attn.qkv_proj.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (std::vector<uint64_t>{3 * 8, 64}));  // 1 q, 1 k, 1 v head
  ASSERT_EQ(qkv->pieces.size(), 3u);
  EXPECT_EQ(qkv->pieces[1].canon_offset, 1u * 8 * 64);  // KV head 5 * 2 / 8 = 1
  const LocalTensor* emb = Find(l->ranks[7], "model.embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<uint64_t>{40, 64}));  // 320 / 8
  ASSERT_EQ(emb->pieces.size(), 1u);
  EXPECT_EQ(emb->pieces[0].rows, 20u);  // rows 280..299 real, 20 padding
}

TEST(GenerateEngine, Qwen2BiasesAndQwen3NormsTied) {
  for (uint32_t tp : {1u, 2u, 4u}) {
    Check(Qwen2(), tp, 1);
    Check(Qwen3Tied(), tp, 1);
    if (HasFailure()) return;
  }
  Result<Layout> l = GenerateEngineLayout(Qwen3Tied(), {Engine::kVllm, 2, 1, 64});
  ASSERT_OK(l);
  EXPECT_EQ(Find(l->ranks[0], "lm_head.weight"), nullptr);  // tied: the embedding
  EXPECT_NE(Find(l->ranks[1], "model.layers.0.self_attn.k_norm.weight"), nullptr);
}

TEST(GenerateEngine, MoeWithTpAndEp) {
  for (uint32_t tp : {1u, 2u, 4u}) {
    Check(Mixtral(), tp, 1);
    Check(Qwen3Moe(), tp, 1);
    Check(Qwen2Moe(), tp, 1);
    if (tp > 1) {
      Check(Mixtral(), tp, tp);  // 6 experts over 4: 2, 2, 1, 1
      Check(Qwen3Moe(), tp, tp);
      Check(Qwen2Moe(), tp, tp);
    }
    if (HasFailure()) return;
  }
  Result<Layout> l = GenerateEngineLayout(Mixtral(), {Engine::kVllm, 2, 1, 64});
  ASSERT_OK(l);
  const LocalTensor* w13 = Find(l->ranks[1], "model.layers.0.block_sparse_moe.experts.w13_weight");
  ASSERT_NE(w13, nullptr);
  EXPECT_EQ(w13->shape, (std::vector<uint64_t>{6, 32, 64}));  // [E, 2 I / tp, H]
  const LocalTensor* w2 = Find(l->ranks[1], "model.layers.0.block_sparse_moe.experts.w2_weight");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->shape, (std::vector<uint64_t>{6, 64, 16}));  // [E, H, I / tp]
  l = GenerateEngineLayout(Mixtral(), {Engine::kVllm, 4, 4, 64});
  ASSERT_OK(l);
  w13 = Find(l->ranks[3], "model.layers.1.block_sparse_moe.experts.w13_weight");
  ASSERT_NE(w13, nullptr);
  EXPECT_EQ(w13->shape, (std::vector<uint64_t>{1, 64, 64}));  // expert 5, whole
  EXPECT_EQ(w13->pieces.at(0).canonical, "model.layers.1.block_sparse_moe.experts.5.w1.weight");
}

TEST(GenerateEngine, RefusesWhatItDoesNotModel) {
  auto refused = [](const ModelConfig& m, const std::string& name) {
    Result<Layout> l = GenerateEngineLayout(m, EngineParallelism{});
    ASSERT_FALSE(l.ok()) << name;
    EXPECT_EQ(l.status().code(), StatusCode::kUnimplemented) << l.status().ToString();
    EXPECT_NE(l.status().message().find(name), std::string_view::npos)
        << l.status().ToString();
  };
  // DeepSeek-V3 as published (FP8 blocks) and gpt-oss with MXFP4 experts:
  // their BF16 checkpoints are modelled, not these.
  refused(Parse(kDeepSeekV3), "fp8");
  refused(Parse(GptOss120bConfig(true)), "mxfp4");
  ModelConfig tied = GptOss();
  tied.tie_word_embeddings = true;
  refused(tied, "tie_word_embeddings");
  Result<ModelConfig> q = ParseModelConfig(R"({
    "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                            "group_size": 16}})");
  ASSERT_OK(q);
  refused(*q, "modelopt");
  ModelConfig other = Llama();
  other.model_type = "phi3";
  refused(other, "phi3");
  // Splits vLLM itself refuses.
  Result<Layout> l = GenerateEngineLayout(Llama(), {Engine::kVllm, 3, 1, 64});
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  l = GenerateEngineLayout(Mixtral(), {Engine::kVllm, 4, 2, 64});
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("ep 2"), std::string_view::npos) << l.status().ToString();
  // gpt-oss's attention does not replicate KV heads: 4 of them over 8 ranks.
  l = GenerateEngineLayout(GptOss(), {Engine::kVllm, 8, 1, 64});
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("num_key_value_heads"), std::string_view::npos)
      << l.status().ToString();
  // MLA: 8 heads over 3 ranks.
  l = GenerateEngineLayout(DeepSeekV3(24), {Engine::kVllm, 3, 1, 64});
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("num_attention_heads"), std::string_view::npos)
      << l.status().ToString();
}

TEST(GenerateEngine, DeepSeekMlaWithTpAndEp) {
  for (uint64_t q_lora_rank : {24u, 0u}) {
    for (const char* type : {"deepseek_v3", "kimi_k2"}) {
      ModelConfig m = DeepSeekV3(q_lora_rank, type);
      ASSERT_TRUE(m.mla);
      ASSERT_EQ(m.dense_layers, (std::vector<uint64_t>{0}));
      for (uint32_t tp : {1u, 2u, 4u}) {
        SCOPED_TRACE("q_lora_rank " + std::to_string(q_lora_rank));
        Check(m, tp, 1);
        if (tp > 1) Check(m, tp, tp);
        if (HasFailure()) return;
      }
    }
  }
  Result<Layout> l = GenerateEngineLayout(DeepSeekV3(24), {Engine::kVllm, 4, 1, 64});
  ASSERT_OK(l);
  const RankLayout& r = l->ranks[3];
  const std::string a = "model.layers.1.self_attn.";
  auto shape = [&](const std::string& name) {
    const LocalTensor* t = Find(r, name);
    EXPECT_NE(t, nullptr) << name;
    return t ? t->shape : std::vector<uint64_t>{};
  };
  // q_a rows (24), then kv_a rows (16 + 4 rope), replicated.
  EXPECT_EQ(shape(a + "fused_qkv_a_proj.weight"), (std::vector<uint64_t>{44, 64}));
  EXPECT_EQ(shape(a + "q_b_proj.weight"), (std::vector<uint64_t>{2 * 12, 24}));   // 2 heads
  EXPECT_EQ(shape(a + "kv_b_proj.weight"), (std::vector<uint64_t>{2 * 14, 16}));  // nope + v
  EXPECT_EQ(shape(a + "o_proj.weight"), (std::vector<uint64_t>{64, 2 * 6}));
  EXPECT_EQ(shape("model.layers.1.mlp.experts.w13_weight"), (std::vector<uint64_t>{8, 8, 64}));
  EXPECT_EQ(shape("model.layers.1.mlp.experts.w2_weight"), (std::vector<uint64_t>{8, 64, 4}));
  EXPECT_EQ(shape("model.layers.1.mlp.shared_experts.gate_up_proj.weight"),
            (std::vector<uint64_t>{16, 64}));  // 2 x 16 rows over 4 ranks, gate and up
  EXPECT_EQ(shape("model.layers.0.mlp.gate_up_proj.weight"), (std::vector<uint64_t>{48, 64}));
  EXPECT_EQ(Find(r, "model.layers.0.mlp.gate.weight"), nullptr);  // dense layer 0
  const LocalTensor* bias = Find(r, "model.layers.2.mlp.gate.e_score_correction_bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->dtype, "F32");
  // The MTP layer (model.layers.3) is neither loaded by vLLM's main model
  // nor among the engine layout's canonical tensors.
  for (const LocalTensor& t : r.tensors) EXPECT_LT(LayerOf(t.name), 3) << t.name;
  Result<Layout> trainer = GenerateLayout(DeepSeekV3(24), Parallelism{});
  ASSERT_OK(trainer);
  // Its norms and attention 9, its own 6, router 2, experts 8 x 3, shared 3.
  EXPECT_EQ(trainer->canonical.size() - l->canonical.size(), 9u + 6u + 2u + 8u * 3u + 3u);
  // Without q_lora_rank: q_proj split by heads, kv_a_proj_with_mqa alone.
  l = GenerateEngineLayout(DeepSeekV3(0), {Engine::kVllm, 2, 2, 64});
  ASSERT_OK(l);
  EXPECT_EQ(Find(l->ranks[1], a + "fused_qkv_a_proj.weight"), nullptr);
  const LocalTensor* q = Find(l->ranks[1], a + "q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (std::vector<uint64_t>{4 * 12, 64}));
  EXPECT_EQ(q->pieces.at(0).canon_offset, 4u * 12 * 64);  // heads 4..7
  const LocalTensor* w13 = Find(l->ranks[1], "model.layers.2.mlp.experts.w13_weight");
  ASSERT_NE(w13, nullptr);
  EXPECT_EQ(w13->shape, (std::vector<uint64_t>{4, 32, 64}));  // experts 4..7, whole
  EXPECT_EQ(w13->pieces.at(0).canonical, "model.layers.2.mlp.experts.4.gate_proj.weight");
}

TEST(GenerateEngine, GptOssWithTpAndEp) {
  for (uint32_t tp : {1u, 2u, 4u}) {
    Check(GptOss(), tp, 1);
    if (tp > 1) Check(GptOss(), tp, tp);
    if (HasFailure()) return;
  }
  Result<Layout> l = GenerateEngineLayout(GptOss(), {Engine::kVllm, 2, 1, 64});
  ASSERT_OK(l);
  const RankLayout& r = l->ranks[1];
  const std::string x = "model.layers.1.mlp.experts.";
  EXPECT_NE(Find(r, "model.embedding.weight"), nullptr);
  EXPECT_NE(Find(r, "model.layers.0.attn.qkv_proj.bias"), nullptr);
  const LocalTensor* sinks = Find(r, "model.layers.0.attn.sinks");
  ASSERT_NE(sinks, nullptr);
  EXPECT_EQ(sinks->shape, (std::vector<uint64_t>{4}));  // heads 4..7
  EXPECT_EQ(sinks->pieces.at(0).canon_offset, 4u);
  const LocalTensor* w13 = Find(r, x + "w13_weight");
  ASSERT_NE(w13, nullptr);
  EXPECT_EQ(w13->shape, (std::vector<uint64_t>{4, 32, 32}));  // [E, 2 I / tp, H]
  // Expert 3's local rows are gate_up_proj's columns 32..63 (gate and up
  // interleaved), running down them.
  const Piece& p = w13->pieces.at(3);
  EXPECT_EQ(p.canonical, x + "gate_up_proj");
  EXPECT_EQ(p.canon_offset, 3u * 32 * 64 + 32);
  EXPECT_EQ(p.canon_row_stride, 1u);
  EXPECT_EQ(p.canon_col_stride, 64u);
  const LocalTensor* w2 = Find(r, x + "w2_weight");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->shape, (std::vector<uint64_t>{4, 32, 16}));  // [E, H, I / tp]
  // w2_bias: rank 0 holds the bias, rank 1's is zeroed by vLLM and mapped
  // by nothing.
  EXPECT_TRUE(Find(r, x + "w2_bias")->pieces.empty());
  EXPECT_EQ(Find(l->ranks[0], x + "w2_bias")->pieces.size(), 1u);
}

// Real sizes in their BF16 form: DeepSeek-V3 (256 experts) and Kimi-K2
// (384) at TP 8 with EP 8, DeepSeek-V3 also without EP, gpt-oss-120b at
// TP 8 with and without EP; generated, owned and proved covered (the time
// is printed, not checked: timings belong to benchmarks).
TEST(GenerateEngine, FrontierModelsAtTp8) {
  struct Case {
    const char* name;
    ModelConfig m;
    uint32_t ep;
    uint64_t tensors;  // rank 0's
  };
  ModelConfig ds = Parse(kDeepSeekV3), kimi = Parse(kKimiK2);
  ds.fp8_block_rows = ds.fp8_block_cols = 0;
  kimi.fp8_block_rows = kimi.fp8_block_cols = 0;
  // MLA: 2 norms, fused_qkv_a, q_a_layernorm, q_b, kv_a_layernorm, kv_b, o;
  // dense layers + gate_up, down; MoE layers + gate, bias, w13, w2 and the
  // shared experts' 2; + embed, norm, lm_head.
  const uint64_t ds_tensors = 61u * 8 + 3u * 2 + 58u * 6 + 3;
  const uint64_t kimi_tensors = 61u * 8 + 1u * 2 + 60u * 6 + 3;
  // gpt-oss: 2 norms, qkv weight and bias, o weight and bias, sinks, router
  // weight and bias, w13, w13_bias, w2, w2_bias.
  const uint64_t oss_tensors = 36u * 13 + 3;
  const std::vector<Case> cases = {{"DeepSeek-V3", ds, 8, ds_tensors},
                                   {"DeepSeek-V3", ds, 1, ds_tensors},
                                   {"Kimi-K2", kimi, 8, kimi_tensors},
                                   {"gpt-oss-120b", Parse(GptOss120bConfig(false)), 8,
                                    oss_tensors},
                                   {"gpt-oss-120b", Parse(GptOss120bConfig(false)), 1,
                                    oss_tensors}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.name) + " ep " + std::to_string(c.ep));
    auto start = std::chrono::steady_clock::now();
    Result<Layout> l = GenerateEngineLayout(c.m, {Engine::kVllm, 8, c.ep, 64});
    ASSERT_OK(l);
    Result<Ownership> o = AssignOwnership(*l);
    ASSERT_OK(o);
    ASSERT_OK(CheckCoverage(*l, *o));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(l->ranks[0].tensors.size(), c.tensors);
    std::printf("%s vLLM TP 8 EP %u: generate + own + cover %.2f s\n", c.name, c.ep, s);
  }
  Result<Layout> l = GenerateEngineLayout(kimi, {Engine::kVllm, 8, 8, 64});
  ASSERT_OK(l);
  const LocalTensor* w13 = Find(l->ranks[7], "model.layers.60.mlp.experts.w13_weight");
  ASSERT_NE(w13, nullptr);
  EXPECT_EQ(w13->shape, (std::vector<uint64_t>{48, 4096, 7168}));  // experts 336..383
  EXPECT_EQ(w13->pieces.at(0).canonical, "model.layers.60.mlp.experts.336.gate_proj.weight");
  const LocalTensor* fused = Find(l->ranks[7], "model.layers.60.self_attn.fused_qkv_a_proj.weight");
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(fused->shape, (std::vector<uint64_t>{1536 + 512 + 64, 7168}));
}

// Qwen/Qwen3-30B-A3B's sizes: 48 layers of 128 experts, at TP 4 with and
// without EP 4, generated, owned and proved covered in seconds.
TEST(GenerateEngine, Qwen3Moe30bAtTp4) {
  Result<ModelConfig> m = ParseModelConfig(R"({
    "model_type": "qwen3_moe", "attention_bias": false, "decoder_sparse_step": 1,
    "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144, "mlp_only_layers": [],
    "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 128,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "vocab_size": 151936})");
  ASSERT_OK(m);
  for (uint32_t ep : {1u, 4u}) {
    auto start = std::chrono::steady_clock::now();
    Result<Layout> l = GenerateEngineLayout(*m, {Engine::kVllm, 4, ep, 64});
    ASSERT_OK(l);
    Result<Ownership> o = AssignOwnership(*l);
    ASSERT_OK(o);
    ASSERT_OK(CheckCoverage(*l, *o));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // 2 norms + qkv + o + q/k norms + router + w13 + w2 a layer, + 3.
    EXPECT_EQ(l->ranks[0].tensors.size(), 48u * 9 + 3);
    const LocalTensor* w13 = Find(l->ranks[2], "model.layers.47.mlp.experts.w13_weight");
    ASSERT_NE(w13, nullptr);
    const std::vector<uint64_t> want =
        ep == 1 ? std::vector<uint64_t>{128, 384, 2048} : std::vector<uint64_t>{32, 1536, 2048};
    EXPECT_EQ(w13->shape, want);
    std::printf("Qwen3-30B-A3B vLLM TP 4 EP %u: generate + own + cover %.2f s\n", ep, s);
  }
}

}  // namespace
}  // namespace refit::layout
