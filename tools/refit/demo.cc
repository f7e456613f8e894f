// `refit demo`, the end-to-end main job, in three sections:
//
// 1. codec: over one trajectory of checkpoints (the qwen2-tiny fixtures,
//    or a synthetic one), a scratch copy of step 0 is patched in place by
//    the delta of every step, and after each step every tensor of the
//    scratch copy must hash (SHA-256, independently of refit's own XXH3
//    hashes) to the same digest as the trainer's checkpoint for that step.
// 2. distribution: this process publishes every step of the same
//    trajectory as a version to N `refit receive` processes (this
//    executable, run again), one of which is SIGKILLed in the middle of a
//    version and restarted. By default the kill is synchronised with the
//    victim's progress: the upload of that version's chunks stops at chunk
//    K (ChunkGate) until the victim's journal records K applied chunks,
//    so it dies with exactly K applied (a version of at least K chunks),
//    in every build. By default
//    the receivers form a relay tree on 127.0.0.1 (fan-out --fanout) under
//    this process as its root, and every object is also written through
//    to a directory store (any OpenObjectStore URL with --store); with
//    --transport dir they read that store instead. Every version must
//    commit, and every receiver must hash to the trainer's tensors. Then
//    the bytes of the first delta file and of the first version in the
//    store are broken down, from the files and objects themselves.
// 3. at scale: one RL step of a synthetic model of --scale-mib (a few GiB)
//    published through a directory store to receivers on threads of this
//    process that hold the model in memory, as inference engines do; at
//    this size the per-version fixed costs that dominate section 2 no
//    longer do.
// Times are measured; link transfer times are computed and labelled so.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "base/file.h"
#include "base/process.h"
#include "cli_util.h"
#include "commands.h"
#include "refit/auth.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "refit/store.h"
#include "scratch_dir.h"
#include "sync/journal.h"
#include "sync/protocol.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "sync_commands.h"
#include "synth.h"
#include "transport/relay_store.h"

namespace refit::cli {
namespace {

namespace fs = std::filesystem;

using Digest = std::array<uint8_t, 32>;

bool IsFile(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// The qwen2-tiny folder under or at `dir`, or "".
std::string QwenDirIn(const fs::path& dir) {
  if (IsFile(dir / "qwen2-tiny" / "step0.safetensors")) {
    return (dir / "qwen2-tiny").lexically_normal().string();
  }
  if (IsFile(dir / "step0.safetensors")) return dir.lexically_normal().string();
  return "";
}

// Looks in $REFIT_FIXTURES_DIR, ../shared/fixtures from the current
// directory, then ../shared/fixtures from every ancestor of the executable
// (which finds the repo's sibling shared/ from build/<preset>/tools/refit).
std::string FindFixtures() {
  if (const char* env = std::getenv("REFIT_FIXTURES_DIR"); env && *env) {
    if (std::string d = QwenDirIn(env); !d.empty()) return d;
  }
  std::error_code ec;
  fs::path cwd = fs::current_path(ec);
  if (!ec) {
    if (std::string d = QwenDirIn(cwd / ".." / "shared" / "fixtures");
        !d.empty()) {
      return d;
    }
  }
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path();
         p = p.parent_path()) {
      if (std::string d = QwenDirIn(p / ".." / "shared" / "fixtures");
          !d.empty()) {
        return d;
      }
    }
  }
  return "";
}

Result<Digest> Sha256Of(std::span<const uint8_t> data) {
  Digest digest{};
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest.data(), &length, EVP_sha256(),
                 nullptr) != 1 ||
      length != digest.size()) {
    return InternalError("OpenSSL EVP_Digest(SHA-256) failed");
  }
  return digest;
}

Result<std::map<std::string, Digest>> Sha256Tensors(const std::string& path) {
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt,
                         Checkpoint::Open(path, Checkpoint::Mode::kReadOnly));
  std::map<std::string, Digest> digests;
  for (size_t i = 0; i < ckpt.tensors().size(); ++i) {
    REFIT_ASSIGN_OR_RETURN(digests[ckpt.tensors()[i].name],
                           Sha256Of(ckpt.Data(i)));
  }
  return digests;
}

struct Trajectory {
  std::string source;       // "fixtures" or "synthetic"
  std::string description;  // for the header line
  std::vector<std::string> steps;
};

struct CodecStep {
  int from = 0;
  DiffReport diff;
  InspectReport inspect;
  ApplyReport apply;
  double encode_seconds = 0;
  double apply_seconds = 0;
  size_t tensors_equal = 0;
  size_t tensors_total = 0;
  bool bit_exact = false;
  bool verified = false;
};

Result<Trajectory> SyntheticTrajectory(const DemoArgs& args,
                                       const ScratchDir& dir,
                                       ProgressBar* bar) {
  if (!(args.size_mib > 0) || args.steps < 1 || !(args.rate > 0) ||
      args.rate > 1) {
    return InvalidArgumentError(
        "--size-mib and --rate (0..1] must be positive and --steps at least 1");
  }
  Trajectory t;
  t.source = "synthetic";
  bar->Note("generating synthetic checkpoints...");
  SynthModel model = GenerateModel(
      static_cast<uint64_t>(args.size_mib * (1 << 20)), args.seed);
  for (int step = 0; step <= args.steps; ++step) {
    if (step > 0) {
      EvolveModel(&model, args.rate,
                  args.seed * 1000003 + static_cast<uint64_t>(step));
    }
    std::string path = dir.File(fmt::format("step{}.safetensors", step));
    REFIT_RETURN_IF_ERROR(
        WriteModel(model, path, {{"step", std::to_string(step)}}));
    t.steps.push_back(path);
  }
  bar->Clear();
  t.description = fmt::format(
      "synthetic BF16 model ({} tensors, {}), {} steps at {} changed per step, "
      "seed {}",
      model.tensors.size(), HumanBytes(static_cast<double>(model.bytes())),
      args.steps, Percent(args.rate, 1), args.seed);
  return t;
}

Result<CodecStep> RunStep(const Trajectory& t, int from,
                          const std::string& scratch, const ScratchDir& dir,
                          const DemoArgs& args, ProgressBar* bar) {
  CodecStep s;
  s.from = from;
  const std::string& base = t.steps[static_cast<size_t>(from)];
  const std::string& target = t.steps[static_cast<size_t>(from) + 1];
  std::string delta = dir.File(fmt::format("step{}-{}.rfd", from, from + 1));

  DiffOptions diff_options;
  diff_options.version = static_cast<uint64_t>(from) + 1;
  diff_options.base_version = static_cast<uint64_t>(from);
  diff_options.threads = args.threads;
  diff_options.progress = bar->Callback();
  Stopwatch encode;
  REFIT_ASSIGN_OR_RETURN(s.diff, Diff(base, target, delta, diff_options));
  s.encode_seconds = encode.Seconds();
  bar->Clear();
  REFIT_ASSIGN_OR_RETURN(s.inspect, Inspect(delta));

  ApplyOptions apply_options;
  apply_options.threads = args.threads;
  apply_options.sync = !args.no_sync;
  apply_options.progress = bar->Callback();
  Stopwatch apply;
  REFIT_ASSIGN_OR_RETURN(s.apply, Apply(delta, scratch, apply_options));
  s.apply_seconds = apply.Seconds();
  bar->Clear();

  REFIT_ASSIGN_OR_RETURN(auto got, Sha256Tensors(scratch));
  REFIT_ASSIGN_OR_RETURN(auto want, Sha256Tensors(target));
  s.tensors_total = want.size();
  for (const auto& [name, digest] : want) {
    auto it = got.find(name);
    if (it != got.end() && it->second == digest) ++s.tensors_equal;
  }
  s.bit_exact = got.size() == want.size() && s.tensors_equal == want.size();

  REFIT_ASSIGN_OR_RETURN(VerifyReport verify,
                         Verify(scratch, delta, args.threads));
  s.verified = verify.matches_target;
  return s;
}

