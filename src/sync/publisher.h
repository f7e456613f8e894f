// Publisher and commit coordinator (docs/protocol.md, "Publisher").
//
// Publish() announces a new version (index/<V>: base, members, tensor
// table with the base's hashes), diffs it against the committed baseline
// and streams each chunk to the store as soon as it is encoded (uploads
// overlap encoding, receivers apply while the upload goes on), writes the
// manifest, then coordinates the joint commit: it
// waits for every member's vote up to a deadline, serves overwrite
// re-sends that recovering receivers ask for, and writes the one decision
// (PutIfAbsent: a restarted coordinator can never write a second one). The
// baseline advances only on commit. Not thread-safe.
#ifndef REFIT_SYNC_PUBLISHER_H_
#define REFIT_SYNC_PUBLISHER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "refit/publisher.h"
#include "refit/status.h"
#include "sync/auth.h"
#include "sync/protocol.h"
#include "sync/publisher_baseline.h"
#include "transport/object_store.h"

namespace refit {

struct PublisherOptions {
  std::vector<std::string> members;
  Authenticator auth = Authenticator::None();
  DiffOptions diff;  // version fields are set by Publish()
  int vote_timeout_ms = 60000;
  DeadlinePolicy policy = DeadlinePolicy::kAbort;
  int upload_threads = 4;
  int poll_ms = 20;
  // Chunk packs (docs/protocol.md, "Chunk packs"): consecutive chunks
  // whose sealed objects are smaller than pack_bytes are stored together,
  // as one object of at most pack_bytes (and kMaxPackChunks chunks), at
  // the first one's key. 0 (the default): every chunk is an object of its
  // own. Worth it for checkpoints of many small tensors, where each object
  // costs a PUT (a file and two fsyncs in a directory store). Off by
  // default: receivers that predate packs cannot read them.
  uint64_t pack_bytes = 0;
  // Snapshots and retention (docs/protocol.md, "Snapshots and retention").
  // snapshot_every N: after version V commits with V % N == 0, store a full
  // copy of the committed baseline under snap/<V>/; with N > 0 version 0 is
  // also snapshotted when Open creates the store. 0 = never.
  uint64_t snapshot_every = 0;
  // keep_versions K: after each commit, delete decided versions older than
  // the K newest that are not newer than the newest snapshot, and snapshots
  // older than the newest two. 0 = keep everything.
  uint64_t keep_versions = 0;
  // A checkpoint baseline (Open with a path) keeps its 64 KiB segment
  // digests across versions and hashes its bytes only in every N-th
  // version's diff, or when its files changed (FileBaselineOptions::
  // full_check_every; docs/protocol.md, "Publisher"). 1: every version.
  int full_baseline_check_every = FileBaselineOptions().full_check_every;
};

struct PublishReport {
  uint64_t version = 0;
  uint64_t base_version = 0;
  bool committed = false;
  std::vector<std::string> dropped;
  std::string reason;  // why aborted or who was dropped
  DiffReport diff;
  uint64_t bytes_uploaded = 0;
  uint64_t resends_served = 0;
  double encode_upload_seconds = 0;  // until the manifest is stored
  double commit_seconds = 0;         // votes and decision
  double seconds = 0;
  bool snapshot = false;             // a snapshot of this version was stored
  uint64_t versions_deleted = 0;     // by retention after this commit
  uint64_t snapshots_deleted = 0;
  // Retention is best effort (the commit stands; the next commit retries):
  // why it stopped, empty when it ran to the end.
  std::string retention_error;
  // Where Publish() spent its time (wall seconds), for benchmarks.
  struct Stages {
    double prepare = 0;  // baseline check, superseded versions, announcement
    double encode = 0;   // the diff until its last chunk was queued for upload
    double encode_blocked = 0;  // of which waiting for room in the upload queue
    double upload_drain = 0;    // the uploads still running when the diff ended
    double manifest = 0;        // the manifest stored
    double vote_wait = 0;       // manifest stored -> every vote read
    double decision = 0;        // the decision stored
    double advance = 0;         // the baseline advanced (copy, check, sync)
    double advance_sync = 0;    // of which making it durable (file baselines)
    double finish = 0;          // snapshot, head, retention
  };
  Stages stages;
  // The diff hashed the baseline's bytes (else its kept digests served).
  bool base_hashed = true;
  // Bytes of the committed chunks' ranges the advance compared, and of
  // those the bytes it stored (file baselines; 0 where not measured).
  uint64_t advance_compared_bytes = 0;
  uint64_t advance_stored_bytes = 0;
};

class Publisher {
 public:
  // `baseline` is the publisher's own copy of the committed version (a
  // checkpoint opened read-write); its version is the store's head (0 when
  // the store is new, in which case head 0 is written).
  static Result<std::unique_ptr<Publisher>> Open(ObjectStore* store,
                                                 const std::string& baseline,
                                                 PublisherOptions options);
  // The same with any baseline (publisher_baseline.h), e.g. one in device
  // memory; Publish's targets are then in its memory kind.
  static Result<std::unique_ptr<Publisher>> Open(ObjectStore* store,
                                                 std::unique_ptr<PublisherBaseline> baseline,
                                                 PublisherOptions options);

