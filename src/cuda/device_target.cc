#include "cuda/device_target.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>

#include "base/hash.h"
#include "codec/payload.h"
#include "cuda/cuda_common.h"
#include "cuda/pipeline.h"
#include "delta/chunk.h"
#include "sync/staging_queue.h"

namespace refit::cuda {

using internal::DeviceBuffer;

namespace {

bool IsXorKind(uint8_t kind) {
  return kind == static_cast<uint8_t>(codec::ChunkKind::kSparseXor) ||
         kind == static_cast<uint8_t>(codec::ChunkKind::kDenseXor);
}

uint64_t Elements(const TensorPlacement& p) { return p.rows * p.cols; }

// Whether a placement holds every element of its canonical tensor (not a
// tensor-parallel shard of it).
bool HoldsAll(const TensorPlacement& p) {
  auto covered = [](const AxisMap& m) {
    uint64_t n = 0;
    for (const AxisPiece& a : m.pieces) n += a.end - a.begin;
    return n;
  };
  return covered(p.row_map) == p.rows && covered(p.col_map) == p.cols;
}

// Copies a canonical tensor (row-major at `canonical`) into placement p
// (`into_placement`) or out of it, by `kind` (host or device canonical
// bytes); the placement is contiguous or holds whole rows in blocks of
// rows (fused and row-sharded layouts).
Status CopyCanonical(const TensorPlacement& p, uint8_t* canonical, bool into_placement,
                     cudaMemcpyKind kind, cudaStream_t stream) {
  const uint64_t w = static_cast<uint64_t>(p.width);
  if (auto address = ContiguousAddress(p, 0, Elements(p))) {
    void* placed = reinterpret_cast<void*>(*address);
    REFIT_CUDA_RETURN(into_placement ? cudaMemcpyAsync(placed, canonical, Elements(p) * w,
                                                       kind, stream)
                                     : cudaMemcpyAsync(canonical, placed, Elements(p) * w,
                                                       kind, stream),
                      "copy a tensor");
    return Status();
  }
  const auto& cols = p.col_map.pieces;
  if (cols.size() != 1 || cols[0].begin != 0 || cols[0].end != p.cols ||
      cols[0].dst != 0 || cols[0].block != 0 || p.col_stride != 1) {
    return UnimplementedError("tensor '" + p.name +
                              "' is placed by columns on the GPU; copying it whole "
                              "(a snapshot's load, the hash of a direct version) is not "
                              "supported for such a placement");
  }
  for (const AxisPiece& r : p.row_map.pieces) {
    const uint64_t block = r.block == 0 ? r.end - r.begin : r.block;
    for (uint64_t first = r.begin, q = 0; first < r.end; first += block, ++q) {
      const uint64_t rows = std::min(block, r.end - first);
      const uint64_t dst_row = r.dst + q * (r.block == 0 ? 0 : r.block_stride);
      uint8_t* placed = reinterpret_cast<uint8_t*>(p.base) + dst_row * p.row_stride * w;
      uint8_t* canon = canonical + first * p.cols * w;
      REFIT_CUDA_RETURN(
          into_placement
              ? cudaMemcpy2DAsync(placed, p.row_stride * w, canon, p.cols * w, p.cols * w, rows,
                                  kind, stream)
              : cudaMemcpy2DAsync(canon, p.cols * w, placed, p.row_stride * w, p.cols * w, rows,
                                  kind, stream),
          "copy rows of a tensor");
    }
  }
  return Status();
}

}  // namespace

struct DeviceTarget::Impl {
  explicit Impl(const DeviceTargetOptions& options)
      : opt(options),
        staging(options.host_staging_bytes,
                "host staging bound (host_staging_bytes)") {}

  std::map<std::string, CanonicalTensor> tensors;
  PlacementPlan plan;
  DeviceTargetOptions opt;
  bool verify = true;
  // Device address of each tensor stored whole and contiguously (hashable).
  std::map<std::string, uint64_t> contiguous;
  std::map<std::string, Hash128> last_hashes;  // from the last Hashes()
  // GPU receivers by tensor table (names), checking ranges or not.
  std::map<std::vector<std::string>, std::unique_ptr<Receiver>> receivers,
      unchecked;

