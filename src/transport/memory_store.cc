#include "transport/memory_store.h"

#include <chrono>
#include <utility>

namespace refit {

Status MemoryStore::Store(std::string_view key, std::span<const uint8_t> data,
                          bool replace) {
  REFIT_RETURN_IF_ERROR(ValidateKey(key));
  auto object =
      std::make_shared<const std::vector<uint8_t>>(data.begin(), data.end());
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it != objects_.end() && !replace) {
      return AlreadyExistsError("object '" + std::string(key) +
                                "' already exists in memory");
    }
    if (it != objects_.end()) {
      it->second = std::move(object);
    } else {
      objects_.emplace(std::string(key), std::move(object));
    }
    ++changes_;
  }
  changed_.notify_all();
  return Status();
}

Status MemoryStore::Put(std::string_view key, std::span<const uint8_t> data) {
  return Store(key, data, /*replace=*/true);
}

Status MemoryStore::PutIfAbsent(std::string_view key,
                                std::span<const uint8_t> data) {
  return Store(key, data, /*replace=*/false);
}

Result<std::vector<uint8_t>> MemoryStore::Get(std::string_view key) {
  REFIT_RETURN_IF_ERROR(ValidateKey(key));
  std::shared_ptr<const std::vector<uint8_t>> object;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) {
      return NotFoundError("object '" + std::string(key) +
                           "' not found in memory");
    }
    object = it->second;
  }
  return *object;  // copied outside the lock
}

Result<std::vector<ObjectInfo>> MemoryStore::List(std::string_view prefix) {
  std::vector<ObjectInfo> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = objects_.lower_bound(prefix);
       it != objects_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
       ++it) {
    out.push_back(ObjectInfo{it->first, it->second->size()});
  }
  return out;
}

Status MemoryStore::Delete(std::string_view key) {
  REFIT_RETURN_IF_ERROR(ValidateKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  if (it != objects_.end()) objects_.erase(it);
  return Status();
}

uint64_t MemoryStore::ChangeCount() {
  std::lock_guard<std::mutex> lock(mu_);
  return changes_;
}

void MemoryStore::AwaitChange(uint64_t since, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, std::chrono::milliseconds(std::max(0, timeout_ms)),
                    [&] { return changes_ != since; });
}

}  // namespace refit
