// Placements from layouts: for generated layouts of many parallel setups
// (tensor parallel shards, Megatron fused QKV, gate/up concatenated and
// interleaved, transposed storage, vocabulary padding), writing every
// canonical element through the rank's placements gives exactly the local
// tensors that the layout's own definition scatters.
#include "cuda/layout_placement.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "layout/generate.h"
#include "support/frontier_configs.h"
#include "support/test_layout.h"
#include "support/testing.h"

namespace refit::cuda {
namespace {

using layout::testing::TensorBytes;

constexpr char kTiny[] = R"({
  "model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64,
  "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "tie_word_embeddings": false})";

// Writes every canonical element of `canonical` through rank ri's
// placements of `l` into local tensors filled with 0xA5, as a receiver
// would, and returns them (for comparison with the layout's scatter).
TensorBytes PlacedThrough(const layout::Layout& l, size_t ri, const TensorBytes& canonical,
                          const TensorBytes& shapes) {
  TensorBytes local;
  std::map<std::string, uint64_t> address;
  for (const auto& [name, bytes] : shapes) local[name].assign(bytes.size(), 0xA5);
  for (auto& [name, bytes] : local) address[name] = reinterpret_cast<uint64_t>(bytes.data());
  auto plan = PlanFromLayout(l, l.ranks[ri].rank, address);
  EXPECT_OK(plan);
  if (!plan.ok()) return {};
  for (const TensorPlacement& p : plan->placements()) {
    const auto& src = canonical.at(p.name);
    for (uint64_t i = 0; i < p.rows * p.cols; ++i) {
      if (auto d = p.Map(i)) {
        std::memcpy(reinterpret_cast<uint8_t*>(p.base) + *d * p.width, &src[i * p.width],
                    static_cast<size_t>(p.width));
      }
    }
  }
  return local;
}

// Every rank of `l` placed through its plan gives what the layout
// scatters, for canonical tensors of random bytes from `seed`; returns the
// ranks checked (0 after a failure).
int ExpectPlacedAsScattered(const layout::Layout& l, uint64_t seed) {
  const TensorBytes canonical = layout::testing::RandomCanonical(l, seed);
  auto expected = layout::testing::ScatterToRanks(l, canonical, 0xA5);
  EXPECT_OK(expected);
  if (!expected.ok()) return 0;
  for (size_t ri = 0; ri < l.ranks.size(); ++ri) {
    const TensorBytes placed = PlacedThrough(l, ri, canonical, (*expected)[ri]);
    EXPECT_EQ(placed, (*expected)[ri]) << "rank " << ri;
    if (placed != (*expected)[ri]) return 0;
  }
  return static_cast<int>(l.ranks.size());
}

TEST(LayoutPlacementTest, PlacementsScatterAsTheLayoutDefines) {
  auto config = layout::ParseModelConfig(kTiny);
  ASSERT_OK(config);
  int cases = 0;
  for (uint32_t tp : {1u, 2u, 4u}) {
    for (bool fused : {false, true}) {
      for (auto gate_up :
           {layout::GateUp::kConcat, layout::GateUp::kInterleaved}) {
        for (bool transposed : {false, true}) {
          layout::Parallelism par;
          par.tp = tp;
          par.fused_qkv = fused;
          par.gate_up = gate_up;
          par.gate_up_group = 16;
          par.transposed = transposed;
          par.vocab_multiple = 64;
          auto l = layout::GenerateLayout(*config, par);
          ASSERT_OK(l);
          SCOPED_TRACE(::testing::Message() << "tp " << tp << " fused " << fused
                                            << " transposed " << transposed);
          cases += ExpectPlacedAsScattered(*l, tp * 7 + fused);
        }
      }
    }
  }
  EXPECT_EQ(cases, 8 * (1 + 2 + 4));
}

// vLLM engine layouts (GenerateEngineLayout: fused qkv_proj with KV heads
// split or replicated, gate_up_proj, FusedMoE w13/w2 with and without
// expert parallelism, padded vocabulary shards): a receiver's placements
// write exactly what the layout scatters (generate_engine_test.cc checks
// that against vLLM's loaders).
TEST(LayoutPlacementTest, EngineLayoutsPlaceAsTheyScatter) {
  auto dense = layout::ParseModelConfig(kTiny);
  ASSERT_OK(dense);
  auto moe = layout::ParseModelConfig(R"({
    "model_type": "qwen3_moe", "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 6,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "tie_word_embeddings": true})");
  ASSERT_OK(moe);
  int cases = 0;
  for (const layout::ModelConfig* config : {&*dense, &*moe}) {
    for (uint32_t tp : {1u, 2u, 4u}) {
      std::vector<uint32_t> eps = {1};
      if (tp > 1 && config->num_experts > 0) eps.push_back(tp);
      for (uint32_t ep : eps) {
        layout::EngineParallelism par;
        par.tp = tp;
        par.ep = ep;
        auto l = layout::GenerateEngineLayout(*config, par);
        ASSERT_OK(l);
        SCOPED_TRACE(::testing::Message() << config->model_type << " tp " << tp << " ep " << ep);
        cases += ExpectPlacedAsScattered(*l, tp * 3 + ep);
      }
    }
  }
  EXPECT_EQ(cases, (1 + 2 + 4) + (1 + 2 + 2 + 4 + 4));
}

// The frontier engine layouts: DeepSeek-V3 / Kimi-K2 (MLA's fused
// q_a + kv_a rows, or a head-split q_proj; head-split q_b, kv_b, o_proj;
// FusedMoE experts, shared experts, the FP32 score correction bias) and
// BF16 gpt-oss (head-split sinks, w13 holding gate_up_proj's columns
// transposed, w2_bias on rank 0 alone without EP): placed as scattered.
TEST(LayoutPlacementTest, FrontierEngineLayoutsPlaceAsTheyScatter) {
  std::vector<layout::ModelConfig> configs;
  for (const char* type : {"deepseek_v3", "kimi_k2"}) {
    for (uint64_t q_lora_rank : {uint64_t{24}, uint64_t{0}}) {
      auto m = layout::ParseModelConfig(layout::testing::TinyDeepSeekV3Config(q_lora_rank, type));
      ASSERT_OK(m);
      configs.push_back(*m);
    }
  }
  auto oss = layout::ParseModelConfig(layout::testing::kTinyGptOss);
  ASSERT_OK(oss);
  configs.push_back(*oss);
  int cases = 0;
  for (const layout::ModelConfig& config : configs) {
    for (uint32_t tp : {1u, 2u, 4u}) {
      std::vector<uint32_t> eps = {1};
      if (tp > 1) eps.push_back(tp);
      for (uint32_t ep : eps) {
        layout::EngineParallelism par;
        par.tp = tp;
        par.ep = ep;
        auto l = layout::GenerateEngineLayout(config, par);
        SCOPED_TRACE(config.model_type + " tp " + std::to_string(tp) + " ep " + std::to_string(ep));
        ASSERT_OK(l);
        cases += ExpectPlacedAsScattered(*l, tp * 5 + ep);
      }
    }
  }
  EXPECT_EQ(cases, 5 * (1 + 2 + 2 + 4 + 4));
}

TEST(LayoutPlacementTest, RefusesWhatItCannotPlace) {
  auto config = layout::ParseModelConfig(kTiny);
  ASSERT_OK(config);
  auto l = layout::GenerateLayout(*config, layout::Parallelism{});
  ASSERT_OK(l);
  std::map<std::string, uint64_t> none;
  EXPECT_EQ(PlanFromLayout(*l, 0, none).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanFromLayout(*l, 5, none).status().code(),
            StatusCode::kInvalidArgument);
  layout::Layout converted = *l;
  converted.ranks[0].tensors[0].dtype = "F32";
  std::map<std::string, uint64_t> all;
  for (const auto& t : converted.ranks[0].tensors) all[t.name] = 4096;
  auto refused = PlanFromLayout(converted, 0, all);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().ToString().find("converts nothing"),
            std::string::npos);
}

}  // namespace
}  // namespace refit::cuda
