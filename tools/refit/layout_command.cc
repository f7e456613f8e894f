#include "layout_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <memory>
#include <numeric>
#include <span>
#include <map>
#include <tuple>
#include <unordered_map>
#include <string>
#include <vector>

#include "base/file.h"
#include "cli_util.h"
#include "flag_checks.h"
#include "layout/generate.h"
#include "refit/checkpoint.h"
#include "refit/layout.h"

namespace refit::cli {
namespace {

struct LayoutArgs {
  // generate
  std::string config, output, gate_up = "concat", local_dtype;
  std::string engine;  // empty: a trainer layout
  std::vector<std::string> trainer_options_given;
  uint32_t tp = 1, pp = 1, ep = 1, dp = 1, cp = 1;
  bool no_fused_qkv = false, transposed = false;
  uint64_t vocab_multiple = 1;
  // check
  std::string layout;
  double min_split_kib = 64;
  bool per_rank = false;
  bool json = false;
};

Result<layout::GateUp> ParseGateUp(const std::string& s, uint64_t* group) {
  if (s == "concat") return layout::GateUp::kConcat;
  if (s == "separate") return layout::GateUp::kSeparate;
  std::string_view v = s;
  if (v.starts_with("interleaved")) {
    v.remove_prefix(11);
    if (v.empty()) return layout::GateUp::kInterleaved;  // default group
    if (v[0] == ':' || v[0] == '=') {
      v.remove_prefix(1);
      uint64_t n = 0;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec == std::errc() && p == v.data() + v.size() && n > 0) {
        *group = n;
        return layout::GateUp::kInterleaved;
      }
    }
  }
  return InvalidArgumentError("--gate-up '" + s +
                              "' is not concat, separate or interleaved:N (N > 0)");
}

// Proves a generated layout valid, writes it and prints a summary.
int WriteGenerated(const LayoutArgs& a, const layout::Layout& l, const std::string& setup) {
  const char* cmd = "layout generate";
  // Generated layouts are valid by construction; prove it before writing.
  if (Status s = layout::ValidateLayout(l); !s.ok()) {
    return Fail(cmd, InternalError("generated layout is invalid: " +
                                   std::string(s.message())),
                a.json);
  }
  std::string text = layout::LayoutToJson(l);
  if (Status s = WriteFileAtomic(a.output, std::span(reinterpret_cast<const uint8_t*>(
                                                          text.data()),
                                                      text.size()));
      !s.ok()) {
    return Fail(cmd, s, a.json);
  }
  uint64_t pieces = 0, tensors = 0;
  for (const layout::RankLayout& r : l.ranks) {
    tensors += r.tensors.size();
    for (const layout::LocalTensor& t : r.tensors) pieces += t.pieces.size();
  }
  if (a.json) {
    Json j;
    j["ok"] = true;
    j["command"] = cmd;
    j["output"] = a.output;
    if (!a.engine.empty()) j["engine"] = a.engine;
    j["ranks"] = l.ranks.size();
    j["canonical_tensors"] = l.canonical.size();
    j["local_tensors"] = tensors;
    j["pieces"] = pieces;
    PrintJson(j);
  } else {
    fmt::print("wrote {}: {} ranks ({}), {} canonical tensors, {} local tensors, {} pieces\n",
               a.output, l.ranks.size(), setup, l.canonical.size(), WithCommas(tensors),
               WithCommas(pieces));
  }
  return kExitOk;
}

// An inference engine's layout (docs/layout.md, "Engine layouts"): one rank
// per engine TP rank. Options that describe a trainer are refused.
int RunGenerateEngine(const LayoutArgs& a, const layout::ModelConfig& m) {
  const char* cmd = "layout generate";
  if (a.engine != "vllm") {
    return Fail(cmd, InvalidArgumentError("--engine '" + a.engine + "' is not vllm"), a.json);
  }
  if (!a.trainer_options_given.empty()) {
    return Fail(cmd,
                InvalidArgumentError(a.trainer_options_given.front() +
                                     " describes a trainer; with --engine only --tp and --ep "
                                     "apply"),
                a.json);
  }
  layout::EngineParallelism p;
  p.engine = layout::Engine::kVllm;
  p.tp = a.tp;
  p.ep = a.ep;
  Result<layout::Layout> l = layout::GenerateEngineLayout(m, p);
  if (!l.ok()) return Fail(cmd, l.status(), a.json);
  return WriteGenerated(a, *l, fmt::format("vllm tp {} ep {}", p.tp, p.ep));
}

int RunGenerate(const LayoutArgs& a) {
  const char* cmd = "layout generate";
  if (Status s = CheckExists(a.config, "config"); !s.ok()) return Fail(cmd, s, a.json);
  Result<layout::ModelConfig> m = layout::LoadModelConfig(a.config);
  if (!m.ok()) return Fail(cmd, m.status(), a.json);
  if (!a.engine.empty()) return RunGenerateEngine(a, *m);
  layout::Parallelism p;
  p.tp = a.tp;
  p.pp = a.pp;
  p.ep = a.ep;
  p.dp = a.dp;
  p.cp = a.cp;
  p.fused_qkv = !a.no_fused_qkv;
  p.transposed = a.transposed;
  p.vocab_multiple = a.vocab_multiple;
  p.local_dtype = a.local_dtype;
  Result<layout::GateUp> gu = ParseGateUp(a.gate_up, &p.gate_up_group);
  if (!gu.ok()) return Fail(cmd, gu.status(), a.json);
  p.gate_up = *gu;
  Result<layout::Layout> l = layout::GenerateLayout(*m, p);
  if (!l.ok()) return Fail(cmd, l.status(), a.json);
  return WriteGenerated(a, *l,
                        fmt::format("tp {} pp {} ep {} dp {} cp {}", p.tp, p.pp, p.ep, p.dp,
                                    p.cp));
}

int RunCheck(const LayoutArgs& a) {
  const char* cmd = "layout check";
  Stopwatch total;
  if (Status s = CheckExists(a.layout, "layout"); !s.ok()) return Fail(cmd, s, a.json);
  Result<layout::Layout> l = layout::LoadLayout(a.layout);
  if (!l.ok()) return Fail(cmd, l.status(), a.json);
  double parse_s = total.Seconds();
  layout::OwnershipOptions opt;
  opt.min_split_bytes = static_cast<uint64_t>(std::max(0.0, a.min_split_kib) * 1024);
  Stopwatch own_clock;
  Result<layout::Ownership> o = layout::AssignOwnership(*l, opt);  // validates first
  if (!o.ok()) return Fail(cmd, o.status(), a.json);
  double own_s = own_clock.Seconds();
  Stopwatch cover_clock;
  if (Status s = layout::CheckCoverage(*l, *o); !s.ok()) return Fail(cmd, s, a.json);
  double cover_s = cover_clock.Seconds();

  size_t n = l->ranks.size();
  std::unordered_map<std::string, uint64_t> width;
  for (const layout::CanonicalTensor& c : l->canonical) {
    width[c.name] = *DTypeRegistry().ElementWidth(c.dtype);  // validated
  }
  auto bytes = [&](const layout::Piece& p) { return p.rows * p.cols * width[p.canonical]; };
  std::vector<uint64_t> owned(n, 0), mapped(n, 0), owned_pieces(n, 0);
  // Ranks that map exactly the same canonical blocks are replicas of each
  // other; ownership should split their work evenly.
  std::map<std::vector<std::tuple<std::string, uint64_t, uint64_t, uint64_t>>,
           std::vector<size_t>>
      replica_sets;
  for (size_t r = 0; r < n; ++r) {
    for (const layout::OwnedPiece& op : (*o)[r]) owned[r] += bytes(op.piece);
    owned_pieces[r] = (*o)[r].size();
    std::vector<std::tuple<std::string, uint64_t, uint64_t, uint64_t>> blocks;
    for (const layout::LocalTensor& t : l->ranks[r].tensors) {
      for (const layout::Piece& p : t.pieces) {
        mapped[r] += bytes(p);
        blocks.emplace_back(p.canonical, p.canon_offset, p.rows, p.cols);
      }
    }
    std::sort(blocks.begin(), blocks.end());
    replica_sets[std::move(blocks)].push_back(r);
  }
  double worst_replica = 1.0;
  size_t largest_set = 0;
  for (const auto& [blocks, ranks] : replica_sets) {
    largest_set = std::max(largest_set, ranks.size());
    uint64_t sum = 0, hi = 0;
    for (size_t r : ranks) sum += owned[r], hi = std::max(hi, owned[r]);
    if (sum == 0) continue;
    double mean_set = static_cast<double>(sum) / static_cast<double>(ranks.size());
    worst_replica = std::max(worst_replica, static_cast<double>(hi) / mean_set);
  }
  uint64_t canonical = std::accumulate(owned.begin(), owned.end(), uint64_t{0});
  uint64_t max_owned = n ? *std::max_element(owned.begin(), owned.end()) : 0;
  uint64_t min_owned = n ? *std::min_element(owned.begin(), owned.end()) : 0;
  double mean = n ? static_cast<double>(canonical) / static_cast<double>(n) : 0;
  double balance = mean > 0 ? static_cast<double>(max_owned) / mean : 0;
  if (a.json) {
    Json j;
    j["ok"] = true;
    j["command"] = cmd;
    j["layout"] = a.layout;
    j["ranks"] = n;
    j["canonical_tensors"] = l->canonical.size();
    j["canonical_bytes"] = canonical;
    j["owned_bytes_max"] = max_owned;
    j["owned_bytes_min"] = min_owned;
    j["balance_max_over_mean"] = balance;
    j["replica_sets"] = replica_sets.size();
    j["largest_replica_set"] = largest_set;
    j["replica_balance_max_over_mean"] = worst_replica;
    j["seconds"] = {{"load", parse_s}, {"validate_and_own", own_s}, {"coverage", cover_s}};
    Json ranks = Json::array();
    for (size_t r = 0; r < n; ++r) {
      ranks.push_back({{"rank", l->ranks[r].rank},
                       {"mapped_bytes", mapped[r]},
                       {"owned_bytes", owned[r]},
                       {"owned_pieces", owned_pieces[r]}});
    }
    j["per_rank"] = ranks;
    PrintJson(j);
    return kExitOk;
  }
  fmt::print("{}: valid; {} ranks, {} canonical tensors ({})\n", a.layout, n,
             l->canonical.size(), HumanBytes(static_cast<double>(canonical)));
  fmt::print("coverage: every canonical element is owned by exactly one rank\n");
  size_t shown = a.per_rank ? n : std::min<size_t>(n, 16);
  fmt::print("{:>6}  {:>12}  {:>12}  {:>8}\n", "rank", "mapped", "owned", "pieces");
  for (size_t r = 0; r < shown; ++r) {
    fmt::print("{:>6}  {:>12}  {:>12}  {:>8}\n", l->ranks[r].rank,
               HumanBytes(static_cast<double>(mapped[r])),
               HumanBytes(static_cast<double>(owned[r])), owned_pieces[r]);
  }
  if (shown < n) fmt::print("   ... {} more ranks (--per-rank lists all)\n", n - shown);
  fmt::print("owned bytes per rank: min {}, mean {}, max {} (max/mean {:.3f})\n",
             HumanBytes(static_cast<double>(min_owned)), HumanBytes(mean),
             HumanBytes(static_cast<double>(max_owned)), balance);
  fmt::print("replicas: {} sets of ranks mapping the same blocks (up to {} ranks each); "
             "worst max/mean owned bytes within a set {:.3f}\n",
             replica_sets.size(), largest_set, worst_replica);
  fmt::print("time: load {}, validate + own {}, coverage {}\n", HumanSeconds(parse_s),
             HumanSeconds(own_s), HumanSeconds(cover_s));
  return kExitOk;
}

}  // namespace

