// `refit bench peers`: refit next to the delta schemes that RL systems use
// today, on the same model, the same steps and the same (modelled) link, in
// one run. Each scheme is written here from its published description; none
// is a copy of its project's code:
//
//   nemo-dcr   changed positions as gaps (16-bit when every gap of a bucket
//              fits, else 32-bit) followed by the 16-bit XOR values, zstd
//              level 1, in buckets of 512 MiB of weights;
//   overwrite  a dense array of the new values with every unchanged element
//              masked by a NaN pattern the target does not hold (the
//              Miles / slime style), zstd level 3, same buckets;
//   xor-lz4    the dense XOR plane, LZ4, then zstd level 3 over the LZ4
//              output (the humans& style: the CPU equivalent of their GPU
//              codec), same buckets;
//   full       the weights themselves, uncompressed;
//   refit      refit's chunks (EncodeChunkRange, ApplyChunkInPlace): the
//              range hashes before and after each chunk included.
//
// Every scheme runs on --threads cores at each end (each thread on its
// share of the tensors, with its own scratch), encode and decode + apply
// timed separately on in-memory weights; decode + apply writes into a copy
// of the base, which must then equal the target bit for bit. End to end at
// a link rate is encode + payload / link + decode + apply, one after the
// other (no overlap, the same for every scheme); refit's own pipelined path
// through a store is what `refit bench sync` measures.
#include <fmt/format.h>
#include <lz4.h>
#include <CLI/CLI.hpp>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "delta/apply.h"
#include "delta/encoder.h"
#include "refit/checkpoint.h"
#include "synth.h"

namespace refit::cli {
namespace {

constexpr uint64_t kBucketElements = uint64_t{256} << 20;  // 512 MiB of BF16
constexpr int kRuns = 3;

struct PeersArgs {
  double size_mib = 1024;
  std::vector<std::string> rates = {"0.01", "0.03"};
  std::vector<double> link_gbit = {1, 10};
  std::string fixtures;
  uint64_t seed = 1;
  double chunk_mib = 8;
  int threads = 1;
  bool json = false;
};

// A model as one flat array of BF16 bit patterns, with its tensors' extents.
struct Flat {
  std::vector<uint16_t> bits;
  std::vector<std::pair<uint64_t, uint64_t>> tensors;  // (offset, count)
};

// A scheme's share of the model: whole tensors, contiguous in the flat
// arrays; a, b and w are the base, the target and the copy being applied.
struct Part {
  std::span<const uint16_t> a, b;
  std::span<uint16_t> w;
  std::vector<std::pair<uint64_t, uint64_t>> tensors;  // relative to the part
};

// Splits the model into `n` parts of about equal elements.
std::vector<Part> Split(const Flat& base, const Flat& target, Flat* work, int n) {
  std::vector<Part> parts;
  const uint64_t total = base.bits.size();
  size_t t = 0;
  for (int i = 0; i < n && t < base.tensors.size(); ++i) {
    const uint64_t begin = base.tensors[t].first;
    const uint64_t goal = total * static_cast<uint64_t>(i + 1) / static_cast<uint64_t>(n);
    Part part;
    while (t < base.tensors.size() &&
           (part.tensors.empty() || base.tensors[t].first < goal || i == n - 1)) {
      part.tensors.emplace_back(base.tensors[t].first - begin, base.tensors[t].second);
      ++t;
    }
    const uint64_t end = t < base.tensors.size() ? base.tensors[t].first : total;
    part.a = std::span<const uint16_t>(base.bits).subspan(begin, end - begin);
    part.b = std::span<const uint16_t>(target.bits).subspan(begin, end - begin);
    part.w = std::span<uint16_t>(work->bits).subspan(begin, end - begin);
    parts.push_back(std::move(part));
  }
  return parts;
}

Flat Flatten(const SynthModel& m) {
  Flat f;
  f.bits.reserve(m.elements());
  for (const SynthTensor& t : m.tensors) {
    f.tensors.emplace_back(f.bits.size(), t.data.size());
    f.bits.insert(f.bits.end(), t.data.begin(), t.data.end());
  }
  return f;
}

Result<Flat> FlattenCheckpoint(const std::string& path,
                               const std::vector<std::string>& names) {
  REFIT_ASSIGN_OR_RETURN(Checkpoint c,
                         Checkpoint::Open(path, Checkpoint::Mode::kReadOnly));
  Flat f;
  for (const std::string& name : names) {
    std::optional<size_t> i = c.IndexOf(name);
    if (!i || c.tensors()[*i].element_width != 2) {
      return InvalidArgumentError(
          fmt::format("{}: no 16-bit tensor '{}'", path, name));
    }
    std::span<const uint8_t> d = c.Data(*i);
    const uint64_t n = d.size() / 2;
    f.tensors.emplace_back(f.bits.size(), n);
    f.bits.resize(f.bits.size() + n);
    std::memcpy(f.bits.data() + f.tensors.back().first, d.data(), d.size());
  }
  return f;
}

// A byte buffer that grows without initializing (a compressor's output
// bound is large and mostly unused) and keeps its memory across runs, so
// that repeated runs measure the codec and not the kernel's page faults.
class Buffer {
 public:
  uint8_t* Grow(size_t n) {
    if (size_ + n > cap_) {
      const size_t cap = std::max(size_ + n, 2 * cap_);
      std::unique_ptr<uint8_t[]> next(new uint8_t[cap]);
      if (size_ != 0) std::memcpy(next.get(), p_.get(), size_);
      p_ = std::move(next);
      cap_ = cap;
    }
    size_ += n;
    return p_.get() + size_ - n;
  }
  void Shrink(size_t size) { size_ = size; }
  void Clear() { size_ = 0; }
  size_t size() const { return size_; }
  uint8_t* data() { return p_.get(); }
  std::span<const uint8_t> span() const { return {p_.get(), size_}; }

