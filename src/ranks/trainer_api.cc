// The public trainer API (include/refit/trainer.h) over the library's own
// rank encoder (trainer/rank_encoder.h), rank publisher and coordinators
// (ranks/parts.h).
#include <utility>

#include "delta/chunk.h"
#include "ranks/parts.h"
#include "refit/checkpoint.h"
#include "refit/trainer.h"
#include "sync/keys.h"
#include "sync/protocol.h"
#include "sync/publisher.h"
#include "sync/sync_publisher.h"
#include "trainer/rank_encoder.h"

namespace refit {
namespace {

RankEncodeReport ToPublic(const trainer::RankReport& r) {
  RankEncodeReport p;
  p.owned_elements = r.owned_elements;
  p.owned_bytes = r.owned_bytes;
  p.changed_direct = r.changed_direct;
  p.changed_residual = r.changed_residual;
  p.chunks = r.chunks;
  p.payload_bytes = r.payload_bytes;
  p.peak_scratch_bytes = r.peak_scratch_bytes;
  p.seconds = r.seconds;
  return p;
}

// The store's head version, 0 for a store without one.
Result<uint64_t> HeadVersion(ObjectStore* store, const Authenticator& auth) {
  auto head = store->Get(kHeadKey);
  if (!head.ok()) {
    if (head.status().code() == StatusCode::kNotFound) return uint64_t{0};
    return head.status();
  }
  REFIT_ASSIGN_OR_RETURN(std::span<const uint8_t> body, auth.Open(*head));
  return DecodeHead(body);
}

}  // namespace

// ---------------------------------------------------------------------------
// RankEncoder

struct RankEncoder::Impl {
  uint32_t rank = 0;
  std::unique_ptr<trainer::RankEncoder> encoder;
};

Result<std::unique_ptr<RankEncoder>> RankEncoder::Create(const layout::Layout& layout,
                                                         uint32_t rank,
                                                         RankEncoderOptions options) {
  trainer::RankEncoderOptions o;
  o.chunk_bytes = options.chunk_bytes;
  o.threads = options.threads;
  o.codec.records_per_lane = options.records_per_lane;
  o.codec.zstd_level = options.zstd_level;
  o.residual_overwrite = options.residual_overwrite;
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  REFIT_ASSIGN_OR_RETURN(impl->encoder, trainer::RankEncoder::Create(layout, rank, o));
  return std::unique_ptr<RankEncoder>(new RankEncoder(std::move(impl)));
}

RankEncoder::RankEncoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RankEncoder::~RankEncoder() = default;

uint32_t RankEncoder::rank() const { return impl_->rank; }

const std::vector<layout::CanonicalTensor>& RankEncoder::canonical_tensors() const {
  return impl_->encoder->canonical_tensors();
}

const std::vector<layout::LocalTensor>& RankEncoder::local_tensors() const {
  return impl_->encoder->local_tensors();
}

uint64_t RankEncoder::owned_bytes() const { return impl_->encoder->owned_bytes(); }

Status RankEncoder::SetBaseline(const std::vector<TensorView>& canonical) {
  return impl_->encoder->SetBaseline(canonical);
}

Status RankEncoder::SetBaselineFromLocal(const std::vector<TensorView>& local,
                                         const GlobalAmax& amax) {
  return impl_->encoder->SetBaselineFromLocal(local, amax);
}

std::vector<std::string> RankEncoder::global_amax_tensors() const {
  return impl_->encoder->global_amax_tensors();
}

Result<RankEncodeReport> RankEncoder::Encode(uint64_t version, uint64_t base_version,
                                             const std::vector<TensorView>& local,
                                             const RankChunkFn& emit,
                                             const GlobalAmax& amax) {
  auto each = [&emit](std::span<const uint8_t> bytes, const ChunkHeader& h) -> Status {
    if (!emit) return Status();
    RankChunk c;
    c.bytes = bytes;
    c.tensor_id = h.tensor_id;
    c.start = h.start;
    c.count = h.count;
    c.run = h.run;
    c.stride = h.stride;
    c.changed = h.changed;
    c.kind = ChunkKindName(h.kind);
    return emit(c);
  };
  REFIT_ASSIGN_OR_RETURN(trainer::RankReport r,
                         impl_->encoder->Encode(version, base_version, local, each, amax));
  return ToPublic(r);
}

Status RankEncoder::Commit() { return impl_->encoder->Commit(); }
void RankEncoder::Abort() { impl_->encoder->Abort(); }
size_t RankEncoder::pending_chunks() const { return impl_->encoder->pending_chunks(); }

// ---------------------------------------------------------------------------
// RankPublisher

struct RankPublisher::Impl {
  std::unique_ptr<ranks::RankPublisher> publisher;
};

Result<std::unique_ptr<RankPublisher>> RankPublisher::Open(ObjectStore* store, ObjectStore* parts,
                                                           RankEncoder* encoder,
                                                           std::optional<uint64_t> committed,
                                                           RankPublisherOptions options) {
  if (store == nullptr || encoder == nullptr) {
    return InvalidArgumentError("RankPublisher needs a store and an encoder");
  }
  if (!committed) {
    REFIT_ASSIGN_OR_RETURN(committed, HeadVersion(store, options.auth));
  }
  auto impl = std::make_unique<Impl>();
  REFIT_ASSIGN_OR_RETURN(impl->publisher,
                         ranks::RankPublisher::Open(parts != nullptr ? parts : store, store,
                                                    encoder->impl_->encoder.get(), encoder->rank(),
                                                    *committed, std::move(options)));
  return std::unique_ptr<RankPublisher>(new RankPublisher(std::move(impl)));
}

RankPublisher::RankPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RankPublisher::~RankPublisher() = default;

uint64_t RankPublisher::committed_version() const { return impl_->publisher->committed_version(); }

Result<RankPartReport> RankPublisher::Publish(uint64_t version,
                                              const std::vector<TensorView>& local,
                                              const GlobalAmax& amax) {
  REFIT_ASSIGN_OR_RETURN(ranks::RankPartReport r,
                         impl_->publisher->Publish(version, local, amax));
  RankPartReport p;
  p.version = r.version;
  p.base_version = r.base_version;
  p.encode = ToPublic(r.encode);
  p.bytes_uploaded = r.bytes_uploaded;
  p.seconds = r.seconds;
  return p;
}

Result<bool> RankPublisher::AwaitDecision(int timeout_ms) {
  return impl_->publisher->AwaitDecision(timeout_ms);
}

uint64_t RankPublisher::resends_served() const { return impl_->publisher->resends_served(); }

// ---------------------------------------------------------------------------
// DirectCoordinator

struct DirectCoordinator::Impl {
  std::unique_ptr<ranks::DirectCoordinator> coordinator;
};

Result<std::unique_ptr<DirectCoordinator>> DirectCoordinator::Open(
    ObjectStore* store, DirectCoordinatorOptions options) {
  ranks::DirectCoordinatorOptions o;
  o.ranks = std::move(options.ranks);
  o.members = std::move(options.members);
  o.auth = std::move(options.auth);
  o.parts_timeout_ms = options.parts_timeout_ms;
  o.vote_timeout_ms = options.vote_timeout_ms;
  o.poll_ms = options.poll_ms;
  if (!options.initial_checkpoint.empty()) {
    REFIT_ASSIGN_OR_RETURN(
        Checkpoint ck, Checkpoint::Open(options.initial_checkpoint, Checkpoint::Mode::kReadOnly));
    REFIT_ASSIGN_OR_RETURN(o.initial, ranks::ReadTensorTable(ck));
  }
  auto impl = std::make_unique<Impl>();
  REFIT_ASSIGN_OR_RETURN(impl->coordinator, ranks::DirectCoordinator::Open(store, std::move(o)));
  return std::unique_ptr<DirectCoordinator>(new DirectCoordinator(std::move(impl)));
}

DirectCoordinator::DirectCoordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DirectCoordinator::~DirectCoordinator() = default;

uint64_t DirectCoordinator::committed_version() const {
  return impl_->coordinator->committed_version();
}

Result<DirectReport> DirectCoordinator::Publish(uint64_t version) {
  return impl_->coordinator->Publish(version);
}

Result<std::vector<uint32_t>> DirectCoordinator::PartsStored(uint64_t version) {
  return impl_->coordinator->PartsStored(version);
}

// ---------------------------------------------------------------------------
// PartsCoordinator

struct PartsCoordinator::Impl {
  std::unique_ptr<Publisher> publisher;  // outlives coordinator (declared first)
  std::unique_ptr<ranks::PartsCoordinator> coordinator;
};

Result<std::unique_ptr<PartsCoordinator>> PartsCoordinator::Open(ObjectStore* store,
                                                                 ObjectStore* parts,
                                                                 const std::string& baseline,
                                                                 const std::string& staging,
                                                                 PartsCoordinatorOptions options) {
  ranks::CoordinatorOptions o;
  o.ranks = std::move(options.ranks);
  o.auth = options.publisher.auth;
  o.parts_timeout_ms = options.parts_timeout_ms;
  o.poll_ms = options.publisher.poll_ms;
  o.threads = options.threads;
  auto impl = std::make_unique<Impl>();
  REFIT_ASSIGN_OR_RETURN(
      impl->publisher,
      Publisher::Open(store, baseline, ToPublisherOptions(std::move(options.publisher))));
  REFIT_ASSIGN_OR_RETURN(
      impl->coordinator,
      ranks::PartsCoordinator::Open(parts != nullptr ? parts : store, impl->publisher.get(),
                                    baseline, staging, std::move(o)));
  return std::unique_ptr<PartsCoordinator>(new PartsCoordinator(std::move(impl)));
}

PartsCoordinator::PartsCoordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PartsCoordinator::~PartsCoordinator() = default;

uint64_t PartsCoordinator::committed_version() const {
  return impl_->publisher->committed_version();
}

Result<PartsReport> PartsCoordinator::Publish(uint64_t version) {
  REFIT_ASSIGN_OR_RETURN(ranks::CoordinatedReport r, impl_->coordinator->Publish(version));
  PartsReport p;
  static_cast<PartsTotals&>(p) = r;
  p.publish = ToSyncPublishReport(std::move(r.publish));
  return p;
}

}  // namespace refit
