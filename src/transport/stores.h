// Internal to the transport layer: the concrete stores behind
// OpenObjectStore and helpers they share. Callers outside src/transport use
// object_store.h.
#ifndef REFIT_TRANSPORT_STORES_H_
#define REFIT_TRANSPORT_STORES_H_

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "transport/object_store.h"

namespace refit::internal {

// A directory store rooted at `root`. When the directory is absent it is
// created with its parents if `create_if_missing`, else kNotFound ("no
// store at ..."). Links inside the store are never followed (dir_store.cc).
Result<std::unique_ptr<ObjectStore>> OpenDirStore(const std::string& root,
                                                  bool create_if_missing);

// An S3 store for objects "<prefix>/<key>" in `bucket`. `prefix` may be
// empty, else it must be a valid key. Endpoint, region and credentials come
// from `options`, then the environment (object_store.h, StoreOptions).
Result<std::unique_ptr<ObjectStore>> OpenS3Store(const std::string& bucket,
                                                 const std::string& prefix,
                                                 const StoreOptions& options);

// Creates `bucket` unless it exists, at the endpoint `options` (or the
// environment) name. For tests and first-time setup against moto or MinIO.
Status CreateS3Bucket(const std::string& bucket, const StoreOptions& options);

// Checks a List prefix: key characters only, at most 1024 bytes, and every
// complete segment (those before the last '/') valid. "" is valid.
Status ValidatePrefix(std::string_view prefix);

// True for the bytes a key segment may hold: [A-Za-z0-9._-].
inline bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

// The wait before retry number `retry` (1 = the first retry): uniformly
// drawn from [d/2, d] with d = base_ms * 2^(retry-1), capped at 10 s.
std::chrono::milliseconds BackoffDelay(int retry, int base_ms);

}  // namespace refit::internal

#endif  // REFIT_TRANSPORT_STORES_H_
