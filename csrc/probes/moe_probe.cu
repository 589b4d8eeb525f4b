// moe_probe.cu: what a BS 8 MoE phase costs under three schedules, with the megakernel's weight-load
// pattern and nothing else. A stand-alone measurement for the "static MoE partition" of
// docs/MEGAKERNEL.md (the MoE phase bound), not part of the megakernel.
//
// One launch = one layer's MoE phase at the release geometry (hidden 2048, expert intermediate 768,
// 128 experts of which 51 are active, BS 8's mean) over one resident 512-thread block per SM:
//   up work    per active expert, gate_up[e] rows: 96 groups of 16 rows (8 gate + 8 up columns,
//              as the megakernel pairs them), K = 2048
//   down work  per active expert, down[e]: 128 groups of 16 hidden rows, K = 768; a down group may
//              start only once all 96 up groups of its expert are done (a per-expert counter)
// A warp streams a group's rows with the megakernel's GEMV loads (16 B of rows gid and gid + 8 per
// lane and k-step, U = 8 k-steps in flight, evict_first + L2::128B, ld.global.nc.L1::no_allocate)
// and folds them (the GEMV is memory bound; its mma is left out). Three schedules:
//   static   every block takes one contiguous, equal share of the 51 x 96 up groups (crossing at
//            most a few experts), signals its experts' counters, then one equal share of the down
//            groups, waiting per expert: no claims, every block ends a phase with the others
//   dynamic  the megakernel's BS 8 queue: per expert a 32-group up item (256 + 256 columns) and
//            four 16-group items (128 + 128 columns each), every expert's wide item first, then the
//            small ones, then four 32-group down items per expert (512 rows); one atomic claim per
//            item; a warp streams whole groups (wpg 1, as gemv_mma for these tiles)
//   warp     (warp_moe) every warp claims one 16-row group at a time, no block barrier: an up
//            group signals its expert itself, a down group's lane 0 waits for its expert; the
//            act_mode variants also read the down group's activations from L2 (fp32 or bf16), as
//            a per-warp down item without staged activations would
// `fixed_us` adds a per-item (dynamic) or per-range (static) fixed cost after each unit of work, as
// the megakernel's staging, epilogue and signal add ~2-5 us per queue item (timeline, 2026-11-30);
// a quarter of it per group for the warp schedule (that warp alone pauses).
// Output: us per layer (median of 15 launches), the phase's HBM rate, per schedule and fixed cost.
// Measured (H200, 2026-11-30, call 2): static 120.1 / 123.0 / 123.3 us with 0 / 4 / 8 us
// per range, dynamic 117.8 / 122.3 / 123.6 per item, warp 129.6-131.3, warp + fp32 activations
// ~140, + bf16 ~133: the schedule is not what the megakernel's BS 8 MoE phase (~150 us) loses, and
// per-warp claims are slower (one head counter for ~11K claims per layer, 8 KB in flight per warp).
// `moe_probe blocks [copies]` (2026-11-30, calls 4 and 6-8; TB/s of the phase, dynamic schedule, 80 KB
// of shared memory reserved, runs varied by ~3 %): with 0 / 4 us of fixed cost per item, 132 blocks
// 4.09-4.23 / 4.05-4.15, 110: 4.24 / 4.01, 90: 4.20-4.23 / 3.88-3.90, 70: 3.95-3.99 / 3.33-3.66,
// 50: 3.57 / 2.99. The phase keeps its rate down to ~90 streaming SMs only without fixed costs;
// the megakernel's items cost ~6-8 us each and its MoE phase shares the SMs with the attention.
// 12 k-steps per warp batch (192 KB in flight) never helps (-1 to -3 %: the SM's rate is capped
// elsewhere); 48 copies (58 GB, TLB-cold) stream as 2 copies do. Two 256-thread blocks per SM
// (64 KB in flight each): full-size items 3.72 at 132 (their last wave is twice as long) but 4.10 /
// 3.93 at 70; half-size items (twice as many) 4.27 / 4.16 at 132, 4.29 / 4.17 at 110, 4.24 / 4.02 at
// 90, 4.17 / 3.88 at 70: the most robust schedule here, +3-6 % at 4 us of fixed cost; call 11 with
// 8 us (the megakernel's items cost ~7-8 us): 3.93 vs 3.68 at 110 and 3.92 vs 3.67 at 90 (+7 %).
// Warp-asynchronous items (async_moe, ring 2 / 4) do not beat the block items: 3.96-4.11 at 0 us,
// 3.68-3.92 at 8 us (the item's last warp still stalls on its fixed cost while holding the slot).
// Uniform items (uniform_moe, call 14) at 8 us per item, against the megakernel's items (3.87 /
// 3.64 / 3.42 / 3.06 on 132 / 110 / 90 / 70 SMs): 2 + 2 items per expert (48 / 64 groups, tiles of
// 768 / 1024 rows) 3.43 / 3.87 / 3.63 / 3.63 (the last wave costs 11 % on 132, the fewer fixed costs
// win 6-19 % below); 3 + 4 (32 / 32) 3.64 / 3.64 / 3.64 / 3.23; 4 + 4 (24 / 32) 3.63 / 3.42 / 3.63
// / 3.23. (This call's medians fell on ~8-us steps: compare within it.)
// `moe_probe prep` (2026-12-04, compile-checked, not yet run): prep_moe, the uniform items with a
// warp of their own that claims, pays the fixed cost and signals beside the streaming warps, against
// uniform_moe of the same shapes and the dynamic schedule (docs/MEGAKERNEL.md, the MoE phase bound).
// Build and run (GPU machine): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
//   csrc/probes/moe_probe.cu -o /tmp/moe_probe && /tmp/moe_probe [blocks [copies] | prep]
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "probe_util.cuh"

