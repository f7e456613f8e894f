#include "sync/relay_tree.h"

#include <algorithm>
#include <optional>

#include "sync/keys.h"

namespace refit {
namespace {

class ProtocolKeys final : public RelayKeyClassifier {
 public:
  bool IsUpward(std::string_view key) const override {
    return IsMemberKey(key);
  }
  std::optional<uint64_t> VersionOf(std::string_view key) const override {
    return VersionOfKey(key);
  }
};

}  // namespace

std::shared_ptr<const RelayKeyClassifier> ProtocolRelayKeys() {
  static const std::shared_ptr<const RelayKeyClassifier> keys =
      std::make_shared<ProtocolKeys>();
  return keys;
}

Result<std::unique_ptr<RelayRootStore>> RelayRootStore::Open(
    const std::string& listen, const std::string& durable_url,
    RelayOptions options) {
  std::unique_ptr<ObjectStore> durable;
  if (!durable_url.empty()) {
    REFIT_ASSIGN_OR_RETURN(durable, OpenObjectStore(durable_url));
  }
  if (options.keys == nullptr) options.keys = ProtocolRelayKeys();
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<RelayStore> root,
                         RelayStore::Root(listen, std::move(options)));
  return std::unique_ptr<RelayRootStore>(
      new RelayRootStore(std::move(root), std::move(durable)));
}

Status RelayRootStore::Seed(int versions) {
  if (!durable_) return Status();
  auto copy = [&](const std::string& key, bool once) -> Status {
    REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, durable_->Get(key));
    Status s = once ? root_->PutIfAbsent(key, bytes) : root_->Put(key, bytes);
    return s.code() == StatusCode::kAlreadyExists ? Status() : s;
  };
  if (Status s = copy(kHeadKey, false);
      !s.ok() && s.code() != StatusCode::kNotFound) {
    return s;
  }
  REFIT_ASSIGN_OR_RETURN(std::vector<ObjectInfo> index,
                         durable_->List(kIndexPrefix));
  const std::vector<uint64_t> listed = VersionsOf(index);
  size_t first = listed.size() > static_cast<size_t>(std::max(versions, 0))
                     ? listed.size() - static_cast<size_t>(versions)
                     : 0;
  for (size_t i = first; i < listed.size(); ++i) {
    const uint64_t v = listed[i];
    REFIT_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects,
                           durable_->List(VersionPrefix(v)));
    // Receivers rely on the order: the announcement (index/<V>) first,
    // then chunks (and re-sends), the manifest after them, the decision
    // last.
    REFIT_RETURN_IF_ERROR(copy(IndexKey(v), false));
    for (const ObjectInfo& o : objects) {
      std::optional<KeyInfo> k = ParseKey(o.key);
      if (k && (k->kind == KeyInfo::Kind::kChunk ||
                k->kind == KeyInfo::Kind::kResend)) {
        REFIT_RETURN_IF_ERROR(copy(o.key, false));
      }
    }
    if (Status s = copy(ManifestKey(v), false);
        !s.ok() && s.code() != StatusCode::kNotFound) {
      return s;  // no manifest: its publisher stopped before the end
    }
    if (Status s = copy(DecisionKey(v), true);
        !s.ok() && s.code() != StatusCode::kNotFound) {
      return s;
    }
  }
  return Status();
}

Status RelayRootStore::MirrorUpward(uint64_t version) {
  if (!durable_) return Status();
  for (const std::string& prefix :
       {VotePrefix(version), RequestPrefix(version)}) {
    REFIT_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects,
                           root_->List(prefix));
    for (const ObjectInfo& o : objects) {
      // Votes and requests, not done reports.
      std::optional<KeyInfo> k = ParseKey(o.key);
      if (!k || (k->kind != KeyInfo::Kind::kVote &&
                 k->kind != KeyInfo::Kind::kRequest)) {
        continue;
      }
      Result<std::vector<uint8_t>> bytes = root_->Get(o.key);
      if (!bytes.ok()) continue;  // evicted meanwhile
      REFIT_RETURN_IF_ERROR(durable_->Put(o.key, *bytes));
    }
  }
  return Status();
}

std::string RelayRootStore::Describe() const {
  std::string d = "relay root " + root_->listen_address();
  if (root_->status().tls) d += " (TLS)";
  if (durable_) d += " (written through to " + durable_->Describe() + ")";
  return d;
}

Status RelayRootStore::Put(std::string_view key,
                           std::span<const uint8_t> data) {
  if (durable_) REFIT_RETURN_IF_ERROR(durable_->Put(key, data));
  return root_->Put(key, data);
}

Status RelayRootStore::PutIfAbsent(std::string_view key,
                                   std::span<const uint8_t> data) {
  if (!durable_) return root_->PutIfAbsent(key, data);
  Status decided = durable_->PutIfAbsent(key, data);
  if (decided.ok()) {
    Status s = root_->PutIfAbsent(key, data);
    return s.code() == StatusCode::kAlreadyExists ? Status() : s;
  }
  if (decided.code() != StatusCode::kAlreadyExists) return decided;
  // Lost to an earlier writer: the tree gets the winner's bytes.
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> winner, durable_->Get(key));
  Status s = root_->PutIfAbsent(key, winner);
  if (!s.ok() && s.code() != StatusCode::kAlreadyExists) return s;
  return decided;
}

Result<std::vector<uint8_t>> RelayRootStore::Get(std::string_view key) {
  Result<std::vector<uint8_t>> r = root_->Get(key);
  if (r.ok() || !durable_ || r.status().code() != StatusCode::kNotFound) {
    return r;
  }
  return durable_->Get(key);
}

Result<std::vector<ObjectInfo>> RelayRootStore::List(std::string_view prefix) {
  return root_->List(prefix);
}

Status RelayRootStore::Delete(std::string_view key) {
  if (durable_) REFIT_RETURN_IF_ERROR(durable_->Delete(key));
  return root_->Delete(key);
}

}  // namespace refit
