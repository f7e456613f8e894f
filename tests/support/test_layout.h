// Test-only helpers for layouts: move bytes between canonical tensors and
// every rank's local tensors the slow, obvious way (one element at a time,
// straight from the Piece definition in layout.h), so that faster code can be
// checked against them. Header-only; for tests, not for production paths.
#ifndef REFIT_TESTS_SUPPORT_TEST_LAYOUT_H_
#define REFIT_TESTS_SUPPORT_TEST_LAYOUT_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "layout/layout.h"
#include "refit/checkpoint.h"
#include "refit/status.h"

namespace refit::layout::testing {

// Tensor name -> bytes (row-major, little-endian elements).
using TensorBytes = std::map<std::string, std::vector<uint8_t>>;

// Random bytes for every canonical tensor of `l` (seeded), the model the
// layout tests scatter and place: elements of the tensor's dtype, 2 bytes
// where the dtype is unknown.
inline TensorBytes RandomCanonical(const Layout& l, uint64_t seed) {
  std::mt19937_64 rng(seed);
  TensorBytes out;
  DTypeRegistry dtypes;
  for (const CanonicalTensor& c : l.canonical) {
    Result<int> width = dtypes.ElementWidth(c.dtype);
    uint64_t n = width.ok() ? static_cast<uint64_t>(*width) : 2;
    for (uint64_t d : c.shape) n *= d;
    std::vector<uint8_t>& b = out[c.name];
    b.resize(n);
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t x = rng();
      std::memcpy(&b[i], &x, std::min<size_t>(8, n - i));
    }
  }
  return out;
}

namespace detail {

inline Result<uint64_t> Elements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n))
      return InvalidArgumentError("shape overflows");
  }
  return n;
}

// The element width shared by a piece's local and canonical dtypes; the
// helpers copy bits, so the widths must match.
inline Result<int> CopyWidth(const LocalTensor& t, const CanonicalTensor& c) {
  DTypeRegistry dtypes;
  REFIT_ASSIGN_OR_RETURN(int lw, dtypes.ElementWidth(t.dtype));
  REFIT_ASSIGN_OR_RETURN(int cw, dtypes.ElementWidth(c.dtype));
  if (lw != cw) {
    return UnimplementedError(
        "local tensor '" + t.name + "' (" + t.dtype + ") and canonical '" +
        c.name + "' (" + c.dtype +
        ") differ in width; the test helpers copy bits only");
  }
  return lw;
}

inline const CanonicalTensor* FindCanonical(const Layout& l,
                                            const std::string& name) {
  for (const CanonicalTensor& c : l.canonical) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

}  // namespace detail

// Each rank's local tensors (indexed like layout.ranks) filled from the
// canonical tensors' bytes; local elements that no piece maps (padding) are
// `pad` bytes. Validates the layout first; kInvalidArgument when a mapped
// canonical tensor is missing from `canonical` or has the wrong size.
inline Result<std::vector<TensorBytes>> ScatterToRanks(
    const Layout& layout, const TensorBytes& canonical, uint8_t pad = 0xA5) {
  REFIT_RETURN_IF_ERROR(ValidateLayout(layout));
  std::vector<TensorBytes> out(layout.ranks.size());
  for (size_t ri = 0; ri < layout.ranks.size(); ++ri) {
    for (const LocalTensor& t : layout.ranks[ri].tensors) {
      DTypeRegistry dtypes;
      REFIT_ASSIGN_OR_RETURN(int lw, dtypes.ElementWidth(t.dtype));
      REFIT_ASSIGN_OR_RETURN(uint64_t n, detail::Elements(t.shape));
      std::vector<uint8_t>& bytes = out[ri][t.name];
      bytes.assign(n * static_cast<uint64_t>(lw), pad);
      for (const Piece& p : t.pieces) {
        const CanonicalTensor* c = detail::FindCanonical(layout, p.canonical);
        auto src = canonical.find(p.canonical);
        REFIT_ASSIGN_OR_RETURN(uint64_t cn, detail::Elements(c->shape));
        REFIT_ASSIGN_OR_RETURN(int w, detail::CopyWidth(t, *c));
        size_t uw = static_cast<size_t>(w);
        if (src == canonical.end() || src->second.size() != cn * uw) {
          return InvalidArgumentError("canonical bytes of '" + p.canonical +
                                      "' are missing or of the wrong size");
        }
        for (uint64_t r = 0; r < p.rows; ++r) {
          uint64_t l0 = p.local_offset + r * p.local_row_stride;
          uint64_t c0 = p.canon_offset + r * p.canon_row_stride;
          if (p.local_col_stride == 1 && p.canon_col_stride == 1) {  // one run
            std::memcpy(&bytes[l0 * uw], &src->second[c0 * uw], p.cols * uw);
            continue;
          }
          for (uint64_t col = 0; col < p.cols; ++col) {
            uint64_t li = l0 + col * p.local_col_stride;
            uint64_t ci = c0 + col * p.canon_col_stride;
            std::memcpy(&bytes[li * uw], &src->second[ci * uw], uw);
          }
        }
      }
    }
  }
  return out;
}