constexpr int NT = 512, NWARPS = NT / 32, U = 8;
constexpr int H = 2048, I = 768, E = 128, ACTIVE = 51;
constexpr int UP_GROUPS = I / 8;     // 96 groups of 8 gate + 8 up rows per expert
constexpr int DOWN_GROUPS = H / 16;  // 128 groups of 16 hidden rows per expert
constexpr int WIDE = 32, SMALL = 16, SMALLS = 4, DOWN_ITEM = 32;  // dynamic items, in groups
// the static schedule's warps split each group's K in SPLIT blocks (wpg in gemv_mma), so that a
// block's ~37 up groups spread over its 16 warps within one task (~8 % imbalance, not ~30 %)
constexpr int SPLIT = 2;
static_assert(WIDE + SMALLS * SMALL == UP_GROUPS && DOWN_ITEM * 4 == DOWN_GROUPS, "item shapes");

// One warp streams one group's k-steps [k0, k1) (in units of 32 elements): rows ra (lane gid) and
// rb, U k-steps per batch; the tail batch loads clamped k-steps, as gemv_group does.
// UU: k-steps in flight per warp batch (the megakernel's U = 8; `moe_probe blocks` also tries 12).
template <int UU = U>
__device__ __forceinline__ uint32_t stream_group(const uint16_t* ra, const uint16_t* rb, int k0, int k1, uint64_t pol) {
  uint32_t acc = 0;
  for (int s0 = k0; s0 < k1; s0 += UU) {
    uint4 wa[UU], wb[UU];
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      const int k = min(s0 + u, k1 - 1) * 32;
      wa[u] = ldw_hint(ra + k, pol);
      wb[u] = ldw_hint(rb + k, pol);
    }
#pragma unroll
    for (int u = 0; u < UU; ++u) acc += fold(wa[u]) ^ fold(wb[u]);
  }
  return acc;
}

struct Layer {
  const uint16_t* gate_up;  // [E][2I][H]
  const uint16_t* down;     // [E][H][I]
  const int* experts;       // [ACTIVE] active expert ids
  unsigned* done;           // [ACTIVE] up groups done per active expert (zeroed before the launch)
  unsigned* head;           // dynamic queue head (zeroed before the launch)
  uint32_t* out;
};

// Up group g of active expert a, K block kb of nk: gate rows 8g .. 8g + 7 (lanes gid) and up rows
// I + 8g .. (gid + 8).
template <int UU = U>
__device__ __forceinline__ uint32_t up_group(const Layer& L, int a, int g, int kb, int nk, int lane, uint64_t pol) {
  const int gid = lane >> 2, t = lane & 3, steps = H / 32;
  const uint16_t* W = L.gate_up + (size_t)L.experts[a] * 2 * I * H;
  return stream_group<UU>(W + (size_t)(8 * g + gid) * H + t * 8, W + (size_t)(I + 8 * g + gid) * H + t * 8,
                      kb * steps / nk, (kb + 1) * steps / nk, pol);
}
// Down group g of active expert a, K block kb of nk: hidden rows 16g + gid and 16g + gid + 8.
template <int UU = U>
__device__ __forceinline__ uint32_t down_group(const Layer& L, int a, int g, int kb, int nk, int lane, uint64_t pol) {
  const int gid = lane >> 2, t = lane & 3, steps = I / 32;
  const uint16_t* W = L.down + (size_t)L.experts[a] * H * I;
  return stream_group<UU>(W + (size_t)(16 * g + gid) * I + t * 8, W + (size_t)(16 * g + gid + 8) * I + t * 8,
                      kb * steps / nk, (kb + 1) * steps / nk, pol);
}

__device__ __forceinline__ void wait_expert(const Layer& L, int a) {
  if (threadIdx.x == 0) {
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(L.done + a) : "memory");
    } while (v < (unsigned)UP_GROUPS);
  }
  __syncthreads();
}

// The block's next queue item: thread 0 claims it (one atomic), every thread reads it.
__device__ __forceinline__ int block_claim(const Layer& L, int* s_item) {
  if (threadIdx.x == 0) *s_item = (int)atomicAdd(L.head, 1u);
  __syncthreads();
  const int it = *s_item;
  __syncthreads();
  return it;
}

// The warp's lane 0 waits (acquire) until expert a's up groups are all done; the warp follows.
__device__ __forceinline__ void warp_wait_expert(const Layer& L, int a, int lane) {
  if (lane == 0) {
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(L.done + a) : "memory");
    } while (v < (unsigned)UP_GROUPS);
  }
  __syncwarp();
}

