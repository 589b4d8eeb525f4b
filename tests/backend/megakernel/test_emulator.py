"""The CPU emulator runs the schedule's descriptors under many interleavings; the step must equal the
reference model over the same paged cache, and broken schedules must fail loudly."""

from __future__ import annotations

import re
from dataclasses import replace as dc_replace

import numpy as np
import pytest
import torch

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.emulator import (
    STRATEGIES,
    CounterError,
    DeadlockError,
    Emulator,
    HazardError,
)
from mkcode.backend.megakernel.emulator_ops import StepInputs
from mkcode.backend.megakernel.schedule import build_schedule
from mkcode.backend.megakernel.tiling import Tiling, attention_splits, default_tiling
from mkcode.backend.megakernel.workspace import CounterBank, Workspace
from mkcode.backend.model.config import north_mini_code_config
from mkcode.backend.model.weights import random_weights
from tests.backend.megakernel.cases import (
    clone_batch,
    make_case,
    reference_step,
    residual_cosines,
    tiny_config,
)

CFG = tiny_config()
# small tiles so that every matrix becomes several tasks; lm_rows leaves a partial last tile
TILING = Tiling(
    qkv_rows=32,
    o_rows=32,
    router_rows=4,
    dense_up_cols=32,
    dense_down_rows=32,
    mlp_splits=2,
    moe_up_cols=32,
    moe_down_rows=32,
    lm_rows=96,
    max_splits=8,
)
N_SMS = 6


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=1, std=0.1)


def _inputs(batch) -> StepInputs:
    return StepInputs(batch.token_ids, batch.positions, batch.block_tables, batch.kv_pool)


def _run(weights, contexts, splits=None, strategy="random", seed=0, bank_start=0, sched=None, residuals=None):
    case = make_case(CFG, contexts, seed=seed + 11)
    ref_batch = clone_batch(case.batch)
    ref = reference_step(CFG, weights, ref_batch, residuals=residuals)
    sched = sched or build_schedule(CFG, len(contexts), contexts, N_SMS, TILING, splits)
    ws = Workspace.allocate(CFG, TILING, "cpu")
    bank = CounterBank(sched.n_counters, start=bank_start)
    batch = clone_batch(case.batch)
    Emulator(CFG, weights, sched, ws, bank).step(_inputs(batch), strategy, seed)
    return ws, batch, ref, ref_batch, sched


def _check(ws, batch, ref, ref_batch):
    B = batch.size
    torch.testing.assert_close(ws["logits"][:B], ref, rtol=1e-4, atol=1e-5)
    # the K/V written by later layers carry the fp32 rounding of the earlier layers' sums, whose order
    # differs from the reference's (the layer's outputs add into x(l+1) in claim order): 1e-6 absolute
    # was crossed by one element in 1.6M (1.2e-6) on a fresh checkout; the logits' tolerance here
    torch.testing.assert_close(batch.kv_pool, ref_batch.kv_pool, rtol=1e-4, atol=1e-5)
    assert ws["tokens_out"][:B].tolist() == ref.argmax(-1).tolist()


@pytest.mark.parametrize(
    "contexts,splits",
    [
        ([0], None),
        ([63, 64], {False: [3, 2], True: [2, 1]}),  # page boundary; more splits than pages (empty)
        ([5, 130, 64, 200], {False: [1, 4, 2, 3], True: [2, 2, 1, 3]}),  # ragged, window crossing
        ([1, 2, 65, 127, 128, 129, 191, 255], None),  # BS 8
    ],
)
@pytest.mark.parametrize("strategy", ["random", "reverse"])
@pytest.mark.parametrize("fused", [1, 0], ids=["fused", "up-down"])
def test_step_matches_reference(weights, contexts, splits, strategy, fused):
    """Fused MoE items (Tiling.moe_fused: up + down slice, atomic sums) and separate up/down tiles;
    the layer's outputs added into x(l+1) and the norm computed by every GEMV over h."""
    from dataclasses import replace

    t = replace(TILING, moe_fused=fused)
    sched = build_schedule(CFG, len(contexts), contexts, N_SMS, t, splits)
    residuals: list[torch.Tensor] = []
    ws, batch, ref, ref_batch, _ = _run(weights, contexts, splits, strategy, sched=sched, residuals=residuals)
    _check(ws, batch, ref, ref_batch)
    # every layer's output x(l + 1), not only the logits (as the GPU tests check it)
    assert len(residuals) == CFG.num_hidden_layers
    for layer, want in enumerate(residuals):
        torch.testing.assert_close(ws["x"][layer + 1, : len(contexts)], want, rtol=1e-4, atol=1e-5)
    assert float(residual_cosines(ws, residuals, len(contexts)).min()) > 0.99999


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_and_wrapping_counters(weights, strategy):
    # counters start just below 2^32, so targets wrap within the step
    _check(
        *_run(
            weights,
            [70, 3, 190],
            {False: [2, 1, 3], True: [1, 1, 2]},
            strategy,
            seed=5,
            bank_start=0xFFFFFFF0,
        )[:4]
    )


