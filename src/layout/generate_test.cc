// Generated layouts: Qwen2-tiny at many TP/PP/DP sizes and storage options,
// MoE models with expert parallelism, the Megatron storage conventions
// checked byte for byte against hand-built local tensors, and the fixture
// checkpoint scattered to ranks and assembled back.
#include "layout/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "layout/layout.h"
#include "refit/checkpoint.h"
#include "support/test_layout.h"
#include "support/testing.h"

namespace refit::layout {
namespace {

using testing::AssembleCanonical;
using testing::ScatterToRanks;
using testing::RandomCanonical;
using testing::TensorBytes;

// The fields of the qwen2-tiny fixture's config.json that matter here
// (FixtureConfigMatches checks them against the file).
constexpr char kQwen2Tiny[] = R"({
  "model_type": "qwen2", "dtype": null, "vocab_size": 4096, "hidden_size": 192,
  "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
  "num_key_value_heads": 2, "tie_word_embeddings": false})";

ModelConfig Tiny() { return *ParseModelConfig(kQwen2Tiny); }

ModelConfig Moe(bool mixtral) {
  ModelConfig m;
  m.model_type = mixtral ? "mixtral" : "qwen2_moe";
  m.mixtral_names = mixtral;
  m.hidden_size = 64;
  m.intermediate_size = 96;
  m.num_hidden_layers = 3;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 16;
  m.vocab_size = 300;
  m.attention_bias = !mixtral;
  m.num_experts = 6;
  m.moe_intermediate_size = 40;
  m.shared_expert_intermediate_size = mixtral ? 0 : 24;
  return m;
}

std::string Describe(const Parallelism& p) {
  return "tp " + std::to_string(p.tp) + " pp " + std::to_string(p.pp) + " ep " +
         std::to_string(p.ep) + " dp " + std::to_string(p.dp) + " cp " +
         std::to_string(p.cp) + (p.fused_qkv ? " fused" : " unfused") + " gate_up " +
         std::to_string(static_cast<int>(p.gate_up)) + "/" +
         std::to_string(p.gate_up_group) + (p.transposed ? " transposed" : "") +
         " vocab x" + std::to_string(p.vocab_multiple);
}

// Generates, validates, owns, proves coverage, round-trips JSON, and
// scatters + assembles random bytes. Returns the layout.
Layout CheckGenerated(const ModelConfig& m, const Parallelism& p, uint64_t seed,
                      bool bytes = true) {
  SCOPED_TRACE(Describe(p));
  Result<Layout> l = GenerateLayout(m, p);
  EXPECT_OK(l);
  if (!l.ok()) return {};
  EXPECT_EQ(l->ranks.size(), uint64_t{p.tp} * p.pp * p.dp * p.cp);
  EXPECT_OK(ValidateLayout(*l));
  Result<Ownership> o = AssignOwnership(*l);
  EXPECT_OK(o);
  if (!o.ok()) return {};
  EXPECT_OK(CheckCoverage(*l, *o));
  Result<Layout> back = ParseLayout(LayoutToJson(*l));
  EXPECT_OK(back);
  if (back.ok()) {
    EXPECT_TRUE(*back == *l);
  }
  if (!bytes) return *std::move(l);
  TensorBytes canon = RandomCanonical(*l, seed);
  Result<std::vector<TensorBytes>> local = ScatterToRanks(*l, canon);
  EXPECT_OK(local);
  if (!local.ok()) return {};
  Result<TensorBytes> again = AssembleCanonical(*l, *local);
  EXPECT_OK(again);
  if (again.ok()) {
    EXPECT_TRUE(*again == canon);
  }
  return *std::move(l);
}

