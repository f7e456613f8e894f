// The relay tree through the refit CLI, with real processes: the built
// `refit` binary (REFIT_CLI_PATH) runs `refit publish --relay-listen` once
// per version (a fresh root each time, seeded from the directory store it
// writes through to) and four `refit receive --relay-parent` nodes in a
// fan-out-2 tree (docs/protocol.md, "Relay tree"):
//
//   root <- r0, r1;  r0 <- r2, r3
//
// r0, the inner node, is SIGKILLed in the middle of one version and
// restarted on the same address: its children reconnect to it, it
// reconnects to the root and gets a replay. After every version, every
// receiver and the publisher's baseline hash (SHA-256 per tensor) to the
// trainer's file of that version. Also: `refit demo` on the relay tree, and
// a receiver whose parent never answers gives up in time.
//
// Every wait is bounded; each test takes well under 60 s.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "refit/checkpoint.h"
#include "sync/protocol.h"
#include "testing.h"
#include "transport/relay_store.h"

#ifndef REFIT_CLI_PATH
#error "REFIT_CLI_PATH must name the refit binary"
#endif

namespace refit {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
using ::refit::testing::ReadBytes;
using ::refit::testing::TempDir;
using ::refit::testing::WriteBytes;

constexpr int kReceivers = 4;
constexpr int kFanout = 2;
constexpr uint64_t kVersions = 20;
constexpr uint64_t kKillVersion = 8;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A child process running `refit ARGS`, stdout and stderr appended to files.
class Proc {
 public:
  Proc() = default;
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;
  ~Proc() { Kill(); }

  void Start(const std::vector<std::string>& args, const std::string& out,
             const std::string& err) {
    ASSERT_LE(pid_, 0) << "already running";
    std::vector<std::string> all = {REFIT_CLI_PATH};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string_view(*e).starts_with("REFIT_CRASH_AT=")) continue;
      env.emplace_back(*e);
    }
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    int rc =
        posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    ASSERT_EQ(rc, 0) << std::strerror(rc);
    status_.reset();
  }

  bool running() {
    Poll();
    return pid_ > 0;
  }
  // The exit code, or -1 when killed or still running.
  int exit_code() {
    Poll();
    return status_ && WIFEXITED(*status_) ? WEXITSTATUS(*status_) : -1;
  }
  bool killed_by_signal() {
    Poll();
    return status_ && WIFSIGNALED(*status_);
  }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
      status_ = st;
      pid_ = -1;
    }
  }
  // Waits up to `seconds` for the end; kills on timeout (and returns false).
  bool Wait(double seconds) {
    auto t0 = Clock::now();
    while (running()) {
      if (SecondsSince(t0) > seconds) {
        Kill();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

 private:
  void Poll() {
    if (pid_ <= 0) return;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = st;
      pid_ = -1;
    }
  }
  pid_t pid_ = -1;
  std::optional<int> status_;
};

std::string ReadText(const std::string& path) {
  std::vector<uint8_t> b = ReadBytes(path);
  return std::string(b.begin(), b.end());
}

std::string Tail(const std::string& path, size_t n = 2000) {
  std::string t = ReadText(path);
  return t.size() > n ? t.substr(t.size() - n) : t;
}

std::vector<Json> JsonLines(const std::string& path) {
  std::vector<Json> out;
  std::string text = ReadText(path);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    Json j = Json::parse(text.substr(pos, nl - pos), nullptr, false);
    if (!j.is_discarded() && j.is_object()) out.push_back(j);
    pos = nl + 1;
  }
  return out;
}

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// ------------------------------------------------------------ models

struct Tensor {
  std::string name;
  std::string dtype;
  int width;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;
};

