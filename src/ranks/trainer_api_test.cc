// The public trainer API (refit/trainer.h): a two-rank layout (a row split
// of a BF16 matrix, so contiguous regions, and a column split of an F32
// matrix, so strided ones), its rank encoders' chunks, and one version
// published by both ranks through the direct coordinator and through the
// assembling one to a receiver that holds the weights in memory. Only the
// setup (scratch folders, checkpoint files) uses test support.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "refit/checkpoint.h"
#include "refit/receiver.h"
#include "refit/trainer.h"
#include "support/safetensors_builder.h"
#include "support/status_matchers.h"
#include "support/testing.h"

namespace refit {
namespace {

using ::refit::testing::StatusIs;
using ::refit::testing::TempDir;

// w: BF16 [8, 64], rank r holds rows 4r .. 4r+3; v: F32 [4, 32], rank r
// holds columns 16r .. 16r+15.
constexpr char kLayout[] = R"({"format": "refit-layout", "version": 1,
  "canonical": [{"name": "w", "dtype": "BF16", "shape": [8, 64]},
                {"name": "v", "dtype": "F32", "shape": [4, 32]}],
  "ranks": [
    {"rank": 0, "tensors": [
      {"name": "w", "dtype": "BF16", "shape": [4, 64], "pieces": [{"canonical": "w",
        "rows": 4, "cols": 64, "local": [0, 64, 1], "canon": [0, 64, 1]}]},
      {"name": "v", "dtype": "F32", "shape": [4, 16], "pieces": [{"canonical": "v",
        "rows": 4, "cols": 16, "local": [0, 16, 1], "canon": [0, 32, 1]}]}]},
    {"rank": 1, "tensors": [
      {"name": "w", "dtype": "BF16", "shape": [4, 64], "pieces": [{"canonical": "w",
        "rows": 4, "cols": 64, "local": [0, 64, 1], "canon": [256, 64, 1]}]},
      {"name": "v", "dtype": "F32", "shape": [4, 16], "pieces": [{"canonical": "v",
        "rows": 4, "cols": 16, "local": [0, 16, 1], "canon": [16, 32, 1]}]}]}]})";

using Bytes = std::map<std::string, std::vector<uint8_t>>;  // by tensor name

// The model as a trainer sees it: the canonical tensors, and each rank's
// local tensors cut from them.
struct Model {
  Bytes canon;
  std::vector<Bytes> local = std::vector<Bytes>(2);

  explicit Model(uint64_t seed) {
    std::mt19937_64 rng(seed);
    canon["w"].resize(8 * 64 * 2);
    canon["v"].resize(4 * 32 * 4);
    for (auto& [name, b] : canon) {
      for (auto& x : b) x = static_cast<uint8_t>(rng() % 64);  // no NaN patterns
    }
    Scatter();
  }

  void Scatter() {
    for (size_t r = 0; r < 2; ++r) {
      const auto& w = canon.at("w");
      local[r]["w"].assign(w.begin() + static_cast<long>(r * 512),
                           w.begin() + static_cast<long>((r + 1) * 512));
      auto& v = local[r]["v"];
      v.resize(4 * 16 * 4);
      for (size_t row = 0; row < 4; ++row) {
        std::memcpy(&v[row * 64], &canon.at("v")[row * 128 + r * 64], 64);
      }
    }
  }

  std::vector<TensorView> Local(size_t r) const {
    return {{"w", "BF16", 2, {4, 64}, local[r].at("w").data()},
            {"v", "F32", 4, {4, 16}, local[r].at("v").data()}};
  }

  void Write(const std::string& path) const {
    testing::WriteSafetensors(
        path, {{"v", "F32", {4, 32}, canon.at("v")}, {"w", "BF16", {8, 64}, canon.at("w")}});
  }
};

layout::Layout TwoRanks() {
  auto l = layout::ParseLayout(kLayout);
  EXPECT_OK(l);
  return *l;
}

Authenticator Key() {
  auto a = Authenticator::Hmac(std::vector<uint8_t>(32, 9));
  EXPECT_TRUE(a.ok());
  return *a;
}

