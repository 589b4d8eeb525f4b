"""Parity harness: the GPU path (prefill + a decode backend over the paged pool) against the
reference model over its own dense caches, step by step, teacher-forced with the reference's
greedy tokens. Used by the tests (CPU twins, reduced and full geometry on the GPU).

`upcast_reference` builds the fp32 reference without a second full copy of the weights: layers
are upcast on access (one layer at a time), so the 30B geometry fits next to its bf16 copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.kv.layout import NO_PAGE
from mkcode.backend.kv.pool import KVPool
from mkcode.backend.kv.sequence import SequenceKV
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.reference import ReferenceModel, Segment
from mkcode.backend.model.weights import LayerWeights, ModelWeights


class _UpcastLayers(Sequence):
    """layers[i] -> that layer's weights in fp32 (cached for the last layer asked for)."""

    def __init__(self, layers: list[LayerWeights]):
        self._layers = layers
        self._cached: tuple[int, LayerWeights] | None = None

    def __len__(self) -> int:
        return len(self._layers)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self._cached is None or self._cached[0] != i:
            lw = self._layers[i]
            up = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in vars(lw).items()}
            self._cached = (i, LayerWeights(**up))
        return self._cached[1]


def upcast_reference(model: ReferenceModel) -> ReferenceModel:
    w = model.w
    embed = w.embed.float()
    lm_head = embed if w.lm_head.data_ptr() == w.embed.data_ptr() else w.lm_head.float()
    up = ModelWeights(embed=embed, final_norm=w.final_norm.float(), lm_head=lm_head, layers=[])
    up.layers = _UpcastLayers(w.layers)  # type: ignore[assignment]
    return ReferenceModel(model.cfg, up)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


@dataclass
class ParityReport:
    cosines: list[float] = field(default_factory=list)  # one per (step, row); step 0 = prefill
    agree: list[bool] = field(default_factory=list)  # greedy token equal
    margins: list[float] = field(default_factory=list)  # reference top-1 minus top-2 logit

    def min_cosine(self) -> float:
        return min(self.cosines)

    def disagreements(self, margin: float) -> int:
        """Greedy disagreements where the reference's top-1 led by more than `margin`."""
        return sum(1 for a, m in zip(self.agree, self.margins, strict=True) if not a and m > margin)


def _compare(rep: ParityReport, ours: torch.Tensor, ref: torch.Tensor) -> None:
    for o, r in zip(ours, ref, strict=True):
        rep.cosines.append(cosine(o, r))
        top2 = torch.topk(r.double(), 2).values
        rep.margins.append(float(top2[0] - top2[1]))
        rep.agree.append(int(o.argmax()) == int(r.argmax()))


def run_parity(
    model: ReferenceModel,
    reference: ReferenceModel,
    prefill_fn: Callable,
    backend,
    contexts: list[int],
    steps: int,
    *,
    seed: int = 0,
    pool_pages: int | None = None,
) -> ParityReport:
    """Prefill B prompts of the given lengths, then `steps` decode steps of all B rows at once."""
    cfg: ModelConfig = model.cfg
    dev = model.device
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in contexts]
    longest = max(contexts) + steps + 1
    need = pool_pages or cfg.num_hidden_layers * len(contexts) * (longest // 64 + 2)
    pool = KVPool(
        need, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, device=dev, dtype=model.dtype
    )
    seqs = [SequenceKV(cfg) for _ in contexts]
    caches = [reference.new_cache(longest) for _ in contexts]
    rep = ParityReport()

    ids, pos, segs, ref_segs, off = [], [], [], [], 0
    for p, seq, cache in zip(prompts, seqs, caches, strict=True):
        seq.ensure_capacity(pool, len(p))
        ids += p
        pos += range(len(p))
        segs.append(Segment(off, off + len(p), seq.view(pool)))
        ref_segs.append(Segment(off, off + len(p), cache))
        off += len(p)
    t_ids = torch.tensor(ids, device=dev)
    t_pos = torch.tensor(pos, device=dev)
    ours = prefill_fn(t_ids, t_pos, segs)
    ref = reference.forward(t_ids, t_pos, ref_segs)
    _compare(rep, ours, ref)

    tokens = [int(t) for t in ref.argmax(-1).tolist()]
    lengths = list(contexts)
    for _ in range(steps):
        for seq, n in zip(seqs, lengths, strict=True):
            seq.release_outside_window(pool, n)
            seq.ensure_capacity(pool, n + 1)
        L = cfg.num_hidden_layers
        width = max(len(s.tables[0]) for s in seqs)
        tables = torch.full((L, len(seqs), width), NO_PAGE, dtype=torch.int32)
        for b, s in enumerate(seqs):
            for layer in range(L):
                tables[layer, b, : len(s.tables[layer])] = torch.tensor(s.tables[layer], dtype=torch.int32)
        batch = DecodeBatch(
            token_ids=torch.tensor(tokens, device=dev),
            positions=torch.tensor(lengths, device=dev),
            block_tables=tables.to(dev),
            kv_pool=pool.tensor,
        )
        ours = backend.decode(batch)
        ref = reference.forward(
            batch.token_ids, batch.positions, [Segment(b, b + 1, c) for b, c in enumerate(caches)]
        )
        _compare(rep, ours, ref)
        tokens = [int(t) for t in ref.argmax(-1).tolist()]
        lengths = [n + 1 for n in lengths]
    return rep


def bf16_model_pair(
    cfg: ModelConfig, device: str | torch.device, seed: int = 0
) -> tuple[ReferenceModel, ReferenceModel]:
    """(bf16 model, its fp32 reference) with identical weight values."""
    from mkcode.backend.model.weights import random_weights

    w = random_weights(cfg, device=device, dtype=torch.bfloat16, seed=seed)
    model = ReferenceModel(cfg, w)
    return model, upcast_reference(model)
