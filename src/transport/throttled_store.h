// ThrottledStore: an ObjectStore that emulates a link of fixed bandwidth in
// front of another store, for benchmarks (`refit bench sync`) and tests. It
// forwards every other call to the wrapped store, shares ownership of it, and is
// thread-safe.
#ifndef REFIT_TRANSPORT_THROTTLED_STORE_H_
#define REFIT_TRANSPORT_THROTTLED_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "transport/object_store.h"

namespace refit {

// Charges the payload bytes of Put, PutIfAbsent (before forwarding) and Get
// (after) to a token bucket filled at `bytes_per_second` and holding at most
// `burst_bytes`; a call sleeps until its bytes are paid for. With the
// default burst of 0 the store behaves like one serial link: concurrent
// calls share the bandwidth, and 1 MB at 10 MB/s takes 100 ms.
class ThrottledStore final : public ForwardingStore {
 public:
  ThrottledStore(std::shared_ptr<ObjectStore> inner, double bytes_per_second,
                 uint64_t burst_bytes = 0);

  std::string Describe() const override;
  Status Put(std::string_view key, std::span<const uint8_t> data) override;
  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override;
  Result<std::vector<uint8_t>> Get(std::string_view key) override;

 private:
  void Charge(uint64_t bytes);

  const double rate_;
  const double burst_;
  std::mutex mu_;
  double tokens_;  // may go negative: the debt later callers wait out
  std::chrono::steady_clock::time_point last_;
};

}  // namespace refit

#endif  // REFIT_TRANSPORT_THROTTLED_STORE_H_
