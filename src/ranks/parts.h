// Versions published by many trainer ranks (docs/trainer.md, "Versions
// from many ranks").
//
// Every rank encodes the canonical regions it owns (trainer/RankEncoder)
// and uploads them, concurrently with the other ranks, as its **part** of
// a version: sealed chunk objects and, last, a sealed part list naming
// each chunk's size, SHA-256 and region. Two coordinators turn parts into
// versions. The DirectCoordinator (below) only decides: receivers apply
// the ranks' chunks where they lie. The PartsCoordinator waits until every rank's
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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "refit/status.h"
#include "refit/trainer.h"
#include "sync/auth.h"
#include "sync/publisher.h"
#include "trainer/rank_encoder.h"
#include "transport/object_store.h"

namespace refit::ranks {

// The part keys are the protocol's (sync/keys.h): receivers read the
// ranks' chunks there when a version is published directly.
using ::refit::PartChunkKey;
using ::refit::PartListKey;

// One chunk of a part: its stored object (size, SHA-256) and its header's
// metadata, so that a coordinator lists it in a manifest without reading
// its payload.
struct PartEntry {
  uint64_t size = 0;
  Sha256 sha256{};
  uint64_t tensor_id = 0;
  uint64_t start = 0;
  uint64_t count = 0;
  uint64_t run = 0;  // 0: contiguous; else a strided region (docs/format.md §3)
  uint64_t stride = 0;
  uint64_t changed = 0;
  uint8_t kind = 0;
  // Chunk packs (docs/protocol.md, "Chunk packs"): > 0 when the chunk is
  // element `pack_offset` of the pack stored at part chunk
  // (k - pack_offset)'s key; 0 when it is at its own key (alone, or first
  // in its pack).
  uint64_t pack_offset = 0;
};

// The part list: which version and base it belongs to, the canonical
// tensor table it indexes (count and a hash of the sorted names), and its
// chunks (docs/trainer.md, "Part list"). A list with a packed chunk is
// encoded as format 3 ("RFPART03"), others as format 2; both decode.
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

// The public options (refit/trainer.h).
using RankPublisherOptions = ::refit::RankPublisherOptions;

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
                                                     trainer::RankEncoderInterface* encoder,
                                                     uint32_t rank, uint64_t committed,
                                                     RankPublisherOptions options);

  uint64_t committed_version() const { return committed_; }

  // Encodes and uploads this rank's part of `version` (base: the committed
  // version). Re-running it after a crash re-uploads byte-identical
  // objects. `amax`: the whole-tensor amax of the tensors this rank owns
  // only part of whose scale needs it (trainer::GlobalAmax).
  Result<RankPartReport> Publish(uint64_t version, const std::vector<TensorView>& local,
                                 const trainer::GlobalAmax& amax = {});

  // Waits up to timeout_ms for the decision of the version published last:
  // commit advances the encoder's baseline (true), abort keeps it (false).
  // kDeadlineExceeded when none arrives in time (call again). While it
  // waits on a direct version (its manifest stored, `direct`), it serves
  // the overwrite re-sends receivers ask for of this rank's own chunks
  // (sync/resend.h): the region at the base from the encoder's baseline,
  // at the version from the baseline with the chunk applied. A receiver
  // killed inside a region's write repairs it so, without a central copy.
  Result<bool> AwaitDecision(int timeout_ms);

  // Re-sends stored by this rank since it was opened.
  uint64_t resends_served() const { return resends_served_; }

 private:
  RankPublisher() = default;
  // One round of serving re-sends of the pending version (above).
  Status ServeResends();

  ObjectStore* parts_ = nullptr;
  ObjectStore* store_ = nullptr;
  trainer::RankEncoderInterface* encoder_ = nullptr;
  uint32_t rank_ = 0;
  uint64_t committed_ = 0;
  uint64_t pending_ = 0;  // the version published last, 0 when none
  uint64_t names_hash_ = 0;  // of the encoder's canonical tensors
  RankPublisherOptions opt_;
  // The pending version's manifest chunks that are this rank's, by
  // manifest index -> part index, once its manifest was read.
  std::optional<std::map<uint64_t, uint64_t>> own_chunks_;
  std::map<std::string, Sha256> served_requests_;
  uint64_t resends_served_ = 0;
};

struct CoordinatorOptions {
  std::vector<uint32_t> ranks;  // every rank that owns canonical elements
  Authenticator auth = Authenticator::None();
  int parts_timeout_ms = 600000;
  int poll_ms = 20;
  int threads = 0;
};

