#include "cuda/device_rank_encoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/pipeline.h"
#include "cuda/placement.h"
#include "delta/apply.h"
#include "delta/chunk.h"

namespace refit::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using internal::MsSince;

using internal::CudaStatus;

constexpr uint64_t kAlign = 256;  // each job's region on a 256-byte boundary
constexpr uint64_t kRangeBytes = 64
                                 << 10;  // the GPU encoder's chunk_bytes unit

struct Pending {
  uint32_t job = 0;
  std::vector<uint8_t> canonical;  // the chunk with the job's region header
};

}  // namespace

struct DeviceRankEncoder::Impl {
  trainer::RankEncoderOptions opt;
  DeviceRankEncoderOptions dev;
  uint32_t rank = 0;
  std::unique_ptr<trainer::RankEncoder> plan;  // plan-only
  std::vector<trainer::RankJob> jobs;
  std::vector<uint64_t> offset;  // per job, bytes into memory
  uint64_t bytes = 0;
  uint64_t gpu_chunk_bytes = kRangeBytes;
  uint8_t* memory = nullptr;
  std::unique_ptr<Receiver> committer;  // built at the first Commit
  std::vector<Pending> pending;
  bool have_baseline = false;
  DeviceRankStats stats;

  ~Impl() {
    committer.reset();
    if (memory != nullptr) cudaFree(memory);
  }
  Status SetDevice() const {
    return CudaStatus(cudaSetDevice(dev.device),
                      "set device " + std::to_string(dev.device));
  }
  const std::string& CanonName(const trainer::RankJob& j) const {
    return plan->canonical_tensors()[j.tensor_id].name;
  }
  // The local tensors' data by local index (null where no job reads one).
  Status LocalData(const std::vector<TensorView>& views, bool device_only,
                   std::vector<const uint8_t*>* data) const;
};

DeviceRankEncoder::DeviceRankEncoder(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
DeviceRankEncoder::~DeviceRankEncoder() = default;

Result<std::unique_ptr<DeviceRankEncoder>> DeviceRankEncoder::Create(
    const layout::Layout& layout, uint32_t rank,
    const trainer::RankEncoderOptions& options,
    const DeviceRankEncoderOptions& device_options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->dev = device_options;
  impl->rank = rank;
  trainer::RankEncoderOptions plan_options = options;
  plan_options.plan_only = true;
  REFIT_ASSIGN_OR_RETURN(
      impl->plan, trainer::RankEncoder::Create(layout, rank, plan_options));
  impl->jobs = impl->plan->jobs();
  uint64_t largest = 0;
  for (const trainer::RankJob& j : impl->jobs) {
    if (!j.in_place) {
      return UnimplementedError(
          "rank " + std::to_string(rank) +
          ": an owned piece of canonical tensor '" + impl->CanonName(j) +
          "' is converted (another local dtype, or FP8 scales the rank "
          "computes) or stored transposed; the GPU rank encoder takes only "
          "pieces whose local bits are the checkpoint's, in canonical order: "
          "encode this rank on the CPU (RankEncoder) instead");
    }
    impl->offset.push_back(impl->bytes);
    const uint64_t b = j.count * static_cast<uint64_t>(j.width);
    impl->bytes += (b + kAlign - 1) / kAlign * kAlign;
    largest = std::max(largest, b);
  }
  // Each job one range of the GPU encoder: its region, whole.
  impl->gpu_chunk_bytes =
      std::max<uint64_t>((largest + kRangeBytes - 1) / kRangeBytes, 1) *
      kRangeBytes;
  REFIT_RETURN_IF_ERROR(impl->SetDevice());
  if (impl->bytes > 0) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, impl->bytes);
    if (e != cudaSuccess) {
      return ResourceExhaustedError(
          "cannot allocate rank " + std::to_string(rank) + "'s baseline (" +
          std::to_string(impl->bytes) +
          " bytes of device memory): " + cudaGetErrorString(e));
    }
    impl->memory = static_cast<uint8_t*>(p);
  }
  return std::unique_ptr<DeviceRankEncoder>(
      new DeviceRankEncoder(std::move(impl)));
}

const std::vector<layout::CanonicalTensor>&
DeviceRankEncoder::canonical_tensors() const {
  return impl_->plan->canonical_tensors();
}
uint64_t DeviceRankEncoder::owned_bytes() const {
  return impl_->plan->owned_bytes();
}
const DeviceRankStats& DeviceRankEncoder::stats() const { return impl_->stats; }
uint64_t DeviceRankEncoder::device_bytes() const { return impl_->bytes; }

