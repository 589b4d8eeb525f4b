// mk_ring.cuh: engine v2's weight ring for the GEMV-shaped ops (issue 41, step 2; the runtime switch
// MK_MODE_RING, off by default: the register GEMV of mk_device.cuh stays the reference).
//
// A GEMV's weight rows go from HBM into a ring of RING_D shared-memory stages by cp.async.bulk copies
// on mbarriers (async proxy: no registers, no L1), and the consumer warps do the math from shared
// memory. An item's plan is one or two tiles (a fused MoE item: its up tile, then its down slice),
// each cut into stages of rows_s rows x kc columns (row-block major, then k chunks); every stage
// is one full/empty mbarrier pair, the stages of the block numbered from the launch on (seq), so
// slot = seq % RING_D and the phase parity = (seq / RING_D) & 1.
// - Arming: before an item's dependency wait (run_task) warp RING_ARMER issues its first stages
//   (at most RING_D): the weights stream while thread 0 waits, the prologues and the staging run.
// - Loader: inside the GEMV, warp RING_LOADER issues the rest in plan order, gated only by free
//   stages; during the up tile of a fused item it runs on into the down slice (up to RING_D stages
//   ahead of the consumers, never past a stage this call's consumers free: no deadlock).
// - Consumers: warps 0 .. RING_CW - 1; a stage's 32 units (16 rows x 32 k each) are dealt u = w + 8i,
//   each unit its own accumulator (four independent mma chains per warp), the stage released by each
//   warp's arrive. Fragment trick as the register GEMV: lane (gid, t) reads 16 bytes of rows gid and
//   gid + 8 at k = 8t (LDS.128; rows 64 bytes apart mod 128 where the stage has room: conflict-free).
// - Epilogue: a GEMV's sums into out_s (red.shared), a fused item's down slice straight into the
//   layer's sum (red.global, weighted per token), as the register path does.
// Every stage issued is consumed by the plan's consumers (the plan is a function of the descriptor);
// an abandoned step waits for its in-flight stages before the block exits (ring_quiesce).
#pragma once

