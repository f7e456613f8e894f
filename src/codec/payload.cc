#include "codec/payload.h"

#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>

#include "base/bytes.h"
#include "codec/rans.h"
#include "codec/rans_kernels.h"
#include "codec/sparse_plane.h"
#include "codec/table.h"

namespace refit::codec {
namespace {

bool ValidWidth(int w) { return w == 1 || w == 2 || w == 4 || w == 8; }

Status CheckShape(uint32_t n, int w) {
  if (!ValidWidth(w)) {
    return InvalidArgumentError("element width " + std::to_string(w) +
                                " is not 1, 2, 4 or 8");
  }
  if (n == 0 || n > kMaxChunkElements) {
    return InvalidArgumentError("chunk element count " + std::to_string(n) +
                                " outside 1 .. 2^28");
  }
  return Status::Ok();
}

bool IsSparse(ChunkKind kind) {
  return kind == ChunkKind::kSparseXor || kind == ChunkKind::kSparseOverwrite;
}
bool IsDense(ChunkKind kind) {
  return kind == ChunkKind::kDenseXor || kind == ChunkKind::kRaw;
}

Status CheckSparseArgs(ChunkKind kind, uint32_t n, int w, uint64_t k) {
  if (!IsSparse(kind)) {
    return InvalidArgumentError("chunk kind " +
                                std::to_string(static_cast<int>(kind)) +
                                " is not sparse");
  }
  REFIT_RETURN_IF_ERROR(CheckShape(n, w));
  if (k == 0 || k > n) {
    return InvalidArgumentError("changed count " + std::to_string(k) +
                                " outside 1 .. n = " + std::to_string(n));
  }
  return Status::Ok();
}

// The coded planes of a model list and their lookup tables.
struct CodedPlanes {
  std::vector<int> index;
  std::vector<const EncPlane*> enc;
  std::vector<const DecPlane*> dec;
};

// The kernel that codes eight lanes at a time, or nullptr for the
// portable code alone.
internal::SparseLanesFn LanesKernel(internal::LaneKernel kernel) {
#if defined(REFIT_CODEC_X86)
  if (kernel == internal::LaneKernel::kAvx2) return &internal::EncodeSparseLanesAvx2;
#endif
  (void)kernel;
  return nullptr;
}

// A coded plane's lookups for the lane kernels; false where a frequency or
// the precision falls outside what SparseLanePlane holds.
bool BuildLanePlane(const Model& m, const EncPlane& enc, uint32_t shift,
                    internal::SparseLanePlane* p) {
  if (m.t < 1 || m.t > kMaxPrecision) return false;
  p->t = static_cast<uint32_t>(m.t);
  p->shift = shift;
  for (int s = 0; s < 256; ++s) {
    const uint32_t f = m.f[s];
    if (f >= (uint32_t{1} << 15)) return false;
    p->fb[s] = f | enc.sym[s].bias << 16;
  }
  return true;
}

// The sparse encoder's two passes, specialized on the element width so the
// per-record value copies compile to single loads and stores.
template <int W>
Status EncodeSparseW(internal::SparseLanesFn kernel, ChunkKind kind, uint32_t n,
                     std::span<const uint32_t> positions, const uint8_t* values,
                     const EncodeOptions& opt, std::vector<uint8_t>* out) {
  const uint32_t k = static_cast<uint32_t>(positions.size());
  // Pass 1: validate, find the widest gap, count symbols per plane
  // (histograms in SparsePlane::histogram order). Gap bytes 2 and 3 are
  // rarely non-zero; their zero counts are derived.
  std::vector<Histogram> hist(kSparseGapBytes + W, Histogram{});
  uint32_t max_gap = 0;
  uint64_t zero_values = 0;
  uint64_t prev_end = 0;  // p_{r-1} + 1
  uint64_t high_gaps = 0;
  for (uint32_t r = 0; r < k; ++r) {
    const uint64_t p = positions[r];
    if (p < prev_end || p >= n) {
      return InvalidArgumentError(
          "position " + std::to_string(p) + " of record " + std::to_string(r) +
          " is not ascending or not below n = " + std::to_string(n));
    }
    const uint32_t gap = static_cast<uint32_t>(p - prev_end);
    prev_end = p + 1;
    max_gap = std::max(max_gap, gap);
    ++hist[SparsePlane::Gap(0).histogram()][gap & 0xff];
    ++hist[SparsePlane::Gap(1).histogram()][(gap >> 8) & 0xff];
    if (gap >> 16) {
      ++hist[SparsePlane::Gap(2).histogram()][(gap >> 16) & 0xff];
      ++hist[SparsePlane::Gap(3).histogram()][gap >> 24];
      ++high_gaps;
    }
    uint64_t v = 0;
    std::memcpy(&v, values + static_cast<size_t>(r) * W, W);
    zero_values += v == 0;
    for (int b = 0; b < W; ++b) {
      ++hist[SparsePlane::Value(b).histogram()][(v >> (8 * b)) & 0xff];
    }
  }
  hist[SparsePlane::Gap(2).histogram()][0] += k - high_gaps;
  hist[SparsePlane::Gap(3).histogram()][0] += k - high_gaps;
  if (kind == ChunkKind::kSparseXor && zero_values != 0) {
    return InvalidArgumentError(std::to_string(zero_values) +
                                " sparse XOR values are zero");
  }

  std::vector<Model> models;
  std::vector<uint8_t> header;
  const int gw = ChooseSparseModels(hist, n, k, max_gap, &models, &header);
  const int planes = gw + W;
  std::vector<EncPlane> enc(static_cast<size_t>(planes));
  CodedPlanes coded;
  for (int j = 0; j < planes; ++j) {
    if (!models[j].coded()) continue;
    BuildEncPlane(models[j], &enc[j]);
    coded.index.push_back(j);
    coded.enc.push_back(&enc[j]);
  }
  out->insert(out->end(), header.begin(), header.end());
  const int lanes = ChooseLanes(k, opt.records_per_lane, !coded.index.empty());
  const uint32_t* pos = positions.data();
  // The kernel takes whole groups of eight lanes; the portable loops code
  // the rest.
  const uint32_t L = static_cast<uint32_t>(lanes);
  const uint32_t groups = kernel != nullptr && !coded.index.empty() ? L / 8 : 0;
  std::vector<internal::SparseLanePlane> lane_planes;
  if (groups > 0) {
    lane_planes.resize(coded.index.size());
    for (size_t c = 0; c < coded.index.size(); ++c) {
      const int j = coded.index[c];
      if (!BuildLanePlane(models[j], enc[j], SparsePlaneAt(j, gw).shift(), &lane_planes[c])) {
        lane_planes.clear();
        break;
      }
    }
  }
  const auto bulk = [&](uint32_t rounds, uint16_t* words, uint32_t* state,
                        uint16_t** ptr) -> uint32_t {
    if (lane_planes.empty()) return 0;
    std::array<uint32_t, kMaxLanes> end;
    for (uint32_t j = 0; j < 8 * groups; ++j) end[j] = static_cast<uint32_t>(ptr[j] - words);
    kernel(internal::SparseLaneJob{pos, values, W, L, rounds, groups,
                                   static_cast<int>(lane_planes.size()),
                                   lane_planes.data(), state, end.data(), words});
    for (uint32_t j = 0; j < 8 * groups; ++j) ptr[j] = words + end[j];
    return 8 * groups;
  };
  // Pass 2: symbols are recomputed per record rather than stored; the gap's
  // bytes, then the value's, are the planes in order (SparsePlaneAt).
  EncodeStream(
      k, lanes, coded.index, coded.enc,
      [pos, values, gw](uint32_t i, uint8_t* syms) {
        const uint32_t gap = i == 0 ? pos[0] : pos[i] - pos[i - 1] - 1;
        std::memcpy(syms, &gap, 4);
        std::memcpy(syms + gw, values + static_cast<size_t>(i) * W, W);
      },
      out, bulk);
  return Status::Ok();
}

template <int W>
Status DecodeSparseW(std::span<const uint8_t> stream, ChunkKind kind,
                     uint32_t n, int gw, uint32_t k,
                     const std::vector<Model>& models, uint32_t* positions,
                     uint8_t* values) {
  const int planes = gw + W;
  std::vector<DecPlane> dec(static_cast<size_t>(planes));
  CodedPlanes coded;
  std::array<uint8_t, kMaxPlanes> fixed{};
  for (int j = 0; j < planes; ++j) {
    if (!models[j].coded()) {
      fixed[j] = models[j].symbol;
      continue;
    }
    BuildDecPlane(models[j], &dec[j]);
    coded.index.push_back(j);
    coded.dec.push_back(&dec[j]);
  }
  const uint32_t gap_mask = gw == 4 ? ~0u : (1u << (8 * gw)) - 1;
  const bool xor_kind = kind == ChunkKind::kSparseXor;
  uint64_t next = 0;  // p_{r-1} + 1
  // A record's symbols are its gap's bytes, then its value's (SparsePlaneAt).
  return DecodeStream(stream, k, planes, fixed.data(), coded.index, coded.dec,
                      [&](uint32_t i, const uint8_t* syms) -> const char* {
                        uint32_t gap;
                        std::memcpy(&gap, syms, 4);
                        const uint64_t p = next + (gap & gap_mask);
                        if (p >= n) return "decoded position past the chunk";
                        positions[i] = static_cast<uint32_t>(p);
                        next = p + 1;
                        uint64_t v = 0;
                        std::memcpy(&v, syms + gw, W);
                        if (xor_kind && v == 0) return "zero XOR value";
                        std::memcpy(values + static_cast<size_t>(i) * W, &v, W);
                        return nullptr;
                      });
}

// Reads gw and the sparse models; *rest is the stream that follows.
Status ReadSparseHeader(std::span<const uint8_t> payload, uint32_t n,
                        uint32_t k, int w, int* gw, std::vector<Model>* models,
                        std::vector<size_t>* model_bytes,
                        std::span<const uint8_t>* rest) {
  if (payload.empty()) return DataLossError("sparse payload is empty");
  *gw = payload[0];
  if (*gw < 1 || *gw > 4) {
    return DataLossError("gap width " + std::to_string(*gw) + " outside 1..4");
  }
  size_t off = 1;
  const int planes = *gw + w;
  models->resize(static_cast<size_t>(planes));
  for (int j = 0; j < planes; ++j) {
    size_t used = 0;
    Status s = ReadModel(payload.subspan(off), SparsePlaneContext(j, *gw, n, k),
                         &(*models)[j], &used);
    if (!s.ok()) return s.WithContext("plane " + std::to_string(j));
    if (model_bytes) model_bytes->push_back(used);
    off += used;
  }
  *rest = payload.subspan(off);
  return Status::Ok();
}

template <typename F>
Status DispatchWidth(int w, F&& f) {
  switch (w) {
    case 1:
      return f(std::integral_constant<int, 1>());
    case 2:
      return f(std::integral_constant<int, 2>());
    case 4:
      return f(std::integral_constant<int, 4>());
    default:
      return f(std::integral_constant<int, 8>());
  }
}

// Dense plane modes (section 4.2).
enum DenseMode : uint8_t {
  kDenseConstant = 0,
  kDenseVerbatim = 1,
  kDenseEntropy = 2,
  kDenseZstd = 3,
};

// Byte counts of plane j of n elements of width w, and in *repeats how many
// bytes equal the one before. Four interleaved count tables: in a plane
// dominated by one byte (the high bytes of XOR values) a single table would
// chain every increment through a store and its reload.
Histogram PlaneHistogram(const uint8_t* data, uint32_t n, int w, int j,
                         uint64_t* repeats) {
  std::array<std::array<uint32_t, 256>, 4> counts{};  // n <= 2^28
  const uint8_t* p = data + j;
  const size_t stride = static_cast<size_t>(w);
  uint64_t same = 0;
  uint32_t i = 0;
  uint8_t prev = p[0];
  for (; i + 4 <= n; i += 4) {
    const uint8_t b0 = p[i * stride];
    const uint8_t b1 = p[(i + 1) * stride];
    const uint8_t b2 = p[(i + 2) * stride];
    const uint8_t b3 = p[(i + 3) * stride];
    ++counts[0][b0];
    ++counts[1][b1];
    ++counts[2][b2];
    ++counts[3][b3];
    same += (b0 == prev) + (b1 == b0) + (b2 == b1) + (b3 == b2);
    prev = b3;
  }
  for (; i < n; ++i) {
    const uint8_t b = p[i * stride];
    ++counts[0][b];
    same += b == prev;
    prev = b;
  }
  // Element 0 was compared with itself.
  *repeats = same - 1;
  Histogram hist;
  for (int s = 0; s < 256; ++s) {
    hist[s] = uint64_t{counts[0][s]} + counts[1][s] + counts[2][s] + counts[3][s];
  }
  return hist;
}

// Whether a plane has clearly more repeats than an order-0 model expects
// (sum c^2 / n), the case where zstd's matches can beat rANS. Integer only,
// so the decision is deterministic.
bool WorthTryingZstd(uint64_t repeats, uint32_t n, const Histogram& hist) {
  // n <= 2^28, so every product below fits 64 bits.
  uint64_t expected = 0;
  for (uint64_t c : hist) expected += c * c;
  return repeats * n > expected + uint64_t{n} * n / 16;
}

// Whether zstd beats the order-0 cost (`cost`, in kCostOne units, of the
// whole plane) on a sample at the start of the plane by a clear margin: the
// case of repeating patterns without runs, which the run count misses.
// zstd's output is deterministic for a given level and library version.
bool ZstdSampleWins(const uint8_t* data, uint32_t n, int w, int j,
                    uint64_t cost) {
  constexpr uint32_t kSample = 16384;
  if (n < 4 * kSample) return false;
  std::vector<uint8_t> sample(kSample);
  for (uint32_t i = 0; i < kSample; ++i) sample[i] = data[size_t{i} * w + j];
  std::vector<uint8_t> frame(ZSTD_compressBound(kSample));
  const size_t size =
      ZSTD_compress(frame.data(), frame.size(), sample.data(), kSample, 1);
  if (ZSTD_isError(size)) return false;
  // Scaled to the whole plane, in bits: size * 8 * n / kSample < 0.75 * cost.
  const uint64_t sample_bits = static_cast<uint64_t>(size) * 8 * n / kSample;
  return sample_bits * 4 * kCostOne < cost * 3;
}

void EncodeDensePlane(uint32_t n, int w, int j, const uint8_t* data,
                      const EncodeOptions& opt, std::vector<uint8_t>* out) {
  uint64_t repeats = 0;
  const Histogram hist = PlaneHistogram(data, n, w, j, &repeats);
  int present = 0;
  int symbol = 0;
  for (int s = 0; s < 256; ++s) {
    if (hist[s] != 0) {
      ++present;
      symbol = s;
    }
  }
  if (present == 1) {
    out->push_back(kDenseConstant);
    out->push_back(static_cast<uint8_t>(symbol));
    return;
  }
  std::vector<uint8_t> best;  // empty: verbatim
  size_t best_size = 1 + size_t{n};
  uint64_t cost;
  const Model model = ChooseModel(hist, GapContext{}, &cost);
  if (model.mode == ModelMode::kTable) {
    std::vector<uint8_t> stream;
    EncPlane enc;
    BuildEncPlane(model, &enc);
    const int index = 0;
    const EncPlane* encp = &enc;
    EncodeStream(
        n, ChooseLanes(n, opt.records_per_lane, true),
        std::span<const int>(&index, 1),
        std::span<const EncPlane* const>(&encp, 1),
        [data, w, j](uint32_t i, uint8_t* syms) {
          syms[0] = data[size_t{i} * w + j];
        },
        &stream);
    std::vector<uint8_t> e;
    e.push_back(kDenseEntropy);
    WriteModel(model, &e);
    ByteWriter(&e).Varint(stream.size());
    e.insert(e.end(), stream.begin(), stream.end());
    if (e.size() < best_size) {
      best_size = e.size();
      best = std::move(e);
    }
  }
  if (opt.allow_zstd && (WorthTryingZstd(repeats, n, hist) ||
                         ZstdSampleWins(data, n, w, j, cost))) {
    std::vector<uint8_t> plane(n);
    for (uint32_t i = 0; i < n; ++i) plane[i] = data[size_t{i} * w + j];
    std::vector<uint8_t> frame(ZSTD_compressBound(n));
    const size_t size = ZSTD_compress(frame.data(), frame.size(), plane.data(),
                                      n, opt.zstd_level);
    if (!ZSTD_isError(size)) {
      std::vector<uint8_t> z;
      z.push_back(kDenseZstd);
      ByteWriter(&z).Varint(size);
      if (z.size() + size < best_size) {
        z.insert(z.end(), frame.begin(), frame.begin() + size);
        best_size = z.size();
        best = std::move(z);
      }
    }
  }
  if (best.empty()) {
    out->push_back(kDenseVerbatim);
    for (uint32_t i = 0; i < n; ++i) out->push_back(data[size_t{i} * w + j]);
    return;
  }
  out->insert(out->end(), best.begin(), best.end());
}

// Parses one dense plane from r; decodes it into out when out is non-null,
// and fills *info when info is non-null.
Status ReadDensePlane(ByteReader* r, uint32_t n, int w, int j, uint8_t* out,
                      PlaneInfo* info, uint64_t* table_bytes, int* lanes) {
  const uint8_t* start = r->position();
  const uint8_t mode = r->U8();
  if (!r->ok()) return DataLossError("dense plane mode truncated");
  if (info) {
    info->role = "plane" + std::to_string(j);
    info->symbols = n;
  }
  switch (mode) {
    case kDenseConstant: {
      const uint8_t s = r->U8();
      if (!r->ok()) return DataLossError("constant plane truncated");
      if (out) {
        for (uint32_t i = 0; i < n; ++i) out[size_t{i} * w + j] = s;
      }
      if (info) info->model = "constant";
      break;
    }
    case kDenseVerbatim: {
      std::span<const uint8_t> b = r->Bytes(n);
      if (!r->ok()) return DataLossError("verbatim plane truncated");
      if (out) {
        for (uint32_t i = 0; i < n; ++i) out[size_t{i} * w + j] = b[i];
      }
      if (info) info->model = "verbatim";
      break;
    }
    case kDenseEntropy: {
      Model model;
      size_t used = 0;
      REFIT_RETURN_IF_ERROR(
          ReadModel(std::span<const uint8_t>(r->position(), r->remaining()),
                    GapContext{}, &model, &used));
      r->Bytes(used);
      if (table_bytes) *table_bytes += 1 + used;
      const uint64_t size = r->Varint();
      if (!r->ok()) return DataLossError("entropy plane size truncated");
      if (size > r->remaining()) {
        return DataLossError("entropy plane size " + std::to_string(size) +
                             " past the payload end");
      }
      std::span<const uint8_t> stream = r->Bytes(size);
      if (info) {
        info->model = ModelName(model.mode);
        info->precision_bits = model.t;
        int l = 0;
        REFIT_RETURN_IF_ERROR(ParseLanes(stream, &l));
        *lanes = std::max(*lanes, l);
      }
      if (out) {
        DecPlane dec;
        std::vector<int> index;
        std::vector<const DecPlane*> decs;
        const uint8_t fixed = model.symbol;
        if (model.coded()) {
          BuildDecPlane(model, &dec);
          index.push_back(0);
          decs.push_back(&dec);
        }
        uint8_t* o = out + j;
        const size_t stride = static_cast<size_t>(w);
        REFIT_RETURN_IF_ERROR(DecodeStream(
            stream, n, 1, &fixed, index, decs,
            [o, stride](uint32_t i, const uint8_t* syms) -> const char* {
              o[i * stride] = syms[0];
              return nullptr;
            }));
      }
      break;
    }
    case kDenseZstd: {
      const uint64_t size = r->Varint();
      if (!r->ok()) return DataLossError("zstd plane size truncated");
      if (size > r->remaining()) {
        return DataLossError("zstd plane size " + std::to_string(size) +
                             " past the payload end");
      }
      std::span<const uint8_t> frame = r->Bytes(size);
      if (info) info->model = "zstd";
      const unsigned long long content =
          ZSTD_getFrameContentSize(frame.data(), frame.size());
      if (content != n) {
        return DataLossError("zstd plane frame does not declare " +
                             std::to_string(n) + " bytes");
      }
      if (ZSTD_findFrameCompressedSize(frame.data(), frame.size()) != size) {
        return DataLossError("zstd plane is not exactly one frame");
      }
      if (out) {
        std::vector<uint8_t> scratch;
        uint8_t* dst = out;
        if (w != 1) {
          scratch.resize(n);
          dst = scratch.data();
        }
        const size_t got = ZSTD_decompress(dst, n, frame.data(), frame.size());
        if (ZSTD_isError(got) || got != n) {
          return DataLossError("zstd plane does not decompress to " +
                               std::to_string(n) + " bytes");
        }
        if (w != 1) {
          for (uint32_t i = 0; i < n; ++i) out[size_t{i} * w + j] = dst[i];
        }
      }
      break;
    }
    default:
      return DataLossError("unknown dense plane mode " + std::to_string(mode));
  }
  if (info) info->bytes = static_cast<uint64_t>(r->position() - start);
  return Status::Ok();
}

}  // namespace

namespace internal {

bool LaneKernelSupported(LaneKernel kernel) {
  switch (kernel) {
    case LaneKernel::kPortable:
      return true;
#if defined(REFIT_CODEC_X86)
    // libgcc's check includes the OS having enabled the YMM state.
    case LaneKernel::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2");
#endif
    default:
      return false;
  }
}

Status EncodeSparseWith(LaneKernel kernel, ChunkKind kind, uint32_t n, int w,
                        std::span<const uint32_t> positions,
                        const uint8_t* values, const EncodeOptions& opt,
                        std::vector<uint8_t>* out) {
  if (!LaneKernelSupported(kernel)) {
    return InvalidArgumentError("lane kernel not supported on this CPU");
  }
  REFIT_RETURN_IF_ERROR(CheckSparseArgs(kind, n, w, positions.size()));
  if (values == nullptr || out == nullptr) {
    return InvalidArgumentError("null values or output");
  }
  if (opt.records_per_lane == 0) {
    return InvalidArgumentError("records_per_lane must be >= 1");
  }
  const SparseLanesFn fn = LanesKernel(kernel);
  return DispatchWidth(w, [&](auto width) {
    return EncodeSparseW<decltype(width)::value>(fn, kind, n, positions, values,
                                                 opt, out);
  });
}

}  // namespace internal

Status EncodeSparse(ChunkKind kind, uint32_t n, int w,
                    std::span<const uint32_t> positions, const uint8_t* values,
                    const EncodeOptions& opt, std::vector<uint8_t>* out) {
  // Picked once: EncodeSparse runs per chunk.
  static const internal::LaneKernel best =
      internal::LaneKernelSupported(internal::LaneKernel::kAvx2)
          ? internal::LaneKernel::kAvx2
          : internal::LaneKernel::kPortable;
  return internal::EncodeSparseWith(best, kind, n, w, positions, values, opt,
                                    out);
}

Status DecodeSparse(std::span<const uint8_t> payload, ChunkKind kind,
                    uint32_t n, int w, uint32_t k, uint32_t* positions,
                    uint8_t* values) {
  REFIT_RETURN_IF_ERROR(CheckSparseArgs(kind, n, w, k));
  if (positions == nullptr || values == nullptr) {
    return InvalidArgumentError("null output buffers");
  }
  int gw = 0;
  std::vector<Model> models;
  std::span<const uint8_t> stream;
  REFIT_RETURN_IF_ERROR(
      ReadSparseHeader(payload, n, k, w, &gw, &models, nullptr, &stream));
  return DispatchWidth(w, [&](auto width) {
    return DecodeSparseW<decltype(width)::value>(stream, kind, n, gw, k, models,
                                                 positions, values);
  });
}

Status EncodeDense(uint32_t n, int w, const uint8_t* data,
                   const EncodeOptions& opt, std::vector<uint8_t>* out) {
  REFIT_RETURN_IF_ERROR(CheckShape(n, w));
  if (data == nullptr || out == nullptr) {
    return InvalidArgumentError("null data or output");
  }
  if (opt.records_per_lane == 0) {
    return InvalidArgumentError("records_per_lane must be >= 1");
  }
  for (int j = 0; j < w; ++j) EncodeDensePlane(n, w, j, data, opt, out);
  return Status::Ok();
}

Status DecodeDense(std::span<const uint8_t> payload, uint32_t n, int w,
                   uint8_t* out) {
  REFIT_RETURN_IF_ERROR(CheckShape(n, w));
  if (out == nullptr) return InvalidArgumentError("null output buffer");
  ByteReader r(payload);
  for (int j = 0; j < w; ++j) {
    Status s = ReadDensePlane(&r, n, w, j, out, nullptr, nullptr, nullptr);
    if (!s.ok()) return s.WithContext("dense plane " + std::to_string(j));
  }
  if (r.remaining() != 0) {
    return DataLossError(std::to_string(r.remaining()) +
                         " bytes left after the last dense plane");
  }
  return Status::Ok();
}

Result<PayloadInfo> DescribePayload(std::span<const uint8_t> payload,
                                    ChunkKind kind, uint32_t n, int w,
                                    uint32_t k) {
  PayloadInfo info;
  if (IsDense(kind)) {
    REFIT_RETURN_IF_ERROR(CheckShape(n, w));
    ByteReader r(payload);
    for (int j = 0; j < w; ++j) {
      PlaneInfo plane;
      Status s = ReadDensePlane(&r, n, w, j, nullptr, &plane, &info.table_bytes,
                                &info.lanes);
      if (!s.ok()) return s.WithContext("dense plane " + std::to_string(j));
      info.planes.push_back(std::move(plane));
    }
    if (r.remaining() != 0) {
      return DataLossError(std::to_string(r.remaining()) +
                           " bytes left after the last dense plane");
    }
    return info;
  }
  REFIT_RETURN_IF_ERROR(CheckSparseArgs(kind, n, w, k));
  int gw = 0;
  std::vector<Model> models;
  std::vector<size_t> model_bytes;
  std::span<const uint8_t> stream;
  REFIT_RETURN_IF_ERROR(
      ReadSparseHeader(payload, n, k, w, &gw, &models, &model_bytes, &stream));
  REFIT_RETURN_IF_ERROR(ParseLanes(stream, &info.lanes));
  info.gap_width = gw;
  for (size_t j = 0; j < models.size(); ++j) {
    const SparsePlane sp = SparsePlaneAt(static_cast<int>(j), gw);
    PlaneInfo plane;
    plane.role = (sp.is_gap ? "gap" : "value") + std::to_string(sp.byte);
    plane.model = ModelName(models[j].mode);
    plane.precision_bits = models[j].coded() ? models[j].t : 0;
    plane.symbols = k;
    info.planes.push_back(std::move(plane));
    info.table_bytes += model_bytes[j];
  }
  return info;
}

int GapWidthFor(uint32_t max_gap) {
  if (max_gap < (1u << 8)) return 1;
  if (max_gap < (1u << 16)) return 2;
  if (max_gap < (1u << 24)) return 3;
  return 4;
}

}  // namespace refit::codec
