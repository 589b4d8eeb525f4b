// mk_device.cuh: device-side building blocks of the megakernel: the parameter block, memory
// access helpers with the right cache/ordering semantics, counter waits and signals, and the
// tiny-M GEMV engine (weights as the mma A operand, <= 8 tokens as N).
#pragma once

#include <cuda_bf16.h>
#include <limits.h>
#include <stdint.h>

#include "mk_abi.h"
#include "mk_params.h"
#include "mk_ptx.cuh"

namespace mk {

// Threads per block, one block per SM. (Two 256-thread blocks per SM, so that one block's
// latency-bound prologue/epilogue would overlap the other's weight stream, measured slower on the
// H200 on 2026-11-29: every task ran ~2x longer; docs/PERF.md (decision table).)
constexpr int NT = 512;
constexpr int NWARPS = NT / 32;
constexpr int MAXROWS = MK_MAX_TILE_ROWS;  // rows of one GEMV tile at most (tiling.py checks it)
constexpr int OUT_FLOATS = MAXROWS * 8;    // the GEMV result / one hidden row / ROUTE's scratch
// GEMV reduction scratch: one 16x8 block per (row group, K-split warp), for the K-split partial sums
// of gemv_mma only: tiles of fewer 16-row groups than warps split K (wpg > 1, at most NWARPS
// group-and-split slots); a tile of NWARPS groups or more writes each group's sums straight into
// out_s (the same layout)
constexpr int RED_FLOATS = NWARPS * 128;
constexpr int ACT_PAD = 32;           // bf16 padding per staged activation row (bank spread)

typedef __nv_bfloat16 bf16;

// ---- memory helpers ----------------------------------------------------------------------------

// L2 eviction policies for the weight streams (createpolicy: an opaque 64-bit register). A step
// streams ~7 GB of weights that no later read of the step reuses: they are loaded evict_first, so
// that the few small weights every step reads again (the routers: 48 x 512 KB) can stay in L2
// across steps, loaded evict_last (Gemv::keep). Activations and KV keep the normal priority.
// Measured (2026-11-30): the step -1.5 % at BS 1 and 8, from the streamed GEMVs; the router GEMV
// itself did not get faster (one round trip and a 16-warp reduction either way).
__device__ __forceinline__ uint64_t l2_policy(bool keep) {
  uint64_t pol;
  if (keep)
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  else
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// Asks L2 for [ptr, ptr + bytes) (cp.async.bulk.prefetch: one thread, no registers, no L1; bytes a
// multiple of 16) with an L2 policy (l2_policy), in pieces of 64 KB.
__device__ __forceinline__ void prefetch_l2_bulk(const void* ptr, size_t bytes, uint64_t pol) {
  const char* c = static_cast<const char*>(ptr);
  for (size_t a = 0; a < bytes; a += 65536) {
    const uint32_t n = (uint32_t)(bytes - a < 65536 ? bytes - a : 65536);
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(c + a), "r"(n), "l"(pol)
                 : "memory");
  }
}

// Immutable weights, 16 bytes: read-only path, no L1 allocation (streamed once per step), with an
// L2 policy (l2_policy). Not volatile: the compiler may hoist these loads above unrelated math (they
// never alias a write of the step). L2::128B: a miss fetches the whole 128-byte line from HBM. A
// GEMV warp load covers 64 bytes of each of 8 rows (the mma fragment ties lanes to rows) and the
// line's other half comes with the next k-step, so without the hint L2 asked HBM for 64-byte
// pieces (stream_probe: the GEMV pattern 3.6 TB/s with every SM streaming, whole lines 4.5).
// Measured on the H200 (2026-11-30, three rounds in one call): BS 1 3.205 / 3.178 / 3.284 ms vs
// 3.324 / 3.326 / 3.283, BS 8 10.135 / 10.017 / 10.184 vs 10.238 / 10.388 / 10.379; L2::256B
// 3.260-3.300 and 10.269-10.361.
__device__ __forceinline__ uint4 ld_weight16(const void* p, uint64_t pol) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "l"(pol));
  return r;
}

