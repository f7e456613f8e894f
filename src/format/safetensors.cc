#include "format/safetensors.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <utility>

#include "base/bytes.h"
#include "format/json.h"

namespace refit {
namespace {

using Json = nlohmann::json;
using internal::QuoteForMessage;

constexpr std::string_view kMetadataKey = "__metadata__";

// Root object, tensor entry, shape array: a valid header nests no deeper.
constexpr int kMaxHeaderDepth = 3;

Status Corrupt(const std::string& message) {
  return DataLossError("safetensors header: " + message);
}

Status Corrupt(std::string_view tensor, const std::string& message) {
  return Corrupt("tensor " + QuoteForMessage(tensor) + ": " + message);
}

std::string HexByte(uint8_t b) {
  constexpr char kDigits[] = "0123456789abcdef";
  return {'0', 'x', kDigits[b >> 4], kDigits[b & 15]};
}

// Every integer in a header is a non-negative count or offset; nlohmann
// types negative numbers number_integer, fractions and values past 2^64
// number_float.
Result<uint64_t> ReadCount(const Json& v, std::string_view tensor,
                           std::string_view field) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  std::string what = v.is_number_integer() ? "is negative"
                     : v.is_number_float() ? "is not an integer below 2^64"
                                           : "is not a number";
  return Corrupt(tensor, std::string(field) + " " + what);
}

Result<SafetensorsTensor> ParseTensor(const std::string& name, const Json& v,
                                      uint64_t data_start, uint64_t data_size,
                                      const DTypeRegistry& dtypes) {
  if (name.empty()) return Corrupt("empty tensor name");
  if (!v.is_object()) return Corrupt(name, "entry is not an object");
  auto dtype_it = v.find("dtype");
  auto shape_it = v.find("shape");
  auto offsets_it = v.find("data_offsets");
  if (dtype_it == v.end() || shape_it == v.end() || offsets_it == v.end()) {
    return Corrupt(name, "needs dtype, shape and data_offsets");
  }
  if (!dtype_it->is_string()) return Corrupt(name, "dtype is not a string");
  if (!shape_it->is_array()) return Corrupt(name, "shape is not an array");
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    return Corrupt(name, "data_offsets is not an array of two offsets");
  }

  SafetensorsTensor t;
  t.name = name;
  t.dtype = dtype_it->get<std::string>();
  Result<int> width = dtypes.ElementWidth(t.dtype);
  if (!width.ok()) {
    return width.status().WithContext("safetensors header: tensor " +
                                      QuoteForMessage(name));
  }
  t.element_width = *width;

  uint64_t count = 1;
  t.shape.reserve(shape_it->size());
  for (const Json& dim : *shape_it) {
    REFIT_ASSIGN_OR_RETURN(uint64_t d, ReadCount(dim, name, "shape dimension"));
    if (!MulChecked(count, d, &count)) {
      return Corrupt(name, "element count overflows 64 bits");
    }
    t.shape.push_back(d);
  }
  t.num_elements = count;
  if (!MulChecked(count, static_cast<uint64_t>(t.element_width),
                  &t.byte_size)) {
    return Corrupt(name, "byte size overflows 64 bits");
  }

  REFIT_ASSIGN_OR_RETURN(uint64_t begin,
                         ReadCount((*offsets_it)[0], name, "data_offsets"));
  REFIT_ASSIGN_OR_RETURN(uint64_t end,
                         ReadCount((*offsets_it)[1], name, "data_offsets"));
  if (begin > end) return Corrupt(name, "data_offsets end before begin");
  if (end > data_size) {
    return Corrupt(name, "data_offsets end " + std::to_string(end) +
                             " is past the data buffer (" +
                             std::to_string(data_size) + " bytes)");
  }
  if (end - begin != t.byte_size) {
    return Corrupt(name, "data_offsets span " + std::to_string(end - begin) +
                             " bytes but shape and dtype need " +
                             std::to_string(t.byte_size));
  }
  t.offset = data_start + begin;  // cannot overflow: end <= data_size
  return t;
}

