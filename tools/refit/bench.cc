// `refit bench`: an end-to-end benchmark on a synthetic checkpoint (synth.h),
// in the spirit of zstd's benchzstd + datagen and LevelDB's db_bench. For
// each change rate it times Diff (file to file) and Apply (in place, on a
// scratch copy on disk), reports the delta against the order-0 entropy
// bound, and measures in the same run the baselines a reader needs to judge
// the numbers: memcpy and one hashing read of the checkpoint, zstd -3 of
// the dense XOR mask, and "16-bit gaps + XOR values" with zstd -1.
#include <fmt/format.h>
#include <xxhash.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "scratch_dir.h"
#include "synth.h"

namespace refit::cli {
namespace {

double GBps(double bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / 1e9 : 0.0;
}

struct ZstdResult {
  uint64_t bytes = 0;
  double seconds = 0;
};

Result<ZstdResult> ZstdSize(const std::vector<uint8_t>& input, int level) {
  std::vector<uint8_t> out(ZSTD_compressBound(input.size()));
  Stopwatch watch;
  size_t n =
      ZSTD_compress(out.data(), out.size(), input.data(), input.size(), level);
  double seconds = watch.Seconds();
  if (ZSTD_isError(n)) {
    return InternalError(
        fmt::format("zstd baseline failed: {}", ZSTD_getErrorName(n)));
  }
  return ZstdResult{n, seconds};
}

// The baseline streams for base -> target: the dense XOR mask (one 16-bit
// word per element, canonical order) and "16-bit gaps then XOR values",
// where a gap of 0xFFFF means "skip 65,535 elements, no record".
class XorStreams {
 public:
  void Add(uint16_t d) {
    mask_.push_back(d);
    if (d == 0) {
      ++gap_;
      return;
    }
    for (; gap_ >= 0xFFFF; gap_ -= 0xFFFF) gaps_.push_back(0xFFFF);
    gaps_.push_back(static_cast<uint16_t>(gap_));
    values_.push_back(d);
    gap_ = 0;
  }
  std::vector<uint8_t> Dense() const { return Bytes(mask_); }
  std::vector<uint8_t> Sparse() const {
    std::vector<uint8_t> out = Bytes(gaps_);
    std::vector<uint8_t> v = Bytes(values_);
    out.insert(out.end(), v.begin(), v.end());
    return out;
  }

