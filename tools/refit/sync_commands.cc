// `refit publish`, `refit receive` and `refit status`: the version protocol
// of docs/protocol.md on the command line. See sync_commands.h.
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
#include "refit/checkpoint.h"
#include "sync/auth.h"
#include "sync/journal.h"
#include "sync/object_reader.h"
#include "sync/protocol.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "transport/object_store.h"
#include "transport/relay_store.h"

namespace refit::cli {

namespace {

namespace fs = std::filesystem;

// The shared HMAC key (--key-file), plus the publisher's Ed25519 signing
// key (--sign-key) or its public key (--verify-key).
Result<Authenticator> LoadAuth(const std::string& key_file,
                               const std::string& sign_key = "",
                               const std::string& verify_key = "") {
  Authenticator auth = Authenticator::None();
  if (!key_file.empty()) {
    REFIT_RETURN_IF_ERROR(CheckExists(key_file, "--key-file"));
    REFIT_ASSIGN_OR_RETURN(auth, Authenticator::FromKeyFile(key_file));
  }
  if (!sign_key.empty()) {
    REFIT_RETURN_IF_ERROR(CheckExists(sign_key, "--sign-key"));
    REFIT_ASSIGN_OR_RETURN(auth, auth.WithSigningKeyFile(sign_key));
  }
  if (!verify_key.empty()) {
    REFIT_RETURN_IF_ERROR(CheckExists(verify_key, "--verify-key"));
    REFIT_ASSIGN_OR_RETURN(auth, auth.WithVerifyKeyFile(verify_key));
  }
  return auth;
}

Result<uint64_t> ChunkBytes(double chunk_mib) {
  if (!(chunk_mib > 0) || chunk_mib > 1024 * 1024) {
    return InvalidArgumentError(
        fmt::format("--chunk-mib {} is out of range", chunk_mib));
  }
  return static_cast<uint64_t>(std::llround(chunk_mib * (1 << 20)));
}

// One compact JSON object per line (JSON Lines), flushed at once so a
// reader following the output (or a crash right after) sees whole lines.
void PrintJsonLine(const Json& j) {
  // One fwrite per line: the relay watcher thread prints lines too.
  std::string text =
      j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

std::string UtcNow() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ---------------------------------------------------------------- publish

Json PublishJson(const PublishArgs& args, const PublishReport& r,
                 bool already_decided, uint64_t resend_objects) {
  Json j;
  j["ok"] = r.committed;
  j["command"] = "publish";
  j["version"] = r.version;
  j["base_version"] = r.base_version;
  j["members"] = args.members;
  j["decision"] = r.committed ? "commit" : "abort";
  j["committed"] = r.committed;
  j["dropped"] = r.dropped;
  j["reason"] = r.reason;
  j["already_decided"] = already_decided;
  j["total_elements"] = r.diff.total_elements;
  j["changed_elements"] = r.diff.changed_elements;
  j["changed_fraction"] = r.diff.total_elements == 0
                              ? 0.0
                              : static_cast<double>(r.diff.changed_elements) /
                                    static_cast<double>(r.diff.total_elements);
  j["chunks"] = r.diff.chunks;
  j["chunks_by_kind"] = r.diff.chunks_by_kind;
  j["payload_bytes"] = r.bytes_uploaded;
  j["full_bytes"] = r.diff.full_bytes;
  j["encode_upload_seconds"] = r.encode_upload_seconds;
  j["commit_seconds"] = r.commit_seconds;
  j["seconds"] = r.seconds;
  j["resends_served"] = r.resends_served;
  j["resend_objects"] = resend_objects;
  return j;
}

void PrintPublishText(const PublishArgs& args, const std::string& where,
                      const PublishReport& r, bool already_decided,
                      uint64_t resend_objects) {
  fmt::print("refit publish: version {} (base {}) to {} member(s) through {}\n",
             r.version, r.base_version, args.members.size(), where);
  if (already_decided) {
    fmt::print(
        "  resumed: version {} was already decided by an earlier run; "
        "following that decision\n",
        r.version);
  } else {
    double rate = r.diff.total_elements == 0
                      ? 0.0
                      : static_cast<double>(r.diff.changed_elements) /
                            static_cast<double>(r.diff.total_elements);
    fmt::print("  changed       {} of {} elements ({} chunks: {})\n",
               Percent(rate), WithCommas(r.diff.total_elements), r.diff.chunks,
               KindsString(r.diff.chunks_by_kind));
    fmt::print("  payload       {} uploaded vs {} full ({} smaller)\n",
               HumanBytes(static_cast<double>(r.bytes_uploaded)),
               HumanBytes(static_cast<double>(r.diff.full_bytes)),
               Ratio(static_cast<double>(r.diff.full_bytes),
                     static_cast<double>(r.bytes_uploaded)));
    fmt::print("  encode+upload {}\n", HumanSeconds(r.encode_upload_seconds));
    fmt::print("  commit        {} (votes, re-sends, decision)\n",
               HumanSeconds(r.commit_seconds));
  }
  std::string decision;
  if (!r.committed) {
    decision = fmt::format("ABORTED ({})", r.reason);
  } else if (!r.dropped.empty()) {
    std::string names;
    for (const std::string& d : r.dropped)
      names += (names.empty() ? "" : ",") + d;
    decision = fmt::format("committed, dropped {} ({}); they catch up later",
                           names, r.reason);
  } else {
    decision = "committed by every member";
  }
  fmt::print("  decision      {}\n", decision);
  fmt::print(
      "  re-sends      {} served while voting, {} re-send object(s) "
      "stored in all\n",
      r.resends_served, resend_objects);
  fmt::print("  total         {}\n", HumanSeconds(r.seconds));
}

// The root of `publish --relay-listen`: seeded from the durable store when
// there is one; otherwise it starts empty, and its head is the committed
// version the caller says the baseline holds.
Result<std::unique_ptr<RelayRootStore>> OpenRelayRoot(
    const std::string& listen, const std::string& durable_url,
    const Authenticator& auth, uint64_t base_version,
    const RelayTlsOptions& tls) {
  RelayOptions options;
  options.tls = tls;
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<RelayRootStore> relay,
                         RelayRootStore::Open(listen, durable_url, options));
  if (relay->durable() != nullptr) {
    REFIT_RETURN_IF_ERROR(relay->Seed(options.keep_versions)
                              .WithContext("seeding the relay root from " +
                                           relay->durable()->Describe()));
  } else {
    REFIT_RETURN_IF_ERROR(
        relay->Put(kHeadKey, auth.Seal(EncodeHead(base_version))));
  }
  return relay;
}

struct TreeWait {
  std::vector<std::string> done;     // members that reported the version
  std::vector<std::string> missing;  // not by the deadline (dropped excepted)
  double seconds = 0;
};

// Serves re-sends and the tree until every member not in `dropped` put its
// DoneKey for `version` (sealed with the store's key), at most
// `wait_ms`.
Result<TreeWait> WaitForTree(RelayRootStore* relay, Publisher* publisher,
                             const Authenticator& auth, uint64_t version,
                             const std::vector<std::string>& members,
                             const std::vector<std::string>& dropped,
                             int wait_ms) {
  Stopwatch clock;
  TreeWait w;
  std::vector<std::string> waiting;
  for (const std::string& m : members) {
    if (std::find(dropped.begin(), dropped.end(), m) == dropped.end()) {
      waiting.push_back(m);
    }
  }
  for (;;) {
    for (auto it = waiting.begin(); it != waiting.end();) {
      Result<std::vector<uint8_t>> b =
          relay->root()->Get(DoneKey(version, *it));
      if (b.ok() && auth.OpenMember(*b).ok()) {
        w.done.push_back(*it);
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
    if (waiting.empty() || clock.Seconds() * 1000 >= wait_ms) break;
    REFIT_RETURN_IF_ERROR(publisher->Serve(version, 20));
  }
  w.missing = waiting;
  w.seconds = clock.Seconds();
  return w;
}

Json TreeJson(const RelayRootStore& relay, const TreeWait& w) {
  RelayStatus st = relay.root()->status();
  return {{"listen", st.listen_address},
          {"tls", st.tls},
          {"durable", relay.durable() ? relay.durable()->Describe() : ""},
          {"children", st.children},
          {"members_done", w.done},
          {"members_missing", w.missing},
          {"wait_seconds", w.seconds},
          {"last_error", st.last_error.ok() ? "" : st.last_error.ToString()}};
}

void PrintTreeText(const RelayRootStore& relay, const TreeWait& w) {
  RelayStatus st = relay.root()->status();
  std::string missing;
  for (const std::string& m : w.missing) {
    missing += (missing.empty() ? "" : ",") + m;
  }
  fmt::print(
      "  relay tree    root {}, {} child link(s); {} member(s) done in {}{}\n",
      st.listen_address, st.children, w.done.size(), HumanSeconds(w.seconds),
      missing.empty()
          ? ""
          : fmt::format("; NOT CONFIRMED by the deadline: {} (they "
                        "catch up from the next root{})",
                        missing, relay.durable() ? "" : " only with --store"));
}

}  // namespace

int RunPublish(const PublishArgs& args) {
  constexpr std::string_view kCmd = "publish";
  auto fail = [&](const Status& s) { return Fail(kCmd, s, args.json); };
  if (args.version == 0) {
    return fail(InvalidArgumentError("--version must be at least 1"));
  }
  if (args.policy != "abort" && args.policy != "drop") {
    return fail(InvalidArgumentError(
        fmt::format("--policy '{}': use abort or drop", args.policy)));
  }
  if (args.vote_timeout_ms < 0 || args.serve_ms < 0) {
    return fail(InvalidArgumentError("timeouts must not be negative"));
  }
  Result<uint64_t> chunk_bytes = ChunkBytes(args.chunk_mib);
  if (!chunk_bytes.ok()) return fail(chunk_bytes.status());
  if (Status s = CheckExists(args.baseline, "--baseline"); !s.ok())
    return fail(s);
  if (Status s = CheckExists(args.target, "TARGET"); !s.ok()) return fail(s);
  Result<Authenticator> auth = LoadAuth(args.key_file, args.sign_key);
  if (!auth.ok()) return fail(auth.status());
  if (args.store.empty() && args.relay_listen.empty()) {
    return fail(InvalidArgumentError("give --store, --relay-listen, or both"));
  }
  const RelayTlsOptions& tls = args.relay_tls;
  if ((tls.enabled() || tls.child_names_are_members) &&
      args.relay_listen.empty()) {
    return fail(InvalidArgumentError("--relay-tls-* need --relay-listen"));
  }
  if (args.base_version != 0 &&
      (args.relay_listen.empty() || !args.store.empty())) {
    return fail(InvalidArgumentError(
        "--base-version is for --relay-listen without --store only (a "
        "store records the committed version itself)"));
  }
  Result<std::unique_ptr<ObjectStore>> store = InternalError("not opened");
  RelayRootStore* relay = nullptr;
  if (args.relay_listen.empty()) {
    store = OpenObjectStore(args.store);
  } else {
    Result<std::unique_ptr<RelayRootStore>> r = OpenRelayRoot(
        args.relay_listen, args.store, *auth, args.base_version, tls);
    if (!r.ok()) return fail(r.status());
    relay = r->get();
    store = std::unique_ptr<ObjectStore>(std::move(*r));
  }
  if (!store.ok()) return fail(store.status());

  PublisherOptions options;
  options.members = args.members;
  options.auth = *auth;
  options.diff.chunk_bytes = *chunk_bytes;
  options.diff.threads = args.threads;
  options.vote_timeout_ms = args.vote_timeout_ms;
  options.policy =
      args.policy == "drop" ? DeadlinePolicy::kDrop : DeadlinePolicy::kAbort;
  options.upload_threads = std::max(1, args.upload_threads);
  options.poll_ms = std::max(1, args.poll_ms);
  options.snapshot_every = args.snapshot_every;
  options.keep_versions = args.keep_versions;
  Result<std::unique_ptr<Publisher>> publisher =
      Publisher::Open(store->get(), args.baseline, options);
  if (!publisher.ok()) return fail(publisher.status());

  PublishReport report;
  bool already_decided = false;
  if (args.version <= (*publisher)->committed_version()) {
    // Re-running a publish that completed (head moved past it) reports the
    // decision on record, but only for the weights that version holds: a
    // version number is used once.
    Result<Checkpoint> target =
        Checkpoint::Open(args.target, Checkpoint::Mode::kReadOnly);
    if (!target.ok()) return fail(target.status());
    if (Status s = (*publisher)->CheckPublished(args.version,
                                                CheckpointViews(*target));
        !s.ok()) {
      return fail(s);
    }
    const ObjectReader reader(store->get(), *auth);
    ObjectReader::Step step = ObjectReader::Step::kFetch;
    Result<std::optional<Decision>> d =
        reader.ReadDecision(args.version, &step);
    if (d.ok() ? !d->has_value() : step == ObjectReader::Step::kFetch) {
      return fail(InvalidArgumentError(fmt::format(
          "version {} is not above the committed version {} and has no "
          "decision; publish a higher version",
          args.version, (*publisher)->committed_version())));
    }
    if (!d.ok()) return fail(d.status());
    already_decided = true;
    report.version = args.version;
    if (auto a = reader.ReadAnnouncement(args.version); a.ok()) {
      report.base_version = a->base_version;
    }
    report.committed = (*d)->commit;
    report.dropped = (*d)->dropped;
    report.reason = (*d)->reason;
  } else {
    Result<PublishReport> r =
        (*publisher)->PublishCheckpoint(args.version, args.target);
    if (!r.ok()) {
      return fail(r.status().WithContext(
          fmt::format("publishing version {}", args.version)));
    }
    report = *r;
    // Publish() reports no encoding when it followed an earlier decision.
    already_decided = report.diff.tensors == 0;
  }
  std::optional<TreeWait> tree;
  if (relay != nullptr) {
    // Objects flow only while this process (the root) lives: serve until
    // every member has finished the version, or the deadline.
    int wait_ms = args.serve_ms > 0 ? args.serve_ms : args.vote_timeout_ms;
    Result<TreeWait> w =
        WaitForTree(relay, publisher->get(), *auth, args.version, args.members,
                    report.dropped, wait_ms);
    if (!w.ok()) return fail(w.status().WithContext("serving the relay tree"));
    tree = *w;
    if (Status s = relay->MirrorUpward(args.version); !s.ok()) {
      return fail(s.WithContext("copying votes to the durable store"));
    }
  } else if (args.serve_ms > 0) {
    if (Status s = (*publisher)->Serve(args.version, args.serve_ms); !s.ok()) {
      return fail(s.WithContext("serving re-sends"));
    }
  }
  uint64_t resend_objects = 0;
  if (auto listed = (*store)->List(ResendPrefix(args.version));
      listed.ok()) {
    resend_objects = listed->size();
  }
  if (args.json) {
    Json j = PublishJson(args, report, already_decided, resend_objects);
    if (tree) j["relay"] = TreeJson(*relay, *tree);
    PrintJson(j);
  } else {
    PrintPublishText(args, (*store)->Describe(), report, already_decided,
                     resend_objects);
    if (tree) PrintTreeText(*relay, *tree);
  }
  if (!report.committed) {
    fmt::print(stderr,
               "refit: publish: version {} was aborted ({}); receivers rolled "
               "it back; publish it again as a higher version\n",
               args.version, report.reason);
    return kExitAborted;
  }
  return kExitOk;
}

// ---------------------------------------------------------------- receive

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

// The first SIGTERM/SIGINT asks for a stop: a step that waits (for chunks,
// re-sends, a decision) ends within a poll (ReceiverOptions::stop), and the
// process exits with a message. A second one exits at once (safe: the
// journal resumes the version on restart), saying so with write(2), the
// one way a handler may print.
extern "C" void OnStopSignal(int sig) {
  if (g_stop_signal != 0) {
    static const char kMessage[] =
        "refit: receive: second stop signal: exiting now; the journal resumes "
        "the version on restart\n";
    ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    (void)ignored;
    _exit(128 + sig);
  }
  g_stop_signal = sig;
}

void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// Sleeps up to `ms`, waking early for a stop signal.
void SleepUnlessStopped(int ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (g_stop_signal == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(ms, 10)));
  }
}

bool IsTransient(StatusCode code) {
  return code == StatusCode::kUnavailable ||
         code == StatusCode::kDeadlineExceeded;
}

const char* OutcomeName(StepResult::Outcome o) {
  switch (o) {
    case StepResult::Outcome::kIdle:
      return "idle";
    case StepResult::Outcome::kCommitted:
      return "committed";
    case StepResult::Outcome::kAborted:
      return "aborted";
    case StepResult::Outcome::kCaughtUp:
      return "caught-up";
    case StepResult::Outcome::kSnapshot:
      return "snapshot";
    case StepResult::Outcome::kPrepared:
      return "prepared";
  }
  return "?";
}

// The receiver's record of its last failure, for `refit status`.
void RecordLastError(const std::string& state_dir, const Status& s,
                     bool transient) {
  Json j;
  j["time"] = UtcNow();
  j["code"] = std::string(StatusCodeName(s.code()));
  j["message"] = std::string(s.message());
  j["transient"] = transient;
  std::string text =
      j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  (void)WriteFileAtomic(
      StateDir(state_dir).last_error_path(),
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()),
                               text.size()));
}

