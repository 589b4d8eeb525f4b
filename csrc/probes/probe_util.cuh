// probe_util.cuh: what the stand-alone probes in csrc/probes share (not part of the megakernel).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

// A CUDA runtime call in main(): print where it failed and return 1.
#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

// The megakernel's weight load since session 13 (ld_weight16): evict_first L2 policy and the
// L2::128B prefetch-size hint (an L2 miss fetches the whole 128-byte line).
__device__ __forceinline__ uint4 ldw_hint(const void* p, uint64_t pol) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(pol));
  return r;
}

// The L2 evict_first policy the megakernel's weight loads carry (l2_policy(false)).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// Folds loaded words into a checksum, so that no load is dead code.
__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }
