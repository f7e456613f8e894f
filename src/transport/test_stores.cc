#include "transport/test_stores.h"

#include <algorithm>
#include <thread>
#include <utility>

namespace refit {

ThrottledStore::ThrottledStore(std::shared_ptr<ObjectStore> inner,
                               double bytes_per_second, uint64_t burst_bytes)
    : inner_(std::move(inner)),
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
  return inner_->Describe() + " (throttled to " +
         std::to_string(static_cast<uint64_t>(rate_)) + " B/s)";
}

Status ThrottledStore::Put(std::string_view key,
                           std::span<const uint8_t> data) {
  Charge(data.size());
  return inner_->Put(key, data);
}

Status ThrottledStore::PutIfAbsent(std::string_view key,
                                   std::span<const uint8_t> data) {
  Charge(data.size());
  return inner_->PutIfAbsent(key, data);
}

Result<std::vector<uint8_t>> ThrottledStore::Get(std::string_view key) {
  Result<std::vector<uint8_t>> r = inner_->Get(key);
  if (r.ok()) Charge(r->size());
  return r;
}

Result<std::vector<ObjectInfo>> ThrottledStore::List(std::string_view prefix) {
  return inner_->List(prefix);
}

Status ThrottledStore::Delete(std::string_view key) {
  return inner_->Delete(key);
}

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

FaultyStore::FaultyStore(std::shared_ptr<ObjectStore> inner, uint64_t seed)
    : inner_(std::move(inner)), rng_(seed) {}

void FaultyStore::FailNext(int n, StatusCode code) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_next_ = n;
  fail_code_ = code;
}

void FaultyStore::LoseNextResponses(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  lose_next_ = n;
}

void FaultyStore::SetFailureRate(double p) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_rate_ = p;
}

void FaultyStore::DropPutsMatching(std::string substring) {
  std::lock_guard<std::mutex> lock(mu_);
  drop_ = std::move(substring);
}

void FaultyStore::CorruptGetsMatching(std::string substring) {
  std::lock_guard<std::mutex> lock(mu_);
  corrupt_ = std::move(substring);
}

void FaultyStore::SetDelay(std::chrono::milliseconds delay,
                           std::string substring) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_ = delay;
  delay_match_ = std::move(substring);
}

int FaultyStore::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}
int FaultyStore::injected_failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_failures_;
}
int FaultyStore::dropped_puts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_puts_;
}
int FaultyStore::corrupted_gets() const {
  std::lock_guard<std::mutex> lock(mu_);
  return corrupted_gets_;
}

bool FaultyStore::Matches(const std::string& pattern,
                          std::string_view key) const {
  return !pattern.empty() && key.find(pattern) != std::string_view::npos;
}

Status FaultyStore::Enter(std::string_view key, bool* lose) {
  std::chrono::milliseconds delay{0};
  Status result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    if (delay_.count() > 0 &&
        (delay_match_.empty() || Matches(delay_match_, key))) {
      delay = delay_;
    }
    if (fail_next_ > 0) {
      --fail_next_;
      ++injected_failures_;
      result = Status(fail_code_, "injected failure on '" + std::string(key) +
                                      "' in " + inner_->Describe());
    } else if (failure_rate_ > 0 && std::uniform_real_distribution<double>(
                                        0, 1)(rng_) < failure_rate_) {
      ++injected_failures_;
      result =
          UnavailableError("injected random failure on '" + std::string(key) +
                           "' in " + inner_->Describe());
    } else if (lose_next_ > 0) {
      --lose_next_;
      ++injected_failures_;
      *lose = true;
    }
  }
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  return result;
}

std::string FaultyStore::Describe() const {
  return inner_->Describe() + " (faulty)";
}

namespace {
Status LostResponse(std::string_view key) {
  return UnavailableError("injected lost response on '" + std::string(key) +
                          "'");
}
}  // namespace

Status FaultyStore::Put(std::string_view key, std::span<const uint8_t> data) {
  bool lose = false;
  REFIT_RETURN_IF_ERROR(Enter(key, &lose));
  bool drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drop = Matches(drop_, key);
    if (drop) ++dropped_puts_;
  }
  Status s = drop ? ValidateKey(key) : inner_->Put(key, data);
  if (lose) return LostResponse(key);
  return s;
}

Status FaultyStore::PutIfAbsent(std::string_view key,
                                std::span<const uint8_t> data) {
  bool lose = false;
  REFIT_RETURN_IF_ERROR(Enter(key, &lose));
  bool drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drop = Matches(drop_, key);
    if (drop) ++dropped_puts_;
  }
  Status s = drop ? ValidateKey(key) : inner_->PutIfAbsent(key, data);
  if (lose) return LostResponse(key);
  return s;
}

Result<std::vector<uint8_t>> FaultyStore::Get(std::string_view key) {
  bool lose = false;
  REFIT_RETURN_IF_ERROR(Enter(key, &lose));
  Result<std::vector<uint8_t>> r = inner_->Get(key);
  if (lose) return LostResponse(key);
  if (!r.ok()) return r;
  std::lock_guard<std::mutex> lock(mu_);
  if (Matches(corrupt_, key)) {
    ++corrupted_gets_;
    if (r->empty()) {
      r->push_back(0x01);
    } else {
      uint64_t bit =
          std::uniform_int_distribution<uint64_t>(0, r->size() * 8 - 1)(rng_);
      (*r)[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    }
  }
  return r;
}

Result<std::vector<ObjectInfo>> FaultyStore::List(std::string_view prefix) {
  bool lose = false;
  REFIT_RETURN_IF_ERROR(Enter(prefix, &lose));
  Result<std::vector<ObjectInfo>> r = inner_->List(prefix);
  if (lose) return LostResponse(prefix);
  return r;
}

Status FaultyStore::Delete(std::string_view key) {
  bool lose = false;
  REFIT_RETURN_IF_ERROR(Enter(key, &lose));
  Status s = inner_->Delete(key);
  if (lose) return LostResponse(key);
  return s;
}

}  // namespace refit
