#include "layout/generate.h"

#include <algorithm>
#include <array>
#include <tuple>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <utility>

#include "base/file.h"
#include "format/json.h"

namespace refit::layout {
namespace {

using Json = nlohmann::json;

Result<uint64_t> ConfigInt(const Json& j, const char* key, bool required,
                           uint64_t fallback = 0) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) {
      return InvalidArgumentError(std::string("config.json: missing \"") + key + "\"");
    }
    return fallback;
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    return InvalidArgumentError(std::string("config.json: \"") + key +
                                "\" is not a non-negative integer");
  }
  return static_cast<uint64_t>(it->get<int64_t>());
}

Result<bool> ConfigBool(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return InvalidArgumentError(std::string("config.json: \"") + key +
                                "\" is not true or false");
  }
  return it->get<bool>();
}

// Builds one rank's local tensors.
class RankBuilder {
 public:
  RankBuilder(const Parallelism& par, std::string dtype)
      : par_(par), dtype_(std::move(dtype)) {}

  // A local tensor whose logical (untransposed) shape is [rows, cols]; cols
  // == 0 for 1-D tensors. Transposed when `transposable` and par.transposed.
  LocalTensor* Add(std::string name, uint64_t rows, uint64_t cols,
                   bool transposable = true, const char* dtype = nullptr) {
    LocalTensor t;
    t.name = std::move(name);
    t.dtype = dtype ? dtype : dtype_;
    bool tr = cols > 0 && transposable && par_.transposed;
    if (cols == 0) {
      t.shape = {rows};
    } else {
      t.shape = tr ? std::vector<uint64_t>{cols, rows}
                   : std::vector<uint64_t>{rows, cols};
    }
    tensors.push_back(std::move(t));
    transposed_.push_back(tr);
    return &tensors.back();
  }

  // Maps `groups` repeats of an n x w rectangle: repeat j covers logical
  // local rows [lr0 + j*lstep, +n), cols [lc0, +w) and canonical rows
  // [cr0 + j*cstep, +n), cols [cc0, +w). Local logical width `lcols`,
  // canonical width `ccols` (both 1 for 1-D tensors).
  void Rect(const std::string& canonical, uint64_t groups, uint64_t n,
            uint64_t w, uint64_t lr0, uint64_t lstep, uint64_t lc0,
            uint64_t cr0, uint64_t cstep, uint64_t cc0, uint64_t ccols) {
    if (groups == 0 || n == 0 || w == 0) return;
    LocalTensor& t = tensors.back();
    bool one_d = t.shape.size() == 1;
    uint64_t lrows = one_d ? t.shape[0] : (transposed_.back() ? t.shape[1] : t.shape[0]);
    uint64_t lcols = one_d ? 1 : (transposed_.back() ? t.shape[0] : t.shape[1]);
    Piece p;
    p.canonical = canonical;
    if (!transposed_.back()) {
      if (w == lcols && w == ccols && lc0 == 0 && cc0 == 0 && (groups > 1 || one_d)) {
        // Whole rows: each repeat is one contiguous run on both sides.
        p.rows = groups;
        p.cols = n * w;
        p.local_offset = lr0 * lcols;
        p.local_row_stride = groups > 1 ? lstep * lcols : n * w;
        p.local_col_stride = 1;
        p.canon_offset = cr0 * ccols;
        p.canon_row_stride = groups > 1 ? cstep * ccols : n * w;
        p.canon_col_stride = 1;
        t.pieces.push_back(p);
        return;
      }
      for (uint64_t j = 0; j < groups; ++j) {
        p.rows = n;
        p.cols = w;
        p.local_offset = (lr0 + j * lstep) * lcols + lc0;
        p.local_row_stride = lcols;
        p.local_col_stride = 1;
        p.canon_offset = (cr0 + j * cstep) * ccols + cc0;
        p.canon_row_stride = ccols;
        p.canon_col_stride = 1;
        t.pieces.push_back(p);
      }
      return;
    }
    // Stored [lcols, lrows]: block row r is logical column lc0 + r, block
    // column c is logical row; canonical runs go down its columns.
    for (uint64_t j = 0; j < groups; ++j) {
      p.rows = w;
      p.cols = n;
      p.local_offset = lc0 * lrows + lr0 + j * lstep;
      p.local_row_stride = lrows;
      p.local_col_stride = 1;
      p.canon_offset = (cr0 + j * cstep) * ccols + cc0;
      p.canon_row_stride = 1;
      p.canon_col_stride = ccols;
      t.pieces.push_back(p);
    }
  }

  // One piece of the last tensor, given in stored (not logical) local
  // coordinates.
  void Raw(const std::string& canonical, uint64_t rows, uint64_t cols,
           uint64_t local_offset, uint64_t local_row_stride, uint64_t canon_offset,
           uint64_t canon_row_stride, uint64_t canon_col_stride) {
    tensors.back().pieces.push_back(Piece{canonical, rows, cols, local_offset, local_row_stride, 1,
                                          canon_offset, canon_row_stride, canon_col_stride});
  }

  bool transposed() const { return transposed_.back(); }

  std::vector<LocalTensor> tensors;

 private:
  const Parallelism& par_;
  std::string dtype_;
  std::vector<bool> transposed_;
};

struct AttentionShard {
  uint64_t g0 = 0, g1 = 0;  // local query groups
  uint64_t qa = 0, qb = 0;  // q heads of each local group, within the group
};

Result<AttentionShard> ShardAttention(const ModelConfig& m, uint64_t tp,
                                      uint64_t t) {
  uint64_t groups = m.num_key_value_heads;
  uint64_t hpg = m.num_attention_heads / groups;
  AttentionShard s;
  if (tp <= groups) {
    std::tie(s.g0, s.g1) = SplitRange(groups, tp, t);
    s.qa = 0;
    s.qb = hpg;
    return s;
  }
  // More ranks than KV heads: ranks share a query group (and replicate its
  // KV head), splitting its q heads.
  uint64_t g = t * groups / tp;
  uint64_t first = (g * tp + groups - 1) / groups;
  uint64_t last = ((g + 1) * tp + groups - 1) / groups;
  uint64_t m_ranks = last - first;
  if (hpg < m_ranks) {
    return InvalidArgumentError(
        "tp " + std::to_string(tp) + " is too large: " + std::to_string(m_ranks) +
        " ranks would share a query group of " + std::to_string(hpg) +
        " q heads");
  }
  s.g0 = g;
  s.g1 = g + 1;
  std::tie(s.qa, s.qb) = SplitRange(hpg, m_ranks, t - first);
  return s;
}

}  // namespace