// Where the trajectory comes from: --fixtures, the usual places, or a
// generated one. `notice` is set when fixtures were wanted but not found.
Result<Trajectory> LoadTrajectory(const DemoArgs& args, const ScratchDir& dir,
                                  ProgressBar* bar, bool* notice) {
  std::string fixtures;
  if (!args.synthetic) {
    if (!args.fixtures.empty()) {
      fixtures = QwenDirIn(args.fixtures);
      if (fixtures.empty()) {
        return NotFoundError(fmt::format(
            "no qwen2-tiny/step0.safetensors or step0.safetensors under "
            "--fixtures '{}'",
            args.fixtures));
      }
    } else {
      fixtures = FindFixtures();
    }
  }
  Trajectory trajectory;
  if (!fixtures.empty()) {
    trajectory.source = "fixtures";
    for (int step = 0;; ++step) {
      fs::path p = fs::path(fixtures) / fmt::format("step{}.safetensors", step);
      if (!IsFile(p)) break;
      trajectory.steps.push_back(p.string());
    }
    trajectory.description = fmt::format(
        "qwen2-tiny fixtures in {} ({} checkpoints from real RL steps)",
        fixtures, trajectory.steps.size());
  } else {
    *notice = !args.synthetic;
    REFIT_ASSIGN_OR_RETURN(trajectory, SyntheticTrajectory(args, dir, bar));
  }
  if (trajectory.steps.size() < 2) {
    return NotFoundError("the trajectory needs step0 and step1 at least");
  }
  return trajectory;
}

// Section 1: every step's delta applied to a scratch copy of step 0,
// checked by SHA-256 and by `Verify`. Prints the table unless args.json.
Result<std::vector<CodecStep>> RunCodecSection(const DemoArgs& args,
                                               const Trajectory& trajectory,
                                               const ScratchDir& dir,
                                               ProgressBar* bar, bool* all_ok) {
  // The "inference engine": a scratch copy of step 0, patched in place.
  std::string scratch = dir.File("engine.safetensors");
  REFIT_RETURN_IF_ERROR(CopyCheckpoint(trajectory.steps[0], scratch));
  if (!args.json) {
    fmt::print(
        "a copy of step0 (the engine) is patched in place by each "
        "step's delta ({}), then compared by SHA-256 per tensor\n\n",
        args.no_sync ? "not synced" : "msync + fsync included");
    fmt::print("{:<6} {:>8} {:>10} {:>10} {:>8}  {:>26} {:>9} {:>9}  {}\n",
               "step", "changed", "full", "delta", "ratio",
               "payload / entropy bound", "encode", "apply", "bit-exact");
  }
  std::vector<CodecStep> results;
  *all_ok = true;
  for (size_t from = 0; from + 1 < trajectory.steps.size(); ++from) {
    Result<CodecStep> r =
        RunStep(trajectory, static_cast<int>(from), scratch, dir, args, bar);
    if (!r.ok()) {
      return r.status().WithContext(
          fmt::format("step {} -> {}", from, from + 1));
    }
    const CodecStep& s = *r;
    bool ok = s.bit_exact && s.verified;
    *all_ok = *all_ok && ok;
    if (!args.json) {
      double rate = s.diff.total_elements == 0
                        ? 0.0
                        : static_cast<double>(s.diff.changed_elements) /
                              static_cast<double>(s.diff.total_elements);
      std::string bound =
          fmt::format("{} / {} {}",
                      HumanBytes(static_cast<double>(s.inspect.payload_bytes)),
                      HumanBytes(s.inspect.bound_bytes),
                      OverBound(static_cast<double>(s.inspect.payload_bytes),
                                s.inspect.bound_bytes));
      fmt::print(
          "{:<6} {:>8} {:>10} {:>10} {:>8}  {:>26} {:>9} {:>9}  {} "
          "({}/{} tensors){}\n",
          fmt::format("{}->{}", from, from + 1), Percent(rate),
          HumanBytes(static_cast<double>(s.diff.full_bytes)),
          HumanBytes(static_cast<double>(s.diff.file_bytes)),
          Ratio(static_cast<double>(s.diff.full_bytes),
                static_cast<double>(s.diff.file_bytes)),
          bound, HumanSeconds(s.encode_seconds), HumanSeconds(s.apply_seconds),
          s.bit_exact ? "yes" : "NO", s.tensors_equal, s.tensors_total,
          s.verified ? ", verify ok" : ", VERIFY FAILED");
    }
    results.push_back(s);
  }
  return results;
}

Json CodecStepsJson(const std::vector<CodecStep>& results) {
  Json steps = Json::array();
  for (const CodecStep& s : results) {
    steps.push_back({{"from", s.from},
                     {"to", s.from + 1},
                     {"tensors", s.diff.tensors},
                     {"total_elements", s.diff.total_elements},
                     {"changed_elements", s.diff.changed_elements},
                     {"full_bytes", s.diff.full_bytes},
                     {"delta_bytes", s.diff.file_bytes},
                     {"payload_bytes", s.inspect.payload_bytes},
                     {"bound_bytes", s.inspect.bound_bytes},
                     {"bound_valid", s.inspect.bound_valid},
                     {"chunks_by_kind", s.diff.chunks_by_kind},
                     {"encode_seconds", s.encode_seconds},
                     {"apply_seconds", s.apply_seconds},
                     {"pages_written", s.apply.pages_written},
                     {"tensors_equal", s.tensors_equal},
                     {"tensors_total", s.tensors_total},
                     {"bit_exact", s.bit_exact},
                     {"verified", s.verified}});
  }
  return steps;
}

// ------------------------------------------------- distribution section
//
// The trainer (this process) publishes every step through an ObjectStore
// opened by URL to N `refit receive` processes (this executable, run
// again), each patching its own copy of step 0. One receiver is SIGKILLed
// in the middle of one version and restarted; the version must still
// commit everywhere, and every receiver must hash to the trainer's tensors.

// A `refit receive` child process and how to start it again.
struct ReceiverProcess {
  std::string member;
  // Where it reads versions: {"--store", URL} or the relay flags.
  std::vector<std::string> transport;
  std::string checkpoint;
  std::string state;
  std::string log;  // stdout: JSON Lines, appended across restarts
  std::string err;  // stderr
  pid_t pid = -1;
  int starts = 0;
};

class ReceiverFleet {
 public:
  ReceiverFleet(std::string exe, std::string key_file, int64_t until)
      : exe_(std::move(exe)), key_file_(std::move(key_file)), until_(until) {}
  ReceiverFleet(const ReceiverFleet&) = delete;
  ReceiverFleet& operator=(const ReceiverFleet&) = delete;
  // Kills what is still running: the demo failed or is done.
  ~ReceiverFleet() {
    for (ReceiverProcess& r : receivers_) {
      if (r.pid > 0) {
        kill(r.pid, SIGKILL);
        waitpid(r.pid, nullptr, 0);
      }
    }
  }

  Status Add(const std::string& member, std::vector<std::string> transport,
             const std::string& base, const std::string& dir) {
    ReceiverProcess r;
    r.member = member;
    r.transport = std::move(transport);
    r.checkpoint = dir + "/model.safetensors";
    r.state = dir + "/state";
    r.log = dir + "/receive.jsonl";
    r.err = dir + "/receive.err";
    std::error_code ec;
    fs::create_directories(r.state, ec);
    if (ec) return UnavailableError("cannot create " + r.state);
    REFIT_RETURN_IF_ERROR(CopyCheckpoint(base, r.checkpoint));
    receivers_.push_back(std::move(r));
    return Status();
  }

  size_t size() const { return receivers_.size(); }
  ReceiverProcess& at(size_t i) { return receivers_[i]; }

