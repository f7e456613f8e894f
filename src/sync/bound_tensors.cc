#include "sync/bound_tensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "base/parallel.h"

namespace refit::internal {
namespace {

bool Describes(const TensorEntry& e, const std::string& dtype,
               const std::vector<uint64_t>& shape, int width) {
  return dtype == e.dtype && shape == e.shape && width == e.width;
}

}  // namespace

Result<BoundTensors> BindTensors(const std::string& checkpoint,
                                 const std::vector<MutableTensorView>& tensors,
                                 const std::vector<TensorEntry>& table, uint64_t version) {
  BoundTensors b;
  const std::string what = checkpoint.empty() ? "the receiver's in-memory tensors"
                                              : "checkpoint '" + checkpoint + "'";
  size_t have = tensors.size();
  if (!checkpoint.empty()) {
    REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt,
                           Checkpoint::Open(checkpoint, Checkpoint::Mode::kReadWrite));
    b.ckpt.emplace(std::move(ckpt));
    have = b.ckpt->tensors().size();
  }
  if (have != table.size()) {
    return FailedPreconditionError(what + " has " + std::to_string(have) +
                                   " tensors but version " + std::to_string(version) +
                                   " has " + std::to_string(table.size()) +
                                   "; it is not this model");
  }
  // By name, so that binding is linear in the tensors (10^5 and more).
  std::unordered_multimap<std::string_view, const MutableTensorView*> by_name;
  if (!b.ckpt) {
    by_name.reserve(tensors.size());
    for (const MutableTensorView& v : tensors) by_name.emplace(v.name, &v);
  }
  for (const TensorEntry& e : table) {
    uint8_t* data = nullptr;
    bool ok = false;
    if (b.ckpt) {
      const TensorInfo* t = b.ckpt->Find(e.name);
      if (t != nullptr && Describes(e, t->dtype, t->shape, t->element_width)) {
        size_t idx = *b.ckpt->IndexOf(e.name);
        b.ckpt_index.push_back(idx);
        data = b.ckpt->MutableData(idx).data();
        ok = true;
      }
    } else {
      auto [first, last] = by_name.equal_range(e.name);
      for (auto it = first; it != last && !ok; ++it) {
        const MutableTensorView& v = *it->second;
        if (Describes(e, v.dtype, v.shape, v.width) &&
            (v.data != nullptr || e.num_elements == 0)) {
          data = v.data;
          ok = true;
        }
      }
    }
    if (!ok) {
      return FailedPreconditionError(what + " lacks tensor '" + e.name + "' as version " +
                                     std::to_string(version) + " describes it");
    }
    b.data.push_back(data);
    b.bytes.push_back(e.num_elements * e.width);
  }
  return b;
}

namespace {

// Segments of a tensor of `bytes` bytes (one for an empty tensor).
size_t SegmentsOf(uint64_t bytes) {
  return bytes == 0 ? 1
                    : static_cast<size_t>((bytes + kRangeHashSegment - 1) /
                                          kRangeHashSegment);
}

// Digest of segment i of tensor t as its bytes are now.
Hash128 SegmentDigest(const BoundTensors& b, size_t t, size_t i) {
  const uint64_t off = i * kRangeHashSegment;
  return HashBytes(b.data[t] + off, std::min<uint64_t>(kRangeHashSegment, b.bytes[t] - off));
}

}  // namespace

Hash128 Digests::Ensure(const BoundTensors& b, size_t t) {
  if (!known_[t]) {
    std::vector<Hash128>& d = digests_[t];
    d.resize(SegmentsOf(b.bytes[t]));
    // Many segments per piece: a thread's share streams through memory.
    ParallelFor(d.size(), 64, threads_, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) d[i] = SegmentDigest(b, t, i);
    });
    known_[t] = true;
    stale_[t].assign(d.size(), false);
  }
  return HashSegmentDigests(digests_[t].data(), digests_[t].size());
}

void Digests::Seed(size_t t, std::vector<Hash128> digests) {
  digests_[t] = std::move(digests);
  known_[t] = true;
  stale_[t].assign(digests_[t].size(), false);
}

void Digests::Rewritten(const BoundTensors& b, size_t t, uint64_t offset,
                        uint64_t length, std::vector<Hash128>&& after) {
  if (!known_[t] || length == 0) return;
  const size_t first = offset / kRangeHashSegment;
  // Whole segments: the digests of a short last segment are the tensor's
  // only at its tail.
  const bool whole =
      offset % kRangeHashSegment == 0 &&
      (length % kRangeHashSegment == 0 || offset + length == b.bytes[t]) &&
      after.size() == SegmentsOf(length) &&
      first + after.size() <= digests_[t].size();
  if (!whole) return Written(t, offset, length);
  for (size_t i = 0; i < after.size(); ++i) {
    digests_[t][first + i] = after[i];
    stale_[t][first + i] = false;
  }
}

