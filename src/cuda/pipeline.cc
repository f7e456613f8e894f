#include "cuda/pipeline.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "base/hash.h"
#include "cuda/kernels.h"

namespace refit::cuda {
namespace {

Status CudaError(cudaError_t e, const char* what) {
  return InternalError(std::string("CUDA ") + what + ": " +
                       cudaGetErrorString(e));
}

#define REFIT_CUDA_RETURN(expr, what)                 \
  do {                                                \
    const cudaError_t e_ = (expr);                    \
    if (e_ != cudaSuccess) return CudaError(e_, what); \
  } while (0)

// A device allocation that frees itself.
struct DeviceBuffer {
  void* p = nullptr;
  uint64_t size = 0;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  Status Reserve(uint64_t n) {
    if (n <= size) return Status::Ok();
    if (p) cudaFree(p);
    p = nullptr;
    size = 0;
    REFIT_CUDA_RETURN(cudaMalloc(&p, std::max<uint64_t>(n, 16)), "cudaMalloc");
    size = n;
    return Status::Ok();
  }
  uint8_t* bytes() const { return static_cast<uint8_t*>(p); }
};

}  // namespace

struct Receiver::Impl {
  PlacementPlan plan;
  std::vector<std::string> names;
  ReceiverOptions opt;
  cudaStream_t copy = nullptr, compute = nullptr;
  std::array<cudaEvent_t, 2> copied{}, done{};
  DeviceBuffer placements, pieces;
  std::array<DeviceBuffer, 2> payload, meta;
  DeviceBuffer scratch, status, state;
  // Pinned host copies of the two metadata slots, so that their upload is
  // asynchronous like the payload's.
  std::array<uint8_t*, 2> meta_host{};
  uint64_t meta_host_size = 0;

  ~Impl() {
    for (uint8_t* h : meta_host) {
      if (h) cudaFreeHost(h);
    }
    if (copy) cudaStreamDestroy(copy);
    if (compute) cudaStreamDestroy(compute);
    for (int s = 0; s < 2; ++s) {
      if (copied[s]) cudaEventDestroy(copied[s]);
      if (done[s]) cudaEventDestroy(done[s]);
    }
  }

  uint64_t HeldBytes() const {
    return placements.size + pieces.size + payload[0].size + payload[1].size +
           meta[0].size + meta[1].size + scratch.size + status.size +
           state.size;
  }

  Status Reserve(const PreparedDelta& p) {
    for (int s = 0; s < 2; ++s) {
      REFIT_RETURN_IF_ERROR(payload[s].Reserve(p.largest_batch));
      REFIT_RETURN_IF_ERROR(meta[s].Reserve(p.largest_meta));
    }
    REFIT_RETURN_IF_ERROR(scratch.Reserve(p.largest_scratch));
    REFIT_RETURN_IF_ERROR(status.Reserve(4 * uint64_t{p.status_count}));
    if (p.largest_meta > meta_host_size) {
      REFIT_CUDA_RETURN(cudaDeviceSynchronize(), "sync");
      for (uint8_t*& h : meta_host) {
        if (h) cudaFreeHost(h);
        h = nullptr;
      }
      meta_host_size = 0;
      for (uint8_t*& h : meta_host) {
        REFIT_CUDA_RETURN(cudaHostAlloc(reinterpret_cast<void**>(&h),
                                        p.largest_meta, cudaHostAllocDefault),
                          "cudaHostAlloc");
      }
      meta_host_size = p.largest_meta;
    }
    return Status::Ok();
  }

  // Enqueues batch b's upload into slot s on the copy stream.
  Status Upload(std::span<const uint8_t> buf, const HostBatch& hb, int s,
                std::vector<uint8_t>* meta_tmp) {
    // The pinned slot is free once its previous upload has completed.
    REFIT_CUDA_RETURN(cudaEventSynchronize(copied[s]), "sync");
    REFIT_CUDA_RETURN(cudaStreamWaitEvent(copy, done[s], 0), "wait");
    hb.SerializeMeta(meta_tmp);
    std::memcpy(meta_host[s], meta_tmp->data(), meta_tmp->size());
    REFIT_CUDA_RETURN(cudaMemcpyAsync(meta[s].p, meta_host[s], meta_tmp->size(),
                                      cudaMemcpyHostToDevice, copy),
                      "copy metadata");
    REFIT_CUDA_RETURN(
        cudaMemcpyAsync(payload[s].p, buf.data() + hb.payload_begin,
                        hb.payload_end - hb.payload_begin,
                        cudaMemcpyHostToDevice, copy),
        "copy payload");
    if (!hb.dense.empty()) {
      REFIT_CUDA_RETURN(
          cudaMemcpyAsync(payload[s].bytes() + hb.dense_offset,
                          hb.dense.data(), hb.dense.size(),
                          cudaMemcpyHostToDevice, copy),
          "copy dense bytes");
    }
    REFIT_CUDA_RETURN(cudaEventRecord(copied[s], copy), "record");
    return Status::Ok();
  }

