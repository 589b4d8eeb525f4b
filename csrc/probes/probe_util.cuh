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

// A phase of a layer: the block (NTH threads) streams n16 16-byte words from p, 8 loads in flight per
// thread, folded into acc. MATH: as the kernel's GEMV does, each pair of loads also feeds two
// mma.sync with a 16-byte activation fragment from shared memory (xs[(thread + 32 u) & x_mask]), and
// the phase ends with the warps' partial sums reduced through shared memory (`red`, NTH * 4 floats)
// behind a barrier. (layer_probe's phases; gemv_cost_probe's "flat" GEMV.)
template <bool MATH, int NTH>
__device__ __forceinline__ uint32_t phase_stream(const uint4* p, size_t n16, uint32_t acc, uint64_t pol,
                                                 const uint4* xs, int x_mask, float* red) {
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  size_t i = threadIdx.x;
  for (; i + 7 * (size_t)NTH < n16; i += 8 * (size_t)NTH) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = ldw_hint(p + i + (size_t)u * NTH, pol);
    if (MATH) {
#pragma unroll
      for (int u = 0; u < 8; u += 2) {
        const uint4 bx = xs[(threadIdx.x + 32 * u) & x_mask];
        mma16816(c, v[u].x, v[u + 1].x, v[u].y, v[u + 1].y, bx.x, bx.y);
        mma16816(c, v[u].z, v[u + 1].z, v[u].w, v[u + 1].w, bx.z, bx.w);
      }
    } else {
#pragma unroll
      for (int u = 0; u < 8; ++u) acc ^= fold(v[u]);
    }
  }
  for (; i < n16; i += NTH) acc ^= fold(ldw_hint(p + i, pol));
  if (MATH) {  // the warps' partials: every thread's 4 sums into shared memory, 128 threads add NTH / 32 each
    reinterpret_cast<float4*>(red)[threadIdx.x] = make_float4(c[0], c[1], c[2], c[3]);
    __syncthreads();
    if (threadIdx.x < 128) {
      float t = 0.f;
#pragma unroll
      for (int w = 0; w < NTH / 32; ++w) t += red[w * 128 + threadIdx.x];
      acc ^= __float_as_uint(t);
    }
    __syncthreads();
  }
  return acc;
}

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
