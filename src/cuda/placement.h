// Placement plans: where a receiver GPU keeps each canonical element.
//
// A delta names elements canonically (docs/format.md §1: Hugging Face tensor
// name, flat row-major index). An inference engine stores them otherwise:
// tensor-parallel shards (this GPU holds rows or columns [a, b) and nothing
// else), fused tensors (Megatron QKV interleaved per query group, gate/up
// concatenated or interleaved in groups of rows), transposed storage. A
// TensorPlacement describes one such layout with two piecewise maps:
//
//   canonical flat index i -> (row = i / cols, col = i % cols)
//   destination element = row_map(row) * row_stride + col_map(col) * col_stride
//   destination byte address = base + destination element * width
//
// where row_map and col_map are made of AxisPieces; a row or column no piece
// covers is absent on this GPU and its elements are ignored. A piece maps
// x in [begin, end) to dst + q * block_stride + r with
// (q, r) = divmod(x - begin, block); block = 0 means one block (a plain
// shift), so an interleaved layout costs one piece, not one per group.
//
// The plan is built and validated on the CPU; Flatten() turns it into the
// POD arrays that kernels read (DevicePlacement, DevicePiece), and
// MapElement() is the one mapping routine shared by the CPU reference and
// the kernels. Plans are immutable values once built; thread-compatible.
#ifndef REFIT_CUDA_PLACEMENT_H_
#define REFIT_CUDA_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "refit/status.h"

#if defined(__CUDACC__)
#define REFIT_HOST_DEVICE __host__ __device__
#else
#define REFIT_HOST_DEVICE
#endif

namespace refit::cuda {

struct AxisPiece {
  uint64_t begin = 0;  // canonical coordinates [begin, end)
  uint64_t end = 0;
  uint64_t dst = 0;           // destination coordinate of `begin`
  uint64_t block = 0;         // 0: one block covering the piece
  uint64_t block_stride = 0;  // destination distance between blocks
};

// Sorted, disjoint pieces; coordinates outside every piece are absent.
struct AxisMap {
  std::vector<AxisPiece> pieces;

  // All of [0, n) to itself.
  static AxisMap Identity(uint64_t n);
  // [a, b) to [dst, dst + b - a); everything else absent.
  static AxisMap Slice(uint64_t a, uint64_t b, uint64_t dst = 0);

  std::optional<uint64_t> Map(uint64_t x) const;
};

struct TensorPlacement {
  std::string name;       // canonical (Hugging Face) tensor name
  int width = 0;          // element bytes: 1, 2, 4 or 8
  uint64_t rows = 0;      // canonical shape viewed as [rows, cols]
  uint64_t cols = 0;      // (a 1-D tensor of n elements is [n, 1])
  uint64_t base = 0;      // destination byte address (device or host)
  uint64_t dst_elements = 0;  // elements the destination buffer holds
  uint64_t row_stride = 0;    // destination elements per mapped row step
  uint64_t col_stride = 0;    // destination elements per mapped col step
  AxisMap row_map;
  AxisMap col_map;

