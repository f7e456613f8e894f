// OnceUploader: objects written once (PutOnce) on a small pool of threads
// while the caller goes on producing them. The queue holds at most two
// objects per thread, so a producer never runs far ahead of the link. After
// the first failure Add refuses new objects and Finish reports it (the
// objects already queued are still tried). Add and Finish are for one
// producer thread.
#ifndef REFIT_TRANSPORT_ONCE_UPLOADER_H_
#define REFIT_TRANSPORT_ONCE_UPLOADER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
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

  // Queues `bytes` under `key`; blocks while the queue is full. Returns the
  // first upload failure instead once there is one.
  Status Add(std::string key, std::vector<uint8_t> bytes);
  // Waits until every queued object is stored; the first failure, if any.
  Status Finish();
  // Bytes handed to Add.
  uint64_t bytes() const { return bytes_; }

 private:
  void Work();
  ObjectStore* store_;
  std::string on_conflict_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::vector<uint8_t>>> queue_;
  std::vector<std::thread> pool_;
  bool done_ = false;
  Status error_;
  uint64_t bytes_ = 0;
};

}  // namespace refit

#endif  // REFIT_TRANSPORT_ONCE_UPLOADER_H_
