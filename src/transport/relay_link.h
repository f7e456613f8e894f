// Internal to the relay transport: one TCP link of a relay endpoint, to its
// parent or to a child (docs/protocol.md, "Relay tree": "Frames",
// "Liveness", "TLS"), and the socket-level helpers of the link code
// (relay_link.cc).
//
// A link's fields are touched on its endpoint's I/O thread only, except
// `flow`, which the endpoint guards with its mutex (relay_object_map.h).
// With TLS, reads and writes go through `tls` (over `socket`); at most one
// read and one write are outstanding, both on the I/O thread, as asio's
// ssl::stream requires.
#ifndef REFIT_TRANSPORT_RELAY_LINK_H_
#define REFIT_TRANSPORT_RELAY_LINK_H_

#include <asio.hpp>
#include <asio/ssl.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "refit/status.h"
#include "transport/relay_frame.h"
#include "transport/relay_object_map.h"

namespace refit::internal {

using RelayClock = std::chrono::steady_clock;
using RelayTlsStream = asio::ssl::stream<asio::ip::tcp::socket&>;

// Bodies are read in pieces of this size so liveness is seen during a
// large object and progress is visible.
inline constexpr size_t kRelayReadPiece = 1 << 20;
// A TLS stream writes one record per buffer: frames with bodies up to this
// size are written as one buffer.
inline constexpr size_t kRelayTlsGatherBytes = 16 << 10;

struct RelayLink {
  explicit RelayLink(asio::io_context& io) : socket(io), delay_timer(io) {}

  asio::ip::tcp::socket socket;
  std::optional<RelayTlsStream>
      tls;                         // over `socket`, when the endpoint uses TLS
  asio::steady_timer delay_timer;  // test_read_delay_ms
  bool to_parent = false;
  // For messages: "parent 1.2.3.4:5" / "child r3 (1.2.3.4:5)".
  std::string peer;
  bool closed = false;
  bool hello_done = false;   // child: hello received; parent: hello sent
  bool handshaking = false;  // TLS handshake in progress: no reads, writes
  bool got_frame = false;    // a whole frame was read on this link
  RelayClock::time_point last_rx, last_tx;

  // Reading.
  bool reading = false;   // a read or a read delay is outstanding
  bool delaying = false;  // waiting out test_read_delay_ms
  uint8_t rhdr[kRelayHeaderBytes];
  RelayFrameHeader rh;
  std::string rkey;
  std::vector<uint8_t> rbody;
  size_t rdone = 0;
  uint8_t rcrc[kRelayTrailerBytes];

  // Writing.
  bool writing = false;
  uint8_t whdr[kRelayHeaderBytes];
  uint8_t wcrc[kRelayTrailerBytes];
  std::vector<uint8_t> wsmall;   // a whole control frame (hello, heartbeat)
  std::vector<uint8_t> wgather;  // TLS: header, key (and a small body, crc)

  // Where the link stands in the down log (a child) or the up log (the
  // parent: only its cursor). Guarded by the endpoint's mutex.
  RelayChildFlow flow;
};
using RelayLinkPtr = std::shared_ptr<RelayLink>;

// Reads and writes on a link, through TLS when it has it.
template <typename Buffers, typename Handler>
void AsyncRead(RelayLink& l, const Buffers& buffers, Handler&& handler) {
  if (l.tls) {
    asio::async_read(*l.tls, buffers, std::forward<Handler>(handler));
  } else {
    asio::async_read(l.socket, buffers, std::forward<Handler>(handler));
  }
}

template <typename Buffers, typename Handler>
void AsyncWrite(RelayLink& l, const Buffers& buffers, Handler&& handler) {
  if (l.tls) {
    asio::async_write(*l.tls, buffers, std::forward<Handler>(handler));
  } else {
    asio::async_write(l.socket, buffers, std::forward<Handler>(handler));
  }
}

// "host:port" with an IP literal (IPv6 in brackets) or "localhost";
// kInvalidArgument naming what is wrong.
Result<asio::ip::tcp::endpoint> ParseRelayAddress(const std::string& addr);
// "1.2.3.4:5" or "[::1]:5".
std::string FormatEndpoint(const asio::ip::tcp::endpoint& ep);
int MsSince(RelayClock::time_point t, RelayClock::time_point now);
// Member names of relay endpoints: 1..64 of [A-Za-z0-9._-].
Status ValidateRelayMember(std::string_view m);

}  // namespace refit::internal

#endif  // REFIT_TRANSPORT_RELAY_LINK_H_
