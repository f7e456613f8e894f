// Each rank encodes only what it owns, in its own layout; the union of all
// ranks' chunks applied to the canonical base must give the canonical
// target bit for bit.
#include "trainer/rank_encoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "base/bytes.h"
#include "delta/apply.h"
#include "refit/checkpoint.h"
#include "support/status_matchers.h"
#include "support/testing.h"
#include "trainer/convert.h"

namespace refit::trainer {
namespace {

using ::refit::testing::StatusIs;

using layout::CanonicalTensor;
using layout::Layout;
using layout::LocalTensor;
using layout::Piece;
using layout::RankLayout;

using Bytes = std::vector<uint8_t>;
using Named = std::map<std::string, Bytes>;

Piece P(const std::string& canon, uint64_t rows, uint64_t cols, uint64_t lo, uint64_t lrs,
        uint64_t lcs, uint64_t co, uint64_t crs, uint64_t ccs) {
  Piece p;
  p.canonical = canon;
  p.rows = rows;
  p.cols = cols;
  p.local_offset = lo;
  p.local_row_stride = lrs;
  p.local_col_stride = lcs;
  p.canon_offset = co;
  p.canon_row_stride = crs;
  p.canon_col_stride = ccs;
  return p;
}

// Two ranks: a row-parallel (column-split, uneven) matrix, a
// column-parallel one with a padding row, a transposed replicated matrix,
// a replicated 1-D norm, an FP32 master cast to BF16 and one quantized to
// FP8 E4M3 with a per-tensor scale.
Layout TwoRankLayout() {
  Layout l;
  auto canon = [&](const std::string& n, const std::string& dt, std::vector<uint64_t> shape) {
    CanonicalTensor c;
    c.name = n;
    c.dtype = dt;
    c.shape = std::move(shape);
    l.canonical.push_back(c);
    return &l.canonical.back();
  };
  canon("a.weight", "BF16", {12, 10});
  canon("b.weight", "BF16", {8, 6});
  canon("c.weight", "BF16", {5, 7});
  canon("e.norm", "BF16", {10});
  canon("f.weight", "BF16", {6, 4});
  canon("g.weight_scale", "F32", {1});
  CanonicalTensor* g = canon("g.weight", "F8_E4M3", {4, 8});
  g->scale = "g.weight_scale";
  g->scale_kind = "per_tensor";

  RankLayout r0, r1;
  r0.rank = 0;
  r1.rank = 1;
  r0.tensors.push_back({"a", "BF16", {12, 4}, {P("a.weight", 12, 4, 0, 4, 1, 0, 10, 1)}});
  r1.tensors.push_back({"a", "BF16", {12, 6}, {P("a.weight", 12, 6, 0, 6, 1, 4, 10, 1)}});
  r0.tensors.push_back({"b", "BF16", {3, 6}, {P("b.weight", 3, 6, 0, 6, 1, 0, 6, 1)}});
  r1.tensors.push_back({"b", "BF16", {6, 6}, {P("b.weight", 5, 6, 0, 6, 1, 18, 6, 1)}});
  for (RankLayout* r : {&r0, &r1}) {
    // Local [7, 5] holds canonical [5, 7] transposed.
    r->tensors.push_back({"c_t", "BF16", {7, 5}, {P("c.weight", 7, 5, 0, 5, 1, 0, 1, 7)}});
    r->tensors.push_back({"norm", "BF16", {10}, {P("e.norm", 1, 10, 0, 10, 1, 0, 10, 1)}});
  }
  r1.tensors.push_back({"f_master", "F32", {6, 4}, {P("f.weight", 6, 4, 0, 4, 1, 0, 4, 1)}});
  r0.tensors.push_back({"g_master", "F32", {4, 8}, {P("g.weight", 4, 8, 0, 8, 1, 0, 8, 1)}});
  l.ranks = {r0, r1};
  return l;
}

uint64_t Elements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

int WidthOf(const std::string& dt) {
  return dt == "F32" ? 4 : dt == "F8_E4M3" ? 1 : 2;
}

// The trainer's state: every rank's local tensors. Canonical tensors are
// derived from it the slow way (Assemble).
struct World {
  Layout layout;
  std::vector<Named> local;  // per rank
};

World MakeWorld(std::mt19937_64& rng) {
  World w;
  w.layout = TwoRankLayout();
  std::map<std::string, Bytes> canon;  // direct tensors' canonical bytes
  for (const CanonicalTensor& c : w.layout.canonical) {
    Bytes b(Elements(c.shape) * static_cast<uint64_t>(WidthOf(c.dtype)));
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    canon[c.name] = b;
  }
  std::normal_distribution<float> normal(0, 0.02f);
  for (const RankLayout& r : w.layout.ranks) {
    Named named;
    for (const LocalTensor& lt : r.tensors) {
      const int lw = WidthOf(lt.dtype);
      Bytes b(Elements(lt.shape) * static_cast<uint64_t>(lw), 0xEE);  // padding stays 0xEE
      for (const Piece& p : lt.pieces) {
        for (uint64_t i = 0; i < p.rows; ++i) {
          for (uint64_t j = 0; j < p.cols; ++j) {
            uint64_t li = p.local_offset + i * p.local_row_stride + j * p.local_col_stride;
            uint64_t ci = p.canon_offset + i * p.canon_row_stride + j * p.canon_col_stride;
            if (lt.dtype == "F32") {
              float x = normal(rng);
              std::memcpy(b.data() + li * 4, &x, 4);
            } else {
              std::memcpy(b.data() + li * lw, canon[p.canonical].data() + ci * lw,
                          static_cast<size_t>(lw));
            }
          }
        }
      }
      named[lt.name] = b;
    }
    w.local.push_back(named);
  }
  return w;
}

// Canonical tensors assembled from the ranks' local tensors, the slow way.
Named Assemble(const World& w) {
  Named out;
  for (const CanonicalTensor& c : w.layout.canonical) {
    out[c.name] = Bytes(Elements(c.shape) * static_cast<uint64_t>(WidthOf(c.dtype)));
  }
  std::map<std::string, float> amax;
  for (size_t r = 0; r < w.layout.ranks.size(); ++r) {
    for (const LocalTensor& lt : w.layout.ranks[r].tensors) {
      const Bytes& b = w.local[r].at(lt.name);
      for (const Piece& p : lt.pieces) {
        for (uint64_t i = 0; i < p.rows; ++i) {
          for (uint64_t j = 0; j < p.cols; ++j) {
            uint64_t li = p.local_offset + i * p.local_row_stride + j * p.local_col_stride;
            if (lt.dtype == "F32") {
              amax[p.canonical] = std::max(amax[p.canonical], std::fabs(LoadAsF32("F32", b.data(), li)));
            }
          }
        }
      }
    }
  }
  for (size_t r = 0; r < w.layout.ranks.size(); ++r) {
    for (const LocalTensor& lt : w.layout.ranks[r].tensors) {
      const Bytes& b = w.local[r].at(lt.name);
      for (const Piece& p : lt.pieces) {
        const CanonicalTensor* ct = nullptr;
        for (const auto& c : w.layout.canonical) {
          if (c.name == p.canonical) ct = &c;
        }
        Bytes& dst = out[p.canonical];
        const int cw = WidthOf(ct->dtype);
        for (uint64_t i = 0; i < p.rows; ++i) {
          for (uint64_t j = 0; j < p.cols; ++j) {
            uint64_t li = p.local_offset + i * p.local_row_stride + j * p.local_col_stride;
            uint64_t ci = p.canon_offset + i * p.canon_row_stride + j * p.canon_col_stride;
            if (lt.dtype == ct->dtype) {
              std::memcpy(dst.data() + ci * cw, b.data() + li * cw, static_cast<size_t>(cw));
            } else if (ct->dtype == "BF16") {
              StoreLE(dst.data() + ci * 2, Bf16FromF32(LoadAsF32("F32", b.data(), li)), 2);
            } else {
              float scale = amax[p.canonical] / 448.0f;
              dst[ci] = E4m3FromF32(LoadAsF32("F32", b.data(), li) / scale);
              std::memcpy(out[ct->scale].data(), &scale, 4);
            }
          }
        }
      }
    }
  }
  return out;
}

// One training step: every local tensor changes a little, replicas alike.
void Step(World* w, std::mt19937_64& rng, double rate) {
  std::uniform_real_distribution<double> u(0, 1);
  // Direct tensors change in canonical space so that replicas stay equal:
  // flip bits of the assembled tensors, then scatter back.
  Named canon = Assemble(*w);
  for (auto& [name, b] : canon) {
    for (size_t i = 0; i < b.size(); i += 2) {
      if (u(rng) < rate) b[i] ^= static_cast<uint8_t>(1 + rng() % 3);
    }
  }
  for (size_t r = 0; r < w->layout.ranks.size(); ++r) {
    for (const LocalTensor& lt : w->layout.ranks[r].tensors) {
      Bytes& b = w->local[r][lt.name];
      for (const Piece& p : lt.pieces) {
        for (uint64_t i = 0; i < p.rows; ++i) {
          for (uint64_t j = 0; j < p.cols; ++j) {
            uint64_t li = p.local_offset + i * p.local_row_stride + j * p.local_col_stride;
            uint64_t ci = p.canon_offset + i * p.canon_row_stride + j * p.canon_col_stride;
            if (lt.dtype == "F32") {
              float x = LoadAsF32("F32", b.data(), li);
              if (u(rng) < 10 * rate) x *= 1.0f + 2e-2f * static_cast<float>(u(rng) - 0.5);
              std::memcpy(b.data() + li * 4, &x, 4);
            } else {
              std::memcpy(b.data() + li * 2, canon[p.canonical].data() + ci * 2, 2);
            }
          }
        }
      }
    }
  }
}

std::vector<TensorView> Views(const Named& named, const Layout& l) {
  std::map<std::string, const CanonicalTensor*> ct;
  for (const auto& c : l.canonical) ct[c.name] = &c;
  std::vector<TensorView> v;
  for (const auto& [name, b] : named) {
    const CanonicalTensor* c = ct.at(name);
    v.push_back({name, c->dtype, WidthOf(c->dtype), c->shape, b.data()});
  }
  return v;
}

std::vector<TensorView> LocalViews(const World& w, size_t rank) {
  std::vector<TensorView> v;
  for (const LocalTensor& lt : w.layout.ranks[rank].tensors) {
    v.push_back({lt.name, lt.dtype, WidthOf(lt.dtype), lt.shape, w.local[rank].at(lt.name).data()});
  }
  return v;
}

struct Emitted {
  std::vector<Bytes> chunks;
};

// Applies chunks by the at-most-once rule, as a receiver does.
void ApplyAll(const std::vector<Bytes>& chunks, const RankEncoder& enc, Named* canon) {
  ApplyScratch scratch;
  for (const Bytes& c : chunks) {
    auto parsed = ParseChunk(c);
    ASSERT_OK(parsed);
    const std::string& name = enc.canonical_tensors()[parsed->header.tensor_id].name;
    Bytes& t = (*canon)[name];
    ASSERT_LE(parsed->header.End() * parsed->header.width, t.size());
    ASSERT_EQ(ClassifyRange(parsed->header, RegionHash(parsed->header, t.data())),
              RangeState::kBefore)
        << name;
    Status st = ApplyChunkInPlace(*parsed, t.data(), &scratch, nullptr, nullptr);
    ASSERT_OK(st);
  }
}

class RankEncoderTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RankEncoderTest, UnionOfRanksEqualsAssembledTarget) {
  std::mt19937_64 rng(GetParam());
  World world = MakeWorld(rng);
  Named base = Assemble(world);
  RankEncoderOptions opt;
  opt.chunk_bytes = GetParam();
  opt.threads = 2;
  std::vector<std::unique_ptr<RankEncoder>> enc;
  for (uint32_t r = 0; r < 2; ++r) {
    auto e = RankEncoder::Create(world.layout, r, opt);
    ASSERT_OK(e);
    ASSERT_TRUE((*e)->SetBaseline(Views(base, world.layout)).ok());
    enc.push_back(std::move(*e));
  }
  // Owned bytes sum to the canonical model's bytes: each element once.
  uint64_t canon_bytes = 0, owned = 0;
  for (const auto& [n, b] : base) canon_bytes += b.size();
  for (const auto& e : enc) owned += e->owned_bytes();
  EXPECT_EQ(owned, canon_bytes);

