#include "transport/throttled_store.h"

#include <algorithm>
#include <thread>
#include <utility>

namespace refit {

ThrottledStore::ThrottledStore(std::shared_ptr<ObjectStore> inner,
                               double bytes_per_second, uint64_t burst_bytes)
    : ForwardingStore(std::move(inner)),
      rate_(std::max(bytes_per_second, 1.0)),
      burst_(static_cast<double>(burst_bytes)),
      tokens_(static_cast<double>(burst_bytes)),
      last_(std::chrono::steady_clock::now()) {}

void ThrottledStore::Charge(uint64_t bytes) {
  std::chrono::steady_clock::time_point until;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    double elapsed = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    tokens_ = std::min(burst_, tokens_ + elapsed * rate_);
    tokens_ -= static_cast<double>(bytes);
    if (tokens_ >= 0) return;
    until =
        now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(-tokens_ / rate_));
  }
  std::this_thread::sleep_until(until);
}

std::string ThrottledStore::Describe() const {
  return inner()->Describe() + " (throttled to " +
         std::to_string(static_cast<uint64_t>(rate_)) + " B/s)";
}

Status ThrottledStore::Put(std::string_view key,
                           std::span<const uint8_t> data) {
  Charge(data.size());
  return inner()->Put(key, data);
}

Status ThrottledStore::PutIfAbsent(std::string_view key,
                                   std::span<const uint8_t> data) {
  Charge(data.size());
  return inner()->PutIfAbsent(key, data);
}

Result<std::vector<uint8_t>> ThrottledStore::Get(std::string_view key) {
  Result<std::vector<uint8_t>> r = inner()->Get(key);
  if (r.ok()) Charge(r->size());
  return r;
}

}  // namespace refit
