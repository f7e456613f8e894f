// ObjectStore: the transport seam for versions that travel through storage
// (docs/protocol.md). The protocol sees only this interface, so a local
// directory (the embedded default, also for shared file systems), any
// S3-compatible service, and test doubles that drop, corrupt, delay or
// throttle are interchangeable. Programs include this header; a store of
// their own implements ObjectStore.
//
// Keys are relative paths of [A-Za-z0-9._-] segments joined by '/', with no
// empty, "." or ".." segment, each segment at most 255 bytes (a file name
// in the directory store), at most 1024 bytes in all. Objects are immutable
// once visible: a reader sees a whole object or none. Implementations are
// thread-safe: one store may be used from several threads at once.
//
// Errors: kNotFound (absent key), kAlreadyExists (PutIfAbsent lost),
// kInvalidArgument (bad key or URL), kUnavailable (retryable transport
// failure, after the store's own retries), kPermissionDenied,
// kResourceExhausted, kDataLoss (a response that fails its own checks).
#ifndef REFIT_STORE_H_
#define REFIT_STORE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit {

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // Human-readable location, for logs and errors (never credentials).
  virtual std::string Describe() const = 0;

  // Stores `data` under `key`, replacing any earlier object atomically.
  virtual Status Put(std::string_view key, std::span<const uint8_t> data) = 0;

  // Stores `data` only if `key` does not exist; kAlreadyExists otherwise.
  // Of any number of concurrent callers (processes, hosts) exactly one
  // succeeds. Used for the one decision per version.
  // Note 1: when an attempt's outcome is unknown (a lost response) and a
  // retry then finds the key present, the store reads the object back and
  // reports success if it holds exactly `data`. Writers that must tell
  // themselves apart write distinct bytes (e.g. their own id).
  virtual Status PutIfAbsent(std::string_view key,
                             std::span<const uint8_t> data) = 0;

  virtual Result<std::vector<uint8_t>> Get(std::string_view key) = 0;

  // Objects whose key starts with `prefix`, sorted by key.
  virtual Result<std::vector<ObjectInfo>> List(std::string_view prefix) = 0;

  // Removes `key`; removing an absent key succeeds.
  virtual Status Delete(std::string_view key) = 0;

  // Change notification, so that a wait for an object need not sleep a
  // whole poll interval. ChangeCount() grows whenever the store stores an
  // object (through this store object or, where the store can tell, from
  // other writers: a relay endpoint counts what arrives). AwaitChange(since,
  // timeout_ms) returns once the count differs from `since`, or after
  // timeout_ms, whichever comes first. A waiter takes the count before it
  // looks for the object, so an object stored in between ends the wait at
  // once; a wake-up says only that something changed. The defaults count
  // nothing and sleep the whole timeout (a poll). Wrappers forward both.
  virtual uint64_t ChangeCount() { return 0; }
  virtual void AwaitChange(uint64_t since, int timeout_ms);
};

struct StoreOptions {
  // S3: endpoint URL ("http://127.0.0.1:9000"); empty = AWS_ENDPOINT_URL or
  // the AWS regional endpoint. Region: empty = AWS_REGION or "us-east-1".
  // Credentials: empty = AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
  std::string endpoint;
  std::string region;
  std::string access_key;
  std::string secret_key;
  // Temporary credentials: empty = AWS_SESSION_TOKEN (may stay empty).
  std::string session_token;
  // S3: objects above this size are uploaded in parts of this size.
  uint64_t multipart_threshold = 16 << 20;
  // Attempts for retryable failures (5xx, 429, connection errors), with
  // exponential backoff and jitter starting at backoff_ms.
  int max_attempts = 5;
  int backoff_ms = 50;
  // Per-request deadline.
  int timeout_ms = 30000;
  // Directory stores: create the directory (and its parents) when absent.
  // Writers (publish, receive) want that; readers (status) set false, so a
  // mistyped path fails with kNotFound ("no store at PATH") instead of
  // leaving an empty store behind.
  bool create_if_missing = true;
};

// Opens a store by URL: "s3://bucket/prefix" for S3-compatible storage,
// "file:///abs/dir" or a plain path for a directory (created if absent,
// unless options.create_if_missing is false).
// An s3 URL may carry "?endpoint=URL&region=NAME"; they fill the options
// fields left empty (docs/protocol.md, "Object stores").
Result<std::unique_ptr<ObjectStore>> OpenObjectStore(
    const std::string& url, const StoreOptions& options = {});

// Wraps `inner` so that kUnavailable results are retried up to
// options.max_attempts times in all, with exponential backoff and jitter
// starting at options.backoff_ms. For stores whose own retries do not cover
// the failure (a directory on a flaky network file system) and for callers
// that want a second layer. PutIfAbsent follows note 1 above.
std::unique_ptr<ObjectStore> NewRetryingStore(
    std::shared_ptr<ObjectStore> inner, const StoreOptions& options = {});

// Checks a key against the rules above.
Status ValidateKey(std::string_view key);

}  // namespace refit

#endif  // REFIT_STORE_H_
