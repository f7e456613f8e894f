#include "cuda/device_baseline.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "base/file.h"
#include "cuda/cuda_common.h"
#include "cuda/pipeline.h"
#include "delta/chunk.h"
#include "delta/encoder.h"
#include "format/safetensors.h"

namespace refit::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using internal::MsSince;

// CUDA calls as Status (cuda_common.h).
Status Cuda(cudaError_t e, const std::string& what) { return internal::CudaStatus(e, what); }

constexpr uint64_t kAlign = 256;  // each tensor starts on a 256-byte boundary

// The durable file's metadata key; its value is the version, 20 digits, so
// that the header keeps its length from one version to the next.
constexpr char kVersionKey[] = "refit_version";

std::map<std::string, std::string> VersionMetadata(uint64_t version) {
  char digits[24];
  std::snprintf(digits, sizeof(digits), "%020llu",
                static_cast<unsigned long long>(version));
  return {{kVersionKey, digits}};
}

Status PwriteAll(int fd, const uint8_t* data, uint64_t bytes, uint64_t offset,
                 const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, data, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("pwrite", path);
    }
    data += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status();
}

}  // namespace

// The background writer of the durable baseline file (device_baseline.h).
class DeviceBaseline::DurableWriter {
 public:
  struct Range {
    size_t tensor;
    uint64_t offset, bytes;
  };

