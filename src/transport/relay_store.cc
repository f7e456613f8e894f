// The relay tree (docs/protocol.md, "Relay tree").
//
// Threads: one I/O thread per endpoint runs every socket and timer handler,
// so link state (Link's read and write fields, links_, parent_) is touched
// on that thread only. The object map, the two logs and the per-child flow
// counters are shared with callers' threads and guarded by mu_.
//
// Invariants (under mu_):
//   - Every stored object has a unique, increasing seq. Down objects sit in
//     down_log_ by seq, up objects (at nodes) in up_log_; a replaced or
//     evicted object leaves its log, so a log replays the current objects
//     in the order they were written.
//   - A child link's cursor is the seq of the last object it was sent; it is
//     sent down_log_ entries above its cursor, in order. live_from is the
//     seq at its hello: entries up to it are replay and cost no queue bytes.
//     queued = bytes of down_log_ entries above max(cursor, live_from).
//   - The parent link sends up_log_ entries above its own cursor.
#include "transport/relay_store.h"

#include <algorithm>
#include <array>
#include <asio.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "transport/relay_frame.h"
#include "transport/stores.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;
using asio::ip::tcp;
using internal::RelayFrameType;

// Bodies are read in pieces of this size so liveness is seen during a
// large object and progress is visible.
constexpr size_t kReadPiece = 1 << 20;

struct Object {
  std::string key;
  std::vector<uint8_t> data;
  RelayFrameType type = RelayFrameType::kPut;  // kPut or kPutOnce
  uint32_t crc = 0;                            // of its frame
  uint64_t seq = 0;
  bool up = false;
  std::optional<uint64_t> version;
};
using ObjectPtr = std::shared_ptr<Object>;

// The version a key belongs to: v/<V>/... or index/<V>.
std::optional<uint64_t> KeyVersion(std::string_view key) {
  std::string_view digits;
  if (key.starts_with("v/")) {
    digits = key.substr(2);
    digits = digits.substr(0, digits.find('/'));
  } else if (key.starts_with("index/")) {
    digits = key.substr(6);
  } else {
    return std::nullopt;
  }
  if (digits.empty() || digits.size() > 20)
    return std::nullopt;  // protocol: 20
  uint64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

ObjectPtr MakeObject(std::string_view key, std::vector<uint8_t> data,
                     RelayFrameType type, bool up) {
  auto o = std::make_shared<Object>();
  o->key = std::string(key);
  o->data = std::move(data);
  o->type = type;
  o->up = up;
  o->version = KeyVersion(key);
  uint8_t header[internal::kRelayHeaderBytes];
  internal::EncodeRelayHeader(type, static_cast<uint32_t>(key.size()),
                              o->data.size(), header);
  o->crc = internal::RelayFrameCrc(header, o->key, o->data);
  return o;
}

bool SameBytes(const Object& a, const Object& b) {
  return a.data.size() == b.data.size() && a.crc == b.crc &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size()) == 0;
}

Status ValidateMemberName(std::string_view m) {
  if (m.empty() || m.size() > 64 ||
      !std::all_of(m.begin(), m.end(), internal::IsKeyChar)) {
    return InvalidArgumentError("relay member name '" + std::string(m) +
                                "' must be 1..64 of [A-Za-z0-9._-]");
  }
  return Status();
}

Result<tcp::endpoint> ParseAddress(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) {
    return InvalidArgumentError("relay address '" + addr +
                                "' is not host:port");
  }
  std::string host = addr.substr(0, colon);
  const std::string port_text = addr.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") host = "127.0.0.1";
  char* end = nullptr;
  const unsigned long port = std::strtoul(port_text.c_str(), &end, 10);
  if (*end != '\0' || port > 65535) {
    return InvalidArgumentError("relay address '" + addr + "' has a bad port");
  }
  asio::error_code ec;
  asio::ip::address ip = asio::ip::make_address(host, ec);
  if (ec) {
    return InvalidArgumentError("relay address '" + addr +
                                "': host must be an IP literal or localhost");
  }
  return tcp::endpoint(ip, static_cast<uint16_t>(port));
}

std::string FormatEndpoint(const tcp::endpoint& ep) {
  if (ep.address().is_v6()) {
    return "[" + ep.address().to_string() + "]:" + std::to_string(ep.port());
  }
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

int MsSince(Clock::time_point t, Clock::time_point now) {
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count());
}

