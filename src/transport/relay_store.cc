// A relay endpoint's options, lifecycle and ObjectStore calls
// (relay_endpoint.h); its links are in relay_link.cc, the objects it holds
// in relay_object_map.cc.
#include "transport/relay_store.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "transport/relay_endpoint.h"
#include "transport/relay_tls.h"
#include "transport/stores.h"

namespace refit {

using internal::FormatEndpoint;
using internal::RelayFrameType;
using InsertResult = internal::RelayObjectMap::InsertResult;

RelayStore::Impl::Impl(bool is_root, std::string member, RelayOptions options)
    : opt_(std::move(options)),
      is_root_(is_root),
      member_(std::move(member)),
      name_(is_root_ ? "root" : "node " + member_),
      acceptor_(io_),
      tick_timer_(io_),
      reconnect_timer_(io_),
      connect_timer_(io_),
      map_(name_, /*up_log=*/!is_root_, opt_.keep_versions,
           opt_.max_store_bytes) {}

Status RelayStore::Impl::Start(const std::string& listen,
                               const std::string& parent) {
  if (opt_.keys == nullptr) {
    return InvalidArgumentError(
        "relay options: no key classifier (RelayOptions::keys)");
  }
  if (opt_.heartbeat_ms < 1 || opt_.dead_after_ms <= opt_.heartbeat_ms) {
    return InvalidArgumentError(
        "relay options: need 1 <= heartbeat_ms < dead_after_ms");
  }
  if (opt_.reconnect_min_ms < 1 ||
      opt_.reconnect_max_ms < opt_.reconnect_min_ms || opt_.keep_versions < 1 ||
      opt_.put_timeout_ms < 0 || opt_.child_queue_bytes == 0 ||
      opt_.test_read_delay_ms < 0) {
    return InvalidArgumentError("relay options out of range");
  }
  if (!is_root_) {
    REFIT_RETURN_IF_ERROR(internal::ValidateRelayMember(member_));
    REFIT_ASSIGN_OR_RETURN(parent_ep_, internal::ParseRelayAddress(parent));
    parent_text_ = parent;
  }
  if (opt_.tls.enabled()) {
    REFIT_ASSIGN_OR_RETURN(tls_,
                           internal::MakeRelayTlsContext(opt_.tls, name_));
  } else if (!opt_.tls.parent_name.empty() ||
             opt_.tls.child_names_are_members) {
    return InvalidArgumentError("relay " + name_ +
                                ": TLS name checks need the TLS "
                                "certificate, key and CA files");
  }
  if (!listen.empty()) {
    REFIT_ASSIGN_OR_RETURN(tcp::endpoint ep,
                           internal::ParseRelayAddress(listen));
    asio::error_code ec;
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return UnavailableError("relay " + name_ + ": cannot listen on '" +
                              listen + "': " + ec.message());
    }
    listen_address_ = FormatEndpoint(acceptor_.local_endpoint(ec));
    Accept();
  } else if (is_root_) {
    return InvalidArgumentError("a relay root needs a listen address");
  }
  if (!is_root_) Connect();
  ScheduleTick();
  work_.emplace(io_.get_executor());
  thread_ = std::thread([this] { io_.run(); });
  return Status();
}

void RelayStore::Impl::Shutdown() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  changed_.notify_all();
  asio::post(io_, [this] {
    asio::error_code ec;
    acceptor_.close(ec);
    tick_timer_.cancel();
    reconnect_timer_.cancel();
    connect_timer_.cancel();
    if (connecting_) connecting_->socket.close(ec);
    for (const LinkPtr& l : std::vector<LinkPtr>(links_)) Close(l, Status());
  });
  work_.reset();
  // Every handler sees stopping_ and starts nothing new, so run() returns
  // once the cancelled operations have completed.
  thread_.join();
}

