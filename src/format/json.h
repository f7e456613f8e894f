// Strict JSON parsing for headers and index files that come from outside.
//
// nlohmann::json keeps the last of duplicate object keys silently, stops at
// a NUL byte and reports errors by throwing; here duplicates and NUL bytes
// are errors and every exception becomes a Status at this boundary. The
// value is built from SAX events in O(n log n) for n members, so headers
// with ~10^5 tensors parse in well under a second. Pure and thread-safe.
#ifndef REFIT_FORMAT_JSON_H_
#define REFIT_FORMAT_JSON_H_

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "refit/status.h"

namespace refit::internal {

// Parses `text` as one JSON value (surrounding whitespace allowed). Fails
// with kDataLoss naming `what` on malformed JSON or invalid UTF-8, on a NUL
// byte anywhere in `text`, on a key repeated within one object, and on
// nesting deeper than `max_depth` containers (the root counts as depth 1);
// kResourceExhausted when memory runs out.
Result<nlohmann::json> ParseJsonStrict(std::string_view text, int max_depth,
                                       std::string_view what);

// `s` quoted for an error message, cut to a readable length: names in
// hostile input may be megabytes long.
std::string QuoteForMessage(std::string_view s);

}  // namespace refit::internal

#endif  // REFIT_FORMAT_JSON_H_