// One TCP link to a parent or a child.
struct Link {
  explicit Link(asio::io_context& io) : socket(io), delay_timer(io) {}

  tcp::socket socket;
  asio::steady_timer delay_timer;  // test_read_delay_ms
  bool to_parent = false;
  std::string
      peer;  // for messages: "parent 1.2.3.4:5" / "child r3 (1.2.3.4:5)"
  bool closed = false;
  bool hello_done = false;  // child: hello received; parent: hello sent
  Clock::time_point last_rx, last_tx;

  // Reading (I/O thread).
  bool reading = false;   // a read or a read delay is outstanding
  bool delaying = false;  // waiting out test_read_delay_ms
  uint8_t rhdr[internal::kRelayHeaderBytes];
  internal::RelayFrameHeader rh;
  std::string rkey;
  std::vector<uint8_t> rbody;
  size_t rdone = 0;
  uint8_t rcrc[internal::kRelayTrailerBytes];

  // Writing (I/O thread).
  bool writing = false;
  uint8_t whdr[internal::kRelayHeaderBytes];
  uint8_t wcrc[internal::kRelayTrailerBytes];
  std::vector<uint8_t> wsmall;  // a whole control frame (hello, heartbeat)

  // Flow state, guarded by Impl::mu_.
  bool registered = false;  // a child in children_
  uint64_t cursor = 0;
  uint64_t live_from = 0;
  uint64_t queued = 0;
};
using LinkPtr = std::shared_ptr<Link>;

}  // namespace

class RelayStore::Impl {
 public:
  Impl(bool is_root, std::string member, RelayOptions options)
      : opt_(std::move(options)),
        is_root_(is_root),
        member_(std::move(member)),
        name_(is_root_ ? "root" : "node " + member_),
        acceptor_(io_),
        tick_timer_(io_),
        reconnect_timer_(io_),
        connect_timer_(io_) {}

  ~Impl() { Shutdown(); }

