// mk_abi.h: the megakernel's ABI, the ONE source of truth for opcodes, the task-descriptor layout,
// the parameter block and the dependency-counter protocol. Python (mkcode.backend.megakernel.abi)
// parses this file; tests/backend/megakernel/test_abi.py proves the two agree.
//
// Rules for editing: values are plain integer literals (the Python parser reads `NAME = <int>,`
// inside `enum` blocks and `#define NAME <int>`); append, never renumber, and bump MK_ABI_VERSION.
#pragma once

#define MK_ABI_VERSION 51

// A task descriptor is MK_DESC_WORDS int32 words (128 bytes: one cache line, 16-byte aligned).
#define MK_DESC_WORDS 32
#define MK_MAX_WAITS 3    // counters a task waits on before running
#define MK_MAX_SIGNALS 2  // counters a task increments after its writes are visible
#define MK_MAX_TOKENS 8   // decode batch limit (tokens per expert tile fit one mma N=8)
#define MK_MAX_TILE_ROWS 1024  // weight rows of one GEMV task at most (gate+up count twice)
#define MK_NORM_MAX_HIDDEN 4096  // hidden size at most (the GEMV staging's RMSNorm sweeps)
#define MK_NO_COUNTER -1

// Opcodes (word MK_F_OP). Every opcode is handled by the kernel's dispatch and by the emulator.
// 12 is reserved, never to be reused: ADD_NORM (one row's residual add and next norm), removed in
// ABI 31 (the norm inside the GEMVs, below, measured faster: docs/PERF.md). 14 is reserved too:
// SAMPLE (every row's greedy argmax), never scheduled since SAMPLE_ROW; removed in ABI 36.
enum MkOpcode {
  MK_OP_NOP = 0,
  MK_OP_EMBED = 1,         // one row: x[0][b] = embed[token[b]] (a dense layer 0: x[1][b] too)
  MK_OP_QKV = 2,           // a tile of rows of [Wq; Wk; Wv] for all rows; RoPE; K/V into the pool
  MK_OP_ATTN = 3,          // one (row, kv head, split) of split-KV decode attention -> (o, lse)
  MK_OP_ATTN_COMBINE = 4,  // one (row, kv head): LSE merge of the splits -> attn_out
  MK_OP_OPROJ = 5,         // a (row tile, K split) of Wo, added into x[l+1]
  MK_OP_DENSE_UP = 6,      // a tile of intermediate columns: silu(gate h) * (up h) -> dense_act
  MK_OP_DENSE_DOWN = 7,    // a (row tile, K split) of Wdown, added into x[l+1]
  MK_OP_ROUTER = 8,        // a tile of experts: router logits
  MK_OP_ROUTE = 9,         // one per MoE layer: top-k, weights, expert table, MoE queue reset
  MK_OP_MOE_UP = 10,       // one expert, a tile of intermediate columns, its <= 8 tokens
  MK_OP_MOE_DOWN = 11,     // one expert, a tile of hidden rows, its tokens: added (weighted) into x[l+1]
  MK_OP_LM_HEAD = 13,      // a tile of vocab rows: logits (scaled) and the tile's argmax per row
  MK_OP_DRAIN = 15,        // claim tasks from a work queue until it is empty, run each
  MK_OP_SAMPLE_ROW = 16,   // one row: greedy / temperature / top-k / top-p draw -> tokens[b]
  MK_OP_MOE_FUSED = 17,    // one expert, a tile of intermediate columns: its up tile, then the down
                           // slice of those columns for every hidden row, added (fp32 atomics,
                           // weighted) into x[l+1] of its tokens' rows (Tiling.moe_fused)
  MK_OP_COUNT = 18,
};

