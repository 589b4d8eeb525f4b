// mk_attn.cuh: split-KV paged decode attention of one (row, kv head, split) on the tensor cores.
// Included by mk_kernel.cuh after View and Smem. Semantics: emulator_ops (ATTN): the split's
// normalised output o_part and its log-sum-exp lse_part, combined later by ATTN_COMBINE.
//
// Two implementations: at d = 128 attn_warp_t (16 independent warp pipelines, below), for d = 32
// and 64 attn_mma_t, the page ring described next. (Measured and removed: at d = 128 the page ring
// (BS 1 4.29 vs 4.03 ms, 2026-11-30) and K in registers with lock-step warp pairs (BS 8 9.00 vs 8.77
// ms, 2026-12-01).)
//
// attn_mma_t's data flow: the item's K/V pages stream through a ring of ATTN_STAGES shared-memory page slots by
// cp.async (16 B per thread-copy, L2 only). The first ATTN_STAGES pages are issued BEFORE the
// item's dependency wait (they were written by earlier steps), except the current token's row,
// which this step's QKV writes: that row is read after the wait. Keys outside the visible range are
// zero-filled, so no NaN of an unwritten slot reaches the PV product.
//
// Math per warp (NWARPS/2 key groups x 2 halves of the head dimension): a key group is 16 keys of
// one page, so a round covers PPR = NWARPS/8 pages (2 with 16 warps, 1 with 8). S = Q K^T with
// mma.m16n8k16 (A = the kv head's G <= 8 query heads as rows 0..7, B = K rows straight from shared
// memory: 16 contiguous bytes per thread are the k slots {2t,2t+1,2t+8, 2t+9} of two k16 steps, for
// Q and K alike); an online softmax in base 2 per warp; the S accumulator becomes the A operand of
// O += P V (the FlashAttention-2 register reuse), with V's B fragments from ldmatrix.trans. The
// warps' partial (m, l, O) merge in shared memory at the end.
#pragma once

namespace mk {

constexpr int ATTN_PPR = NWARPS / 8;  // pages per round (4 key groups of 16 keys per page)
static_assert(NWARPS % 8 == 0, "the attention needs a multiple of 8 warps");
// Page slots of K and V: one round in flight. Two rounds (151 KB at d = 128) made the block's
// shared memory so large that the SM's L1 share shrank, and every global load path slowed down:
// measured on the H200, 64 KB more shared memory (MKCODE_MK_SMEM_PAD) cost 25 % at BS 1.
constexpr int ATTN_STAGES = ATTN_PPR;

template <int HD>
struct AttnShape {
  // K rows: stride = 16 banks mod 32, so the two rows of one 8-lane phase use disjoint banks
  static constexpr int KLD = HD + ((HD % 64) == 0 ? 32 : 0);
  // V rows: stride = 4 banks mod 32, so the 8 rows of an ldmatrix are conflict-free
  static constexpr int VLD = HD + 8;
  static constexpr int PAGE_BYTES = 64 * (KLD + VLD) * 2;
  static constexpr int STAGE_BYTES = ATTN_STAGES * PAGE_BYTES;
  static constexpr int MERGE_BYTES = NWARPS * 8 * (HD / 2) * 4 + 2 * NWARPS * 8 * 4;
  static constexpr int SMEM = STAGE_BYTES > MERGE_BYTES ? STAGE_BYTES : MERGE_BYTES;
};

// The geometries the attention runs (the release geometry is G = 8, d = 128): a kv head's G query
// heads fill one 8-wide side of the mma tiles (G <= 8), and d picks an instantiation. The launcher
// refuses others, as MegakernelBackend does at construction (backend.py check_geometry).
inline bool attn_supported(const Params& p) {
  const int G = p.num_heads / p.num_kv_heads;
  return G <= MK_ATTN_MAX_GROUP && (p.head_dim == MK_ATTN_HEAD_DIM_32 || p.head_dim == MK_ATTN_HEAD_DIM_64 ||
                                    p.head_dim == MK_ATTN_HEAD_DIM_128);
}

__host__ __device__ inline size_t attn_smem(int hd) {
  return hd == 32 ? AttnShape<32>::SMEM : hd == 64 ? AttnShape<64>::SMEM : AttnShape<128>::SMEM;
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32(p)));
}