__device__ __forceinline__ void fixed_cost(int fixed_ns) {
  if (fixed_ns > 0) __nanosleep(fixed_ns);
  __syncthreads();
}

// Static: block b takes up groups [b * n / nb, (b + 1) * n / nb) of the ACTIVE x UP_GROUPS list,
// signals each expert it touched by its group count, then the same for the down groups.
__global__ void __launch_bounds__(NT, 1) static_moe(Layer L, int fixed_ns) {
  const uint64_t pol = evict_first_policy();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nb = gridDim.x, b = blockIdx.x;
  uint32_t acc = 0;
  const int nu = ACTIVE * UP_GROUPS, u0 = (int)((long)b * nu / nb), u1 = (int)((long)(b + 1) * nu / nb);
  for (int j = u0 * SPLIT + warp; j < u1 * SPLIT; j += NWARPS) {  // warp tasks: (group, K block)
    const int i = j / SPLIT;
    acc += up_group(L, i / UP_GROUPS, i % UP_GROUPS, j % SPLIT, SPLIT, lane, pol);
  }
  __syncthreads();
  if (threadIdx.x == 0)  // the experts of this range, each by its groups here
    for (int a = u0 / UP_GROUPS; a <= (u1 - 1) / UP_GROUPS && u1 > u0; ++a) {
      const int lo = max(u0, a * UP_GROUPS), hi = min(u1, (a + 1) * UP_GROUPS);
      asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(L.done + a), "r"(hi - lo) : "memory");
    }
  fixed_cost(fixed_ns);
  const int nd = ACTIVE * DOWN_GROUPS, d0 = (int)((long)b * nd / nb), d1 = (int)((long)(b + 1) * nd / nb);
  for (int a = d0 / DOWN_GROUPS; a <= (d1 - 1) / DOWN_GROUPS && d1 > d0; ++a) {
    wait_expert(L, a);
    const int lo = max(d0, a * DOWN_GROUPS), hi = min(d1, (a + 1) * DOWN_GROUPS);
    for (int j = lo * SPLIT + warp; j < hi * SPLIT; j += NWARPS)
      acc += down_group(L, a, j / SPLIT - a * DOWN_GROUPS, j % SPLIT, SPLIT, lane, pol);
  }
  fixed_cost(fixed_ns);
  if (acc == 0x12345678u) L.out[b] = acc;
}

// Dynamic: the megakernel's BS 8 MoE queue order (wide up items, small up items, down items), one
// claim per item by thread 0, items spread over the block's warps by group.
// NTH: threads per block (512; `moe_probe blocks` also runs two 256-thread blocks per SM: one
// block's fixed cost under the other's stream, 64 KB in flight each).
// SP: every item split in SP (SP times the items, each 1 / SP of the groups: the half-block
// pipelines' items, whose last wave otherwise takes twice as long).
template <int UU = U, int NTH = NT, int SP = 1>
__global__ void __launch_bounds__(NTH, NT / NTH) dynamic_moe(Layer L, int fixed_ns) {
  constexpr int NWARPS = NTH / 32, WIDE_SP = WIDE / SP, SMALL_SP = SMALL / SP, DOWN_SP = DOWN_ITEM / SP;
  __shared__ int s_item;
  const uint64_t pol = evict_first_policy();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_wide = ACTIVE * SP, n_small = ACTIVE * SMALLS * SP, n_down = ACTIVE * 4 * SP;
  uint32_t acc = 0;
  while (true) {
    const int it = block_claim(L, &s_item);
    if (it >= n_wide + n_small + n_down) break;
    if (it < n_wide + n_small) {  // an up item: (expert, first group, groups)
      const bool wide = it < n_wide;
      const int a = wide ? it / SP : (it - n_wide) / (SMALLS * SP);
      const int g0 = wide ? (it % SP) * WIDE_SP : WIDE + ((it - n_wide) % (SMALLS * SP)) * SMALL_SP;
      const int ng = wide ? WIDE_SP : SMALL_SP;
      for (int g = warp; g < ng; g += NWARPS) acc += up_group<UU>(L, a, g0 + g, 0, 1, lane, pol);
      __syncthreads();
      if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(L.done + a), "r"(ng) : "memory");
    } else {  // a down item: (expert, quarter)
      const int d = it - n_wide - n_small, a = d / (4 * SP), g0 = (d % (4 * SP)) * DOWN_SP;
      wait_expert(L, a);
      for (int g = warp; g < DOWN_SP; g += NWARPS) acc += down_group<UU>(L, a, g0 + g, 0, 1, lane, pol);
    }
    fixed_cost(fixed_ns);
  }
  if (acc == 0x12345678u) L.out[blockIdx.x] = acc;
}

