// The trainer side of versions published by many ranks (docs/trainer.md,
// "Versions from many ranks"; docs/protocol.md, "Versions from many
// ranks").
//
// A trainer rank holds shards of tensors in its framework's layout
// (refit/layout.h). Every rank:
//   1. encodes the changes of the canonical elements it owns, against its
//      own baseline, in its own layout (RankEncoder): no tensor is
//      assembled and no other rank is asked;
//   2. uploads them as its part of the version (RankPublisher::Publish);
//   3. waits for the version's decision (RankPublisher::AwaitDecision),
//      serving the re-sends receivers ask for of its own chunks meanwhile;
//      commit advances its baseline, abort keeps it.
// One coordinator per version turns the ranks' parts into a version of
// the distribution protocol:
//   - DirectCoordinator: the ranks upload to the protocol store itself; it
//     checks the part lists, writes the announcement and a manifest that
//     lists the ranks' chunks where they are, collects the receivers' votes
//     and writes the decision. It reads no chunk and holds no tensor.
//   - PartsCoordinator: assembles the parts into its staging copy of the
//     canonical checkpoint and publishes that as a single trainer would,
//     for receivers that cannot apply the ranks' strided regions (the
//     two-phase and GPU receivers) and for catch-up by folding.
//
// These are the library's rank encoder, rank publisher and coordinators
// behind a stable interface: what they hold stays private to the library.
// None of the classes is thread-safe; objects of different ranks are
// independent (one process may run several ranks on threads). Stores and
// encoders passed by pointer must outlive the objects opened on them.
#ifndef REFIT_TRAINER_H_
#define REFIT_TRAINER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "refit/auth.h"
#include "refit/delta.h"
#include "refit/layout.h"
#include "refit/publisher.h"
#include "refit/status.h"
#include "refit/store.h"

namespace refit {

struct RankEncoderOptions {
  // Upper bound on one chunk's region bytes (whole canonical rows, or a
  // part of one row that alone exceeds it).
  uint64_t chunk_bytes = uint64_t{8} << 20;
  int threads = 0;  // Encode's workers; 0 = all cores
  // Payload coding, as in DiffOptions: records per rANS lane (fewer means
  // more parallel lanes for GPU decoders) and the zstd level of dense
  // planes.
  uint32_t records_per_lane = 1024;
  int zstd_level = 3;
  // Residual chunks (local dtype differs from the checkpoint's) as
  // overwrite records instead of XOR.
  bool residual_overwrite = false;
};

// What one Encode() did.
struct RankEncodeReport {
  uint64_t owned_elements = 0;
  uint64_t owned_bytes = 0;       // canonical bytes owned (the baseline's size)
  uint64_t changed_direct = 0;    // changed canonical elements, local dtype = checkpoint's
  uint64_t changed_residual = 0;  // changed canonical elements, converted dtypes
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;  // serialized chunk bytes
  uint64_t peak_scratch_bytes = 0;
  double seconds = 0;
};

// One chunk as Encode() emits it: a canonical region of one tensor
// (docs/format.md §3) and the serialized chunk that changes it.
struct RankChunk {
  std::span<const uint8_t> bytes;  // the serialized chunk; valid during the call
  uint64_t tensor_id = 0;          // index into RankEncoder::canonical_tensors()
  // The region: `count` elements from `start` (run 0), or count / run rows
  // of `run` elements, row r starting at start + r * stride.
  uint64_t start = 0, count = 0, run = 0, stride = 0;
  uint64_t changed = 0;   // elements whose bits differ
  std::string_view kind;  // "sparse-xor", "dense-xor", "sparse-overwrite", "raw"
};

// The amax (largest magnitude, in FP32) of whole canonical tensors, by the
// quantized tensor's canonical name (docs/trainer.md, "Scales of tensors
// split across ranks"). A per_tensor FP8 scale and an nvfp4 global scale
// (weight_scale_2) are the amax of the whole tensor; a rank that owns only
// part of such a tensor (RankEncoder::global_amax_tensors) takes it from
// the caller for each version, e.g. an all-reduce MAX of every owner's
// local amax over the trainer's process group. Entries for other tensors
// are ignored, so every rank may be given the same map.
using GlobalAmax = std::map<std::string, float>;

// Receives each chunk as it is encoded, from the calling thread, in a
// deterministic order. A non-OK status stops Encode(), which returns it.
using RankChunkFn = std::function<Status(const RankChunk&)>;

// Per rank: detect, project and encode the changes of the canonical
// elements this rank owns (docs/trainer.md, "Per rank, per version").
// Memory: the baseline holds the owned canonical bytes once (in the
// checkpoint's dtype); Encode adds scratch of a few chunks and keeps the
// encoded chunks until Commit() folds them into the baseline.
class RankEncoder {
 public:
  // The encoder of rank `rank` (a RankLayout::rank of `layout`). The
  // layout is validated and ownership assigned here, as every rank does
  // from the same layout. Errors: those of layout::AssignOwnership (which
  // validates first); kInvalidArgument when the layout has no such rank.
  // The baseline is unset until SetBaseline*.
  static Result<std::unique_ptr<RankEncoder>> Create(const layout::Layout& layout, uint32_t rank,
                                                     RankEncoderOptions options = {});
  ~RankEncoder();
  RankEncoder(const RankEncoder&) = delete;
  RankEncoder& operator=(const RankEncoder&) = delete;