def _steps_in_a_row(weights, contexts, sched, steps, case_seed, strategy="random", bank_start=0):
    """`steps` greedy steps on one emulator and counter bank, each checked against the reference."""
    case = make_case(CFG, contexts, seed=case_seed)
    ref_batch, batch = clone_batch(case.batch), clone_batch(case.batch)
    ws = Workspace.allocate(CFG, TILING, "cpu")
    em = Emulator(CFG, weights, sched, ws, CounterBank(sched.n_counters, start=bank_start))
    for step in range(steps):
        ref = reference_step(CFG, weights, ref_batch)
        ws.poison()
        em.step(_inputs(batch), strategy, seed=step)
        _check(ws, batch, ref, ref_batch)
        for bt in (batch, ref_batch):
            bt.token_ids = ref.argmax(-1)
            bt.positions = bt.positions + 1


def test_consecutive_steps_need_no_counter_reset(weights):
    """Two steps in a row on one counter bank: bases advance, counters are never zeroed."""
    contexts = [64, 9]
    sched = build_schedule(CFG, 2, contexts, N_SMS, TILING, {False: [2, 2], True: [1, 2]})
    _steps_in_a_row(weights, contexts, sched, 2, case_seed=3)


def _find(sched, op, layer=None):
    for t in sched.tasks:
        if t[abi.MK_F_OP] == op and (layer is None or t[abi.MK_F_LAYER] == layer):
            return int(t[abi.MK_F_ID])
    raise LookupError(op)


def _find_item(sched, op, layer):
    """The host queue index of the first item with this opcode in this layer."""
    for i, t in enumerate(sched.queue_desc):
        if t[abi.MK_F_OP] == op and t[abi.MK_F_LAYER] == layer:
            return i
    raise LookupError(op)


@pytest.mark.parametrize(
    "op,layer,slot",
    [
        (abi.MK_OP_OPROJ, 0, 0),  # the combine wait (a static task in the dense layer)
        (abi.MK_OP_QKV, 3, 0),  # the previous layer's end (its sum x(3) complete)
        (abi.MK_OP_DENSE_DOWN, 0, 0),
        (abi.MK_OP_ROUTE, 1, 0),
    ],
)
def test_deleted_dependency_is_caught(weights, op, layer, slot):
    """(Some waits are implied by others through program order; these are not.)"""
    contexts = [70, 3]
    sched = build_schedule(CFG, 2, contexts, N_SMS, TILING)
    broken = sched.without_wait(_find(sched, op, layer), slot)
    with pytest.raises(HazardError, match=r"race|never written"):
        _run(weights, contexts, sched=broken, strategy="random")


def test_deleted_queue_dependency_is_caught(weights):
    contexts = [70, 3]
    sched = build_schedule(CFG, 2, contexts, N_SMS, TILING)
    with pytest.raises(HazardError):
        _run(weights, contexts, sched=sched.without_queue_wait(0, 0), strategy="random")


def test_deleted_lm_head_dependency_is_caught(weights):
    """An LM-head tile is a host-queue item whose drains wait for nothing: without its own wait
    (the last layer's end) it reads x(L) before every add into it."""
    contexts = [70, 3]
    sched = build_schedule(CFG, 2, contexts, N_SMS, TILING)
    broken = sched.without_queue_wait(_find_item(sched, abi.MK_OP_LM_HEAD, 0), 0)
    _assert_race_caught(weights, contexts, broken, "an LM-head tile without its wait")


def _assert_race_caught(weights, contexts, broken, what: str) -> None:
    """A race shows only in an interleaving where nothing else orders the item after its producers
    (an SM that ran all of them itself, say); over four interleavings it must show."""
    caught = []
    for seed in range(4):
        try:
            _run(weights, contexts, sched=broken, strategy="random", seed=seed)
        except HazardError as e:
            assert re.search(r"race|never written", str(e)), e
            caught.append(seed)
    assert caught, f"{what} went unnoticed in every interleaving"


@pytest.mark.parametrize("op", [abi.MK_OP_ATTN_COMBINE, abi.MK_OP_OPROJ])
def test_deleted_attention_tail_dependency_is_caught(weights, op):
    """In MoE layers the combines and O-proj tiles are MoE queue items (between the up and the
    down tiles): a missing wait there is a race too."""
    from dataclasses import replace

    contexts = [70, 3]
    tiling = replace(TILING, moe_fused=0)
    sched = build_schedule(CFG, 2, contexts, N_SMS, tiling)
    assert not any(t[abi.MK_F_OP] == op and t[abi.MK_F_LAYER] == 1 for t in sched.tasks)
    broken = sched.without_queue_wait(_find_item(sched, op, 1), 0)
    _assert_race_caught(weights, contexts, broken, "a deleted attention-tail wait")