// O^T's accumulator fragments (NTM m16 tiles of dims; columns: heads 2t, 2t + 1) times their heads'
// factors c0, c1: the online softmax's rescale on a new maximum (attn_warp_t).
template <int NTM>
__device__ __forceinline__ void scale_ot(float (&o)[NTM][4], float c0, float c1) {
#pragma unroll
  for (int n = 0; n < NTM; ++n) {
    o[n][0] *= c0;
    o[n][1] *= c1;
    o[n][2] *= c0;
    o[n][3] *= c1;
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The visible keys [a, e) of one split and its pages (logical page indices pa .. pa + np - 1).
struct AttnSpan {
  long long pos, a, e;
  long long pa;
  int np;
};

__device__ __forceinline__ AttnSpan attn_span(const Params& p, const View& V, const int* d) {
  const int l = d[MK_F_LAYER], b = d[MK_F_A0], split = d[MK_F_A2], S = d[MK_F_A3];
  AttnSpan sp;
  sp.pos = V.position(b);
  const long long lo = V.first_visible(l, sp.pos);
  const long long p_lo = lo / 64, p_hi = sp.pos / 64;
  const long long per = (p_hi - p_lo + 1 + S - 1) / S;
  sp.a = (p_lo + split * per) * 64;
  sp.e = (p_lo + (split + 1) * per) * 64;
  if (sp.a < lo) sp.a = lo;
  if (sp.e > sp.pos + 1) sp.e = sp.pos + 1;
  sp.pa = sp.a / 64;
  sp.np = sp.a < sp.e ? (int)((sp.e - 1) / 64 - sp.pa + 1) : 0;
  return sp;
}

// Where one ATTN item's results go: the O rows [G][HD] and LSE values of its (row, kv head, split).
template <int HD>
struct AttnOut {
  float* o;
  float* lse;
  int split, stride, G;
  __device__ AttnOut(const Params& p, const int* d) {
    const int l = d[MK_F_LAYER], b = d[MK_F_A0], kvh = d[MK_F_A1];
    G = p.num_heads / p.num_kv_heads;
    split = d[MK_F_A2];
    stride = p.max_splits;
    o = (float*)p.o_part + ((((size_t)l * 8 + b) * p.num_heads + kvh * G) * stride) * HD;
    lse = (float*)p.lse_part + (((size_t)l * 8 + b) * p.num_heads + kvh * G) * stride;
  }
  // an item that sees no key: O = 0 and LSE = -inf (the combine weighs it zero)
  __device__ __noinline__ void empty() const {
    for (int i = threadIdx.x; i < G * HD; i += NT) o[((size_t)(i / HD) * stride + split) * HD + i % HD] = 0.f;
    if ((int)threadIdx.x < G) lse[threadIdx.x * stride + split] = -INFINITY;
  }
  // the block's merge of the warps' partial softmax states, in shared memory after the key loop:
  // Ms, Ls [NWARPS][8] (row max in log2 units, sum of exponentials; head rows), Os [NWARPS][8][HD/2]
  // (warp 2k + h holds dims h * HD/2 .. of its keys). Out of line: inlined, it made attn_mma_t<128>'s
  // key loop keep 56 values in local memory instead of 7 (mkcode kernels loops).
  __device__ __noinline__ void merge(const float* Ms, const float* Ls, const float* Os) const {
    for (int i = threadIdx.x; i < G * HD; i += NT) {
      const int hq = i / HD, dim = i % HD, h = dim / (HD / 2), dl = dim % (HD / 2);
      float M = -INFINITY;
#pragma unroll
      for (int k = 0; k < NWARPS / 2; ++k) M = fmaxf(M, Ms[(2 * k + h) * 8 + hq]);
      float num = 0.f, den = 0.f;
#pragma unroll
      for (int k = 0; k < NWARPS / 2; ++k) {
        const int w = 2 * k + h;
        const float f = exp2f(Ms[w * 8 + hq] - M);  // 0 for a warp that saw no key
        den += Ls[w * 8 + hq] * f;
        num += Os[(w * 8 + hq) * (HD / 2) + dl] * f;
      }
      o[((size_t)hq * stride + split) * HD + dim] = num / den;
      if (dim == 0) lse[hq * stride + split] = M * 0.6931471805599453f + logf(den);
    }
  }
};

// Q of head gid (rows >= G zero) as the QK's A operand, chunk c (this thread's 8 dims at c * 32 +
// t * 8): pre-scaled into log2 units, bf16 pairs.
template <int HD>
__device__ __forceinline__ uint4 q_fragment(const Params& p, const View& V, const int* d, int G, int gid, int t,
                                            int c) {
  const float scale = p.attn_scale * 1.4426950408889634f;
  const int b = d[MK_F_A0], kvh = d[MK_F_A1];
  const float* qsrc = V.q(d[MK_F_LAYER]) + (size_t)b * V.QW() + (size_t)(kvh * G + (gid < G ? gid : 0)) * HD + t * 8;
  float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
  if (gid < G) {
    x0 = ld_cg4(qsrc + c * 32);
    x1 = ld_cg4(qsrc + c * 32 + 4);
  }
  return make_uint4(pack_bf16(x0.x * scale, x0.y * scale), pack_bf16(x0.z * scale, x0.w * scale),
                    pack_bf16(x1.x * scale, x1.y * scale), pack_bf16(x1.z * scale, x1.w * scale));
}

// Issue page j of the item into slot j % ATTN_STAGES and commit one cp.async group (empty past the
// item's pages, so every thread's group count stays uniform). `before_wait`: skip the current
// token's row (this step's QKV has not written it yet).
template <int HD>
__device__ __forceinline__ void attn_issue(const View& V, int l, int b, int kvh, const AttnSpan& sp, int j,
                                           unsigned char* stages, bool before_wait) {
  using SH = AttnShape<HD>;
  if (j < sp.np) {
    constexpr int CH = HD / 8;  // 16-byte chunks per row
    const long long pg = sp.pa + j;
    const int phys = V.page(l, b, (int)(pg * 64));
    bf16* Ks = reinterpret_cast<bf16*>(stages + (j % ATTN_STAGES) * SH::PAGE_BYTES);
    bf16* Vs = Ks + 64 * SH::KLD;
    const bf16* Kg = V.kv(phys, 0, kvh, 0);
    const bf16* Vg = V.kv(phys, 1, kvh, 0);
    for (int i = threadIdx.x; i < 2 * 64 * CH; i += NT) {
      const int which = i / (64 * CH), rem = i % (64 * CH), key = rem / CH, ch = rem % CH;
      const long long kp = pg * 64 + key;
      const bool ok = kp >= sp.a && kp < sp.e;
      if (before_wait && ok && kp == sp.pos) continue;
      const bf16* src = (which ? Vg : Kg) + key * HD + ch * 8;
      bf16* dst = (which ? Vs + key * SH::VLD : Ks + key * SH::KLD) + ch * 8;
      cp_async16(dst, src, ok);
    }
  }
  cp_async_commit();
}

template <int HD>
__device__ __noinline__ void attn_prologue_t(const Params& p, const int* d, Smem& s) {
  View V(p);
  const AttnSpan sp = attn_span(p, V, d);
  if (sp.np == 0) return;
  for (int j = 0; j < ATTN_STAGES; ++j)
    attn_issue<HD>(V, d[MK_F_LAYER], d[MK_F_A0], d[MK_F_A1], sp, j, s.raw, true);
}

// d = 128 takes the warp pipelines below (attn_warp_t), other head dims the page ring above.
__host__ __device__ inline bool attn_warps(const Params& p) { return p.head_dim == 128; }

// ---- the d = 128 default: sixteen independent warp pipelines --------------------------------
//
// Warps in lock-step (pairs exchanging row maxima and P halves, three block barriers per round of two
// pages) waited every round for the slowest warp's loads (~3 us per round of 64 KB, 2026-12-01).
// Here each warp owns whole groups of 16 keys (group g = 16 keys of page g / 4; warp w takes
// groups w, w + NWARPS, ...), i.e. 4 pages per block round, and needs nobody else until the merge:
// - K of its 16 keys straight into registers (lane (gid, t): keys gid and gid + 8, the 8 dims at
//   c * 32 + t * 8 of each chunk c: the k slots {2t, 2t+1, 2t+8, 2t+9} of two k16 steps, as Q's);
//   the next group's K is issued right after this group's QK;
// - V of its 16 keys by its own cp.async into its own slot (16 rows), issued after its PV;
// - S^T = K Q^T with K as the A operand (16 keys x 16 dims, no zero half), Q^T's B fragments from
//   shared memory; c0, c1: key gid, heads 2t, 2t + 1; c2, c3: key gid + 8;
// - the online softmax per head over the warp's keys (row maxima by shuffles over gid), so a lane's
//   correction factors are those of its own O^T columns (heads 2t, 2t + 1);
// - P^T into the PV's B fragments by movmatrix.trans (the accumulator layout transposed);
// - O^T += V^T P^T: A = V^T from ldmatrix.trans (16 dims x 16 keys), 8 m16 tiles of dims (32
//   accumulators).
// The warps' (m, l, O) merge in shared memory at the end (68 KB: every warp holds all 128 dims).
// 299 SASS instructions per 16-key round, no local memory (mkcode kernels loops, 2026-12-01).
template <int HD>
struct WarpAttn {
  static constexpr int KEYS = 16;               // keys per warp group
  static constexpr int VLD = HD + 8;            // V rows: 4 banks apart, ldmatrix conflict-free
  static constexpr int SLOT = KEYS * VLD;       // bf16 per warp's V slot
  static constexpr int V_BYTES = NWARPS * SLOT * 2;
  static constexpr int Q_BYTES = (HD / 32) * 32 * 16;
  static constexpr int OS = HD + 4;             // merge rows: 4 banks apart
  static constexpr int MERGE_BYTES = NWARPS * 8 * OS * 4 + 2 * NWARPS * 8 * 4;
};

__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}

// A warp's copy of its 16-key group's V rows into its slot: lane copies 16-byte chunk lane % 16 of
// rows lane / 16 + 2m (src, dst: that lane's first chunk; rows HD / VLD elements apart), 8 copies,
// keys outside [lo, hi) zero-filled, key `skip` not copied (the current token's before the wait:
// this step's QKV has not written it yet; -1: none). No commit.
template <int HD>
__device__ __forceinline__ void warp_copy_v(const bf16* src, bf16* dst, int lo, int hi, int skip) {
  using W = WarpAttn<HD>;
  static_assert(HD / 8 == 16, "a lane copies 16-byte chunk lane % 16 of every other row");
  const int k0 = (threadIdx.x % 32) >> 4;
#pragma unroll
  for (int m = 0; m < W::KEYS / 2; ++m) {
    const int key = k0 + 2 * m;
    if (key == skip) continue;
    cp_async16(dst + 2 * m * W::VLD, src + 2 * m * HD, key >= lo && key < hi);
  }
}

// 16 bytes from L2 into r when `pred` holds, else r unchanged (no zeroing: masked keys' garbage is
// dropped by the softmax mask); volatile: issued where written, not sunk to the first use.
__device__ __forceinline__ void ld_cg16_keep(uint4& r, const void* p, bool pred) {
  asm volatile(
      "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t@q ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];\n\t}"
      : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w)
      : "l"(p), "r"((int)pred)
      : "memory");
}

