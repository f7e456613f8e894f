// RelayStore: an ObjectStore that is one endpoint of a relay tree over TCP
// (docs/protocol.md, "Relay tree"). The protocol sees only ObjectStore, and
// the relay knows no key layout: the protocol's RelayKeyClassifier
// (RelayOptions::keys) says which keys flow up and which version a key
// belongs to.
//
// The publisher process runs the ROOT endpoint; each receiver process runs
// a NODE that connects to its parent (the root or another node) and accepts
// its own children. Every endpoint keeps a local in-memory map of objects:
//   - Put / PutIfAbsent at the root store locally and flow DOWN: the root
//     sends each object once to each child, in the order they were written;
//     every node stores what it receives and forwards it at once to its own
//     children (a node forwards while its local receiver reads).
//   - Put / PutIfAbsent at a node take only upward keys (the protocol's
//     votes and requests); they are stored locally and flow UP hop by hop
//     to the root, where the publisher reads them.
//   - Get / List / Delete act on the local map only; Get answers kNotFound
//     for an object that has not arrived yet (the protocol polls).
//   - A node that (re)connects gets a replay of every down object its parent
//     holds, in write order, and re-sends every up object it holds.
//
// TLS (RelayOptions::tls): when configured, every link of the endpoint,
// to its parent and to its children, is TLS 1.3 with certificates on both
// sides (mutual TLS), and plaintext peers are refused.
//
// Ownership: each endpoint owns one I/O thread and its sockets; destroying
// the endpoint closes its links (children see the link drop and reconnect).
// Thread-safety: every public method may be called from any thread.
// Durability: objects live in memory only (rule 4 of "Atomicity" does not
// hold); a restarted endpoint gets its objects back from its parent.
#ifndef REFIT_TRANSPORT_RELAY_STORE_H_
#define REFIT_TRANSPORT_RELAY_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "transport/object_store.h"

namespace refit {

// TLS 1.3 on every link of an endpoint (docs/protocol.md, "Relay tree",
// "TLS"). Off while all of cert_file, key_file and ca_file are empty; set
// one and all three are required. With TLS on:
//   - the endpoint presents cert_file both to its children (as the server
//     of their links) and to its parent (as a client certificate);
//   - every peer must present a certificate whose chain leads to a CA of
//     ca_file: a child without one, or with one from another CA, is
//     refused, and a node refuses such a parent;
//   - a plaintext peer is refused (either way round), with an error that
//     says so; a handshake not done within dead_after_ms closes the link.
// By default any certificate the CA issued is accepted: the CA is the
// tree's own (it issues certificates to its members only), and parents are
// addressed by IP. parent_name and child_names_are_members narrow that.
struct RelayTlsOptions {
  std::string cert_file;  // PEM certificate chain, leaf first
  std::string key_file;   // PEM private key of the leaf
  std::string ca_file;    // PEM CA certificate(s) peers' chains lead to
  // Node: the parent's certificate must also carry this name (a DNS
  // subjectAltName, or an IP subjectAltName when it is an IP literal).
  // Empty: any certificate from the CA.
  std::string parent_name;
  // Parent side: a child's hello is refused (kPermissionDenied) unless its
  // certificate names its member (DNS subjectAltName, or the subject CN
  // when it has none), so one member cannot speak for another.
  bool child_names_are_members = false;

  bool enabled() const {
    return !cert_file.empty() || !key_file.empty() || !ca_file.empty();
  }
};

// How a relay tree treats keys; the protocol above the relay supplies one
// (sync/relay_tree.h). Called from any thread: implementations must be
// thread-safe, and are expected to be pure functions of the key.
class RelayKeyClassifier {
 public:
  virtual ~RelayKeyClassifier() = default;
  // True for keys that members (nodes) write and that flow up to the root;
  // every other key flows down from the root, and only the root writes it.
  virtual bool IsUpward(std::string_view key) const = 0;
  // The version `key` belongs to, for the keep_versions window; nullopt
  // for keys that are never evicted.
  virtual std::optional<uint64_t> VersionOf(std::string_view key) const = 0;
};

struct RelayOptions {
  // Required: which keys flow up, and their versions (see above).
  std::shared_ptr<const RelayKeyClassifier> keys;
  // Liveness: every link carries a heartbeat when it has sent nothing for
  // heartbeat_ms; a peer silent for dead_after_ms (> heartbeat_ms) is
  // declared dead and its link closed. Connecting to a parent times out
  // after dead_after_ms too.
  int heartbeat_ms = 500;
  int dead_after_ms = 5000;
  // A node reconnects to its parent after a random wait in [d/2, d],
  // d = reconnect_min_ms * 2^(attempt-1), capped at reconnect_max_ms.
  int reconnect_min_ms = 50;
  int reconnect_max_ms = 2000;
  // Largest object body a link accepts; checked before allocating.
  uint64_t max_body_bytes = uint64_t{1} << 30;
  // Per-child send queue bound: bytes of objects written or received since
  // the child joined and not yet sent to it. Above the bound a node stops
  // reading from its parent and a root's Put waits (up to put_timeout_ms,
  // then kUnavailable). A queue exceeds the bound by at most one object.
  uint64_t child_queue_bytes = uint64_t{64} << 20;
  int put_timeout_ms = 60000;
  // Memory bound of the local map: objects of the keep_versions newest
  // versions (as keys->VersionOf gives them) are kept; when an object of a
  // newer version arrives, the oldest version's objects are evicted.
  // Unversioned keys are never evicted. Beyond max_store_bytes a
  // root Put fails with kResourceExhausted and a node closes its parent
  // link with that error (and retries with backoff).
  int keep_versions = 4;
  uint64_t max_store_bytes = uint64_t{16} << 30;
  // Off by default (plaintext links); see RelayTlsOptions.
  RelayTlsOptions tls;
  // Log link failures and refusals to stderr ("refit relay <name>: ...").
  bool log_to_stderr = true;