// Data written by other SMs during this step: L2 (coherent) loads, never a stale L1 line.
__device__ __forceinline__ float4 ld_cg4(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float ld_cg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ int ld_cg(const int* p) { return __ldcg(p); }
__device__ __forceinline__ uint4 ld_cg16(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }
// ld_cg when `pred` holds, else no memory access and zero: one predicated instruction, not a branch,
// so a run of them keeps every load in flight (guarded by `if`, each load sat in its own branch and
// was consumed before the next was issued). volatile with a memory clobber: issued where it is
// written, not sunk to its first use.
__device__ __forceinline__ float ld_cg_if(const float* p, bool pred) {
  float r = 0.f;
  asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q ld.global.cg.f32 %0, [%1];\n\t}"
               : "+f"(r)
               : "l"(p), "r"((int)pred)
               : "memory");
  return r;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// ---- errors and the watchdog --------------------------------------------------------------------

__device__ __forceinline__ bool aborted(const Params& p) {
  return *reinterpret_cast<volatile int*>(p.err) != MK_ERR_NONE;
}

__device__ __forceinline__ void raise_error(const Params& p, int code, int task, int a, int b, int c) {
  int* err = reinterpret_cast<int*>(p.err);
  if (atomicCAS(err, MK_ERR_NONE, code) == MK_ERR_NONE) {
    err[1] = blockIdx.x;
    err[2] = task;
    err[3] = a;
    err[4] = b;
    err[5] = c;
    __threadfence_system();
  }
}

// Thread 0 only: wait until counter c reaches base[c] + rel (wrapping compare), acquire ordering.
// Returns false on timeout or when another block has failed (the step is then abandoned). With
// spin = false it only looks once: false when the counter is not there yet.
__device__ bool wait_counter(const Params& p, int c, int rel, int task, bool spin = true) {
  const uint32_t* cnt = reinterpret_cast<const uint32_t*>(p.counters) + c;
  const uint32_t target = reinterpret_cast<const uint32_t*>(p.base)[c] + (uint32_t)rel;
  uint32_t v = ld_acquire(cnt);
  if ((int32_t)(v - target) >= 0) return true;
  if (!spin) return false;
  const uint64_t t0 = globaltimer();
  const uint64_t limit = (uint64_t)p.timeout_ms * 1000000ull;
  while (true) {
    __nanosleep(40);
    v = ld_acquire(cnt);
    if ((int32_t)(v - target) >= 0) return true;
    if (aborted(p)) return false;
    if (globaltimer() - t0 > limit) {
      raise_error(p, MK_ERR_TIMEOUT, task, c, (int)v, (int)target);
      return false;
    }
  }
}

// Timeline marks of the running task (thread 0 writes them when the timeline is on): when its GEMV
// began (activations staged) and ended. Reset by run_task; see MK_TL_WORDS.
__shared__ unsigned long long tl_marks[2];
// ... and when its waits ended (block_wait)
__shared__ unsigned long long tl_wait;

// A copy of the launch's Params in shared memory, for the out-of-line ops. An out-of-line function
// reads `const Params& p` through a generic pointer: to the kernel parameter, that is a memory load
// the compiler repeats inside loops (it cannot prove the stores there leave it alone), and the
// acquire of every dependency wait invalidates L1, so each one can be an L2 round trip on the
// op's critical path. Pointing the reference at this copy makes them shared-memory loads. Inlined
// code keeps reading the kernel parameter (constant-bank operands, free).
__shared__ __align__(16) Params s_params;

// The layer whose h rows (all batch rows, in row order) the GEMV activation region holds, or -1:
// set by a MoE up item, a router tile or a MoE drain that staged them, cleared by every other task
// (they may overwrite the region). Thread 0 writes it before a barrier.
__shared__ int s_h_staged;