// Uniform items (`moe_probe blocks`, "uniform UPG/DNG"): every up item UPG groups (96 / UPG per
// expert, expert-major), every down item DNG groups (128 / DNG per expert): how the item count
// trades the per-item fixed cost against the last wave, e.g. 48 / 64 (2 + 2 items per expert, tiles
// of 768 / 1024 weight rows: above the megakernel's 512-row tile limit) against the megakernel's
// 1 wide + 4 small up items and 4 down items.
template <int UPG, int DNG>
__global__ void __launch_bounds__(NT, 1) uniform_moe(Layer L, int fixed_ns) {
  static_assert(UP_GROUPS % UPG == 0 && DOWN_GROUPS % DNG == 0, "whole items");
  constexpr int UPS = UP_GROUPS / UPG, DNS = DOWN_GROUPS / DNG;
  __shared__ int s_item;
  const uint64_t pol = evict_first_policy();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_up = ACTIVE * UPS, n_all = n_up + ACTIVE * DNS;
  uint32_t acc = 0;
  while (true) {
    const int it = block_claim(L, &s_item);
    if (it >= n_all) break;
    if (it < n_up) {
      const int a = it / UPS, g0 = (it % UPS) * UPG;
      for (int g = warp; g < UPG; g += NWARPS) acc += up_group(L, a, g0 + g, 0, 1, lane, pol);
      __syncthreads();
      if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(L.done + a), "r"(UPG) : "memory");
    } else {
      const int d = it - n_up, a = d / DNS, g0 = (d % DNS) * DNG;
      wait_expert(L, a);
      for (int g = warp; g < DNG; g += NWARPS) acc += down_group(L, a, g0 + g, 0, 1, lane, pol);
    }
    fixed_cost(fixed_ns);
  }
  if (acc == 0x12345678u) L.out[blockIdx.x] = acc;
}

// Warp-asynchronous block items (`moe_probe blocks`, "async"): the dynamic schedule's items and
// claims, but no block barrier between items. The block walks one sequence of items; slot j % RING
// of a shared-memory ring holds item j (claimed with one global atomic by the first warp to reach
// it); each warp streams its groups of item j and moves on to item j + 1 (up to RING - 1 items ahead
// of the slowest warp); the warp that finishes an item last signals it (up items) and pays the
// item's fixed cost (a nanosleep of that warp: the epilogue), while the other warps stream on. A
// down item's lane 0 of each warp waits for its expert. The question: does an SM keep streaming
// through its item boundaries, as two half-block pipelines do, without halving anything?
template <int RING>
__global__ void __launch_bounds__(NT, 1) async_moe(Layer L, int fixed_ns) {
  __shared__ int s_item[RING];  // the item of the slot's sequence number, -1: unclaimed, -2: claiming
  __shared__ int s_seq[RING];   // the sequence number the slot serves
  __shared__ int s_done[RING];  // warps finished with it
  const uint64_t pol = evict_first_policy();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_wide = ACTIVE, n_small = ACTIVE * SMALLS, n_down = ACTIVE * 4, n_all = n_wide + n_small + n_down;
  if (threadIdx.x < RING) {
    s_item[threadIdx.x] = -1;
    s_seq[threadIdx.x] = threadIdx.x;
    s_done[threadIdx.x] = 0;
  }
  __syncthreads();
  volatile int* v_item = s_item;
  volatile int* v_seq = s_seq;
  uint32_t acc = 0;
  for (int j = 0;; ++j) {
    const int slot = j % RING;
    int it = 0;
    if (lane == 0) {
      while (v_seq[slot] != j) __nanosleep(20);  // the slot's previous item is done
      if (atomicCAS(&s_item[slot], -1, -2) == -1) {
        it = (int)atomicAdd(L.head, 1u);
        v_item[slot] = it;
      } else {
        while ((it = v_item[slot]) < 0) __nanosleep(20);
      }
    }
    it = __shfl_sync(0xffffffffu, it, 0);
    if (it >= n_all) break;
    int a, ng;
    if (it < n_wide + n_small) {
      const bool wide = it < n_wide;
      a = wide ? it : (it - n_wide) / SMALLS;
      const int g0 = wide ? 0 : WIDE + ((it - n_wide) % SMALLS) * SMALL;
      ng = wide ? WIDE : SMALL;
      for (int g = warp; g < ng; g += NWARPS) acc += up_group(L, a, g0 + g, 0, 1, lane, pol);
    } else {
      const int d = it - n_wide - n_small, g0 = (d % 4) * DOWN_ITEM;
      a = d / 4;
      ng = 0;
      warp_wait_expert(L, a, lane);
      for (int g = warp; g < DOWN_ITEM; g += NWARPS) acc += down_group(L, a, g0 + g, 0, 1, lane, pol);
    }
    __syncwarp();
    if (lane == 0 && atomicAdd(&s_done[slot], 1) == NWARPS - 1) {  // the last warp of the item
      if (ng) asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(L.done + a), "r"(ng) : "memory");
      if (fixed_ns > 0) __nanosleep(fixed_ns);
      s_done[slot] = 0;
      v_item[slot] = -1;
      __threadfence_block();
      v_seq[slot] = j + RING;  // the slot serves item j + RING now
    }
    __syncwarp();
  }
  if (acc == 0x12345678u) L.out[blockIdx.x] = acc;
}