TEST(TrainerApi, EncoderEmitsTheOwnedChanges) {
  Model m(1);
  EXPECT_THAT(RankEncoder::Create(TwoRanks(), 7), StatusIs(StatusCode::kInvalidArgument));
  auto e = RankEncoder::Create(TwoRanks(), 0);
  ASSERT_OK(e);
  RankEncoder& enc = **e;
  EXPECT_EQ(enc.rank(), 0u);
  ASSERT_EQ(enc.canonical_tensors().size(), 2u);
  EXPECT_EQ(enc.canonical_tensors()[0].name, "v");  // sorted by name
  EXPECT_EQ(enc.local_tensors().size(), 2u);
  EXPECT_EQ(enc.owned_bytes(), 512u + 256u);
  EXPECT_THAT(enc.Encode(1, 0, m.Local(0)), StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_OK(enc.SetBaselineFromLocal(m.Local(0)));

  // One element of each tensor that rank 0 owns changes (w row 1, v row 2
  // column 5), and one that rank 1 owns (w row 6).
  m.canon["w"][2 * (64 + 3)] ^= 1;
  m.canon["v"][4 * (2 * 32 + 5)] ^= 1;
  m.canon["w"][2 * (6 * 64)] ^= 1;
  m.Scatter();
  std::vector<RankChunk> chunks;
  auto r = enc.Encode(1, 0, m.Local(0), [&](const RankChunk& c) -> Status {
    EXPECT_FALSE(c.bytes.empty());
    if (c.changed > 0) chunks.push_back(c);
    return Status();
  });
  ASSERT_OK(r);
  EXPECT_EQ(r->changed_direct, 2u);
  EXPECT_EQ(r->changed_residual, 0u);
  EXPECT_EQ(enc.pending_chunks(), r->chunks);
  ASSERT_EQ(chunks.size(), 2u);
  for (const RankChunk& c : chunks) {
    EXPECT_EQ(c.changed, 1u);
    EXPECT_FALSE(c.kind.empty());
    if (c.tensor_id == 0) {  // v: columns 0 .. 15 of 32, a strided region
      EXPECT_EQ(c.start, 0u);
      EXPECT_EQ(c.count, 64u);
      EXPECT_EQ(c.run, 16u);
      EXPECT_EQ(c.stride, 32u);
    } else {  // w: rows 0 .. 3, contiguous
      EXPECT_EQ(c.tensor_id, 1u);
      EXPECT_EQ(c.start, 0u);
      EXPECT_EQ(c.count, 256u);
      EXPECT_EQ(c.run, 0u);
    }
  }

  // Aborted, the same tensors encode to the same changes again; committed,
  // they are the baseline and nothing changed.
  enc.Abort();
  EXPECT_EQ(enc.pending_chunks(), 0u);
  auto again = enc.Encode(1, 0, m.Local(0));
  ASSERT_OK(again);
  EXPECT_EQ(again->changed_direct, 2u);
  EXPECT_EQ(again->payload_bytes, r->payload_bytes);
  ASSERT_OK(enc.Commit());
  auto none = enc.Encode(2, 1, m.Local(0));
  ASSERT_OK(none);
  EXPECT_EQ(none->changed_direct, 0u);
}

// q: FP8 E4M3 [4, 16] with a per-tensor scale, from F32 masters split by
// rows over two ranks: neither holds the amax its scale is.
constexpr char kSplitFp8Layout[] = R"({"format": "refit-layout", "version": 1,
  "canonical": [{"name": "q", "dtype": "F8_E4M3", "shape": [4, 16], "scale": "q_scale",
                 "scale_kind": "per_tensor"},
                {"name": "q_scale", "dtype": "F32", "shape": []}],
  "ranks": [
    {"rank": 0, "tensors": [
      {"name": "q", "dtype": "F32", "shape": [2, 16], "pieces": [{"canonical": "q",
        "rows": 2, "cols": 16, "local": [0, 16, 1], "canon": [0, 16, 1]}]}]},
    {"rank": 1, "tensors": [
      {"name": "q", "dtype": "F32", "shape": [2, 16], "pieces": [{"canonical": "q",
        "rows": 2, "cols": 16, "local": [0, 16, 1], "canon": [32, 16, 1]}]}]}]})";

