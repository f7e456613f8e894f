// Test doubles for ObjectStore, compiled into refit_transport so any test or
// benchmark can wrap a real store (LevelDB's fault-injecting Env, applied to
// the object-store seam).
//
// ThrottledStore emulates a link of fixed bandwidth; FaultyStore fails,
// drops, corrupts and delays calls on demand. Both forward everything else
// to the wrapped store, share ownership of it, and are thread-safe.
// MemoryStore keeps objects in a map of its process, for benchmarks that
// measure the protocol rather than a store.
#ifndef REFIT_TRANSPORT_TEST_STORES_H_
#define REFIT_TRANSPORT_TEST_STORES_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "transport/object_store.h"

namespace refit {

// Charges the payload bytes of Put, PutIfAbsent (before forwarding) and Get
// (after) to a token bucket filled at `bytes_per_second` and holding at most
// `burst_bytes`; a call sleeps until its bytes are paid for. With the
// default burst of 0 the store behaves like one serial link: concurrent
// calls share the bandwidth, and 1 MB at 10 MB/s takes 100 ms.
class ThrottledStore final : public ObjectStore {
 public:
  ThrottledStore(std::shared_ptr<ObjectStore> inner, double bytes_per_second,
                 uint64_t burst_bytes = 0);

  std::string Describe() const override;
  Status Put(std::string_view key, std::span<const uint8_t> data) override;
  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override;
  Result<std::vector<uint8_t>> Get(std::string_view key) override;
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override;
  Status Delete(std::string_view key) override;
  uint64_t ChangeCount() override { return inner_->ChangeCount(); }
  void AwaitChange(uint64_t since, int timeout_ms) override {
    inner_->AwaitChange(since, timeout_ms);
  }

 private:
  void Charge(uint64_t bytes);

  std::shared_ptr<ObjectStore> inner_;
  const double rate_;
  const double burst_;
  std::mutex mu_;
  double tokens_;  // may go negative: the debt later callers wait out
  std::chrono::steady_clock::time_point last_;
};

// Objects in memory (a sorted map), immutable once stored: Get copies.
// ChangeCount counts every object stored, so waiters wake at once.
// Thread-safe.
class MemoryStore final : public ObjectStore {
 public:
  std::string Describe() const override { return "memory"; }
  Status Put(std::string_view key, std::span<const uint8_t> data) override;
  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override;
  Result<std::vector<uint8_t>> Get(std::string_view key) override;
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override;
  Status Delete(std::string_view key) override;
  uint64_t ChangeCount() override;
  void AwaitChange(uint64_t since, int timeout_ms) override;

 private:
  Status Store(std::string_view key, std::span<const uint8_t> data,
               bool replace);

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>,
           std::less<>>
      objects_;
  uint64_t changes_ = 0;
};

// Injects faults, deterministically for a given seed. Knobs may be changed
// while other threads use the store. "Calls" are all five operations;
// Describe() is not a call.
class FaultyStore final : public ObjectStore {
 public:
  FaultyStore(std::shared_ptr<ObjectStore> inner, uint64_t seed);

  // The next `n` calls fail with `code` without reaching the inner store.
  void FailNext(int n, StatusCode code = StatusCode::kUnavailable);
  // The next `n` calls reach the inner store, then report kUnavailable as
  // if the response was lost (the call may well have taken effect).
  void LoseNextResponses(int n);
  // Each call fails with kUnavailable with this probability (0 = never).
  void SetFailureRate(double p);
  // Put and PutIfAbsent of keys containing `substring` report success but
  // store nothing ("" = stop dropping).
  void DropPutsMatching(std::string substring);
  // Get of keys containing `substring` returns the object with one bit
  // flipped at a seeded random position; empty objects come back as one
  // byte ("" = stop corrupting).
  void CorruptGetsMatching(std::string substring);
  // Calls on keys (or List prefixes) containing `substring` ("" = all)
  // sleep `delay` first (zero = no delay).
  void SetDelay(std::chrono::milliseconds delay, std::string substring = "");

  // Counters since construction.
  int calls() const;
  int injected_failures() const;
  int dropped_puts() const;
  int corrupted_gets() const;

  std::string Describe() const override;
  Status Put(std::string_view key, std::span<const uint8_t> data) override;
  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override;
  Result<std::vector<uint8_t>> Get(std::string_view key) override;
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override;
  Status Delete(std::string_view key) override;
  uint64_t ChangeCount() override { return inner_->ChangeCount(); }
  void AwaitChange(uint64_t since, int timeout_ms) override {
    inner_->AwaitChange(since, timeout_ms);
  }

 private:
  // Counts the call, applies delay and failure knobs. A non-OK return is
  // the call's result. Sets *lose when the response is to be lost.
  Status Enter(std::string_view key, bool* lose);
  bool Matches(const std::string& pattern, std::string_view key) const;

  std::shared_ptr<ObjectStore> inner_;
  mutable std::mutex mu_;
  std::mt19937_64 rng_;
  int fail_next_ = 0;
  StatusCode fail_code_ = StatusCode::kUnavailable;
  int lose_next_ = 0;
  double failure_rate_ = 0;
  std::string drop_;
  std::string corrupt_;
  std::chrono::milliseconds delay_{0};
  std::string delay_match_;
  int calls_ = 0;
  int injected_failures_ = 0;
  int dropped_puts_ = 0;
  int corrupted_gets_ = 0;
};

}  // namespace refit

#endif  // REFIT_TRANSPORT_TEST_STORES_H_