// A QKV task's step facts, read by its prologue before the task waits (fixed for the step) and by
// op_qkv's epilogue after its GEMV: the layer's flags, each row's position and the KV page its new
// K/V row goes to. Read in the epilogue they were two dependent L2 round trips (position, then the
// page it selects) after the GEMV, on the attention chain. Written before run_task's barriers.
struct QkvFacts {
  long long pos[MK_MAX_TOKENS];
  int page[MK_MAX_TOKENS];
  int flags;
};
__shared__ QkvFacts s_qkv;

// A MoE down or fused item's routing weights (one per token, s_rw[j] for its j-th token) and a fused
// item's down-weight pointer, copied by cp.async before its GEMV (moe_prologue) and read after it
// (op_moe_down, op_moe_fused wait for the copies): read there, the weights were an L2 round trip
// after the GEMV (before the down GEMV in a fused item, behind the pointer's own round trip).
__shared__ float s_rw[MK_MAX_TOKENS];
__shared__ unsigned long long s_wdown;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The block's dynamic shared memory. Pointers into it that reach an out-of-line op through the Smem
// struct are generic, and the compiler then emits generic loads and stores (LD.E / ST.E, which
// take the slower generic path) for them; shared(p) re-derives the same address from this symbol,
// so the accesses compile to LDS / STS. p must point into this array (not into static __shared__).
extern __shared__ __align__(128) unsigned char mk_dyn_smem[];
template <class T>
__device__ __forceinline__ T* shared(T* p) {
  return reinterpret_cast<T*>(mk_dyn_smem + (smem_u32(p) - smem_u32(mk_dyn_smem)));
}

// ---- tiny-M GEMV on the tensor cores -------------------------------------------------------------
//
// out[r][n] = sum_k W_r[k] * act[n][k] for r < nrows, n < 8, with W_r = W0 + r*ld0 for r < nsplit
// and W1 + (r - nsplit)*ld1 after (gate|up pairs). One warp computes a 16-row x 8-token block with
// mma.m16n8k16 (fp32 accumulate): each thread loads 16 contiguous bytes of weight row g and of row
// g+8 and 16 bytes of token g's activations; since a dot product does not care about the order of
// its k terms, those 8 contiguous k values are assigned to the fragment's k slots {2t,2t+1,2t+8,
// 2t+9} of two consecutive mma k16 steps, for A and B alike. Warps of one 16-row group split K.
// Activations are staged in shared memory as bf16 [8][klen + ACT_PAD].

struct Gemv {
  const bf16* W0;
  long ld0;
  const bf16* W1;
  long ld1;
  int nsplit;
  int nrows;
  int klen;
  bool keep = false;  // L2 evict_last (weights every step reads again: the routers), else evict_first
};

__device__ __forceinline__ const bf16* gemv_row(const Gemv& g, int r) {
  r = r < g.nrows ? r : g.nrows - 1;  // rows past the tile repeat the last one; results unused
  return r < g.nsplit ? g.W0 + (long)r * g.ld0 : g.W1 + (long)(r - g.nsplit) * g.ld1;
}

// Where a GEMV's activations come from: act[n][k] = src[rows[n] * stride + k0 + k] for n < 8
// (rows[n] < 0: an unused token column, staged as zeros). rows is in shared memory.
// norm_w (every GEMV over h(l)): src holds x(l) and the staging applies the layer's RMSNorm (weights
// norm_w, eps) to each row; copy (a MoE layer's router tiles): also store the raw rows' columns
// [copy_lo, copy_hi) into copy (same row stride): the residual the layer's outputs are added onto.
struct ActSrc {
  const float* src;
  long stride;
  const int* rows;
  int k0;
  const bf16* norm_w = nullptr;
  float eps = 0.f;
  float* copy = nullptr;
  int copy_lo = 0, copy_hi = 0;
};

