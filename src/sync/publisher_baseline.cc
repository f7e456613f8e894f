#include "sync/publisher_baseline.h"

#include <cstring>
#include <map>

#include "base/file.h"
#include "delta/encoder.h"

namespace refit {

uint64_t TensorBytes(const TensorView& t) {
  uint64_t n = static_cast<uint64_t>(t.width);
  for (uint64_t d : t.shape) n *= d;
  return n;
}

FileBaseline::FileBaseline(Checkpoint ckpt) : ckpt_(std::move(ckpt)) {}

Result<std::unique_ptr<FileBaseline>> FileBaseline::Open(const std::string& path) {
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(path, Checkpoint::Mode::kReadWrite));
  std::unique_ptr<FileBaseline> b(new FileBaseline(std::move(ckpt)));
  b->views_ = CheckpointViews(b->ckpt_);
  return b;
}

std::string FileBaseline::Describe() const { return "the baseline '" + ckpt_.path() + "'"; }

Result<Hash128> FileBaseline::HashTensor(size_t i) {
  auto d = ckpt_.Data(i);
  return RangeHash(d.data(), d.size());
}

Result<Hash128> FileBaseline::HashTarget(const TensorView& target) {
  return RangeHash(target.data, TensorBytes(target));
}

Result<DiffReport> FileBaseline::Diff(const std::vector<TensorView>& target,
                                      const DiffOptions& options, ChunkSink* sink) {
  return DiffTensorsToSink(views_, target, options, sink);
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
  std::map<std::string, const TensorView*> by_name;
  for (const TensorView& v : target) by_name[v.name] = &v;
  for (const ManifestChunk& mc : m.chunks) {
    const TensorEntry& e = m.tensors[mc.tensor_id];
    auto it = by_name.find(e.name);
    if (it == by_name.end()) return InternalError("target lost tensor " + e.name);
    size_t idx = *ckpt_.IndexOf(e.name);
    std::memcpy(ckpt_.MutableData(idx).data() + mc.start * e.width,
                it->second->data + mc.start * e.width, mc.count * e.width);
  }
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    auto d = ckpt_.Data(*ckpt_.IndexOf(m.tensors[t].name));
    if (RangeHash(d.data(), d.size()) != m.tensors[t].after) {
      return DataLossError("baseline tensor '" + m.tensors[t].name +
                           "' does not match the committed version after advancing");
    }
  }
  return ckpt_.Sync();
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