std::string RelayStore::Impl::Describe() const {
  const std::string tls = tls_ ? " (TLS)" : "";
  if (is_root_) return "relay root at " + listen_address_ + tls;
  return "relay node '" + member_ + "' at " +
         (listen_address_.empty() ? std::string("(leaf)") : listen_address_) +
         ", parent " + parent_text_ + tls;
}

RelayStatus RelayStore::Impl::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  RelayStatus s = stats_;
  s.is_root = is_root_;
  s.tls = tls_ != nullptr;
  s.listen_address = listen_address_;
  s.children = map_.children();
  s.objects = map_.objects();
  s.bytes = map_.bytes();
  s.evicted = map_.evicted();
  s.max_child_queue_bytes = map_.max_child_queue_bytes();
  return s;
}

Status RelayStore::Impl::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.last_error;
}

Status RelayStore::Impl::Put(std::string_view key,
                             std::span<const uint8_t> data, bool once) {
  REFIT_RETURN_IF_ERROR(ValidateKey(key));
  const RelayFrameType type =
      once ? RelayFrameType::kPutOnce : RelayFrameType::kPut;
  if (!is_root_ && !opt_.keys->IsUpward(key)) {
    return FailedPreconditionError(
        "relay " + name_ + ": '" + std::string(key) +
        "' flows down the tree, so only the root (the publisher's endpoint) "
        "may "
        "write it; nodes write votes and requests only");
  }
  if (data.size() > opt_.max_body_bytes) {
    return InvalidArgumentError(
        "relay " + name_ + ": object '" + std::string(key) + "' has " +
        std::to_string(data.size()) + " bytes, over max_body_bytes " +
        std::to_string(opt_.max_body_bytes));
  }
  internal::RelayObjectPtr o =
      MakeObject(key, std::vector<uint8_t>(data.begin(), data.end()), type,
                 /*up=*/!is_root_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (is_root_) {
      // Back-pressure: wait (bounded) until every child has room.
      const auto deadline =
          Clock::now() + std::chrono::milliseconds(opt_.put_timeout_ms);
      if (!cv_.wait_until(lock, deadline,
                          [&] { return stopping_ || !AnyChildOver(); })) {
        return UnavailableError(
            "relay root: " + SlowestChild() + " for " +
            std::to_string(opt_.put_timeout_ms) +
            " ms; its subtree is slow or stuck (child_queue_bytes " +
            std::to_string(opt_.child_queue_bytes) + ")");
      }
      if (stopping_) return CancelledError("relay root is shutting down");
    }
    if (once && map_.Find(key) != nullptr) {
      return AlreadyExistsError("relay " + name_ + ": '" + std::string(key) +
                                "' already exists");
    }
    std::string why;
    switch (map_.Insert(o, /*local=*/true, &why)) {
      case InsertResult::kInserted:
        ++changes_;
        changed_.notify_all();
        break;
      case InsertResult::kDuplicate:
        break;
      case InsertResult::kStale:
        return FailedPreconditionError(
            "relay " + name_ + ": '" + std::string(key) +
            "' belongs to a version older than the " +
            std::to_string(opt_.keep_versions) + " kept (keep_versions)");
      case InsertResult::kConflict:
      case InsertResult::kOverCap:
        return ResourceExhaustedError(why);
    }
  }
  asio::post(io_, [this] { PumpAll(); });
  return Status();
}

Result<std::vector<uint8_t>> RelayStore::Impl::Get(std::string_view key) {
  REFIT_RETURN_IF_ERROR(ValidateKey(key));
  internal::RelayObjectPtr o;
  {
    std::lock_guard<std::mutex> lock(mu_);
    o = map_.Find(key);
    if (o == nullptr) {
      return NotFoundError("relay " + name_ + ": '" + std::string(key) +
                           "' has not arrived (or was evicted)");
    }
  }
  return o->data;  // immutable once stored: copied outside the lock
}

Result<std::vector<ObjectInfo>> RelayStore::Impl::List(
    std::string_view prefix) {
  REFIT_RETURN_IF_ERROR(internal::ValidatePrefix(prefix));
  std::lock_guard<std::mutex> lock(mu_);
  return map_.List(prefix);
}

