// The safetensors file format: parsing, mapping and writing.
//
// A file is an 8-byte little-endian u64 N, then N bytes of UTF-8 JSON
//   {"<name>": {"dtype": "BF16", "shape": [d0, ...], "data_offsets": [b, e]},
//    ..., "__metadata__": {"<key>": "<string>", ...}}
// that begin with '{' and may end with JSON whitespace only (spaces pad it),
// then the data buffer; each tensor's bytes are [b, e) of the buffer, and the
// tensors tile the buffer exactly: ordered by (b, e), each begins where the
// previous one ended and the last ends at the end of the buffer (upstream
// spec: huggingface/safetensors README, "Format"; the rules are those of the
// reference reader, safetensors/src/tensor.rs).
//
// ParseSafetensorsHeader does no I/O and treats its input as hostile, so it
// is fuzzed (fuzz/safetensors_header_fuzz.cc). SafetensorsFile owns one
// memory mapping; it is movable, not copyable, and not synchronized (const
// use from several threads is safe).
#ifndef REFIT_FORMAT_SAFETENSORS_H_
#define REFIT_FORMAT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/file.h"
#include "refit/checkpoint.h"
#include "refit/status.h"

namespace refit {

// The spec's cap on N, which bounds what a hostile header can make us
// allocate.
inline constexpr uint64_t kMaxSafetensorsHeaderSize = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  int element_width = 0;  // 1, 2, 4 or 8
  std::vector<uint64_t> shape;
  uint64_t num_elements = 0;
  uint64_t offset = 0;     // absolute byte offset in the file
  uint64_t byte_size = 0;  // num_elements * element_width
};

struct SafetensorsHeader {
  uint64_t header_size = 0;  // N
  uint64_t data_start = 0;   // 8 + N: where the data buffer begins
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsTensor> tensors;  // sorted by name, byte-wise
};

// Parses and fully validates the header of a safetensors file of
// `file_size` bytes whose first bytes are `file_prefix` (at least 8 + N of
// them; the whole file is fine). Errors, all with a message naming the
// problem:
//   kDataLoss        N > kMaxSafetensorsHeaderSize or past the end of the
//                    file; malformed JSON or UTF-8; a header that does not
//                    begin with '{' (a byte order mark, leading whitespace)
//                    or has anything but JSON whitespace after its JSON (a
//                    NUL byte, other text); a JSON value of the wrong
//                    type; a missing field; a duplicate key; an empty tensor
//                    name; a shape dimension that is negative, fractional or
//                    too large; an element count or byte size that
//                    overflows; data_offsets reversed, out of the buffer, not
//                    equal to the tensor's size, overlapping, or leaving a
//                    hole (tensors must tile the data buffer exactly); a
//                    zero-size tensor whose offset lies inside another
//                    tensor; a metadata value that is not a string;
//   kInvalidArgument a dtype of unknown width (see DTypeRegistry), or a
//                    prefix shorter than 8 + N bytes;
//   kUnimplemented   a dtype whose width the codec does not handle.
// Note 1: unknown fields inside a tensor entry are ignored, as the reference
// implementation does.
// Note 2: a scalar (shape []) has one element; a shape containing 0 has none,
// and its offsets [b, b] must fall where one tensor ends and the next begins
// (or at 0, or at the end of the buffer).
// Note 3: O(n log n) in the number of tensors; ~10^5 tensors parse in a few
// hundred milliseconds (docs/benchmarks.md, "Opening large checkpoints").
Result<SafetensorsHeader> ParseSafetensorsHeader(
    std::span<const uint8_t> file_prefix, uint64_t file_size,
    const DTypeRegistry& dtypes = {});