// The canonical tensors assembled from every rank's local tensors: each
// element from every piece that maps it. kInvalidArgument when a local
// tensor is missing or of the wrong size, when replicas disagree on an
// element (named), or when an element is mapped by nothing. Scale tensors
// (derived) are left out.
inline Result<TensorBytes> AssembleCanonical(
    const Layout& layout, const std::vector<TensorBytes>& local) {
  REFIT_RETURN_IF_ERROR(ValidateLayout(layout));
  if (local.size() != layout.ranks.size()) {
    return InvalidArgumentError(
        "local bytes for " + std::to_string(local.size()) +
        " ranks, layout has " + std::to_string(layout.ranks.size()));
  }
  TensorBytes out;
  std::map<std::string, std::vector<bool>> seen;
  for (const CanonicalTensor& c : layout.canonical) {
    if (!c.scale.empty()) {
      // Its scale tensor is derived; mark it so it is not reported.
      seen[c.scale];
    }
  }
  for (size_t ri = 0; ri < layout.ranks.size(); ++ri) {
    for (const LocalTensor& t : layout.ranks[ri].tensors) {
      auto src = local[ri].find(t.name);
      DTypeRegistry dtypes;
      REFIT_ASSIGN_OR_RETURN(int lw, dtypes.ElementWidth(t.dtype));
      REFIT_ASSIGN_OR_RETURN(uint64_t n, detail::Elements(t.shape));
      if (src == local[ri].end() ||
          src->second.size() != n * static_cast<uint64_t>(lw)) {
        return InvalidArgumentError(
            "rank " + std::to_string(layout.ranks[ri].rank) +
            ": local tensor '" + t.name + "' is missing or of the wrong size");
      }
      for (const Piece& p : t.pieces) {
        const CanonicalTensor* c = detail::FindCanonical(layout, p.canonical);
        REFIT_ASSIGN_OR_RETURN(int w, detail::CopyWidth(t, *c));
        size_t uw = static_cast<size_t>(w);
        REFIT_ASSIGN_OR_RETURN(uint64_t cn, detail::Elements(c->shape));
        std::vector<uint8_t>& dst = out[c->name];
        std::vector<bool>& have = seen[c->name];
        if (dst.empty()) dst.assign(cn * uw, 0), have.assign(cn, false);
        for (uint64_t r = 0; r < p.rows; ++r) {
          uint64_t l0 = p.local_offset + r * p.local_row_stride;
          uint64_t c0 = p.canon_offset + r * p.canon_row_stride;
          if (p.local_col_stride == 1 && p.canon_col_stride == 1 &&
              std::none_of(have.begin() + static_cast<long>(c0),
                           have.begin() + static_cast<long>(c0 + p.cols),
                           [](bool b) { return b; })) {  // one fresh run
            std::memcpy(&dst[c0 * uw], &src->second[l0 * uw], p.cols * uw);
            std::fill(have.begin() + static_cast<long>(c0),
                      have.begin() + static_cast<long>(c0 + p.cols), true);
            continue;
          }
          for (uint64_t col = 0; col < p.cols; ++col) {
            uint64_t li = l0 + col * p.local_col_stride;
            uint64_t ci = c0 + col * p.canon_col_stride;
            const uint8_t* from = &src->second[li * uw];
            if (have[ci] && std::memcmp(&dst[ci * uw], from, uw) != 0) {
              return InvalidArgumentError(
                  "replicas disagree on element " + std::to_string(ci) +
                  " of '" + c->name + "' (rank " +
                  std::to_string(layout.ranks[ri].rank) + ", local tensor '" +
                  t.name + "')");
            }
            std::memcpy(&dst[ci * uw], from, uw);
            have[ci] = true;
          }
        }
      }
    }
  }
  for (const CanonicalTensor& c : layout.canonical) {
    auto it = seen.find(c.name);
    if (it == seen.end()) {
      return InvalidArgumentError("canonical '" + c.name +
                                  "' is mapped by nothing");
    }
    for (size_t i = 0; i < it->second.size(); ++i) {
      if (!it->second[i]) {
        return InvalidArgumentError("element " + std::to_string(i) + " of '" +
                                    c.name + "' is mapped by nothing");
      }
    }
  }
  return out;
}