TEST(Generate, ParsesConfig) {
  ModelConfig m = Tiny();
  EXPECT_EQ(m.model_type, "qwen2");
  EXPECT_EQ(m.dtype, "BF16");
  EXPECT_EQ(m.hidden_size, 192u);
  EXPECT_EQ(m.head_dim, 48u);
  EXPECT_EQ(m.num_key_value_heads, 2u);
  EXPECT_TRUE(m.attention_bias);  // Qwen2 has q/k/v biases
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(m.num_experts, 0u);
  Result<ModelConfig> mix = ParseModelConfig(
      R"({"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
          "num_local_experts": 8, "torch_dtype": "float32"})");
  ASSERT_OK(mix);
  EXPECT_EQ(mix->num_experts, 8u);
  EXPECT_EQ(mix->moe_intermediate_size, 96u);
  EXPECT_EQ(mix->num_key_value_heads, 4u);
  EXPECT_EQ(mix->dtype, "F32");
  EXPECT_TRUE(mix->mixtral_names);
  Result<ModelConfig> bad = ParseModelConfig(R"({"model_type": "llama", "hidden_size": 64})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("missing \"intermediate_size\""),
            std::string_view::npos)
      << bad.status().ToString();
}

TEST(Generate, FixtureConfigMatches) {
  REFIT_REQUIRE_FIXTURES();
  Result<ModelConfig> m =
      LoadModelConfig(refit::testing::FixturesDir() + "/sharded_step3/config.json");
  ASSERT_OK(m);
  ModelConfig t = Tiny();
  EXPECT_EQ(m->hidden_size, t.hidden_size);
  EXPECT_EQ(m->intermediate_size, t.intermediate_size);
  EXPECT_EQ(m->num_hidden_layers, t.num_hidden_layers);
  EXPECT_EQ(m->num_attention_heads, t.num_attention_heads);
  EXPECT_EQ(m->num_key_value_heads, t.num_key_value_heads);
  EXPECT_EQ(m->vocab_size, t.vocab_size);
  EXPECT_EQ(m->head_dim, t.head_dim);
  EXPECT_EQ(m->tie_word_embeddings, t.tie_word_embeddings);
  EXPECT_EQ(m->attention_bias, t.attention_bias);
}

// TP in {1, 2, 3 (uneven), 4 (KV heads replicated)} x PP {1, 2} x DP
// {1, 2, 3}, cycling through the storage options.
TEST(Generate, Qwen2TinyAtManySizes) {
  ModelConfig m = Tiny();
  uint64_t i = 0;
  for (uint32_t tp : {1u, 2u, 3u, 4u}) {
    for (uint32_t pp : {1u, 2u}) {
      for (uint32_t dp : {1u, 2u, 3u}) {
        Parallelism p;
        p.tp = tp;
        p.pp = pp;
        p.dp = dp;
        p.fused_qkv = i % 2 == 0;
        p.gate_up = i % 4 == 3 ? GateUp::kSeparate
                               : (i % 3 == 0 ? GateUp::kConcat : GateUp::kInterleaved);
        p.gate_up_group = i % 2 ? 64 : 16;
        p.transposed = i % 5 == 1;
        p.vocab_multiple = i % 3 == 2 ? 128 : 1;
        p.cp = i % 7 == 6 ? 2 : 1;
        // Bytes for a third of them (Qwen2TinyEveryStorageOption and the
        // Conventions tests cover the storage options byte for byte).
        CheckGenerated(m, p, i + 1, /*bytes=*/i % 3 == 0);
        ++i;
        if (HasFailure()) return;
      }
    }
  }
}

TEST(Generate, Qwen2TinyEveryStorageOption) {
  ModelConfig m = Tiny();
  uint64_t seed = 100;
  for (bool fused : {false, true}) {
    for (int gu = 0; gu < 4; ++gu) {
      for (bool transposed : {false, true}) {
        if (transposed && gu % 2 == 0) continue;  // element by element: slow
        Parallelism p;
        p.tp = 3;
        p.pp = 2;
        p.dp = transposed ? 1 : 2;  // element by element: keep it quick
        p.fused_qkv = fused;
        p.gate_up = gu == 0 ? GateUp::kSeparate
                            : (gu == 1 ? GateUp::kConcat : GateUp::kInterleaved);
        p.gate_up_group = gu == 3 ? 16 : 64;
        p.transposed = transposed;
        p.vocab_multiple = 128;
        CheckGenerated(m, p, ++seed);
        if (HasFailure()) return;
      }
    }
  }
}

