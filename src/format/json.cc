#include "format/json.h"

#include <cstring>
#include <exception>
#include <new>
#include <utility>
#include <vector>

namespace refit::internal {
namespace {

using Json = nlohmann::json;

// Builds the value from nlohmann's SAX events, refusing what the strict
// parse refuses as it goes.
//
// nlohmann's callback parser (json::parse with a callback) rescans the
// parent object after every nested object closes, looking for discarded
// members, which makes a header of n tensors cost O(n^2). This builder
// never discards, so each event costs O(1) apart from the key's insertion
// into its object's std::map, which also finds duplicates: O(n log n) in
// all.
class StrictBuilder {
 public:
  explicit StrictBuilder(int max_depth) : max_depth_(max_depth) {}

  Json& root() { return root_; }
  const std::string& error() const { return error_; }

  bool null() { return Put(Json(nullptr)); }
  bool boolean(bool v) { return Put(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return Put(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return Put(Json(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t&) {
    return Put(Json(v));
  }
  bool string(Json::string_t& v) { return Put(Json(std::move(v))); }
  bool binary(Json::binary_t& v) { return Put(Json(std::move(v))); }

  bool start_object(size_t) { return Open(Json::value_t::object); }
  bool start_array(size_t) { return Open(Json::value_t::array); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(Json::string_t& k) {
    auto& members = open_.back()->get_ref<Json::object_t&>();
    // try_emplace leaves `k` alone when the key is already there.
    auto [it, inserted] = members.try_emplace(std::move(k), nullptr);
    if (!inserted) {
      error_ = "duplicate key " + QuoteForMessage(it->first);
      return false;
    }
    slot_ = &it->second;
    return true;
  }

  template <class Exception>
  bool parse_error(size_t, const std::string&, const Exception& e) {
    // The parser quotes the token it choked on, which may be huge.
    std::string_view msg = e.what();
    if (msg.size() > 200) msg = msg.substr(0, 200);
    error_ = "invalid JSON: " + std::string(msg);
    return false;
  }

 private:
  // Stores `v` where the grammar puts the next value: the root, the end of
  // the innermost open array, or the member whose key came last. Returns
  // where it went. Pointers into the innermost container stay valid while it
  // is innermost (an enclosing array does not grow meanwhile), and std::map
  // members never move.
  Json* Place(Json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json* top = open_.back();
    if (top->is_array()) {
      auto& elements = top->get_ref<Json::array_t&>();
      elements.push_back(std::move(v));
      return &elements.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }

  bool Put(Json&& v) {
    Place(std::move(v));
    return true;
  }

  bool Open(Json::value_t type) {
    // The new container's depth is open_.size() + 1; the root counts as 1.
    if (open_.size() >= static_cast<size_t>(max_depth_)) {
      error_ = "nesting deeper than " + std::to_string(max_depth_);
      return false;
    }
    open_.push_back(Place(Json(type)));
    return true;
  }

  bool Close() {
    open_.pop_back();
    return true;
  }

  const int max_depth_;
  Json root_;
  std::vector<Json*> open_;  // the containers not yet closed, outermost first
  Json* slot_ = nullptr;     // the member of open_.back() named by the last key
  std::string error_;
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
  // nlohmann's lexer takes a NUL byte outside a string for the end of the
  // input, so "{}\0anything" would parse as "{}". JSON has no place for a raw
  // NUL (inside a string it must be escaped), so any NUL is an error.
  if (const void* nul = std::memchr(text.data(), '\0', text.size())) {
    size_t offset = static_cast<size_t>(static_cast<const char*>(nul) -
                                        text.data());
    return DataLossError(std::string(what) + ": invalid JSON: NUL byte at offset " +
                         std::to_string(offset));
  }
  StrictBuilder builder(max_depth);
  try {
    if (!Json::sax_parse(text.begin(), text.end(), &builder,
                         Json::input_format_t::json, /*strict=*/true,
                         /*ignore_comments=*/false)) {
      std::string reason =
          builder.error().empty() ? "invalid JSON" : builder.error();
      return DataLossError(std::string(what) + ": " + reason);
    }
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(std::string(what) +
                                  ": out of memory parsing JSON");
  } catch (const std::exception& e) {
    // sax_parse reports parse errors through the builder; this guards the
    // boundary against anything else it might throw.
    std::string_view msg = e.what();
    if (msg.size() > 200) msg = msg.substr(0, 200);
    return DataLossError(std::string(what) + ": " + std::string(msg));
  }
  return std::move(builder.root());
}

}  // namespace refit::internal
