// Checkpoint: one flat, canonical view over the safetensors files of a
// single-file, single-directory or sharded Hugging Face checkpoint.
#include "refit/checkpoint.h"

#include <algorithm>
#include <cassert>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <map>
#include <system_error>
#include <utility>

#include "base/bytes.h"
#include "base/file.h"
#include "format/json.h"
#include "format/safetensors.h"

namespace refit {
namespace {

namespace fs = std::filesystem;
using internal::QuoteForMessage;

constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";

// An index maps every tensor name to a short file name; even a model with a
// million tensors stays far below this.
constexpr uint64_t kMaxIndexSize = 256ull << 20;
// The index's own "metadata" object is free-form; bound its nesting anyway.
constexpr int kMaxIndexDepth = 16;

Status ErrorCodeStatus(const std::error_code& ec, const std::string& what) {
  std::string msg = what + ": " + ec.message();
  if (ec == std::errc::no_such_file_or_directory) return NotFoundError(msg);
  if (ec == std::errc::permission_denied) return PermissionDeniedError(msg);
  if (ec == std::errc::no_space_on_device) return ResourceExhaustedError(msg);
  return InternalError(msg);
}

// A shard path from the index must stay inside the checkpoint directory.
Status CheckShardPath(const std::string& shard, const std::string& index_path) {
  bool bad = shard.empty() || shard.front() == '/' ||
             shard.find('\0') != std::string::npos;
  for (size_t start = 0; !bad && start <= shard.size();) {
    size_t slash = shard.find('/', start);
    if (slash == std::string::npos) slash = shard.size();
    if (shard.compare(start, slash - start, "..") == 0 && slash - start == 2) {
      bad = true;
    }
    start = slash + 1;
  }
  if (bad) {
    return DataLossError(index_path + ": shard path " + QuoteForMessage(shard) +
                         " must be a relative path without '..'");
  }
  return Status();
}

// Reads weight_map (tensor name -> shard path) from a sharded checkpoint's
// index.
Result<std::map<std::string, std::string>> ReadWeightMap(
    const std::string& index_path) {
  REFIT_ASSIGN_OR_RETURN(
      MappedFile index,
      MappedFile::Open(index_path, MappedFile::Mode::kReadOnly));
  if (index.size() > kMaxIndexSize) {
    return DataLossError(
        index_path + ": index of " + std::to_string(index.size()) +
        " bytes exceeds the limit of " + std::to_string(kMaxIndexSize));
  }
  std::string_view text(reinterpret_cast<const char*>(index.data()),
                        index.size());
  REFIT_ASSIGN_OR_RETURN(
      nlohmann::json root,
      internal::ParseJsonStrict(text, kMaxIndexDepth, index_path));
  if (!root.is_object()) {
    return DataLossError(index_path + ": JSON root is not an object");
  }
  auto wm = root.find("weight_map");
  if (wm == root.end() || !wm->is_object()) {
    return DataLossError(index_path + ": no \"weight_map\" object");
  }
  std::map<std::string, std::string> weight_map;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) {
      return DataLossError(index_path + ": weight_map value for " +
                           QuoteForMessage(it.key()) + " is not a string");
    }
    std::string shard = it->get<std::string>();
    REFIT_RETURN_IF_ERROR(CheckShardPath(shard, index_path));
    weight_map.emplace(it.key(), std::move(shard));
  }
  return weight_map;
}

