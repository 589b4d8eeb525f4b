"""Verify rows on the megakernel, proven in the emulator: several rows of one sequence at positions
L..L+d over one block table (DecodeBatch.seq_rows), row i reading the K/V that rows < i write in the
same step.

What the kernel does: each QKV tile writes its K/V columns for every row of the step into the pool
slot of the row's position, and signals its kv head's QKV counter; an ATTN item (row, kv head,
split) waits on that counter, so the counters alone order every row's K/V write of a layer and head
before any row's attention of it. But the kernel starts an item's first K/V pages before that wait
(the attention prologue: only the row's own slot is left for after it), so a verify row's prologue
may load an earlier row's slot before its write. The emulator keys K/V by physical page and slot
and checks the prologue's loads against what the SM saw before the item's waits: the plain
schedule races; `build_schedule(verify_rows=True)` makes the drains that claim the attention items
wait for every QKV tile of the layer, which orders them (no kernel change).

Each ordering test fails when its dependency is broken: the plain schedule, a verify schedule with
the drains' waits dropped, and rows with a gap all raise HazardError."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.engine.torch_backend import TorchDecodeBackend
from mkcode.backend.kv.layout import NO_PAGE, PAGE_SIZE, first_visible_position, pages_for, pool_shape
from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.backend import MegakernelBackend
from mkcode.backend.megakernel.emulator import Emulator, HazardError
from mkcode.backend.megakernel.emulator_ops import StepInputs
from mkcode.backend.megakernel.schedule import Schedule, build_schedule
from mkcode.backend.megakernel.tiling import Tiling, default_tiling, split_bucket_position, tiling_for_batch
from mkcode.backend.megakernel.workspace import CounterBank, Workspace
from mkcode.backend.model.config import north_mini_code_config
from mkcode.backend.model.reference import ReferenceModel
from mkcode.backend.model.weights import random_weights
from tests.backend.megakernel.test_backend_host import FakeNative
from tests.backend.megakernel.test_emulator import CFG, N_SMS, TILING  # window 64: layers 1-3 and 5 slide

# tilings of the engine's kinds: attention in the MoE queue claimed before ROUTE with one QKV
# counter per kv head (the BS 8 kind), fused MoE items (the small batches' kind)
TILINGS = {
    "base": TILING,
    "moe-head-by-head": replace(TILING, attn_in_moe=3, qkv_by_head=1),
    "fused": replace(TILING, moe_fused=1),
}
# (contexts, rows per sequence): one sequence of 8 rows; across a page boundary (61..66); a ragged
# mix with a plain row and a context past the window; rows ending on and starting at a page edge
CASES = [
    ([20], [8]),
    ([61], [6]),
    ([5, 61, 130], [1, 4, 3]),
    ([63, 100, 7], [2, 1, 5]),
    ([126, 190], [4, 4]),
]


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=1, std=0.1)


def verify_batch(cfg, contexts, rows, seed=0, gap: bool = False) -> DecodeBatch:
    """Sequence s holds contexts[s] tokens and gets rows[s] rows at consecutive positions over ONE
    block table (its pages scattered over the pool; sliding layers' pages below the window of its
    first row released); the pool is noise, so a slot read before this step's write is wrong.
    `gap`: a sequence's rows skip one position after the first (a malformed step)."""
    g = torch.Generator().manual_seed(seed)
    L, B = cfg.num_hidden_layers, sum(rows)
    P = max(pages_for(c + r + gap) for c, r in zip(contexts, rows))
    need = L * len(contexts) * P + 2
    perm = torch.randperm(need, generator=g)
    tables = torch.full((L, B, P), NO_PAGE, dtype=torch.int32)
    k, r0, pos = 0, 0, []
    for c, r in zip(contexts, rows):
        for layer in range(L):
            lo_page = first_visible_position(c, cfg.window(layer)) // PAGE_SIZE
            for p in range(pages_for(c + r + gap)):
                if p >= lo_page:
                    tables[layer, r0 : r0 + r, p] = int(perm[k])
                k += 1
        pos += [c] + [c + i + gap for i in range(1, r)]
        r0 += r
    pool = torch.randn(pool_shape(need, cfg.num_key_value_heads, cfg.head_dim), generator=g) * 0.5
    return DecodeBatch(
        token_ids=torch.randint(0, cfg.vocab_size, (B,), generator=g),
        positions=torch.tensor(pos),
        block_tables=tables,
        kv_pool=pool,
        host_positions=tuple(pos),
        seq_rows=tuple(rows),
    )