// The d = 128 item with its dependency wait inside (run_task leaves the wait to it; false: the step
// was abandoned). Before the wait, from pages earlier steps wrote: each warp's first group, K into
// its registers and V into its slot, and its next round's page id; the current token's row (this
// step's QKV writes it) is skipped and loaded after the wait, with Q. So the item's first keys cost
// no round trip after its inputs are ready: only Q's load does.
template <int HD>
__device__ __noinline__ bool attn_warp_t(const Params& p, const int* d, Smem& s, int* flag) {
  using W = WarpAttn<HD>;
  constexpr int NC = HD / 32;
  constexpr int CH = HD / 8;
  constexpr int NTM = HD / 16;  // m16 tiles of dims
  static_assert(CH == 16, "a V row is 16 chunks: lane copies chunk lane % 16 of every other row");
  static_assert(W::V_BYTES + W::Q_BYTES <= AttnShape<HD>::SMEM, "V slots and Q must fit");
  static_assert(W::MERGE_BYTES <= AttnShape<HD>::SMEM, "the merge scratch must fit");
  View V(p);
  const int l = d[MK_F_LAYER], b = d[MK_F_A0], kvh = d[MK_F_A1];
  const int G = p.num_heads / p.num_kv_heads;
  const AttnSpan sp = attn_span(p, V, d);
  const AttnOut<HD> out(p, d);  // where this (row, kv head, split)'s O rows and LSE values go
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  // Group g = 4 j + (warp & 3) of page j: this warp's pages are j = warp / 4 + 4 r, always its keys
  // ko .. ko + 15 of them. Addresses as a page base plus per-lane element offsets; the visible range
  // in keys relative to page 0's key ko (minus 64 j for page j): 32-bit math in the loop.
  const int ko = (warp & 3) * 16, nj = sp.np;
  const bf16* pool = (const bf16*)p.kv_pool;
  const size_t page_elems = (size_t)2 * p.num_kv_heads * 64 * HD;
  const int offK = (kvh * 64 + ko + gid) * HD + t * 8;  // key gid; key gid + 8 is 8 rows on
  const int offV = ((p.num_kv_heads + kvh) * 64 + ko + (lane >> 4)) * HD + (lane & 15) * 8;
  const int* bt = (const int*)p.block_tables + ((size_t)l * p.batch + b) * p.max_pages + sp.pa;
  const int a_rel = (int)(sp.a - sp.pa * 64) - ko, e_rel = (int)(sp.e - sp.pa * 64) - ko;
  bf16* slot = shared(reinterpret_cast<bf16*>(s.raw)) + warp * W::SLOT;
  bf16* vdst = slot + (lane >> 4) * W::VLD + (lane & 15) * 8;
  const uint4* qs = shared(reinterpret_cast<const uint4*>(s.raw + W::V_BYTES));  // [NC][32 lanes]
  uint4 k0[NC], k1[NC];
  // this lane's K of keys gid (k0) and gid + 8 (k1) of a group, each when its predicate holds
  auto issue_k = [&](int phys, bool pred0, bool pred1) {
    const bf16* K0 = pool + (size_t)phys * page_elems + offK;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      ld_cg16_keep(k0[c], K0 + c * 32, pred0);
      ld_cg16_keep(k1[c], K0 + 8 * HD + c * 32, pred1);
    }
  };
  int j = warp >> 2;
  const int phys0 = j < nj ? bt[j] : 0;
  // the current token's key within this warp's first group (-1: not there)
  const long long kb = (sp.pa + j) * 64 + ko;  // the group's first key
  const int own = j < nj && sp.pos >= kb && sp.pos < kb + 16 ? (int)(sp.pos - kb) : -1;
