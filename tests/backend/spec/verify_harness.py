"""Verify rows against single rows: a decode step that runs several staggered rows of one sequence
(positions n..n+r-1 over one block table) must give each row the logits that r one-row steps
give, fed the same tokens in order. The pool is filled with noise first, so a row that read a slot
before the step's own write (or missed the K/V of the rows before it) gets different logits."""

from __future__ import annotations

import numpy as np
import torch

from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.kv.layout import NO_PAGE
from mkcode.backend.kv.pool import KVPool
from mkcode.backend.kv.sequence import SequenceKV
from mkcode.backend.model.reference import ReferenceModel, Segment
from tests.backend.gpu.parity import cosine


def _batch(seqs, feeds, starts, pool, dev, seq_rows) -> DecodeBatch:
    L = seqs[0].num_layers
    width = max(s.num_blocks for s in seqs)
    n_rows = sum(len(f) for f in feeds)
    tables = np.full((L, n_rows, width), NO_PAGE, dtype=np.int32)
    ids, pos, r = [], [], 0
    for s, f, start in zip(seqs, feeds, starts):
        tables[:, r : r + len(f), : s.num_blocks] = s.array[:, None, :]
        ids += f
        pos += range(start, start + len(f))
        r += len(f)
    return DecodeBatch(
        token_ids=torch.tensor(ids, device=dev),
        positions=torch.tensor(pos, device=dev),
        block_tables=torch.from_numpy(tables).to(dev),
        kv_pool=pool.tensor,
        host_positions=tuple(pos),
        seq_rows=tuple(len(f) for f in feeds) if seq_rows else None,
    )


def verify_vs_single_rows(
    model: ReferenceModel, backend, contexts: list[int], rows: list[int], seed: int = 0
) -> list[tuple[float, bool, float]]:
    """(cosine, same argmax, single-row top-1 margin) for every row of every sequence."""
    cfg, dev = model.cfg, model.device
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in contexts]
    feeds = [torch.randint(0, cfg.vocab_size, (r,), generator=g).tolist() for r in rows]
    pages = cfg.num_hidden_layers * sum((n + r) // 64 + 2 for n, r in zip(contexts, rows))
    pool = KVPool(
        pages, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, device=dev, dtype=model.dtype
    )
    pool.tensor.copy_(torch.randn(pool.tensor.shape, generator=g).to(pool.tensor.dtype))
    seqs = [SequenceKV(cfg) for _ in contexts]
    ids, pos, segs, off = [], [], [], 0
    for p, s, r in zip(prompts, seqs, rows):
        s.ensure_capacity(pool, len(p) + r)
        ids += p
        pos += range(len(p))
        segs.append(Segment(off, off + len(p), s.view(pool)))
        off += len(p)
    model.forward(torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), segs)
    before = pool.tensor.clone()

    together = backend.decode(_batch(seqs, feeds, contexts, pool, dev, True)).float().cpu()
    pool.tensor.copy_(before)
    single: dict[tuple[int, int], torch.Tensor] = {}
    for i in range(max(rows)):
        live = [b for b, r in enumerate(rows) if r > i]
        out = backend.decode(
            _batch(
                [seqs[b] for b in live],
                [[feeds[b][i]] for b in live],
                [contexts[b] + i for b in live],
                pool,
                dev,
                False,
            )
        ).float()
        for j, b in enumerate(live):
            single[(b, i)] = out[j].cpu()
    result, r0 = [], 0
    for b, r in enumerate(rows):
        for i in range(r):
            a, s = together[r0 + i], single[(b, i)]
            top2 = torch.topk(s.double(), 2).values
            result.append((cosine(a, s), int(a.argmax()) == int(s.argmax()), float(top2[0] - top2[1])))
        r0 += r
    return result


def gpu_engine(model: ReferenceModel, backend, speculative: str):
    """An engine over `backend` on the GPU (bf16 pool, GPU prefill) with speculation on or off."""
    from mkcode.backend.engine.engine import Engine, EngineOptions
    from mkcode.backend.gpu.prefill import GpuPrefill

    cfg = model.cfg
    pool = KVPool(
        2000,
        cfg.num_hidden_layers,
        cfg.num_key_value_heads,
        cfg.head_dim,
        device="cuda",
        dtype=torch.bfloat16,
    )
    return Engine(
        model, pool, backend, options=EngineOptions(speculative=speculative), prefill_fn=GpuPrefill(model)
    )
