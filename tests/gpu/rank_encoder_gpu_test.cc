// The GPU rank encoder against the CPU one (the oracle): for tensor-parallel
// row and column shards, a fused QKV tensor and replicated tensors, every
// version's chunks must be byte for byte the CPU RankEncoder's, over
// commits and an abort, and the re-send regions the same. And the GPU
// receiver (a two-phase DeviceTarget) applying the ranks' chunks, strided
// regions included: bit-exact, its pre-pause hashes those of the CPU, a
// wrong base refused before the pause and undone in it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "base/hash.h"
#include "cuda/device_rank_encoder.h"
#include "cuda/device_target.h"
#include "delta/chunk.h"
#include "layout/layout.h"
#include "support/status_matchers.h"
#include "support/testing.h"
#include "trainer/rank_encoder.h"

namespace refit::cuda {
namespace {

using layout::CanonicalTensor;
using layout::Layout;
using layout::LocalTensor;
using layout::Piece;
using ::refit::testing::StatusIs;
using Bytes = std::vector<uint8_t>;
using Named = std::map<std::string, Bytes>;

Piece P(const std::string& canon, uint64_t rows, uint64_t cols, uint64_t lo,
        uint64_t lrs, uint64_t co, uint64_t crs) {
  Piece p;
  p.canonical = canon;
  p.rows = rows;
  p.cols = cols;
  p.local_offset = lo;
  p.local_row_stride = lrs;
  p.local_col_stride = 1;
  p.canon_offset = co;
  p.canon_row_stride = crs;
  p.canon_col_stride = 1;
  return p;
}

uint64_t Elements(const std::vector<uint64_t>& s) {
  uint64_t n = 1;
  for (uint64_t d : s) n *= d;
  return n;
}
int Width(const std::string& dt) { return dt == "F32" ? 4 : 2; }

// TP 2: a row-parallel matrix (column halves: strided regions), a
// column-parallel one (row halves), q/k/v fused per rank, a replicated
// BF16 norm and a replicated F32 bias.
Layout Tp2Layout() {
  Layout l;
  auto canon = [&](const std::string& n, const std::string& dt,
                   std::vector<uint64_t> shape) {
    CanonicalTensor c;
    c.name = n;
    c.dtype = dt;
    c.shape = std::move(shape);
    l.canonical.push_back(c);
  };
  canon("a.weight", "BF16", {96, 1024});
  canon("b.weight", "BF16", {1024, 384});
  canon("q.weight", "BF16", {256, 128});
  canon("k.weight", "BF16", {64, 128});
  canon("v.weight", "BF16", {64, 128});
  canon("n.weight", "BF16", {1000});
  canon("e.bias", "F32", {333});
  for (uint32_t r = 0; r < 2; ++r) {
    layout::RankLayout rl;
    rl.rank = r;
    rl.tensors.push_back({"a",
                          "BF16",
                          {96, 512},
                          {P("a.weight", 96, 512, 0, 512, r * 512, 1024)}});
    rl.tensors.push_back(
        {"b",
         "BF16",
         {512, 384},
         {P("b.weight", 512, 384, 0, 384, r * 512 * 384, 384)}});
    rl.tensors.push_back(
        {"qkv",
         "BF16",
         {192, 128},
         {P("q.weight", 128, 128, 0, 128, r * 128 * 128, 128),
          P("k.weight", 32, 128, 128 * 128, 128, r * 32 * 128, 128),
          P("v.weight", 32, 128, 160 * 128, 128, r * 32 * 128, 128)}});
    rl.tensors.push_back(
        {"norm", "BF16", {1000}, {P("n.weight", 1, 1000, 0, 1000, 0, 1000)}});
    rl.tensors.push_back(
        {"bias", "F32", {333}, {P("e.bias", 1, 333, 0, 333, 0, 333)}});
    l.ranks.push_back(rl);
  }
  return l;
}

Named Scatter(const Layout& l, const Named& canon, size_t rank) {
  Named out;
  for (const LocalTensor& lt : l.ranks[rank].tensors) {
    const uint64_t w = static_cast<uint64_t>(Width(lt.dtype));
    Bytes b(Elements(lt.shape) * w, 0);
    for (const Piece& p : lt.pieces) {
      for (uint64_t i = 0; i < p.rows; ++i) {
        std::memcpy(b.data() + (p.local_offset + i * p.local_row_stride) * w,
                    canon.at(p.canonical).data() +
                        (p.canon_offset + i * p.canon_row_stride) * w,
                    p.cols * w);
      }
    }
    out[lt.name] = std::move(b);
  }
  return out;
}

std::vector<TensorView> CanonViews(const Layout& l, const Named& canon) {
  std::vector<TensorView> v;
  for (const CanonicalTensor& c : l.canonical) {
    v.push_back(
        {c.name, c.dtype, Width(c.dtype), c.shape, canon.at(c.name).data()});
  }
  return v;
}

// The rank's local tensors, on the host and as device copies.
struct Local {
  Named host;
  std::map<std::string, void*> device;
  ~Local() {
    for (auto& [n, p] : device) cudaFree(p);
  }
  void Upload() {
    for (auto& [n, b] : host) {
      if (!device.count(n)) {
        ASSERT_EQ(cudaMalloc(&device[n], b.size()), cudaSuccess);
      }
      ASSERT_EQ(
          cudaMemcpy(device[n], b.data(), b.size(), cudaMemcpyHostToDevice),
          cudaSuccess);
    }
  }
  std::vector<TensorView> Views(const Layout& l, size_t rank,
                                bool on_device) const {
    std::vector<TensorView> v;
    for (const LocalTensor& lt : l.ranks[rank].tensors) {
      const uint8_t* d = on_device
                             ? static_cast<const uint8_t*>(device.at(lt.name))
                             : host.at(lt.name).data();
      v.push_back({lt.name, lt.dtype, Width(lt.dtype), lt.shape, d});
    }
    return v;
  }
};

std::vector<Bytes> EncodeAll(trainer::RankEncoderInterface& e, uint64_t version,
                             const std::vector<TensorView>& local,
                             trainer::RankReport* report) {
  std::vector<Bytes> out;
  auto r = e.Encode(version, version - 1, local,
                    [&](std::span<const uint8_t> c, const ChunkHeader&) {
                      out.emplace_back(c.begin(), c.end());
                      return Status();
                    });
  EXPECT_OK(r);
  if (r.ok() && report != nullptr) *report = *r;
  return out;
}

// Random canonical tensors of the layout.
Named RandomCanon(const Layout& l, std::mt19937_64& rng) {
  Named canon;
  for (const CanonicalTensor& c : l.canonical) {
    Bytes b(Elements(c.shape) * static_cast<uint64_t>(Width(c.dtype)));
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    canon[c.name] = std::move(b);
  }
  return canon;
}

// A training step: `rate` of the 16-bit words get low bits flipped.
void Step(Named& canon, double rate, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& [name, b] : canon) {
    for (size_t i = 0; i < b.size(); i += 2) {
      if (u(rng) < rate) b[i] ^= static_cast<uint8_t>(1 + rng() % 7);
    }
  }
}

class DeviceRankEncoderTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(DeviceRankEncoderTest, ChunksEqualTheCpuEncodersOverVersions) {
  const Layout l = Tp2Layout();
  std::mt19937_64 rng(GetParam());
  Named canon = RandomCanon(l, rng);
  trainer::RankEncoderOptions opt;
  opt.chunk_bytes = GetParam();
  opt.threads = 2;
  std::vector<std::unique_ptr<trainer::RankEncoder>> cpu;
  std::vector<std::unique_ptr<DeviceRankEncoder>> gpu;
  std::vector<std::unique_ptr<Local>> local;
  for (uint32_t r = 0; r < 2; ++r) {
    auto c = trainer::RankEncoder::Create(l, r, opt);
    ASSERT_OK(c);
    ASSERT_OK((*c)->SetBaseline(CanonViews(l, canon)));
    auto g = DeviceRankEncoder::Create(l, r, opt, {});
    ASSERT_OK(g);
    local.push_back(std::make_unique<Local>());
    local[r]->host = Scatter(l, canon, r);
    local[r]->Upload();
    // Rank 0 from the canonical checkpoint, rank 1 from its own tensors.
    if (r == 0) {
      ASSERT_OK((*g)->SetBaseline(CanonViews(l, canon)));
    } else {
      ASSERT_OK((*g)->SetBaselineFromLocal(
          local[r]->Views(l, r, /*on_device=*/true)));
    }
    EXPECT_EQ((*g)->owned_bytes(), (*c)->owned_bytes());
    cpu.push_back(std::move(*c));
    gpu.push_back(std::move(*g));
  }
  for (uint64_t version = 1; version <= 6; ++version) {
    const double rate = version % 2 ? 0.02 : 0.3;  // sparse, and dense-prone
    Step(canon, rate, rng);
    for (uint32_t r = 0; r < 2; ++r) {
      local[r]->host = Scatter(l, canon, r);
      local[r]->Upload();
      trainer::RankReport rc, rg;
      const std::vector<Bytes> want =
          EncodeAll(*cpu[r], version, local[r]->Views(l, r, false), &rc);
      const std::vector<Bytes> got =
          EncodeAll(*gpu[r], version, local[r]->Views(l, r, true), &rg);
      ASSERT_FALSE(want.empty());
      ASSERT_EQ(got.size(), want.size())
          << "version " << version << " rank " << r;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i])
            << "chunk " << i << " version " << version << " rank " << r;
      }
      EXPECT_EQ(rg.changed_direct, rc.changed_direct);
      EXPECT_EQ(rg.chunks, rc.chunks);
      ASSERT_EQ(gpu[r]->pending_chunks(), cpu[r]->pending_chunks());
      for (size_t i : {size_t{0}, want.size() / 2, want.size() - 1}) {
        for (bool after : {false, true}) {
          auto a = cpu[r]->PendingRegion(i, after);
          auto b = gpu[r]->PendingRegion(i, after);
          ASSERT_OK(a);
          ASSERT_OK(b);
          EXPECT_EQ(*a, *b) << "region " << i << " after " << after;
        }
      }
      if (version == 3) {
        cpu[r]->Abort();
        gpu[r]->Abort();
      } else {
        ASSERT_OK(cpu[r]->Commit());
        ASSERT_OK(gpu[r]->Commit());
      }
    }
  }
}