  uint64_t committed_version() const { return committed_; }

  // Publishes `target` (same tensors as the baseline) as `version`
  // (> committed_version()). Resumes a version a previous publisher
  // started: re-uploads are byte-identical, and an existing decision is
  // honoured, never overwritten.
  Result<PublishReport> Publish(uint64_t version, const std::vector<TensorView>& target);
  Result<PublishReport> PublishCheckpoint(uint64_t version, const std::string& target_path);

  // Whether `target` holds exactly the tensors `version` was published
  // with (every tensor's hash against the version's manifest), so that
  // re-running its publish is a resume. FAILED_PRECONDITION naming the
  // head version when it is other weights; NOT_FOUND when the version has
  // no manifest.
  Status CheckPublished(uint64_t version, const std::vector<TensorView>& target);

  // Serves re-send requests for `version` from the baseline (after its
  // decision) for up to `ms` milliseconds.
  Status Serve(uint64_t version, int ms);

 private:
  Publisher(ObjectStore* store, PublisherOptions options)
      : store_(store), opt_(std::move(options)) {}
  // The tensor table recording `version`'s hashes ("after"): its manifest,
  // or its snapshot index; nullopt when the store holds neither.
  Result<std::optional<std::vector<TensorEntry>>> VersionTensors(uint64_t version);
  // FAILED_PRECONDITION unless the baseline hashes to the head version's
  // tensor table (when the store records one).
  Status CheckBaseline();
  Status TargetMatches(const Manifest& m, const std::vector<TensorView>& target);
  Status ServeRequests(uint64_t version, const std::vector<TensorEntry>& tensors,
                       const std::vector<TensorView>* target, uint64_t* served);
  // Collects the members' votes on `version` (manifest `m` stored),
  // serving re-sends meanwhile, and writes or reads its decision.
  Result<Decision> VoteAndDecide(uint64_t version, const Manifest& m,
                                 const std::vector<TensorView>& target, PublishReport* report);
  // Writes an abort decision for every announced, undecided version
  // between the committed one and `version`.
  Status AbortSuperseded(uint64_t version);
  Status AdvanceBaseline(const Manifest& m, const std::vector<TensorView>& target);
  // Stores snap/<version>/ from the baseline, which must hold that version.
  Status WriteSnapshot(uint64_t version);
  // Applies the retention rule after a commit; counts into `report`.
  Status Retain(PublishReport* report);
  Status DeletePrefix(const std::string& prefix);

  ObjectStore* store_;
  PublisherOptions opt_;
  std::unique_ptr<PublisherBaseline> baseline_;
  std::vector<Hash128> baseline_hashes_;  // per baseline tensor, its RangeHash
  std::unordered_map<std::string, size_t> baseline_index_;  // name -> tensor
  uint64_t committed_ = 0;
  std::map<std::string, Sha256> served_requests_;
};

}  // namespace refit

#endif  // REFIT_SYNC_PUBLISHER_H_
