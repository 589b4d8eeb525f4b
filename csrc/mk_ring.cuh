// mk_ring.cuh: engine v2's weight ring for the GEMV-shaped ops (issue 41, step 2; compiled in with
// MK_RING=1 and selected by the runtime bit MK_MODE_RING; the register GEMV of mk_device.cuh stays
// the reference).
//
// A GEMV tile whose rows are contiguous in memory (ld == klen: QKV, router, LM head, MoE and dense up
// tiles) goes from HBM into a ring of RING_D shared-memory stages, one cp.async.bulk copy of 8 whole
// rows per stage (32 KB at klen 2048) on a full/empty mbarrier pair (async proxy: no registers, no
// L1), and the consumer warps do the math from shared memory. The block's stages are numbered from
// the launch on (seq): slot = seq % RING_D, phase parity = (seq / RING_D) & 1.
// - Arming: before an item's dependency wait (run_task) warp RING_ARMER issues its first stages (at
//   most RING_D): the weights stream while thread 0 waits and the prologues and the staging run.
// - Loader: inside the GEMV, warp RING_LOADER issues the rest in order, gated only by free stages.
// - Consumers: warps 0 .. RING_CW - 1; each stage on its own (ring_consume), its k-steps of 32
//   dealt over the warps (j = w + 8i), four accumulators per warp, released by each warp's arrive
//   once read. Fragment trick as the register GEMV: lane (gid, t) reads 16 bytes of row gid at
//   k = 8t (LDS.128; rows 4 KB apart: 2-way bank conflicts).
// - Epilogue: the group's sums into out_s (red.shared), the RMSNorm factor as gemv_mma.
// Every stage issued is consumed by the item's GEMV (the plan is a function of the descriptor); an
// abandoned step waits for its in-flight stages before the block exits (ring_quiesce).
// Measured and removed (2026-12-05, H100): stages of row pieces (32 rows x 512 k, one 1 KB copy per
// row; a fused MoE item's down slice as 256-byte pieces) streamed at a third to a half of the
// register GEMV's rate (BS 1 8K: 8.7-8.9 ms vs 3.57): bulk copies must be large.
#pragma once