TEST(Generate, MoeWithExpertParallelism) {
  for (bool mixtral : {false, true}) {
    ModelConfig m = Moe(mixtral);
    struct Sizes {
      uint32_t tp, pp, ep, dp;
    };
    for (Sizes s : {Sizes{1, 1, 1, 1}, Sizes{2, 1, 2, 2}, Sizes{2, 3, 2, 4},
                    Sizes{1, 2, 4, 4}, Sizes{3, 1, 3, 3}}) {
      Parallelism p;
      p.tp = s.tp;
      p.pp = s.pp;
      p.ep = s.ep;
      p.dp = s.dp;
      p.gate_up = GateUp::kInterleaved;
      p.gate_up_group = 8;
      p.transposed = s.pp == 3;
      Layout l = CheckGenerated(m, p, s.tp * 100 + s.ep);
      if (HasFailure()) return;
      // Local expert j on an expert-parallel rank is global expert e0 + j.
      auto [e0, e1] = SplitRange(6, s.ep, s.ep - 1);
      uint32_t d = s.ep - 1;  // data-parallel index with expert index ep - 1
      const RankLayout& r = l.ranks[uint64_t{s.tp} * d];  // t = 0, stage 0
      std::string local = "decoder.layers.0.mlp.experts.local_experts." +
                          std::to_string(e1 - e0 - 1) + ".linear_fc2.weight";
      std::string hf = "model.layers.0." + std::string(mixtral ? "block_sparse_moe" : "mlp") +
                       ".experts." + std::to_string(e1 - 1) +
                       (mixtral ? ".w2.weight" : ".down_proj.weight");
      auto it = std::find_if(r.tensors.begin(), r.tensors.end(),
                             [&](const LocalTensor& t) { return t.name == local; });
      ASSERT_NE(it, r.tensors.end()) << local;
      ASSERT_FALSE(it->pieces.empty());
      EXPECT_EQ(it->pieces[0].canonical, hf);
    }
  }
}

TEST(Generate, TiedEmbeddingsQkNormAndCasts) {
  ModelConfig m = Tiny();
  m.model_type = "qwen3";
  m.qk_norm = true;
  m.tie_word_embeddings = true;
  for (uint32_t pp : {1u, 2u}) {
    Parallelism p;
    p.tp = 2;
    p.pp = pp;
    p.dp = 2;
    Layout l = CheckGenerated(m, p, 40 + pp);
    if (HasFailure()) return;
    bool lm_head = false, q_norm = false;
    for (const CanonicalTensor& c : l.canonical) {
      lm_head |= c.name == "lm_head.weight";
      q_norm |= c.name == "model.layers.3.self_attn.q_norm.weight";
    }
    EXPECT_FALSE(lm_head) << "tied: no lm_head in the checkpoint";
    EXPECT_TRUE(q_norm);
    // With stages, the last one holds a replica of the embedding.
    const RankLayout& last = l.ranks.back();
    bool output = false;
    for (const LocalTensor& t : last.tensors) {
      if (t.name == "output_layer.weight") {
        output = true;
        EXPECT_EQ(t.pieces.at(0).canonical, "model.embed_tokens.weight");
      }
    }
    EXPECT_EQ(output, pp > 1);
  }
  // F32 master weights of a BF16 checkpoint: a cast, valid, ownership by
  // canonical bytes.
  Parallelism p;
  p.tp = 2;
  p.dp = 3;
  p.local_dtype = "F32";
  Result<Layout> l = GenerateLayout(Tiny(), p);
  ASSERT_OK(l);
  EXPECT_EQ(l->ranks[0].tensors[0].dtype, "F32");
  Result<Ownership> o = AssignOwnership(*l);
  ASSERT_OK(o);
  ASSERT_OK(CheckCoverage(*l, *o));
}

