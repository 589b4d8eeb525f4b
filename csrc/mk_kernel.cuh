// mk_kernel.cuh: the persistent decode megakernel. One block per SM walks its descriptor list
// (built by mkcode.backend.megakernel.schedule); each task prefetches its weights to L2, waits on
// its counters, runs, and signals. DRAIN tasks claim further tasks from work queues. The semantics
// of each opcode are those of mkcode.backend.megakernel.emulator_ops (the tests compare them).
#pragma once

#include "mk_device.cuh"

namespace mk {

// Shared-memory carve-up (dynamic smem), sized on the host by smem_bytes().
struct Smem {
  bf16* act;    // [8][klen + ACT_PAD]
  float* red;   // [RED_FLOATS]
  float* out;   // [OUT_FLOATS]
  float* misc;  // [NWARPS + 64]
  unsigned char* raw;
};

__device__ __forceinline__ Smem carve(unsigned char* base, const Params& p, int max_k) {
  Smem s;
  s.raw = base;
  s.act = reinterpret_cast<bf16*>(base);
  size_t off = (size_t)8 * (max_k + ACT_PAD) * sizeof(bf16);
  off = (off + 15) & ~(size_t)15;
  s.red = reinterpret_cast<float*>(base + off);
  off += RED_FLOATS * sizeof(float);
  s.out = reinterpret_cast<float*>(base + off);
  off += OUT_FLOATS * sizeof(float);
  s.misc = reinterpret_cast<float*>(base + off);
  return s;
}

// ---- indexing of the workspace (row strides are MK_MAX_TOKENS = 8) ----------------------------

struct View {
  const Params& p;
  __device__ View(const Params& pp) : p(pp) {}
  __device__ int B() const { return p.batch; }
  __device__ int H() const { return p.hidden; }
  __device__ int QW() const { return p.num_heads * p.head_dim; }
  __device__ int KVW() const { return p.num_kv_heads * p.head_dim; }
  __device__ float* x(int l) const { return (float*)p.x + (size_t)l * 8 * p.hidden; }
  __device__ float* q(int l) const { return (float*)p.q + (size_t)l * 8 * QW(); }
  __device__ float* attn_out(int l) const { return (float*)p.attn_out + (size_t)l * 8 * QW(); }
  __device__ float* dense_act(int l) const { return (float*)p.dense_act + (size_t)l * 8 * p.dense_inter; }
  __device__ float* rlogits(int l) const { return (float*)p.rlogits + (size_t)l * 8 * p.num_experts; }
  __device__ float* route_w(int l) const { return (float*)p.route_w + (size_t)l * 8 * p.top_k; }
  __device__ int* expert_tab(int l) const {
    return (int*)p.expert_tab + (size_t)l * p.num_experts * (2 + MK_MAX_TOKENS);
  }
  __device__ int* moe_info(int l) const { return (int*)p.moe_info + (size_t)l * 4; }
  __device__ float* moe_act(int l) const { return (float*)p.moe_act + (size_t)l * 8 * p.top_k * p.moe_inter; }
  // layer l's weight pointers (layer_w[l]: MK_LW_COUNT of them)
  __device__ const long long* lw_row(int l) const { return (const long long*)p.layer_w + (size_t)l * MK_LW_COUNT; }
  __device__ const bf16* lw(int l, int slot) const { return reinterpret_cast<const bf16*>(lw_row(l)[slot]); }
  __device__ int flags(int l) const { return ((const int*)p.layer_flags)[l]; }
  __device__ int page(int l, int b, int pos) const {
    return ((const int*)p.block_tables)[((size_t)l * p.batch + b) * p.max_pages + pos / 64];
  }
  __device__ long long position(int b) const { return ((const long long*)p.positions)[b]; }
  // the first position a query at `pos` sees on layer l (a sliding layer's window, else 0)
  __device__ long long first_visible(int l, long long pos) const {
    const long long lo = pos - p.sliding_window + 1;
    return (flags(l) & MK_LAYER_SLIDING) && lo > 0 ? lo : 0;
  }
  __device__ bf16* kv(int page, int which, int head, int slot) const {
    return (bf16*)p.kv_pool + ((((size_t)page * 2 + which) * p.num_kv_heads + head) * 64 + slot) * p.head_dim;
  }
  __device__ uint32_t* counter(int c) const { return (uint32_t*)p.counters + c; }
};

__device__ bool wait_task(const Params& p, const int* d, bool spin = true, int first = 0);

// A task's wait for its counters (thread 0, unless `ready`: all were satisfied at a first look; the
// block's barrier extends its ld.acquire to every thread), its end stamped in tl_wait for the
// timeline. False for every thread when the step was abandoned, no copy left in flight. first: the
// waits before it are already satisfied (a self-routing item waited for its first in moe_local_stage).
__device__ __forceinline__ bool block_wait(const Params& p, const int* d, int* flag, bool ready, int first = 0) {
  if (threadIdx.x == 0) {
    *flag = ready || wait_task(p, d, true, first);
    if (p.timeline) {
      tl_wait = globaltimer();
      tl_marks[0] = tl_marks[1] = 0;
    }
  }
  __syncthreads();
  if (!*flag) {
    cp_async_wait_all();
    return false;
  }
  return true;
}

}  // namespace mk

#include "mk_attn.cuh"  // the tensor-core attention (needs View and Smem)

