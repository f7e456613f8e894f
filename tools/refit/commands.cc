// diff, apply, verify and inspect: thin wrappers over include/refit/delta.h.
#include "commands.h"

#include <fmt/format.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cmath>
#include <cstdio>

#include "cli_util.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"

namespace refit::cli {
namespace {

Json KindsJson(const std::map<std::string, uint64_t>& kinds) {
  Json j = Json::object();
  for (const auto& [kind, count] : kinds) j[kind] = count;
  return j;
}

// Named in the hint when a checkpoint and a delta were swapped.
constexpr std::string_view kDiffUsage = "usage: refit diff BASE TARGET -o DELTA";
constexpr std::string_view kApplyUsage =
    "usage: refit apply DELTA CHECKPOINT";
constexpr std::string_view kVerifyUsage =
    "usage: refit verify CHECKPOINT --delta DELTA";

double Fraction(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0
                    : static_cast<double>(part) / static_cast<double>(whole);
}

// The pages of the checkpoint's files that hold tensor data: the pages an
// apply can store into, counted as the apply counts them (pages of each
// file's mapping). Tensor data seldom starts on a page boundary, so N bytes
// of it usually span more than ceil(N / page_size) pages.
Result<uint64_t> TensorPages(const std::string& path, uint64_t page_size) {
  if (page_size == 0) return InvalidArgumentError("page size 0");
  REFIT_ASSIGN_OR_RETURN(Checkpoint checkpoint,
                         Checkpoint::Open(path, Checkpoint::Mode::kReadOnly));
  struct Span {
    size_t file;
    uint64_t first, last;  // pages, inclusive
  };
  std::vector<Span> spans;
  for (const TensorInfo& t : checkpoint.tensors()) {
    if (t.byte_size == 0) continue;
    spans.push_back({t.file_index, t.offset / page_size,
                     (t.offset + t.byte_size - 1) / page_size});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.file != b.file ? a.file < b.file : a.first < b.first;
  });
  // Neighbouring tensors share the page where one ends and the next starts.
  uint64_t pages = 0;
  for (size_t i = 0; i < spans.size();) {
    Span merged = spans[i++];
    while (i < spans.size() && spans[i].file == merged.file &&
           spans[i].first <= merged.last + 1) {
      merged.last = std::max(merged.last, spans[i++].last);
    }
    pages += merged.last - merged.first + 1;
  }
  return pages;
}

}  // namespace

int RunDiff(const DiffArgs& args) {
  constexpr std::string_view kCmd = "diff";
  if (Status s = CheckExists(args.base, "base checkpoint"); !s.ok()) {
    return Fail(kCmd, s, args.json);
  }
  if (Status s = CheckExists(args.target, "target checkpoint"); !s.ok()) {
    return Fail(kCmd, s, args.json);
  }
  for (const std::string& path : {args.base, args.target}) {
    if (Status s = CheckIsCheckpoint(path); !s.ok()) {
      return Fail(kCmd, s, args.json, kDiffUsage);
    }
  }
  if (!(args.chunk_mib > 0) || args.chunk_mib > 1024 * 1024) {
    return Fail(kCmd,
                InvalidArgumentError(fmt::format(
                    "--chunk-mib {} is out of range", args.chunk_mib)),
                args.json);
  }
  DiffOptions options;
  options.version = args.version;
  options.base_version = args.base_version;
  options.chunk_bytes =
      static_cast<uint64_t>(std::llround(args.chunk_mib * (1 << 20)));
  options.threads = args.threads;
  options.allow_xor = !args.overwrite_only;
  options.allow_conditional = args.conditional && !args.overwrite_only;
  ProgressBar bar;
  options.progress = bar.Callback();
  Result<DiffReport> report = Diff(args.base, args.target, args.out, options);
  bar.Clear();
  if (!report.ok()) return Fail(kCmd, report.status(), args.json);
  const DiffReport& r = *report;

  if (args.json) {
    Json j;
    j["ok"] = true;
    j["command"] = "diff";
    j["base"] = args.base;
    j["target"] = args.target;
    j["delta"] = args.out;
    j["version"] = args.version;
    j["base_version"] = args.base_version;
    j["tensors"] = r.tensors;
    j["changed_tensors"] = r.changed_tensors;
    j["total_elements"] = r.total_elements;
    j["changed_elements"] = r.changed_elements;
    j["change_rate"] = Fraction(r.changed_elements, r.total_elements);
    j["full_bytes"] = r.full_bytes;
    j["chunks"] = r.chunks;
    j["payload_bytes"] = r.payload_bytes;
    j["chunk_bytes"] = r.chunk_bytes;
    j["file_bytes"] = r.file_bytes;
    j["compression_ratio"] =
        r.file_bytes == 0 ? 0.0 : Fraction(r.full_bytes, r.file_bytes);
    j["chunks_by_kind"] = KindsJson(r.chunks_by_kind);
    j["seconds"] = r.seconds;
    PrintJson(j);
    return kExitOk;
  }
  fmt::print("{} -> {}: wrote {} (version {}, base {})\n", args.base,
             args.target, args.out, args.version, args.base_version);
  fmt::print("  tensors   {} ({} changed)\n", WithCommas(r.tensors),
             WithCommas(r.changed_tensors));
  fmt::print("  elements  {} changed of {} ({})\n",
             WithCommas(r.changed_elements), WithCommas(r.total_elements),
             Percent(Fraction(r.changed_elements, r.total_elements)));
  fmt::print("  delta     {} file ({} chunks, {} payload) vs {} full: {}\n",
             HumanBytes(static_cast<double>(r.file_bytes)),
             WithCommas(r.chunks),
             HumanBytes(static_cast<double>(r.payload_bytes)),
             HumanBytes(static_cast<double>(r.full_bytes)),
             Ratio(static_cast<double>(r.full_bytes),
                   static_cast<double>(r.file_bytes)));
  fmt::print("  kinds     {}\n", KindsString(r.chunks_by_kind));
  fmt::print(
      "  time      {} ({}/s)\n", HumanSeconds(r.seconds),
      HumanBytes(r.seconds > 0 ? static_cast<double>(r.full_bytes) / r.seconds
                               : 0.0));
  return kExitOk;
}