#pragma unroll
  for (int c = 0; c < NC; ++c) k0[c] = k1[c] = make_uint4(0u, 0u, 0u, 0u);
  issue_k(phys0, j < nj && gid != own, j < nj && gid + 8 != own);
  if (j < nj) warp_copy_v<HD>(pool + (size_t)phys0 * page_elems + offV, vdst, a_rel - 64 * j, e_rel - 64 * j, own);
  cp_async_commit();
  int phys_n = j + 4 < nj ? bt[j + 4] : 0;  // one round ahead: the next K issue needs no dependent load
  if (!block_wait(p, d, flag, false)) return false;
  if (nj == 0) {
    out.empty();
    return true;
  }
  // the current token's K (its lanes) and V row (into its owner's slot), written by this step's QKV
  if (own >= 0) {
    issue_k(phys0, gid == own, gid + 8 == own);
    if (lane < CH) {
      const uint4 v = ld_cg16(pool + (size_t)phys0 * page_elems + ((p.num_kv_heads + kvh) * 64 + ko + own) * HD + lane * 8);
      *reinterpret_cast<uint4*>(slot + own * W::VLD + lane * 8) = v;
    }
  }
  // Q^T's B fragments (head gid, pre-scaled into log2 units; heads >= G zero), by warp 0
  if (warp == 0) {
    uint4* qw = shared(reinterpret_cast<uint4*>(s.raw + W::V_BYTES));
#pragma unroll
    for (int c = 0; c < NC; ++c) qw[c * 32 + lane] = q_fragment<HD>(p, V, d, G, gid, t, c);
  }
  __syncthreads();  // Q is in shared memory (the only block barrier before the merge)
  if (p.timeline && threadIdx.x == 0) tl_marks[0] = globaltimer();  // timeline: the key loop starts
  float o[NTM][4];