  uint32_t rank() const;
  // The version's tensor table order: the canonical tensors sorted by
  // name (RankChunk::tensor_id indexes it).
  const std::vector<layout::CanonicalTensor>& canonical_tensors() const;
  // This rank's local tensors, in the layout's order: what Encode and
  // SetBaselineFromLocal take, by name.
  const std::vector<layout::LocalTensor>& local_tensors() const;
  // Canonical bytes this rank owns: the baseline's size.
  uint64_t owned_bytes() const;

  // Sets the baseline from canonical tensors (a checkpoint at the
  // committed version, CheckpointViews): only the owned regions are read.
  // kInvalidArgument when a tensor is missing or its dtype or shape
  // differs from the layout's.
  Status SetBaseline(const std::vector<TensorView>& canonical);
  // Sets the baseline from this rank's local tensors (by local name),
  // converted where the layout says so: for a trainer that starts from its
  // own state. Every rank must start from the same version. `amax` as for
  // Encode.
  Status SetBaselineFromLocal(const std::vector<TensorView>& local,
                              const GlobalAmax& amax = {});

  // The quantized canonical tensors (sorted by name) this rank owns only
  // part of whose scale is the amax of the whole tensor (per_tensor FP8,
  // nvfp4): Encode, SetBaselineFromLocal and RankPublisher::Publish need
  // their GlobalAmax. Empty when the rank owns each such tensor whole.
  std::vector<std::string> global_amax_tensors() const;

  // Encodes the owned regions of `local` (this rank's tensors by local
  // name, in its own layout, in host memory) against the baseline as
  // chunks of `version` from `base_version`, handing each to `emit` (may
  // be empty). The chunks are kept until Commit() or Abort(); encoding
  // again before either replaces them.
  // Note 1: the baseline must be set (kFailedPrecondition otherwise).
  // Note 2: chunks are XOR records (the rank holds the exact base bits),
  // or overwrite records for residual chunks with residual_overwrite.
  // Note 3: encoding the same tensors twice gives the same bytes.
  // Note 4: `amax` must hold the whole-tensor amax of every tensor of
  // global_amax_tensors(); kInvalidArgument naming the tensor when one is
  // missing, NaN, negative or below the amax of the rank's own elements.
  // Every owner must pass the same value: owners given different amaxes
  // produce a version whose receivers' hashes do not match (it aborts).
  // The owner of the tensor's element 0 emits the scale.
  Result<RankEncodeReport> Encode(uint64_t version, uint64_t base_version,
                                  const std::vector<TensorView>& local,
                                  const RankChunkFn& emit = {}, const GlobalAmax& amax = {});
  // The version encoded last committed: the baseline becomes its bits.
  Status Commit();
  // The version encoded last aborted: the baseline stays.
  void Abort();
  // Chunks of the last Encode() not yet committed or aborted.
  size_t pending_chunks() const;
  // Note 5: while a RankPublisher is open on the encoder, only the
  // publisher encodes, commits and aborts (Publish, AwaitDecision).

