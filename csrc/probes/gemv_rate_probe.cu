// gemv_rate_probe.cu: how fast one SM streams the megakernel's GEMV (gemv_group's batch loop with its
// mma.sync and activation reads, not only its loads) when few SMs stream and when all do, and which
// loop shape lifts that rate. A stand-alone measurement (not part of the megakernel).
//
// the 2026-12-01 timeline: a BS 8 up tile (768 x 2048) streams ~46 GB/s per SM and a down tile
// (1024 x 768) ~55 (both beside the attention's SMs, i.e. their HBM share), while `stream_probe hint`
// moved the same addressing at ~118 GB/s per SM with 16 blocks (loads folded, no mma). The layer's
// holes (its head, the attention SMs' switch to the MoE queue, the tail) are phases in which few SMs
// stream, so there the per-SM rate is the step's rate. Measured (calls 7-8): the loop with its mma
// 86-87 GB/s per SM at 40 blocks (loads alone 91), 66 at 66, 34.9 at 132 (docs/PERF.md, 2026-12-01).
// Loop shapes (every block streams its own consecutive tiles of R x K bf16,
// 512 threads, the megakernel's split: wpg warps per 16-row group, contiguous K blocks, U = 8 k-steps
// of 16 B per row pair in registers per batch, the evict_first + L2::128B loads):
//   fold    the loads folded into a checksum (stream_probe's gemv: the memory side alone)
//   mma1    gemv_group: each batch's 16 mma.sync in one accumulator chain, B fragments from shared memory
//   mma4    the same with four independent accumulators (a chain of 4 instead of 16 per batch)
//   pipe    U = 4 batches, the next batch's loads issued before this batch's mma (the same 64
//           registers: 4 k-steps always in flight instead of 8 then none)
// Build and run (GPU machine): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
//   csrc/probes/gemv_rate_probe.cu -o /tmp/gemv_rate_probe && /tmp/gemv_rate_probe
#include "probe_util.cuh"

constexpr int NT = 512, NWARPS = NT / 32, ACT_PAD = 32;

enum Shape { FOLD = 0, MMA1 = 1, MMA4 = 2, PIPE = 3 };

// One 16-row group's K block [k0, k1): rows ra (gid) and rb (gid + 8), B fragments from xa.
template <int MODE>
__device__ __forceinline__ void group(float (&c)[4][4], uint32_t& acc, const uint16_t* ra, const uint16_t* rb,
                                      const uint16_t* xa, int k0, int k1, uint64_t pol) {
  if constexpr (MODE == PIPE) {
    constexpr int U = 4;
    uint4 wa[U], wb[U], na[U], nb[U];
    int kk = k0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      wa[u] = ldw_hint(ra + kk + u * 32, pol);
      wb[u] = ldw_hint(rb + kk + u * 32, pol);
    }
    for (; kk + U * 32 <= k1; kk += U * 32) {
      const bool more = kk + 2 * U * 32 <= k1;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = more ? kk + U * 32 + u * 32 : kk + u * 32;  // past the end: reload (an L1/L2 hit)
        na[u] = ldw_hint(ra + k, pol);
        nb[u] = ldw_hint(rb + k, pol);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const uint4 bx = *reinterpret_cast<const uint4*>(xa + kk + u * 32);
        mma16816(c[0], wa[u].x, wb[u].x, wa[u].y, wb[u].y, bx.x, bx.y);
        mma16816(c[0], wa[u].z, wb[u].z, wa[u].w, wb[u].w, bx.z, bx.w);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        wa[u] = na[u];
        wb[u] = nb[u];
      }
    }
  } else {
    constexpr int U = 8;
    for (int kk = k0; kk + (U - 1) * 32 < k1; kk += U * 32) {
      uint4 wa[U], wb[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        wa[u] = ldw_hint(ra + kk + u * 32, pol);
        wb[u] = ldw_hint(rb + kk + u * 32, pol);
      }
      if constexpr (MODE == FOLD) {
#pragma unroll
        for (int u = 0; u < U; ++u) acc += fold(wa[u]) ^ fold(wb[u]);
      } else {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const uint4 bx = *reinterpret_cast<const uint4*>(xa + kk + u * 32);
          float(&cc)[4] = c[MODE == MMA4 ? u % 4 : 0];
          mma16816(cc, wa[u].x, wb[u].x, wa[u].y, wb[u].y, bx.x, bx.y);
          mma16816(cc, wa[u].z, wb[u].z, wa[u].w, wb[u].w, bx.z, bx.w);
        }
      }
    }
  }
}