#pragma unroll
  for (int n = 0; n < NTM; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads 2t, 2t + 1; l: this lane's keys
  const bf16* vrow = slot + ((lane & 7) + ((lane >> 4) & 1) * 8) * W::VLD + ((lane >> 3) & 1) * 8;
#pragma unroll 1
  for (; j < nj; j += 4) {
    const int lo = a_rel - 64 * j, hi = e_rel - 64 * j;  // the group's visible keys: [lo, hi) of 0..15
    // 1. S^T = K Q^T (waits for this group's K)
    float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const uint4 qb = qs[c * 32 + lane];
      mma16816(sc, k0[c].x, k1[c].x, k0[c].y, k1[c].y, qb.x, qb.y);
      mma16816(sc, k0[c].z, k1[c].z, k0[c].w, k1[c].w, qb.z, qb.w);
    }
    // 2. the next group's K (its page id was loaded a round ago), and the page id after it
    const int jn = j + 4, phys_c = phys_n;
    issue_k(phys_c, jn < nj, jn < nj);
    phys_n = jn + 4 < nj ? bt[jn + 4] : 0;
    // 3. online softmax of heads 2t, 2t + 1 over the group's keys
    if (lo < 16 && hi > 0) {  // warp-uniform: a visible key in the group
      if (gid < lo || gid >= hi) sc[0] = sc[1] = -INFINITY;  // also drops unwritten slots' garbage
      if (gid + 8 < lo || gid + 8 >= hi) sc[2] = sc[3] = -INFINITY;
      float x0 = fmaxf(sc[0], sc[2]), x1 = fmaxf(sc[1], sc[3]);
#pragma unroll
      for (int sh = 4; sh < 32; sh <<= 1) {
        x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, sh));
        x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, sh));
      }
      const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);  // finite: the group has a visible key
      const float c0 = exp2f(m0 - n0), c1 = exp2f(m1 - n1);
      const float p00 = exp2f(sc[0] - n0), p01 = exp2f(sc[1] - n1);
      const float p10 = exp2f(sc[2] - n0), p11 = exp2f(sc[3] - n1);
      l0 = l0 * c0 + (p00 + p10);
      l1 = l1 * c1 + (p01 + p11);
      if (__any_sync(0xffffffffu, n0 != m0 || n1 != m1)) scale_ot(o, c0, c1);  // a new maximum: rescale O^T
      m0 = n0;
      m1 = n1;
      // P^T's B fragments: (key gid, heads 2t..) transposed to (head gid, keys 2t..)
      const uint32_t b0 = movmatrix_trans(pack_bf16(p00, p01)), b1 = movmatrix_trans(pack_bf16(p10, p11));
      // 4. O^T += V^T P^T once this group's V has landed
      cp_async_wait_all();
      __syncwarp();