// The reference reader's rule (safetensors/src/tensor.rs, Metadata::validate):
// ordered by (begin, end), each tensor begins where the previous one ended
// and the last ends at the end of the buffer. So the tensors tile the buffer
// with no overlap and no hole, and a zero-size tensor may sit at the start,
// at the end or between two tensors, never inside one.
Status CheckTiling(const std::vector<SafetensorsTensor>& tensors,
                   uint64_t data_start, uint64_t data_size) {
  std::vector<const SafetensorsTensor*> by_offset;
  by_offset.reserve(tensors.size());
  for (const SafetensorsTensor& t : tensors) by_offset.push_back(&t);
  // Stable, so ties (empty tensors at one offset) keep name order and the
  // error message names the same tensors on every run.
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
                     if (a->offset != b->offset) return a->offset < b->offset;
                     return a->byte_size < b->byte_size;
                   });
  uint64_t expected = data_start;
  const SafetensorsTensor* prev = nullptr;
  for (const SafetensorsTensor* t : by_offset) {
    if (t->offset < expected) {
      // Sorting puts a tensor that begins inside prev after it; an empty one
      // that begins where prev begins would have sorted before it.
      if (t->byte_size == 0) {
        return Corrupt("zero-size tensor " + QuoteForMessage(t->name) +
                       " at data offset " +
                       std::to_string(t->offset - data_start) +
                       " lies inside tensor " + QuoteForMessage(prev->name));
      }
      return Corrupt("tensors " + QuoteForMessage(prev->name) + " and " +
                     QuoteForMessage(t->name) + " overlap");
    }
    if (t->offset > expected) {
      return Corrupt("hole of " + std::to_string(t->offset - expected) +
                     " bytes at data offset " +
                     std::to_string(expected - data_start) +
                     " (tensors must tile the data buffer)");
    }
    expected = t->offset + t->byte_size;
    prev = t;
  }
  if (expected != data_start + data_size) {
    return Corrupt(std::to_string(data_start + data_size - expected) +
                   " bytes after the last tensor are not covered by any "
                   "tensor (tensors must tile the data buffer)");
  }
  return Status();
}

// The reference reader requires the header to begin with '{' and parses
// the rest as one JSON value, so only JSON whitespace may follow it (its
// writer pads with spaces). Called once `text` has parsed as a JSON object;
// nlohmann skips a byte order mark and whitespace before it, which are
// refused here.
Status CheckHeaderFraming(std::string_view text) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") {
    return Corrupt("header starts with a UTF-8 byte order mark; it must begin "
                   "with '{'");
  }
  if (text.front() != '{') {
    return Corrupt("header must begin with '{', not whitespace");
  }
  // The object's closing brace is its last byte that is not whitespace.
  size_t last = text.find_last_not_of(" \t\n\r");
  if (text[last] != '}') {
    return Corrupt("only whitespace may follow the header's JSON (byte " +
                   std::to_string(last) + " is " +
                   HexByte(static_cast<uint8_t>(text[last])) + ")");
  }
  return Status();
}

}  // namespace

