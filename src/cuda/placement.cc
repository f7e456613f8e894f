#include "cuda/placement.h"

#include <algorithm>
#include <cstring>

namespace refit::cuda {
namespace {

// Largest destination coordinate a map produces, plus one (0 if empty).
uint64_t MapExtent(const AxisMap& m) {
  uint64_t extent = 0;
  for (const AxisPiece& p : m.pieces) {
    if (p.end <= p.begin) continue;
    const uint64_t last = p.end - 1 - p.begin;
    const uint64_t d =
        p.block == 0
            ? p.dst + last
            : p.dst + (last / p.block) * p.block_stride + last % p.block;
    extent = std::max(extent, d + 1);
  }
  return extent;
}

Status ValidateMap(const AxisMap& m, uint64_t n, const char* axis) {
  uint64_t prev_end = 0;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const AxisPiece& p = m.pieces[i];
    if (p.begin >= p.end || p.end > n || (i > 0 && p.begin < prev_end)) {
      return InvalidArgumentError(std::string(axis) + " piece " +
                                  std::to_string(i) +
                                  " is empty, unsorted, overlapping or outside "
                                  "the canonical shape");
    }
    if (p.block != 0 && p.block_stride < p.block) {
      return InvalidArgumentError(std::string(axis) + " piece " +
                                  std::to_string(i) +
                                  " has blocks that overlap (stride < block)");
    }
    // Keep every destination coordinate well below 2^63 so products with
    // strides cannot wrap unnoticed (checked again below with the strides).
    if (p.dst > (uint64_t{1} << 48) || p.block_stride > (uint64_t{1} << 48)) {
      return InvalidArgumentError(std::string(axis) + " piece " +
                                  std::to_string(i) + " maps too far");
    }
    prev_end = p.end;
  }
  return Status::Ok();
}

}  // namespace

AxisMap AxisMap::Identity(uint64_t n) { return Slice(0, n, 0); }

AxisMap AxisMap::Slice(uint64_t a, uint64_t b, uint64_t dst) {
  AxisMap m;
  if (b > a) m.pieces.push_back(AxisPiece{a, b, dst, 0, 0});
  return m;
}

std::optional<uint64_t> AxisMap::Map(uint64_t x) const {
  for (const AxisPiece& p : pieces) {
    if (x < p.begin || x >= p.end) continue;
    const uint64_t d = x - p.begin;
    if (p.block == 0) return p.dst + d;
    return p.dst + (d / p.block) * p.block_stride + d % p.block;
  }
  return std::nullopt;
}

std::optional<uint64_t> TensorPlacement::Map(uint64_t i) const {
  const uint64_t row = i / cols;
  const uint64_t col = i % cols;
  auto r = row_map.Map(row);
  auto c = col_map.Map(col);
  if (!r || !c) return std::nullopt;
  return *r * row_stride + *c * col_stride;
}

TensorPlacement WholePlacement(std::string name, int width, uint64_t rows,
                               uint64_t cols, uint64_t base) {
  TensorPlacement p;
  p.name = std::move(name);
  p.width = width;
  p.rows = rows;
  p.cols = cols;
  p.base = base;
  p.dst_elements = rows * cols;
  p.row_stride = cols;
  p.col_stride = 1;
  p.row_map = AxisMap::Identity(rows);
  p.col_map = AxisMap::Identity(cols);
  return p;
}

TensorPlacement TransposedPlacement(std::string name, int width, uint64_t rows,
                                    uint64_t cols, uint64_t base) {
  TensorPlacement p = WholePlacement(std::move(name), width, rows, cols, base);
  p.row_stride = 1;
  p.col_stride = rows;
  return p;
}

TensorPlacement RowShardPlacement(std::string name, int width, uint64_t rows,
                                  uint64_t cols, uint64_t a, uint64_t b,
                                  uint64_t base) {
  TensorPlacement p = WholePlacement(std::move(name), width, rows, cols, base);
  p.row_map = AxisMap::Slice(a, b, 0);
  p.dst_elements = (b - a) * cols;
  return p;
}

TensorPlacement ColShardPlacement(std::string name, int width, uint64_t rows,
                                  uint64_t cols, uint64_t a, uint64_t b,
                                  uint64_t base) {
  TensorPlacement p = WholePlacement(std::move(name), width, rows, cols, base);
  p.col_map = AxisMap::Slice(a, b, 0);
  p.row_stride = b - a;
  p.dst_elements = rows * (b - a);
  return p;
}

