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
//
// TLS: a link's reads and writes go through its ssl::stream (over the
// link's socket) when the endpoint has TLS options. A TLS link does nothing
// but its handshake until that completes (Pump and StartRead wait); at most
// one read and one write are outstanding on it, both on the I/O thread, as
// asio's ssl::stream requires. Links are closed by closing the socket
// without a TLS close_notify: frames are self-delimiting and checksummed,
// so a truncated stream loses nothing the frame layer would not notice,
// and no close waits on a peer.
#include "transport/relay_store.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <asio.hpp>
#include <asio/ssl.hpp>
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
using TlsStream = asio::ssl::stream<tcp::socket&>;

// Bodies are read in pieces of this size so liveness is seen during a
// large object and progress is visible.
constexpr size_t kReadPiece = 1 << 20;
// A TLS stream writes one record per buffer: frames with bodies up to this
// size are written as one buffer.
constexpr size_t kTlsGatherBytes = 16 << 10;

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

ObjectPtr MakeObject(std::string_view key, std::vector<uint8_t> data,
                     RelayFrameType type, bool up,
                     std::optional<uint64_t> version) {
  auto o = std::make_shared<Object>();
  o->key = std::string(key);
  o->data = std::move(data);
  o->type = type;
  o->up = up;
  o->version = version;
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
  std::optional<TlsStream> tls;    // over `socket`, when the endpoint uses TLS
  asio::steady_timer delay_timer;  // test_read_delay_ms
  bool to_parent = false;
  std::string
      peer;  // for messages: "parent 1.2.3.4:5" / "child r3 (1.2.3.4:5)"
  bool closed = false;
  bool hello_done = false;   // child: hello received; parent: hello sent
  bool handshaking = false;  // TLS handshake in progress: no reads, writes
  bool got_frame = false;    // a whole frame was read on this link
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
  std::vector<uint8_t> wsmall;   // a whole control frame (hello, heartbeat)
  std::vector<uint8_t> wgather;  // TLS: header, key (and a small body, crc)

  // Flow state, guarded by Impl::mu_.
  bool registered = false;  // a child in children_
  uint64_t cursor = 0;
  uint64_t live_from = 0;
  uint64_t queued = 0;
};
using LinkPtr = std::shared_ptr<Link>;

// Reads and writes on a link, through TLS when it has it.
template <typename Buffers, typename Handler>
void AsyncRead(Link& l, const Buffers& buffers, Handler&& handler) {
  if (l.tls) {
    asio::async_read(*l.tls, buffers, std::forward<Handler>(handler));
  } else {
    asio::async_read(l.socket, buffers, std::forward<Handler>(handler));
  }
}

template <typename Buffers, typename Handler>
void AsyncWrite(Link& l, const Buffers& buffers, Handler&& handler) {
  if (l.tls) {
    asio::async_write(*l.tls, buffers, std::forward<Handler>(handler));
  } else {
    asio::async_write(l.socket, buffers, std::forward<Handler>(handler));
  }
}

bool IsTlsError(const asio::error_code& ec) {
  return ec.category() == asio::error::get_ssl_category() ||
         ec == asio::ssl::error::stream_truncated;
}

// OpenSSL's reason for an ssl-category error (0 for others).
int TlsReason(const asio::error_code& ec) {
  if (ec.category() != asio::error::get_ssl_category()) return 0;
  return ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
}

// What an alert the peer sent means for us ("" when nothing useful).
std::string TlsAlertHint(int reason) {
  if (reason < SSL_AD_REASON_OFFSET) return "";
  switch (reason - SSL_AD_REASON_OFFSET) {
    case SSL3_AD_UNSUPPORTED_CERTIFICATE:
      return "the peer refused this endpoint's certificate as unsuitable "
             "(an extendedKeyUsage must allow both serverAuth and "
             "clientAuth)";
    case SSL3_AD_BAD_CERTIFICATE:
    case SSL3_AD_CERTIFICATE_REVOKED:
    case SSL3_AD_CERTIFICATE_EXPIRED:
    case SSL3_AD_CERTIFICATE_UNKNOWN:
    case TLS1_AD_UNKNOWN_CA:
    case TLS1_AD_ACCESS_DENIED:
    case TLS13_AD_CERTIFICATE_REQUIRED:
      return "the peer refused this endpoint's certificate (is it from the "
             "peer's CA? does it carry the name the peer expects?)";
    case SSL3_AD_BAD_RECORD_MAC:
      return "the peer received a corrupted TLS record";
    case TLS1_AD_PROTOCOL_VERSION:
      return "the peer does not speak TLS 1.3";
    default:
      return "an alert from the peer";
  }
}