TEST(Generate, RejectsImpossibleSizes) {
  ModelConfig m = Tiny();
  Parallelism p;
  p.tp = 8;  // 4 ranks per query group of 2 q heads
  Result<Layout> l = GenerateLayout(m, p);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("tp 8 is too large"), std::string_view::npos)
      << l.status().ToString();
  p.tp = 1;
  p.pp = 5;
  EXPECT_FALSE(GenerateLayout(m, p).ok());
  p.pp = 1;
  p.dp = 3;
  p.ep = 2;
  l = GenerateLayout(m, p);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("ep 2 does not divide dp 3"), std::string_view::npos);
}

// The storage conventions, checked against local tensors built by hand
// from canonical row slices.
class Conventions : public ::testing::Test {
 protected:
  // Rows [r0, r1) of a 2-D canonical tensor (BF16).
  std::vector<uint8_t> Slice(const std::string& name, uint64_t r0, uint64_t r1,
                             uint64_t width) {
    const std::vector<uint8_t>& b = canon_.at(name);
    return std::vector<uint8_t>(b.begin() + static_cast<long>(r0 * width * 2),
                                b.begin() + static_cast<long>(r1 * width * 2));
  }
  const std::vector<uint8_t>& Local(const Layout& l, uint32_t rank,
                                    const std::string& name) {
    for (size_t i = 0; i < l.ranks.size(); ++i) {
      if (l.ranks[i].rank == rank) return local_.at(i).at(name);
    }
    ADD_FAILURE() << "no rank " << rank;
    static std::vector<uint8_t> none;
    return none;
  }
  Layout Make(const Parallelism& p) {
    Result<Layout> l = GenerateLayout(Tiny(), p);
    EXPECT_OK(l);
    canon_ = RandomCanonical(*l, 5);
    local_ = *ScatterToRanks(*l, canon_, 0xA5);
    return *l;
  }
  static void Append(std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
  }
  TensorBytes canon_;
  std::vector<TensorBytes> local_;
};

TEST_F(Conventions, FusedQkvPerQueryGroup) {
  Parallelism p;
  p.tp = 2;
  p.pp = 2;
  Layout l = Make(p);
  // Rank 3 = t 1 of stage 1: query group 1 of global layer 2 (local 0).
  std::string hp = "model.layers.2.self_attn.";
  std::vector<uint8_t> want = Slice(hp + "q_proj.weight", 96, 192, 192);
  Append(want, Slice(hp + "k_proj.weight", 48, 96, 192));
  Append(want, Slice(hp + "v_proj.weight", 48, 96, 192));
  EXPECT_TRUE(Local(l, 3, "decoder.layers.0.self_attention.linear_qkv.weight") == want);
  std::vector<uint8_t> bias = Slice(hp + "q_proj.bias", 96, 192, 1);
  Append(bias, Slice(hp + "k_proj.bias", 48, 96, 1));
  Append(bias, Slice(hp + "v_proj.bias", 48, 96, 1));
  EXPECT_TRUE(Local(l, 3, "decoder.layers.0.self_attention.linear_qkv.bias") == bias);
  // TP 1: both groups, each q heads then k then v.
  Layout one = Make(Parallelism{});
  hp = "model.layers.0.self_attn.";
  want.clear();
  for (uint64_t g = 0; g < 2; ++g) {
    Append(want, Slice(hp + "q_proj.weight", g * 96, g * 96 + 96, 192));
    Append(want, Slice(hp + "k_proj.weight", g * 48, g * 48 + 48, 192));
    Append(want, Slice(hp + "v_proj.weight", g * 48, g * 48 + 48, 192));
  }
  EXPECT_TRUE(Local(one, 0, "decoder.layers.0.self_attention.linear_qkv.weight") == want);
}

