// Strict JSON parsing for headers and index files that come from outside.
//
// nlohmann::json keeps the last of duplicate object keys silently and
// reports errors by throwing; here duplicates are an error and every
// exception becomes a Status at this boundary. Pure and thread-safe.
#ifndef REFIT_FORMAT_JSON_H_
#define REFIT_FORMAT_JSON_H_

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "refit/status.h"

namespace refit::internal {

// Parses `text` as one JSON value (surrounding whitespace allowed). Fails
// with kDataLoss naming `what` on malformed JSON or invalid UTF-8, on a key
// repeated within one object, and on nesting deeper than `max_depth`
// containers (the root counts as depth 1).
Result<nlohmann::json> ParseJsonStrict(std::string_view text, int max_depth,
                                       std::string_view what);

// `s` quoted for an error message, cut to a readable length: names in
// hostile input may be megabytes long.
std::string QuoteForMessage(std::string_view s);

}  // namespace refit::internal

#endif  // REFIT_FORMAT_JSON_H_