 private:
  friend class RankPublisher;
  struct Impl;
  explicit RankEncoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct RankPublisherOptions {
  Authenticator auth = Authenticator::None();  // seals the part's objects
  int upload_threads = 4;
  int poll_ms = 20;  // while waiting for the decision
  // Chunk packs (docs/protocol.md, "Chunk packs"): consecutive chunks of
  // the part whose sealed objects are smaller than pack_bytes are stored
  // together, as one object of at most pack_bytes (and 4,096 chunks), at
  // the first one's key; the part list (format 3) gives each chunk's
  // offset in its pack. Each chunk keeps its own envelope and is checked
  // and applied on its own. 0 (default): one object per chunk; receivers
  // and coordinators that predate packs cannot read a packed part.
  uint64_t pack_bytes = 0;
};

// What one RankPublisher::Publish() did.
struct RankPartReport {
  uint64_t version = 0;
  uint64_t base_version = 0;
  RankEncodeReport encode;
  uint64_t bytes_uploaded = 0;
  double seconds = 0;
};

// One rank's side of the versions: its part of each version in a store,
// the version's decision read back from the protocol store.
class RankPublisher {
 public:
  // Opens rank encoder->rank()'s publisher. `store` is the protocol
  // store, read for decisions and the head. `parts` holds the rank's parts
  // (parts/<V>/<rank>/...): nullptr or `store` itself for the direct path
  // (DirectCoordinator), a store the ranks and a PartsCoordinator share
  // otherwise. `encoder` has its baseline at `committed`; nullopt reads
  // the store's head (0 when the store has none), which fails as the
  // store's Get does, or as Authenticator::Open for a head that
  // `options.auth` does not open (kUnauthenticated, kDataLoss). kInvalidArgument for a null store or
  // encoder.
  static Result<std::unique_ptr<RankPublisher>> Open(ObjectStore* store, ObjectStore* parts,
                                                     RankEncoder* encoder,
                                                     std::optional<uint64_t> committed,
                                                     RankPublisherOptions options = {});
  ~RankPublisher();
  RankPublisher(const RankPublisher&) = delete;
  RankPublisher& operator=(const RankPublisher&) = delete;

  uint64_t committed_version() const;

  // Encodes this rank's owned regions of `local` (by local name) as its
  // part of `version` from the committed version and uploads it: the
  // chunks, then the part list. Re-running it after a crash re-uploads
  // byte-identical objects. kInvalidArgument when `version` is not above
  // the committed version; kFailedPrecondition while the previous
  // version's decision has not been seen (AwaitDecision). `amax`: as for
  // RankEncoder::Encode (Note 4), the whole-tensor amax of the tensors
  // this rank owns only part of.
  Result<RankPartReport> Publish(uint64_t version, const std::vector<TensorView>& local,
                                 const GlobalAmax& amax = {});

  // Waits up to timeout_ms for the decision of the version published last:
  // commit advances the encoder's baseline and returns true, abort keeps
  // it and returns false. kDeadlineExceeded when none arrives in time:
  // call again. While it waits on a direct version it serves the overwrite
  // re-sends that receivers killed inside one of this rank's regions ask
  // for, from the encoder's baseline and kept chunks; so a rank should
  // keep calling it until the decision, not only poll for one.
  Result<bool> AwaitDecision(int timeout_ms);

  // Re-sends stored by this rank since it was opened.
  uint64_t resends_served() const;

 private:
  struct Impl;
  explicit RankPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct DirectCoordinatorOptions {
  std::vector<uint32_t> ranks;       // every rank that owns canonical elements
  std::vector<std::string> members;  // the receivers that vote
  Authenticator auth = Authenticator::None();
  int parts_timeout_ms = 600000;  // for every rank's part list
  int vote_timeout_ms = 600000;
  int poll_ms = 20;
  // A checkpoint (file or directory) at the version the store's head
  // names, read once by Open for its tensor table (names, dtypes, shapes,
  // hashes). Needed only when the store records no table for that version
  // (version 0 without a snapshot); empty otherwise. Its tensors are
  // hashed from reads through a few buffers of 2 MiB, not mapped, so
  // reading it adds a few MiB to the coordinator's memory whatever the
  // model's size.
  std::string initial_checkpoint;
};

// What one DirectCoordinator::Publish() did.
struct DirectReport {
  uint64_t version = 0;
  uint64_t base_version = 0;
  bool committed = false;
  std::string reason;             // of an abort
  uint64_t part_chunks = 0;       // chunks the manifest lists
  uint64_t part_bytes = 0;        // their stored sizes, as the part lists state
  uint64_t changed_elements = 0;  // over all parts
  double wait_seconds = 0;        // announcing, then until every part list was stored
  double manifest_seconds = 0;    // the lists' checks and the manifest
  double vote_seconds = 0;        // until every vote (or the deadline)
  double seconds = 0;
};

// Decides versions whose ranks' parts receivers apply where they lie
// (the ranks' RankPublishers open with parts == store). Its memory is the
// part lists and the tensor table; it needs no disk.
class DirectCoordinator {
 public:
  // kInvalidArgument without ranks or members, or for a bad member name;
  // the errors of Checkpoint::Open for initial_checkpoint, and kDataLoss
  // or a file-system error naming the tensor and file when reading one of
  // its tensors fails.
  static Result<std::unique_ptr<DirectCoordinator>> Open(ObjectStore* store,
                                                         DirectCoordinatorOptions options);
  ~DirectCoordinator();
  DirectCoordinator(const DirectCoordinator&) = delete;
  DirectCoordinator& operator=(const DirectCoordinator&) = delete;

