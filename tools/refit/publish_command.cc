// `refit publish`: publishes one version as its trainer side and commit
// coordinator (docs/protocol.md), to a store, a relay tree, or both. See
// sync_commands.h.
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

namespace {

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
  Result<DeadlinePolicy> policy = ParseDeadlinePolicy(args.policy);
  if (!policy.ok()) return fail(policy.status().WithContext("--policy"));
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
  options.diff.allow_conditional = args.conditional;
  options.vote_timeout_ms = args.vote_timeout_ms;
  options.policy = *policy;
  options.upload_threads = std::max(1, args.upload_threads);
  options.pack_bytes = args.pack_bytes;
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
    if (Status s = (*publisher)
                       ->CheckPublished(args.version, CheckpointViews(*target));
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
  if (auto listed = (*store)->List(ResendPrefix(args.version)); listed.ok()) {
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

}  // namespace refit::cli
