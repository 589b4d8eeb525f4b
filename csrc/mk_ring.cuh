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
// A tile over a K range of longer rows (O-proj, dense down, a MoE down tile of a K range, a fused
// item's down slice) streams as TMA boxes (cp.async.bulk.tensor.2d) of [rbox rows][64 k] with the
// 128-byte swizzle (mk_abi.h MK_TMAP_*: one tensor map per layer and weight kind, in layer_w's
// allocation): a stage is bps boxes, consecutive k blocks of one row block (row block major), and
// the consumers read them with ldmatrix (16-byte chunk c of box row r at c ^ (r & 7)), four
// accumulators per 16-row group, adding a row block's sums at its last stage (ring_consume_box).
// An item's plan (ring_plan) is its GEMV's tile and, for a fused MoE item, its down slice: the
// loader of the first call runs on into the slice by up to RING_D stages (ring_model.kernel_upto).
// Every stage issued is consumed by the item's GEMV (the plan is a function of the descriptor); an
// abandoned step waits for its in-flight stages before the block exits (ring_quiesce).
// Measured and removed (figures: docs/PERF.md's engine v2 rows, docs/MEGAKERNEL.md): stages of row
// pieces (bulk copies must be large), bulk-copied activations (bit 4096), claims one item ahead on
// the static lists (bit 8192), a 2-stage ring, arming fewer than RING_D stages before the wait.
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
// the tensor maps (mk_abi.h MK_TMAP_*): map (l, kind) at s_tmap + MK_TMAP_BYTES * (l * MK_TMAP_KINDS +
// kind); s_tmap_rows[kind]: its box rows (0: that kind keeps the register GEMV)
__shared__ unsigned long long s_tmap;
__shared__ int s_tmap_rows[MK_TMAP_KINDS];

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
// One box of a tensor map (global address `map`) at column x, row y into shared memory (dst: a
// multiple of MK_TMAP_SMEM_ALIGN for the 128-byte swizzle), completing on mbarrier `bar`.
__device__ __forceinline__ void tma_2d(uint32_t dst, unsigned long long map, int x, int y, uint32_t bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3}], [%4], %5;" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(bar), "l"(pol)
      : "memory");
}
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
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

// A tile through the ring. Whole rows (map 0): row r at W0 + r * klen (r < nsplit), else W1 + (r -
// nsplit) * klen; stage k holds rows [8k, 8k + 8). Boxes (map: a tensor map's global address): the
// map's rows y0 .. y0 + nrows, columns x0 .. x0 + klen, in boxes of [rbox][MK_TMAP_BOX_K]; box q is
// row block q / kb, k block q % kb (kb = klen / MK_TMAP_BOX_K); stage k holds boxes [k bps, k bps + bps).
struct RingTile {
  const bf16* W0;
  const bf16* W1;
  int nsplit, nrows, klen, stages;
  unsigned long long map;
  int x0, y0, rbox, bps, kb;
};

// What an item streams through the ring, in the order it reads it: its GEMV's tile (gemv: t[0] is
// it) and a fused MoE item's down slice. n = 0: nothing (every tile keeps the register GEMV).
struct RingPlan {
  RingTile t[2];
  int n;
  bool gemv;
  __device__ __forceinline__ int total() const { return n == 0 ? 0 : n == 1 ? t[0].stages : t[0].stages + t[1].stages; }
};

__device__ __forceinline__ uint32_t stage_bytes(const RingTile& t) {
  return t.map ? (uint32_t)(t.bps * t.rbox * MK_TMAP_BOX_K * 2) : (uint32_t)(t.klen * 2 * RING_ROWS);
}

// A GEMV tile (task_gemv's) of whole rows through the ring, or false: rows not contiguous (a K range
// of longer rows: box_tile's), klen not a multiple of 256 or over a stage's 8 rows, rows not whole
// stages, a stage straddling the W0 / W1 split, misaligned.
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
  t.map = 0;
  return true;
}