  Named current = base;
  for (uint64_t version = 1; version <= 3; ++version) {
    Step(&world, rng, 0.05);
    Named target = Assemble(world);
    ASSERT_NE(target, current);
    std::vector<Bytes> chunks;
    RankReport total;
    for (uint32_t r = 0; r < 2; ++r) {
      auto report = enc[r]->Encode(version, version - 1, LocalViews(world, r),
                                   [&](std::span<const uint8_t> c, const ChunkHeader& h) {
                                     EXPECT_EQ(h.version, version);
                                     chunks.emplace_back(c.begin(), c.end());
                                     return Status();
                                   });
      ASSERT_OK(report);
      total.changed_direct += report->changed_direct;
      total.changed_residual += report->changed_residual;
    }
    EXPECT_GT(total.changed_direct, 0u);
    EXPECT_GT(total.changed_residual, 0u);
    Named applied = current;
    ApplyAll(chunks, *enc[0], &applied);
    ASSERT_EQ(applied, target) << "version " << version;
    if (version == 2) {
      // An aborted version leaves the baseline: the next encode is again
      // against version 1, so apply this version's target as the base.
      for (auto& e : enc) e->Abort();
      Step(&world, rng, 0.05);
      Named target3 = Assemble(world);
      std::vector<Bytes> again;
      for (uint32_t r = 0; r < 2; ++r) {
        ASSERT_TRUE(enc[r]->Encode(version, version - 1, LocalViews(world, r),
                                   [&](std::span<const uint8_t> c, const ChunkHeader&) {
                                     again.emplace_back(c.begin(), c.end());
                                     return Status();
                                   }).ok());
      }
      Named applied2 = current;
      ApplyAll(again, *enc[0], &applied2);
      ASSERT_EQ(applied2, target3);
      target = target3;
    }
    for (auto& e : enc) ASSERT_TRUE(e->Commit().ok());
    current = target;
  }
}

// chunk_bytes: tiny (rows split into parts), small (a few rows a chunk),
// default (one chunk a region).
INSTANTIATE_TEST_SUITE_P(ChunkSizes, RankEncoderTest,
                         ::testing::Values(uint64_t{6}, uint64_t{40}, uint64_t{8} << 20));

TEST(RankEncoderTest, BaselineFromLocalEqualsBaselineFromCanonical) {
  std::mt19937_64 rng(11);
  World world = MakeWorld(rng);
  Named base = Assemble(world);
  World next = world;
  Step(&next, rng, 0.1);
  for (uint32_t r = 0; r < 2; ++r) {
    auto a = RankEncoder::Create(world.layout, r, {});
    auto b = RankEncoder::Create(world.layout, r, {});
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE((*a)->SetBaseline(Views(base, world.layout)).ok());
    ASSERT_TRUE((*b)->SetBaselineFromLocal(LocalViews(world, r)).ok());
    std::vector<Bytes> ca, cb;
    ASSERT_TRUE((*a)->Encode(1, 0, LocalViews(next, r), [&](auto c, const ChunkHeader&) {
      ca.emplace_back(c.begin(), c.end());
      return Status();
    }).ok());
    ASSERT_TRUE((*b)->Encode(1, 0, LocalViews(next, r), [&](auto c, const ChunkHeader&) {
      cb.emplace_back(c.begin(), c.end());
      return Status();
    }).ok());
    EXPECT_FALSE(ca.empty());
    EXPECT_EQ(ca, cb);
  }
}

// jobs() is the plan Encode follows: every emitted chunk's region is the
// next changed job's, and an in-place job's local elements are the
// region's canonical bits, consecutive from local_element. A plan-only
// encoder has the same plan and no baseline.
TEST(RankEncoderTest, JobsDescribeEveryChunkInEmitOrder) {
  for (uint64_t chunk_bytes : {uint64_t{6}, uint64_t{40}, uint64_t{8} << 20}) {
    std::mt19937_64 rng(17);
    World world = MakeWorld(rng);
    Named base = Assemble(world);
    Step(&world, rng, 0.5);
    Named target = Assemble(world);
    RankEncoderOptions opt;
    opt.chunk_bytes = chunk_bytes;
    for (uint32_t r = 0; r < 2; ++r) {
      auto e = RankEncoder::Create(world.layout, r, opt);
      ASSERT_OK(e);
      ASSERT_OK((*e)->SetBaseline(Views(base, world.layout)));
      const std::vector<RankJob> jobs = (*e)->jobs();
      std::vector<ChunkHeader> emitted;
      ASSERT_OK((*e)->Encode(1, 0, LocalViews(world, r),
                             [&](std::span<const uint8_t>, const ChunkHeader& h) {
                               emitted.push_back(h);
                               return Status();
                             }));
      ASSERT_FALSE(emitted.empty());
      size_t k = 0;
      bool any_in_place = false;
      uint64_t offset = 0;
      for (const RankJob& j : jobs) {
        EXPECT_EQ(j.base_offset, offset);
        offset += j.count * static_cast<uint64_t>(j.width);
        const auto& ct = (*e)->canonical_tensors()[j.tensor_id];
        if (j.in_place) {
          any_in_place = true;
          const LocalTensor& lt = (*e)->local_tensors()[j.local];
          const Bytes& local = world.local[r].at(lt.name);
          const Bytes& canon = target.at(ct.name);
          const uint64_t w = static_cast<uint64_t>(j.width);
          for (uint64_t i = 0; i < j.count; ++i) {
            const uint64_t ci =
                j.run == 0 ? j.start + i : j.start + (i / j.run) * j.stride + i % j.run;
            ASSERT_EQ(0, std::memcmp(local.data() + (j.local_element + i) * w,
                                     canon.data() + ci * w, w))
                << ct.name << " element " << i;
          }
        }
        if (k < emitted.size() && emitted[k].tensor_id == j.tensor_id &&
            emitted[k].start == j.start && emitted[k].count == j.count) {
          EXPECT_EQ(emitted[k].run, j.run);
          EXPECT_EQ(emitted[k].stride, j.run == 0 ? 0 : j.stride);
          EXPECT_EQ(emitted[k].width, j.width);
          ++k;
        }
      }
      EXPECT_EQ(k, emitted.size()) << "chunk_bytes " << chunk_bytes << " rank " << r;
      EXPECT_EQ(offset, (*e)->owned_bytes());
      EXPECT_TRUE(any_in_place);
      RankEncoderOptions plan = opt;
      plan.plan_only = true;
      auto p = RankEncoder::Create(world.layout, r, plan);
      ASSERT_OK(p);
      EXPECT_EQ((*p)->owned_bytes(), (*e)->owned_bytes());
      const std::vector<RankJob> again = (*p)->jobs();
      ASSERT_EQ(again.size(), jobs.size());
      for (size_t i = 0; i < jobs.size(); ++i) {
        EXPECT_EQ(again[i].base_offset, jobs[i].base_offset);
        EXPECT_EQ(again[i].in_place, jobs[i].in_place);
      }
      EXPECT_THAT((*p)->SetBaseline(Views(base, world.layout)),
                  StatusIs(StatusCode::kFailedPrecondition));
    }
  }
}

TEST(RankEncoderTest, BadInputsAreRefused) {
  std::mt19937_64 rng(5);
  World world = MakeWorld(rng);
  auto e = RankEncoder::Create(world.layout, 7, {});
  EXPECT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("no rank 7"), std::string::npos);