  struct Version {
    const std::vector<TensorEntry>* table = nullptr;
    std::vector<uint8_t> bytes;
    std::vector<ChunkSpan> spans;
    std::vector<uint64_t> tensor_ids;  // by span, for HashesAfter
    PreparedDelta prepared;
    Receiver* receiver = nullptr;
    // On the device: every batch in its own region (Receiver::Stage).
    std::unique_ptr<StagedDelta> resident;
    // A device copy of `bytes`, kept after a SealDirect() for
    // HashesAfter() (which frees it), when it fits the device bound.
    std::unique_ptr<DeviceBuffer> raw;
    uint64_t offset = 0;         // in the pinned staged payload
    std::vector<uint8_t> kinds;  // chunk kind by chunk index
    // Its conditional chunks were mapped before the pause (resident):
    // undone by XORing their records again, not from saved copies.
    bool mapped = false;
  };
  // The staged versions; applied (or restored) ones are freed by the next
  // Begin(), outside the pause.
  StagingQueue<Version> staging;
  bool sealed = false;
  bool on_device = false;
  uint64_t resident_bytes = 0;  // device memory of the staged versions
  uint64_t raw_bytes = 0;       // of the versions' raw copies
  uint8_t* pinned = nullptr;
  uint64_t pinned_size = 0;
  struct Saved {
    uint64_t address, length, offset;
    size_t version;    // index in the staging
    bool conditional;  // a kind-5 chunk's range
  };
  std::vector<Saved> saved;
  bool restorable = true;
  DeviceBuffer backup;
  cudaStream_t stream = nullptr;

  ~Impl() {
    if (pinned) cudaFreeHost(pinned);
    if (stream) cudaStreamDestroy(stream);
  }

  // Begin() (`retire` false) or the end of Apply(): drops the staging; after
  // Apply its memory goes with the next Begin().
  void Reset(bool retire) {
    if (retire) {
      staging.Retire();
    } else {
      staging.Clear();
      resident_bytes = 0;
      raw_bytes = 0;
    }
    sealed = false;
    saved.clear();
    restorable = true;
  }

  Result<Receiver*> ReceiverFor(const std::vector<TensorEntry>& table,
                                bool check) {
    std::vector<std::string> names;
    for (const TensorEntry& e : table) names.push_back(e.name);
    auto& cache = check ? receivers : unchecked;
    auto it = cache.find(names);
    if (it != cache.end()) return it->second.get();
    ReceiverOptions ro;
    ro.staging_bytes = opt.apply_staging_bytes;
    ro.verify = check && verify;
    ro.host_threads = opt.host_threads;
    ro.device = opt.device;
    REFIT_ASSIGN_OR_RETURN(auto r, Receiver::Create(plan, names, ro));
    Receiver* raw = r.get();
    cache.emplace(std::move(names), std::move(r));
    return raw;
  }

  Result<std::vector<std::optional<Hash128>>> HashHeld(
      const std::vector<TensorEntry>& table) {
    std::vector<DeviceRange> ranges;
    std::vector<size_t> which;
    for (size_t t = 0; t < table.size(); ++t) {
      auto it = contiguous.find(table[t].name);
      if (it == contiguous.end()) continue;
      ranges.push_back(
          {reinterpret_cast<const void*>(it->second),
           table[t].num_elements * static_cast<uint64_t>(table[t].width)});
      which.push_back(t);
    }
    REFIT_CUDA_RETURN(cudaSetDevice(opt.device), "cudaSetDevice");
    REFIT_ASSIGN_OR_RETURN(auto hashes, RangeHashesDevice(ranges));
    std::vector<std::optional<Hash128>> out(table.size());
    for (size_t i = 0; i < which.size(); ++i) out[which[i]] = hashes[i];
    return out;
  }

