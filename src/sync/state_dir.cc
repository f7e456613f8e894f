#include "sync/state_dir.h"

#include <cstdlib>
#include <span>
#include <vector>

#include "base/file.h"

namespace refit {

Result<uint64_t> StateDir::ReadActive() const {
  const std::string active = active_path();
  if (!PathExists(active)) return uint64_t{0};
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> text, ReadFile(active));
  const std::string s(text.begin(), text.end());
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) {
    return DataLossError("active pointer '" + active + "' is corrupt");
  }
  return static_cast<uint64_t>(v);
}

Status StateDir::WriteActive(uint64_t version) const {
  const std::string text = std::to_string(version) + "\n";
  return WriteFileAtomic(
      active_path(),
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()),
                               text.size()));
}

}  // namespace refit
