// Drives the built `refit` binary (REFIT_CLI_PATH, set by CMake) as a
// process: diff/apply/verify/inspect round trips on small generated
// safetensors files and on the qwen2-tiny fixtures, the exit code of every
// error family, --json output (parsed by python3), and small runs of
// `refit demo` (its --json output checked field by field) and `refit bench`.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "refit/checkpoint.h"
#include "support/moto_testing.h"
#include "support/safetensors_builder.h"
#include "support/testing.h"

#ifndef REFIT_CLI_PATH
#error "REFIT_CLI_PATH must name the refit binary"
#endif

namespace refit {
namespace {

using ::refit::testing::FixturesDir;
using ::refit::testing::ReadBytes;
using ::refit::testing::TempDir;
using ::refit::testing::TestTensor;
using ::refit::testing::WriteBytes;
using ::refit::testing::WriteSafetensors;

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

std::string ReadText(const std::string& path) {
  std::vector<uint8_t> bytes = ReadBytes(path);
  return std::string(bytes.begin(), bytes.end());
}

// Runs `refit <args>` with stdout and stderr captured to files in `dir`;
// `env` (env(1) arguments: "NAME=value" adds, "-u", "NAME" removes) changes
// the environment.
RunResult Refit(const TempDir& dir, const std::vector<std::string>& args,
                const std::vector<std::string>& env = {}) {
  std::string cmd;
  if (!env.empty()) {
    cmd = "env";
    for (const std::string& e : env) cmd += " " + Quote(e);
    cmd += " ";
  }
  cmd += Quote(REFIT_CLI_PATH);
  for (const std::string& a : args) cmd += " " + Quote(a);
  std::string out = dir.File("stdout.txt");
  std::string err = dir.File("stderr.txt");
  cmd += " >" + Quote(out) + " 2>" + Quote(err) + " </dev/null";
  int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadText(out);
  r.err = ReadText(err);
  return r;
}

// True when python3's json module accepts `text`.
bool IsJson(const TempDir& dir, const std::string& text) {
  std::string path = dir.File("check.json");
  WriteBytes(path, std::vector<uint8_t>(text.begin(), text.end()));
  std::string cmd =
      "python3 -c 'import json,sys; json.load(sys.stdin)' < " + Quote(path);
  return std::system(cmd.c_str()) == 0;
}

using Tensor = TestTensor;

uint64_t Lcg(uint64_t* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return *state >> 33;
}

// A small model: three BF16 tensors (one spanning several 64 KiB chunks)
// and one F32 tensor.
std::vector<Tensor> SmallModel(uint64_t seed) {
  uint64_t state = seed;
  auto make = [&](std::string name, std::string dtype, int width,
                  std::vector<uint64_t> shape) {
    Tensor t{std::move(name), std::move(dtype), std::move(shape), {}};
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    t.data.resize(n * static_cast<uint64_t>(width));
    for (uint8_t& b : t.data) b = static_cast<uint8_t>(Lcg(&state));
    return t;
  };
  return {
      make("a.weight", "BF16", 2, {300, 400}), make("b.bias", "BF16", 2, {400}),
      make("c.weight", "BF16", 2, {64, 64}), make("d.scale", "F32", 4, {16})};
}

// Flips the low bit of about `rate` of the 16-bit words of BF16 tensors.
std::vector<Tensor> Step(std::vector<Tensor> model, double rate,
                         uint64_t seed) {
  uint64_t state = seed;
  uint64_t threshold = static_cast<uint64_t>(rate * 2147483648.0);
  for (Tensor& t : model) {
    if (t.dtype != "BF16") continue;
    for (size_t i = 0; i + 1 < t.data.size(); i += 2) {
      if (Lcg(&state) < threshold) t.data[i] ^= 1;
    }
  }
  return model;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    base_ = dir_.File("base.safetensors");
    target_ = dir_.File("target.safetensors");
    other_ = dir_.File("other.safetensors");
    delta_ = dir_.File("delta.rfd");
    scratch_ = dir_.File("scratch.safetensors");
    std::vector<Tensor> model = SmallModel(1);
    WriteSafetensors(base_, model);
    WriteSafetensors(target_, Step(model, 0.02, 2));
    WriteSafetensors(other_, SmallModel(3));  // same layout, other bits
  }

  RunResult Run(const std::vector<std::string>& args,
                const std::vector<std::string>& env = {}) {
    return Refit(dir_, args, env);
  }