 private:
  std::unique_ptr<uint8_t[]> p_;
  size_t cap_ = 0, size_ = 0;
};

// What a scheme does: encode base -> target into a payload, and apply a
// payload to a copy of the base. Both may keep scratch memory between runs.
struct Scheme {
  std::string name;
  std::string what;
  std::function<Result<std::span<const uint8_t>>(const Part& part)> encode;
  std::function<Status(std::span<const uint8_t> payload, const Part& part)> apply;
};

// Payloads of the bucketed schemes: per bucket, u64 compressed size, then
// the compressed bytes.
void PutU64(Buffer* out, uint64_t v) {
  uint8_t* p = out->Grow(8);
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

Result<uint64_t> GetU64(std::span<const uint8_t> in, size_t* at) {
  if (in.size() - *at < 8) return DataLossError("truncated payload");
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{in[*at + i]} << (8 * i);
  *at += 8;
  return v;
}

// Appends u64 raw size, u64 compressed size and the zstd frame of `raw`.
Status AppendZstd(std::span<const uint8_t> raw, int level, Buffer* out) {
  PutU64(out, raw.size());
  const size_t at = out->size();
  PutU64(out, 0);
  const size_t bound = ZSTD_compressBound(raw.size());
  uint8_t* z = out->Grow(bound);
  const size_t n = ZSTD_compress(z, bound, raw.data(), raw.size(), level);
  if (ZSTD_isError(n)) return InternalError(ZSTD_getErrorName(n));
  out->Shrink(at + 8 + n);
  for (int i = 0; i < 8; ++i) out->data()[at + i] = static_cast<uint8_t>(n >> (8 * i));
  return Status();
}

// The next zstd frame of `in` at *at, decompressed into *out.
Status TakeZstd(std::span<const uint8_t> in, size_t* at, Buffer* out) {
  REFIT_ASSIGN_OR_RETURN(uint64_t raw, GetU64(in, at));
  REFIT_ASSIGN_OR_RETURN(uint64_t n, GetU64(in, at));
  if (in.size() - *at < n) return DataLossError("truncated payload");
  out->Clear();
  const size_t got = ZSTD_decompress(out->Grow(raw), raw, in.data() + *at, n);
  if (ZSTD_isError(got) || got != raw) return DataLossError("bad zstd frame");
  *at += n;
  return Status();
}

template <typename T>
void PutArray(Buffer* out, const std::vector<T>& v) {
  if (!v.empty()) std::memcpy(out->Grow(v.size() * sizeof(T)), v.data(), v.size() * sizeof(T));
}

// Calls fn(begin, end) for each bucket of the flat model.
template <typename Fn>
Status ForBuckets(uint64_t n, Fn&& fn) {
  for (uint64_t b = 0; b < n; b += kBucketElements) {
    REFIT_RETURN_IF_ERROR(fn(b, std::min(n, b + kBucketElements)));
  }
  return Status();
}

// Scratch a scheme keeps between runs.
struct State {
  Buffer out, raw, lz;
  std::vector<uint32_t> gaps;
  std::vector<uint16_t> gaps16, values, dense;
};

Scheme NemoDcr() {
  auto st = std::make_shared<State>();
  Scheme s{"nemo-dcr", "16/32-bit gaps + 16-bit XOR values, zstd -1, 512 MiB buckets",
           nullptr, nullptr};
  s.encode = [st](const Part& p) -> Result<std::span<const uint8_t>> {
    st->out.Clear();
    REFIT_RETURN_IF_ERROR(ForBuckets(p.a.size(), [&](uint64_t lo, uint64_t hi) {
      st->gaps.clear();
      st->values.clear();
      uint64_t last = lo;
      uint32_t widest = 0;
      for (uint64_t i = lo; i < hi; ++i) {
        const uint16_t x = p.a[i] ^ p.b[i];
        if (x == 0) continue;
        const uint32_t gap = static_cast<uint32_t>(i - last);
        widest = std::max(widest, gap);
        st->gaps.push_back(gap);
        st->values.push_back(x);
        last = i;
      }
      const bool narrow = widest <= 0xFFFF;
      st->raw.Clear();
      *st->raw.Grow(1) = narrow ? 2 : 4;
      PutU64(&st->raw, st->gaps.size());
      if (narrow) {
        st->gaps16.assign(st->gaps.begin(), st->gaps.end());
        PutArray(&st->raw, st->gaps16);
      } else {
        PutArray(&st->raw, st->gaps);
      }
      PutArray(&st->raw, st->values);
      return AppendZstd(st->raw.span(), 1, &st->out);
    }));
    return st->out.span();
  };
  s.apply = [st](std::span<const uint8_t> in, const Part& p) -> Status {
    size_t at = 0;
    return ForBuckets(p.w.size(), [&](uint64_t lo, uint64_t hi) -> Status {
      REFIT_RETURN_IF_ERROR(TakeZstd(in, &at, &st->raw));
      std::span<const uint8_t> raw = st->raw.span();
      size_t head = 1;
      if (raw.empty()) return DataLossError("empty bucket");
      const uint64_t width = raw[0];
      REFIT_ASSIGN_OR_RETURN(uint64_t k, GetU64(raw, &head));
      if (raw.size() != head + k * (width + 2)) return DataLossError("bad bucket");
      const uint8_t* g = raw.data() + head;
      const uint8_t* v = g + k * width;
      uint64_t pos = lo;
      for (uint64_t j = 0; j < k; ++j) {
        uint32_t gap = 0;
        std::memcpy(&gap, g + j * width, width);
        uint16_t x;
        std::memcpy(&x, v + 2 * j, 2);
        pos += gap;
        if (pos >= hi) return DataLossError("gap past the bucket");
        p.w[pos] ^= x;
      }
      return Status();
    });
  };
  return s;
}

Scheme Overwrite() {
  auto st = std::make_shared<State>();
  Scheme s{"overwrite", "new values, unchanged masked by a NaN, zstd -3, 512 MiB buckets",
           nullptr, nullptr};
  s.encode = [st](const Part& p) -> Result<std::span<const uint8_t>> {
    // A NaN pattern the target does not hold marks "unchanged".
    std::vector<bool> used(0x80);
    for (uint16_t v : p.b) {
      if ((v & 0xFF80) == 0x7F80 && (v & 0x7F) != 0) used[v & 0x7F] = true;
    }
    auto free_nan = std::find(used.begin() + 1, used.end(), false);
    if (free_nan == used.end()) {
      return FailedPreconditionError("the target holds every positive NaN");
    }
    const uint16_t mask = static_cast<uint16_t>(0x7F80 | (free_nan - used.begin()));
    st->out.Clear();
    PutU64(&st->out, mask);
    REFIT_RETURN_IF_ERROR(ForBuckets(p.a.size(), [&](uint64_t lo, uint64_t hi) {
      st->dense.assign(hi - lo, mask);
      for (uint64_t i = lo; i < hi; ++i) {
        if (p.a[i] != p.b[i]) st->dense[i - lo] = p.b[i];
      }
      return AppendZstd({reinterpret_cast<const uint8_t*>(st->dense.data()),
                         2 * st->dense.size()},
                        3, &st->out);
    }));
    return st->out.span();
  };
  s.apply = [st](std::span<const uint8_t> in, const Part& p) -> Status {
    size_t at = 0;
    REFIT_ASSIGN_OR_RETURN(uint64_t mask, GetU64(in, &at));
    return ForBuckets(p.w.size(), [&](uint64_t lo, uint64_t hi) -> Status {
      REFIT_RETURN_IF_ERROR(TakeZstd(in, &at, &st->raw));
      if (st->raw.size() != 2 * (hi - lo)) return DataLossError("bad bucket");
      const uint8_t* raw = st->raw.data();
      for (uint64_t i = lo; i < hi; ++i) {
        uint16_t v;
        std::memcpy(&v, raw + 2 * (i - lo), 2);
        if (v != mask) p.w[i] = v;
      }
      return Status();
    });
  };
  return s;
}

Scheme XorLz4() {
  auto st = std::make_shared<State>();
  Scheme s{"xor-lz4", "dense XOR plane, LZ4, then zstd -3, 512 MiB buckets", nullptr,
           nullptr};
  s.encode = [st](const Part& p) -> Result<std::span<const uint8_t>> {
    st->out.Clear();
    REFIT_RETURN_IF_ERROR(ForBuckets(p.a.size(), [&](uint64_t lo, uint64_t hi) {
      std::vector<uint16_t>& x = st->dense;
      x.resize(hi - lo);
      for (uint64_t i = lo; i < hi; ++i) x[i - lo] = p.a[i] ^ p.b[i];
      const int src = static_cast<int>(2 * x.size());
      const int bound = LZ4_compressBound(src);
      st->lz.Clear();
      uint8_t* block = st->lz.Grow(static_cast<size_t>(bound));
      const int n = LZ4_compress_default(reinterpret_cast<const char*>(x.data()),
                                         reinterpret_cast<char*>(block), src, bound);
      if (n <= 0) return InternalError("LZ4 failed");
      st->lz.Shrink(static_cast<size_t>(n));
      PutU64(&st->out, static_cast<uint64_t>(src));
      return AppendZstd(st->lz.span(), 3, &st->out);
    }));
    return st->out.span();
  };
  s.apply = [st](std::span<const uint8_t> in, const Part& p) -> Status {
    size_t at = 0;
    return ForBuckets(p.w.size(), [&](uint64_t lo, uint64_t hi) -> Status {
      REFIT_ASSIGN_OR_RETURN(uint64_t src, GetU64(in, &at));
      if (src != 2 * (hi - lo)) return DataLossError("bad bucket");
      REFIT_RETURN_IF_ERROR(TakeZstd(in, &at, &st->lz));
      std::vector<uint16_t>& x = st->dense;
      x.resize(hi - lo);
      const int got = LZ4_decompress_safe(reinterpret_cast<const char*>(st->lz.data()),
                                          reinterpret_cast<char*>(x.data()),
                                          static_cast<int>(st->lz.size()),
                                          static_cast<int>(src));
      if (got != static_cast<int>(src)) return DataLossError("bad LZ4 block");
      for (uint64_t i = lo; i < hi; ++i) p.w[i] ^= x[i - lo];
      return Status();
    });
  };
  return s;
}

// The weights as they are: nothing to encode (they are sent from where they
// lie); applying is copying the received bytes into place.
Scheme Full() {
  Scheme s{"full", "the weights, uncompressed", nullptr, nullptr};
  s.encode = [](const Part& p) -> Result<std::span<const uint8_t>> {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(p.b.data()),
                                    2 * p.b.size());
  };
  s.apply = [](std::span<const uint8_t> in, const Part& p) -> Status {
    if (in.size() != 2 * p.w.size()) return DataLossError("wrong size");
    std::memcpy(p.w.data(), in.data(), in.size());
    return Status();
  };
  return s;
}

// refit's chunks, as the publisher makes them, framed by a u64 size each.
Scheme Refit(uint64_t chunk_elements) {
  struct RefitState {
    Buffer out;
    EncodeScratch encode;
    ChunkResult chunk;
    ApplyScratch apply;
  };
  auto st = std::make_shared<RefitState>();
  Scheme s{"refit", "refit chunks, range hashes before and after included", nullptr,
           nullptr};
  s.encode = [st, chunk_elements](const Part& p) -> Result<std::span<const uint8_t>> {
    st->out.Clear();
    ChunkResult& r = st->chunk;
    for (size_t t = 0; t < p.tensors.size(); ++t) {
      const auto [offset, count] = p.tensors[t];
      ChunkHeader ids;
      ids.version = 1;
      ids.base_version = 0;
      ids.tensor_id = t;
      ids.width = 2;
      const auto* old_data = reinterpret_cast<const uint8_t*>(p.a.data() + offset);
      const auto* new_data = reinterpret_cast<const uint8_t*>(p.b.data() + offset);
      for (uint64_t start = 0; start < count; start += chunk_elements) {
        REFIT_RETURN_IF_ERROR(EncodeChunkRange(ids, old_data, new_data, start,
                                               std::min(chunk_elements, count - start),
                                               {}, &st->encode, &r));
        if (r.chunk.empty()) continue;
        PutU64(&st->out, r.chunk.size());
        std::memcpy(st->out.Grow(r.chunk.size()), r.chunk.data(), r.chunk.size());
      }
    }
    return st->out.span();
  };
  s.apply = [st](std::span<const uint8_t> in, const Part& p) -> Status {
    size_t at = 0;
    while (at < in.size()) {
      REFIT_ASSIGN_OR_RETURN(uint64_t n, GetU64(in, &at));
      if (in.size() - at < n) return DataLossError("truncated payload");
      REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(in.subspan(at, n)));
      at += n;
      const uint64_t t = c.header.tensor_id;
      if (t >= p.tensors.size()) return DataLossError("no such tensor");
      auto* data = reinterpret_cast<uint8_t*>(p.w.data() + p.tensors[t].first);
      REFIT_RETURN_IF_ERROR(
          ApplyChunkInPlace(c, data, &st->apply, nullptr, nullptr, nullptr));
    }
    return Status();
  };
  return s;
}

struct Row {
  std::string scheme;
  uint64_t payload = 0;
  double encode_s = 0;
  double apply_s = 0;
  bool exact = false;
};

struct Case {
  std::string input;
  double bytes() const { return 2.0 * static_cast<double>(elements); }
  double rate = 0;  // measured: changed / elements
  uint64_t elements = 0;
  std::vector<Row> rows;
};

std::vector<Scheme> MakeSchemes(uint64_t chunk_elements) {
  return {Refit(chunk_elements), NemoDcr(), Overwrite(), XorLz4(), Full()};
}

// Runs fn(i) for i in [0, n) on n threads; the first error.
Status OnThreads(size_t n, const std::function<Status(size_t)>& fn) {
  std::vector<Status> st(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) threads.emplace_back([&, i] { st[i] = fn(i); });
  for (std::thread& t : threads) t.join();
  for (const Status& s : st) REFIT_RETURN_IF_ERROR(s);
  return Status();
}

Result<Case> RunCase(std::string input, const Flat& base, const Flat& target,
                     int threads, uint64_t chunk_elements) {
  Case c;
  c.input = std::move(input);
  c.elements = base.bits.size();
  uint64_t changed = 0;
  for (size_t i = 0; i < base.bits.size(); ++i) changed += base.bits[i] != target.bits[i];
  c.rate = c.elements ? static_cast<double>(changed) / static_cast<double>(c.elements) : 0;
  Flat work = base;
  // Each thread runs every scheme on its own part, with its own scratch.
  const std::vector<Part> parts = Split(base, target, &work, threads);
  std::vector<std::vector<Scheme>> schemes;
  for (size_t i = 0; i < parts.size(); ++i) schemes.push_back(MakeSchemes(chunk_elements));
  std::vector<std::span<const uint8_t>> payload(parts.size());
  for (size_t k = 0; k < schemes[0].size(); ++k) {
    // The fastest of three runs: the first also pays for first touches of
    // the scheme's scratch memory.
    Row r;
    r.scheme = schemes[0][k].name;
    r.encode_s = r.apply_s = 1e300;
    for (int rep = 0; rep < kRuns; ++rep) {
      Stopwatch enc;
      REFIT_RETURN_IF_ERROR(OnThreads(parts.size(), [&](size_t i) -> Status {
        REFIT_ASSIGN_OR_RETURN(payload[i], schemes[i][k].encode(parts[i]));
        return Status();
      }));
      r.encode_s = std::min(r.encode_s, enc.Seconds());
      r.payload = 0;
      for (const auto& one : payload) r.payload += one.size();
      std::memcpy(work.bits.data(), base.bits.data(), 2 * base.bits.size());
      Stopwatch app;
      REFIT_RETURN_IF_ERROR(OnThreads(parts.size(), [&](size_t i) {
        return schemes[i][k].apply(payload[i], parts[i]);
      }).WithContext(r.scheme));
      r.apply_s = std::min(r.apply_s, app.Seconds());
      r.exact = work.bits == target.bits;
      if (!r.exact) break;
    }
    c.rows.push_back(r);
  }
  return c;
}

int RunPeers(const PeersArgs& args, const std::string& command_line) {
  constexpr std::string_view kCmd = "bench peers";
  const uint64_t chunk_elements =
      static_cast<uint64_t>(args.chunk_mib * (1 << 20)) / 2 / 32768 * 32768;
  if (chunk_elements == 0) {
    return Fail(kCmd, InvalidArgumentError("--chunk-mib must be at least 64 KiB"),
                args.json);
  }
  std::vector<Case> cases;
  if (!args.fixtures.empty()) {
    auto names = [&]() -> Result<std::vector<std::string>> {
      REFIT_ASSIGN_OR_RETURN(
          Checkpoint c, Checkpoint::Open(args.fixtures + "/step0.safetensors",
                                         Checkpoint::Mode::kReadOnly));
      std::vector<std::string> out;
      for (const auto& t : c.tensors()) out.push_back(t.name);
      return out;
    }();
    if (!names.ok()) return Fail(kCmd, names.status(), args.json);
    for (int from = 0; from < 3; ++from) {
      auto a = FlattenCheckpoint(fmt::format("{}/step{}.safetensors", args.fixtures, from),
                                 *names);
      auto b = FlattenCheckpoint(
          fmt::format("{}/step{}.safetensors", args.fixtures, from + 1), *names);
      if (!a.ok() || !b.ok()) return Fail(kCmd, a.ok() ? b.status() : a.status(), args.json);
      auto c = RunCase(fmt::format("step{}->step{}", from, from + 1), *a, *b, args.threads, chunk_elements);
      if (!c.ok()) return Fail(kCmd, c.status(), args.json);
      cases.push_back(std::move(*c));
    }
  } else {
    if (!(args.size_mib > 0) || args.size_mib > 64 * 1024) {
      return Fail(kCmd, InvalidArgumentError("--size-mib must be in (0, 65536]"), args.json);
    }
    SynthModel model =
        GenerateModel(static_cast<uint64_t>(args.size_mib * (1 << 20)), args.seed);
    const Flat base = Flatten(model);
    for (size_t i = 0; i < args.rates.size(); ++i) {
      Result<double> rate = ParseRate(args.rates[i], "--rates");
      if (!rate.ok()) return Fail(kCmd, rate.status(), args.json);
      SynthModel next = model;
      EvolveModel(&next, *rate, args.seed * 7919 + i + 1);
      const Flat target = Flatten(next);
      next = SynthModel{};
      auto c = RunCase(fmt::format("synthetic {} at {}", HumanBytes(2.0 * static_cast<double>(base.bits.size())),
                                   Percent(*rate, 1)),
                       base, target, args.threads, chunk_elements);
      if (!c.ok()) return Fail(kCmd, c.status(), args.json);
      cases.push_back(std::move(*c));
    }
  }

  bool all_exact = true;
  auto e2e = [](const Row& r, double gbit) {
    return r.encode_s + static_cast<double>(r.payload) * 8 / (gbit * 1e9) + r.apply_s;
  };
  if (args.json) {
    Json j;
    j["command"] = "bench peers";
    j["command_line"] = command_line;
    j["machine"] = {{"cpu", CpuModel()},
                    {"hardware_threads", std::thread::hardware_concurrency()},
                    {"threads", args.threads}};
    Json out = Json::array();
    for (const Case& c : cases) {
      auto per_core = [&](double s) { return c.bytes() / s / 1e9 / args.threads; };
      Json rows = Json::array();
      for (const Row& r : c.rows) {
        all_exact = all_exact && r.exact;
        Json e = Json::object();
        for (double g : args.link_gbit) e[fmt::format("{}", g)] = e2e(r, g);
        rows.push_back({{"scheme", r.scheme},
                        {"payload_bytes", r.payload},
                        {"encode_seconds", r.encode_s},
                        {"apply_seconds", r.apply_s},
                        {"encode_gbps_per_core",
                         r.scheme == "full" ? Json() : Json(per_core(r.encode_s))},
                        {"apply_gbps_per_core", per_core(r.apply_s)},
                        {"end_to_end_seconds_by_gbit", e},
                        {"exact", r.exact}});
      }
      out.push_back({{"input", c.input}, {"elements", c.elements},
                     {"changed_fraction", c.rate}, {"schemes", rows}});
    }
    j["cases"] = out;
    j["ok"] = all_exact;
    PrintJson(j);
  } else {
    fmt::print("refit bench peers: {}\n", command_line);
    fmt::print("machine: {}; {} core{} per side; GB/s per core; end to end = encode + "
               "payload / link + decode and apply, one after the other\n",
               CpuModel(), args.threads, args.threads == 1 ? "" : "s");
    for (const Scheme& s : MakeSchemes(chunk_elements)) {
      fmt::print("  {:<10} {}\n", s.name, s.what);
    }
    for (const Case& c : cases) {
      auto per_core = [&](double s) { return c.bytes() / s / 1e9 / args.threads; };
      fmt::print("\n{} ({} elements, {:.2f}% changed)\n", c.input, WithCommas(c.elements),
                 100 * c.rate);
      std::string head = fmt::format("{:<10} {:>12} {:>9} {:>14} {:>14}", "scheme",
                                     "payload", "x refit", "encode GB/s", "apply GB/s");
      for (double g : args.link_gbit) head += fmt::format(" {:>13}", fmt::format("e2e {} Gb/s", g));
      fmt::print("{} {:>6}\n", head, "exact");
      const double refit_payload = static_cast<double>(c.rows.front().payload);
      for (const Row& r : c.rows) {
        all_exact = all_exact && r.exact;
        // "full" sends the weights from where they lie: nothing to encode.
        const std::string encode =
            r.scheme == "full" ? "-" : fmt::format("{:.2f}", per_core(r.encode_s));
        std::string line = fmt::format(
            "{:<10} {:>12} {:>9.2f} {:>14} {:>14.2f}", r.scheme,
            HumanBytes(static_cast<double>(r.payload)),
            static_cast<double>(r.payload) / refit_payload, encode,
            per_core(r.apply_s));
        for (double g : args.link_gbit) line += fmt::format(" {:>13}", HumanSeconds(e2e(r, g)));
        fmt::print("{} {:>6}\n", line, r.exact ? "yes" : "NO");
      }
    }
  }
  if (!all_exact) {
    fmt::print(stderr, "refit: bench peers: a scheme's result differs from the target\n");
    return kExitMismatch;
  }
  return kExitOk;
}

}  // namespace

