// Trainer layouts: how the elements of every trainer-local tensor on every
// rank map to canonical tensors (a Hugging Face checkpoint's tensor name plus
// a row-major flat element index), and which rank owns which canonical
// element. docs/layout.md specifies the JSON form and the rules checked here.
//
// Everything rests on one representation, the Piece: an affine map between a
// 2-D block of a local tensor and a block of a canonical tensor. Tensor
// parallel splits, pipeline renumbering, expert parallelism, fused QKV and
// gate/up, transposed storage, vocab padding and data/context-parallel
// replicas are all lists of pieces.
//
// All functions are pure (LoadLayout reads one file) and thread-safe; the
// structs are plain values. Programs include this header to load and check
// a layout before publishing from one (`refit layout check` does the same).
#ifndef REFIT_LAYOUT_H_
#define REFIT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit::layout {

// An affine map between a 2-D block of a rank's local tensor and a block of a
// canonical tensor: block element (r, c), r < rows, c < cols, is local flat
// element  local_offset + r*local_row_stride + c*local_col_stride
// and canonical flat element  canon_offset + r*canon_row_stride + c*canon_col_stride.
// Exactly one of canon_row_stride / canon_col_stride is 1 when both extents
// are > 1 (the canonical block is a "strided range": contiguous runs at a
// fixed stride); transposed storage has canon_row_stride == 1. 1-D tensors use
// rows == 1.
struct Piece {
  std::string canonical;  // canonical tensor name
  uint64_t rows = 0, cols = 0;
  uint64_t local_offset = 0, local_row_stride = 0, local_col_stride = 0;
  uint64_t canon_offset = 0, canon_row_stride = 0, canon_col_stride = 0;
  bool operator==(const Piece&) const = default;
};

struct LocalTensor {
  std::string name;             // the trainer's own name for it
  std::string dtype;            // safetensors dtype of the local storage ("BF16", "F32", ...)
  std::vector<uint64_t> shape;  // local shape
  // Local elements covered by no piece have no canonical counterpart
  // (padding).
  std::vector<Piece> pieces;
  bool operator==(const LocalTensor&) const = default;
};

struct CanonicalTensor {
  std::string name;
  std::string dtype;  // dtype in the checkpoint ("BF16", "F8_E4M3", ...)
  std::vector<uint64_t> shape;
  // Optional quantization of the checkpoint tensor: empty scale = none.
  // "per_tensor" (scale tensor of 1 element) or "per_block" with
  // block_rows x block_cols; or a packed FP4 format ("mxfp4", "nvfp4";
  // docs/layout.md, section 3), whose pieces map logical (unpacked)
  // elements: see LogicalShape.
  std::string scale;       // name of the canonical scale tensor
  std::string scale_kind;  // "", "per_tensor", "per_block", "mxfp4", "nvfp4"
  uint64_t block_rows = 0, block_cols = 0;
  bool operator==(const CanonicalTensor&) const = default;
};

// Packed FP4 tensors (scale_kind "mxfp4" or "nvfp4") hold two logical
// elements per U8 byte, the even one in the low nibble, and one scale per
// PackedBlock() logical elements along a logical row. Pieces, coverage and
// ownership count logical elements: logical flat element i lives in byte
// i / 2, under scale element i / PackedBlock().
//   mxfp4: shape [..., C/32, 16] -> logical [..., C], blocks of 32;
//   nvfp4: shape [..., K/2]      -> logical [..., K], blocks of 16.
// PackedBlock is 0 and LogicalShape the shape itself for other tensors.
uint64_t PackedBlock(const CanonicalTensor& tensor);
std::vector<uint64_t> LogicalShape(const CanonicalTensor& tensor);
// An "nvfp4" tensor also has a global scale, named as ModelOpt names it:
// `scale` + "_2" (weight_scale -> weight_scale_2), a canonical F32 tensor of
// one element, derived like `scale`. Empty for other tensors.
std::string GlobalScaleName(const CanonicalTensor& tensor);

struct RankLayout {
  uint32_t rank = 0;
  std::vector<LocalTensor> tensors;
  bool operator==(const RankLayout&) const = default;
};

