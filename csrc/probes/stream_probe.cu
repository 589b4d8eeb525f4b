// stream_probe.cu: how fast can one persistent block per SM stream weights from HBM, and by which
// load strategy? A stand-alone measurement for the megakernel's GEMV design (not part of it).
//
// Every block streams its own contiguous chunk of a large buffer (never L2-resident) and folds the
// data into a checksum so no load is dead. Strategies:
//   ldg<U>   each thread issues U 16-byte ld.global.nc.L1::no_allocate loads, then consumes them
//            (the megakernel's current GEMV loop shape)
//   cpa<S>   each thread owns a private ring of S 16-byte cp.async slots in shared memory: wait for
//            the oldest, consume it, refill it (no barriers: a thread reads only what it copied)
//   bulk<S>  warp 0 lane 0 streams STAGE-byte cp.async.bulk copies into a ring of S stages with
//            mbarrier full/empty barriers; every warp consumes a stage and arrives on its empty
//            barrier (count = warps), so no block-wide barrier is involved
//   ldg U=8 smemNK  the ldg<8> loop with N KB of dynamic shared memory reserved (unused): how the
//            L1 share that the shared-memory size leaves limits the loads in flight
// Blocks: all SMs, or fewer (per-SM ceiling). Output: one line per (strategy, blocks): GB/s.
//
//   gemv<U> (`stream_probe gemv`) the megakernel GEMV's own addressing, from HBM and from L2, and
//            gemv_lines: addressings whose every warp load covers whole 128-byte lines
//   `stream_probe hint`: the GEMV addressing with and without the megakernel's L2 hints
//   `stream_probe loaded`: one block's rate by in-flight strategy while other blocks load HBM
//   `stream_probe stripe`: a fused MoE item's down slice (a column stripe of a row-major matrix)
//            against the same bytes stored contiguously
//   `stream_probe acquire`: whether an acquire load's L1 invalidation reaches local memory
// Build and run (GPU machine): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
//   csrc/probes/stream_probe.cu -o /tmp/stream_probe && /tmp/stream_probe [gemv]
#include <algorithm>

#include "probe_util.cuh"

constexpr int NT = 512;

__device__ __forceinline__ uint4 ldw(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

template <bool HINT>
__device__ __forceinline__ uint4 ldw_as(const void* p, uint64_t pol) {
  if constexpr (HINT) return ldw_hint(p, pol);
  return ldw(p);
}

// The block streams n 16-byte words from p in batches of U loads per thread; returns the fold.
template <int U>
__device__ uint32_t ldg_words(const uint4* p, size_t n) {
  uint32_t acc = 0;
  for (size_t i = threadIdx.x; i + (U - 1) * NT < n; i += (size_t)U * NT) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ldw(p + i + u * NT);
#pragma unroll
    for (int u = 0; u < U; ++u) acc += fold(v[u]);
  }
  return acc;
}

template <int U>
__global__ void __launch_bounds__(NT, 1) ldg_stream(const uint4* src, size_t per_block, uint32_t* out) {
  const uint32_t acc = ldg_words<U>(src + blockIdx.x * (per_block / 16), per_block / 16);
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

template <int S>
__global__ void __launch_bounds__(NT, 1) cpa_stream(const uint4* src, size_t per_block, uint32_t* out) {
  extern __shared__ uint4 ring[];  // [S][NT]
  const uint4* p = src + blockIdx.x * (per_block / 16);
  const size_t n = per_block / 16, steps = n / NT;
  uint32_t acc = 0;
  for (int s = 0; s < S; ++s) {
    if ((size_t)s < steps)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(&ring[s * NT + threadIdx.x])),
                   "l"(p + (size_t)s * NT + threadIdx.x));
    asm volatile("cp.async.commit_group;");
  }
  for (size_t i = 0; i < steps; ++i) {
    asm volatile("cp.async.wait_group %0;" ::"n"(S - 1));
    const int slot = (int)(i % S);
    acc += fold(ring[slot * NT + threadIdx.x]);
    const size_t nx = i + S;
    if (nx < steps)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(&ring[slot * NT + threadIdx.x])),
                   "l"(p + nx * NT + threadIdx.x));
    asm volatile("cp.async.commit_group;");
  }
  asm volatile("cp.async.wait_all;");
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred P;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n @!P bra WAIT_%=;\n}\n" ::"r"(
          smem_u32(b)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// The block streams `bytes` from p through a ring of S stages of STAGE bytes in buf (shared memory):