Status DeviceRankEncoder::Impl::LocalData(
    const std::vector<TensorView>& views, bool device_only,
    std::vector<const uint8_t*>* data) const {
  REFIT_ASSIGN_OR_RETURN(*data, plan->LocalData(views));
  if (!device_only) return Status();
  for (size_t i = 0; i < data->size(); ++i) {
    if ((*data)[i] == nullptr) continue;
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, (*data)[i]);
    if (e != cudaSuccess || a.type != cudaMemoryTypeDevice ||
        a.device != dev.device) {
      cudaGetLastError();  // clear a sticky "invalid value" of a host pointer
      return InvalidArgumentError(
          "local tensor '" + plan->local_tensors()[i].name +
          "' is not in the memory of CUDA device " +
          std::to_string(dev.device) + ", where the rank's baseline is");
    }
  }
  return Status();
}

Status DeviceRankEncoder::SetBaseline(
    const std::vector<TensorView>& canonical) {
  Impl& m = *impl_;
  REFIT_RETURN_IF_ERROR(m.SetDevice());
  std::map<std::string, const TensorView*> by_name;
  for (const TensorView& v : canonical) by_name[v.name] = &v;
  m.have_baseline = false;
  m.pending.clear();
  for (size_t k = 0; k < m.jobs.size(); ++k) {
    const trainer::RankJob& j = m.jobs[k];
    const layout::CanonicalTensor& ct =
        m.plan->canonical_tensors()[j.tensor_id];
    auto it = by_name.find(ct.name);
    if (it == by_name.end()) {
      return InvalidArgumentError("the canonical baseline has no tensor '" +
                                  ct.name + "'");
    }
    const TensorView& v = *it->second;
    if (v.dtype != ct.dtype || v.shape != ct.shape || v.data == nullptr) {
      return InvalidArgumentError(
          "canonical tensor '" + ct.name +
          "' has a different dtype or shape than the layout says");
    }
    const uint64_t w = static_cast<uint64_t>(j.width);
    const uint8_t* src = v.data + j.start * w;
    uint8_t* dst = m.memory + m.offset[k];
    if (j.run == 0) {
      REFIT_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpy(dst, src, j.count * w, cudaMemcpyDefault),
                     "copy of the baseline of '" + ct.name + "'"));
    } else {
      REFIT_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpy2D(dst, j.run * w, src, j.stride * w, j.run * w,
                                  j.count / j.run, cudaMemcpyDefault),
                     "copy of the baseline of '" + ct.name + "'"));
    }
  }
  m.have_baseline = true;
  return Status();
}

Status DeviceRankEncoder::SetBaselineFromLocal(
    const std::vector<TensorView>& local) {
  Impl& m = *impl_;
  REFIT_RETURN_IF_ERROR(m.SetDevice());
  std::vector<const uint8_t*> data;
  REFIT_RETURN_IF_ERROR(m.LocalData(local, /*device_only=*/false, &data));
  m.have_baseline = false;
  m.pending.clear();
  for (size_t k = 0; k < m.jobs.size(); ++k) {
    const trainer::RankJob& j = m.jobs[k];
    const uint64_t w = static_cast<uint64_t>(j.width);
    REFIT_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(m.memory + m.offset[k], data[j.local] + j.local_element * w,
                   j.count * w, cudaMemcpyDefault),
        "copy of the baseline of '" + m.CanonName(j) + "'"));
  }
  m.have_baseline = true;
  return Status();
}

Result<trainer::RankReport> DeviceRankEncoder::Encode(
    uint64_t version, uint64_t base_version,
    const std::vector<TensorView>& local, const trainer::EmitChunkFn& emit,
    const trainer::GlobalAmax& /*amax*/) {
  Impl& m = *impl_;
  if (!m.have_baseline) {
    return FailedPreconditionError(
        "the rank encoder has no baseline (SetBaseline first)");
  }
  const auto t0 = Clock::now();
  REFIT_RETURN_IF_ERROR(m.SetDevice());
  std::vector<const uint8_t*> data;
  REFIT_RETURN_IF_ERROR(m.LocalData(local, /*device_only=*/true, &data));
  m.pending.clear();
  trainer::RankReport report;
  report.owned_bytes = m.plan->owned_bytes();
  std::vector<DeviceTensorPair> pairs(m.jobs.size());
  for (size_t k = 0; k < m.jobs.size(); ++k) {
    const trainer::RankJob& j = m.jobs[k];
    pairs[k].old_data = m.memory + m.offset[k];
    pairs[k].new_data =
        data[j.local] + j.local_element * static_cast<uint64_t>(j.width);
    pairs[k].elements = j.count;
    pairs[k].width = j.width;
    pairs[k].tensor_id = k;
    report.owned_elements += j.count;
  }
  GpuEncodeOptions eo = m.dev.encode;
  eo.version = version;
  eo.base_version = base_version;
  eo.chunk_bytes = m.gpu_chunk_bytes;
  eo.records_per_lane = m.opt.codec.records_per_lane;
  eo.host_threads = m.opt.threads;
  eo.device = m.dev.device;
  auto encoded = EncodeOnDevice(
      pairs, eo,
      [&](const GpuChunkInfo& info, std::span<const uint8_t> bytes) -> Status {
        const trainer::RankJob& j = m.jobs.at(info.pair);
        REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(bytes));
        if (c.header.start != 0 || c.header.count != j.count) {
          return InternalError("the GPU encoder cut the region of '" +
                               m.CanonName(j) + "' into more than one chunk");
        }
        ChunkHeader h = c.header;
        h.tensor_id = j.tensor_id;
        h.start = j.start;
        h.run = j.run;
        h.stride = j.stride;
        Pending p;
        p.job = info.pair;
        SerializeChunk(h, c.payload, &p.canonical);
        report.changed_direct += h.changed;
        ++report.chunks;
        report.payload_bytes += p.canonical.size();
        REFIT_RETURN_IF_ERROR(emit(p.canonical, h));
        m.pending.push_back(std::move(p));
        return Status();
      });
  if (!encoded.ok()) {
    m.pending.clear();
    return encoded.status();
  }
  m.stats.last_encode = *encoded;
  for (const Pending& p : m.pending) {
    report.peak_scratch_bytes += p.canonical.capacity();
  }
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  m.stats.last_encode_ms = report.seconds * 1000;
  return report;
}

