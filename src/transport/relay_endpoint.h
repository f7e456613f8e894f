// Internal to the relay transport: one endpoint of a relay tree, the
// implementation behind RelayStore (relay_store.h; docs/protocol.md, "Relay
// tree"). Its parts:
//   relay_store.cc       options, start and shutdown, the ObjectStore calls
//   relay_link.cc        links: accept and connect, frames in and out,
//                        liveness, flow control (relay_link.h)
//   relay_tls.cc         TLS contexts, peer checks and their messages
//   relay_object_map.cc  the objects held and each child's place in them
//
// Threads: one I/O thread per endpoint runs every socket and timer handler,
// so link state (RelayLink's read and write fields, links_, parent_) is
// touched on that thread only. The object map, the statistics and the
// links' flow state are shared with callers' threads and guarded by mu_.
//
// Links are closed by closing the socket without a TLS close_notify:
// frames are self-delimiting and checksummed, so a truncated stream loses
// nothing the frame layer would not notice, and no close waits on a peer.
#ifndef REFIT_TRANSPORT_RELAY_ENDPOINT_H_
#define REFIT_TRANSPORT_RELAY_ENDPOINT_H_

#include <asio.hpp>
#include <asio/ssl.hpp>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "transport/relay_link.h"
#include "transport/relay_object_map.h"
#include "transport/relay_store.h"

namespace refit {

class RelayStore::Impl {
 public:
  Impl(bool is_root, std::string member, RelayOptions options);
  ~Impl() { Shutdown(); }

  // Checks the options, binds `listen` (when not empty) and, at a node,
  // starts connecting to `parent`; then starts the I/O thread.
  Status Start(const std::string& listen, const std::string& parent);
  // Closes every link and joins the I/O thread; idempotent.
  void Shutdown();

  std::string Describe() const;
  const std::string& listen_address() const { return listen_address_; }
  RelayStatus status() const;
  Status last_error() const;

  Status Put(std::string_view key, std::span<const uint8_t> data, bool once);
  Result<std::vector<uint8_t>> Get(std::string_view key);
  Result<std::vector<ObjectInfo>> List(std::string_view prefix);
  Status Delete(std::string_view key);
  uint64_t ChangeCount();
  void AwaitChange(uint64_t since, int timeout_ms);

 private:
  using Clock = internal::RelayClock;
  using Link = internal::RelayLink;
  using LinkPtr = internal::RelayLinkPtr;
  using tcp = asio::ip::tcp;

  // ---- The object map (callers hold mu_) ----
  bool AnyChildOver() const;
  std::string SlowestChild() const;
  internal::RelayObjectPtr MakeObject(std::string_view key,
                                      std::vector<uint8_t> data,
                                      internal::RelayFrameType type,
                                      bool up) const;

  // ---- Links, relay_link.cc (I/O thread) ----
  void Log(const std::string& msg);
  void RecordError(const Status& s);
  void Accept();
  void Connect();
  void ParentReady(const LinkPtr& l);
  // The TLS handshake of a new link: the server's side for a child, the
  // client's for the parent. Bounded by dead_after_ms (Tick). On success a
  // child's link starts reading (its hello comes first), the parent's link
  // says hello.
  void StartHandshake(const LinkPtr& l, asio::ssl::verify_mode mode);
  Status HandshakeError(const LinkPtr& l, const asio::error_code& ec);
  void ScheduleReconnect();
  void ScheduleTick();
  // Heartbeats on idle links; death of silent peers.
  void Tick();
  bool NotReadingOnPurpose(const Link& l) const;
  void Close(const LinkPtr& l, const Status& why);
  void OnIoError(const LinkPtr& l, const asio::error_code& ec,
                 const char* what);
  void StartRead(const LinkPtr& l);
  void ReadKey(const LinkPtr& l);
  void ReadBody(const LinkPtr& l);
  void ReadCrc(const LinkPtr& l);
  Status BadFrame(const LinkPtr& l, const Status& s);
  Status OnFrame(const LinkPtr& l);
  void PumpAll();
  // Starts the next write on `l` if none is in flight: the hello, the next
  // object above its cursor, or a heartbeat when it has been quiet.
  void Pump(const LinkPtr& l);
  void WriteSmall(const LinkPtr& l, std::vector<uint8_t> frame);
  void MaybeResumeParent();
  bool IsStopping() const;

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
  uint64_t changes_ = 0;  // objects inserted, local or arrived
  std::condition_variable changed_;
  internal::RelayObjectMap map_;
  RelayStatus stats_;
};

}  // namespace refit

#endif  // REFIT_TRANSPORT_RELAY_ENDPOINT_H_