// thread 0 issues cp.async.bulk copies with mbarrier full/empty barriers; every warp consumes a
// stage and arrives on its empty barrier (count = warps), so no block-wide barrier is involved.
// full / empty: S mbarriers each in shared memory. Returns the fold.
template <int S, int STAGE>
__device__ uint32_t bulk_ring(unsigned char* buf, uint64_t* full, uint64_t* empty, const char* p, size_t bytes) {
  const int nstages = (int)(bytes / STAGE);
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], NT / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int s = 0; s < S && s < nstages; ++s) {
      mbar_expect_tx(&full[s], STAGE);
      bulk_copy(buf + s * STAGE, p + (size_t)s * STAGE, STAGE, &full[s]);
    }
  uint32_t acc = 0;
  for (int i = 0; i < nstages; ++i) {
    const int s = i % S;
    mbar_wait(&full[s], (i / S) & 1);
    const uint4* st = reinterpret_cast<const uint4*>(buf + s * STAGE);
    for (int j = threadIdx.x; j < STAGE / 16; j += NT) acc += fold(st[j]);
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    if (threadIdx.x == 0 && i + S < nstages) {  // refill this slot once every warp released it
      mbar_wait(&empty[s], (i / S) & 1);
      mbar_expect_tx(&full[s], STAGE);
      bulk_copy(buf + s * STAGE, p + (size_t)(i + S) * STAGE, STAGE, &full[s]);
    }
  }
  return acc;
}

