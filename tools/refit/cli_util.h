// Shared plumbing of the refit command-line tool: exit codes, error
// reporting, progress bars, number formatting and timing.
//
// Every subcommand reports failure through Fail(), which maps a Status to
// the tool's exit code in one place (ExitCodeFor) and prints one line that
// says what went wrong and what to do. Progress bars go to stderr only, and
// only when stderr is a terminal, so stdout stays clean for --json. Nothing
// here is thread-safe; the library calls ProgressFn from the calling thread.
#ifndef REFIT_TOOLS_REFIT_CLI_UTIL_H_
#define REFIT_TOOLS_REFIT_CLI_UTIL_H_

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "refit/delta.h"
#include "refit/status.h"

namespace refit::cli {

// The tool's exit codes, one per error family; `refit --help` lists them.
enum ExitCode : int {
  kExitOk = 0,
  kExitUsage = 1,               // bad command line (CLI11 parse errors)
  kExitInvalidArgument = 2,     // well-formed but unacceptable arguments
  kExitNotFound = 3,            // a path does not exist
  kExitDataLoss = 4,            // corrupt or truncated delta or checkpoint
  kExitFailedPrecondition = 5,  // wrong base, partly applied checkpoint
  kExitIo = 6,                  // I/O error, permission, disk full; retry
  kExitMismatch = 7,            // verify: not the delta's target
  kExitInternal = 10,           // a bug in refit
};

// The one mapping from library status codes to exit codes.
int ExitCodeFor(StatusCode code);

// The footer of `refit --help`.
std::string ExitCodesHelp();

// The store URL forms and the S3 settings read from the environment
// (transport/object_store.h, StoreOptions), for `refit --help`.
std::string StoresHelp();
// The help of a --store option: the same, in one paragraph.
inline constexpr char kStoreOptionHelp[] =
    "store URL: a directory, file:///dir, or "
    "s3://bucket/prefix[?endpoint=URL&region=NAME]; S3 credentials come from "
    "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
    "AWS_SESSION_TOKEN), and the endpoint and region, unless the URL names "
    "them, too (AWS_ENDPOINT_URL, AWS_REGION)";

using Json = nlohmann::ordered_json;

// Prints `json` to stdout (indented, invalid UTF-8 replaced).
void PrintJson(const Json& json);

// Reports a failed `command` ("apply", ...): on stderr
//   refit: <command>: <message>; <hint>
// where the hint says what to do: `hint` when given, else a default for the
// error family; with `json`, also {"ok": false, "error": {...}} on stdout.
// Returns the exit code.
int Fail(std::string_view command, const Status& status, bool json,
         std::string_view hint = {});

// Reports a CLI-level failure with an explicit exit code (e.g. a verify
// mismatch); same output shape as Fail.
int FailWith(std::string_view command, int exit_code,
             std::string_view code_name, std::string_view message, bool json);

// kNotFound naming `what` when `path` does not exist; otherwise OK.
Status CheckExists(const std::string& path, std::string_view what);

// Swapped arguments: kInvalidArgument ("X is a safetensors checkpoint, not a
// refit delta") when `path`, given where a delta is expected, is plainly a
// checkpoint (file or directory); OK otherwise, also for files that are
// neither (the real open reports those).
Status CheckIsDelta(const std::string& path);
// The reverse: kInvalidArgument when `path`, given where a checkpoint is
// expected, starts with a delta's magic.
Status CheckIsCheckpoint(const std::string& path);

// A progress bar on stderr for the library's ProgressFn callbacks: enabled
// only when stderr is a TTY; redraws at most ~10 times a second; erases
// itself on Clear() and on destruction.
class ProgressBar {
 public:
  ProgressBar();
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool enabled() const { return enabled_; }
  // A callback that draws this bar; empty (no callback) when disabled.
  ProgressFn Callback();
  // Shows a one-off status line (e.g. "generating"), when enabled.
  void Note(std::string_view text);
  void Clear();

 private:
  void Draw(std::string_view stage, uint64_t done, uint64_t total);

  bool enabled_ = false;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
  std::string last_stage_;
};

// "6.40 MB", "112.3 KB", "950 B" (decimal units, as file sizes are quoted).
std::string HumanBytes(double bytes);
// "12.3 ms", "1.24 s".
std::string HumanSeconds(double seconds);
// "3,198,144".
std::string WithCommas(uint64_t value);
// "2.82%" of a fraction.
std::string Percent(double fraction, int decimals = 2);
// "57.0x"; "-" when the denominator is 0.
std::string Ratio(double num, double den, int decimals = 1);
// How far `bytes` is above `bound`: "x1.013"; "-" when the bound is 0.
std::string OverBound(double bytes, double bound);
// "sparse_xor:3 dense_xor:1".
std::string KindsString(const std::map<std::string, uint64_t>& kinds);

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// The number of threads `threads` (0 = all cores) stands for.
int EffectiveThreads(int threads);

// A change rate: "1%" -> 0.01, "0.01" -> 0.01. kInvalidArgument naming
// `flag` unless it is in (0, 1].
Result<double> ParseRate(const std::string& text, std::string_view flag);

// The CPU's model name from /proc/cpuinfo, for benchmark records.
std::string CpuModel();

}  // namespace refit::cli

#endif  // REFIT_TOOLS_REFIT_CLI_UTIL_H_