#pragma unroll
      for (int n = 0; n < NTM; ++n) {
        uint32_t a0, a1, a2, a3;
        ldsm_x4_trans(a0, a1, a2, a3, vrow + n * 16);
        mma16816(o[n], a0, a1, a2, a3, b0, b1);
      }
    } else {
      cp_async_wait_all();
    }
    __syncwarp();  // every lane's ldmatrix of the slot is done before it is overwritten
    // 5. the next group's V into the slot (keys outside its visible range zero-filled)
    if (jn < nj) warp_copy_v<HD>(pool + (size_t)phys_c * page_elems + offV, vdst, lo - 256, hi - 256, -1);
    cp_async_commit();
  }
  cp_async_wait_all();
#pragma unroll
  for (int sh = 4; sh < 32; sh <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, sh);
    l1 += __shfl_xor_sync(0xffffffffu, l1, sh);
  }
  __syncthreads();  // every warp is done with its V slot: the slots become the merge scratch
  if (p.timeline && threadIdx.x == 0) tl_marks[1] = globaltimer();  // timeline: the key loop ended
  float* Ms = shared(reinterpret_cast<float*>(s.raw));
  float* Ls = Ms + NWARPS * 8;
  float* Os = Ls + NWARPS * 8;  // [NWARPS][8 heads][OS]
  if (gid == 0) {
    Ms[warp * 8 + 2 * t] = m0;
    Ms[warp * 8 + 2 * t + 1] = m1;
    Ls[warp * 8 + 2 * t] = l0;
    Ls[warp * 8 + 2 * t + 1] = l1;
  }
