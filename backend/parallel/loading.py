"""Loading only this rank's slices of a checkpoint (the sliced path of `build_parallel_runtime`).

`load_shard(dir, plan)` validates the checkpoint exactly as `load_checkpoint` does (`plan_load`:
every stored tensor mapped onto the canonical fused-expert layout), then allocates only this rank's
slices (`ShardPlan` ranges: q/k/v rows, o_proj and dense-down columns, dense gate/up rows, its
experts, its LM-head vocab rows; embedding, norms and routers whole) and fills them through
safetensors' memory-mapped slices, chunk by chunk. A rank never holds the full model, on the device
or on the host: with TP = EP = 8 each GPU reads ~1/8 of the attention, experts and LM head.

The result equals `shard_weights(cfg, load_checkpoint(dir).weights, plan)` bit for bit (tested).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from mkcode.backend.checkpoint.errors import CheckpointError
from mkcode.backend.checkpoint.layout import Placement, itemsize
from mkcode.backend.checkpoint.loader import plan_checkpoint
from mkcode.backend.checkpoint.progress import ByteProgress
from mkcode.backend.checkpoint.transfer import ChunkCopier
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.weights import EMBED, FINAL_NORM, LM_HEAD, layer_prefix
from mkcode.backend.parallel.plan import ShardPlan
from mkcode.backend.parallel.shard import ShardLayer, ShardWeights

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


@dataclass
class LoadedShard:
    config: ModelConfig
    weights: ShardWeights
    nbytes: int  # bytes read from the shards by this rank
    seconds: float


def owned_slice(cfg: ModelConfig, plan: ShardPlan, name: str) -> tuple[int, range] | None:
    """(dim, index range) of canonical tensor `name` this rank holds, or None when it holds it whole."""
    d = cfg.head_dim
    if name == LM_HEAD:
        return (0, plan.vocab(cfg)) if plan.vocab_sharded else None
    m = _LAYER.match(name)
    if m is None:
        return None  # embedding, final norm
    rest = m[2]
    q, kv = plan.q_heads(cfg), plan.kv_heads(cfg)
    q_rows, kv_rows = range(q.start * d, q.stop * d), range(kv.start * d, kv.stop * d)
    dense, experts = plan.dense_cols(cfg), plan.experts(cfg)
    table: dict[str, tuple[int, range]] = {
        "self_attn.q_proj.weight": (0, q_rows),
        "self_attn.k_proj.weight": (0, kv_rows),
        "self_attn.v_proj.weight": (0, kv_rows),
        "self_attn.o_proj.weight": (1, q_rows),
        "mlp.gate_proj.weight": (0, dense),
        "mlp.up_proj.weight": (0, dense),
        "mlp.down_proj.weight": (1, dense),
        "mlp.experts.gate_up_proj": (0, experts),
        "mlp.experts.down_proj": (0, experts),
    }
    return table.get(rest)  # norms and routers: whole


def _local_shape(shape: tuple[int, ...], own: tuple[int, range] | None) -> tuple[int, ...]:
    if own is None:
        return shape
    dim, r = own
    out = list(shape)
    out[dim] = len(r)
    return tuple(out)


def _expert_of(p: Placement) -> int | None:
    """The expert a per-expert placement fills (its first index), None for a whole tensor."""
    return p.index[0] if p.index and isinstance(p.index[0], int) else None


def _is_whole(own: tuple[int, range] | None, shape: tuple[int, ...]) -> bool:
    return own is None or (own[1].start == 0 and len(own[1]) == shape[own[0]])


def _copy_rows(
    handle: Any,
    name: str,
    dst: torch.Tensor,
    own: tuple[int, range] | None,
    copier: ChunkCopier,
    on_bytes: Callable[[int], None],
) -> None:
    """dst = stored[name] restricted to `own` (dim 0 or 1), read in chunks along dim 0."""
    sl = handle.get_slice(name)
    shape = [int(x) for x in sl.get_shape()]
    if not shape:
        src = handle.get_tensor(name)
        copier.copy(dst, src)
        on_bytes(src.nbytes)
        return
    dim, r = own if own is not None else (0, range(shape[0]))
    rows = range(shape[0]) if dim != 0 else r
    cols = r if dim == 1 else None
    row_elems = math.prod(shape[1:]) if cols is None else len(cols) * math.prod(shape[2:])
    step = max(1, copier.chunk_bytes // max(1, itemsize(sl.get_dtype()) * row_elems))
    for a in range(rows.start, rows.stop, step):
        b = min(rows.stop, a + step)
        src = sl[a:b] if cols is None else sl[a:b, cols.start : cols.stop]
        copier.copy(dst[a - rows.start : b - rows.start], src)
        on_bytes(src.nbytes)


def _open(file: Path) -> Any:
    try:
        return safe_open(file, framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from e


def load_shard(
    ckpt_dir: str | Path,
    plan: ShardPlan,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: bool | Callable[[int, int], None] = False,
) -> LoadedShard:
    """This rank's `ShardWeights` of the checkpoint in `ckpt_dir`, read slice by slice."""
    ckpt_dir = Path(ckpt_dir)
    lp, _ = plan_checkpoint(ckpt_dir)
    cfg = lp.config
    plan.validate(cfg)
    dev = torch.device(device)
    owns = {name: owned_slice(cfg, plan, name) for name in lp.targets}
    targets = {
        name: torch.empty(_local_shape(shape, owns[name]), device=dev, dtype=dtype)
        for name, shape in lp.targets.items()
    }

    # What this rank reads: whole-tensor placements (sliced to what it owns), its experts' pieces,
    # and for a tied checkpoint that also stores lm_head, its vocab rows of that (checked, not kept).
    work: list[tuple[Placement, int]] = []
    for p in lp.placements:
        own = owns.get(p.target)
        expert = _expert_of(p)
        if p.tied_check:
            vocab = plan.vocab(cfg) if plan.vocab_sharded else range(cfg.vocab_size)
            work.append((p, p.source.nbytes * len(vocab) // cfg.vocab_size))
        elif expert is not None:
            assert own is not None
            if expert in own[1]:
                work.append((p, p.source.nbytes))
        else:
            full = lp.targets[p.target]
            frac = 1.0 if _is_whole(own, full) else len(own[1]) / full[own[0]]  # type: ignore[index]
            work.append((p, int(p.source.nbytes * frac)))
    total = sum(n for _, n in work)

    by_file: dict[Path, list[Placement]] = {}
    for p, _ in work:
        by_file.setdefault(p.source.file, []).append(p)
    copier = ChunkCopier(dev)
    callback = progress if callable(progress) else None
    bar_on = bool(progress) and callback is None
    t0 = time.perf_counter()
    tied: list[Placement] = []
    with ByteProgress(
        f"loading {ckpt_dir.name} ({plan.describe()})", total, enabled=bar_on, callback=callback
    ) as bar:
        for file, placements in by_file.items():
            with _open(file) as handle:
                for p in placements:
                    if p.tied_check:
                        tied.append(p)
                        continue
                    own = owns[p.target]
                    expert = _expert_of(p)
                    try:
                        if expert is not None:
                            assert own is not None
                            dst = targets[p.target][(expert - own[1].start, *p.index[1:])]
                            _copy_rows(handle, p.source.name, dst, None, copier, bar.advance)
                        else:
                            _copy_rows(handle, p.source.name, targets[p.target], own, copier, bar.advance)
                    except SafetensorError as e:
                        raise CheckpointError(f"tensor {p.source.name!r} in {file}: cannot read ({e})") from e
        copier.finish()
        for p in tied:
            _check_tied(cfg, plan, p, targets[EMBED], copier, bar.advance)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0
    return LoadedShard(cfg, _assemble(cfg, plan, targets), total, seconds)


def _check_tied(
    cfg: ModelConfig,
    plan: ShardPlan,
    p: Placement,
    embed: torch.Tensor,
    copier: ChunkCopier,
    on_bytes: Callable[[int], None],
) -> None:
    """A stored lm_head next to tied embeddings must equal them: each rank checks its vocab rows."""
    vocab = plan.vocab(cfg) if plan.vocab_sharded else range(cfg.vocab_size)
    rows = embed.narrow(0, vocab.start, len(vocab))
    scratch = torch.empty_like(rows)
    with _open(p.source.file) as handle:
        _copy_rows(handle, p.source.name, scratch, (0, vocab), copier, on_bytes)
        copier.finish()
    if not torch.equal(scratch, rows):
        raise CheckpointError(
            f"tensor {p.source.name!r} in {p.source.file} differs from {EMBED!r}, but config.json has "
            "tie_word_embeddings=true (set it to false to use a separate LM head)"
        )


def _assemble(cfg: ModelConfig, plan: ShardPlan, t: dict[str, torch.Tensor]) -> ShardWeights:
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i)
        sl = ShardLayer(
            norm=t[p + "input_layernorm.weight"],
            q=t[p + "self_attn.q_proj.weight"],
            k=t[p + "self_attn.k_proj.weight"],
            v=t[p + "self_attn.v_proj.weight"],
            o=t[p + "self_attn.o_proj.weight"],
        )
        if cfg.is_dense(i):
            sl.gate, sl.up, sl.down = (
                t[p + "mlp.gate_proj.weight"],
                t[p + "mlp.up_proj.weight"],
                t[p + "mlp.down_proj.weight"],
            )
        else:
            sl.router = t[p + "mlp.gate.weight"]
            sl.experts_gate_up = t[p + "mlp.experts.gate_up_proj"]
            sl.experts_down = t[p + "mlp.experts.down_proj"]
            sl.first_expert = plan.experts(cfg).start
        layers.append(sl)
    embed = t[EMBED]
    if cfg.tie_word_embeddings:
        vocab = plan.vocab(cfg)
        lm_head = embed.narrow(0, vocab.start, len(vocab)) if plan.vocab_sharded else embed
    else:
        lm_head = t[LM_HEAD]
    return ShardWeights(embed=embed, final_norm=t[FINAL_NORM], lm_head=lm_head, layers=layers)