  // Starts receiver i running until `until` (-1: the fleet's), with
  // REFIT_CRASH_AT=crash_at when not empty (and never otherwise).
  Status Start(size_t i, int64_t until = -1, const std::string& crash_at = "") {
    ReceiverProcess& r = receivers_[i];
    std::vector<std::string> args = {exe_, "receive"};
    args.insert(args.end(), r.transport.begin(), r.transport.end());
    args.insert(args.end(), {"--member", r.member, "--checkpoint", r.checkpoint,
                             "--state", r.state, "--until",
                             std::to_string(until >= 0 ? until : until_),
                             "--poll-ms", "2", "--threads", "1", "--json"});
    if (!key_file_.empty()) {
      args.push_back("--key-file");
      args.push_back(key_file_);
    }
    REFIT_ASSIGN_OR_RETURN(pid_t pid, SpawnLogged(args, r.log, r.err, crash_at));
    r.pid = pid;
    ++r.starts;
    return Status();
  }

  // Receiver i's active version, from its state directory.
  uint64_t Active(size_t i) const {
    Result<uint64_t> active = StateDir(receivers_[i].state).ReadActive();
    return active.ok() ? *active : 0;
  }

  // Collects children that ended: (index, wait status).
  std::vector<std::pair<size_t, int>> Reap() {
    std::vector<std::pair<size_t, int>> ended;
    for (size_t i = 0; i < receivers_.size(); ++i) {
      ReceiverProcess& r = receivers_[i];
      if (r.pid <= 0) continue;
      int status = 0;
      if (waitpid(r.pid, &status, WNOHANG) == r.pid) {
        r.pid = -1;
        ended.emplace_back(i, status);
      }
    }
    return ended;
  }

 private:
  std::string exe_;
  std::string key_file_;
  int64_t until_;
  std::vector<ReceiverProcess> receivers_;
};

std::string LastLine(const std::string& path) {
  Result<std::vector<uint8_t>> bytes = ReadFile(path);
  if (!bytes.ok()) return "";
  std::string text(bytes->begin(), bytes->end());
  while (!text.empty() && text.back() == '\n') text.pop_back();
  size_t nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);
}

// The JSON Lines a receiver printed, across its restarts.
std::vector<Json> ReadEvents(const std::string& path) {
  std::vector<Json> events;
  Result<std::vector<uint8_t>> bytes = ReadFile(path);
  if (!bytes.ok()) return events;
  std::string text(bytes->begin(), bytes->end());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    Json j = Json::parse(text.begin() + static_cast<long>(pos),
                         text.begin() + static_cast<long>(nl), nullptr, false);
    if (!j.is_discarded()) events.push_back(std::move(j));
    pos = nl + 1;
  }
  return events;
}

struct VersionRow {
  uint64_t version = 0;
  PublishReport publish;
  double refit_seconds = 0;  // publish start -> every receiver active
  size_t receivers_exact = 0;
  bool baseline_exact = false;
  std::vector<std::string> events;
};

// The mid-version kill of the distribution section, as planned and as it
// happened.
struct Crash {
  uint64_t version = 0;               // 0: no kill
  std::string member;                 // the victim
  bool by_demo = false;               // --crash-at chunks:N; else a crash point
  uint64_t after_chunks = 0;          // N
  std::string point;                  // the crash point (REFIT_CRASH_AT)
  bool killed = false;                // the victim died inside the version
  int64_t applied_at_kill = -1;       // its journal when the demo killed it
  int64_t journaled_at_restart = -1;  // what the restarted victim read
  // What the restarted victim did with the version (-1: not reported).
  int64_t skipped = -1;
  int64_t applied = -1;
  int64_t resent = -1;
  bool once = false;  // skipped + applied + resent = the version's chunks
};

// One version's objects in the store, by kind (stored sizes, envelopes
// included).
struct StoreBytes {
  uint64_t announcement = 0;  // index/<V>
  uint64_t chunks = 0;        // v/<V>/chunk/<i>: how many
  uint64_t chunk_objects = 0;
  uint64_t manifest = 0;
  uint64_t coordination = 0;  // votes and the decision: not the upload
  uint64_t coordination_objects = 0;
};

struct Distribution {
  std::string store;      // what the publisher writes to, described
  std::string transport;  // "relay" or "dir"
  int fanout = 0;
  std::string tree;  // "r0,r1 <- root; r2,r3 <- r0" for relay
  int receivers = 0;
  double link_gbit = 0;
  uint64_t chunk_bytes = 0;  // of the published versions
  Crash crash;
  StoreBytes first;  // version 1 in the store
  std::vector<VersionRow> rows;
  bool all_ok = true;
};

// The publisher's store, passing everything through except the chunks of
// one version from index `from` on, whose Put waits until Release(). The
// publisher hands chunks to its upload threads in index order (a FIFO
// queue, transport/once_uploader.h), so every chunk below `from` is stored
// while the held ones wait: until the gate opens, a receiver can apply
// exactly `from` chunks of that version, however fast it is. Thread-safe.
class ChunkGate final : public ObjectStore {
 public:
  explicit ChunkGate(ObjectStore* inner) : inner_(inner) {}

  void Hold(uint64_t version, uint64_t from) {
    std::lock_guard<std::mutex> lock(mu_);
    prefix_ = VersionPrefix(version) + "chunk/";
    from_ = from;
    holding_ = true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      holding_ = false;
    }
    cv_.notify_all();
  }

  std::string Describe() const override { return inner_->Describe(); }
  Status Put(std::string_view key, std::span<const uint8_t> data) override {
    Wait(key);
    return inner_->Put(key, data);
  }
  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override {
    Wait(key);
    return inner_->PutIfAbsent(key, data);
  }
  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    return inner_->Get(key);
  }
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    return inner_->List(prefix);
  }
  Status Delete(std::string_view key) override { return inner_->Delete(key); }

 private:
  // Under mu_.
  bool Held(std::string_view key) const {
    if (!holding_ || !key.starts_with(prefix_)) return false;
    const std::string_view digits = key.substr(prefix_.size());
    uint64_t index = 0;
    auto [end, ec] =
        std::from_chars(digits.data(), digits.data() + digits.size(), index);
    return ec == std::errc() && end == digits.data() + digits.size() &&
           index >= from_;
  }
  void Wait(std::string_view key) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !Held(key); });
  }

  ObjectStore* inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool holding_ = false;
  std::string prefix_;
  uint64_t from_ = 0;
};

// --crash-at into `c`: "chunks:N" (N >= 1) in every build, a crash point
// name where this build has them.
Status ParseCrashAt(const std::string& at, Crash* c) {
  constexpr std::string_view kChunks = "chunks:";
  if (std::string_view(at).starts_with(kChunks)) {
    const std::string_view n = std::string_view(at).substr(kChunks.size());
    auto [end, ec] =
        std::from_chars(n.data(), n.data() + n.size(), c->after_chunks);
    if (ec != std::errc() || end != n.data() + n.size() ||
        c->after_chunks < 1) {
      return InvalidArgumentError(
          "--crash-at chunks:N needs a whole number N >= 1");
    }
    c->by_demo = true;
    return Status();
  }
#ifdef REFIT_CRASH_POINTS
  c->point = at;
  return Status();
#else
  return InvalidArgumentError(
      "--crash-at '" + at +
      "': this build (Release) has no crash points; use chunks:N");
#endif
}

// The kill that --crash-version and --crash-at ask for.
Result<Crash> PlanCrash(const SyncDemoArgs& sync, uint64_t versions) {
  Crash c;
  const int64_t v = sync.crash_version < 0
                        ? static_cast<int64_t>((versions + 1) / 2)
                        : sync.crash_version;
  if (v <= 0 || v > static_cast<int64_t>(versions)) return c;
  c.version = static_cast<uint64_t>(v);
  REFIT_RETURN_IF_ERROR(ParseCrashAt(sync.crash_at, &c));
  return c;
}

// Sizes of version `v`'s objects in `store`, by kind.
Result<StoreBytes> VersionObjects(ObjectStore* store, uint64_t v) {
  StoreBytes b;
  REFIT_ASSIGN_OR_RETURN(std::vector<ObjectInfo> index,
                         store->List(IndexKey(v)));
  for (const ObjectInfo& o : index) {
    if (o.key == IndexKey(v)) b.announcement = o.size;
  }
  const std::string chunk_prefix = VersionPrefix(v) + "chunk/";
  REFIT_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects,
                         store->List(VersionPrefix(v)));
  for (const ObjectInfo& o : objects) {
    if (o.key.starts_with(chunk_prefix)) {
      ++b.chunks;
      b.chunk_objects += o.size;
    } else if (o.key == ManifestKey(v)) {
      b.manifest = o.size;
    } else {
      ++b.coordination_objects;
      b.coordination += o.size;
    }
  }
  return b;
}

