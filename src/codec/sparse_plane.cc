#include "codec/sparse_plane.h"

#include "codec/payload.h"
#include "codec/rans.h"

namespace refit::codec {

static_assert(kMaxSparsePlanes == kMaxPlanes);

int ChooseSparseModels(std::span<const Histogram> hist, uint32_t n, uint32_t k,
                       uint32_t max_gap, std::vector<Model>* models,
                       std::vector<uint8_t>* header) {
  const int w = static_cast<int>(hist.size()) - kSparseGapBytes;
  const int gw = GapWidthFor(max_gap);
  const int planes = gw + w;
  models->resize(static_cast<size_t>(planes));
  header->push_back(static_cast<uint8_t>(gw));
  for (int j = 0; j < planes; ++j) {
    uint64_t cost;
    (*models)[j] = ChooseModel(hist[SparsePlaneAt(j, gw).histogram()],
                               SparsePlaneContext(j, gw, n, k), &cost);
    WriteModel((*models)[j], header);
  }
  return gw;
}

}  // namespace refit::codec
