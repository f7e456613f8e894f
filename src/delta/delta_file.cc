#include "delta/delta_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/bytes.h"

namespace refit {
namespace {

constexpr char kHeaderMagic[8] = {'R', 'E', 'F', 'I', 'T', 'D', 'L', 'T'};
constexpr char kFooterMagic[8] = {'R', 'E', 'F', 'I', 'T', 'E', 'N', 'D'};

uint64_t TrailerChecksum(std::span<const uint8_t> header,
                         std::span<const uint8_t> trailer) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, header.data(), header.size());
  XXH3_64bits_update(st, trailer.data(), trailer.size());
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

Status IoError(const std::string& what, const std::string& path) {
  std::string msg = what + " '" + path + "': " + std::strerror(errno);
  if (errno == ENOSPC || errno == EDQUOT) return ResourceExhaustedError(msg);
  if (errno == ENOENT) return NotFoundError(msg);
  if (errno == EACCES || errno == EROFS) return PermissionDeniedError(msg);
  return UnavailableError(msg);
}

}  // namespace

void WriteTensorTable(const std::vector<TensorEntry>& tensors,
                      std::vector<uint8_t>* out) {
  ByteWriter w(out);
  w.Varint(tensors.size());
  for (const TensorEntry& t : tensors) {
    w.String(t.name);
    w.String(t.dtype);
    w.U8(t.width);
    w.Varint(t.shape.size());
    for (uint64_t d : t.shape) w.Varint(d);
    PutHash(w, t.before);
    PutHash(w, t.after);
  }
}

Status ReadTensorTable(ByteReader* reader, std::vector<TensorEntry>* out) {
  ByteReader& r = *reader;
  uint64_t tensor_count = r.Varint();
  if (tensor_count > kMaxTensors || tensor_count > r.remaining() / 36) {
    REFIT_RETURN_IF_ERROR(r.status("tensor table"));
    return DataLossError("tensor table names an implausible number of tensors (" +
                         std::to_string(tensor_count) + ")");
  }
  std::vector<TensorEntry>& tensors = *out;
  tensors.assign(tensor_count, TensorEntry{});
  for (uint64_t i = 0; i < tensor_count && r.ok(); ++i) {
    TensorEntry& t = tensors[i];
    t.name = r.String(kMaxNameBytes);
    t.dtype = r.String(32);
    t.width = r.U8();
    uint64_t ndim = r.Varint();
    if (ndim > kMaxDims) {
      return DataLossError("tensor has more than 16 dimensions");
    }
    uint64_t elements = 1;
    for (uint64_t d = 0; d < ndim && r.ok(); ++d) {
      uint64_t dim = r.Varint();
      t.shape.push_back(dim);
      if (!MulChecked(elements, dim, &elements)) {
        return DataLossError("tensor shape overflows");
      }
    }
    t.num_elements = elements;
    t.before = GetHash(r);
    t.after = GetHash(r);
    if (!r.ok()) break;
    uint64_t bytes;
    if (t.name.empty() || t.dtype.empty() ||
        (t.width != 1 && t.width != 2 && t.width != 4 && t.width != 8) ||
        !MulChecked(elements, t.width, &bytes) || bytes > (uint64_t{1} << 62)) {
      return DataLossError("tensor table entry " + std::to_string(i) +
                           " is malformed");
    }
    if (i > 0 && !(tensors[i - 1].name < t.name)) {
      return DataLossError("tensor table is not sorted by unique name");
    }
  }
  return r.status("tensor table");
}

// ---------------------------------------------------------------- writer

Result<std::unique_ptr<DeltaWriter>> DeltaWriter::Create(
    const std::string& path, uint64_t version, uint64_t base_version) {
  std::unique_ptr<DeltaWriter> w(new DeltaWriter());
  w->path_ = path;
  w->tmp_path_ = path + ".tmp." + std::to_string(getpid());
  w->fd_ = open(w->tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                0644);
  if (w->fd_ < 0) return IoError("cannot create", w->tmp_path_);
  ByteWriter h(&w->header_);
  h.Bytes(kHeaderMagic, 8);
  h.U16(kDeltaFormatVersion);
  h.U16(0);
  h.U32(0);
  h.U64(version);
  h.U64(base_version);
  REFIT_RETURN_IF_ERROR(w->Write(w->header_.data(), w->header_.size()));
  return w;
}

