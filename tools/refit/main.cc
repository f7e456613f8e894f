// refit: the command-line front end to the delta API (include/refit/*.h).
// Parses the command line with CLI11 and dispatches to commands.h; every
// failure leaves through cli_util.h's ExitCodeFor, so exit codes are the same
// across subcommands (listed in `refit --help`).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "flag_checks.h"
#include "layout_command.h"
#include "sync_commands.h"

namespace refit::cli {
namespace {

void AddThreads(CLI::App* cmd, int* threads) {
  cmd->add_option("-j,--threads", *threads, "worker threads; 0 = all cores")
      ->capture_default_str()
      ->check(IntIn(0, kMaxThreads));
}

void AddJson(CLI::App* cmd, bool* json) {
  cmd->add_flag("--json", *json,
                "print a JSON object on stdout instead of text");
}

// Levenshtein distance, for suggesting the subcommand a typo meant.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// CLI11 answers a mistyped subcommand with "A subcommand is required" or
// complains about its arguments; this names the word instead, with the
// nearest subcommand when one is close. The top level takes only flags, so
// the first word not starting with '-' is the subcommand. Returns the exit
// code when the word is unknown.
std::optional<int> CheckSubcommand(CLI::App* app, int argc, char** argv) {
  std::string_view word;
  for (int i = 1; i < argc && word.empty(); ++i) {
    if (argv[i][0] != '-') word = argv[i];
  }
  if (word.empty()) return std::nullopt;
  std::vector<std::string> names;
  for (const CLI::App* sub : app->get_subcommands({})) {
    if (sub->check_name(std::string(word))) return std::nullopt;
    names.push_back(sub->get_name());
  }
  std::string nearest;
  size_t best = 3;  // at most two edits away
  for (const std::string& name : names) {
    size_t d = EditDistance(word, name);
    if (d < best) {
      best = d;
      nearest = name;
    }
  }
  std::string advice =
      nearest.empty()
          ? fmt::format("subcommands: {}", fmt::join(names, ", "))
          : fmt::format("did you mean '{}'?", nearest);
  fmt::print(stderr, "refit: unknown subcommand '{}'; {} (see `refit --help`)\n",
             word, advice);
  return kExitUsage;
}

int Main(int argc, char** argv) {
  CLI::App app(
      "refit: send only the changed bits of model weights.\n"
      "Diffs two versions of a checkpoint (.safetensors file or Hugging Face "
      "checkpoint directory) into a compact delta, applies it in place, and "
      "checks the result bit for bit.",
      "refit");
  app.footer(ExitCodesHelp() +
             "\nrefit publish exits 8 when the version was aborted.");
  app.require_subcommand(1);
  bool global_json = false;
  app.add_flag("--json", global_json,
               "JSON output for every subcommand (same as the subcommand's "
               "--json)");

  DiffArgs diff;
  CLI::App* diff_cmd = app.add_subcommand(
      "diff", "Write the delta that takes BASE to TARGET into a file.");
  diff_cmd->add_option("BASE", diff.base, "the version the engine has")
      ->required();
  diff_cmd->add_option("TARGET", diff.target, "the new version")->required();
  diff_cmd->add_option("-o,--output", diff.out, "the delta file to write")
      ->required();
  diff_cmd
      ->add_option("--version", diff.version,
                   "version number of TARGET, recorded in the delta")
      ->capture_default_str()
      ->check(Unsigned());
  diff_cmd
      ->add_option("--base-version", diff.base_version,
                   "version number of BASE")
      ->capture_default_str()
      ->check(Unsigned());
  diff_cmd
      ->add_option("--chunk-mib", diff.chunk_mib,
                   "bytes of a tensor per chunk, in MiB (a multiple of "
                   "64 KiB, e.g. 0.25)")
      ->capture_default_str();
  AddThreads(diff_cmd, &diff.threads);
  diff_cmd->add_flag("--overwrite-only", diff.overwrite_only,
                     "only idempotent overwrite chunks (no XOR): larger, but "
                     "decodable without the base's bits");
  diff_cmd->add_flag("--conditional", diff.conditional,
                     "also code BF16 changes given the base's elements "
                     "(conditional XOR chunks) where smaller; CPU apply only, "
                     "and `refit inspect` gives no bound for them");
  AddJson(diff_cmd, &diff.json);
  diff_cmd->footer(
      "Example: refit diff step0.safetensors step1.safetensors -o "
      "step1.rfd --version 1 --base-version 0");

  ApplyArgs apply;
  CLI::App* apply_cmd = app.add_subcommand(
      "apply",
      "Apply DELTA to CHECKPOINT in place (checked against the delta's base "
      "first; nothing is written unless it applies). Interrupted (Ctrl-C, "
      "SIGTERM, or killed at any point), it leaves a journal beside the "
      "checkpoint: run the same command again to finish, or with --rollback "
      "to restore the base.");
  apply_cmd->add_option("DELTA", apply.delta, "a delta from `refit diff`")
      ->required();
  apply_cmd
      ->add_option("CHECKPOINT", apply.checkpoint,
                   "the checkpoint to patch (file or directory)")
      ->required();
  AddThreads(apply_cmd, &apply.threads);
  apply_cmd->add_flag("--no-sync", apply.no_sync,
                      "skip msync/fsync at the end (faster, not durable)");
  apply_cmd->add_flag("--rollback", apply.rollback,
                      "undo an interrupted apply of DELTA: restore the base "
                      "from the journal it left");
  AddJson(apply_cmd, &apply.json);

  VerifyArgs verify;
  CLI::App* verify_cmd = app.add_subcommand(
      "verify",
      "Check that CHECKPOINT is exactly the target of a delta (exit 0), or "
      "say what it is (exit 7).");
  verify_cmd
      ->add_option("CHECKPOINT", verify.checkpoint, "the checkpoint to check")
      ->required();
  verify_cmd
      ->add_option("--delta", verify.delta,
                   "the delta whose target hashes to compare with")
      ->required();
  AddThreads(verify_cmd, &verify.threads);
  AddJson(verify_cmd, &verify.json);

  InspectArgs inspect;
  CLI::App* inspect_cmd = app.add_subcommand(
      "inspect",
      "Decode and check every chunk of DELTA and report sizes, encodings and "
      "the entropy bound.");
  inspect_cmd->add_option("DELTA", inspect.delta, "the delta file")->required();
  inspect_cmd->add_flag("--tensors", inspect.tensors,
                        "list every tensor (default: totals and the largest "
                        "few)");
  inspect_cmd
      ->add_option("--top", inspect.top,
                   "how many tensors to list without --tensors")
      ->capture_default_str()
      ->check(IntIn(0, 1'000'000));
  AddJson(inspect_cmd, &inspect.json);

  std::string study_base, study_target;
  CLI::App* study_cmd = app.add_subcommand(
      "codec-study",
      "Price coding the changes of BASE -> TARGET (BF16 tensors) conditioned "
      "on the base, against today's payload and the order-0 bound.");
  study_cmd->add_option("BASE", study_base, "the base checkpoint")->required();
  study_cmd->add_option("TARGET", study_target, "the target checkpoint")->required();

  DemoArgs demo;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo",
      "Follow a trajectory of checkpoints (the qwen2-tiny fixtures, or a "
      "synthetic one): diff each step, patch a copy of step0 in place, and "
      "check every tensor by SHA-256; then publish every step through a "
      "store to receiver processes (one killed and restarted mid-version), "
      "with timings and SHA-256 checks of every receiver; then publish one "
      "RL step of a synthetic model of realistic size (--scale-mib).");
  demo_cmd->add_option("--fixtures", demo.fixtures,
                       "folder holding qwen2-tiny/ (or step0.safetensors, "
                       "...); default: $REFIT_FIXTURES_DIR, then "
                       "../shared/fixtures");
  demo_cmd->add_flag("--synthetic", demo.synthetic,
                     "use a generated model even when fixtures exist");
  demo_cmd
      ->add_option("--size-mib", demo.size_mib, "synthetic model size in MiB")
      ->capture_default_str();
  demo_cmd->add_option("--steps", demo.steps, "synthetic RL steps")
      ->capture_default_str();
  demo_cmd
      ->add_option("--rate", demo.rate,
                   "fraction of elements changed per synthetic step "
                   "(--synthetic, and the section at scale)")
      ->capture_default_str();
  demo_cmd->add_option("--seed", demo.seed, "synthetic generator seed")
      ->capture_default_str()
      ->check(Unsigned());
  AddThreads(demo_cmd, &demo.threads);
  demo_cmd->add_flag("--no-sync", demo.no_sync,
                     "apply without msync/fsync (time the patching alone)");
  AddJson(demo_cmd, &demo.json);
  SyncCommandArgs sync;
  RegisterSyncDemoOptions(demo_cmd, &demo, &sync.demo);