  // Undoes what Apply wrote: version `failed`'s chunks that the GPU
  // applied (`status`), then every earlier version's, newest first; then
  // the saved ranges; then checks the hashable tensors.
  Status Restore(size_t failed, const std::vector<uint32_t>& status) {
    for (size_t j = failed + 1; j-- > 0;) {
      Version& v = staging.items()[j];
      std::vector<ChunkSpan> undo;
      std::vector<bool> applied(v.spans.size(), j < failed);
      if (j == failed) {
        for (size_t s = 0;
             s < status.size() && s < v.prepared.chunk_of_status.size(); ++s) {
          if (status[s] == kStatusOk)
            applied[v.prepared.chunk_of_status[s]] = true;
        }
      }
      for (size_t c = 0; c < v.spans.size(); ++c) {
        if (applied[c] && IsXorKind(v.kinds[c])) undo.push_back(v.spans[c]);
      }
      if (v.mapped) {
        // Mapped conditional chunks: their staged records again.
        std::vector<bool> by_status(v.prepared.status_count, j < failed);
        if (j == failed) {
          for (size_t s = 0; s < status.size() && s < by_status.size(); ++s) {
            by_status[s] = status[s] == kStatusOk;
          }
        }
        REFIT_RETURN_IF_ERROR(v.receiver->UndoMapped(*v.resident, v.prepared, by_status));
      }
      if (undo.empty()) continue;
      REFIT_ASSIGN_OR_RETURN(Receiver * r,
                             ReceiverFor(*v.table, /*check=*/false));
      REFIT_ASSIGN_OR_RETURN(PreparedDelta p, r->Prepare(v.bytes, undo));
      REFIT_RETURN_IF_ERROR(r->Apply(v.bytes, p).status());
    }
    for (const Saved& s : saved) {
      REFIT_CUDA_RETURN(cudaMemcpyAsync(reinterpret_cast<void*>(s.address),
                                        backup.bytes() + s.offset, s.length,
                                        cudaMemcpyDeviceToDevice, stream),
                        "restore a saved range");
    }
    REFIT_CUDA_RETURN(cudaStreamSynchronize(stream), "restore");
    if (!restorable) {
      return DataLossError(
          "a changed range that is not stored contiguously here was "
          "overwritten and cannot be restored");
    }
    for (const Version& v : staging.items()) {
      REFIT_ASSIGN_OR_RETURN(auto now, HashHeld(*v.table));
      for (size_t t = 0; t < now.size(); ++t) {
        auto was = last_hashes.find((*v.table)[t].name);
        if (now[t] && was != last_hashes.end() && *now[t] != was->second) {
          // Every write was undone: the tensor changed between the
          // preparation (which hashed it) and the pause.
          return FailedPreconditionError(
              "tensor '" + (*v.table)[t].name +
              "' no longer holds what it held when the version was "
              "prepared: it changed while the version was staged");
        }
      }
    }
    return Status();
  }
};

DeviceTarget::DeviceTarget(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
DeviceTarget::~DeviceTarget() = default;

Result<std::unique_ptr<DeviceTarget>> DeviceTarget::Create(
    std::vector<CanonicalTensor> tensors, PlacementPlan plan,
    const DeviceTargetOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  for (CanonicalTensor& t : tensors) {
    const std::string name = t.name;
    if (!impl->tensors.emplace(name, std::move(t)).second) {
      return InvalidArgumentError("tensor '" + name + "' is given twice");
    }
  }
  for (const TensorPlacement& p : plan.placements()) {
    if (!impl->tensors.contains(p.name)) {
      return InvalidArgumentError(
          "a placement names tensor '" + p.name +
          "', which is not among the canonical tensors");
    }
  }
  for (const auto& [name, t] : impl->tensors) {
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    auto placed = plan.Find(name);
    for (uint32_t j : placed) {
      const TensorPlacement& p = plan.placements()[j];
      if (Elements(p) != n || p.width != t.width) {
        return InvalidArgumentError(
            "the placement of '" + p.name +
            "' does not have the tensor's elements or width");
      }
      if (!ContiguousAddress(p, 0, n)) impl->verify = false;
    }
    if (placed.empty()) {
      if (n == 0) continue;
      return InvalidArgumentError("tensor '" + name + "' has no placement");
    }
    const TensorPlacement& p = plan.placements()[placed.front()];
    if (auto address = ContiguousAddress(p, 0, n);
        address && placed.size() == 1) {
      impl->contiguous[name] = *address;
    }
  }
  impl->plan = std::move(plan);
  REFIT_CUDA_RETURN(cudaSetDevice(options.device), "cudaSetDevice");
  REFIT_CUDA_RETURN(
      cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking),
      "stream");
  return std::unique_ptr<DeviceTarget>(new DeviceTarget(std::move(impl)));
}

bool DeviceTarget::verifies() const { return impl_->verify; }

Status DeviceTarget::Check(const std::vector<TensorEntry>& table) {
  size_t held = 0;
  for (const TensorEntry& e : table) {
    auto it = impl_->tensors.find(e.name);
    if (it == impl_->tensors.end() || it->second.dtype != e.dtype ||
        it->second.width != e.width || it->second.shape != e.shape) {
      return FailedPreconditionError(
          "tensor '" + e.name +
          "' is not held on the GPU with the version's dtype and "
          "shape; these are not the version's tensors");
    }
    ++held;
  }
  if (held != impl_->tensors.size()) {
    return FailedPreconditionError(
        "the GPU holds " + std::to_string(impl_->tensors.size()) +
        " tensors but the version has " + std::to_string(table.size()));
  }
  return Status();
}

Result<std::vector<std::optional<Hash128>>> DeviceTarget::Hashes(
    const std::vector<TensorEntry>& table) {
  REFIT_RETURN_IF_ERROR(Check(table));
  REFIT_ASSIGN_OR_RETURN(auto hashes, impl_->HashHeld(table));
  for (size_t t = 0; t < table.size(); ++t) {
    if (hashes[t]) impl_->last_hashes[table[t].name] = *hashes[t];
  }
  return hashes;
}

Status DeviceTarget::Begin() {
  impl_->Reset(/*retire=*/false);
  return Status();
}

Status DeviceTarget::Add(size_t version, const std::vector<TensorEntry>& table,
                         std::span<const uint8_t> chunk) {
  Impl& m = *impl_;
  std::vector<Impl::Version>& versions = m.staging.items();
  if (version > versions.size() || (version + 1 < versions.size())) {
    return InvalidArgumentError("versions must be staged in order");
  }
  // The tensor, for HashesAfter (the checksum is Seal's to verify).
  REFIT_ASSIGN_OR_RETURN(ChunkHeader header, ParseChunkHeader(chunk));
  REFIT_RETURN_IF_ERROR(m.staging.Charge(chunk.size()));
  if (version == versions.size()) {
    versions.emplace_back();
    versions.back().table = &table;
  }
  Impl::Version& v = versions.back();
  v.spans.push_back({v.bytes.size(), chunk.size()});
  v.tensor_ids.push_back(header.tensor_id);
  v.bytes.insert(v.bytes.end(), chunk.begin(), chunk.end());
  m.sealed = false;
  return Status();
}

Status DeviceTarget::Seal() { return SealVersions(/*keep_raw=*/false); }

Status DeviceTarget::SealDirect() { return SealVersions(/*keep_raw=*/true); }

Status DeviceTarget::SealVersions(bool keep_raw) {
  Impl& m = *impl_;
  REFIT_CUDA_RETURN(cudaSetDevice(m.opt.device), "cudaSetDevice");
  uint64_t offset = 0;
  m.saved.clear();
  m.restorable = true;
  for (size_t k = 0; k < m.staging.items().size(); ++k) {
    Impl::Version& v = m.staging.items()[k];
    v.mapped = false;
    REFIT_ASSIGN_OR_RETURN(v.receiver, m.ReceiverFor(*v.table, /*check=*/true));
    REFIT_ASSIGN_OR_RETURN(v.prepared, v.receiver->Prepare(v.bytes, v.spans));
    v.offset = offset;
    offset += v.bytes.size();
    v.kinds.assign(v.spans.size(), 0);
    for (const HostBatch& b : v.prepared.batches) {
      for (const DevChunk& c : b.chunks) {
        const uint32_t index = v.prepared.chunk_of_status[c.status_index];
        // A conditional XOR chunk (kind 5) runs as a sparse XOR one on the
        // device, but applying it again decodes it against its after state:
        // its range is saved like an overwrite chunk's, and restored
        // (unless it is mapped before the pause, below).
        v.kinds[index] =
            c.conditional ? static_cast<uint8_t>(codec::ChunkKind::kConditionalXor) : c.kind;
        if (IsXorKind(v.kinds[index])) continue;
        if (c.linear_address == 0) {
          m.restorable = false;
          continue;
        }
        // A strided region's span, its rows and what lies between them.
        const uint64_t length = RegionSpan(c.n, c.run, c.stride) * c.width;
        m.saved.push_back({c.linear_address, length, 0, k, c.conditional != 0});
      }
    }
  }
  // On the device when every version's batches fit: each batch then sits in
  // a region of its own, so that the pause launches them all at once.
  uint64_t resident = 0;
  for (const Impl::Version& v : m.staging.items()) {
    resident += Receiver::StagedBytes(v.prepared);
  }
  m.on_device = resident <= m.opt.device_staging_bytes;
  m.resident_bytes = 0;
  m.raw_bytes = 0;
  if (m.on_device) {
    // For HashesAfter, the payload as it was added, copied once (the
    // batches are then staged from it on the device) when it fits too.
    uint64_t raw = 0;
    for (const Impl::Version& v : m.staging.items()) raw += v.bytes.size();
    keep_raw = keep_raw && resident + raw <= m.opt.device_staging_bytes;
    for (Impl::Version& v : m.staging.items()) {
      v.raw.reset();
      std::span<const uint8_t> from = v.bytes;
      if (keep_raw) {
        v.raw = std::make_unique<DeviceBuffer>();
        REFIT_RETURN_IF_ERROR(v.raw->Reserve(v.bytes.size()));
        REFIT_CUDA_RETURN(cudaMemcpyAsync(v.raw->bytes(), v.bytes.data(), v.bytes.size(),
                                          cudaMemcpyHostToDevice, m.stream),
                          "copy the payload");
        REFIT_CUDA_RETURN(cudaStreamSynchronize(m.stream), "copy the payload");
        from = std::span<const uint8_t>(v.raw->bytes(), v.bytes.size());
        m.raw_bytes += v.bytes.size();
      }
      REFIT_ASSIGN_OR_RETURN(v.resident, v.receiver->Stage(from, v.prepared));
      m.resident_bytes += v.resident->bytes();
    }
    // The first version's base is what the GPU holds now: its conditional
    // XOR chunks are decoded against it here, so that the pause only XORs
    // their records in. A later version's base exists only in the pause.
    // Its records, kept there, also undo it: its ranges need no copy.
    if (!m.staging.items().empty()) {
      Impl::Version& first = m.staging.items().front();
      REFIT_RETURN_IF_ERROR(first.receiver->MapConditional(*first.resident, first.prepared));
      first.mapped = true;
      std::erase_if(m.saved, [](const Impl::Saved& s) { return s.version == 0 && s.conditional; });
    }
  } else {
    for (Impl::Version& v : m.staging.items()) {
      v.resident.reset();
      v.raw.reset();
    }
    if (offset > m.pinned_size) {
      if (m.pinned) cudaFreeHost(m.pinned);
      m.pinned = nullptr;
      m.pinned_size = 0;
      REFIT_CUDA_RETURN(cudaHostAlloc(reinterpret_cast<void**>(&m.pinned),
                                      offset, cudaHostAllocDefault),
                        "cudaHostAlloc (staging)");
      m.pinned_size = offset;
    }
    for (const Impl::Version& v : m.staging.items()) {
      std::memcpy(m.pinned + v.offset, v.bytes.data(), v.bytes.size());
    }
  }
  // The ranges that only a copy restores (overwrite and conditional
  // chunks), saved now: nothing writes them until the pause.
  uint64_t saved_bytes = 0;
  for (Impl::Saved& s : m.saved) {
    s.offset = saved_bytes;
    saved_bytes += (s.length + 255) & ~uint64_t{255};
  }
  REFIT_RETURN_IF_ERROR(m.backup.Reserve(saved_bytes));
  for (const Impl::Saved& s : m.saved) {
    REFIT_CUDA_RETURN(
        cudaMemcpyAsync(m.backup.bytes() + s.offset,
                        reinterpret_cast<const void*>(s.address), s.length,
                        cudaMemcpyDeviceToDevice, m.stream),
        "save a range");
  }
  REFIT_CUDA_RETURN(cudaStreamSynchronize(m.stream), "stage the payload");
  m.sealed = true;
  return Status();
}

Result<StagedApplyReport> DeviceTarget::Apply() {
  Impl& m = *impl_;
  if (!m.sealed) REFIT_RETURN_IF_ERROR(Seal());
  const auto t0 = std::chrono::steady_clock::now();
  REFIT_CUDA_RETURN(cudaSetDevice(m.opt.device), "cudaSetDevice");
  StagedApplyReport report;
  Status failed;
  for (size_t k = 0; k < m.staging.items().size(); ++k) {
    Impl::Version& v = m.staging.items()[k];
    auto applied =
        v.resident
            ? v.receiver->Apply(*v.resident, v.prepared)
            : v.receiver->Apply(
                  std::span<const uint8_t>(m.pinned + v.offset, v.bytes.size()),
                  v.prepared);
    if (!applied.ok()) {
      failed = applied.status();
      Status restored = m.Restore(k, v.receiver->last_status());
      m.Reset(/*retire=*/true);
      if (restored.code() == StatusCode::kFailedPrecondition) {
        return Status(failed.code(),
                      std::string(failed.message()) +
                          "; every tensor was restored to what it held before "
                          "the pause, but " +
                          std::string(restored.message()));
      }
      return RestoredError(failed, restored);
    }
    report.chunks += applied->chunks_applied;
    report.kernel_ms += applied->kernel_ms;
    report.verify_ms += applied->verify_ms;
    ++report.versions;
  }
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  m.Reset(/*retire=*/true);
  return report;
}

Status DeviceTarget::Load(const TensorEntry& e,
                          std::span<const uint8_t> bytes) {
  Impl& m = *impl_;
  REFIT_CUDA_RETURN(cudaSetDevice(m.opt.device), "cudaSetDevice");
  const uint64_t w = static_cast<uint64_t>(e.width);
  if (bytes.size() != e.num_elements * w) {
    return InvalidArgumentError("tensor '" + e.name +
                                "' is loaded with the wrong size");
  }
  for (uint32_t j : m.plan.Find(e.name)) {
    REFIT_RETURN_IF_ERROR(CopyCanonical(m.plan.placements()[j],
                                        const_cast<uint8_t*>(bytes.data()),
                                        /*into_placement=*/true, cudaMemcpyHostToDevice,
                                        m.stream));
  }
  REFIT_CUDA_RETURN(cudaStreamSynchronize(m.stream), "load a tensor");
  return Status();
}

Result<std::vector<Hash128>> DeviceTarget::HashesAfter(const std::vector<TensorEntry>& table) {
  REFIT_RETURN_IF_ERROR(Check(table));
  Impl& m = *impl_;
  // Sealed, as the pause seals: the chunks' kinds and the staged payload.
  if (!m.sealed) REFIT_RETURN_IF_ERROR(Seal());
  REFIT_CUDA_RETURN(cudaSetDevice(m.opt.device), "cudaSetDevice");
  std::vector<Impl::Version>& versions = m.staging.items();
  // The staged chunks of each tensor, by version (their indices).
  std::map<std::string, std::vector<std::vector<size_t>>> chunks;
  for (size_t k = 0; k < versions.size(); ++k) {
    const Impl::Version& v = versions[k];
    for (size_t i = 0; i < v.spans.size(); ++i) {
      if (v.tensor_ids[i] >= v.table->size())
        return DataLossError("a chunk names a tensor outside its table");
      auto& per = chunks[(*v.table)[v.tensor_ids[i]].name];
      per.resize(versions.size());
      per[k].push_back(i);
    }
  }
  // The payload the GPU receivers read: the device copy SealDirect() kept,
  // else the page-locked copy, else the staged bytes.
  std::vector<std::span<const uint8_t>> payloads;
  for (const Impl::Version& v : versions) {
    if (v.raw) {
      payloads.emplace_back(v.raw->bytes(), v.bytes.size());
    } else if (!m.on_device) {
      payloads.emplace_back(m.pinned + v.offset, v.bytes.size());
    } else {
      payloads.emplace_back(v.bytes);
    }
  }
  // Tensors no chunk touches are hashed where they are, when contiguous;
  // the others are copied (in canonical order) into groups of up to
  // device_staging_bytes (at least one tensor), the staged chunks applied
  // to the copies by the GPU receiver, checked at "before" and "after"
  // as the pause checks them, and the copies hashed.
  std::vector<Hash128> out(table.size());
  std::vector<DeviceRange> ranges;
  std::vector<size_t> which, copied;
  uint64_t largest = 0;
  for (size_t t = 0; t < table.size(); ++t) {
    const TensorEntry& e = table[t];
    const uint64_t bytes = e.num_elements * static_cast<uint64_t>(e.width);
    auto held = m.contiguous.find(e.name);
    if (bytes != 0 && !HoldsAll(m.plan.placements()[m.plan.Find(e.name).front()])) {
      // Only the tensor's hash after the version goes into the vote, and
      // this GPU does not hold the tensor.
      return UnimplementedError(
          "tensor '" + e.name + "' is held as a shard on this GPU, so its hash after a "
          "version published by several trainer ranks cannot be computed here; receive "
          "such versions with every tensor held whole, or through an assembling "
          "coordinator");
    }
    if (bytes == 0) {
      out[t] = RangeHash(nullptr, 0);
    } else if (!chunks.contains(e.name) && held != m.contiguous.end()) {
      ranges.push_back({reinterpret_cast<const void*>(held->second), bytes});
      which.push_back(t);
    } else {
      copied.push_back(t);
      largest = std::max(largest, bytes);
    }
  }
  REFIT_ASSIGN_OR_RETURN(auto in_place, RangeHashesDevice(ranges));
  for (size_t i = 0; i < which.size(); ++i) out[which[i]] = in_place[i];
  const auto padded = [](uint64_t b) { return (b + 255) & ~uint64_t{255}; };
  const uint64_t budget = std::max(m.opt.device_staging_bytes, padded(largest));
  DeviceBuffer copy;
  // One GPU receiver per version, placing through each group's plan in
  // turn (made once: streams, arena and pinned buffers are not cheap).
  std::vector<std::unique_ptr<Receiver>> appliers(versions.size());
  for (size_t i = 0; i < copied.size();) {
    // One group: copies of tensors i .. j - 1.
    uint64_t used = 0;
    size_t j = i;
    for (; j < copied.size(); ++j) {
      const TensorEntry& e = table[copied[j]];
      const uint64_t bytes = padded(e.num_elements * static_cast<uint64_t>(e.width));
      if (j > i && used + bytes > budget) break;
      used += bytes;
    }
    REFIT_RETURN_IF_ERROR(copy.Reserve(used));
    PlacementPlan plan;
    ranges.clear();
    used = 0;
    for (size_t g = i; g < j; ++g) {
      const TensorEntry& e = table[copied[g]];
      const uint64_t bytes = e.num_elements * static_cast<uint64_t>(e.width);
      uint8_t* dst = copy.bytes() + used;
      used += padded(bytes);
      REFIT_RETURN_IF_ERROR(CopyCanonical(m.plan.placements()[m.plan.Find(e.name).front()], dst,
                                          /*into_placement=*/false, cudaMemcpyDeviceToDevice,
                                          m.stream));
      REFIT_RETURN_IF_ERROR(plan.Add(WholePlacement(e.name, e.width, e.num_elements, 1,
                                                    reinterpret_cast<uint64_t>(dst))));
      ranges.push_back({dst, bytes});
    }
    REFIT_CUDA_RETURN(cudaStreamSynchronize(m.stream), "copy tensors");
    for (size_t k = 0; k < versions.size(); ++k) {
      const Impl::Version& v = versions[k];
      std::vector<size_t> indices;
      for (size_t g = i; g < j; ++g) {
        auto it = chunks.find(table[copied[g]].name);
        if (it != chunks.end()) indices.insert(indices.end(), it->second[k].begin(), it->second[k].end());
      }
      if (indices.empty()) continue;
      std::sort(indices.begin(), indices.end());
      std::vector<ChunkSpan> spans;
      // An XOR chunk whose range reaches "after" held its "before" (the
      // records are fixed, so "after" follows from "before" and only from
      // it): the "after" check of the apply also checks "before". Other
      // kinds (an overwrite reaches "after" from any base; a conditional
      // chunk's records depend on the base) are classified first.
      bool classify = false;
      for (size_t c : indices) {
        spans.push_back(v.spans[c]);
        classify = classify || !IsXorKind(v.kinds[c]);
      }
      if (appliers[k]) {
        REFIT_RETURN_IF_ERROR(appliers[k]->SetPlan(plan));
      } else {
        std::vector<std::string> names;
        for (const TensorEntry& e : *v.table) names.push_back(e.name);
        ReceiverOptions ro;
        ro.staging_bytes = m.opt.apply_staging_bytes;
        ro.verify = true;
        ro.host_threads = m.opt.host_threads;
        ro.device = m.opt.device;
        REFIT_ASSIGN_OR_RETURN(appliers[k], Receiver::Create(plan, std::move(names), ro));
      }
      Receiver* r = appliers[k].get();
      REFIT_ASSIGN_OR_RETURN(PreparedDelta p, r->Prepare(v.bytes, spans));
      std::vector<uint8_t> states;
      if (classify) {
        REFIT_ASSIGN_OR_RETURN(states, r->Classify(payloads[k], p));
      }
      // A refused chunk, named by its tensor and first element.
      const auto refused = [&](size_t st, const std::string& why) -> Status {
        const ChunkSpan& span = spans[p.chunk_of_status[st]];
        REFIT_ASSIGN_OR_RETURN(ChunkHeader h,
                               ParseChunkHeader(std::span(v.bytes).subspan(span.offset, span.size)));
        return DataLossError("chunk of tensor '" + (*v.table)[h.tensor_id].name + "' at element " +
                             std::to_string(h.start) + ": " + why);
      };
      for (size_t st = 0; st < states.size(); ++st) {
        if (states[st] != 0) return refused(st, "its range does not hold the chunk's base");
      }
      auto applied = r->Apply(payloads[k], p);
      if (!applied.ok()) {
        const std::vector<uint32_t>& status = r->last_status();
        for (size_t st = 0; st < status.size() && st < p.chunk_of_status.size(); ++st) {
          if (status[st] != kStatusOk && status[st] != kStatusSkipped) {
            return refused(st, "applied to a copy of its range as held here, it does not reach "
                               "its \"after\" hash (" + std::string(ChunkStatusName(status[st])) +
                               "): this GPU does not hold the chunk's base, or the chunk is "
                               "corrupt");
          }
        }
        return applied.status();
      }
    }
    REFIT_ASSIGN_OR_RETURN(auto hashes, RangeHashesDevice(ranges));
    for (size_t g = i; g < j; ++g) out[copied[g]] = hashes[g - i];
    i = j;
  }
  for (Impl::Version& v : versions) v.raw.reset();
  m.raw_bytes = 0;
  return out;
}

StagingUsage DeviceTarget::usage() const {
  const Impl& m = *impl_;
  StagingUsage u;
  u.host_limit = m.opt.host_staging_bytes;
  u.device_limit = m.opt.device_staging_bytes;
  u.staged_payload = m.staging.bytes();
  u.host_bytes = m.staging.bytes() + m.pinned_size;
  // The GPU receivers' arenas count once allocated (a receiver that only
  // applies staged deltas never allocates its arena).
  u.device_bytes = m.resident_bytes + m.raw_bytes + m.backup.size();
  for (const auto* cache : {&m.receivers, &m.unchecked}) {
    for (const auto& [names, r] : *cache) u.device_bytes += r->device_bytes();
  }
  return u;
}

}  // namespace refit::cuda
