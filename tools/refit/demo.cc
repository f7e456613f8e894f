// `refit demo`: walks a trajectory of checkpoints (the qwen2-tiny fixtures,
// or a synthetic one) the way an inference engine would follow an RL
// trainer: a scratch copy of step 0 is patched in place by the delta of
// every step, and after each step every tensor of the scratch copy must
// hash (SHA-256, independently of refit's own XXH3 hashes) to the same
// digest as the trainer's checkpoint for that step.
#include <fmt/format.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "cli_util.h"
#include "commands.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "scratch_dir.h"
#include "synth.h"

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

Result<std::map<std::string, Digest>> Sha256Tensors(const std::string& path) {
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt,
                         Checkpoint::Open(path, Checkpoint::Mode::kReadOnly));
  std::map<std::string, Digest> digests;
  for (size_t i = 0; i < ckpt.tensors().size(); ++i) {
    std::span<const uint8_t> data = ckpt.Data(i);
    Digest digest{};
    unsigned int length = 0;
    if (EVP_Digest(data.data(), data.size(), digest.data(), &length,
                   EVP_sha256(), nullptr) != 1 ||
        length != digest.size()) {
      return InternalError("OpenSSL EVP_Digest(SHA-256) failed");
    }
    digests[ckpt.tensors()[i].name] = digest;
  }
  return digests;
}

struct Trajectory {
  std::string source;       // "fixtures" or "synthetic"
  std::string description;  // for the header line
  std::vector<std::string> steps;
};

struct StepResult {
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

Result<StepResult> RunStep(const Trajectory& t, int from,
                           const std::string& scratch, const ScratchDir& dir,
                           const DemoArgs& args, ProgressBar* bar) {
  StepResult s;
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

}  // namespace

int RunDemo(const DemoArgs& args) {
  constexpr std::string_view kCmd = "demo";
  ProgressBar bar;
  Result<ScratchDir> dir = ScratchDir::Create("refit-demo");
  if (!dir.ok()) return Fail(kCmd, dir.status(), args.json);

  Trajectory trajectory;
  std::string fixtures;
  if (!args.synthetic) {
    if (!args.fixtures.empty()) {
      fixtures = QwenDirIn(args.fixtures);
      if (fixtures.empty()) {
        return Fail(kCmd,
                    NotFoundError(fmt::format(
                        "no qwen2-tiny/step0.safetensors or step0.safetensors "
                        "under --fixtures '{}'",
                        args.fixtures)),
                    args.json);
      }
    } else {
      fixtures = FindFixtures();
    }
  }
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
    if (!args.synthetic && !args.json) {
      fmt::print(
          "fixtures not found (looked in $REFIT_FIXTURES_DIR and "
          "../shared/fixtures); using a synthetic trajectory\n");
    }
    Result<Trajectory> t = SyntheticTrajectory(args, *dir, &bar);
    if (!t.ok()) return Fail(kCmd, t.status(), args.json);
    trajectory = std::move(*t);
  }
  if (trajectory.steps.size() < 2) {
    return Fail(kCmd,
                NotFoundError("the trajectory needs step0 and step1 at least"),
                args.json);
  }

  // The "inference engine": a scratch copy of step 0, patched in place.
  std::string scratch = dir->File("engine.safetensors");
  if (Status s = CopyCheckpoint(trajectory.steps[0], scratch); !s.ok()) {
    return Fail(kCmd, s, args.json);
  }

  if (!args.json) {
    fmt::print("refit demo: {}\n", trajectory.description);
    fmt::print(
        "a copy of step0 (the engine) is patched in place by each "
        "step's delta ({}), then compared by SHA-256 per tensor\n\n",
        args.no_sync ? "not synced" : "msync + fsync included");
    fmt::print("{:<6} {:>8} {:>10} {:>10} {:>8}  {:>26} {:>9} {:>9}  {}\n",
               "step", "changed", "full", "delta", "ratio",
               "payload / entropy bound", "encode", "apply", "bit-exact");
  }
  std::vector<StepResult> results;
  bool all_ok = true;
  for (size_t from = 0; from + 1 < trajectory.steps.size(); ++from) {
    Result<StepResult> r =
        RunStep(trajectory, static_cast<int>(from), scratch, *dir, args, &bar);
    if (!r.ok()) {
      return Fail(
          kCmd,
          r.status().WithContext(fmt::format("step {} -> {}", from, from + 1)),
          args.json);
    }
    const StepResult& s = *r;
    bool ok = s.bit_exact && s.verified;
    all_ok = all_ok && ok;
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

  if (args.json) {
    Json j;
    j["ok"] = all_ok;
    j["command"] = "demo";
    j["source"] = trajectory.source;
    j["description"] = trajectory.description;
    Json steps = Json::array();
    for (const StepResult& s : results) {
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
    j["steps"] = steps;
    PrintJson(j);
  } else {
    fmt::print("\n{}\n", all_ok ? "all steps bit-exact and verified"
                                : "FAILED: the patched copy differs from the "
                                  "trainer's checkpoint");
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