  // For tests. A node waits this long before reading each frame from its
  // parent (an artificially slow reader).
  int test_read_delay_ms = 0;
  // Called on the endpoint's I/O thread for each new object that arrived
  // over a link, after it is stored. Must not block or call the store.
  std::function<void(const std::string& key)> on_arrival;
};

struct RelayStatus {
  bool is_root = false;
  bool tls = false;            // links use TLS (RelayOptions::tls)
  std::string listen_address;  // "127.0.0.1:port" as bound, "" if none
  bool parent_connected = false;
  int children = 0;      // children that completed their hello
  uint64_t objects = 0;  // objects in the local map
  uint64_t bytes = 0;    // their bytes
  uint64_t evicted = 0;  // objects evicted by the version window
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  uint64_t links_closed = 0;  // by error, death or peer
  uint64_t reconnects = 0;    // successful connections to a parent
  uint64_t refused = 0;       // once-only objects refused (a different copy)
  uint64_t max_child_queue_bytes = 0;  // high-water mark of any child queue
  Status last_error;                   // the most recent link or refusal error
};

class RelayStore final : public ObjectStore {
 public:
  // The root endpoint, listening on `listen` ("host:port"; port 0 picks an
  // ephemeral port, see listen_address()). Hosts are IP literals or
  // "localhost". kInvalidArgument for bad options (no keys included) or
  // addresses (TLS files that cannot be loaded included), kUnavailable when
  // the address cannot be bound.
  static Result<std::unique_ptr<RelayStore>> Root(const std::string& listen,
                                                  RelayOptions options = {});

  // A node named `member` (1..64 of [A-Za-z0-9._-]) that connects to
  // `parent` ("host:port") in the background, retrying with backoff, and
  // accepts children on `listen` ("" = a leaf that accepts none).
  static Result<std::unique_ptr<RelayStore>> Node(const std::string& member,
                                                  const std::string& parent,
                                                  const std::string& listen,
                                                  RelayOptions options = {});

  ~RelayStore() override;
  RelayStore(const RelayStore&) = delete;
  RelayStore& operator=(const RelayStore&) = delete;

  // "host:port" actually bound ("" for a leaf without a listener).
  std::string listen_address() const;
  RelayStatus status() const;
  // The most recent link failure or refusal (OK if none yet).
  Status last_error() const;

  std::string Describe() const override;
  // Root: any key; may wait for slow children (see child_queue_bytes).
  // Node: upward keys only, else kFailedPrecondition.
  Status Put(std::string_view key, std::span<const uint8_t> data) override;
  // Honoured at this endpoint: kAlreadyExists if the key is held here.
  // Only the root's answer is authoritative for the whole tree; nodes
  // refuse a different copy of a once-only object that they already hold.
  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override;
  Result<std::vector<uint8_t>> Get(std::string_view key) override;
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override;
  // Removes the local copy only; nothing is sent to other endpoints.
  Status Delete(std::string_view key) override;
  // Counts the objects stored here, by Put or arrived over a link.
  uint64_t ChangeCount() override;
  void AwaitChange(uint64_t since, int timeout_ms) override;

 private:
  class Impl;
  explicit RelayStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The tree the CLI lays out: for `members` members under one root with
// fan-out `fanout`, parents[i] is the index of member i's parent, or -1 for
// the root. Members are placed breadth-first: 0..fanout-1 under the root,
// then fanout children under member 0, and so on, so the depth is about
// log_fanout(members). kInvalidArgument if members < 0 or fanout < 1.
Result<std::vector<int>> RelayTreeParents(int members, int fanout);

}  // namespace refit

#endif  // REFIT_TRANSPORT_RELAY_STORE_H_
