// `refit status`: a store's versions, decisions and votes, the trainer
// ranks' parts of versions in flight, and a receiver's local state. See sync_commands.h.
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

struct VersionStatus {
  uint64_t version = 0;
  uint64_t base_version = 0;
  uint64_t chunks = 0;
  uint64_t changed = 0;
  std::string decision = "pending";  // commit, abort, pending
  bool uploading = false;            // announced, manifest not stored yet
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

// The parts of a version in flight that trainer ranks uploaded
// (docs/trainer.md, "Versions from many ranks"): per rank, its chunk
// objects so far and whether its part list (written last) is stored.
struct RankParts {
  uint64_t chunks = 0;
  uint64_t bytes = 0;
  bool listed = false;
};
using VersionParts = std::map<uint64_t, std::map<uint32_t, RankParts>>;  // V -> rank

// parts/<V: 20 digits>/<rank: 10 digits>/list or .../chunk/<k: 10 digits>
// (sync/keys.h); other keys are not parts.
bool ParsePartKey(std::string_view key, uint64_t* version, uint32_t* rank, bool* list) {
  auto digits = [](std::string_view d, uint64_t* out) {
    if (d.empty() || d.size() > 20) return false;
    auto [p, ec] = std::from_chars(d.data(), d.data() + d.size(), *out);
    return ec == std::errc() && p == d.data() + d.size();
  };
  constexpr std::string_view kPrefix = "parts/";
  if (key.substr(0, kPrefix.size()) != kPrefix) return false;
  key.remove_prefix(kPrefix.size());
  const size_t a = key.find('/');
  if (a != 20) return false;
  const size_t b = key.find('/', a + 1);
  if (b != a + 11) return false;
  uint64_t r = 0;
  if (!digits(key.substr(0, a), version) || !digits(key.substr(a + 1, 10), &r) ||
      r > UINT32_MAX) {
    return false;
  }
  *rank = static_cast<uint32_t>(r);
  const std::string_view rest = key.substr(b + 1);
  *list = rest == "list";
  return *list || (rest.size() == 16 && rest.substr(0, 6) == "chunk/");
}

// The parts stored for versions above `head` (every version without one).
Result<VersionParts> ReadParts(ObjectStore* store, std::optional<uint64_t> head) {
  VersionParts out;
  REFIT_ASSIGN_OR_RETURN(auto objects, store->List("parts/"));
  for (const ObjectInfo& o : objects) {
    uint64_t v = 0;
    uint32_t rank = 0;
    bool list = false;
    if (!ParsePartKey(o.key, &v, &rank, &list) || (head && v <= *head)) continue;
    RankParts& p = out[v][rank];
    if (list) {
      p.listed = true;
    } else {
      ++p.chunks;
      p.bytes += o.size;
    }
  }
  return out;
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
                  args.json,
                  "every node of a store uses the same key, or none");
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
  Result<VersionParts> parts = ReadParts(s, head);
  if (!parts.ok()) return fail(parts.status());
  // In flight: no decision yet (an aborted version's parts stay stored).
  for (auto it = parts->begin(); it != parts->end();) {
    Result<std::optional<Decision>> decided = reader.ReadDecision(it->first);
    it = decided.ok() && *decided ? parts->erase(it) : std::next(it);
  }

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
    Json ps = Json::array();
    for (const auto& [v, ranks] : *parts) {
      Json rs = Json::object();
      for (const auto& [rank, p] : ranks) {
        rs[std::to_string(rank)] = Json{{"chunks", p.chunks}, {"bytes", p.bytes},
                                        {"listed", p.listed}};
      }
      ps.push_back(Json{{"version", v}, {"ranks", rs}});
    }
    j["parts"] = ps;
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
  for (const auto& [v, ranks] : *parts) {
    // A version that trainer ranks publish, not decided yet: which ranks
    // stored their part list (a coordinator waits for all of them).
    size_t with_list = 0;
    for (const auto& [rank, p] : ranks) with_list += p.listed;
    fmt::print("\nparts of version {} in flight: {} rank(s), {} with their part list\n", v,
               ranks.size(), with_list);
    for (const auto& [rank, p] : ranks) {
      fmt::print("  rank {:>5}  {:>7} chunk(s) {:>14} bytes  {}\n", rank, p.chunks,
                 WithCommas(p.bytes), p.listed ? "listed" : "uploading");
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

}  // namespace refit::cli
