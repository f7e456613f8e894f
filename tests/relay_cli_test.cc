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
// trainer's file of that version. Also: `refit demo` on the relay tree, a
// receiver whose parent never answers gives up in time, and the same tree
// over TLS (--relay-tls-*, certificates made at test time), which refuses
// a plaintext receiver.
//
// Every wait is bounded; each test takes well under 60 s.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
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

#include "cli_process.h"
#include "refit/checkpoint.h"
#include "support/testing.h"
#include "support/tls_testing.h"
#include "sync/protocol.h"
#include "transport/relay_store.h"

#ifndef REFIT_CLI_PATH
#error "REFIT_CLI_PATH must name the refit binary"
#endif

namespace refit {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
using namespace ::refit::testing;  // NOLINT(build/namespaces): test helpers

constexpr int kReceivers = 4;
constexpr int kFanout = 2;
constexpr uint64_t kVersions = 20;
constexpr uint64_t kKillVersion = 8;

// ------------------------------------------------------------ the tree

class Tree {
 public:
  // tls: every link of the tree uses TLS (--relay-tls-*), and every parent
  // checks that its children's certificates name their members.
  explicit Tree(bool tls = false) {
    if (tls) {
      // A throwaway CA and, per endpoint, a leaf naming it (subjectAltName
      // DNS:<name>, IP:127.0.0.1).
      ca_.emplace(dir_, "relay");
      std::vector<std::string> names = {"root"};
      for (int i = 0; i < kReceivers; ++i) names.push_back(Member(i));
      for (const std::string& n : names) tls_[n] = ca_->Issue(n, "DNS:" + n + ",IP:127.0.0.1");
    }
    key_ = dir_.File("hmac.key");
    std::string hex(64, 'a');
    hex += "\n";
    WriteBytes(key_, std::vector<uint8_t>(hex.begin(), hex.end()));
    std::vector<Tensor> m = BaseModel(1);
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
  const std::string& root() const { return root_; }
  // The --relay-tls-* flags of the endpoint with certificate `name`.
  std::vector<std::string> TlsArgs(const std::string& name) const {
    auto it = tls_.find(name);
    if (it == tls_.end()) return {};
    return {"--relay-tls-cert", it->second.cert_file, "--relay-tls-key", it->second.key_file,
            "--relay-tls-ca",   it->second.ca_file,   "--relay-tls-member-names"};
  }
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
    const std::vector<std::string> tls = TlsArgs(Member(i));
    args.insert(args.end(), tls.begin(), tls.end());
    p->Start(args, Log(i), Err(i));
  }

  // Waits for `publisher` of version v, which must have committed it and
  // served the tree until every member finished it; its report in *report.
  void CheckPublished(Proc& publisher, uint64_t v, Json* report) const {
    ASSERT_TRUE(publisher.Wait(40)) << "publish " << v << " hung: " << Tail(PubErr());
    ASSERT_EQ(publisher.exit_code(), 0) << Tail(PubErr());
    *report = Json::parse(ReadText(PubLog(v)), nullptr, false);
    ASSERT_TRUE(report->is_object()) << ReadText(PubLog(v));
    EXPECT_TRUE(report->value("committed", false)) << report->dump();
    ASSERT_TRUE(report->contains("relay")) << report->dump();
    EXPECT_EQ((*report)["relay"]["members_done"].size(), size_t{kReceivers})
        << report->dump();
  }

  void StartPublisher(Proc* p, uint64_t v) {
    std::string members;
    for (int i = 0; i < kReceivers; ++i) {
      members += (i ? "," : "") + Member(i);
    }
    std::vector<std::string> args = {"publish",
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
                                     "--json"};
    const std::vector<std::string> tls = TlsArgs("root");
    args.insert(args.end(), tls.begin(), tls.end());
    p->Start(args, PubLog(v), PubErr());
  }

  uint64_t Active(int i) const {
    std::string text = ReadText(State(i) + "/active");
    return text.empty() ? 0 : std::strtoull(text.c_str(), nullptr, 10);
  }

