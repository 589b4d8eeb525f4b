"""The step's scratch buffers and counters, shared by the CUDA kernel and the CPU emulator.

Per-layer buffers (q[l], attn_out[l], ...) are written once per step, so within a step there are no
write-after-read hazards: the only orderings that matter are producer -> consumer, and those are the
counters. x[l + 1], layer l's sum, is initialised once (the residual x[l], copied by its router tiles
or, for a dense layer 0, by EMBED) and then only added into (fp32 atomics) before it is read. Row
strides use MK_MAX_TOKENS whatever the batch, so one layout serves every batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.schedule import Schedule
from mkcode.backend.megakernel.tiling import Tiling
from mkcode.backend.model.config import ModelConfig

FLOAT_BUFFERS = (
    "x",
    "q",
    "o_part",
    "lse_part",
    "attn_out",
    "dense_act",
    "rlogits",
    "route_w",
    "moe_act",
    "logits",
    "lm_best",
)
INT_BUFFERS = ("expert_tab", "moe_info", "lm_arg", "tokens_out")


def buffer_shapes(cfg: ModelConfig, tiling: Tiling) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    L, B, H = cfg.num_hidden_layers, abi.MK_MAX_TOKENS, cfg.hidden_size
    Hq, d, S = cfg.num_attention_heads, cfg.head_dim, tiling.most_splits()
    E, K = max(cfg.num_experts, 1), max(cfg.num_experts_per_tok, 1)
    D, I = max(cfg.prefix_dense_intermediate_size, 1), max(cfg.intermediate_size, 1)
    n_lm = -(-cfg.vocab_size // tiling.lm_rows)
    f32, i32, i64 = torch.float32, torch.int32, torch.int64
    return {
        "x": ((L + 1, B, H), f32),
        "q": ((L, B, Hq * d), f32),
        "o_part": ((L, B, Hq, S, d), f32),
        "lse_part": ((L, B, Hq, S), f32),
        "attn_out": ((L, B, Hq * d), f32),
        "dense_act": ((L, B, D), f32),
        "rlogits": ((L, B, E), f32),
        "route_w": ((L, B * K), f32),
        "expert_tab": ((L, E, 2 + abi.MK_MAX_TOKENS), i32),
        "moe_info": ((L, 4), i32),
        "moe_act": ((L, B * K, I), f32),
        "logits": ((B, cfg.vocab_size), f32),
        "lm_best": ((n_lm, B), f32),
        "lm_arg": ((n_lm, B), i32),
        "tokens_out": ((B,), i64),
    }


@dataclass
class Workspace:
    cfg: ModelConfig
    tiling: Tiling
    bufs: dict[str, torch.Tensor]

    @classmethod
    def allocate(
        cls, cfg: ModelConfig, tiling: Tiling, device: torch.device | str, math: bool = True
    ) -> Workspace:
        """With math=False (schedule checks at full geometry) float buffers are 'meta' tensors and
        only the small int buffers (routing tables) are real, on the CPU."""

        def where(dtype: torch.dtype) -> torch.device | str:
            return device if math or not dtype.is_floating_point else "meta"

        bufs = {
            n: torch.empty(
                s, dtype=t, device=where(t) if math else ("meta" if t.is_floating_point else "cpu")
            )
            for n, (s, t) in buffer_shapes(cfg, tiling).items()
        }
        ws = cls(cfg, tiling, bufs)
        ws.poison()
        return ws

    def poison(self) -> None:
        """NaN in every float buffer, a sentinel in every int buffer: unwritten reads show up."""
        for n in FLOAT_BUFFERS:
            self.bufs[n].fill_(float("nan"))
        for n in INT_BUFFERS:
            self.bufs[n].fill_(-7777)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.bufs[name]


class CounterBank:
    """Dependency counters and their per-step bases (the step epoch: docs/MEGAKERNEL.md, Counters).

    Counters are never reset between steps: the host keeps `base` = each counter's value at the
    step's start (the running sum of every finished step's known increments, mod 2^32), and the
    kernel waits for base + target. Dynamic counters (MoE heads, expert counts) are reset on the
    device by ROUTE and keep base 0. `values` is the emulator's copy of the device counters."""

    def __init__(self, capacity: int, start: int = 0):
        self.capacity = capacity
        self.base = np.full(capacity, start, dtype=np.uint32)
        self.values = np.full(capacity, start, dtype=np.uint32)  # emulator only

    def step_done(self, schedule: Schedule) -> None:
        """Advance the bases by the step's totals (mod 2^32)."""
        n = schedule.n_counters
        if n > self.capacity:
            raise ValueError("schedule has more counters than the bank")
        nd = schedule.counters.n_dynamic
        self.base[nd:n] += schedule.totals32[nd:n]  # uint32: wraps mod 2^32
        self.base[:nd] = 0

    def prepare(self, schedule: Schedule) -> None:
        if schedule.n_counters > self.capacity:
            raise ValueError(f"schedule needs {schedule.n_counters} counters, bank holds {self.capacity}")
        self.base[: schedule.counters.n_dynamic] = 0
