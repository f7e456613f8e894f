#include "sync/relay_tree.h"

#include <optional>

#include "sync/keys.h"

namespace refit {
namespace {

class ProtocolKeys final : public RelayKeyClassifier {
 public:
  bool IsUpward(std::string_view key) const override {
    return IsMemberKey(key);
  }
  std::optional<uint64_t> VersionOf(std::string_view key) const override {
    return VersionOfKey(key);
  }
};

}  // namespace

std::shared_ptr<const RelayKeyClassifier> ProtocolRelayKeys() {
  static const std::shared_ptr<const RelayKeyClassifier> keys =
      std::make_shared<ProtocolKeys>();
  return keys;
}

}  // namespace refit
