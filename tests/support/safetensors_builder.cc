#include "support/safetensors_builder.h"

#include "support/testing.h"

namespace refit::testing {

std::vector<uint8_t> SafetensorsBytes(const std::vector<TestTensor>& tensors,
                                      const std::string& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":" + metadata + (tensors.empty() ? "" : ",");
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TestTensor& t = tensors[i];
    std::string shape;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      shape += (d ? "," : "") + std::to_string(t.shape[d]);
    }
    header += (i ? "," : "") + std::string("\"") + t.name + "\":{\"dtype\":\"" +
              t.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(offset) + "," +
              std::to_string(offset + t.data.size()) + "]}";
    offset += t.data.size();
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<uint8_t> file(8);
  for (int i = 0; i < 8; ++i) {
    file[static_cast<size_t>(i)] =
        static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  }
  file.insert(file.end(), header.begin(), header.end());
  for (const TestTensor& t : tensors)
    file.insert(file.end(), t.data.begin(), t.data.end());
  return file;
}

void WriteSafetensors(const std::string& path,
                      const std::vector<TestTensor>& tensors,
                      const std::string& metadata) {
  WriteBytes(path, SafetensorsBytes(tensors, metadata));
}

}  // namespace refit::testing