namespace {

// SIGINT/SIGTERM during an apply ask it to stop at the next chunk
// boundary; SA_RESETHAND lets a second signal end the process at once,
// which the apply's journal makes safe too.
std::atomic<bool> g_cancel_apply{false};
volatile std::sig_atomic_t g_cancel_signal = 0;

extern "C" void OnCancelApply(int sig) {
  g_cancel_signal = sig;
  g_cancel_apply.store(true);
}

void CancelApplyOnSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnCancelApply;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int RunRollback(const ApplyArgs& args, const ApplyOptions& options) {
  constexpr std::string_view kCmd = "apply";
  Result<ApplyReport> report = Rollback(args.delta, args.checkpoint, options);
  if (!report.ok()) {
    return Fail(kCmd,
                report.status().WithContext(fmt::format(
                    "rolling back {} on {}", args.delta, args.checkpoint)),
                args.json);
  }
  if (args.json) {
    Json j;
    j["ok"] = true;
    j["command"] = "apply";
    j["rollback"] = true;
    j["delta"] = args.delta;
    j["checkpoint"] = args.checkpoint;
    j["chunks_restored"] = report->chunks_restored;
    j["seconds"] = report->seconds;
    PrintJson(j);
    return kExitOk;
  }
  fmt::print("rolled back {}: {} is the delta's base ({} chunk(s) restored)\n",
             args.delta, args.checkpoint, WithCommas(report->chunks_restored));
  return kExitOk;
}

}  // namespace

