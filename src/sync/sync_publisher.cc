// The public publisher (include/refit/publisher.h) over the library's own
// (sync/publisher.h).
#include "sync/sync_publisher.h"

#include <utility>

#include "refit/publisher.h"
#include "sync/publisher.h"

namespace refit {

SyncPublishReport ToSyncPublishReport(PublishReport r) {
  SyncPublishReport s;
  s.version = r.version;
  s.base_version = r.base_version;
  s.committed = r.committed;
  s.dropped = std::move(r.dropped);
  s.reason = std::move(r.reason);
  s.diff = std::move(r.diff);
  s.bytes_uploaded = r.bytes_uploaded;
  s.resends_served = r.resends_served;
  s.encode_upload_seconds = r.encode_upload_seconds;
  s.commit_seconds = r.commit_seconds;
  s.seconds = r.seconds;
  s.snapshot = r.snapshot;
  s.versions_deleted = r.versions_deleted;
  s.snapshots_deleted = r.snapshots_deleted;
  s.retention_error = std::move(r.retention_error);
  return s;
}

PublisherOptions ToPublisherOptions(SyncPublisherOptions options) {
  PublisherOptions o;
  o.members = std::move(options.members);
  o.auth = std::move(options.auth);
  o.diff = std::move(options.diff);
  o.vote_timeout_ms = options.vote_timeout_ms;
  o.policy = options.policy;
  o.upload_threads = options.upload_threads;
  o.poll_ms = options.poll_ms;
  o.snapshot_every = options.snapshot_every;
  o.keep_versions = options.keep_versions;
  return o;
}

struct SyncPublisher::Impl {
  std::unique_ptr<Publisher> publisher;
};

Result<std::unique_ptr<SyncPublisher>> SyncPublisher::Open(
    ObjectStore* store, const std::string& baseline,
    SyncPublisherOptions options) {
  auto impl = std::make_unique<Impl>();
  REFIT_ASSIGN_OR_RETURN(
      impl->publisher,
      Publisher::Open(store, baseline, ToPublisherOptions(std::move(options))));
  return std::unique_ptr<SyncPublisher>(new SyncPublisher(std::move(impl)));
}

SyncPublisher::SyncPublisher(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
SyncPublisher::~SyncPublisher() = default;

uint64_t SyncPublisher::committed_version() const {
  return impl_->publisher->committed_version();
}

Result<SyncPublishReport> SyncPublisher::Publish(
    uint64_t version, const std::vector<TensorView>& target) {
  REFIT_ASSIGN_OR_RETURN(PublishReport r,
                         impl_->publisher->Publish(version, target));
  return ToSyncPublishReport(std::move(r));
}

Result<SyncPublishReport> SyncPublisher::PublishCheckpoint(
    uint64_t version, const std::string& target_path) {
  REFIT_ASSIGN_OR_RETURN(
      PublishReport r, impl_->publisher->PublishCheckpoint(version, target_path));
  return ToSyncPublishReport(std::move(r));
}

Status SyncPublisher::Serve(uint64_t version, int ms) {
  return impl_->publisher->Serve(version, ms);
}

}  // namespace refit
