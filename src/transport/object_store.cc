// Key rules, the URL factory and the retrying wrapper (object_store.h).
#include "transport/object_store.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <utility>

#include "transport/stores.h"

namespace refit {

void ObjectStore::AwaitChange(uint64_t /*since*/, int timeout_ms) {
  std::this_thread::sleep_for(
      std::chrono::milliseconds(std::max(0, timeout_ms)));
}

namespace {

constexpr size_t kMaxKeyBytes = 1024;
constexpr size_t kMaxSegmentBytes = 255;

Status CheckSegment(std::string_view seg, std::string_view whole,
                    std::string_view what) {
  if (seg.empty() || seg == "." || seg == "..") {
    return InvalidArgumentError(std::string(what) + " '" + std::string(whole) +
                                "' has an empty, '.' or '..' segment");
  }
  if (seg.size() > kMaxSegmentBytes) {
    return InvalidArgumentError(std::string(what) + " '" + std::string(whole) +
                                "' has a segment over 255 bytes");
  }
  for (char c : seg) {
    if (!internal::IsKeyChar(c)) {
      return InvalidArgumentError(
          std::string(what) + " '" + std::string(whole) +
          "' holds a character outside [A-Za-z0-9._-/]");
    }
  }
  return Status();
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) {
      return InvalidArgumentError("truncated %-escape in store URL");
    }
    int hi = HexValue(s[i + 1]);
    int lo = HexValue(s[i + 2]);
    if (hi < 0 || lo < 0)
      return InvalidArgumentError("bad %-escape in store URL");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

Result<std::unique_ptr<ObjectStore>> OpenS3Url(std::string_view rest,
                                               StoreOptions options) {
  std::string_view query;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  size_t slash = rest.find('/');
  std::string bucket(rest.substr(0, slash));
  std::string prefix(slash == std::string_view::npos ? std::string_view()
                                                     : rest.substr(slash + 1));
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (bucket.empty() || bucket.size() > 255 ||
      !std::all_of(bucket.begin(), bucket.end(), internal::IsKeyChar)) {
    return InvalidArgumentError("bad bucket name '" + bucket +
                                "' in s3 URL (want [A-Za-z0-9._-]+)");
  }
  if (!prefix.empty()) REFIT_RETURN_IF_ERROR(ValidateKey(prefix));
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view()
                                          : query.substr(amp + 1);
    if (param.empty()) continue;
    size_t eq = param.find('=');
    std::string_view name = param.substr(0, eq);
    REFIT_ASSIGN_OR_RETURN(
        std::string value,
        PercentDecode(eq == std::string_view::npos ? std::string_view()
                                                   : param.substr(eq + 1)));
    if (name == "endpoint") {
      if (options.endpoint.empty()) options.endpoint = value;
    } else if (name == "region") {
      if (options.region.empty()) options.region = value;
    } else {
      return InvalidArgumentError("unknown s3 URL parameter '" +
                                  std::string(name) +
                                  "' (known: endpoint, region)");
    }
  }
  return internal::OpenS3Store(bucket, prefix, options);
}

// kUnavailable is retried; PutIfAbsent resolves a lost response by reading
// the object back (object_store.h, note 1).
class RetryingStore final : public ForwardingStore {
 public:
  RetryingStore(std::shared_ptr<ObjectStore> inner, const StoreOptions& o)
      : ForwardingStore(std::move(inner)),
        max_attempts_(std::max(1, o.max_attempts)),
        backoff_ms_(std::max(0, o.backoff_ms)) {}

  Status Put(std::string_view key, std::span<const uint8_t> data) override {
    return Retry([&] { return inner()->Put(key, data); });
  }

  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override {
    bool ambiguous = false;
    Status s = Retry([&] {
      Status r = inner()->PutIfAbsent(key, data);
      if (r.code() == StatusCode::kUnavailable) ambiguous = true;
      return r;
    });
    if (s.code() != StatusCode::kAlreadyExists || !ambiguous) return s;
    Result<std::vector<uint8_t>> stored =
        RetryResult([&] { return inner()->Get(key); });
    if (stored.ok() &&
        std::equal(stored->begin(), stored->end(), data.begin(), data.end())) {
      return Status();
    }
    return s;
  }

  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    return RetryResult([&] { return inner()->Get(key); });
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    return RetryResult([&] { return inner()->List(prefix); });
  }

  Status Delete(std::string_view key) override {
    return Retry([&] { return inner()->Delete(key); });
  }

 private:
  template <typename F>
  Status Retry(F&& f) {
    Status s;
    for (int attempt = 1;; ++attempt) {
      s = f();
      if (s.code() != StatusCode::kUnavailable || attempt >= max_attempts_) {
        break;
      }
      std::this_thread::sleep_for(internal::BackoffDelay(attempt, backoff_ms_));
    }
    if (s.code() == StatusCode::kUnavailable && max_attempts_ > 1) {
      return s.WithContext("after " + std::to_string(max_attempts_) +
                           " attempts");
    }
    return s;
  }

