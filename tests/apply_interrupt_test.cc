// `refit apply` interrupted as a user would: Ctrl-C, SIGTERM and SIGKILL at
// random points, then run again (or --rollback). Every run must end with
// the checkpoint exactly the target (or the base), with no manual step.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <random>

#include "base/file.h"
#include "cli_process.h"

namespace refit::testing {
namespace {

class ApplyInterruptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // About 20 MB: long enough with one thread that a signal lands inside
    // the apply's chunk loop.
    auto base = BaseModel(16);
    WriteSafetensors(base_, base);
    WriteSafetensors(target_, NextVersion(base, 7));
    ASSERT_EQ(Run({"diff", base_, target_, "-o", delta_, "--chunk-mib", "1"}), 0);
    ASSERT_EQ(Run({"diff", base_, target_, "-o", ow_delta_, "--chunk-mib", "1",
                   "--overwrite-only"}),
              0);
  }

  int Run(const std::vector<std::string>& args) {
    Proc p;
    p.Start(args, dir_.File("out"), dir_.File("err"));
    EXPECT_TRUE(p.Wait(120)) << "refit " << args[0] << " hung";
    return p.exit_code();
  }

  void FreshCheckpoint() { WriteBytes(ckpt_, ReadBytes(base_)); }
  std::string Err() { return ReadText(dir_.File("err")); }

  TempDir dir_;
  std::string base_ = dir_.File("base.safetensors");
  std::string target_ = dir_.File("target.safetensors");
  std::string delta_ = dir_.File("d.rfd");
  std::string ow_delta_ = dir_.File("ow.rfd");
  std::string ckpt_ = dir_.File("ckpt.safetensors");
  std::string journal_ = ckpt_ + ".refit-apply";
};

// Starts `refit apply` on a fresh checkpoint, signals it `delay` seconds
// after its journal appears (the chunk loop starts right after; on a loaded
// machine the time before it varies most), and returns its wait status.
int SignalledApply(const std::string& delta, const std::string& ckpt, int sig,
                   double delay, const std::string& out, const std::string& err) {
  Proc p;
  p.Start({"apply", delta, ckpt, "--threads", "1"}, out, err);
  const auto t0 = Clock::now();
  while (p.running() && !PathExists(ckpt + ".refit-apply") && SecondsSince(t0) < 60) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  p.Signal(sig);
  EXPECT_TRUE(p.Wait(120));
  return *p.status();
}

TEST_F(ApplyInterruptTest, KillAtAnyPointIsFinishedByRunningApplyAgain) {
  // How long one apply takes here.
  FreshCheckpoint();
  auto t0 = Clock::now();
  ASSERT_EQ(Run({"apply", delta_, ckpt_, "--threads", "1"}), 0) << Err();
  const double full = SecondsSince(t0);
  ASSERT_EQ(ReadBytes(ckpt_), ReadBytes(target_));

  std::mt19937_64 rng(11);
  int mid_apply = 0;  // killed with the journal on disk: stores had begun
  int mid_store = 0;  // ... and some had reached the checkpoint
  for (int trial = 0; trial < 10; ++trial) {
    const std::string& delta = trial % 3 == 2 ? ow_delta_ : delta_;
    FreshCheckpoint();
    const double delay = std::uniform_real_distribution<double>(0.0, 0.4)(rng) * full;
    int st = SignalledApply(delta, ckpt_, SIGKILL, delay, dir_.File("out"),
                            dir_.File("err"));
    if (!WIFSIGNALED(st)) continue;  // finished before the kill
    const bool journaled = PathExists(journal_);
    if (journaled) ++mid_apply;
    if (journaled && ReadBytes(ckpt_) != ReadBytes(base_)) ++mid_store;
    if (!journaled) {
      // Killed before the first chunk or after the last: whole either way.
      const auto now = ReadBytes(ckpt_);
      EXPECT_TRUE(now == ReadBytes(base_) || now == ReadBytes(target_));
    }
    if (journaled && trial % 4 == 3) {
      ASSERT_EQ(Run({"apply", "--rollback", delta, ckpt_}), 0) << Err();
      EXPECT_EQ(ReadBytes(ckpt_), ReadBytes(base_)) << "trial " << trial;
    } else {
      ASSERT_EQ(Run({"apply", delta, ckpt_}), 0) << "trial " << trial << ": " << Err();
      EXPECT_EQ(ReadBytes(ckpt_), ReadBytes(target_)) << "trial " << trial;
    }
    EXPECT_FALSE(PathExists(journal_));
  }
  // The test is only worth something if kills landed inside the chunk loop
  // (torn chunks in particular are covered deterministically by
  // ApplyJournalTest.ChunkTornByAKillIsRestoredFromTheJournal).
  EXPECT_GE(mid_apply, 3);
  std::printf("%d of 10 kills landed inside the chunk loop, %d after stores "
              "reached the checkpoint (one apply: %.2f s)\n",
              mid_apply, mid_store, full);
}

TEST_F(ApplyInterruptTest, CtrlCStopsAtAChunkBoundaryWithAMessage) {
  FreshCheckpoint();
  auto t0 = Clock::now();
  ASSERT_EQ(Run({"apply", delta_, ckpt_, "--threads", "1"}), 0) << Err();
  const double full = SecondsSince(t0);
  for (int sig : {SIGINT, SIGTERM}) {
    FreshCheckpoint();
    int st = SignalledApply(delta_, ckpt_, sig, 0.3 * full, dir_.File("out"),
                            dir_.File("err"));
    ASSERT_TRUE(WIFEXITED(st)) << "died of signal " << WTERMSIG(st);
    if (WEXITSTATUS(st) == 0) continue;  // finished before the signal
    EXPECT_EQ(WEXITSTATUS(st), 128 + sig);
    const std::string err = Err();
    EXPECT_NE(err.find("at a chunk boundary"), std::string::npos) << err;
    EXPECT_NE(err.find("--rollback"), std::string::npos) << err;
    EXPECT_TRUE(PathExists(journal_));
    ASSERT_EQ(Run({"apply", delta_, ckpt_}), 0) << Err();
    EXPECT_EQ(ReadBytes(ckpt_), ReadBytes(target_));
    EXPECT_NE(ReadText(dir_.File("out")).find("restored from its journal"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace refit::testing
