// gemv_cost_probe.cu: where a megakernel GEMV task's fixed cost goes. The BS 1 timeline gives a
// router tile (16 rows x 2048, 64 KB) 3.8 us of staging and 5.2 of GEMV, and a GEMV of one k-step
// per warp (no bytes to speak of) 3.6-4.1 us, while layer_probe's phases with the same math stream a
// router share of 64 KB in 2.1 us (docs/PERF.md). This probe runs the kernel's own code (mk_device.cuh:
// the RMSNorm staging `stage_rows` and `gemv_mma`, included, not copied) on tiles of the kernel's
// shapes, back to back per block (each tile's weights its own bytes; router tiles re-read from a
// 24-MB bank that L2 keeps, as the kernel's evict_last routers), with stamps around each piece:
//   stage   x(l) (8 KB, fp32 through L2) normed into shared memory, the GEMV's activations
//   gemv    gemv_mma on the staged rows (loads, mma.sync, the warps' reduction, the norm factor);
//           for a fused item's down slice (2048 rows x 128 columns, rows 768 apart) gemv_down_acc<4>,
//           its rows added into a global sum row
//   store   the outputs to global memory (ld.cg-visible stores) and a barrier, as an epilogue
// in three settings: every block running tiles ("all"); block 0 alone ("alone"); block 0 beside the
// other 131 streaming weights with the kernel's loads ("beside"). Each runs gemv_mma ("gemv": its
// 16-row layout, 8 token columns) and layer_probe's phase over the same bytes ("flat": each thread 16
// consecutive bytes per load, 8 loads in flight, two mma.sync per pair, the warps' sums reduced
// through shared memory).
// Prints, per shape and setting, block 0's (setting all: every block's) medians in ns.
// Build and run (GPU machine): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
//   csrc/probes/gemv_cost_probe.cu -o /tmp/gemv_cost_probe && /tmp/gemv_cost_probe  (or:
//   PROBE=gemv_cost_probe PROBE_ARGS=run gpu_run.sh probe)
#include <algorithm>
#include <vector>

#include "../mk_device.cuh"
#include "probe_util.cuh"

using mk::ActSrc;
using mk::Gemv;

constexpr int HID = 2048, ITEMS = 48, NSTAMP = 4;
constexpr size_t ROUTER_BANK = (size_t)24 << 20;  // the routers' bytes (48 layers x 512 KB): L2-resident

struct Shape {
  const char* name;
  int rows, klen;
  bool keep;  // the router: evict_last, from the bank L2 keeps
  int ld = 0;  // a fused item's down slice: klen columns of rows `ld` apart (gemv_down_acc)
};
constexpr Shape SHAPES[] = {
    {"router 16 x 2048 (L2)", 16, 2048, true},
    {"one k-step 16 x 512", 16, 512, false},
    {"QKV 128 x 2048", 128, 2048, false},
    {"O-proj 128 x 1024", 128, 1024, false},
    {"MoE up 256 x 2048", 256, 2048, false},
    {"down slice 2048 x 128", 2048, 128, false, 768},
};

struct Args {
  const char* w;           // the 4 GiB weight buffer
  const float* x;          // x(l): [8][HID] fp32 (row 0 used)
  const __nv_bfloat16* norm_w;
  float* out;              // [blocks][MAXROWS * 8] the epilogue's stores
  float* sum;              // [blocks][HID] what the down slices add into
  unsigned long long* st;  // [blocks][ITEMS][NSTAMP]
  unsigned* done;          // block 0 finished (the streamers stop)
  uint32_t* sink;
  int rows, klen, keep, ld, setting, flat;
};
enum { ALL = 0, ALONE = 1, BESIDE = 2 };