  // Destination element of canonical flat index i, or nullopt if absent.
  std::optional<uint64_t> Map(uint64_t i) const;
};

// Layout builders. `base` is the destination buffer's byte address.
// The canonical tensor [rows, cols] stored as is.
TensorPlacement WholePlacement(std::string name, int width, uint64_t rows,
                               uint64_t cols, uint64_t base);
// Stored transposed, as [cols, rows] row-major.
TensorPlacement TransposedPlacement(std::string name, int width, uint64_t rows,
                                    uint64_t cols, uint64_t base);
// Tensor-parallel row shard: this GPU stores rows [a, b) as [b - a, cols].
TensorPlacement RowShardPlacement(std::string name, int width, uint64_t rows,
                                  uint64_t cols, uint64_t a, uint64_t b,
                                  uint64_t base);
// Tensor-parallel column shard: stores columns [a, b) as [rows, b - a].
TensorPlacement ColShardPlacement(std::string name, int width, uint64_t rows,
                                  uint64_t cols, uint64_t a, uint64_t b,
                                  uint64_t base);

// Megatron-style fused QKV: the fused tensor has, for each query group g
// (num_kv_heads groups), the group's q heads (q_per_group * head_dim rows),
// then its k head, then its v head (head_dim rows each); this GPU holds
// groups [g0, g1). `part` is 'q', 'k' or 'v'; the canonical tensor is
// q_proj [num_q_heads * head_dim, cols] or k_proj / v_proj
// [num_kv_heads * head_dim, cols] (cols = 1 for biases).
struct QkvLayout {
  uint64_t num_q_heads = 0;
  uint64_t num_kv_heads = 0;
  uint64_t head_dim = 0;
  uint64_t g0 = 0;  // first group held
  uint64_t g1 = 0;  // one past the last group held
};
Result<TensorPlacement> FusedQkvPlacement(std::string name, int width,
                                          const QkvLayout& layout, char part,
                                          uint64_t cols, uint64_t base);

// Fused gate/up: canonical gate_proj and up_proj are [inter, cols]; this GPU
// holds canonical rows [a, b) of each. group_rows = 0: the fused tensor is
// [gate rows a..b; up rows a..b] (concatenated); group_rows = N: groups of N
// gate rows then N up rows alternate (a, b multiples of N). `part` is 'g' or
// 'u'.
Result<TensorPlacement> FusedGateUpPlacement(std::string name, int width,
                                             uint64_t inter, uint64_t cols,
                                             uint64_t a, uint64_t b,
                                             uint64_t group_rows, char part,
                                             uint64_t base);

// Checks a placement: width, shape, sorted disjoint pieces inside the
// canonical shape, and every mapped element inside dst_elements (so a
// kernel can never write outside the destination buffer).
Status ValidatePlacement(const TensorPlacement& p);

// Kernel-side form: POD, no pointers but `base`.
struct DevicePiece {
  uint64_t begin, end, dst, block, block_stride;
};
struct DevicePlacement {
  uint64_t base;
  uint64_t cols;
  uint64_t row_stride, col_stride;
  uint32_t row_first, row_count;  // pieces[row_first .. +row_count)
  uint32_t col_first, col_count;
  uint32_t width;
  uint32_t reserved;
};

REFIT_HOST_DEVICE inline bool MapAxis(const DevicePiece* pieces, uint32_t first,
                                      uint32_t count, uint64_t x,
                                      uint64_t* out) {
  // Binary search for the last piece with begin <= x.
  uint32_t lo = first, hi = first + count;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (pieces[mid].begin <= x) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo == first) return false;
  const DevicePiece& p = pieces[lo - 1];
  if (x >= p.end) return false;
  const uint64_t d = x - p.begin;
  if (p.block == 0) {
    *out = p.dst + d;
  } else {
    *out = p.dst + (d / p.block) * p.block_stride + d % p.block;
  }
  return true;
}

// Destination byte address of canonical flat index i; false if absent.
REFIT_HOST_DEVICE inline bool MapElement(const DevicePlacement& p,
                                         const DevicePiece* pieces, uint64_t i,
                                         uint64_t* address) {
  const uint64_t row = i / p.cols;
  const uint64_t col = i - row * p.cols;
  uint64_t r, c;
  if (!MapAxis(pieces, p.row_first, p.row_count, row, &r)) return false;
  if (!MapAxis(pieces, p.col_first, p.col_count, col, &c)) return false;
  *address = p.base + (r * p.row_stride + c * p.col_stride) * p.width;
  return true;
}

// A validated set of placements. A canonical tensor may be placed more
// than once (tied weights); every placement receives the update.
class PlacementPlan {
 public:
  // Validates and adds; fails on an invalid placement.
  Status Add(TensorPlacement p);

  const std::vector<TensorPlacement>& placements() const { return list_; }
  // Indices into placements() for a canonical name (empty if none).
  std::span<const uint32_t> Find(const std::string& name) const;

  // Kernel arrays; placement j of placements() is devices[j].
  void Flatten(std::vector<DevicePlacement>* devices,
               std::vector<DevicePiece>* pieces) const;

 private:
  std::vector<TensorPlacement> list_;
  std::map<std::string, std::vector<uint32_t>> by_name_;
};

// Whether canonical elements [start, start + count) of p are present and
// stored contiguously in canonical order; if so, returns their first byte
// address. Range hashes (docs/format.md §2) can be computed in place only
// for such ranges.
std::optional<uint64_t> ContiguousAddress(const TensorPlacement& p,
                                          uint64_t start, uint64_t count);

// Whether any element of [start, start + count) is present.
bool Intersects(const TensorPlacement& p, uint64_t start, uint64_t count);

// CPU reference: applies k records (positions relative to `start`,
// ascending; values k * width little-endian bytes) through p to host
// memory at p.base. xor_kind: XOR the value in, else overwrite.
void ApplyPlacementCpu(const TensorPlacement& p, uint64_t start,
                       std::span<const uint32_t> positions,
                       const uint8_t* values, bool xor_kind);

}  // namespace refit::cuda

#endif  // REFIT_CUDA_PLACEMENT_H_
