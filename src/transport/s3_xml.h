// The few S3 XML responses the S3 store reads, parsed by hand: a response
// is hostile input, so every parser here bounds what it reads and fails
// with kDataLoss on anything malformed. Not a general XML parser: no
// attributes on the elements read, no CDATA, no namespaces (S3 sends none
// of these inside the elements used here). Pure functions, thread-safe.
#ifndef REFIT_TRANSPORT_S3_XML_H_
#define REFIT_TRANSPORT_S3_XML_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit::internal {

// Replaces &amp; &lt; &gt; &quot; &apos; &#N; &#xH; (as UTF-8).
Result<std::string> XmlUnescape(std::string_view text);

// Escapes & < > " ' for element text.
std::string XmlEscape(std::string_view text);

// Raw inner text of each <tag>...</tag> in `xml`, in order (not nested
// occurrences of the same tag).
Result<std::vector<std::string_view>> XmlElements(std::string_view xml,
                                                  std::string_view tag);

// The unescaped text of the first <tag>...</tag>, or nullopt.
Result<std::optional<std::string>> XmlFirst(std::string_view xml,
                                            std::string_view tag);

struct ListedObject {
  std::string key;  // unescaped, as S3 has it (including any prefix)
  uint64_t size = 0;
};

struct ListPage {
  std::vector<ListedObject> objects;
  bool truncated = false;
  std::string next_token;  // set when truncated
};

// A ListObjectsV2 result (ListBucketResult).
Result<ListPage> ParseListObjectsV2(std::string_view xml);

// Code and Message of an S3 <Error> body; empty strings when absent or
// unparsable (an error body is only used for messages).
struct S3Error {
  std::string code;
  std::string message;
};
S3Error ParseS3Error(std::string_view xml);

}  // namespace refit::internal

#endif  // REFIT_TRANSPORT_S3_XML_H_