void Digests::Refresh(const BoundTensors& b) {
  std::vector<std::pair<size_t, size_t>> todo;  // (tensor, segment)
  for (size_t t = 0; t < digests_.size(); ++t) {
    if (!known_[t]) {
      digests_[t].resize(SegmentsOf(b.bytes[t]));
      stale_[t].assign(digests_[t].size(), true);
      known_[t] = true;
    }
    for (size_t i = 0; i < stale_[t].size(); ++i) {
      if (stale_[t][i]) todo.emplace_back(t, i);
    }
  }
  ParallelFor(todo.size(), 16, threads_, [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      const auto [t, i] = todo[k];
      digests_[t][i] = SegmentDigest(b, t, i);
    }
  });
  for (const auto& [t, i] : todo) stale_[t][i] = false;
}

std::vector<Hash128> Digests::Current(size_t t) const {
  if (!known_[t]) return {};
  for (bool s : stale_[t]) {
    if (s) return {};
  }
  return digests_[t];
}

Hash128 Digests::Range(const BoundTensors& b, size_t t, uint64_t offset,
                       uint64_t length) const {
  if (!known_[t] || length == 0 || offset % kRangeHashSegment != 0 ||
      (length % kRangeHashSegment != 0 && offset + length != b.bytes[t])) {
    return b.Range(t, offset, length);
  }
  const size_t first = offset / kRangeHashSegment;
  const size_t n = (length + kRangeHashSegment - 1) / kRangeHashSegment;
  for (size_t i = first; i < first + n; ++i) {
    if (stale_[t][i]) return b.Range(t, offset, length);
  }
  return HashSegmentDigests(digests_[t].data() + first, n);
}

void Digests::Written(size_t t, uint64_t offset, uint64_t length) {
  if (!known_[t] || length == 0) return;
  const size_t last = std::min<size_t>((offset + length - 1) / kRangeHashSegment,
                                       stale_[t].size() - 1);
  for (size_t i = offset / kRangeHashSegment; i <= last; ++i) stale_[t][i] = true;
}

std::vector<FileStamp> StampFiles(const BoundTensors& b) {
  std::vector<FileStamp> out;
  if (!b.ckpt) return out;
  for (const CheckpointFile& f : b.ckpt->files()) {
    struct stat st {};
    FileStamp s;
    if (::stat(f.path.c_str(), &st) == 0) {
      s.device = st.st_dev;
      s.inode = st.st_ino;
      s.size = static_cast<uint64_t>(st.st_size);
      s.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
      s.ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
    }
    out.push_back(s);
  }
  return out;
}

Status BaseCheck::Through(size_t upto) {
  for (; next_ <= upto && next_ < base_.size(); ++next_) {
    const size_t t = next_;
    const bool at_base = digests_->Ensure(b_, t) == base_[t].before;
    if (!resume_ && !at_base) {
      return DataLossError("tensor '" + base_[t].name + "' is not at " + of_ +
                           " (it does not hash to the announced base): the local model "
                           "was changed (resync this receiver), or the publisher's "
                           "baseline is not that version");
    }
    digests_->SetCovered(t, at_base && !resume_);
  }
  return Status();
}

Flusher::Flusher(const BoundTensors& b) : b_(b) {
  if (!b_.ckpt) return;
  for (const CheckpointFile& f : b_.ckpt->files()) {
    fds_.push_back(open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
  }
  thread_ = std::thread([this] { Run(); });
}

Flusher::~Flusher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (int fd : fds_) {
    if (fd >= 0) close(fd);
  }
}

void Flusher::Add(size_t t, uint64_t offset, uint64_t length) {
  if (!b_.ckpt) return;
  const TensorInfo& info = b_.ckpt->tensors()[b_.ckpt_index[t]];
  if (info.file_index >= fds_.size() || fds_[info.file_index] < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back({fds_[info.file_index], info.offset + offset, length});
  cv_.notify_all();
}

void Flusher::Run() {
  for (;;) {
    Range r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || done_; });
      if (done_) return;  // what is left is written by the flush
      r = queue_.front();
      queue_.pop_front();
    }
    (void)sync_file_range(r.fd, static_cast<off64_t>(r.offset),
                          static_cast<off64_t>(r.length), SYNC_FILE_RANGE_WRITE);
  }
}

}  // namespace refit::internal