#pragma unroll
  for (int n = 0; n < NTM; ++n) {
    float* h0 = Os + (warp * 8 + 2 * t) * W::OS + n * 16 + gid;  // head 2t; head 2t + 1 one row on
    h0[0] = o[n][0];
    h0[W::OS] = o[n][1];
    h0[8] = o[n][2];
    h0[W::OS + 8] = o[n][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * HD; i += NT) {
    const int hq = i / HD, dim = i % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < NWARPS; ++w) M = fmaxf(M, Ms[w * 8 + hq]);
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < NWARPS; ++w) {
      const float f = exp2f(Ms[w * 8 + hq] - M);  // 0 for a warp that saw no key
      den += Ls[w * 8 + hq] * f;
      num += Os[(w * 8 + hq) * W::OS + dim] * f;
    }
    out.o[((size_t)hq * out.stride + out.split) * HD + dim] = num / den;
    if (dim == 0) out.lse[hq * out.stride + out.split] = M * 0.6931471805599453f + logf(den);
  }
  return true;
}

// Before the dependency wait of an ATTN item on the page ring (d = 32, 64): start its first pages.
__device__ void attn_prologue(const Params& p, const int* d, Smem& s) {
  if (attn_warps(p)) return;
  if (p.head_dim == 32)
    attn_prologue_t<32>(p, d, s);
  else
    attn_prologue_t<64>(p, d, s);
}