// Descriptor words. Waits are (counter, target) pairs, the target RELATIVE to the counter's base
// for this step (see the protocol below). Signals add MK_F_SIG_AMOUNT (0 means 1) to each counter.
enum MkField {
  MK_F_OP = 0,
  MK_F_LAYER = 1,
  MK_F_A0 = 2,  // op arguments (meaning per opcode, see below)
  MK_F_A1 = 3,
  MK_F_A2 = 4,
  MK_F_A3 = 5,
  MK_F_A4 = 6,
  MK_F_NWAIT = 7,
  MK_F_WAIT0 = 8,  // counter index; MK_F_WAIT0 + 1: relative target; then the next pair
  MK_F_NSIG = 14,
  MK_F_SIG0 = 15,  // counter indices, MK_MAX_SIGNALS of them
  MK_F_SIG_AMOUNT = 17,
  MK_F_ID = 18,     // the task's id in the step's task list (diagnostics, emulator)
  MK_F_NTOK = 19,   // MoE tasks: tokens routed to the expert
  MK_F_SLOT0 = 20,  // MoE tasks: MK_MAX_TOKENS slots (b * top_k + j)
  MK_F_LROW = 28,   // ROUTER, self-routing MOE_FUSED: the row of rlogits it writes / ranks (below)
  MK_F_END = 29,
};
// Arguments per opcode (A0..A4):
//   EMBED                    A0 = row, A1 = MK_EMBED_RESET_HEADS or 0
//   QKV, ROUTER, DENSE_UP    A0 = first row (of [Wq;Wk;Wv] / experts / intermediate), A1 = rows
//                            (QKV: A3 > 0 rows from A2 too, Tiling.attn_group's Q and K/V shares;
//                            ROUTER: batch row b's logits go to rlogits row b + LROW; only tiles
//                            with LROW = 0 copy their share of x(l) into x(l+1))
//   OPROJ, DENSE_DOWN        A0 = first row, A1 = rows, A2 = k0, A3 = k1
//   LM_HEAD                  A0 = first vocab row, A1 = rows, A2 = tile index
//   ATTN                     A0 = row, A1 = kv head, A2 = split, A3 = splits
//   ATTN_COMBINE             A0 = row, A1 = kv head, A2 = splits
//   MOE_UP                   A0 = expert, A1 = first intermediate column, A2 = columns
//   MOE_DOWN                 A0 = expert, A1 = first hidden row, A2 = rows
//   MOE_FUSED                A0 = expert, A1 = first intermediate column, A2 = columns (A3 =
//                            MK_MOE_LOCAL: A0 = the row's top-k rank, A4 =
//                            row 0's attention splits in the layer, LROW = the rlogits row it
//                            ranks; see the end of this file)
//   DRAIN                    A0 = queue kind (MkQueueKind), A1 = queue index (MOE: A1 = layer,
//                            A2 = its MLP counter, A3 = its tail queue or -1, A4 =
//                            MK_DRAIN_LATE_ROUTE or 0)
//   SAMPLE_ROW               A0 = row
//   ROUTE                    A0 = MK_ROUTE_KEEP_HEAD or 0
//   SAMPLE, NOP              none

enum MkQueueKind {
  MK_QUEUE_HOST = 0,  // descriptors written by the host (attention splits); head is a counter
  MK_QUEUE_MOE = 1,   // per MoE layer, filled on the device by ROUTE (implicit items)
};

// Counter protocol. Counters are uint32 in global memory and never reset by the host between
// steps: each step the host passes base[c] (the counter's value at the step's start, tracked on the
// host as the running sum of each step's known increments), and a wait is satisfied when
// (int32)(counter[c] - (base[c] + target)) >= 0, so the arithmetic wraps safely. Counters whose
// increments depend on routing (MoE queue heads, per-expert up-tile counts) live in the DYNAMIC
// region and are reset on the device by ROUTE before it publishes (their base is always 0; with
// MK_ROUTE_KEEP_HEAD the queue head by the EMBED of row 0, see the end of this file).
// A wait whose counter is MK_NO_COUNTER is skipped.

// Kernel error codes (written to err[0]; err[1..] = block, task id, counter, value, target).
enum MkError {
  MK_ERR_NONE = 0,
  MK_ERR_TIMEOUT = 1,       // a wait exceeded the watchdog limit
  MK_ERR_BAD_OPCODE = 2,
  MK_ERR_QUEUE_OVERFLOW = 3,
  MK_ERR_ABORTED = 4,       // another block failed first
  MK_ERR_BAD_ARGS = 5,
  MK_ERR_NAN_LOGITS = 6,    // a greedy row whose LM-head tiles all have NaN maxima (no argmax)
};
#define MK_ERR_WORDS 8