DeltaWriter::~DeltaWriter() {
  if (fd_ >= 0) close(fd_);
  if (!finished_ && !tmp_path_.empty()) unlink(tmp_path_.c_str());
}

Status DeltaWriter::Write(const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t k = write(fd_, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return IoError("cannot write", tmp_path_);
    }
    p += k;
    n -= static_cast<size_t>(k);
    offset_ += static_cast<uint64_t>(k);
  }
  return Status();
}

Status DeltaWriter::AddChunk(std::span<const uint8_t> chunk,
                             const ChunkHeader& h) {
  if (finished_) return FailedPreconditionError("delta already finished");
  IndexEntry e;
  e.offset = offset_;
  e.size = chunk.size();
  e.tensor_id = h.tensor_id;
  e.start = h.start;
  e.count = h.count;
  e.kind = h.kind;
  index_.push_back(e);
  return Write(chunk.data(), chunk.size());
}

Status DeltaWriter::SetCarriedHeaders(std::vector<CarriedHeader> headers) {
  if (finished_) return FailedPreconditionError("delta already finished");
  if (headers.size() > kMaxCarriedFiles) {
    return InvalidArgumentError("cannot carry the headers of " +
                                std::to_string(headers.size()) +
                                " files; the format's limit is " +
                                std::to_string(kMaxCarriedFiles));
  }
  std::sort(headers.begin(), headers.end(),
            [](const CarriedHeader& a, const CarriedHeader& b) {
              return a.name < b.name;
            });
  for (size_t i = 0; i < headers.size(); ++i) {
    const CarriedHeader& h = headers[i];
    if (h.name.empty() || h.name.size() > kMaxNameBytes) {
      return InvalidArgumentError("file name of " +
                                  std::to_string(h.name.size()) +
                                  " bytes cannot be carried (1..4096)");
    }
    if (i > 0 && headers[i - 1].name == h.name) {
      return InvalidArgumentError("file '" + h.name + "' given twice");
    }
    if (h.json.size() < 2 || h.json.size() > kMaxCarriedHeaderBytes) {
      return InvalidArgumentError("header of '" + h.name + "' has " +
                                  std::to_string(h.json.size()) +
                                  " bytes, outside 2..100,000,000");
    }
  }
  headers_ = std::move(headers);
  return Status();
}

Status DeltaWriter::Finish(const std::vector<TensorEntry>& tensors) {
  if (finished_) return FailedPreconditionError("delta already finished");
  std::vector<uint8_t> trailer;
  ByteWriter w(&trailer);
  WriteTensorTable(tensors, &trailer);
  w.Varint(index_.size());
  for (const IndexEntry& e : index_) {
    w.Varint(e.offset);
    w.Varint(e.size);
    w.Varint(e.tensor_id);
    w.Varint(e.start);
    w.Varint(e.count);
    w.U8(static_cast<uint8_t>(e.kind));
  }
  w.Varint(headers_.size());
  for (const CarriedHeader& h : headers_) {
    w.String(h.name);
    w.Varint(h.json.size());
    w.Bytes(h.json);
  }
  uint64_t trailer_offset = offset_;
  std::vector<uint8_t> footer;
  ByteWriter f(&footer);
  f.U64(trailer_offset);
  f.U64(TrailerChecksum(header_, trailer));
  f.Bytes(kFooterMagic, 8);
  REFIT_RETURN_IF_ERROR(Write(trailer.data(), trailer.size()));
  REFIT_RETURN_IF_ERROR(Write(footer.data(), footer.size()));
  if (fsync(fd_) != 0) return IoError("fsync failed on", tmp_path_);
  close(fd_);
  fd_ = -1;
  if (rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return IoError("cannot rename over", path_);
  }
  finished_ = true;
  std::string dir = path_.find('/') == std::string::npos
                        ? "."
                        : path_.substr(0, path_.find_last_of('/'));
  if (dir.empty()) dir = "/";
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return Status();
}

// ---------------------------------------------------------------- reader

