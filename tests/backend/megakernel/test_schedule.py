"""Schedule builder at the release geometry (descriptors and counters only, no math)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.schedule import build_schedule
from mkcode.backend.megakernel.tiling import (
    Tiling,
    TilingError,
    attention_splits,
    default_tiling,
)
from mkcode.backend.model.config import north_mini_code_config
from tests.backend.megakernel.cases import tiny_config

CFG = north_mini_code_config()


@pytest.fixture(scope="module", params=[1, 8])
def sched(request):
    B = request.param
    return build_schedule(CFG, B, [8192 + 37 * b for b in range(B)], 132)


def test_task_counts_at_release_geometry(sched):
    s = sched.summary()
    L = CFG.num_hidden_layers
    assert s["QKV"] == L * (4096 + 1024) // 64
    assert s["OPROJ"] == L * (2048 // 64) * 4
    assert s["ROUTE"] == L - 1 and s["ROUTER"] == (L - 1) * (128 // 16)
    assert s["DENSE_UP"] == 3072 // 32 and s["DENSE_DOWN"] == (2048 // 64) * 4
    assert s["LM_HEAD"] == 262144 // 128 and s["SAMPLE_ROW"] == sched.batch and "SAMPLE" not in s
    assert s["EMBED"] == sched.batch
    assert s["max_per_sm"] <= 280


def _producers(sched):
    """counter -> ids of the static tasks that signal it (queue items: the drains of their queue)."""
    prod = defaultdict(list)
    drains_of_queue = defaultdict(list)
    for t in sched.tasks:
        if t[abi.MK_F_OP] == abi.MK_OP_DRAIN and t[abi.MK_F_A0] == abi.MK_QUEUE_HOST:
            drains_of_queue[int(t[abi.MK_F_A1])].append(int(t[abi.MK_F_ID]))
        if t[abi.MK_F_OP] == abi.MK_OP_DRAIN and t[abi.MK_F_A0] == abi.MK_QUEUE_MOE:
            prod[int(t[abi.MK_F_A2])].append(int(t[abi.MK_F_ID]))  # device-made MoE down tasks
            drains_of_queue[int(t[abi.MK_F_A3])].append(int(t[abi.MK_F_ID]))  # the layer's attention tail
        for i in range(int(t[abi.MK_F_NSIG])):
            prod[int(t[abi.MK_F_SIG0 + i])].append(int(t[abi.MK_F_ID]))
    for q, (first, n, _, _) in enumerate(sched.queue_info):
        for item in sched.queue_desc[first : first + n]:
            for i in range(int(item[abi.MK_F_NSIG])):
                prod[int(item[abi.MK_F_SIG0 + i])] += drains_of_queue[q]
    return prod


def test_global_order_is_topological_and_lists_follow_it(sched):
    prod = _producers(sched)
    nd = sched.counters.n_dynamic
    for t in sched.tasks:
        for i in range(abi.MK_MAX_WAITS):
            c = int(t[abi.MK_F_WAIT0 + 2 * i])
            if c == abi.MK_NO_COUNTER or c < nd:
                continue
            assert prod[c], f"{sched.describe(t)} waits on {sched.counters.names[c]} that nobody signals"
            assert max(prod[c]) < t[abi.MK_F_ID], f"{sched.describe(t)} waits on a later task"
    for ids in sched.sm_lists:
        assert ids == sorted(ids)
    assert sorted(i for ids in sched.sm_lists for i in ids) == list(range(len(sched.tasks)))


def test_wait_targets_equal_step_totals(sched):
    cs = sched.counters
    for name, target in cs.targets.items():
        c = cs.index(name)
        if name.startswith(("attn_head", "attn_tail", "lm_head_queue")):  # host-queue heads: no waits
            continue
        assert cs.totals[c] == target, f"{name}: target {target} but {cs.totals[c]} signals per step"


def test_descriptor_array_layout(sched):
    desc, ntasks = sched.desc_array()
    assert desc.dtype == np.int32 and desc.shape[2] == abi.MK_DESC_WORDS
    assert int(ntasks.sum()) == len(sched.tasks)
    assert (desc[0, 0] == sched.tasks[sched.sm_lists[0][0]]).all()


def test_attn_idle_first_places_drains_on_idle_sms_first():
    """Tiling.attn_idle_first: a layer's attention drains take the SMs that hold none of its QKV or
    router tiles before the router tiles' SMs, and those before the QKV tiles' SMs."""
    from dataclasses import replace

    from mkcode.backend.megakernel.tiling import tiling_for_batch

    # 16 splits: 64 attention items per layer, more than the idle SMs with 64-row QKV tiles (80 of
    # them; the BS 1 default's 128-row tiles leave 80 idle SMs)
    t = replace(
        tiling_for_batch(CFG, default_tiling(CFG), 1),
        attn_idle_first=1,
        max_splits=16,
        qkv_rows=64,
        moe_local=0,
    )  # (80 QKV and 8 router tiles leave too few SMs for the 48 self-routing fused items)
    s = build_schedule(CFG, 1, [8192], 132, t)
    sm_of = {tid: sm for sm, ids in enumerate(s.sm_lists) for tid in ids}
    layer = 5
    mine = [i for i, d in enumerate(s.tasks) if int(d[abi.MK_F_LAYER]) == layer]
    qkv = {sm_of[i] for i in mine if s.tasks[i][abi.MK_F_OP] == abi.MK_OP_QKV}
    router = {sm_of[i] for i in mine if s.tasks[i][abi.MK_F_OP] == abi.MK_OP_ROUTER}
    drains = [
        sm_of[i]
        for i in mine
        if s.tasks[i][abi.MK_F_OP] == abi.MK_OP_DRAIN and s.tasks[i][abi.MK_F_A0] == abi.MK_QUEUE_HOST
    ]
    rank = [0 if sm not in qkv | router else 1 if sm in router else 2 for sm in drains]
    assert rank == sorted(rank) and len(set(drains)) == len(drains)
    n_idle = 132 - t.ctrl_sms - len(qkv | router)
    assert rank.count(0) == min(len(drains), n_idle) and 0 < n_idle < len(drains)


def test_split_policy_buckets_and_caps():
    t = default_tiling(CFG)
    s1 = attention_splits(CFG, [8192], t, 132)
    assert 1 <= s1[False][0] <= t.max_splits and 1 <= s1[True][0] <= t.max_splits
    # one schedule from 8192 up to 16383 tokens: the policy sees the power-of-two bucket
    assert attention_splits(CFG, [8200], t, 132) == attention_splits(CFG, [16383], t, 132)
    assert attention_splits(CFG, [3, 8200], t, 132) == attention_splits(CFG, [9000, 100], t, 132)
    s8 = attention_splits(CFG, [100] * 8, t, 132)
    assert all(x <= 4 for x in s8[False])  # short rows: few splits
    ragged = attention_splits(CFG, [10, 5000, 9000], t, 132)
    assert len(set(ragged[False])) == 1 and len(set(ragged[True])) == 1


def test_bad_tilings_are_refused():
    with pytest.raises(TilingError, match="qkv_rows"):
        build_schedule(CFG, 1, [10], 132, Tiling(qkv_rows=48))
    with pytest.raises(ValueError, match="batch"):
        build_schedule(tiny_config(), 9, [1] * 9, 8)
    many = tiny_config(num_experts=512, num_experts_per_tok=2)  # ROUTE's scratch holds 384
    with pytest.raises(TilingError, match="num_experts"):
        default_tiling(many).validate(many)


def test_long_contexts_raise_the_small_batch_split_cap():
    """tiling_for_batch below WIDE_MOE_FROM_BATCH: SMALL_MAX_SPLITS splits at most up to
    SMALL_MAX_SPLITS * SMALL_SPLIT_TOKENS visible tokens, then one per SMALL_SPLIT_TOKENS, never
    more than SMALL_SPLIT_CAP nor the base tiling's max_splits (the workspace's stride); sliding
    layers (4096 visible tokens at most) keep the small cap; bad values are refused."""
    from mkcode.backend.kv.layout import PAGE_SIZE as page_tokens
    from mkcode.backend.megakernel.tiling import (
        PAIR_SPLIT_CAP,
        SMALL_MAX_SPLITS,
        SMALL_SPLIT_CAP,
        SMALL_SPLIT_TOKENS,
        split_cap,
        tiling_for_batch,
    )

    base = default_tiling(CFG)
    t = tiling_for_batch(CFG, base, 1)
    assert SMALL_MAX_SPLITS < 16 < SMALL_SPLIT_CAP == 20 < base.max_splits == 32
    assert split_cap(t, 8192 // page_tokens) == SMALL_MAX_SPLITS
    assert split_cap(t, 32768 // page_tokens) == 32768 // SMALL_SPLIT_TOKENS == 16
    assert split_cap(t, 65536 // page_tokens) == split_cap(t, 10**6) == SMALL_SPLIT_CAP
    for ctx, full in [(8192, SMALL_MAX_SPLITS), (32768, 16), (40960, 20), (65536, 20), (200_000, 20)]:
        s = attention_splits(CFG, [ctx - 1], t, 132)
        assert s[False] == [full] and s[True][0] <= SMALL_MAX_SPLITS, ctx
    # two rows: a lower cap (2 x 4 kv heads x 20 items outnumber the SMs); one and three rows keep 20
    assert split_cap(tiling_for_batch(CFG, base, 2), 10**6) == PAIR_SPLIT_CAP == 16
    assert split_cap(tiling_for_batch(CFG, base, 3), 10**6) == SMALL_SPLIT_CAP
    narrow = tiling_for_batch(CFG, replace(base, max_splits=18), 1)  # a base stride below the cap
    assert split_cap(narrow, 10**6) == 18
    assert split_cap(base, 10**6) == base.max_splits  # split_tokens 0: the plain cap
    with pytest.raises(TilingError, match="split_cap"):
        replace(t, split_cap=4).validate(CFG)
    with pytest.raises(TilingError, match="split_tokens"):
        replace(t, split_tokens=-1).validate(CFG)


def test_timeline_summary_of_synthetic_records():
    import torch

    from mkcode.backend.megakernel import timeline

    tl = timeline.allocate(2, 4, "cpu")
    tl[0, 0] = torch.tensor([abi.MK_OP_QKV | (3 << 8), 1000, 3000, 4000, 7000, 8000, 9000])
    tl[0, 1] = torch.tensor([abi.MK_OP_MOE_UP | (3 << 8) | (1 << 16), 9000, 9000, 0, 0, 12000, 13000])
    tl[1, 0] = torch.tensor([abi.MK_OP_DRAIN | (3 << 8), 1000, 5000, 0, 0, 5000, 13000])
    s = timeline.summarize(tl)
    assert s["span_us"] == 12.0 and s["records"] == 3
    assert s["per_op"]["QKV"]["mean_run_us"] == 6.0 and s["per_op"]["QKV"]["mean_wait_us"] == 2.0
    assert s["per_op"]["QKV"]["mean_signal_us"] == 1.0
    q = s["per_op"]["QKV"]
    assert (q["mean_stage_us"], q["mean_gemv_us"], q["mean_epilogue_us"]) == (1.0, 3.0, 1.0)
    assert s["per_op"]["MOE_UP*"]["gemv_n"] == 0  # no GEMV marks: no staging/GEMV split
    assert s["per_op"]["MOE_UP*"]["count"] == 1
    # non-streaming: QKV run 6 us less its 3-us GEMV; the MoE item has no marks: all of its 4 us
    assert s["per_op"]["QKV"]["median_fixed_us"] == 3.0 and s["per_op"]["MOE_UP*"]["median_fixed_us"] == 4.0
    assert s["median_fixed_us"] == 3.5 and "DRAIN" not in [
        k for k, v in s["per_op"].items() if v["median_fixed_us"]
    ]
    assert abs(s["mean_busy_fraction"] - (10 / 12) / 2) < 1e-9  # drains are not busy time
    recs = timeline.records(tl)
    assert recs.shape == (3, 1 + abi.MK_TL_WORDS) and sorted(recs[:, 0].tolist()) == [0, 0, 1]
    spans = timeline.layer_spans(recs, 3)
    assert [d["op"] for d in spans] == ["QKV", "MOE_UP"]  # by first end of wait; drains left out
    assert spans[0]["first_ready_us"] == 2.0 and spans[1]["last_end_us"] == 12.0
    assert timeline.layer_spans(recs, 7) == []
    bd = timeline.breakdown(recs)  # span 12 us, 2 blocks: 24 SM-us, every microsecond counted once
    assert bd["span_us"] == 12.0 and bd["blocks"] == 2
    assert abs(sum(bd["sm_us"].values()) - 24.0) < 1e-9
    assert bd["sm_us"]["wait"] == 2.0 and bd["sm_us"]["stage"] == 1.0 and bd["sm_us"]["gemv"] == 3.0
    assert bd["sm_us"]["epilogue"] == 1.0 and bd["sm_us"]["op"] == 3.0  # the MoE item without GEMV marks
    assert bd["sm_us"]["signal"] == 2.0 and bd["sm_us"]["drain_wait"] == 4.0
    assert bd["sm_us"]["tail"] == 12.0 - 4.0  # block 1: its drain's wait, then nothing of its own
    gp = timeline.gaps(recs)  # block 0: QKV ends (after its signal) at 9000, the MoE item starts then
    assert [(d["prev"], d["next"], d["count"], d["total_us"]) for d in gp] == [("QKV", "MOE_UP", 1, 0.0)]
    tl[0, 2] = torch.tensor([abi.MK_OP_OPROJ | (3 << 8), 15000, 15500, 0, 0, 17000, 17500])
    tl[1, 1] = torch.tensor([abi.MK_OP_MOE_UP | (3 << 8) | (1 << 16), 6000, 6000, 0, 0, 8000, 8500])
    tl[1, 2] = torch.tensor([abi.MK_OP_OPROJ | (3 << 8), 11500, 11500, 0, 0, 12000, 12500])
    gp = timeline.gaps(timeline.records(tl))  # largest total first; drains never count
    assert [(d["prev"], d["next"], d["count"]) for d in gp] == [
        ("MOE_UP", "OPROJ", 2),
        ("QKV", "MOE_UP", 1),
    ]
    assert gp[0]["total_us"] == 5.0 and gp[0]["median_us"] == 3.0 and gp[0]["p90_us"] == 3.0
    assert bd["per_op"]["QKV"]["gemv"] == 3.0 and bd["per_op"]["DRAIN"]["drain_wait"] == 4.0
    assert timeline.breakdown(recs[:0])["blocks"] == 0
    ch = timeline.chain_ends(timeline.records(tl))  # layer 3 has no layer-2 end to count from
    assert ch == []
    tl[1, 3] = torch.tensor([abi.MK_OP_OPROJ | (2 << 8), 500, 500, 0, 0, 700, 800])  # layer 2's end
    ch = timeline.chain_ends(timeline.records(tl))
    assert [c["layer"] for c in ch] == [3] and ch[0]["layer_us"] == 17.5 - 0.8
    # MOE_UP is not a chain op (nor an end op); ends after signals
    assert ch[0]["ends_us"] == {"QKV": 9.0 - 0.8, "OPROJ": 17.5 - 0.8}


def test_timeline_layer_ends():
    """Each layer ends with its last O-proj / MLP item's signal (the end counter the next layer waits
    on), which chain_ends and sm_states use."""
    import torch

    from mkcode.backend.megakernel import timeline

    tl = timeline.allocate(2, 4, "cpu")
    tl[0, 0] = torch.tensor([abi.MK_OP_OPROJ | (2 << 8), 100, 200, 300, 500, 600, 700])
    tl[1, 0] = torch.tensor([abi.MK_OP_MOE_DOWN | (2 << 8) | (1 << 16), 100, 200, 300, 700, 800, 900])
    tl[0, 1] = torch.tensor([abi.MK_OP_QKV | (3 << 8), 900, 1000, 1200, 2000, 2200, 2300])
    tl[1, 1] = torch.tensor([abi.MK_OP_MOE_FUSED | (3 << 8) | (1 << 16), 1000, 1100, 1200, 4000, 5000, 5200])
    ch = timeline.chain_ends(timeline.records(tl))
    assert [c["layer"] for c in ch] == [3] and ch[0]["layer_us"] == 5.2 - 0.9  # from layer 2's last signal
    assert ch[0]["ends_us"] == {"QKV": 2.3 - 0.9, "MOE_FUSED": 5.2 - 0.9}
    assert timeline.sm_states(timeline.records(tl), 3, bin_us=1.0)  # a layer span to bin
    # a fused item's epilogue is its down slice's stream: only its staging and signal are fixed
    assert abs(timeline.summarize(tl)["per_op"]["MOE_FUSED*"]["median_fixed_us"] - 0.3) < 1e-9
    # op_phases: per op, medians of wait / staging / GEMV / epilogue / signal, and the GEMV's rate
    ph = {d["op"]: d for d in timeline.op_phases(timeline.records(tl), {3}, {"QKV": 1600, "MOE_FUSED": 5600})}
    assert set(ph) == {"QKV", "MOE_FUSED"}  # layer 2's items are not asked for
    q = ph["QKV"]
    assert (q["count"], q["wait_us"], q["stage_us"], q["gemv_us"], q["epilogue_us"], q["signal_us"]) == (
        1,
        0.1,
        0.2,
        0.8,
        0.2,
        0.1,
    )
    assert abs(q["gb_s_sm"] - 2.0) < 1e-9  # 1600 bytes in 0.8 us
    assert abs(ph["MOE_FUSED"]["gb_s_sm"] - 2.0) < 1e-9 and "down_gb_s_sm" not in ph["MOE_FUSED"]
    assert [d["op"] for d in timeline.op_phases(timeline.records(tl), {3})] == [
        "QKV",
        "MOE_FUSED",
    ]  # staging 0.2 > 0.1


def test_layer_lengths_by_kind(tmp_path, capsys):
    """timeline.layer_lengths: each layer from the previous one's last end signal (layer 0 from the
    step's first record), its head (last QKV end -> median attention ready) and the mean by kind;
    the CLI's --layers prints them."""
    import torch

    from mkcode.backend.megakernel import timeline

    tl = timeline.allocate(2, 6, "cpu")
    # layer 0 (dense): QKV 1-3 us, attention ready at 5 and 7, dense down ends at 10
    tl[0, 0] = torch.tensor([abi.MK_OP_QKV, 1000, 1500, 0, 0, 2800, 3000])
    tl[1, 0] = torch.tensor([abi.MK_OP_ATTN | (1 << 16), 3000, 5000, 0, 0, 6000, 6200])
    tl[0, 1] = torch.tensor([abi.MK_OP_ATTN | (1 << 16), 3100, 7000, 0, 0, 8000, 8200])
    tl[1, 1] = torch.tensor([abi.MK_OP_DENSE_DOWN, 8200, 8300, 8400, 9500, 9800, 10000])
    # layer 1 (sliding): its last O-proj signal at 25 us, no attention records; layer 2 (full): 40
    tl[0, 2] = torch.tensor([abi.MK_OP_OPROJ | (1 << 8), 11000, 12000, 0, 0, 24000, 25000])
    tl[1, 2] = torch.tensor([abi.MK_OP_MOE_DOWN | (2 << 8) | (1 << 16), 26000, 27000, 0, 0, 39000, 40000])
    ll = timeline.layer_lengths(timeline.records(tl), sliding={1}, dense={0})
    assert [(d["layer"], d["kind"], d["length_us"]) for d in ll["layers"]] == [
        (0, "dense", 9.0),
        (1, "sliding", 15.0),
        (2, "full", 15.0),
    ]
    assert ll["layers"][0]["head_us"] == 3.0 and "head_us" not in ll["layers"][1]
    assert ll["mean_us"] == {"dense": 9.0, "sliding": 15.0, "full": 15.0}
    assert timeline.layer_lengths(timeline.records(tl)[:0], set(), set()) == {"layers": [], "mean_us": {}}
    path = tmp_path / "timeline_bs8.pt"
    torch.save(timeline.records(tl), path)
    assert timeline.main([str(path), "--layers"]) == 0
    out = capsys.readouterr().out
    assert "    0 dense        9.0    3.0" in out and out.strip().endswith("sliding 15.0")


