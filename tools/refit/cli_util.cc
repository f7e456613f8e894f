#include "cli_util.h"

#include "base/parallel.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

namespace refit::cli {

int ExitCodeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnimplemented:
    case StatusCode::kAlreadyExists:
      return kExitInvalidArgument;
    case StatusCode::kNotFound:
      return kExitNotFound;
    case StatusCode::kDataLoss:
      return kExitDataLoss;
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAborted:
      return kExitFailedPrecondition;
    case StatusCode::kUnavailable:
    case StatusCode::kPermissionDenied:
    case StatusCode::kResourceExhausted:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kCancelled:
    case StatusCode::kUnauthenticated:
      return kExitIo;
    case StatusCode::kUnknown:
    case StatusCode::kInternal:
      return kExitInternal;
  }
  return kExitInternal;
}

std::string ExitCodesHelp() {
  return "Exit codes:\n"
         "  0   success\n"
         "  1   usage error (bad command line)\n"
         "  2   invalid argument (mismatched tensors, bad option value, "
         "unsupported dtype)\n"
         "  3   not found (a file or directory does not exist)\n"
         "  4   corrupt data (the delta or a checkpoint is damaged or "
         "truncated)\n"
         "  5   wrong base / precondition (the checkpoint is not the delta's "
         "base; nothing was written)\n"
         "  6   I/O error or unavailable (disk full, permissions; retry)\n"
         "  7   verify mismatch (the checkpoint is not the delta's target)\n"
         "  10  internal error (a bug in refit)\n"
         "  130, 143  apply stopped by SIGINT or SIGTERM at a chunk boundary "
         "(run it again to finish)\n"
         "Every subcommand takes --json for machine-readable output on "
         "stdout;\nprogress bars go to stderr, only when it is a terminal.";
}

std::string StoresHelp() {
  return "Stores (--store of publish, receive, status, demo):\n"
         "  DIR, file:///DIR               a directory (local or a shared "
         "file system)\n"
         "  s3://BUCKET/PREFIX             S3-compatible storage, at AWS by "
         "default\n"
         "  s3://BUCKET/PREFIX?endpoint=URL&region=NAME\n"
         "                                 another endpoint (MinIO, moto, "
         "...) or region; values %-encoded\n"
         "S3 settings come from the environment:\n"
         "  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY  credentials "
         "(required)\n"
         "  AWS_SESSION_TOKEN                         temporary credentials\n"
         "  AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL     endpoint, unless the URL "
         "has endpoint=\n"
         "  AWS_REGION, AWS_DEFAULT_REGION            region, unless the URL "
         "has region= (default us-east-1)";
}

