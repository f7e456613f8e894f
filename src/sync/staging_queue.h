// StagingQueue: the bookkeeping every StagedTarget (sync/staged_target.h)
// does between Begin() and Apply(): the staged items in order, the bytes
// they hold against the staging bound, and the items of the last Apply(),
// kept until the next Begin() so that freeing them (munmap of large
// buffers takes milliseconds per hundred megabytes) stays out of the
// pause. RestoredError words the outcome of an Apply() that failed and
// undid its writes. Not thread-safe (a target serves one stepping thread).
#ifndef REFIT_SYNC_STAGING_QUEUE_H_
#define REFIT_SYNC_STAGING_QUEUE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "refit/status.h"

namespace refit {

template <typename Item>
class StagingQueue {
 public:
  // At most `limit` bytes staged at once; `bound` names the limit in
  // errors ("staging limit").
  StagingQueue(uint64_t limit, std::string bound)
      : limit_(limit), bound_(std::move(bound)) {}

  // Begin(): drops the staged items and the retired ones.
  void Clear() {
    retired_.clear();
    items_.clear();
    bytes_ = 0;
  }

  // Counts `n` more staged bytes; RESOURCE_EXHAUSTED, counting nothing,
  // when they would exceed the limit.
  Status Charge(uint64_t n) {
    if (n > limit_ - bytes_) {  // bytes_ <= limit_ always
      return ResourceExhaustedError("staging the versions needs more than the " + bound_ +
                                    " of " + std::to_string(limit_) + " bytes");
    }
    bytes_ += n;
    return Status();
  }

  // Apply(): the staged items become the retired ones (freed by the next
  // Clear()); returns them.
  std::vector<Item>& Retire() {
    retired_ = std::move(items_);
    items_.clear();
    bytes_ = 0;
    return retired_;
  }

  std::vector<Item>& items() { return items_; }
  const std::vector<Item>& items() const { return items_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t limit() const { return limit_; }

 private:
  uint64_t limit_;
  std::string bound_;
  uint64_t bytes_ = 0;
  std::vector<Item> items_;
  std::vector<Item> retired_;
};

// The error of an Apply() that failed with `failed` and then undid what it
// wrote, with outcome `restored`: `failed` saying every tensor was
// restored, or DATA_LOSS saying the restore failed too and the tensors
// must be loaded again.
inline Status RestoredError(const Status& failed, const Status& restored) {
  if (!restored.ok()) {
    return DataLossError(failed.ToString() + "; restoring the tensors failed too (" +
                         restored.ToString() + "): load them again");
  }
  return Status(failed.code(), std::string(failed.message()) +
                                   "; every tensor was restored to what it held before");
}

}  // namespace refit

#endif  // REFIT_SYNC_STAGING_QUEUE_H_
