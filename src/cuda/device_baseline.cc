#include "cuda/device_baseline.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>

#include "base/file.h"
#include "cuda/cuda_common.h"
#include "cuda/pipeline.h"
#include "delta/chunk.h"
#include "delta/encoder.h"
#include "format/safetensors.h"

namespace refit::cuda {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

Status Cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status();
  return internal::CudaError(e, what.c_str());
}

constexpr uint64_t kAlign = 256;  // each tensor starts on a 256-byte boundary

}  // namespace

DeviceBaseline::~DeviceBaseline() {
  if (memory_ == nullptr) return;
  (void)SetDevice();
  if (options_.pinned_host) {
    cudaFreeHost(memory_);
  } else {
    cudaFree(memory_);
  }
}

Status DeviceBaseline::SetDevice() const {
  return Cuda(cudaSetDevice(options_.device), "set device " + std::to_string(options_.device));
}

Result<std::unique_ptr<DeviceBaseline>> DeviceBaseline::Create(
    const std::vector<TensorView>& initial, const DeviceBaselineOptions& options) {
  std::unique_ptr<DeviceBaseline> b(new DeviceBaseline());
  b->options_ = options;
  REFIT_RETURN_IF_ERROR(b->SetDevice());
  // Canonical order (sorted by name), as a checkpoint lists its tensors.
  std::vector<const TensorView*> sorted;
  for (const TensorView& v : initial) sorted.push_back(&v);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorView* x, const TensorView* y) { return x->name < y->name; });
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i > 0 && sorted[i]->name == sorted[i - 1]->name) {
      return InvalidArgumentError("tensor '" + sorted[i]->name + "' appears twice");
    }
    const int w = sorted[i]->width;
    if (w != 1 && w != 2 && w != 4 && w != 8) {
      return InvalidArgumentError("tensor '" + sorted[i]->name + "' has element width " +
                                  std::to_string(sorted[i]->width) +
                                  "; the codec supports 1, 2, 4 and 8 bytes");
    }
    offsets.push_back(total);
    total += (TensorBytes(*sorted[i]) + kAlign - 1) / kAlign * kAlign;
  }
  b->stats_.bytes = total;
  if (total > 0) {
    cudaError_t e = options.pinned_host ? cudaMallocHost(&b->memory_, total)
                                        : cudaMalloc(&b->memory_, total);
    if (e != cudaSuccess) {
      b->memory_ = nullptr;
      return ResourceExhaustedError(
          std::string("cannot allocate the publisher's baseline (") + std::to_string(total) +
          " bytes of " + (options.pinned_host ? "page-locked host" : "device") +
          " memory): " + cudaGetErrorString(e) +
          (options.pinned_host ? "" : "; keep the baseline in page-locked host memory instead"));
    }
  }
  uint8_t* base = static_cast<uint8_t*>(b->memory_);
  for (size_t i = 0; i < sorted.size(); ++i) {
    TensorView v = *sorted[i];
    const uint64_t bytes = TensorBytes(v);
    if (bytes > 0) {
      if (v.data == nullptr) return InvalidArgumentError("tensor '" + v.name + "' has no data");
      REFIT_RETURN_IF_ERROR(Cuda(cudaMemcpy(base + offsets[i], v.data, bytes, cudaMemcpyDefault),
                                 "copy of initial tensor '" + v.name + "'"));
    }
    v.data = base + offsets[i];
    b->views_.push_back(std::move(v));
  }
  std::vector<DeviceRange> ranges;
  for (const TensorView& v : b->views_) ranges.push_back({v.data, TensorBytes(v)});
  REFIT_ASSIGN_OR_RETURN(b->hashes_, RangeHashesDevice(ranges));
  return b;
}

std::string DeviceBaseline::Describe() const {
  return std::string("the publisher's baseline in ") +
         (options_.pinned_host ? "page-locked host" : "device") + " memory (device " +
         std::to_string(options_.device) + ")";
}

Result<Hash128> DeviceBaseline::HashTensor(size_t i) {
  if (i >= hashes_.size()) return OutOfRangeError("no baseline tensor " + std::to_string(i));
  return hashes_[i];
}

