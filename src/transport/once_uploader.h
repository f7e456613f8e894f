// OnceUploader: objects written once (PutOnce) on a small pool of threads
// while the caller goes on producing them. The queue holds at most two
// objects per thread, so a producer never runs far ahead of the link. An
// object may come with work that turns it into the bytes to store (e.g.
// sealing it), which then runs on the pool instead of the producer's
// thread. After the first failure Add refuses new objects and Finish
// reports it (the objects already queued are still tried). Add and Finish
// are for one producer thread.
#ifndef REFIT_TRANSPORT_ONCE_UPLOADER_H_
#define REFIT_TRANSPORT_ONCE_UPLOADER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "refit/status.h"
#include "transport/object_store.h"

namespace refit {

class OnceUploader {
 public:
  // `on_conflict` completes the message when a key already holds other
  // bytes (PutOnce).
  OnceUploader(ObjectStore* store, int threads, std::string on_conflict);
  ~OnceUploader();  // waits for the queued objects
  OnceUploader(const OnceUploader&) = delete;
  OnceUploader& operator=(const OnceUploader&) = delete;

  // Runs on a pool thread before the object is stored and may replace its
  // bytes; several run at once, in any order.
  using Prepare = std::function<void(std::vector<uint8_t>* bytes)>;

  // Queues `bytes` under `key` (with `prepare`, what it leaves in them);
  // blocks while the queue is full. Returns the first upload failure
  // instead once there is one.
  Status Add(std::string key, std::vector<uint8_t> bytes, Prepare prepare = nullptr);
  // Waits until every queued object is stored; the first failure, if any.
  Status Finish();
  // Bytes of the objects stored or tried (after their Prepare); complete
  // once Finish returned.
  uint64_t bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  struct Item {
    std::string key;
    std::vector<uint8_t> bytes;
    Prepare prepare;
  };
  void Work();
  ObjectStore* store_;
  std::string on_conflict_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::vector<std::thread> pool_;
  bool done_ = false;
  Status error_;
  uint64_t bytes_ = 0;
};

}  // namespace refit

#endif  // REFIT_TRANSPORT_ONCE_UPLOADER_H_