void PrintJson(const Json& json) {
  std::string text =
      json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

namespace {

bool Contains(std::string_view text, std::string_view word) {
  return text.find(word) != std::string_view::npos;
}

// The advice after a failure, by its code and, where one code has several
// usual causes, by what the message names: the advice must fit the cause
// (no disk-space advice for a refused connection).
std::string Hint(std::string_view command, const Status& status) {
  const std::string_view message = status.message();
  const bool file_command = command == "diff" || command == "apply" ||
                            command == "verify" || command == "inspect";
  switch (status.code()) {
    case StatusCode::kOk:
    case StatusCode::kCancelled:
      return "";
    case StatusCode::kNotFound:
      // A missing bucket's message says what to do already.
      if (Contains(message, "NoSuchBucket")) return "";
      if (Contains(message, "s3://")) {
        return "check the bucket and prefix of the s3:// URL";
      }
      return "check the path";
    case StatusCode::kDataLoss:
      if (command == "diff") return "a checkpoint file is damaged; re-save it";
      if (!file_command) return "";
      return "the file is corrupt or truncated; fetch the delta again or "
             "re-create it with `refit diff`";
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAborted:
      // A store's own refusals (a link inside it, an object that already
      // holds other bytes) say what to fix in the message.
      if (!file_command) return "";
      return "fix the checkpoint's state first (see `refit verify`)";
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnimplemented:
    case StatusCode::kAlreadyExists:
      return fmt::format("see `refit {} --help`", command);
    case StatusCode::kUnavailable:
      if (Contains(message, "curl error") || Contains(message, "connect") ||
          Contains(message, "resolve")) {
        return "check that the store's endpoint is up and reachable from "
               "here (the s3 URL's endpoint= or AWS_ENDPOINT_URL), then retry";
      }
      return "this may be transient (network, store or file system); retry";
    case StatusCode::kDeadlineExceeded:
      return "the store or a peer did not answer in time; check that it is "
             "up, then retry";
    case StatusCode::kUnauthenticated:
      return "every node of a store uses the same --key-file (or none), and "
             "receivers of a signed store the publisher's --verify-key";
    case StatusCode::kPermissionDenied:
      if (Contains(message, "s3://") || Contains(message, "HTTP")) {
        return "check the store's credentials (AWS_ACCESS_KEY_ID, "
               "AWS_SECRET_ACCESS_KEY) and the bucket's policy";
      }
      return "check the permissions of the path";
    case StatusCode::kResourceExhausted:
      return "free disk space or memory (or use fewer threads), then retry";
    case StatusCode::kUnknown:
    case StatusCode::kInternal:
      return "this is a bug in refit; please report it with the command line";
  }
  return "";
}

}  // namespace

int FailWith(std::string_view command, int exit_code,
             std::string_view code_name, std::string_view message, bool json) {
  if (json) {
    Json j;
    j["ok"] = false;
    j["command"] = std::string(command);
    j["error"] = {{"code", std::string(code_name)},
                  {"exit_code", exit_code},
                  {"message", std::string(message)}};
    PrintJson(j);
  }
  fmt::print(stderr, "refit: {}: {}\n", command, message);
  return exit_code;
}

int Fail(std::string_view command, const Status& status, bool json,
         std::string_view hint) {
  std::string message(status.message());
  std::string advice =
      hint.empty() ? Hint(command, status) : std::string(hint);
  if (!advice.empty()) message += "; " + advice;
  return FailWith(command, ExitCodeFor(status.code()),
                  StatusCodeName(status.code()), message, json);
}

namespace {

// A delta's first bytes (docs/format.md, "Delta file"): the CLI sniffs
// them without the library's internal headers.
constexpr char kDeltaMagic[8] = {'R', 'E', 'F', 'I', 'T', 'D', 'L', 'T'};

enum class FileKind { kOther, kDelta, kCheckpoint };

// What `path` plainly is: a refit delta (its magic), a safetensors
// checkpoint (a plausible little-endian header length followed by '{'), a
// directory holding .safetensors files, or anything else (kOther, also when
// unreadable: the real open reports that).
FileKind Sniff(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    for (const auto& entry :
         std::filesystem::directory_iterator(path, ec)) {
      if (entry.path().extension() == ".safetensors") {
        return FileKind::kCheckpoint;
      }
    }
    return FileKind::kOther;
  }
  std::ifstream in(path, std::ios::binary);
  unsigned char head[9] = {};
  if (!in.read(reinterpret_cast<char*>(head), sizeof head)) {
    return FileKind::kOther;
  }
  if (std::memcmp(head, kDeltaMagic, sizeof kDeltaMagic) == 0) {
    return FileKind::kDelta;
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | head[i];
  // Safetensors caps its header at 100 MB.
  if (head[8] == '{' && header_len >= 2 && header_len <= 100'000'000) {
    return FileKind::kCheckpoint;
  }
  return FileKind::kOther;
}

}  // namespace

Status CheckIsDelta(const std::string& path) {
  if (Sniff(path) != FileKind::kCheckpoint) return Status::Ok();
  return InvalidArgumentError(fmt::format(
      "{} is a safetensors checkpoint, not a refit delta", path));
}

Status CheckIsCheckpoint(const std::string& path) {
  if (Sniff(path) != FileKind::kDelta) return Status::Ok();
  return InvalidArgumentError(
      fmt::format("{} is a refit delta, not a checkpoint", path));
}

Status CheckExists(const std::string& path, std::string_view what) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return NotFoundError(fmt::format("{} '{}' does not exist", what, path));
  }
  return Status::Ok();
}

