// `refit publish`, `refit receive` and `refit status`: the version protocol
// of docs/protocol.md on the command line. See sync_commands.h.
#include "sync_commands.h"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
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
#include "sync/auth.h"
#include "sync/journal.h"
#include "sync/protocol.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "transport/object_store.h"

namespace refit::cli {
namespace {

namespace fs = std::filesystem;

Result<Authenticator> LoadAuth(const std::string& key_file) {
  if (key_file.empty()) return Authenticator::None();
  REFIT_RETURN_IF_ERROR(CheckExists(key_file, "--key-file"));
  return Authenticator::FromKeyFile(key_file);
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
  std::string text =
      j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
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
  Result<Authenticator> auth = LoadAuth(args.key_file);
  if (!auth.ok()) return fail(auth.status());
  Result<std::unique_ptr<ObjectStore>> store = OpenObjectStore(args.store);
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
  Result<std::unique_ptr<Publisher>> publisher =
      Publisher::Open(store->get(), args.baseline, options);
  if (!publisher.ok()) return fail(publisher.status());

  PublishReport report;
  bool already_decided = false;
  if (args.version <= (*publisher)->committed_version()) {
    // Re-running a publish that completed (head moved past it): report the
    // decision on record; there is nothing left to do.
    Result<std::vector<uint8_t>> bytes =
        (*store)->Get(DecisionKey(args.version));
    if (!bytes.ok()) {
      return fail(InvalidArgumentError(fmt::format(
          "version {} is not above the committed version {} and has no "
          "decision; publish a higher version",
          args.version, (*publisher)->committed_version())));
    }
    Result<std::span<const uint8_t>> body = auth->Open(*bytes);
    if (!body.ok()) return fail(body.status());
    Result<Decision> d = DecodeDecision(*body);
    if (!d.ok()) return fail(d.status());
    already_decided = true;
    report.version = args.version;
    if (auto mb = (*store)->Get(ManifestKey(args.version)); mb.ok()) {
      if (auto mbody = auth->Open(*mb); mbody.ok()) {
        if (auto m = DecodeManifest(*mbody); m.ok()) {
          report.base_version = m->base_version;
        }
      }
    }
    report.committed = d->commit;
    report.dropped = d->dropped;
    report.reason = d->reason;
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
  if (args.serve_ms > 0) {
    if (Status s = (*publisher)->Serve(args.version, args.serve_ms); !s.ok()) {
      return fail(s.WithContext("serving re-sends"));
    }
  }
  uint64_t resend_objects = 0;
  if (auto listed = (*store)->List(VersionPrefix(args.version) + "resend/");
      listed.ok()) {
    resend_objects = listed->size();
  }
  if (args.json) {
    PrintJson(PublishJson(args, report, already_decided, resend_objects));
  } else {
    PrintPublishText(args, (*store)->Describe(), report, already_decided,
                     resend_objects);
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

extern "C" void OnStopSignal(int sig) { g_stop_signal = sig; }

// The first SIGTERM/SIGINT asks for a stop between steps; SA_RESETHAND
// makes a second one kill at once (safe: the journal resumes).
void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
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
      state_dir + "/last_error",
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()),
                               text.size()));
}

void ClearLastError(const std::string& state_dir) {
  std::error_code ec;
  fs::remove(state_dir + "/last_error", ec);
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
  Result<Authenticator> auth = LoadAuth(args.key_file);
  if (!auth.ok()) return fail(auth.status());
  Result<std::unique_ptr<ObjectStore>> store = OpenObjectStore(args.store);
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
  if (auto j = Journal::Load(args.state + "/journal"); j.ok()) journal = *j;
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
    std::fflush(stdout);
  }