def test_layer_chain_medians(tmp_path, capsys):
    """timeline.layer_chain: each op's phases from the previous layer's last end signal, medians over
    the layers asked for; the CLI's --chain prints them."""
    import torch

    from mkcode.backend.megakernel import timeline

    tl = timeline.allocate(2, 8, "cpu")
    tl[0, 0] = torch.tensor(
        [abi.MK_OP_OPROJ | (2 << 8), 100, 200, 300, 500, 600, 1000]
    )  # layer 2 ends at 1 us
    for k, (layer, off) in enumerate([(3, 1000), (4, 11000)]):  # layer 3 ends at 11 us, layer 4 at 23
        tl[0, 1 + 2 * k] = torch.tensor(
            [abi.MK_OP_QKV | (layer << 8), off, off + 500, off + 1000, off + 3000, off + 3500, off + 4000]
        )
        tl[1, 1 + 2 * k] = torch.tensor(
            [
                abi.MK_OP_MOE_FUSED | (layer << 8),
                off,
                off + 2000,
                off + 2500,
                off + 8000,
                off + 9000,
                off + 10000 + 2000 * k,
            ]
        )
    head, *ops = timeline.layer_chain(timeline.records(tl), {3, 4})
    assert head["layer_us"] == 11.0  # 10 and 12
    assert [d["op"] for d in ops] == ["QKV", "MOE_FUSED"]  # by ready: 0.5 before 2.0
    qkv, moe = ops
    assert (qkv["ready"], qkv["gemv0"], qkv["gemv1"], qkv["end_last"]) == (0.5, 1.0, 3.0, 4.0)
    assert moe["end_last"] == 11.0  # layer 3: 10, layer 4: 12
    path = tmp_path / "timeline_bs1.pt"
    torch.save(timeline.records(tl), path)
    assert timeline.main([str(path), "--chain"]) == 0  # the release MoE layers 3-46: layers 3 and 4 here
    out = capsys.readouterr().out
    assert out.startswith("median layer 11.0 us") and "MOE_FUSED" in out