// Named CTA barriers for prep_moe (ids 1-4; 0 is __syncthreads): `arrive` signals without waiting,
// `sync` waits until `count` threads arrived or synced. Both order the memory accesses the arriving
// threads made before them for the threads that sync (the PTX barrier's guarantee), which is what
// hands the item id in shared memory from the preparing warp to the streaming warps.
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// Item preparation on a warp of its own (`moe_probe prep`, 2026-12-04, not yet run on a GPU): the
// uniform schedule's items (UPG / DNG groups per up / down item, expert-major), but the block is SW
// streaming warps plus one preparing warp. SW = 16: 544 threads, and ptxas then allows 96 registers
// per thread (17 warps put 5 on one SM sub-partition's 16K registers), which the megakernel's code
// could not take; SW = 15: the megakernel's 512 threads with one warp fewer streaming (15/16 of the
// bytes in flight), each item's (group, 8-k-step batch) pairs dealt round-robin over the 15 warps
// (98.5 % balanced for 48 up / 64 down groups, where whole groups would leave 3 warps a 4th). While
// the streaming warps stream item j, the preparing warp signals item j - 1 (up items: red.release on the
// expert's counter, once the streaming warps are done with it), then claims item j + 1, pays its fixed cost
// (fixed_ns: the claim's table and token reads, the weight pointer, the activation staging and the
// epilogue that the megakernel's items pay serially, ~6-8 us each) and, for a down item, waits for
// its expert, so the streaming warps pay one barrier between items instead. Two shared-memory slots
// and four named barriers: FULL s (id 1 + s: the slot holds a prepared item; the preparing warp
// arrives, the streaming warps sync) and EMPTY s (id 3 + s: the streaming warps are done with the
// slot's item; they arrive, the preparing warp syncs). The claim is one item ahead (eager): an SM
// holds its next item while it streams, which can lengthen the last wave; the probe prices both
// effects together. The question it answers: does the phase keep its 0-us rate (4.09-4.23 TB/s on
// 132 SMs, 2026-11-30) with the megakernel's 8 us per item (3.87-3.92 with uniform_moe)?
template <int UPG, int DNG, int SW>
__global__ void __launch_bounds__((SW + 1) * 32, 1) prep_moe(Layer L, int fixed_ns) {
  static_assert(UP_GROUPS % UPG == 0 && DOWN_GROUPS % DNG == 0, "whole items");
  static_assert(SW == 16 || SW == 15, "16 streaming warps (whole groups) or 15 (batches dealt round-robin)");
  constexpr int UPS = UP_GROUPS / UPG, DNS = DOWN_GROUPS / DNG, ALL = (SW + 1) * 32;
  constexpr int UPB = H / 32 / U, DNB = I / 32 / U;  // 8-k-step batches per up / down group
  constexpr int FULL = 1, EMPTY = 3;  // + slot
  __shared__ int s_item[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_up = ACTIVE * UPS, n_all = n_up + ACTIVE * DNS;
  uint32_t acc = 0;
  if (warp == SW) {  // the preparing warp
    // claim the next item and pay its fixed cost (lane 0; the warp gets the id)
    auto claim = [&]() {
      int it = 0;
      if (lane == 0) {
        it = (int)atomicAdd(L.head, 1u);
        if (it < n_all && fixed_ns > 0) __nanosleep(fixed_ns);
      }
      return __shfl_sync(0xffffffffu, it, 0);
    };
    auto is_down = [&](int it) { return it >= n_up && it < n_all; };
    // hand item `it` to the streaming warps in `slot`; a down item first waits for its expert
    auto publish = [&](int slot, int it) {
      if (is_down(it)) warp_wait_expert(L, (it - n_up) / DNS, lane);
      if (lane == 0) *(volatile int*)&s_item[slot] = it;
      __syncwarp();
      named_arrive(FULL + slot, ALL);
    };
    // A down item's wait is made only while no up item of this block is streamed but not yet
    // signalled: otherwise two blocks, each waiting for the expert whose last up item the other
    // holds unsignalled, would wait for ever. So an up item (or the end) is published as soon as
    // it is claimed, a down item only after the item before it was signalled.
    int cur = claim();
    publish(0, cur);                            // nothing of this block is unsignalled yet
    int nxt = cur < n_all ? claim() : n_all;     // item 1 (none past the end marker)
    if (!is_down(nxt) && cur < n_all) publish(1, nxt);
    for (int j = 0;; ++j) {
      const int slot = j & 1;
      named_sync(EMPTY + slot, ALL);  // the streaming warps are done with item j (or saw the end)
      if (cur >= n_all) break;        // they left
      if (cur < n_up && lane == 0)    // item j's groups are streamed: its expert counts them
        asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(L.done + cur / UPS), "r"(UPG) : "memory");
      if (is_down(nxt)) publish(slot ^ 1, nxt);  // item j + 1: nothing is unsignalled now
      const int after = nxt < n_all ? claim() : n_all;  // item j + 2, into the slot item j freed
      if (!is_down(after) && nxt < n_all) publish(slot, after);
      cur = nxt;
      nxt = after;
    }
  } else {  // the SW streaming warps
    const uint64_t pol = evict_first_policy();
    for (int j = 0;; ++j) {
      const int slot = j & 1;
      named_sync(FULL + slot, ALL);
      const int it = *(volatile int*)&s_item[slot];
      if (it < n_up) {
        const int a = it / UPS, g0 = (it % UPS) * UPG;
        if constexpr (SW == 16) {
          for (int g = warp; g < UPG; g += SW) acc += up_group(L, a, g0 + g, 0, 1, lane, pol);
        } else {
          for (int u = warp; u < UPG * UPB; u += SW) acc += up_group(L, a, g0 + u / UPB, u % UPB, UPB, lane, pol);
        }
      } else if (it < n_all) {
        const int d = it - n_up, a = d / DNS, g0 = (d % DNS) * DNG;
        if constexpr (SW == 16) {
          for (int g = warp; g < DNG; g += SW) acc += down_group(L, a, g0 + g, 0, 1, lane, pol);
        } else {
          for (int u = warp; u < DNG * DNB; u += SW) acc += down_group(L, a, g0 + u / DNB, u % DNB, DNB, lane, pol);
        }
      }
      __syncwarp();
      named_arrive(EMPTY + slot, ALL);
      if (it >= n_all) break;
    }
  }
  if (acc == 0x12345678u) L.out[blockIdx.x] = acc;
}

