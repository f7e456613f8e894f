// Test support: FaultyStore, a test double for ObjectStore that wraps a real
// store (LevelDB's fault-injecting Env, applied to the object-store seam).
// It fails, drops, corrupts and delays calls on demand, forwards everything
// else to the wrapped store, shares ownership of it, and is thread-safe.
// Linked into test binaries only.
#ifndef REFIT_TESTS_SUPPORT_FAULTY_STORE_H_
#define REFIT_TESTS_SUPPORT_FAULTY_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "transport/object_store.h"

namespace refit {

// Injects faults, deterministically for a given seed. Knobs may be changed
// while other threads use the store. "Calls" are all five operations;
// Describe() is not a call.
class FaultyStore final : public ForwardingStore {
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

 private:
  // Counts the call, applies delay and failure knobs. A non-OK return is
  // the call's result. Sets *lose when the response is to be lost.
  Status Enter(std::string_view key, bool* lose);
  bool Matches(const std::string& pattern, std::string_view key) const;

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

#endif  // REFIT_TESTS_SUPPORT_FAULTY_STORE_H_
