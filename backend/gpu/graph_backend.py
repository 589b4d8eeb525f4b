"""The `graph` decode backend: per-op kernels, as a vLLM-class engine runs them, captured in CUDA
graphs per batch-size bucket.

One step, per layer (a parallel block: attention and MLP both read h = norm(x)):

    main stream:  QKV GEMM (cuBLAS) -> RoPE + KV write -> split-KV attention -> combine -> O GEMM
    side stream:  router -> top-k + work list -> expert gate_up+SiLU·up -> expert down
                  (layer 0: dense SwiGLU through cuBLAS)
    join:         x += attn + sum_k y;  h = norm_{next}(x)      (one fused kernel)

then the final norm (fused into the last add_norm) and the LM head (cuBLAS, fp32 out). The two
branches run on two streams so that one branch's kernel tails overlap the other's streaming.
Batches are padded to the next bucket (1, 2, 4, 8, 16, 32); padding rows have no KV pages, write
nothing and route to no expert. All inputs live in static buffers (block tables padded to
`max_pages`), so each bucket's step is captured once per KV pool and replayed.

Verify rows (speculative decoding: rows of one sequence at positions L..L+k over the same block
table, `DecodeBatch.seq_rows`) need no special case, because each layer's KV write and attention
are two kernels in stream order: `rope_kv_write` stores every row's K/V (one program per row and
head) and only then does `paged_decode_attention` run, where row i reads keys up to its own
position, the K/V of rows < i included. The MoE branch on the side stream never touches the pool.
The captured graph keeps that order (both kernels on the capture stream, one after the other).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.gpu.attn_kernels import num_splits, paged_decode_attention, rope_kv_write
from mkcode.backend.gpu.moe_kernels import MoeWorkspace, moe_decode
from mkcode.backend.gpu.norm_kernels import add_norm, embed_norm
from mkcode.backend.gpu.prepared import PreparedLayer, prepare
from mkcode.backend.gpu.triton_support import HAVE_TRITON, triton_usable
from mkcode.backend.kv.layout import NO_PAGE, pages_for
from mkcode.backend.model.reference import ReferenceModel

BUCKETS = (1, 2, 4, 8, 16, 32)
# A step's time by bucket, relative to one row (the engine's speculation policy weighs drafts with
# it: backend.spec.policy). Measured in one run of `mkcode bench spec --ctx 8192,32768 --batch 1,4
# --engine-tokens 256` on an H100 (2026-12-05), 8K context, random weights, uniform routing: 1, 2,
# 4, 8 rows from one sequence's verify steps (3.700 / 4.812 / 6.991 / 10.538 ms), 16 and 32 rows
# from four sequences of 4 and 8 rows (15.908 / 21.037 ms).
ROW_COST = {1: 1.0, 2: 1.301, 4: 1.889, 8: 2.848, 16: 4.299, 32: 5.686}


def bucket_for(batch: int) -> int:
    for b in BUCKETS:
        if batch <= b:
            return b
    raise ValueError(f"batch {batch} exceeds the graph backend's max_batch {BUCKETS[-1]}")


def _mm_f32_supported(device: torch.device) -> bool:
    """cuBLAS bf16 x bf16 -> fp32 (`torch.mm(..., out_dtype=)`), for logits without bf16 rounding."""
    try:
        a = torch.ones(1, 16, device=device, dtype=torch.bfloat16)
        return torch.mm(a, a.t(), out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError):
        return False


class GraphDecodeBackend:
    name = "graph"
    max_batch = BUCKETS[-1]
    verify_rows = True  # KV write then attention, in stream order (module docstring)

    def __init__(
        self,
        model: ReferenceModel,
        *,
        max_pages: int | None = None,
        use_graphs: bool | None = None,
        use_triton: bool | None = None,
        overlap: bool = True,
    ):
        dev = model.device
        if model.dtype != torch.bfloat16:
            raise RuntimeError(f"graph backend runs bf16 weights, got {model.dtype}")
        if dev.type == "cuda" and not HAVE_TRITON and use_triton is not False:
            raise RuntimeError("graph backend needs Triton (pip install triton)")
        self.model = model
        self.cfg = cfg = model.cfg
        self.pm = prepare(model)
        self.use_triton = triton_usable(dev.type) if use_triton is None else use_triton
        self.use_graphs = dev.type == "cuda" if use_graphs is None else use_graphs
        self.overlap = overlap and dev.type == "cuda"
        self.max_pages = max_pages or pages_for(cfg.max_position_embeddings)
        self.mm_f32 = dev.type == "cuda" and _mm_f32_supported(dev)

        M, H, L = self.max_batch, cfg.hidden_size, cfg.num_hidden_layers
        Hq, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bf, f32 = torch.bfloat16, torch.float32

        def z(*shape, dtype=bf):
            return torch.zeros(*shape, device=dev, dtype=dtype)

        self.ids = z(M, dtype=torch.long)
        self.pos = z(M, dtype=torch.long)
        self.n_real = z(1, dtype=torch.int32)
        self.bt = torch.full((L, M, self.max_pages), NO_PAGE, device=dev, dtype=torch.int32)
        self.x = z(M, H, dtype=f32)
        self.h = z(M, H)
        self.h_lo = z(M, H)
        self.qkv = z(M, (Hq + 2 * Hkv) * d)
        self.q = z(M, Hq, d)
        max_rows_splits = max(b * num_splits(b, Hkv) for b in BUCKETS)
        self.o_part = z(max_rows_splits * Hq * d, dtype=f32)
        self.lse_part = z(max_rows_splits * Hq, dtype=f32)
        self.attn = z(M, Hq * d)
        self.ao = z(M, H)
        D = cfg.prefix_dense_intermediate_size
        self.dgu = z(M, 2 * D)
        self.dact = z(M, D)
        self.dy = z(M, H)
        self.logits = z(M, cfg.vocab_size, dtype=f32)
        self.routed = z(L, dtype=torch.int32)  # distinct experts per layer, last step
        self.ws = (
            MoeWorkspace(M, H, cfg.intermediate_size, cfg.num_experts, cfg.num_experts_per_tok, dev)
            if cfg.num_experts
            else None
        )
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._mempool = None
        if dev.type == "cuda":
            self._side = torch.cuda.Stream(dev)
            self._cap_stream = torch.cuda.Stream(dev)

    # ---- one step over static buffers -----------------------------------------------------

    def _mlp(self, i: int, pl: PreparedLayer, bb: int) -> torch.Tensor:
        cfg, ut = self.cfg, self.use_triton
        h = self.h[:bb]
        if pl.dense_gate_up is not None:
            D = cfg.prefix_dense_intermediate_size
            gu = self.dgu[:bb]
            torch.mm(h, pl.dense_gate_up.t(), out=gu)
            self.dact[:bb].copy_(F.silu(gu[:, :D].float()) * gu[:, D:].float())
            torch.mm(self.dact[:bb], pl.dense_down.t(), out=self.dy[:bb])
            return self.dy[:bb]
        return moe_decode(
            h,
            self.h_lo[:bb],
            self.n_real,
            pl.router,
            pl.experts_gate_up,
            pl.experts_down,
            cfg.num_experts_per_tok,
            cfg.expert_selection_fn == "softmax",
            cfg.norm_topk_prob,
            self.ws,
            self.routed[i : i + 1],
            ut,
        )

    def _attention(self, i: int, pl: PreparedLayer, bb: int, pool: torch.Tensor) -> None:
        cfg, ut = self.cfg, self.use_triton
        Hq, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bt, pos = self.bt[i, :bb], self.pos[:bb]
        torch.mm(self.h[:bb], pl.qkv.t(), out=self.qkv[:bb])
        rope_kv_write(self.qkv[:bb], pos, bt, pool, self.q[:bb], self.pm.inv_freq, Hq, Hkv, pl.rope, ut)
        S = num_splits(bb, Hkv)
        o_part = self.o_part[: bb * Hq * S * d].view(bb, Hq, S, d)
        lse = self.lse_part[: bb * Hq * S].view(bb, Hq, S)
        paged_decode_attention(self.q[:bb], pool, bt, pos, pl.window, o_part, lse, self.attn[:bb], ut)
        torch.mm(self.attn[:bb], pl.o.t(), out=self.ao[:bb])

    def _step(self, bb: int, pool: torch.Tensor) -> None:
        cfg, pm, ut = self.cfg, self.pm, self.use_triton
        eps = cfg.rms_norm_eps
        x, h, h_lo = self.x[:bb], self.h[:bb], self.h_lo[:bb]
        embed_norm(self.ids[:bb], pm.embed, pm.layers[0].norm, eps, x, h, h_lo, ut)
        n = len(pm.layers)
        for i, pl in enumerate(pm.layers):
            if self.overlap:
                main = torch.cuda.current_stream()
                self._side.wait_stream(main)
                with torch.cuda.stream(self._side):
                    y = self._mlp(i, pl, bb)
                self._attention(i, pl, bb, pool)
                main.wait_stream(self._side)
            else:
                y = self._mlp(i, pl, bb)
                self._attention(i, pl, bb, pool)
            w_next = pm.layers[i + 1].norm if i + 1 < n else pm.final_norm
            add_norm(x, self.ao[:bb], y, w_next, eps, h, h_lo, ut)
        if self.mm_f32:
            self.logits[:bb].copy_(torch.mm(h, pm.lm_head.t(), out_dtype=torch.float32))
        else:
            self.logits[:bb].copy_(torch.mm(h, pm.lm_head.t()))
        if cfg.logit_scale != 1.0:
            self.logits[:bb].mul_(cfg.logit_scale)

    # ---- the DecodeBackend interface ------------------------------------------------------

    def row_cost(self, rows: int) -> float:
        """Relative time of a step of `rows` rows (its bucket's, ROW_COST)."""
        return ROW_COST[bucket_for(rows)]

    def _load_inputs(self, batch: DecodeBatch, bb: int) -> None:
        B = batch.size
        P = batch.block_tables.shape[2]
        if self.max_pages < P:
            raise ValueError(f"block tables of {P} pages exceed the backend's max_pages {self.max_pages}")
        self.ids[:B].copy_(batch.token_ids)
        self.pos[:B].copy_(batch.positions)
        if bb > B:
            self.ids[B:bb].zero_()
            self.pos[B:bb].zero_()
        self.n_real.fill_(B)
        self.bt[:, :bb].fill_(NO_PAGE)
        self.bt[:, :B, :P].copy_(batch.block_tables)

    def _capture(self, bb: int, pool: torch.Tensor, key: tuple) -> None:
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._mempool, stream=self._cap_stream):
            self._step(bb, pool)
        self._graphs[key] = g

    @torch.inference_mode()
    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        B = batch.size
        bb = bucket_for(B)
        self._load_inputs(batch, bb)
        pool = batch.kv_pool
        if not self.use_graphs:
            self._step(bb, pool)
            return self.logits[:B].clone()
        key = (bb, pool.data_ptr(), tuple(pool.shape))
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
        else:
            # First step of this bucket: run it eagerly on the capture stream (compiles the
            # kernels, warms cuBLAS there, and is this step's real result), then capture.
            cur = torch.cuda.current_stream()
            self._cap_stream.wait_stream(cur)
            with torch.cuda.stream(self._cap_stream):
                self._step(bb, pool)
            cur.wait_stream(self._cap_stream)
            torch.cuda.synchronize()
            self._capture(bb, pool, key)
        return self.logits[:B].clone()

    def routed_experts(self) -> list[int]:
        """Distinct experts each MoE layer read in the last step (0 on dense layers)."""
        return [int(v) for v in self.routed.tolist()]