ProgressBar::ProgressBar() : enabled_(isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() { Clear(); }

ProgressFn ProgressBar::Callback() {
  if (!enabled_) return nullptr;
  return [this](std::string_view stage, uint64_t done, uint64_t total) {
    Draw(stage, done, total);
  };
}

void ProgressBar::Note(std::string_view text) {
  if (!enabled_) return;
  fmt::print(stderr, "\r\033[K{}", text);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::Draw(std::string_view stage, uint64_t done, uint64_t total) {
  auto now = std::chrono::steady_clock::now();
  bool finished = total > 0 && done >= total;
  if (drawn_ && stage == last_stage_ && !finished &&
      now - last_draw_ < std::chrono::milliseconds(100)) {
    return;
  }
  last_draw_ = now;
  last_stage_ = std::string(stage);
  double fraction = total == 0 ? 1.0
                               : std::min(1.0, static_cast<double>(done) /
                                                   static_cast<double>(total));
  constexpr int kWidth = 30;
  int filled = static_cast<int>(fraction * kWidth);
  fmt::print(stderr, "\r\033[K{:>7} [{}{}] {:5.1f}% {} / {}", stage,
             std::string(static_cast<size_t>(filled), '#'),
             std::string(static_cast<size_t>(kWidth - filled), ' '),
             fraction * 100.0, HumanBytes(static_cast<double>(done)),
             HumanBytes(static_cast<double>(total)));
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::Clear() {
  if (enabled_ && drawn_) {
    fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
}

std::string HumanBytes(double bytes) {
  if (bytes < 1000) return fmt::format("{:.0f} B", bytes);
  if (bytes < 1e6) return fmt::format("{:.1f} KB", bytes / 1e3);
  if (bytes < 1e9) return fmt::format("{:.2f} MB", bytes / 1e6);
  return fmt::format("{:.2f} GB", bytes / 1e9);
}

std::string HumanSeconds(double seconds) {
  if (seconds < 1e-3) return fmt::format("{:.0f} us", seconds * 1e6);
  if (seconds < 1.0) return fmt::format("{:.1f} ms", seconds * 1e3);
  return fmt::format("{:.2f} s", seconds);
}

std::string WithCommas(uint64_t value) {
  std::string digits = std::to_string(value);
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[static_cast<size_t>(i)];
  }
  return out;
}

std::string Percent(double fraction, int decimals) {
  return fmt::format("{:.{}f}%", fraction * 100.0, decimals);
}

std::string Ratio(double num, double den, int decimals) {
  if (den <= 0) return "-";
  return fmt::format("{:.{}f}x", num / den, decimals);
}

std::string OverBound(double bytes, double bound) {
  if (bound <= 0) return "-";
  return fmt::format("x{:.3f}", bytes / bound);
}

std::string KindsString(const std::map<std::string, uint64_t>& kinds) {
  std::string out;
  for (const auto& [kind, count] : kinds) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{}:{}", kind, count);
  }
  return out.empty() ? "-" : out;
}

int EffectiveThreads(int threads) {
  return threads > 0 ? threads : DefaultThreads();
}

Result<double> ParseRate(const std::string& text, std::string_view flag) {
  std::string s = text;
  bool percent = !s.empty() && s.back() == '%';
  if (percent) s.pop_back();
  double value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size()) {
    return InvalidArgumentError(
        fmt::format("{} '{}' is not a number; write 1% or 0.01", flag, text));
  }
  if (percent) value /= 100.0;
  if (!(value > 0) || value > 1) {
    return InvalidArgumentError(
        fmt::format("{} '{}' must be in (0, 100%]", flag, text));
  }
  return value;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    size_t start = line.find_first_not_of(' ', colon + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "unknown CPU";
}

}  // namespace refit::cli