// Pointers in the parameter block, in order (an X-macro: C++ fills the struct from it, Python
// passes the tensors' data_ptr() in the same order).
#define MK_PARAM_PTRS(X) \
  X(desc)          /* int32 [n_sms][max_tasks][MK_DESC_WORDS] per-SM task lists */ \
  X(ntasks)        /* int32 [n_sms] */ \
  X(queue)         /* int32 [n_queue_desc][MK_DESC_WORDS] host queues (attention splits) */ \
  X(queue_info)    /* int32 [n_queues][4]: first descriptor, length, head counter, unused */ \
  X(counters)      /* uint32 [n_counters] */ \
  X(base)          /* uint32 [n_counters] this step's base of each counter */ \
  X(err)           /* int32 [MK_ERR_WORDS] */ \
  X(token_ids)     /* int64 [B] */ \
  X(positions)     /* int64 [B] */ \
  X(block_tables)  /* int32 [L][B][P] */ \
  X(kv_pool)       /* bf16 [pages][2][Hkv][64][d] */ \
  X(layer_w)       /* int64 [L][MK_LW_COUNT] weight pointers */ \
  X(layer_flags)   /* int32 [L] MK_LAYER_* bits */ \
  X(embed)         /* bf16 [V][H] */ \
  X(final_norm)    /* bf16 [H] */ \
  X(lm_head)       /* bf16 [V][H] */ \
  X(x)             /* fp32 [L+1][B][H] residual stream: x[l+1] is layer l's sum */ \
  X(q)             /* fp32 [L][B][Hq*d] */ \
  X(o_part)        /* fp32 [L][B][Hq][S][d] */ \
  X(lse_part)      /* fp32 [L][B][Hq][S] */ \
  X(attn_out)      /* fp32 [L][B][Hq*d] */ \
  X(dense_act)     /* fp32 [L][B][D] */ \
  X(rlogits)       /* fp32 [L][B][E] */ \
  X(route_w)       /* fp32 [L][B*k] */ \
  X(expert_tab)    /* int32 [L][E][2 + MK_MAX_TOKENS]: expert, ntok, slots */ \
  X(moe_info)      /* int32 [L][4]: active experts, items, unused, unused */ \
  X(moe_act)       /* fp32 [L][B*k][I] */ \
  X(logits)        /* fp32 [B][V] */ \
  X(lm_best)       /* fp32 [n_lm_tiles][B] tile max */ \
  X(lm_arg)        /* int32 [n_lm_tiles][B] tile argmax */ \
  X(tokens_out)    /* int64 [B] greedy tokens */ \
  X(timeline)      /* int64 [n_sms][timeline_cap][4] per-task stamps, or 0 (off): see MK_TL_* */ \
  X(sample_params) /* int32 [MK_MAX_TOKENS][MK_SP_WORDS] per-row sampling (MkSampleField), or 0: greedy */

// Integer parameters, in order (int64 on the Python side, int32 in the kernel).
#define MK_PARAM_INTS(X) \
  X(n_sms) X(max_tasks) X(batch) X(num_layers) X(hidden) X(num_heads) X(num_kv_heads) \
  X(head_dim) X(dense_inter) X(moe_inter) X(num_experts) X(top_k) X(vocab) X(max_pages) \
  X(max_splits) X(n_lm_tiles) X(dyn_base) X(moe_up_tiles) X(moe_up_cols) \
  X(moe_down_tiles) X(moe_down_rows) X(sliding_window) X(selection_sigmoid) X(norm_topk) \
  X(timeout_ms) X(prefetch_mode) X(timeline_cap) X(moe_fused)
