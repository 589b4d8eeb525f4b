"""One rank's share of a step: the reference model's math (docs/ENGINE.md, Model) over this rank's shard.

Per layer (a parallel block, one norm):

    h = rmsnorm(x)                                   replicated: every rank holds the same x
    a = attention over this rank's q heads,          partial when tp > 1 (o_proj rows of those
        KV for its kv heads in its own pool              heads), else the whole attention output
    m = this rank's experts (or dense columns)       partial when ep > 1 (dense: tp > 1)
    x = x + all_reduce(partials) + wholes            ONE collective per layer

Then the final norm (replicated) and the LM head over this rank's vocab rows, all-gathered. The
router is replicated and sees the same x on every rank, so every rank routes every token alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkcode.backend.kv.layout import PAGE_SIZE, first_visible_position, gather_tokens, write_tokens
from mkcode.backend.model import ops
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.parallel.comm import Comm
from mkcode.backend.parallel.plan import ShardPlan
from mkcode.backend.parallel.shard import ShardLayer, ShardWeights
from mkcode.backend.parallel.step import StepInputs


class ShardedModel:
    def __init__(self, cfg: ModelConfig, weights: ShardWeights, plan: ShardPlan, comm: Comm):
        if comm.world != plan.world or comm.rank != plan.rank:
            raise ValueError(
                f"plan ({plan.describe()}) does not match the process group "
                f"(world {comm.world}, rank {comm.rank})"
            )
        self.cfg, self.w, self.plan, self.comm = cfg, weights, plan.validate(cfg), comm
        self.q_heads = len(plan.q_heads(cfg))
        self.kv_heads = len(plan.kv_heads(cfg))
        self.kv_pool: torch.Tensor | None = None  # [pages, 2, kv_heads, PAGE_SIZE, d], attached later

    @property
    def device(self) -> torch.device:
        return self.w.device

    @property
    def dtype(self) -> torch.dtype:
        return self.w.dtype

    def attach_pool(self, pool: torch.Tensor) -> None:
        want = (2, self.kv_heads, PAGE_SIZE, self.cfg.head_dim)
        if tuple(pool.shape[1:]) != want:
            raise ValueError(f"KV pool pages are {tuple(pool.shape[1:])}, this rank needs {want}")
        self.kv_pool = pool

    # ---- one layer ---------------------------------------------------------------------------

    def _attention(
        self,
        i: int,
        lw: ShardLayer,
        h: torch.Tensor,
        step: StepInputs,
        bounds: list[list[int]],
        first_pos: list[int],
        last_pos: list[int],
    ) -> torch.Tensor:
        cfg, pool = self.cfg, self.kv_pool
        assert pool is not None, "attach a KV pool before running steps"
        T, d = h.shape[0], cfg.head_dim
        q = F.linear(h, lw.q).view(T, self.q_heads, d)
        k = F.linear(h, lw.k).view(T, self.kv_heads, d)
        v = F.linear(h, lw.v).view(T, self.kv_heads, d)
        pos = step.positions
        if cfg.uses_rope(i):
            q = ops.apply_rope(q, pos, cfg.rope_theta)
            k = ops.apply_rope(k, pos, cfg.rope_theta)
        window = cfg.window(i)
        out = torch.empty(T, self.q_heads * d, device=h.device, dtype=h.dtype)
        for s, (start, end) in enumerate(bounds):
            row = step.block_tables[i, s]
            write_tokens(pool, row, pos[start:end], k[start:end], v[start:end])
            kv_start = first_visible_position(first_pos[s], window)
            K, V = gather_tokens(pool, row, kv_start, last_pos[s] + 1)
            kpos = torch.arange(kv_start, last_pos[s] + 1, device=h.device)
            out[start:end] = ops.attention(
                q[start:end], K.to(h.dtype), V.to(h.dtype), pos[start:end], kpos, window
            )
        return F.linear(out, lw.o)

    def _experts(self, lw: ShardLayer, h: torch.Tensor) -> torch.Tensor:
        """This rank's experts' share of the routed MoE output (ops.moe restricted to them)."""
        cfg = self.cfg
        assert lw.router is not None and lw.experts_gate_up is not None and lw.experts_down is not None
        weights, ids = ops.route(
            h, lw.router, cfg.num_experts_per_tok, cfg.expert_selection_fn, cfg.norm_topk_prob
        )
        first, count = lw.first_expert, lw.experts_gate_up.shape[0]
        inter = lw.experts_gate_up.shape[1] // 2
        out = torch.zeros_like(h)
        local = (ids >= first) & (ids < first + count)
        for e in torch.unique(ids[local]).tolist():
            tok, slot = torch.where(ids == e)
            gu, down = lw.experts_gate_up[e - first], lw.experts_down[e - first]
            y = ops.swiglu(h[tok], gu[:inter], gu[inter:], down)
            out.index_add_(0, tok, (y * weights[tok, slot, None]).to(out.dtype))
        return out

    def _mlp(self, i: int, lw: ShardLayer, h: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """(output, whether it is a partial sum that needs the all-reduce)."""
        if self.cfg.is_dense(i):
            assert lw.gate is not None and lw.up is not None and lw.down is not None
            return ops.swiglu(h, lw.gate, lw.up, lw.down), self.plan.dense_sharded
        return self._experts(lw, h), self.plan.experts_sharded

    def _layer(self, i: int, x: torch.Tensor, step: StepInputs, host: tuple) -> torch.Tensor:
        lw = self.w.layers[i]
        h = ops.rms_norm(x, lw.norm, self.cfg.rms_norm_eps)
        attn = self._attention(i, lw, h, step, *host)
        mlp, mlp_partial = self._mlp(i, lw, h)
        attn_partial = self.plan.attn_sharded
        if attn_partial and mlp_partial:
            return x + self.comm.all_reduce_sum(attn + mlp)
        if attn_partial:
            return x + self.comm.all_reduce_sum(attn) + mlp
        if mlp_partial:
            return x + attn + self.comm.all_reduce_sum(mlp)
        return x + attn + mlp

    # ---- whole step --------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, step: StepInputs) -> torch.Tensor:
        """Every rank calls this with the same step; returns fp32 logits [M, V] (whole vocab)."""
        # Host copies of the few scalars the per-segment loop needs: one device sync per step.
        bounds = step.bounds.tolist()
        pos_host = step.positions.tolist()
        first_pos = [pos_host[s] for s, _ in bounds]
        last_pos = [pos_host[e - 1] for _, e in bounds]
        host = (bounds, first_pos, last_pos)
        x = F.embedding(step.token_ids, self.w.embed)
        for i in range(self.cfg.num_hidden_layers):
            x = self._layer(i, x, step, host)
        h = ops.rms_norm(x[step.logits_for], self.w.final_norm, self.cfg.rms_norm_eps)
        local = ops.lm_head(h, self.w.lm_head, self.cfg.logit_scale).float()
        return self.comm.all_gather_last(local) if self.plan.vocab_sharded else local