template <int HD>
__device__ __noinline__ void attn_mma_t(const Params& p, const int* d, Smem& s) {
  using SH = AttnShape<HD>;
  View V(p);
  const int l = d[MK_F_LAYER], b = d[MK_F_A0], kvh = d[MK_F_A1];
  const AttnSpan sp = attn_span(p, V, d);
  const int G = p.num_heads / p.num_kv_heads;
  if (sp.np == 0) {
    AttnOut<HD>(p, d).empty();
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  const int kg = warp >> 1, half = warp & 1;
  constexpr int CH = HD / 8;
  // the current token's K/V row (written by this step's QKV) into its slot, if the prologue skipped it
  if (sp.pos >= sp.a && sp.pos < sp.e) {
    const int j = (int)(sp.pos / 64 - sp.pa);
    if (j < ATTN_STAGES && threadIdx.x < 2 * CH) {
      const int which = threadIdx.x / CH, ch = threadIdx.x % CH, key = (int)(sp.pos % 64);
      const int phys = V.page(l, b, (int)sp.pos);
      const uint4 v = ld_cg16(V.kv(phys, which, kvh, key) + ch * 8);
      bf16* Ks = reinterpret_cast<bf16*>(s.raw + (j % ATTN_STAGES) * SH::PAGE_BYTES);
      bf16* dst = which ? Ks + 64 * SH::KLD + key * SH::VLD : Ks + key * SH::KLD;
      *reinterpret_cast<uint4*>(dst + ch * 8) = v;
    }
  }
  // Q's A-operand fragments, in registers
  constexpr int NC = HD / 32;
  uint32_t qa[NC][4];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const uint4 q = q_fragment<HD>(p, V, d, G, gid, t, c);
    qa[c][0] = q.x, qa[c][1] = q.y, qa[c][2] = q.z, qa[c][3] = q.w;
  }
  constexpr int NTD = HD / 16;  // n-tiles of 8 dims in this warp's half of the head dimension
  float o[NTD][4];
#pragma unroll
  for (int n = 0; n < NTD; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m = -INFINITY, lsum = 0.f;
  const int rounds = (sp.np + ATTN_PPR - 1) / ATTN_PPR;
  for (int r = 0; r < rounds; ++r) {
    cp_async_wait<ATTN_STAGES - ATTN_PPR>();  // this round's pages have landed (this thread's copies)
    __syncthreads();                           // ... and everyone's
    const int j = ATTN_PPR * r + (kg >> 2);
    if (j < sp.np) {
      const bf16* Ks = reinterpret_cast<const bf16*>(s.raw + (j % ATTN_STAGES) * SH::PAGE_BYTES) + (kg & 3) * 16 * SH::KLD;
      const bf16* Vs = reinterpret_cast<const bf16*>(s.raw + (j % ATTN_STAGES) * SH::PAGE_BYTES) + 64 * SH::KLD +
                       (kg & 3) * 16 * SH::VLD;
      float sc[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
        const bf16* kr = Ks + (nt * 8 + gid) * SH::KLD + t * 8;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const uint4 kx = *reinterpret_cast<const uint4*>(kr + c * 32);
          mma16816(sc[nt], qa[c][0], 0u, qa[c][1], 0u, kx.x, kx.y);
          mma16816(sc[nt], qa[c][2], 0u, qa[c][3], 0u, kx.z, kx.w);
        }
      }
      // c0, c1 of n-tile nt: head gid, keys nt*8 + 2t, +1 of the group
      const long long k0 = (sp.pa + j) * 64 + (kg & 3) * 16 + 2 * t;
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const long long kp = k0 + nt * 8 + c;
          if (kp < sp.a || kp >= sp.e) sc[nt][c] = -INFINITY;
          mx = fmaxf(mx, sc[nt][c]);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m, mx);
      if (m_new != -INFINITY) {  // the same for the whole quad (one head)
        const float corr = exp2f(m - m_new);
        const float p00 = exp2f(sc[0][0] - m_new), p01 = exp2f(sc[0][1] - m_new);
        const float p10 = exp2f(sc[1][0] - m_new), p11 = exp2f(sc[1][1] - m_new);
        lsum = lsum * corr + (p00 + p01 + p10 + p11);
        m = m_new;
#pragma unroll
        for (int n = 0; n < NTD; ++n) {
          o[n][0] *= corr;
          o[n][1] *= corr;
        }
        const uint32_t pa0 = pack_bf16(p00, p01), pa2 = pack_bf16(p10, p11);
        const bf16* vrow = Vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * SH::VLD + half * (HD / 2) + (lane >> 4) * 8;
#pragma unroll
        for (int n = 0; n < NTD; n += 2) {
          uint32_t v0, v1, v2, v3;
          ldsm_x4_trans(v0, v1, v2, v3, vrow + n * 8);
          mma16816(o[n], pa0, 0u, pa2, 0u, v0, v1);
          mma16816(o[n + 1], pa0, 0u, pa2, 0u, v2, v3);
        }
      }
    }
    __syncthreads();  // slots of this round are free
#pragma unroll
    for (int i = 0; i < ATTN_PPR; ++i) attn_issue<HD>(V, l, b, kvh, sp, ATTN_PPR * r + ATTN_STAGES + i, s.raw, false);
  }
  cp_async_wait_all();
  lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
  lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
  __syncthreads();  // the page slots become the merge scratch
  float* Ms = reinterpret_cast<float*>(s.raw);
  float* Ls = Ms + NWARPS * 8;
  float* Os = Ls + NWARPS * 8;  // [NWARPS][8][HD/2]
  if (t == 0) {
    Ms[warp * 8 + gid] = m;
    Ls[warp * 8 + gid] = lsum;
  }
#pragma unroll
  for (int n = 0; n < NTD; ++n) {
    float* dst = Os + (warp * 8 + gid) * (HD / 2) + n * 8 + 2 * t;
    dst[0] = o[n][0];
    dst[1] = o[n][1];
  }
  __syncthreads();
  AttnOut<HD>(p, d).merge(Ms, Ls, Os);
}

// The ATTN op on the page ring (d = 32, 64); the caller ran attn_prologue before the wait.
__device__ void attn_mma(const Params& p, const int* d, Smem& s) {
  if (p.head_dim == 32)
    attn_mma_t<32>(p, d, s);
  else
    attn_mma_t<64>(p, d, s);
}

}  // namespace mk