  auto finish = [&](std::string_view why) {
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

  int backoff_ms = 0;
  for (;;) {
    if (g_stop_signal != 0) {
      return finish(fmt::format("stopped by signal {}", int{g_stop_signal}));
    }
    if (args.until >= 0 &&
        receiver.active_version() >= static_cast<uint64_t>(args.until)) {
      return finish(fmt::format("reached --until {}", args.until));
    }
    Result<StepResult> step = receiver.Step();
    if (!step.ok()) {
      const Status& s = step.status();
      bool transient = IsTransient(s.code());
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
      SleepUnlessStopped(args.poll_ms);
      continue;
    }
    ClearLastError(args.state);
    if (args.json) {
      PrintJsonLine({{"event", "version"},
                     {"version", r.version},
                     {"outcome", OutcomeName(r.outcome)},
                     {"active", receiver.active_version()},
                     {"chunks_applied", r.chunks_applied},
                     {"chunks_skipped", r.chunks_skipped},
                     {"chunks_resent", r.chunks_resent},
                     {"changed_elements", r.changed_elements},
                     {"bytes_fetched", r.bytes_fetched},
                     {"seconds", r.seconds}});
    } else {
      fmt::print(
          "v{} {}: {} chunks applied{}, {} skipped (already applied), {} "
          "re-sent; {} fetched; {}; active {}\n",
          r.version, OutcomeName(r.outcome), r.chunks_applied,
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
  std::vector<std::string> dropped;
  std::string reason;
  std::vector<std::pair<std::string, std::string>> votes;  // member, state
  std::string error;  // why this version could not be read
};

Result<VersionStatus> ReadVersion(ObjectStore* store, const Authenticator& auth,
                                  uint64_t version) {
  VersionStatus v;
  v.version = version;
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> mbytes,
                         store->Get(ManifestKey(version)));
  REFIT_ASSIGN_OR_RETURN(auto mbody, auth.Open(mbytes));
  REFIT_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(mbody));
  v.base_version = m.base_version;
  v.chunks = m.chunks.size();
  for (const ManifestChunk& c : m.chunks) v.changed += c.changed;
  if (auto d = store->Get(DecisionKey(version)); d.ok()) {
    REFIT_ASSIGN_OR_RETURN(auto body, auth.Open(*d));
    REFIT_ASSIGN_OR_RETURN(Decision decision, DecodeDecision(body));
    v.decision = decision.commit ? "commit" : "abort";
    v.dropped = decision.dropped;
    v.reason = decision.reason;
  } else if (d.status().code() != StatusCode::kNotFound) {
    return d.status();
  }
  for (const std::string& member : m.members) {
    std::string state = "missing";
    if (auto b = store->Get(VoteKey(version, member)); b.ok()) {
      auto body = auth.Open(*b);
      auto vote = body.ok() ? DecodeVote(*body) : Result<Vote>(body.status());
      if (!vote.ok()) {
        state = "invalid";
      } else {
        state = vote->ready ? "ready" : "failed: " + vote->message;
      }
    } else if (b.status().code() != StatusCode::kNotFound) {
      return b.status();
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
  if (auto text = ReadFile(dir + "/active"); text.ok()) {
    l.active = std::strtoull(std::string(text->begin(), text->end()).c_str(),
                             nullptr, 10);
  }
  auto j = Journal::Load(dir + "/journal");
  if (!j.ok()) {
    l.journal = "unreadable: " + j.status().ToString();
  } else if (j->has_value() && (*j)->version > l.active) {
    l.journal_version = (*j)->version;
    l.journal = fmt::format("version {} in progress: {} chunk(s) applied{}",
                            (*j)->version, (*j)->applied.size(),
                            (*j)->voted ? ", voted" : "");
  }
  if (auto text = ReadFile(dir + "/last_error"); text.ok()) {
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
  Result<Authenticator> auth = LoadAuth(args.key_file);
  if (!auth.ok()) return fail(auth.status());
  Result<std::unique_ptr<ObjectStore>> store = OpenObjectStore(args.store);
  if (!store.ok()) return fail(store.status());
  ObjectStore* s = store->get();

  std::optional<uint64_t> head;
  if (auto bytes = s->Get(kHeadKey); bytes.ok()) {
    Result<std::span<const uint8_t>> body = auth->Open(*bytes);
    if (!body.ok()) {
      return Fail(kCmd, body.status().WithContext("the head object"), args.json,
                  "every node of a store uses the same key, or none");
    }
    Result<uint64_t> h = DecodeHead(*body);
    if (!h.ok()) return fail(h.status());
    head = *h;
  } else if (bytes.status().code() != StatusCode::kNotFound) {
    return fail(bytes.status());
  }
  Result<std::vector<ObjectInfo>> index = s->List("index/");
  if (!index.ok()) return fail(index.status());
  std::vector<uint64_t> versions;
  for (const ObjectInfo& o : *index) {
    versions.push_back(std::strtoull(o.key.c_str() + 6, nullptr, 10));
  }
  std::sort(versions.rbegin(), versions.rend());
  if (args.recent >= 0 && versions.size() > static_cast<size_t>(args.recent)) {
    versions.resize(static_cast<size_t>(args.recent));
  }
  std::vector<VersionStatus> listed;
  for (uint64_t v : versions) {
    Result<VersionStatus> vs = ReadVersion(s, *auth, v);
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
               v.base_version, v.decision, v.chunks, WithCommas(v.changed),
               votes);
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

void RegisterSyncCommands(CLI::App* app, SyncCommandArgs* args) {
  auto add_json = [](CLI::App* cmd, bool* json) {
    cmd->add_flag("--json", *json, "print JSON on stdout instead of text");
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
                  "store URL: a directory, file:///dir or s3://bucket/prefix")
      ->required();
  pub->add_option("--baseline", p.baseline,
                  "the publisher's own copy of the committed version; "
                  "advanced in place on commit")
      ->required();
  pub->add_option("--members", p.members,
                  "receiver names, comma-separated (r0,r1,...)")
      ->required()
      ->delimiter(',');
  pub->add_option("--version", p.version,
                  "the version to publish (above the store's head)")
      ->required();
  pub->add_option("TARGET", p.target, "the new checkpoint (file or directory)")
      ->required();
  add_key(pub, &p.key_file);
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
      ->check(CLI::NonNegativeNumber);
  pub->add_option("--upload-threads", p.upload_threads,
                  "concurrent chunk uploads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  pub->add_option("--serve-ms", p.serve_ms,
                  "after the decision, keep serving re-send requests this long")
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
      "step1.safetensors",
      kExitAborted));

  ReceiveArgs& r = args->receive;
  CLI::App* rcv = app->add_subcommand(
      "receive",
      "Follow the versions published to the store: apply each in place to "
      "CHECKPOINT (at most once per chunk, journaled), vote, and activate it "
      "after the joint commit. Runs until stopped (SIGTERM/SIGINT stop it "
      "between versions; a second signal stops it at once, safely), until "
      "--until, or after one version with --once.");
  args->receive_cmd = rcv;
  rcv->add_option("--store", r.store, "store URL (as for publish)")->required();
  rcv->add_option("--member", r.member, "this receiver's name")->required();
  rcv->add_option("--checkpoint", r.checkpoint,
                  "the checkpoint to keep in sync, patched in place")
      ->required();
  rcv->add_option("--state", r.state,
                  "state directory: active version, journal, last_error "
                  "(created if absent)")
      ->required();
  add_key(rcv, &r.key_file);
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
      ->check(CLI::NonNegativeNumber);
  rcv->add_flag("--json", r.json,
                "print one JSON object per line (events: start, version, "
                "error, exit)");
  rcv->footer(
      "Transient failures (unavailable store, no decision in time) are "
      "retried with backoff and recorded in STATE/last_error; others exit "
      "with the codes of `refit --help`.");

  StatusArgs& st = args->status;
  CLI::App* sts = app->add_subcommand(
      "status",
      "Show the store's head, recent versions with their decision and each "
      "member's vote, and for each --state directory the receiver's active "
      "version, lag and any interrupted version.");
  args->status_cmd = sts;
  sts->add_option("--store", st.store, "store URL")->required();
  add_key(sts, &st.key_file);
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
                       "store URL for the distribution section (must be "
                       "empty); default: a directory in the scratch dir");
  demo_cmd
      ->add_option("--link-gbit", sync->link_gbit,
                   "link speed in Gbit/s for the computed transfer times")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  demo_cmd
      ->add_option("--crash-version", sync->crash_version,
                   "the version in which one receiver is killed and "
                   "restarted; -1 = the middle one, 0 = none")
      ->capture_default_str();
  demo_cmd
      ->add_option("--crash-at", sync->crash_at,
                   "where it dies: a crash point (REFIT_CRASH_AT=name[:n], "
                   "not in Release builds), or 'parent' for a SIGKILL "
                   "from the demo once its journal exists")
      ->capture_default_str();
  demo_cmd
      ->add_option("--chunk-mib", sync->chunk_mib,
                   "chunk size of the published versions, in MiB")
      ->capture_default_str();
}

std::optional<int> RunSyncCommand(SyncCommandArgs* args, bool global_json) {
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