template <int MODE>
__global__ void __launch_bounds__(NT, 1) gemv_rate(const uint16_t* src, size_t per_block, int R, int K, uint32_t* out) {
  extern __shared__ uint16_t act[];  // [8][K + ACT_PAD] bf16: small nonzero values
  for (int i = threadIdx.x; i < 8 * (K + ACT_PAD); i += NT) act[i] = 0x3c00 + (i & 7);
  __syncthreads();
  const uint64_t pol = evict_first_policy();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  const int ngroups = R / 16, wpg = NWARPS / (ngroups < NWARPS ? ngroups : NWARPS), gslots = NWARPS / wpg;
  const int kw = warp % wpg, span = ((K / 32 + wpg - 1) / wpg) * 32;
  const int k0 = kw * span, k1 = k0 + span < K ? k0 + span : K;
  const size_t tile = (size_t)R * K;
  const size_t ntiles = per_block / 2 / tile;
  const uint16_t* base = src + blockIdx.x * (per_block / 2);
  const uint16_t* xa = act + gid * (K + ACT_PAD) + t * 8;
  float c[4][4] = {};
  uint32_t acc = 0;
  for (size_t ti = 0; ti < ntiles; ++ti) {
    for (int grp = warp / wpg; grp < ngroups; grp += gslots) {
      const uint16_t* ra = base + ti * tile + (size_t)(grp * 16 + gid) * K + t * 8;
      group<MODE>(c, acc, ra, ra + (size_t)8 * K, xa, k0, k1, pol);
    }
    __syncthreads();  // the megakernel's end-of-GEMV barrier, once per tile
  }
  float s = 0.f;
  for (int j = 0; j < 4; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (acc == 0x12345678u || s == 1.2345f) out[blockIdx.x] = acc + (uint32_t)s;
}

template <int MODE>
static int run(const char* name, int blocks, const uint16_t* src, size_t per_block, int R, int K, uint32_t* out,
               cudaEvent_t a, cudaEvent_t b) {
  const int smem = 8 * (K + ACT_PAD) * 2;
  CK(cudaFuncSetAttribute(gemv_rate<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const size_t bytes = (per_block / 2 / ((size_t)R * K)) * (size_t)R * K * 2 * blocks;
  double ms = 0.0;
  if (median_launch_ms(a, b, [&] { gemv_rate<MODE><<<blocks, NT, smem>>>(src, per_block, R, K, out); }, &ms)) return 1;
  const double gbs = (double)bytes / (ms * 1e-3) / 1e9;
  printf("%-5s %4d x %4d  blocks %3d: %7.1f GB/s total, %6.1f GB/s per SM\n", name, R, K, blocks, gbs, gbs / blocks);
  return 0;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  ProbeMem m;
  if (probe_alloc(&m)) return 1;
  uint32_t* out = m.out;
  cudaEvent_t a = m.a, b = m.b;
  const uint16_t* src = reinterpret_cast<const uint16_t*>(m.buf);
  const int shapes[][2] = {{768, 2048}, {1024, 768}, {64, 2048}};  // BS 8 up, down and QKV tiles
  printf("gemv rate probe: per-block chunk min(4 GiB / blocks, 96 MiB); GB/s = bytes / kernel time (median of 5)\n");
  for (int blocks : {16, 40, 66, sms}) {
    const size_t per_block = probe_chunk(blocks, (size_t)96 << 20);
    for (const auto& sh : shapes) {
      const int R = sh[0], K = sh[1];
      if (run<FOLD>("fold", blocks, src, per_block, R, K, out, a, b)) return 1;
      if (run<MMA1>("mma1", blocks, src, per_block, R, K, out, a, b)) return 1;
      if (run<MMA4>("mma4", blocks, src, per_block, R, K, out, a, b)) return 1;
      if (run<PIPE>("pipe", blocks, src, per_block, R, K, out, a, b)) return 1;
    }
  }
  return 0;
}
