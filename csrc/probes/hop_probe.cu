// hop_probe.cu: what a hand-off between two SMs costs. A flag hop the megakernel's way (a release add
// on a global counter, the waiter's thread 0 spinning with ld.acquire.gpu, block barriers on both
// sides) and through distributed shared memory inside a thread-block cluster (st.release.cluster into
// the partner's shared memory, ld.acquire.cluster spinning on its own); dependent load chains (L2
// hits, HBM misses, the partner's shared memory: a data round trip); cluster-wide barriers of 2 / 8 /
// 16 SMs; an 8-KB hand-off each way (every thread's 16 B written by the producer, a flag, read by
// the consumer and used in its answer), through global memory the megakernel's way and pushed into
// the partner's shared memory. Each with the other blocks idle and with them streaming HBM as the megakernel's GEMVs do (8
// k-steps of 16 B per thread in flight, evict_first + L2::128B). The question (docs/MEGAKERNEL.md): a
// BS 1 item spends ~2-4 us staging its activations from L2 and ~1.5-2 more from its GEMV's end to its
// signal, while the flag hop itself takes ~0.5 us; would data handed over inside a cluster cost a
// fraction of that? A stand-alone measurement (not part of the megakernel).
// Build and run (GPU machine): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
//   csrc/probes/hop_probe.cu -o /tmp/hop_probe && /tmp/hop_probe
#include <algorithm>

#include "probe_util.cuh"

constexpr int NT = 512, CLUSTER = 2, ITERS = 2000, WARMUP = 100;
constexpr int CHAIN = 1 << 20;  // the L2 chain: 1 Mi words (4 MB), a stride that defeats the sectors

enum Mode {
  GLOBAL_PAIR = 0,
  GLOBAL_FAR = 1,
  CLUSTER_PAIR = 2,
  L2_CHAIN = 3,
  DSMEM_CHAIN = 4,
  DATA_GLOBAL = 5,
  DATA_CLUSTER = 6
};
constexpr int NMODES = 7, DSMEM_WORDS = 4096;