namespace {

// Fields of a config.json that change the set or shapes of the checkpoint's
// tensors beyond the common ones. A config that sets one of them to a value
// other than its neutral one (absent, null, 0, false, empty, or the value
// given here) is refused unless its architecture's generator reads it.
struct TensorSetField {
  const char* name;
  int64_t neutral;  // besides null / false / 0 / empty
};
constexpr TensorSetField kTensorSetFields[] = {
    {"q_lora_rank", 0},          {"kv_lora_rank", 0},
    {"qk_nope_head_dim", 0},     {"qk_rope_head_dim", 0},
    {"v_head_dim", 0},           {"n_routed_experts", 0},
    {"n_shared_experts", 0},     {"num_experts", 0},
    {"num_local_experts", 0},    {"first_k_dense_replace", 0},
    {"moe_layer_freq", 1},       {"num_nextn_predict_layers", 0},
    {"shared_expert_intermediate_size", 0},
    {"decoder_sparse_step", 1},  {"mlp_only_layers", 0},
    {"mlp_bias", 0},             {"quantization_config", 0},
};

// The fields of kTensorSetFields each architecture's generator reads.
const std::map<std::string, std::set<std::string>>& ReadFields() {
  static const auto* kRead = new std::map<std::string, std::set<std::string>>{
      {"llama", {"quantization_config"}},
      {"mistral", {"quantization_config"}},
      {"qwen2", {"quantization_config"}},
      {"qwen3", {"quantization_config"}},
      {"mixtral", {"num_local_experts", "quantization_config"}},
      {"qwen2_moe",
       {"num_experts", "shared_expert_intermediate_size", "decoder_sparse_step",
        "mlp_only_layers", "quantization_config"}},
      {"qwen3_moe",
       {"num_experts", "decoder_sparse_step", "mlp_only_layers", "quantization_config"}},
      {"deepseek_v3",
       {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
        "v_head_dim", "n_routed_experts", "n_shared_experts", "first_k_dense_replace",
        "moe_layer_freq", "num_nextn_predict_layers", "quantization_config"}},
      {"gpt_oss", {"num_local_experts", "num_experts", "quantization_config"}},
  };
  return *kRead;
}

bool IsNeutral(const Json& v, int64_t neutral) {
  if (v.is_null()) return true;
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    return x == 0 || x == neutral;
  }
  if (v.is_array() || v.is_object()) return v.empty();
  return false;
}

std::string SupportedList() {
  std::string out;
  for (const char* t : kSupportedModelTypes) {
    if (!out.empty()) out += ", ";
    out += t;
  }
  return out;
}

// A list of module name patterns of quantization_config, appended to
// m->unquantized_modules.
Status ReadModuleList(const Json& q, const char* key, ModelConfig* m) {
  auto it = q.find(key);
  if (it == q.end() || it->is_null()) return Status();
  if (!it->is_array()) {
    return InvalidArgumentError(std::string("config.json: quantization_config \"") + key +
                                "\" is not a list");
  }
  for (const Json& v : *it) {
    if (!v.is_string()) {
      return InvalidArgumentError(std::string("config.json: quantization_config \"") + key +
                                  "\" holds " + v.dump());
    }
    m->unquantized_modules.push_back(v.get<std::string>());
  }
  return Status();
}

// FP8 E4M3 with block scales (the DeepSeek-V3 convention).
Status ParseFp8(const Json& q, ModelConfig* m) {
  if (auto it = q.find("fmt"); it != q.end() && !(it->is_string() && *it == "e4m3")) {
    return UnimplementedError("config.json: quantization_config fmt " + it->dump() +
                              " is not \"e4m3\"");
  }
  for (const char* key : {"modules_to_not_convert", "ignored_layers"}) {
    if (auto it = q.find(key); it != q.end() && !IsNeutral(*it, 0)) {
      return UnimplementedError(std::string("config.json: quantization_config \"") + key +
                                "\" is not modelled (the generator quantizes every "
                                "linear weight of the layers but the router)");
    }
  }
  auto it = q.find("weight_block_size");
  if (it == q.end() || !it->is_array() || it->size() != 2 ||
      !(*it)[0].is_number_integer() || !(*it)[1].is_number_integer() ||
      (*it)[0].get<int64_t>() <= 0 || (*it)[1].get<int64_t>() <= 0) {
    return UnimplementedError(
        "config.json: quantization_config fp8 without a weight_block_size [rows, cols] "
        "(per-tensor FP8 checkpoints are not generated)");
  }
  m->fp8_block_rows = static_cast<uint64_t>((*it)[0].get<int64_t>());
  m->fp8_block_cols = static_cast<uint64_t>((*it)[1].get<int64_t>());
  return Status();
}

// NVIDIA ModelOpt NVFP4, as config.json carries hf_quant_config.json's
// "quantization" ({"quant_algo": "NVFP4", "group_size": 16,
// "exclude_modules": [...], "kv_cache_quant_algo": null}) or its
// compressed-tensors-style form ("config_groups", "ignore").
Status ParseNvfp4(const Json& q, ModelConfig* m) {
  std::string algo;
  if (auto it = q.find("quant_algo"); it != q.end() && it->is_string()) {
    algo = it->get<std::string>();
  }
  if (algo != "NVFP4") {
    return UnimplementedError("config.json: quantization_config quant_algo \"" + algo +
                              "\" is not modelled (the generator writes ModelOpt "
                              "\"NVFP4\" checkpoints)");
  }
  auto group_size_ok = [](const Json& owner) {
    auto it = owner.find("group_size");
    return it == owner.end() || it->is_null() ||
           (it->is_number_integer() && it->get<int64_t>() == 16);
  };
  if (!group_size_ok(q)) {
    return UnimplementedError("config.json: quantization_config group_size " +
                              q.at("group_size").dump() + " is not NVFP4's 16");
  }
  if (auto it = q.find("config_groups"); it != q.end() && !it->is_null()) {
    if (!it->is_object()) {
      return InvalidArgumentError("config.json: quantization_config config_groups is not "
                                  "an object");
    }
    for (const auto& [name, group] : it->items()) {
      const Json* w = group.is_object() && group.contains("weights") ? &group.at("weights")
                                                                     : nullptr;
      if (w && w->is_object() && !group_size_ok(*w)) {
        return UnimplementedError("config.json: quantization_config config_groups \"" + name +
                                  "\" weights group_size " + w->at("group_size").dump() +
                                  " is not NVFP4's 16");
      }
    }
  }
  // An FP8 KV cache adds k/v scale tensors to the attention: ModelOpt's
  // "kv_cache_quant_algo": "FP8" names them after k_proj and v_proj (its
  // export, and the names vLLM and SGLang load). The compressed-tensors
  // form ("kv_cache_scheme") is written under other names by other
  // exporters (self_attn.k_scale, the attention module's own), which the
  // config does not tell apart: refused.
  if (auto it = q.find("kv_cache_quant_algo"); it != q.end() && !IsNeutral(*it, 0)) {
    if (!(it->is_string() && it->get<std::string>() == "FP8")) {
      return UnimplementedError(
          "config.json: quantization_config \"kv_cache_quant_algo\": " + it->dump() +
          " is not modelled (the generator writes the "
          "k/v scales of an \"FP8\" KV cache)");
    }
    m->fp8_kv_cache = true;
  }
  if (auto it = q.find("kv_cache_scheme"); it != q.end() && !IsNeutral(*it, 0)) {
    return UnimplementedError(
        "config.json: quantization_config \"kv_cache_scheme\": " + it->dump() +
        " adds KV-cache scale tensors whose names differ "
        "by exporter, which the generator does not model (ModelOpt's "
        "\"kv_cache_quant_algo\": \"FP8\" is)");
  }
  REFIT_RETURN_IF_ERROR(ReadModuleList(q, "exclude_modules", m));
  REFIT_RETURN_IF_ERROR(ReadModuleList(q, "ignore", m));
  m->nvfp4 = true;
  return Status();
}