Result<Hash128> DeviceBaseline::HashTarget(const TensorView& target) {
  REFIT_RETURN_IF_ERROR(SetDevice());
  const DeviceRange r{target.data, TensorBytes(target)};
  REFIT_ASSIGN_OR_RETURN(auto h, RangeHashesDevice(std::span<const DeviceRange>(&r, 1)));
  return h[0];
}

Result<DiffReport> DeviceBaseline::Diff(const std::vector<TensorView>& target,
                                        const DiffOptions& options, ChunkSink* sink) {
  const auto t0 = Clock::now();
  if (!options.allow_xor) {
    return InvalidArgumentError(
        "the GPU encoder writes XOR chunks only; a baseline in device memory cannot "
        "publish overwrite-only versions");
  }
  REFIT_RETURN_IF_ERROR(SetDevice());
  std::vector<size_t> base_order, target_order;
  REFIT_ASSIGN_OR_RETURN(auto entries,
                         MatchTensors(views_, target, &base_order, &target_order));
  DiffReport report;
  report.tensors = entries.size();
  std::vector<DeviceTensorPair> pairs(entries.size());
  std::vector<DeviceRange> after_ranges(entries.size());
  for (size_t t = 0; t < entries.size(); ++t) {
    const TensorView& b = views_[base_order[t]];
    const TensorView& n = target[target_order[t]];
    pairs[t].old_data = b.data;
    pairs[t].new_data = n.data;
    pairs[t].elements = entries[t].num_elements;
    pairs[t].width = entries[t].width;
    pairs[t].tensor_id = t;
    after_ranges[t] = {n.data, TensorBytes(n)};
    entries[t].before = hashes_[base_order[t]];
    report.total_elements += entries[t].num_elements;
    report.full_bytes += TensorBytes(n);
  }
  const auto th = Clock::now();
  REFIT_ASSIGN_OR_RETURN(std::vector<Hash128> after, RangeHashesDevice(after_ranges));
  stats_.last_hash_ms = MsSince(th);
  for (size_t t = 0; t < entries.size(); ++t) entries[t].after = after[t];

  GpuEncodeOptions eo = options_.encode;
  eo.version = options.version;
  eo.base_version = options.base_version;
  eo.chunk_bytes = options.chunk_bytes;
  eo.records_per_lane = options.records_per_lane;
  eo.host_threads = options.threads;
  eo.device = options_.device;
  std::vector<bool> changed(entries.size(), false);
  REFIT_ASSIGN_OR_RETURN(
      stats_.last_encode,
      EncodeOnDevice(pairs, eo,
                     [&](const GpuChunkInfo& info, std::span<const uint8_t> bytes) -> Status {
                       REFIT_ASSIGN_OR_RETURN(ParsedChunk parsed, ParseChunk(bytes));
                       report.payload_bytes += parsed.payload.size();
                       report.chunk_bytes += bytes.size();
                       ++report.chunks;
                       ++report.chunks_by_kind[ChunkKindName(info.header.kind)];
                       changed[info.pair] = true;
                       return sink->AddChunk(bytes, info.header);
                     }));
  report.changed_elements = stats_.last_encode.changed_elements;
  for (size_t t = 0; t < entries.size(); ++t) {
    if (changed[t]) ++report.changed_tensors;
    // A tensor without chunks must not have changed: the encoder and the
    // hashes agree, or the version would not apply.
    if (!changed[t] && entries[t].before != entries[t].after) {
      return InternalError("tensor '" + entries[t].name +
                           "' hashes differently but the GPU encoder found no change");
    }
  }
  REFIT_RETURN_IF_ERROR(sink->Finish(entries));
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  stats_.last_diff_ms = report.seconds * 1000;
  return report;
}

Status DeviceBaseline::Read(size_t i, uint64_t offset, uint64_t bytes, uint8_t* out) {
  if (i >= views_.size()) return OutOfRangeError("no baseline tensor " + std::to_string(i));
  return ReadTarget(views_[i], offset, bytes, out);
}