template <int S, int STAGE>
__global__ void __launch_bounds__(NT, 1) bulk_stream(const char* src, size_t per_block, uint32_t* out) {
  extern __shared__ __align__(128) unsigned char buf[];  // [S][STAGE]
  __shared__ uint64_t full[S], empty[S];
  const uint32_t acc = bulk_ring<S, STAGE>(buf, full, empty, src + blockIdx.x * per_block, per_block);
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// gemv<U>: the megakernel GEMV's access pattern (gemv_group in mk_device.cuh) without its mma. A block
// streams consecutive tiles of R rows x K bf16 (row-major), `reps` times over its chunk (reps > 1 with
// a chunk of one tile: the tile is L2-resident after the first pass). A 16-row group per wpg warps
// (16 warps / groups), warp kw of a group takes the k-steps kw * 32 + j * wpg * 32; lane (gid, t)
// loads 16 B of rows gid and gid + 8 per k-step, U k-steps per batch, then folds them (the GEMV's
// mma phase). Against ldg<U> (contiguous 512 B per warp load) it says what the GEMV's addressing
// costs; against HBM it says whether a GEMV from L2 is faster.
// KB: the group's warps take contiguous K blocks instead (the megakernel's GEMV since 2026-11-30).
template <int U, bool KB = false, bool HINT = false>
__global__ void __launch_bounds__(NT, 1)
    gemv_stream(const uint16_t* src, size_t per_block, int R, int K, int reps, uint32_t* out) {
  const uint64_t pol = HINT ? evict_first_policy() : 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  const int ngroups = R / 16, wpg = 16 / (ngroups < 16 ? ngroups : 16), gslots = 16 / wpg;
  const int kw = warp % wpg, stride = KB ? 32 : wpg * 32;
  const int k0 = KB ? kw * (K / wpg) : kw * 32, k1 = KB ? k0 + K / wpg : K;
  const size_t tile = (size_t)R * K;
  const size_t ntiles = per_block / 2 / tile;
  const uint16_t* base = src + blockIdx.x * (per_block / 2);
  uint32_t acc = 0;
  for (int rep = 0; rep < reps; ++rep)
    for (size_t ti = 0; ti < ntiles; ++ti)
      for (int grp = warp / wpg; grp < ngroups; grp += gslots) {
        const uint16_t* ra = base + ti * tile + (size_t)(grp * 16 + gid) * K + t * 8;
        const uint16_t* rb = ra + (size_t)8 * K;
        for (int kk = k0; kk + (U - 1) * stride < k1; kk += U * stride) {
          uint4 wa[U], wb[U];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            wa[u] = ldw_as<HINT>(ra + kk + u * stride, pol);
            wb[u] = ldw_as<HINT>(rb + kk + u * stride, pol);
          }
#pragma unroll
          for (int u = 0; u < U; ++u) acc += fold(wa[u]) ^ fold(wb[u]);
        }
      }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// gemv_lines<U, M>: addressings that make every warp load cover whole 128-byte lines (the GEMV's
// 8 rows x 64 B touch 8 lines per load; `stream_probe gemv` found one SM's GEMV rate at about half
// the contiguous stream's, as if the SM were bound by lines per load). A 16-row group per warp
// (wpg = 1 at 256 rows; 64-row tiles: 4 warps per group, contiguous K blocks), U k-chunks of 32 per
// row in flight per batch, as the GEMV.
//   M = 1 (tiled): the weights stored as 16 x 32 blocks ([R/16][K/32][16][32], 1 KB each): the
//          GEMV's lane mapping unchanged, each load 512 contiguous bytes (rows g of the block)
//   M = 2 (rows4): row-major weights, each load 4 rows x 128 B (lane L: row 4i + L/8, piece L%8),
//          no redistribution (what the memory system sees)
//   M = 3 (rows4 + shuffles): M = 2 plus the shuffles that hand every lane the mma fragment pieces
//          of its rows g and g+8 (source-side and destination-side selects, 1 shfl per word)
template <int U, int M>
__global__ void __launch_bounds__(NT, 1)
    gemv_lines(const uint16_t* src, size_t per_block, int R, int K, uint32_t* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  const int ngroups = R / 16, wpg = 16 / (ngroups < 16 ? ngroups : 16), gslots = 16 / wpg;
  const int kw = warp % wpg, k0 = kw * (K / wpg), k1 = k0 + K / wpg;
  const size_t tile = (size_t)R * K;
  const size_t ntiles = per_block / 2 / tile;
  const uint16_t* base = src + blockIdx.x * (per_block / 2);
  uint32_t acc = 0;
  for (size_t ti = 0; ti < ntiles; ++ti)
    for (int grp = warp / wpg; grp < ngroups; grp += gslots) {
      const uint16_t* g0 = base + ti * tile + (size_t)grp * 16 * K;  // the group's first row (both layouts)
      if (M == 1) {
        const uint16_t* ra = g0 + gid * 32 + t * 8;
        for (int kk = k0; kk + (U - 1) * 32 < k1; kk += U * 32) {
          uint4 wa[U], wb[U];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            wa[u] = ldw(ra + (size_t)(kk + u * 32) * 16);
            wb[u] = ldw(ra + (size_t)(kk + u * 32) * 16 + 256);
          }
#pragma unroll
          for (int u = 0; u < U; ++u) acc += fold(wa[u]) ^ fold(wb[u]);
        }
      } else {
        // per batch: U / 2 chunks of 64 k, each 4 loads (rows 4i .. 4i + 3, 128 B each)
        const uint16_t* rp = g0 + (size_t)(lane >> 3) * K + (lane & 7) * 8;
        const bool odd = lane & 1, hi = gid >= 4;
        for (int kk = k0; kk + (U - 1) * 32 < k1; kk += U * 32) {
          uint4 v[2 * U];
#pragma unroll
          for (int c = 0; c < U / 2; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i) v[c * 4 + i] = ldw(rp + (size_t)(4 * i) * K + kk + c * 64);
          if (M == 2) {
#pragma unroll
            for (int u = 0; u < 2 * U; ++u) acc += fold(v[u]);
          } else {
            // consumer (gid, t) wants row gid (loads 0 / 1) and row gid + 8 (loads 2 / 3), pieces
            // 2t and 2t + 1. Shuffle A: lanes gid < 4 read piece 2t of load 0 from lane 8 gid + 2t
            // (even), lanes gid >= 4 piece 2t + 1 of load 1 from lane 8 (gid - 4) + 2t + 1 (odd):
            // even sources offer load 0, odd ones load 1. Shuffle B the other way round.
#pragma unroll
            for (int c = 0; c < U / 2; ++c)
#pragma unroll
              for (int h = 0; h < 2; ++h) {  // h = 0: rows 0-7 (loads 0, 1), h = 1: rows 8-15 (2, 3)
                const uint4 l0 = v[c * 4 + 2 * h], l1 = v[c * 4 + 2 * h + 1];
                const int sa = 8 * (gid & 3) + 2 * t + (hi ? 1 : 0), sb = 8 * (gid & 3) + 2 * t + (hi ? 0 : 1);
                uint32_t pa[4], pb[4];
                const uint32_t* w0 = &l0.x;
                const uint32_t* w1 = &l1.x;
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                  pa[w] = __shfl_sync(0xffffffffu, odd ? w1[w] : w0[w], sa);
                  pb[w] = __shfl_sync(0xffffffffu, odd ? w0[w] : w1[w], sb);
                }
                uint32_t ev = 0, od = 0;  // piece 2t (even) and 2t + 1 (odd) of this lane's row
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                  ev ^= hi ? pb[w] : pa[w];
                  od += hi ? pa[w] : pb[w];
                }
                acc += ev ^ od;
              }
          }
        }
      }
    }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// Run `launch` five times between events a and b and print `bytes` over the median time as GB/s,
