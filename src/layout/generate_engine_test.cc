// Engine layouts (vLLM): coverage at many TP / EP sizes, every rank's
// local tensors filled through the layout compared byte for byte with a
// reference that slices and concatenates the canonical tensors the way
// vLLM's weight loaders do, refusal of what the generator does not model,
// and a real-size Qwen3-MoE.
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
#include "support/test_layout.h"
#include "support/testing.h"

namespace refit::layout {
namespace {

using testing::ScatterToRanks;
using testing::RandomCanonical;
using testing::TensorBytes;

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

// The reference: rank t's parameters as vLLM's loaders fill them from the
// canonical tensors (BF16), written from vLLM's formulas, not the
// generator's.
class VllmReference {
 public:
  VllmReference(const ModelConfig& m, const TensorBytes& canon, uint64_t tp, uint64_t ep,
                uint64_t t)
      : m_(m), c_(canon), tp_(tp), ep_(ep), t_(t) {}

  std::map<std::string, std::vector<uint8_t>> Build() {
    const uint64_t H = m_.hidden_size, hd = m_.head_dim;
    const uint64_t heads = m_.num_attention_heads, kv = m_.num_key_value_heads;
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
    out_["model.embed_tokens.weight"] = vocab("model.embed_tokens.weight");
    if (!m_.tie_word_embeddings) out_["lm_head.weight"] = vocab("lm_head.weight");
    Copy("model.norm.weight");
    // QKVParallelLinear.
    const uint64_t q_heads = heads / tp_;
    const uint64_t kv_heads = tp_ >= kv ? 1 : kv / tp_;
    const uint64_t replicas = tp_ >= kv ? tp_ / kv : 1;
    const uint64_t kv_shard = t_ / replicas;  // weight_loader's shard_id
    for (uint64_t i = 0; i < m_.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      const std::string a = p + "self_attn.";
      Copy(p + "input_layernorm.weight");
      Copy(p + "post_attention_layernorm.weight");
      for (std::string s : {"weight", "bias"}) {
        if (s == "bias" && !m_.attention_bias) continue;
        const uint64_t w = s == "bias" ? 1 : H;
        std::vector<uint8_t>& qkv = out_[a + "qkv_proj." + s];
        Append(qkv, RowSlice(a + "q_proj." + s, w, t_ * q_heads * hd, q_heads * hd));
        Append(qkv, RowSlice(a + "k_proj." + s, w, kv_shard * kv_heads * hd, kv_heads * hd));
        Append(qkv, RowSlice(a + "v_proj." + s, w, kv_shard * kv_heads * hd, kv_heads * hd));
      }
      out_[a + "o_proj.weight"] =
          ColSlice(a + "o_proj.weight", H, heads * hd, t_ * q_heads * hd, q_heads * hd);
      if (m_.qk_norm) {
        Copy(a + "q_norm.weight");
        Copy(a + "k_norm.weight");
      }
      bool dense = m_.num_experts == 0;
      for (uint64_t d : m_.dense_layers) dense |= d == i;
      if (dense) {
        Mlp(p + "mlp.", m_.intermediate_size);
        continue;
      }
      const std::string mb = p + (m_.mixtral_names ? "block_sparse_moe." : "mlp.");
      Copy(mb + "gate.weight");
      // FusedMoE: with EP, determine_expert_map's contiguous ranges and
      // tp_size 1 for the experts.
      const uint64_t E = m_.num_experts, I = m_.moe_intermediate_size;
      uint64_t first = 0, count = E, etp = tp_, erank = t_;
      if (ep_ > 1) {
        const uint64_t base = E / ep_, rem = E % ep_;
        count = base + (t_ < rem ? 1 : 0);
        first = t_ * base + std::min(t_, rem);
        etp = 1;
        erank = 0;
      }
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
  // The same canonical tensors as the trainer generator's.
  Result<Layout> trainer = GenerateLayout(m, Parallelism{});
  ASSERT_OK(trainer);
  EXPECT_TRUE(trainer->canonical == l->canonical);
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
  Result<ModelConfig> ds = ParseModelConfig(R"({
    "model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
    "v_head_dim": 8, "n_routed_experts": 4, "moe_intermediate_size": 16,
    "first_k_dense_replace": 1})");
  ASSERT_OK(ds);
  refused(*ds, "deepseek_v3");
  Result<ModelConfig> oss = ParseModelConfig(R"({
    "model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "vocab_size": 100, "num_local_experts": 4})");
  ASSERT_OK(oss);
  refused(*oss, "gpt_oss");
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
    EXPECT_LT(s, 30.0);
  }
}

}  // namespace
}  // namespace refit::layout