// moe_fused: 1 = a MoE queue's expert items are MOE_FUSED (no down tiles, no per-expert counter
// wait), 0 = MOE_UP tiles, then MOE_DOWN tiles. ABI 46 added cluster (the launch as thread-block
// clusters), measured equal and removed in ABI 47: the grouped layer hands over through L2
// (docs/MEGAKERNEL.md).
// ABI 37 added resident_bytes (Tiling.resident: a QKV / router / O-proj tile's first columns loaded
// into shared memory by cp.async.bulk before its wait), measured slower in every form and removed in
// ABI 38 (docs/PERF.md).
// ABI 39 added res_bytes (Tiling.qkv_res_tiles: QKV tiles of 16 rows whose whole rows a block loaded
// into shared memory a layer ahead, on the self-routing items' SMs, the other rows in shorter
// streamed tiles), measured 6-9 % slower at BS 1 and removed in ABI 40 (docs/PERF.md).
// The norm inside the GEMVs: x(l+1) is layer l's sum: its residual x(l) copied in by the layer's
// initialiser (EMBED for a dense layer 0, else the router tiles while they stage, each its share of
// the columns), then the O-proj, dense-down, MoE-down and fused items add their outputs into it
// (fp32 red.global.add, no partial buffers); every GEMV over h(l) = RMSNorm(x(l)) (QKV, router,
// dense up, MoE up / fused, LM head) stages the norm itself, after the previous layer's one counter
// (its MLP counter, which the O-proj items signal too). So a dense layer must be layer 0 (no other
// initialiser), hidden <= MK_NORM_MAX_HIDDEN and each router tile's share whole float4 columns
// (backend.py check_geometry). ABI 31 removed the other way (Tiling.norm_inline = 0: ADD_NORM tasks
// summing per-layer partial buffers, then h(l+1); measured +1.2-1.3 % per step) with the buffers h,
// ao_part, mlp_part, moe_out, moe_acc and the ints mlp_splits and norm_inline.
// ABI 22 removed moe_down_ready (down tiles claimed in the up tiles' end order, per up tile or per
// expert; measured +4 % / equal, docs/PERF.md) with its moe_ready buffer; ABI 27 removed use_mma
// (the plain-FMA GEMV and fused down slice, measured slower than mma.sync); ABI 28 removed
// moe_up_big and moe_up_small (two up-tile sizes, superseded by the 384-column up tiles).

// prefetch_mode: variant bits (A/B measurements and bisection); the product runs
// MK_PREFETCH_DEFAULT. Measured slower and removed: L2 prefetches of a task's weights before its
// wait, of the next static task's, of a layer head's tiles (bits 1, 2, 256; 2026-11-29/30: BS 1
// 6.01 vs 5.73 ms, the bulk prefetches compete with the loads); engine v2's weight ring (bit 8 and
// its tensor maps in layer_w's tail; removed in ABI 21: docs/MEGAKERNEL.md); the SIMT attention
// (bit 4, removed in ABI 27). Measured equal and removed: MoE up items staging their own tokens'
// rows of h instead of reusing the staged batch rows (MK_MODE_TOKEN_ROWS, bit 128; ABI 28).
#define MK_PREFETCH_DEFAULT 0

// The attention's geometries (mk_attn.cuh attn_supported; backend.py refuses others): a kv head's
// query heads fill one 8-wide side of its mma tiles, and each head_dim is one instantiation.
#define MK_ATTN_MAX_GROUP 8
#define MK_ATTN_HEAD_DIM_32 32
#define MK_ATTN_HEAD_DIM_64 64
#define MK_ATTN_HEAD_DIM_128 128
// MK_MODE_TWICE (measurement only): ATTN_COMBINE runs its op twice (idempotent), the
// timeline stamping the end of each run (as "stage" and "gemv"): the second run finds the op's
// code in the instruction cache, so the difference is what a cold op costs.
#define MK_MODE_TWICE 16
// Measured and removed in ABI 50 (H100, 2026-12-08): K-segment GEMV layouts at 1-4 rows (bits 32, 64;
// each load instruction whole 128-byte lines of 8 / S rows instead of 64 bytes of 8): BS 1 8K 3.41 /
// 3.41 vs 3.30 / 3.22 ms, BS 2 and 4 equal (docs/PERF.md).