  internal::BatchDevice Device(const HostBatch& hb, int s) const {
    uint64_t t, l;
    hb.MetaOffsets(&t, &l);
    internal::BatchDevice d;
    d.chunks = reinterpret_cast<const DevChunk*>(meta[s].bytes());
    d.num_chunks = static_cast<uint32_t>(hb.chunks.size());
    d.tables = reinterpret_cast<const DevTable*>(meta[s].bytes() + t);
    d.lanes = reinterpret_cast<const uint32_t*>(meta[s].bytes() + l);
    d.payload = payload[s].bytes();
    d.scratch = scratch.bytes();
    d.placements = static_cast<const DevicePlacement*>(placements.p);
    d.pieces = static_cast<const DevicePiece*>(pieces.p);
    d.status = static_cast<uint32_t*>(status.p);
    d.smem = hb.smem;
    d.fused_threads = (hb.max_fused_lanes + 31) / 32 * 32;
    return d;
  }
};

Receiver::Receiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Receiver::~Receiver() = default;

Result<std::unique_ptr<Receiver>> Receiver::Create(
    PlacementPlan plan, std::vector<std::string> tensor_names,
    const ReceiverOptions& options) {
  if (options.staging_bytes < (uint64_t{4} << 20)) {
    return InvalidArgumentError("staging_bytes must be at least 4 MiB");
  }
  auto impl = std::make_unique<Impl>();
  impl->plan = std::move(plan);
  impl->names = std::move(tensor_names);
  impl->opt = options;
  REFIT_CUDA_RETURN(cudaSetDevice(options.device), "cudaSetDevice");
  REFIT_CUDA_RETURN(cudaStreamCreateWithFlags(&impl->copy, cudaStreamNonBlocking),
                    "stream");
  REFIT_CUDA_RETURN(
      cudaStreamCreateWithFlags(&impl->compute, cudaStreamNonBlocking), "stream");
  for (int s = 0; s < 2; ++s) {
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&impl->copied[s],
                                               cudaEventDisableTiming),
                      "event");
    REFIT_CUDA_RETURN(
        cudaEventCreateWithFlags(&impl->done[s], cudaEventDisableTiming), "event");
  }
  std::vector<DevicePlacement> dp;
  std::vector<DevicePiece> pieces;
  impl->plan.Flatten(&dp, &pieces);
  REFIT_RETURN_IF_ERROR(impl->placements.Reserve(dp.size() * sizeof(dp[0])));
  REFIT_RETURN_IF_ERROR(impl->pieces.Reserve(pieces.size() * sizeof(pieces[0])));
  REFIT_CUDA_RETURN(cudaMemcpy(impl->placements.p, dp.data(),
                               dp.size() * sizeof(dp[0]), cudaMemcpyHostToDevice),
                    "copy plan");
  REFIT_CUDA_RETURN(cudaMemcpy(impl->pieces.p, pieces.data(),
                               pieces.size() * sizeof(pieces[0]),
                               cudaMemcpyHostToDevice),
                    "copy plan");
  return std::unique_ptr<Receiver>(new Receiver(std::move(impl)));
}

Result<PreparedDelta> Receiver::Prepare(std::span<const uint8_t> payload,
                                        std::span<const ChunkSpan> chunks) {
  // Budget: two metadata slots of 1/16 each; the rest is split between the
  // two payload slots and the scratch area (decoded records of overwrite
  // chunks, undo bytes, digests) in proportion to the delta's needs
  // (PrepareOptions::staging_total). Sparse XOR chunks need no scratch
  // beyond their digests, so a typical delta gets large payload slots and
  // few batches.
  PrepareOptions po;
  po.staging_total = impl_->opt.staging_bytes;
  po.verify = impl_->opt.verify;
  po.threads = impl_->opt.host_threads;
  auto prepared = PrepareBatches(payload, chunks, impl_->names, impl_->plan, po);
  if (prepared.ok() && prepared->largest_smem > internal::kMaxDecodeSmem) {
    return ResourceExhaustedError("chunk tables need more shared memory than "
                                  "the decoder allows");
  }
  return prepared;
}