// quantization_config: FP8 E4M3 with block scales (MLA models), MXFP4
// experts (gpt-oss) or ModelOpt NVFP4 (the others and MLA models).
Status ParseQuantization(const Json& q, const std::string& arch, ModelConfig* m) {
  if (!q.is_object()) return InvalidArgumentError("config.json: quantization_config is not an object");
  std::string method;
  if (auto it = q.find("quant_method"); it != q.end() && it->is_string()) {
    method = it->get<std::string>();
  }
  const bool mla = arch == "deepseek_v3", gpt_oss = arch == "gpt_oss";
  if (method == "fp8" && mla) return ParseFp8(q, m);
  if (method == "modelopt" && !gpt_oss) {
    REFIT_RETURN_IF_ERROR(ParseNvfp4(q, m));
    if (mla && m->fp8_kv_cache) {
      return UnimplementedError(
          "config.json: quantization_config \"kv_cache_quant_algo\": \"FP8\" on multi-head "
          "latent attention (" +
          arch +
          "): the scales of its compressed KV cache are not "
          "modelled");
    }
    return Status();
  }
  if (method == "mxfp4" && gpt_oss) {
    REFIT_RETURN_IF_ERROR(ReadModuleList(q, "modules_to_not_convert", m));
    m->mxfp4 = true;
    return Status();
  }
  const std::string modelled =
      mla       ? "\"fp8\" (FP8 E4M3 with block scales) or \"modelopt\" (NVFP4)"
      : gpt_oss ? "\"mxfp4\" (MXFP4 experts)"
                : "\"modelopt\" (NVFP4)";
  return UnimplementedError(
      "config.json: \"quantization_config\" quant_method \"" + method +
      "\" is not modelled for " + m->model_type + " (the generator writes quant_method " +
      modelled + "); remove quantization_config to generate the unquantized checkpoint's "
      "layout");
}

// Dense-layer schedules of MoE models.
Status ParseDenseLayers(const Json& j, ModelConfig* m) {
  const uint64_t L = m->num_hidden_layers + m->num_nextn_predict_layers;
  if (m->mla) {
    // DeepSeek: layer i is MoE iff i >= first_k_dense_replace and
    // i % moe_layer_freq == 0 (MTP layers included).
    REFIT_ASSIGN_OR_RETURN(uint64_t k, ConfigInt(j, "first_k_dense_replace", false));
    REFIT_ASSIGN_OR_RETURN(uint64_t freq, ConfigInt(j, "moe_layer_freq", false, 1));
    if (freq == 0) return InvalidArgumentError("config.json: moe_layer_freq is 0");
    for (uint64_t i = 0; i < L; ++i) {
      if (i < k || i % freq != 0) m->dense_layers.push_back(i);
    }
    return Status();
  }
  // Qwen-MoE: layer i is MoE iff it is not in mlp_only_layers and
  // (i + 1) % decoder_sparse_step == 0.
  REFIT_ASSIGN_OR_RETURN(uint64_t step, ConfigInt(j, "decoder_sparse_step", false, 1));
  if (step == 0) return InvalidArgumentError("config.json: decoder_sparse_step is 0");
  std::set<uint64_t> only;
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) {
      return InvalidArgumentError("config.json: mlp_only_layers is not a list");
    }
    for (const Json& v : *it) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        return InvalidArgumentError("config.json: mlp_only_layers holds " + v.dump());
      }
      only.insert(static_cast<uint64_t>(v.get<int64_t>()));
    }
  }
  for (uint64_t i = 0; i < L; ++i) {
    if (only.count(i) || (i + 1) % step != 0) m->dense_layers.push_back(i);
  }
  return Status();
}

// ModelOpt NVFP4 on rank `r`: refuses a piece that would cut an NVFP4
// tensor's 16-element scale blocks (a block scale is the amax of its block;
// a TP split of a tensor along whole blocks is fine: its owners take its
// global scale's amax from the trainer, docs/trainer.md), and adds, for
// each local tensor that maps NVFP4 weights, an F32
// `<name>.input_scale` [k] holding their k input_scale scalars in piece
// order (activation calibration the trainer keeps and sends as it is).
Status AddNvfp4InputScales(const std::map<std::string, uint64_t>& nvfp4_cols, RankLayout* r) {
  std::set<std::string> mapped;
  std::vector<LocalTensor> scales;
  for (const LocalTensor& t : r->tensors) {
    std::vector<std::string> weights;
    for (const Piece& p : t.pieces) {
      auto it = nvfp4_cols.find(p.canonical);
      if (it == nvfp4_cols.end()) continue;
      if (mapped.insert(p.canonical).second) weights.push_back(p.canonical);
      // The piece's run along a canonical row (its columns, or its rows
      // when stored transposed) must start and end on a block boundary.
      const bool transposed = p.rows > 1 && p.canon_row_stride == 1;
      const uint64_t run = transposed ? p.rows : p.cols;
      const uint64_t col = p.canon_offset % it->second;
      if (col % 16 != 0 || run % 16 != 0) {
        return InvalidArgumentError(
            "rank " + std::to_string(r->rank) + " would hold logical columns " +
            std::to_string(col) + " to " + std::to_string(col + run) + " of NVFP4 tensor '" +
            p.canonical + "', cutting a 16-element scale block; a block scale is the amax of "
            "its block, so one rank must hold whole blocks: use a tp that splits the tensor "
            "at multiples of 16 columns");
      }
    }
    if (weights.empty()) continue;
    LocalTensor s;
    const size_t dot = t.name.rfind('.');
    s.name = t.name.substr(0, dot == std::string::npos ? t.name.size() : dot) + ".input_scale";
    s.dtype = "F32";
    s.shape = {weights.size()};
    for (uint64_t j = 0; j < weights.size(); ++j) {
      Piece p;
      p.canonical = weights[j].substr(0, weights[j].size() - 6) + "input_scale";
      p.rows = p.cols = 1;
      p.local_offset = j;
      p.local_row_stride = p.local_col_stride = 1;
      p.canon_row_stride = p.canon_col_stride = 1;
      s.pieces.push_back(std::move(p));
    }
    scales.push_back(std::move(s));
  }
  for (LocalTensor& s : scales) r->tensors.push_back(std::move(s));
  return Status();
}

}  // namespace