  static Result<std::unique_ptr<DurableWriter>> Start(const DeviceBaseline& owner) {
    std::unique_ptr<DurableWriter> w(new DurableWriter(owner));
    const DeviceBaselineOptions& o = owner.options_;
    w->path_ = o.durable_path;
    w->buffer_bytes_ = std::max<uint64_t>(o.durable_buffer_bytes, uint64_t{1} << 20);
    for (const TensorView& v : owner.views_) w->entries_.push_back({v.name, v.dtype, v.shape});
    REFIT_ASSIGN_OR_RETURN(w->layout_, LayOutSafetensors(VersionMetadata(0), w->entries_));
    REFIT_RETURN_IF_ERROR(owner.SetDevice());
    REFIT_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&w->stream_, cudaStreamNonBlocking),
                               "stream for the durable baseline"));
    REFIT_RETURN_IF_ERROR(Cuda(cudaMallocHost(reinterpret_cast<void**>(&w->pinned_), w->buffer_bytes_),
                               "page-locked buffer for the durable baseline"));
    w->state_ = owner.loaded_;
    w->thread_ = std::thread([p = w.get()] { p->Run(); });
    return w;
  }

  ~DurableWriter() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (pinned_) cudaFreeHost(pinned_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Held by Advance while it changes the baseline, by the writer while it
  // copies from it.
  std::mutex& memory() { return memory_mu_; }

  // Advance, holding memory(), before it changes `ranges` for `version`.
  void Advancing(uint64_t version, std::vector<Range> ranges) {
    std::lock_guard<std::mutex> l(mu_);
    if (writing_) dirty_.insert(dirty_.end(), ranges.begin(), ranges.end());
    latest_ = version;
    pending_ = true;
    cv_.notify_all();
  }

  // Advance failed midway: the device memory holds no committed version.
  void Poison(const std::string& why) {
    std::lock_guard<std::mutex> l(mu_);
    poisoned_ = true;
    state_.error = "the baseline in device memory is no longer a committed version (" + why +
                   "); the durable file stays at version " +
                   std::to_string(state_.written_version);
    cv_.notify_all();
  }

  DurableState state() const {
    std::lock_guard<std::mutex> l(mu_);
    return state_;
  }

  Status Flush() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return poisoned_ || (!pending_ && !writing_); });
    if (!state_.error.empty()) return DataLossError("durable baseline file: " + state_.error);
    return Status();
  }

 private:
  explicit DurableWriter(const DeviceBaseline& owner) : owner_(owner) {}

  void Run() {
    (void)owner_.SetDevice();
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || (pending_ && !poisoned_); });
      if (!pending_ || poisoned_) return;  // stopping, nothing (more) to write
      pending_ = false;
      writing_ = true;
      dirty_.clear();
      l.unlock();
      const auto t0 = Clock::now();
      uint64_t version = 0;
      const Status s = Write(&version);
      l.lock();
      writing_ = false;
      if (s.ok()) {
        state_.written_version = version;
        ++state_.writes;
        state_.last_write_ms = MsSince(t0);
        if (!poisoned_) state_.error.clear();
      } else if (!poisoned_) {
        state_.error = s.ToString();
      }
      cv_.notify_all();
    }
  }

  // Copies [offset, offset + bytes) of tensor `t` from the baseline into
  // the file at `at`, a buffer at a time.
  Status CopyOut(int fd, const std::string& tmp, size_t t, uint64_t offset, uint64_t bytes,
                 uint64_t at) {
    const TensorView& v = owner_.views_[t];
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = std::min(buffer_bytes_, bytes - done);
      {
        std::lock_guard<std::mutex> m(memory_mu_);
        REFIT_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(pinned_, v.data + offset + done, n,
                                                   cudaMemcpyDefault, stream_),
                                   "copy of baseline tensor '" + v.name + "' for its file"));
        REFIT_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "durable baseline copy"));
      }
      REFIT_RETURN_IF_ERROR(PwriteAll(fd, pinned_, n, at + done, tmp));
      done += n;
    }
    return Status();
  }

  Status Write(uint64_t* version) {
    const std::string tmp = path_ + ".tmp-" + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus("open", tmp);
    Status s = WriteTo(fd, tmp, version);
    if (s.ok() && ::fsync(fd) != 0) s = ErrnoStatus("fsync", tmp);
    if (::close(fd) != 0 && s.ok()) s = ErrnoStatus("close", tmp);
    if (s.ok() && ::rename(tmp.c_str(), path_.c_str()) != 0) s = ErrnoStatus("rename", path_);
    if (s.ok()) s = SyncDirectoryOf(path_);
    if (!s.ok()) (void)RemoveFile(tmp, /*sync=*/false);
    return s;
  }

  Status WriteTo(int fd, const std::string& tmp, uint64_t* version) {
    if (::ftruncate(fd, static_cast<off_t>(layout_.file_size)) != 0) {
      return ErrnoStatus("ftruncate", tmp);
    }
    for (size_t t = 0; t < owner_.views_.size(); ++t) {
      REFIT_RETURN_IF_ERROR(CopyOut(fd, tmp, t, 0, layout_.sizes[t], layout_.offsets[t]));
    }
    // What Advance changed during the pass, until nothing is left; then the
    // file holds the version the memory held at that moment.
    for (;;) {
      std::vector<Range> again;
      {
        std::lock_guard<std::mutex> m(memory_mu_);
        std::lock_guard<std::mutex> l(mu_);
        if (poisoned_) return AbortedError("the baseline stopped being a committed version");
        if (dirty_.empty()) {
          *version = latest_;
          pending_ = false;  // this file holds the newest commit
          break;
        }
        again.swap(dirty_);
      }
      for (const Range& r : again) {
        REFIT_RETURN_IF_ERROR(
            CopyOut(fd, tmp, r.tensor, r.offset, r.bytes, layout_.offsets[r.tensor] + r.offset));
      }
    }
    REFIT_ASSIGN_OR_RETURN(SafetensorsLayout final,
                           LayOutSafetensors(VersionMetadata(*version), entries_));
    if (final.prefix.size() != layout_.prefix.size()) {
      return InternalError("the durable baseline's header changed its length");
    }
    return PwriteAll(fd, final.prefix.data(), final.prefix.size(), 0, tmp);
  }

  const DeviceBaseline& owner_;
  std::string path_;
  uint64_t buffer_bytes_ = 0;
  std::vector<SafetensorsEntry> entries_;
  SafetensorsLayout layout_;
  uint8_t* pinned_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::mutex memory_mu_;
  mutable std::mutex mu_;  // everything below
  std::condition_variable cv_;
  uint64_t latest_ = 0;
  bool pending_ = false, writing_ = false, stop_ = false, poisoned_ = false;
  std::vector<Range> dirty_;
  DurableState state_;
  std::thread thread_;
};