// A K-range tile as boxes of layer l's map of `kind` (ring_model.box_plan is the same rule), or false:
// no map of that kind, rows not whole boxes, K not whole boxes. A stage holds the most boxes of one
// row block that fit it and divide the row block's k blocks (a power of two).
__device__ __forceinline__ bool box_tile(int l, int kind, int x0, int y0, int nrows, int klen, RingTile& t) {
  const int rbox = s_tmap_rows[kind];
  // box rows: a power of two from MK_TMAP_BOX_ROWS_MIN to MK_TMAP_BOX_ROWS_MAX (the consumers deal a
  // box's row groups over the warps by powers of two; tensor_maps.swizzle_legal_box_rows)
  if (s_tmap == 0 || rbox < MK_TMAP_BOX_ROWS_MIN || rbox > MK_TMAP_BOX_ROWS_MAX || (rbox & (rbox - 1))) return false;
  if (nrows <= 0 || nrows % rbox || klen <= 0 || klen % MK_TMAP_BOX_K) return false;
  const int kb = klen / MK_TMAP_BOX_K;
  int bps = RING_STAGE / (rbox * MK_TMAP_BOX_K * 2);
  while (kb % bps) bps >>= 1;
  t.map = s_tmap + (unsigned long long)(l * MK_TMAP_KINDS + kind) * MK_TMAP_BYTES;
  t.x0 = x0;
  t.y0 = y0;
  t.nrows = t.nsplit = nrows;
  t.klen = klen;
  t.rbox = rbox;
  t.kb = kb;
  t.bps = bps;
  t.stages = (nrows / rbox) * kb / bps;
  t.W0 = t.W1 = nullptr;
  return true;
}

// The K-range GEMV tiles of task_gemv as boxes: O-proj (rows a0.., K a2..a3 of W_o), dense down
// (likewise of W_down), a MoE down tile of a K range (expert a0's rows a1.., columns a3 .. a3 + a4).
__device__ __forceinline__ bool gemv_box_tile(const Params& p, const int* d, RingTile& t) {
  const int op = d[MK_F_OP], l = d[MK_F_LAYER];
  const int a0 = d[MK_F_A0], a1 = d[MK_F_A1], a2 = d[MK_F_A2], a3 = d[MK_F_A3], a4 = d[MK_F_A4];
  if (op == MK_OP_OPROJ) return box_tile(l, MK_TMAP_O, a2, a0, a1, a3 - a2, t);
  if (op == MK_OP_DENSE_DOWN) return box_tile(l, MK_TMAP_DENSE_DOWN, a2, a0, a1, a3 - a2, t);
  if (op == MK_OP_MOE_DOWN) return box_tile(l, MK_TMAP_EXP_DOWN, a3, a0 * p.hidden + a1, a2, a4 ? a4 : p.moe_inter, t);
  return false;
}

// A fused MoE item's down slice (op_moe_fused): expert a0's every hidden row, its columns a1 .. a1 + a2.
__device__ __forceinline__ bool slice_tile(const Params& p, const int* d, RingTile& t) {
  return d[MK_F_OP] == MK_OP_MOE_FUSED &&
         box_tile(d[MK_F_LAYER], MK_TMAP_EXP_DOWN, d[MK_F_A1], d[MK_F_A0] * p.hidden, p.hidden, d[MK_F_A2], t);
}

// The item's plan (every caller computes the same one from the descriptor: the armer, the GEMV, the
// slice). False when nothing goes through the ring.
__device__ __forceinline__ bool ring_plan(const Params& p, const int* d, RingPlan& pl) {
  pl.n = 0;
  pl.gemv = false;
  if (!ring_on(p)) return false;
  Gemv g;
  if (task_gemv(p, d, g) && (ring_tile(g, pl.t[0]) || gemv_box_tile(p, d, pl.t[0]))) {
    pl.gemv = true;
    pl.n = 1;
  }
  if (slice_tile(p, d, pl.t[pl.n])) ++pl.n;
  return pl.n > 0;
}

// ---- the loader ------------------------------------------------------------------------------------

