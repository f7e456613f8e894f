// The S3 store: path-style requests (<endpoint>/<bucket>/<prefix>/<key>)
// signed by libcurl's AWS SigV4 (CURLOPT_AWS_SIGV4), so it works with AWS,
// MinIO, Ceph RGW and moto alike. docs/protocol.md, "Object stores".
//
// Every request carries x-amz-content-sha256 with the payload's SHA-256, so
// the service rejects a body damaged on the way. Retryable failures (curl
// transport errors, HTTP 5xx and 429) are retried with exponential backoff
// and jitter; an attempt that may have taken effect (a lost response, a
// 5xx) makes the call "ambiguous", which PutIfAbsent resolves by reading
// the object back (object_store.h, note 1).
//
// Threading: curl easy handles live in a pool guarded by a mutex; a request
// takes one for its duration, so one store serves many threads and keeps
// connections alive between requests. Credentials are only handed to curl;
// no message or Describe() holds them.
#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>

#include "transport/s3_xml.h"
#include "transport/stores.h"

namespace refit::internal {
namespace {

constexpr uint64_t kMinPartSize = 5ull << 20;  // S3's minimum part size
constexpr uint64_t kMaxParts = 10000;          // S3's maximum part count
constexpr size_t kMaxMetaResponse = 64 << 20;  // lists, errors
constexpr int kPartThreads = 4;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string Sha256Hex(std::span<const uint8_t> data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

std::string Escape(std::string_view s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : s) {
    if (IsKeyChar(c) || c == '~') {  // RFC 3986 unreserved
      out.push_back(c);
    } else {
      auto u = static_cast<unsigned char>(c);
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

bool CurlRetryable(CURLcode c) {
  switch (c) {
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_WRITE_ERROR:  // our response cap
    case CURLE_OUT_OF_MEMORY:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_LOGIN_DENIED:
      return false;
    default:
      return true;
  }
}

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Request {
  const char* method = "GET";  // GET, HEAD, PUT, POST, DELETE
  std::string key;             // full object name in the bucket; "" = bucket
  std::string query;           // sorted, escaped, without '?'
  std::vector<std::string> headers;
  std::span<const uint8_t> body;
  bool object_body = false;   // response is object data (no size cap)
  bool error_in_200 = false;  // CompleteMultipartUpload may fail with 200
};

struct Response {
  long status = 0;
  std::vector<uint8_t> body;
  std::string etag;
  bool ambiguous = false;  // an earlier attempt may have taken effect
  std::string_view text() const {
    return {reinterpret_cast<const char*>(body.data()), body.size()};
  }
};

struct Transfer {
  Response* response;
  size_t cap;
};

size_t OnWrite(char* p, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t bytes = size * n;
  if (t->response->body.size() + bytes > t->cap) return 0;
  t->response->body.insert(t->response->body.end(), p, p + bytes);
  return bytes;
}

size_t OnHeader(char* p, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t bytes = size * n;
  std::string_view line(p, bytes);
  auto starts = [&](std::string_view name) {
    if (line.size() < name.size()) return false;
    for (size_t i = 0; i < name.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) {
        return false;
      }
    }
    return true;
  };
  auto value = [&](size_t skip) {
    std::string_view v = line.substr(skip);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t'))
      v.remove_prefix(1);
    while (!v.empty() &&
           (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) {
      v.remove_suffix(1);
    }
    return v;
  };
  if (starts("http/")) {
    t->response->etag.clear();  // a new (possibly interim) response
  } else if (starts("etag:")) {
    t->response->etag = std::string(value(5));
  } else if (starts("content-length:")) {
    std::string_view v = value(15);
    uint64_t len = 0;
    for (char c : v) {
      if (c < '0' || c > '9' || len > (uint64_t{1} << 40)) return bytes;
      len = len * 10 + static_cast<uint64_t>(c - '0');
    }
    if (len <= t->cap) {
      t->response->body.reserve(
          static_cast<size_t>(std::min<uint64_t>(len, uint64_t{1} << 30)));
    }
  }
  return bytes;
}

class S3Store final : public ObjectStore {
 public:
  S3Store(std::string bucket, std::string prefix, StoreOptions o,
          std::string endpoint, std::string region)
      : bucket_(std::move(bucket)),
        prefix_(std::move(prefix)),
        options_(std::move(o)),
        endpoint_(std::move(endpoint)),
        sigv4_("aws:amz:" + region + ":s3") {
    options_.region = std::move(region);
  }

  ~S3Store() override {
    for (CURL* h : pool_) curl_easy_cleanup(h);
  }

  std::string Describe() const override {
    return "s3://" + bucket_ + (prefix_.empty() ? "" : "/" + prefix_) + " at " +
           endpoint_;
  }

  Status Put(std::string_view key, std::span<const uint8_t> data) override {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    if (data.size() > options_.multipart_threshold) {
      bool ambiguous = false;
      return PutMultipart(key, data, /*if_absent=*/false, &ambiguous);
    }
    Request req;
    req.method = "PUT";
    req.key = ObjectName(key);
    req.body = data;
    req.headers.push_back("Content-Type: application/octet-stream");
    REFIT_ASSIGN_OR_RETURN(Response r, Execute(req, "PUT", key));
    if (r.status != 200) return HttpError("PUT", key, r);
    return Status();
  }

  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    bool ambiguous = false;
    Status s;
    // 409 ConditionalRequestConflict: another conditional write to the key
    // is in flight; ours did not happen. Retry until one outcome is final.
    for (int attempt = 1;; ++attempt) {
      s = PutIfAbsentOnce(key, data, &ambiguous);
      if (s.code() != StatusCode::kAborted) break;
      if (attempt >= std::max(1, options_.max_attempts)) {
        return UnavailableError(Describe() + ": PUT (if absent) '" +
                                std::string(key) + "' kept conflicting (" +
                                std::string(s.message()) + ")");
      }
      std::this_thread::sleep_for(BackoffDelay(attempt, options_.backoff_ms));
    }
    if (s.code() == StatusCode::kAlreadyExists && ambiguous) {
      // Did the attempt whose answer we lost win? Same size, same bytes.
      Result<std::vector<uint8_t>> stored = Get(key);
      if (stored.ok() && std::equal(stored->begin(), stored->end(),
                                    data.begin(), data.end())) {
        return Status();
      }
    }
    return s;
  }

  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    Request req;
    req.key = ObjectName(key);
    req.object_body = true;
    REFIT_ASSIGN_OR_RETURN(Response r, Execute(req, "GET", key));
    if (r.status != 200) return HttpError("GET", key, r);
    return std::move(r.body);
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    REFIT_RETURN_IF_ERROR(ValidatePrefix(prefix));
    std::string full_prefix = ObjectName(prefix);
    if (prefix.empty() && !prefix_.empty()) full_prefix = prefix_ + "/";
    std::string strip = prefix_.empty() ? "" : prefix_ + "/";
    std::vector<ObjectInfo> out;
    std::string token;
    for (int page_no = 0;; ++page_no) {
      Request req;
      req.key = "";
      // Parameters in canonical (sorted) order, escaped as SigV4 wants.
      req.query =
          (token.empty() ? "" : "continuation-token=" + Escape(token) + "&") +
          "list-type=2&prefix=" + Escape(full_prefix);
      REFIT_ASSIGN_OR_RETURN(Response r, Execute(req, "LIST", prefix));
      if (r.status != 200) return HttpError("LIST", prefix, r);
      REFIT_ASSIGN_OR_RETURN(ListPage page, ParseListObjectsV2(r.text()));
      for (ListedObject& o : page.objects) {
        if (!o.key.starts_with(strip)) {
          return DataLossError(Describe() + ": listing returned key '" + o.key +
                               "' outside the prefix");
        }
        std::string key = o.key.substr(strip.size());
        // Objects written by others with names we cannot address are not
        // ours; a listing shows only valid keys.
        if (!key.starts_with(prefix) || !ValidateKey(key).ok()) continue;
        out.push_back({std::move(key), o.size});
      }
      if (!page.truncated) break;
      if (page.next_token == token) {
        return DataLossError(Describe() + ": listing repeated its token");
      }
      token = std::move(page.next_token);
    }
    std::sort(
        out.begin(), out.end(),
        [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  Status Delete(std::string_view key) override {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    Request req;
    req.method = "DELETE";
    req.key = ObjectName(key);
    REFIT_ASSIGN_OR_RETURN(Response r, Execute(req, "DELETE", key));
    if (r.status == 200 || r.status == 204) return Status();
    Status s = HttpError("DELETE", key, r);
    if (s.code() == StatusCode::kNotFound &&
        ParseS3Error(r.text()).code == "NoSuchKey") {
      return Status();
    }
    return s;
  }

  // Creates the bucket unless it exists (HEAD, then PUT).
  Status CreateBucket() {
    Request head;
    head.method = "HEAD";
    REFIT_ASSIGN_OR_RETURN(Response h, Execute(head, "HEAD BUCKET", bucket_));
    if (h.status == 200) return Status();
    Request req;
    req.method = "PUT";
    REFIT_ASSIGN_OR_RETURN(Response r, Execute(req, "CREATE BUCKET", bucket_));
    if (r.status == 200) return Status();
    return HttpError("CREATE BUCKET", bucket_, r);
  }

 private:
  std::string ObjectName(std::string_view key) const {
    return prefix_.empty() ? std::string(key)
                           : prefix_ + "/" + std::string(key);
  }

  // kAborted on 409 (retry), kAlreadyExists on 412.
  Status PutIfAbsentOnce(std::string_view key, std::span<const uint8_t> data,
                         bool* ambiguous) {
    if (data.size() > options_.multipart_threshold) {
      return PutMultipart(key, data, /*if_absent=*/true, ambiguous);
    }
    Request req;
    req.method = "PUT";
    req.key = ObjectName(key);
    req.body = data;
    req.headers.push_back("Content-Type: application/octet-stream");
    req.headers.push_back("If-None-Match: *");
    REFIT_ASSIGN_OR_RETURN(Response r, Execute(req, "PUT (if absent)", key));
    *ambiguous |= r.ambiguous;
    if (r.status == 200) return Status();
    return ConditionalError("PUT (if absent)", key, r);
  }

  Status ConditionalError(std::string_view op, std::string_view key,
                          const Response& r) {
    if (r.status == 412) {
      return AlreadyExistsError("object '" + std::string(key) +
                                "' already exists in " + Describe());
    }
    if (r.status == 409) {
      S3Error e = ParseS3Error(r.text());
      return AbortedError("HTTP 409 " + e.code);
    }
    return HttpError(op, key, r);
  }

  Status PutMultipart(std::string_view key, std::span<const uint8_t> data,
                      bool if_absent, bool* ambiguous) {
    std::string name = ObjectName(key);
    uint64_t part =
        std::max<uint64_t>(options_.multipart_threshold, kMinPartSize);
    part = std::max<uint64_t>(part, (data.size() + kMaxParts - 1) / kMaxParts);
    const size_t nparts = static_cast<size_t>((data.size() + part - 1) / part);

    Request create;
    create.method = "POST";
    create.key = name;
    create.query = "uploads=";
    create.headers.push_back("Content-Type: application/octet-stream");
    REFIT_ASSIGN_OR_RETURN(Response cr, Execute(create, "CREATE UPLOAD", key));
    if (cr.status != 200) return HttpError("CREATE UPLOAD", key, cr);
    REFIT_ASSIGN_OR_RETURN(auto upload_id, XmlFirst(cr.text(), "UploadId"));
    if (!upload_id || upload_id->empty()) {
      return DataLossError(Describe() + ": CreateMultipartUpload for '" +
                           std::string(key) + "' returned no UploadId");
    }
    const std::string id_query = "uploadId=" + Escape(*upload_id);

    std::vector<std::string> etags(nparts);
    std::vector<Status> errors(nparts);
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    auto worker = [&] {
      for (size_t i; !failed && (i = next.fetch_add(1)) < nparts;) {
        Request up;
        up.method = "PUT";
        up.key = name;
        up.query = "partNumber=" + std::to_string(i + 1) + "&" + id_query;
        size_t off = static_cast<size_t>(i * part);
        up.body = data.subspan(off, std::min<size_t>(static_cast<size_t>(part),
                                                     data.size() - off));
        up.headers.push_back("Content-Type: application/octet-stream");
        Result<Response> r = Execute(up, "UPLOAD PART", key);
        if (!r.ok()) {
          errors[i] = r.status();
        } else if (r->status != 200) {
          errors[i] = HttpError("UPLOAD PART", key, *r);
        } else if (r->etag.empty()) {
          errors[i] = DataLossError(Describe() + ": UploadPart for '" +
                                    std::string(key) + "' returned no ETag");
        } else {
          etags[i] = std::move(r->etag);
          continue;
        }
        failed = true;
      }
    };
    {
      std::vector<std::thread> threads;
      size_t n = std::min<size_t>(kPartThreads, nparts);
      for (size_t t = 1; t < n; ++t) threads.emplace_back(worker);
      worker();
      for (auto& t : threads) t.join();
    }
    Status s;
    for (Status& e : errors) {
      if (!e.ok()) {
        s = std::move(e);
        break;
      }
    }
    if (s.ok()) {
      std::string xml = "<CompleteMultipartUpload>";
      for (size_t i = 0; i < nparts; ++i) {
        xml += "<Part><PartNumber>" + std::to_string(i + 1) +
               "</PartNumber><ETag>" + XmlEscape(etags[i]) + "</ETag></Part>";
      }
      xml += "</CompleteMultipartUpload>";
      Request done;
      done.method = "POST";
      done.key = name;
      done.query = id_query;
      done.body = {reinterpret_cast<const uint8_t*>(xml.data()), xml.size()};
      done.headers.push_back("Content-Type: application/xml");
      if (if_absent) done.headers.push_back("If-None-Match: *");
      done.error_in_200 = true;
      Result<Response> r = Execute(done, "COMPLETE UPLOAD", key);
      if (!r.ok()) {
        s = r.status();
      } else {
        *ambiguous |= r->ambiguous;
        if (r->status == 200) return Status();
        s = if_absent ? ConditionalError("COMPLETE UPLOAD", key, *r)
                      : HttpError("COMPLETE UPLOAD", key, *r);
      }
    }
    // Best effort: an upload left behind only costs storage until the
    // bucket's lifecycle rule removes it.
    Request abort;
    abort.method = "DELETE";
    abort.key = name;
    abort.query = id_query;
    (void)Execute(abort, "ABORT UPLOAD", key);
    return s;
  }

  Status HttpError(std::string_view op, std::string_view key,
                   const Response& r) const {
    S3Error e = ParseS3Error(r.text());
    std::string msg = Describe() + ": " + std::string(op) + " '" +
                      std::string(key) + "': HTTP " + std::to_string(r.status);
    if (!e.code.empty()) msg += " " + e.code;
    if (!e.message.empty()) msg += " (" + e.message + ")";
    switch (r.status) {
      case 404:
        if (e.code == "NoSuchBucket") {
          return NotFoundError(msg + "; bucket '" + bucket_ +
                               "' does not exist at " + endpoint_ +
                               ": create it or fix the URL");
        }
        return NotFoundError(msg);
      case 401:
      case 403:
        return PermissionDeniedError(msg +
                                     "; check the credentials and the region");
      case 400:
        return InvalidArgumentError(msg);
      case 409:
        return AbortedError(msg);
      case 412:
        return FailedPreconditionError(msg);
      case 413:
        return ResourceExhaustedError(msg);
      default:
        if (r.status == 429 || r.status >= 500) return UnavailableError(msg);
        return UnknownError(msg);
    }
  }

  CURL* Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!pool_.empty()) {
        CURL* h = pool_.back();
        pool_.pop_back();
        return h;
      }
    }
    return curl_easy_init();
  }

  void Release(CURL* h) {
    std::lock_guard<std::mutex> lock(mu_);
    pool_.push_back(h);
  }

  // One attempt. On a transport failure returns the curl code and sets
  // *error; on an HTTP answer returns CURLE_OK.
  CURLcode PerformOnce(const Request& req, Response* resp, std::string* error) {
    CURL* h = Acquire();
    if (h == nullptr) {
      *error = "curl_easy_init failed";
      return CURLE_FAILED_INIT;
    }
    curl_easy_reset(h);
    std::string url = endpoint_ + "/" + bucket_;
    if (!req.key.empty()) url += "/" + req.key;  // key chars need no escaping
    if (!req.query.empty()) url += "?" + req.query;
    char errbuf[CURL_ERROR_SIZE] = {0};
    Transfer transfer{resp, req.object_body ? SIZE_MAX : kMaxMetaResponse};

    curl_slist* headers = nullptr;
    for (const std::string& hdr : req.headers) {
      headers = curl_slist_append(headers, hdr.c_str());
    }
    std::string sha = "x-amz-content-sha256: " + Sha256Hex(req.body);
    headers = curl_slist_append(headers, sha.c_str());
    std::string token_header;
    if (!options_.session_token.empty()) {
      token_header = "x-amz-security-token: " + options_.session_token;
      headers = curl_slist_append(headers, token_header.c_str());
    }

    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(options_.timeout_ms));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::min(options_.timeout_ms, 10000)));
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4_.c_str());
    curl_easy_setopt(h, CURLOPT_USERNAME, options_.access_key.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, options_.secret_key.c_str());
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, OnWrite);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &transfer);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &transfer);
    std::string_view method = req.method;
    if (method == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (method == "PUT" || method == "POST") {
      // POSTFIELDS keeps the body in memory for curl's payload handling;
      // CUSTOMREQUEST makes it a PUT where needed.
      static const char kEmpty[] = "";
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(req.body.size()));
      curl_easy_setopt(h, CURLOPT_POSTFIELDS,
                       req.body.empty()
                           ? kEmpty
                           : reinterpret_cast<const char*>(req.body.data()));
      if (method == "PUT") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
    } else if (method == "DELETE") {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);

    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK) {
      curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status);
    } else {
      *error = "curl error " + std::to_string(static_cast<int>(rc)) + " (" +
               (errbuf[0] != 0 ? std::string(errbuf) : curl_easy_strerror(rc)) +
               ")";
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, nullptr);
    curl_slist_free_all(headers);
    Release(h);
    return rc;
  }

  // Runs `req` with retries. Returns the first non-retryable HTTP answer,
  // whatever its status; kUnavailable after max_attempts.
  Result<Response> Execute(const Request& req, std::string_view op,
                           std::string_view key) {
    const int attempts = std::max(1, options_.max_attempts);
    std::string last;
    bool ambiguous = false;
    for (int attempt = 1; attempt <= attempts; ++attempt) {
      if (attempt > 1) {
        std::this_thread::sleep_for(
            BackoffDelay(attempt - 1, options_.backoff_ms));
      }
      Response resp;
      std::string error;
      CURLcode rc = PerformOnce(req, &resp, &error);
      if (rc != CURLE_OK) {
        last = error;
        if (!CurlRetryable(rc)) {
          std::string msg = Describe() + ": " + std::string(op) + " '" +
                            std::string(key) + "': " + error;
          if (rc == CURLE_WRITE_ERROR)
            return DataLossError(msg + ": response too large");
          if (rc == CURLE_URL_MALFORMAT || rc == CURLE_UNSUPPORTED_PROTOCOL) {
            return InvalidArgumentError(msg);
          }
          return UnavailableError(msg);
        }
        ambiguous = true;
        continue;
      }
      bool failed_200 = req.error_in_200 && resp.status == 200 &&
                        resp.text().find("<Error>") != std::string_view::npos;
      if (resp.status >= 500 || resp.status == 429 || failed_200) {
        S3Error e = ParseS3Error(resp.text());
        last = "HTTP " + std::to_string(failed_200 ? 500 : resp.status) +
               (e.code.empty() ? "" : " " + e.code);
        ambiguous = true;
        continue;
      }
      resp.ambiguous = ambiguous;
      return resp;
    }
    return UnavailableError(Describe() + ": " + std::string(op) + " '" +
                            std::string(key) + "' failed after " +
                            std::to_string(attempts) +
                            " attempts; last: " + last);
  }

  const std::string bucket_;
  const std::string prefix_;
  StoreOptions options_;
  const std::string endpoint_;
  const std::string sigv4_;
  std::mutex mu_;
  std::vector<CURL*> pool_;
};

}  // namespace

