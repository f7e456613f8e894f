// SyncPublisher: the trainer's side of versions that travel through an
// ObjectStore (docs/protocol.md, "Publisher"). Publish() announces a
// version, diffs it against the publisher's baseline (its own copy of the
// committed version), uploads each chunk as soon as it is encoded so that
// receivers apply while the upload goes on, writes the manifest, then
// coordinates the joint commit: it collects every member's vote up to a
// deadline, serves the re-sends recovering receivers ask for, and writes
// the one decision. The baseline advances only on commit.
//
// This is the library's publisher behind a stable interface: what it holds
// stays private to the library. Not thread-safe; the store must outlive
// the publisher.
#ifndef REFIT_PUBLISHER_H_
#define REFIT_PUBLISHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "refit/auth.h"
#include "refit/delta.h"
#include "refit/status.h"
#include "refit/store.h"

namespace refit {

enum class DeadlinePolicy {
  kAbort,  // a member that misses the vote deadline aborts the version
  kDrop,   // commit with the members that voted; the others must resync
};

// The policy's name as `refit publish --policy` and the Python module take
// it: "abort" or "drop".
std::string_view DeadlinePolicyName(DeadlinePolicy policy);
// The policy named `name` (DeadlinePolicyName); kInvalidArgument for any
// other name.
Result<DeadlinePolicy> ParseDeadlinePolicy(std::string_view name);

struct SyncPublisherOptions {
  // The receivers that vote on each version (their SyncReceiverOptions::
  // member names): at least one, each listed once.
  std::vector<std::string> members;
  Authenticator auth = Authenticator::None();
  // Chunking and coding; the version fields are ignored. With
  // diff.allow_conditional, versions may carry conditional XOR chunks,
  // which only CPU receivers apply (docs/protocol.md, "Conditional XOR
  // chunks").
  DiffOptions diff;
  int vote_timeout_ms = 60000;
  DeadlinePolicy policy = DeadlinePolicy::kAbort;
  int upload_threads = 4;
  int poll_ms = 20;
  // snapshot_every N > 0: a full copy of every committed version V with
  // V % N == 0 (and of version 0 when Open creates the store) is stored for
  // receivers too far behind. 0 = never.
  uint64_t snapshot_every = 0;
  // keep_versions K > 0: after each commit, delete decided versions older
  // than the K newest that are not newer than the newest snapshot, and
  // snapshots older than the newest two (docs/protocol.md, "Snapshots and
  // retention"). 0 = keep everything.
  uint64_t keep_versions = 0;
};

// What one Publish() did.
struct SyncPublishReport {
  uint64_t version = 0;
  uint64_t base_version = 0;
  bool committed = false;
  std::vector<std::string> dropped;  // members dropped (policy kDrop)
  std::string reason;                // why aborted or who was dropped
  DiffReport diff;
  uint64_t bytes_uploaded = 0;
  uint64_t resends_served = 0;
  double encode_upload_seconds = 0;  // until the manifest was stored
  double commit_seconds = 0;         // votes and decision
  double seconds = 0;
  bool snapshot = false;  // a snapshot of this version was stored
  uint64_t versions_deleted = 0;   // by retention after this commit
  uint64_t snapshots_deleted = 0;
  // Retention is best effort (the commit stands; the next commit retries):
  // why it stopped, empty when it ran to the end.
  std::string retention_error;
};

class SyncPublisher {
 public:
  // `baseline` is the publisher's own copy of the committed version, a
  // safetensors file or checkpoint directory that it rewrites on each
  // commit; its version is the store's head (0 when the store is new, in
  // which case head 0 is written). kInvalidArgument for bad options.
  static Result<std::unique_ptr<SyncPublisher>> Open(
      ObjectStore* store, const std::string& baseline,
      SyncPublisherOptions options);
  ~SyncPublisher();
  SyncPublisher(const SyncPublisher&) = delete;
  SyncPublisher& operator=(const SyncPublisher&) = delete;

  uint64_t committed_version() const;

  // Publishes `target` (the baseline's tensors: same names, dtypes and
  // shapes) as `version` (> committed_version()) and returns once it is
  // decided: committed, or aborted (report.committed false, report.reason
  // says why; the baseline is unchanged). kFailedPrecondition when the
  // baseline does not hold the committed version's weights. Re-running a version a previous
  // publisher started resumes it: re-uploads are byte-identical and an
  // existing decision is honoured, never overwritten.
  Result<SyncPublishReport> Publish(uint64_t version,
                                    const std::vector<TensorView>& target);
  // The same with the target read from a checkpoint file or directory.
  Result<SyncPublishReport> PublishCheckpoint(uint64_t version,
                                              const std::string& target_path);

  // Serves re-send requests for a decided `version` from the baseline for
  // up to `ms` milliseconds (receivers that fell out of the vote).
  Status Serve(uint64_t version, int ms);

 private:
  struct Impl;
  explicit SyncPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit

#endif  // REFIT_PUBLISHER_H_