// A memory-mapped safetensors file with a validated header.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> Open(const std::string& path,
                                      MappedFile::Mode mode,
                                      const DTypeRegistry& dtypes = {});

  const std::string& path() const { return map_.path(); }
  uint64_t size() const { return map_.size(); }
  bool writable() const { return writable_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<SafetensorsTensor>& tensors() const {
    return header_.tensors;
  }
  const std::map<std::string, std::string>& metadata() const {
    return header_.metadata;
  }

  // The whole mapped file; mutable_bytes() has a null data() when the file
  // was opened read-only.
  std::span<const uint8_t> bytes() const { return map_.bytes(); }
  std::span<uint8_t> mutable_bytes() {
    return {map_.mutable_data(), map_.mutable_data() ? map_.size() : 0};
  }

  // The tensor called `name`, or nullptr.
  const SafetensorsTensor* Find(std::string_view name) const;

  // The bytes of tensors()[index]. Requires index < tensors().size().
  std::span<const uint8_t> Data(size_t index) const;
  // Writable bytes of tensors()[index]; data() is null when the file was
  // opened read-only. Requires index < tensors().size().
  std::span<uint8_t> MutableData(size_t index);

  // msync + fsync of the file bytes [offset, offset + length) (absolute
  // offsets, clamped to the file), or of the whole file. No-ops when
  // read-only.
  Status Sync(uint64_t offset, uint64_t length);
  Status Sync();

 private:
  SafetensorsFile(MappedFile map, SafetensorsHeader header, bool writable)
      : map_(std::move(map)), header_(std::move(header)), writable_(writable) {}

  MappedFile map_;
  SafetensorsHeader header_;
  bool writable_ = false;
};

// A tensor to write: its bytes are borrowed for the duration of the call.
struct SafetensorsTensorView {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::span<const uint8_t> data;
};

// Writes a safetensors file atomically (a temporary file, fsync, rename):
// the header JSON with "__metadata__" first (omitted when empty), then the
// tensors sorted by name, each entry {"dtype","shape","data_offsets"}, padded
// with spaces to a multiple of 8 bytes as the reference writer does; then the
// tensor bytes, contiguous, in the same order. Output is deterministic.
// Errors: kInvalidArgument for an empty, reserved ("__metadata__") or
// duplicate name, invalid UTF-8, or data whose size is not
// prod(shape) * width; dtype errors as DTypeRegistry::ElementWidth; file
// errors as WriteFileAtomic.
// Note 1: the tensors are assembled in memory before the write, so this is
// meant for test fixtures and small checkpoints.
Status WriteSafetensors(const std::string& path,
                        const std::map<std::string, std::string>& metadata,
                        std::span<const SafetensorsTensorView> tensors,
                        const DTypeRegistry& dtypes = {});

// Where WriteSafetensors puts each tensor, for writers that stream the
// data themselves: `prefix` is the file's first 8 + N bytes (N, then the
// header JSON, padded), offsets[i] the file offset of entries[i]'s bytes
// (sizes[i] of them), file_size the whole file's. Errors as
// WriteSafetensors's (no data is read).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
};
struct SafetensorsLayout {
  std::vector<uint8_t> prefix;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> sizes;
  uint64_t file_size = 0;
};
Result<SafetensorsLayout> LayOutSafetensors(
    const std::map<std::string, std::string>& metadata,
    std::span<const SafetensorsEntry> entries, const DTypeRegistry& dtypes = {});

// Reads the header of the safetensors file at `path`: its bytes 8 .. 8 + N
// (the JSON with any trailing padding), without mapping or parsing the
// file. Errors: kDataLoss when N > kMaxSafetensorsHeaderSize or the file
// ends before 8 + N bytes; file errors as ReadFileRange.
Result<std::vector<uint8_t>> ReadSafetensorsHeaderBytes(const std::string& path);

// Overwrites the header of the safetensors file at `path` in place with
// `json`, which must be exactly as long as the header it replaces (the
// 8-byte N and every tensor byte stay as they are; kFailedPrecondition
// otherwise). One pwrite, then fsync when `sync`. It does not check that
// `json` describes the file's data: callers parse it first. Not atomic (see
// WriteFileRange).
Status WriteSafetensorsHeaderInPlace(const std::string& path,
                                     std::span<const uint8_t> json, bool sync);

}  // namespace refit

#endif  // REFIT_FORMAT_SAFETENSORS_H_