int RunApply(const ApplyArgs& args) {
  constexpr std::string_view kCmd = "apply";
  if (Status s = CheckExists(args.delta, "delta"); !s.ok()) {
    return Fail(kCmd, s, args.json);
  }
  if (Status s = CheckExists(args.checkpoint, "checkpoint"); !s.ok()) {
    return Fail(kCmd, s, args.json);
  }
  if (Status s = CheckIsDelta(args.delta); !s.ok()) {
    return Fail(kCmd, s, args.json, kApplyUsage);
  }
  if (Status s = CheckIsCheckpoint(args.checkpoint); !s.ok()) {
    return Fail(kCmd, s, args.json, kApplyUsage);
  }
  ApplyOptions options;
  options.threads = args.threads;
  options.sync = !args.no_sync;
  if (args.rollback) return RunRollback(args, options);
  ProgressBar bar;
  options.progress = bar.Callback();
  options.cancel = &g_cancel_apply;
  CancelApplyOnSignals();
  Result<ApplyReport> report = Apply(args.delta, args.checkpoint, options);
  bar.Clear();
  if (!report.ok() && report.status().code() == StatusCode::kCancelled) {
    const int sig = g_cancel_signal != 0 ? int{g_cancel_signal} : SIGINT;
    return FailWith(
        kCmd, 128 + sig, StatusCodeName(StatusCode::kCancelled),
        fmt::format("stopped by {} at a chunk boundary: {}; run `refit apply "
                    "{} {}` again to finish, or `refit apply --rollback {} {}` "
                    "to restore the base",
                    sig == SIGTERM ? "SIGTERM" : "SIGINT",
                    report.status().message(), args.delta, args.checkpoint,
                    args.delta, args.checkpoint),
        args.json);
  }
  if (!report.ok()) {
    const Status& error = report.error();
    if (error.code() == StatusCode::kFailedPrecondition) {
      std::string hint;
      if (error.message().find("nothing was written") == std::string::npos) {
        hint = "nothing was written; ";
      }
      hint += fmt::format(
          "run `refit verify {} --delta {}` to see what the checkpoint is, "
          "or use the delta made from this checkpoint's version",
          args.checkpoint, args.delta);
      return Fail(kCmd,
                  error.WithContext(fmt::format("{} is not for {}", args.delta,
                                                args.checkpoint)),
                  args.json, hint);
    }
    return Fail(kCmd,
                error.WithContext(fmt::format("applying {} to {}", args.delta,
                                              args.checkpoint)),
                args.json);
  }
  const ApplyReport& r = *report;
  // The apply succeeded, so the checkpoint opens; the estimate is a
  // fallback only.
  Result<uint64_t> tensor_pages = TensorPages(args.checkpoint, r.page_size);
  uint64_t checkpoint_pages =
      tensor_pages.ok() ? *tensor_pages
      : r.page_size == 0
          ? 0
          : (r.checkpoint_bytes + r.page_size - 1) / r.page_size;
  if (args.json) {
    Json j;
    j["ok"] = true;
    j["command"] = "apply";
    j["delta"] = args.delta;
    j["checkpoint"] = args.checkpoint;
    j["chunks"] = r.chunks;
    j["chunks_applied"] = r.chunks_applied;
    j["chunks_skipped"] = r.chunks_skipped;
    j["chunks_restored"] = r.chunks_restored;
    j["changed_elements"] = r.changed_elements;
    j["checkpoint_bytes"] = r.checkpoint_bytes;
    j["pages_written"] = r.pages_written;
    j["page_size"] = r.page_size;
    j["checkpoint_pages"] = checkpoint_pages;
    j["synced"] = !args.no_sync;
    j["seconds"] = r.seconds;
    j["headers_written"] = r.headers_written;
    j["headers_unchanged"] = r.headers_unchanged;
    j["headers_not_carried"] = r.headers_not_carried;
    PrintJson(j);
    return kExitOk;
  }
  fmt::print("applied {} to {}\n", args.delta, args.checkpoint);
  fmt::print("  chunks    {} ({} applied, {} already applied)\n",
             WithCommas(r.chunks), WithCommas(r.chunks_applied),
             WithCommas(r.chunks_skipped));
  if (r.chunks_restored > 0) {
    fmt::print("  resumed   {} chunk(s) of an interrupted apply restored "
               "from its journal first\n",
               WithCommas(r.chunks_restored));
  }
  fmt::print("  elements  {} changed\n", WithCommas(r.changed_elements));
  fmt::print("  pages     {} written of {} ({} of {})\n",
             WithCommas(r.pages_written), WithCommas(checkpoint_pages),
             Percent(Fraction(r.pages_written, checkpoint_pages), 1),
             HumanBytes(static_cast<double>(r.checkpoint_bytes)));
  fmt::print("  time      {}{}\n", HumanSeconds(r.seconds),
             args.no_sync ? " (not synced)" : " (synced)");
  if (r.headers_written + r.headers_unchanged > 0) {
    fmt::print("  headers   {} rewritten to the target's, {} already the target's\n",
               WithCommas(r.headers_written), WithCommas(r.headers_unchanged));
  }
  // Not an error: every tensor is the target's; only the file's header
  // (its metadata) is not.
  for (const std::string& note : r.headers_not_carried) {
    fmt::print("  note      header not carried: {}\n", note);
  }
  return kExitOk;
}