// A random 32-byte HMAC key in hex, so the demo runs authenticated.
Status WriteKeyFile(const std::string& path) {
  std::random_device rd;
  std::string hex;
  for (int i = 0; i < 32; ++i) {
    hex += fmt::format("{:02x}", static_cast<unsigned>(rd() & 0xFF));
  }
  hex += "\n";
  return WriteFileAtomic(
      path, std::span<const uint8_t>(
                reinterpret_cast<const uint8_t*>(hex.data()), hex.size()));
}

// A TCP port on 127.0.0.1 that was free a moment ago (bound, read, closed),
// for relay endpoints that must keep their address across restarts.
Result<int> FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return UnavailableError("socket: " + std::string(strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  int err = errno;
  close(fd);
  if (!ok)
    return UnavailableError("bind 127.0.0.1:0: " + std::string(strerror(err)));
  return static_cast<int>(ntohs(addr.sin_port));
}

Result<size_t> CountExact(const std::vector<std::string>& paths,
                          const std::map<std::string, Digest>& want) {
  size_t exact = 0;
  for (const std::string& path : paths) {
    REFIT_ASSIGN_OR_RETURN(auto got, Sha256Tensors(path));
    if (got == want) ++exact;
  }
  return exact;
}

Result<Distribution> RunDistribution(const DemoArgs& args,
                                     const SyncDemoArgs& sync,
                                     const Trajectory& trajectory,
                                     const ScratchDir& dir) {
  using Clock = std::chrono::steady_clock;
  const uint64_t versions = trajectory.steps.size() - 1;
  Distribution out;
  out.receivers = sync.receivers;
  out.link_gbit = sync.link_gbit;
  const std::string store_url =
      sync.store.empty() ? dir.File("store") : sync.store;
  const bool relay = sync.transport == "relay";
  out.transport = relay ? "relay" : "dir";
  out.fanout = relay ? sync.fanout : 0;
  REFIT_ASSIGN_OR_RETURN(out.crash, PlanCrash(sync, versions));
  Crash& crash = out.crash;
  const int64_t crash_version = static_cast<int64_t>(crash.version);

  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec)
    return UnavailableError("cannot find this executable: " + ec.message());
  std::string key_file = dir.File("hmac.key");
  REFIT_RETURN_IF_ERROR(WriteKeyFile(key_file));
  REFIT_ASSIGN_OR_RETURN(Authenticator auth,
                         Authenticator::FromKeyFile(key_file));
  // The publisher's store: the relay root (written through to the
  // directory store), or the directory store itself.
  std::unique_ptr<ObjectStore> store;
  RelayRootStore* root = nullptr;
  if (relay) {
    RelayOptions root_options;
    root_options.log_to_stderr = false;  // a killed child is expected
    REFIT_ASSIGN_OR_RETURN(
        std::unique_ptr<RelayRootStore> r,
        RelayRootStore::Open("127.0.0.1:0", store_url, root_options));
    root = r.get();
    store = std::move(r);
  } else {
    REFIT_ASSIGN_OR_RETURN(store, OpenObjectStore(store_url));
  }
  ObjectStore* durable = root ? root->durable() : store.get();
  REFIT_ASSIGN_OR_RETURN(auto existing, durable->List(""));
  if (!existing.empty()) {
    return FailedPreconditionError("--store '" + store_url +
                                   "' is not empty; give the demo a new one");
  }
  out.store = store->Describe();

  std::string baseline = dir.File("publisher.safetensors");
  REFIT_RETURN_IF_ERROR(CopyCheckpoint(trajectory.steps[0], baseline));
  PublisherOptions popt;
  for (int i = 0; i < sync.receivers; ++i)
    popt.members.push_back(fmt::format("r{}", i));
  popt.auth = auth;
  REFIT_ASSIGN_OR_RETURN(uint64_t chunk_bytes, [&]() -> Result<uint64_t> {
    if (!(sync.chunk_mib > 0) || sync.chunk_mib > 1024) {
      return InvalidArgumentError("--chunk-mib is out of range");
    }
    return static_cast<uint64_t>(std::llround(sync.chunk_mib * (1 << 20)));
  }());
  popt.diff.chunk_bytes = chunk_bytes;
  out.chunk_bytes = chunk_bytes;
  popt.diff.threads = args.threads;
  popt.vote_timeout_ms = 60000;
  popt.poll_ms = 2;
  ChunkGate gate(store.get());
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<Publisher> publisher,
                         Publisher::Open(&gate, baseline, popt));

  // Each receiver's transport flags. In the tree, members with children
  // listen on a fixed free port, so a restarted member keeps its address;
  // leaves listen on nothing. The victim (the last member) is a leaf.
  std::vector<std::vector<std::string>> transport(
      static_cast<size_t>(sync.receivers));
  std::vector<int> parents;
  if (relay) {
    REFIT_ASSIGN_OR_RETURN(parents,
                           RelayTreeParents(sync.receivers, sync.fanout));
    std::vector<std::string> listen(parents.size());
    for (int p : parents) {
      if (p >= 0 && listen[static_cast<size_t>(p)].empty()) {
        REFIT_ASSIGN_OR_RETURN(int port, FreeLoopbackPort());
        listen[static_cast<size_t>(p)] = fmt::format("127.0.0.1:{}", port);
      }
    }
    std::map<int, std::string> under;  // parent -> "r2,r3"
    for (size_t i = 0; i < parents.size(); ++i) {
      const int p = parents[i];
      std::string& names = under[p];
      names += (names.empty() ? "" : ",") + popt.members[i];
      transport[i] = {"--relay-parent",
                      p < 0 ? root->root()->listen_address()
                            : listen[static_cast<size_t>(p)],
                      "--relay-parent-timeout-ms", "30000"};
      if (!listen[i].empty()) {
        transport[i].insert(transport[i].end(), {"--relay-listen", listen[i]});
      }
    }
    for (const auto& [p, names] : under) {
      out.tree += fmt::format(
          "{}{} <- {}", out.tree.empty() ? "" : "; ", names,
          p < 0 ? std::string("root") : popt.members[static_cast<size_t>(p)]);
    }
  } else {
    for (auto& t : transport) t = {"--store", store_url};
  }
  ReceiverFleet fleet(exe.string(), key_file, static_cast<int64_t>(versions));
  std::vector<std::string> checkpoints;
  for (int i = 0; i < sync.receivers; ++i) {
    std::string rdir = dir.File(fmt::format("r{}", i));
    REFIT_RETURN_IF_ERROR(fleet.Add(popt.members[static_cast<size_t>(i)],
                                    transport[static_cast<size_t>(i)],
                                    trajectory.steps[0], rdir));
    checkpoints.push_back(fleet.at(static_cast<size_t>(i)).checkpoint);
  }
  // The victim is the last receiver. Killed by the demo, it runs from the
  // start. At a crash point, it runs up to the version before the crash,
  // then again with REFIT_CRASH_AT for the crash version (crash points
  // count hits per process), then once more without it.
  const size_t victim = fleet.size() - 1;
  crash.member = fleet.at(victim).member;
  const bool crash_point = crash.version > 0 && !crash.by_demo;
  // Whether the victim runs armed for the crash version already.
  bool armed = false;
  for (size_t i = 0; i < fleet.size(); ++i) {
    if (crash_point && i == victim) {
      if (crash_version == 1) {
        REFIT_RETURN_IF_ERROR(fleet.Start(i, -1, crash.point));
        armed = true;
      } else {
        REFIT_RETURN_IF_ERROR(fleet.Start(i, crash_version - 1));
      }
    } else {
      REFIT_RETURN_IF_ERROR(fleet.Start(i));
    }
  }

  for (uint64_t v = 1; v <= versions; ++v) {
    VersionRow row;
    row.version = v;
    if (crash_point && static_cast<int64_t>(v) == crash_version && !armed) {
      // The victim stopped at v-1 (--until); wait for it, then restart it
      // armed for this version.
      ReceiverProcess& r = fleet.at(victim);
      auto deadline = Clock::now() + std::chrono::seconds(60);
      while (r.pid > 0 && Clock::now() < deadline) {
        for (auto [i, status] : fleet.Reap()) {
          if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            return InternalError(
                fmt::format("receiver {} failed before version {}: {}",
                            fleet.at(i).member, v, LastLine(fleet.at(i).err)));
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      if (r.pid > 0) {
        return InternalError(
            fmt::format("{} did not stop at version {}", r.member, v - 1));
      }
      REFIT_RETURN_IF_ERROR(fleet.Start(victim, -1, crash.point));
      armed = true;
    }
    // Killed by the demo: the upload of this version stops at chunk N
    // until the victim's journal records N applied chunks and the victim
    // is dead.
    bool kill_pending =
        crash.by_demo && static_cast<int64_t>(v) == crash_version;
    bool reap_pending = false;
    if (kill_pending) gate.Hold(v, crash.after_chunks);

    auto t0 = Clock::now();
    Result<PublishReport> report = InternalError("not run");
    std::atomic<bool> published{false};
    std::thread trainer([&] {
      report = publisher->PublishCheckpoint(v, trajectory.steps[v]);
      published = true;
    });
    std::optional<double> all_active;
    Status failure;
    auto deadline = t0 + std::chrono::seconds(120);
    for (;;) {
      for (auto [i, status] : fleet.Reap()) {
        ReceiverProcess& r = fleet.at(i);
        if (WIFSIGNALED(status)) {
          std::string rejoin;
          if (relay) {
            const int p = parents[i];
            rejoin =
                fmt::format("; it reconnects to its parent {} for a replay",
                            p < 0 ? std::string("(the root)")
                                  : fleet.at(static_cast<size_t>(p)).member);
          }
          std::string progress;
          if (i == victim && reap_pending) {
            progress =
                fmt::format(", its journal recording {} applied chunk(s)",
                            crash.applied_at_kill);
          }
          if (i == victim && static_cast<int64_t>(v) == crash_version) {
            crash.killed = true;
          }
          row.events.push_back(fmt::format(
              "{} was killed by signal {}{} in the middle of version {} "
              "(active {}){}; restarted{}",
              r.member, WTERMSIG(status),
              WTERMSIG(status) == SIGKILL ? " (SIGKILL)" : "", v,
              fleet.Active(i), progress, rejoin));
          if (Status s = fleet.Start(i); !s.ok()) failure = s;
          if (i == victim && reap_pending) {
            reap_pending = false;
            gate.Release();
          }
          continue;
        }
        // A clean exit is expected at --until: the last version, or the
        // victim's stop before the crash version.
        uint64_t active = fleet.Active(i);
        bool expected = WEXITSTATUS(status) == 0 &&
                        (active >= versions ||
                         (i == victim &&
                          static_cast<int64_t>(active) + 1 == crash_version));
        if (!expected) {
          failure = InternalError(fmt::format(
              "receiver {} exited with code {} at version {}: {}", r.member,
              WEXITSTATUS(status), active, LastLine(r.err)));
        }
      }
      if (kill_pending && fleet.at(victim).pid > 0) {
        Result<std::optional<JournalState>> journal =
            Journal::Load(StateDir(fleet.at(victim).state).journal_path());
        if (journal.ok() && journal->has_value() && (*journal)->version == v &&
            (*journal)->applied.size() >= crash.after_chunks) {
          kill(fleet.at(victim).pid, SIGKILL);
          crash.applied_at_kill =
              static_cast<int64_t>((*journal)->applied.size());
          kill_pending = false;
          reap_pending = true;
        } else if (fleet.Active(victim) >= v) {
          // The version had too few chunks to hold any back.
          kill_pending = false;
          gate.Release();
        }
      }
      if (!all_active) {
        bool all = true;
        for (size_t i = 0; i < fleet.size() && all; ++i) {
          all = fleet.Active(i) >= v;
        }
        if (all) {
          all_active = std::chrono::duration<double>(Clock::now() - t0).count();
        }
      }
      if (!failure.ok()) break;
      if (published && (all_active || !report.ok() || !report->committed)) {
        break;
      }
      if (Clock::now() > deadline) {
        failure = DeadlineExceededError(fmt::format(
            "version {} did not reach every receiver within 120 s", v));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    gate.Release();  // the publisher must not wait on a failed demo
    trainer.join();
    REFIT_RETURN_IF_ERROR(failure);
    if (!report.ok()) {
      return report.status().WithContext(
          fmt::format("publishing version {}", v));
    }
    row.publish = *report;
    if (!report->committed) {
      return AbortedError(
          fmt::format("version {} was aborted: {}", v, report->reason));
    }
    row.refit_seconds = *all_active;
    if (v == 1) {
      REFIT_ASSIGN_OR_RETURN(out.first, VersionObjects(durable, v));
    }

    // Every receiver and the publisher's baseline against the trainer.
    REFIT_ASSIGN_OR_RETURN(auto want, Sha256Tensors(trajectory.steps[v]));
    REFIT_ASSIGN_OR_RETURN(row.receivers_exact, CountExact(checkpoints, want));
    REFIT_ASSIGN_OR_RETURN(size_t b, CountExact({baseline}, want));
    row.baseline_exact = b == 1;
    out.all_ok = out.all_ok && row.baseline_exact &&
                 row.receivers_exact == checkpoints.size();
    out.rows.push_back(std::move(row));
  }

  // What the restarted victim says it did with the crash version.
  if (crash.version > 0) {
    VersionRow& row = out.rows[crash.version - 1];
    if (!crash.killed) {
      row.events.push_back(fmt::format(
          "{} was not killed: version {} has fewer chunks than --crash-at "
          "asks for",
          crash.member, crash.version));
    }
    for (const Json& e : ReadEvents(fleet.at(victim).log)) {
      if (e.value("event", "") == "start" && e.contains("resume")) {
        crash.journaled_at_restart = static_cast<int64_t>(
            e["resume"].value("chunks_journaled", uint64_t{0}));
        row.events.push_back(fmt::format(
            "{} restarted from its journal of version {}: {} chunk(s) "
            "journaled applied before the kill",
            crash.member, e["resume"].value("version", uint64_t{0}),
            crash.journaled_at_restart));
      }
      if (e.value("event", "") == "version" &&
          e.value("version", int64_t{0}) == crash_version) {
        // At most once: what the restarted run applied, skipped (found in
        // place) and had re-sent (torn) adds up to the version's chunks.
        const uint64_t skipped = e.value("chunks_skipped", uint64_t{0});
        const uint64_t applied = e.value("chunks_applied", uint64_t{0});
        const uint64_t resent = e.value("chunks_resent", uint64_t{0});
        crash.skipped = static_cast<int64_t>(skipped);
        crash.applied = static_cast<int64_t>(applied);
        crash.resent = static_cast<int64_t>(resent);
        crash.once = skipped + applied + resent == row.publish.diff.chunks;
        row.events.push_back(fmt::format(
            "{} finished version {} after the restart: {} chunk(s) skipped "
            "(already applied), {} applied, {} re-sent{}",
            crash.member, crash_version, skipped, applied, resent,
            crash.once ? fmt::format(" = all {} chunks, none applied twice",
                                     row.publish.diff.chunks)
                       : fmt::format(" != {} chunks: AT-MOST-ONCE VIOLATED",
                                     row.publish.diff.chunks)));
      }
    }
    // A kill that happened must be followed by a resume that accounts for
    // every chunk exactly once.
    if (crash.killed) out.all_ok = out.all_ok && crash.once;
  }
  // Every receiver runs until the last version and exits by itself.
  auto deadline = Clock::now() + std::chrono::seconds(30);
  size_t running = fleet.size();
  while (running > 0 && Clock::now() < deadline) {
    running = 0;
    fleet.Reap();
    for (size_t i = 0; i < fleet.size(); ++i) running += fleet.at(i).pid > 0;
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return out;
}

// ------------------------------------------------------ section at scale
//
// One RL step of a synthetic model of a realistic size (synth.h: the same
// generator as `refit bench` and `--synthetic`), published by this process
// through a directory store to receivers on threads of this process, each
// holding its own copy of the model in memory as an inference engine does
// (ReceiverOptions::tensors: applied in place, nothing written back to a
// file). Setup (generating, writing the publisher's baseline, copying the
// model into the receivers, the RL step) is timed apart from the version.

struct Scale {
  std::string description;  // the model and the step
  std::string store;
  int receivers = 0;
  double link_gbit = 0;
  uint64_t chunk_bytes = 0;
  double generate_seconds = 0;  // GenerateModel
  // The publisher's baseline file and step 0 into every receiver's
  // memory, side by side.
  double copy_seconds = 0;
  double step_seconds = 0;  // EvolveModel
  VersionRow row;
  bool all_ok = false;
};

Result<std::map<std::string, Digest>> Sha256Model(const SynthModel& model) {
  std::map<std::string, Digest> digests;
  for (const SynthTensor& t : model.tensors) {
    REFIT_ASSIGN_OR_RETURN(
        digests[t.name],
        Sha256Of({reinterpret_cast<const uint8_t*>(t.data.data()),
                  t.data.size() * sizeof(uint16_t)}));
  }
  return digests;
}

Result<Scale> RunScale(const DemoArgs& args, const SyncDemoArgs& sync,
                       const ScratchDir& dir, ProgressBar* bar) {
  using Clock = std::chrono::steady_clock;
  if (!(args.rate > 0) || args.rate > 1) {
    return InvalidArgumentError("--rate must be in (0, 1]");
  }
  Scale out;
  out.receivers = sync.scale_receivers;
  out.link_gbit = sync.link_gbit;
  const std::string root = dir.File("scale");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return UnavailableError("cannot create " + root);

  bar->Note("generating the synthetic model...");
  Stopwatch generate;
  SynthModel model = GenerateModel(
      static_cast<uint64_t>(std::llround(sync.scale_mib * (1 << 20))),
      args.seed);
  out.generate_seconds = generate.Seconds();
  // The publisher's baseline file and every receiver's copy of step 0,
  // made side by side (one thread each).
  bar->Note(
      "writing the publisher's baseline, copying step0 into the "
      "receivers...");
  const std::string baseline = root + "/publisher.safetensors";
  Stopwatch copy;
  Status written;
  std::vector<SynthModel> engines(static_cast<size_t>(sync.scale_receivers));
  {
    std::vector<std::thread> threads;
    threads.emplace_back([&] {
      written = WriteModel(model, baseline, {{"step", "0"}});
    });
    for (SynthModel& engine : engines) {
      threads.emplace_back([&] { engine = model; });
    }
    for (std::thread& t : threads) t.join();
  }
  REFIT_RETURN_IF_ERROR(written);
  out.copy_seconds = copy.Seconds();
  bar->Note("one RL step...");
  Stopwatch step;
  const uint64_t changed =
      EvolveModel(&model, args.rate, args.seed * 1000003 + 1);
  out.step_seconds = step.Seconds();
  bar->Clear();
  out.description = fmt::format(
      "synthetic BF16 model ({} tensors, {}), one RL step changing {} of "
      "its {} elements ({}), seed {}",
      model.tensors.size(), HumanBytes(static_cast<double>(model.bytes())),
      WithCommas(changed), WithCommas(model.elements()),
      Percent(static_cast<double>(changed) /
              static_cast<double>(model.elements())),
      args.seed);

  const std::string key_file = root + "/hmac.key";
  REFIT_RETURN_IF_ERROR(WriteKeyFile(key_file));
  REFIT_ASSIGN_OR_RETURN(Authenticator auth,
                         Authenticator::FromKeyFile(key_file));
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> store,
                         OpenObjectStore(root + "/store"));
  out.store = store->Describe();
  PublisherOptions popt;
  for (int i = 0; i < sync.scale_receivers; ++i) {
    popt.members.push_back(fmt::format("e{}", i));
  }
  popt.auth = auth;
  popt.diff.threads = args.threads;
  popt.vote_timeout_ms = 60000;
  popt.poll_ms = 2;
  out.chunk_bytes = popt.diff.chunk_bytes;
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<Publisher> publisher,
                         Publisher::Open(store.get(), baseline, popt));
  std::vector<std::unique_ptr<Receiver>> receivers;
  for (size_t i = 0; i < engines.size(); ++i) {
    ReceiverOptions ropt;
    ropt.member = popt.members[i];
    for (SynthTensor& t : engines[i].tensors) {
      ropt.tensors.push_back({t.name, "BF16", 2, t.shape,
                              reinterpret_cast<uint8_t*>(t.data.data())});
    }
    ropt.state_dir = root + "/" + ropt.member + ".state";
    fs::create_directories(ropt.state_dir, ec);
    if (ec) return UnavailableError("cannot create " + ropt.state_dir);
    ropt.auth = auth;
    ropt.threads = args.threads;
    ropt.poll_ms = 2;
    REFIT_ASSIGN_OR_RETURN(std::unique_ptr<Receiver> r,
                           Receiver::Open(store.get(), std::move(ropt)));
    receivers.push_back(std::move(r));
  }

  bar->Note("publishing version 1...");
  std::vector<Status> status(receivers.size());
  std::vector<double> active(receivers.size(), 0);
  const auto t0 = Clock::now();
  std::vector<std::thread> followers;
  for (size_t i = 0; i < receivers.size(); ++i) {
    followers.emplace_back([&, i] {
      Result<StepResult> r = receivers[i]->SyncTo(1, 120000);
      active[i] = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!r.ok()) status[i] = r.status();
    });
  }
  Result<PublishReport> report = publisher->Publish(1, model.Views());
  for (std::thread& t : followers) t.join();
  bar->Clear();
  if (!report.ok()) return report.status().WithContext("publishing version 1");
  for (size_t i = 0; i < receivers.size(); ++i) {
    if (!status[i].ok()) {
      return status[i].WithContext("receiver " + popt.members[i]);
    }
  }
  if (!report->committed) {
    return AbortedError("version 1 was aborted: " + report->reason);
  }
  out.row.version = 1;
  out.row.publish = *report;
  out.row.refit_seconds = *std::max_element(active.begin(), active.end());

  // SHA-256 of the trainer's model, every receiver's and the publisher's
  // baseline file, one thread each.
  bar->Note("checking every receiver by SHA-256...");
  using Digests = std::map<std::string, Digest>;
  std::vector<Result<Digests>> digests(engines.size() + 2,
                                       InternalError("not run"));
  {
    std::vector<std::thread> threads;
    threads.emplace_back([&] { digests[0] = Sha256Model(model); });
    threads.emplace_back([&] { digests[1] = Sha256Tensors(baseline); });
    for (size_t i = 0; i < engines.size(); ++i) {
      threads.emplace_back(
          [&, i] { digests[i + 2] = Sha256Model(engines[i]); });
    }
    for (std::thread& t : threads) t.join();
  }
  for (const Result<Digests>& d : digests) REFIT_RETURN_IF_ERROR(d.status());
  const Digests& want = *digests[0];
  out.row.baseline_exact = *digests[1] == want;
  for (size_t i = 2; i < digests.size(); ++i) {
    out.row.receivers_exact += *digests[i] == want;
  }
  bar->Clear();
  out.all_ok =
      out.row.baseline_exact && out.row.receivers_exact == engines.size();
  return out;
}

// ---------------------------------------------------------------- output

double Seconds(double bytes, double gbit) { return bytes * 8 / (gbit * 1e9); }

// A version's times at the link: full = the full checkpoint's bytes over
// it (computed); refit = the measured refit time, or the payload's time
// over the link when that is longer.
struct AtLink {
  double full = 0;
  double refit = 0;
};
AtLink TimesAtLink(const VersionRow& r, double gbit) {
  return {
      Seconds(static_cast<double>(r.publish.diff.full_bytes), gbit),
      std::max(r.refit_seconds,
               Seconds(static_cast<double>(r.publish.bytes_uploaded), gbit))};
}

void PrintTimesLegend(std::string_view where, double link_gbit) {
  fmt::print(
      "measured: refit = publish start -> every receiver has activated the "
      "version (encode, upload, apply, vote, decision, activate), on this "
      "machine ({}).\n"
      "computed at {} Gbit/s: full = full bytes / link; refit@link = "
      "max(measured refit, payload / link); speedup = full / refit@link.\n\n",
      where, link_gbit);
}

void PrintVersionTable(const std::vector<VersionRow>& rows, int receivers,
                       double link_gbit) {
  fmt::print(
      "{:<7} {:>8} {:>10} {:>10} {:>7} {:>9} {:>9} {:>9} {:>10} {:>10} "
      "{:>8}  {}\n",
      "version", "changed", "payload", "full", "ratio", "enc+upl", "commit",
      "refit", "full@link", "refit@link", "speedup", "SHA-256 = trainer");
  for (const VersionRow& r : rows) {
    const DiffReport& diff = r.publish.diff;
    double rate = diff.total_elements == 0
                      ? 0.0
                      : static_cast<double>(diff.changed_elements) /
                            static_cast<double>(diff.total_elements);
    const AtLink t = TimesAtLink(r, link_gbit);
    fmt::print(
        "{:<7} {:>8} {:>10} {:>10} {:>7} {:>9} {:>9} {:>9} {:>10} {:>10} "
        "{:>8}  {}/{} receivers{}\n",
        r.version, Percent(rate),
        HumanBytes(static_cast<double>(r.publish.bytes_uploaded)),
        HumanBytes(static_cast<double>(diff.full_bytes)),
        Ratio(static_cast<double>(diff.full_bytes),
              static_cast<double>(r.publish.bytes_uploaded)),
        HumanSeconds(r.publish.encode_upload_seconds),
        HumanSeconds(r.publish.commit_seconds), HumanSeconds(r.refit_seconds),
        HumanSeconds(t.full), HumanSeconds(t.refit), Ratio(t.full, t.refit, 2),
        r.receivers_exact, receivers,
        r.baseline_exact ? ", publisher too" : ", PUBLISHER DIFFERS");
    for (const std::string& e : r.events) fmt::print("        - {}\n", e);
  }
}

std::string MiB(uint64_t bytes) {
  return fmt::format("{:g} MiB", static_cast<double>(bytes) / (1 << 20));
}

// Why the first step's delta file and the first version in the store have
// different sizes, from both sides' real numbers: the same kind of chunks
// (cut at different chunk sizes), in two different containers.
void PrintBytesBreakdown(const DiffReport& file, const Distribution& d) {
  const VersionRow& v1 = d.rows.front();
  const DiffReport& pub = v1.publish.diff;
  const StoreBytes& b = d.first;
  const uint64_t envelopes =
      b.chunk_objects > pub.chunk_bytes ? b.chunk_objects - pub.chunk_bytes : 0;
  auto kb = [](uint64_t bytes) {
    return HumanBytes(static_cast<double>(bytes));
  };
  fmt::print(
      "\nbytes: the delta file of step 0->1 and version 1 in the store hold "
      "the same kind of chunks (payload + per-chunk header and range "
      "hashes), cut at different sizes, in different containers:\n");
  fmt::print(
      "  delta file {:>9} = {} chunks of <= {}: {} ({} payload + {} chunk "
      "headers) + {} file header, tensor table with hashes, chunk index and "
      "the target's safetensors header\n",
      kb(file.file_bytes), file.chunks, MiB(DiffOptions{}.chunk_bytes),
      kb(file.chunk_bytes), kb(file.payload_bytes),
      kb(file.chunk_bytes - file.payload_bytes),
      kb(file.file_bytes - file.chunk_bytes));
  const uint64_t listed = b.announcement + b.chunk_objects + b.manifest;
  fmt::print(
      "  store      {:>9} = {} chunks of <= {}: {} ({} payload + {} chunk "
      "headers) + {} authentication envelopes ({} B per chunk object) + {} "
      "announcement + {} manifest (every chunk's size and SHA-256, tensor "
      "hashes before and after){}\n",
      kb(v1.publish.bytes_uploaded), pub.chunks, MiB(d.chunk_bytes),
      kb(pub.chunk_bytes), kb(pub.payload_bytes),
      kb(pub.chunk_bytes - pub.payload_bytes), kb(envelopes),
      b.chunks == 0 ? 0 : envelopes / b.chunks, kb(b.announcement),
      kb(b.manifest),
      listed == v1.publish.bytes_uploaded
          ? ""
          : fmt::format(" (objects listed: {}, not the bytes uploaded)",
                        kb(listed)));
}

void PrintDistribution(const Distribution& d, const DiffReport& first_file,
                       bool scale_follows) {
  if (d.transport == "relay") {
    fmt::print(
        "trainer (this process, the {}) -> {} `refit receive` processes in "
        "a relay tree on loopback, fan-out {}: {} (HMAC-SHA256 "
        "authenticated); each receiver patches its own copy of step0 in "
        "place, votes, and activates after the joint commit\n",
        d.store, d.receivers, d.fanout, d.tree);
  } else {
    fmt::print(
        "trainer (this process) -> {} `refit receive` processes through the "
        "store {} (HMAC-SHA256 authenticated); each receiver patches its own "
        "copy of step0 in place, votes, and activates after the joint "
        "commit\n",
        d.receivers, d.store);
  }
  const Crash& c = d.crash;
  if (c.version > 0 && c.by_demo) {
    fmt::print(
        "crash: {} is SIGKILLed by the demo once its journal records {} "
        "applied chunk(s) of version {} (the upload of that version's chunk "
        "{} onward waits until then), then restarted\n",
        c.member, c.after_chunks, c.version, c.after_chunks);
  } else if (c.version > 0) {
    fmt::print(
        "crash: {} dies by SIGKILL at crash point {} (REFIT_CRASH_AT) in "
        "version {}, then restarted\n",
        c.member, c.point, c.version);
  }
  PrintTimesLegend(d.transport == "relay" ? "relay tree over loopback TCP, "
                                            "checkpoint files msynced and "
                                            "fsynced"
                                          : "local store, checkpoint files "
                                            "msynced and fsynced",
                   d.link_gbit);
  PrintVersionTable(d.rows, d.receivers, d.link_gbit);
  bool slower = false;
  for (const VersionRow& r : d.rows) {
    const AtLink t = TimesAtLink(r, d.link_gbit);
    slower = slower || t.refit > t.full;
  }
  if (slower) {
    fmt::print(
        "note: where speedup < 1x the measured refit time is mostly a fixed "
        "cost per version (fsync of every stored object, msync + fsync of "
        "each checkpoint, vote and decision polling), not bytes; it does not "
        "grow with the model, while full@link does (column ratio){}.\n",
        scale_follows ? ": section 3 shows a model of a realistic size" : "");
  }
  if (!d.rows.empty()) PrintBytesBreakdown(first_file, d);
}

void PrintScale(const Scale& s) {
  const bool one = s.receivers == 1;
  fmt::print(
      "trainer (this process) -> {} on {} of this process, {} its own copy "
      "of the model in memory as an inference engine does, through the "
      "directory store {} (HMAC-SHA256 authenticated, {} chunks); {} chunks "
      "as they land, votes, and activates after the joint commit\n",
      one ? "1 receiver" : fmt::format("{} receivers", s.receivers),
      one ? "a thread" : "threads", one ? "holding" : "each holding", s.store,
      MiB(s.chunk_bytes), one ? "it applies" : "each applies");
  fmt::print(
      "setup, not in the times below: generate {}, write the publisher's "
      "baseline file and copy step0 into {} {}, RL step {}\n",
      HumanSeconds(s.generate_seconds), one ? "the receiver" : "every receiver",
      HumanSeconds(s.copy_seconds), HumanSeconds(s.step_seconds));
  PrintTimesLegend("receiver memory on the same cores as the encoder",
                   s.link_gbit);
  PrintVersionTable({s.row}, s.receivers, s.link_gbit);
  const AtLink t = TimesAtLink(s.row, s.link_gbit);
  fmt::print(
      "at {}, refit brings {} to the new version in {} where sending the "
      "full checkpoint over {} Gbit/s takes {}: {}\n",
      HumanBytes(static_cast<double>(s.row.publish.diff.full_bytes)),
      one ? "the receiver" : "every receiver", HumanSeconds(t.refit),
      s.link_gbit, HumanSeconds(t.full),
      t.full >= t.refit
          ? Ratio(t.full, t.refit, 2) + " faster"
          : "slower; at this size the fixed costs per version still "
            "dominate (--scale-mib)");
}

Json VersionJson(const VersionRow& r, double link_gbit) {
  const DiffReport& diff = r.publish.diff;
  const AtLink t = TimesAtLink(r, link_gbit);
  return {{"version", r.version},
          {"total_elements", diff.total_elements},
          {"changed_elements", diff.changed_elements},
          {"chunks", diff.chunks},
          {"payload_bytes", r.publish.bytes_uploaded},
          {"chunk_payload_bytes", diff.payload_bytes},
          {"chunk_bytes", diff.chunk_bytes},
          {"full_bytes", diff.full_bytes},
          {"encode_upload_seconds", r.publish.encode_upload_seconds},
          {"commit_seconds", r.publish.commit_seconds},
          {"refit_seconds_measured", r.refit_seconds},
          {"full_seconds_at_link_computed", t.full},
          {"refit_seconds_at_link_computed", t.refit},
          {"speedup_at_link_computed", t.refit > 0 ? t.full / t.refit : 0.0},
          {"committed", r.publish.committed},
          {"receivers_bit_exact", r.receivers_exact},
          {"publisher_bit_exact", r.baseline_exact},
          {"events", r.events}};
}

Json DistributionJson(const Distribution& d) {
  Json versions = Json::array();
  for (const VersionRow& r : d.rows) {
    versions.push_back(VersionJson(r, d.link_gbit));
  }
  const Crash& c = d.crash;
  Json crash = nullptr;
  if (c.version > 0) {
    crash = {{"version", c.version},
             {"member", c.member},
             {"by", c.by_demo ? "demo" : "crash_point"},
             {"after_chunks", c.after_chunks},
             {"crash_point", c.point},
             {"killed", c.killed},
             {"chunks_applied_at_kill", c.applied_at_kill},
             {"chunks_journaled_at_restart", c.journaled_at_restart},
             {"chunks_skipped_after_restart", c.skipped},
             {"chunks_applied_after_restart", c.applied},
             {"chunks_resent_after_restart", c.resent},
             {"at_most_once", c.once}};
  }
  const StoreBytes& b = d.first;
  Json first = {{"announcement_bytes", b.announcement},
                {"chunk_objects", b.chunks},
                {"chunk_object_bytes", b.chunk_objects},
                {"manifest_bytes", b.manifest},
                {"coordination_objects", b.coordination_objects},
                {"coordination_bytes", b.coordination}};
  return {{"store", d.store},
          {"transport", d.transport},
          {"fanout", d.fanout},
          {"tree", d.tree},
          {"receivers", d.receivers},
          {"link_gbit", d.link_gbit},
          {"chunk_bytes", d.chunk_bytes},
          {"crash", crash},
          {"first_version_objects", first},
          {"ok", d.all_ok},
          {"versions", versions}};
}

Json ScaleJson(const Scale& s) {
  return {{"description", s.description},
          {"store", s.store},
          {"receivers", s.receivers},
          {"link_gbit", s.link_gbit},
          {"chunk_bytes", s.chunk_bytes},
          {"generate_seconds", s.generate_seconds},
          {"copy_seconds", s.copy_seconds},
          {"step_seconds", s.step_seconds},
          {"ok", s.all_ok},
          {"version", VersionJson(s.row, s.link_gbit)}};
}

}  // namespace