  Status Start(const std::string& listen, const std::string& parent) {
    if (opt_.heartbeat_ms < 1 || opt_.dead_after_ms <= opt_.heartbeat_ms) {
      return InvalidArgumentError(
          "relay options: need 1 <= heartbeat_ms < dead_after_ms");
    }
    if (opt_.reconnect_min_ms < 1 ||
        opt_.reconnect_max_ms < opt_.reconnect_min_ms ||
        opt_.keep_versions < 1 || opt_.put_timeout_ms < 0 ||
        opt_.child_queue_bytes == 0 || opt_.test_read_delay_ms < 0) {
      return InvalidArgumentError("relay options out of range");
    }
    if (!is_root_) {
      REFIT_RETURN_IF_ERROR(ValidateMemberName(member_));
      REFIT_ASSIGN_OR_RETURN(parent_ep_, ParseAddress(parent));
      parent_text_ = parent;
    }
    if (!listen.empty()) {
      REFIT_ASSIGN_OR_RETURN(tcp::endpoint ep, ParseAddress(listen));
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

  void Shutdown() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
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

  std::string Describe() const {
    if (is_root_) return "relay root at " + listen_address_;
    return "relay node '" + member_ + "' at " +
           (listen_address_.empty() ? std::string("(leaf)") : listen_address_) +
           ", parent " + parent_text_;
  }

  const std::string& listen_address() const { return listen_address_; }

  RelayStatus status() const {
    std::lock_guard<std::mutex> lock(mu_);
    RelayStatus s = stats_;
    s.is_root = is_root_;
    s.listen_address = listen_address_;
    s.children = static_cast<int>(children_.size());
    s.objects = objects_.size();
    s.bytes = total_bytes_;
    return s;
  }

  Status last_error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_.last_error;
  }

  Status Put(std::string_view key, std::span<const uint8_t> data, bool once) {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    const RelayFrameType type =
        once ? RelayFrameType::kPutOnce : RelayFrameType::kPut;
    if (!is_root_ && !RelayIsUpwardKey(key)) {
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
    ObjectPtr o =
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
      auto it = objects_.find(key);
      if (once && it != objects_.end()) {
        return AlreadyExistsError("relay " + name_ + ": '" + std::string(key) +
                                  "' already exists");
      }
      std::string why;
      switch (Insert(o, /*local=*/true, &why)) {
        case InsertResult::kInserted:
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

  Result<std::vector<uint8_t>> Get(std::string_view key) {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    ObjectPtr o;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = objects_.find(key);
      if (it == objects_.end()) {
        return NotFoundError("relay " + name_ + ": '" + std::string(key) +
                             "' has not arrived (or was evicted)");
      }
      o = it->second;
    }
    return o->data;  // immutable once stored: copied outside the lock
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) {
    REFIT_RETURN_IF_ERROR(internal::ValidatePrefix(prefix));
    std::vector<ObjectInfo> out;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = objects_.lower_bound(prefix);
         it != objects_.end() && it->first.starts_with(prefix); ++it) {
      out.push_back(ObjectInfo{it->first, it->second->data.size()});
    }
    return out;
  }

  Status Delete(std::string_view key) {
    REFIT_RETURN_IF_ERROR(ValidateKey(key));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it != objects_.end()) {
      ObjectPtr o = it->second;  // Remove() erases the map's reference
      Remove(o);
    }
    return Status();
  }

 private:
  enum class InsertResult {
    kInserted,
    kDuplicate,
    kStale,
    kConflict,
    kOverCap
  };

  // ---- The object map (callers hold mu_) ----

  // Stores `o`, replacing a different object under its key unless either is
  // once-only (a conflict; `local` writes at this endpoint may replace).
  // Evicts the oldest version first when `o` opens a new one.
  InsertResult Insert(const ObjectPtr& o, bool local, std::string* why) {
    auto it = objects_.find(o->key);
    ObjectPtr old = it == objects_.end() ? nullptr : it->second;
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
      if (static_cast<int>(versions_.size()) >= opt_.keep_versions &&
          *o->version < versions_.begin()->first) {
        return InsertResult::kStale;
      }
      // Remove() drops a version's entry with its last key.
      while (static_cast<int>(versions_.size()) >= opt_.keep_versions) {
        const std::set<std::string> keys = versions_.begin()->second;
        for (const std::string& k : keys) {
          ObjectPtr victim = objects_.find(k)->second;
          Remove(victim);
          ++stats_.evicted;
        }
      }
    }
    const uint64_t after =
        total_bytes_ - (old ? old->data.size() : 0) + o->data.size();
    if (after > opt_.max_store_bytes) {
      *why = "relay " + name_ + ": storing '" + o->key + "' (" +
             std::to_string(o->data.size()) + " bytes) would hold " +
             std::to_string(after) + " bytes, over max_store_bytes " +
             std::to_string(opt_.max_store_bytes) +
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
      for (Link* c : children_) {
        c->queued += o->data.size();
        stats_.max_child_queue_bytes =
            std::max(stats_.max_child_queue_bytes, c->queued);
      }
    } else if (!is_root_) {
      up_log_[o->seq] = o;
    }
    return InsertResult::kInserted;
  }

  void Remove(const ObjectPtr& o) {
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
    for (Link* c : children_) {
      if (o->seq > c->cursor && o->seq > c->live_from)
        c->queued -= o->data.size();
    }
  }

  bool AnyChildOver() const {
    for (const Link* c : children_) {
      if (c->queued > opt_.child_queue_bytes) return true;
    }
    return false;
  }

  std::string SlowestChild() const {
    const Link* worst = nullptr;
    for (const Link* c : children_) {
      if (!worst || c->queued > worst->queued) worst = c;
    }
    if (!worst) return "no child";
    return worst->peer + " has " + std::to_string(worst->queued) +
           " bytes queued";
  }

  // ---- Links (I/O thread) ----

  void Log(const std::string& msg) {
    // Messages start with "relay <name>: " already.
    if (opt_.log_to_stderr) std::fprintf(stderr, "refit %s\n", msg.c_str());
  }

  void RecordError(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.last_error = s;
  }