void WriteSafetensors(const std::string& path, const std::vector<Tensor>& ts) {
  std::string header = "{";
  uint64_t offset = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    std::string shape;
    for (size_t d = 0; d < ts[i].shape.size(); ++d) {
      shape += (d ? "," : "") + std::to_string(ts[i].shape[d]);
    }
    header += (i ? "," : "") + std::string("\"") + ts[i].name +
              "\":{\"dtype\":\"" + ts[i].dtype + "\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + ts[i].data.size()) + "]}";
    offset += ts[i].data.size();
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<uint8_t> file(8);
  for (int i = 0; i < 8; ++i) {
    file[static_cast<size_t>(i)] =
        static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  }
  file.insert(file.end(), header.begin(), header.end());
  for (const Tensor& t : ts)
    file.insert(file.end(), t.data.begin(), t.data.end());
  WriteBytes(path, file);
}

// ~1.3 MB: sparse changes in the BF16 weights (sparse XOR chunks), dense
// ones in the F32 scale (dense chunks).
std::vector<Tensor> BaseModel() {
  std::mt19937_64 rng(42);
  auto make = [&](std::string name, std::string dtype, int width,
                  std::vector<uint64_t> shape) {
    Tensor t{std::move(name), std::move(dtype), width, std::move(shape), {}};
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    t.data.resize(n * static_cast<uint64_t>(width));
    for (uint8_t& b : t.data) b = static_cast<uint8_t>(rng());
    return t;
  };
  return {make("a.weight", "BF16", 2, {512, 1024}),
          make("b.weight", "BF16", 2, {128, 1024}),
          make("c.bias", "BF16", 2, {1000}), make("d.scale", "F32", 4, {8192})};
}

std::vector<Tensor> NextVersion(std::vector<Tensor> m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (Tensor& t : m) {
    double rate = t.dtype == "F32" ? 0.5 : 0.02;
    for (size_t i = 0; i < t.data.size(); i += static_cast<size_t>(t.width)) {
      if (u(rng) < rate) t.data[i] ^= static_cast<uint8_t>(1 + rng() % 7);
    }
  }
  return m;
}

using Digests = std::map<std::string, Sha256>;

Digests TensorDigests(const std::string& path) {
  Digests d;
  auto ck = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
  if (!ck.ok()) return d;
  for (size_t i = 0; i < ck->tensors().size(); ++i) {
    d[ck->tensors()[i].name] = ComputeSha256(ck->Data(i));
  }
  return d;
}

// ------------------------------------------------------------ the tree

class Tree {
 public:
  Tree() {
    key_ = dir_.File("hmac.key");
    std::string hex(64, 'a');
    hex += "\n";
    WriteBytes(key_, std::vector<uint8_t>(hex.begin(), hex.end()));
    std::vector<Tensor> m = BaseModel();
    for (uint64_t v = 0; v <= kVersions; ++v) {
      if (v > 0) m = NextVersion(std::move(m), 1000 + v);
      trainer_.push_back(dir_.File("trainer/v" + std::to_string(v)));
      fs::create_directories(dir_.File("trainer"));
      WriteSafetensors(trainer_.back(), m);
      digests_.push_back(TensorDigests(trainer_.back()));
    }
    baseline_ = dir_.File("publisher.safetensors");
    fs::copy_file(trainer_[0], baseline_);
    root_ = "127.0.0.1:" + std::to_string(FreePort());
    auto parents = RelayTreeParents(kReceivers, kFanout);
    EXPECT_TRUE(parents.ok());
    parents_ = *parents;
    listen_.resize(kReceivers);
    for (int p : parents_) {
      if (p >= 0 && listen_[static_cast<size_t>(p)].empty()) {
        listen_[static_cast<size_t>(p)] =
            "127.0.0.1:" + std::to_string(FreePort());
      }
    }
    for (int i = 0; i < kReceivers; ++i) {
      fs::create_directories(dir_.File(Member(i) + "/state"));
      fs::copy_file(trainer_[0], Checkpoint(i));
    }
  }

  static std::string Member(int i) { return "r" + std::to_string(i); }
  std::string Checkpoint(int i) const {
    return dir_.File(Member(i) + "/model.safetensors");
  }
  std::string State(int i) const { return dir_.File(Member(i) + "/state"); }
  std::string Log(int i) const { return dir_.File(Member(i) + "/out.jsonl"); }
  std::string Err(int i) const { return dir_.File(Member(i) + "/err.txt"); }
  std::string PubLog(uint64_t v) const {
    return dir_.File("publish" + std::to_string(v) + ".json");
  }
  std::string PubErr() const { return dir_.File("publish.err"); }
  const std::vector<int>& parents() const { return parents_; }
  const std::string& baseline() const { return baseline_; }
  const Digests& digests(uint64_t v) const { return digests_[v]; }