  uint64_t committed_version() const;

  // Decides `version` (above the store's head): waits for every rank's
  // part list, checks the lists (authentication, version, base, the
  // canonical tensor table, every region inside its tensor), writes the
  // announcement and the manifest, collects the votes and commits only
  // when every member voted ready with the same tensor hashes.
  // Note 1: a version some coordinator already decided reports that
  // decision.
  // Note 2: when a rank's part list does not arrive in time the result is
  // kDeadlineExceeded naming the missing ranks, and nothing is announced.
  Result<DirectReport> Publish(uint64_t version);

  // Which ranks' part lists of `version` are stored.
  Result<std::vector<uint32_t>> PartsStored(uint64_t version);

 private:
  struct Impl;
  explicit DirectCoordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct PartsCoordinatorOptions {
  // The publisher of the assembled versions: members, authentication (also
  // of the ranks' parts), vote deadline and policy, coding, snapshots and
  // retention.
  SyncPublisherOptions publisher;
  std::vector<uint32_t> ranks;  // every rank that owns canonical elements
  int parts_timeout_ms = 600000;
  int threads = 0;  // checking and applying the parts; 0 = all cores
};

// What a PartsCoordinator did with the ranks' parts of one version.
struct PartsTotals {
  uint64_t part_chunks = 0;  // chunks received from the ranks
  uint64_t part_bytes = 0;
  uint64_t changed_elements = 0;  // over all parts
  double wait_seconds = 0;        // until every part was stored
  double apply_seconds = 0;       // checking and applying the parts
};

// What one PartsCoordinator::Publish() did.
struct PartsReport : PartsTotals {
  SyncPublishReport publish;  // the assembled version's joint commit
};

// Assembles the ranks' parts into versions of canonical ranges. It holds
// two copies of the canonical checkpoint on disk (the publisher's baseline
// and the staging copy) and re-encodes each version, one diff of the model.
class PartsCoordinator {
 public:
  // `store` is the protocol store, `parts` the store the ranks upload
  // their parts to (nullptr: `store`). `baseline` is the publisher's copy
  // of the committed version (SyncPublisher::Open); `staging` the
  // coordinator's working copy, created from the baseline when missing,
  // otherwise checked against it. kInvalidArgument for bad options.
  static Result<std::unique_ptr<PartsCoordinator>> Open(ObjectStore* store, ObjectStore* parts,
                                                        const std::string& baseline,
                                                        const std::string& staging,
                                                        PartsCoordinatorOptions options);
  ~PartsCoordinator();
  PartsCoordinator(const PartsCoordinator&) = delete;
  PartsCoordinator& operator=(const PartsCoordinator&) = delete;

  uint64_t committed_version() const;

  // Waits for every rank's part of `version`, checks each chunk (size and
  // SHA-256 as listed, authentication, version, base, region bounds),
  // applies them to staging at most once each and publishes staging as
  // `version`. kDeadlineExceeded naming the missing ranks when a part does
  // not arrive in time (nothing announced). On abort or any error the
  // staging copy is rolled back to the committed version; rerun to resume.
  Result<PartsReport> Publish(uint64_t version);

 private:
  struct Impl;
  explicit PartsCoordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit

#endif  // REFIT_TRAINER_H_
