// Change notification for a directory store from every writer: other
// processes, other hosts' writes that the local kernel sees, other store
// objects. One inotify instance per folder and process watches every
// directory of the store's tree for names that appear (link(2): created;
// rename(2): moved in), adds a watch to each directory as it is created,
// and counts what it sees; temporaries (names with '~') are not counted.
//
// Where inotify is not available (no instance or watch left, a file system
// whose remote writers the kernel does not see, such as NFS), Open fails
// or the count stays still, and waiters fall back to their poll interval:
// a notification is only ever a faster wake-up, never a condition for
// progress.
#ifndef REFIT_TRANSPORT_TREE_WATCH_H_
#define REFIT_TRANSPORT_TREE_WATCH_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace refit::internal {

class TreeWatch {
 public:
  // The process's watch on the tree at `root` (shared by every store
  // object on it), started on first use; null when inotify cannot watch it.
  static std::shared_ptr<TreeWatch> For(const std::string& root);
  ~TreeWatch();
  TreeWatch(const TreeWatch&) = delete;
  TreeWatch& operator=(const TreeWatch&) = delete;

  // Names seen to appear so far (grows; never reset).
  uint64_t Count();
  // Returns once Count() differs from `since`, or after timeout_ms.
  void Await(uint64_t since, int timeout_ms);

 private:
  TreeWatch(std::string root, int fd) : root_(std::move(root)), fd_(fd) {}
  // Adds a watch to `rel` (below the root; "" is the root) and every
  // directory under it. Needs mu_.
  void AddTree(const std::string& rel);
  // Reads every pending event. Needs mu_.
  void Drain();

  const std::string root_;
  const int fd_;
  std::mutex mu_;
  uint64_t count_ = 0;                                // guarded by mu_
  std::unordered_map<int, std::string> dirs_;         // watch -> rel dir
};

}  // namespace refit::internal

#endif  // REFIT_TRANSPORT_TREE_WATCH_H_