void ClearLastError(const std::string& state_dir) {
  std::error_code ec;
  fs::remove(StateDir(state_dir).last_error_path(), ec);
}

// Watches a relay node's parent link on its own thread: a parent not
// connected for RelayOptions::dead_after_ms is reported (stderr or a JSON
// "relay" event, and STATE/last_error), its return too; after `give_up_ms`
// (0 = never) gave_up() turns true and the receiver exits.
class ParentWatch {
 public:
  ParentWatch(RelayStore* node, std::string parent, std::string state,
              int give_up_ms, bool json)
      : node_(node),
        parent_(std::move(parent)),
        state_(std::move(state)),
        give_up_ms_(give_up_ms),
        json_(json),
        thread_([this] { Run(); }) {}
  ~ParentWatch() {
    stop_ = true;
    thread_.join();
  }
  ParentWatch(const ParentWatch&) = delete;
  ParentWatch& operator=(const ParentWatch&) = delete;

  bool gave_up() const { return gave_up_; }
  std::string why() const {
    Status last = node_->last_error();
    return fmt::format("relay parent {} unreachable for {} ms, giving up{}",
                       parent_, give_up_ms_,
                       last.ok() ? "" : " (" + last.ToString() + ")");
  }

 private:
  void Report(bool up, double seconds, const Status& last) {
    std::string what =
        up ? fmt::format("relay parent {} reachable again", parent_)
           : fmt::format("relay parent {} unreachable for {:.1f} s{}", parent_,
                         seconds, last.ok() ? "" : ": " + last.ToString());
    if (!up) RecordLastError(state_, UnavailableError(what), true);
    if (json_) {
      PrintJsonLine({{"event", "relay"},
                     {"parent", parent_},
                     {"parent_connected", up},
                     {"message", what}});
    } else {
      fmt::print(stderr, "refit: receive: {}\n", what);
    }
  }

