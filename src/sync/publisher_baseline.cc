#include "sync/publisher_baseline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "base/bytes.h"
#include "base/file.h"
#include "base/parallel.h"
#include "delta/encoder.h"

namespace refit {

uint64_t TensorBytes(const TensorView& t) {
  uint64_t n = static_cast<uint64_t>(t.width);
  for (uint64_t d : t.shape) n *= d;
  return n;
}

FileBaseline::FileBaseline(Checkpoint ckpt, FileBaselineOptions options)
    : ckpt_(std::move(ckpt)), opt_(options) {}

Result<std::unique_ptr<FileBaseline>> FileBaseline::Open(const std::string& path,
                                                         FileBaselineOptions options) {
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(path, Checkpoint::Mode::kReadWrite));
  std::unique_ptr<FileBaseline> b(new FileBaseline(std::move(ckpt), options));
  b->views_ = CheckpointViews(b->ckpt_);
  b->digests_.resize(b->views_.size());
  // Before any tensor is hashed: a change made while they are is seen.
  b->stamps_ = b->Stamps();
  return b;
}

std::vector<FileStamp> FileBaseline::Stamps() const {
  std::vector<FileStamp> out;
  for (const CheckpointFile& f : ckpt_.files()) {
    std::optional<FileStamp> s = GetFileStamp(f.path);
    if (!s) return {};  // unknown: never matches
    out.push_back(*s);
  }
  return out;
}

bool FileBaseline::DigestsCurrent() const {
  for (const auto& d : digests_) {
    if (d.empty()) return false;
  }
  return !stamps_.empty() && Stamps() == stamps_;
}

bool FileBaseline::DigestsMatch(const std::vector<TensorEntry>& tensors) const {
  if (tensors.size() != views_.size()) return false;
  for (const TensorEntry& e : tensors) {
    std::optional<size_t> i = ckpt_.IndexOf(e.name);
    if (!i || digests_[*i].empty() ||
        HashSegmentDigests(digests_[*i].data(), digests_[*i].size()) != e.before) {
      return false;
    }
  }
  return true;
}

std::string FileBaseline::Describe() const { return "the baseline '" + ckpt_.path() + "'"; }

Result<Hash128> FileBaseline::HashTensor(size_t i) {
  auto d = ckpt_.Data(i);
  std::vector<Hash128>& digests = digests_[i];
  digests.resize(SegmentCount(d.size()));
  SegmentDigests(d.data(), d.size(), digests.data());
  return HashSegmentDigests(digests.data(), digests.size());
}

Result<Hash128> FileBaseline::HashTarget(const TensorView& target) {
  return RangeHash(target.data, TensorBytes(target));
}

// Passes chunks through; at Finish, notes whether the diff's "before"
// hashes (hashed from the baseline's bytes) are what the kept digests say.
class FileBaseline::ConfirmingSink final : public ChunkSink {
 public:
  ConfirmingSink(const FileBaseline* baseline, ChunkSink* sink)
      : baseline_(baseline), sink_(sink) {}
  Status AddChunk(std::span<const uint8_t> chunk, const ChunkHeader& header) override {
    return sink_->AddChunk(chunk, header);
  }
  Status Finish(const std::vector<TensorEntry>& tensors) override {
    confirmed_ = baseline_->DigestsMatch(tensors);
    return sink_->Finish(tensors);
  }
  bool confirmed() const { return confirmed_; }

 private:
  const FileBaseline* baseline_;
  ChunkSink* sink_;
  bool confirmed_ = false;
};

Result<DiffReport> FileBaseline::Diff(const std::vector<TensorView>& target,
                                      const DiffOptions& options, ChunkSink* sink) {
  const bool kept = DigestsCurrent() && (opt_.full_check_every <= 0 ||
                                         reused_ + 1 < opt_.full_check_every);
  last_diff_hashed_base_ = !kept;
  if (kept) {
    ++reused_;
    return DiffTensorsToSink(views_, target, options, sink, &digests_);
  }
  // The bytes are hashed. Digests they confirm are kept as checked now;
  // digests they contradict stay unconfirmed, so every later Diff hashes
  // the bytes too, and the Publisher refuses each version (its announced
  // hashes are the kept ones).
  const std::vector<FileStamp> stamps = Stamps();
  ConfirmingSink confirming(this, sink);
  REFIT_ASSIGN_OR_RETURN(DiffReport report,
                         DiffTensorsToSink(views_, target, options, &confirming));
  if (confirming.confirmed()) {
    reused_ = 0;
    stamps_ = stamps;
  }
  return report;
}