namespace mk {

// Bytes of dynamic shared memory every op needs (the GEMV, attention and sampling regions overlap).
__host__ __device__ inline size_t base_smem_bytes(const Params& p, int max_k) {
  const size_t gemv = (((size_t)8 * (max_k + ACT_PAD) * 2 + 15) & ~(size_t)15) + RED_FLOATS * 4 +
                      OUT_FLOATS * 4 + (NWARPS + 64) * 4;
  const size_t attn = attn_smem(p.head_dim);
  // SAMPLE_ROW: per-warp histograms, totals, scratch, the compacted candidates (2048 of them)
  const size_t samp = (size_t)NWARPS * 256 * 4 + 256 * 4 + NWARPS * 4 + 32 * 4 + (size_t)2048 * 8;
  size_t need = gemv > attn ? gemv : attn;
  need = need > samp ? need : samp;
  return (need + 127) & ~(size_t)127;
}

__device__ __forceinline__ void rows_identity(int* rows, int B) {
  if (threadIdx.x < 8) rows[threadIdx.x] = (int)threadIdx.x < B ? (int)threadIdx.x : -1;
}

// ---- the weight tile of each GEMV task (one definition, for gemv_op) -------------------------------

// lw: the task's layer row of weight pointers (layer_w[l], or gemv_prologue's copy of it).
__device__ __forceinline__ bool task_gemv(const Params& p, const int* d, const long long* lw, Gemv& g) {
  View V(p);
  const int op = d[MK_F_OP];
  const int a0 = d[MK_F_A0], a1 = d[MK_F_A1], a2 = d[MK_F_A2], a3 = d[MK_F_A3];
  const int H = p.hidden;
  switch (op) {
    case MK_OP_QKV: {  // rows a0 .. a0 + a1 of [Wq; Wk; Wv], then (a3 > 0) rows a2 .. a2 + a3
      const int qw = V.QW(), kvw = V.KVW();
      auto row = [&](int r) {
        return r < qw          ? (const bf16*)lw[MK_LW_Q] + (size_t)r * H
               : r < qw + kvw ? (const bf16*)lw[MK_LW_K] + (size_t)(r - qw) * H
                               : (const bf16*)lw[MK_LW_V] + (size_t)(r - qw - kvw) * H;
      };
      const bf16* W = row(a0);
      g = Gemv{W, H, a3 > 0 ? row(a2) : W, H, a1, a1 + a3, H};
      return true;
    }
    case MK_OP_ROUTER: {  // read every step, small (E x H per layer): kept in L2 across steps
      const bf16* W = (const bf16*)lw[MK_LW_ROUTER] + (size_t)a0 * H;
      g = Gemv{W, H, W, H, a1, a1, H, true};
      return true;
    }
    case MK_OP_DENSE_UP: {
      const bf16* Wg = (const bf16*)lw[MK_LW_GATE] + (size_t)a0 * H;
      const bf16* Wu = (const bf16*)lw[MK_LW_UP] + (size_t)a0 * H;
      g = Gemv{Wg, H, Wu, H, a1, 2 * a1, H};
      return true;
    }
    case MK_OP_OPROJ: {
      const bf16* W = (const bf16*)lw[MK_LW_O] + (size_t)a0 * V.QW() + a2;
      g = Gemv{W, V.QW(), W, V.QW(), a1, a1, a3 - a2};
      return true;
    }
    case MK_OP_DENSE_DOWN: {
      const bf16* W = (const bf16*)lw[MK_LW_DOWN] + (size_t)a0 * p.dense_inter + a2;
      g = Gemv{W, p.dense_inter, W, p.dense_inter, a1, a1, a3 - a2};
      return true;
    }
    case MK_OP_LM_HEAD: {
      const bf16* W = (const bf16*)p.lm_head + (size_t)a0 * H;
      g = Gemv{W, H, W, H, a1, a1, H};
      return true;
    }
    case MK_OP_MOE_UP:       // A0 expert, A1 first column, A2 columns
    case MK_OP_MOE_FUSED: {  // (its up tile; the down slice follows in op_moe_fused)
      const int I = p.moe_inter;
      const bf16* gu = (const bf16*)lw[MK_LW_EXP_GATE_UP] + (size_t)a0 * 2 * I * H;
      g = Gemv{gu + (size_t)a1 * H, H, gu + (size_t)(I + a1) * H, H, a2, 2 * a2, H};
      return true;
    }
    case MK_OP_MOE_DOWN: {  // A0 expert, A1 first hidden row, A2 rows; all of the expert's columns
      const int I = p.moe_inter;
      const bf16* W = (const bf16*)lw[MK_LW_EXP_DOWN] + ((size_t)a0 * H + a1) * I;
      g = Gemv{W, I, W, I, a2, a2, I};
      return true;
    }
    default:
      return false;
  }
}

// A MoE down item's activation rows: its tokens' top-k slots (rows of moe_act).
__device__ void moe_rows(const int* d, int* rows) {
  if (threadIdx.x < 8) {
    const int j = threadIdx.x;
    rows[j] = j < d[MK_F_NTOK] ? d[MK_F_SLOT0 + j] : -1;
  }
}

// ---- the GEMV ops' common part ----------------------------------------------------------------------
//
// Every GEMV op (QKV, O-proj, dense up / down, router, MoE up / down, LM head) runs this one piece
// of code before its GEMV: its weight tile (task_gemv's runtime switch), its activation source,
// rows and K offset, the staging, the GEMV; then run_task runs the op's own epilogue (op_qkv etc.),
// which reads s.out. Out of line, so there is one copy of it (run_task is inlined twice: static
// tasks and queue items) instead of an inlined copy per op and call site; it reads Params from
// s_params (run_task passes it). Measured 2026-11-30: the step kernel's stack frame 592 -> 272 B, its spill
// stores 1216 -> 232 B, its code 263 -> 164 KB; step time unchanged (docs/MEGAKERNEL.md).
__device__ __forceinline__ bool is_gemv_op(int op) {
  return op == MK_OP_QKV || op == MK_OP_OPROJ || op == MK_OP_DENSE_UP || op == MK_OP_DENSE_DOWN ||
         op == MK_OP_ROUTER || op == MK_OP_MOE_UP || op == MK_OP_MOE_DOWN || op == MK_OP_LM_HEAD ||
         op == MK_OP_MOE_FUSED;
}

// The activations of a GEMV over h(l) = RMSNorm(x(l)) (l = num_layers: the LM head's, after the
// final norm): x(l)'s rows, which the staging norms with the layer's weights. gemv_op and a MoE
// drain's staging (drain_stage_h) take it from here.
// lw: layer l's weight pointers (View::lw_row, or gemv_prologue's copy; unread for the LM head's).
__device__ __forceinline__ ActSrc h_rows(const Params& p, int l, const int* rows, const long long* lw) {
  View V(p);
  const bf16* w = l < p.num_layers ? (const bf16*)lw[MK_LW_NORM] : (const bf16*)p.final_norm;
  return ActSrc{V.x(l), p.hidden, rows, 0, w, p.rms_eps};
}

// A router tile's share of the residual's columns, [router_share(.., 0), router_share(.., 1)): the
// columns of x(l) it copies into x(l+1), the layer's initialiser (the tiling keeps them whole float4s).
__device__ __forceinline__ int router_share(const Params& p, const int* d, int end) {
  return (d[MK_F_A0] + end * d[MK_F_A1]) * p.hidden / p.num_experts;
}

// Before a GEMV task's wait (gemv_prologue, warps 1-: thread 0 polls): layer_w[l] (the layer's
// weight pointers) into shared memory, so that after the wait the tile's and the norm's pointers are
// shared-memory reads, not an L2 round trip ahead of the activation loads (the wait's acquire leaves
// nothing in L1). Written before run_task's barriers, read in gemv_op. (H100, BS 1: -0.8 to -1.1 %.)
__shared__ long long s_lw[MK_LW_COUNT];

__device__ __forceinline__ void gemv_prologue(const Params& p, const int* d) {
  const int l = d[MK_F_LAYER], i = (int)threadIdx.x - 32;
  if (l < p.num_layers && i >= 0 && i < MK_LW_COUNT) s_lw[i] = View(p).lw_row(l)[i];
}

__device__ __noinline__ void gemv_op(const Params& p, const int* d, Smem& s, int* rows) {
  View V(p);
  const int op = d[MK_F_OP], l = d[MK_F_LAYER];
  const long long* lw = l < p.num_layers ? s_lw : nullptr;  // gemv_prologue's copy (the LM head: none)
  ActSrc a = h_rows(p, op == MK_OP_LM_HEAD ? p.num_layers : l, rows, lw);  // every GEMV over h, else below
  bool slots = false;  // the rows: the batch rows in order, or (MoE down) the item's token slots
  bool staged = false;
  if (op == MK_OP_OPROJ) {
    a = ActSrc{V.attn_out(l), V.QW(), rows, d[MK_F_A2]};
  } else if (op == MK_OP_DENSE_DOWN) {
    a = ActSrc{V.dense_act(l), p.dense_inter, rows, d[MK_F_A2]};
  } else if (op == MK_OP_ROUTER && d[MK_F_LROW] == 0) {  // its share of the residual, into x(l+1)
    a.copy = V.x(l + 1);
    a.copy_lo = router_share(p, d, 0);
    a.copy_hi = router_share(p, d, 1);
  } else if (op == MK_OP_MOE_UP || op == MK_OP_MOE_FUSED) {
    // all batch rows of h(l), staged once per layer and SM and reused (s_h_staged)
    staged = s_h_staged == l;
  } else if (op == MK_OP_MOE_DOWN) {
    a = ActSrc{V.moe_act(l), p.moe_inter, rows, 0};
    slots = true;
  } else if (op == MK_OP_LM_HEAD) {  // the final norm's rows, staged by this SM's first LM tile
    staged = s_h_staged == p.num_layers;
  }
  if (!staged) {
    if (slots)
      moe_rows(d, rows);
    else
      rows_identity(rows, p.batch);
    __syncthreads();
  }
  Gemv g;
  task_gemv(p, d, lw, g);
  gemv(p, g, a, s.act, s.red, s.out, staged);
}

// ---- ops -------------------------------------------------------------------------------------------

__device__ __noinline__ void op_embed(const Params& p, const int* d) {
  View V(p);
  const int b = d[MK_F_A0];
  const long long tok = ((const long long*)p.token_ids)[b];
  const bf16* e = (const bf16*)p.embed + (size_t)tok * p.hidden;
  // MK_EMBED_RESET_HEADS (Tiling.attn_in_moe = 3): every layer's MoE queue head, before the signal
  // that every drain of the step waits behind (mk_abi.h)
  if (d[MK_F_A1] == MK_EMBED_RESET_HEADS && p.num_experts > 0)
    for (int l = threadIdx.x; l < p.num_layers; l += NT) atomicExch(V.counter(p.dyn_base + l * (p.num_experts + 1)), 0u);
  // x(0); a dense layer 0's sum x(1) starts at its residual (EMBED is its initialiser). The GEMVs
  // over h(0) norm x(0) themselves.
  float* x = V.x(0) + (size_t)b * p.hidden;
  float* x1 = (V.flags(0) & MK_LAYER_DENSE) ? V.x(1) + (size_t)b * p.hidden : nullptr;
  for (int i = threadIdx.x; i < p.hidden; i += NT) {
    const float v = __bfloat162float(e[i]);
    x[i] = v;
    if (x1) x1[i] = v;
  }
}

// Before the wait (run_task): the layer's flags, each row's position and its new K/V row's page.
__device__ __noinline__ void qkv_prologue(const Params& p, const int* d) {
  View V(p);
  const int l = d[MK_F_LAYER];
  if (threadIdx.x == 0) s_qkv.flags = V.flags(l);
  if ((int)threadIdx.x < p.batch) {
    const int b = threadIdx.x;
    const long long pos = V.position(b);
    s_qkv.pos[b] = pos;
    s_qkv.page[b] = V.page(l, b, (int)pos);
  }
}

// The QKV tile's epilogue (its facts from qkv_prologue): RoPE on Q and K, Q to q(l), K / V rows into
// the KV cache at each row's position. Its rows: A1 rows from A0 of [Wq; Wk; Wv], then A3 from A2
// (Tiling.attn_group: a share of a head's Q rows, then of its K or V rows); each range even.
// dry: a warm-up run (no global write; see warmable).
__device__ void op_qkv(const Params& p, const int* d, Smem& s, bool dry) {
  View V(p);
  const int l = d[MK_F_LAYER], n0 = d[MK_F_A1], n = n0 + d[MK_F_A3];
  const int qw = V.QW(), kvw = V.KVW(), hd = p.head_dim;
  for (int i = threadIdx.x; i < (n / 2) * p.batch; i += NT) {
    const int b = i % p.batch, r = (i / p.batch) * 2;
    const int row = r < n0 ? d[MK_F_A0] + r : d[MK_F_A2] + (r - n0);  // of [Wq; Wk; Wv]: even
    const int kind = row < qw ? 0 : row < qw + kvw ? 1 : 2;
    const int col = row - (kind == 0 ? 0 : kind == 1 ? qw : qw + kvw);  // in Q, K or V
    const bool rope = (s_qkv.flags & MK_LAYER_ROPE) && kind != 2;
    float v0 = s.out[r * 8 + b], v1 = s.out[(r + 1) * 8 + b];
    const long long pos = s_qkv.pos[b];
    if (rope) {
      const int pair = (col % hd) / 2;
      const float inv = 1.0f / powf(p.rope_theta, (float)(2 * pair) / (float)hd);
      const float ang = (float)pos * inv;
      float sn, cs;
      sincosf(ang, &sn, &cs);
      const float a = v0 * cs - v1 * sn, c = v0 * sn + v1 * cs;
      v0 = a;
      v1 = c;
    }
    if (dry) continue;
    if (kind == 0) {
      float* q = V.q(l) + (size_t)b * qw + col;
      q[0] = v0;
      q[1] = v1;
    } else {
      bf16* dst = V.kv(s_qkv.page[b], kind - 1, col / hd, (int)(pos % 64)) + col % hd;
      *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
    }
  }
}

// out = sum_s w_s o_s with w_s = exp(lse_s - max) / sum: the weights of the (row, kv head)'s G
// heads are computed once into shared memory (a warp per head), then every output element sums its
// S partials in split order. Its loads are one round trip: each thread first issues the split
// outputs of its (up to) two output elements for the first COMBINE_PRE splits (they do not depend
// on the weights), then the warps load the lse values, one per lane and split, and keep them in
// registers for the max and the exponentials (loaded again, they were a second L2 round trip on
// the attention chain; the split outputs, loaded after the barrier, a third).
// dry: a warm-up run (no global writes; see warmable).
constexpr int COMBINE_PRE = 16;

__device__ __noinline__ void attn_combine_at(const Params& p, int l, int b, int kvh, int S, Smem& s, bool dry) {
  View V(p);
  const int hd = p.head_dim, G = p.num_heads / p.num_kv_heads, MS = p.max_splits;
  const float* o_base = (const float*)p.o_part + ((((size_t)l * 8 + b) * p.num_heads + kvh * G) * MS) * hd;
  const float* lse_base = (const float*)p.lse_part + (((size_t)l * 8 + b) * p.num_heads + kvh * G) * MS;
  float* out = V.attn_out(l) + (size_t)b * V.QW() + (size_t)kvh * G * hd;
  float* wts = shared(s.out);  // [G][S] (<= OUT_FLOATS floats: G <= 64, S <= 32)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_out = G * hd;
  // output i: head i / hd, dimension i % hd; split sp's value at src(i) + sp * hd
  auto src = [&](int i) { return o_base + (size_t)(i / hd) * MS * hd + i % hd; };
  const int i0 = threadIdx.x, i1 = threadIdx.x + NT;
  const float* s0 = src(i0 < n_out ? i0 : 0);
  const float* s1 = src(i1 < n_out ? i1 : 0);
  float x0[COMBINE_PRE], x1[COMBINE_PRE];
#pragma unroll
  for (int u = 0; u < COMBINE_PRE; ++u) x0[u] = ld_cg_if(s0 + (size_t)u * hd, i0 < n_out && u < S);
#pragma unroll
  for (int u = 0; u < COMBINE_PRE; ++u) x1[u] = ld_cg_if(s1 + (size_t)u * hd, i1 < n_out && u < S);
  for (int hq = warp; hq < G; hq += NWARPS) {
    const float* lse = lse_base + hq * MS;
    const float v0 = ld_cg_if(lse + lane, lane < S);  // S <= 32: all of them (more: the loops below)
    float m = lane < S ? v0 : -INFINITY;
    for (int sp = lane + 32; sp < S; sp += 32) m = fmaxf(m, ld_cg(lse + sp));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float den = 0.f;
    if (lane < S) {
      const float e = expf(v0 - m);  // 0 for an empty split
      wts[hq * S + lane] = e;
      den += e;
    }
    for (int sp = lane + 32; sp < S; sp += 32) {
      const float e = expf(ld_cg(lse + sp) - m);
      wts[hq * S + sp] = e;
      den += e;
    }
    for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
    __syncwarp();
    for (int sp = lane; sp < S; sp += 32) wts[hq * S + sp] /= den;
  }
  __syncthreads();
  auto finish = [&](int i, const float* x) {  // output i from its preloaded splits and the rest
    const float* wr = wts + (i / hd) * S;
    const float* sp_src = src(i);
    float acc = 0.f;
#pragma unroll
    for (int u = 0; u < COMBINE_PRE; ++u)
      if (u < S) acc += wr[u] * x[u];
    for (int sp = COMBINE_PRE; sp < S; ++sp) acc += wr[sp] * ld_cg(sp_src + (size_t)sp * hd);
    if (!dry) out[i] = acc;
  };
  if (i0 < n_out) finish(i0, x0);
  if (i1 < n_out) finish(i1, x1);
  for (int i = threadIdx.x + 2 * NT; i < n_out; i += NT) {  // geometries with more than 2 x NT outputs
    const float* wr = wts + (i / hd) * S;
    float acc = 0.f;
    for (int sp = 0; sp < S; ++sp) acc += wr[sp] * ld_cg(src(i) + (size_t)sp * hd);
    if (!dry) out[i] = acc;
  }
}

// ATTN_COMBINE's descriptor: A0 row, A1 kv head, A2 splits
__device__ __forceinline__ void op_attn_combine(const Params& p, const int* d, Smem& s, bool dry) {
  attn_combine_at(p, d[MK_F_LAYER], d[MK_F_A0], d[MK_F_A1], d[MK_F_A2], s, dry);
}

// A GEMV's rows r0 .. r0 + n of its nt token columns added into the layer's sum x(l+1)
// (fp32 red.global.add): column j goes to batch row j (slots null) or to row slots[j] / K, weighted
// by rw[j]. Out of line (O-proj, dense down and MoE down call it), so that the step kernel, which
// inlines those epilogues twice, does not grow.
__device__ __noinline__ void add_into_sum(float* acc, const float* out, int n, int r0, int nt, int H, const int* slots,
                                          const float* rw, int K) {
  out = shared(const_cast<float*>(out));
  for (int i = threadIdx.x; i < n * nt; i += NT) {
    const int r = i % n, j = i / n;
    const int b = slots ? slots[j] / K : j;
    red_add_global(acc + (size_t)b * H + r0 + r, (rw ? rw[j] : 1.f) * out[r * 8 + j]);
  }
}

// added into the layer's sum x(l+1)
__device__ __noinline__ void op_oproj(const Params& p, const int* d, Smem& s) {
  View V(p);
  const int l = d[MK_F_LAYER], r0 = d[MK_F_A0], n = d[MK_F_A1];
  add_into_sum(V.x(l + 1), s.out, n, r0, p.batch, p.hidden, nullptr, nullptr, 0);
}

__device__ void op_dense_up(const Params& p, const int* d, Smem& s) {
  View V(p);
  const int l = d[MK_F_LAYER], c0 = d[MK_F_A0], n = d[MK_F_A1];
  float* dst = V.dense_act(l);
  for (int i = threadIdx.x; i < n * p.batch; i += NT) {
    const int r = i % n, b = i / n;
    dst[(size_t)b * p.dense_inter + c0 + r] = silu(s.out[r * 8 + b]) * s.out[(n + r) * 8 + b];
  }
}

// added into the layer's sum x(l+1)
__device__ __noinline__ void op_dense_down(const Params& p, const int* d, Smem& s) {
  View V(p);
  const int l = d[MK_F_LAYER], r0 = d[MK_F_A0], n = d[MK_F_A1];
  add_into_sum(V.x(l + 1), s.out, n, r0, p.batch, p.hidden, nullptr, nullptr, 0);
}

// Batch row b's logits into rlogits row b + LROW (Tiling.moe_group: a group's row). Its GEMV staged
// h(l)'s batch rows (gemv_op, as a MoE drain's drain_stage_h): kept for the SM's next task.
__device__ void op_router(const Params& p, const int* d, Smem& s) {
  View V(p);
  const int l = d[MK_F_LAYER], e0 = d[MK_F_A0], n = d[MK_F_A1];
  float* dst = V.rlogits(l) + (size_t)d[MK_F_LROW] * p.num_experts;
  for (int i = threadIdx.x; i < n * p.batch; i += NT) {
    const int r = i % n, b = i / n;
    dst[(size_t)b * p.num_experts + e0 + r] = s.out[r * 8 + b];
  }
  if (threadIdx.x == 0) s_h_staged = l;  // read after run_task's closing barrier
}

// Order-preserving uint32 key of an fp32 value.
__device__ __forceinline__ uint32_t fkey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// ROUTE's experts per lane at most: E <= 32 * ROUTE_J (tiling.py keeps E <= 384).
constexpr int ROUTE_J = 12;

constexpr int ETAB_STRIDE = 2 + MK_MAX_TOKENS;  // an expert-table row: expert, tokens, slots

// Row `row`'s top-k by one warp (all 32 lanes; E <= 32 * J logits in shared memory, NaN already
// made -inf): lane r < K returns the expert of rank r, ties to the lower id. Its lanes hold the
// keys of experts lane + 32 j in registers and each of the K rounds is one warp max and one warp
// min (the order of a sequential arg-max). ROUTE and a self-routing fused item (MK_MOE_LOCAL) share it.
template <int J>
__device__ __forceinline__ int warp_topk(const float* row, int E, int K, int lane) {
  uint32_t key[J];  // key 0, below every float's key, marks a taken or absent expert
#pragma unroll
  for (int j = 0; j < J; ++j) key[j] = lane + 32 * j < E ? fkey(row[lane + 32 * j]) : 0u;
  int my_e = -1;  // lane r < K: the expert of rank r
  for (int r = 0; r < K; ++r) {
    uint32_t mine = 0;
    int mj = 0;
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (key[j] > mine) {  // strictly greater: ties keep the lower id
        mine = key[j];
        mj = j;
      }
    const uint32_t top = __reduce_max_sync(0xffffffffu, mine);
    const uint32_t e = __reduce_min_sync(0xffffffffu, mine == top ? (uint32_t)(lane + 32 * mj) : 0xffffffffu);
    if (lane == r) my_e = (int)e;
    if (mine == top && (uint32_t)(lane + 32 * mj) == e) {  // the winner: take it
#pragma unroll
      for (int j = 0; j < J; ++j)
        if (j == mj) key[j] = 0u;
    }
  }
  return my_e;
}

// The routing weight of lane r < K's expert (warp_topk's my_e) over the row's K winners: softmax,
// or sigmoid (normalised over the K with norm_topk). All 32 lanes.
__device__ __forceinline__ float warp_topk_weight(const Params& p, const float* row, int my_e, int K, int lane) {
  const float v = lane < K ? row[my_e] : 0.f;
  const float m = __shfl_sync(0xffffffffu, v, 0);  // rank 0: the largest
  float w = 0.f;
  if (lane < K) w = p.selection_sigmoid ? 1.f / (1.f + expf(-v)) : expf(v - m);
  float sum = w;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (!p.selection_sigmoid || p.norm_topk) w /= sum;
  return w;
}

// Top-k per row (ties to the lower expert id), routing weights, the expert table (experts
// ascending, slots b*k+j ascending). Top-k by warp arg-maxes (warp_topk): warp b takes row b (J =
// ceil(E / 32), a template constant: 4 at E = 128); lane r < K ORs bit b into its expert's row mask.
// The routing weights come from the K winners in the same warp (a warp sum). The table needs no
// counting loops: an expert's table position is the number of chosen experts below it (warp
// ballots over the row masks), its token count the mask's popcount, and slot (b, j)'s place among
// the expert's slots the number of earlier rows in its mask (a row chooses an expert at most once).
// Three block barriers in all (2026-11-30: the previous version counted every slot's rank against
// all earlier slots and scanned 12 keys per lane per round; ROUTE took ~5 us at BS 1 and ~7 us at
// BS 8, and ~10 us per drain when every MoE drain routed itself).
// dry: a warm-up run (no global writes; see warmable).
// Garbage logits are harmless: NaN becomes -inf, so the chosen experts are K distinct valid indices.
template <int J>
__device__ void route_impl(const Params& p, int l, Smem& s, bool dry) {
  View V(p);
  const int E = p.num_experts, K = p.top_k, B = p.batch, BK = B * K;
  float* lg = shared(s.out);                                      // [B][E]
  int* fid = reinterpret_cast<int*>(s.out + 8 * E);               // [B*K] expert of slot b*K + j
  unsigned* rmask = reinterpret_cast<unsigned*>(fid + 8 * MK_MAX_TOKENS);  // [E] rows choosing e
  int* pos_s = reinterpret_cast<int*>(rmask + E);                 // [E] table position of each expert
  int* wcnt = pos_s + E;                                          // [NWARPS] chosen experts per warp
  // rows of E logits, contiguous: every load issued before the first is used (one round trip on
  // the MoE chain; as a loop each load was stored to shared memory before the next was issued, two
  // round trips at BS 8); B * E <= 8 * 32 * J
  constexpr int PER = (MK_MAX_TOKENS * 32 * J + NT - 1) / NT;
  float v[PER];
#pragma unroll
  for (int u = 0; u < PER; ++u) v[u] = ld_cg_if(V.rlogits(l) + threadIdx.x + u * NT, threadIdx.x + u * NT < B * E);
#pragma unroll
  for (int u = 0; u < PER; ++u)
    if (threadIdx.x + u * NT < B * E)
      lg[threadIdx.x + u * NT] = isnan(v[u]) ? -INFINITY : v[u];  // a total order: K distinct experts below
  for (int e = threadIdx.x; e < E; e += NT) rmask[e] = 0u;
  __syncthreads();
  if (p.timeline && threadIdx.x == 0) tl_marks[0] = globaltimer();  // timeline: logits loaded
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < B) {
    const int b = warp;
    const float* row = lg + b * E;
    const int my_e = warp_topk<J>(row, E, K, lane);
    if (lane < K) atomicOr(&rmask[my_e], 1u << b);
    const float w = warp_topk_weight(p, row, my_e, K, lane);
    if (lane < K) {
      fid[b * K + lane] = my_e;
      if (!dry) V.route_w(l)[b * K + lane] = w;
    }
  }
  __syncthreads();
  if (p.timeline && threadIdx.x == 0) tl_marks[1] = globaltimer();  // timeline: top-k done
  // table positions: chosen experts below e (E <= 384 < NT: one thread per expert)
  const bool chosen = (int)threadIdx.x < E && rmask[threadIdx.x < E ? threadIdx.x : 0] != 0u;
  const unsigned bal = __ballot_sync(0xffffffffu, chosen);
  if (lane == 0) wcnt[warp] = __popc(bal);
  __syncthreads();
  if ((int)threadIdx.x < E) {
    int at = __popc(bal & ((1u << lane) - 1u));
    for (int w2 = 0; w2 < warp; ++w2) at += wcnt[w2];
    pos_s[threadIdx.x] = at;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < BK; i += NT) {  // slot i = b*K + j: its place among its expert's slots
    const int e = fid[i], b = i / K;
    const unsigned msk = rmask[e];
    const int rank = __popc(msk & ((1u << b) - 1u));
    if (dry) continue;
    int* row = V.expert_tab(l) + (size_t)pos_s[e] * ETAB_STRIDE;
    row[2 + rank] = i;
    if (rank == 0) {
      row[0] = e;
      row[1] = __popc(msk);
    }
  }
  if (dry) return;
  if (threadIdx.x == 0) {
    int n_act = 0;  // chosen experts
    for (int w2 = 0; w2 < NWARPS; ++w2) n_act += wcnt[w2];
    V.moe_info(l)[0] = n_act;
    V.moe_info(l)[1] = n_act * (p.moe_up_tiles + p.moe_down_tiles);
  }
}