namespace mk {

constexpr int RING_D = 4;                   // stages
constexpr int RING_STAGE = 32 * 1024;       // bytes of one stage: 8 rows of klen <= 2048
constexpr int RING_BYTES = RING_D * RING_STAGE;
constexpr int RING_ROWS = 8;                // rows per stage
constexpr int RING_CW = 8;                  // consumer warps 0 .. 7
constexpr int RING_LOADER = NWARPS - 1;     // the loader warp inside a ring GEMV
constexpr int RING_ARMER = 1;               // the warp that arms an item before its wait

__shared__ __align__(8) unsigned long long s_ring_full[RING_D];
__shared__ __align__(8) unsigned long long s_ring_empty[RING_D];
__shared__ uint32_t s_ring_issued;  // stages issued since the launch (the issuing warp's lane 0)
__shared__ uint32_t s_ring_cons;    // stages consumed (thread 0, after the consuming call's barrier)
__shared__ uint32_t s_ring_base;    // shared-memory address of stage 0 (after the base carve-up)

__device__ __forceinline__ bool ring_on(const Params& p) { return (p.prefetch_mode & MK_MODE_RING) && p.use_mma; }

// ---- mbarriers and bulk copies ---------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(b) : "memory");
}
__device__ __forceinline__ bool mbar_try(uint32_t b, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n\t.reg .pred P;\n\tmbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2;\n\tselp.u32 %0, 1, 0, P;\n\t}"
      : "=r"(ok)
      : "r"(b), "r"(parity)
      : "memory");
  return ok != 0;
}
// Wait for the phase of `parity`. A protocol bug must not hang the GPU: past the watchdog limit the
// error word says so (MK_ERR_TIMEOUT, counter word -2 - slot) and the kernel traps.
__device__ __forceinline__ void mbar_wait(const Params& p, uint32_t b, uint32_t parity, int slot) {
  if (mbar_try(b, parity)) return;
  const uint64_t t0 = globaltimer();
  const uint64_t limit = (uint64_t)p.timeout_ms * 1000000ull;
  for (uint32_t n = 0;; ++n) {
    if (mbar_try(b, parity)) return;
    if ((n & 255) == 255 && globaltimer() - t0 > limit) {
      raise_error(p, MK_ERR_TIMEOUT, -1, -2 - slot, (int)parity, 0);
      asm volatile("trap;");
    }
  }
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(pol)
      : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ void red_shared(float* p, float v) {
  asm volatile("red.shared.add.f32 [%0], %1;" ::"r"(smem_u32(p)), "f"(v) : "memory");
}

// ---- the plan --------------------------------------------------------------------------------------

// A GEMV tile through the ring: row r at W0 + r * klen (r < nsplit), else W1 + (r - nsplit) * klen;
// stage k holds rows [8k, 8k + 8).
struct RingTile {
  const bf16* W0;
  const bf16* W1;
  int nsplit, nrows, klen, stages;
};

// A GEMV tile (task_gemv's) through the ring, or false: rows not contiguous (a K range of longer
// rows: O-proj, dense and MoE down, a fused item's down slice), klen not a multiple of 256 or over
// a stage's 8 rows, rows not whole stages, a stage straddling the W0 / W1 split, misaligned.
__device__ __forceinline__ bool ring_tile(const Gemv& g, RingTile& t) {
  if (g.ld0 != g.klen || g.ld1 != g.klen || g.klen % 256 || g.klen * 2 * RING_ROWS > RING_STAGE) return false;
  if (g.nrows <= 0 || g.nrows % RING_ROWS || g.nsplit % RING_ROWS) return false;
  if (((uintptr_t)g.W0 | (uintptr_t)g.W1) & 15) return false;
  t.W0 = g.W0;
  t.W1 = g.W1;
  t.nsplit = g.nsplit;
  t.nrows = g.nrows;
  t.klen = g.klen;
  t.stages = g.nrows / RING_ROWS;
  return true;
}

__device__ __forceinline__ bool ring_plan(const Params& p, const int* d, RingTile& t) {
  Gemv g;
  return ring_on(p) && task_gemv(p, d, g) && ring_tile(g, t);
}

// ---- the loader ------------------------------------------------------------------------------------

// Lane 0 of a warp: issue the tile's stages from s_ring_issued up to (not including) `upto`; stage k
// of the tile is seq item0 + k. Each stage: wait for its slot to be free, arm the full barrier with
// the stage's bytes, one bulk copy of its 8 rows.
__device__ __noinline__ void ring_issue(const Params& p, const RingTile& t, uint32_t item0, uint32_t upto) {
  const uint64_t pol = l2_policy(false);  // streamed once per step
  const uint32_t ring = s_ring_base, bytes = (uint32_t)(t.klen * 2 * RING_ROWS);
  uint32_t seq = s_ring_issued;
  for (; seq < upto; ++seq) {
    const int slot = (int)(seq % RING_D), r = (int)(seq - item0) * RING_ROWS;
    const uint32_t full = smem_u32(&s_ring_full[slot]);
    mbar_wait(p, smem_u32(&s_ring_empty[slot]), ((seq / RING_D) & 1u) ^ 1u, slot);
    mbar_expect_tx(full, bytes);
    const bf16* src = r < t.nsplit ? t.W0 + (size_t)r * t.klen : t.W1 + (size_t)(r - t.nsplit) * t.klen;
    bulk_g2s(ring + (uint32_t)(slot * RING_STAGE), src, bytes, full, pol);
  }
  s_ring_issued = seq;
}

// Before an item's dependency wait (run_task; lane 0 of warp RING_ARMER): its first stages, at most
// RING_D (every slot is free: the items before it consumed all they issued).
__device__ __noinline__ void ring_arm(const Params& p, const int* d) {
  RingTile t;
  if (!ring_plan(p, d, t)) return;
  const uint32_t item0 = s_ring_cons;
  ring_issue(p, t, item0, item0 + (uint32_t)min(RING_D, t.stages));
}

// Thread 0, before the block leaves an abandoned step: every stage still in flight has landed.
__device__ __forceinline__ void ring_quiesce() {
  for (uint32_t seq = s_ring_cons; seq < s_ring_issued; ++seq) {
    const int slot = (int)(seq % RING_D);
    while (!mbar_try(smem_u32(&s_ring_full[slot]), (seq / RING_D) & 1u)) {
    }
  }
}

// ---- the consumers ---------------------------------------------------------------------------------

// Consumer warp w (< RING_CW): every stage on its own (8 rows: the mma's A rows gid and gid + 8 both
// from row gid, the duplicate sums unused, so a stage is released as soon as its warps read it and the
// others stay in flight; a 16-row group over two stages held two of the four, measured slower);
// k-steps j = w + 8i, i < nu = klen / 256; the warp's activation fragments in registers for the
// whole tile (every stage has the whole K). act_s [8][lds] bf16 (token n's column k at
// act_s[n * lds + k]); sums added into out_s[row * 8 + n].
constexpr int RING_NU = 8;  // k-steps per warp and stage at most (klen <= 2048)
__device__ __forceinline__ void ring_consume(const Params& p, const RingTile& tl, uint32_t seq0, const bf16* act_s,
                                             int lds, float* out_s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, gid = lane >> 2, t = lane & 3;
  const uint32_t roff = gid * (uint32_t)(tl.klen * 2) + (uint32_t)(warp * 64 + t * 16);
  const uint32_t xa = smem_u32(act_s) + (uint32_t)((gid * lds + t * 8 + warp * 32) * 2);
  const int nu = tl.klen / (32 * RING_CW);
  uint4 bx[RING_NU];
#pragma unroll
  for (int i = 0; i < RING_NU; ++i) bx[i] = i < nu ? lds128(xa + (uint32_t)(i * RING_CW * 64)) : make_uint4(0, 0, 0, 0);
  const uint32_t ring = s_ring_base;
  uint32_t seq = seq0;
  for (int st = 0; st < tl.stages; ++st, ++seq) {
    const int slot = (int)(seq % RING_D);
    mbar_wait(p, smem_u32(&s_ring_full[slot]), (seq / RING_D) & 1u, slot);
    const uint32_t a = ring + (uint32_t)(slot * RING_STAGE) + roff;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
    for (int i = 0; i < RING_NU; ++i) {
      if (i < nu) {
        const uint4 w = lds128(a + (uint32_t)(i * RING_CW * 64));
        mma16816(acc[i & 3], w.x, w.x, w.y, w.y, bx[i].x, bx[i].y);
        mma16816(acc[i & 3], w.z, w.z, w.w, w.w, bx[i].z, bx[i].w);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(&s_ring_empty[slot]));  // the warp has read the stage
    // c0, c1: row st * 8 + gid, tokens 2t, 2t + 1 (c2, c3: the same row again)
    const int r = st * RING_ROWS + gid;
    red_shared(out_s + r * 8 + 2 * t, (acc[0][0] + acc[1][0]) + (acc[2][0] + acc[3][0]));
    red_shared(out_s + r * 8 + 2 * t + 1, (acc[0][1] + acc[1][1]) + (acc[2][1] + acc[3][1]));
  }
}

// The ring's GEMV of a task (gemv_op in ring mode, in place of gemv): out_s[r * 8 + n] with the
// staging and the RMSNorm factor as gemv_mma. All threads; ends with __syncthreads().
__device__ __noinline__ void gemv_ring(const Params& p, const int* d, const RingTile& t0, const ActSrc& act,
                                       bf16* act_s, float* out_s, bool staged) {
  const int warp = threadIdx.x / 32;
  const int klen = t0.klen;
  const uint32_t item0 = s_ring_cons;
  act_s = shared(act_s);
  out_s = shared(out_s);
  for (int i = threadIdx.x; i < t0.nrows * 8; i += NT) out_s[i] = 0.f;
  if (!staged) stage_rows(act_s, act, klen);
  __syncthreads();
  if (p.timeline && threadIdx.x == 0) tl_marks[0] = globaltimer();
  if (warp == RING_LOADER) {
    if ((threadIdx.x & 31) == 0) ring_issue(p, t0, item0, item0 + (uint32_t)t0.stages);
  } else if (warp < RING_CW) {
    ring_consume(p, t0, item0, act_s, klen + ACT_PAD, out_s);
  }
  __syncthreads();
  if (threadIdx.x == 0) s_ring_cons = item0 + (uint32_t)t0.stages;  // read after the next barrier
  if (act.norm_w != nullptr) {  // as gemv_mma: the rows' RMSNorm factors
    const float sc = norm_scale(klen, act.eps);
    for (int i = threadIdx.x; i < t0.nrows * 8; i += NT) out_s[i] *= sc;
  }
  __syncthreads();
  if (p.timeline && threadIdx.x == 0) tl_marks[1] = globaltimer();
}

// gemv_op in ring mode: the GEMV through the ring when its tile takes it (then true), else nothing
// (false: gemv_op runs the register GEMV). Out of line, so that gemv_op stays small.
__device__ __noinline__ bool gemv_ring_op(const Params& p, const int* d, const Gemv& g, const ActSrc& act,
                                          bf16* act_s, float* out_s, bool staged) {
  RingTile t;
  if (!ring_tile(g, t)) return false;
  gemv_ring(p, d, t, act, act_s, out_s, staged);
  return true;
}

// Kernel start (thread 0, before the first barrier): the barriers and counters, the ring's address.
__device__ __forceinline__ void ring_init(uint32_t base) {
  for (int s = 0; s < RING_D; ++s) {
    mbar_init(smem_u32(&s_ring_full[s]), 1);
    mbar_init(smem_u32(&s_ring_empty[s]), RING_CW);
  }
  s_ring_issued = s_ring_cons = 0;
  s_ring_base = base;
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

}  // namespace mk