namespace mk {

constexpr int RING_D = 4;                   // stages
constexpr int RING_STAGE = 36 * 1024;       // bytes of one stage (rows_s x pitch at most)
constexpr int RING_BYTES = RING_D * RING_STAGE;
constexpr int RING_ELEMS = 16384;           // weights per stage: 32 units of 16 rows x 32 k
constexpr int RING_CW = 8;                  // consumer warps 0 .. 7
constexpr int RING_LOADER = NWARPS - 1;     // the loader warp inside a ring GEMV
constexpr int RING_ARMER = 1;               // the warp that arms an item before its wait
static_assert(RING_ELEMS / (16 * 32) == 4 * RING_CW, "a stage is four units per consumer warp");

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

// One GEMV's weight rows through the ring: row r at W0 + r * ld0 (r < nsplit), else W1 + (r - nsplit) *
// ld1, columns [0, nkc * kc). Geometry (kc, rows_s, pitch, stages) depends only on (klen, nrows), so
// the consumers, which need no pointers, derive the same stages as the loader.
struct RingTile {
  const bf16* W0;
  const bf16* W1;
  long ld0, ld1;
  int nsplit, nrows, kc, nkc, rows_s, pitch, stages;
};

// false: this shape does not go through the ring (klen not a multiple of 64)
__device__ __forceinline__ bool ring_geom(int klen, int nrows, RingTile& t) {
  int kc = 0;
  for (int c = 512; c >= 64; c >>= 1)
    if (klen % c == 0) {
      kc = c;
      break;
    }
  if (kc == 0 || klen <= 0 || nrows <= 0) return false;
  t.kc = kc;
  t.nkc = klen / kc;
  t.rows_s = RING_ELEMS / kc;  // 32 .. 256: 2 .. 16 groups of 16 rows
  // a row 64 bytes apart (mod 128) from the next: LDS.128 of rows gid, gid + 1 in one phase do not
  // collide; where that does not fit the stage (kc 64, 128), 2-way conflicts
  t.pitch = t.rows_s * (kc * 2 + 64) <= RING_STAGE ? kc * 2 + 64 : kc * 2;
  t.nrows = nrows;
  t.stages = ((nrows + t.rows_s - 1) / t.rows_s) * t.nkc;
  return true;
}

// A GEMV tile (task_gemv's): its geometry and pointers; false when it cannot go through the ring.
__device__ __forceinline__ bool ring_tile(const Gemv& g, RingTile& t) {
  if (!ring_geom(g.klen, g.nrows, t)) return false;
  if (((uintptr_t)g.W0 | (uintptr_t)g.W1 | (uintptr_t)(g.ld0 * 2) | (uintptr_t)(g.ld1 * 2)) & 15) return false;
  t.W0 = g.W0;
  t.W1 = g.W1;
  t.ld0 = g.ld0;
  t.ld1 = g.ld1;
  t.nsplit = g.nsplit;
  return true;
}

// A fused MoE item's down slice W_down[e][:, c0 : c0 + n] (hidden rows, n columns); Wd: the layer's
// down weights, or null for the geometry only (the consumers).
__device__ __forceinline__ bool ring_down_tile(const Params& p, const int* d, const bf16* Wd, RingTile& t) {
  const int I = p.moe_inter, c0 = d[MK_F_A1], n = d[MK_F_A2];
  if ((I % 8) || (c0 % 8) || !ring_geom(n, p.hidden, t)) return false;
  const bf16* W = Wd ? Wd + (size_t)d[MK_F_A0] * p.hidden * I + c0 : nullptr;
  t.W0 = t.W1 = W;
  t.ld0 = t.ld1 = I;
  t.nsplit = p.hidden;
  return true;
}

// The item's ring plan from its GEMV tile g (task_gemv's): the number of tiles, 0 when it does not
// use the ring. pointers = false: a fused item's down slice as geometry only (no global load).
__device__ __forceinline__ int ring_plan_of(const Params& p, const int* d, const Gemv& g, RingTile (&t)[2],
                                            bool pointers) {
  if (!ring_on(p) || !ring_tile(g, t[0])) return 0;
  if (d[MK_F_OP] != MK_OP_MOE_FUSED) return 1;
  const bf16* Wd = pointers ? View(p).lw(d[MK_F_LAYER], MK_LW_EXP_DOWN) : nullptr;
  return ring_down_tile(p, d, Wd, t[1]) ? 2 : 0;
}
__device__ __forceinline__ int ring_plan(const Params& p, const int* d, RingTile (&t)[2]) {
  Gemv g;
  if (!ring_on(p) || !task_gemv(p, d, g)) return 0;
  return ring_plan_of(p, d, g, t, true);
}

// The running GEMV's plan size (gemv_op's thread 0, before its barriers): op_moe_fused reads it.
__shared__ int s_ring_n;

// ---- the loader ------------------------------------------------------------------------------------

// One warp: issue the plan's stages from s_ring_issued up to (not including) `upto`; stage k of the
// plan is seq item0 + k. Each stage: lane 0 waits for its slot to be free, arms the full barrier with
// the stage's bytes, then every lane copies rows lane, lane + 32, ... (one bulk copy per row piece).
__device__ __noinline__ void ring_issue(const Params& p, const RingTile* tl, int ntl, uint32_t item0, uint32_t upto) {
  const int lane = threadIdx.x & 31;
  const uint64_t pol = l2_policy(false);  // streamed once per step
  const uint32_t ring = s_ring_base;
  uint32_t seq = s_ring_issued;
  for (; seq < upto; ++seq) {
    int k = (int)(seq - item0);
    const RingTile* t = tl;
    if (ntl > 1 && k >= tl[0].stages) {
      k -= tl[0].stages;
      t = tl + 1;
    }
    const int slot = (int)(seq % RING_D);
    const uint32_t full = smem_u32(&s_ring_full[slot]);
    const int rb = k / t->nkc, kci = k - rb * t->nkc;
    const int r0 = rb * t->rows_s, nr = min(t->rows_s, t->nrows - r0);
    if (lane == 0) {
      mbar_wait(p, smem_u32(&s_ring_empty[slot]), ((seq / RING_D) & 1u) ^ 1u, slot);
      mbar_expect_tx(full, (uint32_t)(nr * t->kc * 2));
    }
    __syncwarp();
    const uint32_t dst = ring + (uint32_t)(slot * RING_STAGE);
    for (int r = lane; r < nr; r += 32) {
      const int row = r0 + r;
      const bf16* src = (row < t->nsplit ? t->W0 + row * t->ld0 : t->W1 + (row - t->nsplit) * t->ld1) + kci * t->kc;
      bulk_g2s(dst + (uint32_t)(r * t->pitch), src, (uint32_t)(t->kc * 2), full, pol);
    }
  }
  __syncwarp();
  if (lane == 0) s_ring_issued = seq;
}

// Before an item's dependency wait (run_task; warp RING_ARMER): its first stages, at most RING_D
// (every slot is free: the items before it consumed all they issued).
__device__ __noinline__ void ring_arm(const Params& p, const int* d) {
  RingTile t[2];
  const int n = ring_plan(p, d, t);
  if (!n) return;
  const uint32_t item0 = s_ring_cons;
  ring_issue(p, t, n, item0, item0 + (uint32_t)min(RING_D, t[0].stages + (n > 1 ? t[1].stages : 0)));
}

// Thread 0, before the block leaves an abandoned step: every stage still in flight has landed.
__device__ __forceinline__ void ring_quiesce() {
  for (uint32_t seq = s_ring_cons; seq < s_ring_issued; ++seq) {
    const int slot = (int)(seq % RING_D);
    while (!mbar_try(smem_u32(&s_ring_full[slot]), (seq / RING_D) & 1u)) {
    }
  }
}

// The loader's plan disagrees with the consumers' (a bug): say so, and stop the kernel (the consumers
// would wait for stages nobody issues).
__device__ __noinline__ void ring_fail(const Params& p, const int* d) {
  if ((threadIdx.x & 31) == 0) raise_error(p, MK_ERR_BAD_ARGS, d[MK_F_ID], d[MK_F_OP], -1, -1);
  asm volatile("trap;");
}

// ---- the consumers ---------------------------------------------------------------------------------

// Where a ring GEMV's sums go: out_s[row * 8 + n] (down = false), or a fused item's down slice:
// acc[btok[n] * H + row] += wtok[n] * sum for its nt tokens (as gemv_down_acc).
struct RingOut {
  float* out_s;
  float* acc;
  const float* wtok;
  const int* btok;
  int nt, H;
};

__device__ __forceinline__ void ring_flush(const RingOut& o, bool down, int nrows, int row0, const float (&c)[4]) {
  const int lane = threadIdx.x & 31, gid = lane >> 2, t = lane & 3;
  const int ra = row0 + gid, rb = ra + 8;
  if (!down) {
    if (ra < nrows) {
      red_shared(o.out_s + ra * 8 + 2 * t, c[0]);
      red_shared(o.out_s + ra * 8 + 2 * t + 1, c[1]);
    }
    if (rb < nrows) {
      red_shared(o.out_s + rb * 8 + 2 * t, c[2]);
      red_shared(o.out_s + rb * 8 + 2 * t + 1, c[3]);
    }
    return;
  }
  // c0, c1: row ra, tokens 2t, 2t + 1; c2, c3: row rb (nrows: the hidden size, a multiple of 16, so
  // rb < nrows with ra; a group past it, in a stage's last row block, adds nothing)
  if (ra >= nrows) return;
  if (2 * t < o.nt) {
    float* d0 = o.acc + (size_t)o.btok[2 * t] * o.H;
    const float w0 = o.wtok[2 * t];
    red_add_global(d0 + ra, w0 * c[0]);
    red_add_global(d0 + rb, w0 * c[2]);
  }
  if (2 * t + 1 < o.nt) {
    float* d1 = o.acc + (size_t)o.btok[2 * t + 1] * o.H;
    const float w1 = o.wtok[2 * t + 1];
    red_add_global(d1 + ra, w1 * c[1]);
    red_add_global(d1 + rb, w1 * c[3]);
  }
}

// Consumer warp w (< RING_CW): the tile's stages from seq0 on; activations act_s [8][lds] bf16
// (token n's column k at act_s[n * lds + k]).
__device__ __forceinline__ void ring_consume(const Params& p, const RingTile& tl, uint32_t seq0, const bf16* act_s,
                                             int lds, const RingOut& o, bool down) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, gid = lane >> 2, t = lane & 3;
  const int G = tl.rows_s / 16;  // groups per stage: 2, 4, 8 or 16 (a power of two)
  uint32_t offw[4];
  int offx[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int u = warp + RING_CW * i, g = u & (G - 1), j = u / G;
    offw[i] = (uint32_t)((g * 16 + gid) * tl.pitch + j * 64 + t * 16);
    offx[i] = j * 32;
  }
  const uint32_t pitch8 = (uint32_t)(8 * tl.pitch);
  const uint32_t xa = smem_u32(act_s) + (uint32_t)((gid * lds + t * 8) * 2);
  const uint32_t ring = s_ring_base;
  uint32_t seq = seq0;
  const int nrb = tl.stages / tl.nkc;
  for (int rb = 0; rb < nrb; ++rb) {
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    for (int kci = 0; kci < tl.nkc; ++kci, ++seq) {
      const int slot = (int)(seq % RING_D);
      mbar_wait(p, smem_u32(&s_ring_full[slot]), (seq / RING_D) & 1u, slot);
      const uint32_t st = ring + (uint32_t)(slot * RING_STAGE);
      const uint32_t xk = xa + (uint32_t)(kci * tl.kc * 2);
      uint4 wa[4], wb[4], bx[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        wa[i] = lds128(st + offw[i]);
        wb[i] = lds128(st + offw[i] + pitch8);
        bx[i] = lds128(xk + (uint32_t)(offx[i] * 2));
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_u32(&s_ring_empty[slot]));  // the weights are in registers
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        mma16816(acc[i], wa[i].x, wb[i].x, wa[i].y, wb[i].y, bx[i].x, bx[i].y);
        mma16816(acc[i], wa[i].z, wb[i].z, wa[i].w, wb[i].w, bx[i].z, bx[i].w);
      }
    }
    // the row block's sums: G <= 8: all four units in group warp % G; G = 16: units 0, 2 in group
    // warp, units 1, 3 in group warp + 8
    const int r0 = rb * tl.rows_s;
    if (G == 16) {
      float c0[4], c1[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        c0[e] = acc[0][e] + acc[2][e];
        c1[e] = acc[1][e] + acc[3][e];
      }
      ring_flush(o, down, tl.nrows, r0 + warp * 16, c0);
      ring_flush(o, down, tl.nrows, r0 + (warp + 8) * 16, c1);
    } else {
      float c[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) c[e] = (acc[0][e] + acc[1][e]) + (acc[2][e] + acc[3][e]);
      ring_flush(o, down, tl.nrows, r0 + (warp & (G - 1)) * 16, c);
    }
  }
}