  void Run() {
    using Clock = std::chrono::steady_clock;
    const int dead_ms = RelayOptions().dead_after_ms;
    bool lost = false;
    Clock::time_point lost_at;  // since when the parent is not connected
    bool reported = false;
    while (!stop_) {
      RelayStatus st = node_->status();
      if (st.parent_connected) {
        if (reported) Report(true, 0, Status());
        lost = false;
        reported = false;
      } else {
        if (!lost) lost_at = Clock::now();
        lost = true;
        double ms =
            std::chrono::duration<double, std::milli>(Clock::now() - lost_at)
                .count();
        if (!reported && ms >= dead_ms) {
          Report(false, ms / 1000, st.last_error);
          reported = true;
        }
        if (give_up_ms_ > 0 && ms >= give_up_ms_) gave_up_ = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  RelayStore* node_;
  std::string parent_;
  std::string state_;
  int give_up_ms_;
  bool json_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> gave_up_{false};
  std::thread thread_;  // last: starts after the members above
};

// Before a relay node's process ends: waits until the last done report
// has likely left (a frame went out after it), and, for a node
// that accepts children, until none has been connected for a second (a
// restarting child reconnects well within that), at most `linger_ms`.
void LingerForTree(RelayStore* node, bool has_listener, uint64_t done_frames,
                   int linger_ms) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kQuiet = std::chrono::seconds(1);
  Stopwatch clock;
  bool quiet = false;
  Clock::time_point quiet_since;  // no child connected since then
  while (clock.Seconds() * 1000 < linger_ms && g_stop_signal == 0) {
    RelayStatus st = node->status();
    // frames_out counts every link's frames: a heuristic, bounded below.
    bool sent = st.frames_out > done_frames;
    if (st.children > 0) {
      quiet = false;
    } else if (!quiet) {
      quiet = true;
      quiet_since = Clock::now();
    }
    bool children_done =
        !has_listener || (quiet && Clock::now() - quiet_since >= kQuiet);
    if (sent && children_done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

int RunReceive(const ReceiveArgs& args) {
  constexpr std::string_view kCmd = "receive";
  auto fail = [&](const Status& s) { return Fail(kCmd, s, args.json); };
  if (Status s = ValidateMember(args.member); !s.ok()) return fail(s);
  if (args.poll_ms < 1 || args.decision_timeout_ms < 1 ||
      args.resend_timeout_ms < 1) {
    return fail(InvalidArgumentError(
        "--poll-ms and the timeouts must be at least 1 ms"));
  }
  if (Status s = CheckExists(args.checkpoint, "--checkpoint"); !s.ok()) {
    return fail(s);
  }
  std::error_code ec;
  fs::create_directories(args.state, ec);
  if (ec) {
    return fail(UnavailableError(
        fmt::format("cannot create the state directory '{}': {}", args.state,
                    ec.message())));
  }
  Result<Authenticator> auth = LoadAuth(args.key_file, "", args.verify_key);
  if (!auth.ok()) return fail(auth.status());
  if (args.store.empty() == args.relay_parent.empty()) {
    return fail(
        InvalidArgumentError("give exactly one of --store and --relay-parent"));
  }
  if (args.relay_parent.empty() && !args.relay_listen.empty()) {
    return fail(InvalidArgumentError("--relay-listen needs --relay-parent"));
  }
  const RelayTlsOptions& tls = args.relay_tls;
  if ((tls.enabled() || !tls.parent_name.empty() ||
       tls.child_names_are_members) &&
      args.relay_parent.empty()) {
    return fail(InvalidArgumentError("--relay-tls-* need --relay-parent"));
  }
  if (args.relay_parent_timeout_ms < 0 || args.relay_linger_ms < 0) {
    return fail(InvalidArgumentError("timeouts must not be negative"));
  }
  Result<std::unique_ptr<ObjectStore>> store = InternalError("not opened");
  RelayStore* node = nullptr;
  if (args.relay_parent.empty()) {
    store = OpenObjectStore(args.store);
  } else {
    RelayOptions relay_options;
    relay_options.keys = ProtocolRelayKeys();
    relay_options.tls = tls;
    // Publisher processes come and go (one root per `publish`): find the
    // next one soon after it binds.
    relay_options.reconnect_max_ms = 500;
    Result<std::unique_ptr<RelayStore>> n = RelayStore::Node(
        args.member, args.relay_parent, args.relay_listen, relay_options);
    if (!n.ok()) return fail(n.status());
    node = n->get();
    store = std::unique_ptr<ObjectStore>(std::move(*n));
  }
  if (!store.ok()) return fail(store.status());

  ReceiverOptions options;
  options.member = args.member;
  options.checkpoint = args.checkpoint;
  options.state_dir = args.state;
  options.auth = *auth;
  options.threads = args.threads;
  options.poll_ms = args.poll_ms;
  options.decision_timeout_ms = args.decision_timeout_ms;
  options.resend_timeout_ms = args.resend_timeout_ms;
  options.max_fold_versions = args.max_fold_versions;
  options.stop = [] { return g_stop_signal != 0; };
  Result<std::unique_ptr<Receiver>> opened =
      Receiver::Open(store->get(), options);
  if (!opened.ok()) {
    RecordLastError(args.state, opened.status(), false);
    return fail(opened.status());
  }
  Receiver& receiver = **opened;
  InstallStopHandlers();

  // An interrupted version (the process was killed) resumes in Step().
  std::optional<JournalState> journal;
  if (auto j = Journal::Load(StateDir(args.state).journal_path()); j.ok()) {
    journal = *j;
  }
  bool resuming = journal && journal->version > receiver.active_version();
  if (args.json) {
    Json j{{"event", "start"},
           {"member", args.member},
           {"active", receiver.active_version()},
           {"store", (*store)->Describe()}};
    if (resuming) {
      j["resume"] = {{"version", journal->version},
                     {"chunks_journaled", journal->applied.size()},
                     {"voted", journal->voted}};
    }
    if (node != nullptr) {
      j["relay"] = {{"parent", args.relay_parent},
                    {"listen", node->listen_address()}};
    }
    PrintJsonLine(j);
  } else {
    fmt::print("refit receive: member {} at version {}, following {}\n",
               args.member, receiver.active_version(), (*store)->Describe());
    if (resuming) {
      fmt::print(
          "  resuming version {} from its journal ({} chunk(s) journaled "
          "applied{})\n",
          journal->version, journal->applied.size(),
          journal->voted ? ", voted" : "");
    }
    if (node != nullptr) {
      fmt::print("  relay node: parent {}, {}{}\n", args.relay_parent,
                 node->listen_address().empty()
                     ? std::string("a leaf (no listener)")
                     : "children connect to " + node->listen_address(),
                 node->status().tls ? ", TLS" : "");
    }
    std::fflush(stdout);
  }

  // On a relay node: report each finished version up the tree (publish
  // serves the tree until every member did), and watch the parent link.
  uint64_t done_frames = 0;  // frames_out just before the last report
  auto report_done = [&](uint64_t version) {
    if (node == nullptr || version == 0) return;
    std::string body = fmt::format("done {}", version);
    done_frames = node->status().frames_out;  // before: the send is async
    Status s = node->Put(
        DoneKey(version, args.member),
        auth->SealMember(std::span<const uint8_t>(
            reinterpret_cast<const uint8_t*>(body.data()), body.size())));
    if (!s.ok()) {
      fmt::print(stderr, "refit: receive: reporting version {}: {}\n", version,
                 s.ToString());
    }
  };
  // A restarted member reports where it is, in case its last report was
  // lost with the process.
  report_done(receiver.active_version());
  std::optional<ParentWatch> watch;
  if (node != nullptr) {
    watch.emplace(node, args.relay_parent, args.state,
                  args.relay_parent_timeout_ms, args.json);
  }

  auto finish = [&](std::string_view why) {
    if (node != nullptr && why.find("signal") == std::string_view::npos) {
      // Children may still need what this node forwards, and the last
      // report must leave before the process (and the node) ends.
      LingerForTree(node, !args.relay_listen.empty(), done_frames,
                    args.relay_linger_ms);
    }
    if (args.json) {
      PrintJsonLine({{"event", "exit"},
                     {"reason", std::string(why)},
                     {"active", receiver.active_version()}});
    } else {
      fmt::print("refit receive: {} at version {} ({})\n", args.member,
                 receiver.active_version(), why);
      std::fflush(stdout);
    }
    return kExitOk;
  };

  // Says once what an idle receiver waits for, when it is not obvious;
  // warnings go to stderr (text) or as events (JSON).
  bool told_empty = false;
  uint64_t told_not_member = 0;
  auto tell = [&](std::string_view event, const std::string& message) {
    if (args.json) {
      PrintJsonLine({{"event", std::string(event)}, {"message", message}});
    } else {
      fmt::print(stderr, "refit: receive: {}\n", message);
    }
  };

  int backoff_ms = 0;
  for (;;) {
    if (watch && watch->gave_up()) {
      Status s = UnavailableError(watch->why());
      RecordLastError(args.state, s, false);
      return fail(s);
    }
    if (g_stop_signal != 0) {
      return finish(fmt::format("stopped by signal {}", int{g_stop_signal}));
    }
    if (args.until >= 0 &&
        receiver.active_version() >= static_cast<uint64_t>(args.until)) {
      return finish(fmt::format("reached --until {}", args.until));
    }
    // Catch-up folds no version past --until into a step.
    Result<StepResult> step = receiver.Step(
        args.until >= 0 ? static_cast<uint64_t>(args.until) : UINT64_MAX);
    if (!step.ok()) {
      const Status& s = step.status();
      // Stopped by a signal while it waited: the loop's top says so.
      if (s.code() == StatusCode::kCancelled && g_stop_signal != 0) continue;
      // On a relay node an object can be missing only for now: a node that
      // just (re)started resumes its journaled version before its parent's
      // replay has delivered the manifest.
      bool transient = IsTransient(s.code()) ||
                       (node != nullptr && s.code() == StatusCode::kNotFound);
      // A version this receiver cannot apply was voted failed: its
      // coordinator aborts it, and the next steps roll it back and follow
      // the next version. A chunk that failed its checks is read again
      // before that.
      const std::optional<uint64_t> failed = receiver.failed_vote();
      if (failed) {
        tell("failed", fmt::format("voted failed on version {}: {}; it is rolled "
                                   "back once aborted",
                                   *failed, s.ToString()));
      }
      transient = transient || failed.has_value() || receiver.rereading();
      RecordLastError(args.state, s, transient);
      if (!transient) return fail(s);
      // Exponential backoff: poll interval doubling up to 5 s.
      backoff_ms = std::min(5000, std::max(args.poll_ms, backoff_ms * 2));
      if (args.json) {
        PrintJsonLine({{"event", "error"},
                       {"code", std::string(StatusCodeName(s.code()))},
                       {"message", std::string(s.message())},
                       {"retry_in_ms", backoff_ms}});
      } else {
        fmt::print(stderr, "refit: receive: {} (retrying in {} ms)\n",
                   s.ToString(), backoff_ms);
      }
      SleepUnlessStopped(backoff_ms);
      continue;
    }
    backoff_ms = 0;
    const StepResult& r = *step;
    if (r.outcome == StepResult::Outcome::kIdle) {
      if (r.not_member_of != 0 && r.not_member_of != told_not_member) {
        told_not_member = r.not_member_of;
        tell("warning",
             fmt::format("member '{}' is not in the members of version {}: it is not "
                         "a voting member (check --member against publish --members); "
                         "it applies versions once they are committed",
                         args.member, r.not_member_of));
      }
      if (!told_empty) {
        told_empty = true;
        Result<std::vector<ObjectInfo>> versions = (*store)->List(kIndexPrefix);
        if (versions.ok() && versions->empty() && receiver.active_version() == 0) {
          // Progress, not a warning: a status line on stdout.
          const std::string message = fmt::format(
              "{} holds no version yet; waiting for the first version",
              (*store)->Describe());
          if (args.json) {
            tell("waiting", message);
          } else {
            fmt::print("refit receive: {}\n", message);
            std::fflush(stdout);
          }
        }
      }
      SleepUnlessStopped(args.poll_ms);
      continue;
    }
    ClearLastError(args.state);
    report_done(r.version);
    if (!r.recovered.empty()) {
      // Deltas could not bring this receiver forward; a snapshot did.
      if (args.json) {
        PrintJsonLine({{"event", "resynced"},
                       {"snapshot", r.version},
                       {"because", r.recovered}});
      } else {
        fmt::print(stderr, "refit: receive: resynced from snapshot {} because: {}\n",
                   r.version, r.recovered);
      }
    }
    if (args.json) {
      PrintJsonLine({{"event", "version"},
                     {"version", r.version},
                     {"outcome", OutcomeName(r.outcome)},
                     {"active", receiver.active_version()},
                     {"versions_folded", r.versions_folded},
                     {"chunks_applied", r.chunks_applied},
                     {"chunks_skipped", r.chunks_skipped},
                     {"chunks_resent", r.chunks_resent},
                     {"changed_elements", r.changed_elements},
                     {"bytes_fetched", r.bytes_fetched},
                     {"seconds", r.seconds}});
    } else {
      fmt::print(
          "v{} {}{}: {} chunks applied{}, {} skipped (already applied), {} "
          "re-sent; {} fetched; {}; active {}\n",
          r.version, OutcomeName(r.outcome),
          r.versions_folded > 1
              ? fmt::format(" ({} versions folded)", r.versions_folded)
              : std::string(),
          r.chunks_applied,
          r.outcome == StepResult::Outcome::kAborted ? " then rolled back" : "",
          r.chunks_skipped, r.chunks_resent,
          HumanBytes(static_cast<double>(r.bytes_fetched)),
          HumanSeconds(r.seconds), receiver.active_version());
      std::fflush(stdout);
    }
    if (args.once) return finish("--once");
  }
}

// ---------------------------------------------------------------- status

namespace {

struct VersionStatus {
  uint64_t version = 0;
  uint64_t base_version = 0;
  uint64_t chunks = 0;
  uint64_t changed = 0;
  std::string decision = "pending";  // commit, abort, pending
  bool uploading = false;  // announced, manifest not stored yet
  std::vector<std::string> dropped;
  std::string reason;
  std::vector<std::pair<std::string, std::string>> votes;  // member, state
  std::string error;  // why this version could not be read
};

Result<VersionStatus> ReadVersion(const ObjectReader& reader,
                                  uint64_t version) {
  VersionStatus v;
  v.version = version;
  REFIT_ASSIGN_OR_RETURN(Announcement m, reader.ReadAnnouncement(version));
  v.base_version = m.base_version;
  // The manifest closes the version's chunk list; until it is stored the
  // version is still being uploaded (or its publisher stopped).
  REFIT_ASSIGN_OR_RETURN(std::optional<Manifest> full,
                         reader.ReadManifest(version));
  if (full) {
    v.chunks = full->chunks.size();
    for (const ManifestChunk& c : full->chunks) v.changed += c.changed;
  } else {
    v.uploading = true;
  }
  REFIT_ASSIGN_OR_RETURN(std::optional<Decision> decision,
                         reader.ReadDecision(version));
  if (decision) {
    v.decision = decision->commit ? "commit" : "abort";
    v.dropped = decision->dropped;
    v.reason = decision->reason;
  }
  for (const std::string& member : m.members) {
    std::string state = "missing";
    ObjectReader::Step step = ObjectReader::Step::kFetch;
    Result<std::optional<Vote>> vote = reader.ReadVote(version, member, &step);
    if (!vote.ok()) {
      // A vote that does not open or parse is shown; a store that fails
      // is an error.
      if (step == ObjectReader::Step::kFetch) return vote.status();
      state = "invalid";
    } else if (*vote) {
      state = (*vote)->ready ? "ready" : "failed: " + (*vote)->message;
    }
    v.votes.emplace_back(member, state);
  }
  return v;
}

struct LocalStatus {
  std::string dir;
  bool exists = false;
  uint64_t active = 0;
  std::string journal;  // "", or a description of the one in progress
  std::optional<uint64_t> journal_version;
  Json last_error;  // null when none
};

LocalStatus ReadLocal(const std::string& dir) {
  LocalStatus l;
  l.dir = dir;
  l.exists = fs::is_directory(dir);
  if (!l.exists) return l;
  const StateDir state(dir);
  if (auto active = state.ReadActive(); active.ok()) l.active = *active;
  auto j = Journal::Load(state.journal_path());
  if (!j.ok()) {
    l.journal = "unreadable: " + j.status().ToString();
  } else if (j->has_value() && (*j)->version > l.active) {
    l.journal_version = (*j)->version;
    l.journal = fmt::format("version {} in progress: {} chunk(s) applied{}",
                            (*j)->version, (*j)->applied.size(),
                            (*j)->voted ? ", voted" : "");
  }
  if (auto text = ReadFile(state.last_error_path()); text.ok()) {
    l.last_error = Json::parse(text->begin(), text->end(), nullptr, false);
    if (l.last_error.is_discarded()) {
      l.last_error = std::string(text->begin(), text->end());
    }
  }
  return l;
}

}  // namespace

int RunSyncStatus(const StatusArgs& args) {
  constexpr std::string_view kCmd = "status";
  auto fail = [&](const Status& s) { return Fail(kCmd, s, args.json); };
  Result<Authenticator> auth = LoadAuth(args.key_file, "", args.verify_key);
  if (!auth.ok()) return fail(auth.status());
  // Status only reads: a mistyped path must fail, not become a new store.
  StoreOptions read_only;
  read_only.create_if_missing = false;
  Result<std::unique_ptr<ObjectStore>> store =
      OpenObjectStore(args.store, read_only);
  if (!store.ok()) return fail(store.status());
  ObjectStore* s = store->get();
  const ObjectReader reader(s, *auth);

  ObjectReader::Step step = ObjectReader::Step::kFetch;
  Result<std::optional<uint64_t>> read_head = reader.ReadHead(&step);
  if (!read_head.ok()) {
    if (step == ObjectReader::Step::kOpen) {
      return Fail(kCmd, read_head.status().WithContext("the head object"),
                  args.json, "every node of a store uses the same key, or none");
    }
    return fail(read_head.status());
  }
  const std::optional<uint64_t> head = *read_head;
  Result<std::vector<uint64_t>> listed_versions = reader.ListVersions();
  if (!listed_versions.ok()) return fail(listed_versions.status());
  std::vector<uint64_t> versions = *listed_versions;
  std::sort(versions.rbegin(), versions.rend());
  if (args.recent >= 0 && versions.size() > static_cast<size_t>(args.recent)) {
    versions.resize(static_cast<size_t>(args.recent));
  }
  std::vector<VersionStatus> listed;
  for (uint64_t v : versions) {
    Result<VersionStatus> vs = ReadVersion(reader, v);
    if (vs.ok()) {
      listed.push_back(*vs);
    } else {
      VersionStatus bad;
      bad.version = v;
      bad.decision = "unreadable";
      bad.error = vs.status().ToString();
      listed.push_back(bad);
    }
  }
  std::vector<LocalStatus> locals;
  for (const std::string& dir : args.states) locals.push_back(ReadLocal(dir));

  if (args.json) {
    Json j;
    j["ok"] = true;
    j["command"] = "status";
    j["store"] = s->Describe();
    j["head"] = head ? Json(*head) : Json(nullptr);
    Json vs = Json::array();
    for (const VersionStatus& v : listed) {
      Json votes = Json::object();
      for (const auto& [member, state] : v.votes) votes[member] = state;
      Json e{{"version", v.version},
             {"base_version", v.base_version},
             {"decision", v.decision},
             {"dropped", v.dropped},
             {"reason", v.reason},
             {"chunks", v.chunks},
             {"uploading", v.uploading},
             {"changed_elements", v.changed},
             {"votes", votes}};
      if (!v.error.empty()) e["error"] = v.error;
      vs.push_back(e);
    }
    j["versions"] = vs;
    Json ls = Json::array();
    for (const LocalStatus& l : locals) {
      Json e{{"state", l.dir}, {"exists", l.exists}};
      if (l.exists) {
        e["active"] = l.active;
        e["lag"] = head && *head > l.active ? *head - l.active : 0;
        e["journal_in_progress"] = l.journal_version.has_value();
        e["journal"] = l.journal;
        e["last_error"] = l.last_error;
      }
      ls.push_back(e);
    }
    j["receivers"] = ls;
    PrintJson(j);
    return kExitOk;
  }

  fmt::print("store {}\n", s->Describe());
  if (head) {
    fmt::print("head  version {} (the latest committed)\n", *head);
  } else {
    fmt::print("head  none: nothing was published here yet\n");
  }
  if (!listed.empty()) {
    fmt::print("\n{:>8} {:>6} {:>9} {:>7} {:>10}  {}\n", "version", "base",
               "decision", "chunks", "changed", "votes");
  }
  for (const VersionStatus& v : listed) {
    if (!v.error.empty()) {
      fmt::print("{:>8} {:>6} {:>9}  {}\n", v.version, "?", v.decision,
                 v.error);
      continue;
    }
    std::string votes;
    for (const auto& [member, state] : v.votes) {
      votes += fmt::format("{}{}={}", votes.empty() ? "" : " ", member, state);
    }
    fmt::print("{:>8} {:>6} {:>9} {:>7} {:>10}  {}\n", v.version,
               v.base_version, v.decision,
               v.uploading ? std::string("upload") : std::to_string(v.chunks),
               v.uploading ? std::string("?") : WithCommas(v.changed), votes);
    if (!v.dropped.empty() || (!v.reason.empty() && v.decision != "commit")) {
      std::string dropped;
      for (const std::string& d : v.dropped) dropped += " " + d;
      fmt::print("{:>8} {}{}\n", "",
                 dropped.empty() ? "" : "dropped:" + dropped + "; ", v.reason);
    }
  }
  for (const LocalStatus& l : locals) {
    fmt::print("\nreceiver state {}\n", l.dir);
    if (!l.exists) {
      fmt::print("  does not exist\n");
      continue;
    }
    fmt::print("  active   version {}{}\n", l.active,
               head
                   ? fmt::format(" ({} behind head {})",
                                 *head > l.active ? *head - l.active : 0, *head)
                   : "");
    fmt::print("  journal  {}\n",
               l.journal.empty() ? "none in progress" : l.journal);
    if (!l.last_error.is_null()) {
      fmt::print("  last error {}\n",
                 l.last_error.is_object()
                     ? fmt::format("{} {}: {}", l.last_error.value("time", ""),
                                   l.last_error.value("code", ""),
                                   l.last_error.value("message", ""))
                     : l.last_error.dump());
    }
  }
  return kExitOk;
}

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
      ->check(CLI::IsMember({"abort", "drop"}));
  pub->add_option("--chunk-mib", p.chunk_mib,
                  "bytes of a tensor per chunk, in MiB (a multiple of 64 KiB)")
      ->capture_default_str();
  pub->add_option("-j,--threads", p.threads, "encoder threads; 0 = all cores")
      ->capture_default_str()
      ->check(IntIn(0, kMaxThreads));
  pub->add_option("--upload-threads", p.upload_threads,
                  "concurrent chunk uploads")
      ->capture_default_str()
      ->check(IntIn(1, 256));
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

std::optional<int> RunSyncCommand(SyncCommandArgs* args, bool global_json) {
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