Result<SafetensorsHeader> ParseSafetensorsHeader(
    std::span<const uint8_t> file_prefix, uint64_t file_size,
    const DTypeRegistry& dtypes) {
  if (file_size < 8 || file_prefix.size() < 8) {
    return Corrupt("file of " + std::to_string(file_size) +
                   " bytes is too short for the 8-byte header length");
  }
  SafetensorsHeader h;
  h.header_size = LoadLE(file_prefix.data(), 8);
  if (h.header_size > kMaxSafetensorsHeaderSize) {
    return Corrupt("header length " + std::to_string(h.header_size) +
                   " exceeds the limit of " +
                   std::to_string(kMaxSafetensorsHeaderSize) + " bytes");
  }
  if (h.header_size > file_size - 8) {
    return Corrupt("header length " + std::to_string(h.header_size) +
                   " runs past the end of the " + std::to_string(file_size) +
                   "-byte file (truncated?)");
  }
  h.data_start = 8 + h.header_size;
  if (file_prefix.size() < h.data_start) {
    return InvalidArgumentError(
        "safetensors header: need the first " + std::to_string(h.data_start) +
        " bytes of the file, got " + std::to_string(file_prefix.size()));
  }
  const uint64_t data_size = file_size - h.data_start;

  std::string_view text(reinterpret_cast<const char*>(file_prefix.data() + 8),
                        static_cast<size_t>(h.header_size));
  REFIT_ASSIGN_OR_RETURN(
      Json root,
      internal::ParseJsonStrict(text, kMaxHeaderDepth, "safetensors header"));
  if (!root.is_object()) return Corrupt("JSON root is not an object");
  REFIT_RETURN_IF_ERROR(CheckHeaderFraming(text));

  h.tensors.reserve(root.size());
  try {
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (it.key() == kMetadataKey) {
        if (!it->is_object()) return Corrupt("__metadata__ is not an object");
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string()) {
            return Corrupt("__metadata__ value for " +
                           QuoteForMessage(m.key()) + " is not a string");
          }
          h.metadata.emplace(m.key(), m->get<std::string>());
        }
        continue;
      }
      REFIT_ASSIGN_OR_RETURN(
          SafetensorsTensor t,
          ParseTensor(it.key(), *it, h.data_start, data_size, dtypes));
      h.tensors.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    // The checks above make this unreachable; it guards the boundary anyway.
    return Corrupt(std::string("unexpected JSON error: ") + e.what());
  }
  // nlohmann's default object is a std::map, so the tensors already come in
  // byte-wise name order; sorting keeps that invariant explicit.
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.name < b.name;
            });
  REFIT_RETURN_IF_ERROR(CheckTiling(h.tensors, h.data_start, data_size));
  return h;
}

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path,
                                              MappedFile::Mode mode,
                                              const DTypeRegistry& dtypes) {
  REFIT_ASSIGN_OR_RETURN(MappedFile map, MappedFile::Open(path, mode));
  Result<SafetensorsHeader> header =
      ParseSafetensorsHeader(map.bytes(), map.size(), dtypes);
  if (!header.ok()) return header.status().WithContext(path);
  return SafetensorsFile(std::move(map), std::move(header).value(),
                         mode == MappedFile::Mode::kReadWrite);
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  auto it =
      std::lower_bound(header_.tensors.begin(), header_.tensors.end(), name,
                       [](const SafetensorsTensor& t, std::string_view n) {
                         return t.name < n;
                       });
  if (it == header_.tensors.end() || it->name != name) return nullptr;
  return &*it;
}

std::span<const uint8_t> SafetensorsFile::Data(size_t index) const {
  assert(index < header_.tensors.size());
  const SafetensorsTensor& t = header_.tensors[index];
  return map_.bytes().subspan(static_cast<size_t>(t.offset),
                              static_cast<size_t>(t.byte_size));
}

std::span<uint8_t> SafetensorsFile::MutableData(size_t index) {
  assert(index < header_.tensors.size());
  const SafetensorsTensor& t = header_.tensors[index];
  uint8_t* base = map_.mutable_data();
  if (base == nullptr) return {};
  return {base + t.offset, static_cast<size_t>(t.byte_size)};
}

Status SafetensorsFile::Sync(uint64_t offset, uint64_t length) {
  if (!writable_) return Status();
  return map_.Sync(static_cast<size_t>(offset), static_cast<size_t>(length));
}

Status SafetensorsFile::Sync() {
  if (!writable_) return Status();
  return map_.Sync();
}

