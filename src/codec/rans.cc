#include "codec/rans.h"

#include <algorithm>

namespace refit::codec {

void BuildEncPlane(const Model& m, EncPlane* p) {
  const int t = m.t;
  p->shift = static_cast<uint32_t>(32 + t);
  uint32_t c = 0;
  for (int s = 0; s < 256; ++s) {
    const uint32_t f = m.f[s];
    EncSymbol& e = p->sym[s];
    if (f == 0) {
      // Never used: the encoder only codes symbols its model gives f >= 1.
      e = EncSymbol{0, 0, 0, 0};
      continue;
    }
    e.rcp = ((uint64_t{1} << (32 + t)) + f - 1) / f;
    e.x_max = uint64_t{f} << (32 - t);
    e.bias = c;
    e.cmpl = (uint32_t{1} << t) - f;
    c += f;
  }
}

void BuildDecPlane(const Model& m, DecPlane* p) {
  const uint32_t t = static_cast<uint32_t>(m.t);
  p->t = t;
  p->mask = (uint32_t{1} << t) - 1;
  p->slot_symbol.resize(size_t{1} << t);
  p->slot_entry.resize(size_t{1} << t);
  uint32_t c = 0;
  for (int s = 0; s < 256; ++s) {
    const uint32_t f = m.f[s];
    if (f != 0) {
      std::memset(p->slot_symbol.data() + c, s, f);
      uint32_t* entry = p->slot_entry.data() + c;
      for (uint32_t k = 0; k < f; ++k) entry[k] = f | k << 16;
      c += f;
    }
  }
}

int ChooseLanes(uint32_t n_records, uint32_t records_per_lane, bool any_coded) {
  if (!any_coded || n_records == 0) return 1;
  const uint64_t lanes =
      (uint64_t{n_records} + records_per_lane - 1) / records_per_lane;
  return static_cast<int>(
      std::min<uint64_t>(std::max<uint64_t>(lanes, 1), kMaxLanes));
}

Status ParseLanes(std::span<const uint8_t> in, int* lanes) {
  ByteReader r(in);
  const uint32_t L = r.U8();
  if (!r.ok()) return DataLossError("stream truncated before the lane count");
  if (L == 0) return DataLossError("stream has zero lanes");
  std::array<uint64_t, kMaxLanes> size;
  for (uint32_t j = 0; j + 1 < L; ++j) size[j] = r.Varint();
  if (!r.ok()) return DataLossError("stream lane sizes truncated");
  uint64_t left = r.remaining();
  for (uint32_t j = 0; j + 1 < L; ++j) {
    if (size[j] < 4 || size[j] > left) {
      return DataLossError("lane size below 4 or past the stream end");
    }
    left -= size[j];
  }
  if (left < 4) return DataLossError("last lane shorter than its 4-byte state");
  *lanes = static_cast<int>(L);
  return Status::Ok();
}

}  // namespace refit::codec