// Stage activations: act_s[n][k] = bf16(src[rows[n]][k0 + k]) for n < 8 (zeros where rows[n] < 0).
// A thread takes the same 4 columns of all 8 rows (their 8 loads in flight together) per sweep;
// no index division (the previous flat loop spent ~2 us per task on integer divisions, measured).
__device__ __forceinline__ void stage_act(bf16* act_s, const ActSrc& a, int klen) {
  act_s = shared(act_s);
  const int lds = klen + ACT_PAD;
  int r[8];
#pragma unroll
  for (int n = 0; n < 8; ++n) r[n] = a.rows[n];
  for (int k = threadIdx.x * 4; k < klen; k += NT * 4) {
    float4 v[8];
#pragma unroll
    for (int n = 0; n < 8; ++n)
      v[n] = r[n] >= 0 ? ld_cg4(a.src + r[n] * a.stride + a.k0 + k) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(v[n].x, v[n].y), hi = __floats2bfloat162_rn(v[n].z, v[n].w);
      uint2 packed;
      packed.x = *reinterpret_cast<uint32_t*>(&lo);
      packed.y = *reinterpret_cast<uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(act_s + n * lds + k) = packed;
    }
  }
}

// Stage act_s[n][k] = bf16(x[rows[n]][k] * norm_w[k]) for the whole row (a.norm_w set: a GEMV over
// h(l); k0 = 0, klen = the hidden size, at most NORM_SWEEPS * NT * 4), and each warp's
// sums of squares of the 8 rows' columns it loaded into s_nss[warp][n] (no barrier here: the GEMV's
// barrier after the staging publishes them). The RMSNorm's per-row factor rsqrt(mean(x^2) + eps)
// is linear in the GEMV, so gemv_mma applies it to the outputs (norm_scale): the staging
// stays one L2 round trip with no block reduction on the chain (a reduction between the loads and
// the stores, two barriers, measured +1.6 us per staging on the H200, 2026-12-01).
// With a.copy the thread also stores its raw values of columns [copy_lo, copy_hi).
// Out of line, its sweep loop rolled: one copy (7.2 KB of SASS). Inlined at its call sites with
// both sweeps unrolled, it took gemv_mma from 14.3 to 26.8 KB
// and gemv_op from 10.5 to 24.7 KB (`mkcode kernels sizes`; out of line: 17.2 / 15.1 KB), code every
// GEMV task fetches (the 2026-12-01 switch timeline: the up item's ready -> GEMV 2.4 -> 3.3 us).
constexpr int NORM_SWEEPS = MK_NORM_MAX_HIDDEN / (NT * 4);
static_assert(NORM_SWEEPS * NT * 4 == MK_NORM_MAX_HIDDEN, "the norm's sweeps cover MK_NORM_MAX_HIDDEN");
__shared__ float s_nss[NWARPS * 8];
__device__ __noinline__ void stage_act_norm(bf16* act_s, const ActSrc a, int klen) {
  act_s = shared(act_s);
  const int lds = klen + ACT_PAD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int r[8];
#pragma unroll
  for (int n = 0; n < 8; ++n) r[n] = a.rows[n];
  float ss[8];
#pragma unroll
  for (int n = 0; n < 8; ++n) ss[n] = 0.f;
#pragma unroll 1
  for (int sw = 0; sw < NORM_SWEEPS; ++sw) {  // one sweep at hidden <= 2048 (NT * 4)
    const int k = (threadIdx.x + sw * NT) * 4;
    if (k >= klen) break;
    // the norm weights through L2 as x (ld.global.cg): the GEMV's read-only loads are its weight
    // stream's alone (each with the L2::128B hint, test_sass_issue)
    const uint2 w = __ldcg(reinterpret_cast<const uint2*>(a.norm_w + k));
    float4 v[8];
#pragma unroll
    for (int n = 0; n < 8; ++n) v[n] = r[n] >= 0 ? ld_cg4(a.src + r[n] * a.stride + k) : make_float4(0.f, 0.f, 0.f, 0.f);
    const __nv_bfloat162 w01 = *reinterpret_cast<const __nv_bfloat162*>(&w.x);
    const __nv_bfloat162 w23 = *reinterpret_cast<const __nv_bfloat162*>(&w.y);
    const float w0 = __low2float(w01), w1 = __high2float(w01), w2 = __low2float(w23), w3 = __high2float(w23);
    const bool copy = a.copy != nullptr && k >= a.copy_lo && k < a.copy_hi;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float4 x = v[n];
      ss[n] += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
      const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x * w0, x.y * w1);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(x.z * w2, x.w * w3);
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(act_s + n * lds + k) = packed;
      if (copy && r[n] >= 0) *reinterpret_cast<float4*>(a.copy + r[n] * a.stride + k) = x;
    }
  }
  // The warp's 8 row sums in 9 shuffles (8 butterflies of 5 took 40): each exchange halves the rows
  // a lane keeps (xor 16: rows 0-3 or 4-7, xor 8: two of those, xor 4: one), then the row's sum over
  // the lanes left (xor 2, xor 1); lane L ends with row 4 * b4 + 2 * b3 + b2 of its bits.
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
  float t[4], u[2];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    t[j] = (b4 ? ss[j + 4] : ss[j]) + __shfl_xor_sync(0xffffffffu, b4 ? ss[j] : ss[j + 4], 16);
