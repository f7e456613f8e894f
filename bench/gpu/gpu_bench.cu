// GPU receiver benchmark (docs/benchmarks.md, "GPU (H200)").
//
// Synthesizes a BF16 model of --model-gib GiB in device memory (32 tensors;
// every 8 MiB chunk range starts from the same random tile, so the host
// never holds the whole model), encodes a delta at each change rate on the
// CPU with the reference encoder (changed elements get small XORs, as 1-ulp
// trainer updates do), and measures, in the same run:
//   - device-to-device copy bandwidth (the HBM ceiling);
//   - the receiver: end-to-end Apply from pinned host memory with the
//     default 256 MiB staging, with and without "after" verification, and
//     its GPU kernel time (the pause when the payload is already staged);
//   - the pre-pause "before" check (Classify);
//   - baselines: a dense XOR-mask apply over the whole model, plain
//     host-to-device copy of the payload, CPU decode of the payload plus a
//     host-to-device copy of the whole model;
//   - the scatter's floor: the in-place XOR of every changed element alone
//     (RED.XOR at Bernoulli(rate) positions, no decode, no payload);
//   - the trainer side: GPU detect + encode (EncodeOnDevice) of the applied
//     model against a device copy of the base, 5 timed calls into a sink
//     that counts the chunks, then one call whose chunks are checked byte
//     for byte against the CPU-encoded delta.
//
//   refit_gpu_bench [--model-gib 32] [--rates 0.001,0.01,0.03]
//                   [--encode-only 0|1] [--floor-only 0|1] [--encode-threads N]
//                   [--encode-staging-mib 256]
//                   [--records-per-lane 1024]
//                   [--normal-weights 0|1] [--conditional 0|1]
//
// --normal-weights 1 makes the tile BF16 values ~ N(0, 0.02) and moves
// each changed element by 1-3 units in the last place (an add, as a
// trainer step does), instead of random bits and small XORs.
// --conditional 1 (implies --normal-weights 1) lets the encoder choose
// conditional XOR chunks (kind 5, decoded given the base); the trainer
// side's GPU encode is then skipped (it does not write kind 5). With
// --normal-weights, every timed apply starts from a device copy of the
// base (a kind-5 chunk applied twice does not toggle back), so run both
// modes with it to compare their pauses.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/parallel.h"
#include "codec/payload.h"
#include "cuda/encoder.h"
#include "cuda/pipeline.h"
#include "delta/chunk.h"
#include "delta/encoder.h"
#include "trainer/convert.h"

