// GPU receiver tests: the CPU codec and apply are the oracle; the GPU path
// must produce the same bytes and refuse the same chunks. Needs a CUDA GPU;
// run by hand (tests/gpu/README.md), never under ctest.
//
// REFIT_GPU_FIXTURES names a folder with qwen2-tiny step0..3.safetensors.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "base/bytes.h"
#include "base/hash.h"
#include "codec/payload.h"
#include "cuda/encoder.h"
#include "cuda/pipeline.h"
#include "delta/apply.h"
#include "delta/encoder.h"
#include "format/safetensors.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit::cuda {
namespace {

using ::refit::testing::StatusIs;

struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(size_t n) { EXPECT_EQ(cudaMalloc(&p, n ? n : 1), cudaSuccess); }
  ~DeviceMem() { cudaFree(p); }
  uint8_t* get() const { return static_cast<uint8_t*>(p); }
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(p); }
};

// Page-locked host memory, which kernels read in place over the bus.
struct PinnedMem {
  void* p = nullptr;
  explicit PinnedMem(size_t n) { EXPECT_EQ(cudaMallocHost(&p, n ? n : 1), cudaSuccess); }
  ~PinnedMem() { cudaFreeHost(p); }
};

void Upload(DeviceMem& d, const std::vector<uint8_t>& h) {
  ASSERT_EQ(cudaMemcpy(d.p, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
}
std::vector<uint8_t> Download(const DeviceMem& d, size_t n) {
  std::vector<uint8_t> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d.p, n, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng());
  return v;
}

// Changes ~rate of the elements of `a` by small XORs (1-ulp-like), as a
// trainer step does; overwrite-style rewrites when `wide`.
std::vector<uint8_t> Perturb(const std::vector<uint8_t>& a, int w, double rate,
                             uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution change(rate);
  std::vector<uint8_t> b = a;
  const size_t n = a.size() / w;
  for (size_t i = 0; i < n; ++i) {
    if (!change(rng)) continue;
    const uint64_t v = LoadLE(&b[i * w], w);
    StoreLE(&b[i * w], v ^ (1 + rng() % 3), w);
  }
  return b;
}

struct Encoded {
  std::vector<uint8_t> buf;
  std::vector<ChunkSpan> spans;
  std::vector<ChunkHeader> headers;
};

// Encodes the difference of a tensor pair in chunks of chunk_bytes.
Encoded EncodeTensor(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                     int w, uint64_t chunk_bytes, bool allow_xor,
                     uint64_t tensor_id = 0, Encoded* into = nullptr) {
  Encoded local;
  Encoded& e = into ? *into : local;
  const uint64_t n = a.size() / w;
  const uint64_t per = chunk_bytes / w;
  ChunkHeader ids;
  ids.width = static_cast<uint8_t>(w);
  ids.version = 2;
  ids.base_version = 1;
  ids.tensor_id = tensor_id;
  ChunkEncodeOptions opt;
  opt.allow_xor = allow_xor;
  opt.codec.records_per_lane = 256;
  EncodeScratch scratch;
  for (uint64_t s = 0; s < n; s += per) {
    ChunkResult r;
    const uint64_t count = std::min(per, n - s);
    EXPECT_TRUE(EncodeChunkRange(ids, a.data(), b.data(), s, count, opt,
                                 &scratch, &r).ok());
    if (r.chunk.empty()) continue;
    e.spans.push_back({e.buf.size(), r.chunk.size()});
    e.headers.push_back(r.header);
    e.buf.insert(e.buf.end(), r.chunk.begin(), r.chunk.end());
  }
  return local;
}

TEST(GpuHash, Xxh3EqualsLibxxhashForEveryLength) {
  const size_t kMax = 64 * 1024;
  auto data = RandomBytes(kMax + 64, 7);
  DeviceMem d(data.size());
  Upload(d, data);
  std::vector<uint64_t> off, len;
  for (uint64_t l = 0; l <= kMax; ++l) {
    off.push_back(0);
    len.push_back(l);
  }
  // Unaligned starts exercise the byte-wise load path.
  for (uint64_t o = 1; o < 16; ++o) {
    for (uint64_t l : std::initializer_list<uint64_t>{0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024,
                       1025, 4096 + 7, 65536 - o}) {
      off.push_back(o);
      len.push_back(l);
    }
  }
  auto got = HashSpansDevice(d.p, off, len);
  ASSERT_OK(got);
  size_t bad = 0;
  for (size_t i = 0; i < off.size(); ++i) {
    const XXH128_hash_t want = XXH3_128bits(data.data() + off[i], len[i]);
    if ((*got)[i].lo != want.low64 || (*got)[i].hi != want.high64) {
      if (++bad < 10) ADD_FAILURE() << "offset " << off[i] << " length " << len[i];
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(GpuHash, RangeHashEqualsCpu) {
  auto data = RandomBytes((10 << 20) + 77, 8);
  DeviceMem d(data.size());
  Upload(d, data);
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{240}, uint64_t{65536},
                     uint64_t{65537}, uint64_t{3 * 65536 + 5},
                     uint64_t{data.size()}}) {
    auto h = RangeHashDevice(d.p, n);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(*h, RangeHash(data.data(), n)) << n;
  }
}

// Applies `e` on the GPU into a whole-tensor placement and compares with
// the CPU apply; `staged`: through Receiver::Stage (every batch resident in
// device memory, launched at once) instead of the staging slots.
void CheckWholeTensor(int w, double rate, bool allow_xor, uint64_t seed,
                      bool staged) {
  const uint64_t n = (3 << 20) / w + 123;
  auto a = RandomBytes(n * w, seed);
  auto b = Perturb(a, w, rate, seed + 1);
  Encoded e = EncodeTensor(a, b, w, 1 << 20, allow_xor);
  ASSERT_FALSE(e.spans.empty());
  // CPU reference.
  std::vector<uint8_t> cpu = a;
  ApplyScratch scratch;
  for (size_t i = 0; i < e.spans.size(); ++i) {
    auto pc = ParseChunk(std::span(e.buf).subspan(e.spans[i].offset, e.spans[i].size));
    ASSERT_TRUE(pc.ok());
    ASSERT_TRUE(ApplyChunkInPlace(*pc, cpu.data(), &scratch, nullptr, nullptr).ok());
  }
  ASSERT_EQ(cpu, b);

  DeviceMem d(a.size());
  Upload(d, a);
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(WholePlacement("t", w, n, 1, d.addr())).ok());
  ReceiverOptions opt;
  opt.staging_bytes = 32 << 20;  // several batches
  auto rx = Receiver::Create(std::move(plan), {"t"}, opt);
  ASSERT_TRUE(rx.ok());
  auto prep = (*rx)->Prepare(e.buf, e.spans);
  ASSERT_OK(prep);
  auto states = (*rx)->Classify(e.buf, *prep);
  ASSERT_TRUE(states.ok());
  for (uint8_t s : *states) ASSERT_EQ(s, 0);
  std::unique_ptr<StagedDelta> resident;
  if (staged) {
    auto st = (*rx)->Stage(e.buf, *prep);
    ASSERT_OK(st);
    EXPECT_EQ((*st)->bytes(), Receiver::StagedBytes(*prep));
    resident = std::move(*st);
  }
  auto apply = [&](const std::vector<uint8_t>* st) {
    return staged ? (*rx)->Apply(*resident, *prep, st)
                  : (*rx)->Apply(e.buf, *prep, st);
  };
  auto rep = apply(&*states);
  ASSERT_OK(rep);
  EXPECT_EQ(rep->chunks_applied, e.spans.size());
  EXPECT_EQ(Download(d, a.size()), b) << "w=" << w << " rate=" << rate;
  // At most once: a second apply finds every range at "after".
  states = (*rx)->Classify(e.buf, *prep);
  ASSERT_TRUE(states.ok());
  for (uint8_t s : *states) ASSERT_EQ(s, 1);
  rep = apply(&*states);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->chunks_skipped, e.spans.size());
  EXPECT_EQ(Download(d, a.size()), b);
}

