// Internal to the library: what the protocol adds to the public object
// store interface (refit/store.h), which this header includes.
#ifndef REFIT_TRANSPORT_OBJECT_STORE_H_
#define REFIT_TRANSPORT_OBJECT_STORE_H_

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "refit/status.h"
#include "refit/store.h"

namespace refit {

// Stores an object that must never change once written: PutIfAbsent, where
// a key already holding exactly `bytes` is success (a writer re-running
// the same deterministic work) and other bytes are kFailedPrecondition,
// with `on_conflict` (what to do about it) appended to the message.
Status PutOnce(ObjectStore* store, const std::string& key, std::span<const uint8_t> bytes,
               const std::string& on_conflict);

// A store that wraps another and forwards every call to it, the change
// notification (ChangeCount, AwaitChange) included. Wrappers that change
// some calls (retries, throttling, counting, injected faults) derive from
// it and override only those, so none of them forgets to forward the
// rest. Shares ownership of the wrapped store; as thread-safe as it.
class ForwardingStore : public ObjectStore {
 public:
  std::string Describe() const override { return inner_->Describe(); }
  Status Put(std::string_view key, std::span<const uint8_t> data) override {
    return inner_->Put(key, data);
  }
  Status PutIfAbsent(std::string_view key, std::span<const uint8_t> data) override {
    return inner_->PutIfAbsent(key, data);
  }
  Result<std::vector<uint8_t>> Get(std::string_view key) override { return inner_->Get(key); }
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    return inner_->List(prefix);
  }
  Status Delete(std::string_view key) override { return inner_->Delete(key); }
  uint64_t ChangeCount() override { return inner_->ChangeCount(); }
  void AwaitChange(uint64_t since, int timeout_ms) override {
    inner_->AwaitChange(since, timeout_ms);
  }

 protected:
  explicit ForwardingStore(std::shared_ptr<ObjectStore> inner) : inner_(std::move(inner)) {}
  ObjectStore* inner() const { return inner_.get(); }

 private:
  const std::shared_ptr<ObjectStore> inner_;
};

}  // namespace refit

#endif  // REFIT_TRANSPORT_OBJECT_STORE_H_