// One instance per key-register count, so the common E <= 128 scans 4 keys per lane per round.
__device__ __noinline__ void op_route(const Params& p, int l, Smem& s, bool dry) {
  if (p.num_experts <= 128)
    route_impl<4>(p, l, s, dry);
  else
    route_impl<ROUTE_J>(p, l, s, dry);
}

// A fused item that routes itself (Tiling.moe_local, mk_abi.h MK_MOE_LOCAL).
__device__ __forceinline__ bool moe_local(const int* d) {
  return d[MK_F_OP] == MK_OP_MOE_FUSED && d[MK_F_A3] == MK_MOE_LOCAL;
}

// Tiling.moe_local (mk_abi.h MK_MOE_LOCAL), after the router tiles' wait: rank row 0's logits (in
// rlogits row LROW: Tiling.moe_group's group row) as ROUTE does (warp_topk, warp_topk_weight) and
// make this item one of the expert of rank A0: that
// expert into its descriptor's A0 (the SM's own copy in shared memory, which task_gemv and
// op_moe_fused read) and its routing weight into s_rw[0]. The logits go through s.out, free until
// the GEMV; the staged h rows (s.act) and their norm sums stay. Nothing on the device reads the
// expert table, route_w or moe_info in this mode; the rank's first tile writes them for the host.
template <int J>
__device__ void moe_local_route_impl(const Params& p, int* d, Smem& s) {
  View V(p);
  const int E = p.num_experts, K = p.top_k, rank = d[MK_F_A0];
  float* lg = shared(s.out);
  const float* src = V.rlogits(d[MK_F_LAYER]) + (size_t)d[MK_F_LROW] * E;  // its group's row
  for (int e = threadIdx.x; e < E; e += NT) {
    const float v = __ldcg(src + e);
    lg[e] = isnan(v) ? -INFINITY : v;  // as ROUTE: a total order, K distinct experts
  }
  __syncthreads();  // also: every thread has read A0 before it changes below
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int my_e = warp_topk<J>(lg, E, K, lane);
    const float w = warp_topk_weight(p, lg, my_e, K, lane);
    if (lane == rank) {
      d[MK_F_A0] = my_e;
      s_rw[0] = w;
    }
    if (d[MK_F_A1] == 0) {  // the rank's first column tile records the routing as ROUTE would
      // (the expert table, route_w, moe_info): what the tests and the benches read back
      const int l = d[MK_F_LAYER], e_r = __shfl_sync(0xffffffffu, my_e, rank);
      const int at = __popc(__ballot_sync(0xffffffffu, lane < K && my_e < e_r));  // experts ascending
      if (lane == rank) {
        int* row = V.expert_tab(l) + (size_t)at * ETAB_STRIDE;
        row[0] = my_e;
        row[1] = 1;
        row[2] = rank;  // slot b * K + j of row 0
        V.route_w(l)[rank] = w;
      }
      if (rank == 0 && lane == 0) {
        V.moe_info(l)[0] = K;
        V.moe_info(l)[1] = K * p.moe_up_tiles;
      }
    }
  }
  __syncthreads();
}

__device__ __noinline__ void moe_local_route(const Params& p, int* d, Smem& s) {
  if (p.num_experts <= 128)
    moe_local_route_impl<4>(p, d, s);
  else
    moe_local_route_impl<ROUTE_J>(p, d, s);
}

// Before ROUTE's dependency wait: reset the layer's dynamic counters (its MoE queue head and the
// per-expert up counts). Nothing reads them in this step before ROUTE signals route[l] (the drains
// wait for it), the previous step is over, and that signal's release orders these writes before it;
// done here, their round trip is off the layer's chain.
__device__ void route_prologue(const Params& p, const int* d) {
  View V(p);
  const int l = d[MK_F_LAYER], E = p.num_experts;
  // MK_ROUTE_KEEP_HEAD (Tiling.attn_in_moe = 3): the queue head is claimed before ROUTE and was
  // reset by the EMBED of row 0; only the per-expert counts are ours
  const int e0 = d[MK_F_A0] == MK_ROUTE_KEEP_HEAD ? 1 : 0;
  for (int e = e0 + threadIdx.x; e <= E; e += NT) atomicExch(V.counter(p.dyn_base + l * (E + 1) + e), 0u);
}

// The up item's epilogue: silu(gate) * up of its tokens' columns into moe_act. Its GEMV (gemv_op)
// took all the batch rows of h(l) (token column b = the row: the mma computes 8 columns either
// way), staged once per layer on an SM and reused by its next up items (s_h_staged).
__device__ void op_moe_up(const Params& p, const int* d, Smem& s) {
  View V(p);
  const int l = d[MK_F_LAYER], c0 = d[MK_F_A1], n = d[MK_F_A2];
  const int I = p.moe_inter, K = p.top_k;
  if (threadIdx.x == 0) s_h_staged = l;  // read after run_task's closing barrier
  const int nt = d[MK_F_NTOK];
  float* dst = V.moe_act(l);
  for (int i = threadIdx.x; i < n * nt; i += NT) {
    const int r = i % n, j = i / n, slot = d[MK_F_SLOT0 + j];
    const int col = slot / K;
    dst[(size_t)slot * I + c0 + r] = silu(s.out[r * 8 + col]) * s.out[(n + r) * 8 + col];
  }
}