// chunk_bytes: rows split into parts, a few rows a chunk, one chunk a region.
INSTANTIATE_TEST_SUITE_P(ChunkSizes, DeviceRankEncoderTest,
                         ::testing::Values(uint64_t{600}, uint64_t{64} << 10,
                                           uint64_t{8} << 20));

TEST(DeviceRankEncoderRefusals, ConvertedPiecesAndHostTensors) {
  Layout l = Tp2Layout();
  // An FP32 master (on every replica) cast to a BF16 canonical tensor:
  // residual, CPU only.
  for (layout::RankLayout& rl : l.ranks) rl.tensors[3].dtype = "F32";
  EXPECT_THAT(DeviceRankEncoder::Create(l, 0, {}, {}).status(),
              StatusIs(StatusCode::kUnimplemented));
  const Layout ok = Tp2Layout();
  Named canon;
  for (const CanonicalTensor& c : ok.canonical) {
    canon[c.name] =
        Bytes(Elements(c.shape) * static_cast<uint64_t>(Width(c.dtype)), 1);
  }
  auto g = DeviceRankEncoder::Create(ok, 1, {}, {});
  ASSERT_OK(g);
  EXPECT_THAT((*g)->Encode(1, 0, {}, nullptr),
              StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_OK((*g)->SetBaseline(CanonViews(ok, canon)));
  Local host;
  host.host = Scatter(ok, canon, 1);
  EXPECT_THAT((*g)->Encode(1, 0, host.Views(ok, 1, /*on_device=*/false),
                           [](std::span<const uint8_t>, const ChunkHeader&) {
                             return Status();
                           }),
              StatusIs(StatusCode::kInvalidArgument));
}

// The union of both ranks' chunks of each version (strided regions of the
// row-parallel matrix, fused QKV rows, replicas from rank 0 only) staged
// into a DeviceTarget holding the canonical tensors; two versions folded
// into one pause at the end. Staged with a device bound that splits the
// hashing into groups and leaves the payload in host memory, and with one
// that holds it on the device (SealDirect then keeps a device copy of the
// payload for HashesAfter, which frees it).
class DeviceTargetRankChunks : public ::testing::TestWithParam<uint64_t> {};

TEST_P(DeviceTargetRankChunks, AppliesStridedRegionsBitExact) {
  const Layout l = Tp2Layout();
  std::mt19937_64 rng(11);
  Named canon = RandomCanon(l, rng);
  trainer::RankEncoderOptions opt;
  opt.chunk_bytes = 4096;  // several regions a tensor
  opt.threads = 2;
  std::vector<std::unique_ptr<trainer::RankEncoder>> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    auto c = trainer::RankEncoder::Create(l, r, opt);
    ASSERT_OK(c);
    ASSERT_OK((*c)->SetBaseline(CanonViews(l, canon)));
    ranks.push_back(std::move(*c));
  }
  // The receiver's canonical tensors in device memory.
  std::vector<cuda::CanonicalTensor> held;
  std::vector<TensorEntry> table;
  PlacementPlan plan;
  std::map<std::string, void*> dev;
  // The version's tensor table: canonical tensors sorted by name.
  std::vector<layout::CanonicalTensor> sorted = l.canonical;
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& x, const auto& y) { return x.name < y.name; });
  for (const layout::CanonicalTensor& c : sorted) {
    const Bytes& b = canon.at(c.name);
    ASSERT_EQ(cudaMalloc(&dev[c.name], b.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev[c.name], b.data(), b.size(), cudaMemcpyHostToDevice), cudaSuccess);
    const int w = Width(c.dtype);
    held.push_back({c.name, c.dtype, w, c.shape});
    TensorEntry e;
    e.name = c.name;
    e.dtype = c.dtype;
    e.width = static_cast<uint8_t>(w);
    e.shape = c.shape;
    e.num_elements = Elements(c.shape);
    table.push_back(e);
    const uint64_t cols = c.shape.back(), rows = e.num_elements / cols;
    ASSERT_OK(plan.Add(WholePlacement(c.name, w, rows, cols, reinterpret_cast<uint64_t>(dev[c.name]))));
  }
  auto download = [&](const std::string& n) {
    Bytes b(canon.at(n).size());
    EXPECT_EQ(cudaMemcpy(b.data(), dev.at(n), b.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return b;
  };
  DeviceTargetOptions dopt;
  dopt.device_staging_bytes = GetParam();
  auto target = DeviceTarget::Create(held, plan, dopt);
  ASSERT_OK(target);
  DeviceTarget& t = **target;
  ASSERT_TRUE(t.AppliesDirectVersions());
  uint64_t strided = 0;
  // Version 4 is held back and folded with version 5 into one pause.
  std::vector<Bytes> held_back;
  Named before;
  for (uint64_t version = 1; version <= 5; ++version) {
    if (version != 5) before = canon;
    const double rate = version % 2 ? 0.02 : 0.3;
    Step(canon, rate, rng);
    std::vector<Bytes> chunks;
    for (uint32_t r = 0; r < 2; ++r) {
      const Named local = Scatter(l, canon, r);
      std::vector<TensorView> views;
      for (const LocalTensor& lt : l.ranks[r].tensors) {
        views.push_back({lt.name, lt.dtype, Width(lt.dtype), lt.shape, local.at(lt.name).data()});
      }
      for (Bytes& c : EncodeAll(*ranks[r], version, views, nullptr)) chunks.push_back(std::move(c));
      ASSERT_OK(ranks[r]->Commit());
    }
    if (version == 4) {
      held_back = std::move(chunks);
      continue;
    }
    auto stage = [&](bool direct) {
      ASSERT_OK(t.Begin());
      size_t v = 0;
      if (!held_back.empty()) {
        for (const Bytes& c : held_back) ASSERT_OK(t.Add(v, table, c));
        ++v;
      }
      for (const Bytes& c : chunks) ASSERT_OK(t.Add(v, table, c));
      ASSERT_OK(direct ? t.SealDirect() : t.Seal());
    };
    for (const Bytes& c : chunks) {
      auto pc = ParseChunk(c);
      ASSERT_OK(pc);
      strided += pc->header.IsStrided();
    }
    if (version == 2) {
      // A changed element inside a strided region of a.weight (rows of 512
      // at stride 1024): the pre-pause hashes refuse it, and the pause
      // undoes every chunk and reports it.
      const uint64_t e = 3 * 1024 + 600;  // rank 1's half of row 3
      Bytes wrong = before.at("a.weight");
      wrong[2 * e] ^= 0x80;
      ASSERT_EQ(cudaMemcpy(dev["a.weight"], wrong.data(), wrong.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      stage(/*direct=*/false);
      auto refused = t.HashesAfter(table);
      EXPECT_THAT(refused, StatusIs(StatusCode::kDataLoss));
      if (!refused.ok()) {
        EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("'a.weight'"));
      }
      // The pause undoes every chunk it applied (on the device too, where
      // a version without conditional chunks has nothing mapped to undo).
      auto failed = t.Apply();
      ASSERT_FALSE(failed.ok());
      EXPECT_THAT(std::string(failed.status().message()),
                  ::testing::HasSubstr("every tensor was restored"));
      EXPECT_EQ(download("a.weight"), wrong);
      for (const auto& [n, b] : before) {
        if (n != "a.weight") {
          EXPECT_EQ(download(n), b) << n;
        }
      }
      ASSERT_EQ(cudaMemcpy(dev["a.weight"], before.at("a.weight").data(), wrong.size(),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    stage(/*direct=*/true);
    const StagingUsage sealed = t.usage();
    auto after = t.HashesAfter(table);
    ASSERT_OK(after);
    // The payload's device copy, when kept, is freed by HashesAfter.
    const uint64_t freed = sealed.device_bytes - t.usage().device_bytes;
    if (GetParam() >= (64u << 20)) {
      EXPECT_EQ(freed, sealed.staged_payload);
    } else {  // kept only when batches and payload fit the bound together
      EXPECT_TRUE(freed == 0 || freed == sealed.staged_payload) << freed;
    }
    for (size_t i = 0; i < table.size(); ++i) {
      const Bytes& b = canon.at(table[i].name);
      EXPECT_EQ((*after)[i], RangeHash(b.data(), b.size())) << table[i].name;
      // Nothing was written before the pause.
      EXPECT_EQ(download(table[i].name), before.at(table[i].name)) << table[i].name;
    }
    auto applied = t.Apply();
    ASSERT_OK(applied);
    EXPECT_EQ(applied->chunks, chunks.size() + held_back.size());
    EXPECT_EQ(applied->versions, held_back.empty() ? 1u : 2u);
    for (const auto& [n, b] : canon) ASSERT_EQ(download(n), b) << n << " version " << version;
  }
  EXPECT_GT(strided, 10u);
  for (auto& [n, p] : dev) cudaFree(p);
}

INSTANTIATE_TEST_SUITE_P(DeviceBounds, DeviceTargetRankChunks,
                         ::testing::Values(uint64_t{256} << 10, uint64_t{64} << 20));

}  // namespace
}  // namespace refit::cuda