// Per-warp: every warp claims one 16-row group at a time (lane 0, one atomic, the next claim in flight
// while the group streams): up groups (expert-major), then down groups. An up group signals its
// expert (red.release after __syncwarp); a down group's lane 0 waits (acquire) for its expert's 96
// up groups. No block barrier anywhere: one warp's fixed cost (fixed_ns, a nanosleep of that warp)
// leaves the block's other 15 warps streaming. act_mode: a down group also reads its expert's
// activations from L2 as the megakernel would without staging them (0: none, down_group; 1: fp32,
// 32 B per lane and k-step, 2: bf16, 16 B: stream_down_act, stream_group with those loads beside).
template <int ACT>
__device__ __forceinline__ uint32_t stream_down_act(const uint16_t* ra, const uint16_t* rb, const void* act, int steps,
                                                    uint64_t pol) {
  static_assert(ACT == 1 || ACT == 2, "ACT 0 streams with down_group");
  uint32_t acc = 0;
  const int lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  for (int s0 = 0; s0 < steps; s0 += U) {
    uint4 wa[U], wb[U], x0[U], x1[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = min(s0 + u, steps - 1) * 32;
      wa[u] = ldw_hint(ra + k, pol);
      wb[u] = ldw_hint(rb + k, pol);
      if (ACT == 1) {
        const float* xp = (const float*)act + (size_t)gid * I + k + t * 8;
        x0[u] = __ldcg((const uint4*)xp);
        x1[u] = __ldcg((const uint4*)xp + 1);
      } else if (ACT == 2) {
        x0[u] = __ldcg((const uint4*)((const uint16_t*)act + (size_t)gid * I + k + t * 8));
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      acc += fold(wa[u]) ^ fold(wb[u]);
      acc += fold(x0[u]);
      if (ACT == 1) acc += fold(x1[u]);
    }
  }
  return acc;
}

template <int ACT>
__global__ void __launch_bounds__(NT, 1) warp_moe(Layer L, int fixed_ns, const void* act) {
  const uint64_t pol = evict_first_policy();
  const int lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  const int n_up = ACTIVE * UP_GROUPS, n_all = n_up + ACTIVE * DOWN_GROUPS;
  uint32_t acc = 0;
  int cur = 0, nxt = 0;
  if (lane == 0) {
    cur = (int)atomicAdd(L.head, 1u);
    nxt = (int)atomicAdd(L.head, 1u);
  }
  cur = __shfl_sync(0xffffffffu, cur, 0);
  while (cur < n_all) {
    if (cur < n_up) {
      const int a = cur / UP_GROUPS;
      acc += up_group(L, a, cur % UP_GROUPS, 0, 1, lane, pol);
      __syncwarp();
      if (lane == 0) asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(L.done + a), "r"(1) : "memory");
    } else {
      const int d = cur - n_up, a = d / DOWN_GROUPS, g = d % DOWN_GROUPS;
      warp_wait_expert(L, a, lane);
      if constexpr (ACT == 0) {
        acc += down_group(L, a, g, 0, 1, lane, pol);
      } else {
        const uint16_t* W = L.down + (size_t)L.experts[a] * H * I;
        const void* x = ACT == 1 ? (const void*)((const float*)act + (size_t)a * 8 * I)
                                 : (const void*)((const uint16_t*)act + (size_t)a * 8 * I);
        acc += stream_down_act<ACT>(W + (size_t)(16 * g + gid) * I + t * 8,
                                    W + (size_t)(16 * g + gid + 8) * I + t * 8, x, I / 32, pol);
      }
    }
    if (fixed_ns > 0) __nanosleep(fixed_ns);
    int fresh = 0;
    if (lane == 0) fresh = (int)atomicAdd(L.head, 1u);
    cur = __shfl_sync(0xffffffffu, nxt, 0);
    nxt = fresh;
  }
  if (acc == 0x12345678u) L.out[blockIdx.x] = acc;
}