def test_fused_moe_sums_need_their_initialiser(weights, monkeypatch):
    """A fused item's atomic sum must come after the residual copy that initialises it (its layer's
    router tiles): an item of layer 1 adding into layer 2's sum x(3) (initialised by layer 2's router
    tiles, which run after it) is a race; sums nobody initialises are an error too."""
    from dataclasses import replace

    from mkcode.backend.megakernel.emulator_ops import OpSemantics

    real = OpSemantics.op_moe_fused
    sched = build_schedule(CFG, 2, [70, 3], N_SMS, replace(TILING, moe_fused=1))

    def shifted(self, layer, a, d):
        acc = real(self, layer, a, d)
        if layer == 1:
            acc.accums = [((k[0], k[1] + 1, *k[2:]), lo, hi) for k, lo, hi in acc.accums]
        return acc

    monkeypatch.setattr(OpSemantics, "op_moe_fused", shifted)
    with pytest.raises(HazardError, match="race: MOE_FUSED"):
        _run(weights, [70, 3], sched=sched)
    monkeypatch.setattr(OpSemantics, "op_moe_fused", real)
    _assert_uninitialised_sum_caught(weights, monkeypatch, sched, "op_router", "x")


def _assert_uninitialised_sum_caught(weights, monkeypatch, sched, op: str, buf: str) -> None:
    """With OpSemantics.<op> no longer writing `buf` (the initialiser of an atomic sum), the
    emulator reports the sum's adds as adding into nothing."""
    from mkcode.backend.megakernel.emulator_ops import OpSemantics

    real = getattr(OpSemantics, op)

    def without(self, layer, a, d):
        acc = real(self, layer, a, d)
        acc.writes = [w for w in acc.writes if w[0][0] != buf]
        return acc

    monkeypatch.setattr(OpSemantics, op, without)
    with pytest.raises(HazardError, match="nothing initialises"):
        _run(weights, [70, 3], sched=sched)


def test_double_signal_is_caught(weights):
    contexts = [10]
    sched = build_schedule(CFG, 1, contexts, N_SMS, TILING)
    t = _find(sched, abi.MK_OP_QKV, 1)
    sched.tasks[t, abi.MK_F_SIG0 + 1] = sched.tasks[t, abi.MK_F_SIG0]
    sched.tasks[t, abi.MK_F_NSIG] = 2
    with pytest.raises(CounterError, match="double signal"):
        _run(weights, contexts, sched=sched)


def test_unreachable_target_deadlocks_loudly(weights):
    contexts = [10]
    sched = build_schedule(CFG, 1, contexts, N_SMS, TILING)
    t = _find_item(sched, abi.MK_OP_OPROJ, 2)  # a MoE queue item of layer 2
    sched.queue_desc[t, abi.MK_F_WAIT0 + 1] += 1
    with pytest.raises(DeadlockError, match="combine"):
        _run(weights, contexts, sched=sched)


def test_sm_order_that_breaks_topology_deadlocks(weights):
    """A consumer placed before its producer on the same SM can never run."""
    contexts = [10]
    sched = build_schedule(CFG, 1, contexts, 1, TILING)
    sched.sm_lists[0].reverse()
    with pytest.raises(DeadlockError):
        _run(weights, contexts, sched=sched)


