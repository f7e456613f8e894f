#include "support/faulty_store.h"

#include <algorithm>
#include <thread>
#include <utility>

namespace refit {

FaultyStore::FaultyStore(std::shared_ptr<ObjectStore> inner, uint64_t seed)
    : ForwardingStore(std::move(inner)), rng_(seed) {}

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
                                      "' in " + inner()->Describe());
    } else if (failure_rate_ > 0 && std::uniform_real_distribution<double>(
                                        0, 1)(rng_) < failure_rate_) {
      ++injected_failures_;
      result =
          UnavailableError("injected random failure on '" + std::string(key) +
                           "' in " + inner()->Describe());
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
  return inner()->Describe() + " (faulty)";
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
  Status s = drop ? ValidateKey(key) : inner()->Put(key, data);
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
  Status s = drop ? ValidateKey(key) : inner()->PutIfAbsent(key, data);
  if (lose) return LostResponse(key);
  return s;
}

Result<std::vector<uint8_t>> FaultyStore::Get(std::string_view key) {
  bool lose = false;
  REFIT_RETURN_IF_ERROR(Enter(key, &lose));
  Result<std::vector<uint8_t>> r = inner()->Get(key);
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
  Result<std::vector<ObjectInfo>> r = inner()->List(prefix);
  if (lose) return LostResponse(prefix);
  return r;
}

Status FaultyStore::Delete(std::string_view key) {
  bool lose = false;
  REFIT_RETURN_IF_ERROR(Enter(key, &lose));
  Status s = inner()->Delete(key);
  if (lose) return LostResponse(key);
  return s;
}

}  // namespace refit