__device__ __forceinline__ uint32_t cluster_addr(const void* smem, unsigned rank) {
  uint32_t local = (uint32_t)__cvta_generic_to_shared(smem), remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ unsigned ld_acquire_cluster(uint32_t addr) {
  unsigned v;
  asm volatile("ld.acquire.cluster.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_cluster(uint32_t addr, unsigned v) {
  asm volatile("st.release.cluster.shared::cluster.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_cluster_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Background: stream `chunk` bytes per block from the 4 GiB buffer, round after round, until *stop.
__device__ void stream_until(const uint4* buf, size_t chunk, const volatile unsigned* stop, uint32_t* out) {
  const uint64_t pol = evict_first_policy();
  const size_t n = chunk / 16;
  const uint4* base = buf + (size_t)blockIdx.x * n;
  uint32_t acc = 0;
  for (size_t i = threadIdx.x; !*stop; i += (size_t)NT * 8) {
    if (i + (size_t)NT * 7 >= n) i = threadIdx.x;
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = ldw_hint(base + i + (size_t)u * NT, pol);
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= fold(v[u]);
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// Blocks 0 and `partner` measure (MODE), the others stream while `background`, else idle. res[0]:
// ns per hop (ping-pong round trip / 2) or per chained load; DATA_*: the payloads that arrived wrong
// are counted into out[2000] (0 expected).
template <int MODE>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(NT, 1)
    hop_kernel(const uint4* buf, size_t chunk, unsigned* flags, const unsigned* chain, uint4* xbuf, int background,
               int partner, uint32_t* out, double* res) {
  __shared__ unsigned s_flag;  // (the launch's 120 KB of dynamic shared memory: one block per SM)
  if (threadIdx.x == 0) s_flag = 0;
  cluster_sync();
  volatile unsigned* stop = flags + 64;
  const int me = blockIdx.x;
  if (me != 0 && me != partner) {
    if (background) stream_until(buf, chunk, stop, out);
    cluster_sync();
    return;
  }
  const bool ping = me == 0;
  uint64_t t0 = 0;
  if (MODE == DSMEM_CHAIN) {  // dependent loads from the partner's shared memory (a chain it wrote)
    extern __shared__ unsigned dyn[];
    for (int j = threadIdx.x; j < DSMEM_WORDS; j += NT) dyn[j] = (unsigned)(j * 97 + 1) & (DSMEM_WORDS - 1);
    cluster_sync();
    if (ping && threadIdx.x == 0) {
      const uint32_t base = cluster_addr(dyn, cluster_rank() ^ 1);
      unsigned j = 0;
      for (int i = 0; i < WARMUP + ITERS; ++i) {
        if (i == WARMUP) t0 = globaltimer();
        asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(j) : "r"(base + 4 * j) : "memory");
      }
      res[0] = (double)(globaltimer() - t0) / ITERS;
      out[1001] = j;
      *stop = 1;
    }
    cluster_sync();
    return;
  }
  if (MODE == L2_CHAIN) {
    // HBM misses (res[1]): each load's address hashed from the previous one's value, over the 4 GiB
    // buffer (far beyond L2); then L2 hits (res[0]): the 4-MB chain walked twice, timed the second
    // time. Volatile loads: the compiler may neither merge the walks nor drop one.
    if (ping && threadIdx.x == 0) {
      const unsigned* words = reinterpret_cast<const unsigned*>(buf);
      const size_t mask = ((size_t)ProbeMem::TOTAL / 4 - 1) & ~(size_t)31;  // 128-byte lines
      size_t at = 12345 * 32;
      t0 = globaltimer();
      for (int i = 0; i < ITERS; ++i) {
        unsigned v;
        asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(words + at) : "memory");
        at = ((at + v) * 2654435761ull) & mask;
      }
      res[1] = (double)(globaltimer() - t0) / ITERS;
      unsigned j = (unsigned)at;
      for (int pass = 0; pass < 2; ++pass) {
        j &= CHAIN - 1;
        t0 = globaltimer();
        for (int i = 0; i < ITERS; ++i)
          asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(j) : "l"(chain + j) : "memory");
      }
      res[0] = (double)(globaltimer() - t0) / ITERS;
      out[1000] = j;
      *stop = 1;
    }
    cluster_sync();
    return;
  }
  // Ping-pong: a flag hop (GLOBAL_*, CLUSTER_PAIR) or an 8-KB hand-off each way, 16 B per thread
  // (DATA_*). A send is the payload's stores, the block's barrier and thread 0's release (the
  // megakernel's add on a global counter, or a release store into the partner's shared-memory flag);
  // a receive is thread 0's acquire spin, the block's barrier and the payload's loads (ld.global.cg,
  // or the block's own shared memory, where the partner pushed it with st.shared::cluster). The
  // answer is the received value plus one, so the consumer's read is on the chain.
  constexpr bool CL = MODE == CLUSTER_PAIR || MODE == DATA_CLUSTER, DATA = MODE >= DATA_GLOBAL;
  extern __shared__ uint4 dyn4[];
  uint4* gin = xbuf + (ping ? 0 : NT) + threadIdx.x;  // where this block receives (global)
  uint4* gout = xbuf + (ping ? NT : 0) + threadIdx.x;
  unsigned* gwait = flags + (ping ? 0 : 32);
  unsigned* gsig = flags + (ping ? 32 : 0);
  const uint32_t mine = cluster_addr(&s_flag, cluster_rank());
  const uint32_t theirs = cluster_addr(&s_flag, cluster_rank() ^ 1);
  const uint32_t peer = cluster_addr(dyn4, cluster_rank() ^ 1) + 16u * threadIdx.x;
  auto send = [&](unsigned want, unsigned x) {
    if (DATA) {
      const uint4 v = make_uint4(x, threadIdx.x, ~x, want);
      if (CL)
        st_cluster_v4(peer, v);
      else
        __stcg(gout, v);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (CL)
        st_release_cluster(theirs, want);
      else
        signal_release(gsig, 1);
    }
  };
  unsigned x = 0, bad = 0;
  for (int i = 0; i < WARMUP + ITERS; ++i) {
    if (ping && i == WARMUP && threadIdx.x == 0) t0 = globaltimer();
    const unsigned want = (unsigned)i + 1;
    if (ping) send(want, x);
    if (threadIdx.x == 0) {
      if (CL)
        while (ld_acquire_cluster(mine) < want) {
        }
      else
        while (ld_acquire(gwait) < want) {
        }
    }
    __syncthreads();
    if (DATA) {
      const uint4 r = CL ? dyn4[threadIdx.x] : __ldcg(gin);
      // ping sent 2i, pong answers 2i + 1; ping's next payload is 2i + 2
      const unsigned expect = ping ? 2u * i + 1u : 2u * i;
      bad += (r.x != expect) | (r.y != threadIdx.x) | (r.z != ~expect) | (r.w != want);
      x = r.x + 1u;
    }
    if (!ping) send(want, x);  // (ping's next send: its barrier orders these reads before the push)
  }
  if (bad) atomicAdd(out + 2000, bad);
  if (ping && threadIdx.x == 0) {
    res[0] = (double)(globaltimer() - t0) / (2.0 * ITERS);
    *stop = 1;
  }
  cluster_sync();
}

// A cluster-wide barrier (barrier.cluster arrive.release / wait.acquire, every thread) ITERS times in
// cluster 0 (clusters of the launch's size), the other clusters streaming while `background`, else idle.
// res[0]: ns per barrier.
__global__ void __launch_bounds__(NT, 1)
    barrier_kernel(const uint4* buf, size_t chunk, unsigned* flags, int background, uint32_t* out, double* res) {
  volatile unsigned* stop = flags + 64;
  unsigned nblocks;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(nblocks));
  cluster_sync();
  if (blockIdx.x >= nblocks) {  // not cluster 0
    if (background) stream_until(buf, chunk, stop, out);
    cluster_sync();
    return;
  }
  uint64_t t0 = 0;
  for (int i = 0; i < WARMUP + ITERS; ++i) {
    if (i == WARMUP) t0 = globaltimer();
    cluster_sync();
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    res[0] = (double)(globaltimer() - t0) / ITERS;
    *stop = 1;
  }
  cluster_sync();
}

int main() {
  ProbeMem m;
  if (probe_alloc(&m)) return 1;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int SMEM = 120 * 1024;
  const void* kernels[NMODES] = {(const void*)hop_kernel<0>, (const void*)hop_kernel<1>, (const void*)hop_kernel<2>,
                                 (const void*)hop_kernel<3>, (const void*)hop_kernel<4>, (const void*)hop_kernel<5>,
                                 (const void*)hop_kernel<6>};
  for (const void* k : kernels) CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  // every block resident at once (clusters fill GPCs pairwise: fewer than sms / 2 may fit)
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(sms / CLUSTER * CLUSTER);
  lc.blockDim = dim3(NT);
  lc.dynamicSmemBytes = SMEM;
  int clusters = 0;
  CK(cudaOccupancyMaxActiveClusters(&clusters, hop_kernel<0>, &lc));
  const int blocks = std::min(clusters, sms / CLUSTER) * CLUSTER;
  unsigned *flags = nullptr, *chain = nullptr;
  double* res = nullptr;
  CK(cudaMalloc(&flags, 256 * sizeof(unsigned)));
  CK(cudaMalloc(&res, 2 * sizeof(double)));
  uint4* xbuf = nullptr;  // the global hand-off's two 8-KB payloads
  CK(cudaMalloc(&xbuf, 2 * NT * sizeof(uint4)));
  // the chain: j -> (j * 4099 + 1) mod CHAIN visits words 16 KB apart in a full cycle (4099 odd, CHAIN
  // a power of two)
  unsigned* h = new unsigned[CHAIN];
  for (unsigned j = 0; j < (unsigned)CHAIN; ++j) h[j] = (j * 4099u + 1u) & (CHAIN - 1);
  CK(cudaMalloc(&chain, CHAIN * sizeof(unsigned)));
  CK(cudaMemcpy(chain, h, CHAIN * sizeof(unsigned), cudaMemcpyHostToDevice));
  delete[] h;
  const size_t chunk = probe_chunk(blocks, (size_t)32 << 20);
  const uint4* buf = reinterpret_cast<const uint4*>(m.buf);
  const char* names[] = {"global hop, same cluster", "global hop, far block", "cluster hop (DSMEM)",
                         "L2-hit load (chained)", "DSMEM load (chained)", "8 KB hand-off, global", "8 KB hand-off, DSMEM"};
  printf("hop probe: %d blocks of %d threads, clusters of %d; ns per hop (ping-pong / 2) or per load, median of 5\n",
         blocks, NT, CLUSTER);
  for (int mode = 0; mode < NMODES; ++mode) {
    for (int bg = 0; bg < 2; ++bg) {
      double v[5], w[5];
      unsigned long long wrong = 0;  // DATA_*: payloads that arrived wrong, over the five runs
      for (int r = 0; r < 5; ++r) {
        CK(cudaMemset(flags, 0, 256 * sizeof(unsigned)));
        CK(cudaMemset(m.out + 2000, 0, sizeof(uint32_t)));
        const int partner = mode == GLOBAL_FAR ? blocks / 2 : 1;
        void* args[] = {(void*)&buf, (void*)&chunk, (void*)&flags, (void*)&chain, (void*)&xbuf, (void*)&bg,
                        (void*)&partner, (void*)&m.out, (void*)&res};
        CK(cudaLaunchKernel(kernels[mode], dim3(blocks), dim3(NT), args, SMEM, 0));
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        double got[2];
        CK(cudaMemcpy(got, res, 2 * sizeof(double), cudaMemcpyDeviceToHost));
        v[r] = got[0];
        w[r] = got[1];
        uint32_t bad = 0;
        CK(cudaMemcpy(&bad, m.out + 2000, sizeof(uint32_t), cudaMemcpyDeviceToHost));
        wrong += bad;
      }
      const char* where = bg ? "beside streaming SMs" : "others idle";
      printf("%-26s %-22s %8.0f ns\n", names[mode], where, median5(v));
      if (mode == L2_CHAIN) printf("%-26s %-22s %8.0f ns\n", "HBM-miss load (chained)", where, median5(w));
      if (mode >= DATA_GLOBAL && wrong) {
        printf("%s: %llu payload words arrived wrong\n", names[mode], wrong);
        return 1;
      }
    }
  }
  // cluster barriers by cluster size (16 needs the non-portable size)
  CK(cudaFuncSetAttribute(barrier_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  CK(cudaFuncSetAttribute(barrier_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  for (int cl : {2, 8, 16}) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cl;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t bc = {};
    bc.gridDim = dim3(sms / cl * cl);
    bc.blockDim = dim3(NT);
    bc.dynamicSmemBytes = SMEM;
    bc.attrs = attr;
    bc.numAttrs = 1;
    int fit = 0;
    if (cudaOccupancyMaxActiveClusters(&fit, barrier_kernel, &bc) != cudaSuccess || fit == 0) {
      (void)cudaGetLastError();
      printf("cluster barrier, %2d SMs: no launch fits\n", cl);
      continue;
    }
    bc.gridDim = dim3(std::min(fit, sms / cl) * cl);
    for (int bg = 0; bg < 2; ++bg) {
      double v[5];
      for (int r = 0; r < 5; ++r) {
        CK(cudaMemset(flags, 0, 256 * sizeof(unsigned)));
        CK(cudaLaunchKernelEx(&bc, barrier_kernel, buf, chunk, flags, bg, m.out, res));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(&v[r], res, sizeof(double), cudaMemcpyDeviceToHost));
      }
      printf("cluster barrier, %2d SMs (%3d blocks) %-22s %8.0f ns\n", cl, (int)bc.gridDim.x,
             bg ? "beside streaming SMs" : "others idle", median5(v));
    }
  }
  return 0;
}