namespace refit::cuda {
namespace {

#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e_ = (x);                                              \
    if (e_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,   \
                   cudaGetErrorString(e_));                            \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kChunkBytes = 8 << 20;  // the encoder's default

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

__global__ void XorMaskKernel(uint4* dst, const uint4* mask, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    uint4 a = dst[i];
    const uint4 m = mask[i];
    a.x ^= m.x;
    a.y ^= m.y;
    a.z ^= m.z;
    a.w ^= m.w;
    dst[i] = a;
  }
}

// Scatter floor: Bernoulli(rate) positions per 8 MiB chunk (BF16), drawn
// on the GPU by geometric skips, one thread per chunk, into pos[c * cap..]
// (count[c] of them, ascending).
__global__ void FloorPositionsKernel(uint32_t* pos, uint32_t* count, uint64_t chunks,
                                     uint32_t per_chunk, uint32_t cap, double rate) {
  const uint64_t c = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (c >= chunks) return;
  uint64_t x = 0x9e3779b97f4a7c15ull * (c + 1);
  const double lq = log1p(-rate);
  uint32_t k = 0;
  for (uint64_t i = 0;; ++i) {
    x ^= x << 13;  // xorshift64
    x ^= x >> 7;
    x ^= x << 17;
    const double u = (static_cast<double>(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    i += static_cast<uint64_t>(floor(log(u) / lq));
    if (i >= per_chunk || k == cap) break;
    pos[c * cap + k++] = static_cast<uint32_t>(i);
  }
  count[c] = k;
}

// One block per chunk: its threads XOR 1 into the elements at the chunk's
// positions, 128 consecutive records at a time in ascending order, with
// the apply kernel's fire-and-forget RED.XOR on the 32-bit word: the DRAM
// read-modify-write traffic of an in-place sparse apply with no decode.
__global__ void FloorScatterKernel(uint8_t* model, const uint32_t* pos,
                                   const uint32_t* count, uint32_t per_chunk, uint32_t cap) {
  const uint64_t c = blockIdx.x;
  const uint32_t* p = pos + c * cap;
  const uint32_t n = count[c];
  auto* words = reinterpret_cast<unsigned int*>(model);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t e = c * per_chunk + p[i];
    atomicXor(&words[e / 2], 1u << (16 * (e & 1)));
  }
}

// The same positions with a plain load, XOR and store of each 16-bit
// element (no atomic: the elements are distinct).
__global__ void FloorRmwKernel(uint8_t* model, const uint32_t* pos, const uint32_t* count,
                               uint32_t per_chunk, uint32_t cap) {
  const uint64_t c = blockIdx.x;
  const uint32_t* p = pos + c * cap;
  const uint32_t n = count[c];
  auto* el = reinterpret_cast<uint16_t*>(model);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t e = c * per_chunk + p[i];
    el[e] ^= 1;
  }
}

float TimeMs(cudaStream_t s, const std::function<void()>& fn, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  fn();  // warm-up
  CK(cudaEventRecord(a, s));
  for (int i = 0; i < reps; ++i) fn();
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

struct Delta {
  uint8_t* pinned = nullptr;  // cudaHostAlloc'd chunk bytes
  uint64_t bytes = 0;
  std::vector<ChunkSpan> spans;
  uint64_t records = 0;
  uint64_t conditional = 0;  // chunks of kind 5
};

// One chunk per 8 MiB range of each tensor; tile is the base of every
// range (the device model repeats it).
// With `upload_to` (device), each range's new bytes are also copied there,
// which makes the device model "after" without the receiver.
Delta Encode(const std::vector<uint8_t>& tile, int tensors, uint64_t per_tensor,
             double rate, int threads, uint32_t records_per_lane, bool add_ulps,
             bool conditional, uint8_t* upload_to = nullptr) {
  const uint64_t chunks_per_tensor = per_tensor / kChunkBytes;
  const uint64_t total = chunks_per_tensor * tensors;
  std::vector<std::vector<uint8_t>> out(total);
  std::atomic<uint64_t> records{0}, conditional_chunks{0};
  ParallelForEach(total, threads, [&](size_t c, int) {
    std::vector<uint8_t> b = tile;
    std::mt19937_64 rng(c * 7919 + static_cast<uint64_t>(rate * 1e6));
    // Geometric skips reproduce a Bernoulli(rate) change pattern fast.
    std::geometric_distribution<uint64_t> skip(rate);
    const uint64_t n = tile.size() / 2;
    for (uint64_t i = skip(rng); i < n; i += 1 + skip(rng)) {
      uint16_t v;
      std::memcpy(&v, &b[2 * i], 2);
      const uint16_t d = static_cast<uint16_t>(1 + rng() % 3);
      if (add_ulps) {
        v = (rng() & 1) ? static_cast<uint16_t>(v + d) : static_cast<uint16_t>(v - d);
      } else {
        v ^= d;
      }
      std::memcpy(&b[2 * i], &v, 2);
    }
    if (upload_to != nullptr) {
      CK(cudaMemcpy(upload_to + c * kChunkBytes, b.data(), kChunkBytes,
                    cudaMemcpyHostToDevice));
    }
    ChunkHeader ids;
    ids.width = 2;
    ids.version = 2;
    ids.base_version = 1;
    ids.tensor_id = c / chunks_per_tensor;
    ChunkEncodeOptions opt;
    opt.codec.records_per_lane = records_per_lane;
    opt.allow_conditional = conditional;
    EncodeScratch scratch;
    ChunkResult r;
    if (!EncodeChunkRange(ids, tile.data(), b.data(), 0, n, opt, &scratch, &r).ok() ||
        r.chunk.empty()) {
      std::fprintf(stderr, "encode failed\n");
      std::exit(1);
    }
    records += r.header.changed;
    conditional_chunks += r.header.kind == codec::ChunkKind::kConditionalXor;
    // Re-frame at the chunk's real start in its tensor.
    auto pc = ParseChunk(r.chunk);
    ChunkHeader h = pc->header;
    h.start = (c % chunks_per_tensor) * n;
    std::vector<uint8_t> payload(pc->payload.begin(), pc->payload.end());
    SerializeChunk(h, payload, &out[c]);
  });
  Delta d;
  for (auto& c : out) d.bytes += c.size();
  CK(cudaHostAlloc(reinterpret_cast<void**>(&d.pinned), d.bytes, cudaHostAllocDefault));
  uint64_t off = 0;
  for (auto& c : out) {
    std::memcpy(d.pinned + off, c.data(), c.size());
    d.spans.push_back({off, c.size()});
    off += c.size();
  }
  d.records = records;
  d.conditional = conditional_chunks;
  return d;
}

int Main(int argc, char** argv) {
  double model_gib = 32;
  uint32_t records_per_lane = 1024;  // the encoder's default
  bool encode_only = false;  // trainer side only (no receiver)
  bool floor_only = false;   // the scatter floors only
  int encode_threads = 0;     // GpuEncodeOptions::host_threads (0: default)
  uint64_t encode_staging_mib = 0;  // GpuEncodeOptions::staging_bytes (0: default)
  bool normal_weights = false;  // BF16 ~ N(0, 0.02), changes by 1-3 ulps
  bool conditional = false;     // the encoder may choose kind 5
  std::vector<double> rates = {0.001, 0.01, 0.03};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model-gib") model_gib = std::atof(argv[i + 1]);
    if (a == "--encode-only") encode_only = std::atoi(argv[i + 1]) != 0;
    if (a == "--floor-only") floor_only = std::atoi(argv[i + 1]) != 0;
    if (a == "--encode-threads") encode_threads = std::atoi(argv[i + 1]);
    if (a == "--normal-weights") normal_weights = std::atoi(argv[i + 1]) != 0;
    if (a == "--conditional") conditional = std::atoi(argv[i + 1]) != 0;
    if (a == "--encode-staging-mib") {
      encode_staging_mib = std::strtoull(argv[i + 1], nullptr, 10);
    }
    if (a == "--records-per-lane") {
      records_per_lane = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    }
    if (a == "--rates") {
      rates.clear();
      std::string s = argv[i + 1];
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        rates.push_back(std::atof(s.substr(p, q - p).c_str()));
        p = q + 1;
      }
    }
  }
  if (conditional) normal_weights = true;
  if (conditional && encode_only) {
    std::fprintf(stderr, "--conditional has no trainer side to time: the GPU encoder does not"
                         " write kind 5\n");
    return 2;
  }
  const int threads = DefaultThreads();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.1f GiB; host threads %d; records/lane %u\n",
              prop.name, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / kGiB, threads,
              records_per_lane);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));

  // 1. Device-to-device copy bandwidth.
  double d2d_gbps = 0;
  {
    const uint64_t n = 4 * kGiB;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    const float ms = TimeMs(s, [&] { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s)); }, 5);
    std::printf("d2d copy 4 GiB: %.3f ms, %.0f GB/s (read+write %.0f GB/s)\n", ms,
                n / ms / 1e6, 2 * n / ms / 1e6);
    d2d_gbps = n / ms / 1e6;
    CK(cudaFree(a));
    CK(cudaFree(b));
  }

  // 2. The model: 32 tensors, every 8 MiB range a copy of one random tile.
  const int tensors = 32;
  const uint64_t per_tensor =
      static_cast<uint64_t>(model_gib * kGiB / tensors) / kChunkBytes * kChunkBytes;
  const uint64_t model_bytes = per_tensor * tensors;
  std::vector<uint8_t> tile(kChunkBytes);
  {
    std::mt19937_64 rng(1);
    if (normal_weights) {
      std::normal_distribution<float> normal(0.0f, 0.02f);
      for (size_t i = 0; i < tile.size(); i += 2) {
        const uint16_t v = trainer::Bf16FromF32(normal(rng));
        std::memcpy(&tile[i], &v, 2);
      }
    } else {
      for (size_t i = 0; i < tile.size(); i += 8) {
        const uint64_t v = rng();
        std::memcpy(&tile[i], &v, 8);
      }
    }
  }
  uint8_t* model;
  CK(cudaMalloc(&model, model_bytes));
  CK(cudaMemcpy(model, tile.data(), kChunkBytes, cudaMemcpyHostToDevice));
  for (uint64_t off = kChunkBytes; off < model_bytes;) {
    const uint64_t n = std::min(off, model_bytes - off);
    CK(cudaMemcpy(model + off, model, n, cudaMemcpyDeviceToDevice));
    off += n;
  }
  // A device copy of the base, for the trainer-side encoder.
  uint8_t* base_copy;
  CK(cudaMalloc(&base_copy, model_bytes));
  CK(cudaMemcpy(base_copy, model, model_bytes, cudaMemcpyDeviceToDevice));
  std::printf("model: %d BF16 tensors, %.2f GiB resident\n", tensors,
              static_cast<double>(model_bytes) / kGiB);
  std::vector<std::string> names;
  PlacementPlan plan;
  for (int t = 0; t < tensors; ++t) {
    names.push_back("layer" + std::to_string(t) + ".weight");
    if (!plan.Add(WholePlacement(names.back(), 2, per_tensor / 2, 1,
                                 reinterpret_cast<uintptr_t>(model) + t * per_tensor))
             .ok()) {
      return 1;
    }
  }

  size_t free0, total0;
  CK(cudaMemGetInfo(&free0, &total0));
  // 3. Dense XOR-mask baseline (a full-size mask in HBM).
  {
    uint8_t* mask;
    CK(cudaMalloc(&mask, model_bytes));
    CK(cudaMemset(mask, 0, model_bytes));
    const uint64_t n16 = model_bytes / 16;
    const float ms = TimeMs(s, [&] {
      XorMaskKernel<<<prop.multiProcessorCount * 8, 512, 0, s>>>(
          reinterpret_cast<uint4*>(model), reinterpret_cast<const uint4*>(mask), n16);
    }, 3);
    std::printf("baseline dense XOR mask apply (%.0f GiB mask): %.2f ms, %.0f GB/s moved\n",
                static_cast<double>(model_bytes) / kGiB, ms, 3.0 * model_bytes / ms / 1e6);
    CK(cudaFree(mask));
  }
  // Host-to-device bandwidth from pinned memory (for the CPU baseline).
  double h2d_gbps = 0;
  {
    const uint64_t n = 2 * kGiB;
    void *h, *d;
    CK(cudaHostAlloc(&h, n, cudaHostAllocDefault));
    std::memset(h, 3, n);
    CK(cudaMalloc(&d, n));
    const float ms = TimeMs(s, [&] { CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s)); }, 3);
    h2d_gbps = n / ms / 1e6;
    std::printf("h2d pinned 2 GiB: %.2f ms, %.1f GB/s; whole model would take %.0f ms\n",
                ms, h2d_gbps, model_bytes / h2d_gbps / 1e6);
    CK(cudaFreeHost(h));
    CK(cudaFree(d));
  }

  // The scatter's floor at a rate: every changed element XORed in place
  // and nothing else (RED.XOR on the element's 32-bit word, as the apply
  // kernel does, or a plain 16-bit load, XOR and store). Leaves the model
  // as it was: the warm-up and 3 timed passes toggle it an even number of
  // times.
  auto scatter_floor = [&](double rate, bool rmw) -> float {
    const uint64_t chunks = model_bytes / kChunkBytes;
    const uint32_t per_chunk = static_cast<uint32_t>(kChunkBytes / 2);
    const uint32_t cap = static_cast<uint32_t>(per_chunk * rate * 1.2 + 4096);
    uint32_t *fpos, *fcount;
    CK(cudaMalloc(&fpos, chunks * cap * sizeof(uint32_t)));
    CK(cudaMalloc(&fcount, chunks * sizeof(uint32_t)));
    FloorPositionsKernel<<<static_cast<unsigned>((chunks + 127) / 128), 128, 0, s>>>(
        fpos, fcount, chunks, per_chunk, cap, rate);
    CK(cudaGetLastError());
    const float ms = TimeMs(s, [&] {
      if (rmw) {
        FloorRmwKernel<<<static_cast<unsigned>(chunks), 128, 0, s>>>(model, fpos, fcount,
                                                                    per_chunk, cap);
      } else {
        FloorScatterKernel<<<static_cast<unsigned>(chunks), 128, 0, s>>>(model, fpos, fcount,
                                                                        per_chunk, cap);
      }
    }, 3);
    CK(cudaGetLastError());
    CK(cudaFree(fpos));
    CK(cudaFree(fcount));
    return ms;
  };
  if (floor_only) {
    for (double rate : rates) {
      std::printf("scatter floor %.1f%%: RED.XOR %.2f ms, 16-bit load+store %.2f ms\n",
                  rate * 100, scatter_floor(rate, false), scatter_floor(rate, true));
    }
    return 0;
  }

  // Trainer side: with the model at "after", encode it against the base on
  // the GPU and compare with the CPU-encoded delta.
  auto encode_gpu = [&](const Delta& d, double rate) -> bool {
      std::vector<DeviceTensorPair> pairs;
      for (int t = 0; t < tensors; ++t) {
        DeviceTensorPair p;
        p.old_data = base_copy + t * per_tensor;
        p.new_data = model + t * per_tensor;
        p.elements = per_tensor / 2;
        p.width = 2;
        p.tensor_id = static_cast<uint64_t>(t);
        pairs.push_back(p);
      }
      GpuEncodeOptions eo;
      eo.version = 2;
      eo.base_version = 1;
      eo.records_per_lane = records_per_lane;
      eo.host_threads = encode_threads;
      if (encode_staging_mib != 0) eo.staging_bytes = encode_staging_mib << 20;
      // Timed calls hand the chunks to a sink that only counts them (a
      // trainer's sink writes them to the store); one more call compares
      // every chunk with the CPU-encoded delta.
      double best = 1e9;
      std::vector<double> times;
      GpuEncodeReport er;
      for (int rep = 0; rep < 5; ++rep) {
        uint64_t got_bytes = 0;
        const double e0 = Now();
        auto r = EncodeOnDevice(pairs, eo, [&](const GpuChunkInfo&, std::span<const uint8_t> b) {
          got_bytes += b.size();
          return Status::Ok();
        });
        const double el = Now() - e0;
        if (!r.ok()) {
          std::fprintf(stderr, "gpu encode: %s\n", r.status().ToString().c_str());
          return false;
        }
        times.push_back(el * 1e3);
        if (el < best) {
          best = el;
          er = *r;
        }
      }
      uint64_t same = 0;
      size_t index = 0;
      auto checked = EncodeOnDevice(pairs, eo, [&](const GpuChunkInfo&,
                                                   std::span<const uint8_t> b) {
        if (index < d.spans.size()) {
          same += b.size() == d.spans[index].size &&
                  std::memcmp(b.data(), d.pinned + d.spans[index].offset, b.size()) == 0;
        }
        ++index;
        return Status::Ok();
      });
      if (!checked.ok() || index != d.spans.size()) same = 0;
      std::sort(times.begin(), times.end());
      std::printf("  gpu encode %.1f%%: 5 runs %.1f / %.1f / %.1f / %.1f / %.1f ms\n", rate * 100,
                  times[0], times[1], times[2], times[3], times[4]);
      std::printf("  gpu encode %.1f%%: %.1f ms (detect+hash kernel %.1f ms), %.0f GB/s of"
                  " both tensors read (%.0f%% of d2d copy GB/s); %llu chunks, %llu on CPU,"
                  " %llu groups; identical to CPU chunks: %llu/%zu; peak extra device %.0f MiB\n",
                  rate * 100, best * 1e3, er.detect_ms, 2.0 * model_bytes / best / 1e9,
                  100.0 * 2.0 * model_bytes / best / 1e9 / d2d_gbps,
                  static_cast<unsigned long long>(er.chunks),
                  static_cast<unsigned long long>(er.cpu_chunks),
                  static_cast<unsigned long long>(er.groups),
                  static_cast<unsigned long long>(same), d.spans.size(),
                  static_cast<double>(er.peak_device_bytes) / (1 << 20));
      std::printf("    per-group steps, ms summed over groups: cpu fallback %.1f, compact +"
                  " histograms %.1f, models (CPU) %.1f, encode lanes %.1f, gather + copy"
                  " back %.1f, framing (CPU, overlapped) %.1f\n",
                  er.cpu_fallback_ms, er.compact_ms, er.models_ms, er.encode_ms,
                  er.gather_ms, er.frame_ms);
      std::printf("    GPU kernel time, ms summed: detect + range hashes %.1f, compact %.1f,"
                  " histograms %.1f, encode lanes %.1f, gather %.1f\n",
                  er.detect_ms, er.gpu_compact_ms, er.gpu_hist_ms, er.gpu_encode_ms,
                  er.gpu_gather_ms);
        return true;
  };
  if (encode_only) {
    for (double rate : rates) {
      Delta d = Encode(tile, tensors, per_tensor, rate, threads, records_per_lane,
                       normal_weights, conditional, model);
      if (!encode_gpu(d, rate)) return 1;
      CK(cudaMemcpy(model, base_copy, model_bytes, cudaMemcpyDeviceToDevice));
      CK(cudaFreeHost(d.pinned));
    }
    return 0;
  }
  std::printf("\n| change | chunks | records | payload MB | batches | prepare ms (CPU) |"
              " before-check ms | pause (payload in HBM) ms | its GPU span ms |"
              " pause +verify (in HBM) ms | e2e apply ms | e2e +verify ms |"
              " H2D payload ms | e2e / H2D | CPU decode ms | extra device MiB |\n");
  for (double rate : rates) {
    const double t0 = Now();
    Delta d = Encode(tile, tensors, per_tensor, rate, threads, records_per_lane,
                     normal_weights, conditional);
    const double enc_s = Now() - t0;
    std::span<const uint8_t> payload(d.pinned, d.bytes);
    // The same bytes already in device memory (the pause without the copy).
    uint8_t* dpay;
    CK(cudaMalloc(&dpay, d.bytes));
    CK(cudaMemcpy(dpay, d.pinned, d.bytes, cudaMemcpyHostToDevice));
    std::span<const uint8_t> dpayload(dpay, d.bytes);
    ReceiverOptions vo, no;
    vo.verify = true;
    no.verify = false;
    auto rv = Receiver::Create(plan, names, vo);
    auto rn = Receiver::Create(plan, names, no);
    if (!rv.ok() || !rn.ok()) return 1;
    double p0 = Now();
    auto pv = (*rv)->Prepare(payload, d.spans);
    const double prep_ms = (Now() - p0) * 1e3;
    auto pn = (*rn)->Prepare(payload, d.spans);
    if (!pv.ok() || !pn.ok()) {
      std::fprintf(stderr, "prepare: %s\n", pv.status().ToString().c_str());
      return 1;
    }
    p0 = Now();
    auto states = (*rv)->Classify(payload, *pv);
    const double classify_ms = (Now() - p0) * 1e3;
    if (!states.ok()) return 1;
    for (uint8_t st : *states) {
      if (st != 0) {
        std::fprintf(stderr, "classify: a range is not at 'before'\n");
        return 1;
      }
    }
    // base -> after (verified), then toggled back and forth without.
    auto r1 = (*rv)->Apply(payload, *pv, &*states);
    if (!r1.ok()) {
      std::fprintf(stderr, "apply: %s\n", r1.status().ToString().c_str());
      return 1;
    }
    if (conditional) {
      std::printf("  (%llu of %zu chunks conditional XOR; the GPU encoder does not write"
                  " kind 5: its timing is skipped)\n",
                  static_cast<unsigned long long>(d.conditional), d.spans.size());
    } else if (!encode_gpu(d, rate)) {
      return 1;
    }
    // With --normal-weights every apply starts from the base's device copy.
    // A device-to-device cudaMemcpy may return before the copy ends, and
    // the receiver's streams do not wait for it: the copy must be over
    // before the timed apply starts, or the two share the memory bandwidth.
    auto restore = [&] {
      if (normal_weights) {
        CK(cudaMemcpy(model, base_copy, model_bytes, cudaMemcpyDeviceToDevice));
        CK(cudaDeviceSynchronize());
      }
    };
    auto best_of = [&](std::span<const uint8_t> pay, int reps) {
      GpuApplyReport best;
      best.seconds = 1e9;
      for (int rep = 0; rep < reps; ++rep) {
        restore();
        auto r = (*rn)->Apply(pay, *pn);
        if (!r.ok()) {
          std::fprintf(stderr, "apply: %s\n", r.status().ToString().c_str());
          std::exit(1);
        }
        if (r->seconds < best.seconds) best = *r;
      }
      return best;
    };
    const GpuApplyReport best_n = best_of(payload, 6);  // even: still "after"
    const GpuApplyReport best_d = best_of(dpayload, 6);
    // The product path (DeviceTarget staging in device memory): Stage and
    // MapConditional before the pause (kind-5 chunks decoded against the
    // base into XOR records), then the pause applies the staged delta.
    restore();  // the base, which the mapping decodes against
    p0 = Now();
    auto staged = (*rn)->Stage(dpayload, *pn);
    const double stage_ms = (Now() - p0) * 1e3;
    if (!staged.ok()) {
      std::fprintf(stderr, "stage: %s\n", staged.status().ToString().c_str());
      return 1;
    }
    p0 = Now();
    if (Status ms = (*rn)->MapConditional(**staged, *pn); !ms.ok()) {
      std::fprintf(stderr, "map: %s\n", ms.ToString().c_str());
      return 1;
    }
    const double map_ms = (Now() - p0) * 1e3;
    GpuApplyReport best_s;
    best_s.seconds = 1e9;
    for (int rep = 0; rep < 6; ++rep) {  // even: as it was
      restore();
      auto r = (*rn)->Apply(**staged, *pn);
      if (!r.ok()) {
        std::fprintf(stderr, "staged apply: %s\n", r.status().ToString().c_str());
        return 1;
      }
      if (r->seconds < best_s.seconds) best_s = *r;
    }
    staged->reset();
    // Verified applies from the base again: from host memory, then from
    // device memory.
    auto verified = [&](std::span<const uint8_t> pay) {
      if (normal_weights) {
        restore();
      } else if (!(*rn)->Apply(payload, *pn).ok()) {
        std::exit(1);  // back to base
      }
      auto r = (*rv)->Apply(pay, *pv);
      if (!r.ok()) {
        std::fprintf(stderr, "verified apply: %s\n", r.status().ToString().c_str());
        std::exit(1);
      }
      return *r;
    };
    const GpuApplyReport r2 = verified(payload);
    const GpuApplyReport bv = r2.seconds < r1->seconds ? r2 : *r1;
    const GpuApplyReport dv = verified(dpayload);
    // Back to the base for the next rate.
    if (normal_weights) {
      restore();
    } else if (!(*rn)->Apply(payload, *pn).ok()) {
      return 1;
    }
    const float floor_ms = scatter_floor(rate, false);
    const float floor_rmw_ms = scatter_floor(rate, true);
    // Baselines: plain H2D of the payload; CPU decode of every chunk.
    const float h2d_ms = TimeMs(s, [&] { CK(cudaMemcpyAsync(dpay, d.pinned, d.bytes, cudaMemcpyHostToDevice, s)); }, 5);
    CK(cudaFree(dpay));
    p0 = Now();
    ParallelForEach(d.spans.size(), threads, [&](size_t i, int) {
      auto pc = ParseChunk(payload.subspan(d.spans[i].offset, d.spans[i].size));
      // Decoded given the base: not timed here.
      if (pc->header.kind == codec::ChunkKind::kConditionalXor) return;
      std::vector<uint32_t> pos(pc->header.changed);
      std::vector<uint8_t> val(pc->header.changed * 2);
      (void)codec::DecodeSparse(pc->payload, pc->header.kind,
                                static_cast<uint32_t>(pc->header.count), 2,
                                static_cast<uint32_t>(pc->header.changed),
                                pos.data(), val.data());
    });
    const double cpu_ms = (Now() - p0) * 1e3;
    std::printf("| %.1f%% | %zu | %llu | %.1f | %llu | %.1f | %.2f | %.2f | %.2f | %.2f |"
                " %.2f | %.2f | %.2f | %.2f | %.1f (+%.0f model H2D) | %.0f |\n",
                rate * 100, d.spans.size(), static_cast<unsigned long long>(d.records),
                d.bytes / 1e6, static_cast<unsigned long long>(best_n.batches),
                prep_ms, classify_ms, best_d.seconds * 1e3, best_d.kernel_ms,
                dv.seconds * 1e3, best_n.seconds * 1e3, bv.seconds * 1e3, h2d_ms,
                best_n.seconds * 1e3 / h2d_ms, cpu_ms, model_bytes / h2d_gbps / 1e6,
                static_cast<double>(bv.device_bytes) / (1 << 20));
    std::printf("  (CPU encode %.1f s on %d threads; e2e GPU span %.2f ms; kernels summed"
                " over batches %.2f ms (in HBM), verify kernels summed %.2f ms;"
                " e2e +verify / H2D %.2f)\n",
                enc_s, threads, best_n.kernel_ms, best_d.decode_ms, dv.verify_ms,
                bv.seconds * 1e3 / h2d_ms);
    std::printf("  staged in HBM (the product path): before the pause, stage %.2f ms and map"
                " kind 5 %.2f ms; the pause %.2f ms, its GPU span %.2f ms\n",
                stage_ms, map_ms, best_s.seconds * 1e3, best_s.kernel_ms);
    std::printf("  scatter floor (every changed element XORed in place, no decode, no"
                " payload): RED.XOR %.2f ms = %.2f x H2D of the payload; 16-bit load +"
                " store %.2f ms = %.2f x\n",
                floor_ms, floor_ms / h2d_ms, floor_rmw_ms, floor_rmw_ms / h2d_ms);
    CK(cudaFreeHost(d.pinned));
  }
  size_t free1, total1;
  CK(cudaMemGetInfo(&free1, &total1));
  std::printf("device memory in use beyond the model and base copy at the end: %.0f MiB\n",
              (static_cast<double>(free0) - free1) / (1 << 20));
  return 0;
}

}  // namespace
}  // namespace refit::cuda

int main(int argc, char** argv) { return refit::cuda::Main(argc, argv); }
