// mk_attn.cuh: split-KV paged decode attention of one (row, kv head, split) on the tensor cores.
// Included by mk_kernel.cuh after View and Smem. Semantics: emulator_ops (ATTN): the split's
// normalised output o_part and its log-sum-exp lse_part, combined later by ATTN_COMBINE.
//
// Data flow: the item's K/V pages stream through a ring of ATTN_STAGES shared-memory page slots by
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

// The tensor-core path covers the release geometry (G = 8, d = 128) and the test geometries.
__host__ __device__ inline bool attn_fast(const Params& p) {
  const int G = p.num_heads / p.num_kv_heads;
  return p.use_mma && !(p.prefetch_mode & MK_MODE_SIMT_ATTN) && G <= 8 && (p.head_dim == 32 || p.head_dim == 64 || p.head_dim == 128);
}

__host__ __device__ inline size_t attn_fast_smem(int hd) {
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
  const bool sliding = V.flags(l) & MK_LAYER_SLIDING;
  const long long lo = sliding ? (sp.pos - p.sliding_window + 1 > 0 ? sp.pos - p.sliding_window + 1 : 0) : 0;
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

// ---- the d = 128 default (MK_MODE_ATTN_SMEM_K off): every warp an independent flash-decoding worker --
//
// Session 16. The block-wide rounds before (K in registers, V through shared-memory slots, the
// warps of a pair exchanging row maxima and P halves over four block barriers per round) spent
// ~2.4-2.7 us per round of two pages at BS 1 and BS 8 alike (~25 GB/s per SM): the round was
// bound by its ~500 instructions per warp and the barriers, not by the memory. Here each warp takes
// 8-key chunks of the item's keys (chunk c: page c / 8, keys (c % 8) * 8 .. + 8 of it; warp w takes
// chunks w, w + NWARPS, ...), keeps its own online-softmax state and O^T in registers, and loads its
// chunk's K and V straight into registers one chunk ahead (V once the chunk's PV is done). No barrier until the warps' states merge.
//   QK: S = Q K^T with m16n8k16 (A = Q, rows = the kv head's G <= 8 query heads, 8 contiguous dims
//       of Q and of K row gid as the k slots {2t, 2t+1, 2t+8, 2t+9} of two k16 steps, as before).
//   PV: O^T += V^T P^T with m16n8k8 over the chunk's 8 keys: B = P^T is this thread's own QK
//       accumulator (head gid, keys 2t, 2t+1), so nothing crosses warps; A = V^T (rows = dims): the
//       thread loads keys 2t and 2t+1 at dims gid * DPT .. + DPT (contiguous) and pairs them with a
//       byte permute: tile i's row gid is dim gid * DPT + 2i, row gid + 8 is dim gid * DPT + 2i + 1.
__host__ __device__ inline bool attn_kreg(const Params& p) {
  return !(p.prefetch_mode & MK_MODE_ATTN_SMEM_K) && p.head_dim == 128;
}

__device__ __forceinline__ void mma16808(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Before the wait: L2 prefetches of the first two pages' K and V of this kv head (the warps' first
// chunks), which earlier steps wrote. A hint only: the loads after the wait read L2 either way.
// (The unused Smem keeps the call the old prologue's: the step kernel's code around it unchanged.)
template <int HD>
__device__ __noinline__ void warp_attn_prologue_t(const Params& p, const int* d, Smem&) {
  if (threadIdx.x >= 4) return;
  View V(p);
  const AttnSpan sp = attn_span(p, V, d);
  const int j = threadIdx.x >> 1, which = threadIdx.x & 1;
  if (j >= sp.np) return;
  const int phys = V.page(d[MK_F_LAYER], d[MK_F_A0], (int)((sp.pa + j) * 64));
  prefetch_l2(V.kv(phys, which, d[MK_F_A1], 0), 64 * HD * 2);
}

template <int HD>
__device__ __noinline__ void attn_warp_t(const Params& p, const int* d, Smem& s) {
  constexpr int NC = HD / 32;   // QK: 16-byte K pieces per thread (two k16 steps each)
  constexpr int DPT = HD / 8;   // PV: dims per thread
  constexpr int VQ = DPT / 8;   // 16-byte V pieces per key and thread
  constexpr int NTL = DPT / 2;  // m16 tiles of O^T per warp
  constexpr int OLD = HD + 2;   // merge rows (padded against bank conflicts of the tile stores)
  static_assert(NWARPS * 8 * OLD * 4 + 2 * NWARPS * 8 * 4 <= AttnShape<HD>::SMEM, "the merge must fit");
  static_assert(NC * 2 * 32 * 16 <= AttnShape<HD>::SMEM, "Q's fragments must fit");
  View V(p);
  const int l = d[MK_F_LAYER], b = d[MK_F_A0], kvh = d[MK_F_A1], split = d[MK_F_A2];
  const int G = p.num_heads / p.num_kv_heads;
  const AttnSpan sp = attn_span(p, V, d);
  float* o_base = (float*)p.o_part + ((((size_t)l * 8 + b) * p.num_heads + kvh * G) * p.max_splits) * HD;
  float* lse_base = (float*)p.lse_part + (((size_t)l * 8 + b) * p.num_heads + kvh * G) * p.max_splits;
  if (sp.np == 0) {
    for (int i = threadIdx.x; i < G * HD; i += NT) o_base[((size_t)(i / HD) * p.max_splits + split) * HD + i % HD] = 0.f;
    if (threadIdx.x < G) lse_base[threadIdx.x * p.max_splits + split] = -INFINITY;
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, t = lane & 3;
  const int nchunks = sp.np * 8;
  // Chunk c's keys are pa * 64 + 8c .. + 8 (pages are consecutive in the item), i.e. keys ka + 8c ..
  // relative to the first visible key a; visible ones are those in [0, ne). Per-item constants keep
  // the per-chunk address math to one block-table load and one wide multiply.
  const int ka = (int)(sp.pa * 64 - sp.a), ne = (int)(sp.e - sp.a);
  const int* bt = (const int*)p.block_tables + ((size_t)l * p.batch + b) * p.max_pages + sp.pa;
  const int page_elems = 2 * p.num_kv_heads * 64 * HD;
  const bf16* kbase = (const bf16*)p.kv_pool + (size_t)kvh * 64 * HD + gid * HD + t * 8;
  const bf16* vbase = (const bf16*)p.kv_pool + ((size_t)p.num_kv_heads + kvh) * 64 * HD + 2 * t * HD + gid * DPT;
  // chunk c's K (key gid, dims c2 * 32 + t * 8 ..) and V (keys 2t, 2t + 1, dims gid * DPT ..); keys
  // outside [a, e) load as zeros (an unwritten slot's garbage must not reach P V). The block table
  // is read through the read-only path (the host wrote it before the step): an L1 hit after the
  // item's first chunk.
  auto chunk_off = [&](int c) {
    return (size_t)__ldg(bt + (c >> 3)) * (unsigned)page_elems + (size_t)((c & 7) * 8 * HD);
  };
  auto load_k = [&](int c, uint4 (&kx)[NC]) {
    const bool ok = c < nchunks && (unsigned)(ka + 8 * c + gid) < (unsigned)ne;
    const bf16* Kr = kbase + chunk_off(c < nchunks ? c : 0);
#pragma unroll
    for (int c2 = 0; c2 < NC; ++c2) kx[c2] = ld_cg16_if(Kr + c2 * 32, ok);
  };
  auto load_v = [&](int c, uint4 (&vx)[2 * VQ]) {
    const int r0 = ka + 8 * c + 2 * t;
    const bool ok0 = c < nchunks && (unsigned)r0 < (unsigned)ne;
    const bool ok1 = c < nchunks && (unsigned)(r0 + 1) < (unsigned)ne;
    const bf16* Vr = vbase + chunk_off(c < nchunks ? c : 0);
#pragma unroll
    for (int q = 0; q < VQ; ++q) {
      vx[q] = ld_cg16_if(Vr + q * 8, ok0);
      vx[VQ + q] = ld_cg16_if(Vr + HD + q * 8, ok1);
    }
  };
  uint4 kc[NC], vc[2 * VQ];
  load_k(warp, kc);  // before the Q setup: their latency overlaps it
  load_v(warp, vc);
  // Q of head gid as the QK's A operand rows (rows >= G zero), pre-scaled into log2 units, by warp 0:
  // each mma's four A registers as one 16-byte word {a0, a1 = 0, a2, a3 = 0} (rows gid + 8 are no
  // head), so the loop feeds the HMMA straight from one LDS.128 (with {x, 0, y, 0} built in the loop,
  // ~6 register moves per HMMA)
  uint4* qs = reinterpret_cast<uint4*>(shared(s.raw));  // [NC][2][32 lanes]
  if (warp == 0) {
    const float scale = p.attn_scale * 1.4426950408889634f;
    const float* qsrc = V.q(l) + (size_t)b * V.QW() + (size_t)(kvh * G + (gid < G ? gid : 0)) * HD + t * 8;
#pragma unroll
    for (int c2 = 0; c2 < NC; ++c2) {
      float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
      if (gid < G) {
        x0 = ld_cg4(qsrc + c2 * 32);
        x1 = ld_cg4(qsrc + c2 * 32 + 4);
      }
      qs[(2 * c2) * 32 + lane] = make_uint4(pack_bf16(x0.x * scale, x0.y * scale), 0u, pack_bf16(x0.z * scale, x0.w * scale), 0u);
      qs[(2 * c2 + 1) * 32 + lane] = make_uint4(pack_bf16(x1.x * scale, x1.y * scale), 0u, pack_bf16(x1.z * scale, x1.w * scale), 0u);
    }
  }
  __syncthreads();
  float o[NTL][4];
#pragma unroll
  for (int i = 0; i < NTL; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m = -INFINITY, lsum = 0.f;  // of head gid over this thread's keys (the 4 t lanes sum at the end)
  for (int c = warp; c < nchunks; c += NWARPS) {
    uint4 kn[NC];
    load_k(c + NWARPS, kn);  // the next chunk's K flies while this one computes
    float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c2 = 0; c2 < NC; ++c2) {
      const uint4 qa = qs[(2 * c2) * 32 + lane], qb = qs[(2 * c2 + 1) * 32 + lane];
      mma16816(sc, qa.x, qa.y, qa.z, qa.w, kc[c2].x, kc[c2].y);
      mma16816(sc, qb.x, qb.y, qb.z, qb.w, kc[c2].z, kc[c2].w);
    }
    const int r0 = ka + 8 * c + 2 * t;
    if ((unsigned)r0 >= (unsigned)ne) sc[0] = -INFINITY;  // also drops unwritten slots' garbage
    if ((unsigned)(r0 + 1) >= (unsigned)ne) sc[1] = -INFINITY;
    float mx = fmaxf(sc[0], sc[1]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx);
    // uniform over the warp: every head sees the same keys, so all are -inf or none is
    if (m_new != -INFINITY) {
      const float corr = exp2f(m - m_new);
      const float p0 = exp2f(sc[0] - m_new), p1 = exp2f(sc[1] - m_new);
      lsum = lsum * corr + (p0 + p1);
      m = m_new;
      // O^T's columns are heads 2t, 2t + 1: their factors from the lanes of those head rows. Once
      // the maxima have settled (most chunks after the first few) no head's changes: skip the 32
      // multiplies.
      if (__any_sync(0xffffffffu, corr != 1.f)) {
        const float f0 = __shfl_sync(0xffffffffu, corr, 8 * t), f1 = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
#pragma unroll
        for (int i = 0; i < NTL; ++i) {
          o[i][0] *= f0;
          o[i][1] *= f1;
          o[i][2] *= f0;
          o[i][3] *= f1;
        }
      }
      const uint32_t pb = pack_bf16(p0, p1);
#pragma unroll
      for (int i = 0; i < NTL; ++i) {
        const uint32_t w0 = word_of(vc[i / 4], i % 4), w1 = word_of(vc[VQ + i / 4], i % 4);
        mma16808(o[i], __byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632), pb);
      }
    }
    load_v(c + NWARPS, vc);  // this chunk's V is used: the next one's into its registers
#pragma unroll
    for (int c2 = 0; c2 < NC; ++c2) kc[c2] = kn[c2];
  }
  lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
  lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
  __syncthreads();  // every warp is past its loop (and Q's reads): the merge scratch may overwrite Q
  float* Os = reinterpret_cast<float*>(shared(s.raw));  // [NWARPS][8 heads][OLD]
  float* Ms = Os + NWARPS * 8 * OLD;                     // [NWARPS][8]
  float* Ls = Ms + NWARPS * 8;
  if (t == 0) {
    Ms[warp * 8 + gid] = m;
    Ls[warp * 8 + gid] = lsum;
  }
#pragma unroll
  for (int i = 0; i < NTL; ++i) {
    float* h0 = Os + (warp * 8 + 2 * t) * OLD + gid * DPT + 2 * i;  // head 2t; head 2t + 1 one row on
    h0[0] = o[i][0];
    h0[OLD] = o[i][1];
    h0[1] = o[i][2];
    h0[OLD + 1] = o[i][3];
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
      const float f = exp2f(Ms[w * 8 + hq] - M);  // 0 for a warp that saw no key (M is finite: np > 0)
      den += Ls[w * 8 + hq] * f;
      num += Os[(w * 8 + hq) * OLD + dim] * f;
    }
    o_base[((size_t)hq * p.max_splits + split) * HD + dim] = num / den;
    if (dim == 0) lse_base[hq * p.max_splits + split] = M * 0.6931471805599453f + logf(den);
  }
}

// Before the dependency wait of an ATTN item: start its first pages (fast path only).
__device__ void attn_prologue(const Params& p, const int* d, Smem& s) {
  if (!attn_fast(p)) return;
  if (attn_kreg(p)) {
    warp_attn_prologue_t<128>(p, d, s);
    return;
  }
  switch (p.head_dim) {
    case 32: attn_prologue_t<32>(p, d, s); break;
    case 64: attn_prologue_t<64>(p, d, s); break;
    default: attn_prologue_t<128>(p, d, s); break;
  }
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

// The ATTN op on the fast path (attn_fast(p)); the caller ran attn_prologue before the wait.
__device__ void attn_mma(const Params& p, const int* d, Smem& s) {
  if (attn_kreg(p)) {
    attn_warp_t<128>(p, d, s);
    return;
  }
  switch (p.head_dim) {
    case 32: attn_mma_t<32>(p, d, s); break;
    case 64: attn_mma_t<64>(p, d, s); break;
    default: attn_mma_t<128>(p, d, s); break;
  }
}

}  // namespace mk