// The first bytes of a TLS record (a handshake or an alert) where a relay
// frame should start: the peer speaks TLS and this endpoint does not.
bool LooksLikeTls(const uint8_t* p, size_t n) {
  return n >= 2 && (p[0] == 0x16 || p[0] == 0x15) && p[1] == 0x03;
}

// The endpoint's TLS context (one for both roles: server of its children's
// links, client of its parent link). TLS 1.3 only, no session tickets.
Result<std::unique_ptr<asio::ssl::context>> MakeTlsContext(
    const RelayTlsOptions& t, const std::string& name) {
  if (t.cert_file.empty() || t.key_file.empty() || t.ca_file.empty()) {
    return InvalidArgumentError(
        "relay " + name +
        ": TLS needs a certificate chain, its private key and a CA file "
        "(cert_file, key_file, ca_file), all three");
  }
  auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls);
  SSL_CTX* c = ctx->native_handle();
  if (SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) != 1) {
    return InternalError("relay " + name + ": OpenSSL refuses TLS 1.3");
  }
  SSL_CTX_set_num_tickets(c, 0);
  ctx->set_options(asio::ssl::context::default_workarounds);
  auto failed = [&](const std::string& what, const std::string& file,
                    const asio::error_code& ec) {
    return InvalidArgumentError("relay " + name + ": cannot load the TLS " +
                                what + " '" + file + "': " + ec.message());
  };
  asio::error_code ec;
  ctx->use_certificate_chain_file(t.cert_file, ec);
  if (ec) return failed("certificate chain", t.cert_file, ec);
  ctx->use_private_key_file(t.key_file, asio::ssl::context::pem, ec);
  if (ec) return failed("private key", t.key_file, ec);
  if (SSL_CTX_check_private_key(c) != 1) {
    ERR_clear_error();
    return InvalidArgumentError("relay " + name + ": the TLS private key '" +
                                t.key_file +
                                "' does not belong to the "
                                "certificate '" +
                                t.cert_file + "'");
  }
  ctx->load_verify_file(t.ca_file, ec);
  if (ec) return failed("CA file", t.ca_file, ec);
  return ctx;
}

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
    if (opt_.keys == nullptr) {
      return InvalidArgumentError(
          "relay options: no key classifier (RelayOptions::keys)");
    }
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
    if (opt_.tls.enabled()) {
      REFIT_ASSIGN_OR_RETURN(tls_, MakeTlsContext(opt_.tls, name_));
    } else if (!opt_.tls.parent_name.empty() ||
               opt_.tls.child_names_are_members) {
      return InvalidArgumentError("relay " + name_ +
                                  ": TLS name checks need the TLS "
                                  "certificate, key and CA files");
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
    const std::string tls = tls_ ? " (TLS)" : "";
    if (is_root_) return "relay root at " + listen_address_ + tls;
    return "relay node '" + member_ + "' at " +
           (listen_address_.empty() ? std::string("(leaf)") : listen_address_) +
           ", parent " + parent_text_ + tls;
  }

  const std::string& listen_address() const { return listen_address_; }

  RelayStatus status() const {
    std::lock_guard<std::mutex> lock(mu_);
    RelayStatus s = stats_;
    s.is_root = is_root_;
    s.tls = tls_ != nullptr;
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
    ObjectPtr o =
        MakeObject(key, std::vector<uint8_t>(data.begin(), data.end()), type,
                   /*up=*/!is_root_, opt_.keys->VersionOf(key));
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
      if (tls_) {
        // A child must present a certificate from our CA.
        StartHandshake(
            l, asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
      } else {
        StartRead(l);
      }
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
      if (tls_) {
        StartHandshake(l, asio::ssl::verify_peer);
      } else {
        ParentReady(l);
      }
    });
  }

  void ParentReady(const LinkPtr& l) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      l->cursor = 0;  // re-send every up object we hold
      stats_.parent_connected = true;
      ++stats_.reconnects;
    }
    Pump(l);
    StartRead(l);
  }

  // The TLS handshake of a new link: the server's side for a child, the
  // client's for the parent. Bounded by dead_after_ms (Tick). On success a
  // child's link starts reading (its hello comes first), the parent's link
  // says hello.
  void StartHandshake(const LinkPtr& l, asio::ssl::verify_mode mode) {
    l->tls.emplace(l->socket, *tls_);
    asio::error_code ec;
    l->tls->set_verify_mode(mode, ec);
    if (!ec && l->to_parent && !opt_.tls.parent_name.empty()) {
      X509_VERIFY_PARAM* param = SSL_get0_param(l->tls->native_handle());
      asio::error_code not_ip;
      asio::ip::make_address(opt_.tls.parent_name, not_ip);
      const int ok = not_ip ? X509_VERIFY_PARAM_set1_host(
                                  param, opt_.tls.parent_name.c_str(), 0)
                            : X509_VERIFY_PARAM_set1_ip_asc(
                                  param, opt_.tls.parent_name.c_str());
      if (ok != 1) {
        ERR_clear_error();
        return Close(l, InvalidArgumentError("relay " + name_ +
                                             ": bad TLS parent name '" +
                                             opt_.tls.parent_name + "'"));
      }
    }
    if (ec) {
      return Close(l, InternalError("relay " + name_ + ": TLS setup for " +
                                    l->peer + " failed: " + ec.message()));
    }
    l->handshaking = true;
    l->tls->async_handshake(
        l->to_parent ? asio::ssl::stream_base::client
                     : asio::ssl::stream_base::server,
        [this, l](asio::error_code hec) {
          if (l->closed || hec == asio::error::operation_aborted) return;
          if (hec) return Close(l, HandshakeError(l, hec));
          l->handshaking = false;
          l->last_rx = Clock::now();
          if (l->to_parent) {
            ParentReady(l);
          } else {
            StartRead(l);
          }
        });
  }

  Status HandshakeError(const LinkPtr& l, const asio::error_code& ec) {
    std::string why = ec.message();
    const int reason = TlsReason(ec);
    if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
      const long v = SSL_get_verify_result(l->tls->native_handle());
      why += std::string(" (") + X509_verify_cert_error_string(v) + ")";
      switch (v) {
        case X509_V_ERR_HOSTNAME_MISMATCH:
        case X509_V_ERR_IP_ADDRESS_MISMATCH:
          why += ": its certificate does not name '" + opt_.tls.parent_name +
                 "' (parent_name)";
          break;
        case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
        case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
        case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
        case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
        case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
        case X509_V_ERR_CERT_SIGNATURE_FAILURE:
          why += ": its certificate is not from our CA (ca_file)";
          break;
        case X509_V_ERR_INVALID_PURPOSE:
          why +=
              ": its certificate's extendedKeyUsage must allow both "
              "serverAuth and clientAuth";
          break;
        default:
          break;
      }
    } else if (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
      why += ": a child must present a certificate from our CA";
    } else if (reason == SSL_R_WRONG_VERSION_NUMBER ||
               reason == SSL_R_HTTP_REQUEST ||
               reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
               reason == SSL_R_RECORD_LENGTH_MISMATCH ||
               reason == SSL_R_UNEXPECTED_RECORD ||
               reason == SSL_R_UNSUPPORTED_PROTOCOL ||
               reason == SSL_R_NO_PROTOCOLS_AVAILABLE) {
      why +=
          ": the peer does not speak TLS 1.3 (is it configured without "
          "relay TLS?)";
    } else if (reason >= SSL_AD_REASON_OFFSET) {
      why += ": " + TlsAlertHint(reason);
    } else if (ec == asio::error::eof ||
               ec == asio::ssl::error::stream_truncated) {
      why =
          "the peer closed the connection during the handshake (does it "
          "use TLS? does it trust our certificate?)";
    }
    ERR_clear_error();
    return UnavailableError("relay " + name_ + ": TLS handshake with " +
                            l->peer + " failed: " + why + "; link closed");
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
      } else if (l->handshaking &&
                 MsSince(l->last_rx, now) > opt_.dead_after_ms) {
        Close(
            l,
            UnavailableError(
                "relay " + name_ + ": TLS handshake with " + l->peer +
                " not done after " + std::to_string(MsSince(l->last_rx, now)) +
                " ms (dead_after_ms " + std::to_string(opt_.dead_after_ms) +
                "; a plaintext peer waiting for us?): link closed"));
        continue;
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
    std::string how;
    if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) {
      how = "closed the connection";
      if (l->to_parent && !l->tls && !l->got_frame) {
        how +=
            " before sending anything (if it keeps doing so: it may be a "
            "TLS endpoint, and this one uses no TLS)";
      }
    } else if (IsTlsError(ec)) {
      how = std::string(what) + " failed: TLS: " + ec.message();
      const std::string hint = TlsAlertHint(TlsReason(ec));
      if (!hint.empty()) how += "; " + hint;
      ERR_clear_error();
    } else {
      how = std::string(what) + " failed: " + ec.message();
    }
    Close(l, UnavailableError("relay " + name_ + ": " + l->peer + " " + how));
  }

  // ---- Reading ----

  void StartRead(const LinkPtr& l) {
    if (l->closed || l->reading || l->handshaking || IsStopping()) return;
    if (l->to_parent && parent_paused_) return;
    l->reading = true;
    AsyncRead(
        *l, asio::buffer(l->rhdr), [this, l](asio::error_code ec, size_t got) {
          if (ec && !l->tls && LooksLikeTls(l->rhdr, got)) {
            // A TLS peer's hello or alert, cut short.
            return Close(
                l, BadFrame(l, DataLossError("the peer sent a TLS record "
                                             "and closed: it uses TLS and "
                                             "this endpoint does not "
                                             "(relay TLS options)")));
          }
          if (ec) return OnIoError(l, ec, "read");
          l->last_rx = Clock::now();
          auto h = internal::ParseRelayHeader(l->rhdr, opt_.max_body_bytes);
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
    AsyncRead(*l, asio::buffer(l->rkey.data(), l->rkey.size()),
              [this, l](asio::error_code ec, size_t) {
                if (ec) return OnIoError(l, ec, "read");
                l->last_rx = Clock::now();
                ReadBody(l);
              });
  }

  void ReadBody(const LinkPtr& l) {
    if (l->rdone == l->rbody.size()) return ReadCrc(l);
    const size_t n = std::min(kReadPiece, l->rbody.size() - l->rdone);
    AsyncRead(*l, asio::buffer(l->rbody.data() + l->rdone, n),
              [this, l](asio::error_code ec, size_t got) {
                if (ec) return OnIoError(l, ec, "read");
                l->last_rx = Clock::now();
                l->rdone += got;
                ReadBody(l);
              });
  }

  void ReadCrc(const LinkPtr& l) {
    AsyncRead(*l, asio::buffer(l->rcrc),
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
    l->got_frame = true;
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
        if (l->tls && opt_.tls.child_names_are_members) {
          X509* cert = SSL_get0_peer_certificate(l->tls->native_handle());
          if (cert == nullptr ||
              X509_check_host(cert, l->rkey.data(), l->rkey.size(),
                              X509_CHECK_FLAG_NO_WILDCARDS, nullptr) != 1) {
            ERR_clear_error();
            return PermissionDeniedError(
                "relay " + name_ + ": " + l->peer + " says hello as '" +
                l->rkey +
                "' but its TLS certificate does not name that member "
                "(child_names_are_members); link closed");
          }
        }
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
    if (!l->to_parent && !opt_.keys->IsUpward(l->rkey)) {
      return BadFrame(
          l, PermissionDeniedError("'" + l->rkey +
                                   "' is not an upward key (votes, requests)"));
    }
    if (l->to_parent) reconnect_attempt_ = 0;
    ObjectPtr o = MakeObject(l->rkey, std::move(l->rbody), l->rh.type,
                             !l->to_parent, opt_.keys->VersionOf(l->rkey));
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
    if (l->closed || l->writing || l->handshaking || IsStopping()) return;
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
    std::vector<asio::const_buffer> bufs;
    if (l->tls) {
      // One TLS record per buffer: header and key (and a small body and
      // the crc) go as one.
      const bool small = o->data.size() <= kTlsGatherBytes;
      l->wgather.assign(l->whdr, l->whdr + internal::kRelayHeaderBytes);
      l->wgather.insert(l->wgather.end(), o->key.begin(), o->key.end());
      if (small) {
        l->wgather.insert(l->wgather.end(), o->data.begin(), o->data.end());
        l->wgather.insert(l->wgather.end(), l->wcrc,
                          l->wcrc + internal::kRelayTrailerBytes);
      }
      bufs.push_back(asio::buffer(l->wgather));
      if (!small) {
        bufs.push_back(asio::buffer(o->data.data(), o->data.size()));
        bufs.push_back(asio::buffer(l->wcrc));
      }
    } else {
      bufs = {asio::buffer(l->whdr), asio::buffer(o->key.data(), o->key.size()),
              asio::buffer(o->data.data(), o->data.size()),
              asio::buffer(l->wcrc)};
    }
    l->writing = true;
    l->last_tx = Clock::now();
    AsyncWrite(*l, bufs, [this, l, o](asio::error_code ec, size_t) {
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
    AsyncWrite(*l, asio::buffer(l->wsmall),
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

  // Declared before io_: streams in handlers that io_ destroys refer to it.
  std::unique_ptr<asio::ssl::context> tls_;  // null: plaintext links
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