// in total and per block. Nonzero on a CUDA error.
template <class F>
static int report(const char* name, int blocks, size_t bytes, cudaEvent_t a, cudaEvent_t b, F launch) {
  double ms = 0.0;
  if (median_launch_ms(a, b, launch, &ms)) return 1;
  const double gbs = (double)bytes / (ms * 1e-3) / 1e9;
  printf("%-26s blocks %4d: %8.1f GB/s total, %6.1f GB/s per block\n", name, blocks, gbs, gbs / blocks);
  return 0;
}

// stripe<KP, TILED> (`stream_probe stripe`): a fused MoE item's down slice. W is an H x I bf16
// matrix (row-major, I contiguous: the checkpoint's down_proj of one expert); an item reads columns
// c * n .. + n (n = 32 KP) of every row, 2 n bytes per row at a row pitch of 2 I bytes, with
// gemv_down_acc's addressing (a warp owns a contiguous run of 16-row groups, 8 / KP groups in
// flight, each thread 16 B of rows gid and gid + 8 per 32 columns). TILED: the same slice stored
// contiguously ([I / n][H][n] per matrix: the layout a re-tiled copy of the weights would have).
// Consecutive blocks take consecutive column tiles of one matrix, as a layer's fused items do
// (the I / n items of an expert run at the same time); `items` items per block, all distinct data.
template <int KP, bool TILED>
__global__ void __launch_bounds__(NT, 1)
    stripe_stream(const uint16_t* src, int H, int I, int items, uint32_t* out) {
  constexpr int GB = 8 / KP, n = 32 * KP;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  const int gpw = H / 16 / 16;  // 16 warps
  const int g_begin = warp * gpw, g_end = g_begin + gpw;
  const int tiles = I / n;
  uint32_t acc = 0;
  for (int it = 0; it < items; ++it) {
    const int item = it * gridDim.x + blockIdx.x;
    const int m = item / tiles, c = item % tiles;
    const uint16_t* W = src + (size_t)m * H * I + (TILED ? (size_t)c * H * n : (size_t)c * n);
    const int ld = TILED ? n : I;
    for (int g0 = g_begin; g0 < g_end; g0 += GB) {
      uint4 wa[GB][KP], wb[GB][KP];
#pragma unroll
      for (int u = 0; u < GB; ++u) {
        const uint16_t* ra = W + (size_t)((g0 + u) * 16 + gid) * ld + t * 8;
        const uint16_t* rb = ra + (size_t)8 * ld;
#pragma unroll
        for (int kp = 0; kp < KP; ++kp) {
          wa[u][kp] = ldw(ra + kp * 32);
          wb[u][kp] = ldw(rb + kp * 32);
        }
      }
#pragma unroll
      for (int u = 0; u < GB; ++u)
#pragma unroll
        for (int kp = 0; kp < KP; ++kp) acc += fold(wa[u][kp]) ^ fold(wb[u][kp]);
    }
    __syncthreads();  // one item after another, as the kernel's drain runs them
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// `stream_probe stripe`: down slices of fused MoE items (H 2048, I 768: the release geometry) as
// column stripes of row-major matrices and as contiguous tiles, with 48 blocks (BS 1's fused
// items), all SMs and 16.
// `stream_probe acquire`: does an acquire load (ld.acquire.gpu: LDG.STRONG.GPU + CCTL.IVALL in SASS)
// drop the SM's L1 copy of local memory, the megakernel's spilled registers? One warp keeps a
// 128-float array in local memory (dynamically indexed, so ptxas cannot keep it in registers) and,
// per iteration, polls a flag (MODE 0: ld.relaxed.gpu, 1: ld.acquire.gpu, 2: no poll), then walks
// a chain of 8 dependent loads through the array. Cycles per iteration: if the acquire's
// invalidation reaches local memory, MODE 1 pays ~8 L2 round trips more than MODE 0.
// Measured (H200, 2026-11-30, call 12): relaxed 822, acquire 994, no flag load 658
// cycles: the acquire costs ~170 cycles more than a relaxed load and spilled registers stay in L1
// (8 L2 round trips would be ~4000 cycles); an item's spill reloads after its wait are L1 hits.
template <int MODE>
__global__ void acquire_local(const unsigned* flag, float* out, int iters, long long* cycles) {
  float loc[128];
  for (int i = 0; i < 128; ++i) loc[i] = (float)((i * 37 + threadIdx.x) & 127);
  int idx = threadIdx.x & 127;
  float acc = 0.f;
  __syncwarp();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    unsigned v = 0;
    if (MODE == 0) asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    if (MODE == 1) asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    idx = (idx + (int)v) & 127;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float x = loc[idx];
      acc += x;
      idx = (int)x & 127;
    }
    loc[(idx + it) & 127] = acc * 0.f + (float)idx;  // keep the array live and written
  }
  const long long t1 = clock64();
  if (threadIdx.x == 0) *cycles = (t1 - t0) / iters;
  if (acc == 12345.f) out[threadIdx.x] = acc;
}

