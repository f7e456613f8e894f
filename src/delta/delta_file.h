// Delta files (docs/format.md §6): a header, chunks in tensor order, and a
// trailer that names the base and target by tensor hashes, indexes the
// chunks and (format version 2) carries the target's safetensors headers.
//
// DeltaWriter streams: each chunk is written as soon as it is handed over,
// so memory does not grow with the delta; the file appears under its final
// name only after Finish() (temp file, fsync, rename, fsync of the folder).
// DeltaReader validates the footer, trailer checksum and index before any
// chunk is read, and hands out chunks as spans into its memory map.
// Neither class is thread-safe; a DeltaReader's spans may be read from
// several threads.
#ifndef REFIT_DELTA_DELTA_FILE_H_
#define REFIT_DELTA_DELTA_FILE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/file.h"
#include "base/hash.h"
#include "delta/chunk.h"
#include "refit/status.h"

namespace refit {

// The delta file's own version (docs/format.md §6), distinct from the chunk
// framing's kFormatVersion. Version 2 added the file-header section;
// readers accept every version from kMinDeltaFormatVersion on.
inline constexpr uint16_t kDeltaFormatVersion = 2;
inline constexpr uint16_t kMinDeltaFormatVersion = 1;
inline constexpr size_t kDeltaHeaderSize = 32;
inline constexpr size_t kDeltaFooterSize = 24;
inline constexpr uint64_t kMaxTensors = uint64_t{1} << 24;
inline constexpr uint64_t kMaxNameBytes = 4096;
inline constexpr uint64_t kMaxDims = 16;
// File-header section (docs/format.md §6, §7): a sharded checkpoint has far
// fewer shards; a header is capped as the safetensors spec caps it.
inline constexpr uint64_t kMaxCarriedFiles = uint64_t{1} << 16;
inline constexpr uint64_t kMaxCarriedHeaderBytes = 100'000'000;

struct TensorEntry {
  std::string name;
  std::string dtype;
  uint8_t width = 0;
  std::vector<uint64_t> shape;
  uint64_t num_elements = 0;
  Hash128 before;
  Hash128 after;
};

// One safetensors file's header as the target holds it: `name` is the
// file's path relative to the checkpoint directory ("model.safetensors" for
// a checkpoint that is one file), `json` the file's bytes 8 .. 8 + N (its
// JSON header with any trailing padding).
struct CarriedHeader {
  std::string name;
  std::vector<uint8_t> json;
};

struct IndexEntry {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t tensor_id = 0;
  uint64_t start = 0;
  uint64_t count = 0;
  codec::ChunkKind kind = codec::ChunkKind::kSparseXor;
};

// The tensor table of docs/format.md §6 (also carried by manifests).
void WriteTensorTable(const std::vector<TensorEntry>& tensors,
                      std::vector<uint8_t>* out);
Status ReadTensorTable(ByteReader* reader, std::vector<TensorEntry>* out);

// Where encoded chunks go: a delta file, or a transport.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  // Takes one serialized chunk, in tensor-table order then by start.
  virtual Status AddChunk(std::span<const uint8_t> chunk,
                          const ChunkHeader& header) = 0;
  // Called once after the last chunk with the complete tensor table.
  virtual Status Finish(const std::vector<TensorEntry>& tensors) = 0;
};

class DeltaWriter : public ChunkSink {
 public:
  static Result<std::unique_ptr<DeltaWriter>> Create(const std::string& path,
                                                     uint64_t version,
                                                     uint64_t base_version);
  ~DeltaWriter();  // removes the temp file unless Finish() succeeded

  // Appends one serialized chunk.
  Status AddChunk(std::span<const uint8_t> chunk,
                  const ChunkHeader& header) override;
  // Sets the target's file headers that Finish() writes into the trailer;
  // without a call the section is empty. Requires names unique, 1..4096
  // bytes, at most kMaxCarriedFiles of them, and each json 2 ..
  // kMaxCarriedHeaderBytes bytes (kInvalidArgument otherwise).
  Status SetCarriedHeaders(std::vector<CarriedHeader> headers);
  // Writes trailer and footer and publishes the file.
  Status Finish(const std::vector<TensorEntry>& tensors) override;

  uint64_t bytes_written() const { return offset_; }

 private:
  DeltaWriter() = default;
  Status Write(const uint8_t* p, size_t n);
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  std::vector<uint8_t> header_;
  std::vector<IndexEntry> index_;
  std::vector<CarriedHeader> headers_;  // sorted by name
  bool finished_ = false;
};

class DeltaReader {
 public:
  static Result<DeltaReader> Open(const std::string& path);
  // Parses a delta held in memory (no I/O; for fuzzing). `bytes` must
  // outlive the reader.
  static Result<DeltaReader> FromBytes(std::span<const uint8_t> bytes);

  // The file's format version: 1 (no file headers) or 2.
  uint16_t format_version() const { return format_version_; }
  uint64_t version() const { return version_; }
  uint64_t base_version() const { return base_version_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::vector<IndexEntry>& index() const { return index_; }
  // The target's safetensors headers, sorted by name; empty for a version 1
  // delta or a diff of tensors in memory.
  const std::vector<CarriedHeader>& headers() const { return headers_; }
  uint64_t file_size() const { return bytes_.size(); }

  // Parses chunk i and checks that its header agrees with the index.
  Result<ParsedChunk> ReadChunk(size_t i) const;

 private:
  Status Parse();
  Status ParseCarriedHeaders(ByteReader* reader);
  MappedFile file_;
  std::span<const uint8_t> bytes_;
  uint16_t format_version_ = 0;
  uint64_t version_ = 0;
  uint64_t base_version_ = 0;
  std::vector<TensorEntry> tensors_;
  std::vector<IndexEntry> index_;
  std::vector<CarriedHeader> headers_;
};

}  // namespace refit

#endif  // REFIT_DELTA_DELTA_FILE_H_