TEST_F(Conventions, KvHeadsReplicatedBeyondTheGroups) {
  Parallelism p;
  p.tp = 4;  // two ranks per query group, one q head each
  Layout l = Make(p);
  std::string hp = "model.layers.1.self_attn.";
  std::vector<uint8_t> want = Slice(hp + "q_proj.weight", 48, 96, 192);  // head 1
  Append(want, Slice(hp + "k_proj.weight", 0, 48, 192));
  Append(want, Slice(hp + "v_proj.weight", 0, 48, 192));
  EXPECT_TRUE(Local(l, 1, "decoder.layers.1.self_attention.linear_qkv.weight") == want);
}

TEST_F(Conventions, GateUpConcatAndInterleaved) {
  Parallelism p;
  p.tp = 3;  // 512 rows: 171, 171, 170
  p.gate_up = GateUp::kConcat;
  Layout l = Make(p);
  std::string hp = "model.layers.3.mlp.";
  std::vector<uint8_t> want = Slice(hp + "gate_proj.weight", 342, 512, 192);
  Append(want, Slice(hp + "up_proj.weight", 342, 512, 192));
  EXPECT_TRUE(Local(l, 2, "decoder.layers.3.mlp.linear_fc1.weight") == want);
  for (uint64_t group : {64u, 16u}) {
    p.gate_up = GateUp::kInterleaved;
    p.gate_up_group = group;
    Layout li = Make(p);
    // Rank 1 holds rows [171, 342): full groups, then the tail of each.
    want.clear();
    uint64_t full = 171 / group, tail = 171 % group;
    for (uint64_t g = 0; g < full; ++g) {
      uint64_t r = 171 + g * group;
      Append(want, Slice(hp + "gate_proj.weight", r, r + group, 192));
      Append(want, Slice(hp + "up_proj.weight", r, r + group, 192));
    }
    Append(want, Slice(hp + "gate_proj.weight", 342 - tail, 342, 192));
    Append(want, Slice(hp + "up_proj.weight", 342 - tail, 342, 192));
    EXPECT_TRUE(Local(li, 1, "decoder.layers.3.mlp.linear_fc1.weight") == want)
        << "group " << group;
  }
}

TEST_F(Conventions, RowParallelTransposedAndPadded) {
  Parallelism p;
  p.tp = 3;
  p.transposed = true;
  p.vocab_multiple = 128;  // 4096 -> 4224 rows, 1408 per rank
  Layout l = Make(p);
  // down_proj [192, 512], rank 2 holds columns [342, 512), stored transposed
  // as [170, 192]: local[i][o] = canonical[o][342 + i].
  const std::vector<uint8_t>& down = canon_.at("model.layers.0.mlp.down_proj.weight");
  const std::vector<uint8_t>& got = Local(l, 2, "decoder.layers.0.mlp.linear_fc2.weight");
  ASSERT_EQ(got.size(), 170u * 192 * 2);
  for (uint64_t i = 0; i < 170; ++i) {
    for (uint64_t o = 0; o < 192; ++o) {
      ASSERT_EQ(0, std::memcmp(&got[(i * 192 + o) * 2], &down[(o * 512 + 342 + i) * 2], 2));
    }
  }
  // The embedding's last rank: 1280 real rows, then 128 padding rows.
  const std::vector<uint8_t>& emb = Local(l, 2, "embedding.word_embeddings.weight");
  ASSERT_EQ(emb.size(), 1408u * 192 * 2);
  std::vector<uint8_t> want = Slice("model.embed_tokens.weight", 2816, 4096, 192);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), emb.begin()));
  EXPECT_TRUE(std::all_of(emb.begin() + static_cast<long>(want.size()), emb.end(),
                          [](uint8_t b) { return b == 0xA5; }));
}

