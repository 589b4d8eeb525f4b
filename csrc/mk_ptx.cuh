// mk_ptx.cuh: the megakernel's inline-PTX primitives that the lab probes use too (through
// csrc/probes/probe_util.cuh), so that a probe measures these very instructions: its clock, the
// cross-block hand-off its counters use (a release add, an acquire load) and the GEMV's tensor-core
// step.
#pragma once

#include <stdint.h>

namespace mk {

__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Counter increment with release semantics (one instruction instead of a full __threadfence and
// a relaxed atomic; the waiter's ld.acquire pairs with it).
__device__ __forceinline__ void signal_release(uint32_t* c, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(c), "r"(v) : "memory");
}

// The GEMV's tensor-core step (mma_steps in mk_device.cuh): m16n8k16, bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace mk