 private:
  static std::vector<uint8_t> Bytes(const std::vector<uint16_t>& v) {
    std::vector<uint8_t> out(v.size() * 2);
    if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  std::vector<uint16_t> mask_, gaps_, values_;
  uint64_t gap_ = 0;
};

void BaselineStreams(const SynthModel& base, const SynthModel& target,
                     std::vector<uint8_t>* dense,
                     std::vector<uint8_t>* sparse) {
  XorStreams streams;
  for (size_t t = 0; t < base.tensors.size(); ++t) {
    const std::vector<uint16_t>& a = base.tensors[t].data;
    const std::vector<uint16_t>& b = target.tensors[t].data;
    for (size_t i = 0; i < a.size(); ++i) {
      streams.Add(static_cast<uint16_t>(a[i] ^ b[i]));
    }
  }
  *dense = streams.Dense();
  *sparse = streams.Sparse();
}

struct RateResult {
  double rate = 0;
  uint64_t changed = 0;
  DiffReport diff;
  InspectReport inspect;
  ApplyReport apply;
  double encode_seconds = 0;
  double apply_seconds = 0;
  bool exact = false;
  ZstdResult dense_zstd3;
  ZstdResult sparse_zstd1;
};

Result<bool> SameAs(const std::string& path, const SynthModel& model) {
  REFIT_ASSIGN_OR_RETURN(Checkpoint ckpt,
                         Checkpoint::Open(path, Checkpoint::Mode::kReadOnly));
  if (ckpt.tensors().size() != model.tensors.size()) return false;
  for (size_t i = 0; i < model.tensors.size(); ++i) {
    std::span<const uint8_t> got = ckpt.Data(i);
    const std::vector<uint16_t>& want = model.tensors[i].data;
    if (ckpt.tensors()[i].name != model.tensors[i].name ||
        got.size() != want.size() * 2 ||
        std::memcmp(got.data(), want.data(), got.size()) != 0) {
      return false;
    }
  }
  return true;
}

Result<RateResult> RunRate(const BenchArgs& args, double rate, size_t index,
                           const SynthModel& base, const std::string& base_path,
                           const ScratchDir& dir, ProgressBar* bar) {
  RateResult r;
  r.rate = rate;
  bar->Note(fmt::format("rate {}: generating the target...", Percent(rate, 1)));
  SynthModel target = base;
  r.changed = EvolveModel(&target, rate, args.seed * 7919 + index + 1);
  std::string target_path = dir.File("target.safetensors");
  REFIT_RETURN_IF_ERROR(WriteModel(target, target_path, {{"step", "1"}}));

  bar->Note(fmt::format("rate {}: zstd baselines...", Percent(rate, 1)));
  {
    std::vector<uint8_t> dense;
    std::vector<uint8_t> sparse;
    BaselineStreams(base, target, &dense, &sparse);
    REFIT_ASSIGN_OR_RETURN(r.dense_zstd3, ZstdSize(dense, 3));
    REFIT_ASSIGN_OR_RETURN(r.sparse_zstd1, ZstdSize(sparse, 1));
  }
  bar->Clear();

  std::string delta_path = dir.File("delta.rfd");
  DiffOptions diff_options;
  diff_options.threads = args.threads;
  diff_options.progress = bar->Callback();
  Stopwatch encode;
  REFIT_ASSIGN_OR_RETURN(
      r.diff, Diff(base_path, target_path, delta_path, diff_options));
  r.encode_seconds = encode.Seconds();
  bar->Clear();
  REFIT_ASSIGN_OR_RETURN(r.inspect, Inspect(delta_path));

  bar->Note(fmt::format("rate {}: copying the base...", Percent(rate, 1)));
  std::string scratch = dir.File("engine.safetensors");
  REFIT_RETURN_IF_ERROR(CopyCheckpoint(base_path, scratch));
  bar->Clear();
  ApplyOptions apply_options;
  apply_options.threads = args.threads;
  apply_options.sync = !args.no_sync;
  apply_options.progress = bar->Callback();
  Stopwatch apply;
  REFIT_ASSIGN_OR_RETURN(r.apply, Apply(delta_path, scratch, apply_options));
  r.apply_seconds = apply.Seconds();
  bar->Clear();
  REFIT_ASSIGN_OR_RETURN(r.exact, SameAs(scratch, target));
  return r;
}

struct PairSizes {
  std::string pair;
  uint64_t elements = 0;
  uint64_t changed = 0;
  double bound = 0;
  uint64_t payload = 0;      // ours, XOR kinds
  uint64_t chunk_bytes = 0;  // ours, with chunk framing
  uint64_t file_bytes = 0;   // ours, the whole delta file
  uint64_t overwrite = 0;    // ours, overwrite kinds only
  uint64_t dense_zstd3 = 0;  // dense XOR mask, zstd -3
  uint64_t sparse_zstd1 = 0; // 16-bit gaps + XOR values, zstd -1
  uint64_t full_zstd3 = 0;   // the target checkpoint's tensors, zstd -3
};

// Payload sizes of one fixture pair: ours (XOR and overwrite-only) and the
// baselines, all from the same tensors.
Result<PairSizes> MeasurePair(const std::string& dir, int from, int to,
                              const ScratchDir& scratch) {
  PairSizes r;
  r.pair = fmt::format("step{}->step{}", from, to);
  const std::string a = fmt::format("{}/step{}.safetensors", dir, from);
  const std::string b = fmt::format("{}/step{}.safetensors", dir, to);
  REFIT_ASSIGN_OR_RETURN(Checkpoint base, Checkpoint::Open(a, Checkpoint::Mode::kReadOnly));
  REFIT_ASSIGN_OR_RETURN(Checkpoint target, Checkpoint::Open(b, Checkpoint::Mode::kReadOnly));
  XorStreams streams;
  std::vector<uint8_t> full;
  for (size_t t = 0; t < base.tensors().size(); ++t) {
    if (base.tensors()[t].element_width != 2) {
      return InvalidArgumentError("--fixtures expects BF16 step checkpoints");
    }
    auto x = base.Data(t);
    auto y = target.Data(*target.IndexOf(base.tensors()[t].name));
    full.insert(full.end(), y.begin(), y.end());
    for (size_t i = 0; i + 1 < x.size(); i += 2) {
      streams.Add(static_cast<uint16_t>((x[i] | x[i + 1] << 8) ^ (y[i] | y[i + 1] << 8)));
    }
  }
  REFIT_ASSIGN_OR_RETURN(ZstdResult dz, ZstdSize(streams.Dense(), 3));
  REFIT_ASSIGN_OR_RETURN(ZstdResult sz, ZstdSize(streams.Sparse(), 1));
  REFIT_ASSIGN_OR_RETURN(ZstdResult fz, ZstdSize(full, 3));
  r.dense_zstd3 = dz.bytes;
  r.sparse_zstd1 = sz.bytes;
  r.full_zstd3 = fz.bytes;

  const std::string delta = scratch.File("pair.rfd");
  REFIT_ASSIGN_OR_RETURN(DiffReport d, Diff(a, b, delta, {}));
  REFIT_ASSIGN_OR_RETURN(InspectReport info, Inspect(delta));
  r.elements = info.total_elements;
  r.changed = info.changed_elements;
  r.bound = info.bound_bytes;
  r.payload = info.payload_bytes;
  r.chunk_bytes = info.chunk_bytes;
  r.file_bytes = d.file_bytes;
  DiffOptions overwrite;
  overwrite.allow_xor = false;
  REFIT_ASSIGN_OR_RETURN(DiffReport o, Diff(a, b, scratch.File("ow.rfd"), overwrite));
  r.overwrite = o.payload_bytes;
  return r;
}

int RunFixtureSizes(const BenchArgs& args) {
  constexpr std::string_view kCmd = "bench";
  auto dir = ScratchDir::Create("refit-bench-");
  if (!dir.ok()) return Fail(kCmd, dir.status(), args.json);
  std::vector<PairSizes> rows;
  for (int from = 0; from < 3; ++from) {
    auto r = MeasurePair(args.fixtures, from, from + 1, *dir);
    if (!r.ok()) return Fail(kCmd, r.status(), args.json);
    rows.push_back(*r);
  }
  auto x = [](uint64_t bytes, double bound) { return static_cast<double>(bytes) / bound; };
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const PairSizes& r : rows) {
      out.push_back({{"pair", r.pair}, {"elements", r.elements}, {"changed", r.changed},
                     {"bound_bytes", r.bound}, {"payload_bytes", r.payload},
                     {"chunk_bytes", r.chunk_bytes}, {"file_bytes", r.file_bytes},
                     {"overwrite_payload_bytes", r.overwrite},
                     {"dense_xor_zstd3_bytes", r.dense_zstd3},
                     {"gaps_xor_zstd1_bytes", r.sparse_zstd1},
                     {"full_zstd3_bytes", r.full_zstd3}});
    }
    fmt::print("{}\n", nlohmann::json{{"command", args.command_line}, {"pairs", out}}.dump(2));
    return 0;
  }
  fmt::print("refit bench: {}\n", args.command_line);
  fmt::print("bytes, and in brackets x the order-0 entropy bound (positions as a uniform "
             "random subset + empirical entropy of the 16-bit XOR values)\n");
  fmt::print("{:<14} {:>8} {:>10} {:>18} {:>18} {:>18} {:>18} {:>18} {:>18}\n", "pair",
             "changed", "bound", "refit payload", "refit file", "refit overwrite",
             "xor mask+zstd3", "gaps+xor+zstd1", "full+zstd3");
  for (const PairSizes& r : rows) {
    auto cell = [&](uint64_t b) { return fmt::format("{} (x{:.3f})", b, x(b, r.bound)); };
    fmt::print("{:<14} {:>7.2f}% {:>10.0f} {:>18} {:>18} {:>18} {:>18} {:>18} {:>18}\n",
               r.pair, 100.0 * static_cast<double>(r.changed) / static_cast<double>(r.elements),
               r.bound, cell(r.payload), cell(r.file_bytes), cell(r.overwrite),
               cell(r.dense_zstd3), cell(r.sparse_zstd1), cell(r.full_zstd3));
  }
  return 0;
}

}  // namespace

