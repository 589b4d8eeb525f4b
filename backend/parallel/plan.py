"""Which slice of the model one rank owns: the sharding plan.

Two degrees, each either 1 (replicated on every rank) or the whole world:

- `tp` (tensor parallel): attention q heads split evenly, each rank keeping the kv heads its q heads
  read (kv heads are duplicated when tp > num_kv_heads); o_proj split by the same columns; the dense
  prefix MLP split by intermediate columns; the LM head split by vocabulary rows.
- `ep` (expert parallel): the routed experts split into contiguous ranges; the router is replicated.

Both degrees span the whole world so that one layer's sharded outputs (attention and MLP of the
parallel block) are summed by ONE all-reduce per layer. A degree between 1 and the world would
replicate attention across groups and need a second, group-local collective per layer; see
docs/SCALING.md for why that is not worth it on one host.
"""

from __future__ import annotations

from dataclasses import dataclass

from mkcode.backend.model.config import ModelConfig


class PlanError(ValueError):
    """A parallel layout this model cannot be split into, with the reason."""


@dataclass(frozen=True)
class ShardPlan:
    world: int
    rank: int
    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise PlanError(f"rank {self.rank} outside world of {self.world}")
        for name, deg in (("tensor-parallel", self.tp), ("expert-parallel", self.ep)):
            if deg not in (1, self.world):
                raise PlanError(
                    f"{name} degree {deg} must be 1 or the world size {self.world} "
                    "(partial degrees would need a second collective per layer)"
                )

    # ---- what is sharded ---------------------------------------------------------------------

    @property
    def attn_sharded(self) -> bool:
        return self.tp > 1

    @property
    def experts_sharded(self) -> bool:
        return self.ep > 1

    @property
    def dense_sharded(self) -> bool:
        return self.tp > 1

    @property
    def vocab_sharded(self) -> bool:
        return self.tp > 1

    # ---- index ranges this rank owns -----------------------------------------------------------

    @staticmethod
    def _split(n: int, parts: int, rank: int) -> range:
        size = n // parts
        return range(rank * size, (rank + 1) * size)

    def q_heads(self, cfg: ModelConfig) -> range:
        return self._split(cfg.num_attention_heads, self.tp, self.rank if self.tp > 1 else 0)

    def kv_heads(self, cfg: ModelConfig) -> range:
        """The kv heads this rank's q heads read (one, duplicated, when tp > num_kv_heads)."""
        q = self.q_heads(cfg)
        g = cfg.gqa_group
        return range(q.start // g, (q.stop - 1) // g + 1)

    def experts(self, cfg: ModelConfig) -> range:
        return self._split(cfg.num_experts, self.ep, self.rank if self.ep > 1 else 0)

    def dense_cols(self, cfg: ModelConfig) -> range:
        return self._split(cfg.prefix_dense_intermediate_size, self.tp, self.rank if self.tp > 1 else 0)

    def vocab(self, cfg: ModelConfig) -> range:
        return self._split(cfg.vocab_size, self.tp, self.rank if self.tp > 1 else 0)

    def validate(self, cfg: ModelConfig) -> ShardPlan:
        """Raise PlanError unless every sharded dimension divides evenly; return self."""
        t, e = self.tp, self.ep
        hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        checks = [
            (hq % t == 0, f"num_attention_heads {hq} is not divisible by tensor-parallel {t}"),
            (
                hkv % t == 0 or t % hkv == 0,
                f"tensor-parallel {t} must divide num_key_value_heads {hkv} or be a multiple of it",
            ),
            (
                cfg.prefix_dense_intermediate_size % t == 0,
                f"dense intermediate {cfg.prefix_dense_intermediate_size} not divisible by tensor-parallel {t}",
            ),
            (cfg.vocab_size % t == 0, f"vocab {cfg.vocab_size} not divisible by tensor-parallel {t}"),
            (
                e == 1 or cfg.num_experts % e == 0,
                f"num_experts {cfg.num_experts} not divisible by expert-parallel {e}",
            ),
        ]
        for ok, why in checks:
            if not ok:
                raise PlanError(why)
        return self

    def describe(self) -> str:
        return f"world {self.world} (tp {self.tp}, ep {self.ep}), rank {self.rank}"