TEST(GpuApply, RandomWidthsRatesAndKinds) {
  uint64_t seed = 100;
  for (int w : {1, 2, 4, 8}) {
    for (double rate : {0.0005, 0.01, 0.03, 0.2, 0.8}) {
      for (bool allow_xor : {true, false}) {
        for (bool staged : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "w=" << w << " rate=" << rate
                                          << " xor=" << allow_xor
                                          << " staged=" << staged);
          CheckWholeTensor(w, rate, allow_xor, seed += 10, staged);
        }
      }
    }
  }
}

// Layouts: GPU apply through a placement == CPU ApplyPlacementCpu.
// Many batches in flight on several streams (8 staging slots), and the
// payload given in device memory instead of host memory: the same bytes as
// the target, each chunk applied once; a chunk whose "after" hash fails is
// undone while the batches around it apply.
TEST(GpuApply, ConcurrentBatchesAndDevicePayload) {
  const int w = 2;
  const uint64_t n = uint64_t{12} << 20;  // 24 MiB
  auto a = RandomBytes(n * w, 501);
  auto b = Perturb(a, w, 0.05, 502);
  Encoded e = EncodeTensor(a, b, w, 256 << 10, true);
  ASSERT_GT(e.spans.size(), 64u);
  DeviceMem d(a.size());
  Upload(d, a);
  DeviceMem dpay(e.buf.size());
  ASSERT_EQ(cudaMemcpy(dpay.p, e.buf.data(), e.buf.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  std::span<const uint8_t> on_device(dpay.get(), e.buf.size());
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(WholePlacement("t", w, n, 1, d.addr())).ok());
  ReceiverOptions opt;
  opt.staging_bytes = 16 << 20;
  auto rx = Receiver::Create(std::move(plan), {"t"}, opt);
  ASSERT_TRUE(rx.ok());
  auto prep = (*rx)->Prepare(e.buf, e.spans);
  ASSERT_OK(prep);
  EXPECT_EQ(prep->slots, 8u);
  EXPECT_GE(prep->batches.size(), 8u);
  auto states = (*rx)->Classify(on_device, *prep);
  ASSERT_TRUE(states.ok());
  for (uint8_t s : *states) ASSERT_EQ(s, 0);
  auto rep = (*rx)->Apply(on_device, *prep, &*states);
  ASSERT_OK(rep);
  EXPECT_EQ(rep->chunks_applied, e.spans.size());
  // Staging within the budget; besides it, the plan and the status and
  // state words.
  EXPECT_LE(rep->device_bytes,
            opt.staging_bytes + 5 * uint64_t{prep->status_count} + 4096);
  EXPECT_EQ(Download(d, a.size()), b);
  // Back to the base from host memory, without verification.
  ReceiverOptions nv = opt;
  nv.verify = false;
  PlacementPlan plan2;
  ASSERT_TRUE(plan2.Add(WholePlacement("t", w, n, 1, d.addr())).ok());
  auto rn = Receiver::Create(std::move(plan2), {"t"}, nv);
  ASSERT_TRUE(rn.ok());
  auto pn = (*rn)->Prepare(e.buf, e.spans);
  ASSERT_TRUE(pn.ok());
  ASSERT_TRUE((*rn)->Apply(e.buf, *pn).ok());
  EXPECT_EQ(Download(d, a.size()), a);
  // One chunk's "after" hash is wrong (the header is not covered by the
  // payload checks, so only verification catches it): that chunk is undone,
  // every other one applied, from device memory again.
  Encoded bad = e;
  const size_t victim = bad.spans.size() / 2;
  {
    auto pc = ParseChunk(std::span(bad.buf).subspan(bad.spans[victim].offset,
                                                    bad.spans[victim].size));
    ASSERT_TRUE(pc.ok());
    ChunkHeader h = pc->header;
    h.after.lo ^= 1;
    std::vector<uint8_t> payload(pc->payload.begin(), pc->payload.end());
    std::vector<uint8_t> re;
    SerializeChunk(h, payload, &re);
    ASSERT_EQ(re.size(), bad.spans[victim].size);
    std::memcpy(bad.buf.data() + bad.spans[victim].offset, re.data(), re.size());
  }
  ASSERT_EQ(cudaMemcpy(dpay.p, bad.buf.data(), bad.buf.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  auto pb = (*rx)->Prepare(bad.buf, bad.spans);
  ASSERT_TRUE(pb.ok());
  rep = (*rx)->Apply(on_device, *pb);
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.status().ToString().find("chunk " + std::to_string(victim)),
            std::string::npos) << rep.status().ToString();
  std::vector<uint8_t> expect = b;
  const uint64_t v0 = bad.headers[victim].start * w;
  const uint64_t v1 = v0 + bad.headers[victim].count * w;
  std::copy(a.begin() + static_cast<ptrdiff_t>(v0),
            a.begin() + static_cast<ptrdiff_t>(v1),
            expect.begin() + static_cast<ptrdiff_t>(v0));
  EXPECT_EQ(Download(d, a.size()), expect);
  EXPECT_EQ((*rx)->last_status()[victim], kStatusAfterMismatch);
  // The same through Stage: every batch launched at once (more batches
  // than slots), the bad chunk undone, the others applied; a staged delta
  // is refused by a receiver that did not stage it.
  Upload(d, a);
  auto staged = (*rx)->Stage(on_device, *pb);
  ASSERT_OK(staged);
  EXPECT_FALSE((*rn)->Apply(**staged, *pb).ok());
  EXPECT_EQ(Download(d, a.size()), a);
  rep = (*rx)->Apply(**staged, *pb);
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(Download(d, a.size()), expect);
  EXPECT_EQ((*rx)->last_status()[victim], kStatusAfterMismatch);
}

TEST(GpuApply, PlacementsMatchCpuReference) {
  const int w = 2;
  const uint64_t rows = 768, cols = 640;  // 480 KiB per tensor
  std::vector<TensorPlacement> layouts;
  layouts.push_back(WholePlacement("t", w, rows, cols, 0));
  layouts.push_back(TransposedPlacement("t", w, rows, cols, 0));
  layouts.push_back(RowShardPlacement("t", w, rows, cols, 100, 333, 0));
  layouts.push_back(ColShardPlacement("t", w, rows, cols, 0, 213, 0));
  layouts.push_back(*FusedQkvPlacement("t", w, {32, 8, 96, 2, 6}, 'k', cols, 0));
  layouts.push_back(*FusedQkvPlacement("t", w, {4, 4, 192, 0, 2}, 'q', cols, 0));
  layouts.push_back(*FusedGateUpPlacement("t", w, rows, cols, 64, 512, 0, 'u', 0));
  layouts.push_back(*FusedGateUpPlacement("t", w, rows, cols, 64, 512, 32, 'g', 0));
  uint64_t seed = 900;
  for (size_t li = 0; li < layouts.size(); ++li) {
    for (bool allow_xor : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "layout " << li << " xor " << allow_xor);
      auto a = RandomBytes(rows * cols * w, ++seed);
      auto b = Perturb(a, w, 0.02, ++seed);
      Encoded e = EncodeTensor(a, b, w, 128 << 10, allow_xor);
      TensorPlacement lay = layouts[li];
      auto dst0 = RandomBytes(lay.dst_elements * w, ++seed);
      // CPU reference through the placement.
      std::vector<uint8_t> cpu = dst0;
      lay.base = reinterpret_cast<uintptr_t>(cpu.data());
      for (size_t i = 0; i < e.spans.size(); ++i) {
        auto pc = ParseChunk(std::span(e.buf).subspan(e.spans[i].offset, e.spans[i].size));
        ASSERT_TRUE(pc.ok());
        const ChunkHeader& h = pc->header;
        std::vector<uint32_t> pos;
        std::vector<uint8_t> val;
        if (h.IsSparse()) {
          pos.resize(h.changed);
          val.resize(h.changed * w);
          ASSERT_TRUE(codec::DecodeSparse(pc->payload, h.kind, static_cast<uint32_t>(h.count),
                                          w, static_cast<uint32_t>(h.changed),
                                          pos.data(), val.data()).ok());
        } else {
          val.resize(h.count * w);
          ASSERT_TRUE(codec::DecodeDense(pc->payload, static_cast<uint32_t>(h.count), w,
                                         val.data()).ok());
          for (uint32_t j = 0; j < h.count; ++j) pos.push_back(j);
        }
        ApplyPlacementCpu(lay, h.start, pos, val.data(), h.IsXor());
      }
      DeviceMem d(dst0.size());
      Upload(d, dst0);
      lay.base = d.addr();
      PlacementPlan plan;
      ASSERT_TRUE(plan.Add(lay).ok());
      ReceiverOptions opt;
      opt.verify = false;
      opt.staging_bytes = 4 << 20;
      auto rx = Receiver::Create(std::move(plan), {"t"}, opt);
      ASSERT_TRUE(rx.ok());
      auto prep = (*rx)->Prepare(e.buf, e.spans);
      ASSERT_OK(prep);
      auto rep = (*rx)->Apply(e.buf, *prep);
      ASSERT_OK(rep);
      EXPECT_EQ(Download(d, dst0.size()), cpu);
    }
  }
}

// Strided regions (trainer ranks' column blocks, docs/format.md §3): every
// width, rows shorter and longer than a hash block and a segment, XOR and
// overwrite records, sparse and dense; applied through a whole tensor
// (verified: its rows gathered for the range hash on the device, checked
// by Classify before and after) and through a row shard (unverified),
// against the CPU apply of the same chunks.
TEST(GpuApply, StridedRegionsMatchCpu) {
  struct Shape {
    int w;
    uint64_t rows, cols, run, col0;
  };
  const Shape shapes[] = {{2, 64, 1024, 512, 512}, {2, 40, 300, 7, 13},
                          {1, 96, 4096, 1500, 1000}, {4, 33, 70000, 40000, 30000},
                          {8, 16, 96, 24, 72}, {2, 300, 16, 4, 12}};
  uint64_t seed = 4000;
  for (const Shape& sh : shapes) {
    for (double rate : {0.02, 0.4}) {
      for (bool allow_xor : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "w " << sh.w << " cols " << sh.cols << " run "
                                          << sh.run << " rate " << rate << " xor " << allow_xor);
        const int w = sh.w;
        const uint64_t n = sh.rows * sh.cols;
        auto a = RandomBytes(n * w, ++seed);
        auto b = Perturb(a, w, rate, ++seed);
        // Each region: a block of rows [r0, r0 + rows) of columns
        // [col0, col0 + run).
        Encoded e;
        ChunkHeader ids;
        ids.width = static_cast<uint8_t>(w);
        ids.version = 2;
        ids.base_version = 1;
        ChunkEncodeOptions opt;
        opt.allow_xor = allow_xor;
        EncodeScratch scratch;
        const uint64_t block = std::max<uint64_t>(2, sh.rows / 3);
        for (uint64_t r0 = 0; r0 + 2 <= sh.rows; r0 += block) {
          const uint64_t rows = std::min(block, sh.rows - r0);
          if (rows < 2) break;
          std::vector<uint8_t> ra, rb;
          for (uint64_t r = r0; r < r0 + rows; ++r) {
            const uint64_t at = (r * sh.cols + sh.col0) * w;
            ra.insert(ra.end(), a.begin() + at, a.begin() + at + sh.run * w);
            rb.insert(rb.end(), b.begin() + at, b.begin() + at + sh.run * w);
          }
          ChunkResult r;
          ASSERT_OK(EncodeRegionChunk(ids, ra.data(), rb.data(), r0 * sh.cols + sh.col0,
                                      rows * sh.run, sh.run, sh.cols, opt, &scratch, &r));
          if (r.chunk.empty()) continue;
          ASSERT_TRUE(r.header.IsStrided());
          e.spans.push_back({e.buf.size(), r.chunk.size()});
          e.buf.insert(e.buf.end(), r.chunk.begin(), r.chunk.end());
        }
        ASSERT_FALSE(e.spans.empty());
        // The CPU apply is the oracle.
        std::vector<uint8_t> cpu = a;
        ApplyScratch as;
        for (const ChunkSpan& sp : e.spans) {
          auto pc = ParseChunk(std::span(e.buf).subspan(sp.offset, sp.size));
          ASSERT_OK(pc);
          ASSERT_OK(ApplyChunkInPlace(*pc, cpu.data(), &as, nullptr, nullptr));
        }
        // Whole tensor, verified.
        {
          DeviceMem d(n * w);
          Upload(d, a);
          PlacementPlan plan;
          ASSERT_OK(plan.Add(WholePlacement("t", w, sh.rows, sh.cols, d.addr())));
          ReceiverOptions ro;
          ro.staging_bytes = 8 << 20;
          auto rx = Receiver::Create(std::move(plan), {"t"}, ro);
          ASSERT_OK(rx);
          auto prep = (*rx)->Prepare(e.buf, e.spans);
          ASSERT_OK(prep);
          auto before = (*rx)->Classify(e.buf, *prep);
          ASSERT_OK(before);
          for (uint8_t st : *before) EXPECT_EQ(st, 0);
          ASSERT_OK((*rx)->Apply(e.buf, *prep));
          EXPECT_EQ(Download(d, n * w), cpu);
          auto after = (*rx)->Classify(e.buf, *prep);
          ASSERT_OK(after);
          for (uint8_t st : *after) EXPECT_EQ(st, 1);
        }
        // Rows [1, rows - 1) on this GPU, unverified: the rest is not here.
        {
          TensorPlacement lay = RowShardPlacement("t", w, sh.rows, sh.cols, 1, sh.rows - 1, 0);
          const uint64_t held = (sh.rows - 2) * sh.cols * w;
          std::vector<uint8_t> want(cpu.begin() + sh.cols * w, cpu.begin() + sh.cols * w + held);
          DeviceMem d(held);
          Upload(d, std::vector<uint8_t>(a.begin() + sh.cols * w, a.begin() + sh.cols * w + held));
          lay.base = d.addr();
          PlacementPlan plan;
          ASSERT_OK(plan.Add(lay));
          ReceiverOptions ro;
          ro.verify = false;
          ro.staging_bytes = 8 << 20;
          auto rx = Receiver::Create(std::move(plan), {"t"}, ro);
          ASSERT_OK(rx);
          auto prep = (*rx)->Prepare(e.buf, e.spans);
          ASSERT_OK(prep);
          ASSERT_OK((*rx)->Apply(e.buf, *prep));
          EXPECT_EQ(Download(d, held), want);
        }
      }
    }
  }
}