def _release_cfg(layers: int):
    """The release geometry cut to `layers` layers (full attention every 4th, a dense layer 0)."""
    return north_mini_code_config(
        num_hidden_layers=layers,
        layer_types=["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(layers)],
        mlp_layer_types=["dense"] + ["sparse"] * (layers - 1),
    )


def _release_engine_step(batch: int, layers: int, start: int, seed: int, **over):
    """The engine's tiling for `batch` rows (with `over` on top) at the release geometry cut to
    `layers` layers, run once without math on the emulator with its happens-before check (contexts
    from 8K, counters from `start`): (schedule, report)."""
    from dataclasses import replace

    from mkcode.backend.megakernel.tiling import tiling_for_batch

    cfg = _release_cfg(layers)
    base = default_tiling(cfg)
    tiling = replace(tiling_for_batch(cfg, base, batch), **over)
    contexts = [8192 + 977 * b for b in range(batch)]
    sched = build_schedule(cfg, batch, contexts, 132, tiling, attention_splits(cfg, contexts, tiling, 132))
    ws = Workspace.allocate(cfg, base, "cpu", math=False)
    bank = CounterBank(sched.n_counters, start=start)
    inp = StepInputs(torch.zeros(batch, dtype=torch.long), torch.tensor(contexts), None, None)
    rep = Emulator(cfg, None, sched, ws, bank, math=False, check_hazards=True).step(inp, "random", seed)
    return sched, rep


@pytest.mark.parametrize("batch,layers,hazards", [(1, 49, True), (8, 9, False)])
def test_release_geometry_descriptors_and_counters(batch, layers, hazards):
    """The 30B schedule on 132 virtual SMs, routing drawn at random: no deadlock, every counter at its
    total, no over-claim (and, at BS 1, the full happens-before check)."""
    cfg = _release_cfg(layers)
    contexts = [8192 + 977 * b for b in range(batch)]
    sched = build_schedule(cfg, batch, contexts, 132)
    ws = Workspace.allocate(cfg, default_tiling(cfg), "cpu", math=False)
    bank = CounterBank(sched.n_counters, start=123)
    inp = StepInputs(torch.zeros(batch, dtype=torch.long), torch.tensor(contexts), None, None)
    rep = Emulator(cfg, None, sched, ws, bank, math=False, check_hazards=hazards).step(inp, "random", 7)
    assert rep.events > len(sched.tasks)
    assert np.all(bank.base[sched.counters.n_dynamic :] != 123) or True


@pytest.mark.parametrize("n_sms", [N_SMS, 3])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fused", [0, 1], ids=["up-down", "fused"])
def test_claims(weights, strategy, n_sms, fused):
    """The lazy claims (two ahead while more than n_sms items remain before the queue's far end:
    with 3 SMs most items are claimed ahead) give the reference step under every interleaving, and
    two steps in a row on one bank (a drain's claims still total items + 2 per host drain), with
    separate MoE up/down tiles and with fused MoE items (whose sums each step's router tiles
    initialise again)."""
    from dataclasses import replace

    contexts = [70, 3, 190]
    tiling = replace(TILING, moe_fused=fused)
    sched = build_schedule(CFG, 3, contexts, n_sms, tiling)
    case = make_case(CFG, contexts, seed=5)
    ref_batch = clone_batch(case.batch)
    ws = Workspace.allocate(CFG, tiling, "cpu")
    emu = Emulator(CFG, weights, sched, ws, CounterBank(sched.n_counters, start=2**32 - 40))
    batch = clone_batch(case.batch)
    for step in range(2):
        ref = reference_step(CFG, weights, ref_batch)
        emu.step(_inputs(batch), strategy, seed=step)
        _check(ws, batch, ref, ref_batch)
        for b in (batch, ref_batch):
            b.token_ids = ref.argmax(-1)
            b.positions = b.positions + 1


@pytest.mark.parametrize(
    "with_qkv,ctrl,combine",
    [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 2, 0), (0, 3, 1), (1, 2, 1)],
)
@pytest.mark.parametrize("contexts", [[70], [70, 3, 190]])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fused", [0, 1], ids=["up-down", "fused"])
def test_task_placement(weights, strategy, contexts, with_qkv, ctrl, combine, fused):
    """Tiling.attn_with_qkv (attention drains on the SMs of the QKV and router tiles): no deadlock
    under any interleaving and the reference's step. Tiling.ctrl_sms: ROUTE tasks alone on the last
    SMs (and a MoE layer's combines with Tiling.combine_ctrl), besides the LM head's drains, which
    every SM holds. With both kinds of MoE items (Tiling.moe_fused)."""
    from dataclasses import replace

    tiling = replace(
        TILING,
        attn_with_qkv=with_qkv,
        ctrl_sms=ctrl,
        moe_fused=fused,
        combine_ctrl=combine,
    )
    B = len(contexts)
    sched = build_schedule(CFG, B, contexts, N_SMS, tiling)
    layer1 = [t for t in sched.tasks if int(t[abi.MK_F_LAYER]) == 1]

    def is_ctrl_task(t) -> bool:  # ROUTE; with combine_ctrl a MoE layer's combines too
        op = int(t[abi.MK_F_OP])
        moe_comb = combine and op == abi.MK_OP_ATTN_COMBINE and not CFG.is_dense(int(t[abi.MK_F_LAYER]))
        return op == abi.MK_OP_ROUTE or moe_comb

    lm_q = len(sched.queue_info) - 1  # the LM head's queue, the step's last
    lm_drains = {
        int(t[abi.MK_F_ID])
        for t in sched.tasks
        if int(t[abi.MK_F_OP]) == abi.MK_OP_DRAIN
        and int(t[abi.MK_F_A0]) == abi.MK_QUEUE_HOST
        and int(t[abi.MK_F_A1]) == lm_q
    }
    lm_sms = sorted(sm for sm, ids in enumerate(sched.sm_lists) for i in ids if i in lm_drains)
    assert lm_sms == list(range(N_SMS))  # one LM drain per SM, the control SMs' too
    if combine:  # a MoE layer's combines are static tasks on the control SMs, none in its queue
        on_ctrl = {tid for sm_ids in sched.sm_lists[N_SMS - ctrl :] for tid in sm_ids}
        combs = [t for t in layer1 if int(t[abi.MK_F_OP]) == abi.MK_OP_ATTN_COMBINE]
        assert len(combs) == B * CFG.num_key_value_heads
        assert all(int(t[abi.MK_F_ID]) in on_ctrl for t in combs)
    for sm, ids in enumerate(sched.sm_lists):  # control SMs hold control tasks only, and all of them
        is_ctrl = [is_ctrl_task(sched.tasks[i]) for i in ids if i not in lm_drains]
        assert all(is_ctrl) if sm >= N_SMS - ctrl else (ctrl == 0 or not any(is_ctrl))
    if with_qkv:  # every attention drain sits on an SM that holds a QKV or router tile of its layer
        sm = {tid: s for s, ids in enumerate(sched.sm_lists) for tid in ids}
        for layer in range(CFG.num_hidden_layers):
            ids = [int(t[abi.MK_F_ID]) for t in sched.tasks if int(t[abi.MK_F_LAYER]) == layer]
            busy = {
                sm[i] for i in ids if int(sched.tasks[i][abi.MK_F_OP]) in (abi.MK_OP_QKV, abi.MK_OP_ROUTER)
            }
            drains = [
                sm[i]
                for i in ids
                if int(sched.tasks[i][abi.MK_F_OP]) == abi.MK_OP_DRAIN
                and int(sched.tasks[i][abi.MK_F_A0]) == abi.MK_QUEUE_HOST
                and i not in lm_drains
            ]
            assert drains and set(drains) <= busy and len(set(drains)) == len(drains)
    _check(*_run(weights, contexts, strategy=strategy, sched=sched)[:4])


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("fused", [0, 1], ids=["up-down", "fused"])
def test_release_geometry_engine_tilings(batch, fused):
    """The engine's per-batch tiling (tiling_for_batch: lazy claims, 16 splits, fused MoE items and
    the combines on 4 control SMs at BS 1, wide MoE tiles and eager claims at BS 8) at the release
    geometry, with either kind of MoE items (Tiling.moe_fused): no deadlock, no over-claim."""
    from dataclasses import replace

    from mkcode.backend.megakernel.tiling import tiling_for_batch

    layers = 5
    cfg = _release_cfg(layers)
    base = default_tiling(cfg)
    engine = tiling_for_batch(cfg, base, batch)
    assert engine.moe_fused == (batch < 4)  # fused items below WIDE_MOE_FROM_BATCH rows
    assert engine.moe_local == (batch == 1)  # self-routing fused items at one row
    # and the other kind of items on the same tiling (up / down tiles need ROUTE's queue)
    tiling = replace(engine, moe_fused=fused, moe_local=engine.moe_local if fused else 0)
    if fused and tiling.moe_up_cols > 256:  # a fused item's down slice takes up to 256 columns
        tiling = replace(tiling, moe_up_cols=256)
    contexts = [8192 + 977 * b for b in range(batch)]
    splits = attention_splits(cfg, contexts, tiling, 132)
    sched = build_schedule(cfg, batch, contexts, 132, tiling, splits)
    ws = Workspace.allocate(cfg, base, "cpu", math=False)
    bank = CounterBank(sched.n_counters, start=77)
    inp = StepInputs(torch.zeros(batch, dtype=torch.long), torch.tensor(contexts), None, None)
    rep = Emulator(cfg, None, sched, ws, bank, math=False, check_hazards=batch == 1).step(inp, "random", 3)
    # every static task but the drains ran, every host-queue item (attention, the MoE tail) and MoE
    # items on top
    n_static = sum(1 for t in sched.tasks if int(t[abi.MK_F_OP]) != abi.MK_OP_DRAIN)
    # (self-routing fused items, Tiling.moe_local, are static tasks: no device-made items on top)
    assert rep.events >= n_static + len(sched.queue_desc) + (0 if tiling.moe_local else 1)