// Lane 0 of a warp: issue the plan's stages from s_ring_issued up to (not including) `upto`; stage k
// of the plan is seq item0 + k. Each stage: wait for its slot to be free, arm the full barrier with
// the stage's bytes, then one bulk copy of its 8 rows or its bps boxes.
__device__ __noinline__ void ring_issue(const Params& p, const RingPlan& pl, uint32_t item0, uint32_t upto) {
  const uint64_t pol = l2_policy(false);  // streamed once per step
  const uint32_t ring = s_ring_base;
  uint32_t seq = s_ring_issued;
  for (; seq < upto; ++seq) {
    const int slot = (int)(seq % RING_D);
    int k = (int)(seq - item0);
    const bool second = k >= pl.t[0].stages;
    const RingTile& t = second ? pl.t[1] : pl.t[0];
    if (second) k -= pl.t[0].stages;
    const uint32_t full = smem_u32(&s_ring_full[slot]), dst = ring + (uint32_t)(slot * RING_STAGE);
    mbar_wait(p, smem_u32(&s_ring_empty[slot]), ((seq / RING_D) & 1u) ^ 1u, slot);
    mbar_expect_tx(full, stage_bytes(t));
    if (t.map) {
      const int q = k * t.bps, y = t.y0 + (q / t.kb) * t.rbox, x = t.x0 + (q % t.kb) * MK_TMAP_BOX_K;
      for (int j = 0; j < t.bps; ++j)
        tma_2d(dst + (uint32_t)(j * t.rbox * MK_TMAP_BOX_K * 2), t.map, x + j * MK_TMAP_BOX_K, y, full, pol);
    } else {
      const int r = k * RING_ROWS;
      const bf16* src = r < t.nsplit ? t.W0 + (size_t)r * t.klen : t.W1 + (size_t)(r - t.nsplit) * t.klen;
      bulk_g2s(dst, src, stage_bytes(t), full, pol);
    }
  }
  s_ring_issued = seq;
}

// Before an item's dependency wait (run_task; lane 0 of warp RING_ARMER): its plan's first stages, at
// most RING_D (every slot is free: the items before it consumed all they issued).
__device__ __noinline__ void ring_arm(const Params& p, const int* d) {
  RingPlan pl;
  const uint32_t item0 = s_ring_cons;
  if (!ring_plan(p, d, pl)) return;
  ring_issue(p, pl, item0, item0 + (uint32_t)min(RING_D, pl.total()));
}

// Thread 0, before the block leaves an abandoned step: every stage still in flight has landed.
__device__ __forceinline__ void ring_quiesce() {
  for (uint32_t seq = s_ring_cons; seq < s_ring_issued; ++seq) {
    const int slot = (int)(seq % RING_D);
    while (!mbar_try(smem_u32(&s_ring_full[slot]), (seq / RING_D) & 1u)) {
    }
  }
}