// The BF16 twin of layout `q`: the same ranks, each packed FP4 tensor
// (mxfp4, nvfp4) a BF16 tensor of its logical shape under its own name, its
// scale tensors gone. The helpers above move a packed layout's bytes through
// its twin; a reference quantizer makes the packed checkpoint from the
// twin's canonical values.
inline Layout UnpackedTwin(const Layout& q) {
  std::set<std::string> scales;
  for (const CanonicalTensor& c : q.canonical) {
    if (PackedBlock(c) == 0) continue;
    scales.insert(c.scale);
    scales.insert(GlobalScaleName(c));
  }
  Layout b;
  b.ranks = q.ranks;
  for (const CanonicalTensor& c : q.canonical) {
    if (scales.count(c.name)) continue;
    if (PackedBlock(c) == 0) {
      b.canonical.push_back(c);
    } else {
      b.canonical.push_back({c.name, "BF16", LogicalShape(c), "", "", 0, 0});
    }
  }
  return b;
}

// config.json of small packed-FP4 models for the generator's tests and the
// rank encoder's (docs/layout.md, section 6). gpt-oss with MXFP4 experts in
// layer 0 and layer 1's listed in modules_to_not_convert (BF16), I = 64
// (two scale blocks), H = `hidden`:
inline std::string SmallGptOssMxfp4Config(uint64_t hidden) {
  return R"({"model_type": "gpt_oss", "hidden_size": )" + std::to_string(hidden) + R"(,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 50, "num_local_experts": 4,
      "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
          "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
          "lm_head", "model.layers.1.mlp.experts"]}})";
}

// ModelOpt NVFP4 as hf_quant_config.json has it, excluding lm_head, layer
// 1's attention and the routers.
inline constexpr char kModelOptNvfp4Quant[] = R"("quantization_config": {
    "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
    "kv_cache_quant_algo": null, "producer": {"name": "modelopt", "version": "0.23.0"},
    "exclude_modules": ["lm_head", "model.layers.1.self_attn*", "model.layers.*.mlp.gate"]})";

// Qwen3-MoE with a dense layer 0 and 4 experts in layer 1, in NVFP4.
inline std::string SmallQwen3MoeNvfp4Config() {
  return R"({"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96,
      "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "num_experts": 4,
      "mlp_only_layers": [0], )" + std::string(kModelOptNvfp4Quant) + "}";
}

}  // namespace refit::layout::testing

#endif  // REFIT_TESTS_SUPPORT_TEST_LAYOUT_H_