TEST_F(Conventions, PipelineStagesRenumberLayers) {
  Parallelism p;
  p.pp = 3;  // 4 layers: 2, 1, 1
  Layout l = Make(p);
  EXPECT_TRUE(Local(l, 1, "decoder.layers.0.input_layernorm.weight") ==
              canon_.at("model.layers.2.input_layernorm.weight"));
  EXPECT_TRUE(Local(l, 2, "decoder.layers.0.pre_mlp_layernorm.weight") ==
              canon_.at("model.layers.3.post_attention_layernorm.weight"));
  EXPECT_TRUE(Local(l, 2, "output_layer.weight") == canon_.at("lm_head.weight"));
  EXPECT_TRUE(Local(l, 0, "embedding.word_embeddings.weight") ==
              canon_.at("model.embed_tokens.weight"));
}

// Data-parallel replicas split ownership about evenly.
TEST(Generate, OwnershipIsBalancedAcrossReplicas) {
  for (uint32_t dp : {2u, 3u, 4u}) {
    Parallelism p;
    p.tp = 2;
    p.dp = dp;
    Result<Layout> l = GenerateLayout(Tiny(), p);
    ASSERT_OK(l);
    Result<Ownership> o = AssignOwnership(*l);
    ASSERT_OK(o);
    std::vector<uint64_t> bytes(o->size());
    uint64_t total = 0;
    for (size_t r = 0; r < o->size(); ++r) {
      for (const OwnedPiece& op : (*o)[r]) bytes[r] += PieceBytes(*l, op.piece);
      total += bytes[r];
    }
    EXPECT_EQ(total, 6396288u);  // the fixture's total_size
    auto [lo, hi] = std::minmax_element(bytes.begin(), bytes.end());
    EXPECT_LT(static_cast<double>(*hi), 1.05 * static_cast<double>(*lo))
        << "dp " << dp << ": " << *lo << " .. " << *hi << " bytes";
  }
}

// The real checkpoint: generated canonical tensors are exactly the
// fixture's, and its bytes survive scatter + assemble.
TEST(Generate, FixtureCheckpointRoundTrip) {
  REFIT_REQUIRE_FIXTURES();
  std::string dir = refit::testing::FixturesDir();
  Result<ModelConfig> m = LoadModelConfig(dir + "/sharded_step3/config.json");
  ASSERT_OK(m);
  Result<Checkpoint> ck = Checkpoint::Open(dir + "/step0.safetensors",
                                           Checkpoint::Mode::kReadOnly);
  ASSERT_OK(ck);
  Parallelism p;
  p.tp = 3;
  p.pp = 2;
  p.dp = 2;
  p.gate_up = GateUp::kInterleaved;
  p.transposed = true;
  p.vocab_multiple = 128;
  Result<Layout> l = GenerateLayout(*m, p);
  ASSERT_OK(l);
  ASSERT_EQ(l->canonical.size(), ck->tensors().size());
  TensorBytes canon;
  for (size_t i = 0; i < ck->tensors().size(); ++i) {
    const TensorInfo& t = ck->tensors()[i];
    EXPECT_EQ(l->canonical[i].name, t.name);
    EXPECT_EQ(l->canonical[i].shape, t.shape) << t.name;
    EXPECT_EQ(l->canonical[i].dtype, t.dtype) << t.name;
    std::span<const uint8_t> d = ck->Data(i);
    canon[t.name].assign(d.begin(), d.end());
  }
  Result<std::vector<TensorBytes>> local = ScatterToRanks(*l, canon);
  ASSERT_OK(local);
  Result<TensorBytes> again = AssembleCanonical(*l, *local);
  ASSERT_OK(again);
  EXPECT_TRUE(*again == canon);
}

}  // namespace
}  // namespace refit::layout
