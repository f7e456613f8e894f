// Versions published by many trainer ranks (docs/trainer.md, "Versions
// from many ranks").
//
// Every rank encodes the canonical regions it owns (trainer/RankEncoder)
// and uploads them, concurrently with the other ranks, as its **part** of
// a version: sealed chunk objects and, last, a sealed part list naming
// each chunk's size and SHA-256. The coordinator waits until every rank's
// part is stored (a deadline; a version is complete only with every
// owner's part), checks and applies all parts to its staging copy of the
// canonical checkpoint (each chunk at most once, by its region hashes),
// and publishes the result as the version through the Publisher: the
// announcement, the chunks the receivers get, the manifest and the joint
// commit are those of docs/protocol.md. Ranks advance their baselines
// only when the version's decision is commit.
//
// Parts live in a store the ranks and the coordinator share (the trainer
// cluster's side: a directory or an S3 prefix), under
//   parts/<V>/<rank>/chunk/<k>   sealed chunk k of the rank's part
//   parts/<V>/<rank>/list        sealed part list, written last
// Neither class is thread-safe; different ranks' objects are independent.
#ifndef REFIT_RANKS_PARTS_H_
#define REFIT_RANKS_PARTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "refit/status.h"
#include "sync/auth.h"
#include "sync/publisher.h"
#include "trainer/rank_encoder.h"
#include "transport/object_store.h"

namespace refit::ranks {

std::string PartChunkKey(uint64_t version, uint32_t rank, uint64_t k);
std::string PartListKey(uint64_t version, uint32_t rank);

struct PartEntry {
  uint64_t size = 0;
  Sha256 sha256{};
};

// The part list: which version and base it belongs to, the canonical
// tensor table it indexes (count and a hash of the sorted names), and its
// chunks.
struct PartList {
  uint64_t version = 0;
  uint64_t base_version = 0;
  uint32_t rank = 0;
  uint64_t tensor_count = 0;
  uint64_t names_hash = 0;
  std::vector<PartEntry> chunks;
};
std::vector<uint8_t> EncodePartList(const PartList& list);
Result<PartList> DecodePartList(std::span<const uint8_t> body);

// XXH3-64 over the sorted canonical names, each followed by a zero byte.
uint64_t HashTensorNames(std::vector<std::string> names);

struct RankPublisherOptions {
  Authenticator auth = Authenticator::None();
  int upload_threads = 4;
  int poll_ms = 20;
};

struct RankPartReport {
  uint64_t version = 0;
  uint64_t base_version = 0;
  trainer::RankReport encode;
  uint64_t bytes_uploaded = 0;
  double seconds = 0;
};

class RankPublisher {
 public:
  // `parts` holds the parts; `store` is the protocol's store, read for
  // decisions and the head; `encoder` has its baseline at `committed`.
  static Result<std::unique_ptr<RankPublisher>> Open(ObjectStore* parts, ObjectStore* store,
                                                     trainer::RankEncoder* encoder,
                                                     uint32_t rank, uint64_t committed,
                                                     RankPublisherOptions options);

  uint64_t committed_version() const { return committed_; }

  // Encodes and uploads this rank's part of `version` (base: the committed
  // version). Re-running it after a crash re-uploads byte-identical
  // objects.
  Result<RankPartReport> Publish(uint64_t version, const std::vector<TensorView>& local);

  // Waits up to timeout_ms for the decision of the version published last:
  // commit advances the encoder's baseline (true), abort keeps it (false).
  // kDeadlineExceeded when none arrives in time (call again).
  Result<bool> AwaitDecision(int timeout_ms);

 private:
  RankPublisher() = default;
  ObjectStore* parts_ = nullptr;
  ObjectStore* store_ = nullptr;
  trainer::RankEncoder* encoder_ = nullptr;
  uint32_t rank_ = 0;
  uint64_t committed_ = 0;
  uint64_t pending_ = 0;  // the version published last, 0 when none
  uint64_t names_hash_ = 0;  // of the encoder's canonical tensors
  RankPublisherOptions opt_;
};

struct CoordinatorOptions {
  std::vector<uint32_t> ranks;  // every rank that owns canonical elements
  Authenticator auth = Authenticator::None();
  int parts_timeout_ms = 600000;
  int poll_ms = 20;
  int threads = 0;
};

struct CoordinatedReport {
  PublishReport publish;          // the joint commit (docs/protocol.md)
  uint64_t part_chunks = 0;       // chunks received from the ranks
  uint64_t part_bytes = 0;
  uint64_t changed_elements = 0;  // over all parts
  double wait_seconds = 0;        // until every part was stored
  double apply_seconds = 0;       // checking and applying the parts
};

class PartsCoordinator {
 public:
  // `publisher` is open on the protocol store with its baseline at
  // `baseline_path`; `staging_path` is the coordinator's working copy of
  // the committed version (created from the baseline when missing,
  // otherwise checked against it).
  static Result<std::unique_ptr<PartsCoordinator>> Open(ObjectStore* parts, Publisher* publisher,
                                                        const std::string& baseline_path,
                                                        const std::string& staging_path,
                                                        CoordinatorOptions options);

  // Waits for every rank's part of `version`, applies them to staging and
  // publishes staging as `version`. On abort or any error the staging copy
  // is rolled back to the committed version; rerun to resume.
  Result<CoordinatedReport> Publish(uint64_t version);

 private:
  PartsCoordinator() = default;
  ObjectStore* parts_ = nullptr;
  Publisher* publisher_ = nullptr;
  std::unique_ptr<Checkpoint> staging_;
  CoordinatorOptions opt_;
  uint64_t names_hash_ = 0;
};

}  // namespace refit::ranks

#endif  // REFIT_RANKS_PARTS_H_