#pragma unroll
  for (int j = 0; j < 2; ++j)
    u[j] = (b3 ? t[j + 2] : t[j]) + __shfl_xor_sync(0xffffffffu, b3 ? t[j] : t[j + 2], 8);
  float v = (b2 ? u[1] : u[0]) + __shfl_xor_sync(0xffffffffu, b2 ? u[0] : u[1], 4);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  if ((lane & 3) == 0) s_nss[warp * 8 + (b4 ? 4 : 0) + (b3 ? 2 : 0) + (b2 ? 1 : 0)] = v;
}

// The RMSNorm factor of token column threadIdx.x % 8 from the staging's s_nss (after a barrier).
// A GEMV's outputs out_s[r * 8 + n] are touched by thread i with i % 8 == n only (NT % 8 == 0).
__device__ __forceinline__ float norm_scale(int klen, float eps) {
  float t = 0.f;
#pragma unroll
  for (int w = 0; w < NWARPS; ++w) t += s_nss[w * 8 + threadIdx.x % 8];
  return rsqrtf(t / (float)klen + eps);
}

// The staging of every GEMV (and of a MoE drain's h rows): plain, or with the row norm.
__device__ __forceinline__ void stage_rows(bf16* act_s, const ActSrc& a, int klen) {
  if (a.norm_w != nullptr)
    stage_act_norm(act_s, a, klen);
  else
    stage_act(act_s, a, klen);
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
// 4- and 8-byte copies (cp.async.ca: the only sizes below 16 it takes; through L1, so only for data
// the block has acquired since it was written, e.g. after waiting on its producer's counter)
__device__ __forceinline__ void cp_async4_ca(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async8_ca(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Result: out_s[r * 8 + n] (fp32). red_s: RED_FLOATS floats scratch. Ends with __syncthreads().
// Stages the activations (act_s: [8][klen + ACT_PAD] bf16) first. (Issuing the first weight loads
// before the staging, with the activations copied by cp.async so that no register is held across
// them, was measured slower on the H200, 2026-11-29: MoE up items 14.9 vs 12.4 us at BS 1.)
// `mark`: thread 0 stamps tl_marks[0] once the activations are staged.
// Not inlined: it gets the whole register budget, so the U weight loads in flight per thread stay
// in registers (inlined into the kernel's dispatch they were spilled to local memory).
template <int U>
__device__ __forceinline__ void mma_steps(float (&c)[4], const uint4 (&wa)[U], const uint4 (&wb)[U], const bf16* xa,
                                          int stride) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const uint4 bx = *reinterpret_cast<const uint4*>(xa + u * stride);
    mma16816(c, wa[u].x, wb[u].x, wa[u].y, wb[u].y, bx.x, bx.y);
    mma16816(c, wa[u].z, wb[u].z, wa[u].w, wb[u].w, bx.z, bx.w);
  }
}

// One 16-row group of a warp from k = kk on (the k-steps before kk were already accumulated in c);
// the partial sums go to this warp's block of red_s.
template <int U>
__device__ __forceinline__ void gemv_group(float (&c)[4], const bf16* ra, const bf16* rb, const bf16* xa, int kk,
                                           int klen, int stride, float* red, uint64_t pol) {
  const int lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  for (; kk + (U - 1) * stride < klen; kk += U * stride) {  // full batches: no predicates
    uint4 wa[U], wb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      wa[u] = ld_weight16(ra + kk + u * stride, pol);
      wb[u] = ld_weight16(rb + kk + u * stride, pol);
    }
    mma_steps<U>(c, wa, wb, xa + kk, stride);
  }
  // The tail (fewer than U k-steps): all its loads issued before the first mma, so it costs one
  // memory latency, not one per k-step (a loop of dependent load -> mma steps made the 16-row
  // ROUTER tiles, 4 k-steps per warp, ~4 latencies: gemv 5.9 us for 64 KB at BS 1, measured).
  // Unconditional: steps past the tail reload its last step (an L1/L2 hit) and multiply zero
  // activations (a branch around the loads had ptxas spill them to local memory). kk is
  // warp-uniform.
  if (kk < klen) {
    const int last = (klen - 1 - kk) / stride;  // the tail's last k-step (< U - 1)
    uint4 wa[U - 1], wb[U - 1];
#pragma unroll
    for (int u = 0; u < U - 1; ++u) {
      const int k = kk + (u < last ? u : last) * stride;
      wa[u] = ld_weight16(ra + k, pol);
      wb[u] = ld_weight16(rb + k, pol);
    }
#pragma unroll
    for (int u = 0; u < U - 1; ++u) {
      const uint4 bx = u <= last ? *reinterpret_cast<const uint4*>(xa + kk + u * stride) : make_uint4(0, 0, 0, 0);
      mma16816(c, wa[u].x, wb[u].x, wa[u].y, wb[u].y, bx.x, bx.y);
      mma16816(c, wa[u].z, wb[u].z, wa[u].w, wb[u].w, bx.z, bx.w);
    }
  }
  // c0,c1: (row gid, tokens 2t, 2t+1); c2,c3: (row gid+8, same tokens)
  red[gid * 8 + 2 * t] = c[0];
  red[gid * 8 + 2 * t + 1] = c[1];
  red[(gid + 8) * 8 + 2 * t] = c[2];
  red[(gid + 8) * 8 + 2 * t + 1] = c[3];
}

