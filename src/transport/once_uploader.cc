#include "transport/once_uploader.h"

#include <algorithm>

namespace refit {

OnceUploader::OnceUploader(ObjectStore* store, int threads, std::string on_conflict)
    : store_(store), on_conflict_(std::move(on_conflict)) {
  for (int i = 0; i < std::max(1, threads); ++i) pool_.emplace_back([this] { Work(); });
}

OnceUploader::~OnceUploader() { (void)Finish(); }

Status OnceUploader::Add(std::string key, std::vector<uint8_t> bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.size() < 2 * pool_.size() || !error_.ok(); });
  if (!error_.ok()) return error_;
  bytes_ += bytes.size();
  queue_.emplace_back(std::move(key), std::move(bytes));
  cv_.notify_all();
  return Status();
}

Status OnceUploader::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  for (auto& t : pool_) {
    if (t.joinable()) t.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void OnceUploader::Work() {
  for (;;) {
    std::pair<std::string, std::vector<uint8_t>> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || done_; });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      cv_.notify_all();
    }
    Status s = PutOnce(store_, item.first, item.second, on_conflict_);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.ok()) error_ = s.WithContext("uploading '" + item.first + "'");
      cv_.notify_all();
    }
  }
}

}  // namespace refit
