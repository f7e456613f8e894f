// The version protocol on a relay tree (docs/protocol.md, "Relay tree"):
// the key classifier every relay endpoint of the protocol needs, and the
// publisher's store at the tree's root, optionally written through to a
// durable store.
//
// Thread-safe, as their parts are.
#ifndef REFIT_SYNC_RELAY_TREE_H_
#define REFIT_SYNC_RELAY_TREE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"
#include "transport/object_store.h"
#include "transport/relay_store.h"

namespace refit {

// The protocol's keys (sync/keys.h) for RelayOptions::keys: members' keys
// (votes, done reports, re-send requests) flow up; index/<V> and v/<V>/...
// belong to version V; head and snapshots are never evicted.
std::shared_ptr<const RelayKeyClassifier> ProtocolRelayKeys();

// The publisher's store on a relay tree: a RelayStore root, optionally
// written through to a durable store (a directory or S3 URL).
//   - Put / PutIfAbsent go to the durable store first, then to the root
//     (so a decision's one authority is the durable store when there is
//     one: its PutIfAbsent decides, and the winner's bytes are put once-only
//     at the root).
//   - Get / List answer from the root (votes and re-send requests arrive
//     there only); a Get the root answers kNotFound falls back to the
//     durable store (versions older than the root's window).
//   - Delete acts on both.
// The root lives in memory only, in the publishing process: Seed() puts
// the durable store's head and newest versions into a fresh root, so a
// new publisher process serves the same tree again (replay included).
class RelayRootStore final : public ObjectStore {
 public:
  // A root listening on `listen` (RelayStore::Root), with `options.keys`
  // set to ProtocolRelayKeys() when empty. `durable_url` empty: the root
  // alone; else the store it names is opened (OpenObjectStore).
  static Result<std::unique_ptr<RelayRootStore>> Open(
      const std::string& listen, const std::string& durable_url,
      RelayOptions options);

  RelayStore* root() const { return root_.get(); }
  ObjectStore* durable() const { return durable_.get(); }

  // Copies into the root, oldest first and in the order a publisher writes
  // them (announcement, chunks and re-sends, manifest, decision once-only),
  // the head and the objects of the newest `versions` versions of the
  // durable store. Members' objects (votes, requests) are not copied. A
  // no-op without a durable store.
  Status Seed(int versions);
  // Copies the votes and re-send requests of `version` that reached the
  // root to the durable store (for `refit status` there). Done reports
  // (DoneKey) stay at the root.
  Status MirrorUpward(uint64_t version);

  std::string Describe() const override;
  Status Put(std::string_view key, std::span<const uint8_t> data) override;
  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override;
  Result<std::vector<uint8_t>> Get(std::string_view key) override;
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override;
  Status Delete(std::string_view key) override;
  // Changes at the root (where votes and requests arrive).
  uint64_t ChangeCount() override { return root_->ChangeCount(); }
  void AwaitChange(uint64_t since, int timeout_ms) override {
    root_->AwaitChange(since, timeout_ms);
  }

 private:
  RelayRootStore(std::unique_ptr<RelayStore> root,
                 std::unique_ptr<ObjectStore> durable)
      : root_(std::move(root)), durable_(std::move(durable)) {}
  std::unique_ptr<RelayStore> root_;
  std::unique_ptr<ObjectStore> durable_;
};

}  // namespace refit

#endif  // REFIT_SYNC_RELAY_TREE_H_
