// Compression against the order-0 bound on the real qwen2-tiny checkpoint
// pairs: every changed tensor becomes one sparse XOR chunk, and the summed
// payloads are compared with log2 C(N, K) / 8 + K * H(XOR values) / 8 over
// the whole pair. The safetensors parsing here is deliberately minimal (the
// fixtures are BF16-only); the real parser lives in src/format.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/hash.h"
#include "codec/conditional.h"
#include "codec/payload.h"
#include "support/testing.h"

namespace refit::codec {
namespace {

struct Tensor {
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Returns the data section and the tensors' byte ranges within it.
bool LoadBf16(const std::string& path, std::vector<uint8_t>* data,
              std::vector<Tensor>* tensors) {
  std::vector<uint8_t> file = ::refit::testing::ReadBytes(path);
  if (file.size() < 8) return false;
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  if (header_len > file.size() - 8) return false;
  const std::string header(file.begin() + 8, file.begin() + 8 + header_len);
  data->assign(file.begin() + 8 + header_len, file.end());
  for (size_t at = header.find("\"dtype\""); at != std::string::npos;
       at = header.find("\"dtype\"", at + 1)) {
    if (header.compare(header.find('"', at + 7) + 1, 5, "BF16\"") != 0) {
      return false;
    }
  }
  const std::string key = "\"data_offsets\":[";
  for (size_t at = header.find(key); at != std::string::npos;
       at = header.find(key, at + 1)) {
    Tensor t;
    char* endp = nullptr;
    t.begin = std::strtoull(header.c_str() + at + key.size(), &endp, 10);
    t.end = std::strtoull(endp + 1, nullptr, 10);
    if (t.end < t.begin || t.end > data->size()) return false;
    tensors->push_back(t);
  }
  return !tensors->empty();
}

struct PairResult {
  double bound = 0;
  uint64_t payload = 0;
  uint64_t conditional = 0;  // per tensor the smaller of kinds 1 and 5
  uint64_t tables = 0;
  uint64_t chunks = 0;
};

PairResult EncodePair(int from, int to) {
  const std::string dir = ::refit::testing::FixturesDir() + "/";
  std::vector<uint8_t> a, b;
  std::vector<Tensor> ta, tb;
  PairResult res;
  EXPECT_TRUE(
      LoadBf16(dir + "step" + std::to_string(from) + ".safetensors", &a, &ta));
  EXPECT_TRUE(
      LoadBf16(dir + "step" + std::to_string(to) + ".safetensors", &b, &tb));
  EXPECT_EQ(ta.size(), tb.size());
  if (a.size() != b.size() || ta.size() != tb.size()) return res;
  uint64_t total_n = 0, total_k = 0;
  std::map<uint16_t, uint64_t> counts;
  for (const Tensor& t : ta) {
    const uint32_t n = static_cast<uint32_t>((t.end - t.begin) / 2);
    total_n += n;
    std::vector<uint32_t> positions;
    std::vector<uint8_t> values;
    for (uint32_t i = 0; i < n; ++i) {
      const size_t o = t.begin + 2 * size_t{i};
      const uint16_t x =
          static_cast<uint16_t>((a[o] ^ b[o]) | (a[o + 1] ^ b[o + 1]) << 8);
      if (x == 0) continue;
      positions.push_back(i);
      values.push_back(static_cast<uint8_t>(x));
      values.push_back(static_cast<uint8_t>(x >> 8));
      ++counts[x];
    }
    const uint32_t k = static_cast<uint32_t>(positions.size());
    total_k += k;
    if (k == 0) continue;
    std::vector<uint8_t> payload;
    EXPECT_OK(EncodeSparse(ChunkKind::kSparseXor, n, 2, positions,
                           values.data(), EncodeOptions(), &payload));
    std::vector<uint32_t> pos2(k);
    std::vector<uint8_t> val2(2 * size_t{k});
    EXPECT_OK(DecodeSparse(payload, ChunkKind::kSparseXor, n, 2, k, pos2.data(),
                           val2.data()));
    EXPECT_EQ(pos2, positions);
    EXPECT_EQ(val2, values);
    std::vector<uint8_t> cond;
    EXPECT_OK(EncodeConditional(n, a.data() + t.begin, positions, values.data(),
                                EncodeOptions(), &cond));
    std::fill(pos2.begin(), pos2.end(), 0);
    std::fill(val2.begin(), val2.end(), 0);
    EXPECT_OK(DecodeConditional(cond, n, a.data() + t.begin, k, pos2.data(), val2.data()));
    EXPECT_EQ(pos2, positions);
    EXPECT_EQ(val2, values);
    res.conditional += std::min(cond.size(), payload.size());
    Result<PayloadInfo> info =
        DescribePayload(payload, ChunkKind::kSparseXor, n, 2, k);
    EXPECT_TRUE(info.ok());
    if (info.ok()) res.tables += info->table_bytes;
    res.payload += payload.size();
    ++res.chunks;
  }
  double h = 0;
  for (const auto& [v, c] : counts) {
    const double p = static_cast<double>(c) / static_cast<double>(total_k);
    h -= static_cast<double>(c) * std::log2(p);
  }
  const double n = static_cast<double>(total_n);
  const double k = static_cast<double>(total_k);
  const double log2_choose =
      (std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1)) /
      std::log(2.0);
  res.bound = (log2_choose + h) / 8;
  return res;
}

TEST(FixtureRatioTest, SparseXorNearOrder0Bound) {
  REFIT_REQUIRE_FIXTURES();
  for (int from = 0; from < 3; ++from) {
    const PairResult r = EncodePair(from, from + 1);
    const double ratio = static_cast<double>(r.payload) / r.bound;
    std::printf(
        "step%d->step%d: %zu chunks, payload %llu B (tables %llu B), "
        "bound %.0f B, ratio %.4f\n",
        from, from + 1, static_cast<size_t>(r.chunks),
        static_cast<unsigned long long>(r.payload),
        static_cast<unsigned long long>(r.tables), r.bound, ratio);
    EXPECT_LE(ratio, 1.05);
  }
}

// Conditional XOR (kind 5) on the same pairs, each tensor's chunk the
// smaller of kinds 1 and 5 as the encoder picks: round trips, and at most
// 0.80 of the order-0 bound.
TEST(FixtureRatioTest, ConditionalXorBelowOrder0Bound) {
  REFIT_REQUIRE_FIXTURES();
  for (int from = 0; from < 3; ++from) {
    const PairResult r = EncodePair(from, from + 1);
    const double ratio = static_cast<double>(r.conditional) / r.bound;
    std::printf("step%d->step%d: conditional payload %llu B, bound %.0f B, ratio %.4f\n",
                from, from + 1, static_cast<unsigned long long>(r.conditional), r.bound,
                ratio);
    EXPECT_LE(ratio, 0.80);
  }
}

// The sparse payloads of the real steps, digested: every changed tensor
// as one XOR chunk (default lanes), and cut into 2^16-element ranges as XOR
// (64 records a lane) and overwrite chunks. Model, precision and lane
// choices must never change these bytes.
TEST(GoldenTest, FixtureSparsePayloadsAreFrozen) {
  REFIT_REQUIRE_FIXTURES();
  const std::string dir = ::refit::testing::FixturesDir() + "/";
  std::vector<uint8_t> all;
  auto add = [&](ChunkKind kind, uint32_t n, std::span<const uint32_t> positions,
                 const uint8_t* values, uint32_t per_lane) {
    EncodeOptions opt;
    opt.records_per_lane = per_lane;
    std::vector<uint8_t> payload;
    EXPECT_OK(EncodeSparse(kind, n, 2, positions, values, opt, &payload));
    const uint64_t size = payload.size();
    for (int b = 0; b < 8; ++b) all.push_back(static_cast<uint8_t>(size >> (8 * b)));
    all.insert(all.end(), payload.begin(), payload.end());
  };
  for (int from = 0; from < 3; ++from) {
    std::vector<uint8_t> a, b;
    std::vector<Tensor> ta, tb;
    ASSERT_TRUE(LoadBf16(dir + "step" + std::to_string(from) + ".safetensors", &a, &ta));
    ASSERT_TRUE(LoadBf16(dir + "step" + std::to_string(from + 1) + ".safetensors", &b, &tb));
    ASSERT_EQ(a.size(), b.size());
    for (const Tensor& t : ta) {
      const uint32_t n = static_cast<uint32_t>((t.end - t.begin) / 2);
      constexpr uint32_t kRange = 1u << 16;
      for (uint32_t r0 = 0; r0 < n; r0 += kRange) {
        const uint32_t rn = std::min(kRange, n - r0);
        std::vector<uint32_t> positions;
        std::vector<uint8_t> xors, news;
        for (uint32_t i = 0; i < rn; ++i) {
          const size_t o = t.begin + 2 * (size_t{r0} + i);
          if (a[o] == b[o] && a[o + 1] == b[o + 1]) continue;
          positions.push_back(i);
          xors.push_back(static_cast<uint8_t>(a[o] ^ b[o]));
          xors.push_back(static_cast<uint8_t>(a[o + 1] ^ b[o + 1]));
          news.push_back(b[o]);
          news.push_back(b[o + 1]);
        }
        if (positions.empty()) continue;
        add(ChunkKind::kSparseXor, rn, positions, xors.data(), 64);
        add(ChunkKind::kSparseOverwrite, rn, positions, news.data(), 1024);
      }
      std::vector<uint32_t> positions;
      std::vector<uint8_t> xors;
      for (uint32_t i = 0; i < n; ++i) {
        const size_t o = t.begin + 2 * size_t{i};
        if (a[o] == b[o] && a[o + 1] == b[o + 1]) continue;
        positions.push_back(i);
        xors.push_back(static_cast<uint8_t>(a[o] ^ b[o]));
        xors.push_back(static_cast<uint8_t>(a[o + 1] ^ b[o + 1]));
      }
      if (!positions.empty()) add(ChunkKind::kSparseXor, n, positions, xors.data(), 1024);
    }
  }
  EXPECT_EQ(HashBytes(all.data(), all.size()).Hex(), "c7babc3d84f8903a37f2bed314378dd5");
}

// The conditional XOR payloads of the real steps (every changed tensor as
// one chunk, 1024 and 64 records a lane), digested: the class window, model
// and lane choices must never change these bytes.
TEST(GoldenTest, FixtureConditionalPayloadsAreFrozen) {
  REFIT_REQUIRE_FIXTURES();
  const std::string dir = ::refit::testing::FixturesDir() + "/";
  std::vector<uint8_t> all;
  for (int from = 0; from < 3; ++from) {
    std::vector<uint8_t> a, b;
    std::vector<Tensor> ta, tb;
    ASSERT_TRUE(LoadBf16(dir + "step" + std::to_string(from) + ".safetensors", &a, &ta));
    ASSERT_TRUE(LoadBf16(dir + "step" + std::to_string(from + 1) + ".safetensors", &b, &tb));
    ASSERT_EQ(a.size(), b.size());
    for (const Tensor& t : ta) {
      const uint32_t n = static_cast<uint32_t>((t.end - t.begin) / 2);
      std::vector<uint32_t> positions;
      std::vector<uint8_t> xors;
      for (uint32_t i = 0; i < n; ++i) {
        const size_t o = t.begin + 2 * size_t{i};
        if (a[o] == b[o] && a[o + 1] == b[o + 1]) continue;
        positions.push_back(i);
        xors.push_back(static_cast<uint8_t>(a[o] ^ b[o]));
        xors.push_back(static_cast<uint8_t>(a[o + 1] ^ b[o + 1]));
      }
      if (positions.empty()) continue;
      for (uint32_t per_lane : {1024u, 64u}) {
        EncodeOptions opt;
        opt.records_per_lane = per_lane;
        std::vector<uint8_t> payload;
        EXPECT_OK(EncodeConditional(n, a.data() + t.begin, positions, xors.data(), opt,
                                    &payload));
        const uint64_t size = payload.size();
        for (int j = 0; j < 8; ++j) all.push_back(static_cast<uint8_t>(size >> (8 * j)));
        all.insert(all.end(), payload.begin(), payload.end());
      }
    }
  }
  EXPECT_EQ(HashBytes(all.data(), all.size()).Hex(), "36a54a20e419cde44292dfde09f19ea1");
}

}  // namespace
}  // namespace refit::codec
