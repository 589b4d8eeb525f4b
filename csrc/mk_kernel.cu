// mk_kernel.cu: the megakernel's translation unit: the kernel itself and its host launcher.
#include <stdio.h>
#include <stdlib.h>

#include "mk_kernel.cuh"
#include "mk_launch.h"

static_assert(mk::NT == mk::kThreads, "mk_launch.h kThreads must equal NT");

namespace mk {

size_t smem_bytes(const Params& p, int max_k) { return base_smem_bytes(p, max_k); }

cudaError_t launch_step(const Params& p, int max_k, cudaStream_t stream, char* msg, size_t cap) {
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) {
    snprintf(msg, cap, "device query: %s", cudaGetErrorString(e));
    return e;
  }
  if (p.n_sms < 1 || p.n_sms > sms) {
    snprintf(msg, cap, "n_sms=%d but the GPU has %d SMs (every block must be resident)", p.n_sms, sms);
    return cudaErrorInvalidValue;
  }
  // ROUTE: logits, slots, counts, positions, chosen logits in s.out
  if (10 * p.num_experts + 16 * MK_MAX_TOKENS + NWARPS > OUT_FLOATS) {
    snprintf(msg, cap, "num_experts=%d is more than ROUTE takes", p.num_experts);
    return cudaErrorInvalidValue;
  }
  if (!attn_supported(p)) {
    snprintf(msg, cap,
             "num_heads=%d, num_kv_heads=%d, head_dim=%d: the attention runs at most %d query heads per kv "
             "head and head_dim %d, %d or %d",
             p.num_heads, p.num_kv_heads, p.head_dim, MK_ATTN_MAX_GROUP, MK_ATTN_HEAD_DIM_32, MK_ATTN_HEAD_DIM_64,
             MK_ATTN_HEAD_DIM_128);
    return cudaErrorInvalidValue;
  }
  if (p.hidden > MK_NORM_MAX_HIDDEN) {  // the GEMVs' norm staging (stage_act_norm) sweeps that many
    snprintf(msg, cap, "hidden=%d: the norm inside the GEMVs takes a hidden size of at most %d", p.hidden,
             MK_NORM_MAX_HIDDEN);
    return cudaErrorInvalidValue;
  }
  // MKCODE_MK_SMEM_PAD (bytes, measurement only): request more dynamic shared memory than the
  // kernel uses, which shrinks the L1 share of the SM's unified L1/shared memory.
  static const size_t pad = [] {
    const char* v = getenv("MKCODE_MK_SMEM_PAD");
    return v ? (size_t)strtoull(v, nullptr, 10) : (size_t)0;
  }();
  const size_t smem = smem_bytes(p, max_k) + pad;
  auto kernel = mk_step_kernel;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) {
    snprintf(msg, cap, "cudaFuncSetAttribute(%zu bytes smem): %s", smem, cudaGetErrorString(e));
    return e;
  }
  int per_sm = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, NT, smem);
  if (e != cudaSuccess || per_sm < 1) {  // the step's blocks wait on each other: all must be resident
    snprintf(msg, cap, "one %d-thread block with %zu bytes smem does not fit an SM (%s)", NT, smem,
             cudaGetErrorString(e));
    return e != cudaSuccess ? e : cudaErrorInvalidConfiguration;
  }
  kernel<<<p.n_sms, NT, smem, stream>>>(p, max_k);
  e = cudaGetLastError();
  if (e != cudaSuccess) snprintf(msg, cap, "mk_step_kernel launch: %s", cudaGetErrorString(e));
  return e;
}

}  // namespace mk