Result<DeltaReader> DeltaReader::Open(const std::string& path) {
  DeltaReader r;
  REFIT_ASSIGN_OR_RETURN(r.file_,
                         MappedFile::Open(path, MappedFile::Mode::kReadOnly));
  r.bytes_ = r.file_.bytes();
  Status s = r.Parse();
  if (!s.ok()) return s.WithContext(path);
  return r;
}

Result<DeltaReader> DeltaReader::FromBytes(std::span<const uint8_t> bytes) {
  DeltaReader r;
  r.bytes_ = bytes;
  REFIT_RETURN_IF_ERROR(r.Parse());
  return r;
}

Status DeltaReader::Parse() {
  const size_t size = bytes_.size();
  if (size < kDeltaHeaderSize + kDeltaFooterSize) {
    return DataLossError("not a refit delta: " + std::to_string(size) +
                         " bytes is too short (truncated?)");
  }
  if (std::memcmp(bytes_.data(), kHeaderMagic, 8) != 0) {
    return DataLossError("not a refit delta (bad magic)");
  }
  ByteReader h(bytes_.subspan(8, kDeltaHeaderSize - 8));
  uint16_t format_version = h.U16();
  uint16_t flags = h.U16();
  uint32_t reserved = h.U32();
  version_ = h.U64();
  base_version_ = h.U64();
  if (format_version < kMinDeltaFormatVersion ||
      format_version > kDeltaFormatVersion) {
    return DataLossError("delta has format version " +
                         std::to_string(format_version) +
                         "; this build reads versions " +
                         std::to_string(kMinDeltaFormatVersion) + " to " +
                         std::to_string(kDeltaFormatVersion));
  }
  format_version_ = format_version;
  if (flags != 0 || reserved != 0) {
    return DataLossError("delta header has unknown flags");
  }
  const uint8_t* foot = bytes_.data() + size - kDeltaFooterSize;
  if (std::memcmp(foot + 16, kFooterMagic, 8) != 0) {
    return DataLossError("delta has no footer (truncated or not finished)");
  }
  ByteReader f(foot, 16);
  uint64_t trailer_offset = f.U64();
  uint64_t checksum = f.U64();
  if (trailer_offset < kDeltaHeaderSize ||
      trailer_offset > size - kDeltaFooterSize) {
    return DataLossError("delta footer points outside the file");
  }
  std::span<const uint8_t> trailer = bytes_.subspan(
      trailer_offset, size - kDeltaFooterSize - trailer_offset);
  if (TrailerChecksum(bytes_.first(kDeltaHeaderSize), trailer) != checksum) {
    return DataLossError("delta trailer checksum mismatch (corrupted?)");
  }

  ByteReader r(trailer);
  REFIT_RETURN_IF_ERROR(ReadTensorTable(&r, &tensors_));
  const uint64_t tensor_count = tensors_.size();
  uint64_t chunk_count = r.Varint();
  if (!r.ok() || chunk_count > r.remaining() / 6) {
    REFIT_RETURN_IF_ERROR(r.status("delta trailer"));
    return DataLossError("delta names an implausible number of chunks");
  }
  index_.resize(chunk_count);
  uint64_t prev_end_offset = kDeltaHeaderSize;
  for (uint64_t i = 0; i < chunk_count && r.ok(); ++i) {
    IndexEntry& e = index_[i];
    e.offset = r.Varint();
    e.size = r.Varint();
    e.tensor_id = r.Varint();
    e.start = r.Varint();
    e.count = r.Varint();
    uint8_t kind = r.U8();
    if (!r.ok()) break;
    if (kind < 1 || kind > 5) return DataLossError("index has unknown kind");
    e.kind = static_cast<codec::ChunkKind>(kind);
    if (e.offset < prev_end_offset || !AddWithin(e.offset, e.size, trailer_offset)) {
      return DataLossError("chunk " + std::to_string(i) +
                           " lies outside the chunk area or overlaps another");
    }
    prev_end_offset = e.offset + e.size;
    if (e.tensor_id >= tensor_count) {
      return DataLossError("chunk " + std::to_string(i) + " names tensor " +
                           std::to_string(e.tensor_id) + " of " +
                           std::to_string(tensor_count));
    }
    const TensorEntry& t = tensors_[e.tensor_id];
    if (e.count == 0 || e.count > kMaxChunkElements ||
        !AddWithin(e.start, e.count, t.num_elements)) {
      return DataLossError("chunk " + std::to_string(i) +
                           " range lies outside tensor '" + t.name + "'");
    }
    if ((e.start * t.width) % kRangeHashSegment != 0 ||
        ((e.count * t.width) % kRangeHashSegment != 0 &&
         e.start + e.count != t.num_elements)) {
      return DataLossError("chunk " + std::to_string(i) +
                           " is not aligned to 64 KiB segments");
    }
    if (i > 0) {
      const IndexEntry& p = index_[i - 1];
      if (p.tensor_id > e.tensor_id ||
          (p.tensor_id == e.tensor_id && p.start + p.count > e.start)) {
        return DataLossError("chunks out of order or overlapping at chunk " +
                             std::to_string(i));
      }
    }
  }
  REFIT_RETURN_IF_ERROR(r.status("delta trailer"));
  if (format_version_ >= 2) REFIT_RETURN_IF_ERROR(ParseCarriedHeaders(&r));
  if (r.remaining() != 0) {
    return DataLossError("delta trailer has trailing bytes");
  }
  return Status();
}