__device__ __noinline__ void gemv_mma(const Gemv g, const ActSrc act, bf16* act_s, float* red_s, float* out_s,
                                      bool mark, bool staged) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane >> 2, t = lane & 3;
  const int klen = g.klen;
  const int lds = klen + ACT_PAD;
  const int ngroups = (g.nrows + 15) / 16;
  const int wpg = NWARPS / (ngroups < NWARPS ? ngroups : NWARPS);  // warps per 16-row group
  const int gslots = NWARPS / wpg;
  const int kw = warp % wpg;
  // The wpg warps of a row group split K into contiguous blocks (warp kw: k-steps [kw * span,
  // (kw + 1) * span)), so each warp's loads of a row are consecutive 64-byte pieces, as with one
  // warp per group. Interleaved k-steps (warp kw: kw * 32 + j * wpg * 32, before 2026-11-30) read
  // each row in 64-byte pieces 64 * wpg bytes apart: csrc/probes/stream_probe.cu (`gemv`) measured
  // 64 x 2048 tiles (wpg 4) at 2.8 TB/s with every SM streaming and 256 x 2048 (wpg 1) at 3.6.
  const int span = ((klen / 32 + wpg - 1) / wpg) * 32;
  const int k_begin = kw * span, k_end = min(klen, k_begin + span);
  // 16 x 16 B of weights in flight per thread (U = 8), or 8 (U = 4) where a warp's K block has at most
  // 4 k-steps (the 16-row router tiles: one batch of 4, where U = 8 ran a tail of 7 loads, 3 of them
  // reloads; H100, 2026-12-07: router GEMV 5.8 -> 4.4 us). U = 4 for every GEMV slowed the others.
  const bool u4 = span <= 4 * 32;
  act_s = shared(act_s);
  red_s = shared(red_s);
  out_s = shared(out_s);
  if (!staged) stage_rows(act_s, act, klen);
  __syncthreads();
  if (mark && threadIdx.x == 0) tl_marks[0] = globaltimer();
  const bf16* xa = act_s + gid * lds + t * 8;
  const uint64_t pol = l2_policy(g.keep);
  // one warp per group (wpg 1): its sums are the result, in out_s's layout (group grp's 16 rows x 8
  // tokens at grp * 128); else each (group, K block) into red_s, summed below
  float* const part = wpg == 1 ? out_s : red_s;
  for (int grp = warp / wpg; grp < ngroups; grp += gslots) {
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    const bf16* ra = gemv_row(g, grp * 16 + gid) + t * 8;
    const bf16* rb = gemv_row(g, grp * 16 + gid + 8) + t * 8;
    if (u4)
      gemv_group<4>(c, ra, rb, xa, k_begin, k_end, 32, part + (grp * wpg + kw) * 128, pol);
    else
      gemv_group<8>(c, ra, rb, xa, k_begin, k_end, 32, part + (grp * wpg + kw) * 128, pol);
  }
  __syncthreads();
  // a GEMV over h(l): the staged rows were x * norm_w; the row's RMSNorm factor scales its outputs
  const float sc = act.norm_w != nullptr ? norm_scale(klen, act.eps) : 1.f;
  if (wpg > 1) {
    for (int i = threadIdx.x; i < g.nrows * 8; i += NT) {
      const int r = i / 8, n = i % 8, grp = r / 16;
      float s = 0.f;
      for (int w = 0; w < wpg; ++w) s += red_s[(grp * wpg + w) * 128 + (r % 16) * 8 + n];
      out_s[i] = s * sc;
    }
    __syncthreads();
  } else if (act.norm_w != nullptr) {
    for (int i = threadIdx.x; i < g.nrows * 8; i += NT) out_s[i] *= sc;
    __syncthreads();
  }
}