  template <typename F>
  auto RetryResult(F&& f) -> decltype(f()) {
    for (int attempt = 1;; ++attempt) {
      auto r = f();
      if (r.ok() || r.status().code() != StatusCode::kUnavailable) return r;
      if (attempt >= max_attempts_) {
        if (max_attempts_ == 1) return r;
        return r.status().WithContext("after " + std::to_string(max_attempts_) +
                                      " attempts");
      }
      std::this_thread::sleep_for(internal::BackoffDelay(attempt, backoff_ms_));
    }
  }

  int max_attempts_;
  int backoff_ms_;
};

}  // namespace

Status ValidateKey(std::string_view key) {
  if (key.empty()) return InvalidArgumentError("empty object key");
  if (key.size() > kMaxKeyBytes) {
    return InvalidArgumentError("object key of " + std::to_string(key.size()) +
                                " bytes is over the 1024-byte limit");
  }
  size_t start = 0;
  for (;;) {
    size_t slash = key.find('/', start);
    std::string_view seg = key.substr(start, slash == std::string_view::npos
                                                 ? std::string_view::npos
                                                 : slash - start);
    REFIT_RETURN_IF_ERROR(CheckSegment(seg, key, "object key"));
    if (slash == std::string_view::npos) return Status();
    start = slash + 1;
  }
}

namespace internal {

Status ValidatePrefix(std::string_view prefix) {
  if (prefix.size() > kMaxKeyBytes) {
    return InvalidArgumentError("list prefix over the 1024-byte limit");
  }
  size_t start = 0;
  for (;;) {
    size_t slash = prefix.find('/', start);
    if (slash == std::string_view::npos) {
      // The last, possibly partial, segment: characters only ("a.", "." and
      // ".." are fine as the start of a longer segment).
      if (prefix.size() - start > kMaxSegmentBytes) {
        return InvalidArgumentError("list prefix '" + std::string(prefix) +
                                    "' has a segment over 255 bytes");
      }
      for (char c : prefix.substr(start)) {
        if (!IsKeyChar(c)) {
          return InvalidArgumentError(
              "list prefix '" + std::string(prefix) +
              "' holds a character outside [A-Za-z0-9._-/]");
        }
      }
      return Status();
    }
    REFIT_RETURN_IF_ERROR(CheckSegment(prefix.substr(start, slash - start),
                                       prefix, "list prefix"));
    start = slash + 1;
  }
}

std::chrono::milliseconds BackoffDelay(int retry, int base_ms) {
  constexpr int64_t kCapMs = 10000;
  int64_t d = std::max(0, base_ms);
  for (int i = 1; i < retry && d < kCapMs; ++i) d *= 2;
  d = std::min(d, kCapMs);
  if (d == 0) return std::chrono::milliseconds(0);
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int64_t> dist(d / 2, d);
  return std::chrono::milliseconds(dist(rng));
}

}  // namespace internal

Result<std::unique_ptr<ObjectStore>> OpenObjectStore(
    const std::string& url, const StoreOptions& options) {
  std::string_view u(url);
  if (u.empty()) return InvalidArgumentError("empty object store URL");
  if (u.starts_with("s3://")) return OpenS3Url(u.substr(5), options);
  if (u.starts_with("file://")) {
    std::string_view path = u.substr(7);
    if (!path.starts_with("/")) {
      return InvalidArgumentError("file URL '" + url +
                                  "' must be file:///absolute/path");
    }
    return internal::OpenDirStore(std::string(path),
                                   options.create_if_missing);
  }
  if (auto colon = u.find("://"); colon != std::string_view::npos) {
    return InvalidArgumentError("unsupported object store URL '" + url +
                                "' (want s3://bucket/prefix, file:///dir or "
                                "a path)");
  }
  return internal::OpenDirStore(url, options.create_if_missing);
}

std::unique_ptr<ObjectStore> NewRetryingStore(
    std::shared_ptr<ObjectStore> inner, const StoreOptions& options) {
  return std::make_unique<RetryingStore>(std::move(inner), options);
}

Status PutOnce(ObjectStore* store, const std::string& key, std::span<const uint8_t> bytes,
               const std::string& on_conflict) {
  Status s = store->PutIfAbsent(key, bytes);
  if (s.code() != StatusCode::kAlreadyExists) return s;
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> held, store->Get(key));
  if (held.size() == bytes.size() && std::equal(held.begin(), held.end(), bytes.begin())) {
    return Status();
  }
  return FailedPreconditionError("'" + key + "' already holds other bytes: " + on_conflict);
}

}  // namespace refit
