"""Tiling.oproj_combine: no ATTN_COMBINE tasks; each O-proj tile merges its kv head's attention
splits itself (mk_abi.h MK_OPROJ_COMBINE) after the head's one attention counter. The emulator runs
such schedules under every interleaving against the reference; a wait the mode relies on, removed or
pointed at the wrong head, must fail loudly."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.emulator import STRATEGIES, Emulator, HazardError
from mkcode.backend.megakernel.emulator_ops import StepInputs
from mkcode.backend.megakernel.schedule import build_schedule
from mkcode.backend.megakernel.tiling import TilingError, default_tiling
from mkcode.backend.megakernel.workspace import CounterBank, Workspace
from mkcode.backend.model.weights import random_weights
from tests.backend.megakernel.cases import clone_batch, make_case, reference_step, tiny_config
from tests.backend.megakernel.test_emulator import TILING as EMULATOR_TILING
from tests.backend.megakernel.test_emulator import _check, _release_engine_step

CFG = tiny_config()
TILING = replace(EMULATOR_TILING, oproj_combine=1)
N_SMS = 6


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=1, std=0.1)


def _run(weights, contexts, sched, strategy="random", seed=0, splits=None):
    case = make_case(CFG, contexts, seed=seed + 11)
    ref_batch = clone_batch(case.batch)
    ref = reference_step(CFG, weights, ref_batch)
    ws = Workspace.allocate(CFG, TILING, "cpu")
    ws.poison()
    batch = clone_batch(case.batch)
    inp = StepInputs(batch.token_ids, batch.positions, batch.block_tables, batch.kv_pool)
    Emulator(CFG, weights, sched, ws, CounterBank(sched.n_counters, start=7)).step(inp, strategy, seed)
    return ws, batch, ref, ref_batch


def _oproj(sched, layer):
    every = list(sched.tasks) + list(sched.queue_desc)
    return [t for t in every if t[abi.MK_F_OP] == abi.MK_OP_OPROJ and t[abi.MK_F_LAYER] == layer]


@pytest.mark.parametrize(
    "contexts,splits",
    [
        ([0], None),
        ([63, 64], {False: [3, 2], True: [2, 1]}),  # page boundary; more splits than pages (empty)
        ([5, 130, 64, 200], {False: [1, 4, 2, 3], True: [2, 2, 1, 3]}),  # ragged splits per row
        ([1, 2, 65, 127, 128, 129, 191, 255], None),  # BS 8
    ],
)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fused,inline", [(1, 1), (0, 0), (1, 0)], ids=["fused-inline", "up-down", "fused"])
def test_oproj_merges_the_splits(weights, contexts, splits, strategy, fused, inline):
    tiling = replace(TILING, moe_fused=fused, norm_inline=inline, ctrl_sms=1, combine_ctrl=1)
    B = len(contexts)
    sched = build_schedule(CFG, B, contexts, N_SMS, tiling, splits)
    assert "ATTN_COMBINE" not in sched.summary()
    for t in _oproj(sched, 1):
        assert t[abi.MK_F_NTOK] == abi.MK_OPROJ_COMBINE
        row_splits = [int(t[abi.MK_F_SLOT0 + b]) for b in range(B)]
        if splits:
            assert row_splits == splits[CFG.is_sliding(1)]
    ws, batch, ref, ref_batch = _run(weights, contexts, sched, strategy)
    _check(ws, batch, ref, ref_batch)
    assert torch.isnan(ws["attn_out"][:, :B]).all()  # nobody combined into attn_out


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_oproj_merges_with_self_routing_items(weights, strategy):
    """The BS 1 engine's layout (Tiling.moe_local: the O-proj tiles a host queue of their own)."""
    tiling = replace(TILING, moe_fused=1, norm_inline=1, moe_local=1)
    sched = build_schedule(CFG, 1, [200], 16, tiling)
    assert "ATTN_COMBINE" not in sched.summary() and "ROUTE" not in sched.summary()
    _check(*_run(weights, [200], sched, strategy))


def _broken_runs(weights, contexts, sched) -> list[int]:
    """The seeds of four interleavings in which the hazard check reports a race."""
    caught = []
    for seed in range(4):
        try:
            _run(weights, contexts, sched, "random", seed)
        except HazardError as e:
            assert "race" in str(e) or "never written" in str(e), e
            caught.append(seed)
    return caught


def test_oproj_without_its_attention_wait_is_caught(weights):
    contexts = [70, 3]
    sched = build_schedule(CFG, 2, contexts, N_SMS, TILING)
    i = next(i for i, t in enumerate(sched.queue_desc) if t[abi.MK_F_OP] == abi.MK_OP_OPROJ)
    assert _broken_runs(weights, contexts, sched.without_queue_wait(i, 0))


def test_oproj_waiting_for_the_other_heads_splits_is_caught(weights):
    contexts = [70, 3]
    sched = build_schedule(CFG, 2, contexts, N_SMS, TILING)
    q = sched.queue_desc.copy()
    items = [i for i, t in enumerate(q) if t[abi.MK_F_OP] == abi.MK_OP_OPROJ and t[abi.MK_F_LAYER] == 1]
    heads = {int(q[i, abi.MK_F_A4]): int(q[i, abi.MK_F_WAIT0]) for i in items}
    assert len(set(heads.values())) == CFG.num_key_value_heads  # one counter per kv head
    for i in items:  # every tile of head 0 waits for head 1's splits
        if q[i, abi.MK_F_A4] == 0:
            q[i, abi.MK_F_WAIT0] = heads[1]
    assert _broken_runs(weights, contexts, replace(sched, queue_desc=q))


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_oproj_combine_release_geometry(batch):
    """The engine's tiling with oproj_combine at the release geometry (5 layers): no combine task,
    no deadlock, every counter at its total, the happens-before check clean."""
    sched, rep = _release_engine_step(batch, 5, 77, 3, oproj_combine=1)
    assert "ATTN_COMBINE" not in sched.summary()
    assert rep.events > sum(int(t[abi.MK_F_OP]) != abi.MK_OP_DRAIN for t in sched.tasks)


def test_oproj_combine_refuses_more_merge_weights_than_the_kernel_holds():
    from mkcode.backend.model.config import north_mini_code_config

    cfg = north_mini_code_config()
    ok = replace(default_tiling(cfg), oproj_combine=1, max_splits=32)
    ok.validate(cfg)  # 8 rows x 8 heads x 32 splits = 2048 weights
    with pytest.raises(TilingError, match="merge weights"):
        replace(ok, split_tokens=1024, split_cap=33).validate(cfg)
    with pytest.raises(TilingError, match="oproj_combine must be 0 or 1"):
        replace(ok, oproj_combine=2).validate(cfg)
