"""Tiling.moe_local: at one row a MoE layer's fused items are static tasks that rank the router's
logits themselves (no ROUTE, no MoE queue). The emulator runs such schedules under every
interleaving against the reference; removing a wait the mode relies on must fail loudly."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.emulator import STRATEGIES, Emulator, HazardError, RoutingError
from mkcode.backend.megakernel.emulator_ops import StepInputs
from mkcode.backend.megakernel.schedule import build_schedule
from mkcode.backend.megakernel.tiling import TilingError
from mkcode.backend.megakernel.workspace import CounterBank, Workspace
from mkcode.backend.model.weights import random_weights
from tests.backend.megakernel.cases import clone_batch, kernel_routing, make_case, reference_step, tiny_config
from tests.backend.megakernel.test_emulator import TILING as EMULATOR_TILING

CFG = tiny_config()
# test_emulator's small tiles, with the fused items routing themselves
TILING = replace(EMULATOR_TILING, moe_fused=1, moe_local=1)
N_SMS = 16  # 8 QKV and 2 router tiles per layer leave SMs for the 4 fused items (top-2 x 2 tiles)
# Tiling.moe_group: the 4 items (top-2 x 2 column tiles) in 2 groups of 2 SMs, each SM first a
# router tile of 4 experts into its group's row of the logits
GROUPED = replace(TILING, moe_group=2)
# Tiling.attn_group: each kv head's QKV tiles (a quarter of its Q rows, then of its K or V rows),
# attention splits and O-proj tiles on a group of 4 SMs of its own; the combines on 2 control SMs
AGROUP = replace(TILING, ctrl_sms=2, combine_ctrl=1, attn_group=4)


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=1, std=0.1)


def _run(weights, context, strategy, sched, seed=0):
    case = make_case(CFG, [context], seed=seed + 11)
    ref_batch = clone_batch(case.batch)
    ref = reference_step(CFG, weights, ref_batch)
    ws = Workspace.allocate(CFG, TILING, "cpu")
    ws.poison()
    batch = clone_batch(case.batch)
    inp = StepInputs(batch.token_ids, batch.positions, batch.block_tables, batch.kv_pool)
    Emulator(CFG, weights, sched, ws, CounterBank(sched.n_counters, start=5)).step(inp, strategy, seed)
    return ws, batch, ref, ref_batch


def _attn_items(sched, layer):
    return [
        t
        for t in sched.queue_desc
        if int(t[abi.MK_F_OP]) == abi.MK_OP_ATTN and int(t[abi.MK_F_LAYER]) == layer
    ]


def _ops(sched, layer):
    return [int(t[abi.MK_F_OP]) for t in sched.tasks if int(t[abi.MK_F_LAYER]) == layer]


@pytest.mark.parametrize("context", [0, 70, 200])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_self_routing_items_match_the_reference(weights, context, strategy):
    sched = build_schedule(CFG, 1, [context], N_SMS, TILING)
    for layer in range(CFG.num_hidden_layers):
        if CFG.is_dense(layer):
            continue
        ops = _ops(sched, layer)
        assert abi.MK_OP_ROUTE not in ops
        # A4: row 0's attention splits in the layer (which KV pages the items prefetch, gap_prefetch_kv)
        splits = {int(t[abi.MK_F_A3]) for t in _attn_items(sched, layer)}
        assert len(splits) == 1
        assert ops.count(abi.MK_OP_MOE_FUSED) == CFG.num_experts_per_tok * 2  # 64 columns in 32-col tiles
        for t in sched.tasks:
            if int(t[abi.MK_F_LAYER]) == layer and int(t[abi.MK_F_OP]) == abi.MK_OP_MOE_FUSED:
                assert int(t[abi.MK_F_A3]) == abi.MK_MOE_LOCAL and {int(t[abi.MK_F_A4])} == splits
        # every drain of the layer is a host-queue drain (attention, then the O-proj tail)
        drains = [
            t
            for t in sched.tasks
            if int(t[abi.MK_F_LAYER]) == layer and int(t[abi.MK_F_OP]) == abi.MK_OP_DRAIN
        ]
        assert {int(t[abi.MK_F_A0]) for t in drains} == {abi.MK_QUEUE_HOST}
    ws, batch, ref, ref_batch = _run(weights, context, strategy, sched)
    torch.testing.assert_close(ws["logits"][:1], ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(batch.kv_pool, ref_batch.kv_pool, rtol=1e-4, atol=1e-5)
    assert ws["tokens_out"][:1].tolist() == ref.argmax(-1).tolist()
    # the items record their routing as ROUTE would: the reference forced to it changes nothing
    forced = reference_step(
        CFG, weights, clone_batch(make_case(CFG, [context], seed=11).batch), kernel_routing(CFG, ws, 1)
    )
    torch.testing.assert_close(forced, ref, rtol=1e-5, atol=1e-6)


def test_fused_items_sit_apart_from_the_layers_qkv_and_router_tiles():
    sched = build_schedule(CFG, 1, [70], N_SMS, TILING)
    sm_of = {tid: sm for sm, ids in enumerate(sched.sm_lists) for tid in ids}
    for layer in range(1, CFG.num_hidden_layers):
        ids = [int(t[abi.MK_F_ID]) for t in sched.tasks if int(t[abi.MK_F_LAYER]) == layer]
        by_op: dict[int, set[int]] = {}
        for i in ids:
            by_op.setdefault(int(sched.tasks[i][abi.MK_F_OP]), set()).add(sm_of[i])
        fused = by_op[abi.MK_OP_MOE_FUSED]
        assert len(fused) == CFG.num_experts_per_tok * 2
        assert not fused & (by_op[abi.MK_OP_QKV] | by_op[abi.MK_OP_ROUTER] | by_op[abi.MK_OP_DRAIN])


def _assert_caught(weights, sched, tids, slot) -> None:
    """Wait `slot` removed from every task of `tids`: some interleaving raises HazardError."""
    broken = sched
    for tid in tids:
        broken = broken.without_wait(tid, slot)
    with pytest.raises(HazardError, match=r"race|never written|initialises"):
        for strategy in STRATEGIES:
            _run(weights, 70, strategy, broken)


def _task(sched, op, layer):
    for t in sched.tasks:
        if int(t[abi.MK_F_OP]) == op and int(t[abi.MK_F_LAYER]) == layer:
            return int(t[abi.MK_F_ID])
    raise LookupError(op)


@pytest.mark.parametrize(
    "what,slot",
    [
        ("item", 1),  # a fused item's wait for the router tiles: it ranks logits not written yet
        ("tail_drain", 0),  # the O-proj drains' wait for the router tiles that initialise x(l+1)
    ],
)
def test_deleted_wait_is_caught(weights, what, slot):
    sched = build_schedule(CFG, 1, [70], N_SMS, TILING)
    if what == "item":
        tid = _task(sched, abi.MK_OP_MOE_FUSED, 1)
    else:  # the last drain of layer 1: a drain of its O-proj tail queue
        tid = max(
            int(t[abi.MK_F_ID])
            for t in sched.tasks
            if int(t[abi.MK_F_OP]) == abi.MK_OP_DRAIN and int(t[abi.MK_F_LAYER]) == 1
        )
        assert int(sched.tasks[tid][abi.MK_F_WAIT0]) == sched.counters.index("router[1]")
    _assert_caught(weights, sched, [tid], slot)


def test_moe_local_is_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match="batch 1"):
        build_schedule(CFG, 2, [70, 3], N_SMS, TILING)
    with pytest.raises(ValueError, match="SMs free"):
        build_schedule(CFG, 1, [70], 6, TILING)
    with pytest.raises(TilingError, match="moe_local needs moe_fused"):
        replace(TILING, moe_fused=0).validate(CFG)
    with pytest.raises(TilingError, match="attn_in_moe"):
        replace(TILING, attn_in_moe=3).validate(CFG)
    # 2 (the items behind the QKV tiles on their SMs) was measured slower and removed
    with pytest.raises(TilingError, match="moe_local must be 0 or 1"):
        replace(TILING, moe_local=2).validate(CFG)
    with pytest.raises(TilingError, match="moe_local must be 0 or 1"):
        build_schedule(CFG, 1, [70], N_SMS, replace(TILING, moe_local=2))


@pytest.mark.parametrize(
    "tiling",
    [TILING, replace(TILING, ctrl_sms=2), replace(TILING, moe_group=2), AGROUP],
    ids=["tiling", "ctrl-2", "grouped", "attn-groups"],
)
@pytest.mark.parametrize("n_sms", [4, 6, 7, 8, 12, 13, 14, 16, 132])
def test_fits_says_what_the_builder_does(n_sms, tiling):
    """moe_local_fits (the engine's check before it takes the mode) agrees with build_schedule."""
    from mkcode.backend.megakernel.schedule import moe_local_fits

    try:
        build_schedule(CFG, 1, [70], n_sms, tiling)
        built = True
    except ValueError:
        built = False
    assert moe_local_fits(CFG, tiling, n_sms) == built


def _group_of(sched, layer):
    """{SM: [(op, LROW, id) of the layer's router tiles and fused items in list order]}."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    for sm, ids in enumerate(sched.sm_lists):
        for i in ids:
            t = sched.tasks[i]
            if int(t[abi.MK_F_LAYER]) == layer and int(t[abi.MK_F_OP]) in (
                abi.MK_OP_ROUTER,
                abi.MK_OP_MOE_FUSED,
            ):
                out.setdefault(sm, []).append((int(t[abi.MK_F_OP]), int(t[abi.MK_F_LROW]), i))
    return out


@pytest.mark.parametrize("context", [0, 70, 200])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_grouped_items_match_the_reference(weights, context, strategy):
    sched = build_schedule(CFG, 1, [context], N_SMS, GROUPED)
    E, K = CFG.num_experts, CFG.num_experts_per_tok
    for layer in range(1, CFG.num_hidden_layers):
        per_sm = _group_of(sched, layer)
        # every item's SM runs its group's router tile first (E / 2 experts), then the item
        assert len(per_sm) == K * 2
        rows = sorted((ops[0][1], ops[1][1]) for ops in per_sm.values())
        assert rows == [(0, 0), (0, 0), (1, 1), (1, 1)]
        for ops in per_sm.values():
            assert [o[0] for o in ops] == [abi.MK_OP_ROUTER, abi.MK_OP_MOE_FUSED]
            tile = sched.tasks[ops[0][2]]
            assert int(tile[abi.MK_F_A1]) == E // 2
        # a group's tiles cover every expert once
        for g in (0, 1):
            firsts = sorted(int(sched.tasks[o[0][2]][abi.MK_F_A0]) for o in per_sm.values() if o[0][1] == g)
            assert firsts == [0, E // 2]
        assert f"router[{layer}]" not in sched.counters.names
    ws, batch, ref, ref_batch = _run(weights, context, strategy, sched)
    torch.testing.assert_close(ws["logits"][:1], ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(batch.kv_pool, ref_batch.kv_pool, rtol=1e-4, atol=1e-5)
    # both groups' rows hold the same logits (the kernel: the same bits, same tiles and code)
    layer = 1
    torch.testing.assert_close(ws["rlogits"][layer, 1], ws["rlogits"][layer, 0], rtol=0, atol=0)
    forced = reference_step(
        CFG, weights, clone_batch(make_case(CFG, [context], seed=11).batch), kernel_routing(CFG, ws, 1)
    )
    torch.testing.assert_close(forced, ref, rtol=1e-5, atol=1e-6)


def _grouped_task(sched, op, layer, row):
    for t in sched.tasks:
        if int(t[abi.MK_F_OP]) == op and int(t[abi.MK_F_LAYER]) == layer and int(t[abi.MK_F_LROW]) == row:
            return int(t[abi.MK_F_ID])
    raise LookupError(op)


@pytest.mark.parametrize(
    "what,slot,counter",
    [
        ("item", 1, "router[1][1]"),  # group 1's item ranks its row before its group's tiles wrote it
        ("item", 2, "router[1][0]"),  # ... adds into x(l+1) before group 0's tiles copied the residual
        ("tail_drains", 0, "router[1][0]"),  # the O-proj drains' wait for that initialiser
    ],
)
def test_grouped_deleted_wait_is_caught(weights, what, slot, counter):
    sched = build_schedule(CFG, 1, [70], N_SMS, GROUPED)
    c = sched.counters.index(counter)
    if what == "item":
        tids = [_grouped_task(sched, abi.MK_OP_MOE_FUSED, 1, 1)]
    else:  # every drain of layer 1's O-proj tail (whichever claims an O-proj item)
        tids = [
            int(t[abi.MK_F_ID])
            for t in sched.tasks
            if int(t[abi.MK_F_OP]) == abi.MK_OP_DRAIN
            and int(t[abi.MK_F_LAYER]) == 1
            and int(t[abi.MK_F_WAIT0]) == c
        ]
    assert tids and all(int(sched.tasks[t][abi.MK_F_WAIT0 + 2 * slot]) == c for t in tids)
    _assert_caught(weights, sched, tids, slot)


def test_groups_that_rank_different_logits_are_caught(weights, monkeypatch):
    """Group 1's router tiles write negated logits (as a group whose bits differed would rank): its
    items take other experts than group 0's, which the emulator reports after the hazard check."""
    from mkcode.backend.megakernel.emulator_ops import OpSemantics

    plain = OpSemantics.op_router

    def skewed(self, layer, a, d):
        acc = plain(self, layer, a, d)
        if int(d[abi.MK_F_LROW]) == 1:
            e0, n = a[0], a[1]
            self.ws["rlogits"][layer, 1, e0 : e0 + n] *= -1
        return acc

    monkeypatch.setattr(OpSemantics, "op_router", skewed)
    sched = build_schedule(CFG, 1, [70], N_SMS, GROUPED)
    with pytest.raises(RoutingError, match="disagree"):
        _run(weights, 70, "in_order", sched)


@pytest.mark.parametrize(
    "tiling,cfg,match",
    [
        (replace(GROUPED, moe_local=0), CFG, "moe_group needs moe_local"),
        (replace(TILING, moe_group=3), CFG, "divide num_experts"),
        (replace(TILING, moe_group=8), CFG, "divide the layer's 4 fused items"),
        # top-8 x 2 tiles: 16 groups of one
        (replace(TILING, moe_group=1), tiny_config(num_experts_per_tok=8), "at most 8 groups"),
        (replace(AGROUP, combine_ctrl=0), CFG, "needs moe_local and combine_ctrl"),
        (replace(AGROUP, moe_local=0), CFG, "needs moe_local and combine_ctrl"),
        (replace(AGROUP, attn_group=3), CFG, "even"),
        (replace(AGROUP, attn_group=64), CFG, "Q rows"),
        (replace(AGROUP, attn_group=16), CFG, "split stride"),  # max_splits 8
    ],
)
def test_groups_are_refused_where_they_cannot_run(tiling, cfg, match):
    with pytest.raises(TilingError, match=match):
        tiling.validate(cfg)


def test_groups_need_one_row_and_the_sms():
    with pytest.raises(ValueError, match="batch 1"):
        build_schedule(CFG, 2, [70, 3], N_SMS, GROUPED)
    with pytest.raises(ValueError, match="SMs free"):  # 8 group SMs and 4 items on 12 work SMs
        build_schedule(CFG, 1, [70], 13, AGROUP)


@pytest.mark.parametrize("group", [8, 16])
def test_grouped_release_geometry(group):
    """The engine's one-row tiling with moe_group at the release geometry (5 layers, 132 SMs): the
    48 items in groups of `group`, each SM a router tile of 128 / group experts; no deadlock, every
    counter at its total, the full happens-before check."""
    from tests.backend.megakernel.test_emulator import _release_engine_step

    sched, rep = _release_engine_step(1, 5, 99, 5, moe_group=group)
    per_sm = _group_of(sched, 2)
    assert len(per_sm) == 48
    assert {len(v) for v in per_sm.values()} == {2}
    assert sorted({v[0][1] for v in per_sm.values()}) == list(range(48 // group))
    assert rep.events > sum(int(t[abi.MK_F_OP]) != abi.MK_OP_DRAIN for t in sched.tasks)


def _layer_tasks_by_sm(sched, layer):
    out: dict[int, list[int]] = {}
    for sm, ids in enumerate(sched.sm_lists):
        for i in ids:
            if int(sched.tasks[i][abi.MK_F_LAYER]) == layer:
                out.setdefault(sm, []).append(i)
    return out


@pytest.mark.parametrize("moe_group", [0, 2], ids=["routers", "moe-groups"])
@pytest.mark.parametrize("context", [0, 70, 200])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_attention_groups_match_the_reference(weights, context, strategy, moe_group):
    tiling = replace(AGROUP, moe_group=moe_group)
    sched = build_schedule(CFG, 1, [context], N_SMS, tiling)
    Hkv, G, d = CFG.num_key_value_heads, CFG.gqa_group, CFG.head_dim
    for layer in range(1, CFG.num_hidden_layers):
        by_sm = _layer_tasks_by_sm(sched, layer)
        groups: dict[int, list[int]] = {}
        o_tiles: dict[int, int] = {}
        for ids in by_sm.values():
            ops = [int(sched.tasks[i][abi.MK_F_OP]) for i in ids]
            if ops[0] != abi.MK_OP_QKV:
                continue
            qkv = sched.tasks[ids[0]]
            h = int(qkv[abi.MK_F_A0]) // (G * d)
            # a share of head h's Q rows, then of its K or V rows
            assert int(qkv[abi.MK_F_A1]) == G * d // 4 and int(qkv[abi.MK_F_A3]) == 2 * d // 4
            kv_row = int(qkv[abi.MK_F_A2]) - CFG.q_width
            assert (kv_row % CFG.kv_width) // d == h
            # then split r of the head, then O-proj tiles of its K range (2 of them: on 2 of the 4)
            assert ops[:2] == [abi.MK_OP_QKV, abi.MK_OP_ATTN] and set(ops[2:]) <= {abi.MK_OP_OPROJ}
            attn = sched.tasks[ids[1]]
            assert int(attn[abi.MK_F_A1]) == h and int(attn[abi.MK_F_A3]) == 4
            groups.setdefault(h, []).append(int(attn[abi.MK_F_A2]))
            for i in ids[2:]:
                assert int(sched.tasks[i][abi.MK_F_A2]) == h * G * d  # the head's K range of Wo
                o_tiles[h] = o_tiles.get(h, 0) + 1
        assert {h: sorted(v) for h, v in groups.items()} == {h: [0, 1, 2, 3] for h in range(Hkv)}
        assert o_tiles == {h: CFG.hidden_size // AGROUP.o_rows for h in range(Hkv)}
        assert not [
            i for ids in by_sm.values() for i in ids if int(sched.tasks[i][abi.MK_F_OP]) == abi.MK_OP_DRAIN
        ]
    ws, batch, ref, ref_batch = _run(weights, context, strategy, sched)
    torch.testing.assert_close(ws["logits"][:1], ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(batch.kv_pool, ref_batch.kv_pool, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "op,slot,what",
    [
        (abi.MK_OP_OPROJ, 1, "router"),  # an O-proj tile adds into x(l+1) before its initialiser
        (abi.MK_OP_OPROJ, 0, "combine"),  # ... reads attn_out before the combine wrote it
        (abi.MK_OP_ATTN, 0, "qkv"),  # a split reads q and the new K/V before the head's QKV tiles
    ],
)
def test_attention_groups_deleted_wait_is_caught(weights, op, slot, what):
    sched = build_schedule(CFG, 1, [70], N_SMS, AGROUP)
    tids = [
        int(t[abi.MK_F_ID]) for t in sched.tasks if int(t[abi.MK_F_OP]) == op and int(t[abi.MK_F_LAYER]) == 1
    ]
    c = int(sched.tasks[tids[0]][abi.MK_F_WAIT0 + 2 * slot])
    assert sched.counters.names[c].startswith(what)
    _assert_caught(weights, sched, tids, slot)


@pytest.mark.parametrize("moe_group", [0, 16])
def test_attention_groups_release_geometry(moe_group):
    """attn_group = 16 on the engine's one-row tiling at the release geometry (5 layers, 132 SMs):
    64 group SMs, the 48 MoE items beside them; no deadlock, every counter at its total, the full
    happens-before check."""
    from tests.backend.megakernel.test_emulator import _release_engine_step

    sched, rep = _release_engine_step(1, 5, 99, 5, attn_group=16, moe_group=moe_group)
    by_sm = _layer_tasks_by_sm(sched, 2)
    qkv_sms = [sm for sm, ids in by_sm.items() if int(sched.tasks[ids[0]][abi.MK_F_OP]) == abi.MK_OP_QKV]
    assert len(qkv_sms) == 64
    assert sched.splits == {False: [16], True: [16]}
    assert rep.events > sum(int(t[abi.MK_F_OP]) != abi.MK_OP_DRAIN for t in sched.tasks)


def test_engine_tiling_carries_the_groups_at_one_row():
    """tiling_for_batch takes a base's moe_group and attn_group at one row only; every other field
    is the plain base's per-batch tiling (a group in the base must not make the batch tilings fall
    back to the base's tiles)."""
    from mkcode.backend.megakernel.tiling import default_tiling, tiling_for_batch
    from mkcode.backend.model.config import north_mini_code_config

    cfg = north_mini_code_config()
    plain = default_tiling(cfg)
    base = replace(plain, moe_group=16, attn_group=16)
    for B in range(1, 9):
        got, want = tiling_for_batch(cfg, base, B), tiling_for_batch(cfg, plain, B)
        groups = (16, 16) if B == 1 else (0, 0)
        assert (got.moe_group, got.attn_group) == groups
        assert replace(got, moe_group=0, attn_group=0) == want


@pytest.mark.parametrize("over", [{}, {"moe_group": 2}], ids=["routers", "moe-groups"])
def test_96_column_items_match_the_reference(over):
    """Fused items of 96 columns (Tiling.moe_up_cols; the kernel's 3-k-pair down slice) on a tiny
    geometry with 192 expert columns: 4 items (top-2 x 2 tiles) against the reference."""
    cfg = tiny_config(intermediate_size=192)
    w = random_weights(cfg, seed=4, std=0.1)
    tiling = replace(TILING, moe_up_cols=96, **over)
    sched = build_schedule(cfg, 1, [70], N_SMS, tiling)
    assert {int(t[abi.MK_F_A2]) for t in sched.tasks if int(t[abi.MK_F_OP]) == abi.MK_OP_MOE_FUSED} == {96}
    case = make_case(cfg, [70], seed=3)
    ref = reference_step(cfg, w, clone_batch(case.batch))
    ws = Workspace.allocate(cfg, tiling, "cpu")
    ws.poison()
    batch = clone_batch(case.batch)
    inp = StepInputs(batch.token_ids, batch.positions, batch.block_tables, batch.kv_pool)
    Emulator(cfg, w, sched, ws, CounterBank(sched.n_counters)).step(inp, "random", 0)
    torch.testing.assert_close(ws["logits"][:1], ref, rtol=1e-4, atol=1e-5)
