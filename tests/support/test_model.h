// A small BF16 model for protocol tests: three tensors of random bits that
// step by ulp-sized XORs, written as one safetensors file. Test-only.
#ifndef REFIT_TESTS_SUPPORT_TEST_MODEL_H_
#define REFIT_TESTS_SUPPORT_TEST_MODEL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "format/safetensors.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "sync/publisher.h"
#include "sync/receiver.h"

namespace refit::testing {

struct TestModel {
  std::vector<std::string> names = {"a.weight", "b.weight", "c.bias"};
  std::vector<uint64_t> sizes = {70000, 40000, 300};
  std::vector<std::vector<uint8_t>> data;

  explicit TestModel(uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (uint64_t n : sizes) {
      std::vector<uint8_t> d(n * 2);
      for (auto& b : d) b = static_cast<uint8_t>(rng());
      data.push_back(std::move(d));
    }
  }
  // Flips the low bits of a fraction `rate` of the elements.
  void Step(std::mt19937_64& rng, double rate) {
    std::uniform_real_distribution<double> u(0, 1);
    for (auto& d : data) {
      for (size_t i = 0; i < d.size(); i += 2) {
        if (u(rng) < rate)
          d[i] ^= static_cast<uint8_t>((2u << (rng() % 3)) - 1);
      }
    }
  }
  // Moves a fraction `rate` of the elements up or down by one unit of their
  // 16-bit pattern: a step conditional XOR chunks (kind 5) code smaller
  // than sparse XOR ones.
  void StepByOne(std::mt19937_64& rng, double rate) {
    std::uniform_real_distribution<double> u(0, 1);
    for (auto& d : data) {
      for (size_t i = 0; i < d.size(); i += 2) {
        if (u(rng) >= rate) continue;
        uint16_t v = static_cast<uint16_t>(d[i] | d[i + 1] << 8);
        v = static_cast<uint16_t>(rng() % 2 ? v + 1 : v - 1);
        d[i] = static_cast<uint8_t>(v);
        d[i + 1] = static_cast<uint8_t>(v >> 8);
      }
    }
  }
  void Write(const std::string& path) const {
    std::vector<SafetensorsTensorView> views;
    for (size_t i = 0; i < names.size(); ++i) {
      views.push_back({names[i], "BF16", {sizes[i]}, data[i]});
    }
    Status s = WriteSafetensors(path, {}, views);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::vector<TensorView> Views() const {
    std::vector<TensorView> v;
    for (size_t i = 0; i < names.size(); ++i) {
      v.push_back({names[i], "BF16", 2, {sizes[i]}, data[i].data()});
    }
    return v;
  }
  // Writable views, for a receiver that patches these tensors in memory.
  std::vector<MutableTensorView> MutableViews() {
    std::vector<MutableTensorView> v;
    for (size_t i = 0; i < names.size(); ++i) {
      v.push_back({names[i], "BF16", 2, {sizes[i]}, data[i].data()});
    }
    return v;
  }
  // Whether the checkpoint at `path` holds exactly these tensors' bytes.
  bool Matches(const std::string& path) const {
    auto ck = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
    if (!ck.ok()) return false;
    for (size_t i = 0; i < names.size(); ++i) {
      auto idx = ck->IndexOf(names[i]);
      if (!idx) return false;
      auto d = ck->Data(*idx);
      if (!std::equal(d.begin(), d.end(), data[i].begin(), data[i].end()))
        return false;
    }
    return true;
  }
};

// Publishes `model` as `version` while every receiver syncs to it on a
// thread of its own (up to `timeout_ms`); a receiver that fails adds a test
// failure. Checks that the version committed and every receiver holds it.
inline void PublishToAll(
    Publisher& pub, const std::vector<std::unique_ptr<Receiver>>& receivers,
    uint64_t version, const TestModel& model, int timeout_ms) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (const auto& r : receivers) {
    threads.emplace_back([&, rp = r.get()] {
      auto s = rp->SyncTo(version, timeout_ms);
      if (!s.ok()) {
        ADD_FAILURE() << s.status().ToString();
        ++failures;
      }
    });
  }
  auto report = pub.Publish(version, model.Views());
  for (auto& t : threads) t.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->reason;
  ASSERT_EQ(failures.load(), 0);
  for (const auto& r : receivers) EXPECT_EQ(r->active_version(), version);
}

}  // namespace refit::testing

#endif  // REFIT_TESTS_SUPPORT_TEST_MODEL_H_