  BenchArgs bench;
  CLI::App* bench_cmd = app.add_subcommand(
      "bench",
      "End-to-end benchmark on a synthetic checkpoint: diff and apply times, "
      "delta size vs entropy bound, with memcpy, read+hash and zstd "
      "baselines measured in the same run.");
  bench_cmd
      ->add_option("--size-mib", bench.size_mib,
                   "synthetic checkpoint size in MiB")
      ->capture_default_str();
  bench_cmd->add_option("--rate", bench.rates,
                        "fractions of elements changed, e.g. 0.1% 1% 0.03 "
                        "(default: 0.1% 1% 3% 50%)");
  AddThreads(bench_cmd, &bench.threads);
  bench_cmd->add_option("--seed", bench.seed, "generator seed")
      ->capture_default_str()
      ->check(Unsigned());
  bench_cmd->add_flag("--no-sync", bench.no_sync, "apply without msync/fsync");
  bench_cmd->add_option(
      "--fixtures", bench.fixtures,
      "instead: payload sizes on the BF16 step pairs of this "
      "fixture folder (qwen2-tiny), against the entropy bound "
      "and the zstd and overwrite baselines");
  AddJson(bench_cmd, &bench.json);
  auto run_bench_sync = RegisterBenchSync(bench_cmd);
  auto run_bench_peers = RegisterBenchPeers(bench_cmd);
  RegisterSyncCommands(&app, &sync);
  auto run_layout = RegisterLayoutCommand(&app);
  // Set after the subcommands are added: they keep the footer above, and
  // only `refit --help` lists the stores.
  app.footer(ExitCodesHelp() + "\n" + StoresHelp() +
             "\nrefit publish exits 8 when the version was aborted.");

