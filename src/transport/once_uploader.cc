#include "transport/once_uploader.h"

#include <algorithm>

namespace refit {

OnceUploader::OnceUploader(ObjectStore* store, int threads, std::string on_conflict)
    : store_(store), on_conflict_(std::move(on_conflict)) {
  for (int i = 0; i < std::max(1, threads); ++i) pool_.emplace_back([this] { Work(); });
}

OnceUploader::~OnceUploader() { (void)Finish(); }

Status OnceUploader::Add(std::string key, std::vector<uint8_t> bytes, Prepare prepare) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.size() < 2 * pool_.size() || !error_.ok(); });
  if (!error_.ok()) return error_;
  queue_.push_back(Item{std::move(key), std::move(bytes), std::move(prepare)});
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
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || done_; });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      cv_.notify_all();
    }
    if (item.prepare) item.prepare(&item.bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      bytes_ += item.bytes.size();
    }
    Status s = PutOnce(store_, item.key, item.bytes, on_conflict_);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.ok()) error_ = s.WithContext("uploading '" + item.key + "'");
      cv_.notify_all();
    }
  }
}

}  // namespace refit