  void Accept() {
    acceptor_.async_accept([this](asio::error_code ec, tcp::socket socket) {
      if (IsStopping()) return;
      if (ec) {
        if (ec == asio::error::operation_aborted) return;
        Status s = UnavailableError("relay " + name_ +
                                    ": accept failed: " + ec.message());
        RecordError(s);
        Log(std::string(s.message()));
        // Out of descriptors and the like: try again after a heartbeat.
        auto t = std::make_shared<asio::steady_timer>(io_);
        t->expires_after(std::chrono::milliseconds(opt_.heartbeat_ms));
        t->async_wait([this, t](asio::error_code) {
          if (!IsStopping()) Accept();
        });
        return;
      }
      auto l = std::make_shared<Link>(io_);
      l->socket = std::move(socket);
      asio::error_code ignored;
      l->socket.set_option(tcp::no_delay(true), ignored);
      l->peer =
          "child at " + FormatEndpoint(l->socket.remote_endpoint(ignored));
      l->last_rx = l->last_tx = Clock::now();
      links_.push_back(l);
      StartRead(l);
      Accept();
    });
  }

  void Connect() {
    if (IsStopping()) return;
    auto l = std::make_shared<Link>(io_);
    l->to_parent = true;
    l->peer = "parent " + parent_text_;
    connecting_ = l;
    connect_timer_.expires_after(std::chrono::milliseconds(opt_.dead_after_ms));
    connect_timer_.async_wait([this, l](asio::error_code ec) {
      if (!ec && connecting_ == l) {
        asio::error_code ignored;
        l->socket.close(ignored);  // completes the connect with an error
      }
    });
    l->socket.async_connect(parent_ep_, [this, l](asio::error_code ec) {
      connect_timer_.cancel();
      connecting_.reset();
      if (IsStopping()) return;
      if (ec) {
        Status s =
            UnavailableError("relay " + name_ + ": cannot connect to " +
                             l->peer + ": " + ec.message() + " (attempt " +
                             std::to_string(reconnect_attempt_ + 1) + ")");
        RecordError(s);
        if (reconnect_attempt_ == 0) Log(std::string(s.message()));
        ScheduleReconnect();
        return;
      }
      asio::error_code ignored;
      l->socket.set_option(tcp::no_delay(true), ignored);
      l->last_rx = l->last_tx = Clock::now();
      parent_ = l;
      links_.push_back(l);
      {
        std::lock_guard<std::mutex> lock(mu_);
        l->cursor = 0;  // re-send every up object we hold
        stats_.parent_connected = true;
        ++stats_.reconnects;
      }
      Pump(l);
      StartRead(l);
    });
  }

  void ScheduleReconnect() {
    ++reconnect_attempt_;
    auto delay = std::min<std::chrono::milliseconds>(
        internal::BackoffDelay(reconnect_attempt_, opt_.reconnect_min_ms),
        std::chrono::milliseconds(opt_.reconnect_max_ms));
    reconnect_timer_.expires_after(delay);
    reconnect_timer_.async_wait([this](asio::error_code ec) {
      if (!ec) Connect();
    });
  }

  void ScheduleTick() {
    const int tick =
        std::max(5, std::min(opt_.heartbeat_ms, opt_.dead_after_ms / 4));
    tick_timer_.expires_after(std::chrono::milliseconds(tick));
    tick_timer_.async_wait([this](asio::error_code ec) {
      if (ec || IsStopping()) return;
      Tick();
      ScheduleTick();
    });
  }

  // Heartbeats on idle links; death of silent peers. A link we are
  // deliberately not reading (back-pressure, test delay) is not judged:
  // its peer's bytes wait in the socket.
  void Tick() {
    const auto now = Clock::now();
    for (const LinkPtr& l : std::vector<LinkPtr>(links_)) {
      if (l->closed) continue;
      if (NotReadingOnPurpose(*l)) {
        l->last_rx = now;
      } else if (MsSince(l->last_rx, now) > opt_.dead_after_ms) {
        Close(l, UnavailableError("relay " + name_ + ": " + l->peer +
                                  " silent for " +
                                  std::to_string(MsSince(l->last_rx, now)) +
                                  " ms (dead_after_ms " +
                                  std::to_string(opt_.dead_after_ms) +
                                  "): declared dead, link closed"));
        continue;
      }
      Pump(l);
    }
  }

  bool NotReadingOnPurpose(const Link& l) const {
    return l.delaying || (l.to_parent && parent_paused_);
  }