// The median over 15 launches (after two warm-ups) of one layer's phase, cycling through `layers`
// (each launch on a copy the previous ones did not touch), in us; -1 on a CUDA error (printed).
template <class Launch>
static double time_layer(const std::vector<Layer>& layers, unsigned* counters, cudaEvent_t ev0, cudaEvent_t ev1,
                         Launch launch) {
  std::vector<float> ms;
  for (int rep = 0; rep < 17; ++rep) {
    const Layer& L = layers[rep % layers.size()];
    if (cudaMemset(counters, 0, (ACTIVE + 1) * sizeof(unsigned)) != cudaSuccess) return -1;
    cudaEventRecord(ev0);
    launch(L);
    cudaEventRecord(ev1);
    cudaError_t e = cudaEventSynchronize(ev1);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
      fprintf(stderr, "moe probe launch: %s\n", cudaGetErrorString(e));
      return -1;
    }
    float t = 0.f;
    cudaEventElapsedTime(&t, ev0, ev1);
    if (rep >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3;
}

// One `moe_probe blocks` schedule: how to launch it on `sms` SMs with `ns` of fixed cost per item.
struct BlocksSchedule {
  const char* name;
  void (*launch)(int sms, const Layer& L, int ns);
  bool prep = false;  // also run by `moe_probe prep` (prep_moe and what it is compared with)
};

// the megakernel's ~80 KB of dynamic shared memory (unused here): its share of the SM's L1 / shared
// memory leaves the loads in flight the same L1 room (~156 KB); two blocks per SM take half each
constexpr int PROBE_SMEM = 80 * 1024;
template <int UU>
static void launch_dynamic(int sms, const Layer& L, int ns) {
  dynamic_moe<UU><<<sms, NT, PROBE_SMEM>>>(L, ns);
}
template <int SP>
static void launch_two_blocks(int sms, const Layer& L, int ns) {
  dynamic_moe<8, 256, SP><<<2 * sms, 256, PROBE_SMEM / 2>>>(L, ns);
}
template <int UPG, int DNG>
static void launch_uniform(int sms, const Layer& L, int ns) {
  uniform_moe<UPG, DNG><<<sms, NT, PROBE_SMEM>>>(L, ns);
}
template <int R>
static void launch_async(int sms, const Layer& L, int ns) {
  async_moe<R><<<sms, NT, PROBE_SMEM>>>(L, ns);
}
template <int UPG, int DNG, int SW>
static void launch_prep(int sms, const Layer& L, int ns) {
  prep_moe<UPG, DNG, SW><<<sms, (SW + 1) * 32, PROBE_SMEM>>>(L, ns);
}

// `moe_probe blocks`: the dynamic schedule on fewer blocks (the megakernel's MoE phase streams on
// ~50-110 SMs at a time, ~71 on average at BS 8 and 8K, the 2026-11-30 timeline sums), with 12
// k-steps per warp batch (192 KB in flight per block instead of 128), as two 256-thread blocks per
// SM (full- and half-size items), with uniform items, warp-asynchronous items and items prepared by
// a warp of their own: how the phase's HBM rate depends on the streaming SM count and the per-item fixed
// cost. `moe_probe prep`: only the prepared items beside the uniform items of the same shapes and
// the dynamic schedule, on 132 / 110 / 90 SMs (the first measurement of prep_moe).
static int blocks_probe(int sms, const std::vector<Layer>& layers, unsigned* counters, double bytes, bool prep_only) {
  cudaEvent_t ev0, ev1;
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));
  CK(cudaFuncSetAttribute(dynamic_moe<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  CK(cudaFuncSetAttribute(dynamic_moe<12>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  CK(cudaFuncSetAttribute(dynamic_moe<8, 256>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM / 2));
  CK(cudaFuncSetAttribute(dynamic_moe<8, 256, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM / 2));
  CK(cudaFuncSetAttribute(uniform_moe<48, 64>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  CK(cudaFuncSetAttribute(uniform_moe<32, 32>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  CK(cudaFuncSetAttribute(uniform_moe<24, 32>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  CK(cudaFuncSetAttribute(async_moe<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  CK(cudaFuncSetAttribute(async_moe<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  CK(cudaFuncSetAttribute(prep_moe<48, 64, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  CK(cudaFuncSetAttribute(prep_moe<48, 64, 15>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  CK(cudaFuncSetAttribute(prep_moe<32, 32, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  CK(cudaFuncSetAttribute(prep_moe<32, 32, 15>, cudaFuncAttributeMaxDynamicSharedMemorySize, PROBE_SMEM));
  const BlocksSchedule schedules[] = {
      {"512 U 8", launch_dynamic<8>, true},
      {"512 U 12", launch_dynamic<12>},
      {"2x256 U 8", launch_two_blocks<1>},
      {"2x256 half", launch_two_blocks<2>},
      {"uniform 48/64", launch_uniform<48, 64>, true},
      {"uniform 32/32", launch_uniform<32, 32>, true},
      {"uniform 24/32", launch_uniform<24, 32>},
      {"async ring 2", launch_async<2>},
      {"async ring 4", launch_async<4>},
      {"prep 48/64", launch_prep<48, 64, 16>, true},
      {"prep15 48/64", launch_prep<48, 64, 15>, true},
      {"prep 32/32", launch_prep<32, 32, 16>, true},
      {"prep15 32/32", launch_prep<32, 32, 15>, true},
  };
  const std::vector<int> block_counts = prep_only ? std::vector<int>{sms, 110, 90} : std::vector<int>{sms, 110, 90, 70, 50};
  printf("blocks probe: dynamic schedule over %zu layer copies (%.1f GB), 80 KB shared memory reserved, us per "
         "layer (median of 15) and TB/s, by blocks, schedule and fixed cost\n",
         layers.size(), layers.size() * 1.2);
  for (int blocks : block_counts) {
    for (const BlocksSchedule& sc : schedules) {
      if (prep_only && !sc.prep) continue;
      for (int fixed_us : {0, 4, 8}) {
        const double us = time_layer(layers, counters, ev0, ev1,
                                     [&](const Layer& L) { sc.launch(blocks, L, fixed_us * 1000); });
        if (us < 0) return 1;
        printf("dynamic SMs %3d %-13s fixed %d us per item: %7.1f us per layer, %5.2f TB/s\n", blocks, sc.name,
               fixed_us, us, bytes / (us * 1e-6) / 1e12);
      }
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // two layers' experts (2.4 GB), alternated: nothing of a layer is in L2. `moe_probe blocks N`: N
  // copies (1.2 GB each) in turn, e.g. 48 (58 GB, the release checkpoint's span): every launch
  // streams pages it has not touched for 47 launches, as the megakernel's step does (its TLB reach)
  const int copies = argc > 2 && argv[1][0] == 'b' ? std::max(2, atoi(argv[2])) : 2;
  const size_t gu = (size_t)E * 2 * I * H, dn = (size_t)E * H * I;
  uint16_t *gate_up = nullptr, *down = nullptr;
  CK(cudaMalloc(&gate_up, copies * gu * 2));
  CK(cudaMalloc(&down, copies * dn * 2));
  CK(cudaMemset(gate_up, 1, copies * gu * 2));
  CK(cudaMemset(down, 1, copies * dn * 2));
  int* experts = nullptr;
  unsigned* counters = nullptr;
  uint32_t* out = nullptr;
  CK(cudaMalloc(&experts, copies * ACTIVE * sizeof(int)));
  CK(cudaMalloc(&counters, (ACTIVE + 1) * sizeof(unsigned)));
  CK(cudaMalloc(&out, 4096 * sizeof(uint32_t)));
  void* act = nullptr;  // [ACTIVE][8][I] activations (fp32; the bf16 mode reads the first half)
  CK(cudaMalloc(&act, (size_t)ACTIVE * 8 * I * sizeof(float)));
  CK(cudaMemset(act, 1, (size_t)ACTIVE * 8 * I * sizeof(float)));
  std::vector<int> ids(copies * ACTIVE);
  for (int c = 0; c < copies; ++c)  // 51 distinct experts spread over the 128 (gcd(5, 128) = 1)
    for (int k = 0; k < ACTIVE; ++k) ids[c * ACTIVE + k] = (k * 5 + 3 + 17 * c) % E;
  CK(cudaMemcpy(experts, ids.data(), ids.size() * sizeof(int), cudaMemcpyHostToDevice));
  const double bytes = (double)ACTIVE * (2.0 * I * H + (double)H * I) * 2.0;
  std::vector<Layer> layers;
  for (int c = 0; c < copies; ++c)
    layers.push_back(Layer{gate_up + c * gu, down + c * dn, experts + c * ACTIVE, counters, counters + ACTIVE, out});
  if (argc > 1 && (argv[1][0] == 'b' || argv[1][0] == 'p'))  // `moe_probe blocks` / `moe_probe prep`
    return blocks_probe(sms, layers, counters, bytes, argv[1][0] == 'p');
  cudaEvent_t ev0, ev1;
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));
  printf("moe probe: %d blocks, %d of %d experts, %.1f MB per layer; us per layer = median of 15\n", sms, ACTIVE, E,
         bytes / 1e6);
  // schedules: 0 static, 1 dynamic (block items), 2-4 per-warp groups (activations: none, fp32, bf16);
  // fixed cost per range / item (0-2) or per warp group (2-4, in 0.25 us steps of `fixed`)
  const char* names[] = {"static", "dynamic", "warp", "warp+f32", "warp+b16"};
  for (int fixed_us : {0, 4, 8}) {
    for (int sched = 0; sched < 5; ++sched) {
      const int ns = fixed_us * 1000, warp_ns = fixed_us * 250;  // a warp group is ~1/20 of an item
      const double us = time_layer(layers, counters, ev0, ev1, [&](const Layer& L) {
        if (sched == 0)
          static_moe<<<sms, NT>>>(L, ns);
        else if (sched == 1)
          dynamic_moe<><<<sms, NT>>>(L, ns);
        else if (sched == 2)
          warp_moe<0><<<sms, NT>>>(L, warp_ns, act);
        else if (sched == 3)
          warp_moe<1><<<sms, NT>>>(L, warp_ns, act);
        else
          warp_moe<2><<<sms, NT>>>(L, warp_ns, act);
      });
      if (us < 0) return 1;
      printf("%-9s fixed %5.2f us per %s: %7.1f us per layer, %5.2f TB/s\n", names[sched],
             sched < 2 ? (double)fixed_us : fixed_us * 0.25, sched == 0 ? "range" : sched == 1 ? "item " : "group",
             us, bytes / (us * 1e-6) / 1e12);
    }
  }
  return 0;
}
