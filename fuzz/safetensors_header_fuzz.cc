// Fuzz target: ParseSafetensorsHeader on arbitrary bytes, taken as a whole
// file. Beyond "no crash, no UB", it checks the parser's promises on every
// accepted header, so a fuzzer finds logic bugs as well as memory bugs.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "format/safetensors.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> file(data, size);
  refit::DTypeRegistry registry;
  // One caller-declared dtype, so the registry path is reachable.
  if (!registry.Register("X16", 2).ok()) std::abort();
  refit::Result<refit::SafetensorsHeader> h =
      refit::ParseSafetensorsHeader(file, size, registry);
  if (!h.ok()) {
    Check(!h.status().message().empty());
    return 0;
  }
  // Accepted: tensors sorted by name, unique, inside the file, sized as
  // their shape says, and tiling the data buffer exactly.
  Check(h->data_start == 8 + h->header_size && h->data_start <= size);
  uint64_t covered = 0;
  for (size_t i = 0; i < h->tensors.size(); ++i) {
    const refit::SafetensorsTensor& t = h->tensors[i];
    if (i > 0) Check(h->tensors[i - 1].name < t.name);
    Check(!t.name.empty());
    Check(t.element_width == 1 || t.element_width == 2 ||
          t.element_width == 4 || t.element_width == 8);
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;  // cannot overflow: the parser checked
    Check(n == t.num_elements);
    Check(t.byte_size == n * static_cast<uint64_t>(t.element_width));
    Check(t.offset >= h->data_start && t.offset <= size &&
          t.byte_size <= size - t.offset);
    covered += t.byte_size;
  }
  Check(covered == size - h->data_start);
  return 0;
}