  void StartReceiver(Proc* p, int i) {
    const int parent = parents_[static_cast<size_t>(i)];
    std::vector<std::string> args = {
        "receive",
        "--relay-parent",
        parent < 0 ? root_ : listen_[static_cast<size_t>(parent)],
        "--relay-parent-timeout-ms",
        "30000",
        "--member",
        Member(i),
        "--checkpoint",
        Checkpoint(i),
        "--state",
        State(i),
        "--key-file",
        key_,
        "--until",
        std::to_string(kVersions),
        "--poll-ms",
        "2",
        "--decision-timeout-ms",
        "20000",
        "--resend-timeout-ms",
        "20000",
        "--threads",
        "1",
        "--json"};
    if (!listen_[static_cast<size_t>(i)].empty()) {
      args.insert(args.end(),
                  {"--relay-listen", listen_[static_cast<size_t>(i)]});
    }
    p->Start(args, Log(i), Err(i));
  }

  void StartPublisher(Proc* p, uint64_t v) {
    std::string members;
    for (int i = 0; i < kReceivers; ++i) {
      members += (i ? "," : "") + Member(i);
    }
    p->Start({"publish",
              "--relay-listen",
              root_,
              "--store",
              dir_.File("store"),
              "--baseline",
              baseline_,
              "--members",
              members,
              "--version",
              std::to_string(v),
              trainer_[v],
              "--key-file",
              key_,
              "--vote-timeout-ms",
              "20000",
              "--serve-ms",
              "20000",
              "--chunk-mib",
              "0.0625",
              "--threads",
              "1",
              "--poll-ms",
              "2",
              "--json"},
             PubLog(v), PubErr());
  }

  uint64_t Active(int i) const {
    std::string text = ReadText(State(i) + "/active");
    return text.empty() ? 0 : std::strtoull(text.c_str(), nullptr, 10);
  }

 private:
  TempDir dir_;
  std::string key_;
  std::vector<std::string> trainer_;
  std::vector<Digests> digests_;
  std::string baseline_;
  std::string root_;
  std::vector<int> parents_;
  std::vector<std::string> listen_;
};