Status DeviceBaseline::ReadTarget(const TensorView& target, uint64_t offset, uint64_t bytes,
                                  uint8_t* out) {
  if (offset > TensorBytes(target) || bytes > TensorBytes(target) - offset) {
    return OutOfRangeError("read past the end of tensor '" + target.name + "'");
  }
  if (bytes == 0) return Status();
  REFIT_RETURN_IF_ERROR(SetDevice());
  return Cuda(cudaMemcpy(out, target.data + offset, bytes, cudaMemcpyDefault),
              "copy of tensor '" + target.name + "' to the host");
}

Status DeviceBaseline::Advance(const Manifest& m, const std::vector<TensorView>& target) {
  const auto t0 = Clock::now();
  REFIT_RETURN_IF_ERROR(SetDevice());
  std::map<std::string, size_t> base_index, target_index;
  for (size_t i = 0; i < views_.size(); ++i) base_index[views_[i].name] = i;
  for (size_t i = 0; i < target.size(); ++i) target_index[target[i].name] = i;
  std::vector<bool> touched(views_.size(), false);
  for (const ManifestChunk& mc : m.chunks) {
    const TensorEntry& e = m.tensors.at(mc.tensor_id);
    auto b = base_index.find(e.name);
    auto t = target_index.find(e.name);
    if (b == base_index.end() || t == target_index.end()) {
      return InternalError("the baseline or the target lost tensor '" + e.name + "'");
    }
    const uint64_t offset = mc.start * e.width, bytes = mc.count * e.width;
    if (offset + bytes > TensorBytes(views_[b->second])) {
      return InternalError("a chunk of tensor '" + e.name + "' lies past its end");
    }
    REFIT_RETURN_IF_ERROR(Cuda(
        cudaMemcpyAsync(const_cast<uint8_t*>(views_[b->second].data) + offset,
                        target[t->second].data + offset, bytes, cudaMemcpyDefault, nullptr),
        "baseline update of tensor '" + e.name + "'"));
    touched[b->second] = true;
  }
  std::vector<DeviceRange> ranges;
  std::vector<size_t> which;
  for (size_t i = 0; i < views_.size(); ++i) {
    if (!touched[i]) continue;
    ranges.push_back({views_[i].data, TensorBytes(views_[i])});
    which.push_back(i);
  }
  // The same stream as the copies: the hashes see them.
  REFIT_ASSIGN_OR_RETURN(std::vector<Hash128> hashes, RangeHashesDevice(ranges));
  std::vector<Hash128> next = hashes_;
  for (size_t k = 0; k < which.size(); ++k) next[which[k]] = hashes[k];
  for (const TensorEntry& e : m.tensors) {
    auto b = base_index.find(e.name);
    if (b == base_index.end() || next[b->second] != e.after) {
      return DataLossError("baseline tensor '" + e.name +
                           "' does not match the committed version after advancing");
    }
  }
  hashes_ = std::move(next);
  stats_.last_advance_ms = MsSince(t0);
  return Status();
}

Status DeviceBaseline::ForEachSnapshotFile(const SnapshotFileFn& put) {
  // One safetensors file, assembled in host memory through a temporary
  // file (WriteSafetensors writes files).
  std::vector<std::vector<uint8_t>> host(views_.size());
  std::vector<SafetensorsTensorView> tensors;
  for (size_t i = 0; i < views_.size(); ++i) {
    host[i].resize(TensorBytes(views_[i]));
    REFIT_RETURN_IF_ERROR(Read(i, 0, host[i].size(), host[i].data()));
    tensors.push_back(SafetensorsTensorView{views_[i].name, views_[i].dtype, views_[i].shape,
                                            host[i]});
  }
  const char* tmpdir = std::getenv("TMPDIR");
  static std::atomic<int> counter{0};
  const std::string path = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") +
                           "/refit-snapshot-" + std::to_string(getpid()) + "-" +
                           std::to_string(counter++) + ".safetensors";
  REFIT_RETURN_IF_ERROR(WriteSafetensors(path, {}, tensors));
  host.clear();
  Status s;
  {
    auto file = MappedFile::Open(path, MappedFile::Mode::kReadOnly);
    s = file.ok() ? put("model.safetensors", file->bytes()) : file.status();
  }
  Status removed = RemoveFile(path, /*sync=*/false);
  REFIT_RETURN_IF_ERROR(s);
  return removed;
}

}  // namespace refit::cuda