int RunVerify(const VerifyArgs& args) {
  constexpr std::string_view kCmd = "verify";
  if (Status s = CheckExists(args.checkpoint, "checkpoint"); !s.ok()) {
    return Fail(kCmd, s, args.json);
  }
  if (Status s = CheckExists(args.delta, "delta"); !s.ok()) {
    return Fail(kCmd, s, args.json);
  }
  if (Status s = CheckIsCheckpoint(args.checkpoint); !s.ok()) {
    return Fail(kCmd, s, args.json, kVerifyUsage);
  }
  if (Status s = CheckIsDelta(args.delta); !s.ok()) {
    return Fail(kCmd, s, args.json, kVerifyUsage);
  }
  Result<VerifyReport> report =
      Verify(args.checkpoint, args.delta, args.threads);
  if (!report.ok()) return Fail(kCmd, report.status(), args.json);
  const VerifyReport& r = *report;
  if (args.json) {
    Json j;
    j["ok"] = r.matches_target;
    j["command"] = "verify";
    j["checkpoint"] = args.checkpoint;
    j["delta"] = args.delta;
    j["matches_target"] = r.matches_target;
    j["matches_base"] = r.matches_base;
    j["tensors"] = r.tensors;
    j["mismatched"] = r.mismatched;
    j["headers_checked"] = r.headers_checked;
    j["header_matches_target"] = r.headers_checked && r.header_differs.empty();
    j["header_differs"] = r.header_differs;
    j["exit_code"] = r.matches_target ? kExitOk : kExitMismatch;
    PrintJson(j);
  }
  if (r.matches_target) {
    if (!args.json) {
      fmt::print("{} is the target of {} ({} tensors match)\n", args.checkpoint,
                 args.delta, WithCommas(r.tensors));
      // A header-only difference: the tensors are the target's, so this is
      // not a mismatch, but the file is not byte-identical to the target.
      for (const std::string& d : r.header_differs) {
        fmt::print("  header differs: {}\n", d);
      }
    }
    return kExitOk;
  }
  std::string which;
  for (size_t i = 0; i < r.mismatched.size() && i < 3; ++i) {
    which += (i ? ", " : "") + r.mismatched[i];
  }
  if (r.mismatched.size() > 3) which += ", ...";
  std::string message = fmt::format(
      "{} is not the target of {}: {} of {} tensors differ{}", args.checkpoint,
      args.delta, WithCommas(r.mismatched.size()), WithCommas(r.tensors),
      which.empty() ? "" : " (" + which + ")");
  if (r.matches_base) {
    message += "; it is the delta's base: run `refit apply " + args.delta +
               " " + args.checkpoint + "`";
  } else {
    message +=
        "; it is not the delta's base either: use the delta made for this "
        "checkpoint's version, or copy a fresh checkpoint";
  }
  // With --json the report above is the machine-readable answer.
  fmt::print(stderr, "refit: verify: {}\n", message);
  return kExitMismatch;
}