// Before a MoE down or fused item's GEMV (run_task, before its wait): its tokens' routing weights
// into s_rw and, for a fused item, the layer's down-weight pointer into s_wdown, by cp.async (.ca:
// ROUTE wrote the weights this step and the drain acquired route[l] before building the item, which
// emptied L1). The op waits for them (cp_async_wait_all) and a barrier publishes them.
__device__ __noinline__ void moe_prologue(const Params& p, const int* d) {
  View V(p);
  const int l = d[MK_F_LAYER];
  // a self-routing item (MK_MOE_LOCAL) gets its weight from moe_local_route; ROUTE wrote the others'
  if ((int)threadIdx.x < d[MK_F_NTOK] && !moe_local(d))
    cp_async4_ca(&s_rw[threadIdx.x], V.route_w(l) + d[MK_F_SLOT0 + threadIdx.x]);
  if (threadIdx.x == 0 && d[MK_F_OP] == MK_OP_MOE_FUSED)
    cp_async8_ca(&s_wdown, (const long long*)p.layer_w + (size_t)l * MK_LW_COUNT + MK_LW_EXP_DOWN);
  cp_async_commit();
}

// added (weighted) into the layer's sum x(l+1), at each token's row
__device__ __noinline__ void op_moe_down(const Params& p, const int* d, Smem& s) {
  View V(p);
  const int l = d[MK_F_LAYER], r0 = d[MK_F_A1], n = d[MK_F_A2];
  const int nt = d[MK_F_NTOK];
  cp_async_wait_all();  // moe_prologue's routing weights
  __syncthreads();
  add_into_sum(V.x(l + 1), s.out, n, r0, nt, p.hidden, d + MK_F_SLOT0, s_rw, p.top_k);
}

// The rest of a fused MoE item (moe_fused) after its up GEMV (gemv_op, as an up item's): act =
// silu(gate) * up of its tokens and columns c0 .. c0 + n, bf16 in shared memory (over the staged h
// rows: s_h_staged is cleared), then the down slice W_down[e][:, c0 : c0 + n] for every hidden row,
// route_w * (W act) added into the layer's sum x(l+1) at each token's row (fp32 atomics). No
// per-expert counter and no down tiles: an expert's items are independent, the next layer waits for
// all (the mlp counter).
// A fused item's activations in shared memory: [8 tokens][n columns] bf16, rows 64 B apart mod 128
// (no bank conflicts).
__device__ __forceinline__ int fused_act_lds(int n) { return n + ((n / 32) % 2 ? 0 : 32); }

// The down slice W_down[e][:, c0 : c0 + n] of a fused item (s_wdown: moe_prologue's pointer).
__device__ __forceinline__ const bf16* fused_down_w(const Params& p, int e, int c0) {
  return reinterpret_cast<const bf16*>(s_wdown) + (size_t)e * p.hidden * p.moe_inter + c0;
}

// gemv_down_acc over the first nrows hidden rows of a slice of n columns (false: n is not one the
// kernel instantiates; the tiling keeps n 32, 64, 96, 128 or 256: 96 makes 8 items of an expert of
// 768 columns, 64 items at one row for Tiling.attn_group's 64 SMs beside them).
__device__ __forceinline__ bool fused_down(const Params& p, const bf16* Wd, int n, int nrows, const bf16* act,
                                           float* acc, const float* wtok, const int* btok, int nt) {
  const int I = p.moe_inter, H = p.hidden, lds = fused_act_lds(n);
  switch (n / 32) {
    case 1: gemv_down_acc<1>(Wd, I, nrows, act, lds, acc, H, wtok, btok, nt); return true;
    case 2: gemv_down_acc<2>(Wd, I, nrows, act, lds, acc, H, wtok, btok, nt); return true;
    case 3: gemv_down_acc<3>(Wd, I, nrows, act, lds, acc, H, wtok, btok, nt); return true;
    case 4: gemv_down_acc<4>(Wd, I, nrows, act, lds, acc, H, wtok, btok, nt); return true;
    case 8: gemv_down_acc<8>(Wd, I, nrows, act, lds, acc, H, wtok, btok, nt); return true;
    default: return false;
  }
}

__device__ __noinline__ void op_moe_fused(const Params& p, const int* d, Smem& s) {
  View V(p);
  __shared__ int s_b[MK_MAX_TOKENS];
  const int l = d[MK_F_LAYER], e = d[MK_F_A0], c0 = d[MK_F_A1], n = d[MK_F_A2];
  const int nt = d[MK_F_NTOK], K = p.top_k;
  if (threadIdx.x < MK_MAX_TOKENS && (int)threadIdx.x < nt) s_b[threadIdx.x] = d[MK_F_SLOT0 + threadIdx.x] / K;
  cp_async_wait_all();  // moe_prologue's routing weights (s_rw) and down-weight pointer (s_wdown)
  if (threadIdx.x == 0) s_h_staged = -1;  // the activations below overwrite the staged h rows
  bf16* act = shared(s.act);
  const int lds = fused_act_lds(n);
  for (int i = threadIdx.x; i < 8 * n; i += NT) {
    const int j = i / n, c = i - j * n;
    const int col = j < nt ? d[MK_F_SLOT0 + j] / K : j;  // token j's column of the up GEMV: its row
    const float v = j < nt ? silu(s.out[c * 8 + col]) * s.out[(n + c) * 8 + col] : 0.f;
    act[j * lds + c] = __float2bfloat16(v);
  }
  __syncthreads();
  if (!fused_down(p, fused_down_w(p, e, c0), n, p.hidden, act, V.x(l + 1), s_rw, s_b, nt) && threadIdx.x == 0)
    raise_error(p, MK_ERR_BAD_ARGS, d[MK_F_ID], MK_OP_MOE_FUSED, n, 0);
}

__device__ void op_lm_head(const Params& p, const int* d, Smem& s) {
  const int r0 = d[MK_F_A0], n = d[MK_F_A1], t = d[MK_F_A2];
  float* logits = (float*)p.logits;
  for (int i = threadIdx.x; i < n * p.batch; i += NT) {
    const int r = i % n, b = i / n;
    logits[(size_t)b * p.vocab + r0 + r] = s.out[r * 8 + b] * p.logit_scale;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < p.batch) {
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int r = lane; r < n; r += 32) {
      const float v = s.out[r * 8 + warp] * p.logit_scale;
      if (v > best || (v == best && r < bi)) {
        best = v;
        bi = r;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) {
        best = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      ((float*)p.lm_best)[(size_t)t * 8 + warp] = best;
      ((int*)p.lm_arg)[(size_t)t * 8 + warp] = r0 + bi;
    }
  }
  // the staged rows (and their norm sums) stay for this SM's next LM tile (gemv_op); read after
  // run_task's closing barrier, as op_moe_up's
  if (threadIdx.x == 0) s_h_staged = p.num_layers;
}

// ---- per-row sampling (semantics: mkcode.backend.megakernel.sampling) ----------------------------

__device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ float gumbel_noise(uint32_t rk, uint32_t tok) {
  const uint32_t bits = mix32(rk ^ mix32(tok + 0x632BE5ABu));
  const float u = ((float)(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
  return -logf(-logf(u));
}

// The row's candidates: the whole logits row in global memory (L2), or a compacted list in smem.
struct SampleSrc {
  const float* g;
  const int* ci;
  const float* cv;
  int n;
  __device__ __forceinline__ void at(int i, int& idx, float& l) const {
    if (ci) {
      idx = ci[i];
      l = cv[i];
    } else {
      idx = i;
      l = ld_cg(g + i);
    }
  }
};

constexpr int SAMPLE_CAP = 2048;  // compacted candidates kept in shared memory
// The noise g = -log(-log(u)) of gumbel_noise lies in [-2.812, 16.636] (u in [2^-24, 1 - 2^-24]), so
// the max token scores at least -2.812 and a token with (l - m) / T below -19.448 scores less than
// that whatever its noise: the Gumbel pass skips the noise (two logs and a hash) for tokens below
// GUMBEL_FLOOR (a margin under -19.448). The draw is the same. (Measured on a 262k row at T 0.8,
// Measured 2026-11-30: the draw costs ~170 us with or without it; most of a row lies above the floor there,
// and the loads and the division per token remain.)
constexpr float GUMBEL_FLOOR = -20.f;
constexpr int SELECT_BATCH = 8;   // logits per lane in flight in select_key's passes
constexpr unsigned FULL = 0xffffffffu;

// All 32 lanes: add w into this warp's private histogram at `bin` (bin < 0: nothing). Lanes with
// the same bin are summed with shuffles and one lane stores, so no atomics and no contention.
__device__ __forceinline__ void warp_hist_add(float* wh, int bin, float w) {
  const int lane = threadIdx.x % 32;
  unsigned pending = __ballot_sync(FULL, bin >= 0);
  while (pending) {
    const int src = __ffs(pending) - 1;
    const int lb = __shfl_sync(FULL, bin, src);
    const unsigned same = __ballot_sync(FULL, bin == lb);
    float v = bin == lb ? w : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    if (lane == src) wh[lb] += v;
    __syncwarp();  // the next round may update the same bin from another lane
    pending &= ~same;
  }
}

// Largest key v with sum(weight of {key >= floor_key, key >= v}) >= target, by four 8-bit radix
// passes (weights 1, or exp((l - m) / T) when `mass`); the smallest candidate key if rounding leaves
// no bin reaching the target. hist: NWARPS*256 floats, tot: 256 floats, sh: 2 words.
__device__ uint32_t select_key(const SampleSrc& src, uint32_t floor_key, bool mass, float m, float T, float target,
                               float* hist, float* tot, int* sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint32_t prefix = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int j = threadIdx.x; j < NWARPS * 256; j += NT) hist[j] = 0.f;
    __syncthreads();
    const uint32_t hmask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    float* wh = hist + warp * 256;
    // SELECT_BATCH elements per lane are loaded before any of them is binned: the binning is a
    // chain of warp shuffles, so one element per lane and iteration left one L2 latency per
    // iteration (~0.3-0.5 ms per pass over a 262k vocabulary, measured as top-p's +2 ms per step)
    for (int base = warp * 32 * SELECT_BATCH; base < src.n; base += NT * SELECT_BATCH) {  // warp-uniform
      float lv[SELECT_BATCH];
#pragma unroll
      for (int e = 0; e < SELECT_BATCH; ++e) {
        const int i = base + e * 32 + lane;
        int idx;
        lv[e] = 0.f;
        if (i < src.n) src.at(i, idx, lv[e]);
      }
#pragma unroll
      for (int e = 0; e < SELECT_BATCH; ++e) {
        int bin = -1;
        float w = 0.f;
        if (base + e * 32 + lane < src.n) {
          const uint32_t k = fkey(lv[e]);
          if (k >= floor_key && (k & hmask) == prefix) {
            bin = (int)((k >> shift) & 255u);
            w = mass ? expf((lv[e] - m) / T) : 1.f;
          }
        }
        warp_hist_add(wh, bin, w);
      }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < 256; j += NT) {
      float t = 0.f;
      for (int w = 0; w < NWARPS; ++w) t += hist[w * 256 + j];
      tot[j] = t;
    }
    __syncthreads();
    if (warp == 0) {  // lane owns bins 255-8*lane down to 248-8*lane; scan from the top
      float part = 0.f;
      for (int q = 0; q < 8; ++q) part += tot[255 - 8 * lane - q];
      float incl = part;
      for (int o = 1; o < 32; o <<= 1) {
        const float v = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += v;
      }
      const float excl = incl - part;
      const unsigned hit = __ballot_sync(FULL, incl >= target);
      const unsigned nonempty = __ballot_sync(FULL, part > 0.f);
      const int L = hit ? __ffs(hit) - 1 : (nonempty ? 31 - __clz(nonempty) : 0);
      if (lane == L) {
        float c = excl;
        int sel = -1, last = -1;
        float above = c, above_last = c;
        for (int q = 0; q < 8; ++q) {
          const int j = 255 - 8 * lane - q;
          if (hit && sel < 0 && c + tot[j] >= target) {
            sel = j;
            above = c;
          }
          if (tot[j] > 0.f) {  // the lowest non-empty bin so far
            last = j;
            above_last = c;
          }
          c += tot[j];
        }
        if (sel < 0) {  // no bin reaches the target (rounding): the lowest non-empty one
          sel = last >= 0 ? last : 255 - 8 * lane - 7;
          above = above_last;
        }
        sh[0] = sel;
        reinterpret_cast<float*>(sh)[1] = above;
      }
    }
    __syncthreads();
    prefix |= (uint32_t)sh[0] << shift;
    target -= reinterpret_cast<float*>(sh)[1];
    __syncthreads();
  }
  return prefix;
}

// Block-wide max (all threads get it). scratch: NWARPS floats.
__device__ float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < NWARPS; ++w) r = fmaxf(r, scratch[w]);
  __syncthreads();
  return r;
}

// (l - m) / scale: the one expression every pass of sample_candidates bins and compares (so that a
// token's membership in a range is decided the same way in each pass)
__device__ __forceinline__ float scaled_logit(float l, float m, float scale) {
  return __fdiv_rn(__fsub_rn(l, m), scale);
}

constexpr int CAND_BINS = 8;    // bins per pass of sample_candidates
constexpr int CAND_ROUNDS = 4;  // its binning passes at most (the range shrinks 8x per pass)
// its logits per thread in flight. A pass over a 262k row takes ~30-60 us on one SM, bound by the
// work per token more than by the loads (the row streamed through shared memory by cp.async was
// slower, 2026-11-30); 16-byte loads into registers changed the step kernel's code through
// op_sample_row (ptxas fits each call's convention to its callee), and the greedy step is what
// every request pays
constexpr int CAND_BATCH = 4;
constexpr float CAND_COUNT_RANGE = 64.f;  // top-k: the logits within this much of the max are binned