// The ring's GEMV of a task (gemv_op in ring mode, in place of gemv): out_s[r * 8 + n] for the plan's
// first tile, with the staging and the RMSNorm factor as gemv_mma. The loader runs on into the
// plan's second tile (a fused item's down slice) while the consumers finish this one. All threads;
// ends with __syncthreads().
__device__ __noinline__ void gemv_ring(const Params& p, const int* d, const RingTile& t0, const ActSrc& act,
                                       bf16* act_s, float* out_s, bool staged) {
  const int warp = threadIdx.x / 32;
  const int klen = t0.nkc * t0.kc;
  const uint32_t item0 = s_ring_cons;
  act_s = shared(act_s);
  out_s = shared(out_s);
  for (int i = threadIdx.x; i < t0.nrows * 8; i += NT) out_s[i] = 0.f;
  if (!staged) stage_rows(act_s, act, klen);
  __syncthreads();
  if (p.timeline && threadIdx.x == 0) tl_marks[0] = globaltimer();
  if (warp == RING_LOADER) {
    RingTile t[2];
    const int n = ring_plan(p, d, t);
    if (n == 0) ring_fail(p, d);
    const uint32_t total = (uint32_t)(t[0].stages + (n > 1 ? t[1].stages : 0));
    ring_issue(p, t, n, item0, item0 + min(total, (uint32_t)(t[0].stages + RING_D)));
  } else if (warp < RING_CW) {
    ring_consume(p, t0, item0, act_s, klen + ACT_PAD, RingOut{out_s, nullptr, nullptr, nullptr, 0, 0}, false);
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

// gemv_op in ring mode: the GEMV through the ring when its plan takes it (then true), else nothing
// (false: gemv_op runs the register GEMV). Out of line, so that gemv_op's code and registers stay
// those of the reference path. s_ring_n: the plan's tiles, 0 when not through the ring.
__device__ __noinline__ bool gemv_ring_op(const Params& p, const int* d, const Gemv& g, const ActSrc& act,
                                          bf16* act_s, float* out_s, bool staged) {
  RingTile t[2];
  const int n = ring_plan_of(p, d, g, t, false);
  if (threadIdx.x == 0) s_ring_n = n;  // op_moe_fused reads it after the GEMV's barriers
  if (n) gemv_ring(p, d, t[0], act, act_s, out_s, staged);
  return n != 0;
}

// A fused MoE item's down slice through the ring (op_moe_fused in ring mode, in place of
// gemv_down_acc): its stages follow the up tile's, some already issued during the up GEMV. act_s:
// silu(gate) * up, bf16 [8][lds]. All threads; ends with __syncthreads().
__device__ __noinline__ void ring_down(const Params& p, const int* d, const bf16* act_s, int lds, float* acc,
                                       const float* wtok, const int* btok, int nt) {
  const int warp = threadIdx.x / 32;
  const uint32_t seq0 = s_ring_cons;
  RingTile t[2];
  if (warp == RING_LOADER) {
    const int n = ring_plan(p, d, t);  // the same plan as the up GEMV's (n == 2)
    if (n != 2) ring_fail(p, d);
    const uint32_t item0 = seq0 - (uint32_t)t[0].stages;
    ring_issue(p, t, n, item0, seq0 + (uint32_t)t[1].stages);
  } else if (warp < RING_CW) {
    ring_down_tile(p, d, nullptr, t[1]);
    ring_consume(p, t[1], seq0, shared(const_cast<bf16*>(act_s)), lds,
                 RingOut{nullptr, acc, wtok, btok, nt, p.hidden}, true);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    RingTile g;
    ring_geom(d[MK_F_A2], p.hidden, g);
    s_ring_cons = seq0 + (uint32_t)g.stages;
  }
  __syncthreads();
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