  auto enc = RankEncoder::Create(world.layout, 0, {});
  ASSERT_TRUE(enc.ok());
  auto none = (*enc)->Encode(1, 0, LocalViews(world, 0), [](auto, const ChunkHeader&) {
    return Status();
  });
  EXPECT_THAT(none, StatusIs(StatusCode::kFailedPrecondition));  // no baseline
  ASSERT_TRUE((*enc)->SetBaselineFromLocal(LocalViews(world, 0)).ok());
  auto views = LocalViews(world, 0);
  views.pop_back();
  auto missing = (*enc)->Encode(1, 0, views, [](auto, const ChunkHeader&) { return Status(); });
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("g_master"), std::string::npos);

  // A per-tensor scale split over two ranks cannot be computed locally:
  // the caller must give the tensor's amax.
  Layout split = world.layout;
  for (auto& r : split.ranks) {
    for (auto& lt : r.tensors) {
      if (lt.name == "g_master") {
        lt.shape = {2, 8};
        lt.pieces = {P("g.weight", 2, 8, 0, 8, 1, 0, 8, 1)};
      }
    }
  }
  split.ranks[1].tensors.push_back({"g_master", "F32", {2, 8}, {P("g.weight", 2, 8, 0, 8, 1, 16, 8, 1)}});
  auto s = RankEncoder::Create(split, 0, {});
  ASSERT_OK(s);
  EXPECT_EQ((*s)->global_amax_tensors(), std::vector<std::string>{"g.weight"});
  std::vector<TensorView> half = LocalViews(world, 0);
  for (TensorView& v : half) {
    if (v.name == "g_master") v.shape = {2, 8};
  }
  const Status no_amax = (*s)->SetBaselineFromLocal(half);
  EXPECT_THAT(no_amax, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(no_amax.message().find("'g.weight' is split across ranks"), std::string::npos)
      << no_amax.ToString();
  EXPECT_NE(no_amax.message().find("per-tensor scale 'g.weight_scale'"), std::string::npos)
      << no_amax.ToString();
  EXPECT_THAT((*s)->SetBaselineFromLocal(half, {{"g.weight", std::nanf("")}}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_OK((*s)->SetBaselineFromLocal(half, {{"g.weight", 1.0f}}));
}

// FP8 with per-block scales: each rank converts only the blocks it owns
// (splits on block boundaries), computes their scales and owns their
// elements of the scale tensor; partial edge blocks and a BF16 source
// included. One large value moves a block's scale and so every element of
// that block.
struct BlockCase {
  std::string name, scale, local_dtype;
  uint64_t rows, cols, br, bc;
  std::vector<std::pair<uint64_t, uint64_t>> col_split;  // per rank [c0, c1)
  std::vector<std::pair<uint64_t, uint64_t>> row_split;  // per rank [r0, r1)
};

// Canonical FP8 bytes and scales of an FP32 matrix, the slow way.
void Quantize(const BlockCase& c, const std::vector<float>& m, Bytes* q, Bytes* scales) {
  const uint64_t nbr = (c.rows + c.br - 1) / c.br, nbc = (c.cols + c.bc - 1) / c.bc;
  std::vector<float> amax(nbr * nbc, 0);
  for (uint64_t r = 0; r < c.rows; ++r) {
    for (uint64_t k = 0; k < c.cols; ++k) {
      float& a = amax[(r / c.br) * nbc + k / c.bc];
      a = std::max(a, std::fabs(m[r * c.cols + k]));
    }
  }
  scales->assign(amax.size() * 4, 0);
  for (size_t b = 0; b < amax.size(); ++b) {
    float s = amax[b] > 0 ? amax[b] / 448.0f : 1.0f;
    std::memcpy(scales->data() + 4 * b, &s, 4);
  }
  q->assign(c.rows * c.cols, 0);
  for (uint64_t r = 0; r < c.rows; ++r) {
    for (uint64_t k = 0; k < c.cols; ++k) {
      float s;
      std::memcpy(&s, scales->data() + 4 * ((r / c.br) * nbc + k / c.bc), 4);
      (*q)[r * c.cols + k] = E4m3FromF32(m[r * c.cols + k] / s);
    }
  }
}

TEST(RankEncoderTest, PerBlockFp8ScalesFollowOwnedBlocks) {
  const std::vector<BlockCase> cases = {
      {"q.weight", "q.weight_scale_inv", "F32", 256, 384, 128, 128, {{0, 256}, {256, 384}}, {}},
      {"u.weight", "u.weight_scale_inv", "BF16", 200, 96, 64, 64, {}, {{0, 128}, {128, 200}}},
  };
  Layout l;
  l.ranks.resize(2);
  l.ranks[0].rank = 0;
  l.ranks[1].rank = 1;
  for (const BlockCase& c : cases) {
    CanonicalTensor t;
    t.name = c.name;
    t.dtype = "F8_E4M3";
    t.shape = {c.rows, c.cols};
    t.scale = c.scale;
    t.scale_kind = "per_block";
    t.block_rows = c.br;
    t.block_cols = c.bc;
    l.canonical.push_back(t);
    CanonicalTensor st;
    st.name = c.scale;
    st.dtype = "F32";
    st.shape = {(c.rows + c.br - 1) / c.br, (c.cols + c.bc - 1) / c.bc};
    l.canonical.push_back(st);
    for (uint32_t r = 0; r < 2; ++r) {
      uint64_t r0 = 0, r1 = c.rows, c0 = 0, c1 = c.cols;
      if (!c.col_split.empty()) std::tie(c0, c1) = c.col_split[r];
      if (!c.row_split.empty()) std::tie(r0, r1) = c.row_split[r];
      l.ranks[r].tensors.push_back(
          {"local." + c.name, c.local_dtype, {r1 - r0, c1 - c0},
           {P(c.name, r1 - r0, c1 - c0, 0, c1 - c0, 1, r0 * c.cols + c0, c.cols, 1)}});
    }
  }
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0, 0.02f);
  // Masters in canonical coordinates (BF16-representable for the BF16 case).
  std::map<std::string, std::vector<float>> m0, m1;
  for (const BlockCase& c : cases) {
    auto& a = m0[c.name];
    a.resize(c.rows * c.cols);
    for (float& x : a) {
      x = normal(rng);
      if (c.local_dtype == "BF16") x = F32FromBf16(Bf16FromF32(x));
    }
    auto& b = m1[c.name];
    b = a;
    for (float& x : b) {
      if (rng() % 10 == 0) x *= 1.02f;
      if (c.local_dtype == "BF16") x = F32FromBf16(Bf16FromF32(x));
    }
    b[5 * c.cols + 3] = 0.5f;  // moves block (0, 0)'s scale
  }
  auto canonical = [&](const std::map<std::string, std::vector<float>>& m) {
    Named out;
    for (const BlockCase& c : cases) Quantize(c, m.at(c.name), &out[c.name], &out[c.scale]);
    return out;
  };
  auto local_of = [&](const std::map<std::string, std::vector<float>>& m, uint32_t rank) {
    Named out;
    for (const LocalTensor& lt : l.ranks[rank].tensors) {
      const BlockCase* c = nullptr;
      for (const auto& x : cases) {
        if ("local." + x.name == lt.name) c = &x;
      }
      const Piece& p = lt.pieces[0];
      const int lw = WidthOf(lt.dtype);
      Bytes b(p.rows * p.cols * static_cast<uint64_t>(lw));
      for (uint64_t i = 0; i < p.rows; ++i) {
        for (uint64_t j = 0; j < p.cols; ++j) {
          float x = m.at(c->name)[p.canon_offset + i * c->cols + j];
          uint8_t* d = b.data() + (i * p.cols + j) * lw;
          if (lw == 4) std::memcpy(d, &x, 4);
          else StoreLE(d, Bf16FromF32(x), 2);
        }
      }
      out[lt.name] = std::move(b);
    }
    return out;
  };
  auto views = [&](const Named& named, uint32_t rank) {
    std::vector<TensorView> v;
    for (const LocalTensor& lt : l.ranks[rank].tensors) {
      v.push_back({lt.name, lt.dtype, WidthOf(lt.dtype), lt.shape, named.at(lt.name).data()});
    }
    return v;
  };
  Named base = canonical(m0), target = canonical(m1);
  std::vector<Bytes> chunks;
  std::vector<Named> locals = {local_of(m1, 0), local_of(m1, 1)};
  std::unique_ptr<RankEncoder> first;
  uint64_t residual = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    auto enc = RankEncoder::Create(l, r, {});
    ASSERT_OK(enc);
    ASSERT_TRUE((*enc)->SetBaseline(Views(base, l)).ok());
    auto report = (*enc)->Encode(1, 0, views(locals[r], r), [&](auto c, const ChunkHeader&) {
      chunks.emplace_back(c.begin(), c.end());
      return Status();
    });
    ASSERT_OK(report);
    residual += report->changed_residual;
    if (!first) first = std::move(*enc);
  }
  EXPECT_GT(residual, 128u * 128u / 2);  // block (0, 0) rescaled
  Named applied = base;
  ApplyAll(chunks, *first, &applied);
  for (const auto& [name, bytes] : target) EXPECT_EQ(applied[name], bytes) << name;

  // A split inside a block cannot be converted by either rank alone.
  Layout bad = l;
  bad.ranks[0].tensors[0] = {"local.q.weight", "F32", {256, 200},
                             {P("q.weight", 256, 200, 0, 200, 1, 0, 384, 1)}};
  bad.ranks[1].tensors[0] = {"local.q.weight", "F32", {256, 184},
                             {P("q.weight", 256, 184, 0, 184, 1, 200, 384, 1)}};
  auto refused = RankEncoder::Create(bad, 0, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("whole block"), std::string::npos)
      << refused.status().ToString();
}