// f(i, l) for every token i of a logits row lg[V], N loads per thread in flight (each thread's
// tokens in the same order every pass). Inlined, with f's work, into its caller.
template <int N, class F>
__device__ __forceinline__ void row_pass(const float* lg, int V, F f) {
  for (int base = threadIdx.x; base < V; base += NT * N) {
    float lv[N];
#pragma unroll
    for (int e = 0; e < N; ++e) lv[e] = base + e * NT < V ? ld_cg(lg + base + e * NT) : 0.f;
#pragma unroll
    for (int e = 0; e < N; ++e)
      if (base + e * NT < V) f(base + e * NT, lv[e]);
  }
}

// A short list of candidates for SAMPLE_ROW (2026-11-30; the radix passes over the 262k-entry row
// made top-p cost ~1.6 ms and top-k ~1.2 ms per step at BS 1): the tokens with s >= some edge,
// s = (l - m) / scale, at most SAMPLE_CAP of them (cidx / cval), that hold
// - with k = 0 (plain top-p, scale T): the top-p set. No token with s < -R, R = ln(V / (1 - top_p)),
//   is in it: all of them weigh at most V e^-R = 1 - top_p, while Z >= 1 (the max token). *Z_out =
//   sum(e^s) over the row;
// - with k > 0 (top-k, scale 1): the top-k set (ties kept), when it lies within CAND_COUNT_RANGE of
//   the max.
// The list is an upper set of the keys holding the set, so select_key over it finds the same key
// as over the row, and the Gumbel draw over it the same token. Each pass bins [lo, hi] (first
// [-R, 0]) into CAND_BINS ranges by weight and count (per-warp shared-memory bins, then thread 0),
// walks them from the top until the weight reaches top_p * Z (with a 1e-4 margin for the sums'
// rounding) or the count k, and either the tokens down to that bin fit the list (edge: the bin's
// lower end) or the next pass bins that one bin. A last pass compacts s >= edge; the list is used
// only when it fits and holds the set (its weight reaches top_p * Z with a 1e-5 margin, or it holds
// k tokens). Returns its length, or -1 (then the caller runs over the row). Inlined into
// op_sample_row: as a call of its own it changed the step kernel's code (ptxas fits each call's
// convention to its callee; greedy steps ~1 % slower in one call). hist: >= NWARPS * 2 * CAND_BINS
// floats; misc: NWARPS.
__device__ __forceinline__ int sample_candidates(const float* lg, int V, float m, float T, float top_p, int k,
                                                 const float* tile_best, int n_tiles, float* Z_out, int* cidx,
                                                 float* cval, int* sh, float* hist, float* tot, float* misc) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool mass = k <= 0;
  const float scale = mass ? T : 1.f;
  float* st = reinterpret_cast<float*>(sh);  // thread 0's state for all: [2] lo, [3] hi, [4] edge
  float lo = -CAND_COUNT_RANGE, hi = 0.f, above_m = 0.f, Z = 0.f;
  int above_c = 0, state = 0;  // 0: next pass, 1: edge found, -1: no list fits
  if (mass) {
    // the row's Z first: every token weighs at most 1 (the max token), so a top-p set holds at least
    // top_p * Z tokens, and when that is more than the list holds, no list fits (a flat row: the
    // passes over the row then run as before, with this Z, at no extra cost)
    float z = 0.f;
    row_pass<CAND_BATCH>(lg, V, [&](int, float l) { z += expf(scaled_logit(l, m, scale)); });
    Z = block_sum(z, misc);
    *Z_out = Z;
    if (!(top_p * Z <= (float)SAMPLE_CAP)) return -1;
    lo = -logf((float)V / (1.f - top_p));
  }
  if (n_tiles <= SAMPLE_CAP && (mass || n_tiles >= k)) {
    // The LM-head tiles' maxima are logits of the row: the largest key at which their own weight
    // reaches top_p * Z (their k-th largest, for top-k) is a key at or below the row's threshold, so
    // the set lies at or above it, and the first pass bins only that range. When their whole weight
    // stays below top_p * Z, the set takes many tokens that are no tile's maximum: the row passes
    // (a flat row: binning most of the vocabulary through the shared-memory atomics first cost
    // ~0.35 ms more than the row passes alone, 2026-11-30).
    for (int t = threadIdx.x; t < n_tiles; t += NT) cval[t] = ld_cg(tile_best + (size_t)t * 8);
    __syncthreads();
    const SampleSrc tiles{nullptr, cidx, cval, n_tiles};
    if (mass) {
      float zt = 0.f;
      for (int t = threadIdx.x; t < n_tiles; t += NT) zt += expf(scaled_logit(cval[t], m, scale));
      if (!(block_sum(zt, misc) >= top_p * Z * (1.f + 1e-4f))) return -1;
    }
    const uint32_t kt = select_key(tiles, 0u, mass, m, T, mass ? top_p * Z : (float)k, hist, tot, sh);
    const uint32_t bits = kt & 0x80000000u ? kt & 0x7fffffffu : ~kt;  // fkey's inverse
    lo = fmaxf(lo, scaled_logit(__uint_as_float(bits), m, scale));
  }
  for (int round = 0; round < CAND_ROUNDS && state == 0; ++round) {
    const float w = (hi - lo) / CAND_BINS;
    float* wm = hist + warp * 2 * CAND_BINS;  // this warp's bins: weights, then counts
    int* wc = reinterpret_cast<int*>(wm + CAND_BINS);
    if (lane < CAND_BINS) wm[lane] = 0.f, wc[lane] = 0;
    __syncwarp();
    row_pass<CAND_BATCH>(lg, V, [&](int, float l) {
      const float sl = scaled_logit(l, m, scale);
      if (sl >= lo && (round == 0 ? sl <= hi : sl < hi)) {
        const int q = min(CAND_BINS - 1, max(0, (int)((hi - sl) / w)));
        if (mass) atomicAdd(wm + q, expf(sl));
        atomicAdd(wc + q, 1);
      }
    });
    __syncthreads();
    if (threadIdx.x == 0) {  // walk the bins from the top (sums over the warps)
      const float target = top_p * Z * (1.f + 1e-4f);
      float cum = above_m, mk = 0.f;
      int cnt = above_c, ck = 0, kb = -1;
      for (int j = 0; j < CAND_BINS && kb < 0; ++j) {
        mk = 0.f, ck = 0;
        for (int v = 0; v < NWARPS; ++v) {
          mk += hist[v * 2 * CAND_BINS + j];
          ck += reinterpret_cast<const int*>(hist)[v * 2 * CAND_BINS + CAND_BINS + j];
        }
        cum += mk;
        cnt += ck;
        if (mass ? cum >= target : cnt >= k) kb = j;
      }
      if (kb < 0) {
        state = -1;  // the range does not reach the target (rounding)
      } else if (cnt <= SAMPLE_CAP) {
        state = 1;
        st[4] = kb == CAND_BINS - 1 ? lo : hi - (kb + 1) * w;
      } else if (cnt - ck > SAMPLE_CAP) {
        state = -1;  // the tokens above the bin alone overflow the list
      } else {  // bin kb again, finer; the bins above it join `above`
        above_m = cum - mk;
        above_c = cnt - ck;
        const float top = hi - kb * w;
        lo = kb == CAND_BINS - 1 ? lo : hi - (kb + 1) * w;
        hi = top;
        st[2] = lo;
        st[3] = hi;
      }
      sh[0] = state;
    }
    __syncthreads();
    state = sh[0];
    lo = st[2];
    hi = st[3];
    __syncthreads();  // everyone read the state before thread 0 writes it again
  }
  if (state != 1) return -1;
  const float edge = st[4];
  if (threadIdx.x == 0) sh[1] = 0;
  __syncthreads();
  float zc = 0.f;
  row_pass<CAND_BATCH>(lg, V, [&](int i, float l) {
    const float sl = scaled_logit(l, m, scale);
    if (sl >= edge) {
      if (mass) zc += expf(sl);
      const int at = atomicAdd(sh + 1, 1);
      if (at < SAMPLE_CAP) {
        cidx[at] = i;
        cval[at] = l;
      }
    }
  });
  const float Zc = block_sum(zc, misc);  // its barriers publish sh[1]
  const int n = sh[1];
  __syncthreads();
  // a list whose weight only just reaches top_p * Z could miss it in select_key's own sums
  const bool holds = mass ? Zc >= top_p * Z * (1.f + 1e-5f) : n >= k;
  return n <= SAMPLE_CAP && holds ? n : -1;
}

