// mk_sync.cuh: the cross-block hand-off the megakernel's counters use (a release add, an acquire
// load) and its clock. Shared with the lab probes (csrc/probes/probe_util.cuh), so that a probe of a
// hand-off measures these very instructions.
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

}  // namespace mk
