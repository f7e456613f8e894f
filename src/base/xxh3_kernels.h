// XXH3-128 compiled inline for several instruction sets (docs/format.md §2
// fixes the digests; every kernel returns the same ones). The shared
// libxxhash is built for the baseline x86-64 and hashes cached 64 KiB
// segments at about a third of what AVX2 or AVX-512 reach, and hashing is a
// large share of encode and apply; hash.cc picks the best kernel the CPU
// has, once. Internal to src/base.
#ifndef REFIT_BASE_XXH3_KERNELS_H_
#define REFIT_BASE_XXH3_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace refit::internal {

struct Xxh3Digest {
  uint64_t lo, hi;
};

Xxh3Digest Xxh3Baseline(const void* data, size_t size);
#if defined(REFIT_XXH3_X86)
Xxh3Digest Xxh3Avx2(const void* data, size_t size);
Xxh3Digest Xxh3Avx512(const void* data, size_t size);
#endif

}  // namespace refit::internal

#endif  // REFIT_BASE_XXH3_KERNELS_H_