Result<SafetensorsLayout> LayOutSafetensors(
    const std::map<std::string, std::string>& metadata,
    std::span<const SafetensorsEntry> input, const DTypeRegistry& dtypes) {
  std::vector<size_t> sorted(input.size());
  for (size_t i = 0; i < sorted.size(); ++i) sorted[i] = i;
  std::sort(sorted.begin(), sorted.end(),
            [&](size_t a, size_t b) { return input[a].name < input[b].name; });

  // Entries are spelled out rather than built as a Json object: Json sorts
  // an entry's keys, and the reference writer's order is dtype, shape,
  // data_offsets.
  SafetensorsLayout out;
  out.offsets.resize(input.size());
  out.sizes.resize(input.size());
  std::vector<std::string> entries;
  entries.reserve(sorted.size() + 1);
  uint64_t data_size = 0;
  try {
    if (!metadata.empty()) {
      entries.push_back("\"__metadata__\":" + Json(metadata).dump());
    }
    for (size_t i = 0; i < sorted.size(); ++i) {
      const SafetensorsEntry& t = input[sorted[i]];
      if (t.name.empty() || t.name == kMetadataKey) {
        return InvalidArgumentError("cannot write a tensor named " +
                                    QuoteForMessage(t.name));
      }
      if (i > 0 && input[sorted[i - 1]].name == t.name) {
        return InvalidArgumentError("duplicate tensor name " +
                                    QuoteForMessage(t.name));
      }
      REFIT_ASSIGN_OR_RETURN(int width, dtypes.ElementWidth(t.dtype));
      uint64_t bytes = static_cast<uint64_t>(width);
      for (uint64_t d : t.shape) {
        if (!MulChecked(bytes, d, &bytes)) {
          return InvalidArgumentError("tensor " + QuoteForMessage(t.name) +
                                      ": size overflows 64 bits");
        }
      }
      if (!AddWithin(data_size, bytes, UINT64_MAX)) {
        return InvalidArgumentError("tensors total more than 2^64 bytes");
      }
      entries.push_back(Json(t.name).dump() +
                        ":{\"dtype\":" + Json(t.dtype).dump() +
                        ",\"shape\":" + Json(t.shape).dump() +
                        ",\"data_offsets\":[" + std::to_string(data_size) +
                        "," + std::to_string(data_size + bytes) + "]}");
      out.offsets[sorted[i]] = data_size;  // made absolute below
      out.sizes[sorted[i]] = bytes;
      data_size += bytes;
    }
  } catch (const nlohmann::json::exception& e) {
    // dump() throws on strings that are not valid UTF-8.
    return InvalidArgumentError(std::string("cannot write safetensors: ") +
                                e.what());
  }
  std::string header = "{";
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) header += ",";
    header += entries[i];
  }
  header += "}";
  // The reference writer pads with spaces so the data buffer starts 8-byte
  // aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxSafetensorsHeaderSize) {
    return InvalidArgumentError("safetensors header of " +
                                std::to_string(header.size()) +
                                " bytes exceeds the format's limit");
  }
  ByteWriter w(&out.prefix);
  w.U64(header.size());
  w.Bytes(header.data(), header.size());
  for (uint64_t& o : out.offsets) o += out.prefix.size();
  out.file_size = out.prefix.size() + data_size;
  return out;
}

Status WriteSafetensors(const std::string& path,
                        const std::map<std::string, std::string>& metadata,
                        std::span<const SafetensorsTensorView> tensors,
                        const DTypeRegistry& dtypes) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const SafetensorsTensorView& t : tensors) {
    entries.push_back({t.name, t.dtype, t.shape});
  }
  REFIT_ASSIGN_OR_RETURN(SafetensorsLayout layout,
                         LayOutSafetensors(metadata, entries, dtypes));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (layout.sizes[i] != tensors[i].data.size()) {
      return InvalidArgumentError(
          "tensor " + QuoteForMessage(tensors[i].name) + ": shape and dtype need " +
          std::to_string(layout.sizes[i]) + " bytes, data has " +
          std::to_string(tensors[i].data.size()));
    }
  }
  std::vector<uint8_t> out = std::move(layout.prefix);
  out.resize(static_cast<size_t>(layout.file_size));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].data.empty()) {
      std::memcpy(out.data() + layout.offsets[i], tensors[i].data.data(),
                  tensors[i].data.size());
    }
  }
  return WriteFileAtomic(path, out);
}

Result<std::vector<uint8_t>> ReadSafetensorsHeaderBytes(
    const std::string& path) {
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> prefix,
                         ReadFileRange(path, 0, 8));
  const uint64_t n = LoadLE(prefix.data(), 8);
  if (n > kMaxSafetensorsHeaderSize) {
    return DataLossError(path + ": safetensors header length " +
                         std::to_string(n) + " exceeds the limit of " +
                         std::to_string(kMaxSafetensorsHeaderSize));
  }
  return ReadFileRange(path, 8, n);
}

Status WriteSafetensorsHeaderInPlace(const std::string& path,
                                     std::span<const uint8_t> json,
                                     bool sync) {
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> prefix,
                         ReadFileRange(path, 0, 8));
  const uint64_t n = LoadLE(prefix.data(), 8);
  if (n != json.size()) {
    return FailedPreconditionError(
        path + ": a header of " + std::to_string(json.size()) +
        " bytes cannot replace one of " + std::to_string(n) + " in place");
  }
  return WriteFileRange(path, 8, json, sync);
}

}  // namespace refit