// Cross-checks a shard's tensors against the index, both ways, in
// O(t log n) for a shard of t tensors and an index of n: every tensor of the
// shard must be placed in it by the index, and the index must place no more
// tensors in it (`indexed` of them) than it holds, so none is missing. The
// scan for the missing tensor's name runs only on the error path; scanning
// the whole index for every shard would cost O(shards * n).
Status CheckShardAgainstIndex(
    const SafetensorsFile& file, const std::string& shard,
    const std::map<std::string, std::string>& weight_map, size_t indexed,
    const std::string& index_path) {
  for (const SafetensorsTensor& t : file.tensors()) {
    auto it = weight_map.find(t.name);
    if (it == weight_map.end()) {
      return DataLossError(file.path() + ": tensor " + QuoteForMessage(t.name) +
                           " is missing from " + index_path);
    }
    if (it->second != shard) {
      return DataLossError(file.path() + " holds tensor " +
                           QuoteForMessage(t.name) + ", which " + index_path +
                           " places in " + QuoteForMessage(it->second));
    }
  }
  // Names in a file are unique, so the counts differ exactly when the index
  // places a tensor here that the file does not hold.
  if (indexed == file.tensors().size()) return Status();
  for (const auto& [name, where] : weight_map) {
    if (where == shard && file.Find(name) == nullptr) {
      return DataLossError(index_path + " places tensor " +
                           QuoteForMessage(name) + " in " + file.path() +
                           ", which does not hold it");
    }
  }
  return InternalError(index_path + ": tensor count of " + file.path() +
                       " disagrees with the index");
}

Status CopyFile(const std::string& src, const std::string& dst) {
  REFIT_ASSIGN_OR_RETURN(MappedFile in,
                         MappedFile::Open(src, MappedFile::Mode::kReadOnly));
  return WriteFileAtomic(dst, in.bytes());
}

}  // namespace

struct Checkpoint::Impl {
  std::vector<SafetensorsFile> files;  // parallel to Checkpoint::files_
};

