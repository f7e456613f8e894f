#include "transport/s3_xml.h"

#include <charconv>

namespace refit::internal {
namespace {

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

Result<std::string> XmlUnescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '&') {
      out.push_back(text[i]);
      continue;
    }
    size_t semi = text.find(';', i);
    if (semi == std::string_view::npos || semi - i > 12) {
      return DataLossError("S3 response: unterminated XML entity");
    }
    std::string_view ent = text.substr(i + 1, semi - i - 1);
    if (ent == "amp") {
      out.push_back('&');
    } else if (ent == "lt") {
      out.push_back('<');
    } else if (ent == "gt") {
      out.push_back('>');
    } else if (ent == "quot") {
      out.push_back('"');
    } else if (ent == "apos") {
      out.push_back('\'');
    } else if (ent.size() >= 2 && ent[0] == '#') {
      int base = 10;
      std::string_view digits = ent.substr(1);
      if (digits[0] == 'x' || digits[0] == 'X') {
        base = 16;
        digits = digits.substr(1);
      }
      uint32_t cp = 0;
      auto [p, ec] = std::from_chars(digits.data(),
                                     digits.data() + digits.size(), cp, base);
      if (digits.empty() || ec != std::errc() ||
          p != digits.data() + digits.size() || cp == 0 || cp > 0x10FFFF ||
          (cp >= 0xD800 && cp <= 0xDFFF)) {
        return DataLossError("S3 response: bad XML character reference");
      }
      AppendUtf8(cp, &out);
    } else {
      return DataLossError("S3 response: unknown XML entity '&" +
                           std::string(ent) + ";'");
    }
    i = semi;
  }
  return out;
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

Result<std::vector<std::string_view>> XmlElements(std::string_view xml,
                                                  std::string_view tag) {
  std::string open = "<" + std::string(tag) + ">";
  std::string close = "</" + std::string(tag) + ">";
  std::vector<std::string_view> out;
  size_t pos = 0;
  for (;;) {
    size_t b = xml.find(open, pos);
    if (b == std::string_view::npos) return out;
    b += open.size();
    size_t e = xml.find(close, b);
    if (e == std::string_view::npos) {
      return DataLossError("S3 response: <" + std::string(tag) +
                           "> is not closed");
    }
    out.push_back(xml.substr(b, e - b));
    pos = e + close.size();
  }
}

Result<std::optional<std::string>> XmlFirst(std::string_view xml,
                                            std::string_view tag) {
  std::string open = "<" + std::string(tag) + ">";
  size_t b = xml.find(open);
  if (b == std::string_view::npos) return std::optional<std::string>();
  REFIT_ASSIGN_OR_RETURN(auto all, XmlElements(xml.substr(b), tag));
  REFIT_ASSIGN_OR_RETURN(std::string text, XmlUnescape(all.front()));
  return std::optional<std::string>(std::move(text));
}

Result<ListPage> ParseListObjectsV2(std::string_view xml) {
  if (xml.find("<ListBucketResult") == std::string_view::npos) {
    return DataLossError("S3 response: not a ListBucketResult");
  }
  ListPage page;
  REFIT_ASSIGN_OR_RETURN(auto contents, XmlElements(xml, "Contents"));
  page.objects.reserve(contents.size());
  for (std::string_view c : contents) {
    REFIT_ASSIGN_OR_RETURN(auto key, XmlFirst(c, "Key"));
    REFIT_ASSIGN_OR_RETURN(auto size, XmlFirst(c, "Size"));
    if (!key || key->empty() || !size || size->empty()) {
      return DataLossError("S3 response: <Contents> without Key or Size");
    }
    uint64_t n = 0;
    auto [p, ec] =
        std::from_chars(size->data(), size->data() + size->size(), n);
    if (ec != std::errc() || p != size->data() + size->size()) {
      return DataLossError("S3 response: bad object size '" + *size + "'");
    }
    page.objects.push_back({std::move(*key), n});
  }
  // Everything after the last </Contents> (or the whole body) holds the
  // result's own fields; searching only there keeps a key named
  // "<IsTruncated>" (escaped anyway) from confusing us.
  size_t tail_start = xml.rfind("</Contents>");
  std::string_view tail =
      tail_start == std::string_view::npos ? xml : xml.substr(tail_start);
  std::string_view head =
      xml.substr(0, xml.find("<Contents>") == std::string_view::npos
                        ? xml.size()
                        : xml.find("<Contents>"));
  auto field = [&](std::string_view tag) -> Result<std::string> {
    REFIT_ASSIGN_OR_RETURN(auto v, XmlFirst(head, tag));
    if (!v) {
      REFIT_ASSIGN_OR_RETURN(v, XmlFirst(tail, tag));
    }
    return v.value_or(std::string());
  };
  REFIT_ASSIGN_OR_RETURN(std::string truncated, field("IsTruncated"));
  if (truncated != "true" && truncated != "false") {
    return DataLossError("S3 response: ListBucketResult without IsTruncated");
  }
  page.truncated = truncated == "true";
  if (page.truncated) {
    REFIT_ASSIGN_OR_RETURN(page.next_token, field("NextContinuationToken"));
    if (page.next_token.empty()) {
      return DataLossError(
          "S3 response: truncated listing without NextContinuationToken");
    }
  }
  return page;
}

S3Error ParseS3Error(std::string_view xml) {
  S3Error e;
  auto code = XmlFirst(xml, "Code");
  if (code.ok() && code->has_value()) e.code = std::move(**code);
  auto message = XmlFirst(xml, "Message");
  if (message.ok() && message->has_value()) e.message = std::move(**message);
  if (e.code.size() > 200) e.code.resize(200);
  if (e.message.size() > 500) e.message.resize(500);
  return e;
}

}  // namespace refit::internal
