// Random generated layouts (TP/PP/EP/DP/CP sizes, uneven splits, fused QKV,
// concatenated and interleaved gate/up, transposed storage, vocab padding,
// MoE experts): every rank encodes its owned regions from its own local
// tensors; the union of all ranks' chunks applied to the canonical base is
// the canonical target assembled the slow way, bit for bit.
#include <gtest/gtest.h>

#include <random>

#include "delta/apply.h"
#include "layout/generate.h"
#include "support/test_layout.h"
#include "support/testing.h"
#include "trainer/rank_encoder.h"

namespace refit::trainer {
namespace {

using layout::GateUp;
using layout::Layout;
using layout::ModelConfig;
using layout::Parallelism;
using layout::testing::TensorBytes;

ModelConfig SmallModel(std::mt19937_64& rng, bool moe) {
  ModelConfig c;
  c.model_type = moe ? "qwen2_moe" : "qwen2";
  c.num_attention_heads = 4 + 2 * (rng() % 3);   // 4, 6, 8
  c.num_key_value_heads = c.num_attention_heads / 2;
  c.head_dim = 8;
  c.hidden_size = c.num_attention_heads * c.head_dim;
  c.intermediate_size = 40 + 8 * (rng() % 4);
  c.num_hidden_layers = 2 + rng() % 3;
  c.vocab_size = 97 + rng() % 40;
  c.attention_bias = true;
  c.tie_word_embeddings = rng() % 4 == 0;
  if (moe) {
    c.num_experts = 4;
    c.moe_intermediate_size = 24;
  }
  return c;
}

Parallelism RandomParallelism(std::mt19937_64& rng, bool moe) {
  Parallelism p;
  p.tp = 1 + static_cast<uint32_t>(rng() % 3);  // 1..3 (3: uneven splits)
  p.pp = 1 + static_cast<uint32_t>(rng() % 2);
  p.dp = 1 + static_cast<uint32_t>(rng() % 3);
  p.ep = moe && p.dp % 2 == 0 ? 2 : 1;
  p.fused_qkv = rng() % 2 == 0;
  switch (rng() % 3) {
    case 0: p.gate_up = GateUp::kSeparate; break;
    case 1: p.gate_up = GateUp::kConcat; break;
    default: p.gate_up = GateUp::kInterleaved; p.gate_up_group = 4 + 4 * (rng() % 2); break;
  }
  p.transposed = rng() % 3 == 0;
  p.vocab_multiple = 1 + rng() % 8;
  return p;
}

void Flip(TensorBytes* t, std::mt19937_64& rng, double rate) {
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& [name, b] : *t) {
    for (size_t i = 0; i < b.size(); i += 2) {
      if (u(rng) < rate) b[i] ^= static_cast<uint8_t>(1 + rng() % 7);
    }
  }
}

std::vector<TensorView> LocalViews(const Layout& l, size_t ri, const TensorBytes& bytes) {
  std::vector<TensorView> v;
  for (const auto& t : l.ranks[ri].tensors) {
    v.push_back({t.name, t.dtype, 2, t.shape, bytes.at(t.name).data()});
  }
  return v;
}

class ProjectionTest : public ::testing::TestWithParam<int> {};

TEST_P(ProjectionTest, UnionOfRankDeltasEqualsAssembledTarget) {
  std::mt19937_64 rng(static_cast<uint64_t>(GetParam()) * 7919 + 1);
  const bool moe = GetParam() % 3 == 2;
  ModelConfig config = SmallModel(rng, moe);
  Parallelism par = RandomParallelism(rng, moe);
  auto generated = layout::GenerateLayout(config, par);
  ASSERT_OK(generated);
  const Layout& l = *generated;
  SCOPED_TRACE("tp " + std::to_string(par.tp) + " pp " + std::to_string(par.pp) + " dp " +
               std::to_string(par.dp) + " ep " + std::to_string(par.ep) + " ranks " +
               std::to_string(l.ranks.size()));

  TensorBytes base;
  for (const auto& c : l.canonical) {
    uint64_t n = 1;
    for (uint64_t d : c.shape) n *= d;
    std::vector<uint8_t> b(n * 2);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    base[c.name] = std::move(b);
  }
  TensorBytes target = base;
  Flip(&target, rng, 0.03);
  auto local_base = layout::testing::ScatterToRanks(l, base);
  auto local_target = layout::testing::ScatterToRanks(l, target);
  ASSERT_TRUE(local_base.ok() && local_target.ok());

  RankEncoderOptions opt;
  opt.chunk_bytes = 512;  // several chunks a region, some rows split
  opt.threads = 2;
  std::vector<std::vector<uint8_t>> chunks;
  uint64_t owned = 0;
  std::vector<std::string> names;
  for (size_t ri = 0; ri < l.ranks.size(); ++ri) {
    auto enc = RankEncoder::Create(l, l.ranks[ri].rank, opt);
    ASSERT_OK(enc);
    // Each rank starts from its own local state (no canonical copy).
    ASSERT_TRUE((*enc)->SetBaselineFromLocal(LocalViews(l, ri, (*local_base)[ri])).ok());
    owned += (*enc)->owned_bytes();
    auto report = (*enc)->Encode(1, 0, LocalViews(l, ri, (*local_target)[ri]),
                                 [&](std::span<const uint8_t> c, const ChunkHeader&) {
                                   chunks.emplace_back(c.begin(), c.end());
                                   return Status();
                                 });
    ASSERT_OK(report);
    EXPECT_EQ(report->changed_residual, 0u);
    if (names.empty()) {
      for (const auto& c : (*enc)->canonical_tensors()) names.push_back(c.name);
    }
  }
  uint64_t canon_bytes = 0;
  for (const auto& [n, b] : base) canon_bytes += b.size();
  EXPECT_EQ(owned, canon_bytes);  // every element owned once

  TensorBytes applied = base;
  ApplyScratch scratch;
  for (const auto& c : chunks) {
    auto parsed = ParseChunk(c);
    ASSERT_TRUE(parsed.ok());
    auto& t = applied[names[parsed->header.tensor_id]];
    ASSERT_EQ(ClassifyRange(parsed->header, RegionHash(parsed->header, t.data())),
              RangeState::kBefore);
    ASSERT_TRUE(ApplyChunkInPlace(*parsed, t.data(), &scratch, nullptr, nullptr).ok());
  }
  auto assembled = layout::testing::AssembleCanonical(l, *local_target);
  ASSERT_OK(assembled);
  EXPECT_EQ(*assembled, target);
  EXPECT_TRUE(applied == target);
}

INSTANTIATE_TEST_SUITE_P(Seeds, ProjectionTest, ::testing::Range(0, 12));

}  // namespace
}  // namespace refit::trainer
