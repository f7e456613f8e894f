// Checkpoints: the tensors refit reads and patches, as Hugging Face stores
// them in safetensors files (format: see src/format/safetensors.h).
//
// A Checkpoint is one .safetensors file, a directory holding
// model.safetensors, or a directory holding a sharded checkpoint
// (model.safetensors.index.json plus its shards). Whatever the layout, it
// presents one flat list of tensors in canonical order: sorted by name,
// compared byte by byte. Tensor data is never copied: every file is memory
// mapped, read-only or read-write (MAP_SHARED, so stores reach the file), and
// the Checkpoint owns its mappings until it is destroyed.
//
// Elements are opaque bit patterns of 1, 2, 4 or 8 bytes. refit needs only a
// dtype's element width; dtypes outside the safetensors spec get theirs from
// a DTypeRegistry.
//
// Thread safety: a Checkpoint is not synchronized; const methods may be
// called from several threads at once, and different threads may write
// disjoint byte ranges through MutableData() concurrently. DTypeRegistry is
// safe for concurrent const use.
#ifndef REFIT_CHECKPOINT_H_
#define REFIT_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit {

// Element widths by dtype name. Knows the safetensors spec dtypes (BOOL, U8,
// I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64)
// and a few others (F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, C64); callers declare
// any further dtype with Register (the CLI's --dtype-width NAME=N).
class DTypeRegistry {
 public:
  // Declares that `name` has `width`-byte elements. Fails with
  // kInvalidArgument when the name is empty or contains '=', when width is
  // not 1, 2, 4 or 8 (the element widths the delta codec handles), or when
  // `name` is a built-in dtype of another width. Registering a name again
  // replaces its width.
  Status Register(std::string_view name, int width);

  // Parses "NAME=N" (the --dtype-width flag) and registers it.
  Status RegisterFlag(std::string_view flag);

  // The element width of `dtype` in bytes: 1, 2, 4 or 8. Errors:
  //   kUnimplemented    a known dtype whose elements are not 1, 2, 4 or 8
  //                     bytes (C128, packed sub-byte F4/F6 types);
  //   kInvalidArgument  an unknown dtype; the message says how to declare it.
  Result<int> ElementWidth(std::string_view dtype) const;

 private:
  std::map<std::string, int, std::less<>> widths_;
};

// One tensor of a checkpoint, in canonical coordinates.
struct TensorInfo {
  std::string name;
  std::string dtype;            // as the file spells it, e.g. "BF16"
  int element_width = 0;        // bytes per element: 1, 2, 4 or 8
  std::vector<uint64_t> shape;  // [] is a scalar (one element)
  uint64_t num_elements = 0;    // product of shape
  size_t file_index = 0;        // into Checkpoint::files()
  uint64_t offset = 0;          // absolute byte offset in that file
  uint64_t byte_size = 0;       // num_elements * element_width
};

// One safetensors file of a checkpoint.
struct CheckpointFile {
  std::string path;
  uint64_t size = 0;                            // bytes
  std::map<std::string, std::string> metadata;  // the file's __metadata__
};

class Checkpoint {
 public:
  enum class Mode { kReadOnly, kReadWrite };

  // Opens `path`: a .safetensors file, or a directory holding
  // model.safetensors.index.json (sharded) or else model.safetensors.
  // Validates every file header completely (see ParseSafetensorsHeader in
  // src/format/safetensors.h) and, for a sharded checkpoint, that the index's
  // weight_map and the shards name exactly the same tensors.
  // Errors: kNotFound (no such path, or a directory with neither file),
  // kDataLoss (a malformed file or index, duplicate tensor names, a shard
  // path that is absolute or contains ".."), kInvalidArgument (a dtype of
  // unknown width: declare it in `dtypes`), kUnimplemented (a dtype whose
  // width the codec cannot handle), and file-system errors.
  // Note 1: a read-write open needs write permission on every shard.
  static Result<Checkpoint> Open(const std::string& path, Mode mode,
                                 const DTypeRegistry& dtypes = {});

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  Mode mode() const { return mode_; }
  // The path given to Open.
  const std::string& path() const { return path_; }
  // True for a directory with model.safetensors.index.json.
  bool sharded() const { return sharded_; }

  // All tensors in canonical order (sorted by name, byte-wise).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The safetensors files, in the order TensorInfo::file_index counts them
  // (sorted by path for a sharded checkpoint).
  const std::vector<CheckpointFile>& files() const { return files_; }

  // The index of `name` in tensors(), or nullopt.
  std::optional<size_t> IndexOf(std::string_view name) const;
  // The tensor called `name`, or nullptr.
  const TensorInfo* Find(std::string_view name) const;

  // The bytes of tensors()[index]. Requires index < tensors().size().
  std::span<const uint8_t> Data(size_t index) const;
  // Writable bytes of tensors()[index], which reach the file (call Sync or
  // SyncRange to make them durable). In kReadOnly mode, a span whose data()
  // is null. Requires index < tensors().size().
  std::span<uint8_t> MutableData(size_t index);

  // msync + fsync of every file; OK and a no-op in kReadOnly mode.
  Status Sync();
  // msync (rounded out to pages) + fsync of bytes [byte_offset,
  // byte_offset + length) of tensors()[tensor_index], offsets relative to the
  // tensor's first byte. kOutOfRange when the index or range is out of
  // bounds. OK and a no-op in kReadOnly mode.
  Status SyncRange(size_t tensor_index, uint64_t byte_offset, uint64_t length);

 private:
  struct Impl;
  Checkpoint();

  Mode mode_ = Mode::kReadOnly;
  std::string path_;
  bool sharded_ = false;
  std::vector<TensorInfo> tensors_;
  std::vector<CheckpointFile> files_;
  std::unique_ptr<Impl> impl_;  // the mappings
};

// Copies a checkpoint to `dst_path`: a file to a file, or a directory (all
// of its regular files, including the index and config JSON, and
// subdirectories) to a directory, created when missing. Each file is written
// atomically and fsynced; an existing file at a destination path is
// replaced. Tests and the demo use it to make a scratch copy to patch.
// Errors: kNotFound when src_path is missing, kInvalidArgument when src is a
// file and dst an existing directory, file-system errors otherwise.
Status CopyCheckpoint(const std::string& src_path, const std::string& dst_path);

}  // namespace refit

#endif  // REFIT_CHECKPOINT_H_
