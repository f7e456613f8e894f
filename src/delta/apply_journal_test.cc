// Applies into checkpoint files that are interrupted, torn, rolled back,
// not quite the base, or on a full disk (apply_journal.h, api.cc).
#include "delta/apply_journal.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "base/file.h"
#include "delta/delta_file.h"
#include "format/safetensors.h"
#include "refit/delta.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;

using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

struct Model {
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> data;  // BF16 elements
};

Status Write(const std::string& path, const Model& m) {
  std::vector<SafetensorsTensorView> views;
  for (size_t i = 0; i < m.names.size(); ++i) {
    views.push_back({m.names[i], "BF16", {m.data[i].size() / 2}, m.data[i]});
  }
  return WriteSafetensors(path, {}, views);
}

// `tensors` tensors of `elements` random BF16 elements each.
Model RandomModel(int tensors, uint64_t elements, std::mt19937_64& rng) {
  Model m;
  for (int t = 0; t < tensors; ++t) {
    m.names.push_back("layer." + std::to_string(t) + ".w");
    m.data.emplace_back(elements * 2);
    for (auto& b : m.data.back()) b = static_cast<uint8_t>(rng());
  }
  return m;
}

// Flips the low bit of a fraction `rate` of the elements of [from, to).
void Step(Model* m, double rate, std::mt19937_64& rng, uint64_t from = 0,
          uint64_t to = UINT64_MAX) {
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& d : m->data) {
    for (uint64_t i = from; i < std::min<uint64_t>(to, d.size() / 2); ++i) {
      if (u(rng) < rate) d[2 * i] ^= static_cast<uint8_t>(1 + rng() % 7);
    }
  }
}

class ApplyJournalTest : public ::testing::Test {
 protected:
  // A base and target of 4 tensors x 256 Ki elements at 2% change, and a
  // delta of 64 KiB chunks (32 chunks).
  void SetUp() override {
    std::mt19937_64 rng(7);
    base_ = RandomModel(4, 256 << 10, rng);
    target_ = base_;
    Step(&target_, 0.02, rng);
    ASSERT_OK(Write(dir_.File("base.safetensors"), base_));
    ASSERT_OK(Write(dir_.File("target.safetensors"), target_));
    DiffOptions opts;
    opts.chunk_bytes = 64 << 10;
    ASSERT_OK(Diff(dir_.File("base.safetensors"), dir_.File("target.safetensors"),
                   delta_, opts)
                  .status());
    WriteBytes(ckpt_, ReadBytes(dir_.File("base.safetensors")));
  }

  // Applies with one thread and cancels after `chunks` chunks.
  Status ApplyCancelledAfter(int chunks) {
    std::atomic<bool> cancel{false};
    int seen = 0;
    ApplyOptions opts;
    opts.threads = 1;
    opts.cancel = &cancel;
    opts.progress = [&](std::string_view stage, uint64_t, uint64_t) {
      if (stage == "apply" && ++seen == chunks) cancel = true;
    };
    return Apply(delta_, ckpt_, opts).status();
  }

  TempDir dir_;
  Model base_, target_;
  std::string delta_ = dir_.File("d.rfd");
  std::string ckpt_ = dir_.File("ckpt.safetensors");
  std::string journal_ = ApplyJournal::PathFor(dir_.File("ckpt.safetensors"));
};

TEST_F(ApplyJournalTest, CancelledApplyIsCompletedByRunningItAgain) {
  Status s = ApplyCancelledAfter(5);
  ASSERT_THAT(s, StatusIs(StatusCode::kCancelled));
  EXPECT_NE(s.message().find("interrupted after 5 of 32 chunks"), std::string::npos)
      << s.ToString();
  EXPECT_TRUE(PathExists(journal_));
  const auto partial = ReadBytes(ckpt_);
  EXPECT_NE(partial, ReadBytes(dir_.File("base.safetensors")));
  EXPECT_NE(partial, ReadBytes(dir_.File("target.safetensors")));

  auto again = Apply(delta_, ckpt_, {});
  ASSERT_OK(again.status());
  EXPECT_GE(again->chunks_restored, 5u);  // journaled: stored or about to be
  EXPECT_EQ(again->chunks_applied, 32u);
  EXPECT_EQ(ReadBytes(ckpt_), ReadBytes(dir_.File("target.safetensors")));
  EXPECT_FALSE(PathExists(journal_));
}

