// The per-element passes of the conditional XOR codec (conditional.cc)
// compiled for several instruction sets: the baseline in conditional.cc,
// AVX2 + BMI2 in conditional_avx2.cc (built with those flags, chosen at run
// time, as base/xxh3_kernels.h does for hashing). Every kernel returns the
// same results; the payload bytes never depend on the one chosen.
//
// Internal to src/codec. The kernels are pure functions of their
// arguments and thread-safe. Only plain data and function declarations
// live here, so no inline code is compiled with two sets of flags.
#ifndef REFIT_CODEC_CONDITIONAL_KERNELS_H_
#define REFIT_CODEC_CONDITIONAL_KERNELS_H_

#include <cstdint>

namespace refit::codec::internal {

// The classes (docs/format.md §4.3) of a block of 64 elements as three bit
// planes: bit j of bit[b] is bit b of the class of the block's element j.
struct ConditionalBlock {
  uint64_t bit[3];
};

// Classifies `blocks` full blocks of 64 elements (2 bytes each) at base,
// class window lo, into out[0 .. blocks-1].
using ClassifyFn = void (*)(const uint8_t* base, uint32_t blocks, uint32_t lo,
                            ConditionalBlock* out);

// Finds the changed elements of `blocks` blocks. Class c's members, in
// element order, are numbered from off[c] on in the bit array `changed`
// (bit i of changed[i / 64]), which marks the changed ones; readable one
// word past the highest member. For each block b, hits[b] receives the
// block's changed elements (bit j: element j), and off[c] advances past the
// block's members of class c. valid_last: the elements of the last block
// (all ones when it is full); bits past them are not members of any class.
using PlaceFn = void (*)(const ConditionalBlock* classes, uint32_t blocks,
                         uint64_t valid_last, const uint64_t* changed,
                         uint64_t off[8], uint64_t* hits);

void ClassifyBaseline(const uint8_t* base, uint32_t blocks, uint32_t lo,
                      ConditionalBlock* out);
void PlaceBaseline(const ConditionalBlock* classes, uint32_t blocks,
                   uint64_t valid_last, const uint64_t* changed, uint64_t off[8],
                   uint64_t* hits);
#if defined(REFIT_CODEC_X86)
void ClassifyAvx2(const uint8_t* base, uint32_t blocks, uint32_t lo,
                  ConditionalBlock* out);
// With PDEP (BMI2), one instruction per class and block.
void PlaceBmi2(const ConditionalBlock* classes, uint32_t blocks,
               uint64_t valid_last, const uint64_t* changed, uint64_t off[8],
               uint64_t* hits);
#endif

}  // namespace refit::codec::internal

#endif  // REFIT_CODEC_CONDITIONAL_KERNELS_H_