struct Layout {
  std::vector<CanonicalTensor> canonical;
  std::vector<RankLayout> ranks;
  bool operator==(const Layout&) const = default;
};

// One owned region: a sub-block of one piece of one local tensor, same map.
struct OwnedPiece {
  uint32_t tensor = 0;  // index into RankLayout::tensors
  Piece piece;
  bool operator==(const OwnedPiece&) const = default;
};

// Per rank (indexed like Layout::ranks), the regions it owns.
using Ownership = std::vector<std::vector<OwnedPiece>>;

// A strided range of flat element indices: `count` runs of `run` elements,
// the first at `offset`, each `stride` after the one before (stride >= run).
// Contiguous blocks are one run (count 1).
struct Runs {
  uint64_t offset = 0, run = 0, stride = 0, count = 0;
  uint64_t end() const { return offset + (count - 1) * stride + run; }
  uint64_t size() const { return run * count; }
};

// The flat indices that block (rows x cols, strides) starting at `offset`
// covers, as a strided range; nullopt when the block is empty, when neither
// stride is 1 while both extents exceed 1, when the runs overlap each other
// (stride < run), or when the last index overflows.
std::optional<Runs> PieceRuns(uint64_t offset, uint64_t rows, uint64_t cols,
                              uint64_t row_stride, uint64_t col_stride);

struct OwnershipOptions {
  // A replicated region is split among its replicas only into parts of at
  // least this many bytes; smaller regions go whole to the least loaded
  // replica.
  uint64_t min_split_bytes = 64 * 1024;
};

// Parses the JSON form of docs/layout.md. Fails with kInvalidArgument on
// malformed JSON, duplicate keys, missing or mistyped fields, or unknown
// fields. Does not validate (see ValidateLayout).
Result<Layout> ParseLayout(std::string_view json);
// ParseLayout of a file's contents; kNotFound / kUnavailable on I/O errors.
Result<Layout> LoadLayout(const std::string& path);
// The JSON form; ParseLayout(LayoutToJson(l)) == l.
std::string LayoutToJson(const Layout& layout);

// Checks the rules of docs/layout.md, "Validity": known dtypes, canonical
// names known and unique, local names unique per rank, ranks unique, pieces in
// bounds of both tensors, canonical blocks strided ranges, no two pieces of a
// local tensor overlapping, no canonical element mapped twice within a rank,
// every canonical element mapped by some rank (no gaps), and replicas
// consistent (every rank mapping an element maps it from a local tensor of
// the same dtype). Errors (kInvalidArgument) name the rank, local tensor,
// piece, canonical tensor and element or row.
Status ValidateLayout(const Layout& layout);

// Per rank, the sub-pieces it owns (docs/layout.md, section 5): every
// canonical element is owned by exactly one rank. Deterministic, needs no
// communication: every rank computes the same answer from the same layout.
// Pieces with the same canonical block on k ranks (replicas) are cut along
// the piece's rows (its columns when it has one row) into at most k parts of
// about equal size, none smaller than options.min_split_bytes; the largest
// part goes to the replica with the fewest owned bytes so far, which
// balances bytes across replicas. per_block and packed FP4 quantized
// tensors are cut only between quantization blocks; per_tensor ones are not
// cut. Validates first.
// Errors: those of ValidateLayout; kUnimplemented for a quantized tensor
// whose replicas overlap only in part (pieces that differ between replicas).
Result<Ownership> AssignOwnership(const Layout& layout,
                                  const OwnershipOptions& options = {});

// Proves that `owned` covers every canonical element exactly once, with
// interval arithmetic per canonical row (no per-element bitmap), and that
// every owned piece lies inside a piece of its local tensor with the same
// map. Fails (kInvalidArgument) naming the first overlap or gap: the
// canonical tensor, element index, and the ranks involved.
Status CheckCoverage(const Layout& layout, const Ownership& owned);

// Bytes of canonical data a piece maps (rows * cols * canonical width).
uint64_t PieceBytes(const Layout& layout, const Piece& piece);

}  // namespace refit::layout

#endif  // REFIT_LAYOUT_H_