// The parts' totals (refit/trainer.h) and the joint commit.
struct CoordinatedReport : PartsTotals {
  PublishReport publish;  // the joint commit (docs/protocol.md)
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

// ---------------------------------------------------------------------------
// The direct path (docs/protocol.md, "Versions from many ranks"): the ranks
// upload their parts to the protocol store itself (RankPublisher with
// `parts` == `store`), and the coordinator only decides. It waits for every
// rank's part list (having announced the version, so that receivers read
// the ranks' chunks as they land), checks the lists (authentication,
// version, base, the canonical tensor table, every entry's region inside
// its tensor), and writes a manifest (format 2, `direct`) that lists the
// ranks' chunk objects where they are; receivers stage or apply them.
// It then collects the votes: a ready vote carries the member's tensor
// hashes after the version; it commits only when every member voted ready
// with the same hashes, and records them in the decision, which makes them
// the version's "after" hashes. It never reads a chunk, holds no tensor
// and no file: its memory is the part lists and the tensor table.
struct DirectCoordinatorOptions {
  std::vector<uint32_t> ranks;         // every rank that owns canonical elements
  std::vector<std::string> members;    // the receivers that vote
  Authenticator auth = Authenticator::None();
  int parts_timeout_ms = 600000;
  int vote_timeout_ms = 600000;
  int poll_ms = 20;
  // The tensor table (names, dtypes, shapes, tensor hashes) of the version
  // the store's head names, needed only when the store records none for
  // it (version 0 without a snapshot). TensorTableOf() makes it from a
  // checkpoint at that version, once, on any machine that has one.
  std::vector<TensorEntry> initial;
};

// What one DirectCoordinator::Publish() did: the public report
// (refit/trainer.h).
using DirectReport = ::refit::DirectReport;

// The tensor table of a checkpoint: every tensor's name, dtype, shape and
// hash, as a coordinator's `initial`. Hashes through the checkpoint's
// mappings, so every page of the model enters the resident set; a process
// that holds no model reads the table with ReadTensorTable instead.
std::vector<TensorEntry> TensorTableOf(const Checkpoint& checkpoint);

struct TableReadOptions {
  // Bytes of one read buffer, rounded up to a whole number of 64 KiB hash
  // segments (kRangeHashSegment).
  size_t buffer_bytes = size_t{2} << 20;
  // Threads, each with its own buffer; <= 0: up to 4.
  int threads = 0;
};

// The tensor table TensorTableOf(checkpoint) makes, bit for bit, from
// positioned reads of the checkpoint's files through bounded buffers: no
// page of the model is mapped into the process, so its memory is the
// buffers plus the segment digests of the tensors in flight (16 bytes per
// 64 KiB), whatever the model's size. Each tensor's hash is the outer hash
// of its segment digests (docs/format.md, "Range hash"), the digests
// computed from whole segments of the buffers.
// Errors: kDataLoss when a file ends before a tensor's bytes (the file
// shrank since Open; the message names the tensor and the file), and
// file-system errors, with the same naming.
Result<std::vector<TensorEntry>> ReadTensorTable(const Checkpoint& checkpoint,
                                                 const TableReadOptions& options = {});

class DirectCoordinator {
 public:
  static Result<std::unique_ptr<DirectCoordinator>> Open(ObjectStore* store,
                                                         DirectCoordinatorOptions options);

  uint64_t committed_version() const { return committed_; }

  // Decides version `version` (above the store's head): as above. A
  // version some coordinator already decided reports that decision. The
  // version is announced first, so that receivers read the ranks' chunks
  // as they are stored. A version whose parts did not all arrive by the
  // deadline is DEADLINE_EXCEEDED naming the missing ranks, with nothing
  // written after the announcement (no manifest, no decision): Publish
  // may be called for it again, or a higher version supersedes it. Not
  // thread-safe.
  Result<DirectReport> Publish(uint64_t version);

  // Which ranks' part lists of `version` are stored (for `refit status`).
  Result<std::vector<uint32_t>> PartsStored(uint64_t version);

 private:
  DirectCoordinator() = default;
  // The tensor table of committed version v as the store records it.
  Result<std::vector<TensorEntry>> TableOf(uint64_t v);
  Status AbortSuperseded(uint64_t version);
  Result<Decision> VoteAndDecide(const Manifest& m, std::vector<bool> touched,
                                 DirectReport* report);

  ObjectStore* store_ = nullptr;
  DirectCoordinatorOptions opt_;
  uint64_t committed_ = 0;
};

}  // namespace refit::ranks

#endif  // REFIT_RANKS_PARTS_H_
