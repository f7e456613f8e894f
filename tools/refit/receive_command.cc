// `refit receive`: a long-running receiver that follows versions and
// applies them in place (docs/protocol.md, "Receiver"), on a store or as a
// relay tree node. See sync_commands.h.
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
#include "sync_commands.h"
#include "sync_common.h"
#include "transport/relay_store.h"

namespace refit::cli {

namespace fs = std::filesystem;

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

bool IsTransient(StatusCode code) {
  return code == StatusCode::kUnavailable ||
         code == StatusCode::kDeadlineExceeded;
}

// One line (text) or event (JSON) for a step that did something.
void PrintStep(const StepResult& r, uint64_t active, bool json) {
  if (!r.recovered.empty()) {
    // Deltas could not bring this receiver forward; a snapshot did.
    if (json) {
      PrintJsonLine({{"event", "resynced"},
                     {"snapshot", r.version},
                     {"because", r.recovered}});
    } else {
      fmt::print(stderr,
                 "refit: receive: resynced from snapshot {} because: {}\n",
                 r.version, r.recovered);
    }
  }
  if (json) {
    PrintJsonLine({{"event", "version"},
                   {"version", r.version},
                   {"outcome", OutcomeName(r.outcome)},
                   {"active", active},
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
        HumanSeconds(r.seconds), active);
    std::fflush(stdout);
  }
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

  FollowOptions follow;
  // Catch-up folds no version past --until into a step.
  if (args.until >= 0) follow.until = static_cast<uint64_t>(args.until);
  follow.once = args.once;
  follow.poll_ms = args.poll_ms;
  follow.stop = [&] {
    return (watch && watch->gave_up()) || g_stop_signal != 0;
  };
  int backoff_ms = 0;
  follow.on_error = [&](const Status& s) -> std::optional<int> {
    // Stopped by a signal while it waited: the loop's next stop check says
    // so.
    if (s.code() == StatusCode::kCancelled && g_stop_signal != 0) return 0;
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
    if (!transient) return std::nullopt;
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
    return backoff_ms;
  };
  follow.on_idle = [&](const StepResult& r) {
    backoff_ms = 0;
    if (r.not_member_of != 0 && r.not_member_of != told_not_member) {
      told_not_member = r.not_member_of;
      tell("warning",
           fmt::format(
               "member '{}' is not in the members of version {}: it is not "
               "a voting member (check --member against publish --members); "
               "it applies versions once they are committed",
               args.member, r.not_member_of));
    }
    if (!told_empty) {
      told_empty = true;
      Result<std::vector<ObjectInfo>> versions = (*store)->List(kIndexPrefix);
      if (versions.ok() && versions->empty() &&
          receiver.active_version() == 0) {
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
  };
  follow.on_step = [&](const StepResult& r) {
    backoff_ms = 0;
    ClearLastError(args.state);
    report_done(r.version);
    PrintStep(r, receiver.active_version(), args.json);
  };
  Result<FollowResult> followed = Follow(receiver, follow);
  if (!followed.ok()) return fail(followed.status());
  switch (followed->end) {
    case FollowEnd::kStopped:
      if (watch && watch->gave_up()) {
        Status s = UnavailableError(watch->why());
        RecordLastError(args.state, s, false);
        return fail(s);
      }
      return finish(fmt::format("stopped by signal {}", int{g_stop_signal}));
    case FollowEnd::kOnce:
      return finish("--once");
    default:
      return finish(fmt::format("reached --until {}", args.until));
  }
}

}  // namespace refit::cli