Result<TensorPlacement> FusedQkvPlacement(std::string name, int width,
                                          const QkvLayout& l, char part,
                                          uint64_t cols, uint64_t base) {
  if (l.num_kv_heads == 0 || l.head_dim == 0 ||
      l.num_q_heads % l.num_kv_heads != 0 || l.g0 >= l.g1 ||
      l.g1 > l.num_kv_heads) {
    return InvalidArgumentError("QKV layout: heads must divide into groups "
                                "and 0 <= g0 < g1 <= num_kv_heads");
  }
  const uint64_t qpg = l.num_q_heads / l.num_kv_heads;
  const uint64_t hd = l.head_dim;
  const uint64_t group_rows = (qpg + 2) * hd;  // fused rows per group
  uint64_t per_group = 0;  // canonical rows of this part per group
  uint64_t offset = 0;     // where the part starts inside a fused group
  switch (part) {
    case 'q': per_group = qpg * hd; offset = 0; break;
    case 'k': per_group = hd; offset = qpg * hd; break;
    case 'v': per_group = hd; offset = (qpg + 1) * hd; break;
    default: return InvalidArgumentError("QKV part must be 'q', 'k' or 'v'");
  }
  const uint64_t rows = per_group * l.num_kv_heads;
  TensorPlacement p = WholePlacement(std::move(name), width, rows, cols, base);
  p.row_map.pieces = {AxisPiece{l.g0 * per_group, l.g1 * per_group, offset,
                                per_group, group_rows}};
  p.dst_elements = (l.g1 - l.g0) * group_rows * cols;
  return p;
}

Result<TensorPlacement> FusedGateUpPlacement(std::string name, int width,
                                             uint64_t inter, uint64_t cols,
                                             uint64_t a, uint64_t b,
                                             uint64_t group_rows, char part,
                                             uint64_t base) {
  if (a >= b || b > inter) {
    return InvalidArgumentError("gate/up shard must satisfy a < b <= inter");
  }
  if (part != 'g' && part != 'u') {
    return InvalidArgumentError("gate/up part must be 'g' or 'u'");
  }
  const bool up = part == 'u';
  TensorPlacement p = WholePlacement(std::move(name), width, inter, cols, base);
  const uint64_t held = b - a;
  if (group_rows == 0) {
    p.row_map = AxisMap::Slice(a, b, up ? held : 0);
  } else {
    if (a % group_rows != 0 || b % group_rows != 0) {
      return InvalidArgumentError("gate/up shard bounds must be multiples of "
                                  "the group size");
    }
    p.row_map.pieces = {
        AxisPiece{a, b, up ? group_rows : 0, group_rows, 2 * group_rows}};
  }
  p.dst_elements = 2 * held * cols;
  return p;
}

Status ValidatePlacement(const TensorPlacement& p) {
  if (p.width != 1 && p.width != 2 && p.width != 4 && p.width != 8) {
    return InvalidArgumentError("placement '" + p.name +
                                "': width must be 1, 2, 4 or 8");
  }
  if (p.rows == 0 || p.cols == 0 || p.rows > (uint64_t{1} << 40) ||
      p.cols > (uint64_t{1} << 40) || p.rows * p.cols > (uint64_t{1} << 48)) {
    return InvalidArgumentError("placement '" + p.name +
                                "': shape empty or too large");
  }
  REFIT_RETURN_IF_ERROR(ValidateMap(p.row_map, p.rows, "row"));
  REFIT_RETURN_IF_ERROR(ValidateMap(p.col_map, p.cols, "column"));
  const uint64_t re = MapExtent(p.row_map);
  const uint64_t ce = MapExtent(p.col_map);
  if (re == 0 || ce == 0) return Status::Ok();  // nothing held here
  constexpr uint64_t kLimit = uint64_t{1} << 56;
  if (p.row_stride > kLimit / re || p.col_stride > kLimit / ce) {
    return InvalidArgumentError("placement '" + p.name + "': strides too large");
  }
  const uint64_t last = (re - 1) * p.row_stride + (ce - 1) * p.col_stride;
  if (last >= p.dst_elements) {
    return InvalidArgumentError(
        "placement '" + p.name + "' maps element " + std::to_string(last) +
        " outside its destination of " + std::to_string(p.dst_elements) +
        " elements");
  }
  return Status::Ok();
}

Status PlacementPlan::Add(TensorPlacement p) {
  REFIT_RETURN_IF_ERROR(ValidatePlacement(p));
  by_name_[p.name].push_back(static_cast<uint32_t>(list_.size()));
  list_.push_back(std::move(p));
  return Status::Ok();
}

