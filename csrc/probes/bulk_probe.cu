// bulk_probe.cu: how long does 64 KB take to land in one SM's shared memory by cp.async.bulk, by the
// size of the copies it is cut into (issue 41: the resident-weights experiment cut a QKV tile's
// first 256 columns into 128 copies of 512 B, one per row, and its GEMV waited for them ~10 us after
// they were issued). A stand-alone measurement, not part of the megakernel.
//
// G = 40 loader blocks (the BS 1 QKV tiles' SMs) each load 64 KB ROUNDS times, every round from fresh
// addresses of a 4 GiB buffer (far beyond L2), completing on one mbarrier, in one pattern:
//   1x64K    one copy of 64 KB
//   16x4K    16 copies of 4 KB (whole 2,048-column bf16 rows)
//   64x1K    64 copies of 1 KB, rows 8 KB apart
//   128x512  128 copies of 512 B, rows 4 KB apart (the first 256 columns of 128 rows)
//   ldg      the same 64 KB as 128x512 by register loads (512 threads x 8 x 16 B), for comparison
// with the other 92 SMs idle, or streaming HBM with register loads (bg: the engine's MoE items beside
// the QKV tiles) until every loader is done. Output: per pattern and background, the median and p90
// of a round's time from issue to landed (us) and the loaders' GB/s per SM.
// Build and run (GPU machine): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
//   csrc/probes/bulk_probe.cu -o /tmp/bulk_probe && /tmp/bulk_probe   (or: PROBE=bulk_probe gpu_run.sh probe)
#include <algorithm>
#include <vector>

#include "probe_util.cuh"

constexpr int NT = 512, LOADERS = 40, ROUNDS = 32, BYTES = 65536;
constexpr size_t ROUND_SPAN = (size_t)1 << 20;  // a round's source region (a pattern reads 512 KB of it at most)
enum Pattern { ONE = 0, ROWS4K = 1, PIECES1K = 2, PIECES512 = 3, LDG = 4, NPAT = 5 };
static const char* kNames[NPAT] = {"1x64K", "16x4K", "64x1K", "128x512", "ldg"};

__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__global__ void __launch_bounds__(NT, 1) bulk_kernel(const char* W, int pattern, int bg, unsigned* done,
                                                     unsigned long long* t_out, uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bar;
  const int b = blockIdx.x, lane = threadIdx.x % 32;
  const uint64_t pol = evict_first_policy();
  if (b >= LOADERS) {  // background: stream register loads until every loader is done
    if (!bg) return;
    // a 16 MB window each in the lower 2 GB (92 x 16 MB: far beyond L2), read round and round
    const uint4* src = reinterpret_cast<const uint4*>(W + ((size_t)(b - LOADERS) << 24));
    uint32_t acc = 0;
    for (size_t i = threadIdx.x; *(volatile unsigned*)done < LOADERS; i += 8 * NT) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = ldw_hint(src + ((i + u * NT) & ((1u << 20) - 1)), pol);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc ^= fold(v[u]);
    }
    sink[b * NT + threadIdx.x] = acc;
    return;
  }
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  uint32_t acc = 0;
  for (int r = 0; r < ROUNDS; ++r) {
    // the upper 2 GB (the background streams the lower): 40 x 32 rounds of 1 MB regions
    const char* src = W + ((size_t)1 << 31) + (size_t)(b * ROUNDS + r) * ROUND_SPAN;
    __syncthreads();
    const uint64_t t0 = globaltimer();
    if (pattern == LDG) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int piece = u * NT + threadIdx.x;  // 16-byte piece of the 128 x 512 B pattern
        v[u] = ldw_hint(src + (size_t)(piece / 32) * 4096 + (piece % 32) * 16, pol);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) acc ^= fold(v[u]);
    } else if (threadIdx.x < 32) {
      const int n = pattern == ONE ? 1 : pattern == ROWS4K ? 16 : pattern == PIECES1K ? 64 : 128;
      const uint32_t bytes = BYTES / n;
      const size_t pitch = pattern == PIECES1K ? 8192 : 4096;
      if (lane == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&bar)), "r"(BYTES) : "memory");
      __syncwarp();
      for (int i = lane; i < n; i += 32)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
            "%4;" ::"r"(sa(smem + (size_t)i * bytes)),
            "l"(src + i * pitch), "r"(bytes), "r"(sa(&bar)), "l"(pol)
            : "memory");
      uint32_t ok = 0;
      while (!ok)
        asm volatile(
            "{\n .reg .pred P;\n mbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2;\n selp.u32 %0, 1, 0, P;\n}\n"
            : "=r"(ok)
            : "r"(sa(&bar)), "r"((uint32_t)(r & 1))
            : "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) t_out[b * ROUNDS + r] = globaltimer() - t0;
    if (pattern != LDG) acc ^= reinterpret_cast<const uint32_t*>(smem)[threadIdx.x * 32];
  }
  sink[b * NT + threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(done, 1u);
}

int main() {
  ProbeMem m;
  if (probe_alloc(&m)) return 1;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned* done = nullptr;
  unsigned long long* t_dev = nullptr;
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&done, sizeof(unsigned)));
  CK(cudaMalloc(&t_dev, LOADERS * ROUNDS * sizeof(unsigned long long)));
  CK(cudaMalloc(&sink, (size_t)sms * NT * sizeof(uint32_t)));
  CK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, BYTES));
  printf("bulk_probe: %d SMs, %d loaders x %d rounds of 64 KB\n", sms, LOADERS, ROUNDS);
  std::vector<unsigned long long> t(LOADERS * ROUNDS);
  for (int bg = 0; bg < 2; ++bg)
    for (int pat = 0; pat < NPAT; ++pat) {
      std::vector<double> all;
      for (int rep = 0; rep < 3; ++rep) {
        CK(cudaMemset(done, 0, sizeof(unsigned)));
        bulk_kernel<<<sms, NT, BYTES>>>(m.buf, pat, bg, done, t_dev, sink);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(t.data(), t_dev, t.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < t.size(); ++i)
          if (i % ROUNDS) all.push_back(t[i] / 1e3);  // each loader's first round warms its code: left out
      }
      std::sort(all.begin(), all.end());
      const double med = all[all.size() / 2], p90 = all[all.size() * 9 / 10];
      printf("bulk %-8s bg %-6s round median %6.2f us  p90 %6.2f us  %6.1f GB/s per SM\n", kNames[pat],
             bg ? "stream" : "idle", med, p90, BYTES / med / 1e3);
    }
  return 0;
}
