// Links of a relay endpoint (relay_endpoint.h): accepting children and
// connecting to the parent, TLS handshakes, reading and checking frames,
// writing objects in log order, heartbeats and death of silent peers, and
// flow control. Every function here runs on the endpoint's I/O thread.
#include <openssl/err.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "transport/relay_endpoint.h"
#include "transport/relay_tls.h"
#include "transport/stores.h"

namespace refit {
namespace internal {

Result<asio::ip::tcp::endpoint> ParseRelayAddress(const std::string& addr) {
  using asio::ip::tcp;
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

std::string FormatEndpoint(const asio::ip::tcp::endpoint& ep) {
  if (ep.address().is_v6()) {
    return "[" + ep.address().to_string() + "]:" + std::to_string(ep.port());
  }
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

int MsSince(RelayClock::time_point t, RelayClock::time_point now) {
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count());
}

Status ValidateRelayMember(std::string_view m) {
  if (m.empty() || m.size() > 64 ||
      !std::all_of(m.begin(), m.end(), IsKeyChar)) {
    return InvalidArgumentError("relay member name '" + std::string(m) +
                                "' must be 1..64 of [A-Za-z0-9._-]");
  }
  return Status();
}

}  // namespace internal

using internal::FormatEndpoint;
using internal::MsSince;
using internal::RelayFrameType;
using InsertResult = internal::RelayObjectMap::InsertResult;

void RelayStore::Impl::Log(const std::string& msg) {
  // Messages start with "relay <name>: " already.
  if (opt_.log_to_stderr) std::fprintf(stderr, "refit %s\n", msg.c_str());
}

void RelayStore::Impl::RecordError(const Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.last_error = s;
}

void RelayStore::Impl::Accept() {
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
    l->peer = "child at " + FormatEndpoint(l->socket.remote_endpoint(ignored));
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

void RelayStore::Impl::Connect() {
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
      Status s = UnavailableError("relay " + name_ + ": cannot connect to " +
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

void RelayStore::Impl::ParentReady(const LinkPtr& l) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    l->flow.cursor = 0;  // re-send every up object we hold
    stats_.parent_connected = true;
    ++stats_.reconnects;
  }
  Pump(l);
  StartRead(l);
}

void RelayStore::Impl::StartHandshake(const LinkPtr& l,
                                      asio::ssl::verify_mode mode) {
  l->tls.emplace(l->socket, *tls_);
  asio::error_code ec;
  l->tls->set_verify_mode(mode, ec);
  if (!ec && l->to_parent && !opt_.tls.parent_name.empty() &&
      !internal::RequirePeerName(l->tls->native_handle(),
                                 opt_.tls.parent_name)) {
    return Close(
        l, InvalidArgumentError("relay " + name_ + ": bad TLS parent name '" +
                                opt_.tls.parent_name + "'"));
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

Status RelayStore::Impl::HandshakeError(const LinkPtr& l,
                                        const asio::error_code& ec) {
  const std::string why = internal::ExplainHandshakeFailure(
      ec, l->tls->native_handle(), opt_.tls.parent_name);
  return UnavailableError("relay " + name_ + ": TLS handshake with " + l->peer +
                          " failed: " + why + "; link closed");
}

void RelayStore::Impl::ScheduleReconnect() {
  ++reconnect_attempt_;
  auto delay = std::min<std::chrono::milliseconds>(
      internal::BackoffDelay(reconnect_attempt_, opt_.reconnect_min_ms),
      std::chrono::milliseconds(opt_.reconnect_max_ms));
  reconnect_timer_.expires_after(delay);
  reconnect_timer_.async_wait([this](asio::error_code ec) {
    if (!ec) Connect();
  });
}

void RelayStore::Impl::ScheduleTick() {
  const int tick =
      std::max(5, std::min(opt_.heartbeat_ms, opt_.dead_after_ms / 4));
  tick_timer_.expires_after(std::chrono::milliseconds(tick));
  tick_timer_.async_wait([this](asio::error_code ec) {
    if (ec || IsStopping()) return;
    Tick();
    ScheduleTick();
  });
}

// A link we are deliberately not reading (back-pressure, test delay) is
// not judged: its peer's bytes wait in the socket.
void RelayStore::Impl::Tick() {
  const auto now = Clock::now();
  for (const LinkPtr& l : std::vector<LinkPtr>(links_)) {
    if (l->closed) continue;
    if (NotReadingOnPurpose(*l)) {
      l->last_rx = now;
    } else if (l->handshaking &&
               MsSince(l->last_rx, now) > opt_.dead_after_ms) {
      Close(l,
            UnavailableError(
                "relay " + name_ + ": TLS handshake with " + l->peer +
                " not done after " + std::to_string(MsSince(l->last_rx, now)) +
                " ms (dead_after_ms " + std::to_string(opt_.dead_after_ms) +
                "; a plaintext peer waiting for us?): link closed"));
      continue;
    } else if (MsSince(l->last_rx, now) > opt_.dead_after_ms) {
      Close(l, UnavailableError(
                   "relay " + name_ + ": " + l->peer + " silent for " +
                   std::to_string(MsSince(l->last_rx, now)) +
                   " ms (dead_after_ms " + std::to_string(opt_.dead_after_ms) +
                   "): declared dead, link closed"));
      continue;
    }
    Pump(l);
  }
}

bool RelayStore::Impl::NotReadingOnPurpose(const Link& l) const {
  return l.delaying || (l.to_parent && parent_paused_);
}

void RelayStore::Impl::Close(const LinkPtr& l, const Status& why) {
  if (l->closed) return;
  l->closed = true;
  links_.erase(std::remove(links_.begin(), links_.end(), l), links_.end());
  const bool stopping = IsStopping();
  // Status first, then the socket: whoever sees the link drop (the peer,
  // a test) finds the reason already recorded.
  {
    std::lock_guard<std::mutex> lock(mu_);
    map_.RemoveChild(&l->flow);
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

void RelayStore::Impl::OnIoError(const LinkPtr& l, const asio::error_code& ec,
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
  } else if (internal::IsTlsError(ec)) {
    how = std::string(what) + " failed: TLS: " + ec.message();
    const std::string hint = internal::TlsErrorHint(ec);
    if (!hint.empty()) how += "; " + hint;
    ERR_clear_error();
  } else {
    how = std::string(what) + " failed: " + ec.message();
  }
  Close(l, UnavailableError("relay " + name_ + ": " + l->peer + " " + how));
}

// ---- Reading ----

void RelayStore::Impl::StartRead(const LinkPtr& l) {
  if (l->closed || l->reading || l->handshaking || IsStopping()) return;
  if (l->to_parent && parent_paused_) return;
  l->reading = true;
  AsyncRead(*l, asio::buffer(l->rhdr),
            [this, l](asio::error_code ec, size_t got) {
              if (ec && !l->tls && internal::LooksLikeTls(l->rhdr, got)) {
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

void RelayStore::Impl::ReadKey(const LinkPtr& l) {
  if (l->rkey.empty()) return ReadBody(l);
  AsyncRead(*l, asio::buffer(l->rkey.data(), l->rkey.size()),
            [this, l](asio::error_code ec, size_t) {
              if (ec) return OnIoError(l, ec, "read");
              l->last_rx = Clock::now();
              ReadBody(l);
            });
}

void RelayStore::Impl::ReadBody(const LinkPtr& l) {
  if (l->rdone == l->rbody.size()) return ReadCrc(l);
  const size_t n =
      std::min(internal::kRelayReadPiece, l->rbody.size() - l->rdone);
  AsyncRead(*l, asio::buffer(l->rbody.data() + l->rdone, n),
            [this, l](asio::error_code ec, size_t got) {
              if (ec) return OnIoError(l, ec, "read");
              l->last_rx = Clock::now();
              l->rdone += got;
              ReadBody(l);
            });
}

void RelayStore::Impl::ReadCrc(const LinkPtr& l) {
  AsyncRead(*l, asio::buffer(l->rcrc), [this, l](asio::error_code ec, size_t) {
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

Status RelayStore::Impl::BadFrame(const LinkPtr& l, const Status& s) {
  return Status(s.code(), "relay " + name_ + ": bad frame from " + l->peer +
                              ": " + std::string(s.message()) +
                              "; link closed");
}

Status RelayStore::Impl::OnFrame(const LinkPtr& l) {
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
  if (!l->to_parent && !l->hello_done && l->rh.type != RelayFrameType::kHello) {
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
      REFIT_RETURN_IF_ERROR(internal::ValidateRelayMember(l->rkey).WithContext(
          "relay " + name_ + ": hello from " + l->peer));
      if (l->tls && opt_.tls.child_names_are_members &&
          !internal::PeerCertificateNames(l->tls->native_handle(), l->rkey)) {
        return PermissionDeniedError(
            "relay " + name_ + ": " + l->peer + " says hello as '" + l->rkey +
            "' but its TLS certificate does not name that member "
            "(child_names_are_members); link closed");
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
        map_.AddChild(&l->flow, l->peer);
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
  internal::RelayObjectPtr o =
      MakeObject(l->rkey, std::move(l->rbody), l->rh.type, !l->to_parent);
  l->rbody = {};
  std::string why;
  InsertResult r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r = map_.Insert(o, /*local=*/false, &why);
    if (r == InsertResult::kInserted) {
      ++changes_;
      changed_.notify_all();
    }
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

void RelayStore::Impl::PumpAll() {
  for (const LinkPtr& l : std::vector<LinkPtr>(links_)) Pump(l);
}

void RelayStore::Impl::Pump(const LinkPtr& l) {
  if (l->closed || l->writing || l->handshaking || IsStopping()) return;
  if (l->to_parent && !l->hello_done) {
    uint8_t version[4];
    internal::StoreLe32(version, internal::kRelayProtocolVersion);
    l->hello_done = true;
    return WriteSmall(l, internal::EncodeRelayFrame(RelayFrameType::kHello,
                                                    member_, version));
  }
  internal::RelayObjectPtr o;
  if (l->hello_done) {
    std::lock_guard<std::mutex> lock(mu_);
    o = l->to_parent ? map_.NextUp(l->flow.cursor)
                     : map_.NextDown(l->flow.cursor);
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
    const bool small = o->data.size() <= internal::kRelayTlsGatherBytes;
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
      map_.Sent(&l->flow, o, /*child=*/!l->to_parent);
    }
    cv_.notify_all();
    if (!l->to_parent) MaybeResumeParent();
    Pump(l);
  });
}

void RelayStore::Impl::WriteSmall(const LinkPtr& l,
                                  std::vector<uint8_t> frame) {
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

void RelayStore::Impl::MaybeResumeParent() {
  if (!parent_paused_ || !parent_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (AnyChildOver()) return;
  }
  parent_paused_ = false;
  parent_->last_rx = Clock::now();
  StartRead(parent_);
}

bool RelayStore::Impl::IsStopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

}  // namespace refit
