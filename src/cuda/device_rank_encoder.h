// A trainer rank's encoder on the GPU (trainer/rank_encoder.h): the rank's
// owned canonical bytes are kept in device memory, and Encode detects and
// encodes the changes of the rank's local CUDA tensors there, with the GPU
// encoder (encoder.h); only the chunks come to the host.
//
// The plan is the CPU RankEncoder's (RankEncoder::jobs(), created plan-only:
// no host baseline): the same ownership, the same chunk regions, so the
// chunks are byte for byte the CPU encoder's. Every job must be in place
// (RankJob::in_place: the local dtype is the checkpoint's and the job's
// local elements lie consecutively in chunk order, as for row and column
// shards, fused tensors stored by rows and replicated tensors); a layout
// with residual conversions (FP32 masters -> BF16, FP8 scales) or
// transposed storage is refused at Create, naming the tensor, and runs on
// the CPU encoder instead.
//   - Encode: one GPU encoder pair per job (baseline region, local range),
//     chunk_bytes large enough that each job is one range; each chunk comes
//     back with the job's region header (tensor, start, run, stride)
//     written in place of the encoder's range header. The emit callback
//     runs on the encoder's framing thread, one call at a time, while the
//     caller waits in Encode.
//   - Commit: the pending chunks are applied to the device baseline by the
//     GPU receiver (pipeline.h), each job's region a tensor of its own,
//     with every region's "after" hash checked on the device; it does not
//     read the local tensors again, so they may change after Encode.
//   - PendingChunk / PendingRegion (re-sends): the region is copied to the
//     host and, for `after`, the chunk applied there.
// Memory: the owned bytes once in device memory (each job's region on a
// 256-byte boundary), the encoder's staging (GpuEncodeOptions) and the
// receiver's (commit_staging_bytes); the pending chunks in host memory.
// Not thread-safe.
#ifndef REFIT_CUDA_DEVICE_RANK_ENCODER_H_
#define REFIT_CUDA_DEVICE_RANK_ENCODER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cuda/encoder.h"
#include "layout/layout.h"
#include "trainer/rank_encoder.h"

namespace refit::cuda {

struct DeviceRankEncoderOptions {
  int device = 0;
  // Staging and masks of the encoder; version fields and chunk size are
  // set per Encode from the rank encoder's options.
  GpuEncodeOptions encode;
  uint64_t commit_staging_bytes = uint64_t{64} << 20;
};

struct DeviceRankStats {
  double last_encode_ms = 0;  // wall time of the last Encode
  double last_commit_ms = 0;  // of the last Commit
  GpuEncodeReport last_encode;
};

class DeviceRankEncoder final : public trainer::RankEncoderInterface {
 public:
  // `options` are the rank encoder's (chunk_bytes, codec's records per
  // lane, threads for the host's share); residual_overwrite must be off.
  static Result<std::unique_ptr<DeviceRankEncoder>> Create(
      const layout::Layout& layout, uint32_t rank,
      const trainer::RankEncoderOptions& options,
      const DeviceRankEncoderOptions& device_options);
  ~DeviceRankEncoder() override;
  DeviceRankEncoder(const DeviceRankEncoder&) = delete;
  DeviceRankEncoder& operator=(const DeviceRankEncoder&) = delete;

  const std::vector<layout::CanonicalTensor>& canonical_tensors()
      const override;
  uint64_t owned_bytes() const override;

  // Baseline from canonical tensors (host or device addresses), or from
  // this rank's local tensors (host or device addresses), as RankEncoder's.
  Status SetBaseline(const std::vector<TensorView>& canonical);
  Status SetBaselineFromLocal(const std::vector<TensorView>& local);

  // `local`: device addresses on options' device. `amax` is not needed:
  // the device encoder converts nothing, so no scale of its own.
  Result<trainer::RankReport> Encode(uint64_t version, uint64_t base_version,
                                     const std::vector<TensorView>& local,
                                     const trainer::EmitChunkFn& emit,
                                     const trainer::GlobalAmax& amax) override;
  using trainer::RankEncoderInterface::Encode;
  Status Commit() override;
  void Abort() override;
  size_t pending_chunks() const override;
  Result<std::span<const uint8_t>> PendingChunk(size_t index) const override;
  Result<std::vector<uint8_t>> PendingRegion(size_t index,
                                             bool after) const override;

  const DeviceRankStats& stats() const;
  uint64_t device_bytes() const;  // the baseline's allocation

 private:
  struct Impl;
  explicit DeviceRankEncoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit::cuda

#endif  // REFIT_CUDA_DEVICE_RANK_ENCODER_H_