def test_hand_offs_time_each_waiting_consumer_from_its_trigger():
    """timeline.hand_offs: a consumer that waited is timed from the last producer signal before its
    wait end (a later signal, or a consumer that did not wait, does not count); the layer-end hand-off
    takes the previous layer's O-proj and MoE signals."""
    import torch

    from mkcode.backend.megakernel import timeline

    def rec(op, layer, start, ready, sig):  # (a record with start 0 is no record)
        return [op | (layer << 8), start + 10, ready, 0, 0, sig - 100, sig]

    rows = [
        rec(abi.MK_OP_QKV, 3, 0, 100, 5000),
        rec(abi.MK_OP_QKV, 3, 0, 100, 9000),
        rec(abi.MK_OP_QKV, 3, 0, 100, 30000),  # after both attention items' wait ends
        rec(abi.MK_OP_ATTN, 3, 1000, 5500, 20000),  # waited 4.5 us: 0.5 after the 5-us signal
        rec(abi.MK_OP_ATTN, 3, 1000, 9700, 21000),  # 0.7 after the 9-us signal
        rec(abi.MK_OP_ATTN, 3, 9400, 9800, 22000),  # waited 0.4 us: not a hand-off
        rec(abi.MK_OP_OPROJ, 2, 0, 100, 40000),
        rec(abi.MK_OP_MOE_FUSED, 2, 0, 100, 41000),
        rec(abi.MK_OP_QKV, 3, 39000, 41900, 50000),  # wait end 0.9 after the MoE signal
    ]
    tl = timeline.allocate(1, 16, "cpu")
    for i, r in enumerate(rows):
        tl[0, i] = torch.tensor(r)
    got = {d["hand_off"]: d for d in timeline.hand_offs(timeline.records(tl), {3})}
    assert got["QKV -> ATTN"]["count"] == 2 and abs(got["QKV -> ATTN"]["hop_us"] - 0.6) < 1e-9
    assert abs(got["OPROJ+MOE_FUSED -> QKV"]["hop_us"] - 0.9) < 1e-9
    assert "ROUTER -> MOE_FUSED" not in got