Status FileBaseline::Read(size_t i, uint64_t offset, uint64_t bytes, uint8_t* out) {
  auto d = ckpt_.Data(i);
  if (offset > d.size() || bytes > d.size() - offset) {
    return OutOfRangeError("read past the end of baseline tensor '" + views_[i].name + "'");
  }
  std::memcpy(out, d.data() + offset, bytes);
  return Status();
}

Status FileBaseline::ReadTarget(const TensorView& target, uint64_t offset, uint64_t bytes,
                                uint8_t* out) {
  if (offset > TensorBytes(target) || bytes > TensorBytes(target) - offset) {
    return OutOfRangeError("read past the end of target tensor '" + target.name + "'");
  }
  std::memcpy(out, target.data + offset, bytes);
  return Status();
}

Status FileBaseline::Advance(const Manifest& m, const std::vector<TensorView>& target) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  last_advance_ = AdvanceStages();
  std::unordered_map<std::string_view, const TensorView*> by_name;
  by_name.reserve(target.size());
  for (const TensorView& v : target) by_name.emplace(v.name, &v);

  // A chunk's byte range in its baseline tensor: a contiguous range, or
  // the span of a strided region's rows (bytes between rows are not in any
  // chunk, so target and baseline agree there).
  struct Range {
    size_t tensor;  // into views_
    const uint8_t* from;
    uint64_t offset, bytes;
  };
  std::vector<Range> ranges;
  ranges.reserve(m.chunks.size());
  for (const ManifestChunk& mc : m.chunks) {
    if (mc.tensor_id >= m.tensors.size()) return InternalError("chunk names no tensor");
    const TensorEntry& e = m.tensors[mc.tensor_id];
    auto it = by_name.find(e.name);
    if (it == by_name.end()) return InternalError("target lost tensor " + e.name);
    std::optional<size_t> idx = ckpt_.IndexOf(e.name);
    if (!idx) return InternalError("baseline lost tensor " + e.name);
    const uint64_t size = TensorBytes(views_[*idx]);
    uint64_t elements = mc.count;
    if (mc.run != 0 && mc.run < mc.count && mc.stride > mc.run) {
      if (mc.count % mc.run != 0 || !MulChecked(mc.count / mc.run - 1, mc.stride, &elements) ||
          elements > UINT64_MAX - mc.run) {
        return InternalError("chunk region of " + e.name + " is malformed");
      }
      elements += mc.run;
    }
    uint64_t offset = 0, bytes = 0;
    if (!MulChecked(mc.start, e.width, &offset) || !MulChecked(elements, e.width, &bytes) ||
        offset > size || bytes > size - offset || TensorBytes(*it->second) != size) {
      return InternalError("chunk range outside tensor " + e.name);
    }
    ranges.push_back(Range{*idx, it->second->data, offset, bytes});
  }

  // Tensors whose digests are not kept, or all of them when the files
  // changed since they were stamped, are hashed whole after the stores;
  // so are segments a range covers only in part.
  const bool current = DigestsCurrent();
  std::vector<char> whole(views_.size(), 0);
  for (size_t i = 0; i < views_.size(); ++i) whole[i] = !current || digests_[i].empty();
  std::mutex mu;
  std::vector<std::pair<size_t, uint64_t>> partial;  // tensor, segment
  std::atomic<uint64_t> stored{0};
  Status failed;  // the first write that failed, under mu
  constexpr uint64_t kBlock = 4096;
  ParallelForEach(ranges.size(), opt_.threads, [&](size_t r, int) {
    const Range& g = ranges[r];
    const uint8_t* dst = ckpt_.Data(g.tensor).data();
    const TensorInfo& info = ckpt_.tensors()[g.tensor];
    const std::string& file = ckpt_.files()[info.file_index].path;
    const uint64_t size = info.byte_size;
    const uint64_t end = g.offset + g.bytes;
    uint64_t written = 0;
    Status st;
    for (uint64_t seg = g.offset / kRangeHashSegment * kRangeHashSegment;
         seg < end && st.ok(); seg += kRangeHashSegment) {
      const uint64_t lo = std::max(seg, g.offset);
      const uint64_t seg_end = std::min<uint64_t>(seg + kRangeHashSegment, size);
      const uint64_t hi = std::min(seg_end, end);
      // Compared in blocks: a page that holds no change is not dirtied,
      // so the sync does not write it back. Runs of blocks that differ are
      // written through the file, not stored through the mapping (which
      // sees them at once, one page cache): a store to a clean mapped page
      // faults, once per page, and in virtual machines a fault costs
      // more than copying the page.
      uint64_t run = hi;  // start of the run of differing blocks, or none
      for (uint64_t p = lo; st.ok();) {
        const uint64_t n = std::min(kBlock, hi - p);
        const bool differs = n > 0 && std::memcmp(dst + p, g.from + p, n) != 0;
        if (differs && run == hi) run = p;
        if (!differs && run != hi) {
          st = WriteFileRange(file, info.offset + run, {g.from + run, p - run}, false);
          written += p - run;
          run = hi;
        }
        if (n == 0) break;
        p += n;
      }
      if (!st.ok() || whole[g.tensor]) continue;
      if (lo == seg && hi == seg_end) {
        // Chunks are disjoint, so no other range writes this digest.
        digests_[g.tensor][seg / kRangeHashSegment] = HashBytes(dst + seg, seg_end - seg);
      } else {
        std::lock_guard<std::mutex> lock(mu);
        partial.emplace_back(g.tensor, seg / kRangeHashSegment);
      }
    }
    stored += written;
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (failed.ok()) failed = st;
    }
  });
  REFIT_RETURN_IF_ERROR(failed);
  std::vector<size_t> rehash;
  for (size_t i = 0; i < views_.size(); ++i) {
    if (whole[i]) rehash.push_back(i);
  }
  ParallelForEach(rehash.size(), opt_.threads, [&](size_t k, int) {
    const size_t i = rehash[k];
    auto d = ckpt_.Data(i);
    digests_[i].resize(SegmentCount(d.size()));
    SegmentDigests(d.data(), d.size(), digests_[i].data());
  });
  std::sort(partial.begin(), partial.end());
  partial.erase(std::unique(partial.begin(), partial.end()), partial.end());
  for (const auto& [i, seg] : partial) {
    auto d = ckpt_.Data(i);
    const uint64_t off = seg * kRangeHashSegment;
    digests_[i][seg] = HashBytes(d.data() + off, std::min<uint64_t>(kRangeHashSegment, d.size() - off));
  }
  for (const Range& g : ranges) last_advance_.compared_bytes += g.bytes;
  last_advance_.stored_bytes = stored.load();

  for (const TensorEntry& e : m.tensors) {
    std::optional<size_t> i = ckpt_.IndexOf(e.name);
    if (!i || HashSegmentDigests(digests_[*i].data(), digests_[*i].size()) != e.after) {
      return DataLossError("baseline tensor '" + e.name +
                           "' does not match the committed version after advancing");
    }
  }
  const Clock::time_point synced = Clock::now();
  last_advance_.apply = std::chrono::duration<double>(synced - t0).count();
  REFIT_RETURN_IF_ERROR(ckpt_.Sync());
  // A full check has just hashed every tensor; either way the digests
  // hold what the files hold now.
  stamps_ = Stamps();
  if (!current) reused_ = 0;
  last_advance_.sync = std::chrono::duration<double>(Clock::now() - synced).count();
  return Status();
}

Status FileBaseline::ForEachSnapshotFile(const SnapshotFileFn& put) {
  REFIT_RETURN_IF_ERROR(ckpt_.Sync());
  // Names are relative to the checkpoint directory, or the file's own name.
  std::string root = ckpt_.path();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  const bool dir = IsDirectory(root);
  std::vector<std::pair<std::string, std::string>> files;  // name, path
  for (const CheckpointFile& f : ckpt_.files()) {
    std::string name = dir ? f.path.substr(root.size()) : f.path.substr(f.path.rfind('/') + 1);
    while (!name.empty() && name.front() == '/') name.erase(0, 1);
    files.emplace_back(name, f.path);
  }
  if (ckpt_.sharded()) {
    // Without its index a sharded directory does not open.
    files.emplace_back("model.safetensors.index.json", root + "/model.safetensors.index.json");
  }
  for (const auto& [name, path] : files) {
    REFIT_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path, MappedFile::Mode::kReadOnly));
    REFIT_RETURN_IF_ERROR(put(name, file.bytes()).WithContext("storing snapshot file " + path));
  }
  return Status();
}

}  // namespace refit