def _schedule(batch: DecodeBatch, tiling=TILING, verify=True) -> Schedule:
    return build_schedule(CFG, batch.size, batch.positions_on_host(), N_SMS, tiling, verify_rows=verify)


def _emulate(weights, batch, sched, strategy="random", seed=0, **kw):
    """The emulated step over a copy of the batch's pool: (logits, pool after the step)."""
    ws = Workspace.allocate(CFG, sched.tiling, "cpu")
    pool = batch.kv_pool.clone()
    inp = StepInputs(batch.token_ids, batch.positions, batch.block_tables, pool)
    Emulator(CFG, weights, sched, ws, CounterBank(sched.n_counters), **kw).step(inp, strategy, seed)
    return ws["logits"][: batch.size].clone(), pool


def _torch_backend(weights, batch):
    """TorchDecodeBackend's verify step (every row's K/V, then causal attention) on a copy."""
    pool = batch.kv_pool.clone()
    logits = TorchDecodeBackend(ReferenceModel(CFG, weights)).decode(replace(batch, kv_pool=pool))
    return logits.float(), pool


@pytest.mark.parametrize("tiling", TILINGS, ids=list(TILINGS))
@pytest.mark.parametrize(("contexts", "rows"), CASES)
def test_verify_rows_match_the_torch_backend(weights, contexts, rows, tiling):
    batch = verify_batch(CFG, contexts, rows, seed=len(contexts))
    ref, ref_pool = _torch_backend(weights, batch)
    logits, pool = _emulate(weights, batch, _schedule(batch, TILINGS[tiling]))
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pool, ref_pool, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy", ["in_order", "reverse", "starve_low", "lifo_random"])
def test_verify_rows_under_every_interleaving(weights, strategy):
    batch = verify_batch(CFG, [61, 9], [5, 3], seed=7)
    ref, ref_pool = _torch_backend(weights, batch)
    logits, pool = _emulate(weights, batch, _schedule(batch, TILINGS["moe-head-by-head"]), strategy, seed=3)
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pool, ref_pool, rtol=1e-4, atol=1e-5)


def _attention_drains(sched: Schedule) -> list[int]:
    return [
        int(t[abi.MK_F_ID])
        for t in sched.tasks
        if t[abi.MK_F_OP] == abi.MK_OP_DRAIN and t[abi.MK_F_A0] == abi.MK_QUEUE_HOST and t[abi.MK_F_NWAIT] > 0
    ]


def test_verify_schedule_puts_every_attention_item_behind_the_layers_qkv():
    """Every layer's attention items are host-queue items whose drains wait for every QKV tile of
    the layer: the one QKV counter at its full per-step total, or with per-head counters a
    layer-wide counter that every QKV tile signals; a plain schedule's drains wait on nothing."""
    batch = verify_batch(CFG, [61], [6])
    for name, tiling in TILINGS.items():
        sched = _schedule(batch, tiling)
        cs = sched.counters
        drains = _attention_drains(sched)
        layers = {int(sched.tasks[i, abi.MK_F_LAYER]) for i in drains}
        assert layers == set(range(CFG.num_hidden_layers)), name
        claimed = set()  # the queue indices the attention drains claim: every ATTN item is there
        for qid in {int(sched.tasks[i, abi.MK_F_A1]) for i in drains}:
            first, length = (int(v) for v in sched.queue_info[qid][:2])
            claimed |= set(range(first, first + length))
        attn = {i for i, d in enumerate(sched.queue_desc) if d[abi.MK_F_OP] == abi.MK_OP_ATTN}
        assert attn and attn <= claimed, name
        for i in drains:
            d, layer = sched.tasks[i], int(sched.tasks[i, abi.MK_F_LAYER])
            waits = [(int(d[abi.MK_F_WAIT0 + 2 * j]), int(d[abi.MK_F_WAIT0 + 2 * j + 1])) for j in range(3)]
            waits = [w for w in waits if w[0] != abi.MK_NO_COUNTER]
            qkv = [t for t in sched.tasks if t[abi.MK_F_OP] == abi.MK_OP_QKV and t[abi.MK_F_LAYER] == layer]
            assert len(waits) == 1, name
            c, target = waits[0]
            assert cs.names[c] in (f"qkv[{layer}]", f"qkv_all[{layer}]"), name
            signals = [t for t in qkv if c in t[abi.MK_F_SIG0 : abi.MK_F_SIG0 + abi.MK_MAX_SIGNALS]]
            assert len(signals) == len(qkv) == target == cs.totals[c], name
        assert not _attention_drains(_schedule(batch, tiling, verify=False)), name