  if (argc <= 1) {
    fmt::print(stderr, "{}", app.help());
    return kExitUsage;
  }
  if (std::optional<int> code = CheckSubcommand(&app, argc, argv)) {
    return *code;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  if (*diff_cmd) {
    diff.json |= global_json;
    return RunDiff(diff);
  }
  if (*apply_cmd) {
    apply.json |= global_json;
    return RunApply(apply);
  }
  if (*verify_cmd) {
    verify.json |= global_json;
    return RunVerify(verify);
  }
  if (*inspect_cmd) {
    inspect.json |= global_json;
    return RunInspect(inspect);
  }
  if (*study_cmd) return RunCodecStudy(study_base, study_target);
  if (*demo_cmd) {
    demo.json |= global_json;
    return RunSyncDemo(demo, sync.demo);
  }
  if (std::optional<int> code = RunSyncCommand(&sync, global_json)) {
    return *code;
  }
  if (std::optional<int> code = run_layout(global_json)) return *code;
  if (*bench_cmd) {
    bench.json |= global_json;
    for (int i = 0; i < argc; ++i) {
      bench.command_line += (i ? " " : "") + std::string(argv[i]);
    }
    if (bench_cmd->got_subcommand("sync")) {
      return run_bench_sync(bench.json, bench.command_line);
    }
    if (bench_cmd->got_subcommand("peers")) {
      return run_bench_peers(bench.json, bench.command_line);
    }
    return RunBench(bench);
  }
  return kExitUsage;
}

}  // namespace
}  // namespace refit::cli

int main(int argc, char** argv) {
  try {
    return refit::cli::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    fmt::print(stderr,
               "refit: out of memory; free some memory or use fewer "
               "threads, then retry\n");
    return refit::cli::kExitIo;
  } catch (const std::exception& e) {
    fmt::print(stderr,
               "refit: internal error: {}; this is a bug in refit, "
               "please report it\n",
               e.what());
    return refit::cli::kExitInternal;
  }
}