static int acquire_probe(uint32_t* out) {
  unsigned* flag = nullptr;
  long long* cyc = nullptr;
  CK(cudaMalloc(&flag, 4));
  CK(cudaMemset(flag, 0, 4));
  CK(cudaMalloc(&cyc, 8));
  printf("acquire probe: cycles per iteration (a flag load, then 8 dependent local-memory loads), median of 5\n");
  const char* names[] = {"ld.relaxed.gpu", "ld.acquire.gpu", "no flag load"};
  for (int mode = 0; mode < 3; ++mode) {
    long long v[5];
    for (int r = 0; r < 5; ++r) {
      if (mode == 0) acquire_local<0><<<1, 32>>>(flag, (float*)out, 2000, cyc);
      if (mode == 1) acquire_local<1><<<1, 32>>>(flag, (float*)out, 2000, cyc);
      if (mode == 2) acquire_local<2><<<1, 32>>>(flag, (float*)out, 2000, cyc);
      CK(cudaDeviceSynchronize());
      CK(cudaGetLastError());
      CK(cudaMemcpy(&v[r], cyc, 8, cudaMemcpyDeviceToHost));
    }
    std::sort(v, v + 5);
    printf("%-16s %6lld cycles per iteration\n", names[mode], v[2]);
  }
  return 0;
}

static int stripe_probe(int sms, char* buf, uint32_t* out, cudaEvent_t a, cudaEvent_t b) {
  const int H = 2048, I = 768;
  const uint16_t* s2 = reinterpret_cast<const uint16_t*>(buf);
  const size_t matrices = ((size_t)4 << 30) / ((size_t)H * I * 2);
  printf("stripe probe: a fused item's down slice, H %d x n columns of an H x %d bf16 matrix; GB/s = bytes / time\n", H, I);
  for (int bc : {48, sms, 16}) {
    auto run = [&](const char* name, int n, auto launch) {
      const int items = (int)(matrices * (I / n) / bc);
      return report(name, bc, (size_t)items * bc * H * n * 2, a, b, [&] { launch(items); });
    };
    if (run("stripe n=128 (row pitch)", 128, [&](int it) { stripe_stream<4, false><<<bc, NT>>>(s2, H, I, it, out); })) return 1;
    if (run("tiled  n=128 (contiguous)", 128, [&](int it) { stripe_stream<4, true><<<bc, NT>>>(s2, H, I, it, out); })) return 1;
    if (run("stripe n=256 (row pitch)", 256, [&](int it) { stripe_stream<8, false><<<bc, NT>>>(s2, H, I, it, out); })) return 1;
    if (run("tiled  n=256 (contiguous)", 256, [&](int it) { stripe_stream<8, true><<<bc, NT>>>(s2, H, I, it, out); })) return 1;
    if (run("stripe n=64 (row pitch)", 64, [&](int it) { stripe_stream<2, false><<<bc, NT>>>(s2, H, I, it, out); })) return 1;
  }
  return 0;
}

