// HostStagedTarget: a StagedTarget (sync/staged_target.h) over tensors in
// host memory. It stages chunk bytes in ordinary memory (bounded by
// `staging_limit`), applies them with the CPU apply (delta/apply.h) in the
// pause, and restores from undo records (XOR chunks: applying them again)
// when a chunk fails. It applies versions published by several ranks
// (strided regions) as well. For engines on the CPU that want a version applied
// in one short pause, and as the reference the GPU target is tested
// against.
#ifndef REFIT_SYNC_HOST_STAGED_TARGET_H_
#define REFIT_SYNC_HOST_STAGED_TARGET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "refit/delta.h"
#include "sync/staged_target.h"
#include "sync/staging_queue.h"

namespace refit {

class HostStagedTarget : public StagedTarget {
 public:
  // The views must stay valid while the target lives.
  HostStagedTarget(std::vector<MutableTensorView> tensors,
                   uint64_t staging_limit);

  Status Check(const std::vector<TensorEntry>& table) override;
  Result<std::vector<std::optional<Hash128>>> Hashes(
      const std::vector<TensorEntry>& table) override;
  Status Begin() override;
  Status Add(size_t version, const std::vector<TensorEntry>& table,
             std::span<const uint8_t> chunk) override;
  Status Seal() override;
  Result<StagedApplyReport> Apply() override;
  Status Load(const TensorEntry& e, std::span<const uint8_t> bytes) override;
  StagingUsage usage() const override;
  bool AppliesDirectVersions() const override { return true; }
  // Applies the staged chunks of each tensor to a copy of it, one tensor
  // at a time: host memory for the largest tensor with chunks.
  Result<std::vector<Hash128>> HashesAfter(const std::vector<TensorEntry>& table) override;

 private:
  struct Staged {
    size_t version;
    const std::vector<TensorEntry>* table;
    std::vector<uint8_t> bytes;
  };
  Result<uint8_t*> Data(const std::vector<TensorEntry>& table,
                        uint64_t tensor_id);

  std::vector<MutableTensorView> tensors_;
  std::map<std::string, size_t> by_name_;
  StagingQueue<Staged> staging_;
};

}  // namespace refit

#endif  // REFIT_SYNC_HOST_STAGED_TARGET_H_