int RunInspect(const InspectArgs& args) {
  constexpr std::string_view kCmd = "inspect";
  if (Status s = CheckExists(args.delta, "delta"); !s.ok()) {
    return Fail(kCmd, s, args.json);
  }
  if (Status s = CheckIsDelta(args.delta); !s.ok()) {
    return Fail(kCmd, s, args.json, "usage: refit inspect DELTA");
  }
  Result<InspectReport> report = Inspect(args.delta);
  if (!report.ok()) return Fail(kCmd, report.status(), args.json);
  const InspectReport& r = *report;

  // Largest contributors first, unless every tensor is asked for (then in
  // canonical order, as the delta stores them).
  std::vector<const TensorInspect*> rows;
  for (const TensorInspect& t : r.tensors) rows.push_back(&t);
  if (!args.tensors) {
    std::stable_sort(rows.begin(), rows.end(),
                     [](const TensorInspect* a, const TensorInspect* b) {
                       return a->chunk_bytes > b->chunk_bytes;
                     });
    size_t top = static_cast<size_t>(std::max(0, args.top));
    if (rows.size() > top) rows.resize(top);
  }

  if (args.json) {
    Json j;
    j["ok"] = true;
    j["command"] = "inspect";
    j["delta"] = args.delta;
    j["format_version"] = r.format_version;
    j["version"] = r.version;
    j["base_version"] = r.base_version;
    j["tensor_count"] = r.tensors.size();
    j["total_elements"] = r.total_elements;
    j["changed_elements"] = r.changed_elements;
    j["change_rate"] = Fraction(r.changed_elements, r.total_elements);
    j["chunks"] = r.chunks;
    j["kinds"] = KindsJson(r.kinds);
    j["payload_bytes"] = r.payload_bytes;
    j["bound_bytes"] = r.bound_bytes;
    j["bound_valid"] = r.bound_valid;
    j["payload_vs_bound"] =
        r.bound_bytes > 0 ? static_cast<double>(r.payload_bytes) / r.bound_bytes
                          : 0.0;
    j["chunk_bytes"] = r.chunk_bytes;
    j["file_bytes"] = r.file_bytes;
    j["full_bytes"] = r.full_bytes;
    j["compression_ratio"] =
        r.file_bytes == 0 ? 0.0 : Fraction(r.full_bytes, r.file_bytes);
    Json tensors = Json::array();
    for (const TensorInspect* t : rows) {
      tensors.push_back({{"name", t->name},
                         {"dtype", t->dtype},
                         {"elements", t->elements},
                         {"changed", t->changed},
                         {"change_rate", Fraction(t->changed, t->elements)},
                         {"chunks", t->chunks},
                         {"kinds", KindsJson(t->kinds)},
                         {"payload_bytes", t->payload_bytes},
                         {"chunk_bytes", t->chunk_bytes},
                         {"bound_bytes", t->bound_bytes}});
    }
    j[args.tensors ? "tensors" : "top_tensors"] = tensors;
    PrintJson(j);
    return kExitOk;
  }

  fmt::print("{}: format {}, version {} (base {}), {} tensors\n", args.delta,
             r.format_version, r.version, r.base_version,
             WithCommas(r.tensors.size()));
  fmt::print("  changed   {} of {} elements ({})\n",
             WithCommas(r.changed_elements), WithCommas(r.total_elements),
             Percent(Fraction(r.changed_elements, r.total_elements)));
  fmt::print("  chunks    {} ({})\n", WithCommas(r.chunks),
             KindsString(r.kinds));
  fmt::print("  payload   {} bytes vs order-0 entropy bound {}: {}{}\n",
             WithCommas(r.payload_bytes),
             WithCommas(static_cast<uint64_t>(std::llround(r.bound_bytes))),
             OverBound(static_cast<double>(r.payload_bytes), r.bound_bytes),
             r.bound_valid ? "" : " (bound not valid: non-XOR chunks)");
  fmt::print("  framed    {} bytes (chunks with headers and checksums)\n",
             WithCommas(r.chunk_bytes));
  fmt::print("  file      {} bytes ({})\n", WithCommas(r.file_bytes),
             HumanBytes(static_cast<double>(r.file_bytes)));
  fmt::print("  full      {} bytes ({}): compression {}\n",
             WithCommas(r.full_bytes),
             HumanBytes(static_cast<double>(r.full_bytes)),
             Ratio(static_cast<double>(r.full_bytes),
                   static_cast<double>(r.file_bytes)));
  if (rows.empty()) return kExitOk;

  fmt::print("\n{}\n", args.tensors
                           ? std::string("tensors:")
                           : fmt::format("largest {} of {} tensors by bytes "
                                         "(--tensors lists all):",
                                         rows.size(), r.tensors.size()));
  size_t name_width = 6;
  for (const TensorInspect* t : rows) {
    name_width = std::max(name_width, t->name.size());
  }
  name_width = std::min<size_t>(name_width, 56);
  fmt::print(
      "  {:<{}} {:>5} {:>11} {:>9} {:>7} {:>10} {:>10} {:>7} {:>10}  "
      "{}\n",
      "tensor", name_width, "dtype", "elements", "changed", "rate", "payload",
      "bound", "x bound", "framed", "kinds");
  for (const TensorInspect* t : rows) {
    std::string name = t->name;
    if (name.size() > name_width) {
      name = "..." + name.substr(name.size() - (name_width - 3));
    }
    fmt::print(
        "  {:<{}} {:>5} {:>11} {:>9} {:>7} {:>10} {:>10} {:>7} {:>10}  "
        "{}\n",
        name, name_width, t->dtype, WithCommas(t->elements),
        WithCommas(t->changed), Percent(Fraction(t->changed, t->elements)),
        WithCommas(t->payload_bytes),
        WithCommas(static_cast<uint64_t>(std::llround(t->bound_bytes))),
        OverBound(static_cast<double>(t->payload_bytes), t->bound_bytes),
        WithCommas(t->chunk_bytes), KindsString(t->kinds));
  }
  return kExitOk;
}

}  // namespace refit::cli