def test_sm_states_of_a_layer(tmp_path, capsys):
    """timeline.sm_states: per bin of a layer (the previous layer's end to its own), the blocks that
    stream (a GEMV interval, an ATTN run), sit in fixed costs, wait (by the waiting op) or idle; and
    the module's CLI prints it from a saved step."""
    import torch

    from mkcode.backend.megakernel import timeline

    tl = timeline.allocate(3, 3, "cpu")
    # layer 4's last O-proj tile (its end) signals at 1 us, layer 5's at 9 us: the layer spans 8 us
    # (two 4-us bins)
    tl[2, 0] = torch.tensor([abi.MK_OP_OPROJ | (4 << 8), 500, 500, 0, 0, 900, 1000])
    tl[2, 1] = torch.tensor([abi.MK_OP_OPROJ | (5 << 8), 1000, 8000, 0, 0, 8800, 9000])
    # block 0: a QKV tile waits 1-2 us, stages 2-3, streams 3-7, epilogue + signal 7-8
    tl[0, 0] = torch.tensor([abi.MK_OP_QKV | (5 << 8), 1000, 2000, 3000, 7000, 7500, 8000])
    # block 1: an attention item runs 5-9 us (ready at 5, op end 8.5, signalled 9)
    tl[1, 0] = torch.tensor([abi.MK_OP_ATTN | (5 << 8) | (1 << 16), 5000, 5000, 0, 0, 8500, 9000])
    recs = timeline.records(tl)
    st = timeline.sm_states(recs, 5, bin_us=4.0)
    assert [s["t_us"] for s in st] == [0.0, 4.0]
    # bin 0 (1-5 us): QKV waits 1/4, fixed 1/4, streams 2/4; the O-proj tile waits (1-5: 4/4)
    assert st[0]["stream"] == {"QKV": 0.5} and st[0]["fixed"] == 0.25
    assert st[0]["wait"] == {"QKV": 0.25, "OPROJ": 1.0}
    assert abs(st[0]["idle"] - (3 - 2.0)) < 1e-9  # block 1 idle all bin
    # bin 1 (5-9 us): QKV streams 2/4 then 1/4 fixed; ATTN streams 3.5/4 and 0.5/4 fixed
    assert st[1]["stream"] == {"QKV": 0.5, "ATTN": 0.875}
    assert abs(st[1]["fixed"] - (0.25 + 0.125 + 0.25)) < 1e-9  # + the O-proj tile's run 8-9
    assert timeline.sm_states(recs, 4) == []  # no layer-3 end to start from
    path = tmp_path / "timeline_bs1.pt"
    torch.save(recs, path)
    assert timeline.main([str(path), "--layer", "5", "--bin", "4"]) == 0
    out = capsys.readouterr().out
    assert "layer 5, per 4 us" in out and "[ATTN:1 QKV:0]" in out  # 0.875 and 0.5 blocks, rounded
    assert timeline.main([str(path), "--layer", "4"]) == 1
    # sm_tasks: each block's tasks over a window of the layer, from the previous layer's end (1 us)
    tasks = timeline.sm_tasks(recs, 5, 0.0, 3.0)
    assert sorted(tasks) == [0, 2]  # block 1's attention item starts at 4 us (after the window)
    assert tasks[0] == [{"op": "QKV", "layer": 5, "start": 0.0, "ready": 1.0, "end": 7.0}]
    assert [t["op"] for t in tasks[2]] == ["OPROJ", "OPROJ"]  # layer 4's ends at 0 us
    assert list(timeline.sm_tasks(recs, 5, 5.0, 9.0)) == [0, 1, 2]
    assert timeline.sm_tasks(recs, 4, 0.0, 9.0) == {}
    capsys.readouterr()
    assert timeline.main([str(path), "--layer", "5", "--sms", "0", "9", "1"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0] == "0 QKV5[0|1-7]" and listing[1] == "1 ATTN5[4|4-8]"


def test_stream_profile_spreads_bytes_over_gemv_and_attention_intervals():
    import torch

    from mkcode.backend.megakernel import timeline

    tl = timeline.allocate(2, 4, "cpu")
    # layer 5: a QKV tile streams 4 MB over its GEMV, 2-6 us after the layer's first start
    tl[0, 0] = torch.tensor([abi.MK_OP_QKV | (5 << 8), 1000, 2000, 3000, 7000, 7500, 8000])
    # an attention item runs 3-5 us (ready to op end); the layer's 1 MB of KV is all its own
    tl[1, 0] = torch.tensor([abi.MK_OP_ATTN | (5 << 8) | (1 << 16), 3000, 4000, 0, 0, 6000, 6200])
    tl[1, 1] = torch.tensor([abi.MK_OP_DRAIN | (5 << 8), 1000, 1000, 0, 0, 1000, 9000])
    tl[0, 1] = torch.tensor([abi.MK_OP_QKV | (6 << 8), 9000, 9000, 9500, 9900, 9950, 10000])  # another layer
    prof = timeline.stream_profile(timeline.records(tl), 5, {"QKV": 4e6}, attn_bytes=1e6, bin_us=2.0)
    assert [p["t_us"] for p in prof] == [0.0, 2.0, 4.0, 6.0]  # first start 1000 ns, last end 9000
    got = [round(p["tb_s"], 6) for p in prof]
    # QKV: 1 MB per us over 2..6 us; attention: 0.5 MB per us over 3..5 us
    assert got == [0.0, round((2e6 + 0.5e6) / 2e-6 / 1e12, 6), round((2e6 + 0.5e6) / 2e-6 / 1e12, 6), 0.0]
    assert prof[1]["blocks"] == {"QKV": 1.0, "ATTN": 0.5} and prof[3]["blocks"] == {}
    assert timeline.stream_profile(timeline.records(tl), 9, {}, 0.0) == []


def test_stream_profile_puts_a_fused_items_down_slice_over_its_epilogue():
    """A fused MoE item: its up bytes over its up GEMV, its down slice's (MOE_FUSED_DOWN) over the
    epilogue after it; without MOE_FUSED_DOWN every byte stays over the GEMV."""
    import torch

    from mkcode.backend.megakernel import timeline

    tl = timeline.allocate(1, 2, "cpu")
    # layer 2: up GEMV 0-4 us, then the act and the down slice 4-6 us (from the layer's first stamp,
    # 1000 ns: a record whose start stamp is 0 is an empty slot)
    tl[0, 0] = torch.tensor([abi.MK_OP_MOE_FUSED | (2 << 8) | (1 << 16), 1000, 1000, 1000, 5000, 7000, 7100])
    recs = timeline.records(tl)
    prof = timeline.stream_profile(recs, 2, {"MOE_FUSED": 8e6, "MOE_FUSED_DOWN": 4e6}, 0.0, bin_us=2.0)
    assert [round(p["tb_s"], 6) for p in prof] == [2.0, 2.0, 2.0, 0.0]  # 2 MB per us throughout, then none
    assert prof[0]["blocks"] == {"MOE_FUSED": 1.0} and prof[2]["blocks"] == {"MOE_FUSED_DOWN": 1.0}
    whole = timeline.stream_profile(recs, 2, {"MOE_FUSED": 12e6}, 0.0, bin_us=2.0)
    assert [round(p["tb_s"], 6) for p in whole] == [3.0, 3.0, 0.0, 0.0]


def test_switch_fields_are_tiling_fields():
    """tiling.SWITCH_FIELDS (modes and placements, copied as given by the reduced check) names real
    Tiling fields, and no tile size among them."""
    from dataclasses import fields

    from mkcode.backend.megakernel.tiling import SWITCH_FIELDS, Tiling

    names = {f.name for f in fields(Tiling)}
    assert names >= SWITCH_FIELDS
    assert not SWITCH_FIELDS & {
        "qkv_rows",
        "o_rows",
        "moe_up_cols",
        "moe_down_rows",
        "lm_rows",
        "router_rows",
    }


def test_gpu_check_cli_parses_variants():
    """The device run's command line is checked here, where it costs no device time."""
    from mkcode.backend.megakernel import gpu_check

    args = gpu_check.build_parser().parse_args(
        [
            "bench",
            "--batches",
            "1",
            "8",
            "--variants",
            "prefetch=3",
            "prefetch=16",
            "moe_up_cols=64,moe_down_rows=256",
        ]
    )
    assert args.batches == [1, 8] and len(args.variants) == 3
    assert gpu_check.parse_variant("moe_up_cols=64,prefetch=2") == (2, {"moe_up_cols": 64})
    with pytest.raises(ValueError, match="unknown"):
        gpu_check.parse_variant("warp_size=64")
    with pytest.raises(SystemExit):
        gpu_check.build_parser().parse_args(["bench", "--variants", "bogus=1"])
    assert gpu_check.build_parser().parse_args(["bench"]).timeline_mode is None  # the fastest variant's
    tw = gpu_check.build_parser().parse_args(["bench", "--timeline-mode", str(abi.MK_MODE_TWICE)])
    assert tw.timeline_mode == abi.MK_MODE_TWICE == 16


def test_bench_checks_what_it_changes():
    """gpu_check bench checks a variant at the reduced geometry before timing it where it changes a
    mode bit or a tile field; the default alone needs no check."""
    from mkcode.backend.megakernel import gpu_check

    assert gpu_check.needs_check(abi.MK_MODE_TWICE, {})
    assert gpu_check.needs_check(abi.MK_PREFETCH_DEFAULT, {"moe_local": 1})
    assert gpu_check.needs_check(abi.MK_PREFETCH_DEFAULT, {"router_rows": 8})
    assert not gpu_check.needs_check(abi.MK_PREFETCH_DEFAULT, {})


@pytest.mark.parametrize("layers", [2, 6])
def test_sanitizer_step_runs_the_one_row_path(layers):
    """The sanitizer's step (gpu_check step_sms) takes enough SMs for the BS 1 engine tiling's
    self-routing items, the product's one-row path, and the fewest such; three rows keep 16."""
    from mkcode.backend.megakernel import gpu_check
    from mkcode.backend.megakernel.schedule import moe_local_fits
    from mkcode.backend.megakernel.tiling import tiling_for_batch

    cfg = gpu_check.step_config(layers)
    one = tiling_for_batch(cfg, default_tiling(cfg), 1)
    assert one.moe_local and not moe_local_fits(cfg, one, 16)  # 16 SMs would drop it
    n = gpu_check.step_sms(cfg, one)
    assert moe_local_fits(cfg, one, n) and not moe_local_fits(cfg, one, n - 4)
    build_schedule(cfg, 1, [300], n, one)  # the self-routing schedule builds there
    assert gpu_check.step_sms(cfg, tiling_for_batch(cfg, default_tiling(cfg), 3)) == 16
    assert gpu_check.build_parser().parse_args(["step"]).sms is None


def test_reduced_tiling_carries_options_that_need_each_other():
    """gpu_check.reduced_tiling (the bench's correctness check of a variant at the reduced
    geometry): the BS 1 engine tiling's combines on the control SMs need those SMs, and checked one
    field at a time against the reduced default (no control SMs) they were dropped; applied in field
    order they are carried together. A size that does not fit keeps the default and says so."""
    from dataclasses import replace

    from mkcode.backend.megakernel import gpu_check
    from mkcode.backend.megakernel.tiling import default_tiling, tiling_for_batch
    from tests.backend.megakernel.cases import reduced_config

    release = north_mini_code_config()
    bs1 = tiling_for_batch(release, default_tiling(release), 1)
    assert bs1.combine_ctrl and bs1.ctrl_sms and bs1.moe_fused  # the engine's BS 1 options
    t, dropped = gpu_check.reduced_tiling(bs1)
    t.validate(reduced_config())
    assert (t.combine_ctrl, t.ctrl_sms, t.moe_fused) == (bs1.combine_ctrl, bs1.ctrl_sms, bs1.moe_fused)
    # self-routing items run one row only, and the reduced check runs BS 4
    assert dropped == ["moe_local=1 runs one row only, the reduced check runs 4: kept 0"]
    t, dropped = gpu_check.reduced_tiling(replace(bs1, moe_up_cols=48))
    assert t.moe_up_cols == default_tiling(reduced_config()).moe_up_cols
    assert any(d.startswith("moe_up_cols=48 does not fit") for d in dropped)


def test_gpu_run_plan_variants_parse_and_are_emulated():
    """gpu_run.sh's default VARIANTS parse with gpu_check's parser, the default mode is among them
    (twice: the spread between runs of one call), and every tiling it sweeps is one the emulator test
    runs at the release geometry."""
    import re
    from pathlib import Path

    from mkcode.backend.megakernel import gpu_check

    from .test_emulator import SWEEP_TILINGS

    script = (Path(gpu_check.__file__).parent / "gpu_run.sh").read_text()
    m = re.search(r'VARIANTS=\$\{VARIANTS:-"([^"]+)"\}', script)
    assert m, "gpu_run.sh lost its VARIANTS default"
    specs = m.group(1).split()
    args = gpu_check.build_parser().parse_args(["bench", "--variants", *specs])
    parsed = [gpu_check.parse_variant(v) for v in args.variants]
    assert parsed.count((abi.MK_PREFETCH_DEFAULT, {})) == 2
    for _, kw in parsed:
        if kw:
            assert kw in SWEEP_TILINGS, f"{kw} is swept on the GPU but not emulated"


def test_moe_tiles_widen_with_the_batch():
    """From WIDE_MOE_FROM_BATCH rows the default tiling widens the MoE tiles (measured faster at BS 8,
    slower at BS 1): the widest scale the config takes; a config that takes none keeps the base.
    Below that, 2x (else 1.5x) up columns and 2x down rows where they divide (measured faster at BS 1). Claims
    are lazy at every size (2026-11-30), whatever the tiles."""
    from dataclasses import replace

    from mkcode.backend.megakernel.tiling import (
        SINGLE_QKV_ROWS,
        SMALL_FUSED_BELOW,
        SMALL_MAX_SPLITS,
        SMALL_SPLIT_CAP,
        SMALL_SPLIT_TOKENS,
        WIDE_ATTN_IN_MOE,
        WIDE_ATTN_IN_MOE_FROM_BATCH,
        WIDE_BIG_DOWN_FROM_BATCH,
        WIDE_MAX_SPLITS,
        WIDE_MOE_FROM_BATCH,
        WIDE_QKV_BY_HEAD,
        WIDE_SPLIT_TOKENS,
        tiling_for_batch,
    )

    def placement(t, b, wide=False):  # the control SMs (one per row), where the attention drains go
        assert t.moe_local == int(b == 1)  # self-routing fused items at one row (SINGLE_MOE_LOCAL)
        t = replace(t, moe_local=0)
        if t.combine_ctrl:  # small batches: fused MoE items below SMALL_FUSED_BELOW rows, the
            # combines on at least 4 control SMs, 256-row LM-head tiles
            assert not wide and t.ctrl_sms == max(b, 4) and t.moe_fused == int(b < SMALL_FUSED_BELOW)
            assert (t.lm_rows, t.o_rows) == (256, 128)  # 256-row LM-head, 128-row O-proj tiles
            d = default_tiling(cfg)
            assert t.qkv_rows == (SINGLE_QKV_ROWS if b == 1 else d.qkv_rows)  # 128-row QKV tiles at one row
            t = replace(
                t,
                moe_fused=0,
                combine_ctrl=0,
                ctrl_sms=b,
                lm_rows=d.lm_rows,
                o_rows=d.o_rows,
                qkv_rows=d.qkv_rows,
            )
        # small batches: the attention drains on idle SMs first; wide: on every work SM, at most
        # WIDE_MAX_SPLITS splits (more at long contexts: one per WIDE_SPLIT_TOKENS tokens)
        assert t.ctrl_sms == b and t.attn_with_qkv == 0 and t.combine_ctrl == 0
        assert t.attn_idle_first == int(not wide)
        if wide:  # split_cap keeps the base's max_splits (the cap at long contexts)
            assert t.split_tokens == WIDE_SPLIT_TOKENS and t.max_splits == min(t.split_cap, WIDE_MAX_SPLITS)
            t = replace(t, max_splits=t.split_cap, split_tokens=0, split_cap=0)
        # the attention as the MoE queue's head (claimed before ROUTE) from WIDE_ATTN_IN_MOE_FROM_BATCH rows
        # (with one QKV counter per kv head)
        head_q = wide and b >= WIDE_ATTN_IN_MOE_FROM_BATCH
        assert (t.attn_in_moe, t.qkv_by_head) == ((WIDE_ATTN_IN_MOE, WIDE_QKV_BY_HEAD) if head_q else (0, 0))
        return replace(t, ctrl_sms=0, attn_with_qkv=0, attn_idle_first=0, attn_in_moe=0, qkv_by_head=0)

    cfg = north_mini_code_config(4)
    base = default_tiling(cfg)
    for b in (1, WIDE_MOE_FROM_BATCH - 1):
        small = tiling_for_batch(cfg, base, b)
        assert (small.moe_up_cols, small.moe_down_rows) == (128, 256)  # release geometry: 768 / 128 = 6 tiles
        assert small.moe_fused == int(b < SMALL_FUSED_BELOW)
        assert small.max_splits == min(base.max_splits, SMALL_MAX_SPLITS)
        assert (small.split_tokens, small.split_cap) == (
            SMALL_SPLIT_TOKENS,
            min(base.max_splits, SMALL_SPLIT_CAP),
        )
        assert (
            replace(
                placement(small, b),
                moe_up_cols=base.moe_up_cols,
                moe_down_rows=base.moe_down_rows,
                max_splits=base.max_splits,
                split_tokens=0,
                split_cap=0,
            )
            == base
        )
    fallback = north_mini_code_config(4, intermediate_size=96)  # 128 / 64 columns do not divide 96, 48 do
    t = tiling_for_batch(fallback, default_tiling(fallback), 1)
    assert t.moe_up_cols == 48 and t.moe_fused == 0  # a fused item's down slice takes 32/64/128/256
    # 128, 64, 48 columns do not divide 160: the base
    other = north_mini_code_config(4, intermediate_size=160)
    assert placement(tiling_for_batch(other, default_tiling(other), 1), 1) == replace(
        default_tiling(other),
        max_splits=SMALL_MAX_SPLITS,
        split_tokens=SMALL_SPLIT_TOKENS,
        split_cap=min(default_tiling(other).max_splits, SMALL_SPLIT_CAP),
    )
    wide = tiling_for_batch(cfg, base, 8)
    # 384-column up tiles (768 weight rows: two per expert), 1024-row down tiles from
    # WIDE_BIG_DOWN_FROM_BATCH rows (512 below), one up size (768 - 4 x 128 leaves no whole
    # 384-column tile)
    assert WIDE_BIG_DOWN_FROM_BATCH == 8
    assert (wide.moe_up_cols, wide.moe_down_rows) == (12 * base.moe_up_cols, 8 * base.moe_down_rows)
    four = tiling_for_batch(cfg, base, 4)
    assert (four.moe_up_cols, four.moe_down_rows) == (12 * base.moe_up_cols, 4 * base.moe_down_rows)
    assert placement(four, 4, wide=True) == replace(
        placement(wide, 8, wide=True), moe_down_rows=four.moe_down_rows
    )
    # the attention as the MoE queue's head, claimed before ROUTE, from WIDE_ATTN_IN_MOE_FROM_BATCH rows
    assert (four.attn_in_moe, wide.attn_in_moe) == (0, WIDE_ATTN_IN_MOE)
    assert 2 * wide.moe_up_cols <= abi.MK_MAX_TILE_ROWS
    assert wide.o_rows == 128  # WIDE_O_ROWS
    wide = placement(wide, 8, wide=True)
    assert (
        replace(
            wide,
            moe_up_cols=base.moe_up_cols,
            moe_down_rows=base.moe_down_rows,
            o_rows=base.o_rows,
        )
        == base
    )
    # where the 384-column tiles do not divide the intermediate size but 256 do
    eight = north_mini_code_config(4, intermediate_size=1024)
    t = tiling_for_batch(eight, default_tiling(eight), 8)
    assert t.moe_up_cols == 8 * default_tiling(eight).moe_up_cols
    # 256 / 128-column up tiles do not divide 192, 64 do
    mid = north_mini_code_config(4, intermediate_size=192)
    t = tiling_for_batch(mid, default_tiling(mid), 8)
    assert t.moe_up_cols == 2 * default_tiling(mid).moe_up_cols
    narrow = north_mini_code_config(4, hidden_size=768)  # 512-row down tiles do not divide 768, 256 do
    t = tiling_for_batch(narrow, default_tiling(narrow), 8)
    assert (t.moe_up_cols, t.moe_down_rows) == (
        4 * default_tiling(narrow).moe_up_cols,
        2 * default_tiling(narrow).moe_down_rows,
    )
    odd = north_mini_code_config(4, intermediate_size=96)  # 64-column up tiles do not divide 96
    assert placement(tiling_for_batch(odd, default_tiling(odd), 8), 8, wide=True) == replace(
        default_tiling(odd),
        o_rows=128,
        moe_down_rows=2 * default_tiling(odd).moe_down_rows,
    )


def test_device_scripts_parse():
    """gpu_run.sh and ab_tree.sh are valid bash; the folders ab_tree.sh prepares are git-ignored."""
    import subprocess
    from pathlib import Path

    from mkcode.backend.megakernel import gpu_check

    here = Path(gpu_check.__file__).parent
    for name in ("gpu_run.sh", "ab_tree.sh"):
        subprocess.run(["bash", "-n", str(here / name)], check=True)
    root = here.parents[1]
    assert "/ab_*/" in (root / ".gitignore").read_text().split()  # ab_base/ and ab_tree.sh's other DIRs


def test_item_transitions_and_attention_runs(tmp_path, capsys):
    """timeline.transitions: per (GEMV task, the op its block ran before it) the median gap, staging
    and epilogue; timeline.attention_runs: ATTN items' run and wait by layer kind; the CLI's --items
    prints both from a saved step."""
    import torch

    from mkcode.backend.megakernel import timeline

    tl = timeline.allocate(2, 4, "cpu")
    # block 0: an attention item (layer 1), its drain, then two up items (GEMV marks)
    tl[0, 0] = torch.tensor([abi.MK_OP_ATTN | (1 << 8), 1000, 3000, 0, 0, 30000, 31000])
    tl[0, 1] = torch.tensor([abi.MK_OP_DRAIN | (1 << 8), 31500, 32000, 0, 0, 32000, 90000])
    tl[0, 2] = torch.tensor([abi.MK_OP_MOE_UP | (1 << 8), 37000, 37500, 39500, 60000, 61000, 62000])
    tl[0, 3] = torch.tensor([abi.MK_OP_MOE_UP | (1 << 8), 64000, 64000, 66000, 80000, 81000, 81500])
    # block 1: an attention item of layer 0 (full), then a down item without GEMV marks (not counted)
    tl[1, 0] = torch.tensor([abi.MK_OP_ATTN | (0 << 8), 100, 500, 0, 0, 40500, 41000])
    tl[1, 1] = torch.tensor([abi.MK_OP_MOE_DOWN | (1 << 8), 42000, 43000, 0, 0, 50000, 51000])
    recs = timeline.records(tl)
    tr = timeline.transitions(recs)
    assert [(d["op"], d["after"], d["count"]) for d in tr] == [("MOE_UP", "ATTN", 1), ("MOE_UP", "MOE_UP", 1)]
    first, second = tr
    assert (first["gap_us"], first["pre_us"], first["post_us"]) == (6.0, 2.0, 2.0)  # the drain does not count
    assert (second["gap_us"], second["pre_us"], second["post_us"]) == (2.0, 2.0, 1.5)
    runs = timeline.attention_runs(recs, sliding={1})
    assert runs["sliding"]["count"] == 1 and runs["sliding"]["run_median_us"] == 27.0
    assert runs["sliding"]["wait_median_us"] == 2.0
    assert runs["full"]["run_median_us"] == 40.0 and runs["full"]["wait_median_us"] == 0.4
    assert timeline.attention_runs(recs[:0], sliding={1}) == {}
    # block 0's switch: ATTN end 30 -> signal 31 -> drain 31.5 -> ready 32 -> up 37 -> ready 37.5 -> GEMV 39.5
    sw = timeline.switch_segments(recs)
    assert sw["count"]["n"] == 1
    got = [sw[k]["median_us"] for k in (*timeline.SWITCH_SEGMENTS, "total")]
    assert got == [1.0, 0.5, 0.5, 5.0, 0.5, 2.0, 9.5]
    assert sw["count"]["in_drain"] == 0
    assert timeline.switch_segments(recs[recs[:, 0] == 1]) == {}  # block 1: no MOE_UP after its item
    # attn_in_moe = 3: one drain (started before the item) runs the ATTN item and then the up item
    tl3 = timeline.allocate(1, 3, "cpu")
    tl3[0, 0] = torch.tensor([abi.MK_OP_DRAIN | (1 << 8), 500, 800, 0, 0, 800, 90000])
    tl3[0, 1] = torch.tensor([abi.MK_OP_ATTN | (1 << 8), 1000, 3000, 0, 0, 30000, 31000])
    tl3[0, 2] = torch.tensor([abi.MK_OP_MOE_UP | (1 << 8), 36000, 36500, 38500, 60000, 61000, 62000])
    sw3 = timeline.switch_segments(timeline.records(tl3))
    assert sw3["count"] == {"n": 1.0, "in_drain": 1.0}
    assert [sw3[k]["median_us"] for k in (*timeline.SWITCH_SEGMENTS, "total")] == [
        1.0,
        0.0,
        0.0,
        5.0,
        0.5,
        2.0,
        8.5,
    ]
    path = tmp_path / "timeline_bs8.pt"
    torch.save(recs, path)
    assert timeline.main([str(path), "--items"]) == 0
    out = capsys.readouterr().out
    assert "MOE_UP       ATTN" in out and "ATTN full: 1 items, run median 40.0 us" in out
    assert "ATTN sliding: 1 items" in out  # layer 1 of the release config is a sliding one


def test_paged_case_pages_scattered_or_consecutive():
    """testing.make_case: pages scattered at random over the pool by default; with scatter=False each
    (layer, row)'s visible pages are consecutive (gpu_check bench --kv-contiguous); the same pages
    are mapped either way, each once."""
    from mkcode.backend.kv.layout import NO_PAGE
    from tests.backend.megakernel.cases import make_case

    cfg = tiny_config()
    contexts = [700, 130]
    for scatter in (True, False):
        t = make_case(cfg, contexts, seed=3, scatter=scatter).batch.block_tables
        mapped = t[t != NO_PAGE].tolist()
        assert len(mapped) == len(set(mapped))
        runs = [
            [p for p in t[layer, b].tolist() if p != NO_PAGE]
            for layer in range(cfg.num_hidden_layers)
            for b in range(len(contexts))
        ]
        consecutive = all(all(q == p + 1 for p, q in pairwise(r)) for r in runs)
        assert consecutive == (not scatter)


def sm_lists_of(s, first: int) -> list[list[int]]:
    return [[i for i in ids if i >= first] for ids in s.sm_lists]


def test_moe_phase_of_a_layer(tmp_path):
    """timeline.moe_phase: the layer's up / down tiles binned by ready and end time, the downs'
    waits for their experts' ups, the blocks' idle time before the layer's end; and the CLI's --moe."""
    import torch

    from mkcode.backend.megakernel import timeline

    tl = timeline.allocate(2, 3, "cpu")
    # times from the layer's first end of wait (1 us). Block 0: an up tile ready at 0 us, ends 10; a
    # down tile claimed at 11, ready at 24, ends 39
    tl[0, 0] = torch.tensor([abi.MK_OP_MOE_UP | (6 << 8) | (1 << 16), 500, 1000, 2000, 10000, 10500, 11000])
    tl[0, 1] = torch.tensor(
        [abi.MK_OP_MOE_DOWN | (6 << 8) | (1 << 16), 12000, 25000, 26000, 39000, 39500, 40000]
    )
    # block 1: an up tile ready at 4, ends 23; nothing after it
    tl[1, 0] = torch.tensor([abi.MK_OP_MOE_UP | (6 << 8) | (1 << 16), 4000, 5000, 6000, 23000, 23500, 24000])
    recs = timeline.records(tl)
    ph = timeline.moe_phase(recs, 6, bin_us=10.0)
    assert ph["up_ready"] == {0.0: 2} and ph["up_end"] == {10.0: 1, 20.0: 1}
    assert ph["down_start"] == {10.0: 1} and ph["down_ready"] == {20.0: 1} and ph["down_end"] == {30.0: 1}
    assert ph["down_wait_sm_us"] == 13.0 and ph["end_us"] == 39.0
    assert ph["idle_before_end_sm_us"] == 39.0 - 23.0  # block 1 from its up tile's end
    assert timeline.moe_phase(recs, 5) == {}
    path = tmp_path / "timeline_bs8.pt"
    torch.save(recs, path)
    assert timeline.main([str(path), "--layer", "6", "--moe"]) == 0
    assert timeline.main([str(path), "--layer", "5", "--moe"]) == 1


def test_routing_gap_rate():
    """timeline.routing_gap: from the layer's first QKV / router end of wait to its first MoE GEMV,
    the bytes streamed in that window over its length (issue 41's >= 3 TB/s bar)."""
    import torch

    from mkcode.backend.megakernel import timeline

    tl = timeline.allocate(2, 2, "cpu")
    # (a record's start stamp must be non-zero: 0 marks an empty slot)
    tl[0, 0] = torch.tensor([abi.MK_OP_QKV | (3 << 8), 100, 1100, 2100, 6100, 6600, 7100])
    tl[1, 0] = torch.tensor([abi.MK_OP_MOE_FUSED | (3 << 8), 100, 600, 8100, 12100, 13100, 13600])
    recs = timeline.records(tl)
    gap = timeline.routing_gap(recs, 3, {"QKV": 4e6, "MOE_FUSED": 1e6}, 0.0)
    assert gap["start_us"] == 1.0 and gap["length_us"] == 7.0
    assert abs(gap["tb_s"] - 4.0 / 7.0) < 1e-9  # the QKV tile's 4 MB, all inside the gap
    assert timeline.routing_gap(recs, 4, {}, 0.0) == {}  # no such layer
    assert timeline.routing_gap(recs[:1], 3, {"QKV": 4e6}, 0.0) == {}  # no MoE item: no gap