// `stream_probe gemv`: gemv<8> tiles (256 x 2048: the MoE up tiles' shape; 64 x 2048: QKV's) from
// HBM and from L2, with and without the megakernel's ~78 KB of shared memory, next to ldg<8>.
static int gemv_probe(int sms, char* buf, uint32_t* out, cudaEvent_t a, cudaEvent_t b) {
  const int block_counts[] = {sms, sms / 2, 16, 1};
  const uint16_t* s2 = reinterpret_cast<const uint16_t*>(buf);
  const uint4* s16 = reinterpret_cast<const uint4*>(buf);
  CK(cudaFuncSetAttribute(gemv_stream<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 78 * 1024));
  CK(cudaFuncSetAttribute(gemv_stream<8, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 78 * 1024));
  CK(cudaFuncSetAttribute(ldg_stream<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 78 * 1024));
  printf("gemv probe: GB/s = bytes streamed / kernel time (median of 5); L2 = one tile per block, 40 passes\n");
  for (int bc : block_counts) {
    auto run = [&](const char* name, size_t bytes, auto launch) { return report(name, bc, bytes, a, b, launch); };
    const size_t hbm = (size_t)24 << 20;  // per block, from HBM (132 x 24 MB: far beyond L2)
    for (int smem : {0, 78 * 1024}) {
      const char* sfx = smem ? " smem78K" : "";
      char n[64];
      snprintf(n, sizeof n, "ldg U=8 HBM%s", sfx);
      if (run(n, hbm * bc, [&] { ldg_stream<8><<<bc, NT, smem>>>(s16, hbm, out); })) return 1;
      snprintf(n, sizeof n, "gemv 256x2048 HBM%s", sfx);
      if (run(n, hbm * bc, [&] { gemv_stream<8><<<bc, NT, smem>>>(s2, hbm, 256, 2048, 1, out); })) return 1;
      snprintf(n, sizeof n, "gemv 64x2048 HBM%s", sfx);
      if (run(n, hbm * bc, [&] { gemv_stream<8><<<bc, NT, smem>>>(s2, hbm, 64, 2048, 1, out); })) return 1;
      snprintf(n, sizeof n, "gemv 64x2048 kblock HBM%s", sfx);
      if (run(n, hbm * bc, [&] { gemv_stream<8, true><<<bc, NT, smem>>>(s2, hbm, 64, 2048, 1, out); })) return 1;
      if (!smem) {
        // whole-line addressings (gemv_lines) next to the GEMV's own (contiguous K blocks)
        for (int R : {256, 64}) {
          auto lines = [&](const char* nm, auto launch) {
            snprintf(n, sizeof n, "%s %dx2048 HBM", nm, R);
            return run(n, hbm * bc, launch);
          };
          if (lines("gemv kblock", [&] { gemv_stream<8, true><<<bc, NT>>>(s2, hbm, R, 2048, 1, out); })) return 1;
          if (lines("tiled", [&] { gemv_lines<8, 1><<<bc, NT>>>(s2, hbm, R, 2048, out); })) return 1;
          if (lines("rows4", [&] { gemv_lines<8, 2><<<bc, NT>>>(s2, hbm, R, 2048, out); })) return 1;
          if (lines("rows4+shfl", [&] { gemv_lines<8, 3><<<bc, NT>>>(s2, hbm, R, 2048, out); })) return 1;
        }
      }
      const size_t t64 = (size_t)64 * 2048 * 2;  // one 256 KB tile per block: L2-resident
      snprintf(n, sizeof n, "gemv 64x2048 L2%s", sfx);
      if (run(n, t64 * 40 * bc, [&] { gemv_stream<8><<<bc, NT, smem>>>(s2, t64, 64, 2048, 40, out); })) return 1;
    }
  }
  return 0;
}

// `stream_probe loaded`: what M streaming blocks pull each while B other blocks load HBM, by the
// measured blocks' strategy: registers (ldg U=8: 128 KB in flight per block, the megakernel GEMV's
// budget) or a bulk-copy ring (S stages of 32 KB, up to 192 KB in flight, no registers or L1).
// Every block stamps %globaltimer around its own stream; a measured block's rate = its bytes over
// its own time, so the background's longer stream only sets the load. Question for the megakernel:
// does a deeper in-flight window raise one SM's rate when HBM is shared (its MoE phases stream on
// 48-88 SMs at ~50-60 GB/s each)?