@pytest.mark.parametrize(("contexts", "rows"), [([20], [8]), ([61, 5], [4, 1])])
def test_plain_schedule_races_through_the_attention_prologue(weights, contexts, rows):
    """The plain schedule orders each ATTN item's reads after its kv head's QKV tiles (all rows'):
    with the prologue's loads checked after the waits it is exact. With the prologue as the kernel
    issues it (before the wait), a verify row loads an earlier row's slot unordered: a race."""
    batch = verify_batch(CFG, contexts, rows)
    sched = _schedule(batch, verify=False)
    ref, _ = _torch_backend(weights, batch)
    logits, _ = _emulate(weights, batch, sched, prologue_reads=False)
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(HazardError, match=r"race: ATTN.* reads \('kv'.* written by QKV"):
        _emulate(weights, batch, sched)


def test_plain_rows_have_no_prologue_hazard(weights):
    """One row per sequence: the prologue reads only earlier steps' K/V, so the plain schedule is
    clean (the prologue's hazard is specific to verify rows)."""
    batch = verify_batch(CFG, [5, 61, 130, 64], [1, 1, 1, 1])
    ref, _ = _torch_backend(weights, batch)
    logits, _ = _emulate(weights, batch, _schedule(batch, verify=False))
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tiling", TILINGS, ids=list(TILINGS))
def test_dropped_drain_waits_are_caught(weights, tiling):
    """The verify schedule with one layer's attention drains waiting on nothing: the race is back
    (in any interleaving: the checker works on happens-before, not on luck)."""
    batch = verify_batch(CFG, [61], [6])
    sched = _schedule(batch, TILINGS[tiling])
    layer = 2  # a sliding MoE layer
    for tid in _attention_drains(sched):
        if int(sched.tasks[tid, abi.MK_F_LAYER]) == layer:
            for slot in range(int(sched.tasks[tid, abi.MK_F_NWAIT])):
                sched = sched.without_wait(tid, slot)
    with pytest.raises(HazardError, match=rf"race: ATTN\(layer={layer},.* reads \('kv', {layer},"):
        _emulate(weights, batch, sched)


def test_qkv_tiles_without_the_layer_wide_signal_are_caught(weights):
    """With one counter per kv head, the drains wait for a layer-wide counter that every QKV tile
    signals too; a layer whose kv head 1 tiles do not signal it (their wait target lowered to
    match, so the step still completes) lets kv head 1's K/V be read unordered."""
    batch = verify_batch(CFG, [20], [8])
    sched = _schedule(batch, TILINGS["moe-head-by-head"])
    cs, layer = sched.counters, 1
    c_all = cs.index(f"qkv_all[{layer}]")
    tasks = sched.tasks.copy()
    dropped = 0
    for d in tasks:
        if (
            d[abi.MK_F_OP] == abi.MK_OP_QKV
            and d[abi.MK_F_LAYER] == layer
            and d[abi.MK_F_SIG0] == cs.index(f"qkv[{layer}][1]")
        ):
            assert d[abi.MK_F_SIG0 + 1] == c_all
            d[abi.MK_F_SIG0 + 1], d[abi.MK_F_NSIG] = abi.MK_NO_COUNTER, 1
            dropped += 1
    assert dropped == cs.targets[f"qkv[{layer}][1]"]
    for d in tasks:
        for j in range(abi.MK_MAX_WAITS):
            if d[abi.MK_F_WAIT0 + 2 * j] == c_all:
                d[abi.MK_F_WAIT0 + 2 * j + 1] -= dropped
    totals = list(cs.totals)
    totals[c_all] -= dropped
    broken = replace(sched, tasks=tasks, counters=replace(cs, totals=totals))
    with pytest.raises(HazardError, match=rf"race: ATTN\(layer={layer}, args=\d+,1,"):
        _emulate(weights, batch, broken)