Status RelayStore::Impl::Delete(std::string_view key) {
  REFIT_RETURN_IF_ERROR(ValidateKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  map_.Erase(key);
  return Status();
}

bool RelayStore::Impl::AnyChildOver() const {
  return map_.AnyChildOver(opt_.child_queue_bytes);
}

std::string RelayStore::Impl::SlowestChild() const {
  const internal::RelayChildFlow* worst = map_.Slowest();
  if (worst == nullptr) return "no child";
  return worst->name + " has " + std::to_string(worst->queued) +
         " bytes queued";
}

internal::RelayObjectPtr RelayStore::Impl::MakeObject(
    std::string_view key, std::vector<uint8_t> data,
    internal::RelayFrameType type, bool up) const {
  return internal::MakeRelayObject(key, std::move(data), type, up,
                                   opt_.keys->VersionOf(key));
}

RelayStore::RelayStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RelayStore::~RelayStore() = default;

Result<std::unique_ptr<RelayStore>> RelayStore::Root(const std::string& listen,
                                                     RelayOptions options) {
  auto impl = std::make_unique<Impl>(/*is_root=*/true, "", std::move(options));
  REFIT_RETURN_IF_ERROR(impl->Start(listen, ""));
  return std::unique_ptr<RelayStore>(new RelayStore(std::move(impl)));
}

Result<std::unique_ptr<RelayStore>> RelayStore::Node(const std::string& member,
                                                     const std::string& parent,
                                                     const std::string& listen,
                                                     RelayOptions options) {
  auto impl =
      std::make_unique<Impl>(/*is_root=*/false, member, std::move(options));
  REFIT_RETURN_IF_ERROR(impl->Start(listen, parent));
  return std::unique_ptr<RelayStore>(new RelayStore(std::move(impl)));
}

std::string RelayStore::listen_address() const {
  return impl_->listen_address();
}
RelayStatus RelayStore::status() const { return impl_->status(); }
Status RelayStore::last_error() const { return impl_->last_error(); }
std::string RelayStore::Describe() const { return impl_->Describe(); }
Status RelayStore::Put(std::string_view key, std::span<const uint8_t> data) {
  return impl_->Put(key, data, /*once=*/false);
}
Status RelayStore::PutIfAbsent(std::string_view key,
                               std::span<const uint8_t> data) {
  return impl_->Put(key, data, /*once=*/true);
}
Result<std::vector<uint8_t>> RelayStore::Get(std::string_view key) {
  return impl_->Get(key);
}
Result<std::vector<ObjectInfo>> RelayStore::List(std::string_view prefix) {
  return impl_->List(prefix);
}
Status RelayStore::Delete(std::string_view key) { return impl_->Delete(key); }
uint64_t RelayStore::ChangeCount() { return impl_->ChangeCount(); }
void RelayStore::AwaitChange(uint64_t since, int timeout_ms) {
  impl_->AwaitChange(since, timeout_ms);
}

uint64_t RelayStore::Impl::ChangeCount() {
  std::lock_guard<std::mutex> lock(mu_);
  return changes_;
}

void RelayStore::Impl::AwaitChange(uint64_t since, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, std::chrono::milliseconds(std::max(0, timeout_ms)),
                    [&] { return changes_ != since || stopping_; });
}

Result<std::vector<int>> RelayTreeParents(int members, int fanout) {
  if (members < 0 || fanout < 1) {
    return InvalidArgumentError(
        "relay tree: need members >= 0 and fanout >= 1");
  }
  std::vector<int> parents(static_cast<size_t>(members));
  // Breadth-first: position p (root = 0, member i = i + 1) has parent
  // position (p - 1) / fanout.
  for (int i = 0; i < members; ++i)
    parents[static_cast<size_t>(i)] = i / fanout - 1;
  return parents;
}

}  // namespace refit
