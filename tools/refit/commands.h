// The subcommands of `refit`. main.cc parses the command line (CLI11) into
// these argument structs and calls one Run* function, which prints its
// result (human text, or JSON with `json`) and returns the process exit
// code (cli_util.h, ExitCode).
#ifndef REFIT_TOOLS_REFIT_COMMANDS_H_
#define REFIT_TOOLS_REFIT_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace refit::cli {

struct DiffArgs {
  std::string base;
  std::string target;
  std::string out;
  uint64_t version = 1;
  uint64_t base_version = 0;
  double chunk_mib = 8;
  int threads = 0;
  bool overwrite_only = false;
  bool conditional = false;
  bool json = false;
};
int RunDiff(const DiffArgs& args);

struct ApplyArgs {
  std::string delta;
  std::string checkpoint;
  int threads = 0;
  bool no_sync = false;
  bool rollback = false;
  bool json = false;
};
int RunApply(const ApplyArgs& args);

struct VerifyArgs {
  std::string checkpoint;
  std::string delta;
  int threads = 0;
  bool json = false;
};
int RunVerify(const VerifyArgs& args);

struct InspectArgs {
  std::string delta;
  bool tensors = false;
  int top = 8;
  bool json = false;
};
int RunInspect(const InspectArgs& args);

struct DemoArgs {
  std::string fixtures;  // empty: look in the usual places
  bool synthetic = false;
  double size_mib = 64;  // synthetic model size
  int steps = 3;         // synthetic steps
  double rate = 0.02;    // synthetic change rate per step
  uint64_t seed = 1;
  int threads = 0;
  bool no_sync = false;
  bool json = false;
};
int RunDemo(const DemoArgs& args);

// Prices coding the changes of BASE -> TARGET conditioned on the base.
int RunCodecStudy(const std::string& base_path, const std::string& target_path);

struct BenchArgs {
  double size_mib = 256;
  std::vector<std::string> rates;  // "1%", "0.01"; empty: the defaults
  int threads = 0;
  uint64_t seed = 1;
  bool no_sync = false;
  bool json = false;
  std::string fixtures;      // non-empty: payload sizes on the fixture pairs
  std::string command_line;  // recorded with the results
};
int RunBench(const BenchArgs& args);

// `refit bench sync` (sync_bench.cc): registers the subcommand and its
// options under `bench_cmd`; main() calls the returned function (with the
// global --json and the command line to record) when it was given.
std::function<int(bool json, const std::string& command_line)>
RegisterBenchSync(CLI::App* bench_cmd);

// `refit bench peers` (peers_bench.cc): the same, for refit next to the
// delta schemes in use elsewhere.
std::function<int(bool json, const std::string& command_line)>
RegisterBenchPeers(CLI::App* bench_cmd);

}  // namespace refit::cli

#endif  // REFIT_TOOLS_REFIT_COMMANDS_H_