  void Close(const LinkPtr& l, const Status& why) {
    if (l->closed) return;
    l->closed = true;
    links_.erase(std::remove(links_.begin(), links_.end(), l), links_.end());
    const bool stopping = IsStopping();
    // Status first, then the socket: whoever sees the link drop (the peer,
    // a test) finds the reason already recorded.
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (l->registered) {
        children_.erase(
            std::remove(children_.begin(), children_.end(), l.get()),
            children_.end());
        l->registered = false;
      }
      if (!stopping) {
        ++stats_.links_closed;
        if (!why.ok()) stats_.last_error = why;
      }
      if (l == parent_) stats_.parent_connected = false;
    }
    asio::error_code ignored;
    l->socket.shutdown(tcp::socket::shutdown_both, ignored);
    l->socket.close(ignored);
    l->delay_timer.cancel();
    cv_.notify_all();
    if (!stopping && !why.ok()) Log(std::string(why.message()));
    if (l == parent_) {
      parent_.reset();
      parent_paused_ = false;
      if (!stopping) ScheduleReconnect();
    } else {
      MaybeResumeParent();
    }
  }

  void OnIoError(const LinkPtr& l, const asio::error_code& ec,
                 const char* what) {
    if (l->closed || ec == asio::error::operation_aborted) return;
    const std::string how =
        ec == asio::error::eof ? "closed the connection"
                               : std::string(what) + " failed: " + ec.message();
    Close(l, UnavailableError("relay " + name_ + ": " + l->peer + " " + how));
  }

  // ---- Reading ----

  void StartRead(const LinkPtr& l) {
    if (l->closed || l->reading || IsStopping()) return;
    if (l->to_parent && parent_paused_) return;
    l->reading = true;
    asio::async_read(l->socket, asio::buffer(l->rhdr),
                     [this, l](asio::error_code ec, size_t) {
                       if (ec) return OnIoError(l, ec, "read");
                       l->last_rx = Clock::now();
                       auto h = internal::ParseRelayHeader(l->rhdr,
                                                           opt_.max_body_bytes);
                       if (!h.ok()) return Close(l, BadFrame(l, h.status()));
                       l->rh = *h;
                       l->rkey.assign(h->key_len, '\0');
                       l->rbody.assign(h->body_len, 0);
                       l->rdone = 0;
                       ReadKey(l);
                     });
  }

  void ReadKey(const LinkPtr& l) {
    if (l->rkey.empty()) return ReadBody(l);
    asio::async_read(l->socket, asio::buffer(l->rkey.data(), l->rkey.size()),
                     [this, l](asio::error_code ec, size_t) {
                       if (ec) return OnIoError(l, ec, "read");
                       l->last_rx = Clock::now();
                       ReadBody(l);
                     });
  }

  void ReadBody(const LinkPtr& l) {
    if (l->rdone == l->rbody.size()) return ReadCrc(l);
    const size_t n = std::min(kReadPiece, l->rbody.size() - l->rdone);
    asio::async_read(l->socket, asio::buffer(l->rbody.data() + l->rdone, n),
                     [this, l](asio::error_code ec, size_t got) {
                       if (ec) return OnIoError(l, ec, "read");
                       l->last_rx = Clock::now();
                       l->rdone += got;
                       ReadBody(l);
                     });
  }

  void ReadCrc(const LinkPtr& l) {
    asio::async_read(
        l->socket, asio::buffer(l->rcrc),
        [this, l](asio::error_code ec, size_t) {
          if (ec) return OnIoError(l, ec, "read");
          l->last_rx = Clock::now();
          Status s = OnFrame(l);
          if (!s.ok()) return Close(l, s);
          if (l->closed) return;
          if (l->to_parent && opt_.test_read_delay_ms > 0) {
            l->delaying = true;
            l->delay_timer.expires_after(
                std::chrono::milliseconds(opt_.test_read_delay_ms));
            l->delay_timer.async_wait([this, l](asio::error_code ec2) {
              l->delaying = false;
              l->reading = false;
              if (!ec2) {
                l->last_rx = Clock::now();
                StartRead(l);
              }
            });
            return;
          }
          l->reading = false;
          StartRead(l);
        });
  }

  Status BadFrame(const LinkPtr& l, const Status& s) {
    return Status(s.code(), "relay " + name_ + ": bad frame from " + l->peer +
                                ": " + std::string(s.message()) +
                                "; link closed");
  }

  Status OnFrame(const LinkPtr& l) {
    const uint32_t crc = internal::RelayFrameCrc(l->rhdr, l->rkey, l->rbody);
    if (crc != internal::LoadLe32(l->rcrc)) {
      return BadFrame(
          l, DataLossError("crc mismatch (frame key '" + l->rkey.substr(0, 64) +
                           "', " + std::to_string(l->rbody.size()) +
                           " body bytes)"));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.frames_in;
    }
    if (!l->to_parent && !l->hello_done &&
        l->rh.type != RelayFrameType::kHello) {
      return BadFrame(l,
                      DataLossError("a child's first frame must be its hello"));
    }
    switch (l->rh.type) {
      case RelayFrameType::kHeartbeat:
        if (!l->rkey.empty() || !l->rbody.empty()) {
          return BadFrame(l, DataLossError("heartbeat with a key or body"));
        }
        if (l->to_parent) reconnect_attempt_ = 0;
        return Status();
      case RelayFrameType::kHello: {
        if (l->to_parent || l->hello_done)
          return BadFrame(l, DataLossError("unexpected hello"));
        REFIT_RETURN_IF_ERROR(ValidateMemberName(l->rkey).WithContext(
            "relay " + name_ + ": hello from " + l->peer));
        if (l->rbody.size() != 4 || internal::LoadLe32(l->rbody.data()) !=
                                        internal::kRelayProtocolVersion) {
          return FailedPreconditionError(
              "relay " + name_ + ": " + l->peer +
              " speaks another relay protocol version");
        }
        asio::error_code ignored;
        l->peer = "child " + l->rkey + " (" +
                  FormatEndpoint(l->socket.remote_endpoint(ignored)) + ")";
        l->hello_done = true;
        {
          std::lock_guard<std::mutex> lock(mu_);
          l->cursor = 0;
          l->live_from = seq_;
          l->queued = 0;
          l->registered = true;
          children_.push_back(l.get());
        }
        Pump(l);
        return Status();
      }
      case RelayFrameType::kPut:
      case RelayFrameType::kPutOnce:
        break;
    }
    if (Status k = ValidateKey(l->rkey); !k.ok()) return BadFrame(l, k);
    if (!l->to_parent && !RelayIsUpwardKey(l->rkey)) {
      return BadFrame(
          l, PermissionDeniedError("'" + l->rkey +
                                   "' is not an upward key (votes, requests)"));
    }
    if (l->to_parent) reconnect_attempt_ = 0;
    ObjectPtr o =
        MakeObject(l->rkey, std::move(l->rbody), l->rh.type, !l->to_parent);
    l->rbody = {};
    std::string why;
    InsertResult r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      r = Insert(o, /*local=*/false, &why);
      if (r == InsertResult::kConflict) {
        ++stats_.refused;
        stats_.last_error = FailedPreconditionError(why + " from " + l->peer);
      }
      if (r == InsertResult::kInserted && l->to_parent && AnyChildOver())
        parent_paused_ = true;
    }
    switch (r) {
      case InsertResult::kInserted:
        if (l->to_parent) {
          for (const LinkPtr& c : std::vector<LinkPtr>(links_)) {
            if (!c->to_parent) Pump(c);
          }
        } else if (parent_) {
          Pump(parent_);
        }
        if (opt_.on_arrival) opt_.on_arrival(o->key);
        return Status();
      case InsertResult::kConflict:
        Log(why + " from " + l->peer);
        return Status();
      case InsertResult::kDuplicate:
      case InsertResult::kStale:
        return Status();
      case InsertResult::kOverCap:
        return ResourceExhaustedError(why);
    }
    return Status();
  }

  // ---- Writing ----

  void PumpAll() {
    for (const LinkPtr& l : std::vector<LinkPtr>(links_)) Pump(l);
  }

  // Starts the next write on `l` if none is in flight: the hello, the next
  // object above its cursor, or a heartbeat when it has been quiet.
  void Pump(const LinkPtr& l) {
    if (l->closed || l->writing || IsStopping()) return;
    if (l->to_parent && !l->hello_done) {
      uint8_t version[4];
      internal::StoreLe32(version, internal::kRelayProtocolVersion);
      l->hello_done = true;
      return WriteSmall(l, internal::EncodeRelayFrame(RelayFrameType::kHello,
                                                      member_, version));
    }
    ObjectPtr o;
    if (l->hello_done) {
      std::lock_guard<std::mutex> lock(mu_);
      const auto& log = l->to_parent ? up_log_ : down_log_;
      auto it = log.upper_bound(l->cursor);
      if (it != log.end()) o = it->second;
    }
    if (!o) {
      if (MsSince(l->last_tx, Clock::now()) >= opt_.heartbeat_ms) {
        WriteSmall(
            l, internal::EncodeRelayFrame(RelayFrameType::kHeartbeat, "", {}));
      }
      return;
    }
    internal::EncodeRelayHeader(o->type, static_cast<uint32_t>(o->key.size()),
                                o->data.size(), l->whdr);
    internal::StoreLe32(l->wcrc, o->crc);
    std::array<asio::const_buffer, 4> bufs = {
        asio::buffer(l->whdr), asio::buffer(o->key.data(), o->key.size()),
        asio::buffer(o->data.data(), o->data.size()), asio::buffer(l->wcrc)};
    l->writing = true;
    l->last_tx = Clock::now();
    asio::async_write(l->socket, bufs,
                      [this, l, o](asio::error_code ec, size_t) {
                        l->writing = false;
                        if (ec) return OnIoError(l, ec, "write");
                        l->last_tx = Clock::now();
                        {
                          std::lock_guard<std::mutex> lock(mu_);
                          ++stats_.frames_out;
                          l->cursor = std::max(l->cursor, o->seq);
                          if (!l->to_parent && o->seq > l->live_from) {
                            auto it = down_log_.find(o->seq);
                            if (it != down_log_.end() && it->second == o)
                              l->queued -= o->data.size();
                          }
                        }
                        cv_.notify_all();
                        if (!l->to_parent) MaybeResumeParent();
                        Pump(l);
                      });
  }

  void WriteSmall(const LinkPtr& l, std::vector<uint8_t> frame) {
    l->wsmall = std::move(frame);
    l->writing = true;
    l->last_tx = Clock::now();
    asio::async_write(l->socket, asio::buffer(l->wsmall),
                      [this, l](asio::error_code ec, size_t) {
                        l->writing = false;
                        if (ec) return OnIoError(l, ec, "write");
                        l->last_tx = Clock::now();
                        {
                          std::lock_guard<std::mutex> lock(mu_);
                          ++stats_.frames_out;
                        }
                        Pump(l);
                      });
  }

  void MaybeResumeParent() {
    if (!parent_paused_ || !parent_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (AnyChildOver()) return;
    }
    parent_paused_ = false;
    parent_->last_rx = Clock::now();
    StartRead(parent_);
  }

  bool IsStopping() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }

  const RelayOptions opt_;
  const bool is_root_;
  const std::string member_;
  const std::string name_;  // "root" or "node <member>", for messages
  std::string parent_text_;
  tcp::endpoint parent_ep_;
  std::string listen_address_;

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>>
      work_;
  tcp::acceptor acceptor_;
  asio::steady_timer tick_timer_;
  asio::steady_timer reconnect_timer_;
  asio::steady_timer connect_timer_;
  std::thread thread_;

  // I/O thread only.
  std::vector<LinkPtr> links_;  // open links, parent included
  LinkPtr parent_;              // connected parent link
  LinkPtr connecting_;          // parent link being connected
  int reconnect_attempt_ = 0;
  bool parent_paused_ =
      false;  // not reading the parent: a child is over its bound

  // Guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, ObjectPtr, std::less<>> objects_;
  std::map<uint64_t, ObjectPtr> down_log_;
  std::map<uint64_t, ObjectPtr> up_log_;
  std::map<uint64_t, std::set<std::string>> versions_;  // version -> keys
  std::vector<Link*> children_;  // children past their hello
  uint64_t seq_ = 0;
  uint64_t total_bytes_ = 0;
  RelayStatus stats_;
};

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

bool RelayIsUpwardKey(std::string_view key) {
  if (!key.starts_with("v/")) return false;
  const size_t slash = key.find('/', 2);
  if (slash == std::string_view::npos) return false;
  std::string_view rest = key.substr(slash + 1);
  return rest.starts_with("vote/") || rest.starts_with("request/");
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