// Each self-routing fused item (Tiling.moe_local), idle between h(l) and the router tiles, asks L2
// for its share of row 0's KV pages of layer l (mk_kernel.cuh gap_prefetch_kv; its off switch, bit
// 32768, measured equal on the H200 and +1.2 % on the H100, was removed in ABI 29). Measured slower
// and removed: the same for Wo(l) (+4.5 % at BS 1 on the H100, 2026-12-06), each O-proj tile's own
// weights before its wait and the next layer's QKV weights by the O-proj tiles (+13 % at BS 1 on
// the H200, 2026-12-06), and this layer's QKV weights by the self-routing items after or before
// their h(l) wait (bits 1048576 / 2097152, +1.5-4 % at BS 1 on the H100, 2026-12-07: the QKV tiles'
// own loads queue behind the prefetches, their GEMV 10.8 -> 12.9 us).
// Measured and removed in ABI 30 (H100, BS 1, 8K, 2026-12-07, two rounds in one call): a fused
// item's L2 prefetch of its down slice once its expert is ranked (bit 65536, +9-10 %) and a dry run of
// its ranking and down slice while it waits for the router tiles (bit 262144, +0.3-0.8 %). Kept as
// the default: the layer's weight pointers copied into shared memory before a GEMV task's wait
// (bit 131072, -0.8 to -1.1 % at BS 1, -0.1 % at BS 8; mk_kernel.cuh gemv_prologue).
// The QKV and router tiles' staging run dry before their wait (bit 524288) measured equal (H100,
// 2026-12-07, three rounds at BS 1, two at BS 8) and was removed in ABI 32.

// Claims (lazy): a DRAIN claims two items ahead (the next one's words land while the current one
// runs) while more than n_sms items remain before the queue's far end (a host queue's end; a MoE
// queue's last up tile); beyond that it claims its next item only after the current one ran, so
// that an idle SM can take it meanwhile (an item claimed ahead is held by a busy SM: at BS 1 a
// third of a layer's down tiles waited ~12 us for the SM that held them). ABI 21 removed the other
// policies (eager, lazy at the end only, eager to the queue's end) and the claim window, measured
// equal or slower (docs/PERF.md).

// Timeline records (when `timeline` is set): word 0 = opcode | layer << 8 | queue-item flag << 16,
// words 1-6 = %globaltimer (ns) at the task's start, after its waits, when its GEMV began (the
// activations staged; 0 for ops without a GEMV), when its GEMV ended (0 likewise), when every
// thread finished the op (before the release fence), after its signals.
#define MK_TL_WORDS 7

// Per-row sampling parameters (sample_params[b][field], int32 words; floats stored as their bits).
// Semantics: mkcode.backend.megakernel.sampling (greedy when temperature <= 0, top_k == 1 or
// top_p <= 0; top_k 0 = off; top_p >= 1 = off; Gumbel-max draw with a counter-based hash of
// seed, step and token id, so a row's draw does not depend on the rest of the batch).
#define MK_SP_WORDS 8
enum MkSampleField {
  MK_SP_SEED_LO = 0,
  MK_SP_SEED_HI = 1,
  MK_SP_STEP = 2,
  MK_SP_TOP_K = 3,
  MK_SP_TEMPERATURE = 4,  // float bits
  MK_SP_TOP_P = 5,        // float bits
};

// Float parameters.
#define MK_PARAM_FLOATS(X) X(rms_eps) X(rope_theta) X(logit_scale) X(attn_scale)

// Per-layer flags (layer_flags[l]).
enum MkLayerFlag {
  MK_LAYER_ROPE = 1,
  MK_LAYER_SLIDING = 2,
  MK_LAYER_DENSE = 4,
};

// Per-layer weight pointer slots (layer_w[l][slot]); absent tensors are 0.
enum MkLayerWeight {
  MK_LW_NORM = 0,
  MK_LW_Q = 1,
  MK_LW_K = 2,
  MK_LW_V = 3,
  MK_LW_O = 4,
  MK_LW_GATE = 5,
  MK_LW_UP = 6,
  MK_LW_DOWN = 7,
  MK_LW_ROUTER = 8,
  MK_LW_EXP_GATE_UP = 9,
  MK_LW_EXP_DOWN = 10,
  MK_LW_COUNT = 11,
};