def test_rows_with_a_gap_read_a_slot_never_written(weights):
    """Rows at L, L+2, ... over one table: the row at L+2 attends to L+1, a slot on a page this step
    writes that no row wrote: K/V from an earlier step where this step's belongs."""
    batch = verify_batch(CFG, [20], [3], gap=True)
    assert batch.positions.tolist() == [20, 22, 23]
    with pytest.raises(HazardError, match=r"reads \('kv', 0, \d+, 21\).* never written"):
        _emulate(weights, batch, _schedule(batch))


def _release_case(cfg, contexts, rows):
    """Block tables only (no pool: descriptors and regions alone)."""
    L, B = cfg.num_hidden_layers, sum(rows)
    P = max(pages_for(c + r) for c, r in zip(contexts, rows))
    tables = torch.full((L, B, P), NO_PAGE, dtype=torch.int32)
    r0, k, pos = 0, 0, []
    for c, r in zip(contexts, rows):
        for layer in range(L):
            lo_page = first_visible_position(c, cfg.window(layer)) // PAGE_SIZE
            for p in range(lo_page, pages_for(c + r)):
                tables[layer, r0 : r0 + r, p] = k
                k += 1
        pos += range(c, c + r)
        r0 += r
    return tables, pos


@pytest.mark.parametrize(
    ("contexts", "rows"),
    [
        ([8191], [8]),
        ([100, 200, 9000, 63], [1, 2, 4, 1]),
        ([70000], [8]),  # the long-context wide tiling (attention drains on the QKV SMs)
        ([4095, 20000], [2, 2]),
        ([9000], [2]),
    ],
)
def test_release_geometry_engine_tilings(contexts, rows):
    """The release geometry (4 kv heads: at 8 rows one QKV counter per head, more than a drain's
    waits, so one more layer-wide counter) on the engine's tiling for the batch and its context, as
    the backend picks it: the verify schedule is hazard-free over shared block tables, the plain one
    races (descriptors and regions only)."""
    cfg = north_mini_code_config(4)
    tables, pos = _release_case(cfg, contexts, rows)
    B, n_sms = len(pos), 132
    base = default_tiling(cfg)
    tiling = tiling_for_batch(cfg, base, B, split_bucket_position(pos, base))
    inp = StepInputs(torch.zeros(B, dtype=torch.long), torch.tensor(pos), tables, None)
    for verify in (True, False):
        sched = build_schedule(cfg, B, pos, n_sms, tiling, verify_rows=verify)
        ws = Workspace.allocate(cfg, tiling, "cpu", math=False)
        em = Emulator(cfg, None, sched, ws, CounterBank(sched.n_counters), math=False)
        if verify:
            em.step(inp, "random", 5)
            if tiling.qkv_by_head:
                assert any(n.startswith("qkv_all[") for n in sched.counters.names)
        else:
            with pytest.raises(HazardError, match="race: ATTN"):
                em.step(inp, "random", 5)


# ---- the backend -------------------------------------------------------------------------------
BE_TILING = Tiling(
    qkv_rows=32, o_rows=32, router_rows=4, mlp_splits=2, moe_down_rows=32, lm_rows=96, max_splits=4
)


class _EmulatedBackend(MegakernelBackend):
    """The backend over the fake extension (the emulator on the backend's own schedules and
    counters); the pool of each step registered for the fake."""

    def decode(self, batch):
        self.mod.registry[batch.kv_pool.data_ptr()] = batch.kv_pool
        return super().decode(batch)


def _backend(weights, verify_rows: bool) -> MegakernelBackend:
    fake = FakeNative()
    be = _EmulatedBackend(
        CFG, weights, tiling=BE_TILING, timeout_s=5.0, native_module=fake, verify_rows=verify_rows
    )
    fake.backend = be
    return be


@pytest.fixture(scope="module")
def bf16_weights():
    return random_weights(CFG, seed=1, std=0.1, dtype=torch.bfloat16)