TEST(RelayCliTest, TwentyVersionsToAFanOutTwoTreeWithAnInnerNodeKilled) {
  auto t0 = Clock::now();
  Tree tree;
  ASSERT_EQ(tree.parents(), (std::vector<int>{-1, -1, 0, 0}));
  const int victim = 0;  // the inner node: r2 and r3 hang under it
  Proc receivers[kReceivers];
  for (int i = 0; i < kReceivers; ++i) tree.StartReceiver(&receivers[i], i);

  bool killed = false;
  for (uint64_t v = 1; v <= kVersions; ++v) {
    SCOPED_TRACE("version " + std::to_string(v));
    Proc publisher;
    tree.StartPublisher(&publisher, v);
    if (v == kKillVersion) {
      // Kill the inner node once it is inside the version (its journal of
      // v exists), then restart it on the same address.
      auto deadline = Clock::now() + std::chrono::seconds(20);
      while (!killed && Clock::now() < deadline && publisher.running()) {
        if (fs::exists(tree.State(victim) + "/journal") &&
            tree.Active(victim) < v) {
          receivers[victim].Kill();
          killed = true;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      ASSERT_TRUE(killed) << "r0 never started version " << v;
      EXPECT_TRUE(receivers[victim].killed_by_signal());
      tree.StartReceiver(&receivers[victim], victim);
    }
    ASSERT_TRUE(publisher.Wait(40))
        << "publish " << v << " hung: " << Tail(tree.PubErr());
    ASSERT_EQ(publisher.exit_code(), 0) << Tail(tree.PubErr());
    const Json report = Json::parse(ReadText(tree.PubLog(v)), nullptr, false);
    ASSERT_TRUE(report.is_object()) << ReadText(tree.PubLog(v));
    EXPECT_TRUE(report.value("committed", false)) << report.dump();
    ASSERT_TRUE(report.contains("relay")) << report.dump();
    // publish served the tree until every member finished the version.
    EXPECT_EQ(report["relay"]["members_done"].size(), size_t{kReceivers})
        << report.dump();
    for (int i = 0; i < kReceivers; ++i) {
      EXPECT_EQ(tree.Active(i), v) << Tree::Member(i);
      EXPECT_EQ(TensorDigests(tree.Checkpoint(i)), tree.digests(v))
          << Tree::Member(i) << " is not bit-exact at version " << v;
    }
    EXPECT_EQ(TensorDigests(tree.baseline()), tree.digests(v));
    ASSERT_LT(SecondsSince(t0), 55) << "too slow";
  }
  EXPECT_TRUE(killed);

  // Every receiver stops by itself at --until (inner nodes after their
  // children left), with exit code 0.
  for (int i = 0; i < kReceivers; ++i) {
    EXPECT_TRUE(receivers[i].Wait(15)) << Tree::Member(i) << " did not stop";
    EXPECT_EQ(receivers[i].exit_code(), 0)
        << Tree::Member(i) << ": " << Tail(tree.Err(i));
  }
  // The restarted node resumed the version it was killed in from its
  // journal (or found it done): two starts, and version kKillVersion
  // reported once by the second run.
  int starts = 0;
  bool finished_kill_version = false;
  for (const Json& e : JsonLines(tree.Log(victim))) {
    if (e.value("event", "") == "start") {
      ++starts;
      EXPECT_TRUE(e.contains("relay")) << e.dump();
    }
    if (e.value("event", "") == "version" &&
        e.value("version", uint64_t{0}) == kKillVersion) {
      finished_kill_version = true;
    }
  }
  EXPECT_EQ(starts, 2);
  EXPECT_TRUE(finished_kill_version);
  EXPECT_LT(SecondsSince(t0), 60);
}

TEST(RelayCliTest, DemoOnTheRelayTreeIsBitExact) {
  auto t0 = Clock::now();
  TempDir dir;
  Proc demo;
  demo.Start({"demo", "--synthetic", "--size-mib", "8", "--versions", "3"},
             dir.File("out.txt"), dir.File("err.txt"));
  ASSERT_TRUE(demo.Wait(55)) << Tail(dir.File("out.txt"));
  EXPECT_EQ(demo.exit_code(), 0)
      << Tail(dir.File("out.txt")) << Tail(dir.File("err.txt"));
  std::string out = ReadText(dir.File("out.txt"));
  EXPECT_NE(out.find("relay tree on loopback, fan-out 2"), std::string::npos)
      << out;
  EXPECT_NE(out.find("every receiver bit-exact at every version"),
            std::string::npos)
      << out;
  EXPECT_LT(SecondsSince(t0), 60);
}

TEST(RelayCliTest, ReceiverGivesUpOnADeadParent) {
  auto t0 = Clock::now();
  TempDir dir;
  {
    std::vector<Tensor> m = BaseModel();
    WriteSafetensors(dir.File("model.safetensors"), m);
  }
  Proc r;
  r.Start(
      {"receive", "--relay-parent", "127.0.0.1:" + std::to_string(FreePort()),
       "--relay-parent-timeout-ms", "1500", "--member", "r0", "--checkpoint",
       dir.File("model.safetensors"), "--state", dir.File("state"), "--poll-ms",
       "5"},
      dir.File("out.txt"), dir.File("err.txt"));
  ASSERT_TRUE(r.Wait(20)) << "no deadline on a dead parent";
  EXPECT_NE(r.exit_code(), 0);
  std::string err = ReadText(dir.File("err.txt"));
  EXPECT_NE(err.find("unreachable"), std::string::npos) << err;
  EXPECT_NE(ReadText(dir.File("state/last_error")).find("unreachable"),
            std::string::npos);
  EXPECT_LT(SecondsSince(t0), 20);
}

}  // namespace
}  // namespace refit