TEST(TrainerApi, SplitPerTensorScaleTakesTheGlobalAmax) {
  auto l = layout::ParseLayout(kSplitFp8Layout);
  ASSERT_OK(l);
  // Rank 1 holds the largest magnitude, 3.5; rank 0 holds element 0.
  std::vector<std::vector<float>> masters = {std::vector<float>(32, 0.25f),
                                             std::vector<float>(32, -0.5f)};
  masters[1][7] = -3.5f;
  auto views = [&](size_t r) {
    return std::vector<TensorView>{{"q", "F32", 4, {2, 16},
                                    reinterpret_cast<const uint8_t*>(masters[r].data())}};
  };
  TempDir dir;
  auto store = OpenObjectStore(dir.File("store"));
  ASSERT_OK(store);
  GlobalAmax amax = {{"q", 3.5f}, {"other", 1.0f}};  // other tensors' entries are ignored
  std::vector<std::unique_ptr<RankEncoder>> encoders;
  std::vector<std::unique_ptr<RankPublisher>> publishers;
  for (uint32_t r = 0; r < 2; ++r) {
    auto e = RankEncoder::Create(*l, r);
    ASSERT_OK(e);
    EXPECT_EQ((*e)->global_amax_tensors(), std::vector<std::string>{"q"});
    const Status refused = (*e)->SetBaselineFromLocal(views(r));
    EXPECT_THAT(refused, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_NE(refused.message().find("'q' is split across ranks"), std::string::npos)
        << refused.ToString();
    EXPECT_NE(refused.message().find("must pass the tensor's global amax"), std::string::npos)
        << refused.ToString();
    ASSERT_OK((*e)->SetBaselineFromLocal(views(r), amax));
    // Only rank 0 (the owner of element 0) holds and emits the scale.
    EXPECT_EQ((*e)->owned_bytes(), r == 0 ? 36u : 32u);
    encoders.push_back(std::move(*e));
  }
  // The largest magnitude doubles: the scale, so every element but that
  // one (-448 in units of the scale, before and after) changes.
  masters[1][7] = -7.0f;
  amax["q"] = 7.0f;
  for (uint32_t r = 0; r < 2; ++r) {
    std::map<std::string, uint64_t> changed;  // by tensor
    auto report = encoders[r]->Encode(
        1, 0, views(r),
        [&](const RankChunk& c) {
          changed[encoders[r]->canonical_tensors()[c.tensor_id].name] += c.changed;
          return Status();
        },
        amax);
    ASSERT_OK(report);
    EXPECT_EQ(changed["q"], r == 0 ? 32u : 31u);
    EXPECT_EQ(changed.count("q_scale"), r == 0 ? 1u : 0u);
    encoders[r]->Abort();
    RankPublisherOptions ro;
    ro.auth = Key();
    auto p = RankPublisher::Open(store->get(), nullptr, encoders[r].get(), std::nullopt, ro);
    ASSERT_OK(p);
    EXPECT_THAT((*p)->Publish(1, views(r)), StatusIs(StatusCode::kInvalidArgument));
    auto part = (*p)->Publish(1, views(r), amax);
    ASSERT_OK(part);
    EXPECT_EQ(part->encode.changed_residual, r == 0 ? 33u : 31u);
    publishers.push_back(std::move(*p));
  }
}

class TrainerApiPublish : public ::testing::Test {
 protected:
  void SetUp() override {
    model_.Write(dir_.File("v0.safetensors"));
    memory_ = model_.canon;
    auto s = OpenObjectStore(dir_.File("store"));
    ASSERT_OK(s);
    store_ = std::move(*s);
    auto ck = Checkpoint::Open(dir_.File("v0.safetensors"), Checkpoint::Mode::kReadOnly);
    ASSERT_OK(ck);
    for (uint32_t r = 0; r < 2; ++r) {
      RankEncoderOptions eo;
      eo.chunk_bytes = 128;  // several chunks per region
      eo.threads = 2;
      auto e = RankEncoder::Create(TwoRanks(), r, eo);
      ASSERT_OK(e);
      // Either baseline gives the same owned bytes.
      ASSERT_OK(r == 0 ? (*e)->SetBaseline(CheckpointViews(*ck))
                       : (*e)->SetBaselineFromLocal(model_.Local(r)));
      encoders_.push_back(std::move(*e));
    }
  }

  void OpenRanks(ObjectStore* parts) {
    for (auto& e : encoders_) {
      RankPublisherOptions ro;
      ro.auth = Key();
      ro.poll_ms = 2;
      auto p = RankPublisher::Open(store_.get(), parts, e.get(), std::nullopt, ro);
      ASSERT_OK(p);
      EXPECT_EQ((*p)->committed_version(), 0u);  // the store has no head yet
      ranks_.push_back(std::move(*p));
    }
  }

  // Version 1: a training step changes about 5% of the elements; both
  // ranks publish their parts.
  void PublishRanks() {
    std::mt19937_64 rng(7);
    for (auto& [name, b] : model_.canon) {
      for (size_t i = 0; i < b.size(); i += 4) {
        if (rng() % 20 == 0) b[i] ^= 1;
      }
    }
    model_.Scatter();
    for (size_t r = 0; r < 2; ++r) {
      auto p = ranks_[r]->Publish(1, model_.Local(r));
      ASSERT_OK(p);
      EXPECT_EQ(p->version, 1u);
      EXPECT_EQ(p->base_version, 0u);
      EXPECT_GT(p->encode.chunks, 0u);
    }
  }

  // A receiver with the weights in memory follows the store to version 1
  // on its own thread while `decide` runs.
  void ReceiveWhile(const std::function<void()>& decide) {
    SyncReceiverOptions o;
    o.member = "m0";
    o.auth = Key();
    o.poll_ms = 2;
    o.threads = 2;
    o.state_dir = dir_.File("state");
    std::filesystem::create_directories(o.state_dir);
    o.tensors = {{"v", "F32", 4, {4, 32}, memory_.at("v").data()},
                 {"w", "BF16", 2, {8, 64}, memory_.at("w").data()}};
    Result<SyncStep> synced = Status(StatusCode::kUnknown, "not run");
    std::thread receiver([&] {
      auto r = SyncReceiver::Open(store_.get(), o);
      synced = r.ok() ? (*r)->SyncTo(1, 30000) : Result<SyncStep>(r.status());
    });
    decide();
    receiver.join();
    ASSERT_OK(synced);
    EXPECT_EQ(synced->outcome, SyncStep::Outcome::kCommitted);
    EXPECT_EQ(memory_, model_.canon);
    for (auto& r : ranks_) {
      auto d = r->AwaitDecision(30000);
      ASSERT_OK(d);
      EXPECT_TRUE(*d);
      EXPECT_EQ(r->committed_version(), 1u);
    }
  }

  TempDir dir_;
  Model model_{3};
  Bytes memory_;  // the receiver's weights
  std::unique_ptr<ObjectStore> store_;
  std::vector<std::unique_ptr<RankEncoder>> encoders_;
  std::vector<std::unique_ptr<RankPublisher>> ranks_;
};

TEST_F(TrainerApiPublish, DirectCoordinatorDecides) {
  OpenRanks(nullptr);  // the direct path: parts in the protocol store
  PublishRanks();
  DirectCoordinatorOptions co;
  co.ranks = {0, 1};
  co.members = {"m0"};
  co.auth = Key();
  co.poll_ms = 2;
  co.vote_timeout_ms = 30000;
  co.initial_checkpoint = dir_.File("v0.safetensors");
  auto c = DirectCoordinator::Open(store_.get(), co);
  ASSERT_OK(c);
  auto stored = (*c)->PartsStored(1);
  ASSERT_OK(stored);
  EXPECT_EQ(*stored, (std::vector<uint32_t>{0, 1}));
  ReceiveWhile([&] {
    auto report = (*c)->Publish(1);
    ASSERT_OK(report);
    EXPECT_TRUE(report->committed) << report->reason;
    EXPECT_GT(report->part_chunks, 2u);
    EXPECT_GT(report->changed_elements, 0u);
  });
  EXPECT_EQ((*c)->committed_version(), 1u);
  co.members = {};
  EXPECT_THAT(DirectCoordinator::Open(store_.get(), co), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(TrainerApiPublish, PartsCoordinatorAssembles) {
  auto p = OpenObjectStore(dir_.File("parts"));
  ASSERT_OK(p);
  std::unique_ptr<ObjectStore> parts = std::move(*p);
  OpenRanks(parts.get());
  PartsCoordinatorOptions co;
  co.publisher.members = {"m0"};
  co.publisher.auth = Key();
  co.publisher.poll_ms = 2;
  co.publisher.vote_timeout_ms = 30000;
  co.ranks = {0, 1};
  co.threads = 2;
  model_.Write(dir_.File("baseline.safetensors"));
  auto c = PartsCoordinator::Open(store_.get(), parts.get(), dir_.File("baseline.safetensors"),
                                  dir_.File("staging.safetensors"), co);
  ASSERT_OK(c);
  EXPECT_EQ((*c)->committed_version(), 0u);
  PublishRanks();
  ReceiveWhile([&] {
    auto report = (*c)->Publish(1);
    ASSERT_OK(report);
    EXPECT_TRUE(report->publish.committed) << report->publish.reason;
    EXPECT_EQ(report->publish.version, 1u);
    EXPECT_GT(report->part_chunks, 2u);
    EXPECT_EQ(report->changed_elements, report->publish.diff.changed_elements);
  });
  EXPECT_EQ((*c)->committed_version(), 1u);
}

}  // namespace
}  // namespace refit