 private:
  TempDir dir_;
  std::optional<tls_testing::TestCa> ca_;       // with tls: the tree's CA
  std::map<std::string, RelayTlsOptions> tls_;  // its files, by endpoint
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
    Json report;
    ASSERT_NO_FATAL_FAILURE(tree.CheckPublished(publisher, v, &report));
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

TEST(RelayCliTest, TlsTreeIsBitExactAndRefusesAPlaintextReceiver) {
  auto t0 = Clock::now();
  Tree tree(/*tls=*/true);
  Proc receivers[kReceivers];
  for (int i = 0; i < kReceivers; ++i) tree.StartReceiver(&receivers[i], i);
  // A receiver without TLS options, pointed at the TLS root.
  TempDir plain;
  {
    std::vector<Tensor> m = BaseModel(1);
    WriteSafetensors(plain.File("model.safetensors"), m);
  }
  Proc intruder;
  intruder.Start({"receive", "--relay-parent", tree.root(),
                  "--relay-parent-timeout-ms", "30000", "--member", "r9",
                  "--checkpoint", plain.File("model.safetensors"), "--state",
                  plain.File("state"), "--poll-ms", "5"},
                 plain.File("out.txt"), plain.File("err.txt"));
  // At least three versions, more (up to eight) until the plaintext
  // receiver has tried a running root: it retries every 0.5 s at most.
  auto refused = [&] {
    return ReadText(tree.PubErr()).find("does not speak TLS") !=
               std::string::npos &&
           ReadText(plain.File("err.txt")).find("TLS endpoint") !=
               std::string::npos;
  };
  for (uint64_t v = 1; v <= 3 || (v <= 8 && !refused()); ++v) {
    SCOPED_TRACE("version " + std::to_string(v));
    Proc publisher;
    tree.StartPublisher(&publisher, v);
    Json report;
    ASSERT_NO_FATAL_FAILURE(tree.CheckPublished(publisher, v, &report));
    EXPECT_TRUE(report["relay"].value("tls", false)) << report.dump();
    for (int i = 0; i < kReceivers; ++i) {
      EXPECT_EQ(TensorDigests(tree.Checkpoint(i)), tree.digests(v))
          << Tree::Member(i) << " is not bit-exact at version " << v;
    }
    EXPECT_EQ(TensorDigests(tree.baseline()), tree.digests(v));
  }
  // The plaintext receiver never got a version; both sides said why.
  EXPECT_TRUE(intruder.running());
  intruder.Kill();
  EXPECT_FALSE(fs::exists(plain.File("state/active")) &&
               ReadText(plain.File("state/active")) != "0");
  const std::string root_err = ReadText(tree.PubErr());
  EXPECT_NE(root_err.find("does not speak TLS"), std::string::npos) << root_err;
  const std::string intruder_err = ReadText(plain.File("err.txt"));
  EXPECT_NE(intruder_err.find("TLS endpoint"), std::string::npos)
      << intruder_err;
  // The versions published are below kVersions (--until): stop the
  // receivers.
  for (int i = 0; i < kReceivers; ++i) receivers[i].Kill();
  EXPECT_LT(SecondsSince(t0), 60);
}

TEST(RelayCliTest, DemoOnTheRelayTreeIsBitExact) {
  auto t0 = Clock::now();
  TempDir dir;
  Proc demo;
  demo.Start({"demo", "--synthetic", "--size-mib", "8", "--versions", "3",
              "--scale-mib", "16"},
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
  // The victim died with chunks of its version applied, and its restart
  // applied each of the others once.
  EXPECT_NE(out.find("its journal recording 3 applied chunk(s); restarted"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("3 chunk(s) journaled applied before the kill"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("none applied twice"), std::string::npos) << out;
  EXPECT_NE(out.find("  store "), std::string::npos) << out;
  EXPECT_NE(out.find("3. at scale"), std::string::npos) << out;
  EXPECT_NE(out.find("1/1 receivers, publisher too"), std::string::npos) << out;
  EXPECT_LT(SecondsSince(t0), 60);
}

TEST(RelayCliTest, ReceiverGivesUpOnADeadParent) {
  auto t0 = Clock::now();
  TempDir dir;
  {
    std::vector<Tensor> m = BaseModel(1);
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