// A MoE layer's tail queue (its combines and O-proj items, claimed through the MoE head) sits right
// after the queue's up tiles (its word 3 is 0: ABI 21 removed the tail among the down tiles).
// Word MK_MOE_HEAD (2) of a MoE layer's tail queue (ABI 16): how many head items the MoE queue has
// before its up tiles (Tiling.attn_in_moe: the layer's attention items), stored right before
// the tail's items in the host queue buffer; -1 (MK_NO_COUNTER, a tail queue has no counter of its
// own) or 0: none.
#define MK_MOE_HEAD 2

// Tiling.attn_in_moe = 3 (ABI 17): the MoE queue's head items (the layer's attention, MK_MOE_HEAD)
// are claimed before ROUTE. The MoE drains (A4 = MK_DRAIN_LATE_ROUTE, one wait: h(l); ROUTE's
// (counter, relative target) in words MK_F_SLOT0 and MK_F_SLOT0 + 1, which a DRAIN has no other
// use for: every wait pair that is not MK_NO_COUNTER is waited for, whatever MK_F_NWAIT says)
// claim from the start and wait for ROUTE only at their first claim past the head. ROUTE (A0 =
// MK_ROUTE_KEEP_HEAD) then leaves the queue head alone, and the EMBED of row 0 (A1 =
// MK_EMBED_RESET_HEADS) resets every MoE layer's head before it signals: every claim of the step
// comes after that (each drain waits for h(l), which follows the EMBED tasks), every claim of the
// step before is over (the launch boundary).
#define MK_DRAIN_LATE_ROUTE 1
#define MK_ROUTE_KEEP_HEAD 1
#define MK_EMBED_RESET_HEADS 1

// Tiling.moe_local (ABI 20): at one row, a MoE layer has no ROUTE and no MoE queue. Each fused item
// is a static task (A3 = MK_MOE_LOCAL, A0 = a top-k rank j, NTOK 1, slot j) with two waits: h(l)
// (the previous layer's end), then the router tiles. Between them it stages h(l); after the second
// it ranks the router's logits itself (the top-k and routing weights ROUTE computes), takes the
// expert of rank j and its weight, and runs as a fused item of that expert. Every item of a layer
// reads the same logits with the same code, so they agree on the experts without a table.
// Tiling.moe_group (ABI 51): the items in groups of SMs, each SM first running a router tile of
// E / group rows into its group's rlogits row (LROW = g); an item waits for its own group's tiles
// (and, past group 0, for group 0's, the only ones that copy the residual into x(l+1)). Every group
// computes each logit with the same tile geometry and code, so all rank the same bits. The router
// tile leaves h(l) staged (s_h_staged) for the SM's next task, the item.
#define MK_MOE_LOCAL 1
// While they wait for the router tiles, the layer's self-routing items ask L2 for row 0's KV pages
// the attention splits read first: page k of every split before page k + 1 of any, at most this many
// pages (16 MB at the release geometry: a whole 8K full layer; at 128K all 268 MB thrashed L2 and
// took the QKV tiles' HBM share).
#define MK_GAP_KV_PAGES 128
// Bits measured and removed (never to be reused): ABI 41's what-if bounds MK_MODE_WHATIF_HOT_QKV /
// _HOT_OPROJ / _FREE_QKV / _FREE_OPROJ (8388608 / 16777216 / 33554432 / 67108864: those GEMVs from a
// window L2 keeps, or one k-step per warp; wrong results by design) and MK_MODE_PACED_WO (134217728 /
// 268435456); ABI 42's MK_MODE_GEMV_TWICE (536870912: every GEMV run twice); ABI 43's MK_MODE_GEMV_U4
// (512) / MK_MODE_MOE_U4 (1073741824). What they measured: docs/PERF.md; the what-if bounds and
// GEMV_TWICE went in ABI 45, their questions answered (docs/MEGAKERNEL.md).
