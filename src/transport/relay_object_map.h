// Internal to the relay transport: the objects one relay endpoint holds
// (docs/protocol.md, "Relay tree", "Memory bound"), and where each child
// link stands in sending them. No sockets and no threads: the endpoint
// (relay_store.cc) calls it under its mutex, and relay_object_map_test.cc
// drives it directly.
//
// Invariants:
//   - Every stored object has a unique, increasing seq. Down objects sit in
//     the down log by seq, up objects (at nodes) in the up log; a replaced
//     or evicted object leaves its log, so a log replays the current
//     objects in the order they were written.
//   - A child's cursor is the seq of the last object it was sent; it is
//     sent down-log entries above its cursor, in order. live_from is the
//     seq at its hello: entries up to it are replay and cost no queue
//     bytes. queued = bytes of down-log entries above max(cursor,
//     live_from).
//   - Objects of at most keep_versions versions are held (unversioned ones
//     are never evicted), of at most max_store_bytes in all.
// Not thread-safe.
#ifndef REFIT_TRANSPORT_RELAY_OBJECT_MAP_H_
#define REFIT_TRANSPORT_RELAY_OBJECT_MAP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "transport/object_store.h"
#include "transport/relay_frame.h"

namespace refit::internal {

// One object as an endpoint holds it; immutable once inserted.
struct RelayObject {
  std::string key;
  std::vector<uint8_t> data;
  RelayFrameType type = RelayFrameType::kPut;  // kPut or kPutOnce
  uint32_t crc = 0;                            // of its frame
  uint64_t seq = 0;                            // set by Insert
  bool up = false;                             // flows up the tree
  std::optional<uint64_t> version;             // for the version window
};
using RelayObjectPtr = std::shared_ptr<RelayObject>;

// An object ready for Insert, with the crc of the frame that carries it.
RelayObjectPtr MakeRelayObject(std::string_view key, std::vector<uint8_t> data,
                               RelayFrameType type, bool up,
                               std::optional<uint64_t> version);

// A child link's place in the down log (see the invariants above); owned
// by the link, registered with the map from its hello to its close.
struct RelayChildFlow {
  std::string name;  // the child, for messages
  bool registered = false;
  uint64_t cursor = 0;
  uint64_t live_from = 0;
  uint64_t queued = 0;
};

class RelayObjectMap {
 public:
  enum class InsertResult {
    kInserted,
    kDuplicate,  // the same bytes are held under the key: nothing changed
    kStale,      // older than every kept version: not stored
    kConflict,   // a different once-only object: refused, *why says so
    kOverCap,    // over max_store_bytes: not stored, *why says so
  };

  // `name` starts messages ("relay <name>: ..."); `up_log`: keep a log of
  // up objects to send to a parent (nodes). keep_versions >= 1.
  RelayObjectMap(std::string name, bool up_log, int keep_versions,
                 uint64_t max_store_bytes);

  // Stores `o` (seq assigned), replacing a different object under its key
  // unless either is once-only and `local` is false (writes at this
  // endpoint may replace). Evicts the oldest version first when `o` opens
  // a new one beyond keep_versions. A down object adds its bytes to every
  // registered child's queue.
  InsertResult Insert(const RelayObjectPtr& o, bool local, std::string* why);
  // Removes the object under `key`, if any.
  void Erase(std::string_view key);

  RelayObjectPtr Find(std::string_view key) const;
  // Keys starting with `prefix`, sorted, with their sizes.
  std::vector<ObjectInfo> List(std::string_view prefix) const;
  // The first object of the down (or up) log above `cursor`, or null.
  RelayObjectPtr NextDown(uint64_t cursor) const;
  RelayObjectPtr NextUp(uint64_t cursor) const;

  // A child past its hello: it starts at cursor 0 with everything held as
  // replay (live_from = the current seq) and an empty queue.
  void AddChild(RelayChildFlow* child, std::string name);
  // Forgets `child` (a no-op when it is not registered).
  void RemoveChild(RelayChildFlow* child);
  // `o` went out on a link whose flow is `flow`: advances its cursor and,
  // for a child, takes `o`'s bytes off its queue while `o` is still held.
  void Sent(RelayChildFlow* flow, const RelayObjectPtr& o, bool child);

  // True when a child's queue is above `bound` bytes.
  bool AnyChildOver(uint64_t bound) const;
  // The child with the most bytes queued, or null without children.
  const RelayChildFlow* Slowest() const;

  int children() const { return static_cast<int>(children_.size()); }
  uint64_t objects() const { return objects_.size(); }
  uint64_t bytes() const { return total_bytes_; }
  uint64_t seq() const { return seq_; }
  uint64_t evicted() const { return evicted_; }
  uint64_t max_child_queue_bytes() const { return max_child_queue_bytes_; }

 private:
  void Remove(const RelayObjectPtr& o);

  const std::string name_;
  const bool up_log_enabled_;
  const int keep_versions_;
  const uint64_t max_store_bytes_;
  std::map<std::string, RelayObjectPtr, std::less<>> objects_;
  std::map<uint64_t, RelayObjectPtr> down_log_;
  std::map<uint64_t, RelayObjectPtr> up_log_;
  std::map<uint64_t, std::set<std::string>> versions_;  // version -> keys
  std::vector<RelayChildFlow*> children_;
  uint64_t seq_ = 0;
  uint64_t total_bytes_ = 0;
  uint64_t evicted_ = 0;
  uint64_t max_child_queue_bytes_ = 0;
};

}  // namespace refit::internal

#endif  // REFIT_TRANSPORT_RELAY_OBJECT_MAP_H_
