"""The three collectives the parallel model uses, over torch.distributed (NCCL on GPUs, gloo on the
CPU), or no-ops in a world of one.

Reductions run in fp32 whatever the model dtype: a layer's partial sums are a few KB at decode
batch sizes (B x hidden), so the wider type costs nothing measurable and keeps the sharded sum as
close to the single-GPU result as summation order allows.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class Comm:
    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = group
        if dist.is_available() and dist.is_initialized():
            self.world = dist.get_world_size(group)
            self.rank = dist.get_rank(group)
        else:
            self.world, self.rank = 1, 0
        self.collectives = 0  # count, for the bench's accounting

    @classmethod
    def local(cls) -> Comm:
        """A world of one even inside a process group (a single-GPU baseline on rank 0)."""
        c = cls.__new__(cls)
        c.group, c.world, c.rank, c.collectives = None, 1, 0, 0
        return c

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of `t` over ranks (returned in t's dtype; reduced in fp32)."""
        if self.world == 1:
            return t
        buf = t.float().contiguous()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group)
        self.collectives += 1
        return buf.to(t.dtype)

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `t` [..., n] along the last dim, in rank order -> [..., world*n]."""
        if self.world == 1:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t.contiguous(), group=self.group)
        self.collectives += 1
        return torch.cat(parts, dim=-1)

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite `t` in place with `t` of rank `src` of this group."""
        if self.world > 1:
            dist.broadcast(t, group=self.group, group_src=src)
            self.collectives += 1
        return t

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest `value` over ranks (e.g. KV pages every rank can hold)."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())