std::span<const uint32_t> PlacementPlan::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return {};
  return it->second;
}

void PlacementPlan::Flatten(std::vector<DevicePlacement>* devices,
                            std::vector<DevicePiece>* pieces) const {
  devices->clear();
  pieces->clear();
  for (const TensorPlacement& p : list_) {
    DevicePlacement d{};
    d.base = p.base;
    d.cols = p.cols;
    d.row_stride = p.row_stride;
    d.col_stride = p.col_stride;
    d.width = static_cast<uint32_t>(p.width);
    d.row_first = static_cast<uint32_t>(pieces->size());
    d.row_count = static_cast<uint32_t>(p.row_map.pieces.size());
    for (const AxisPiece& a : p.row_map.pieces) {
      pieces->push_back({a.begin, a.end, a.dst, a.block, a.block_stride});
    }
    d.col_first = static_cast<uint32_t>(pieces->size());
    d.col_count = static_cast<uint32_t>(p.col_map.pieces.size());
    for (const AxisPiece& a : p.col_map.pieces) {
      pieces->push_back({a.begin, a.end, a.dst, a.block, a.block_stride});
    }
    devices->push_back(d);
  }
}

namespace {

// The piece holding x, if any.
const AxisPiece* PieceOf(const AxisMap& m, uint64_t x) {
  for (const AxisPiece& p : m.pieces) {
    if (x >= p.begin && x < p.end) return &p;
  }
  return nullptr;
}

// Whether [x0, x1] lies in one piece and one of its blocks (so it maps to
// consecutive destination coordinates).
bool OneRun(const AxisMap& m, uint64_t x0, uint64_t x1) {
  const AxisPiece* p = PieceOf(m, x0);
  if (p == nullptr || x1 >= p->end) return false;
  if (p->block == 0) return true;
  return (x0 - p->begin) / p->block == (x1 - p->begin) / p->block;
}

}  // namespace

std::optional<uint64_t> ContiguousAddress(const TensorPlacement& p,
                                          uint64_t start, uint64_t count) {
  if (count == 0 || start + count > p.rows * p.cols) return std::nullopt;
  const uint64_t last = start + count - 1;
  const uint64_t r0 = start / p.cols, r1 = last / p.cols;
  const uint64_t c0 = start % p.cols, c1 = last % p.cols;
  if (r0 == r1) {
    if (!OneRun(p.col_map, c0, c1) || (c1 > c0 && p.col_stride != 1)) {
      return std::nullopt;
    }
  } else {
    // Whole rows in between: every column must map to [0, cols) in order,
    // and consecutive rows must follow each other.
    if (!OneRun(p.col_map, 0, p.cols - 1) || *p.col_map.Map(0) != 0 ||
        (p.cols > 1 && p.col_stride != 1) || p.row_stride != p.cols ||
        !OneRun(p.row_map, r0, r1)) {
      return std::nullopt;
    }
  }
  auto first = p.Map(start);
  if (!first) return std::nullopt;
  return p.base + *first * static_cast<uint64_t>(p.width);
}

bool Intersects(const TensorPlacement& p, uint64_t start, uint64_t count) {
  if (count == 0) return false;
  const uint64_t last = start + count - 1;
  const uint64_t r0 = start / p.cols, r1 = last / p.cols;
  bool rows = false;
  for (const AxisPiece& a : p.row_map.pieces) {
    if (a.begin <= r1 && a.end > r0) rows = true;
  }
  if (!rows) return false;
  if (r1 - r0 >= 1) return !p.col_map.pieces.empty();
  const uint64_t c0 = start % p.cols, c1 = last % p.cols;
  for (const AxisPiece& a : p.col_map.pieces) {
    if (a.begin <= c1 && a.end > c0) return true;
  }
  return false;
}

void ApplyPlacementCpu(const TensorPlacement& p, uint64_t start,
                       std::span<const uint32_t> positions,
                       const uint8_t* values, bool xor_kind) {
  const size_t w = static_cast<size_t>(p.width);
  uint8_t* base = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(p.base));
  for (size_t r = 0; r < positions.size(); ++r) {
    auto d = p.Map(start + positions[r]);
    if (!d) continue;
    uint8_t* dst = base + *d * w;
    const uint8_t* v = values + r * w;
    if (xor_kind) {
      for (size_t b = 0; b < w; ++b) dst[b] ^= v[b];
    } else {
      std::memcpy(dst, v, w);
    }
  }
}

}  // namespace refit::cuda