def test_backend_refuses_verify_rows_without_its_flag(bf16_weights):
    be = _backend(bf16_weights, verify_rows=False)
    assert not be.verify_rows
    batch = verify_batch(CFG, [20], [3])
    batch = replace(batch, kv_pool=batch.kv_pool.to(torch.bfloat16))
    with pytest.raises(ValueError, match="without verify_rows"):
        be.decode(batch)


def test_backend_verify_rows_equal_single_steps(bf16_weights):
    """The engine-facing path: MegakernelBackend(verify_rows=True) runs a verify step on its verify
    schedule (cached apart from the plain one) and gives each row the logits of one-row steps."""
    from tests.backend.spec.verify_harness import verify_vs_single_rows

    be = _backend(bf16_weights, verify_rows=True)
    res = verify_vs_single_rows(ReferenceModel(CFG, bf16_weights), be, [61, 5], [5, 2], seed=2)
    assert len(res) == 7
    assert min(c for c, _, _ in res) > 0.9999 and all(a for _, a, _ in res)
    kinds = {p.sched.verify_rows for p in be._cache.values()}
    assert kinds == {True, False}
    assert np.all([p.sched.batch for p in be._cache.values() if p.sched.verify_rows] == [7])


def _engine(weights, be, speculative, pages: int = 48):
    from mkcode.backend.engine.engine import Engine, EngineOptions
    from mkcode.backend.kv.pool import KVPool

    pool = KVPool(
        pages,
        CFG.num_hidden_layers,
        CFG.num_key_value_heads,
        CFG.head_dim,
        device="cpu",
        dtype=torch.bfloat16,
    )
    return Engine(ReferenceModel(CFG, weights), pool, be, options=EngineOptions(speculative=speculative))


def _greedy_off_and_ngram(weights, prompts, max_tokens: int, pages: int = 48) -> dict[str, list[list[int]]]:
    """The prompts' greedy tokens through the emulated megakernel (verify_rows on) with speculation
    off and with n-gram drafts, each mode on an engine of its own (the ngram run must verify and
    accept drafts)."""
    from mkcode.backend.engine.request import GenerationRequest
    from mkcode.backend.sampling import SamplingParams

    out = {}
    for mode in ("off", "ngram"):
        engine = _engine(weights, _backend(weights, verify_rows=True), mode, pages=pages)
        assert engine.speculative == mode
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        streams = [engine.submit(GenerationRequest(list(p), sp)) for p in prompts]
        engine.run_until_idle()
        engine.check_accounting()
        out[mode] = [s.result(0).token_ids for s in streams]
        if mode == "ngram":
            assert engine.stats.spec_verify_steps > 0 and engine.stats.spec_accepted_tokens > 0
    return out


def test_engine_speculates_on_the_megakernel_only_with_its_flag(bf16_weights):
    """Without the flag the engine turns speculation off and says why; with it, greedy tokens through
    the emulated megakernel are those of the plain run, with verify steps that accepted drafts."""
    off = _engine(bf16_weights, _backend(bf16_weights, verify_rows=False), "ngram")
    assert off.speculative == "off" and "verify_rows=False" in off.spec_note
    motif = [7, 300, 41, 99, 5]
    prompts = [[motif[j % 5] for j in range(58)], [11, 12, 13] + motif * 3]
    out = _greedy_off_and_ngram(bf16_weights, prompts, max_tokens=12)
    assert out["off"] == out["ngram"]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3, 5])
def test_engine_speculative_equals_plain_as_on_the_gpu(bf16_weights, batch):
    """test_verify_rows_gpu.py's engine scenario (motif prompts, 96 greedy tokens, BS 1 / 3 / 5)
    through the emulated megakernel: the host logic, the verify schedules and the counters give the
    plain run's tokens exactly, so a difference on the GPU is the kernel's own (its rounding or a
    race the emulator does not model)."""
    import random

    rng, V = random.Random(batch), CFG.vocab_size
    prompts = []
    for i in range(batch):
        motif = [rng.randrange(3, V) for _ in range(rng.randrange(3, 9))]
        body = [motif[j % len(motif)] for j in range(rng.choice((40, 63, 130)))]
        prompts.append(body if i % 2 == 0 else [rng.randrange(3, V) for _ in range(70)] + body[:20])
    out = _greedy_off_and_ngram(bf16_weights, prompts, max_tokens=96, pages=400)
    assert out["off"] == out["ngram"]