Result<ModelConfig> ParseModelConfig(std::string_view json) {
  REFIT_ASSIGN_OR_RETURN(Json j, internal::ParseJsonStrict(json, 64, "config.json"));
  if (!j.is_object()) return InvalidArgumentError("config.json: not an object");
  ModelConfig m;
  try {
    if (auto it = j.find("model_type"); it != j.end() && it->is_string()) {
      m.model_type = it->get<std::string>();
    }
    if (m.model_type.empty()) {
      return UnimplementedError("config.json: no \"model_type\"; the generator models " +
                                SupportedList());
    }
    // Kimi-K2 is DeepSeek-V3's architecture under another name.
    const std::string arch = m.model_type == "kimi_k2" ? "deepseek_v3" : m.model_type;
    auto read = ReadFields().find(arch);
    if (read == ReadFields().end()) {
      return UnimplementedError("config.json: model_type \"" + m.model_type +
                                "\" is not an architecture the generator models (it "
                                "models " + SupportedList() + ")");
    }
    for (const TensorSetField& f : kTensorSetFields) {
      auto it = j.find(f.name);
      if (it == j.end() || read->second.count(f.name) || IsNeutral(*it, f.neutral)) continue;
      return UnimplementedError("config.json: \"" + std::string(f.name) + "\": " +
                                it->dump() + " changes the tensor set, and the " +
                                m.model_type + " generator does not model it");
    }
    for (const char* key : {"torch_dtype", "dtype"}) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_string()) continue;
      static const std::map<std::string, std::string> kDtypes = {
          {"bfloat16", "BF16"}, {"float16", "F16"}, {"float32", "F32"}};
      auto d = kDtypes.find(it->get<std::string>());
      if (d == kDtypes.end()) {
        return InvalidArgumentError("config.json: dtype " + it->get<std::string>() +
                                    " is not bfloat16, float16 or float32");
      }
      m.dtype = d->second;
    }
    REFIT_ASSIGN_OR_RETURN(m.hidden_size, ConfigInt(j, "hidden_size", true));
    REFIT_ASSIGN_OR_RETURN(m.intermediate_size, ConfigInt(j, "intermediate_size", true));
    REFIT_ASSIGN_OR_RETURN(m.num_hidden_layers, ConfigInt(j, "num_hidden_layers", true));
    REFIT_ASSIGN_OR_RETURN(m.num_attention_heads,
                           ConfigInt(j, "num_attention_heads", true));
    REFIT_ASSIGN_OR_RETURN(m.num_key_value_heads,
                           ConfigInt(j, "num_key_value_heads", false,
                                     m.num_attention_heads));
    REFIT_ASSIGN_OR_RETURN(m.vocab_size, ConfigInt(j, "vocab_size", true));
    if (m.num_attention_heads == 0 || m.hidden_size == 0) {
      return InvalidArgumentError("config.json: hidden_size and num_attention_heads "
                                  "must be positive");
    }
    REFIT_ASSIGN_OR_RETURN(m.head_dim, ConfigInt(j, "head_dim", false,
                                                 m.hidden_size / m.num_attention_heads));
    REFIT_ASSIGN_OR_RETURN(m.tie_word_embeddings,
                           ConfigBool(j, "tie_word_embeddings", false));
    bool qwen2 = m.model_type.rfind("qwen2", 0) == 0;
    bool qwen3 = m.model_type.rfind("qwen3", 0) == 0;
    m.gpt_oss = arch == "gpt_oss";
    m.mla = arch == "deepseek_v3";
    REFIT_ASSIGN_OR_RETURN(m.attention_bias,
                           ConfigBool(j, "attention_bias", qwen2 || m.gpt_oss));
    m.qk_norm = qwen3;
    if (m.gpt_oss && !m.attention_bias) {
      return UnimplementedError("config.json: gpt_oss with attention_bias false is not "
                                "modelled (its attention has q/k/v/o biases)");
    }
    if (m.mla) {
      if (m.attention_bias) {
        return UnimplementedError("config.json: attention_bias with MLA is not modelled");
      }
      REFIT_ASSIGN_OR_RETURN(m.q_lora_rank, ConfigInt(j, "q_lora_rank", false));
      REFIT_ASSIGN_OR_RETURN(m.kv_lora_rank, ConfigInt(j, "kv_lora_rank", true));
      REFIT_ASSIGN_OR_RETURN(m.qk_nope_head_dim, ConfigInt(j, "qk_nope_head_dim", true));
      REFIT_ASSIGN_OR_RETURN(m.qk_rope_head_dim, ConfigInt(j, "qk_rope_head_dim", true));
      REFIT_ASSIGN_OR_RETURN(m.v_head_dim, ConfigInt(j, "v_head_dim", true));
      REFIT_ASSIGN_OR_RETURN(m.num_experts, ConfigInt(j, "n_routed_experts", false));
      REFIT_ASSIGN_OR_RETURN(m.n_shared_experts, ConfigInt(j, "n_shared_experts", false));
      REFIT_ASSIGN_OR_RETURN(m.num_nextn_predict_layers,
                             ConfigInt(j, "num_nextn_predict_layers", false));
      // MLA has one latent KV; every head reads it.
      m.num_key_value_heads = m.num_attention_heads;
      m.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
      // DeepSeek's router adds e_score_correction_bias to the scores with
      // topk_method "noaux_tc" (DeepSeek-V3, Kimi-K2) and has none otherwise.
      std::string topk = "noaux_tc";
      if (auto it = j.find("topk_method"); it != j.end() && it->is_string()) {
        topk = it->get<std::string>();
      }
      m.e_score_correction_bias = topk == "noaux_tc";
    } else {
      REFIT_ASSIGN_OR_RETURN(uint64_t e1, ConfigInt(j, "num_experts", false));
      REFIT_ASSIGN_OR_RETURN(uint64_t e2, ConfigInt(j, "num_local_experts", false));
      m.num_experts = e1 ? e1 : e2;
      REFIT_ASSIGN_OR_RETURN(m.shared_expert_intermediate_size,
                             ConfigInt(j, "shared_expert_intermediate_size", false));
    }
    if (m.gpt_oss && m.num_experts == 0) {
      return InvalidArgumentError("config.json: gpt_oss without num_local_experts");
    }
    REFIT_ASSIGN_OR_RETURN(m.moe_intermediate_size,
                           ConfigInt(j, "moe_intermediate_size", false,
                                     m.intermediate_size));
    m.mixtral_names = m.model_type == "mixtral";
    if (m.num_experts > 0 && !m.gpt_oss && !m.mixtral_names) {
      REFIT_RETURN_IF_ERROR(ParseDenseLayers(j, &m));
    }
    if (auto it = j.find("quantization_config"); it != j.end() && !it->is_null()) {
      REFIT_RETURN_IF_ERROR(ParseQuantization(*it, arch, &m));
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("config.json: ") + e.what());
  }
  return m;
}