template <int MODE>  // 0: ldg U=8, 1: bulk 4 x 32 KB, 2: bulk 6 x 32 KB
__global__ void __launch_bounds__(NT, 1)
    loaded_stream(const char* src, size_t per_measured, size_t per_background, int measured, uint64_t* span,
                  uint32_t* out) {
  extern __shared__ __align__(128) unsigned char lring[];
  __shared__ uint64_t full[6], empty[6];
  const bool mine = (int)blockIdx.x < measured;
  const size_t bytes = mine ? per_measured : per_background;
  const char* p = src + (mine ? (size_t)blockIdx.x * per_measured
                              : (size_t)measured * per_measured + (size_t)(blockIdx.x - measured) * per_background);
  __syncthreads();
  const uint64_t t0 = globaltimer();
  uint32_t acc;
  if (!mine || MODE == 0)
    acc = ldg_words<8>(reinterpret_cast<const uint4*>(p), bytes / 16);
  else if (MODE == 1)
    acc = bulk_ring<4, 32768>(lring, full, empty, p, bytes);
  else
    acc = bulk_ring<6, 32768>(lring, full, empty, p, bytes);
  __syncthreads();
  if (threadIdx.x == 0) span[blockIdx.x] = globaltimer() - t0;
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// the measured blocks' mean GB/s per block (each over its own time), median over 5 launches
template <int MODE>
static int loaded_case(const char* name, char* buf, uint32_t* out, uint64_t* span, int measured, int background) {
  const size_t per_m = (size_t)16 << 20, per_b = (size_t)32 << 20;  // the background outlasts; <= 4 GiB in all
  const size_t smem = MODE == 0 ? 0 : (MODE == 1 ? 4 : 6) * 32768;
  CK(cudaFuncSetAttribute(loaded_stream<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  double rate[5];  // mean GB/s per measured block, per launch
  for (int r = 0; r < 5; ++r) {
    loaded_stream<MODE><<<measured + background, NT, smem>>>(buf, per_m, per_b, measured, span, out);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    uint64_t h[1024];
    CK(cudaMemcpy(h, span, sizeof(uint64_t) * (measured + background), cudaMemcpyDeviceToHost));
    double gbs = 0;
    for (int i = 0; i < measured; ++i) gbs += (double)per_m / (double)h[i];  // bytes / ns = GB/s
    rate[r] = gbs / measured;
  }
  const double med = median5(rate);
  printf("loaded %-10s measured %3d + background %3d: %6.1f GB/s per measured block (%6.0f GB/s in all)\n", name,
         measured, background, med, med * measured);
  return 0;
}

static int loaded_probe(int sms, char* buf, uint32_t* out) {
  uint64_t* span = nullptr;
  CK(cudaMalloc(&span, 1024 * sizeof(uint64_t)));
  printf("loaded probe: measured blocks stream 16 MB each, background blocks 32 MB each (ldg U=8)\n");
  for (int measured : {16, 48}) {
    for (int background : {0, 40, sms - measured}) {
      if (measured + background > sms) continue;
      if (loaded_case<0>("ldg U=8", buf, out, span, measured, background)) return 1;
      if (loaded_case<1>("bulk 4x32K", buf, out, span, measured, background)) return 1;
      if (loaded_case<2>("bulk 6x32K", buf, out, span, measured, background)) return 1;
    }
  }
  return 0;
}

// `stream_probe hint`: the GEMV addressing (contiguous K blocks) with and without the megakernel's
// L2 hints (ld_weight16: evict_first, L2::128B), on the MoE tiles' shapes since 2026-11-30 (512 x
// 2048 up tiles, 256 x 2048 small up tiles, 512 x 768 down tiles), next to contiguous ldg<8>: whether
// the GEMV's pattern still streams below the contiguous rate once L2 fetches whole lines.
static int hint_probe(int sms, char* buf, uint32_t* out, cudaEvent_t a, cudaEvent_t b) {
  const int block_counts[] = {sms, sms / 2, 16};
  const uint16_t* s2 = reinterpret_cast<const uint16_t*>(buf);
  const uint4* s16 = reinterpret_cast<const uint4*>(buf);
  printf("hint probe: GB/s = bytes streamed / kernel time (median of 5)\n");
  for (int bc : block_counts) {
    auto run = [&](const char* name, size_t bytes, auto launch) { return report(name, bc, bytes, a, b, launch); };
    const size_t hbm = (size_t)24 << 20;  // per block: 132 x 24 MB, far beyond L2
    if (run("ldg U=8", hbm * bc, [&] { ldg_stream<8><<<bc, NT>>>(s16, hbm, out); })) return 1;
    const int shapes[][2] = {{512, 2048}, {256, 2048}, {512, 768}};
    for (const auto& sh : shapes) {
      char n[64];
      snprintf(n, sizeof n, "gemv %dx%d", sh[0], sh[1]);
      if (run(n, hbm * bc, [&] { gemv_stream<8, true, false><<<bc, NT>>>(s2, hbm, sh[0], sh[1], 1, out); })) return 1;
      snprintf(n, sizeof n, "gemv %dx%d L2::128B", sh[0], sh[1]);
      if (run(n, hbm * bc, [&] { gemv_stream<8, true, true><<<bc, NT>>>(s2, hbm, sh[0], sh[1], 1, out); })) return 1;
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  ProbeMem m;
  if (probe_alloc(&m)) return 1;
  char* buf = m.buf;
  uint32_t* out = m.out;
  cudaEvent_t a = m.a, b = m.b;
  if (argc > 1 && argv[1][0] == 'g') return gemv_probe(sms, buf, out, a, b);  // `stream_probe gemv`
  if (argc > 1 && argv[1][0] == 'h') return hint_probe(sms, buf, out, a, b);  // `stream_probe hint`
  if (argc > 1 && argv[1][0] == 'l') return loaded_probe(sms, buf, out);       // `stream_probe loaded`
  if (argc > 1 && argv[1][0] == 's') return stripe_probe(sms, buf, out, a, b);  // `stream_probe stripe`
  if (argc > 1 && argv[1][0] == 'a') return acquire_probe(out);                  // `stream_probe acquire`
  const int block_counts[] = {sms, sms / 2, 16, 1};
  printf("SMs %d; per-block chunk: min(4 GiB / blocks, 256 MiB); GB/s = bytes / kernel time (median of 5)\n", sms);
  for (int bc : block_counts) {
    const size_t per_block = probe_chunk(bc, (size_t)256 << 20);
    auto run = [&](const char* name, auto launch) { return report(name, bc, per_block * bc, a, b, launch); };
    const uint4* s16 = reinterpret_cast<const uint4*>(buf);
    if (run("ldg U=4", [&] { ldg_stream<4><<<bc, NT>>>(s16, per_block, out); })) return 1;
    if (run("ldg U=8", [&] { ldg_stream<8><<<bc, NT>>>(s16, per_block, out); })) return 1;
    if (run("ldg U=16", [&] { ldg_stream<16><<<bc, NT>>>(s16, per_block, out); })) return 1;
    // the same loads with shared memory reserved but unused: the block's shared-memory size sets
    // the SM's L1 share, and in-flight loads need L1 room (the megakernel lost 25 % at BS 1 with
    // 64 KB more shared memory, docs/PERF.md (decision table))
    for (int kb : {64, 100, 150, 200}) {
      CK(cudaFuncSetAttribute(ldg_stream<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, kb * 1024));
      char name[32];
      snprintf(name, sizeof name, "ldg U=8 smem%dK", kb);
      if (run(name, [&] { ldg_stream<8><<<bc, NT, kb * 1024>>>(s16, per_block, out); })) return 1;
    }
    CK(cudaFuncSetAttribute(cpa_stream<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * NT * 16));
    CK(cudaFuncSetAttribute(cpa_stream<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * NT * 16));
    CK(cudaFuncSetAttribute(cpa_stream<24>, cudaFuncAttributeMaxDynamicSharedMemorySize, 24 * NT * 16));
    if (run("cp.async S=8", [&] { cpa_stream<8><<<bc, NT, 8 * NT * 16>>>(s16, per_block, out); })) return 1;
    if (run("cp.async S=16", [&] { cpa_stream<16><<<bc, NT, 16 * NT * 16>>>(s16, per_block, out); })) return 1;
    if (run("cp.async S=24", [&] { cpa_stream<24><<<bc, NT, 24 * NT * 16>>>(s16, per_block, out); })) return 1;
    CK(cudaFuncSetAttribute(bulk_stream<4, 32768>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 32768));
    CK(cudaFuncSetAttribute(bulk_stream<8, 16384>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 16384));
    CK(cudaFuncSetAttribute(bulk_stream<6, 32768>, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * 32768));
    if (run("bulk 4x32K", [&] { bulk_stream<4, 32768><<<bc, NT, 4 * 32768>>>(buf, per_block, out); })) return 1;
    if (run("bulk 8x16K", [&] { bulk_stream<8, 16384><<<bc, NT, 8 * 16384>>>(buf, per_block, out); })) return 1;
    if (run("bulk 6x32K", [&] { bulk_stream<6, 32768><<<bc, NT, 6 * 32768>>>(buf, per_block, out); })) return 1;
  }
  return 0;
}