Status DeviceRankEncoder::Commit() {
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  if (m.pending.empty()) return Status();
  REFIT_RETURN_IF_ERROR(m.SetDevice());
  if (!m.committer) {
    // Each job's region is a tensor of its own, [count, 1], where it lies.
    PlacementPlan plan;
    std::vector<std::string> names;
    for (size_t k = 0; k < m.jobs.size(); ++k) {
      names.push_back(std::to_string(k));
      REFIT_RETURN_IF_ERROR(plan.Add(
          WholePlacement(names.back(), m.jobs[k].width, m.jobs[k].count, 1,
                         reinterpret_cast<uint64_t>(m.memory + m.offset[k]))));
    }
    ReceiverOptions ro;
    ro.staging_bytes = m.dev.commit_staging_bytes;
    ro.verify = true;
    ro.host_threads = m.opt.threads;
    ro.device = m.dev.device;
    REFIT_ASSIGN_OR_RETURN(
        m.committer, Receiver::Create(std::move(plan), std::move(names), ro));
  }
  std::vector<uint8_t> payload;
  std::vector<ChunkSpan> spans;
  for (const Pending& p : m.pending) {
    // Back to the encoder's own form: the job's region as a tensor of its
    // own, one contiguous range (the committer's plan).
    REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(p.canonical));
    c.header.tensor_id = p.job;
    c.header.start = 0;
    c.header.run = 0;
    c.header.stride = 0;
    const uint64_t begin = payload.size();
    SerializeChunk(c.header, c.payload, &payload);
    spans.push_back({begin, payload.size() - begin});
  }
  auto prepared = m.committer->Prepare(payload, spans);
  Result<GpuApplyReport> applied = prepared.ok()
                                       ? m.committer->Apply(payload, *prepared)
                                       : prepared.status();
  m.pending.clear();
  if (!applied.ok()) {
    // Some regions may have advanced and others not.
    m.have_baseline = false;
    return DataLossError(
        "advancing rank " + std::to_string(m.rank) +
        "'s baseline in device memory failed (" + applied.status().ToString() +
        "); it holds no committed version until it is set again");
  }
  m.stats.last_commit_ms = MsSince(t0);
  return Status();
}

void DeviceRankEncoder::Abort() { impl_->pending.clear(); }

size_t DeviceRankEncoder::pending_chunks() const {
  return impl_->pending.size();
}

Result<std::span<const uint8_t>> DeviceRankEncoder::PendingChunk(
    size_t index) const {
  if (index >= impl_->pending.size()) {
    return trainer::PendingChunkOutOfRange(index, impl_->pending.size());
  }
  return std::span<const uint8_t>(impl_->pending[index].canonical);
}

Result<std::vector<uint8_t>> DeviceRankEncoder::PendingRegion(
    size_t index, bool after) const {
  const Impl& m = *impl_;
  REFIT_RETURN_IF_ERROR(PendingChunk(index).status());
  const Pending& p = m.pending[index];
  const trainer::RankJob& j = m.jobs[p.job];
  REFIT_RETURN_IF_ERROR(m.SetDevice());
  std::vector<uint8_t> out(j.count * static_cast<uint64_t>(j.width));
  REFIT_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(out.data(), m.memory + m.offset[p.job], out.size(),
                            cudaMemcpyDeviceToHost),
                 "copy of a pending region to the host"));
  if (after) {
    ApplyScratch scratch;
    REFIT_RETURN_IF_ERROR(
        trainer::ApplyToGatheredRegion(p.canonical, out.data(), &scratch)
            .WithContext("the region of a pending chunk at its version"));
  }
  return out;
}

}  // namespace refit::cuda