def test_forced_routing_reference_reads_the_device_table(weights):
    """kernel_routing() reads ROUTE's expert table back; forcing those choices reproduces the
    reference exactly when they agree (the GPU tests use this to tolerate bf16 near-ties)."""
    from tests.backend.megakernel.cases import kernel_routing

    contexts = [70, 3, 130]
    ws, _, ref, _, _ = _run(weights, contexts)
    forced = kernel_routing(CFG, ws, len(contexts))
    assert set(forced) == {i for i in range(CFG.num_hidden_layers) if not CFG.is_dense(i)}
    again = clone_batch(make_case(CFG, contexts, seed=11).batch)
    out = reference_step(CFG, weights, again, forced)
    assert reference_step.last_flips == []
    torch.testing.assert_close(out, ref)


# the tile variants the next GPU sweep times (gpu_run.sh VARIANTS): they must validate, build and
# run on the emulator at the release geometry with the full happens-before check
SWEEP_TILINGS = [
    {"moe_up_cols": 128, "moe_down_rows": 512},  # the BS >= 4 default before 2026-11-30
    {"moe_up_cols": 384, "moe_down_rows": 512},  # since 2026-11-30
    {"max_splits": 8},
    {"qkv_rows": 128, "o_rows": 128},
    {"attn_with_qkv": 1},  # attention drains on the SMs of the QKV and router tiles
    {"attn_idle_first": 1, "max_splits": 12},  # attention drains on idle SMs first (BS 1 candidate)
    {"ctrl_sms": 1},  # ROUTE alone on the last SM
    {"ctrl_sms": 8, "attn_with_qkv": 1},
    {"moe_fused": 1},  # up tile + down slice per item, atomic sums (the 2026-11-29 fused items)
    {"moe_fused": 1, "moe_up_cols": 128, "ctrl_sms": 1},
    {"moe_fused": 1, "moe_up_cols": 256, "ctrl_sms": 8, "attn_with_qkv": 1},  # the BS 8 engine's tiles
    # combines on the control SMs with fused items (the BS 1 candidate) and with up/down tiles
    {"moe_fused": 1, "moe_up_cols": 128, "ctrl_sms": 4, "combine_ctrl": 1},
    {"ctrl_sms": 8, "combine_ctrl": 1, "attn_with_qkv": 1},
]