TEST_F(ApplyJournalTest, ChunkTornByAKillIsRestoredFromTheJournal) {
  ASSERT_THAT(ApplyCancelledAfter(3), StatusIs(StatusCode::kCancelled));
  // A kill in the middle of chunk 1's stores (elements [32 Ki, 64 Ki) of
  // the first tensor) leaves some of them old and some new: put the base's
  // bytes back into the first half of that range.
  auto bytes = ReadBytes(ckpt_);
  const auto base_file = ReadBytes(dir_.File("base.safetensors"));
  const uint64_t data_start = bytes.size() - 4 * (256 << 10) * 2;
  const uint64_t from = data_start + (32 << 10) * 2, half = (16 << 10) * 2;
  ASSERT_NE(std::memcmp(bytes.data() + from, base_file.data() + from, half), 0);
  std::memcpy(bytes.data() + from, base_file.data() + from, half);
  WriteBytes(ckpt_, bytes);
  {
    // Without the journal the torn range matches neither hash.
    auto v = Verify(ckpt_, delta_);
    ASSERT_OK(v.status());
    EXPECT_FALSE(v->matches_base);
    EXPECT_FALSE(v->matches_target);
  }
  ASSERT_OK(Apply(delta_, ckpt_, {}).status());
  EXPECT_EQ(ReadBytes(ckpt_), ReadBytes(dir_.File("target.safetensors")));
}

TEST_F(ApplyJournalTest, RollbackRestoresTheBase) {
  ASSERT_THAT(ApplyCancelledAfter(9), StatusIs(StatusCode::kCancelled));
  auto r = Rollback(delta_, ckpt_, {});
  ASSERT_OK(r.status());
  EXPECT_GE(r->chunks_restored, 9u);
  EXPECT_EQ(ReadBytes(ckpt_), ReadBytes(dir_.File("base.safetensors")));
  EXPECT_FALSE(PathExists(journal_));
  // Nothing left to roll back: fine at the base, refused at the target.
  EXPECT_OK(Rollback(delta_, ckpt_, {}).status());
  ASSERT_OK(Apply(delta_, ckpt_, {}).status());
  EXPECT_THAT(Rollback(delta_, ckpt_, {}),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(ReadBytes(ckpt_), ReadBytes(dir_.File("target.safetensors")));
}

TEST_F(ApplyJournalTest, JournalOfAnotherDeltaIsRefused) {
  ASSERT_THAT(ApplyCancelledAfter(2), StatusIs(StatusCode::kCancelled));
  const auto partial = ReadBytes(ckpt_);
  // Another delta from the same base.
  std::mt19937_64 rng(99);
  Model other = base_;
  Step(&other, 0.01, rng);
  ASSERT_OK(Write(dir_.File("other.safetensors"), other));
  ASSERT_OK(Diff(dir_.File("base.safetensors"), dir_.File("other.safetensors"),
                 dir_.File("other.rfd"), {})
                .status());
  Status s = Apply(dir_.File("other.rfd"), ckpt_, {}).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("another delta"), std::string::npos) << s.ToString();
  EXPECT_EQ(ReadBytes(ckpt_), partial);
  ASSERT_OK(Apply(delta_, ckpt_, {}).status());
  EXPECT_EQ(ReadBytes(ckpt_), ReadBytes(dir_.File("target.safetensors")));
}

TEST_F(ApplyJournalTest, DifferenceOutsideTheChunksIsRefusedBeforeWriting) {
  // Changes only in the first 16 Ki elements of each tensor, so the
  // delta's chunks cover [0, 32 Ki) and the rest of each tensor is in none.
  std::mt19937_64 rng(3);
  Model near = base_;
  Step(&near, 0.05, rng, 0, 16 << 10);
  ASSERT_OK(Write(dir_.File("near.safetensors"), near));
  ASSERT_OK(Diff(dir_.File("base.safetensors"), dir_.File("near.safetensors"),
                 delta_, {})
                .status());
  // The checkpoint differs from the base in the last element of tensor 0.
  Model almost = base_;
  almost.data[0][almost.data[0].size() - 1] ^= 0x40;
  ASSERT_OK(Write(ckpt_, almost));
  const auto before = ReadBytes(ckpt_);
  Status s = Apply(delta_, ckpt_, {}).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("nothing was written"), std::string::npos) << s.ToString();
  EXPECT_EQ(ReadBytes(ckpt_), before);
  EXPECT_FALSE(PathExists(journal_));
}

// Writes `bytes` to `path` leaving every all-zero 4 KiB block a hole.
void WriteSparse(const std::string& path, const std::vector<uint8_t>& bytes) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  for (size_t off = 0; off < bytes.size(); off += 4096) {
    size_t n = std::min<size_t>(4096, bytes.size() - off);
    bool zero = std::all_of(bytes.begin() + off, bytes.begin() + off + n,
                            [](uint8_t b) { return b == 0; });
    if (!zero) {
      ASSERT_EQ(pwrite(fd, bytes.data() + off, n, static_cast<off_t>(off)),
                static_cast<ssize_t>(n));
    }
  }
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes.size())), 0);
  close(fd);
}

