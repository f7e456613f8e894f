// The distribution subcommands of `refit` (docs/protocol.md): `publish`
// (the trainer side and commit coordinator of one version), `receive` (a
// long-running receiver that follows versions and applies them in place)
// and `status` (the store's versions, decisions and votes, and receivers'
// local state), plus the options of `refit demo`'s distribution section.
//
// These commands link the internal refit_sync library (src/sync), which is
// accepted for the CLI's distribution commands; the codec commands
// (commands.h) use only the public headers. Every store is opened by URL
// through OpenObjectStore, or is one endpoint of a relay tree
// (transport/relay_store.h, docs/protocol.md "Relay tree"): `publish
// --relay-listen` makes the publisher's store the tree's root (written
// through to a durable --store when one is given: RelayRootStore,
// sync/relay_tree.h), `receive --relay-parent` makes the receiver's store
// a node.
//
// Exit codes: cli_util.h's map, plus kExitAborted (8) for a version that
// was decided abort. Nothing here is thread-safe.
#ifndef REFIT_TOOLS_REFIT_SYNC_COMMANDS_H_
#define REFIT_TOOLS_REFIT_SYNC_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "refit/auth.h"
#include "refit/store.h"
#include "sync/relay_tree.h"
#include "sync/state_dir.h"
#include "transport/relay_store.h"

namespace refit::cli {

// `refit publish` decided abort (distinct from every error code).
inline constexpr int kExitAborted = 8;

struct PublishArgs {
  std::string store;  // with relay_listen: the durable write-through copy
  std::string relay_listen;   // non-empty: publish as a relay tree's root
  uint64_t base_version = 0;  // relay without --store: what baseline holds
  RelayTlsOptions relay_tls;  // --relay-tls-*: TLS on the root's links
  std::string baseline;       // the publisher's copy of the committed version
  std::vector<std::string> members;
  uint64_t version = 0;
  std::string target;
  std::string key_file;  // empty: unauthenticated (scheme 0)
  std::string sign_key;  // Ed25519 private key: sign publisher objects
  int vote_timeout_ms = 60000;
  std::string policy = "abort";  // or "drop"
  double chunk_mib = 8;
  int threads = 0;
  int upload_threads = 4;
  uint64_t pack_bytes = 0;  // PublisherOptions::pack_bytes
  int serve_ms = 0;
  int poll_ms = 10;
  uint64_t snapshot_every = 0;  // full snapshot every N committed versions
  uint64_t keep_versions = 0;   // retention: the K newest versions (0 = all)
  // Versions may carry conditional XOR chunks (kind 5), which CPU
  // receivers apply and GPU receivers refuse.
  bool conditional = false;
  bool json = false;
};
int RunPublish(const PublishArgs& args);

struct ReceiveArgs {
  std::string store;                // exclusive with relay_parent
  std::string relay_parent;         // non-empty: this store is a relay node
  std::string relay_listen;         // where its children connect ("" = a leaf)
  int relay_parent_timeout_ms = 0;  // give up on a dead parent; 0 = never
  int relay_linger_ms = 10000;      // after --until: serve the children
  RelayTlsOptions relay_tls;        // --relay-tls-*: TLS on the node's links
  std::string member;
  std::string checkpoint;
  std::string state;
  std::string key_file;
  std::string verify_key;  // Ed25519 public key: require signed objects
  int64_t until = -1;  // -1: run until stopped
  bool once = false;
  int poll_ms = 50;
  int decision_timeout_ms = 60000;
  int resend_timeout_ms = 30000;
  int max_fold_versions = 16;  // catch-up by folding; 1 = one by one
  int threads = 0;
  bool json = false;
};
int RunReceive(const ReceiveArgs& args);

struct StatusArgs {
  std::string store;
  std::string key_file;
  std::string verify_key;
  std::vector<std::string> states;
  int recent = 10;  // versions listed, newest first
  bool json = false;
};
int RunSyncStatus(const StatusArgs& args);

// `refit demo`'s distribution section (demo.cc); the trajectory options
// stay in DemoArgs.
struct SyncDemoArgs {
  bool codec_only = false;  // only the codec table (the old `refit demo`)
  int receivers = 4;        // receiver processes
  std::string store;        // empty: a directory in the scratch dir
  std::string transport = "relay";  // relay: a tree on loopback; dir
  int fanout = 2;                   // of the relay tree
  double link_gbit = 1.0;  // link speed for the computed transfer times
  int crash_version = -1;  // -1: the middle version; 0: no crash
  // "chunks:N": the demo SIGKILLs the receiver once its journal records N
  // applied chunks of the version (any build); otherwise a crash point
  // (REFIT_CRASH_AT, builds other than Release).
  std::string crash_at = "chunks:3";
  double chunk_mib = 1;
  // The section at scale: a synthetic model of this many MiB (0: none),
  // one RL step, to this many receivers holding their weights in memory.
  double scale_mib = 2048;
  int scale_receivers = 1;
};
int RunSyncDemo(const DemoArgs& demo, const SyncDemoArgs& sync);

// Command-line plumbing for main.cc: registers publish, receive and status
// on `app` (binding to `args`) and the distribution options on `demo`.
// `refit keygen PRIVATE PUBLIC`: a fresh Ed25519 key pair as PEM files
// (--sign-key and --verify-key; docs/protocol.md, "Signatures").
struct KeygenArgs {
  std::string private_key;
  std::string public_key;
  bool json = false;
};
int RunKeygen(const KeygenArgs& args);

// `refit snapshot`: stores a snapshot of a checkpoint receiver's active
// version from its own files (Receiver::WriteSnapshot; docs/protocol.md,
// "Snapshots and retention"), for versions no publisher holds the model
// of (published by many ranks). Run it while no `refit receive` steps the
// same state directory.
struct SnapshotArgs {
  std::string store;
  std::string member = "snapshot";  // names the receiver in messages only
  std::string checkpoint;
  std::string state;
  std::string key_file;
  std::string verify_key;
  bool json = false;
};
int RunSnapshot(const SnapshotArgs& args);

struct SyncCommandArgs {
  PublishArgs publish;
  SnapshotArgs snapshot;
  CLI::App* snapshot_cmd = nullptr;
  ReceiveArgs receive;
  StatusArgs status;
  KeygenArgs keygen;
  CLI::App* keygen_cmd = nullptr;
  SyncDemoArgs demo;
  CLI::App* publish_cmd = nullptr;
  CLI::App* receive_cmd = nullptr;
  CLI::App* status_cmd = nullptr;
};
void RegisterSyncCommands(CLI::App* app, SyncCommandArgs* args);
void RegisterSyncDemoOptions(CLI::App* demo_cmd, DemoArgs* demo,
                             SyncDemoArgs* sync);
// The exit code of the distribution subcommand that was parsed, or nullopt
// when another one was.
std::optional<int> RunSyncCommand(SyncCommandArgs* args, bool global_json);

}  // namespace refit::cli

#endif  // REFIT_TOOLS_REFIT_SYNC_COMMANDS_H_