// The loader's limit during the call that reads tile `ti` of the plan (ring_model.kernel_upto): the
// plan's end in its last call, else up to RING_D stages past this tile (their slots are released by
// this call's consumers, so the loader never waits for a later call).
__device__ __forceinline__ uint32_t ring_upto(const RingPlan& pl, int ti, uint32_t item0) {
  const int total = pl.total();
  return item0 + (uint32_t)(ti == pl.n - 1 ? total : min(total, pl.t[0].stages + RING_D));
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

// Where a box tile's sums go: a GEMV's out_s[r * 8 + n] (red.shared), or for a fused item's down
// slice acc[btok[n] * H + r] += wtok[n] * sum for its nt tokens (red.global, as gemv_down_acc).
struct BoxSink {
  float* out_s;
  float* acc;
  int H, nt;
  const float* wtok;
  const int* btok;
};

// Consumer warp w of a box tile: a box's G = rbox / 16 row groups are dealt as in ring_probe's
// consumers: G >= RING_CW: groups w and w + RING_CW of every box of the stage; else group w % G of
// boxes w / G, w / G + RING_CW / G, ... (several warps then hold sums of one group: the adds sum
// them). A (16 rows x 16 k) by ldmatrix.x4 from the swizzled box: lane l gives the address of row
// l & 15 of the group, chunk 2 ks + (l >> 4), which sits at chunk (2 ks + (l >> 4)) ^ (l & 7) of its
// 128-byte row (the box starts at a multiple of 1024 bytes and the group at a multiple of 16 rows, so
// row & 7 = l & 7); the registers are a0 (rows 0-7, k 0-7), a1 (rows 8-15), a2 (rows 0-7, k 8-15),
// a3. B (16 k x 8 tokens) by ldmatrix.x4 from act_s: lane l gives token l & 7's row at k chunk
// l >> 3 of a 32-k half, so registers 0, 1 are k-step 0's b0, b1 and 2, 3 k-step 1's. Four
// accumulators per group (one per k-step of a box); at a row block's last stage the warp adds them.
__device__ __forceinline__ void ring_consume_box(const Params& p, const RingTile& tl, uint32_t seq0, const bf16* act_s,
                                                 int lds, const BoxSink& o) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, gid = lane >> 2, t = lane & 3;
  const int G = tl.rbox >> 4;
  const int ng = G >= RING_CW ? G / RING_CW : 1, g0 = G >= RING_CW ? warp : warp % G;
  const int box0 = G >= RING_CW ? 0 : warp / G, bstep = G >= RING_CW ? 1 : RING_CW / G;
  const uint32_t box_bytes = (uint32_t)(tl.rbox * MK_TMAP_BOX_K * 2);
  const uint32_t a_lane = (uint32_t)((lane & 15) * MK_TMAP_SWIZZLE), a_hi = (uint32_t)(lane >> 4), a_sw = lane & 7;
  const uint32_t b_lane = smem_u32(act_s) + (uint32_t)(((lane & 7) * lds + (lane >> 3) * 8) * 2);
  // slice mode: this thread's token columns 2t, 2t + 1
  const bool v0 = o.out_s == nullptr && 2 * t < o.nt, v1 = o.out_s == nullptr && 2 * t + 1 < o.nt;
  float* const d0 = v0 ? o.acc + (size_t)o.btok[2 * t] * o.H : nullptr;
  float* const d1 = v1 ? o.acc + (size_t)o.btok[2 * t + 1] * o.H : nullptr;
  const float w0 = v0 ? o.wtok[2 * t] : 0.f, w1 = v1 ? o.wtok[2 * t + 1] : 0.f;
  const uint32_t ring = s_ring_base;
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) acc[i][ks][0] = acc[i][ks][1] = acc[i][ks][2] = acc[i][ks][3] = 0.f;
  uint32_t seq = seq0;
  for (int st = 0; st < tl.stages; ++st, ++seq) {
    const int slot = (int)(seq % RING_D), q0 = st * tl.bps;
    mbar_wait(p, smem_u32(&s_ring_full[slot]), (seq / RING_D) & 1u, slot);
    const uint32_t sb = ring + (uint32_t)(slot * RING_STAGE) + a_lane;
    for (int box = box0; box < tl.bps; box += bstep) {
      uint32_t b[4][2], r[4];
      const uint32_t ba = b_lane + (uint32_t)(((q0 + box) % tl.kb) * MK_TMAP_BOX_K * 2);
      ldsm4(r, ba);
      b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
      ldsm4(r, ba + 64);
      b[2][0] = r[0], b[2][1] = r[1], b[3][0] = r[2], b[3][1] = r[3];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (i < ng) {
          const uint32_t row = sb + (uint32_t)box * box_bytes + (uint32_t)((g0 + i * RING_CW) * 16 * MK_TMAP_SWIZZLE);
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) {
            uint32_t a[4];
            ldsm4(a, row + ((((uint32_t)ks * 2 + a_hi) ^ a_sw) << 4));
            mma16816(acc[i][ks], a[0], a[1], a[2], a[3], b[ks][0], b[ks][1]);
          }
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(&s_ring_empty[slot]));  // the warp has read the stage
    if ((q0 + tl.bps) % tl.kb == 0 && box0 < tl.bps) {  // the row block's last stage: its sums
      const int rb = q0 / tl.kb;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (i < ng) {
          float c[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            c[e] = (acc[i][0][e] + acc[i][1][e]) + (acc[i][2][e] + acc[i][3][e]);
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) acc[i][ks][e] = 0.f;
          }
          // c0, c1: row r, tokens 2t, 2t + 1; c2, c3: row r + 8
          const int r = rb * tl.rbox + (g0 + i * RING_CW) * 16 + gid;
          if (o.out_s != nullptr) {
            red_shared(o.out_s + r * 8 + 2 * t, c[0]);
            red_shared(o.out_s + r * 8 + 2 * t + 1, c[1]);
            red_shared(o.out_s + (r + 8) * 8 + 2 * t, c[2]);
            red_shared(o.out_s + (r + 8) * 8 + 2 * t + 1, c[3]);
          } else {
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
  }
}

// The ring's GEMV of a task (gemv_op in ring mode, in place of gemv): out_s[r * 8 + n] with the
// staging and the RMSNorm factor as gemv_mma. All threads; ends with __syncthreads().
__device__ __noinline__ void gemv_ring(const Params& p, const RingPlan& pl, const ActSrc& act, bf16* act_s,
                                       float* out_s, bool staged) {
  const int warp = threadIdx.x / 32;
  const RingTile& t0 = pl.t[0];
  const int klen = t0.klen;
  const uint32_t item0 = s_ring_cons;
  act_s = shared(act_s);
  out_s = shared(out_s);
  if (!staged) stage_rows(act_s, act, klen);
  for (int i = threadIdx.x; i < t0.nrows * 8; i += NT) out_s[i] = 0.f;
  __syncthreads();
  if (p.timeline && threadIdx.x == 0) tl_marks[0] = globaltimer();
  if (warp == RING_LOADER) {
    if ((threadIdx.x & 31) == 0) {
      ring_issue(p, pl, item0, ring_upto(pl, 0, item0));
    }
  } else if (warp < RING_CW) {
    if (t0.map)
      ring_consume_box(p, t0, item0, act_s, klen + ACT_PAD, BoxSink{out_s, nullptr, 0, 0, nullptr, nullptr});
    else
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
  (void)g;  // the plan rebuilds it (task_gemv), as the armer did
  RingPlan pl;
  if (!ring_plan(p, d, pl) || !pl.gemv) return false;
  gemv_ring(p, pl, act, act_s, out_s, staged);
  return true;
}

// op_moe_fused in ring mode: the down slice through the ring when its plan has it (then true), else
// nothing (false: the register slice). act [8][lds] bf16 (tokens >= nt zeros), published by a
// barrier; acc, wtok, btok as gemv_down_acc. All threads; ends with __syncthreads().
__device__ __noinline__ bool ring_slice_op(const Params& p, const int* d, const bf16* act, int lds, float* acc,
                                           const float* wtok, const int* btok, int nt) {
  RingPlan pl;
  if (!ring_plan(p, d, pl) || pl.n != (pl.gemv ? 2 : 1)) return false;
  const int ti = pl.n - 1;
  const RingTile& t = pl.t[ti];
  const int warp = threadIdx.x / 32;
  const uint32_t seq0 = s_ring_cons, item0 = seq0 - (uint32_t)(ti ? pl.t[0].stages : 0);
  if (warp == RING_LOADER) {
    if ((threadIdx.x & 31) == 0) {
      ring_issue(p, pl, item0, ring_upto(pl, ti, item0));
    }
  } else if (warp < RING_CW) {
    ring_consume_box(p, t, seq0, shared(const_cast<bf16*>(act)), lds, BoxSink{nullptr, acc, p.hidden, nt, wtok, btok});
  }
  __syncthreads();
  if (threadIdx.x == 0) s_ring_cons = seq0 + (uint32_t)t.stages;  // read after the next barrier
  __syncthreads();
  return true;
}

// Kernel start (thread 0, before the first barrier): the barriers and counters, the ring's address
// (base rounded up to MK_TMAP_SMEM_ALIGN: smem_bytes adds that much), the tensor-map table (layer_w's tail, mk_abi.h MK_TMAP_*; a table that is not there, or for another
// layer count, leaves every K-range tile on the register GEMV).
__device__ __forceinline__ void ring_init(const Params& p, uint32_t base) {
  for (int s = 0; s < RING_D; ++s) {
    mbar_init(smem_u32(&s_ring_full[s]), 1);
    mbar_init(smem_u32(&s_ring_empty[s]), RING_CW);
  }
  s_ring_issued = s_ring_cons = 0;
  s_ring_base = (base + MK_TMAP_SMEM_ALIGN - 1) & ~(uint32_t)(MK_TMAP_SMEM_ALIGN - 1);
  const size_t off = ((size_t)p.num_layers * MK_LW_COUNT * 8 + MK_TMAP_BYTES - 1) / MK_TMAP_BYTES * MK_TMAP_BYTES;
  const int* head = reinterpret_cast<const int*>(reinterpret_cast<const unsigned char*>(p.layer_w) + off);
  const bool on = head[MK_TH_MAGIC] == MK_TMAP_MAGIC && head[MK_TH_LAYERS] == p.num_layers;
  s_tmap = on ? reinterpret_cast<unsigned long long>(head) + MK_TMAP_BYTES : 0ull;
  for (int k = 0; k < MK_TMAP_KINDS; ++k) s_tmap_rows[k] = on ? head[MK_TH_ROWS0 + k] : 0;
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

}  // namespace mk