Result<std::vector<uint8_t>> Receiver::Classify(
    std::span<const uint8_t> payload, const PreparedDelta& p) {
  Impl& m = *impl_;
  REFIT_RETURN_IF_ERROR(m.Reserve(p));
  REFIT_RETURN_IF_ERROR(m.state.Reserve(std::max<uint64_t>(p.status_count, 1)));
  REFIT_CUDA_RETURN(cudaMemsetAsync(m.status.p, 0, 4 * uint64_t{p.status_count},
                                    m.compute),
                    "memset");
  REFIT_CUDA_RETURN(cudaStreamSynchronize(m.compute), "sync");
  std::vector<uint8_t> meta_host;
  for (size_t b = 0; b < p.batches.size(); ++b) {
    const int s = static_cast<int>(b % 2);
    REFIT_RETURN_IF_ERROR(m.Upload(payload, p.batches[b], s, &meta_host));
    REFIT_CUDA_RETURN(cudaStreamWaitEvent(m.compute, m.copied[s], 0), "wait");
    REFIT_CUDA_RETURN(internal::LaunchClassify(m.Device(p.batches[b], s),
                                               m.state.bytes(), m.compute),
                      "classify");
    REFIT_CUDA_RETURN(cudaEventRecord(m.done[s], m.compute), "record");
  }
  std::vector<uint8_t> out(p.status_count);
  REFIT_CUDA_RETURN(cudaMemcpyAsync(out.data(), m.state.p, out.size(),
                                    cudaMemcpyDeviceToHost, m.compute),
                    "copy states");
  REFIT_CUDA_RETURN(cudaStreamSynchronize(m.compute), "sync");
  return out;
}

Result<GpuApplyReport> Receiver::Apply(std::span<const uint8_t> payload,
                                       const PreparedDelta& p,
                                       const std::vector<uint8_t>* states) {
  Impl& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  GpuApplyReport report;
  report.chunks = p.status_count;
  report.chunks_not_here = p.chunks_not_here;
  report.batches = p.batches.size();
  std::vector<uint32_t> initial(p.status_count, kStatusOk);
  if (states) {
    if (states->size() != p.status_count) {
      return InvalidArgumentError("states do not belong to this preparation");
    }
    for (uint32_t i = 0; i < p.status_count; ++i) {
      const uint8_t st = (*states)[i];
      if (st == 2) {
        return FailedPreconditionError(
            "chunk " + std::to_string(p.chunk_of_status[i]) +
            " range hashes to neither its \"before\" nor its \"after\"; this "
            "GPU does not hold the delta's base; nothing was written");
      }
      if (st == 1) {
        initial[i] = kStatusSkipped;
        ++report.chunks_skipped;
      }
    }
  }
  REFIT_RETURN_IF_ERROR(m.Reserve(p));
  report.device_bytes = m.HeldBytes();
  REFIT_CUDA_RETURN(cudaMemcpyAsync(m.status.p, initial.data(), 4 * initial.size(),
                                    cudaMemcpyHostToDevice, m.compute),
                    "copy status");
  std::vector<cudaEvent_t> marks;
  auto mark = [&]() -> Status {
    cudaEvent_t e;
    REFIT_CUDA_RETURN(cudaEventCreate(&e), "event");
    marks.push_back(e);
    REFIT_CUDA_RETURN(cudaEventRecord(e, m.compute), "record");
    return Status::Ok();
  };
  Status st;
  std::vector<uint8_t> meta_host;
  for (size_t b = 0; b < p.batches.size() && st.ok(); ++b) {
    const HostBatch& hb = p.batches[b];
    const int s = static_cast<int>(b % 2);
    st = m.Upload(payload, hb, s, &meta_host);
    if (!st.ok()) break;
    report.payload_bytes += hb.device_bytes();
    report.records += hb.records;
    const cudaError_t e = cudaStreamWaitEvent(m.compute, m.copied[s], 0);
    if (e != cudaSuccess) {
      st = CudaError(e, "wait");
      break;
    }
    const internal::BatchDevice d = m.Device(hb, s);
    st = mark();
    if (!st.ok()) break;
    if (cudaError_t k = internal::LaunchDecode(d, m.compute); k != cudaSuccess) {
      st = CudaError(k, "decode launch");
      break;
    }
    st = mark();
    if (!st.ok()) break;
    if (cudaError_t k = internal::LaunchApply(d, m.compute); k != cudaSuccess) {
      st = CudaError(k, "apply launch");
      break;
    }
    st = mark();
    if (!st.ok()) break;
    if (m.opt.verify) {
      if (cudaError_t k = internal::LaunchVerifyAfter(d, m.compute);
          k != cudaSuccess) {
        st = CudaError(k, "verify launch");
        break;
      }
    }
    st = mark();
    if (!st.ok()) break;
    if (cudaError_t k = cudaEventRecord(m.done[s], m.compute); k != cudaSuccess) {
      st = CudaError(k, "record");
    }
  }
  last_status_.assign(p.status_count, 0);
  const cudaError_t ce = cudaMemcpyAsync(last_status_.data(), m.status.p,
                                         4 * last_status_.size(),
                                         cudaMemcpyDeviceToHost, m.compute);
  const cudaError_t se = cudaStreamSynchronize(m.compute);
  for (size_t i = 0; i + 3 < marks.size(); i += 4) {
    float dec = 0, a = 0, v = 0;
    cudaEventElapsedTime(&dec, marks[i], marks[i + 1]);
    cudaEventElapsedTime(&a, marks[i + 1], marks[i + 2]);
    cudaEventElapsedTime(&v, marks[i + 2], marks[i + 3]);
    report.decode_ms += dec;
    report.kernel_ms += dec + a;
    report.verify_ms += v;
  }
  for (cudaEvent_t e : marks) cudaEventDestroy(e);
  REFIT_RETURN_IF_ERROR(st);
  REFIT_CUDA_RETURN(ce, "copy status");
  REFIT_CUDA_RETURN(se, "apply");
  report.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - t0).count();
  Status first;
  for (uint32_t i = 0; i < p.status_count; ++i) {
    const uint32_t code = last_status_[i];
    if (code == kStatusOk) {
      ++report.chunks_applied;
    } else if (code != kStatusSkipped && first.ok()) {
      first = DataLossError("chunk " + std::to_string(p.chunk_of_status[i]) +
                            " was refused on the GPU: " +
                            ChunkStatusName(code) +
                            "; its range is unchanged");
    }
  }
  REFIT_RETURN_IF_ERROR(first);
  return report;
}