// The child's half of the full-disk test: exit 0 when the apply fails
// cleanly with nothing written, 1..3 otherwise; a crash is a signal.
int ApplyOnFullTmpfs(const std::string& mnt, const std::string& delta,
                     const std::vector<uint8_t>& base_bytes) {
  if (unshare(CLONE_NEWNS) != 0) return 10;
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 10;
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=512k") != 0) return 10;
  const std::string ckpt = mnt + "/sparse.safetensors";
  WriteSparse(ckpt, base_bytes);
  // Fill the file system.
  int fd = open((mnt + "/filler").c_str(), O_WRONLY | O_CREAT, 0644);
  std::vector<uint8_t> page(4096, 1);
  while (write(fd, page.data(), page.size()) > 0) {
  }
  close(fd);
  ApplyOptions opts;
  opts.threads = 1;
  Status s = Apply(delta, ckpt, opts).status();
  if (s.code() != StatusCode::kResourceExhausted) {
    fprintf(stderr, "apply: %s\n", s.ToString().c_str());
    return 1;
  }
  if (ReadBytes(ckpt) != base_bytes) return 2;
  if (PathExists(ApplyJournal::PathFor(ckpt))) return 3;
  return 0;
}

TEST(ApplyFullDiskTest, HoleOnAFullFileSystemIsAnErrorNotACrash) {
  TempDir dir;
  // A nonzero tensor and an all-zero one of 128 KiB that the file keeps as
  // a hole; the target changes a few zeros.
  std::vector<uint8_t> a(8192, 0x11), zeros(128 << 10, 0);
  auto target_zeros = zeros;
  for (size_t i = 0; i < target_zeros.size(); i += 997) target_zeros[i] = 0x3c;
  auto write = [&](const std::string& path, const std::vector<uint8_t>& z) {
    std::vector<SafetensorsTensorView> v{{"a", "BF16", {a.size() / 2}, a},
                                         {"z", "BF16", {z.size() / 2}, z}};
    return WriteSafetensors(path, {}, v);
  };
  ASSERT_OK(write(dir.File("base.safetensors"), zeros));
  ASSERT_OK(write(dir.File("target.safetensors"), target_zeros));
  ASSERT_OK(Diff(dir.File("base.safetensors"), dir.File("target.safetensors"),
                 dir.File("d.rfd"), {})
                .status());
  const auto base_bytes = ReadBytes(dir.File("base.safetensors"));
  const std::string mnt = dir.File("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(ApplyOnFullTmpfs(mnt, dir.File("d.rfd"), base_bytes));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 10) {
    GTEST_SKIP() << "no permission to mount a small tmpfs in a mount namespace";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "the apply died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace refit

namespace refit {
namespace {

TEST(ApplyPagesTest, APageTwoChunksShareIsCountedOnce) {
  // 1 MiB of BF16 at an address 100 bytes past a page boundary, half of
  // its elements changed, in 64 KiB chunks: every page of the span is
  // written, and the 16 chunks' boundary pages are each shared by two.
  TempDir dir;
  const uint64_t n = 512 << 10;
  std::vector<uint8_t> base_buf(n * 2 + 8192), target_buf;
  const size_t skew = (4096 - reinterpret_cast<uintptr_t>(base_buf.data()) % 4096) % 4096 + 100;
  std::mt19937_64 rng(5);
  for (auto& b : base_buf) b = static_cast<uint8_t>(rng());
  target_buf = base_buf;
  for (uint64_t i = 0; i < n; i += 2) target_buf[skew + 2 * i] ^= 1;
  std::vector<TensorView> base{{"w", "BF16", 2, {n}, base_buf.data() + skew}};
  std::vector<TensorView> target{{"w", "BF16", 2, {n}, target_buf.data() + skew}};
  DiffOptions opts;
  opts.chunk_bytes = 64 << 10;
  ASSERT_OK(DiffTensors(base, target, dir.File("d.rfd"), opts).status());
  std::vector<MutableTensorView> work{{"w", "BF16", 2, {n}, base_buf.data() + skew}};
  auto r = ApplyToTensors(dir.File("d.rfd"), work, {});
  ASSERT_OK(r.status());
  const uintptr_t first = reinterpret_cast<uintptr_t>(base_buf.data() + skew);
  const uint64_t spanned = (first + n * 2 + 4095) / 4096 - first / 4096;
  EXPECT_EQ(r->pages_written, spanned);
}

}  // namespace
}  // namespace refit