int RunDemo(const DemoArgs& args) {
  SyncDemoArgs codec_only;
  codec_only.codec_only = true;
  return RunSyncDemo(args, codec_only);
}

int RunSyncDemo(const DemoArgs& args, const SyncDemoArgs& sync) {
  constexpr std::string_view kCmd = "demo";
  ProgressBar bar;
  if (!sync.codec_only) {
    // A --crash-at this build cannot do fails before any work is done.
    Crash crash;
    if (Status s = ParseCrashAt(sync.crash_at, &crash); !s.ok()) {
      return Fail(kCmd, s, args.json);
    }
  }
  Result<ScratchDir> dir = ScratchDir::Create("refit-demo");
  if (!dir.ok()) return Fail(kCmd, dir.status(), args.json);
  bool notice = false;
  Result<Trajectory> trajectory = LoadTrajectory(args, *dir, &bar, &notice);
  if (!trajectory.ok()) return Fail(kCmd, trajectory.status(), args.json);
  if (notice && !args.json) {
    fmt::print(
        "fixtures not found (looked in $REFIT_FIXTURES_DIR and "
        "../shared/fixtures); using a synthetic trajectory\n");
  }
  if (!args.json) {
    fmt::print("refit demo: {}\n", trajectory->description);
    if (!sync.codec_only)
      fmt::print("\n1. codec: diff, apply in place, check\n");
  }
  bool codec_ok = false;
  Result<std::vector<CodecStep>> codec =
      RunCodecSection(args, *trajectory, *dir, &bar, &codec_ok);
  if (!codec.ok()) return Fail(kCmd, codec.status(), args.json);

  std::optional<Distribution> dist;
  if (!sync.codec_only) {
    if (!args.json) {
      fmt::print("\n2. distribution: publish, joint commit, crash, check\n");
      std::fflush(stdout);
    }
    Result<Distribution> d = RunDistribution(args, sync, *trajectory, *dir);
    if (!d.ok()) {
      return Fail(kCmd, d.status().WithContext("distribution"), args.json);
    }
    dist = std::move(*d);
    if (!args.json) {
      PrintDistribution(*dist, codec->front().diff, sync.scale_mib > 0);
    }
  }
  std::optional<Scale> scale;
  if (!sync.codec_only && sync.scale_mib > 0) {
    if (!args.json) {
      fmt::print("\n3. at scale: one RL step of a model of realistic size\n");
      std::fflush(stdout);
    }
    Result<Scale> s = RunScale(args, sync, *dir, &bar);
    if (!s.ok()) {
      return Fail(kCmd, s.status().WithContext("at scale"), args.json);
    }
    scale = std::move(*s);
    if (!args.json) {
      fmt::print("{}\n", scale->description);
      PrintScale(*scale);
    }
  }
  bool all_ok =
      codec_ok && (!dist || dist->all_ok) && (!scale || scale->all_ok);

  if (args.json) {
    Json j;
    j["ok"] = all_ok;
    j["command"] = "demo";
    j["source"] = trajectory->source;
    j["description"] = trajectory->description;
    j["steps"] = CodecStepsJson(*codec);
    if (dist) j["distribution"] = DistributionJson(*dist);
    if (scale) j["scale"] = ScaleJson(*scale);
    PrintJson(j);
  } else {
    fmt::print("\n{}\n",
               all_ok ? (dist ? "all steps bit-exact and verified; every "
                                "receiver bit-exact at every version"
                              : "all steps bit-exact and verified")
                      : "FAILED: a patched copy differs from the trainer's "
                        "checkpoint");
  }
  if (!all_ok) {
    fmt::print(stderr,
               "refit: demo: a patched checkpoint is not bit-exact; this is a "
               "bug in refit, please report it\n");
    return kExitMismatch;
  }
  return kExitOk;
}

}  // namespace refit::cli