  void MakeDelta() {
    RunResult r = Run({"diff", base_, target_, "-o", delta_, "--chunk-mib",
                       "0.0625", "--version", "2", "--base-version", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  TempDir dir_;
  std::string base_, target_, other_, delta_, scratch_;
};

TEST_F(CliTest, RoundTripOnGeneratedFiles) {
  MakeDelta();
  RunResult inspect = Run({"inspect", delta_, "--tensors"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("a.weight"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("entropy bound"), std::string::npos);

  std::filesystem::copy_file(base_, scratch_);
  // The untouched copy is the delta's base, not its target.
  RunResult before = Run({"verify", scratch_, "--delta", delta_});
  EXPECT_EQ(before.exit_code, 7) << before.err;
  EXPECT_NE(before.err.find("refit apply"), std::string::npos) << before.err;

  RunResult apply = Run({"apply", delta_, scratch_});
  ASSERT_EQ(apply.exit_code, 0) << apply.err;
  EXPECT_EQ(ReadBytes(scratch_), ReadBytes(target_));
  RunResult after = Run({"verify", scratch_, "--delta", delta_});
  EXPECT_EQ(after.exit_code, 0) << after.err;

  // Applying again is a no-op: every chunk is already at its target.
  RunResult again = Run({"apply", delta_, scratch_, "--json"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("\"chunks_applied\": 0"), std::string::npos)
      << again.out;
  EXPECT_EQ(ReadBytes(scratch_), ReadBytes(target_));
}

// The target's header (its __metadata__) travels in the delta: apply makes
// the file byte-identical to the target, or says why it could not; verify
// reports a header-only difference apart from tensor mismatches.
TEST_F(CliTest, HeadersAreCarriedAndHeaderOnlyDifferencesReported) {
  const std::vector<Tensor> model = SmallModel(1);
  WriteSafetensors(base_, model, R"({"step":"0"})");
  WriteSafetensors(target_, Step(model, 0.02, 2), R"({"step":"1"})");
  MakeDelta();
  std::filesystem::copy_file(base_, scratch_);
  RunResult apply = Run({"apply", delta_, scratch_});
  ASSERT_EQ(apply.exit_code, 0) << apply.err;
  EXPECT_NE(apply.out.find("1 rewritten to the target's"), std::string::npos)
      << apply.out;
  EXPECT_EQ(ReadBytes(scratch_), ReadBytes(target_));
  RunResult same = Run({"verify", scratch_, "--delta", delta_});
  EXPECT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(same.out.find("header differs"), std::string::npos) << same.out;

  // The target's tensors under another header: a header-only difference,
  // on its own line and JSON field, not a mismatch.
  const std::string other = dir_.File("header_only.safetensors");
  WriteSafetensors(other, Step(model, 0.02, 2), R"({"step":"7"})");
  RunResult text = Run({"verify", other, "--delta", delta_});
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("header differs: " + other), std::string::npos)
      << text.out;
  RunResult json = Run({"verify", other, "--delta", delta_, "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.err;
  EXPECT_TRUE(IsJson(dir_, json.out)) << json.out;
  EXPECT_NE(json.out.find("\"header_matches_target\": false"), std::string::npos)
      << json.out;
  EXPECT_NE(json.out.find("\"mismatched\": []"), std::string::npos) << json.out;

  // A target header longer than the base's header area is not carried:
  // the apply succeeds with the target's tensors and says so.
  const std::string long_target = dir_.File("long.safetensors");
  WriteSafetensors(long_target, Step(model, 0.02, 2),
                   R"({"step":"1","note":")" + std::string(64, 'n') + R"("})");
  ASSERT_EQ(Run({"diff", base_, long_target, "-o", delta_}).exit_code, 0);
  std::filesystem::copy_file(base_, scratch_,
                             std::filesystem::copy_options::overwrite_existing);
  RunResult partial = Run({"apply", delta_, scratch_, "--json"});
  ASSERT_EQ(partial.exit_code, 0) << partial.err;
  EXPECT_TRUE(IsJson(dir_, partial.out)) << partial.out;
  EXPECT_NE(partial.out.find("header area"), std::string::npos) << partial.out;
  RunResult partial_text = Run({"apply", delta_, scratch_});
  EXPECT_NE(partial_text.out.find("header not carried"), std::string::npos)
      << partial_text.out;
  RunResult tensors_only = Run({"verify", scratch_, "--delta", delta_});
  EXPECT_EQ(tensors_only.exit_code, 0) << tensors_only.err;
  EXPECT_NE(tensors_only.out.find("header differs"), std::string::npos)
      << tensors_only.out;
}

TEST_F(CliTest, OverwriteOnlyDeltaRoundTrips) {
  RunResult diff =
      Run({"diff", base_, target_, "-o", delta_, "--overwrite-only"});
  ASSERT_EQ(diff.exit_code, 0) << diff.err;
  std::filesystem::copy_file(base_, scratch_);
  RunResult apply = Run({"apply", delta_, scratch_, "--no-sync"});
  ASSERT_EQ(apply.exit_code, 0) << apply.err;
  EXPECT_EQ(ReadBytes(scratch_), ReadBytes(target_));
}

TEST_F(CliTest, JsonOutputParses) {
  RunResult diff = Run({"diff", base_, target_, "-o", delta_, "--json"});
  ASSERT_EQ(diff.exit_code, 0) << diff.err;
  EXPECT_TRUE(IsJson(dir_, diff.out)) << diff.out;

  std::filesystem::copy_file(base_, scratch_);
  RunResult mismatch = Run({"verify", scratch_, "--delta", delta_, "--json"});
  EXPECT_EQ(mismatch.exit_code, 7);
  EXPECT_TRUE(IsJson(dir_, mismatch.out)) << mismatch.out;

  RunResult apply = Run({"--json", "apply", delta_, scratch_});
  ASSERT_EQ(apply.exit_code, 0) << apply.err;
  EXPECT_TRUE(IsJson(dir_, apply.out)) << apply.out;

  RunResult verify = Run({"verify", scratch_, "--delta", delta_, "--json"});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  EXPECT_TRUE(IsJson(dir_, verify.out)) << verify.out;

  for (const char* flag : {"--tensors", "--top=2"}) {
    RunResult inspect = Run({"inspect", delta_, flag, "--json"});
    EXPECT_EQ(inspect.exit_code, 0) << inspect.err;
    EXPECT_TRUE(IsJson(dir_, inspect.out)) << inspect.out;
  }

  // Errors are JSON too, with the exit code inside.
  RunResult missing = Run({"inspect", dir_.File("nope.rfd"), "--json"});
  EXPECT_EQ(missing.exit_code, 3);
  EXPECT_TRUE(IsJson(dir_, missing.out)) << missing.out;
}

TEST_F(CliTest, WrongBaseExits5AndWritesNothing) {
  MakeDelta();
  std::filesystem::copy_file(other_, scratch_);
  std::vector<uint8_t> before = ReadBytes(scratch_);
  RunResult r = Run({"apply", delta_, scratch_});
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_NE(r.err.find("refit verify"), std::string::npos) << r.err;
  EXPECT_EQ(ReadBytes(scratch_), before);

  // Neither base nor target: verify says so with the mismatch code.
  RunResult verify = Run({"verify", scratch_, "--delta", delta_});
  EXPECT_EQ(verify.exit_code, 7) << verify.err;
}

TEST_F(CliTest, CorruptDeltaExits4) {
  MakeDelta();
  std::vector<uint8_t> bytes = ReadBytes(delta_);
  ASSERT_GT(bytes.size(), 100u);
  std::string corrupt = dir_.File("corrupt.rfd");
  std::vector<uint8_t> flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  WriteBytes(corrupt, flipped);
  std::filesystem::copy_file(base_, scratch_);
  std::vector<uint8_t> before = ReadBytes(scratch_);

  RunResult apply = Run({"apply", corrupt, scratch_});
  EXPECT_EQ(apply.exit_code, 4) << apply.err;
  EXPECT_EQ(ReadBytes(scratch_), before);
  RunResult inspect = Run({"inspect", corrupt});
  EXPECT_EQ(inspect.exit_code, 4) << inspect.err;

  std::string truncated = dir_.File("truncated.rfd");
  WriteBytes(truncated, std::vector<uint8_t>(bytes.begin(), bytes.end() - 7));
  RunResult trunc = Run({"apply", truncated, scratch_});
  EXPECT_EQ(trunc.exit_code, 4) << trunc.err;
  EXPECT_EQ(ReadBytes(scratch_), before);

  WriteBytes(truncated,
             {'n', 'o', 't', ' ', 'a', ' ', 'd', 'e', 'l', 't', 'a'});
  RunResult garbage = Run({"inspect", truncated});
  EXPECT_EQ(garbage.exit_code, 4) << garbage.err;
}

TEST_F(CliTest, MissingFilesExit3) {
  MakeDelta();
  std::string nope = dir_.File("nope.safetensors");
  EXPECT_EQ(Run({"diff", nope, target_, "-o", delta_}).exit_code, 3);
  EXPECT_EQ(Run({"diff", base_, nope, "-o", delta_}).exit_code, 3);
  EXPECT_EQ(Run({"apply", dir_.File("nope.rfd"), base_}).exit_code, 3);
  EXPECT_EQ(Run({"apply", delta_, nope}).exit_code, 3);
  EXPECT_EQ(Run({"verify", nope, "--delta", delta_}).exit_code, 3);
  RunResult r = Run({"inspect", dir_.File("nope.rfd")});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("nope.rfd"), std::string::npos) << r.err;
}

TEST_F(CliTest, UsageAndInvalidArguments) {
  EXPECT_EQ(Run({}).exit_code, 1);
  EXPECT_EQ(Run({"frobnicate"}).exit_code, 1);
  EXPECT_EQ(Run({"diff", base_, target_}).exit_code, 1);  // no -o
  EXPECT_EQ(Run({"apply", delta_, base_, "--bogus"}).exit_code, 1);
  EXPECT_EQ(Run({"bench", "--rate", "150%"}).exit_code, 2);
  EXPECT_EQ(
      Run({"diff", base_, target_, "-o", delta_, "--chunk-mib", "0"}).exit_code,
      2);
  // Different tensor sets cannot be diffed.
  std::string small = dir_.File("small.safetensors");
  WriteSafetensors(small, {SmallModel(4)[1]});
  RunResult mismatched = Run({"diff", base_, small, "-o", delta_});
  EXPECT_EQ(mismatched.exit_code, 2) << mismatched.err;
}

// The delta is renamed over OUT when it is complete, so an OUT that names an
// input, by any path, would replace that input with the delta.
TEST_F(CliTest, DiffRefusesToWriteOverItsInputs) {
  namespace fs = std::filesystem;
  const std::vector<uint8_t> base_bytes = ReadBytes(base_);
  const std::vector<uint8_t> target_bytes = ReadBytes(target_);
  fs::create_directory(dir_.File("sub"));
  const std::string symlink = dir_.File("link.safetensors");
  fs::create_symlink(base_, symlink);
  const std::string hardlink = dir_.File("hard.safetensors");
  fs::create_hard_link(target_, hardlink);
  // A checkpoint directory: nothing may be written inside it either (its
  // index, its shards, or a stray file that copies of it would carry along).
  const std::string ckpt = dir_.File("ckpt");
  fs::create_directory(ckpt);
  fs::copy_file(base_, ckpt + "/model.safetensors");
  const std::vector<uint8_t> ckpt_bytes = ReadBytes(ckpt + "/model.safetensors");
  // Every file under dir_, but the captured output of the runs.
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(dir_.path())) {
      if (e.path().extension() != ".txt") names.push_back(e.path().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> before = listing();

  const std::vector<std::vector<std::string>> kCases = {
      {base_, target_, base_},
      {base_, target_, target_},
      {base_, target_, dir_.File("sub/../base.safetensors")},
      {base_, target_, symlink},
      {base_, target_, hardlink},
      {symlink, target_, base_},
      {ckpt, target_, ckpt + "/model.safetensors"},
      {ckpt, target_, ckpt + "/model.safetensors.index.json"},
      {base_, ckpt, ckpt + "/step1.rfd"},
      {base_, ckpt, ckpt},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c[0] + " " + c[1] + " -o " + c[2]);
    RunResult r = Run({"diff", c[0], c[1], "-o", c[2]});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("output '" + c[2] + "' would "), std::string::npos)
        << r.err;
  }
  EXPECT_EQ(ReadBytes(base_), base_bytes);
  EXPECT_EQ(ReadBytes(target_), target_bytes);
  EXPECT_TRUE(fs::is_symlink(symlink));
  EXPECT_EQ(ReadBytes(ckpt + "/model.safetensors"), ckpt_bytes);
  // Nothing was written: no delta, no temporary file.
  EXPECT_EQ(listing(), before);
  // A delta beside the inputs is fine.
  RunResult ok = Run({"diff", ckpt, target_, "-o", delta_});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST_F(CliTest, HelpDocumentsEverySubcommandAndExitCodes) {
  RunResult help = Run({"--help"});
  ASSERT_EQ(help.exit_code, 0);
  for (const char* word : {"diff", "apply", "verify", "inspect", "demo",
                           "bench", "Exit codes", "verify mismatch"}) {
    EXPECT_NE(help.out.find(word), std::string::npos) << word;
  }
  for (const char* cmd :
       {"diff", "apply", "verify", "inspect", "demo", "bench"}) {
    RunResult sub = Run({cmd, "--help"});
    EXPECT_EQ(sub.exit_code, 0) << cmd;
    EXPECT_NE(sub.out.find("--json"), std::string::npos) << cmd;
  }
}

TEST_F(CliTest, DemoSyntheticRunsSmall) {
  RunResult r = Run({"demo", "--synthetic", "--size-mib", "2", "--steps", "2",
                     "--scale-mib", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("bit-exact"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("3. at scale"), std::string::npos) << r.out;
  RunResult j = Run({"demo", "--synthetic", "--size-mib", "1", "--steps", "1",
                     "--scale-mib", "4", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_TRUE(IsJson(dir_, j.out)) << j.out;
  nlohmann::json demo = nlohmann::json::parse(j.out);
  EXPECT_TRUE(demo["ok"].get<bool>()) << j.out;
  EXPECT_TRUE(demo["scale"]["ok"].get<bool>()) << j.out;
}

TEST_F(CliTest, BenchRunsSmall) {
  RunResult r =
      Run({"bench", "--size-mib", "2", "--rate", "1%", "0.2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(IsJson(dir_, r.out)) << r.out;
  EXPECT_NE(r.out.find("zstd3_dense_xor_bytes"), std::string::npos);
}

// Every scheme of `refit bench peers` round-trips bit-exact on the real
// fixture steps, and refit's payload is the smallest of them.
TEST_F(CliTest, BenchPeersRoundTripsEverySchemeOnTheFixtures) {
  REFIT_REQUIRE_FIXTURES();
  RunResult r = Run({"bench", "peers", "--fixtures", FixturesDir(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["ok"].get<bool>()) << r.out;
  ASSERT_EQ(j["cases"].size(), 3u) << r.out;
  for (const auto& c : j["cases"]) {
    std::map<std::string, uint64_t> payload;
    for (const auto& s : c["schemes"]) {
      EXPECT_TRUE(s["exact"].get<bool>()) << s;
      payload[s["scheme"].get<std::string>()] = s["payload_bytes"].get<uint64_t>();
    }
    ASSERT_EQ(payload.size(), 5u) << c;
    for (const auto& [name, bytes] : payload) {
      if (name != "refit") {
        EXPECT_LT(payload["refit"], bytes) << name;
      }
    }
    EXPECT_EQ(payload["full"], 2 * c["elements"].get<uint64_t>());
  }
}

// A checkpoint where a delta belongs, or the reverse, is named as the
// mix-up with the usage line, not reported as a corrupt delta.
TEST_F(CliTest, SwappedArgumentsAreNamed) {
  MakeDelta();
  std::filesystem::copy_file(base_, scratch_);
  const std::vector<uint8_t> before = ReadBytes(scratch_);
  const std::string kNotDelta = "is a safetensors checkpoint, not a refit delta";
  const std::string kNotCheckpoint = "is a refit delta, not a checkpoint";

  RunResult swapped = Run({"apply", scratch_, delta_});
  EXPECT_EQ(swapped.exit_code, 2) << swapped.err;
  EXPECT_NE(swapped.err.find(kNotDelta), std::string::npos) << swapped.err;
  EXPECT_NE(swapped.err.find("usage: refit apply DELTA CHECKPOINT"),
            std::string::npos)
      << swapped.err;
  EXPECT_EQ(swapped.err.find("corrupt"), std::string::npos) << swapped.err;
  EXPECT_EQ(ReadBytes(scratch_), before);

  RunResult two_deltas = Run({"apply", delta_, delta_});
  EXPECT_EQ(two_deltas.exit_code, 2) << two_deltas.err;
  EXPECT_NE(two_deltas.err.find(kNotCheckpoint), std::string::npos)
      << two_deltas.err;

  RunResult inspect = Run({"inspect", base_});
  EXPECT_EQ(inspect.exit_code, 2) << inspect.err;
  EXPECT_NE(inspect.err.find(kNotDelta), std::string::npos) << inspect.err;
  EXPECT_NE(inspect.err.find("usage: refit inspect DELTA"), std::string::npos)
      << inspect.err;

  RunResult verify = Run({"verify", delta_, "--delta", base_});
  EXPECT_EQ(verify.exit_code, 2) << verify.err;
  EXPECT_NE(verify.err.find("usage: refit verify CHECKPOINT --delta DELTA"),
            std::string::npos)
      << verify.err;

  RunResult diff = Run({"diff", delta_, target_, "-o", dir_.File("x.rfd")});
  EXPECT_EQ(diff.exit_code, 2) << diff.err;
  EXPECT_NE(diff.err.find(kNotCheckpoint), std::string::npos) << diff.err;
}

// The advice after an error fits its cause: no disk-space advice for a
// refused connection or a missing key, no "bug" for an overlong path.
TEST_F(CliTest, HintsFitTheError) {
  RunResult refused = Run(
      {"status", "--store", "s3://bkt/x?endpoint=http://127.0.0.1:1"},
      {"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"});
  EXPECT_EQ(refused.exit_code, 6) << refused.err;
  EXPECT_NE(refused.err.find("curl error 7"), std::string::npos)
      << refused.err;
  EXPECT_EQ(refused.err.find("disk space"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("reachable"), std::string::npos) << refused.err;

  // A store written with an HMAC key, read by a receiver without one.
  const std::string store = dir_.File("store");
  const std::string key = dir_.File("hmac.key");
  WriteBytes(key, std::vector<uint8_t>(32, 'k'));
  const std::string baseline = dir_.File("baseline.safetensors");
  std::filesystem::copy_file(base_, baseline);
  std::filesystem::copy_file(base_, scratch_);
  RunResult publish = Run({"publish", "--store", store, "--baseline", baseline,
                           "--members", "r0", "--version", "1", "--key-file",
                           key, "--vote-timeout-ms", "100", target_});
  ASSERT_EQ(publish.exit_code, 8) << publish.err;  // aborted: nobody voted
  RunResult keyless =
      Run({"receive", "--store", store, "--member", "r0", "--checkpoint",
           scratch_, "--state", dir_.File("state"), "--once"});
  EXPECT_NE(keyless.exit_code, 0);
  EXPECT_NE(keyless.err.find("no key"), std::string::npos) << keyless.err;
  EXPECT_EQ(keyless.err.find("disk space"), std::string::npos) << keyless.err;

  RunResult overlong =
      Run({"status", "--store", dir_.File(std::string(300, 'a'))});
  EXPECT_EQ(overlong.exit_code, 2) << overlong.err;
  EXPECT_EQ(overlong.err.find("bug"), std::string::npos) << overlong.err;
}

// How to reach an S3 store is in `refit --help` and the --store options'
// help, and an S3 store without credentials names the variables to set,
// not options that do not exist.
TEST_F(CliTest, S3SettingsAreDocumentedWhereErrorsPointTo) {
  RunResult help = Run({"--help"});
  ASSERT_EQ(help.exit_code, 0);
  RunResult status_help = Run({"status", "--help"});
  ASSERT_EQ(status_help.exit_code, 0);
  for (const char* word :
       {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL", "AWS_REGION", "?endpoint="}) {
    EXPECT_NE(help.out.find(word), std::string::npos) << word;
    EXPECT_NE(status_help.out.find(word), std::string::npos) << word;
  }
  RunResult no_credentials =
      Run({"status", "--store", "s3://bkt/x?endpoint=http://127.0.0.1:1"},
          {"-u", "AWS_ACCESS_KEY_ID", "-u", "AWS_SECRET_ACCESS_KEY", "-u",
           "AWS_SESSION_TOKEN"});
  EXPECT_EQ(no_credentials.exit_code, 2) << no_credentials.err;
  EXPECT_NE(no_credentials.err.find("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
            std::string::npos)
      << no_credentials.err;
  EXPECT_EQ(no_credentials.err.find("options"), std::string::npos)
      << no_credentials.err;
  EXPECT_NE(no_credentials.err.find("see `refit status --help`"),
            std::string::npos)
      << no_credentials.err;
}

// A missing bucket's message says what to do; no path advice follows it.
TEST_F(CliTest, MissingBucketHintFits) {
  auto moto = testing::MotoServer::Start();
  if (!moto.ok() && moto.status().code() == StatusCode::kNotFound) {
    GTEST_SKIP() << "\n*** SKIPPED: moto_server is not on PATH, so the S3 "
                    "CLI tests did not run ***\n";
  }
  ASSERT_OK(moto);
  RunResult r = Run(
      {"status", "--store", "s3://no-such-bucket/run1?endpoint=" + (*moto)->endpoint()},
      {"AWS_ACCESS_KEY_ID=testing", "AWS_SECRET_ACCESS_KEY=testing"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("bucket 'no-such-bucket' does not exist"), std::string::npos)
      << r.err;
  EXPECT_TRUE(r.err.ends_with("create it or fix the URL\n")) << r.err;
  EXPECT_EQ(r.err.find("check the path"), std::string::npos) << r.err;
}

TEST_F(CliTest, UnknownSubcommandSuggestsTheNearOne) {
  RunResult typo = Run({"aply", delta_, base_});
  EXPECT_EQ(typo.exit_code, 1);
  EXPECT_NE(typo.err.find("unknown subcommand 'aply'"), std::string::npos)
      << typo.err;
  EXPECT_NE(typo.err.find("did you mean 'apply'"), std::string::npos)
      << typo.err;
  RunResult far = Run({"--json", "frobnicate"});
  EXPECT_EQ(far.exit_code, 1);
  EXPECT_NE(far.err.find("unknown subcommand 'frobnicate'"), std::string::npos)
      << far.err;
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
}

// Out-of-range numbers name a readable range, never the largest double.
TEST_F(CliTest, NumericFlagsNameASensibleRange) {
  const std::vector<std::vector<std::string>> cases = {
      {"apply", "--threads", "-1", delta_, base_},
      {"apply", "--threads", "100000", delta_, base_},
      {"inspect", "--top", "-5", delta_},
      {"diff", base_, target_, "-o", delta_, "--version", "-1"},
      {"diff", base_, target_, "-o", delta_, "--base-version", "-1"},
      {"bench", "--seed", "-1"},
      {"demo", "--seed", "-1"},
      {"demo", "--scale-mib", "-1"},
      {"layout", "generate", "--config", "c.json", "-o", "l.json", "--tp",
       "-2"},
      {"receive", "--store", "s", "--member", "r0", "--checkpoint", "c",
       "--state", "s", "-j", "-1"},
      {"publish", "--store", "s", "--baseline", "b", "--members", "r0",
       "--version", "1", "--upload-threads", "0", "t"},
  };
  const std::regex long_number("[0-9]{12,}");
  for (const auto& args : cases) {
    RunResult r = Run(args);
    EXPECT_EQ(r.exit_code, 1) << args[1] << ": " << r.err;
    EXPECT_FALSE(std::regex_search(r.err, long_number)) << r.err;
    EXPECT_LT(r.err.size(), 300u) << r.err;
  }
  RunResult threads = Run({"apply", "--threads", "-1", delta_, base_});
  EXPECT_NE(threads.err.find("0..1024"), std::string::npos) << threads.err;
}

// A read-only command never creates a store: a typo is an error.
TEST_F(CliTest, StatusDoesNotCreateAStore) {
  const std::string typo = dir_.File("dir/stor");
  RunResult r = Run({"status", "--store", typo});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("no store at"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_.File("dir")));
}

// Ctrl-C during `refit bench` removes its scratch folder (generated
// checkpoints of --size-mib each) before the process dies of the signal.
TEST_F(CliTest, BenchInterruptedLeavesNoScratch) {
  for (int sig : {SIGINT, SIGTERM}) {
    const std::string tmp = dir_.File("tmp" + std::to_string(sig));
    std::filesystem::create_directories(tmp);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv("TMPDIR", tmp.c_str(), 1);
      freopen("/dev/null", "w", stdout);
      execl(REFIT_CLI_PATH, REFIT_CLI_PATH, "bench", "--size-mib", "64",
            "--rate", "1%", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait until the scratch folder holds the generated checkpoint.
    bool started = false;
    for (int i = 0; i < 600 && !started; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      for (const auto& e : std::filesystem::recursive_directory_iterator(tmp)) {
        if (e.is_regular_file()) started = true;
      }
    }
    EXPECT_TRUE(started) << "no scratch file appeared";
    kill(pid, sig);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig)
        << "status " << status;
    EXPECT_TRUE(std::filesystem::is_empty(tmp))
        << std::filesystem::directory_iterator(tmp)->path();
  }
}

// The page report counts pages as the file has them: 64 KiB of tensor data
// that starts mid-page spans 17 pages, and one chunk storing into all of
// them wrote 17 of 17, not "17 of 16 (106%)".
TEST_F(CliTest, ApplyReportsPagesOfTheFile) {
  Tensor t{"w", "BF16", {32768}, std::vector<uint8_t>(65536)};
  uint64_t state = 7;
  for (uint8_t& b : t.data) b = static_cast<uint8_t>(Lcg(&state));
  WriteSafetensors(base_, {t});
  // Changes in the first and last bytes too: every page holds one.
  t.data[0] ^= 1;
  for (size_t i = 255; i < t.data.size(); i += 256) t.data[i] ^= 1;
  WriteSafetensors(target_, {t});
  RunResult diff = Run({"diff", base_, target_, "-o", delta_});
  ASSERT_EQ(diff.exit_code, 0) << diff.err;
  std::filesystem::copy_file(base_, scratch_);
  RunResult apply = Run({"apply", delta_, scratch_, "--json"});
  ASSERT_EQ(apply.exit_code, 0) << apply.err;
  EXPECT_NE(apply.out.find("\"pages_written\": 17"), std::string::npos)
      << apply.out;
  EXPECT_NE(apply.out.find("\"checkpoint_pages\": 17"), std::string::npos)
      << apply.out;
}

// The real fixtures: step0 -> step1 through the CLI, checked tensor by
// tensor against step1 through the checkpoint API.
TEST_F(CliTest, FixtureStep0ToStep1) {
  REFIT_REQUIRE_FIXTURES();
  std::string step0 = FixturesDir() + "/step0.safetensors";
  std::string step1 = FixturesDir() + "/step1.safetensors";
  RunResult diff = Run({"diff", step0, step1, "-o", delta_});
  ASSERT_EQ(diff.exit_code, 0) << diff.err;
  RunResult inspect = Run({"inspect", delta_, "--json"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_TRUE(IsJson(dir_, inspect.out));
  EXPECT_NE(inspect.out.find("\"changed_elements\": 90309"), std::string::npos)
      << inspect.out;

  std::filesystem::copy_file(step0, scratch_);
  RunResult apply = Run({"apply", delta_, scratch_});
  ASSERT_EQ(apply.exit_code, 0) << apply.err;
  EXPECT_EQ(Run({"verify", scratch_, "--delta", delta_}).exit_code, 0);
  EXPECT_EQ(Run({"verify", step0, "--delta", delta_}).exit_code, 7);

  Result<Checkpoint> got =
      Checkpoint::Open(scratch_, Checkpoint::Mode::kReadOnly);
  Result<Checkpoint> want =
      Checkpoint::Open(step1, Checkpoint::Mode::kReadOnly);
  ASSERT_OK(got);
  ASSERT_OK(want);
  ASSERT_EQ(got->tensors().size(), want->tensors().size());
  for (size_t i = 0; i < want->tensors().size(); ++i) {
    std::span<const uint8_t> a = got->Data(i);
    std::span<const uint8_t> b = want->Data(i);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0)
        << want->tensors()[i].name;
  }

  // step2 is not this delta's base.
  std::string other = dir_.File("step2.safetensors");
  std::filesystem::copy_file(FixturesDir() + "/step2.safetensors", other);
  EXPECT_EQ(Run({"apply", delta_, other}).exit_code, 5);
}

TEST_F(CliTest, LayoutGenerateCheckAndRefuse) {
  REFIT_REQUIRE_FIXTURES();
  const std::string config = FixturesDir() + "/sharded_step3/config.json";
  const std::string layout = dir_.File("layout.json");
  RunResult gen = Run({"layout", "generate", "--config", config, "--tp", "3", "--pp", "2",
                       "--dp", "2", "--gate-up", "interleaved:64", "-o", layout});
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  RunResult check = Run({"layout", "check", layout});
  ASSERT_EQ(check.exit_code, 0) << check.err;
  EXPECT_NE(check.out.find("owned by exactly one rank"), std::string::npos) << check.out;
  RunResult json = Run({"layout", "check", layout, "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_TRUE(IsJson(dir_, json.out));

  // One piece a row longer than its local tensor: refused, named, exit 2.
  std::vector<uint8_t> bytes = ReadBytes(layout);
  std::string text(bytes.begin(), bytes.end());
  const size_t at = text.find("\"rows\":1366");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 11, "\"rows\":1367");
  WriteBytes(layout, std::vector<uint8_t>(text.begin(), text.end()));
  RunResult bad = Run({"layout", "check", layout});
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.err.find("shape mismatch"), std::string::npos) << bad.err;

  RunResult unknown = Run({"layout", "generate", "--config", config, "--gate-up", "zigzag",
                           "-o", layout});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.err;

  // The engine side: vLLM's TP 2 ranks, proved covered; trainer options refused.
  const std::string engine = dir_.File("engine_layout.json");
  RunResult vllm = Run({"layout", "generate", "--config", config, "--engine", "vllm", "--tp",
                        "2", "-o", engine});
  ASSERT_EQ(vllm.exit_code, 0) << vllm.err;
  EXPECT_NE(vllm.out.find("2 ranks (vllm tp 2 ep 1)"), std::string::npos) << vllm.out;
  check = Run({"layout", "check", engine});
  ASSERT_EQ(check.exit_code, 0) << check.err;
  EXPECT_NE(ReadText(engine).find("model.layers.0.self_attn.qkv_proj.weight"), std::string::npos);
  RunResult trainer_flag = Run({"layout", "generate", "--config", config, "--engine", "vllm",
                                "--pp", "2", "-o", engine});
  EXPECT_EQ(trainer_flag.exit_code, 2) << trainer_flag.err;
  EXPECT_NE(trainer_flag.err.find("--pp describes a trainer"), std::string::npos)
      << trainer_flag.err;
}

// The Quickstart's demo (at a small scale): every copy bit-exact, the
// victim killed with chunks of its version applied (in every build: the
// demo holds the upload back until the victim's journal shows them) and
// finishing it with each chunk applied once, and the store's bytes
// accounted for object by object.
TEST_F(CliTest, DemoOnFixtures) {
  REFIT_REQUIRE_FIXTURES();
  std::string parent =
      std::filesystem::path(FixturesDir()).parent_path().string();
  RunResult r =
      Run({"demo", "--fixtures", parent, "--scale-mib", "16", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  nlohmann::json demo = nlohmann::json::parse(r.out);
  EXPECT_TRUE(demo["ok"].get<bool>());
  EXPECT_EQ(demo["source"], "fixtures");
  for (const auto& step : demo["steps"]) {
    EXPECT_TRUE(step["bit_exact"].get<bool>()) << step;
    EXPECT_TRUE(step["verified"].get<bool>()) << step;
  }

  const nlohmann::json& dist = demo["distribution"];
  const int receivers = dist["receivers"].get<int>();
  ASSERT_EQ(dist["versions"].size(), 3u);
  for (const auto& v : dist["versions"]) {
    EXPECT_TRUE(v["committed"].get<bool>()) << v;
    EXPECT_EQ(v["receivers_bit_exact"].get<int>(), receivers) << v;
    EXPECT_TRUE(v["publisher_bit_exact"].get<bool>()) << v;
  }
  const nlohmann::json& crash = dist["crash"];
  EXPECT_EQ(crash["by"], "demo");
  EXPECT_EQ(crash["version"].get<int>(), 2);
  EXPECT_TRUE(crash["killed"].get<bool>());
  const int64_t at_kill = crash["chunks_applied_at_kill"].get<int64_t>();
  EXPECT_GE(at_kill, 1);
  EXPECT_EQ(at_kill, crash["after_chunks"].get<int64_t>());
  EXPECT_EQ(crash["chunks_journaled_at_restart"].get<int64_t>(), at_kill);
  EXPECT_EQ(crash["chunks_skipped_after_restart"].get<int64_t>(), at_kill);
  EXPECT_GE(crash["chunks_applied_after_restart"].get<int64_t>(), 1);
  EXPECT_TRUE(crash["at_most_once"].get<bool>());

  const nlohmann::json& objects = dist["first_version_objects"];
  const nlohmann::json& v1 = dist["versions"][0];
  EXPECT_EQ(objects["announcement_bytes"].get<uint64_t>() +
                objects["chunk_object_bytes"].get<uint64_t>() +
                objects["manifest_bytes"].get<uint64_t>(),
            v1["payload_bytes"].get<uint64_t>());
  EXPECT_EQ(objects["chunk_objects"], v1["chunks"]);

  const nlohmann::json& scale = demo["scale"];
  EXPECT_TRUE(scale["ok"].get<bool>());
  EXPECT_EQ(scale["version"]["receivers_bit_exact"], scale["receivers"]);
  EXPECT_TRUE(scale["version"]["publisher_bit_exact"].get<bool>());
}

#ifdef REFIT_CRASH_POINTS
// Builds with crash points can still kill the victim at one.
TEST_F(CliTest, DemoKillsAtACrashPoint) {
  RunResult r = Run({"demo", "--synthetic", "--size-mib", "4", "--steps", "2",
                     "--scale-mib", "0", "--receivers", "2", "--crash-at",
                     "receiver.after-chunk:2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  nlohmann::json demo = nlohmann::json::parse(r.out);
  const nlohmann::json& crash = demo["distribution"]["crash"];
  EXPECT_EQ(crash["by"], "crash_point");
  EXPECT_TRUE(crash["killed"].get<bool>());
  EXPECT_EQ(crash["chunks_journaled_at_restart"].get<int64_t>(), 2);
  EXPECT_TRUE(crash["at_most_once"].get<bool>());
}
#else
TEST_F(CliTest, DemoRefusesCrashPointsInRelease) {
  RunResult r =
      Run({"demo", "--synthetic", "--size-mib", "1", "--steps", "2",
           "--scale-mib", "0", "--crash-at", "receiver.after-chunk:2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("chunks:N"), std::string::npos) << r.err;
}
#endif

}  // namespace
}  // namespace refit