Checkpoint::Checkpoint() : impl_(std::make_unique<Impl>()) {}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Result<Checkpoint> Checkpoint::Open(const std::string& path, Mode mode,
                                    const DTypeRegistry& dtypes) {
  const MappedFile::Mode map_mode = mode == Mode::kReadWrite
                                        ? MappedFile::Mode::kReadWrite
                                        : MappedFile::Mode::kReadOnly;
  Checkpoint c;
  c.mode_ = mode;
  c.path_ = path;

  // Shard paths relative to the directory, sorted so file indices are
  // deterministic, each with the number of tensors the index places in it
  // (unused for an unsharded checkpoint).
  std::map<std::string, size_t> shards;
  std::map<std::string, std::string> weight_map;
  std::string dir;
  std::string index_path;
  if (IsDirectory(path)) {
    dir = path;
    index_path = path + "/" + std::string(kIndexName);
    if (PathExists(index_path)) {
      c.sharded_ = true;
      REFIT_ASSIGN_OR_RETURN(weight_map, ReadWeightMap(index_path));
      for (const auto& [name, shard] : weight_map) ++shards[shard];
    } else if (PathExists(path + "/" + std::string(kSingleName))) {
      shards.emplace(std::string(kSingleName), 0);
    } else {
      return NotFoundError("directory '" + path + "' holds neither " +
                           std::string(kIndexName) + " nor " +
                           std::string(kSingleName));
    }
  } else if (PathExists(path)) {
    shards.emplace(path, 0);
  } else {
    return NotFoundError("no checkpoint at '" + path + "'");
  }

  for (const auto& [shard, indexed] : shards) {
    std::string file_path = dir.empty() ? shard : dir + "/" + shard;
    REFIT_ASSIGN_OR_RETURN(SafetensorsFile file,
                           SafetensorsFile::Open(file_path, map_mode, dtypes));
    if (c.sharded_) {
      REFIT_RETURN_IF_ERROR(CheckShardAgainstIndex(file, shard, weight_map,
                                                   indexed, index_path));
    }
    const size_t file_index = c.files_.size();
    for (const SafetensorsTensor& t : file.tensors()) {
      c.tensors_.push_back(TensorInfo{
          .name = t.name,
          .dtype = t.dtype,
          .element_width = t.element_width,
          .shape = t.shape,
          .num_elements = t.num_elements,
          .file_index = file_index,
          .offset = t.offset,
          .byte_size = t.byte_size,
      });
    }
    c.files_.push_back(CheckpointFile{
        .path = file.path(), .size = file.size(), .metadata = file.metadata()});
    c.impl_->files.push_back(std::move(file));
  }

  std::sort(
      c.tensors_.begin(), c.tensors_.end(),
      [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  for (size_t i = 1; i < c.tensors_.size(); ++i) {
    if (c.tensors_[i - 1].name == c.tensors_[i].name) {
      const TensorInfo& a = c.tensors_[i - 1];
      const TensorInfo& b = c.tensors_[i];
      return DataLossError("tensor " + QuoteForMessage(a.name) +
                           " appears in both " + c.files_[a.file_index].path +
                           " and " + c.files_[b.file_index].path);
    }
  }
  return c;
}

std::optional<size_t> Checkpoint::IndexOf(std::string_view name) const {
  auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return std::nullopt;
  return static_cast<size_t>(it - tensors_.begin());
}

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  std::optional<size_t> i = IndexOf(name);
  return i ? &tensors_[*i] : nullptr;
}

std::span<const uint8_t> Checkpoint::Data(size_t index) const {
  assert(index < tensors_.size());
  const TensorInfo& t = tensors_[index];
  return impl_->files[t.file_index].bytes().subspan(
      static_cast<size_t>(t.offset), static_cast<size_t>(t.byte_size));
}

std::span<uint8_t> Checkpoint::MutableData(size_t index) {
  assert(index < tensors_.size());
  const TensorInfo& t = tensors_[index];
  std::span<uint8_t> file = impl_->files[t.file_index].mutable_bytes();
  if (file.data() == nullptr) return {};
  return file.subspan(static_cast<size_t>(t.offset),
                      static_cast<size_t>(t.byte_size));
}

Status Checkpoint::Sync() {
  for (SafetensorsFile& f : impl_->files) REFIT_RETURN_IF_ERROR(f.Sync());
  return Status();
}

Status Checkpoint::SyncRange(size_t tensor_index, uint64_t byte_offset,
                             uint64_t length) {
  if (tensor_index >= tensors_.size()) {
    return OutOfRangeError("SyncRange: tensor index " +
                           std::to_string(tensor_index) + " of " +
                           std::to_string(tensors_.size()));
  }
  const TensorInfo& t = tensors_[tensor_index];
  if (!AddWithin(byte_offset, length, t.byte_size)) {
    return OutOfRangeError("SyncRange: bytes [" + std::to_string(byte_offset) +
                           ", +" + std::to_string(length) + ") are outside " +
                           QuoteForMessage(t.name) + " (" +
                           std::to_string(t.byte_size) + " bytes)");
  }
  return impl_->files[t.file_index].Sync(t.offset + byte_offset, length);
}

Status CopyCheckpoint(const std::string& src_path,
                      const std::string& dst_path) {
  if (!PathExists(src_path)) {
    return NotFoundError("no checkpoint at '" + src_path + "'");
  }
  if (!IsDirectory(src_path)) {
    if (IsDirectory(dst_path)) {
      return InvalidArgumentError("cannot copy file '" + src_path +
                                  "' over directory '" + dst_path + "'");
    }
    return CopyFile(src_path, dst_path);
  }
  // Directory listing and creation have no seam in base yet; they only touch
  // metadata, and every file's bytes still go through WriteFileAtomic.
  std::error_code ec;
  fs::create_directories(dst_path, ec);
  if (ec) return ErrorCodeStatus(ec, "cannot create '" + dst_path + "'");
  fs::recursive_directory_iterator it(src_path, ec);
  if (ec) return ErrorCodeStatus(ec, "cannot list '" + src_path + "'");
  // Files in sorted order make a failure reproducible.
  std::vector<fs::path> files;
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return ErrorCodeStatus(ec, "cannot list '" + src_path + "'");
    fs::path rel = it->path().lexically_relative(src_path);
    if (it->is_directory(ec)) {
      fs::create_directories(fs::path(dst_path) / rel, ec);
      if (ec) return ErrorCodeStatus(ec, "cannot create directory");
    } else if (it->is_regular_file(ec)) {
      files.push_back(rel);
    }
  }
  if (ec) return ErrorCodeStatus(ec, "cannot list '" + src_path + "'");
  std::sort(files.begin(), files.end());
  for (const fs::path& rel : files) {
    REFIT_RETURN_IF_ERROR(CopyFile((fs::path(src_path) / rel).string(),
                                   (fs::path(dst_path) / rel).string()));
  }
  return Status();
}

}  // namespace refit