// The fixtures through the residual path: the FP32 masters of step 2 as the
// trainer's tensors (embeddings and lm_head, which have no masters, as
// BF16), against the canonical BF16 checkpoint of step 1, must produce
// step 2 exactly; the same against the FP8 checkpoint.
class FixtureResidualTest : public ::testing::TestWithParam<bool> {};

TEST_P(FixtureResidualTest, MastersOfStep2PatchStep1IntoStep2) {
  REFIT_REQUIRE_FIXTURES();
  const bool fp8 = GetParam();
  const std::string dir = testing::FixturesDir();
  const std::string canon_dir = fp8 ? dir + "/fp8/" : dir + "/";
  auto c1 = Checkpoint::Open(canon_dir + "step1.safetensors", Checkpoint::Mode::kReadOnly);
  auto c2 = Checkpoint::Open(canon_dir + "step2.safetensors", Checkpoint::Mode::kReadOnly);
  auto m2 = Checkpoint::Open(dir + "/fp32/step2.safetensors", Checkpoint::Mode::kReadOnly);
  auto b2 = Checkpoint::Open(dir + "/step2.safetensors", Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(c1.ok() && c2.ok() && m2.ok() && b2.ok());
  Layout l;
  RankLayout r0;
  std::vector<TensorView> local;
  // Tensors with an FP32 master are converted (residual path); the others
  // (embeddings, lm_head: no masters in the fixtures) are held by the
  // trainer as the checkpoint stores them, FP8 ones with their scales.
  for (const TensorInfo& t : c1->tensors()) {
    const bool is_scale = t.name.ends_with("_scale");
    const std::string owner = is_scale ? t.name.substr(0, t.name.size() - 6) : t.name;
    const bool has_master = m2->IndexOf(owner).has_value();
    CanonicalTensor ct;
    ct.name = t.name;
    ct.dtype = t.dtype;
    ct.shape = t.shape;
    if (!is_scale && has_master && c1->IndexOf(t.name + "_scale")) {
      ct.scale = t.name + "_scale";
      ct.scale_kind = "per_tensor";
    }
    l.canonical.push_back(ct);
    if (is_scale && has_master) continue;  // derived from its tensor
    const Checkpoint& src = has_master ? *m2 : fp8 ? *c2 : *b2;
    size_t si = *src.IndexOf(t.name);
    const TensorInfo& st = src.tensors()[si];
    uint64_t n = Elements(t.shape);
    uint64_t cols = t.shape.size() == 2 ? t.shape[1] : n;
    uint64_t rows = n / cols;
    r0.tensors.push_back({"local." + t.name, st.dtype, st.shape,
                          {P(t.name, rows, cols, 0, cols, 1, 0, cols, 1)}});
    local.push_back({"local." + t.name, st.dtype, WidthOf(st.dtype), st.shape, src.Data(si).data()});
  }
  l.ranks = {r0};
  auto enc = RankEncoder::Create(l, 0, {});
  ASSERT_OK(enc);
  std::vector<TensorView> base_views;
  Named work;
  for (size_t i = 0; i < c1->tensors().size(); ++i) {
    const TensorInfo& t = c1->tensors()[i];
    auto d = c1->Data(i);
    work[t.name] = Bytes(d.begin(), d.end());
    base_views.push_back({t.name, t.dtype, WidthOf(t.dtype), t.shape, d.data()});
  }
  ASSERT_TRUE((*enc)->SetBaseline(base_views).ok());
  std::vector<Bytes> chunks;
  auto report = (*enc)->Encode(2, 1, local, [&](auto c, const ChunkHeader&) {
    chunks.emplace_back(c.begin(), c.end());
    return Status();
  });
  ASSERT_OK(report);
  EXPECT_GT(report->changed_residual, 0u);
  EXPECT_GT(report->changed_direct, 0u);  // embeddings and lm_head
  ApplyAll(chunks, **enc, &work);
  for (size_t i = 0; i < c2->tensors().size(); ++i) {
    const TensorInfo& t = c2->tensors()[i];
    auto want = c2->Data(i);
    ASSERT_EQ(work[t.name], Bytes(want.begin(), want.end())) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp8, FixtureResidualTest, ::testing::Bool());

}  // namespace
}  // namespace refit::trainer