Result<Hash128> RangeHashDevice(const void* data, uint64_t len) {
  const uint64_t segments =
      len == 0 ? 1 : (len + kRangeHashSegment - 1) / kRangeHashSegment;
  DeviceBuffer dig, out;
  REFIT_RETURN_IF_ERROR(dig.Reserve(16 * segments));
  REFIT_RETURN_IF_ERROR(out.Reserve(16));
  REFIT_CUDA_RETURN(internal::LaunchRangeHash(static_cast<const uint8_t*>(data),
                                              len, dig.bytes(),
                                              static_cast<uint64_t*>(out.p), 0),
                    "range hash");
  uint64_t h[2];
  REFIT_CUDA_RETURN(cudaMemcpy(h, out.p, 16, cudaMemcpyDeviceToHost), "copy");
  return Hash128{h[0], h[1]};
}

Result<std::vector<Hash128>> HashSpansDevice(const void* data,
                                             std::span<const uint64_t> offsets,
                                             std::span<const uint64_t> lens) {
  if (offsets.size() != lens.size()) {
    return InvalidArgumentError("offsets and lens differ in length");
  }
  const uint64_t n = offsets.size();
  DeviceBuffer off, len, out;
  REFIT_RETURN_IF_ERROR(off.Reserve(8 * n));
  REFIT_RETURN_IF_ERROR(len.Reserve(8 * n));
  REFIT_RETURN_IF_ERROR(out.Reserve(16 * n));
  REFIT_CUDA_RETURN(cudaMemcpy(off.p, offsets.data(), 8 * n,
                               cudaMemcpyHostToDevice), "copy");
  REFIT_CUDA_RETURN(cudaMemcpy(len.p, lens.data(), 8 * n,
                               cudaMemcpyHostToDevice), "copy");
  REFIT_CUDA_RETURN(internal::LaunchHashSpans(
                        static_cast<const uint8_t*>(data),
                        static_cast<const uint64_t*>(off.p),
                        static_cast<const uint64_t*>(len.p),
                        static_cast<uint32_t>(n), static_cast<uint64_t*>(out.p), 0),
                    "hash spans");
  std::vector<uint64_t> h(2 * n);
  REFIT_CUDA_RETURN(cudaMemcpy(h.data(), out.p, 16 * n, cudaMemcpyDeviceToHost),
                    "copy");
  std::vector<Hash128> r(n);
  for (uint64_t i = 0; i < n; ++i) r[i] = Hash128{h[2 * i], h[2 * i + 1]};
  return r;
}

}  // namespace refit::cuda
