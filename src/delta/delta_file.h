// Delta files (docs/format.md §6): a header, chunks in tensor order, and a
// trailer that names the base and target by tensor hashes and indexes the
// chunks.
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

inline constexpr size_t kDeltaHeaderSize = 32;
inline constexpr size_t kDeltaFooterSize = 24;
inline constexpr uint64_t kMaxTensors = uint64_t{1} << 24;
inline constexpr uint64_t kMaxNameBytes = 4096;
inline constexpr uint64_t kMaxDims = 16;

struct TensorEntry {
  std::string name;
  std::string dtype;
  uint8_t width = 0;
  std::vector<uint64_t> shape;
  uint64_t num_elements = 0;
  Hash128 before;
  Hash128 after;
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
  bool finished_ = false;
};

class DeltaReader {
 public:
  static Result<DeltaReader> Open(const std::string& path);
  // Parses a delta held in memory (no I/O; for fuzzing). `bytes` must
  // outlive the reader.
  static Result<DeltaReader> FromBytes(std::span<const uint8_t> bytes);

  uint64_t version() const { return version_; }
  uint64_t base_version() const { return base_version_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::vector<IndexEntry>& index() const { return index_; }
  uint64_t file_size() const { return bytes_.size(); }

  // Parses chunk i and checks that its header agrees with the index.
  Result<ParsedChunk> ReadChunk(size_t i) const;

 private:
  Status Parse();
  MappedFile file_;
  std::span<const uint8_t> bytes_;
  uint64_t version_ = 0;
  uint64_t base_version_ = 0;
  std::vector<TensorEntry> tensors_;
  std::vector<IndexEntry> index_;
};

}  // namespace refit

#endif  // REFIT_DELTA_DELTA_FILE_H_
