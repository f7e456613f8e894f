// Fuzz target: a layout file from arbitrary bytes (docs/layout.md). Parses
// it; a layout that validates, with small tensors, must get an ownership
// that the coverage proof accepts (every canonical element owned exactly
// once), and must survive a round trip through its JSON form.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "layout/layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto layout = refit::layout::ParseLayout(text);
  if (!layout.ok()) return 0;
  auto again = refit::layout::ParseLayout(refit::layout::LayoutToJson(*layout));
  if (!again.ok() || !(*again == *layout)) std::abort();
  if (!refit::layout::ValidateLayout(*layout).ok()) return 0;
  auto owned = refit::layout::AssignOwnership(*layout);
  if (!owned.ok()) return 0;  // e.g. replicas split a quantized tensor differently
  if (!refit::layout::CheckCoverage(*layout, *owned).ok()) std::abort();
  return 0;
}