__device__ __noinline__ void op_sample_row(const Params& p, const int* d, Smem& s) {
  const int b = d[MK_F_A0], V = p.vocab;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int* sp = p.sample_params ? (const int*)p.sample_params + (size_t)b * MK_SP_WORDS : nullptr;
  const float T = sp ? __int_as_float(sp[MK_SP_TEMPERATURE]) : 0.f;
  const int top_k = sp ? sp[MK_SP_TOP_K] : 0;
  const float top_p = sp ? __int_as_float(sp[MK_SP_TOP_P]) : 1.f;
  if (!(T > 0.f) || top_k == 1 || !(top_p > 0.f)) {  // greedy: merge the LM-head tiles' argmax
    // The whole block: each thread's GREEDY_PER tiles loaded before any compare (all in flight at
    // once), then warp and block reductions. Warp 0 alone walked the 1024-2048 tiles 32 at a time,
    // one L2 round trip per step: ~15-18 us at the end of every step (2026-12-02, timeline).
    constexpr int GREEDY_PER = 4;
    const int n = p.n_lm_tiles;
    float best = -INFINITY;
    int bt = 0x7fffffff;
    for (int t0 = threadIdx.x; t0 < n; t0 += GREEDY_PER * NT) {
      float v[GREEDY_PER];
#pragma unroll
      for (int j = 0; j < GREEDY_PER; ++j) {
        const int t = t0 + j * NT;
        v[j] = t < n ? ld_cg((const float*)p.lm_best + (size_t)t * 8 + b) : -INFINITY;
      }
#pragma unroll
      for (int j = 0; j < GREEDY_PER; ++j) {
        const int t = t0 + j * NT;
        if (t < n && (v[j] > best || (v[j] == best && t < bt))) {
          best = v[j];
          bt = t;
        }
      }
    }
    float* wbest = reinterpret_cast<float*>(s.raw);  // [NWARPS] per-warp bests, then their tiles
    int* wtile = reinterpret_cast<int*>(wbest + NWARPS);
    for (int round = 0; round < 2; ++round) {  // within each warp, then over the warps' results
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL, best, o);
        const int oi = __shfl_xor_sync(FULL, bt, o);
        if (ov > best || (ov == best && oi < bt)) {
          best = ov;
          bt = oi;
        }
      }
      if (round == 1) break;
      if (lane == 0) {
        wbest[warp] = best;
        wtile[warp] = bt;
      }
      __syncthreads();
      best = lane < NWARPS ? wbest[lane] : -INFINITY;
      bt = lane < NWARPS ? wtile[lane] : 0x7fffffff;
    }
    if (threadIdx.x == 0) {
      if (bt < n)
        ((long long*)p.tokens_out)[b] = ld_cg((const int*)p.lm_arg + (size_t)bt * 8 + b);
      else  // every tile's maximum was NaN: no token to give (the host raises)
        raise_error(p, MK_ERR_NAN_LOGITS, d[MK_F_ID], b, 0, 0);
    }
    return;
  }
  // smem: hist [NWARPS][256], tot [256], misc [NWARPS], sh [32], compacted idx/val [SAMPLE_CAP] each
  float* hist = reinterpret_cast<float*>(s.raw);
  float* tot = hist + NWARPS * 256;
  float* misc = tot + 256;
  int* sh = reinterpret_cast<int*>(misc + NWARPS);
  int* cidx = sh + 32;
  float* cval = reinterpret_cast<float*>(cidx + SAMPLE_CAP);
  const float* lg = (const float*)p.logits + (size_t)b * V;
  // the row max from the tiles' maxima (the same values the tiles wrote)
  float mx = -INFINITY;
  for (int t = threadIdx.x; t < p.n_lm_tiles; t += NT) mx = fmaxf(mx, ld_cg((const float*)p.lm_best + (size_t)t * 8 + b));
  const float m = block_max(mx, misc);
  SampleSrc src{lg, nullptr, nullptr, V};
  uint32_t thr = 0;
  // A short candidate list first (sample_candidates): the top-p set without a top-k cut, else the
  // top-k set; every pass below then runs over it instead of the row when it fits.
  const bool use_k = top_k > 0 && top_k < V;
  const bool plain_p = top_p < 1.f && !use_k;
  float z_row = 0.f;  // plain top-p: the row's Z (also when no list fits)
  bool listed = false;
  if (plain_p || (use_k && top_k <= SAMPLE_CAP)) {
    const int n = sample_candidates(lg, V, m, T, top_p, use_k ? top_k : 0, (const float*)p.lm_best + b, p.n_lm_tiles,
                                    &z_row, cidx, cval, sh, hist, tot, misc);
    listed = n >= 0;
    if (listed) src = SampleSrc{lg, cidx, cval, n};
  }
  if (use_k) {
    thr = select_key(src, 0u, false, m, T, (float)top_k, hist, tot, sh);
  }
  if (use_k && !listed) {
    // compact the kept set into smem when it fits (ties can make it larger than k)
    if (threadIdx.x == 0) sh[0] = 0;
    __syncthreads();
    row_pass<SELECT_BATCH>(lg, V, [&](int i, float l) {
      if (fkey(l) >= thr) {
        const int at = atomicAdd(sh, 1);
        if (at < SAMPLE_CAP) {
          cidx[at] = i;
          cval[at] = l;
        }
      }
    });
    __syncthreads();
    const int n = sh[0];
    __syncthreads();
    if (n <= SAMPLE_CAP) src = SampleSrc{lg, cidx, cval, n};
  }
  if (top_p < 1.f) {
    float z = 0.f;  // each thread's elements in the same order as one at a time
    if (!plain_p) {  // after a top-k cut: the kept set's Z
      for (int base = threadIdx.x; base < src.n; base += NT * SELECT_BATCH) {
        float lv[SELECT_BATCH];
#pragma unroll
        for (int e = 0; e < SELECT_BATCH; ++e) {
          int idx;
          lv[e] = 0.f;
          if (base + e * NT < src.n) src.at(base + e * NT, idx, lv[e]);
        }
#pragma unroll
        for (int e = 0; e < SELECT_BATCH; ++e)
          if (base + e * NT < src.n && fkey(lv[e]) >= thr) z += expf((lv[e] - m) / T);
      }
    }
    const float Z = plain_p ? z_row : block_sum(z, misc);
    const uint32_t pth = select_key(src, thr, true, m, T, top_p * Z, hist, tot, sh);
    thr = pth > thr ? pth : thr;
  }
  // Gumbel-max over the kept set
  const uint32_t rk = mix32(mix32(mix32((uint32_t)sp[MK_SP_SEED_LO] ^ 0x9E3779B9u) ^ (uint32_t)sp[MK_SP_SEED_HI]) +
                            (uint32_t)sp[MK_SP_STEP]);
  float best = -INFINITY;
  int bi = 0x7fffffff;
  for (int base = threadIdx.x; base < src.n; base += NT * SELECT_BATCH) {  // loads in flight together
    float lv[SELECT_BATCH];
    int iv[SELECT_BATCH];
#pragma unroll
    for (int e = 0; e < SELECT_BATCH; ++e) {
      lv[e] = 0.f;
      iv[e] = 0;
      if (base + e * NT < src.n) src.at(base + e * NT, iv[e], lv[e]);
    }
#pragma unroll
    for (int e = 0; e < SELECT_BATCH; ++e) {
      const float sl = (lv[e] - m) / T;
      // GUMBEL_FLOOR: a token this far below the max cannot win, so its noise is not computed
      if (base + e * NT < src.n && fkey(lv[e]) >= thr && sl >= GUMBEL_FLOOR) {
        const float v = sl + gumbel_noise(rk, (uint32_t)iv[e]);
        if (v > best || (v == best && iv[e] < bi)) {
          best = v;
          bi = iv[e];
        }
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(FULL, best, o);
    const int oi = __shfl_xor_sync(FULL, bi, o);
    if (ov > best || (ov == best && oi < bi)) {
      best = ov;
      bi = oi;
    }
  }
  __syncthreads();
  if (lane == 0) {
    misc[warp] = best;
    sh[8 + warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float bb = misc[0];
    int bix = sh[8];
    for (int w = 1; w < NWARPS; ++w) {
      if (misc[w] > bb || (misc[w] == bb && sh[8 + w] < bix)) {
        bb = misc[w];
        bix = sh[8 + w];
      }
    }
    if (bix == 0x7fffffff) {  // an empty kept set (cannot happen short of NaN logits): the argmax
      float bv = -INFINITY;
      for (int t = 0; t < p.n_lm_tiles; ++t) {
        const float v = ld_cg((const float*)p.lm_best + (size_t)t * 8 + b);
        if (v > bv) {
          bv = v;
          bix = ld_cg((const int*)p.lm_arg + (size_t)t * 8 + b);
        }
      }
    }
    ((long long*)p.tokens_out)[b] = bix;
  }
}

// ---- prefetch, run, signal ------------------------------------------------------------------------

// Warm-up: a static ROUTE or ATTN_COMBINE (and a QKV tile: its epilogue) whose inputs are not ready
// yet first runs its op without any global write (a dry run), so that its code is in the
// instruction cache when the inputs arrive: an op an SM runs once per layer otherwise fetches its
// code cold from L2 while HBM is saturated (MK_MODE_TWICE measured the add+norm op, since removed,
// 8.4 us cold, 2.9 us warm; the step without warm-ups was measured slower and that switch removed).
__device__ __forceinline__ bool warmable(const int* d) {
  const int op = d[MK_F_OP];
  return d[MK_F_ID] >= 0 && (op == MK_OP_ROUTE || op == MK_OP_ATTN_COMBINE || op == MK_OP_QKV);
}

__device__ __noinline__ void warm_op(const Params& p, const int* d, Smem& s) {
  switch (d[MK_F_OP]) {
    case MK_OP_ROUTE: op_route(p, d[MK_F_LAYER], s, true); break;
    // a QKV tile warms its epilogue (RoPE, the Q / K / V writes): run once per layer on its SM after
    // a GEMV, it took 1-2.2 us there, groups of SMs ending it at the same instant (2026-12-01: BS 4
    // 5.874 / 5.872 vs 6.063 / 5.973 ms, BS 8 8.700 / 8.682 vs 8.794 / 8.660, BS 1 3.111 / 3.102 vs
    // 3.172 / 3.085, gpu_check, same call; with a one-page attention item warmed too: +1-3 %)
    case MK_OP_QKV: op_qkv(p, d, s, true); break;
    default: op_attn_combine(p, d, s, true); break;
  }
}

// Thread 0: wait for every counter the descriptor names (false: the step was abandoned). With
// spin = false: are they all at their targets already (one acquire load each, no waiting)?
// first: the waits before it were already satisfied.
__device__ bool wait_task(const Params& p, const int* d, bool spin, int first) {
  for (int i = first; i < MK_MAX_WAITS; ++i) {
    const int c = d[MK_F_WAIT0 + 2 * i];
    if (c != MK_NO_COUNTER && !wait_counter(p, c, d[MK_F_WAIT0 + 2 * i + 1], d[MK_F_ID], spin)) return false;
  }
  return true;
}

// Run one (non-DRAIN) descriptor held in shared memory. Returns false if the step was abandoned.
// Thread 0: append one timeline record (see MK_TL_WORDS) if the timeline is on.
__device__ __forceinline__ void tl_record(const Params& p, int* tl_n, int op, int layer, int item, uint64_t t0,
                                          uint64_t t1, uint64_t t2) {
  if (p.timeline == nullptr || *tl_n >= p.timeline_cap) return;
  long long* e = (long long*)p.timeline + ((size_t)blockIdx.x * p.timeline_cap + *tl_n) * MK_TL_WORDS;
  e[0] = op | (layer << 8) | (item << 16);
  e[1] = (long long)t0;
  e[2] = (long long)t1;
  e[3] = (long long)tl_marks[0];
  e[4] = (long long)tl_marks[1];
  e[5] = (long long)t2;
  e[6] = (long long)globaltimer();
  ++*tl_n;
}

// MK_MODE_TWICE: stamp the end of the first run, run again, stamp the end of the second.
template <class F>
__device__ __forceinline__ void twice(const Params& p, F again) {
  __syncthreads();
  if (p.timeline && threadIdx.x == 0) tl_marks[0] = globaltimer();
  __syncthreads();
  again();
  __syncthreads();
  if (p.timeline && threadIdx.x == 0) tl_marks[1] = globaltimer();
}

__device__ __noinline__ void drain_stage_h(const Params& p, int l, Smem& s, const int* rows);

// h(l)'s batch rows into shared memory unless this SM holds them (s_h_staged): a MoE drain between
// its h(l) and ROUTE waits, a self-routing fused item between its h and router waits. It ends
// with a barrier after which every thread has read s_h_staged and any flag thread 0 set before
// the call (racecheck found thread 0's next write of the drain's s_flag racing those reads without
// it); thread 0 then marks the rows staged, for the caller's next barrier to publish.
__device__ __forceinline__ void stage_h_once(const Params& p, int l, Smem& s, int* rows) {
  if (s_h_staged != l) {  // uniform: s_h_staged is written before barriers
    rows_identity(rows, p.batch);
    __syncthreads();
    drain_stage_h(p, l, s, rows);
  }
  __syncthreads();
  if (threadIdx.x == 0) s_h_staged = l;
}

// The routing gap's KV: self-routing item m of the layer's n, idle until the router tiles end, asks
// L2 (bulk prefetches, evict_last) for row 0's KV pages of layer l that the attention items read
// 10-20 us later, the pages each of the S splits (A4) reads first, at most MK_GAP_KV_PAGES: order
// i = k * S + s is page k of split s (attn_span's split ranges), item m takes every n-th i from m
// (H100, BS 1, 8K, 2026-12-06, two calls: 3.367-3.401 vs 3.393-3.433 ms; the same for Wo: +4.5 %).
__device__ __noinline__ void gap_prefetch_kv(const Params& p, const int* d) {
  if (threadIdx.x != 0) return;
  View V(p);
  const int l = d[MK_F_LAYER], S = d[MK_F_A4] > 0 ? d[MK_F_A4] : 1;
  const int n = p.top_k * p.moe_up_tiles, m = d[MK_F_A0] * p.moe_up_tiles + d[MK_F_A1] / d[MK_F_A2];
  const long long pos = V.position(0), p_lo = V.first_visible(l, pos) / 64, p_hi = pos / 64;
  const long long per = (p_hi - p_lo + 1 + S - 1) / S, total = per * S;
  const size_t page_bytes = (size_t)2 * p.num_kv_heads * 64 * p.head_dim * sizeof(bf16);
  const uint64_t pol = l2_policy(true);
  for (long long i = m; i < total && i < MK_GAP_KV_PAGES; i += n) {
    const long long pg = p_lo + (i % S) * per + i / S;
    if (pg > p_hi) continue;  // the last split's range ends early
    const int page = V.page(l, 0, (int)(pg * 64));
    if (page >= 0) prefetch_l2_bulk(V.kv(page, 0, 0, 0), page_bytes, pol);  // no page held: no address
  }
}

// A self-routing fused item (MK_MOE_LOCAL) before its full wait: wait for its first counter (h(l)
// ready), prefetch the KV pages and stage h(l) (false: the step was abandoned); run_task then waits
// for the router tiles and gemv_op finds the rows staged.
__device__ __noinline__ bool moe_local_stage(const Params& p, const int* d, Smem& s, int* rows, int* flag) {
  if (threadIdx.x == 0) *flag = wait_counter(p, d[MK_F_WAIT0], d[MK_F_WAIT0 + 1], d[MK_F_ID]);
  __syncthreads();
  if (!*flag) return false;  // uniform
  gap_prefetch_kv(p, d);
  stage_h_once(p, d[MK_F_LAYER], s, rows);
  return true;
}

__device__ bool run_task(const Params& p, const int* d, Smem& s, int* rows, int* flag, int* tl_n) {
  const uint64_t t0 = p.timeline ? globaltimer() : 0;
  const Params& q = s_params;  // for the out-of-line ops (s_params)
  // every task but a MoE up item may overwrite the staged h rows (read after the barrier below; a
  // fused item clears it itself after its up GEMV)
  if (threadIdx.x == 0 && d[MK_F_OP] != MK_OP_MOE_UP && d[MK_F_OP] != MK_OP_MOE_FUSED && d[MK_F_OP] != MK_OP_LM_HEAD)
    s_h_staged = -1;
  // the d = 128 attention waits inside its op, its first keys loaded before (attn_warp_t)
  const bool own_wait = d[MK_F_OP] == MK_OP_ATTN && attn_warps(p);
  if (d[MK_F_OP] == MK_OP_ATTN) attn_prologue(q, d, s);  // the page ring's first pages land while we wait
  if (d[MK_F_OP] == MK_OP_ROUTE) route_prologue(q, d);
  if (d[MK_F_OP] == MK_OP_QKV) qkv_prologue(q, d);
  if (d[MK_F_OP] == MK_OP_MOE_FUSED || d[MK_F_OP] == MK_OP_MOE_DOWN) moe_prologue(q, d);
  if (is_gemv_op(d[MK_F_OP])) gemv_prologue(q, d);
  // a self-routing fused item stages h(l) between its first wait and the router tiles' (uniform)
  if (moe_local(d) && !moe_local_stage(q, d, s, rows, flag)) {
    cp_async_wait_all();  // no copy may land after the block has left
    return false;
  }
  if (!own_wait) {  // (the attention's own wait: below)
    bool ready = false;  // all waits were satisfied at the first look (then none is repeated)
    if (warmable(d)) {
      if (threadIdx.x == 0) *flag = wait_task(p, d, /*spin=*/false);
      __syncthreads();
      ready = *flag;
      if (!ready) warm_op(q, d, s);  // the inputs are not there yet: fetch the op's code meanwhile
      __syncthreads();  // everyone has read *flag
    }
    if (!block_wait(p, d, flag, ready, moe_local(d) ? 1 : 0)) return false;
  }
  if (moe_local(d)) moe_local_route(q, const_cast<int*>(d), s);  // d: this SM's copy (s_desc)
  if (is_gemv_op(d[MK_F_OP])) gemv_op(q, d, s, rows);  // then the op's epilogue below
  switch (d[MK_F_OP]) {
    case MK_OP_NOP:
      break;
    case MK_OP_EMBED:
      op_embed(q, d);
      break;
    case MK_OP_QKV:
      op_qkv(p, d, s, false);
      break;
    case MK_OP_ATTN:
      if (own_wait) {
        if (!attn_warp_t<128>(q, d, s, flag)) return false;
      } else
        attn_mma(q, d, s);
      break;
    case MK_OP_ATTN_COMBINE:
      op_attn_combine(q, d, s, false);
      if (p.prefetch_mode & MK_MODE_TWICE) twice(p, [&] { op_attn_combine(q, d, s, false); });
      break;
    case MK_OP_OPROJ:
      op_oproj(q, d, s);
      break;
    case MK_OP_DENSE_UP:
      op_dense_up(p, d, s);
      break;
    case MK_OP_DENSE_DOWN:
      op_dense_down(q, d, s);
      break;
    case MK_OP_ROUTER:
      op_router(p, d, s);
      break;
    case MK_OP_ROUTE:
      op_route(q, d[MK_F_LAYER], s, false);
      break;
    case MK_OP_MOE_UP:
      op_moe_up(p, d, s);
      break;
    case MK_OP_MOE_DOWN:
      op_moe_down(q, d, s);
      break;
    case MK_OP_MOE_FUSED:
      op_moe_fused(q, d, s);
      break;
    case MK_OP_LM_HEAD:
      op_lm_head(p, d, s);
      break;
    case MK_OP_SAMPLE_ROW:
      op_sample_row(q, d, s);
      break;
    case MK_OP_DRAIN:  // handled by the caller; a queue item is never a DRAIN
    default:
      if (threadIdx.x == 0) raise_error(p, MK_ERR_BAD_OPCODE, d[MK_F_ID], d[MK_F_OP], 0, 0);
      return false;
  }
  __syncthreads();  // every thread's writes are done
  if (threadIdx.x == 0) {
    const uint64_t t2 = p.timeline ? globaltimer() : 0;
    // release: the block's writes (ordered before thread 0 by the barrier above, and covered by
    // the release's cumulativity) become visible to whoever acquires the counter
    const int amount = d[MK_F_SIG_AMOUNT] ? d[MK_F_SIG_AMOUNT] : 1;
    for (int i = 0; i < MK_MAX_SIGNALS; ++i) {
      const int c = d[MK_F_SIG0 + i];
      if (c != MK_NO_COUNTER) signal_release((uint32_t*)p.counters + c, (uint32_t)amount);
    }
    tl_record(p, tl_n, d[MK_F_OP], d[MK_F_LAYER], d[MK_F_ID] < 0, t0, tl_wait, t2);
  }
  return true;
}

// A MoE drain's staging of h(l)'s batch rows for its up items (gemv_op stages the same for an up
// item): RMSNorm(x(l)). Out of line: inlined into the step kernel, the norm's branch grew its spills
// (168 -> 248 bytes). The rows' RMSNorm factors go with them (s_nss): the up items' GEMVs apply them.
__device__ __noinline__ void drain_stage_h(const Params& p, int l, Smem& s, const int* rows) {
  stage_rows(s.act, h_rows(p, l, rows, View(p).lw_row(l)), p.hidden);
}

// ---- DRAIN items: fetched into shared memory one item ahead, built from there ---------------------
//
// A claimed item's words are copied into `raw` (cp.async, no registers held across the running
// item) while the item before it runs; `drain_build` then writes the descriptor without a global
// round trip. Host queues: the 32-word descriptor. MoE queue of layer l (indices): the up tiles of
// the n_act active experts, then the layer's attention tail (host descriptors of queue `tq`: the
// combines and O-proj tiles), then the down tiles. An up/down tile's words come from the expert
// table row of its active expert (expert, tokens, slots) plus its index; n_act (the layer's active
// experts) is read once per drain after ROUTE published.

// The shape of a MoE queue: [0, n_up) up tiles, then the n_tail tail items, then the n_down down
// tiles. With head items (Tiling.attn_in_moe, mk_abi.h MK_MOE_HEAD) the queue's first s_moe_head
// claims are those, stored right before the tail's items, and claim c >= s_moe_head is this shape's
// index c - s_moe_head.
struct MoeQueue {
  int n_up, n_tail, n_down, tail_first;  // the tail's items sit at queue indices [n_up, n_up + n_tail)
  __device__ MoeQueue(const Params& p, int n_act, const int* tq)
      : n_up(n_act * p.moe_up_tiles),
        n_tail(tq ? tq[1] : 0),
        n_down(n_act * p.moe_down_tiles),
        tail_first(tq ? tq[0] : 0) {}
  __device__ bool in_tail(uint32_t idx) const {
    return idx >= (uint32_t)n_up && idx < (uint32_t)(n_up + n_tail);
  }
  __device__ uint32_t end() const { return (uint32_t)(n_up + n_tail + n_down); }
  // the up/down tile index (0 .. n_up + n_down) of a queue index outside the tail
  __device__ int tile(uint32_t idx) const { return (int)idx < n_up ? (int)idx : (int)idx - n_tail; }
};

// Up tile m (0 <= m < n_act * moe_up_tiles) of a MoE queue: (active expert index, first column,
// columns), expert-major, moe_up_cols columns each (emulator_ops.moe_item is the same map).
__device__ __forceinline__ int3 up_tile(const Params& p, int m) {
  return make_int3(m / p.moe_up_tiles, (m % p.moe_up_tiles) * p.moe_up_cols, p.moe_up_cols);
}

// Word A1 (first column / hidden row) or A2 (columns / rows) of MoE tile m (an up tile below n_up,
// else a down tile). Out of line: inlined into the drain loop it cost the step kernel 16 B of stack
// and 32 B of spills.
__device__ __noinline__ int tile_span(const Params& p, int m, int n_up, bool count) {
  if (m < n_up) {
    const int3 u = up_tile(p, m);
    return count ? u.z : u.y;
  }
  return count ? p.moe_down_rows : ((m - n_up) % p.moe_down_tiles) * p.moe_down_rows;
}

// A MoE drain's head items (MK_MOE_HEAD; 0: none), set by thread 0 with its first claim.
__shared__ int s_moe_head;

__device__ __forceinline__ void host_item_fetch(const Params& p, int at, int* raw) {
  if (threadIdx.x < MK_DESC_WORDS / 4)
    cp_async16(raw + 4 * threadIdx.x, (const int*)p.queue + (size_t)at * MK_DESC_WORDS + 4 * threadIdx.x, true);
}

// The first ETAB_ROWS rows of a MoE layer's expert table, copied into shared memory (s_etab) when
// its drain starts (with the first claim, no extra round trip): an up/down item of those experts
// then builds from shared memory instead of paying an L2 round trip after its claim. 64 rows cover
// every batch of up to 8 rows at top-8 (BS 8 routes to ~51 experts; 2026-11-30: 16 rows made most
// BS 8 items fetch their row from L2, and a deferred claim, below, needs the build to be local).
constexpr int ETAB_ROWS = 64;
constexpr int ETAB_WORDS = ETAB_ROWS * ETAB_STRIDE;

__device__ __forceinline__ void drain_fetch(const Params& p, int kind, const int* qi, int l, uint32_t idx, int n_act,
                                            int* raw, const int* etab) {
  if (kind == MK_QUEUE_HOST) {
    if (idx < (uint32_t)qi[1]) host_item_fetch(p, qi[0] + (int)idx, raw);
  } else if (idx < (uint32_t)s_moe_head) {  // a head item (right before the tail's)
    host_item_fetch(p, qi[0] - s_moe_head + (int)idx, raw);
  } else {
    idx -= (uint32_t)s_moe_head;
    const MoeQueue q(p, n_act, qi);
    if (q.in_tail(idx)) {
      host_item_fetch(p, q.tail_first + (int)idx - q.n_up, raw);
    } else if (idx < q.end() && threadIdx.x < (2 + MK_MAX_TOKENS) / 2) {
      const int m = q.tile(idx);
      const int a = m < q.n_up ? up_tile(p, m).x : (m - q.n_up) / p.moe_down_tiles;
      if (a < ETAB_ROWS) {  // the drain's copy (read after the loop's barrier, like the cp.async)
        raw[2 * threadIdx.x] = etab[a * (2 + MK_MAX_TOKENS) + 2 * threadIdx.x];
        raw[2 * threadIdx.x + 1] = etab[a * (2 + MK_MAX_TOKENS) + 2 * threadIdx.x + 1];
      } else {
        const int* row = View(p).expert_tab(l) + (size_t)a * (2 + MK_MAX_TOKENS);
        cp_async8_ca(raw + 2 * threadIdx.x, row + 2 * threadIdx.x);  // written by ROUTE this step, after route[l]
      }
    }
  }
  cp_async_commit();
}

// Threads w < MK_DESC_WORDS write word w of `item` from `raw`. Returns false (uniformly) past the
// end of the queue. qi: the host queue (HOST), or the MoE layer's attention tail queue (or null).
__device__ bool drain_build(const Params& p, int kind, const int* qi, int l, uint32_t idx, int n_act, int mlp_counter,
                            const int* raw, int* item) {
  const int w = threadIdx.x;
  if (kind == MK_QUEUE_HOST) {
    if (idx >= (uint32_t)qi[1]) return false;
    if (w < MK_DESC_WORDS) item[w] = raw[w];
    return true;
  }
  if (idx < (uint32_t)s_moe_head) {  // a head item: its host descriptor
    if (w < MK_DESC_WORDS) item[w] = raw[w];
    return true;
  }
  idx -= (uint32_t)s_moe_head;
  const MoeQueue q(p, n_act, qi);
  if (idx >= q.end()) return false;
  if (w >= MK_DESC_WORDS) return true;
  if (q.in_tail(idx)) {
    item[w] = raw[w];
    return true;
  }
  const int up = p.moe_up_tiles;
  const int m = q.tile(idx);
  const bool is_up = m < q.n_up;
  const int e = raw[0], ntok = raw[1];
  const int ecounter = p.dyn_base + l * (p.num_experts + 1) + 1 + e;
  int v = 0;
  const bool fused_up = is_up && p.moe_fused;  // signals the MLP counter itself (no down tiles)
  if (w == MK_F_OP) v = !is_up ? MK_OP_MOE_DOWN : fused_up ? MK_OP_MOE_FUSED : MK_OP_MOE_UP;
  else if (w == MK_F_LAYER) v = l;
  else if (w == MK_F_A0) v = e;
  else if (w == MK_F_A1 || w == MK_F_A2) v = tile_span(p, m, q.n_up, w == MK_F_A2);
  else if (w >= MK_F_WAIT0 && w < MK_F_WAIT0 + 2 * MK_MAX_WAITS) {
    const int i = (w - MK_F_WAIT0) / 2;
    const bool second = (w - MK_F_WAIT0) % 2;
    v = (!is_up && i == 0) ? (second ? up : ecounter) : (second ? 0 : MK_NO_COUNTER);
  } else if (w == MK_F_NWAIT) v = is_up ? 0 : 1;
  else if (w == MK_F_NSIG) v = 1;
  else if (w == MK_F_SIG0) v = is_up && !fused_up ? ecounter : mlp_counter;
  else if (w > MK_F_SIG0 && w < MK_F_SIG0 + MK_MAX_SIGNALS) v = MK_NO_COUNTER;
  else if (w == MK_F_SIG_AMOUNT) v = is_up && !fused_up ? 1 : ntok;
  else if (w == MK_F_ID) v = -(1 << 20) - m;
  else if (w == MK_F_NTOK) v = ntok;
  else if (w >= MK_F_SLOT0 && w < MK_F_SLOT0 + MK_MAX_TOKENS) v = w - MK_F_SLOT0 < ntok ? raw[2 + (w - MK_F_SLOT0)] : -1;
  item[w] = v;
  return true;
}

// Tiling.attn_in_moe = 3 (MK_DRAIN_LATE_ROUTE): a MoE drain that claimed its layer's head items
// without waiting for ROUTE has claimed past them. Wait for ROUTE (its pair in the descriptor's
// words MK_F_SLOT0, MK_F_SLOT0 + 1), then set up what a drain that waited for it at its start has:
// the active experts, the queue's far index, the first expert-table rows in shared memory
// (cp.async: they land during the staging), and h(l)'s rows staged (the head items may have
// overwritten them). All the block's threads; false (uniform) when the step was abandoned.
__device__ __noinline__ bool drain_late_route(const Params& p, const int* d, const int* qi, Smem& s, int* rows,
                                              int* etab, int* nact, uint32_t* far_end, int* flag) {
  const int l = d[MK_F_A1];
  if (threadIdx.x == 0) *flag = wait_counter(p, d[MK_F_SLOT0], d[MK_F_SLOT0 + 1], d[MK_F_ID]);
  __syncthreads();
  if (!*flag) return false;
  // ROUTE published the table (thread 0 acquired route[l], whose acquire also emptied this SM's L1)
  const int words = min(ETAB_WORDS, p.num_experts * ETAB_STRIDE);
  for (int w = threadIdx.x; w < words; w += NT) cp_async4_ca(etab + w, View(p).expert_tab(l) + w);
  cp_async_commit();
  if (threadIdx.x == 0) {  // as the drain's start sets them when it waited for ROUTE there
    const int n = ld_cg(View(p).moe_info(l));
    const MoeQueue q(p, n, qi);
    *nact = n;
    *far_end = (uint32_t)q.n_up;
  }
  if (s_h_staged != l) {  // uniform: written by thread 0 before barriers
    rows_identity(rows, p.batch);
    __syncthreads();
    drain_stage_h(p, l, s, rows);
  }
  cp_async_wait_all();
  __syncthreads();  // the table, the staged rows and thread 0's words are there; s_h_staged read
  if (threadIdx.x == 0) s_h_staged = l;  // the drain loop's next barrier publishes it
  return true;
}

// After task i: s_desc <- task i+1 (from s_next), s_next <- task i+2 (from warp 1's registers),
// registers <- task i+3 (a global load whose latency the next task hides).
__device__ __forceinline__ void advance(int* s_desc, int* s_next, int& ahead, int lane_w, const int* mine, int i,
                                        int n) {
  __syncthreads();  // everyone (thread 0's signals included) is done with s_desc
  if (threadIdx.x < MK_DESC_WORDS) s_desc[threadIdx.x] = s_next[threadIdx.x];
  __syncthreads();
  if (lane_w >= 0 && lane_w < MK_DESC_WORDS) {
    s_next[lane_w] = ahead;
    ahead = i + 3 < n ? mine[(size_t)(i + 3) * MK_DESC_WORDS + lane_w] : MK_OP_NOP;
  }
}

__global__ void __launch_bounds__(NT, 1) mk_step_kernel(const __grid_constant__ Params p, int max_k) {
  __shared__ int s_desc[MK_DESC_WORDS];
  __shared__ int s_item[MK_DESC_WORDS];
  __shared__ int s_next[MK_DESC_WORDS];
  __shared__ int s_rows[8];
  __shared__ int s_flag;
  __shared__ uint32_t s_claim;  // a DRAIN's next claim (queue index)
  __shared__ int s_pend;        // 1: that claim is still in flight (thread 0's claim_far), see below
  __shared__ int s_nact;        // a MoE DRAIN's active experts
  __shared__ uint32_t s_far;    // a DRAIN claims ahead while n_sms items remain before this index
  __shared__ __align__(16) int s_raw[MK_DESC_WORDS];  // the next DRAIN item's words (drain_fetch)
  __shared__ __align__(16) int s_etab[ETAB_WORDS];     // a MoE DRAIN's first expert-table rows
  __shared__ int s_tl_n;      // timeline records written by this block
  __shared__ uint64_t s_t0, s_t1;  // a DRAIN's start and end of wait (timeline)
  if (threadIdx.x == 0) {
    s_tl_n = 0;
    s_h_staged = -1;
  }
  static_assert(sizeof(Params) % 4 == 0 && sizeof(Params) <= 4 * NT, "Params: one word per thread");
  if (threadIdx.x < sizeof(Params) / 4)
    reinterpret_cast<int*>(&s_params)[threadIdx.x] = reinterpret_cast<const int*>(&p)[threadIdx.x];
  Smem s = carve(mk_dyn_smem, p, max_k);
  __syncthreads();
  const int sm = blockIdx.x;
  const int n = ((const int*)p.ntasks)[sm];
  const int* mine = (const int*)p.desc + (size_t)sm * p.max_tasks * MK_DESC_WORDS;
  // Descriptors are pipelined through registers: warp 1 holds task i+2's words while task i runs,
  // so no task start waits on a global load of its descriptor.
  const int lane_w = threadIdx.x - 32;  // warp 1's lanes own one descriptor word each
  int ahead = MK_OP_NOP;
  if (threadIdx.x < MK_DESC_WORDS) s_desc[threadIdx.x] = n > 0 ? mine[threadIdx.x] : MK_OP_NOP;
  if (lane_w >= 0 && lane_w < MK_DESC_WORDS) {
    s_next[lane_w] = n > 1 ? mine[MK_DESC_WORDS + lane_w] : MK_OP_NOP;
    ahead = n > 2 ? mine[2 * MK_DESC_WORDS + lane_w] : MK_OP_NOP;
  }
  for (int i = 0; i < n; ++i) {
    __syncthreads();
    if (s_desc[MK_F_OP] != MK_OP_DRAIN) {
      if (!run_task(p, s_desc, s, s_rows, &s_flag, &s_tl_n)) {
        return;
      }
      advance(s_desc, s_next, ahead, lane_w, mine, i, n);
      continue;
    }
    // DRAIN: wait (MoE queues wait on ROUTE), then claim items until the queue is empty. A MoE
    // drain whose first wait is h(l) (the previous layer's end, schedule.py) stages h(l)'s batch rows
    // for its up items between that wait and ROUTE's: off the MoE chain.
    const bool pre_h = s_desc[MK_F_A0] == MK_QUEUE_MOE && s_desc[MK_F_NWAIT] >= 2;
    if (threadIdx.x == 0 && p.timeline) s_t0 = globaltimer();
    // thread 0: the drain's first claim when it was made before the staging below (early)
    uint32_t early_c = 0;
    bool early = false;
    if (pre_h) {
      if (threadIdx.x == 0) {
        // A drain that ran attention items first finds ROUTE long done: one acquire look at
        // route[l] (which covers h(l) too: ROUTE's chain acquired it) replaces h(l)'s and the
        // route's waits, and the first claim is made before h stages (2026-11-30: norm wait,
        // staging, route wait and claim in turn made ~8.5 us between a BS 8 SM's last attention
        // item and its first up tile; ptxas spills early_c at once, so the claim's round trip is
        // paid here rather than overlapping the staging). Measured neutral.
        early = wait_counter(p, s_desc[MK_F_WAIT0 + 2], s_desc[MK_F_WAIT0 + 3], s_desc[MK_F_ID], false);
        if (early) early_c = atomicAdd((unsigned int*)p.counters + p.dyn_base + s_desc[MK_F_A1] * (p.num_experts + 1), 1u);
        s_flag = early || wait_counter(p, s_desc[MK_F_WAIT0], s_desc[MK_F_WAIT0 + 1], s_desc[MK_F_ID]);
      }
      __syncthreads();
      if (!s_flag) {
        return;
      }
      stage_h_once(s_params, s_desc[MK_F_LAYER], s, s_rows);  // its closing barrier: see there
    }
    if (threadIdx.x == 0) {
      s_flag = early || wait_task(p, s_desc, true, pre_h ? 1 : 0);
      if (p.timeline) s_t1 = globaltimer();
    }
    __syncthreads();
    if (!s_flag) {
      return;
    }
    const int kind = s_desc[MK_F_A0], arg = s_desc[MK_F_A1], mlp_c = s_desc[MK_F_A2];
    // host queues: their (first item, length, head counter); MoE queues: the attention tail's
    const int tail = s_desc[MK_F_A3];
    const int* qi = kind == MK_QUEUE_HOST ? (const int*)p.queue_info + arg * 4
                    : tail >= 0           ? (const int*)p.queue_info + tail * 4
                                          : nullptr;
    unsigned int* head = (unsigned int*)p.counters +
                         (kind == MK_QUEUE_HOST ? qi[2] : p.dyn_base + arg * (p.num_experts + 1));
    const uint32_t head_base = kind == MK_QUEUE_HOST ? ((const uint32_t*)p.base)[qi[2]] : 0u;
    // While item i runs, item i+1's words are on their way into shared memory (drain_fetch) and,
    // while more than `window` (n_sms) items remain before s_far (a host queue's end; a MoE queue's last up tile),
    // the claim of item i+2 is in flight. Beyond that a drain claims its next item only when it is
    // free: an item claimed ahead waits for the running one even when other SMs sit idle (one wave
    // of attention items at BS 1 ran as half a wave of pairs), and a MoE tail or down item claimed
    // ahead may wait on its dependencies too. A drain stops at its first claim past the end;
    // host-queue drains then top their claims up to exactly two past the end (schedule.py counts
    // items + 2 per drain).
    uint32_t claim_far = 0;  // thread 0: the claim in flight (valid when far)
    bool far = false;
    const uint32_t window = (uint32_t)p.n_sms;
    // Tiling.attn_in_moe = 3: the head items are claimed before ROUTE; drain_late_route sets up the
    // MoE part at the first claim past them (until then the queue's end is unknown: s_nact < 0)
    const bool late = kind == MK_QUEUE_MOE && s_desc[MK_F_A4] == MK_DRAIN_LATE_ROUTE;
    if (kind != MK_QUEUE_HOST && !late && threadIdx.x >= 32) {  // warps 1..: beside thread 0's claim
      // rows past n_act are never read; ROUTE published the table (we waited for route[l])
      const int words = min(ETAB_WORDS, p.num_experts * ETAB_STRIDE);
      for (int w = threadIdx.x - 32; w < words; w += NT - 32) s_etab[w] = ld_cg(View(p).expert_tab(arg) + w);
    }
    if (threadIdx.x == 0) {
      const uint32_t c0 = (early ? early_c : atomicAdd(head, 1u)) - head_base;
      s_moe_head = kind == MK_QUEUE_HOST || qi == nullptr ? 0 : max(0, qi[MK_MOE_HEAD]);
      if (late) {  // lazy claims over the head, like an attention drain's
        s_nact = -1;
        s_far = 0;
      } else {
        // (drain_late_route sets the same words for a late-route drain; folding both into one helper
        // changed 167 opcodes of this kernel's own code and its spills, 2026-12-02)
        s_nact = kind == MK_QUEUE_HOST ? 0 : ld_cg(View(p).moe_info(arg));  // ROUTE published it (we waited)
        s_far = kind == MK_QUEUE_HOST ? (uint32_t)qi[1] : (uint32_t)MoeQueue(p, s_nact, qi).n_up;
      }
      s_claim = c0;
      far = c0 + window < s_far;
      if (far) claim_far = atomicAdd(head, 1u);
    }
    __syncthreads();
    // the next item's words into s_raw; a late-route drain's first claim past its head first sets
    // up the MoE part (uniform: s_nact and s_claim are written by thread 0 before a barrier)
    // (false: the step was abandoned, no copy left in flight)
    auto fetch = [&]() -> bool {
      if (s_nact < 0 && s_claim >= (uint32_t)s_moe_head &&
          !drain_late_route(s_params, s_desc, qi, s, s_rows, s_etab, &s_nact, &s_far, &s_flag)) {
        cp_async_wait_all();
        return false;
      }
      drain_fetch(p, kind, qi, arg, s_claim, s_nact, s_raw, s_etab);
      return true;
    };
    if (!fetch()) return;
    while (true) {
      cp_async_wait_all();
      __syncthreads();  // the item's words are in s_raw
      const uint32_t idx = s_claim;
      const bool got = drain_build(p, kind, qi, arg, idx, s_nact, mlp_c, s_raw, s_item);
      __syncthreads();
      if (!got) break;
      // Lazy claims (mk_abi.h): within `window` items of s_far the next item is claimed only after
      // this one ran. Uniform across the block (thread 0's `far` is not): `far` for this item was
      // idx + window < s_far, so a lazy item never has a claim in flight.
      const bool lazy = idx + window >= s_far;
      if (!lazy) {
        if (threadIdx.x == 0) {
          if (far) {  // the next item's claim has been in flight since the last item
            const uint32_t c = claim_far - head_base;
            s_claim = c;
            far = c + window < s_far;
            if (far) claim_far = atomicAdd(head, 1u);
            s_pend = 0;
          } else {  // claim the next item now, read its index after this one ran. (2026-11-30: this
            // does not hide the atomic's round trip as meant: ptxas spills claim_far to local memory
            // right after the atomic, and the spill store waits for it (SASS: ATOMG, then STL of its
            // register); the far claim above likewise. Kept: measured neutral against the claim
            // read here.)
            claim_far = atomicAdd(head, 1u);
            s_pend = 1;
          }
        }
        __syncthreads();
        if (!s_pend && !fetch()) return;  // s_raw is free
      }
      if (!run_task(p, s_item, s, s_rows, &s_flag, &s_tl_n)) {
        cp_async_wait_all();  // no copy may land after the block has left
        return;
      }
      __syncthreads();  // run_task's barriers: everyone read s_pend before thread 0 writes it below
      if (!lazy && s_pend) {
        if (threadIdx.x == 0) s_claim = claim_far - head_base;  // far stays false
        __syncthreads();
        if (!fetch()) return;
      }
      if (lazy) {
        if (threadIdx.x == 0) s_claim = atomicAdd(head, 1u) - head_base;  // far stays false
        __syncthreads();
        if (!fetch()) return;
      }
    }
    // one claim past the end stopped us (none is in flight then: it was not far from the end);
    // one more makes the two per drain that the host queue's step total counts
    if (threadIdx.x == 0 && kind == MK_QUEUE_HOST) atomicAdd(head, 1u);
    if (threadIdx.x == 0) {
      tl_marks[0] = tl_marks[1] = 0;
      tl_record(p, &s_tl_n, MK_OP_DRAIN, s_desc[MK_F_LAYER], 0, s_t0, s_t1, s_t1);
    }
    advance(s_desc, s_next, ahead, lane_w, mine, i, n);
  }
}

}  // namespace mk