// The GEMV of a task with its activation staging (see gemv_mma). Callers have synced `act.rows`.
// staged: act_s already holds these activations (a MoE up item after another of its layer).
__device__ __forceinline__ void gemv(const Params& p, const Gemv& g, const ActSrc& act, bf16* act_s, float* red_s,
                                     float* out_s, bool staged = false) {
  gemv_mma(g, act, act_s, red_s, out_s, p.timeline != nullptr, staged);
  if (p.timeline && threadIdx.x == 0) tl_marks[1] = globaltimer();  // gemv_mma ends with __syncthreads
}

// ---- the down slice of a fused MoE item: every hidden row, a short K (the item's columns) -------
//
// acc[btok[n] * H + r] += wtok[n] * sum_k W[r * ld + k] * act[n][k] for r < nrows, n < nt and
// k < 32 * KP (act_s: bf16 [8][lds], tokens >= nt staged as zeros). K is too short to split over
// warps, so each warp owns a contiguous run of 16-row groups and keeps GB = 8 / KP groups' weights
// (2 x 8 x 16 B per thread) in flight together, then adds its results straight from the mma
// fragments with fp32 reductions (red.global: no return value, RED at L2). nrows % 16 == 0 (the tiling checks
// hidden % 32). Not inlined, for the same register reason as gemv_mma.
// acc += v at a global address, fire and forget (PTX red.global: RED in SASS). atomicAdd on a float
// pointer the compiler cannot prove global compiled to a generic ATOM plus compare-and-swap loops
// for the shared-memory window, with a predicate the warp branched on after each one (SASS,
// 2026-11-30): the fused items' down slices spent most of their time there.
__device__ __forceinline__ void red_add_global(float* p, float v) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(__cvta_generic_to_global(p)), "f"(v) : "memory");
}

