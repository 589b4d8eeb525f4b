// probe_util.cuh: what the stand-alone probes in csrc/probes share (not part of the megakernel).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "../mk_ptx.cuh"

// A CUDA runtime call in main(): print where it failed and return 1.
#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

// The megakernel's weight load since 2026-11-30 (ld_weight16): evict_first L2 policy and the
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

// What the streaming probes' main() sets up: a 4 GiB buffer (far beyond L2) filled with 1s, a
// checksum sink for the kernels, and the two timing events. Nonzero on a CUDA error.
struct ProbeMem {
  static constexpr size_t TOTAL = (size_t)4 << 30;
  char* buf = nullptr;
  uint32_t* out = nullptr;
  cudaEvent_t a, b;
};
static int probe_alloc(ProbeMem* m) {
  CK(cudaMalloc(&m->buf, ProbeMem::TOTAL));
  CK(cudaMalloc(&m->out, 4096 * sizeof(uint32_t)));
  CK(cudaMemset(m->buf, 1, ProbeMem::TOTAL));
  CK(cudaEventCreate(&m->a));
  CK(cudaEventCreate(&m->b));
  return 0;
}

// Each of `blocks` blocks' share of the 4 GiB buffer: at most `cap` bytes, in whole MiB (so every
// block's chunk is 16-byte aligned).
static size_t probe_chunk(int blocks, size_t cap) {
  size_t per_block = ProbeMem::TOTAL / blocks;
  if (per_block > cap) per_block = cap;
  return per_block & ~(size_t)((1 << 20) - 1);
}

// The megakernel's clock, cross-block signal / wait pair and tensor-core step (one definition:
// csrc/mk_ptx.cuh).
using mk::globaltimer;
using mk::ld_acquire;
using mk::mma16816;
using mk::signal_release;

// Folds loaded words into a checksum, so that no load is dead code.
__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// The median of five values (sorts them in place).
static double median5(double (&v)[5]) {
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j)
      if (v[j] < v[i]) {
        const double x = v[i];
        v[i] = v[j];
        v[j] = x;
      }
  return v[2];
}

// Run `launch` five times between events a and b; the median time in ms into *ms. Nonzero on a CUDA
// error.
template <class F>
static int median_launch_ms(cudaEvent_t a, cudaEvent_t b, F launch, double* ms) {
  double t[5];
  for (int r = 0; r < 5; ++r) {
    float e = 0.f;
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    CK(cudaEventElapsedTime(&e, a, b));
    t[r] = e;
  }
  *ms = median5(t);
  return 0;
}
