// The distribution commands' options and `refit keygen`; the commands
// themselves are publish_command.cc, receive_command.cc and
// status_command.cc. See sync_commands.h.
#include "sync_commands.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include "base/file.h"
#include "cli_util.h"
#include "flag_checks.h"
#include "refit/auth.h"
#include "refit/checkpoint.h"
#include "refit/store.h"
#include "sync/follow.h"
#include "sync/journal.h"
#include "sync/object_reader.h"
#include "sync/protocol.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "sync_common.h"
#include "transport/relay_store.h"

namespace refit::cli {

// ---------------------------------------------------------------- CLI

namespace {

// Version numbers are u64: refuses what the conversion would wrap or cut
// ("-1" would otherwise be stored as 2^64 - 1).
CLI::Validator VersionNumber() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const char* end = text.data() + text.size();
        auto [p, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || ec != std::errc() || p != end) {
          return fmt::format(
              "'{}' is not a version number: give a whole number from 0 to {}",
              text, UINT64_MAX);
        }
        return std::string();
      },
      "VERSION");
}

}  // namespace

void RegisterSyncCommands(CLI::App* app, SyncCommandArgs* args) {
  auto add_json = [](CLI::App* cmd, bool* json) {
    cmd->add_flag("--json", *json, "print JSON on stdout instead of text");
  };
  auto add_relay_tls = [](CLI::App* cmd, RelayTlsOptions* tls, bool node) {
    cmd->add_option("--relay-tls-cert", tls->cert_file,
                    "relay links use TLS 1.3 (mutual): this endpoint's "
                    "certificate chain (PEM, leaf first), presented to its "
                    "children and, on a node, to its parent. Needs "
                    "--relay-tls-key and --relay-tls-ca; then plaintext peers "
                    "are refused");
    cmd->add_option("--relay-tls-key", tls->key_file,
                    "the private key (PEM) of --relay-tls-cert");
    cmd->add_option("--relay-tls-ca", tls->ca_file,
                    "CA certificate(s) (PEM) that every peer's certificate "
                    "must lead to (the tree's own CA)");
    if (node) {
      cmd->add_option("--relay-tls-parent-name", tls->parent_name,
                      "also require the parent's certificate to carry this "
                      "name (a DNS or IP subjectAltName); default: any "
                      "certificate from the CA");
    }
    cmd->add_flag("--relay-tls-member-names", tls->child_names_are_members,
                  "refuse a child whose certificate does not name the "
                  "member it says hello as (DNS subjectAltName or CN)");
  };
  auto add_key = [](CLI::App* cmd, std::string* key) {
    cmd->add_option("--key-file", *key,
                    "shared HMAC key (raw bytes, or hex on one line; at least "
                    "16 bytes); every node of a store needs the same key, or "
                    "none");
  };

  PublishArgs& p = args->publish;
  CLI::App* pub = app->add_subcommand(
      "publish",
      "Publish TARGET as version V to the store and coordinate its joint "
      "commit: upload the changed chunks, wait for every member's vote (up "
      "to the vote deadline), write the one decision. Re-running the same "
      "command after a crash resumes the version and follows any decision "
      "already made.");
  args->publish_cmd = pub;
  pub->add_option("--store", p.store,
                  std::string(kStoreOptionHelp) +
                      "; with --relay-listen, the durable copy every object "
                      "is also written to (and the new root is seeded from)");
  pub->add_option("--relay-listen", p.relay_listen,
                  "HOST:PORT: publish as the root of a relay tree listening "
                  "there (receivers use --relay-parent). The root lives in "
                  "this process only: publish serves the tree until every "
                  "member finished the version, at most --serve-ms (default "
                  "then: --vote-timeout-ms)");
  add_relay_tls(pub, &p.relay_tls, /*node=*/false);
  pub->add_option("--base-version", p.base_version,
                  "--relay-listen without --store only: the committed "
                  "version --baseline holds (a bare root records none)")
      ->capture_default_str()
      ->check(VersionNumber());
  pub->add_option("--baseline", p.baseline,
                  "the publisher's own copy of the committed version; "
                  "advanced in place on commit")
      ->required();
  pub->add_option("--members", p.members,
                  "receiver names, comma-separated (r0,r1,...)")
      ->required()
      ->delimiter(',');
  pub->add_option("--version", p.version,
                  "the version to publish (above the store's head; re-running "
                  "a decided version with the same TARGET reports its "
                  "decision, other weights are refused)")
      ->required()
      ->check(VersionNumber());
  pub->add_option("TARGET", p.target, "the new checkpoint (file or directory)")
      ->required();
  add_key(pub, &p.key_file);
  pub->add_option("--sign-key", p.sign_key,
                  "Ed25519 private key (PEM, e.g. from `openssl genpkey "
                  "-algorithm ed25519`): sign every object the publisher "
                  "writes; receivers check them with --verify-key");
  pub->add_option("--snapshot-every", p.snapshot_every,
                  "store a full snapshot every N committed versions (and of "
                  "version 0), for receivers that are new or fall behind the "
                  "retention window; 0 = never")
      ->capture_default_str();
  pub->add_option("--keep-versions", p.keep_versions,
                  "keep the objects of the K newest versions and delete older "
                  "ones after each commit (never past the newest snapshot); "
                  "0 = keep all")
      ->capture_default_str();
  pub->add_option("--vote-timeout-ms", p.vote_timeout_ms,
                  "how long to wait for votes")
      ->capture_default_str();
  pub->add_option("--policy", p.policy,
                  "when a member misses the deadline: abort the version, or "
                  "drop the member and commit with the others")
      ->capture_default_str()
      ->check(CLI::IsMember(
          {std::string(DeadlinePolicyName(DeadlinePolicy::kAbort)),
           std::string(DeadlinePolicyName(DeadlinePolicy::kDrop))}));
  pub->add_option("--chunk-mib", p.chunk_mib,
                  "bytes of a tensor per chunk, in MiB (a multiple of 64 KiB)")
      ->capture_default_str();
  pub->add_flag("--conditional", p.conditional,
                "also code changes given the base (conditional XOR chunks, kind 5) "
                "where smaller; every receiver must apply on the CPU (GPU "
                "receivers refuse such versions)");
  pub->add_option("-j,--threads", p.threads, "encoder threads; 0 = all cores")
      ->capture_default_str()
      ->check(IntIn(0, kMaxThreads));
  pub->add_option("--upload-threads", p.upload_threads,
                  "concurrent chunk uploads")
      ->capture_default_str()
      ->check(IntIn(1, 256));
  pub->add_option("--pack-bytes", p.pack_bytes,
                  "store consecutive chunks smaller than this together, one object of at "
                  "most this many bytes (docs/protocol.md, \"Chunk packs\"); 0 = one object "
                  "per chunk. For checkpoints of many small tensors")
      ->capture_default_str();
  pub->add_option("--serve-ms", p.serve_ms,
                  "after the decision, keep serving re-send requests this "
                  "long; with --relay-listen, the most to wait for members")
      ->capture_default_str();
  pub->add_option("--poll-ms", p.poll_ms, "how often to look for votes")
      ->capture_default_str();
  add_json(pub, &p.json);
  pub->footer(fmt::format(
      "Exit codes: 0 committed (also with dropped members), {} aborted (a "
      "member failed or missed the deadline with --policy abort); other "
      "codes as in `refit --help`.\nExample: refit publish --store "
      "/shared/run7 "
      "--baseline pub/model.safetensors --members r0,r1 --version 1 "
      "step1.safetensors\nRelay tree: refit publish --relay-listen "
      "0.0.0.0:7070 --store /shared/run7 ... (receivers: refit receive "
      "--relay-parent trainer:7070 ...). Objects flow only while a publish "
      "runs; with --store a later publish seeds its root from the store, "
      "so the tree resumes where it was.",
      kExitAborted));

  ReceiveArgs& r = args->receive;
  CLI::App* rcv = app->add_subcommand(
      "receive",
      "Follow the versions published to the store: apply each in place to "
      "CHECKPOINT (at most once per chunk, journaled), vote, and activate it "
      "after the joint commit. Runs until stopped (SIGTERM/SIGINT stop it "
      "within a second, also while it waits for chunks or a decision, its "
      "work journaled; a second signal exits at once, safely), until "
      "--until, or after one version with --once. A version it cannot apply "
      "(announced on another base, a chunk changed in the store) is voted "
      "failed, rolled back once aborted, and the next version followed.");
  args->receive_cmd = rcv;
  rcv->add_option("--store", r.store, kStoreOptionHelp);
  rcv->add_option("--relay-parent", r.relay_parent,
                  "HOST:PORT of the parent in a relay tree (publish's "
                  "--relay-listen, or another receiver's); instead of "
                  "--store. Reconnects with backoff while it is down");
  rcv->add_option("--relay-listen", r.relay_listen,
                  "HOST:PORT where this node's children connect (port 0: "
                  "any, printed at start); none: a leaf");
  add_relay_tls(rcv, &r.relay_tls, /*node=*/true);
  rcv->add_option("--relay-parent-timeout-ms", r.relay_parent_timeout_ms,
                  "exit (code of UNAVAILABLE) after the parent was "
                  "unreachable this long; 0 = keep retrying (it is reported "
                  "after 5 s either way)")
      ->capture_default_str();
  rcv->add_option("--relay-linger-ms", r.relay_linger_ms,
                  "on --until/--once, keep forwarding to children until "
                  "none is connected, at most this long")
      ->capture_default_str();
  rcv->add_option("--member", r.member, "this receiver's name")->required();
  rcv->add_option("--checkpoint", r.checkpoint,
                  "the checkpoint to keep in sync, patched in place")
      ->required();
  rcv->add_option("--state", r.state,
                  "state directory: active version, journal, last_error "
                  "(created if absent)")
      ->required();
  add_key(rcv, &r.key_file);
  rcv->add_option("--verify-key", r.verify_key,
                  "the publisher's Ed25519 public key (PEM, `openssl pkey "
                  "-pubout`): accept only objects it signed");
  rcv->add_option("--max-fold-versions", r.max_fold_versions,
                  "a receiver several committed versions behind applies up to "
                  "this many in one pass and activates the last (never past "
                  "--until); 1 = one by one")
      ->capture_default_str();
  rcv->add_option("--until", r.until,
                  "exit 0 once the active version is at least this");
  rcv->add_flag("--once", r.once, "exit after handling one version");
  rcv->add_option("--poll-ms", r.poll_ms, "how often to look for versions")
      ->capture_default_str();
  rcv->add_option("--decision-timeout-ms", r.decision_timeout_ms,
                  "how long one step waits for a decision after voting "
                  "(then it retries; the work is journaled)")
      ->capture_default_str();
  rcv->add_option("--resend-timeout-ms", r.resend_timeout_ms,
                  "how long one step waits for re-sends of torn chunks")
      ->capture_default_str();
  rcv->add_option("-j,--threads", r.threads, "worker threads; 0 = all cores")
      ->capture_default_str()
      ->check(IntIn(0, kMaxThreads));
  rcv->add_flag("--json", r.json,
                "print one JSON object per line (events: start, version, "
                "error, exit)");
  rcv->footer(
      "Transient failures (unavailable store, no decision in time) are "
      "retried with backoff and recorded in STATE/last_error; others exit "
      "with the codes of `refit --help`.");

  StatusArgs& st = args->status;
  KeygenArgs& k = args->keygen;
  CLI::App* kg = app->add_subcommand(
      "keygen",
      "Write a fresh Ed25519 key pair as PEM files: PRIVATE (mode 0600) for "
      "`publish --sign-key`, PUBLIC for `receive --verify-key`. Existing files "
      "are never overwritten.");
  args->keygen_cmd = kg;
  kg->add_option("PRIVATE", k.private_key, "private key file to create")->required();
  kg->add_option("PUBLIC", k.public_key, "public key file to create")->required();
  add_json(kg, &k.json);

  SnapshotArgs& sn = args->snapshot;
  CLI::App* snp = app->add_subcommand(
      "snapshot",
      "Store a snapshot of a checkpoint receiver's active (committed) version "
      "from its own files, after checking every tensor against the version's "
      "recorded hashes; for receivers that catch up from it. Run it while no "
      "`refit receive` uses the same --state.");
  args->snapshot_cmd = snp;
  snp->add_option("--store", sn.store, kStoreOptionHelp)->required();
  snp->add_option("--checkpoint", sn.checkpoint, "the receiver's checkpoint")->required();
  snp->add_option("--state", sn.state, "the receiver's state directory")->required();
  snp->add_option("--member", sn.member, "the receiver's name, for messages")
      ->capture_default_str();
  add_key(snp, &sn.key_file);
  snp->add_option("--verify-key", sn.verify_key,
                  "the publisher's Ed25519 public key, when it signs");
  add_json(snp, &sn.json);

  CLI::App* sts = app->add_subcommand(
      "status",
      "Show the store's head, recent versions with their decision and each "
      "member's vote, and for each --state directory the receiver's active "
      "version, lag and any interrupted version.");
  args->status_cmd = sts;
  sts->add_option("--store", st.store, kStoreOptionHelp)->required();
  add_key(sts, &st.key_file);
  sts->add_option("--verify-key", st.verify_key,
                  "the publisher's Ed25519 public key, when it signs");
  sts->add_option("--state", st.states,
                  "a receiver's state directory (repeatable)");
  sts->add_option("--recent", st.recent, "how many versions to list")
      ->capture_default_str();
  add_json(sts, &st.json);
}

void RegisterSyncDemoOptions(CLI::App* demo_cmd, DemoArgs* demo,
                             SyncDemoArgs* sync) {
  demo_cmd->add_option("--versions", demo->steps,
                       "synthetic versions (same as --steps)");
  demo_cmd->add_flag("--codec-only", sync->codec_only,
                     "only the codec table: no store, no receivers");
  demo_cmd
      ->add_option("--receivers", sync->receivers,
                   "receiver processes in the distribution section")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  demo_cmd->add_option("--store", sync->store,
                       "the distribution section's " +
                           std::string(kStoreOptionHelp) +
                           " (must be "
                       "empty); default: a directory in the scratch dir. "
                       "With --transport relay every object is written "
                       "through to it");
  demo_cmd
      ->add_option("--transport", sync->transport,
                   "relay: receivers form a relay tree on 127.0.0.1 under "
                   "this process (the root); dir: they read the store")
      ->capture_default_str()
      ->check(CLI::IsMember({"relay", "dir"}));
  demo_cmd
      ->add_option("--fanout", sync->fanout,
                   "children per endpoint of the relay tree")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  demo_cmd
      ->add_option("--link-gbit", sync->link_gbit,
                   "link speed in Gbit/s for the computed transfer times")
      ->capture_default_str()
      ->check(NumberAbove(0, 1e6));
  demo_cmd
      ->add_option("--crash-version", sync->crash_version,
                   "the version in which one receiver is killed and "
                   "restarted; -1 = the middle one, 0 = none")
      ->capture_default_str();
  demo_cmd
      ->add_option("--crash-at", sync->crash_at,
                   "where it dies: chunks:N for a SIGKILL from the demo once "
                   "its journal records N applied chunks of the version (the "
                   "upload of the rest waits until then), or a crash point "
                   "(REFIT_CRASH_AT=name[:n], not in Release builds)")
      ->capture_default_str();
  demo_cmd
      ->add_option("--chunk-mib", sync->chunk_mib,
                   "chunk size of the versions of the distribution section, "
                   "in MiB (the section at scale uses the library's 8 MiB)")
      ->capture_default_str();
  demo_cmd
      ->add_option("--scale-mib", sync->scale_mib,
                   "size of the synthetic model of the section at scale, in "
                   "MiB (0: skip that section); one RL step at --rate")
      ->capture_default_str()
      ->check(NumberIn(0, 1e6));
  demo_cmd
      ->add_option("--scale-receivers", sync->scale_receivers,
                   "receivers of the section at scale (each holds a copy of "
                   "the model in memory)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
}

int RunKeygen(const KeygenArgs& args) {
  constexpr std::string_view kCmd = "keygen";
  if (args.private_key == args.public_key) {
    return Fail(kCmd, InvalidArgumentError("PRIVATE and PUBLIC must be two files"),
                args.json);
  }
  if (Status s = Authenticator::WriteEd25519KeyFiles(args.private_key, args.public_key);
      !s.ok()) {
    return Fail(kCmd, s, args.json,
                "choose new file names");
  }
  if (args.json) {
    PrintJson(Json{{"ok", true},
                   {"command", "keygen"},
                   {"private_key", args.private_key},
                   {"public_key", args.public_key}});
  } else {
    fmt::print("refit keygen: Ed25519 signing key {} (mode 0600: keep it with the "
               "publisher, --sign-key), public key {} (for receivers, --verify-key)\n",
               args.private_key, args.public_key);
  }
  return kExitOk;
}

int RunSnapshot(const SnapshotArgs& args) {
  constexpr std::string_view kCmd = "snapshot";
  auto fail = [&](const Status& s) { return Fail(kCmd, s, args.json); };
  Result<Authenticator> auth = LoadAuth(args.key_file, "", args.verify_key);
  if (!auth.ok()) return fail(auth.status());
  StoreOptions existing;
  existing.create_if_missing = false;
  Result<std::unique_ptr<ObjectStore>> store = OpenObjectStore(args.store, existing);
  if (!store.ok()) return fail(store.status());
  ReceiverOptions o;
  o.member = args.member;
  o.checkpoint = args.checkpoint;
  o.state_dir = args.state;
  o.auth = *auth;
  Result<std::unique_ptr<Receiver>> r = Receiver::Open(store->get(), o);
  if (!r.ok()) return fail(r.status());
  const uint64_t version = (*r)->active_version();
  Result<bool> wrote = (*r)->WriteSnapshot();
  if (!wrote.ok()) return fail(wrote.status());
  if (args.json) {
    PrintJson(Json{{"ok", true},
                   {"command", "snapshot"},
                   {"version", version},
                   {"written", *wrote}});
  } else if (*wrote) {
    fmt::print("refit snapshot: stored the snapshot of version {} from {}\n", version,
               args.checkpoint);
  } else {
    fmt::print("refit snapshot: the store holds the snapshot of version {} already\n",
               version);
  }
  return kExitOk;
}

std::optional<int> RunSyncCommand(SyncCommandArgs* args, bool global_json) {
  if (args->snapshot_cmd && *args->snapshot_cmd) {
    args->snapshot.json |= global_json;
    return RunSnapshot(args->snapshot);
  }
  if (args->keygen_cmd && *args->keygen_cmd) {
    args->keygen.json |= global_json;
    return RunKeygen(args->keygen);
  }
  if (args->publish_cmd && *args->publish_cmd) {
    args->publish.json |= global_json;
    return RunPublish(args->publish);
  }
  if (args->receive_cmd && *args->receive_cmd) {
    args->receive.json |= global_json;
    return RunReceive(args->receive);
  }
  if (args->status_cmd && *args->status_cmd) {
    args->status.json |= global_json;
    return RunSyncStatus(args->status);
  }
  return std::nullopt;
}

}  // namespace refit::cli