int RunBench(const BenchArgs& args) {
  if (!args.fixtures.empty()) return RunFixtureSizes(args);
  constexpr std::string_view kCmd = "bench";
  std::vector<double> rates;
  if (args.rates.empty()) {
    rates = {0.001, 0.01, 0.03, 0.5};
  } else {
    for (const std::string& text : args.rates) {
      Result<double> rate = ParseRate(text, "--rate");
      if (!rate.ok()) return Fail(kCmd, rate.status(), args.json);
      rates.push_back(*rate);
    }
  }
  if (!(args.size_mib > 0) || args.size_mib > 64 * 1024) {
    return Fail(kCmd, InvalidArgumentError("--size-mib must be in (0, 65536]"),
                args.json);
  }
  int threads = EffectiveThreads(args.threads);
  ProgressBar bar;
  Result<ScratchDir> dir = ScratchDir::Create("refit-bench");
  if (!dir.ok()) return Fail(kCmd, dir.status(), args.json);

  bar.Note("generating the synthetic base checkpoint...");
  Stopwatch gen;
  SynthModel base = GenerateModel(
      static_cast<uint64_t>(args.size_mib * (1 << 20)), args.seed);
  double gen_seconds = gen.Seconds();
  std::string base_path = dir->File("base.safetensors");
  if (Status s = WriteModel(base, base_path, {{"step", "0"}}); !s.ok()) {
    return Fail(kCmd, s, args.json);
  }
  double full = static_cast<double>(base.bytes());

  // Baselines on the base checkpoint: the cost of touching every byte once.
  bar.Note("baselines: memcpy and hashing read...");
  std::vector<uint8_t> copy(base.bytes());
  std::memset(copy.data(), 1, copy.size());  // fault the pages in first
  Stopwatch memcpy_watch;
  size_t offset = 0;
  for (const SynthTensor& t : base.tensors) {
    std::memcpy(copy.data() + offset, t.data.data(), t.data.size() * 2);
    offset += t.data.size() * 2;
  }
  double memcpy_seconds = memcpy_watch.Seconds();
  copy.clear();
  copy.shrink_to_fit();
  double hash_seconds = 0;
  {
    Stopwatch watch;
    Result<Checkpoint> ckpt =
        Checkpoint::Open(base_path, Checkpoint::Mode::kReadOnly);
    if (!ckpt.ok()) return Fail(kCmd, ckpt.status(), args.json);
    volatile uint64_t sink = 0;  // XXH3 is declared pure: keep the calls
    for (size_t i = 0; i < ckpt->tensors().size(); ++i) {
      std::span<const uint8_t> data = ckpt->Data(i);
      sink = sink ^ XXH3_128bits(data.data(), data.size()).low64;
    }
    hash_seconds = watch.Seconds();
  }
  bar.Clear();

  if (!args.json) {
    fmt::print("refit bench: {}\n", args.command_line);
    fmt::print("machine: {}, {} hardware threads; refit using {} thread{}\n",
               CpuModel(), std::thread::hardware_concurrency(), threads,
               threads == 1 ? "" : "s");
    fmt::print(
        "input:   synthetic BF16 model, {} tensors, {} ({}), seed {}, "
        "generated in {}\n",
        base.tensors.size(), HumanBytes(full),
        WithCommas(base.elements()) + " elements", args.seed,
        HumanSeconds(gen_seconds));
    fmt::print(
        "steps:   a fraction R of elements moved by +-1 ulp (80%), 2 "
        "(15%) or 3 (5%)\n");
    fmt::print(
        "baseline: memcpy {} ({:.2f} GB/s, 1 thread); read + XXH3 "
        "{} ({:.2f} GB/s, page cache hot, 1 thread)\n\n",
        HumanSeconds(memcpy_seconds), GBps(full, memcpy_seconds),
        HumanSeconds(hash_seconds), GBps(full, hash_seconds));
    fmt::print(
        "{:>6} {:>12} {:>10} {:>8} {:>7}  {:>9} {:>13}  {:>9} {:>9} "
        "{:>15}  {:>10} {:>10}  {}\n",
        "rate", "changed", "delta", "ratio", "x bound", "encode", "GB/s (/thr)",
        "apply", "GB/s", "pages written", "zstd3 XOR", "gap+x zs1", "exact");
  }

  std::vector<RateResult> results;
  bool all_exact = true;
  for (size_t i = 0; i < rates.size(); ++i) {
    Result<RateResult> r =
        RunRate(args, rates[i], i, base, base_path, *dir, &bar);
    if (!r.ok()) {
      return Fail(
          kCmd,
          r.status().WithContext(fmt::format("rate {}", Percent(rates[i], 1))),
          args.json);
    }
    all_exact = all_exact && r->exact;
    if (!args.json) {
      const RateResult& x = *r;
      uint64_t pages =
          x.apply.page_size == 0
              ? 0
              : (x.apply.checkpoint_bytes + x.apply.page_size - 1) /
                    x.apply.page_size;
      double encode_gbps = GBps(full, x.encode_seconds);
      fmt::print(
          "{:>6} {:>12} {:>10} {:>8} {:>7}  {:>9} {:>13}  {:>9} {:>9} "
          "{:>15}  {:>10} {:>10}  {}\n",
          Percent(x.rate, 1), WithCommas(x.changed),
          HumanBytes(static_cast<double>(x.diff.file_bytes)),
          Ratio(full, static_cast<double>(x.diff.file_bytes)),
          OverBound(static_cast<double>(x.inspect.payload_bytes),
                    x.inspect.bound_bytes),
          HumanSeconds(x.encode_seconds),
          fmt::format("{:.2f} ({:.2f})", encode_gbps, encode_gbps / threads),
          HumanSeconds(x.apply_seconds),
          fmt::format("{:.2f}", GBps(full, x.apply_seconds)),
          fmt::format(
              "{} ({})", WithCommas(x.apply.pages_written),
              Percent(pages == 0 ? 0.0
                                 : static_cast<double>(x.apply.pages_written) /
                                       static_cast<double>(pages),
                      0)),
          HumanBytes(static_cast<double>(x.dense_zstd3.bytes)),
          HumanBytes(static_cast<double>(x.sparse_zstd1.bytes)),
          x.exact ? "yes" : "NO");
    }
    results.push_back(std::move(*r));
  }

  if (args.json) {
    Json j;
    j["ok"] = all_exact;
    j["command"] = "bench";
    j["command_line"] = args.command_line;
    j["machine"] = {{"cpu", CpuModel()},
                    {"hardware_threads", std::thread::hardware_concurrency()},
                    {"threads", threads}};
    j["input"] = {
        {"kind", "synthetic BF16"},    {"tensors", base.tensors.size()},
        {"elements", base.elements()}, {"bytes", base.bytes()},
        {"seed", args.seed},           {"generate_seconds", gen_seconds}};
    j["baselines"] = {{"memcpy_seconds", memcpy_seconds},
                      {"memcpy_gbps", GBps(full, memcpy_seconds)},
                      {"read_xxh3_seconds", hash_seconds},
                      {"read_xxh3_gbps", GBps(full, hash_seconds)}};
    Json rows = Json::array();
    for (const RateResult& x : results) {
      rows.push_back(
          {{"rate", x.rate},
           {"changed_elements", x.changed},
           {"delta_bytes", x.diff.file_bytes},
           {"payload_bytes", x.inspect.payload_bytes},
           {"bound_bytes", x.inspect.bound_bytes},
           {"bound_valid", x.inspect.bound_valid},
           {"chunks_by_kind", x.diff.chunks_by_kind},
           {"compression_ratio",
            x.diff.file_bytes ? full / static_cast<double>(x.diff.file_bytes)
                              : 0.0},
           {"encode_seconds", x.encode_seconds},
           {"encode_gbps", GBps(full, x.encode_seconds)},
           {"encode_gbps_per_thread", GBps(full, x.encode_seconds) / threads},
           {"apply_seconds", x.apply_seconds},
           {"apply_gbps", GBps(full, x.apply_seconds)},
           {"apply_synced", !args.no_sync},
           {"pages_written", x.apply.pages_written},
           {"page_size", x.apply.page_size},
           {"checkpoint_bytes", x.apply.checkpoint_bytes},
           {"exact", x.exact},
           {"zstd3_dense_xor_bytes", x.dense_zstd3.bytes},
           {"zstd3_dense_xor_seconds", x.dense_zstd3.seconds},
           {"gaps16_xor_zstd1_bytes", x.sparse_zstd1.bytes},
           {"gaps16_xor_zstd1_seconds", x.sparse_zstd1.seconds}});
    }
    j["rates"] = rows;
    PrintJson(j);
  } else {
    fmt::print(
        "\nx bound: refit's payload over the order-0 entropy bound; "
        "encode/apply are wall time file to file (apply {}synced); "
        "zstd baselines single-threaded\n",
        args.no_sync ? "not " : "");
  }
  if (!all_exact) {
    fmt::print(stderr,
               "refit: bench: an applied checkpoint differs from the "
               "target; this is a bug in refit, please report it\n");
    return kExitMismatch;
  }
  return kExitOk;
}

}  // namespace refit::cli