__global__ void __launch_bounds__(mk::NT, 1) cost_kernel(Args a) {
  extern __shared__ __align__(16) unsigned char dyn[];
  __shared__ int rows[8];
  __shared__ float s_w[1];
  __shared__ int s_b[1];
  __nv_bfloat16* act = reinterpret_cast<__nv_bfloat16*>(dyn);
  float* red = reinterpret_cast<float*>(dyn + (size_t)8 * (HID + mk::ACT_PAD) * 2);
  float* outs = red + mk::RED_FLOATS;
  const uint64_t pol = evict_first_policy();
  uint32_t acc = blockIdx.x;
  const bool runs = a.setting == ALL || blockIdx.x == 0;
  if (!runs) {
    if (a.setting == BESIDE) {  // stream weights the kernel's way until block 0 is done
      const uint4* p = reinterpret_cast<const uint4*>(a.w + ((size_t)blockIdx.x << 24));
      for (size_t i = threadIdx.x;; i += 8 * (size_t)mk::NT) {
        if ((i & (64 * mk::NT - 1)) < mk::NT && *(volatile unsigned*)a.done) break;
#pragma unroll
        for (int u = 0; u < 8; ++u) acc ^= fold(ldw_hint(p + ((i + (size_t)u * mk::NT) & ((1u << 24) / 16 - 1)), pol));
      }
    }
    if (threadIdx.x == 0) a.sink[blockIdx.x] = acc;
    return;
  }
  if (threadIdx.x < 8) rows[threadIdx.x] = threadIdx.x == 0 ? 0 : -1;  // one batch row
  if (threadIdx.x == 0) {
    s_w[0] = 1.f;
    s_b[0] = 0;
  }
  __syncthreads();
  const size_t tile = (size_t)a.rows * (a.ld ? a.ld : a.klen) * 2;
  unsigned long long* st = a.st + (size_t)blockIdx.x * ITEMS * NSTAMP;
  for (int it = 0; it < ITEMS; ++it) {
    // the tile's bytes: the router's from the bank (every block its own 8 tiles per pass), the
    // others each their own, from 64 MB on (wrapping within the 4 GiB buffer)
    const size_t at = a.keep ? ((size_t)(blockIdx.x * ITEMS + it) * tile) % ROUTER_BANK
                             : ((size_t)64 << 20) + ((size_t)(blockIdx.x * ITEMS + it) * tile) % (((size_t)4 << 30) - ((size_t)128 << 20));
    const __nv_bfloat16* W = reinterpret_cast<const __nv_bfloat16*>(a.w + at);
    __syncthreads();
    const unsigned long long t0 = globaltimer();
    ActSrc src{a.x, HID, rows, 0, a.norm_w, 1e-5f};
    mk::stage_rows(act, src, HID);
    __syncthreads();
    const unsigned long long t1 = globaltimer();
    if (a.flat) {
      acc = phase_stream<true, mk::NT>(reinterpret_cast<const uint4*>(W), (size_t)a.rows * a.klen * 2 / 16, acc, pol,
                                       reinterpret_cast<const uint4*>(act), HID / 8 - 1, red);
      if (threadIdx.x < 128) outs[threadIdx.x] = (float)acc;
    } else if (a.ld) {  // the down slice, added into this block's sum row
      float* sum = a.sum + (size_t)blockIdx.x * HID;
      mk::gemv_down_acc<4>(W, a.ld, a.rows, act, HID + mk::ACT_PAD, sum, HID, s_w, s_b, 1);
      __syncthreads();
    } else {
      Gemv g{W, a.klen, W, a.klen, a.rows, a.rows, a.klen, a.keep != 0};
      ActSrc x2 = src;
      mk::gemv_mma(g, x2, act, red, outs, false, /*staged=*/true);
    }
    const unsigned long long t2 = globaltimer();
    float* o = a.out + (size_t)blockIdx.x * mk::OUT_FLOATS;
    if (!a.ld)  // (a down slice has added its rows already)
      for (int i = threadIdx.x; i < a.rows; i += mk::NT) __stcg(o + i, outs[i * 8]);
    __syncthreads();
    const unsigned long long t3 = globaltimer();
    if (threadIdx.x == 0) {
      st[it * NSTAMP + 0] = t0;
      st[it * NSTAMP + 1] = t1;
      st[it * NSTAMP + 2] = t2;
      st[it * NSTAMP + 3] = t3;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    __threadfence();
    *(volatile unsigned*)a.done = 1;
  }
  if (threadIdx.x == 0) a.sink[blockIdx.x] = acc ^ __float_as_uint(outs[0]);
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int main() {
  ProbeMem m;
  if (probe_alloc(&m)) return 1;
  int n_sm = 0;
  CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
  float* x;
  __nv_bfloat16* nw;
  float* out;
  float* sum;
  unsigned long long* st;
  unsigned* done;
  CK(cudaMalloc(&x, 8 * HID * 4));
  CK(cudaMalloc(&nw, HID * 2));
  CK(cudaMalloc(&out, (size_t)n_sm * mk::OUT_FLOATS * 4));
  CK(cudaMalloc(&sum, (size_t)n_sm * HID * 4));
  CK(cudaMemset(sum, 0, (size_t)n_sm * HID * 4));
  CK(cudaMalloc(&st, (size_t)n_sm * ITEMS * NSTAMP * 8));
  CK(cudaMalloc(&done, 4));
  {
    std::vector<float> hx(8 * HID);
    for (int i = 0; i < 8 * HID; ++i) hx[i] = 0.01f * (float)((i * 37) % 101 - 50);
    CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    std::vector<__nv_bfloat16> hw(HID, __float2bfloat16(1.f));
    CK(cudaMemcpy(nw, hw.data(), HID * 2, cudaMemcpyHostToDevice));
  }
  const size_t smem = (size_t)8 * (HID + mk::ACT_PAD) * 2 + (size_t)mk::RED_FLOATS * 4 + (size_t)mk::OUT_FLOATS * 4;
  CK(cudaFuncSetAttribute(cost_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  printf("gemv cost probe: %d blocks of %d threads, %d tiles per block back to back; ns per tile (median over "
         "tiles and, for `all`, blocks; 5 launches, the last timed): stage / gemv / store, and the GEMV's GB/s per SM\n",
         n_sm, mk::NT, ITEMS);
  const char* setting_name[] = {"all", "alone", "beside"};
  for (const Shape& sh : SHAPES) {
    for (int flat = 0; flat < 2; ++flat) {  // gemv_mma, then flat
      for (int setting = 0; setting < 3; ++setting) {
        Args a{m.buf, x, nw, out, sum, st, done, m.out, sh.rows, sh.klen, sh.keep, sh.ld, setting, flat};
        for (int r = 0; r < 5; ++r) {
          CK(cudaMemset(done, 0, 4));
          cost_kernel<<<n_sm, mk::NT, smem>>>(a);
          CK(cudaGetLastError());
        }
        CK(cudaDeviceSynchronize());
        std::vector<unsigned long long> h((size_t)n_sm * ITEMS * NSTAMP);
        CK(cudaMemcpy(h.data(), st, h.size() * 8, cudaMemcpyDeviceToHost));
        std::vector<double> s1, s2, s3;
        for (int b = 0; b < (setting == ALL ? n_sm : 1); ++b)
          for (int it = 1; it < ITEMS; ++it) {  // the first tile pays the launch's cold start
            const unsigned long long* t = h.data() + ((size_t)b * ITEMS + it) * NSTAMP;
            s1.push_back((double)(t[1] - t[0]));
            s2.push_back((double)(t[2] - t[1]));
            s3.push_back((double)(t[3] - t[2]));
          }
        const double g = median(s2);
        printf("%-22s %-5s %-7s stage %6.0f  gemv %6.0f  store %5.0f ns   %5.1f GB/s per SM\n", sh.name,
               flat ? "flat" : "gemv", setting_name[setting], median(s1), g, median(s3),
               g > 0 ? (double)sh.rows * sh.klen * 2 / g : 0.0);
      }
    }
  }
  return 0;
}
