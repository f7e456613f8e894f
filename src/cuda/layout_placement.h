// Placements (placement.h) from a layout (docs/layout.md): a serving
// engine's rank describes its own parameters (fused qkv_proj and
// gate_up_proj, tensor-parallel shards of its own degree, transposed
// storage) in the same layout form as a trainer rank, so one generator
// serves both sides, and a GPU receiver applies canonical chunks straight
// into those parameters.
//
// Each piece of the rank's local tensors becomes one TensorPlacement of its
// canonical tensor, viewed as [elements / S, S] where S is the piece's
// canonical stride across its runs. The receiver applies bits: a local
// tensor's dtype must be its canonical tensors' dtype (conversions are the
// trainer's, docs/trainer.md). Pure; thread-safe.
#ifndef REFIT_CUDA_LAYOUT_PLACEMENT_H_
#define REFIT_CUDA_LAYOUT_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <string>

#include "cuda/placement.h"
#include "layout/layout.h"
#include "refit/checkpoint.h"
#include "refit/status.h"

namespace refit::cuda {

// The placements of rank `rank` of `layout`, whose local tensor named n
// starts at byte address local_address.at(n) (every local tensor of the
// rank must be given). Errors: INVALID_ARGUMENT for an unknown rank, a
// missing address, a dtype that differs from the canonical one, or a piece
// whose canonical side is not a block of rows or columns.
Result<PlacementPlan> PlanFromLayout(
    const layout::Layout& layout, uint32_t rank,
    const std::map<std::string, uint64_t>& local_address,
    const DTypeRegistry& dtypes = {});

}  // namespace refit::cuda

#endif  // REFIT_CUDA_LAYOUT_PLACEMENT_H_