// The file-header section (docs/format.md §6, format version 2). Each entry
// takes at least 3 bytes (a 1-byte name and two length varints), which
// bounds the count before anything is allocated; header bytes are copied
// only after their length is checked against what the trailer holds.
Status DeltaReader::ParseCarriedHeaders(ByteReader* reader) {
  ByteReader& r = *reader;
  uint64_t file_count = r.Varint();
  if (!r.ok() || file_count > kMaxCarriedFiles ||
      file_count > r.remaining() / 3) {
    REFIT_RETURN_IF_ERROR(r.status("delta file headers"));
    return DataLossError("delta names an implausible number of file headers (" +
                         std::to_string(file_count) + ")");
  }
  headers_.resize(file_count);
  for (uint64_t i = 0; i < file_count && r.ok(); ++i) {
    CarriedHeader& h = headers_[i];
    h.name = r.String(kMaxNameBytes);
    uint64_t n = r.Varint();
    if (!r.ok()) break;
    if (h.name.empty()) {
      return DataLossError("file header " + std::to_string(i) +
                           " has an empty name");
    }
    if (i > 0 && !(headers_[i - 1].name < h.name)) {
      return DataLossError("file headers are not sorted by unique name");
    }
    if (n < 2 || n > kMaxCarriedHeaderBytes || n > r.remaining()) {
      return DataLossError("file header of '" + h.name + "' claims " +
                           std::to_string(n) +
                           " bytes (2..100,000,000, within the trailer)");
    }
    std::span<const uint8_t> json = r.Bytes(n);
    h.json.assign(json.begin(), json.end());
  }
  return r.status("delta file headers");
}

Result<ParsedChunk> DeltaReader::ReadChunk(size_t i) const {
  if (i >= index_.size()) return OutOfRangeError("no chunk " + std::to_string(i));
  const IndexEntry& e = index_[i];
  auto parsed = ParseChunk(bytes_.subspan(e.offset, e.size));
  if (!parsed.ok()) {
    return parsed.status().WithContext("chunk " + std::to_string(i));
  }
  const ChunkHeader& h = parsed->header;
  const TensorEntry& t = tensors_[e.tensor_id];
  if (parsed->size != e.size || h.tensor_id != e.tensor_id ||
      h.start != e.start || h.count != e.count || h.kind != e.kind ||
      h.width != t.width || h.version != version_ ||
      h.base_version != base_version_) {
    return DataLossError("chunk " + std::to_string(i) +
                         " disagrees with the delta's index");
  }
  if (h.IsStrided()) {
    // A delta file tiles tensors with contiguous, segment-aligned ranges
    // (§6); strided regions travel as single chunks (§3).
    return DataLossError("chunk " + std::to_string(i) +
                         " is a strided region, which a delta file cannot hold");
  }
  return parsed;
}

}  // namespace refit
