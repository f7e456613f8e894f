// Reading a rANS lane's bytes on the device (docs/format.md section 5.3):
// shared by the receiver's decoders (decode_apply.cu, conditional_apply.cu).
#ifndef REFIT_CUDA_LANE_RING_CUH_
#define REFIT_CUDA_LANE_RING_CUH_

#include <cstdint>

namespace refit::cuda::internal {

// dst = *a when p; the load writes dst's own register, so nothing waits for
// it until dst is read (a load into a temporary followed by a move would
// wait at the move).
__device__ inline void LoadIf(bool p, uint32_t& dst, const uint32_t* a) {
  asm("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t"
      "@q ld.global.nc.u32 %0, [%1];\n\t}"
      : "+r"(dst)
      : "l"(a), "r"(static_cast<uint32_t>(p)));
}

// A rANS lane's bytes, read 16 bits at a time from a ring of four aligned
// 32-bit words held in registers: the word holding the read position q sits
// in slot (q / 4) % 4, followed by the next three. When a word is used up
// its slot is refilled with the word 12 bytes ahead, so a renormalization
// waits for memory only if the lane outruns six renormalizations of
// prefetch. Loads may read up to 20 bytes past the lane's last byte;
// payload slots are padded for that (kPayloadPad, kernels.h), and the
// checks on q never let such bytes be used.
struct LaneRing {
  uint32_t w0, w1, w2, w3;

  __device__ uint32_t Pick(uint32_t i) const {
    return i == 0 ? w0 : i == 1 ? w1 : i == 2 ? w2 : w3;
  }
  __device__ void Start(const uint32_t* words, uint32_t q) {
    const uint32_t wi = q >> 2;
    w0 = __ldg(words + wi + ((0 - wi) & 3));
    w1 = __ldg(words + wi + ((1 - wi) & 3));
    w2 = __ldg(words + wi + ((2 - wi) & 3));
    w3 = __ldg(words + wi + ((3 - wi) & 3));
  }
  // The little-endian 16-bit word at q; advances q by 2.
  __device__ uint32_t Take16(const uint32_t* words, uint32_t& q) {
    const uint32_t wi = q >> 2, i = wi & 3;
    const uint32_t v =
        __funnelshift_r(Pick(i), Pick((i + 1) & 3), 8 * (q & 3)) & 0xffffu;
    q += 2;
    if ((q & 3) < 2) {  // word wi is used up
      const uint32_t* a = words + wi + 4;
      LoadIf(i == 0, w0, a);
      LoadIf(i == 1, w1, a);
      LoadIf(i == 2, w2, a);
      LoadIf(i == 3, w3, a);
    }
    return v;
  }
};

}  // namespace refit::cuda::internal

#endif  // REFIT_CUDA_LANE_RING_CUH_
