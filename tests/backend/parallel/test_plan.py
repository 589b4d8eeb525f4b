"""Sharding plans and weight slices, in one process (no collectives)."""

from __future__ import annotations

import pytest
import torch

from mkcode.backend.model.config import north_mini_code_config
from mkcode.backend.model.weights import random_weights
from mkcode.backend.parallel.plan import PlanError, ShardPlan
from mkcode.backend.parallel.shard import shard_weights
from tests.backend.engine.helpers import tiny_config


def test_full_geometry_ranges() -> None:
    cfg = north_mini_code_config()
    tp4 = [ShardPlan(4, r, tp=4, ep=4) for r in range(4)]
    assert [p.kv_heads(cfg) for p in tp4] == [range(r, r + 1) for r in range(4)]
    assert [len(p.q_heads(cfg)) for p in tp4] == [8] * 4
    assert [p.experts(cfg) for p in tp4] == [range(32 * r, 32 * (r + 1)) for r in range(4)]
    # tp 8 over 4 kv heads: two ranks share (and each store) one kv head
    tp8 = [ShardPlan(8, r, tp=8) for r in range(8)]
    assert [p.kv_heads(cfg).start for p in tp8] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(p.experts(cfg) == range(128) for p in tp8)
    assert ShardPlan(8, 5, tp=8).vocab(cfg) == range(5 * 32768, 6 * 32768)


def test_bad_layouts_say_why() -> None:
    with pytest.raises(PlanError, match="1 or the world size"):
        ShardPlan(4, 0, tp=2)
    with pytest.raises(PlanError, match="num_key_value_heads"):
        ShardPlan(3, 0, tp=3).validate(tiny_config(num_attention_heads=6, num_key_value_heads=2))
    with pytest.raises(PlanError, match="num_experts"):
        ShardPlan(3, 0, ep=3).validate(tiny_config())


def test_world_of_one_copies_nothing_and_shards_partition() -> None:
    cfg = tiny_config()
    w = random_weights(cfg)
    whole = shard_weights(cfg, w, ShardPlan(1, 0))
    assert whole.layers[1].experts_gate_up is w.layers[1].experts_gate_up and whole.lm_head is w.embed
    parts = [shard_weights(cfg, w, ShardPlan(2, r, tp=2, ep=2)) for r in range(2)]
    torch.testing.assert_close(torch.cat([p.layers[1].o for p in parts], 1), w.layers[1].o, rtol=0, atol=0)
    torch.testing.assert_close(
        torch.cat([p.layers[2].experts_down for p in parts]), w.layers[2].experts_down, rtol=0, atol=0
    )
    assert parts[1].lm_head.data_ptr() == w.embed[cfg.vocab_size // 2].data_ptr()  # tied: a view
    assert parts[0].nbytes() < whole.nbytes()
