// XXH3-128 inlined and compiled for one instruction set (see
// xxh3_kernels.h; CMakeLists.txt sets this file's compile flags).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/xxh3_kernels.h"

namespace refit::internal {

Xxh3Digest Xxh3Baseline(const void* data, size_t size) {
  XXH128_hash_t h = XXH3_128bits(data, size);
  return Xxh3Digest{h.low64, h.high64};
}

}  // namespace refit::internal