DurableState DeviceBaseline::durable() const {
  return durable_ ? durable_->state() : loaded_;
}

Status DeviceBaseline::FlushDurable() { return durable_ ? durable_->Flush() : Status(); }

DeviceBaseline::~DeviceBaseline() {
  durable_.reset();  // writes the newest commit, then stops reading memory_
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
  // A durable file from an earlier run: the baseline starts from its bytes.
  std::optional<SafetensorsFile> file;
  std::vector<TensorView> from_file;
  if (!options.durable_path.empty() && PathExists(options.durable_path)) {
    REFIT_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(options.durable_path,
                                                                    MappedFile::Mode::kReadOnly));
    file.emplace(std::move(f));
    auto version = file->metadata().find(kVersionKey);
    if (version == file->metadata().end() || file->tensors().size() != initial.size()) {
      return FailedPreconditionError(
          "durable baseline file " + options.durable_path +
          " was not written by a publisher of these tensors (no " + kVersionKey +
          ", or another tensor count); move it away to start from the given tensors");
    }
    for (const TensorView& v : initial) {
      const SafetensorsTensor* t = file->Find(v.name);
      if (t == nullptr || t->dtype != v.dtype || t->shape != v.shape) {
        return FailedPreconditionError("durable baseline file " + options.durable_path +
                                       " does not hold tensor '" + v.name +
                                       "' as given (name, dtype and shape)");
      }
      TensorView fv = v;
      fv.data = file->Data(static_cast<size_t>(t - file->tensors().data())).data();
      from_file.push_back(std::move(fv));
    }
    b->loaded_.loaded = true;
    b->loaded_.loaded_version = std::strtoull(version->second.c_str(), nullptr, 10);
    b->loaded_.written_version = b->loaded_.loaded_version;
  }
  const std::vector<TensorView>& source = file ? from_file : initial;
  // Canonical order (sorted by name), as a checkpoint lists its tensors.
  std::vector<const TensorView*> sorted;
  for (const TensorView& v : source) sorted.push_back(&v);
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
  if (!options.durable_path.empty()) {
    REFIT_ASSIGN_OR_RETURN(b->durable_, DurableWriter::Start(*b));
  }
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
  // The durable writer copies nothing while the baseline changes, and
  // learns which ranges change.
  std::unique_lock<std::mutex> quiet;
  if (durable_) quiet = std::unique_lock<std::mutex>(durable_->memory());
  Status s = AdvanceLocked(m, target);
  if (!s.ok() && durable_) durable_->Poison(s.ToString());
  return s;
}

Status DeviceBaseline::AdvanceLocked(const Manifest& m, const std::vector<TensorView>& target) {
  const auto t0 = Clock::now();
  REFIT_RETURN_IF_ERROR(SetDevice());
  std::map<std::string, size_t> base_index, target_index;
  for (size_t i = 0; i < views_.size(); ++i) base_index[views_[i].name] = i;
  for (size_t i = 0; i < target.size(); ++i) target_index[target[i].name] = i;
  // Every chunk's range is resolved and checked before anything is copied.
  struct Update {
    size_t base, target;
    uint64_t offset, bytes;
  };
  std::vector<Update> updates;
  updates.reserve(m.chunks.size());
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
    updates.push_back({b->second, t->second, offset, bytes});
  }
  if (durable_) {
    std::vector<DurableWriter::Range> changing;
    changing.reserve(updates.size());
    for (const Update& u : updates) changing.push_back({u.base, u.offset, u.bytes});
    durable_->Advancing(m.version, std::move(changing));
  }
  std::vector<bool> touched(views_.size(), false);
  for (const Update& u : updates) {
    REFIT_RETURN_IF_ERROR(Cuda(
        cudaMemcpyAsync(const_cast<uint8_t*>(views_[u.base].data) + u.offset,
                        target[u.target].data + u.offset, u.bytes, cudaMemcpyDefault, nullptr),
        "baseline update of tensor '" + views_[u.base].name + "'"));
    touched[u.base] = true;
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
