#include "format/json.h"

#include <exception>
#include <new>
#include <set>
#include <utility>
#include <vector>

namespace refit::internal {
namespace {

// Thrown from the parser callback to stop parsing; caught below, so it never
// leaves this file.
struct Rejected {
  std::string reason;
};

}  // namespace

std::string QuoteForMessage(std::string_view s) {
  constexpr size_t kMax = 80;
  if (s.size() <= kMax) return "'" + std::string(s) + "'";
  return "'" + std::string(s.substr(0, kMax)) + "...' (" +
         std::to_string(s.size()) + " bytes)";
}

Result<nlohmann::json> ParseJsonStrict(std::string_view text, int max_depth,
                                       std::string_view what) {
  // keys[d] holds the keys seen so far in the object whose members the
  // parser reports at callback depth d (the callback's depth counts the
  // containers open around the event). Starting an object at depth d resets
  // keys[d + 1], so the vector never holds more than max_depth sets.
  std::vector<std::set<std::string, std::less<>>> keys;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event,
                      nlohmann::json& parsed) -> bool {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      if (depth + 1 > max_depth) {
        throw Rejected{"nesting deeper than " + std::to_string(max_depth)};
      }
      if (event == Event::object_start) {
        size_t d = static_cast<size_t>(depth) + 1;
        if (keys.size() <= d) keys.resize(d + 1);
        keys[d].clear();
      }
    } else if (event == Event::key) {
      size_t d = static_cast<size_t>(depth);
      const auto& key = parsed.get_ref<const std::string&>();
      if (d >= keys.size() || !keys[d].insert(key).second) {
        throw Rejected{"duplicate key " + QuoteForMessage(key)};
      }
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), callback,
                                 /*allow_exceptions=*/true,
                                 /*ignore_comments=*/false);
  } catch (const Rejected& r) {
    return DataLossError(std::string(what) + ": " + r.reason);
  } catch (const nlohmann::json::exception& e) {
    // The parser quotes the token it choked on, which may be huge.
    std::string_view msg = e.what();
    if (msg.size() > 200) msg = msg.substr(0, 200);
    return DataLossError(std::string(what) +
                         ": invalid JSON: " + std::string(msg));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(std::string(what) +
                                  ": out of memory parsing JSON");
  } catch (const std::exception& e) {
    return DataLossError(std::string(what) + ": " + e.what());
  }
}

}  // namespace refit::internal