template <int KP>
__device__ __noinline__ void gemv_down_acc(const bf16* W, int ld, int nrows, const bf16* act_s, int lds, float* acc,
                                           int H, const float* wtok, const int* btok, int nt) {
  constexpr int GB = 8 / KP;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  const int ngroups = nrows / 16;
  const int gpw = (ngroups + NWARPS - 1) / NWARPS;
  const int g_begin = warp * gpw, g_end = min(ngroups, g_begin + gpw);
  const bf16* xa = act_s + gid * lds + t * 8;  // token gid's activations (the mma B column)
  // this thread's accumulator columns are tokens 2t and 2t + 1
  const bool v0 = 2 * t < nt, v1 = 2 * t + 1 < nt;
  float* d0 = acc + (size_t)(v0 ? btok[2 * t] : 0) * H;
  float* d1 = acc + (size_t)(v1 ? btok[2 * t + 1] : 0) * H;
  const float w0 = v0 ? wtok[2 * t] : 0.f, w1 = v1 ? wtok[2 * t + 1] : 0.f;
  const uint64_t pol = l2_policy(false);  // streamed once per step
  for (int g0 = g_begin; g0 < g_end; g0 += GB) {
    uint4 wa[GB][KP], wb[GB][KP];
#pragma unroll
    for (int u = 0; u < GB; ++u) {
      const int g = min(g0 + u, g_end - 1);  // past the run: the last group again, results unused
      const bf16* ra = W + (size_t)(g * 16 + gid) * ld + t * 8;
      const bf16* rb = ra + (size_t)8 * ld;
#pragma unroll
      for (int kp = 0; kp < KP; ++kp) {
        wa[u][kp] = ld_weight16(ra + kp * 32, pol);
        wb[u][kp] = ld_weight16(rb + kp * 32, pol);
      }
    }
#pragma unroll
    for (int u = 0; u < GB; ++u) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kp = 0; kp < KP; ++kp) {
        const uint4 bx = *reinterpret_cast<const uint4*>(xa + kp * 32);
        mma16816(c, wa[u][kp].x, wb[u][kp].x, wa[u][kp].y, wb[u][kp].y, bx.x, bx.y);
        mma16816(c, wa[u][kp].z, wb[u][kp].z, wa[u][kp].w, wb[u][kp].w, bx.z, bx.w);
      }
      if (g0 + u < g_end) {  // c0, c1: row gid, tokens 2t, 2t+1; c2, c3: row gid + 8
        const int r = (g0 + u) * 16 + gid;
        if (v0) {
          red_add_global(d0 + r, w0 * c[0]);
          red_add_global(d0 + r + 8, w0 * c[2]);
        }
        if (v1) {
          red_add_global(d1 + r, w1 * c[1]);
          red_add_global(d1 + r + 8, w1 * c[3]);
        }
      }
    }
  }
}

// Block-wide sum (all threads get the result). scratch: NWARPS floats.
__device__ float block_sum(float v, float* scratch) {
  scratch = shared(scratch);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < NWARPS; ++w) s += scratch[w];
  __syncthreads();
  return s;
}

}  // namespace mk
