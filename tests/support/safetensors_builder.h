// One safetensors writer for tests, independent of refit's own writer
// (src/format/safetensors.h), so a test can make checkpoints that refit's
// reader has to understand rather than ones it wrote itself. It follows the
// format as huggingface/safetensors' README states it: an 8-byte
// little-endian header length, the JSON header padded with spaces to a
// multiple of 8, then the tensors' bytes in order. Test-only.
#ifndef REFIT_TESTS_SUPPORT_SAFETENSORS_BUILDER_H_
#define REFIT_TESTS_SUPPORT_SAFETENSORS_BUILDER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace refit::testing {

// One tensor of a test checkpoint; `data` holds its bytes as stored.
struct TestTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;
};

// The bytes of a safetensors file holding `tensors` in this order.
// `metadata` is the JSON text of the "__metadata__" object, or empty for
// none. Names and dtypes are written as given (no escaping, no checks).
std::vector<uint8_t> SafetensorsBytes(const std::vector<TestTensor>& tensors,
                                      const std::string& metadata = "");

// Writes SafetensorsBytes(tensors, metadata) to `path`.
void WriteSafetensors(const std::string& path,
                      const std::vector<TestTensor>& tensors,
                      const std::string& metadata = "");

}  // namespace refit::testing

#endif  // REFIT_TESTS_SUPPORT_SAFETENSORS_BUILDER_H_
