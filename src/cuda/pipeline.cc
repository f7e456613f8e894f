#include "cuda/pipeline.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "base/hash.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels.h"

namespace refit::cuda {

using internal::DeviceBuffer;

constexpr int kMaxSlots = 8;  // batches in flight (PrepareOptions::slots)
// Compute streams: a staged delta's batches all run at once, one stream
// each up to this many (then round-robin).
constexpr int kMaxStreams = 16;

namespace {

uint64_t Align256(uint64_t x) { return (x + 255) & ~uint64_t{255}; }

// One batch's device region when staged: payload (with the CPU-decoded and
// GPU-decoded dense bytes after it, and the read-ahead pad), metadata,
// scratch.
uint64_t PayloadRegion(const HostBatch& hb) {
  return Align256(hb.dense_offset + hb.dense.size() + hb.gpu_dense_bytes +
                  internal::kPayloadPad);
}
uint64_t BatchRegion(const HostBatch& hb) {
  return PayloadRegion(hb) + Align256(hb.meta.size()) +
         Align256(hb.scratch_bytes);
}

}  // namespace

struct StagedDelta::Impl {
  DeviceBuffer region;
  std::vector<uint64_t> offsets;  // per batch, into region
  const void* owner = nullptr;    // the Receiver::Impl that staged it
  uint64_t batches = 0;
  // MapConditional ran: the conditional chunks' records are in scratch,
  // and their statuses (the decode's refusals) by status index.
  bool mapped = false;
  std::vector<uint32_t> mapped_status;
};

StagedDelta::StagedDelta(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StagedDelta::~StagedDelta() = default;
uint64_t StagedDelta::bytes() const { return impl_->region.size(); }

struct Receiver::Impl {
  PlacementPlan plan;
  std::vector<std::string> names;
  ReceiverOptions opt;
  // One copy stream; one compute stream per staging slot, so that the
  // kernels of up to kMaxSlots batches run at once and each batch starts as
  // soon as its own bytes are in.
  cudaStream_t copy = nullptr;
  std::array<cudaStream_t, kMaxStreams> compute{};
  std::array<cudaEvent_t, kMaxStreams> copied{}, done{};
  cudaEvent_t begin = nullptr, end = nullptr;
  std::vector<cudaEvent_t> marks;  // per batch: before kernels, before verify, after
  DeviceBuffer placements, pieces;
  // The staging arena (ReceiverOptions::staging_bytes), allocated once;
  // every Apply carves its slots from it.
  DeviceBuffer arena;
  DeviceBuffer status, state;
  uint32_t slots = 0;
  uint64_t slot_payload = 0, slot_meta = 0, slot_scratch = 0;
  // Pinned host copies of the metadata slots, so that their upload is
  // asynchronous like the payload's.
  std::array<uint8_t*, kMaxSlots> meta_host{};
  uint64_t meta_host_size = 0;

  ~Impl() {
    for (uint8_t* h : meta_host) {
      if (h) cudaFreeHost(h);
    }
    if (copy) cudaStreamDestroy(copy);
    for (int s = 0; s < kMaxStreams; ++s) {
      if (compute[s]) cudaStreamDestroy(compute[s]);
      if (copied[s]) cudaEventDestroy(copied[s]);
      if (done[s]) cudaEventDestroy(done[s]);
    }
    if (begin) cudaEventDestroy(begin);
    if (end) cudaEventDestroy(end);
    for (cudaEvent_t e : marks) cudaEventDestroy(e);
  }

  uint64_t HeldBytes() const {
    return placements.size() + pieces.size() + arena.size() + status.size() +
           state.size();
  }

  Status Reserve(const PreparedDelta& p) {
    if (p.slots < 2 || p.slots > kMaxSlots) {
      return InvalidArgumentError("prepared delta has " +
                                  std::to_string(p.slots) + " staging slots");
    }
    slots = p.slots;
    slot_payload = Align256(p.largest_batch + internal::kPayloadPad);
    slot_meta = Align256(p.largest_meta);
    slot_scratch = Align256(p.largest_scratch);
    static_assert(internal::kPayloadPad + 3 * 255 <= kSlotPadding);
    const uint64_t arena_bytes = opt.staging_bytes;
    if (slots * (slot_payload + slot_meta + slot_scratch) > arena_bytes) {
      return ResourceExhaustedError(
          "prepared batches need more than the staging budget of " +
          std::to_string(opt.staging_bytes) + " bytes (prepared by another "
          "receiver?)");
    }
    REFIT_RETURN_IF_ERROR(arena.Reserve(arena_bytes));
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

  uint8_t* SlotPayload(int s) const { return arena.bytes() + s * slot_payload; }
  uint8_t* SlotMeta(int s) const {
    return arena.bytes() + slots * slot_payload + s * slot_meta;
  }
  uint8_t* SlotScratch(int s) const {
    return arena.bytes() + slots * (slot_payload + slot_meta) +
           s * slot_scratch;
  }

  // Enqueues batch b's upload into slot s on the copy stream, once the
  // slot's previous batch is done. `buf` may be host memory (pinned for
  // asynchronous copies) or device memory.
  // The batch's metadata into slot s and, with `payload`, its chunk and
  // dense bytes (Classify reads only the metadata).
  Status Upload(std::span<const uint8_t> buf, const HostBatch& hb, int s, bool payload = true) {
    // The pinned metadata slot is free once its previous upload completed.
    REFIT_CUDA_RETURN(cudaEventSynchronize(copied[s]), "sync");
    REFIT_CUDA_RETURN(cudaStreamWaitEvent(copy, done[s], 0), "wait");
    std::memcpy(meta_host[s], hb.meta.data(), hb.meta.size());
    REFIT_CUDA_RETURN(cudaMemcpyAsync(SlotMeta(s), meta_host[s], hb.meta.size(),
                                      cudaMemcpyHostToDevice, copy),
                      "copy metadata");
    if (!payload) {
      REFIT_CUDA_RETURN(cudaEventRecord(copied[s], copy), "record");
      return Status::Ok();
    }
    REFIT_CUDA_RETURN(
        cudaMemcpyAsync(SlotPayload(s), buf.data() + hb.payload_begin,
                        hb.payload_end - hb.payload_begin, cudaMemcpyDefault,
                        copy),
        "copy payload");
    if (!hb.dense.empty()) {
      REFIT_CUDA_RETURN(
          cudaMemcpyAsync(SlotPayload(s) + hb.dense_offset, hb.dense.data(),
                          hb.dense.size(), cudaMemcpyHostToDevice, copy),
          "copy dense bytes");
    }
    REFIT_CUDA_RETURN(cudaEventRecord(copied[s], copy), "record");
    return Status::Ok();
  }

  internal::BatchDevice Device(const HostBatch& hb, int s) const {
    return Device(hb, SlotPayload(s), SlotMeta(s), SlotScratch(s));
  }
  // Batch b of a staged delta.
  internal::BatchDevice Device(const HostBatch& hb, const StagedDelta::Impl& st,
                               size_t b) const {
    uint8_t* base = st.region.bytes() + st.offsets[b];
    uint8_t* meta = base + PayloadRegion(hb);
    return Device(hb, base, meta, meta + Align256(hb.meta.size()));
  }
  internal::BatchDevice Device(const HostBatch& hb, uint8_t* payload,
                               uint8_t* meta, uint8_t* scratch) const {
    uint64_t t, l, dp;
    hb.MetaOffsets(&t, &l, &dp);
    internal::BatchDevice d;
    d.chunks = reinterpret_cast<const DevChunk*>(meta);
    d.num_chunks = static_cast<uint32_t>(hb.chunks.size());
    d.tables = reinterpret_cast<const DevTable*>(meta + t);
    d.lanes = reinterpret_cast<const uint32_t*>(meta + l);
    d.payload = payload;
    d.scratch = scratch;
    d.placements = static_cast<const DevicePlacement*>(placements.data());
    d.pieces = static_cast<const DevicePiece*>(pieces.data());
    d.status = static_cast<uint32_t*>(status.data());
    d.smem = hb.smem;
    d.fused_lanes = hb.max_fused_lanes;
    d.unfused = hb.unfused;
    d.regions = hb.regions;
    d.conditional = hb.conditional;
    d.planes = reinterpret_cast<const DevDensePlane*>(meta + dp);
    d.num_planes = static_cast<uint32_t>(hb.planes.size());
    return d;
  }

  // The plan's flattened placements and pieces, in device memory.
  Status UploadPlan() {
    std::vector<DevicePlacement> dp;
    std::vector<DevicePiece> pc;
    plan.Flatten(&dp, &pc);
    REFIT_RETURN_IF_ERROR(placements.Reserve(dp.size() * sizeof(dp[0])));
    REFIT_RETURN_IF_ERROR(pieces.Reserve(pc.size() * sizeof(pc[0])));
    REFIT_CUDA_RETURN(cudaMemcpy(placements.data(), dp.data(), dp.size() * sizeof(dp[0]),
                                 cudaMemcpyHostToDevice),
                      "copy plan");
    REFIT_CUDA_RETURN(cudaMemcpy(pieces.data(), pc.data(), pc.size() * sizeof(pc[0]),
                                 cudaMemcpyHostToDevice),
                      "copy plan");
    return Status::Ok();
  }

  // `st` was staged by this receiver from preparation `p`.
  Status CheckStaged(const StagedDelta::Impl& st, const PreparedDelta& p) const {
    if (st.owner != this || st.batches != p.batches.size()) {
      return InvalidArgumentError(
          "the staged delta was not staged by this receiver from this "
          "preparation");
    }
    return Status::Ok();
  }

  // The staged path's start: records `begin` on the copy stream after what
  // is enqueued there (the status words) and makes the first `streams`
  // compute streams wait for it. Returns `streams`.
  Result<uint32_t> BeginStaged(size_t batches) {
    const uint32_t streams =
        static_cast<uint32_t>(std::clamp<size_t>(batches, 1, kMaxStreams));
    REFIT_CUDA_RETURN(cudaEventRecord(begin, copy), "record");
    for (uint32_t s = 0; s < streams; ++s) {
      REFIT_CUDA_RETURN(cudaStreamWaitEvent(compute[s], begin, 0), "wait");
    }
    return streams;
  }

  // Makes `after` wait for everything enqueued on the first `streams`
  // compute streams (default: the slots').
  Status Join(cudaStream_t after, uint32_t streams = 0) {
    if (streams == 0) streams = slots;
    for (uint32_t s = 0; s < streams; ++s) {
      REFIT_CUDA_RETURN(cudaEventRecord(done[s], compute[s]), "record");
      REFIT_CUDA_RETURN(cudaStreamWaitEvent(after, done[s], 0), "wait");
    }
    return Status::Ok();
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
  for (int s = 0; s < kMaxStreams; ++s) {
    REFIT_CUDA_RETURN(
        cudaStreamCreateWithFlags(&impl->compute[s], cudaStreamNonBlocking),
        "stream");
    REFIT_CUDA_RETURN(cudaEventCreateWithFlags(&impl->copied[s],
                                               cudaEventDisableTiming),
                      "event");
    REFIT_CUDA_RETURN(
        cudaEventCreateWithFlags(&impl->done[s], cudaEventDisableTiming), "event");
  }
  REFIT_CUDA_RETURN(cudaEventCreate(&impl->begin), "event");
  REFIT_CUDA_RETURN(cudaEventCreate(&impl->end), "event");
  REFIT_RETURN_IF_ERROR(impl->UploadPlan());
  return std::unique_ptr<Receiver>(new Receiver(std::move(impl)));
}

Status Receiver::SetPlan(PlacementPlan plan) {
  REFIT_CUDA_RETURN(cudaSetDevice(impl_->opt.device), "cudaSetDevice");
  REFIT_CUDA_RETURN(cudaDeviceSynchronize(), "sync");
  impl_->plan = std::move(plan);
  return impl_->UploadPlan();
}

Result<PreparedDelta> Receiver::Prepare(std::span<const uint8_t> payload,
                                        std::span<const ChunkSpan> chunks) {
  // Budget: kMaxSlots slots (fewer when the largest chunk needs more room),
  // each 1/16 metadata and the rest split between payload and scratch
  // (decoded records of overwrite chunks, undo bytes, digests) in proportion
  // to the delta's needs (PrepareOptions). Sparse XOR chunks need no
  // scratch beyond their digests, so a typical delta gets large payload
  // slots.
  PrepareOptions po;
  po.staging_total = impl_->opt.staging_bytes;
  po.slots = kMaxSlots;
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
  REFIT_CUDA_RETURN(cudaMemsetAsync(m.status.data(), 0, 4 * uint64_t{p.status_count},
                                    m.copy),
                    "memset");
  for (size_t b = 0; b < p.batches.size(); ++b) {
    const int s = static_cast<int>(b % m.slots);
    REFIT_RETURN_IF_ERROR(m.Upload(payload, p.batches[b], s, /*payload=*/false));
    REFIT_CUDA_RETURN(cudaStreamWaitEvent(m.compute[s], m.copied[s], 0), "wait");
    REFIT_CUDA_RETURN(internal::LaunchClassify(m.Device(p.batches[b], s),
                                               m.state.bytes(), m.compute[s]),
                      "classify");
    REFIT_CUDA_RETURN(cudaEventRecord(m.done[s], m.compute[s]), "record");
  }
  REFIT_RETURN_IF_ERROR(m.Join(m.copy));
  std::vector<uint8_t> out(p.status_count);
  REFIT_CUDA_RETURN(cudaMemcpyAsync(out.data(), m.state.data(), out.size(),
                                    cudaMemcpyDeviceToHost, m.copy),
                    "copy states");
  REFIT_CUDA_RETURN(cudaStreamSynchronize(m.copy), "sync");
  return out;
}

Result<GpuApplyReport> Receiver::Apply(std::span<const uint8_t> payload,
                                       const PreparedDelta& p,
                                       const std::vector<uint8_t>* states) {
  return Run(payload, nullptr, p, states);
}

Result<GpuApplyReport> Receiver::Apply(const StagedDelta& staged,
                                       const PreparedDelta& p,
                                       const std::vector<uint8_t>* states) {
  REFIT_RETURN_IF_ERROR(impl_->CheckStaged(*staged.impl_, p));
  return Run({}, staged.impl_.get(), p, states);
}

uint64_t Receiver::device_bytes() const { return impl_->HeldBytes(); }

uint64_t Receiver::StagedBytes(const PreparedDelta& p) {
  uint64_t total = 0;
  for (const HostBatch& hb : p.batches) total += BatchRegion(hb);
  return total;
}

Result<std::unique_ptr<StagedDelta>> Receiver::Stage(
    std::span<const uint8_t> payload, const PreparedDelta& p) {
  Impl& m = *impl_;
  auto st = std::make_unique<StagedDelta::Impl>();
  st->owner = impl_.get();
  st->batches = p.batches.size();
  uint64_t total = 0;
  for (const HostBatch& hb : p.batches) {
    if (hb.payload_end > payload.size() || hb.payload_begin > hb.payload_end) {
      return InvalidArgumentError("the payload does not hold the prepared batches");
    }
    st->offsets.push_back(total);
    total += BatchRegion(hb);
  }
  REFIT_RETURN_IF_ERROR(st->region.Reserve(std::max<uint64_t>(total, 256)));
  // Each batch as Upload lays out a slot: chunk bytes, then the CPU-decoded
  // dense bytes at dense_offset; then its metadata.
  for (size_t b = 0; b < p.batches.size(); ++b) {
    const HostBatch& hb = p.batches[b];
    uint8_t* base = st->region.bytes() + st->offsets[b];
    REFIT_CUDA_RETURN(
        cudaMemcpyAsync(base, payload.data() + hb.payload_begin,
                        hb.payload_end - hb.payload_begin, cudaMemcpyDefault,
                        m.copy),
        "stage a batch's payload");
    if (!hb.dense.empty()) {
      REFIT_CUDA_RETURN(
          cudaMemcpyAsync(base + hb.dense_offset, hb.dense.data(),
                          hb.dense.size(), cudaMemcpyHostToDevice, m.copy),
          "stage a batch's dense bytes");
    }
    REFIT_CUDA_RETURN(
        cudaMemcpyAsync(base + PayloadRegion(hb), hb.meta.data(), hb.meta.size(),
                        cudaMemcpyHostToDevice, m.copy),
        "stage a batch's metadata");
  }
  REFIT_CUDA_RETURN(cudaStreamSynchronize(m.copy), "stage the batches");
  return std::unique_ptr<StagedDelta>(new StagedDelta(std::move(st)));
}

namespace {

// Whether a prepared delta holds a conditional XOR chunk (kind 5).
bool HasConditional(const PreparedDelta& p) {
  return std::any_of(p.batches.begin(), p.batches.end(),
                     [](const HostBatch& hb) { return hb.conditional != 0; });
}

}  // namespace

Status Receiver::MapConditional(StagedDelta& staged, const PreparedDelta& p) {
  Impl& m = *impl_;
  StagedDelta::Impl& st = *staged.impl_;
  REFIT_RETURN_IF_ERROR(m.CheckStaged(st, p));
  if (st.mapped) {
    return FailedPreconditionError("the staged delta's conditional chunks are already mapped");
  }
  if (!HasConditional(p)) return Status::Ok();
  REFIT_RETURN_IF_ERROR(m.status.Reserve(4 * uint64_t{p.status_count}));
  REFIT_CUDA_RETURN(cudaMemsetAsync(m.status.data(), 0, 4 * uint64_t{p.status_count}, m.copy),
                    "memset");
  static_assert(kStatusOk == 0);
  REFIT_ASSIGN_OR_RETURN(const uint32_t streams, m.BeginStaged(p.batches.size()));
  for (size_t b = 0; b < p.batches.size(); ++b) {
    const HostBatch& hb = p.batches[b];
    if (hb.conditional == 0) continue;
    REFIT_CUDA_RETURN(internal::LaunchConditionalMap(m.Device(hb, st, b),
                                                     m.compute[b % streams]),
                      "map launch");
  }
  REFIT_RETURN_IF_ERROR(m.Join(m.copy, streams));
  st.mapped_status.assign(p.status_count, kStatusOk);
  REFIT_CUDA_RETURN(cudaMemcpyAsync(st.mapped_status.data(), m.status.data(),
                                    4 * uint64_t{p.status_count}, cudaMemcpyDeviceToHost, m.copy),
                    "copy status");
  REFIT_CUDA_RETURN(cudaStreamSynchronize(m.copy), "map");
  st.mapped = true;
  return Status::Ok();
}

Status Receiver::UndoMapped(const StagedDelta& staged, const PreparedDelta& p,
                            const std::vector<bool>& applied) {
  Impl& m = *impl_;
  const StagedDelta::Impl& st = *staged.impl_;
  REFIT_RETURN_IF_ERROR(m.CheckStaged(st, p));
  if (applied.size() != p.status_count) {
    return InvalidArgumentError("UndoMapped needs a flag per chunk");
  }
  if (!HasConditional(p)) return Status::Ok();  // MapConditional had nothing to map
  if (!st.mapped) return InvalidArgumentError("UndoMapped needs a mapped delta");
  std::vector<uint32_t> status(p.status_count);
  for (uint32_t i = 0; i < p.status_count; ++i) {
    status[i] = applied[i] ? kStatusOk : kStatusSkipped;
  }
  REFIT_RETURN_IF_ERROR(m.status.Reserve(4 * uint64_t{p.status_count}));
  REFIT_CUDA_RETURN(cudaMemcpyAsync(m.status.data(), status.data(), 4 * status.size(),
                                    cudaMemcpyHostToDevice, m.copy),
                    "copy status");
  for (size_t b = 0; b < p.batches.size(); ++b) {
    const HostBatch& hb = p.batches[b];
    if (hb.conditional == 0) continue;
    internal::BatchDevice d = m.Device(hb, st, b);
    d.conditional_mapped = 1;
    REFIT_CUDA_RETURN(internal::LaunchConditional(d, m.copy), "undo launch");
  }
  REFIT_CUDA_RETURN(cudaStreamSynchronize(m.copy), "undo");
  return Status::Ok();
}

Result<GpuApplyReport> Receiver::Run(std::span<const uint8_t> payload,
                                     const StagedDelta::Impl* staged,
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
  // A chunk the mapping refused stays refused.
  if (staged && staged->mapped) {
    for (uint32_t i = 0; i < p.status_count; ++i) {
      if (initial[i] == kStatusOk) initial[i] = staged->mapped_status[i];
    }
  }
  // A staged delta brings its own payload, metadata and scratch: only the
  // status words are needed here.
  if (staged) {
    REFIT_RETURN_IF_ERROR(m.status.Reserve(4 * uint64_t{p.status_count}));
    report.device_bytes = m.HeldBytes() + staged->region.size();
  } else {
    REFIT_RETURN_IF_ERROR(m.Reserve(p));
    report.device_bytes = m.HeldBytes();
  }
  while (m.marks.size() < 3 * p.batches.size()) {
    cudaEvent_t e;
    REFIT_CUDA_RETURN(cudaEventCreate(&e), "event");
    m.marks.push_back(e);
  }
  // The status words go first on the copy stream; every batch's kernels
  // wait for them (slots: through their copy; staged: through `begin`,
  // recorded after them).
  REFIT_CUDA_RETURN(cudaMemcpyAsync(m.status.data(), initial.data(),
                                    4 * initial.size(), cudaMemcpyHostToDevice,
                                    m.copy),
                    "copy status");
  uint32_t streams = m.slots;
  if (staged) {
    REFIT_ASSIGN_OR_RETURN(streams, m.BeginStaged(p.batches.size()));
  }
  Status st;
  auto launch = [&](size_t b) -> Status {
    const HostBatch& hb = p.batches[b];
    const int s = static_cast<int>(b % streams);
    cudaStream_t cs = m.compute[s];
    internal::BatchDevice d;
    if (staged) {
      d = m.Device(hb, *staged, b);
      d.conditional_mapped = staged->mapped ? 1 : 0;
    } else {
      REFIT_RETURN_IF_ERROR(m.Upload(payload, hb, s));
      REFIT_CUDA_RETURN(cudaStreamWaitEvent(cs, m.copied[s], 0), "wait");
      if (b == 0) REFIT_CUDA_RETURN(cudaEventRecord(m.begin, cs), "record");
      d = m.Device(hb, s);
    }
    report.payload_bytes += hb.device_bytes();
    report.records += hb.records;
    REFIT_CUDA_RETURN(cudaEventRecord(m.marks[3 * b], cs), "record");
    REFIT_CUDA_RETURN(internal::LaunchDecode(d, cs), "decode launch");
    REFIT_CUDA_RETURN(internal::LaunchApply(d, cs), "apply launch");
    REFIT_CUDA_RETURN(cudaEventRecord(m.marks[3 * b + 1], cs), "record");
    if (m.opt.verify) {
      REFIT_CUDA_RETURN(internal::LaunchVerifyAfter(d, cs), "verify launch");
    }
    REFIT_CUDA_RETURN(cudaEventRecord(m.marks[3 * b + 2], cs), "record");
    REFIT_CUDA_RETURN(cudaEventRecord(m.done[s], cs), "record");
    return Status::Ok();
  };
  for (size_t b = 0; b < p.batches.size() && st.ok(); ++b) st = launch(b);
  // Even after a failed launch, wait for what was enqueued.
  const Status joined = m.Join(m.copy, streams);
  if (st.ok()) st = joined;
  const cudaError_t re = cudaEventRecord(m.end, m.copy);
  last_status_.assign(p.status_count, 0);
  const cudaError_t ce = cudaMemcpyAsync(last_status_.data(), m.status.data(),
                                         4 * last_status_.size(),
                                         cudaMemcpyDeviceToHost, m.copy);
  const cudaError_t se = cudaStreamSynchronize(m.copy);
  if (st.ok() && !p.batches.empty() && re == cudaSuccess && se == cudaSuccess) {
    float span = 0;
    cudaEventElapsedTime(&span, m.begin, m.end);
    report.kernel_ms = span;
    for (size_t b = 0; b < p.batches.size(); ++b) {
      float a = 0, v = 0;
      cudaEventElapsedTime(&a, m.marks[3 * b], m.marks[3 * b + 1]);
      cudaEventElapsedTime(&v, m.marks[3 * b + 1], m.marks[3 * b + 2]);
      report.decode_ms += a;
      report.verify_ms += v;
    }
  }
  REFIT_RETURN_IF_ERROR(st);
  REFIT_CUDA_RETURN(re, "record");
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
                                              static_cast<uint64_t*>(out.data()), 0),
                    "range hash");
  uint64_t h[2];
  REFIT_CUDA_RETURN(cudaMemcpy(h, out.data(), 16, cudaMemcpyDeviceToHost), "copy");
  return Hash128{h[0], h[1]};
}

Result<std::vector<Hash128>> RangeHashesDevice(std::span<const DeviceRange> ranges) {
  uint64_t most = 1;
  for (const DeviceRange& r : ranges) {
    most = std::max<uint64_t>(most, (r.len + kRangeHashSegment - 1) / kRangeHashSegment);
  }
  DeviceBuffer dig, out;
  REFIT_RETURN_IF_ERROR(dig.Reserve(16 * most));
  REFIT_RETURN_IF_ERROR(out.Reserve(16 * std::max<size_t>(ranges.size(), 1)));
  // One stream: each launch finishes with the scratch before the next.
  for (size_t i = 0; i < ranges.size(); ++i) {
    REFIT_CUDA_RETURN(internal::LaunchRangeHash(static_cast<const uint8_t*>(ranges[i].data),
                                                ranges[i].len, dig.bytes(),
                                                static_cast<uint64_t*>(out.data()) + 2 * i, 0),
                      "range hash");
  }
  std::vector<uint64_t> h(2 * ranges.size());
  if (!h.empty()) {
    REFIT_CUDA_RETURN(cudaMemcpy(h.data(), out.data(), 8 * h.size(), cudaMemcpyDeviceToHost),
                      "copy");
  }
  std::vector<Hash128> hashes(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) hashes[i] = Hash128{h[2 * i], h[2 * i + 1]};
  return hashes;
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
  REFIT_CUDA_RETURN(cudaMemcpy(off.data(), offsets.data(), 8 * n,
                               cudaMemcpyHostToDevice), "copy");
  REFIT_CUDA_RETURN(cudaMemcpy(len.data(), lens.data(), 8 * n,
                               cudaMemcpyHostToDevice), "copy");
  REFIT_CUDA_RETURN(internal::LaunchHashSpans(
                        static_cast<const uint8_t*>(data),
                        static_cast<const uint64_t*>(off.data()),
                        static_cast<const uint64_t*>(len.data()),
                        static_cast<uint32_t>(n), static_cast<uint64_t*>(out.data()), 0),
                    "hash spans");
  std::vector<uint64_t> h(2 * n);
  REFIT_CUDA_RETURN(cudaMemcpy(h.data(), out.data(), 16 * n, cudaMemcpyDeviceToHost),
                    "copy");
  std::vector<Hash128> r(n);
  for (uint64_t i = 0; i < n; ++i) r[i] = Hash128{h[2 * i], h[2 * i + 1]};
  return r;
}

}  // namespace refit::cuda
