// Conditional XOR chunks (kind 5, docs/format.md §4.3) through the GPU
// receiver (cuda/conditional_apply.cu): the CPU decoder and apply are the
// oracle. Contiguous ranges and strided regions of BF16 data with
// realistic exponents, change rates from 0.1% to 30%, chunks smaller and
// larger than the class-count tiles; hostile payloads refused without a
// write; an "after" mismatch undone; a fold's versions through a
// DeviceTarget, and the refusal of a kind-5 chunk that shares elements
// with another chunk of one apply; each also staged and mapped against
// the base before the pause (Receiver::MapConditional). Needs a CUDA GPU;
// run by hand (tests/gpu/README.md), never under ctest.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <random>

#include "base/hash.h"
#include "codec/conditional.h"
#include "codec/payload.h"
#include "cuda/device_target.h"
#include "cuda/pipeline.h"
#include "delta/apply.h"
#include "delta/chunk.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit::cuda {
namespace {

using ::refit::testing::StatusIs;
using Bf16 = std::vector<uint16_t>;

struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(size_t n) { EXPECT_EQ(cudaMalloc(&p, n ? n : 1), cudaSuccess); }
  ~DeviceMem() { cudaFree(p); }
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(p); }
};

void Upload(DeviceMem& d, const Bf16& h) {
  ASSERT_EQ(cudaMemcpy(d.p, h.data(), 2 * h.size(), cudaMemcpyHostToDevice), cudaSuccess);
}
Bf16 Download(const DeviceMem& d, size_t n) {
  Bf16 h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d.p, 2 * n, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// BF16 values ~ N(0, 0.02) (rounded to nearest even), so that the
// exponents spread over several classes.
Bf16 RandomWeights(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  Bf16 v(n);
  for (auto& x : v) {
    const float f = normal(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    x = static_cast<uint16_t>(u >> 16);
  }
  return v;
}

// Changes ~rate of the elements as a trainer step does: mostly a few units
// in the last place, some larger moves (exponent changes), never to the
// same bits.
Bf16 Step(const Bf16& a, double rate, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution change(rate);
  Bf16 b = a;
  for (auto& x : b) {
    if (!change(rng)) continue;
    const uint32_t r = static_cast<uint32_t>(rng());
    int d = static_cast<int>(r % 7) - 3;
    if (r % 16 == 0) d = static_cast<int>((r >> 8) % 512) - 256;
    if (d == 0) d = 1;
    x = static_cast<uint16_t>(x + d);
  }
  return b;
}

// A region of a tensor: rows of `run` elements `stride` apart from
// `start` (run 0: the contiguous range of `count` elements).
struct Region {
  uint64_t start = 0, count = 0, run = 0, stride = 0;
  uint64_t Element(uint64_t i) const {
    return run == 0 ? start + i : start + (i / run) * stride + i % run;
  }
};

Bf16 Gather(const Bf16& t, const Region& r) {
  Bf16 g(r.count);
  for (uint64_t i = 0; i < r.count; ++i) g[i] = t[r.Element(i)];
  return g;
}

// A kind-5 chunk taking region r of tensor `tensor_id` from `a` to `b`
// (empty when nothing changed), whatever kind the encoder would pick.
std::vector<uint8_t> ConditionalChunk(const Bf16& a, const Bf16& b, const Region& r,
                                      uint32_t records_per_lane, uint64_t version = 2,
                                      uint64_t tensor_id = 0) {
  const Bf16 ga = Gather(a, r), gb = Gather(b, r);
  std::vector<uint32_t> positions;
  std::vector<uint8_t> xors;
  for (uint64_t i = 0; i < r.count; ++i) {
    const uint16_t x = ga[i] ^ gb[i];
    if (x == 0) continue;
    positions.push_back(static_cast<uint32_t>(i));
    xors.push_back(static_cast<uint8_t>(x));
    xors.push_back(static_cast<uint8_t>(x >> 8));
  }
  if (positions.empty()) return {};
  codec::EncodeOptions eo;
  eo.records_per_lane = records_per_lane;
  std::vector<uint8_t> payload;
  EXPECT_OK(codec::EncodeConditional(static_cast<uint32_t>(r.count),
                                     reinterpret_cast<const uint8_t*>(ga.data()), positions,
                                     xors.data(), eo, &payload));
  ChunkHeader h;
  h.kind = codec::ChunkKind::kConditionalXor;
  h.width = 2;
  h.version = version;
  h.base_version = version - 1;
  h.tensor_id = tensor_id;
  h.start = r.start;
  h.count = r.count;
  h.run = r.run;
  h.stride = r.stride;
  h.changed = positions.size();
  h.before = RangeHash(ga.data(), 2 * ga.size());
  h.after = RangeHash(gb.data(), 2 * gb.size());
  std::vector<uint8_t> out;
  SerializeChunk(h, payload, &out);
  return out;
}

struct Chunks {
  std::vector<uint8_t> buf;
  std::vector<ChunkSpan> spans;
  void Add(const std::vector<uint8_t>& c) {
    if (c.empty()) return;
    spans.push_back({buf.size(), c.size()});
    buf.insert(buf.end(), c.begin(), c.end());
  }
};

// The CPU apply of every chunk of `e`, in order, to `t`.
void ApplyOnCpu(const Chunks& e, Bf16* t) {
  ApplyScratch scratch;
  for (const ChunkSpan& s : e.spans) {
    auto pc = ParseChunk(std::span(e.buf).subspan(s.offset, s.size));
    ASSERT_OK(pc);
    ASSERT_EQ(pc->header.kind, codec::ChunkKind::kConditionalXor);
    ASSERT_OK(ApplyChunkInPlace(*pc, reinterpret_cast<uint8_t*>(t->data()), &scratch, nullptr,
                                nullptr));
  }
}

// How the GPU receiver applies a delta: through its staging slots, staged
// in device memory, or staged and its kind-5 chunks mapped against the
// base before the pause (Receiver::MapConditional).
enum class Path { kSlots, kStaged, kMapped };

// Applies `e` on the GPU to `a` (a [rows, cols] tensor, whole and
// contiguous): Classify says "before" for every chunk, Apply gives `want`,
// and a second Classify says "after".
void CheckOnGpu(const Bf16& a, uint64_t rows, uint64_t cols, const Chunks& e, const Bf16& want,
                Path path) {
  const bool staged = path != Path::kSlots;
  DeviceMem d(2 * a.size());
  Upload(d, a);
  PlacementPlan plan;
  ASSERT_OK(plan.Add(WholePlacement("t", 2, rows, cols, d.addr())));
  ReceiverOptions ro;
  ro.staging_bytes = 64 << 20;  // 8 slots: chunks of a few batches in flight
  auto rx = Receiver::Create(std::move(plan), {"t"}, ro);
  ASSERT_OK(rx);
  auto prep = (*rx)->Prepare(e.buf, e.spans);
  ASSERT_OK(prep);
  auto states = (*rx)->Classify(e.buf, *prep);
  ASSERT_OK(states);
  for (uint8_t s : *states) ASSERT_EQ(s, 0);
  std::unique_ptr<StagedDelta> resident;
  if (staged) {
    auto st = (*rx)->Stage(e.buf, *prep);
    ASSERT_OK(st);
    resident = std::move(*st);
    if (path == Path::kMapped) {
      ASSERT_OK((*rx)->MapConditional(*resident, *prep));
      EXPECT_EQ(Download(d, a.size()), a);  // nothing written before the pause
      EXPECT_THAT((*rx)->MapConditional(*resident, *prep),
                  StatusIs(StatusCode::kFailedPrecondition));
    }
  }
  auto rep = staged ? (*rx)->Apply(*resident, *prep, &*states)
                    : (*rx)->Apply(e.buf, *prep, &*states);
  ASSERT_OK(rep);
  EXPECT_EQ(rep->chunks_applied, e.spans.size());
  const Bf16 got = Download(d, a.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && ++bad < 5) {
      ADD_FAILURE() << "element " << i << ": " << got[i] << " want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u);
  states = (*rx)->Classify(e.buf, *prep);
  ASSERT_OK(states);
  for (uint8_t s : *states) EXPECT_EQ(s, 1);
}

// Contiguous chunks: small (under a tile), a few tiles (not a multiple),
// several runs of tiles, more runs than the decode's block scans at once
// (> 2^20 elements), starting on and off 16-byte boundaries; few
// and many lanes; several chunks of one tensor in one batch and across
// batches.
TEST(GpuConditional, ContiguousRangesMatchCpu) {
  uint64_t seed = 7000;
  for (uint64_t n : {uint64_t{100}, uint64_t{1000}, uint64_t{5 * 256 + 17},
                     uint64_t{256 * 300 + 5}, uint64_t{(1 << 20) + 77}}) {
    for (double rate : {0.001, 0.03, 0.3}) {
      for (uint32_t rpl : {64u, 1024u}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " rate " << rate << " rpl " << rpl);
        const uint64_t chunks = 3;
        const Bf16 a = RandomWeights(chunks * n, ++seed);
        const Bf16 b = Step(a, rate, ++seed);
        Chunks e;
        for (uint64_t c = 0; c < chunks; ++c) {
          e.Add(ConditionalChunk(a, b, Region{c * n, n, 0, 0}, rpl));
        }
        if (e.spans.empty()) continue;  // 0.1% of 100 elements
        Bf16 cpu = a;
        ASSERT_NO_FATAL_FAILURE(ApplyOnCpu(e, &cpu));
        ASSERT_EQ(cpu, b);
        ASSERT_NO_FATAL_FAILURE(CheckOnGpu(a, chunks * n, 1, e, cpu, Path::kSlots));
        ASSERT_NO_FATAL_FAILURE(CheckOnGpu(a, chunks * n, 1, e, cpu, Path::kMapped));
        if (n > 1000 && rate > 0.01) {
          ASSERT_NO_FATAL_FAILURE(CheckOnGpu(a, chunks * n, 1, e, cpu, Path::kStaged));
        }
      }
    }
  }
}

// Strided regions (a tensor-parallel rank's block of columns): rows of
// `run` elements, in row order; the ranks' interleaved regions of one
// version in one apply (their spans overlap, their elements do not).
TEST(GpuConditional, StridedRegionsMatchCpu) {
  struct Shape {
    uint64_t rows, cols, ranks;
  };
  const Shape shapes[] = {{64, 1024, 2}, {40, 300, 3}, {300, 16, 2}, {2048, 1536, 4}};
  uint64_t seed = 8000;
  for (const Shape& sh : shapes) {
    for (double rate : {0.001, 0.03, 0.3}) {
      SCOPED_TRACE(::testing::Message() << "rows " << sh.rows << " cols " << sh.cols << " rate "
                                        << rate);
      const uint64_t n = sh.rows * sh.cols, run = sh.cols / sh.ranks;
      const Bf16 a = RandomWeights(n, ++seed);
      const Bf16 b = Step(a, rate, ++seed);
      Chunks e;
      const uint64_t block = std::max<uint64_t>(2, sh.rows / 3);
      for (uint64_t rank = 0; rank < sh.ranks; ++rank) {
        for (uint64_t r0 = 0; r0 + 2 <= sh.rows; r0 += block) {
          const uint64_t rows = std::min(block, sh.rows - r0);
          if (rows < 2) break;
          e.Add(ConditionalChunk(a, b, Region{r0 * sh.cols + rank * run, rows * run, run, sh.cols},
                                 rate < 0.01 ? 64 : 1024));
        }
      }
      if (e.spans.empty()) continue;
      Bf16 cpu = a;
      ASSERT_NO_FATAL_FAILURE(ApplyOnCpu(e, &cpu));
      for (Path path : {Path::kSlots, Path::kStaged, Path::kMapped}) {
        ASSERT_NO_FATAL_FAILURE(CheckOnGpu(a, sh.rows, sh.cols, e, cpu, path));
      }
    }
  }
}

// Recomputes a chunk's checksum after a deliberate edit, so that the
// corruption reaches the decoder instead of the framing check.
void FixChecksum(std::vector<uint8_t>* chunk) {
  const uint32_t c = static_cast<uint32_t>(XXH3_64bits(chunk->data(), chunk->size() - 4));
  std::memcpy(chunk->data() + chunk->size() - 4, &c, 4);
}

// `chunk` with a wrong "after" hash: its records decode and apply, and the
// range then fails the check.
std::vector<uint8_t> WithWrongAfter(const std::vector<uint8_t>& chunk) {
  auto pc = ParseChunk(chunk);
  EXPECT_OK(pc);
  if (!pc.ok()) return chunk;
  ChunkHeader h = pc->header;
  h.after.lo ^= 1;
  std::vector<uint8_t> payload(pc->payload.begin(), pc->payload.end());
  std::vector<uint8_t> out;
  SerializeChunk(h, payload, &out);
  return out;
}

// The tensor table of one BF16 tensor "t" of [rows, cols].
std::vector<TensorEntry> OneTensorTable(uint64_t rows, uint64_t cols) {
  std::vector<TensorEntry> table(1);
  table[0].name = "t";
  table[0].dtype = "BF16";
  table[0].width = 2;
  table[0].shape = {rows, cols};
  table[0].num_elements = rows * cols;
  return table;
}

// Applies the one chunk `c` to `base` (n elements) on the CPU and the GPU,
// without the pre-apply check (the decoders meet whatever the payload
// holds): both refuse it or both apply it alike; refused, the GPU range is
// unchanged. Returns the GPU's status.
Status CpuAndGpuAgree(const Bf16& base, const std::vector<uint8_t>& c) {
  auto pc = ParseChunk(c);
  EXPECT_OK(pc);
  if (!pc.ok()) return pc.status();
  Bf16 cpu = base;
  ApplyScratch scratch;
  const bool cpu_ok = ApplyChunkInPlace(*pc, reinterpret_cast<uint8_t*>(cpu.data()), &scratch,
                                        nullptr, nullptr)
                          .ok();
  DeviceMem d(2 * base.size());
  Upload(d, base);
  PlacementPlan plan;
  EXPECT_OK(plan.Add(WholePlacement("t", 2, base.size(), 1, d.addr())));
  auto rx = Receiver::Create(std::move(plan), {"t"}, {});
  EXPECT_OK(rx);
  ChunkSpan span{0, c.size()};
  auto prep = (*rx)->Prepare(c, std::span(&span, 1));
  if (!prep.ok()) {
    EXPECT_FALSE(cpu_ok) << "the host refused what the CPU applies: " << prep.status().ToString();
    EXPECT_EQ(Download(d, base.size()), base);
    return prep.status();
  }
  auto rep = (*rx)->Apply(c, *prep);
  EXPECT_EQ(rep.ok(), cpu_ok) << rep.status().ToString();
  EXPECT_EQ(Download(d, base.size()), cpu_ok ? cpu : base);
  // Staged and mapped before the pause: the same outcome, and a refusal
  // found by the mapping is the pause's.
  Upload(d, base);
  auto staged = (*rx)->Stage(c, *prep);
  EXPECT_OK(staged);
  if (!staged.ok()) return staged.status();
  EXPECT_OK((*rx)->MapConditional(**staged, *prep));
  EXPECT_EQ(Download(d, base.size()), base);
  auto mapped = (*rx)->Apply(**staged, *prep);
  EXPECT_EQ(mapped.ok(), rep.ok()) << mapped.status().ToString();
  if (!mapped.ok() && !rep.ok()) {
    EXPECT_EQ(mapped.status().ToString(), rep.status().ToString());
  }
  EXPECT_EQ(Download(d, base.size()), cpu_ok ? cpu : base);
  return rep.status();
}

// Hostile payloads: a class with more changes than the base has members
// (the chunk applied to a base whose classes differ), and flipped bytes
// anywhere in the payload (header, models, lanes).
TEST(GpuConditional, CorruptPayloadsAreRefusedWithoutWriting) {
  const uint64_t n = 20000;
  const Bf16 a = RandomWeights(n, 91);
  const Bf16 b = Step(a, 0.03, 92);
  const std::vector<uint8_t> good = ConditionalChunk(a, b, Region{0, n, 0, 0}, 256);
  auto pc = ParseChunk(good);
  ASSERT_OK(pc);
  auto info = codec::DescribeConditional(pc->payload);
  ASSERT_OK(info);
  // The base with every member of a changed class moved to another class:
  // that class has changes and no members.
  int cls = -1;
  for (int c = 0; c < codec::kConditionalClasses && cls < 0; ++c) {
    if (info->changes[c] > 0) cls = c;
  }
  ASSERT_GE(cls, 0);
  auto class_of = [&](uint16_t x) {
    const int e = (x >> 7) & 0xff;
    return e <= info->lo ? 0 : std::min(e - info->lo, 7);
  };
  Bf16 moved = a;
  const int to_exp = cls == 0 ? info->lo + 1 : info->lo;
  for (auto& x : moved) {
    if (class_of(x) == cls) x = static_cast<uint16_t>((x & 0x807f) | to_exp << 7);
  }
  {
    std::vector<uint32_t> pos(pc->header.changed);
    std::vector<uint8_t> vals(2 * pc->header.changed);
    EXPECT_THAT(codec::DecodeConditional(pc->payload, n,
                                         reinterpret_cast<const uint8_t*>(moved.data()),
                                         static_cast<uint32_t>(pc->header.changed), pos.data(),
                                         vals.data()),
                StatusIs(StatusCode::kDataLoss));
  }
  Status s = CpuAndGpuAgree(moved, good);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_NE(s.message().find(ChunkStatusName(kStatusClassCount)), std::string::npos) << s.ToString();
  // The good chunk applies.
  EXPECT_OK(CpuAndGpuAgree(a, good));
  // Flipped bytes.
  std::mt19937_64 rng(93);
  const size_t payload_at = static_cast<size_t>(pc->payload.data() - good.data());
  int refused = 0;
  for (int t = 0; t < 80; ++t) {
    std::vector<uint8_t> bad = good;
    bad[payload_at + rng() % pc->payload.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    FixChecksum(&bad);
    refused += !CpuAndGpuAgree(a, bad).ok();
  }
  EXPECT_GT(refused, 40);
}

// A chunk whose records decode but whose "after" hash is wrong: the GPU
// applies its records, finds the range off "after" and XORs them again
// (never decoding against the after state), so the range ends untouched,
// while a good chunk of the same batch applies.
TEST(GpuConditional, AfterMismatchIsUndone) {
  const uint64_t n = 50000;
  const Bf16 a = RandomWeights(2 * n, 101);
  const Bf16 b = Step(a, 0.05, 102);
  Chunks e;
  e.Add(ConditionalChunk(a, b, Region{0, n, 0, 0}, 128));
  e.Add(WithWrongAfter(ConditionalChunk(a, b, Region{n, n, 0, 0}, 128)));
  DeviceMem d(2 * a.size());
  Upload(d, a);
  PlacementPlan plan;
  ASSERT_OK(plan.Add(WholePlacement("t", 2, 2 * n, 1, d.addr())));
  auto rx = Receiver::Create(std::move(plan), {"t"}, {});
  ASSERT_OK(rx);
  auto prep = (*rx)->Prepare(e.buf, e.spans);
  ASSERT_OK(prep);
  EXPECT_THAT((*rx)->Apply(e.buf, *prep), StatusIs(StatusCode::kDataLoss));
  ASSERT_EQ((*rx)->last_status().size(), 2u);
  EXPECT_EQ((*rx)->last_status()[0], kStatusOk);
  EXPECT_EQ((*rx)->last_status()[1], kStatusAfterMismatch);
  Bf16 want = a;
  std::copy(b.begin(), b.begin() + n, want.begin());
  EXPECT_EQ(Download(d, a.size()), want);
  // Mapped before the pause: the same.
  Upload(d, a);
  auto staged = (*rx)->Stage(e.buf, *prep);
  ASSERT_OK(staged);
  ASSERT_OK((*rx)->MapConditional(**staged, *prep));
  EXPECT_THAT((*rx)->Apply(**staged, *prep), StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ((*rx)->last_status()[0], kStatusOk);
  EXPECT_EQ((*rx)->last_status()[1], kStatusAfterMismatch);
  EXPECT_EQ(Download(d, a.size()), want);
}

// Two versions of one tensor, each a kind-5 chunk of the same range (the
// second coded against the first's result). One apply holding both is
// refused before anything is written; two applies, one after the other,
// give the CPU's result; and a DeviceTarget folds both into one pause, and
// restores the tensor when a third version fails in the same pause (the
// kind-5 ranges from their saved copies, never by applying them again).
TEST(GpuConditional, FoldedVersionsAndOverlapRefusal) {
  const uint64_t rows = 512, cols = 1000, n = rows * cols;
  const Bf16 v0 = RandomWeights(n, 201);
  const Bf16 v1 = Step(v0, 0.03, 202);
  const Bf16 v2 = Step(v1, 0.03, 203);
  const Bf16 v3 = Step(v2, 0.03, 204);
  const Region whole{0, n, 0, 0};
  const std::vector<uint8_t> c1 = ConditionalChunk(v0, v1, whole, 512, 1);
  const std::vector<uint8_t> c2 = ConditionalChunk(v1, v2, whole, 512, 2);
  // Version 3: a strided region (the left half of the columns) whose
  // "after" hash is wrong, so it fails in the pause.
  const std::vector<uint8_t> c3 = WithWrongAfter(
      ConditionalChunk(v2, v3, Region{0, rows * (cols / 2), cols / 2, cols}, 512, 3));
  Bf16 cpu = v0;
  {
    Chunks e;
    e.Add(c1);
    e.Add(c2);
    ASSERT_NO_FATAL_FAILURE(ApplyOnCpu(e, &cpu));
    ASSERT_EQ(cpu, v2);
  }
  DeviceMem d(2 * n);
  Upload(d, v0);
  PlacementPlan plan;
  ASSERT_OK(plan.Add(WholePlacement("t", 2, rows, cols, d.addr())));
  {
    auto rx = Receiver::Create(plan, {"t"}, {});
    ASSERT_OK(rx);
    Chunks both;
    both.Add(c1);
    both.Add(c2);
    auto prep = (*rx)->Prepare(both.buf, both.spans);
    EXPECT_THAT(prep, StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_NE(prep.status().message().find("chunk 0"), std::string::npos) << prep.status().ToString();
    EXPECT_EQ(Download(d, n), v0);
    // One apply a version.
    for (const auto* c : {&c1, &c2}) {
      ChunkSpan span{0, c->size()};
      auto p = (*rx)->Prepare(*c, std::span(&span, 1));
      ASSERT_OK(p);
      ASSERT_OK((*rx)->Apply(*c, *p));
    }
    EXPECT_EQ(Download(d, n), v2);
  }
  // Through a DeviceTarget: versions 1 and 2 folded into one pause; then
  // versions 1, 2 and the failing 3 from v0 again, all restored.
  const std::vector<TensorEntry> table = OneTensorTable(rows, cols);
  auto target = DeviceTarget::Create({{"t", "BF16", 2, {rows, cols}}}, plan, {});
  ASSERT_OK(target);
  DeviceTarget& t = **target;
  Upload(d, v0);
  ASSERT_OK(t.Hashes(table).status());
  ASSERT_OK(t.Begin());
  ASSERT_OK(t.Add(0, table, c1));
  ASSERT_OK(t.Add(1, table, c2));
  ASSERT_OK(t.Seal());
  EXPECT_EQ(Download(d, n), v0);  // nothing written before the pause
  auto applied = t.Apply();
  ASSERT_OK(applied);
  EXPECT_EQ(applied->versions, 2u);
  EXPECT_EQ(Download(d, n), v2);

  Upload(d, v0);
  ASSERT_OK(t.Hashes(table).status());
  ASSERT_OK(t.Begin());
  ASSERT_OK(t.Add(0, table, c1));
  ASSERT_OK(t.Add(1, table, c2));
  ASSERT_OK(t.Add(2, table, c3));
  ASSERT_OK(t.Seal());
  auto failed = t.Apply();
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(Download(d, n), v0) << failed.status().ToString();
}

// One version staged in device memory: its kind-5 chunks are mapped in
// Seal, so no copy of their ranges is kept (the target holds far less
// device memory than the tensor), and when one of its chunks fails its
// "after" check in the pause, the others are undone by XORing their
// records again: the tensor ends exactly as it was.
TEST(GpuConditional, MappedVersionIsUndoneWithoutASavedCopy) {
  const uint64_t rows = 1024, cols = 1024, n = rows * cols;
  const Bf16 v0 = RandomWeights(n, 301);
  const Bf16 v1 = Step(v0, 0.03, 302);
  const uint64_t quarter = n / 4;
  std::vector<std::vector<uint8_t>> chunks;
  for (uint64_t q = 0; q < 4; ++q) {
    chunks.push_back(ConditionalChunk(v0, v1, Region{q * quarter, quarter, 0, 0}, 512, 1));
  }
  DeviceMem d(2 * n);
  PlacementPlan plan;
  ASSERT_OK(plan.Add(WholePlacement("t", 2, rows, cols, d.addr())));
  const std::vector<TensorEntry> table = OneTensorTable(rows, cols);
  for (bool fail : {false, true}) {
    SCOPED_TRACE(fail ? "a chunk fails" : "all apply");
    auto target = DeviceTarget::Create({{"t", "BF16", 2, {rows, cols}}}, plan, {});
    ASSERT_OK(target);
    DeviceTarget& t = **target;
    Upload(d, v0);
    ASSERT_OK(t.Hashes(table).status());
    ASSERT_OK(t.Begin());
    for (size_t q = 0; q < chunks.size(); ++q) {
      ASSERT_OK(t.Add(0, table, fail && q == 2 ? WithWrongAfter(chunks[q]) : chunks[q]));
    }
    ASSERT_OK(t.Seal());
    EXPECT_EQ(Download(d, n), v0);  // nothing written before the pause
    // The staged payload, scratch and the decode arena: far below the
    // tensor's 2 MiB that a saved copy would add.
    EXPECT_LT(t.usage().device_bytes, 2 * n) << t.usage().device_bytes;
    auto applied = t.Apply();
    if (fail) {
      EXPECT_FALSE(applied.ok());
      EXPECT_EQ(Download(d, n), v0) << applied.status().ToString();
    } else {
      ASSERT_OK(applied);
      EXPECT_EQ(Download(d, n), v1);
    }
  }
}

}  // namespace
}  // namespace refit::cuda