namespace {

Result<std::unique_ptr<S3Store>> MakeS3Store(const std::string& bucket,
                                             const std::string& prefix,
                                             const StoreOptions& options) {
  InitCurlOnce();
  StoreOptions o = options;
  if (!prefix.empty()) REFIT_RETURN_IF_ERROR(ValidateKey(prefix));
  std::string region = o.region;
  if (region.empty()) region = Env("AWS_REGION");
  if (region.empty()) region = Env("AWS_DEFAULT_REGION");
  if (region.empty()) region = "us-east-1";
  for (char c : region) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
      return InvalidArgumentError("bad S3 region '" + region + "'");
    }
  }
  std::string endpoint = o.endpoint;
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = "https://s3." + region + ".amazonaws.com";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (!endpoint.starts_with("http://") && !endpoint.starts_with("https://")) {
    return InvalidArgumentError("S3 endpoint '" + endpoint +
                                "' must start with http:// or https://");
  }
  if (o.access_key.empty()) o.access_key = Env("AWS_ACCESS_KEY_ID");
  if (o.secret_key.empty()) o.secret_key = Env("AWS_SECRET_ACCESS_KEY");
  if (o.session_token.empty()) o.session_token = Env("AWS_SESSION_TOKEN");
  if (o.access_key.empty() || o.secret_key.empty()) {
    return InvalidArgumentError(
        "no S3 credentials for s3://" + bucket +
        ": set the environment variables AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary "
        "credentials)");
  }
  if (o.timeout_ms <= 0)
    return InvalidArgumentError("S3 timeout_ms must be > 0");
  return std::make_unique<S3Store>(bucket, prefix, std::move(o),
                                   std::move(endpoint), std::move(region));
}

}  // namespace

Result<std::unique_ptr<ObjectStore>> OpenS3Store(const std::string& bucket,
                                                 const std::string& prefix,
                                                 const StoreOptions& options) {
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<S3Store> store,
                         MakeS3Store(bucket, prefix, options));
  return std::unique_ptr<ObjectStore>(std::move(store));
}

Status CreateS3Bucket(const std::string& bucket, const StoreOptions& options) {
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<S3Store> store,
                         MakeS3Store(bucket, "", options));
  return store->CreateBucket();
}

}  // namespace refit::internal
