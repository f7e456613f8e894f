// End to end over the relay tree: the real Publisher on the root endpoint,
// three Receivers on nodes (fan-out 2, so one receiver is two hops down),
// three versions, every checkpoint bit-exact; then a late receiver catches
// up from its parent's replay. The only test that links refit_sync: the
// transport library does not depend on the protocol.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>

#include "base/file.h"
#include "format/safetensors.h"
#include "refit/checkpoint.h"
#include "support/test_model.h"
#include "support/testing.h"
#include "sync/auth.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "sync/relay_tree.h"
#include "transport/relay_store.h"

namespace refit {
namespace {

using testing::TempDir;

Authenticator Key() {
  return *Authenticator::Hmac(std::vector<uint8_t>(32, 7));
}

// A small model: a few BF16 tensors in one safetensors file (as in
// src/sync/sync_test.cc).
using Model = testing::TestModel;

RelayOptions Fast() {
  RelayOptions o;
  o.keys = ProtocolRelayKeys();
  o.heartbeat_ms = 50;
  o.dead_after_ms = 1000;
  o.reconnect_min_ms = 10;
  o.reconnect_max_ms = 100;
  return o;
}

TEST(RelaySyncTest, PublisherAndReceiversOverTheTreeBitExact) {
  TempDir dir;
  Model model(1);
  model.Write(dir.File("baseline.safetensors"));
  constexpr int kReceivers = 3;
  auto root = RelayStore::Root("127.0.0.1:0", Fast());
  ASSERT_OK(root);
  auto parents = RelayTreeParents(kReceivers + 1, 2);  // the 4th joins late
  ASSERT_OK(parents);
  std::vector<std::unique_ptr<RelayStore>> nodes;
  auto start_node = [&](int i) {
    const int p = (*parents)[static_cast<size_t>(i)];
    const std::string parent =
        p < 0 ? (*root)->listen_address()
              : nodes[static_cast<size_t>(p)]->listen_address();
    auto node = RelayStore::Node("r" + std::to_string(i), parent, "127.0.0.1:0",
                                 Fast());
    EXPECT_OK(node);
    nodes.push_back(std::move(*node));
  };
  auto receiver_options = [&](int i) {
    std::string name = "r" + std::to_string(i);
    std::filesystem::create_directories(dir.File(name));
    model.Write(dir.File(name + "/model.safetensors"));
    ReceiverOptions o;
    o.member = name;
    o.checkpoint = dir.File(name + "/model.safetensors");
    o.state_dir = dir.File(name);
    o.auth = Key();
    o.poll_ms = 2;
    o.decision_timeout_ms = 20000;
    o.resend_timeout_ms = 20000;
    return o;
  };
  for (int i = 0; i < kReceivers; ++i) start_node(i);

  PublisherOptions popts;
  for (int i = 0; i < kReceivers; ++i)
    popts.members.push_back("r" + std::to_string(i));
  popts.auth = Key();
  popts.poll_ms = 2;
  popts.vote_timeout_ms = 20000;
  popts.diff.chunk_bytes =
      64 * 1024;  // the smallest: several chunks per version
  auto pub =
      Publisher::Open(root->get(), dir.File("baseline.safetensors"), popts);
  ASSERT_OK(pub);
  std::vector<std::unique_ptr<Receiver>> receivers;
  for (int i = 0; i < kReceivers; ++i) {
    auto r = Receiver::Open(nodes[static_cast<size_t>(i)].get(),
                            receiver_options(i));
    ASSERT_OK(r);
    receivers.push_back(std::move(*r));
  }

  std::mt19937_64 rng(2);
  Model trainer = model;
  for (uint64_t v = 1; v <= 3; ++v) {
    trainer.Step(rng, v == 2 ? 0.5 : 0.02);  // one dense step
    ASSERT_NO_FATAL_FAILURE(
        testing::PublishToAll(**pub, receivers, v, trainer, 30000));
    for (int i = 0; i < kReceivers; ++i) {
      EXPECT_TRUE(trainer.Matches(
          dir.File("r" + std::to_string(i) + "/model.safetensors")))
          << "receiver " << i << " version " << v;
    }
    EXPECT_TRUE(trainer.Matches(dir.File("baseline.safetensors")));
  }
  for (const auto& n : nodes) {
    RelayStatus s = n->status();
    EXPECT_TRUE(s.parent_connected);
    EXPECT_EQ(s.refused, 0u);
  }
  // A receiver that joins late (under r0) catches up from r0's replay.
  start_node(kReceivers);
  auto late = Receiver::Open(nodes.back().get(), receiver_options(kReceivers));
  ASSERT_OK(late);
  auto s = (*late)->SyncTo(3, 30000);
  ASSERT_OK(s);
  EXPECT_TRUE(trainer.Matches(dir.File("r3/model.safetensors")));
}

}  // namespace
}  // namespace refit