// Recomputes a chunk's checksum after a deliberate edit, so that the
// corruption reaches the decoder instead of the framing check.
void FixChecksum(uint8_t* chunk, size_t size) {
  const uint32_t c = static_cast<uint32_t>(XXH3_64bits(chunk, size - 4));
  std::memcpy(chunk + size - 4, &c, 4);
}

TEST(GpuApply, CorruptChunksAreRefusedLikeOnTheCpu) {
  const int w = 2;
  const uint64_t n = 1 << 18;
  auto a = RandomBytes(n * w, 31);
  auto b = Perturb(a, w, 0.01, 32);
  Encoded e = EncodeTensor(a, b, w, n * w, true);
  ASSERT_EQ(e.spans.size(), 1u);
  std::mt19937_64 rng(33);
  // Flips byte `at` of `enc`'s chunk (its checksum fixed), applies it on the
  // CPU and on the GPU to `base` (`count` elements): both refuse it, or both
  // give `target`; a refused chunk leaves the GPU tensor at `base`. Sets
  // *refused when the GPU path refused it.
  auto corrupt_at = [&](const std::vector<uint8_t>& base, const std::vector<uint8_t>& target,
                        const Encoded& enc, uint64_t count, size_t at, bool* refused) {
    std::vector<uint8_t> bad = enc.buf;
    const size_t size = bad.size();
    bad[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    FixChecksum(bad.data(), size);
    auto pc = ParseChunk(bad);
    ASSERT_TRUE(pc.ok());
    std::vector<uint8_t> cpu = base;
    ApplyScratch scratch;
    const bool cpu_ok =
        ApplyChunkInPlace(*pc, cpu.data(), &scratch, nullptr, nullptr).ok();
    DeviceMem d(base.size());
    Upload(d, base);
    PlacementPlan plan;
    ASSERT_TRUE(plan.Add(WholePlacement("t", w, count, 1, d.addr())).ok());
    auto rx = Receiver::Create(std::move(plan), {"t"}, {});
    ASSERT_TRUE(rx.ok());
    ChunkSpan span{0, size};
    auto prep = (*rx)->Prepare(bad, std::span(&span, 1));
    if (!prep.ok()) {
      EXPECT_FALSE(cpu_ok) << "host refused what the CPU applies";
      *refused = true;
      return;
    }
    auto rep = (*rx)->Apply(bad, *prep);
    EXPECT_EQ(rep.ok(), cpu_ok);
    EXPECT_EQ(Download(d, base.size()), cpu_ok ? target : base);
    *refused = !rep.ok();
  };
  int refused = 0, trials = 0;
  for (int t = 0; t < 60; ++t) {
    // Corrupt the payload's tail (lanes), past the header and models.
    const size_t at = e.buf.size() - 5 - rng() % std::min<size_t>(e.buf.size() / 2, 2000);
    bool r = false;
    ASSERT_NO_FATAL_FAILURE(corrupt_at(a, b, e, n, at, &r));
    ++trials;
    refused += r;
  }
  EXPECT_GT(refused, trials / 2);
  // Anywhere in the lanes: the fused XOR kernel (decode_apply.cu) meets
  // most of these errors after it has scattered some groups of rows, which
  // it must put back (lane underruns, positions past n, zero values, wrong
  // ends). The second chunk has ~120 lanes: four warps that exchange their
  // row sums through shared memory.
  auto lanes_corrupt = [&](const std::vector<uint8_t>& base,
                           const std::vector<uint8_t>& target,
                           const Encoded& enc, uint64_t count, int tries) {
    auto good = ParseChunk(enc.buf);
    ASSERT_TRUE(good.ok());
    const size_t payload_at =
        static_cast<size_t>(good->payload.data() - enc.buf.data());
    for (int t = 0; t < tries; ++t) {
      const size_t at = payload_at + rng() % good->payload.size();
      bool r = false;
      ASSERT_NO_FATAL_FAILURE(corrupt_at(base, target, enc, count, at, &r));
    }
  };
  lanes_corrupt(a, b, e, n, 60);
  {
    const uint64_t n2 = 1 << 22;  // 8 MiB at 3%: sparse XOR, 123 lanes
    auto a2 = RandomBytes(n2 * w, 41);
    auto b2 = Perturb(a2, w, 0.03, 42);
    Encoded e2 = EncodeTensor(a2, b2, w, n2 * w, true);
    ASSERT_EQ(e2.spans.size(), 1u);
    auto pc2 = ParseChunk(e2.buf);
    ASSERT_TRUE(pc2.ok());
    ASSERT_EQ(pc2->header.kind, codec::ChunkKind::kSparseXor);
    lanes_corrupt(a2, b2, e2, n2, 30);
  }
  // Truncated chunks never get past Prepare.
  auto rx = Receiver::Create(PlacementPlan{}, {"t"}, {});
  ASSERT_TRUE(rx.ok());
  for (size_t cut : {size_t{1}, size_t{10}, e.buf.size() / 2}) {
    ChunkSpan span{0, e.buf.size() - cut};
    EXPECT_FALSE((*rx)->Prepare(e.buf, std::span(&span, 1)).ok());
  }
}

// A corrupt chunk among good ones of the same batch (fused kernel, one
// launch): it must be refused and put back while the others apply, exactly
// as the CPU decides.
TEST(GpuApply, CorruptChunkAmongGoodOnes) {
  const int w = 2;
  const uint64_t n = 6 << 19;  // six chunks of 1 MiB, ~6 lanes each at 1%
  auto a = RandomBytes(n * w, 51);
  auto b = Perturb(a, w, 0.01, 52);
  Encoded e = EncodeTensor(a, b, w, 1 << 20, true);
  ASSERT_EQ(e.spans.size(), 6u);
  std::mt19937_64 rng(53);
  int refused = 0;
  for (int t = 0; t < 24; ++t) {
    std::vector<uint8_t> bad = e.buf;
    const ChunkSpan victim = e.spans[t % 6];
    auto good = ParseChunk(std::span(e.buf).subspan(victim.offset, victim.size));
    ASSERT_TRUE(good.ok());
    ASSERT_EQ(good->header.kind, codec::ChunkKind::kSparseXor);
    const size_t payload_at =
        static_cast<size_t>(good->payload.data() - e.buf.data());
    bad[payload_at + rng() % good->payload.size()] ^=
        static_cast<uint8_t>(1 + rng() % 255);
    FixChecksum(bad.data() + victim.offset, victim.size);
    std::vector<uint8_t> cpu = a;
    ApplyScratch scratch;
    bool cpu_ok = true;
    for (const ChunkSpan& sp : e.spans) {
      auto pc = ParseChunk(std::span(bad).subspan(sp.offset, sp.size));
      ASSERT_TRUE(pc.ok());
      cpu_ok &=
          ApplyChunkInPlace(*pc, cpu.data(), &scratch, nullptr, nullptr).ok();
    }
    DeviceMem d(a.size());
    Upload(d, a);
    PlacementPlan plan;
    ASSERT_TRUE(plan.Add(WholePlacement("t", w, n, 1, d.addr())).ok());
    auto rx = Receiver::Create(std::move(plan), {"t"}, {});
    ASSERT_TRUE(rx.ok());
    auto prep = (*rx)->Prepare(bad, e.spans);
    if (!prep.ok()) {
      EXPECT_FALSE(cpu_ok) << "host refused what the CPU applies";
      continue;
    }
    // Every other round through Stage (the batches resident, all at once).
    std::unique_ptr<StagedDelta> staged;
    if (t % 2 == 1) {
      auto st = (*rx)->Stage(bad, *prep);
      ASSERT_OK(st);
      staged = std::move(*st);
    }
    auto rep = staged ? (*rx)->Apply(*staged, *prep) : (*rx)->Apply(bad, *prep);
    EXPECT_EQ(rep.ok(), cpu_ok);
    EXPECT_EQ(Download(d, a.size()), cpu);
    refused += !rep.ok();
  }
  EXPECT_GT(refused, 0);
}

// Dense chunks (kind 4 here): constant, verbatim and entropy planes are
// decoded on the GPU, a chunk with a zstd plane on the CPU; all must give
// the CPU's bytes. A corrupt entropy lane is refused on the GPU, its range
// untouched, exactly when the CPU refuses it.
TEST(GpuApply, DensePlanesMatchCpu) {
  const int w = 2;
  const uint64_t region = 1 << 17;  // elements a chunk
  const uint64_t n = 3 * region;
  auto a = RandomBytes(n * w, 61);
  std::mt19937_64 rng(62);
  std::vector<uint8_t> b(n * w);
  std::vector<uint8_t> pattern(2 * 521);
  for (auto& x : pattern) x = static_cast<uint8_t>(rng());
  for (uint64_t i = 0; i < region; ++i) {
    // Region 0: low bytes in 1..3 (entropy), high bytes random.
    b[2 * i] = static_cast<uint8_t>(1 + rng() % 3);
    b[2 * i + 1] = static_cast<uint8_t>(rng());
    // Region 1: a repeated pattern (zstd planes, decoded on the CPU).
    const uint64_t r1 = region + i;
    b[2 * r1] = pattern[(2 * i) % pattern.size()];
    b[2 * r1 + 1] = pattern[(2 * i + 1) % pattern.size()];
    // Region 2: low bytes in 1..3, high bytes constant.
    const uint64_t r2 = 2 * region + i;
    b[2 * r2] = static_cast<uint8_t>(1 + rng() % 3);
    b[2 * r2 + 1] = 0x3f;
  }
  Encoded e = EncodeTensor(a, b, w, region * w, true);
  ASSERT_EQ(e.spans.size(), 3u);
  for (const ChunkHeader& h : e.headers) ASSERT_FALSE(h.IsSparse());
  DeviceMem d(a.size());
  Upload(d, a);
  PlacementPlan plan;
  ASSERT_TRUE(plan.Add(WholePlacement("t", w, n, 1, d.addr())).ok());
  auto rx = Receiver::Create(std::move(plan), {"t"}, {});
  ASSERT_TRUE(rx.ok());
  auto prep = (*rx)->Prepare(e.buf, e.spans);
  ASSERT_OK(prep);
  uint64_t gpu_planes = 0;
  for (const HostBatch& hb : prep->batches) gpu_planes += hb.planes.size();
  EXPECT_EQ(gpu_planes, 4u);  // regions 0 and 2
  auto rep = (*rx)->Apply(e.buf, *prep);
  ASSERT_OK(rep);
  EXPECT_EQ(rep->chunks_applied, 3u);
  EXPECT_EQ(Download(d, a.size()), b);

  // Corrupt region 2's entropy plane (its stream ends 2 bytes before the
  // payload's end: the constant plane follows).
  const ChunkSpan sp = e.spans[2];
  std::vector<uint8_t> one(e.buf.begin() + static_cast<ptrdiff_t>(sp.offset),
                           e.buf.begin() + static_cast<ptrdiff_t>(sp.offset + sp.size));
  auto good = ParseChunk(one);
  ASSERT_TRUE(good.ok());
  const size_t payload_end =
      static_cast<size_t>(good->payload.data() - one.data()) + good->payload.size();
  std::vector<uint8_t> a2(a.begin() + static_cast<ptrdiff_t>(2 * region * w), a.end());
  std::vector<uint8_t> b2(b.begin() + static_cast<ptrdiff_t>(2 * region * w), b.end());
  int refused = 0;
  for (int t = 0; t < 30; ++t) {
    std::vector<uint8_t> bad = one;
    const size_t at = payload_end - 3 - rng() % 400;
    bad[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    FixChecksum(bad.data(), bad.size());
    auto pc = ParseChunk(bad);
    ASSERT_TRUE(pc.ok());
    ChunkHeader h = pc->header;
    std::vector<uint8_t> cpu = a2;
    ApplyScratch scratch;
    // The chunk starts at element 2 * region; apply it to that range.
    ParsedChunk shifted = *pc;
    shifted.header.start = 0;
    const bool cpu_ok =
        ApplyChunkInPlace(shifted, cpu.data(), &scratch, nullptr, nullptr).ok();
    DeviceMem d2(a2.size());
    Upload(d2, a2);
    PlacementPlan plan2;
    // The whole tensor's placement, with only region 2 backed by d2.
    ASSERT_TRUE(plan2.Add(WholePlacement("t", w, n, 1,
                                         d2.addr() - 2 * region * w)).ok());
    auto rx2 = Receiver::Create(std::move(plan2), {"t"}, {});
    ASSERT_TRUE(rx2.ok());
    ChunkSpan span{0, bad.size()};
    auto p2 = (*rx2)->Prepare(bad, std::span(&span, 1));
    if (!p2.ok()) {
      EXPECT_FALSE(cpu_ok) << "host refused what the CPU applies";
      ++refused;
      continue;
    }
    auto r2 = (*rx2)->Apply(bad, *p2);
    EXPECT_EQ(r2.ok(), cpu_ok) << (r2.ok() ? "" : r2.status().ToString());
    EXPECT_EQ(Download(d2, a2.size()), cpu_ok ? b2 : a2);
    refused += !r2.ok();
    (void)h;
  }
  EXPECT_GT(refused, 0);
}

TEST(GpuApply, FixtureStepsMatchCpu) {
  const char* dir = std::getenv("REFIT_GPU_FIXTURES");
  if (dir == nullptr) GTEST_SKIP() << "set REFIT_GPU_FIXTURES";
  for (int step = 0; step < 3; ++step) {
    auto fa = SafetensorsFile::Open(std::string(dir) + "/step" + std::to_string(step) +
                                        ".safetensors", MappedFile::Mode::kReadOnly);
    auto fb = SafetensorsFile::Open(std::string(dir) + "/step" + std::to_string(step + 1) +
                                        ".safetensors", MappedFile::Mode::kReadOnly);
    ASSERT_TRUE(fa.ok() && fb.ok());
    Encoded e;
    std::vector<std::string> names;
    std::vector<std::unique_ptr<DeviceMem>> mem;
    std::vector<std::vector<uint8_t>> want;
    PlacementPlan plan;
    for (size_t t = 0; t < fa->tensors().size(); ++t) {
      const auto& ta = fa->tensors()[t];
      const SafetensorsTensor* tb = fb->Find(ta.name);
      ASSERT_NE(tb, nullptr);
      std::vector<uint8_t> a(fa->Data(t).begin(), fa->Data(t).end());
      std::vector<uint8_t> b(tb->byte_size);
      std::memcpy(b.data(), fb->bytes().data() + tb->offset, tb->byte_size);
      if (a.empty()) continue;
      names.push_back(ta.name);
      EncodeTensor(a, b, ta.element_width, 64 << 10, true, names.size() - 1, &e);
      mem.push_back(std::make_unique<DeviceMem>(a.size()));
      Upload(*mem.back(), a);
      ASSERT_TRUE(plan.Add(WholePlacement(ta.name, ta.element_width, ta.num_elements,
                                          1, mem.back()->addr())).ok());
      want.push_back(std::move(b));
    }
    auto rx = Receiver::Create(std::move(plan), names, {});
    ASSERT_TRUE(rx.ok());
    auto prep = (*rx)->Prepare(e.buf, e.spans);
    ASSERT_OK(prep);
    auto rep = (*rx)->Apply(e.buf, *prep);
    ASSERT_OK(rep);
    for (size_t t = 0; t < mem.size(); ++t) {
      EXPECT_EQ(Download(*mem[t], want[t].size()), want[t]) << names[t];
    }
    std::printf("fixture step%d->%d: %zu chunks, %llu records\n", step, step + 1,
                e.spans.size(), static_cast<unsigned long long>(rep->records));
  }
}

// Trainer side: EncodeOnDevice's chunks must be the CPU encoder's chunks,
// byte for byte, over the same ranges.
void CheckGpuEncode(const std::vector<std::vector<uint8_t>>& olds,
                    const std::vector<std::vector<uint8_t>>& news,
                    const std::vector<int>& widths, uint64_t chunk_bytes,
                    uint32_t records_per_lane, const std::string& what,
                    bool host_baseline = false, uint64_t mask_bytes = 0,
                    size_t misalign = 0) {
  SCOPED_TRACE(what);
  std::vector<std::unique_ptr<DeviceMem>> mem;
  std::vector<std::unique_ptr<PinnedMem>> pinned;
  std::vector<DeviceTensorPair> pairs;
  std::vector<std::vector<uint8_t>> want;  // CPU chunks in order
  for (size_t t = 0; t < olds.size(); ++t) {
    const int w = widths[t];
    DeviceTensorPair p;
    if (host_baseline) {
      pinned.push_back(std::make_unique<PinnedMem>(olds[t].size()));
      std::memcpy(pinned.back()->p, olds[t].data(), olds[t].size());
      p.old_data = pinned.back()->p;
    } else {
      mem.push_back(std::make_unique<DeviceMem>(olds[t].size() + misalign));
      ASSERT_EQ(cudaMemcpy(mem.back()->get() + misalign, olds[t].data(), olds[t].size(),
                           cudaMemcpyHostToDevice), cudaSuccess);
      p.old_data = mem.back()->get() + misalign;
    }
    mem.push_back(std::make_unique<DeviceMem>(news[t].size() + misalign));
    ASSERT_EQ(cudaMemcpy(mem.back()->get() + misalign, news[t].data(), news[t].size(),
                         cudaMemcpyHostToDevice), cudaSuccess);
    p.new_data = mem.back()->get() + misalign;
    p.elements = olds[t].size() / w;
    p.width = w;
    p.tensor_id = t;
    pairs.push_back(p);
    ChunkHeader ids;
    ids.width = static_cast<uint8_t>(w);
    ids.version = 5;
    ids.base_version = 4;
    ids.tensor_id = t;
    ChunkEncodeOptions opt;
    opt.codec.records_per_lane = records_per_lane;
    EncodeScratch scratch;
    const uint64_t per = chunk_bytes / w;
    for (uint64_t s = 0; s < p.elements; s += per) {
      ChunkResult r;
      ASSERT_TRUE(EncodeChunkRange(ids, olds[t].data(), news[t].data(), s,
                                   std::min(per, p.elements - s), opt, &scratch,
                                   &r).ok());
      if (!r.chunk.empty()) want.push_back(r.chunk);
    }
  }
  GpuEncodeOptions eo;
  eo.version = 5;
  eo.base_version = 4;
  eo.chunk_bytes = chunk_bytes;
  eo.records_per_lane = records_per_lane;
  eo.staging_bytes = 1 << 20;  // several groups
  if (mask_bytes != 0) eo.mask_bytes = mask_bytes;
  std::vector<GpuEncodedChunk> got;
  auto rep = EncodeOnDevice(pairs, eo, &got);
  ASSERT_OK(rep);
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i].bytes != want[i] && ++bad < 5) {
      ADD_FAILURE() << "chunk " << i << ": " << got[i].bytes.size() << " vs "
                    << want[i].size() << " bytes";
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(GpuEncode, RandomChunksEqualCpu) {
  uint64_t seed = 5000;
  for (int w : {2, 4}) {
    for (double rate : {0.0002, 0.003, 0.01, 0.05, 0.3}) {
      for (uint32_t rpl : {1024u, 64u}) {
        const uint64_t n = (3 << 20) / w + 123;
        auto a = RandomBytes(n * w, ++seed);
        auto b = Perturb(a, w, rate, ++seed);
        auto a2 = RandomBytes(4099 * w, ++seed);  // a small tensor too
        auto b2 = Perturb(a2, w, rate * 4, ++seed);
        CheckGpuEncode({a, a2}, {b, b2}, {w, w}, 1 << 20, rpl,
                       "w=" + std::to_string(w) + " rate=" + std::to_string(rate) +
                           " rpl=" + std::to_string(rpl));
      }
    }
  }
}

// Widths 1 and 8, tensors shorter than a hash block or not a multiple of
// 16 bytes, pointers off 16-byte (and element) alignment, a fully changed
// segment inside a sparse chunk, and change masks cut into many windows
// (mask_bytes of 64 KiB: a few ranges each; 8 KiB: one range each) with groups pipelined across
// them: the chunks stay the CPU encoder's.
TEST(GpuEncode, WidthsAlignmentsAndWindowsEqualCpu) {
  uint64_t seed = 9000;
  for (int w : {1, 2, 4, 8}) {
    for (size_t misalign : {size_t{0}, size_t{8}, size_t{1}}) {
      const uint64_t n = (2 << 20) / w + 37;
      auto a = RandomBytes(n * w, ++seed);
      auto b = Perturb(a, w, 0.01, ++seed);
      // 8 KiB of the second 256 KiB chunk fully changed, across the
      // boundary of two 64 KiB segments (the chunk stays sparse).
      for (uint64_t i = (256 << 10) + (60 << 10); i < (256 << 10) + (68 << 10); ++i) {
        b[i] = static_cast<uint8_t>(a[i] ^ 0x5a);
      }
      auto a2 = RandomBytes(50 * w, ++seed);  // < 240 bytes at widths 1-4
      auto b2 = Perturb(a2, w, 0.2, ++seed);
      auto a3 = RandomBytes(1000 * w + w, ++seed);
      auto b3 = Perturb(a3, w, 0.02, ++seed);
      for (uint64_t mask_bytes : {uint64_t{64} << 10, uint64_t{8} << 10, uint64_t{0}}) {
        CheckGpuEncode({a, a2, a3}, {b, b2, b3}, {w, w, w}, 256 << 10, 256,
                       "w=" + std::to_string(w) + " misalign=" + std::to_string(misalign) +
                           " mask_bytes=" + std::to_string(mask_bytes),
                       /*host_baseline=*/false, mask_bytes, misalign);
      }
    }
  }
}

// Windows whose ranges are all unchanged or dense (encoded on the CPU) make
// groups without GPU chunks between groups with them, and the pipeline
// frames a group two turns after its models: the chunks still come out in
// order, each the CPU encoder's.
TEST(GpuEncode, UnchangedAndDenseWindowsKeepTheOrder) {
  uint64_t seed = 12000;
  const uint64_t n = (1 << 20) / 2;
  std::vector<std::vector<uint8_t>> olds, news;
  for (double rate : {0.01, 0.0, 0.3, 0.002, 0.0, 0.05, 0.3, 0.01}) {
    olds.push_back(RandomBytes(n * 2, ++seed));
    news.push_back(rate == 0.0 ? olds.back() : Perturb(olds.back(), 2, rate, ++seed));
  }
  const std::vector<int> widths(olds.size(), 2);
  for (uint64_t mask_bytes : {uint64_t{8} << 10, uint64_t{0}}) {
    CheckGpuEncode(olds, news, widths, 256 << 10, 1024,
                   "mask_bytes=" + std::to_string(mask_bytes), /*host_baseline=*/false,
                   mask_bytes);
  }
}

// The sink sees the chunks in order; an error from it stops the call, which
// returns that error, and no chunk is handed over after it.
TEST(GpuEncode, SinkErrorStopsTheCall) {
  const uint64_t n = (4 << 20) / 2;
  auto a = RandomBytes(n * 2, 11);
  auto b = Perturb(a, 2, 0.01, 12);
  DeviceMem da(a.size()), db(b.size());
  Upload(da, a);
  Upload(db, b);
  DeviceTensorPair p;
  p.old_data = da.p;
  p.new_data = db.p;
  p.elements = n;
  p.width = 2;
  GpuEncodeOptions eo;
  eo.chunk_bytes = 64 << 10;  // 64 chunks
  eo.staging_bytes = 64 << 10;  // groups of a few chunks
  std::vector<uint64_t> starts;
  auto rep = EncodeOnDevice({&p, 1}, eo, [&](const GpuChunkInfo& info,
                                             std::span<const uint8_t> bytes) {
    starts.push_back(info.header.start);
    EXPECT_TRUE(ParseChunk(bytes).ok());
    if (starts.size() == 10) return DataLossError("store full");
    return Status::Ok();
  });
  ASSERT_FALSE(rep.ok());
  EXPECT_THAT(rep, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(rep.status().ToString().find("store full"), std::string::npos);
  ASSERT_EQ(starts.size(), 10u);
  for (size_t i = 0; i < starts.size(); ++i) EXPECT_EQ(starts[i], i * (32 << 10));
}

// A baseline too large for device memory stays in page-locked host memory:
// the kernels read it over the bus, and the chunks are the same.
TEST(GpuEncode, PinnedHostBaselineEqualsCpu) {
  uint64_t seed = 7000;
  for (double rate : {0.001, 0.03}) {
    const uint64_t n = (5 << 20) / 2 + 77;
    auto a = RandomBytes(n * 2, ++seed);
    auto b = Perturb(a, 2, rate, ++seed);
    CheckGpuEncode({a}, {b}, {2}, 1 << 20, 1024, "host baseline rate=" + std::to_string(rate),
                   /*host_baseline=*/true);
  }
}

TEST(GpuEncode, FixtureStepsEqualCpu) {
  const char* dir = std::getenv("REFIT_GPU_FIXTURES");
  if (dir == nullptr) GTEST_SKIP() << "set REFIT_GPU_FIXTURES";
  for (int step = 0; step < 3; ++step) {
    auto fa = SafetensorsFile::Open(std::string(dir) + "/step" + std::to_string(step) +
                                        ".safetensors", MappedFile::Mode::kReadOnly);
    auto fb = SafetensorsFile::Open(std::string(dir) + "/step" + std::to_string(step + 1) +
                                        ".safetensors", MappedFile::Mode::kReadOnly);
    ASSERT_TRUE(fa.ok() && fb.ok());
    std::vector<std::vector<uint8_t>> olds, news;
    std::vector<int> widths;
    for (size_t t = 0; t < fa->tensors().size(); ++t) {
      const auto& ta = fa->tensors()[t];
      const SafetensorsTensor* tb = fb->Find(ta.name);
      ASSERT_NE(tb, nullptr);
      if (fa->Data(t).empty()) continue;
      olds.emplace_back(fa->Data(t).begin(), fa->Data(t).end());
      news.emplace_back(tb->byte_size);
      std::memcpy(news.back().data(), fb->bytes().data() + tb->offset, tb->byte_size);
      widths.push_back(ta.element_width);
    }
    CheckGpuEncode(olds, news, widths, 64 << 10, 1024, "step" + std::to_string(step));
    CheckGpuEncode(olds, news, widths, 1 << 20, 1024, "step" + std::to_string(step) + " 1 MiB");
  }
}

}  // namespace
}  // namespace refit::cuda