std::function<int(bool, const std::string&)> RegisterBenchPeers(CLI::App* bench_cmd) {
  auto args = std::make_shared<PeersArgs>();
  CLI::App* cmd = bench_cmd->add_subcommand(
      "peers",
      "refit next to the delta schemes in use elsewhere (gaps + XOR + zstd, a "
      "NaN-masked overwrite array + zstd, a dense XOR plane + LZ4 + zstd, full "
      "weights) on the same model and steps: payload, encode and decode + apply "
      "per core, end to end over modelled links.");
  cmd->add_option("--size-mib", args->size_mib, "synthetic model size in MiB")
      ->capture_default_str();
  cmd->add_option("--rates", args->rates, "fractions of elements changed")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--link-gbit", args->link_gbit, "link rates in Gbit/s")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--fixtures", args->fixtures,
                  "instead of a synthetic model: the step pairs of this folder "
                  "(e.g. ../shared/fixtures/qwen2-tiny)");
  cmd->add_option("--chunk-mib", args->chunk_mib, "refit's bytes of a tensor per chunk")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "generator seed")->capture_default_str();
  cmd->add_option("-j,--threads", args->threads,
                  "cores per side: every scheme runs on this many threads, each "
                  "on its share of the tensors")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--json", args->json, "print a JSON object on stdout");
  return [args](bool json, const std::string& command_line) {
    PeersArgs a = *args;
    a.json = a.json || json;
    return RunPeers(a, command_line);
  };
}

}  // namespace refit::cli