namespace {

// `*` matches any run of characters, everything else itself.
bool GlobMatch(std::string_view pattern, std::string_view s) {
  size_t p = 0, i = 0, star = std::string_view::npos, mark = 0;
  while (i < s.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = i;
    } else if (p < pattern.size() && pattern[p] == s[i]) {
      ++p;
      ++i;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

bool ModuleListed(const std::vector<std::string>& patterns, const std::string& module) {
  for (const std::string& pattern : patterns) {
    for (size_t end = module.find('.');; end = module.find('.', end + 1)) {
      if (GlobMatch(pattern, std::string_view(module).substr(0, end))) return true;
      if (end == std::string::npos) break;
    }
  }
  return false;
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
  Result<ModelConfig> m = ParseModelConfig(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!m.ok()) return m.status().WithContext(path);
  return m;
}

Result<Layout> GenerateLayout(const ModelConfig& m, const Parallelism& par) {
  const uint64_t H = m.hidden_size, hd = m.head_dim, L = m.num_hidden_layers;
  const uint64_t nh = m.num_attention_heads, nkv = m.num_key_value_heads;
  const uint64_t tp = par.tp, pp = par.pp, dp = par.dp, cp = par.cp, ep = par.ep;
  const uint64_t mtp = m.num_nextn_predict_layers;
  if (tp == 0 || pp == 0 || dp == 0 || cp == 0 || ep == 0) {
    return InvalidArgumentError("tp, pp, ep, dp and cp must be at least 1");
  }
  if (H == 0 || hd == 0 || L == 0 || nh == 0 || nkv == 0 || m.vocab_size == 0 ||
      m.intermediate_size == 0) {
    return InvalidArgumentError("model config has a zero size");
  }
  if (nh % nkv != 0) {
    return InvalidArgumentError("num_attention_heads " + std::to_string(nh) +
                                " is not a multiple of num_key_value_heads " +
                                std::to_string(nkv));
  }
  if (pp > L) {
    return InvalidArgumentError("pp " + std::to_string(pp) + " exceeds the " +
                                std::to_string(L) + " layers");
  }
  if (dp % ep != 0) {
    return InvalidArgumentError("ep " + std::to_string(ep) + " does not divide dp " +
                                std::to_string(dp));
  }
  if (par.gate_up == GateUp::kInterleaved && par.gate_up_group == 0) {
    return InvalidArgumentError("interleaved gate/up needs a group size > 0");
  }
  const bool moe = m.num_experts > 0;
  if (moe && ep > m.num_experts) {
    return InvalidArgumentError("ep " + std::to_string(ep) + " exceeds the " +
                                std::to_string(m.num_experts) + " experts");
  }
  if (m.gpt_oss && (!moe || par.gate_up != GateUp::kInterleaved || par.gate_up_group != 1)) {
    return InvalidArgumentError(
        "gpt-oss's gate_up_proj interleaves gate and up one by one: its experts' "
        "linear_fc1 rows must too (gate up interleaved with groups of 1)");
  }
  const uint64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, vd = m.v_head_dim;
  const uint64_t qlr = m.q_lora_rank, kvl = m.kv_lora_rank, qkh = nope + rope;
  if (m.mla) {
    if (kvl == 0 || qkh == 0 || vd == 0) {
      return InvalidArgumentError("MLA needs kv_lora_rank, qk head dims and v_head_dim > 0");
    }
    if (tp > nh) {
      return InvalidArgumentError("tp " + std::to_string(tp) + " exceeds the " +
                                  std::to_string(nh) + " attention heads");
    }
  }
  // Layer i (MTP layers after the last) has a dense MLP.
  std::vector<bool> dense(L + mtp, !moe);
  for (uint64_t i : m.dense_layers) {
    if (i < dense.size()) dense[i] = true;
  }
  const bool any_dense = std::find(dense.begin(), dense.end(), true) != dense.end();
  const uint64_t I = m.intermediate_size;
  const uint64_t Im = moe ? m.moe_intermediate_size : 0;
  const uint64_t Is = !moe ? 0
                      : m.mla ? m.n_shared_experts * Im
                              : m.shared_expert_intermediate_size;
  for (uint64_t n : {any_dense ? I : 0, Im, Is}) {
    if (n != 0 && n < tp) {
      return InvalidArgumentError("tp " + std::to_string(tp) + " exceeds an "
                                  "intermediate size of " + std::to_string(n));
    }
  }
  const uint64_t vmul = std::max<uint64_t>(1, par.vocab_multiple) * tp;
  const uint64_t Vp = (m.vocab_size + vmul - 1) / vmul * vmul;
  const std::string local_dtype = par.local_dtype.empty() ? m.dtype : par.local_dtype;
  const bool fp8 = m.fp8_block_rows > 0 && m.fp8_block_cols > 0;
  // gpt-oss layers whose experts the checkpoint stores as MXFP4, 32 logical
  // columns a scale: each row (H of gate_up, I of down) must be whole
  // blocks, and the TP split of I must fall between blocks.
  std::vector<bool> mx(L + mtp, false);
  for (uint64_t i = 0; i < L + mtp; ++i) {
    mx[i] = m.gpt_oss && m.mxfp4 && !dense[i] &&
            !ModuleListed(m.unquantized_modules,
                          "model.layers." + std::to_string(i) + ".mlp.experts");
  }
  if (auto it = std::find(mx.begin(), mx.end(), true); it != mx.end()) {
    const std::string x =
        "model.layers." + std::to_string(it - mx.begin()) + ".mlp.experts.";
    for (auto [name, cols] : {std::pair<const char*, uint64_t>{"gate_up_proj_blocks", H},
                              {"down_proj_blocks", Im}}) {
      if (cols % 32 != 0) {
        return InvalidArgumentError("MXFP4 tensor '" + x + name + "' would have rows of " +
                                    std::to_string(cols) + " elements, not whole "
                                    "32-element scale blocks");
      }
    }
    for (uint64_t t = 1; t < tp; ++t) {
      const uint64_t at = SplitRange(Im, tp, t).first;
      if (at % 32 != 0) {
        return InvalidArgumentError(
            "tp " + std::to_string(tp) + " splits the " + std::to_string(Im) +
            " columns of MXFP4 tensor '" + x + "down_proj_blocks' (logical [E, H, I]) at "
            "column " + std::to_string(at) + ", inside a 32-element scale block; a scale is "
            "the amax of its block, so one rank must hold the whole block: use a tp that "
            "splits " + std::to_string(Im) + " at multiples of 32");
      }
    }
  }

  Layout layout;
  auto canon = [&](std::string name, std::vector<uint64_t> shape,
                   const std::string& dtype = "") {
    layout.canonical.push_back(
        {std::move(name), dtype.empty() ? m.dtype : dtype, std::move(shape), "", "", 0, 0});
  };
  // A linear weight of a layer: FP8 with its weight_scale_inv when the
  // checkpoint is block-quantized; NVFP4 with its block, global and input
  // scales when it is ModelOpt NVFP4 and the module is not excluded.
  Status packed_error;
  auto linear = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    if (m.nvfp4 && !ModuleListed(m.unquantized_modules, module)) {
      if (cols % 16 != 0 && packed_error.ok()) {
        packed_error = InvalidArgumentError(
            "NVFP4 tensor '" + name + "' would have rows of " + std::to_string(cols) +
            " elements, not whole 16-element scale blocks");
      }
      layout.canonical.push_back(
          {name, "U8", {rows, cols / 2}, module + ".weight_scale", "nvfp4", 0, 0});
      canon(module + ".weight_scale", {rows, cols / 16}, "F8_E4M3");
      canon(module + ".weight_scale_2", {}, "F32");
      canon(module + ".input_scale", {}, "F32");
      return;
    }
    if (!fp8) return canon(name, {rows, cols});
    const uint64_t br = m.fp8_block_rows, bc = m.fp8_block_cols;
    layout.canonical.push_back({name, "F8_E4M3", {rows, cols}, name + "_scale_inv",
                                "per_block", br, bc});
    canon(name + "_scale_inv", {(rows + br - 1) / br, (cols + bc - 1) / bc}, "F32");
  };
  // Canonical names.
  const std::string embed = "model.embed_tokens.weight";
  canon(embed, {m.vocab_size, H});
  if (!m.tie_word_embeddings) canon("lm_head.weight", {m.vocab_size, H});
  canon("model.norm.weight", {H});
  auto mlp_names = [&](const std::string& prefix, bool mixtral) {
    return mixtral ? std::array<std::string, 3>{prefix + "w1.weight", prefix + "w3.weight",
                                                prefix + "w2.weight"}
                   : std::array<std::string, 3>{prefix + "gate_proj.weight",
                                                prefix + "up_proj.weight",
                                                prefix + "down_proj.weight"};
  };
  const std::string moe_block = m.mixtral_names ? "block_sparse_moe." : "mlp.";
  const std::string shared_block = m.mla ? "mlp.shared_experts." : "mlp.shared_expert.";
  auto canon_mlp = [&](const std::array<std::string, 3>& n, uint64_t inter) {
    linear(n[0], inter, H);
    linear(n[1], inter, H);
    linear(n[2], H, inter);
  };
  for (uint64_t i = 0; i < L + mtp; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    canon(p + "input_layernorm.weight", {H});
    canon(p + "post_attention_layernorm.weight", {H});
    if (m.mla) {
      if (qlr) {
        linear(p + "self_attn.q_a_proj.weight", qlr, H);
        canon(p + "self_attn.q_a_layernorm.weight", {qlr});
        linear(p + "self_attn.q_b_proj.weight", nh * qkh, qlr);
      } else {
        linear(p + "self_attn.q_proj.weight", nh * qkh, H);
      }
      linear(p + "self_attn.kv_a_proj_with_mqa.weight", kvl + rope, H);
      canon(p + "self_attn.kv_a_layernorm.weight", {kvl});
      linear(p + "self_attn.kv_b_proj.weight", nh * (nope + vd), kvl);
      linear(p + "self_attn.o_proj.weight", H, nh * vd);
    } else {
      linear(p + "self_attn.q_proj.weight", nh * hd, H);
      linear(p + "self_attn.k_proj.weight", nkv * hd, H);
      linear(p + "self_attn.v_proj.weight", nkv * hd, H);
      linear(p + "self_attn.o_proj.weight", H, nh * hd);
      if (m.fp8_kv_cache) {
        canon(p + "self_attn.k_proj.k_scale", {}, "F32");
        canon(p + "self_attn.v_proj.v_scale", {}, "F32");
      }
    }
    if (m.attention_bias) {
      canon(p + "self_attn.q_proj.bias", {nh * hd});
      canon(p + "self_attn.k_proj.bias", {nkv * hd});
      canon(p + "self_attn.v_proj.bias", {nkv * hd});
    }
    if (m.gpt_oss) {
      canon(p + "self_attn.o_proj.bias", {H});
      canon(p + "self_attn.sinks", {nh});
    }
    if (m.qk_norm) {
      canon(p + "self_attn.q_norm.weight", {hd});
      canon(p + "self_attn.k_norm.weight", {hd});
    }
    if (i >= L) {  // multi-token prediction
      canon(p + "embed_tokens.weight", {m.vocab_size, H});
      canon(p + "enorm.weight", {H});
      canon(p + "hnorm.weight", {H});
      canon(p + "eh_proj.weight", {H, 2 * H});
      canon(p + "shared_head.norm.weight", {H});
      canon(p + "shared_head.head.weight", {m.vocab_size, H});
    }
    if (dense[i]) {
      canon_mlp(mlp_names(p + "mlp.", false), I);
      continue;
    }
    const uint64_t E = m.num_experts;
    if (m.gpt_oss) {
      canon(p + "mlp.router.weight", {E, H});
      canon(p + "mlp.router.bias", {E});
      const std::string x = p + "mlp.experts.";
      if (mx[i]) {
        // Logical [E, rows, cols]: gate_up [E, 2I, H], down [E, H, I].
        for (auto [name, rows, cols] :
             {std::tuple<const char*, uint64_t, uint64_t>{"gate_up_proj", 2 * Im, H},
              {"down_proj", H, Im}}) {
          layout.canonical.push_back({x + name + "_blocks", "U8", {E, rows, cols / 32, 16},
                                      x + name + "_scales", "mxfp4", 0, 0});
          canon(x + name + "_scales", {E, rows, cols / 32}, "U8");
        }
      } else {
        canon(x + "gate_up_proj", {E, H, 2 * Im});
        canon(x + "down_proj", {E, Im, H});
      }
      canon(x + "gate_up_proj_bias", {E, 2 * Im});
      canon(x + "down_proj_bias", {E, H});
      continue;
    }
    canon(p + moe_block + "gate.weight", {E, H});
    if (m.e_score_correction_bias) canon(p + "mlp.gate.e_score_correction_bias", {E}, "F32");
    for (uint64_t e = 0; e < E; ++e) {
      canon_mlp(mlp_names(p + moe_block + "experts." + std::to_string(e) + ".",
                          m.mixtral_names),
                Im);
    }
    if (Is) {
      canon_mlp(mlp_names(p + shared_block, false), Is);
      if (!m.mla) canon(p + "mlp.shared_expert_gate.weight", {1, H});
    }
  }
  REFIT_RETURN_IF_ERROR(packed_error);
  std::sort(layout.canonical.begin(), layout.canonical.end(),
            [](const CanonicalTensor& a, const CanonicalTensor& b) { return a.name < b.name; });
  // Logical columns of each NVFP4 tensor.
  std::map<std::string, uint64_t> nvfp4_cols;
  for (const CanonicalTensor& c : layout.canonical) {
    if (c.scale_kind == "nvfp4") nvfp4_cols[c.name] = c.shape[1] * 2;
  }

  const uint64_t hpg = nh / nkv;
  for (uint64_t stage = 0; stage < pp; ++stage) {
    auto [l0, l1] = SplitRange(L, pp, stage);
    for (uint64_t d = 0; d < dp; ++d) {
      uint64_t e_idx = d % ep;
      for (uint64_t c = 0; c < cp; ++c) {
        for (uint64_t t = 0; t < tp; ++t) {
          RankBuilder b(par, local_dtype);
          REFIT_ASSIGN_OR_RETURN(AttentionShard a, ShardAttention(m, tp, t));
          const uint64_t ng = a.g1 - a.g0, nqg = a.qb - a.qa;
          const uint64_t q0 = a.g0 * hpg + a.qa;  // first local q head (contiguous)
          const uint64_t nq = ng * nqg;
          const uint64_t vrows = Vp / tp, v0 = t * vrows;
          const uint64_t vreal =
              v0 >= m.vocab_size ? 0 : std::min(vrows, m.vocab_size - v0);
          if (stage == 0) {
            b.Add("embedding.word_embeddings.weight", vrows, H, false);
            b.Rect(embed, 1, vreal, H, 0, 0, 0, v0, 0, 0, H);
          }
          // A fused or plain MLP of intermediate size `inter`, TP-split.
          auto mlp = [&](const std::string& local, const std::array<std::string, 3>& hf,
                         uint64_t inter) {
            auto [i0, i1] = SplitRange(inter, tp, t);
            uint64_t n = i1 - i0;
            if (par.gate_up == GateUp::kSeparate) {
              b.Add(local + "linear_fc1_gate.weight", n, H);
              b.Rect(hf[0], 1, n, H, 0, 0, 0, i0, 0, 0, H);
              b.Add(local + "linear_fc1_up.weight", n, H);
              b.Rect(hf[1], 1, n, H, 0, 0, 0, i0, 0, 0, H);
            } else if (par.gate_up == GateUp::kConcat) {
              b.Add(local + "linear_fc1.weight", 2 * n, H);
              b.Rect(hf[0], 1, n, H, 0, 0, 0, i0, 0, 0, H);
              b.Rect(hf[1], 1, n, H, n, 0, 0, i0, 0, 0, H);
            } else {
              uint64_t N = par.gate_up_group, full = n / N, tail = n % N;
              b.Add(local + "linear_fc1.weight", 2 * n, H);
              b.Rect(hf[0], full, N, H, 0, 2 * N, 0, i0, N, 0, H);
              b.Rect(hf[1], full, N, H, N, 2 * N, 0, i0, N, 0, H);
              b.Rect(hf[0], 1, tail, H, 2 * N * full, 0, 0, i0 + N * full, 0, 0, H);
              b.Rect(hf[1], 1, tail, H, 2 * N * full + tail, 0, 0, i0 + N * full, 0, 0,
                     H);
            }
            b.Add(local + "linear_fc2.weight", H, n);
            b.Rect(hf[2], 1, H, n, 0, 0, 0, 0, 0, i0, inter);
          };
          // A replicated 1-D tensor.
          auto norm = [&](const std::string& local, const std::string& hf, uint64_t n,
                          const char* dtype = nullptr) {
            b.Add(local, n, 0, true, dtype);
            b.Rect(hf, 1, n, 1, 0, 0, 0, 0, 0, 0, 1);
          };
          // Multi-head latent attention: heads split over TP; the down
          // projections and their norms replicated.
          auto mla = [&](const std::string& sa, const std::string& hsa) {
            auto [h0, h1] = SplitRange(nh, tp, t);
            const uint64_t k = h1 - h0;
            if (qlr) {
              b.Add(sa + "linear_q_down_proj.weight", qlr, H);
              b.Rect(hsa + "q_a_proj.weight", 1, qlr, H, 0, 0, 0, 0, 0, 0, H);
              norm(sa + "q_layernorm.weight", hsa + "q_a_layernorm.weight", qlr);
              b.Add(sa + "linear_q_up_proj.weight", k * qkh, qlr);
              b.Rect(hsa + "q_b_proj.weight", 1, k * qkh, qlr, 0, 0, 0, h0 * qkh, 0, 0, qlr);
            } else {
              b.Add(sa + "linear_q_proj.weight", k * qkh, H);
              b.Rect(hsa + "q_proj.weight", 1, k * qkh, H, 0, 0, 0, h0 * qkh, 0, 0, H);
            }
            b.Add(sa + "linear_kv_down_proj.weight", kvl + rope, H);
            b.Rect(hsa + "kv_a_proj_with_mqa.weight", 1, kvl + rope, H, 0, 0, 0, 0, 0, 0, H);
            norm(sa + "kv_layernorm.weight", hsa + "kv_a_layernorm.weight", kvl);
            b.Add(sa + "linear_kv_up_proj.weight", k * (nope + vd), kvl);
            b.Rect(hsa + "kv_b_proj.weight", 1, k * (nope + vd), kvl, 0, 0, 0,
                   h0 * (nope + vd), 0, 0, kvl);
            b.Add(sa + "linear_proj.weight", H, k * vd);
            b.Rect(hsa + "o_proj.weight", 1, H, k * vd, 0, 0, 0, 0, 0, h0 * vd, nh * vd);
          };
          // gpt-oss experts: linear_fc1 rows alternate gate and up, as the
          // columns of gate_up_proj [E, H, 2I] do, so one piece maps it (its
          // canonical runs go down the columns). MXFP4 (`packed`): the same
          // rows are rows of the blocks' logical [E, 2I, H], and linear_fc2
          // columns of down's logical [E, H, I].
          auto gpt_oss_expert = [&](const std::string& local, const std::string& hp,
                                    uint64_t e, bool packed) {
            auto [i0, i1] = SplitRange(Im, tp, t);
            const uint64_t n = i1 - i0;
            const std::string x = hp + "mlp.experts.";
            b.Add(local + "linear_fc1.weight", 2 * n, H);
            const uint64_t gu = e * H * 2 * Im + 2 * i0;
            if (packed) {
              b.Rect(x + "gate_up_proj_blocks", 1, 2 * n, H, 0, 0, 0, e * 2 * Im + 2 * i0, 0,
                     0, H);
            } else if (b.transposed()) {
              b.Raw(x + "gate_up_proj", H, 2 * n, 0, 2 * n, gu, 2 * Im, 1);
            } else {
              b.Raw(x + "gate_up_proj", 2 * n, H, 0, H, gu, 1, 2 * Im);
            }
            b.Add(local + "linear_fc1.bias", 2 * n, 0);
            b.Rect(x + "gate_up_proj_bias", 1, 2 * n, 1, 0, 0, 0, e * 2 * Im + 2 * i0, 0, 0, 1);
            b.Add(local + "linear_fc2.weight", H, n);
            const uint64_t dn = e * Im * H + i0 * H;
            if (packed) {
              b.Rect(x + "down_proj_blocks", 1, H, n, 0, 0, 0, e * H, 0, i0, Im);
            } else if (b.transposed()) {
              b.Raw(x + "down_proj", n, H, 0, H, dn, H, 1);
            } else {
              b.Raw(x + "down_proj", H, n, 0, n, dn, 1, H);
            }
            // Row parallel: the bias is added once, replicated over TP.
            b.Add(local + "linear_fc2.bias", H, 0);
            b.Rect(x + "down_proj_bias", 1, H, 1, 0, 0, 0, e * H, 0, 0, 1);
          };
          // One decoder layer: model layer i, local prefix lp.
          auto layer = [&](const std::string& lp, uint64_t i) {
            std::string hp = "model.layers." + std::to_string(i) + ".";
            norm(lp + "input_layernorm.weight", hp + "input_layernorm.weight", H);
            norm(lp + "pre_mlp_layernorm.weight", hp + "post_attention_layernorm.weight", H);
            // Attention.
            const std::string sa = lp + "self_attention.", hsa = hp + "self_attn.";
            if (m.mla) {
              mla(sa, hsa);
            } else {
              for (bool bias : {false, true}) {
                if (bias && !m.attention_bias) continue;
                const std::string suffix = bias ? "bias" : "weight";
                const uint64_t W = bias ? 1 : H;
                const uint64_t ccols = bias ? 1 : H;
                uint64_t cols = bias ? 0 : H;
                if (par.fused_qkv) {
                  uint64_t per = (nqg + 2) * hd;
                  b.Add(sa + "linear_qkv." + suffix, ng * per, cols);
                  b.Rect(hsa + "q_proj." + suffix, ng, nqg * hd, W, 0, per, 0, q0 * hd,
                         hpg * hd, 0, ccols);
                  b.Rect(hsa + "k_proj." + suffix, ng, hd, W, nqg * hd, per, 0, a.g0 * hd,
                         hd, 0, ccols);
                  b.Rect(hsa + "v_proj." + suffix, ng, hd, W, (nqg + 1) * hd, per, 0,
                         a.g0 * hd, hd, 0, ccols);
                } else {
                  b.Add(sa + "linear_q." + suffix, nq * hd, cols);
                  b.Rect(hsa + "q_proj." + suffix, 1, nq * hd, W, 0, 0, 0, q0 * hd, 0, 0,
                         ccols);
                  b.Add(sa + "linear_k." + suffix, ng * hd, cols);
                  b.Rect(hsa + "k_proj." + suffix, 1, ng * hd, W, 0, 0, 0, a.g0 * hd, 0, 0,
                         ccols);
                  b.Add(sa + "linear_v." + suffix, ng * hd, cols);
                  b.Rect(hsa + "v_proj." + suffix, 1, ng * hd, W, 0, 0, 0, a.g0 * hd, 0, 0,
                         ccols);
                }
              }
              if (m.qk_norm) {
                norm(sa + "q_layernorm.weight", hsa + "q_norm.weight", hd);
                norm(sa + "k_layernorm.weight", hsa + "k_norm.weight", hd);
              }
              // The FP8 KV cache's scales: one per layer, on every rank of
              // its stage.
              if (m.fp8_kv_cache) {
                norm(sa + "k_scale", hsa + "k_proj.k_scale", 1, "F32");
                norm(sa + "v_scale", hsa + "v_proj.v_scale", 1, "F32");
              }
              b.Add(sa + "linear_proj.weight", H, nq * hd);
              b.Rect(hsa + "o_proj.weight", 1, H, nq * hd, 0, 0, 0, 0, 0, q0 * hd, nh * hd);
              if (m.gpt_oss) {
                norm(sa + "linear_proj.bias", hsa + "o_proj.bias", H);
                b.Add(sa + "core_attention.softmax_offset", nq, 0);
                b.Rect(hsa + "sinks", 1, nq, 1, 0, 0, 0, q0, 0, 0, 1);
              }
            }
            // MLP.
            if (dense[i]) {
              mlp(lp + "mlp.", mlp_names(hp + "mlp.", false), I);
              return;
            }
            const uint64_t E = m.num_experts;
            const std::string router = m.gpt_oss ? hp + "mlp.router." : hp + moe_block + "gate.";
            b.Add(lp + "mlp.router.weight", E, H);
            b.Rect(router + "weight", 1, E, H, 0, 0, 0, 0, 0, 0, H);
            if (m.gpt_oss) norm(lp + "mlp.router.bias", router + "bias", E);
            if (m.e_score_correction_bias) {
              norm(lp + "mlp.router.expert_bias", router + "e_score_correction_bias", E, "F32");
            }
            auto [e0, e1] = SplitRange(E, ep, e_idx);
            for (uint64_t e = e0; e < e1; ++e) {
              const std::string local =
                  lp + "mlp.experts.local_experts." + std::to_string(e - e0) + ".";
              if (m.gpt_oss) {
                gpt_oss_expert(local, hp, e, mx[i]);
                continue;
              }
              mlp(local,
                  mlp_names(hp + moe_block + "experts." + std::to_string(e) + ".",
                            m.mixtral_names),
                  Im);
            }
            if (Is) {
              mlp(lp + "mlp.shared_experts.", mlp_names(hp + shared_block, false), Is);
              if (!m.mla) {
                b.Add(lp + "mlp.shared_experts.gate_weight", 1, H);
                b.Rect(hp + "mlp.shared_expert_gate.weight", 1, 1, H, 0, 0, 0, 0, 0, 0, H);
              }
            }
          };
          for (uint64_t i = l0; i < l1; ++i) {
            layer("decoder.layers." + std::to_string(i - l0) + ".", i);
          }
          if (stage == pp - 1) {
            b.Add("decoder.final_layernorm.weight", H, 0);
            b.Rect("model.norm.weight", 1, H, 1, 0, 0, 0, 0, 0, 0, 1);
            if (!m.tie_word_embeddings || pp > 1) {
              b.Add("output_layer.weight", vrows, H, false);
              b.Rect(m.tie_word_embeddings ? embed : "lm_head.weight", 1, vreal, H, 0, 0,
                     0, v0, 0, 0, H);
            }
            // Multi-token prediction modules on the last stage, each with its
            // own embedding and output head (the checkpoint stores them per
            // module; a trainer sharing them with the main ones holds the
            // same bits under these names).
            for (uint64_t k = 0; k < mtp; ++k) {
              const std::string mp = "mtp.layers." + std::to_string(k) + ".";
              const std::string hp = "model.layers." + std::to_string(L + k) + ".";
              b.Add(mp + "embed_tokens.weight", vrows, H, false);
              b.Rect(hp + "embed_tokens.weight", 1, vreal, H, 0, 0, 0, v0, 0, 0, H);
              norm(mp + "enorm.weight", hp + "enorm.weight", H);
              norm(mp + "hnorm.weight", hp + "hnorm.weight", H);
              auto [r0, r1] = SplitRange(H, tp, t);
              b.Add(mp + "eh_proj.weight", r1 - r0, 2 * H);
              b.Rect(hp + "eh_proj.weight", 1, r1 - r0, 2 * H, 0, 0, 0, r0, 0, 0, 2 * H);
              layer(mp + "transformer_layer.", L + k);
              norm(mp + "final_layernorm.weight", hp + "shared_head.norm.weight", H);
              b.Add(mp + "output_layer.weight", vrows, H, false);
              b.Rect(hp + "shared_head.head.weight", 1, vreal, H, 0, 0, 0, v0, 0, 0, H);
            }
          }
          RankLayout r;
          r.rank = static_cast<uint32_t>(t + tp * (c + cp * (d + dp * stage)));
          r.tensors = std::move(b.tensors);
          if (!nvfp4_cols.empty()) REFIT_RETURN_IF_ERROR(AddNvfp4InputScales(nvfp4_cols, &r));
          layout.ranks.push_back(std::move(r));
        }
      }
    }
  }
  std::sort(layout.ranks.begin(), layout.ranks.end(),
            [](const RankLayout& a, const RankLayout& b) { return a.rank < b.rank; });
  return layout;
}

}  // namespace refit::layout
