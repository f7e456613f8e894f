#include "transport/relay_object_map.h"

#include <algorithm>
#include <cstring>

namespace refit::internal {
namespace {

bool SameBytes(const RelayObject& a, const RelayObject& b) {
  return a.data.size() == b.data.size() && a.crc == b.crc &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size()) == 0;
}

}  // namespace

RelayObjectPtr MakeRelayObject(std::string_view key, std::vector<uint8_t> data,
                               RelayFrameType type, bool up,
                               std::optional<uint64_t> version) {
  auto o = std::make_shared<RelayObject>();
  o->key = std::string(key);
  o->data = std::move(data);
  o->type = type;
  o->up = up;
  o->version = version;
  uint8_t header[kRelayHeaderBytes];
  EncodeRelayHeader(type, static_cast<uint32_t>(key.size()), o->data.size(),
                    header);
  o->crc = RelayFrameCrc(header, o->key, o->data);
  return o;
}

RelayObjectMap::RelayObjectMap(std::string name, bool up_log, int keep_versions,
                               uint64_t max_store_bytes)
    : name_(std::move(name)),
      up_log_enabled_(up_log),
      keep_versions_(std::max(1, keep_versions)),
      max_store_bytes_(max_store_bytes) {}

RelayObjectMap::InsertResult RelayObjectMap::Insert(const RelayObjectPtr& o,
                                                    bool local,
                                                    std::string* why) {
  auto it = objects_.find(o->key);
  RelayObjectPtr old = it == objects_.end() ? nullptr : it->second;
  if (old) {
    if (SameBytes(*old, *o)) return InsertResult::kDuplicate;
    if (!local && (old->type == RelayFrameType::kPutOnce ||
                   o->type == RelayFrameType::kPutOnce)) {
      *why = "relay " + name_ +
             ": refused a second, different object for once-only key '" +
             o->key + "'";
      return InsertResult::kConflict;
    }
  }
  if (o->version && !versions_.count(*o->version)) {
    if (static_cast<int>(versions_.size()) >= keep_versions_ &&
        *o->version < versions_.begin()->first) {
      return InsertResult::kStale;
    }
    // Remove() drops a version's entry with its last key.
    while (static_cast<int>(versions_.size()) >= keep_versions_) {
      const std::set<std::string> keys = versions_.begin()->second;
      for (const std::string& k : keys) {
        RelayObjectPtr victim = objects_.find(k)->second;
        Remove(victim);
        ++evicted_;
      }
    }
  }
  const uint64_t after =
      total_bytes_ - (old ? old->data.size() : 0) + o->data.size();
  if (after > max_store_bytes_) {
    *why = "relay " + name_ + ": storing '" + o->key + "' (" +
           std::to_string(o->data.size()) + " bytes) would hold " +
           std::to_string(after) + " bytes, over max_store_bytes " +
           std::to_string(max_store_bytes_) +
           "; raise it or lower keep_versions";
    return InsertResult::kOverCap;
  }
  if (old) Remove(old);
  o->seq = ++seq_;
  objects_[o->key] = o;
  total_bytes_ += o->data.size();
  if (o->version) versions_[*o->version].insert(o->key);
  if (!o->up) {
    down_log_[o->seq] = o;
    for (RelayChildFlow* c : children_) {
      c->queued += o->data.size();
      max_child_queue_bytes_ = std::max(max_child_queue_bytes_, c->queued);
    }
  } else if (up_log_enabled_) {
    up_log_[o->seq] = o;
  }
  return InsertResult::kInserted;
}

void RelayObjectMap::Erase(std::string_view key) {
  auto it = objects_.find(key);
  if (it == objects_.end()) return;
  RelayObjectPtr o = it->second;  // Remove() erases the map's reference
  Remove(o);
}

void RelayObjectMap::Remove(const RelayObjectPtr& o) {
  objects_.erase(o->key);
  total_bytes_ -= o->data.size();
  if (o->version) {
    auto v = versions_.find(*o->version);
    if (v != versions_.end()) {
      v->second.erase(o->key);
      if (v->second.empty()) versions_.erase(v);
    }
  }
  if (o->up) {
    up_log_.erase(o->seq);
    return;
  }
  down_log_.erase(o->seq);
  for (RelayChildFlow* c : children_) {
    if (o->seq > c->cursor && o->seq > c->live_from) {
      c->queued -= o->data.size();
    }
  }
}

RelayObjectPtr RelayObjectMap::Find(std::string_view key) const {
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second;
}

std::vector<ObjectInfo> RelayObjectMap::List(std::string_view prefix) const {
  std::vector<ObjectInfo> out;
  for (auto it = objects_.lower_bound(prefix);
       it != objects_.end() && it->first.starts_with(prefix); ++it) {
    out.push_back(ObjectInfo{it->first, it->second->data.size()});
  }
  return out;
}

RelayObjectPtr RelayObjectMap::NextDown(uint64_t cursor) const {
  auto it = down_log_.upper_bound(cursor);
  return it == down_log_.end() ? nullptr : it->second;
}

RelayObjectPtr RelayObjectMap::NextUp(uint64_t cursor) const {
  auto it = up_log_.upper_bound(cursor);
  return it == up_log_.end() ? nullptr : it->second;
}

void RelayObjectMap::AddChild(RelayChildFlow* child, std::string name) {
  child->name = std::move(name);
  child->cursor = 0;
  child->live_from = seq_;
  child->queued = 0;
  child->registered = true;
  children_.push_back(child);
}

void RelayObjectMap::RemoveChild(RelayChildFlow* child) {
  if (!child->registered) return;
  children_.erase(std::remove(children_.begin(), children_.end(), child),
                  children_.end());
  child->registered = false;
}

void RelayObjectMap::Sent(RelayChildFlow* flow, const RelayObjectPtr& o,
                          bool child) {
  flow->cursor = std::max(flow->cursor, o->seq);
  if (child && o->seq > flow->live_from) {
    auto it = down_log_.find(o->seq);
    if (it != down_log_.end() && it->second == o)
      flow->queued -= o->data.size();
  }
}

bool RelayObjectMap::AnyChildOver(uint64_t bound) const {
  for (const RelayChildFlow* c : children_) {
    if (c->queued > bound) return true;
  }
  return false;
}

const RelayChildFlow* RelayObjectMap::Slowest() const {
  const RelayChildFlow* worst = nullptr;
  for (const RelayChildFlow* c : children_) {
    if (!worst || c->queued > worst->queued) worst = c;
  }
  return worst;
}

}  // namespace refit::internal