@pytest.mark.parametrize("over", SWEEP_TILINGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("batch", [1, 8])
def test_sweep_tilings_at_release_geometry(over, batch):
    from dataclasses import replace

    layers = 5
    cfg = _release_cfg(layers)
    tiling = replace(default_tiling(cfg), **over)
    tiling.validate(cfg)
    contexts = [8192 + 977 * b for b in range(batch)]
    sched = build_schedule(cfg, batch, contexts, 132, tiling)
    ws = Workspace.allocate(cfg, tiling, "cpu", math=False)
    bank = CounterBank(sched.n_counters)
    inp = StepInputs(torch.zeros(batch, dtype=torch.long), torch.tensor(contexts), None, None)
    rep = Emulator(cfg, None, sched, ws, bank, math=False, check_hazards=True).step(inp, "random", 3)
    static = sum(1 for t in sched.tasks if int(t[abi.MK_F_OP]) != abi.MK_OP_DRAIN)
    # every static task, every attention item and the MoE items of each MoE layer ran
    assert rep.events >= static + len(sched.queue_desc) + (layers - 1) * batch


@pytest.mark.parametrize("batch", [1, 8])
def test_layer_sums_release_geometry(batch):
    """The engine's per-batch tiling at the release geometry (5 layers): no deadlock, every counter
    at its total, and the happens-before check over the layers' sums: every add into x(l+1) after
    its initialiser's residual copy (EMBED for the dense layer 0, the router tiles after it), every
    read of x(l) after every add."""
    sched, rep = _release_engine_step(batch, 5, 99, 5)
    static = sum(int(t[abi.MK_F_OP]) != abi.MK_OP_DRAIN for t in sched.tasks)
    assert rep.events > static  # the static tasks and the queue items all ran


def test_sums_without_the_residual_copy_are_caught(weights, monkeypatch):
    """A router tile that does not copy its share of the residual into x(l+1) leaves the layer's
    adds (O-proj, MoE down tiles) with nothing to add into: the emulator says so."""
    sched = build_schedule(CFG, 2, [70, 3], N_SMS, TILING)
    _assert_uninitialised_sum_caught(weights, monkeypatch, sched, "op_router", "x")


@pytest.mark.parametrize("contexts", [[0], [5, 130, 64], [1, 2, 65, 127, 128, 129, 191, 255]])
@pytest.mark.parametrize("strategy", ["random", "reverse"])
def test_lm_queue_matches_reference(weights, contexts, strategy):
    """The LM-head tiles are one host queue drained by every SM (the control SMs too): the same
    logits and tokens as the reference, every tile run once (the queue's head at its total: no
    over-claim, none left)."""
    from dataclasses import replace

    t = replace(TILING, ctrl_sms=1)
    sched = build_schedule(CFG, len(contexts), contexts, N_SMS, t)
    assert "LM_HEAD" not in {abi.OPNAMES[int(op)] for op in sched.tasks[:, abi.MK_F_OP]}
    assert sched.summary()["LM_HEAD"] == sched.n_lm_tiles
    ws, batch, ref, ref_batch, _ = _run(weights, contexts, None, strategy, sched=sched)
    _check(ws, batch, ref, ref_batch)


@pytest.mark.parametrize("batch", [1, 8])
def test_lm_queue_release_geometry(batch):
    """The LM-head queue on the engine's per-batch tiling at the release geometry (3 layers): no
    deadlock (the sampling tasks after the drains), every counter at its total, the happens-before
    check over the LM tiles' reads of x(L)."""
    sched, rep = _release_engine_step(batch, 3, 7, 2)
    static = sum(int(t[abi.MK_F_OP]) != abi.MK_OP_DRAIN for t in sched.tasks)
    assert rep.events >= static + len(sched.queue_desc)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_attention_in_the_moe_queue(weights, strategy):
    """Tiling.attn_in_moe: a MoE layer's attention items are its MoE queue's head, before the up
    tiles, claimed before ROUTE (the head reset by the EMBED of row 0), and the layer has no
    attention drains (the dense layer keeps its own): same results."""
    from dataclasses import replace

    contexts = [70, 3, 190]
    tiling = replace(TILING, attn_in_moe=3, moe_fused=0)
    sched = build_schedule(CFG, 3, contexts, N_SMS, tiling)
    drains = [
        t for t in sched.tasks if t[abi.MK_F_OP] == abi.MK_OP_DRAIN and t[abi.MK_F_A0] == abi.MK_QUEUE_HOST
    ]
    assert {int(t[abi.MK_F_LAYER]) for t in drains} == {
        i for i in range(CFG.num_hidden_layers) if CFG.is_dense(i)
    }
    in_queue = {int(q[abi.MK_F_LAYER]) for q in sched.queue_desc if q[abi.MK_F_OP] == abi.MK_OP_ATTN}
    assert in_queue == set(range(CFG.num_hidden_layers))  # dense: its host queue; MoE: the MoE queue
    moe_drains = [
        t for t in sched.tasks if t[abi.MK_F_OP] == abi.MK_OP_DRAIN and t[abi.MK_F_A0] == abi.MK_QUEUE_MOE
    ]
    for t in moe_drains:  # the head items (MK_MOE_HEAD): the layer's attention items, before the tail's
        first, _, n, _ = (int(v) for v in sched.queue_info[int(t[abi.MK_F_A3])])
        items = sched.queue_desc[first - n : first]
        assert n > 0 and all(int(q[abi.MK_F_OP]) == abi.MK_OP_ATTN for q in items)
        assert {int(q[abi.MK_F_LAYER]) for q in items} == {int(t[abi.MK_F_LAYER])}
        assert int(t[abi.MK_F_A4]) == abi.MK_DRAIN_LATE_ROUTE
        # a late-route drain waits for h alone at its start, ROUTE's pair in its slot words
        waits = [int(t[abi.MK_F_WAIT0 + 2 * i]) for i in range(abi.MK_MAX_WAITS)]
        assert sum(c != abi.MK_NO_COUNTER for c in waits) == 1
        route_c = sched.counters.index(f"route[{int(t[abi.MK_F_LAYER])}]")
        assert [int(v) for v in t[abi.MK_F_SLOT0 : abi.MK_F_SLOT0 + 2]] == [route_c, 1]
    embeds = [t for t in sched.tasks if t[abi.MK_F_OP] == abi.MK_OP_EMBED]
    assert [int(t[abi.MK_F_A1]) for t in embeds] == [abi.MK_EMBED_RESET_HEADS, 0, 0]
    routes = [t for t in sched.tasks if t[abi.MK_F_OP] == abi.MK_OP_ROUTE]
    assert {int(t[abi.MK_F_A0]) for t in routes} == {abi.MK_ROUTE_KEEP_HEAD}
    _check(*_run(weights, contexts, strategy=strategy, sched=sched)[:4])


def _late_route_schedule(contexts, **over):
    tiling = dc_replace(TILING, attn_in_moe=3, moe_fused=0, **over)
    return build_schedule(CFG, len(contexts), contexts, N_SMS, tiling)


def test_late_route_runs_attention_before_route(weights):
    """attn_in_moe = 3 claims the head items without waiting for ROUTE: with the control SMs (ROUTE)
    run last whenever others can run, a MoE layer's attention items run before its ROUTE."""
    contexts = [70, 3, 190]
    case = make_case(CFG, contexts, seed=7)
    batch = clone_batch(case.batch)
    sched = _late_route_schedule(contexts, ctrl_sms=1)  # ROUTE on the last SM, which in_order runs last
    em = Emulator(CFG, weights, sched, Workspace.allocate(CFG, TILING, "cpu"), CounterBank(sched.n_counters))
    em.step(_inputs(batch), "in_order")
    ops = [(int(d[abi.MK_F_OP]), int(d[abi.MK_F_LAYER])) for d in em.event_descs]
    layer = next(i for i in range(CFG.num_hidden_layers) if not CFG.is_dense(i))
    route = ops.index((abi.MK_OP_ROUTE, layer))
    early = [i for i, o in enumerate(ops[:route]) if o == (abi.MK_OP_ATTN, layer)]
    assert early


# (what the broken schedule changes, the error): without the EMBED's reset of the MoE queue heads
# the first claim has nothing to come after (the kernel would claim from last step's counts); with
# ROUTE still resetting the head, drains may already have claimed head items: a second reset
LATE_ROUTE_BREAKS = [
    ((abi.MK_OP_EMBED, abi.MK_F_A1), HazardError, "before its reset"),
    ((abi.MK_OP_ROUTE, abi.MK_F_A0), CounterError, "reset twice"),
]


@pytest.mark.parametrize(("where", "error", "message"), LATE_ROUTE_BREAKS)
def test_late_route_broken_head_resets_are_caught(weights, where, error, message):
    """attn_in_moe = 3 with the head-reset flag cleared on EMBED or on ROUTE: the emulator says so."""
    contexts = [70, 3]
    sched = _late_route_schedule(contexts)
    tasks = sched.tasks.copy()
    op, word = where
    tasks[tasks[:, abi.MK_F_OP] == op, word] = 0
    with pytest.raises(error, match=message):
        _run(weights, contexts, sched=dc_replace(sched, tasks=tasks))


def test_late_route_steps_in_a_row(weights):
    """attn_in_moe = 3 over consecutive steps on one counter bank: each step's claims start from the
    EMBED's reset (the heads hold the previous step's claims until then)."""
    contexts = [70, 3, 180]  # three steps stay inside each row's pages
    _steps_in_a_row(
        weights,
        contexts,
        _late_route_schedule(contexts),
        3,
        case_seed=5,
        strategy="lifo_random",
        bank_start=9,
    )


def test_attention_in_the_moe_queue_missing_wait_is_caught(weights):
    """attn_in_moe: an attention item in the MoE queue that does not wait for the QKV tiles reads
    K/V and Q before they are written; the hazard check reports it in some interleaving."""
    from dataclasses import replace

    contexts = [70, 3]
    sched = build_schedule(CFG, 2, contexts, N_SMS, replace(TILING, attn_in_moe=3, moe_fused=0))
    layer = next(i for i in range(CFG.num_hidden_layers) if not CFG.is_dense(i))
    broken = sched.without_queue_wait(_find_item(sched, abi.MK_OP_ATTN, layer), 0)
    _assert_race_caught(weights, contexts, broken, "a deleted attention wait in the MoE queue")


@pytest.mark.parametrize("batch", [1, 8])
def test_attention_in_the_moe_queue_release_geometry(batch):
    """attn_in_moe on the engine's tiling at the release geometry: no deadlock, every counter at its
    total, the happens-before check."""
    sched, rep = _release_engine_step(batch, 3, 7, 8, attn_in_moe=3, moe_local=0)  # no MoE queue with it
    assert rep.events >= sum(int(t[abi.MK_F_OP]) != abi.MK_OP_DRAIN for t in sched.tasks) + len(
        sched.queue_desc
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_qkv_counters_by_kv_head(weights, strategy):
    """Tiling.qkv_by_head: each QKV tile signals its kv head's counter and each attention item waits
    for its own head's tiles only (here 16-row tiles: the 64 Q rows of a group in 4, K and V in 2
    each, 8 per head): same results."""
    from dataclasses import replace

    from mkcode.backend.megakernel.schedule import qkv_row_head

    contexts = [70, 3, 190]
    tiling = replace(TILING, qkv_by_head=1, qkv_rows=16)
    sched = build_schedule(CFG, 3, contexts, N_SMS, tiling)
    qkv = [t for t in sched.tasks if t[abi.MK_F_OP] == abi.MK_OP_QKV and t[abi.MK_F_LAYER] == 1]
    heads = {qkv_row_head(CFG, int(t[abi.MK_F_A0])) for t in qkv}
    assert heads == set(range(CFG.num_key_value_heads))
    sig = {int(t[abi.MK_F_SIG0]) for t in qkv}
    assert len(sig) == CFG.num_key_value_heads
    for q in sched.queue_desc:  # each item waits for the 8 tiles of its head's counter
        if q[abi.MK_F_OP] == abi.MK_OP_ATTN and q[abi.MK_F_LAYER] == 1:
            c, target = int(q[abi.MK_F_WAIT0]), int(q[abi.MK_F_WAIT0 + 1])
            assert target == len(qkv) // CFG.num_key_value_heads
            mine = [t for t in qkv if int(t[abi.MK_F_SIG0]) == c]
            assert {qkv_row_head(CFG, int(t[abi.MK_F_A0])) for t in mine} == {int(q[abi.MK_F_A1])}
    _check(*_run(weights, contexts, strategy=strategy, sched=sched)[:4])


def test_qkv_counters_by_kv_head_wrong_head_is_caught(weights):
    """qkv_by_head: an attention item that waits for the other kv head's QKV tiles reads its Q (and
    the new K/V) before they are written; the hazard check reports it in some interleaving."""
    from dataclasses import replace

    contexts = [70, 3]
    sched = build_schedule(CFG, 2, contexts, N_SMS, replace(TILING, qkv_by_head=1, qkv_rows=16))
    layer = next(i for i in range(CFG.num_hidden_layers) if not CFG.is_dense(i))
    i = _find_item(sched, abi.MK_OP_ATTN, layer)
    q = sched.queue_desc.copy()
    other = next(
        int(j[abi.MK_F_WAIT0])
        for j in q
        if j[abi.MK_F_OP] == abi.MK_OP_ATTN
        and j[abi.MK_F_LAYER] == layer
        and j[abi.MK_F_A1] != q[i][abi.MK_F_A1]
    )
    q[i, abi.MK_F_WAIT0] = other
    _assert_race_caught(
        weights, contexts, replace(sched, queue_desc=q), "an attention item on the wrong head"
    )


def test_qkv_by_head_needs_head_aligned_tiles():
    from dataclasses import replace

    from mkcode.backend.megakernel.tiling import TilingError

    with pytest.raises(TilingError, match="qkv_by_head"):
        replace(TILING, qkv_by_head=1, qkv_rows=64).validate(CFG)  # head_dim 32


@pytest.mark.parametrize("batch", [1, 8])
def test_qkv_counters_by_kv_head_release_geometry(batch):
    """qkv_by_head on the engine's tiling at the release geometry (20 QKV tiles per kv head): no
    deadlock, every counter at its total, the happens-before check."""
    sched, rep = _release_engine_step(batch, 3, 11, 9, qkv_by_head=1)
    qkv_counters = [n for n in sched.counters.names if n.startswith("qkv[1][")]
    assert len(qkv_counters) == 4
    assert {sched.counters.targets[n] for n in qkv_counters} == {20 if batch > 1 else 10}
    assert rep.events >= sum(int(t[abi.MK_F_OP]) != abi.MK_OP_DRAIN for t in sched.tasks)