std::function<std::optional<int>(bool)> RegisterLayoutCommand(CLI::App* app) {
  auto a = std::make_shared<LayoutArgs>();
  CLI::App* layout_cmd = app->add_subcommand(
      "layout",
      "Trainer layouts (docs/layout.md): how every rank's local tensors map to "
      "the checkpoint's tensors, and which rank owns which element.");
  layout_cmd->require_subcommand(1);
  CLI::App* gen = layout_cmd->add_subcommand(
      "generate", "Write the layout of a Megatron-style training setup.");
  gen->add_option("--config", a->config, "the model's Hugging Face config.json")
      ->required();
  gen->add_option("-o,--output", a->output, "the layout JSON to write")->required();
  gen->add_option("--tp", a->tp, "tensor-parallel size")->capture_default_str()
      ->check(IntIn(1, 1 << 16));
  gen->add_option("--pp", a->pp, "pipeline stages")->capture_default_str()
      ->check(IntIn(1, 1 << 16));
  gen->add_option("--ep", a->ep, "expert-parallel size (divides --dp; with --engine, 1 or --tp)")
      ->capture_default_str()->check(IntIn(1, 1 << 16));
  gen->add_option("--dp", a->dp, "data-parallel replicas")->capture_default_str()
      ->check(IntIn(1, 1 << 16));
  gen->add_option("--cp", a->cp, "context-parallel size (replicas of the weights)")
      ->capture_default_str()->check(IntIn(1, 1 << 16));
  gen->add_flag("--no-fused-qkv", a->no_fused_qkv,
                "separate q, k and v tensors instead of Megatron's linear_qkv");
  gen->add_option("--gate-up", a->gate_up,
                  "gate/up storage: concat, separate, interleaved:N (N rows each)")
      ->capture_default_str();
  gen->add_flag("--transposed", a->transposed, "2-D linear weights stored [in, out]");
  gen->add_option("--vocab-multiple", a->vocab_multiple,
                  "pad the vocabulary to a multiple of this times --tp")
      ->capture_default_str()->check(IntIn(1, 1 << 20));
  gen->add_option("--local-dtype", a->local_dtype,
                  "dtype of the trainer's storage (default: the checkpoint's)");
  gen->add_option("--engine", a->engine,
                  "write an inference engine's layout instead of a trainer's: vllm "
                  "(one rank per engine TP rank; --tp, and --ep 1 or equal to --tp)")
      ->check(CLI::IsMember({"vllm"}));
  gen->add_flag("--json", a->json, "print a JSON object on stdout instead of text");
  gen->footer("Example: refit layout generate --config config.json --tp 4 --pp 2 "
              "--dp 2 -o layout.json\n"
              "         refit layout generate --config config.json --engine vllm --tp 4 "
              "-o engine_layout.json");
  CLI::App* check = layout_cmd->add_subcommand(
      "check",
      "Validate LAYOUT, assign ownership and prove that every canonical element is "
      "owned exactly once; print per-rank owned bytes and the balance (exit 2 on a bad "
      "layout).");
  check->add_option("LAYOUT", a->layout, "a layout JSON file")->required();
  check->add_option("--min-split-kib", a->min_split_kib,
                    "split replicated regions only into parts of at least this size")
      ->capture_default_str();
  check->add_flag("--per-rank", a->per_rank, "list every rank (default: the first 16)");
  check->add_flag("--json", a->json, "print a JSON object on stdout instead of text");
  return [a, gen, check](bool global_json) -> std::optional<int> {
    a->json |= global_json;
    if (*gen) {
      for (const char* name : {"--pp", "--dp", "--cp", "--no-fused-qkv", "--gate-up",
                               "--transposed", "--vocab-multiple", "--local-dtype"}) {
        if (gen->count(name) > 0) a->trainer_options_given.push_back(name);
      }
      return RunGenerate(*a);
    }
    if (*check) return RunCheck(*a);
    return std::nullopt;
  };
}

}  // namespace refit::cli
