// MemoryStore: an ObjectStore whose objects live in a map of its process,
// for benchmarks that measure the protocol rather than a store (`refit bench
// sync --store memory`). Objects are immutable once stored (Get copies);
// ChangeCount counts every object stored, so waiters wake at once.
// Thread-safe.
#ifndef REFIT_TRANSPORT_MEMORY_STORE_H_
#define REFIT_TRANSPORT_MEMORY_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/object_store.h"

namespace refit {

class MemoryStore final : public ObjectStore {
 public:
  std::string Describe() const override { return "memory"; }
  Status Put(std::string_view key, std::span<const uint8_t> data) override;
  Status PutIfAbsent(std::string_view key, std::span<const uint8_t> data) override;
  Result<std::vector<uint8_t>> Get(std::string_view key) override;
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override;
  Status Delete(std::string_view key) override;
  uint64_t ChangeCount() override;
  void AwaitChange(uint64_t since, int timeout_ms) override;

 private:
  Status Store(std::string_view key, std::span<const uint8_t> data, bool replace);

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>, std::less<>> objects_;
  uint64_t changes_ = 0;
};

}  // namespace refit

#endif  // REFIT_TRANSPORT_MEMORY_STORE_H_
