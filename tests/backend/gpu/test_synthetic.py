"""Synthetic KV and routing generators (CPU, reduced geometry)."""

import torch

from mkcode.backend.bench.synthetic import (
    bench_model,
    distinct_experts,
    kv_pages_needed,
    reduced_config,
    synthetic_kv,
)
from mkcode.backend.kv.layout import NO_PAGE, PAGE_SIZE, first_visible_position


def test_synthetic_kv_layout():
    cfg = reduced_config()  # window 96, layers 0 and 4 full
    contexts = [10, 200, 64]
    kv = synthetic_kv(cfg, contexts, device="cpu", dtype=torch.float32)
    L = cfg.num_hidden_layers
    assert kv.block_tables.shape == (L, 3, 200 // PAGE_SIZE + 1)
    assert kv.positions.tolist() == contexts
    assert kv.pool.shape[0] == kv_pages_needed(cfg, contexts)
    used = kv.block_tables[kv.block_tables != NO_PAGE]
    assert sorted(used.tolist()) == list(range(kv.pool.shape[0]))  # every page used once
    for b, ctx in enumerate(contexts):
        for layer in range(L):
            row = kv.block_tables[layer, b]
            first = first_visible_position(ctx, cfg.window(layer)) // PAGE_SIZE
            last = ctx // PAGE_SIZE
            mapped = (row != NO_PAGE).nonzero()[:, 0].tolist()
            assert mapped == list(range(first, last + 1))
    assert abs(float(kv.pool.std()) - 0.01) < 1e-3
    assert abs(float(kv.pool.mean())) < 1e-3


def test_skewed_routing_reads_fewer_experts():
    cfg = reduced_config(num_experts=64, num_experts_per_tok=4)
    uni = bench_model(cfg, device="cpu", dtype=torch.float32, routing="uniform")
    skw = bench_model(cfg, device="cpu", dtype=torch.float32, routing="skewed")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (16,), generator=g)

    def probe(m):
        from mkcode.backend.model import ops

        h = ops.rms_norm(m.w.embed[ids], m.w.layers[1].norm, cfg.rms_norm_eps)
        return sum(distinct_experts(m, h))

    assert probe(skw) < 0.8 * probe(uni)
