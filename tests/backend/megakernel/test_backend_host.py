"""`MegakernelBackend`'s host logic on the CPU, through a fake native extension.

The fake reads the parameter block the way the kernel does (pointers + ints + floats in ABI order;
per-step tensors read back from their addresses) and runs the step on the CPU emulator, with its
own persistent device counters. So the host's schedule caching, input normalisation, counter bases
across steps, parameter order, sampling block, watchdog and error reporting are all exercised
without a GPU."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest
import torch

from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.megakernel import abi, sampling
from mkcode.backend.megakernel.backend import (
    MegakernelBackend,
    MegakernelError,
    MegakernelTimeout,
    UnsupportedGeometry,
    check_geometry,
)
from mkcode.backend.megakernel.emulator import Emulator
from mkcode.backend.megakernel.emulator_ops import StepInputs
from mkcode.backend.megakernel.sampling import SamplingParams
from mkcode.backend.megakernel.tiling import Tiling
from mkcode.backend.megakernel.workspace import CounterBank
from mkcode.backend.model.weights import random_weights
from tests.backend.megakernel.cases import Fp32Weights, clone_batch, make_case, reference_step, tiny_config

CFG = tiny_config()
TILING = Tiling(
    qkv_rows=32, o_rows=32, router_rows=4, mlp_splits=2, moe_down_rows=32, lm_rows=96, max_splits=4
)


def _array(ptr: int, ctype, shape) -> np.ndarray:
    n = int(np.prod(shape))
    return np.ctypeslib.as_array((ctype * n).from_address(ptr)).reshape(shape)


class _Event:
    def __init__(self, fake):
        self.fake = fake

    def record(self):
        pass

    def query(self) -> bool:
        return self.fake.mode != "hang"


class FakeNative:
    """Stands in for mk_native: `device_info`, `launch`, and `make_event` for the watchdog."""

    def __init__(self, n_sms: int = 4):
        self.n_sms = n_sms
        self.mode = "emulate"  # | "hang" | "error"
        self.calls: list[dict] = []
        self.registry: dict[int, torch.Tensor] = {}  # tensors used in place (the KV pool)
        self.backend: MegakernelBackend | None = None

    def device_info(self):
        return {"sm_count": self.n_sms, "name": "fake"}

    def make_event(self):
        return _Event(self)

    def launch(self, ptrs, ints, floats, max_k, stream):
        assert len(ptrs) == len(abi.PARAM_PTRS) and len(ints) == len(abi.PARAM_INTS)
        assert len(floats) == len(abi.PARAM_FLOATS)
        P = dict(zip(abi.PARAM_PTRS, ptrs, strict=True))
        ints_d = dict(zip(abi.PARAM_INTS, ints, strict=True))
        floats_d = dict(zip(abi.PARAM_FLOATS, floats, strict=True))
        self.calls.append({"ptrs": P, "ints": ints_d, "floats": floats_d, "max_k": max_k})
        be = self.backend
        if self.mode == "error":  # the kernel's error block: code, block, task, counter, value, target
            err = _array(P["err"], ctypes.c_int32, (abi.MK_ERR_WORDS,))
            err[:6] = [abi.MK_ERR_TIMEOUT, 3, 123, 45, 7, 9]
            return
        if self.mode == "hang":
            return
        B, L, Pg = ints_d["batch"], ints_d["num_layers"], ints_d["max_pages"]
        tok = torch.from_numpy(_array(P["token_ids"], ctypes.c_int64, (B,)).copy())
        pos = torch.from_numpy(_array(P["positions"], ctypes.c_int64, (B,)).copy())
        bt = torch.from_numpy(_array(P["block_tables"], ctypes.c_int32, (L, B, Pg)).copy())
        sp = None
        if P["sample_params"]:
            sp = _array(P["sample_params"], ctypes.c_int32, (abi.MK_MAX_TOKENS, abi.MK_SP_WORDS)).copy()
        prep = next(p for p in be._cache.values() if p.desc.data_ptr() == P["desc"])
        cap = be.bank.capacity
        counters = _array(P["counters"], ctypes.c_uint32, (cap,))  # the "device" counters, in place
        bank = CounterBank(cap)
        bank.base[:] = _array(P["base"], ctypes.c_uint32, (cap,))
        bank.values[:] = counters
        inp = StepInputs(tok, pos, bt, self.registry[P["kv_pool"]], sp)
        Emulator(CFG, be.w, prep.sched, be.ws, bank).step(inp, "random", len(self.calls))
        counters[:] = bank.values


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=1, std=0.1, dtype=torch.bfloat16)


@pytest.fixture
def be(weights):
    fake = FakeNative()
    b = MegakernelBackend(CFG, weights, tiling=TILING, timeout_s=0.3, native_module=fake)
    fake.backend = b
    return b


def _case(contexts, seed):
    case = make_case(CFG, contexts, seed=seed, dtype=torch.bfloat16)
    return case.batch


def _check_logits(got, weights, ref_batch):
    ref = reference_step(CFG, Fp32Weights(weights), ref_batch)
    cos = torch.nn.functional.cosine_similarity(got.double(), ref.double(), dim=-1)
    assert float(cos.min()) > 0.9999, cos
    return ref


def test_steps_bases_parameters_and_schedule_cache(be, weights):
    fake = be.mod
    batch = _case([5, 70, 130], seed=3)
    fake.registry[batch.kv_pool.data_ptr()] = batch.kv_pool
    ref_batch = clone_batch(batch)
    for _step in range(3):  # consecutive steps: the host's bases must match the fake's counters
        logits = be.decode(batch)
        ref = _check_logits(logits, weights, ref_batch)
        assert be.greedy_tokens(3).tolist() == logits.argmax(-1).tolist()
        nxt = ref.argmax(-1)
        for b in (batch, ref_batch):
            b.token_ids = nxt.clone()
            b.positions = b.positions + 1
    assert len(be._cache) == 1, "same batch size and split bucket must reuse the schedule"
    assert len({c["ptrs"]["desc"] for c in fake.calls}) == 1
    c = fake.calls[-1]
    assert c["ints"]["batch"] == 3 and c["ints"]["vocab"] == CFG.vocab_size
    assert c["ints"]["num_layers"] == CFG.num_hidden_layers and c["ints"]["n_sms"] == 4
    assert c["ints"]["timeout_ms"] == 150  # the in-kernel watchdog fires at half the host's
    assert c["floats"]["rms_eps"] == pytest.approx(CFG.rms_norm_eps)
    assert c["ptrs"]["sample_params"] == 0 and c["ptrs"]["timeline"] == 0
    assert be.steps == 3


def test_launch_parameters_follow_their_inputs(be):
    """The launch lists are reused between steps (host time is GPU idle time), but every input that
    goes into them is part of the reuse key: new tensors, the timeline and the variant flag show up
    in the very next launch."""
    from mkcode.backend.megakernel import timeline

    fake = be.mod
    batch = _case([5, 70], seed=4)
    fake.registry[batch.kv_pool.data_ptr()] = batch.kv_pool
    be.decode(batch)
    be.decode(batch)
    first, second = fake.calls[-2], fake.calls[-1]
    assert first == second and second["ptrs"]["token_ids"] == batch.token_ids.data_ptr()
    batch.token_ids = batch.token_ids.clone()
    batch.block_tables = batch.block_tables.clone()
    be.decode(batch)
    c = fake.calls[-1]
    assert c["ptrs"]["token_ids"] == batch.token_ids.data_ptr()
    assert c["ptrs"]["block_tables"] == batch.block_tables.data_ptr()
    be.timeline = timeline.allocate(be.n_sms, 16, "cpu")
    be.decode(batch)
    c = fake.calls[-1]
    assert c["ptrs"]["timeline"] == be.timeline.data_ptr() and c["ints"]["timeline_cap"] == 16
    be.timeline = None
    be.prefetch_mode = abi.MK_MODE_TWICE
    be.decode(batch)
    c = fake.calls[-1]
    assert c["ptrs"]["timeline"] == 0 and c["ints"]["timeline_cap"] == 0
    assert c["ints"]["prefetch_mode"] == abi.MK_MODE_TWICE


def test_inputs_are_normalised(be, weights):
    batch = _case([9, 64], seed=5)
    be.mod.registry[batch.kv_pool.data_ptr()] = batch.kv_pool
    ref_batch = clone_batch(batch)
    odd = DecodeBatch(
        token_ids=batch.token_ids.to(torch.int32),
        positions=batch.positions.to(torch.int32),
        block_tables=batch.block_tables.to(torch.int64),
        kv_pool=batch.kv_pool,
    )
    _check_logits(be.decode(odd), weights, ref_batch)
    with pytest.raises(ValueError, match=r"1\.\.8"):
        be.decode(_case([1] * 9, seed=1))
    bad = clone_batch(batch)
    bad.kv_pool = bad.kv_pool.float()
    with pytest.raises(ValueError, match="kv_pool"):
        be.decode(bad)


def test_schedule_cache_is_bounded_and_keyed_by_batch(be):
    be.max_cached_schedules = 2
    for B in (1, 2, 3):
        be._prepare([10] * B)
    assert [k[0] for k in be._cache] == [2, 3]
    assert be.prewarm([2, 3], 10) == 0  # already there
    be._prepare([10, 10])
    assert len(be._cache) == 2


def test_sample_uses_the_row_params(be):
    batch = _case([5, 70, 130], seed=8)
    be.mod.registry[batch.kv_pool.data_ptr()] = batch.kv_pool
    params = [
        SamplingParams(temperature=0.8, top_k=10, seed=5, step=2),
        SamplingParams(),
        SamplingParams(temperature=1.5, top_p=0.8, seed=6, step=2),
    ]
    toks = be.sample(batch, params).tolist()
    assert be.mod.calls[-1]["ptrs"]["sample_params"] == be.sample_params.data_ptr()
    logits = be.last_logits(3).numpy()
    for b in range(3):
        assert toks[b] == int(sampling.sample_row(logits[b], params[b])[0])
    be.mod.mode = "hang"  # sampling state must not leak into the next step after an exception
    with pytest.raises(MegakernelTimeout):
        be.sample(batch, params)
    be.mod.mode = "error"
    with pytest.raises(MegakernelError):
        be.decode(batch)
    assert be.mod.calls[-1]["ptrs"]["sample_params"] == 0
    with pytest.raises(ValueError, match="sampling params"):
        be.sample(batch, params[:2])


def test_watchdog_raises_instead_of_hanging_and_the_next_step_works(be, weights):
    batch = _case([3, 80], seed=2)
    be.mod.registry[batch.kv_pool.data_ptr()] = batch.kv_pool
    be.decode(batch)  # counters and bases are mid-stream now
    be.mod.mode = "hang"
    t0 = time.monotonic()
    with pytest.raises(MegakernelTimeout, match="did not finish"):
        be.decode(batch)
    assert time.monotonic() - t0 < 0.3 + 1.0
    be.mod.mode = "emulate"
    ref_batch = clone_batch(batch)
    _check_logits(be.decode(batch), weights, ref_batch)  # bases and counters agree again


def test_kernel_error_names_the_task_and_counter_and_resets(be):
    batch = _case([3], seed=2)
    be.mod.mode = "error"
    be.counters.fill_(5)
    with pytest.raises(
        MegakernelError, match=r"MK_ERR_TIMEOUT: block 3, task 123, counter 45 value 7 target 9"
    ):
        be.decode(batch)
    assert int(be.err.abs().sum()) == 0, "error word cleared for the next step"
    assert int(be.counters.abs().sum()) == 0 and int(be.bank.base.sum()) == 0, "counters restart from zero"


def test_prefetch_variant_flag_defaults_to_the_measured_path(weights, monkeypatch):
    fake = FakeNative()
    assert (
        MegakernelBackend(CFG, weights, tiling=TILING, native_module=fake).prefetch_mode
        == abi.MK_PREFETCH_DEFAULT
        == 0
    )
    monkeypatch.setenv("MKCODE_MK_PREFETCH", str(abi.MK_MODE_TWICE))
    be = MegakernelBackend(CFG, weights, tiling=TILING, native_module=fake)
    assert be.prefetch_mode == abi.MK_MODE_TWICE


def test_removed_prefetch_bits_are_refused(weights, monkeypatch):
    """A bit that is no MK_MODE_* of mk_abi.h (128 was MK_MODE_TOKEN_ROWS, removed in ABI 28) is an
    error, at construction (MKCODE_MK_PREFETCH) and at the next step (set on the backend), not the
    default path run silently."""
    fake = FakeNative()
    monkeypatch.setenv("MKCODE_MK_PREFETCH", str(128 | abi.MK_MODE_TWICE))
    with pytest.raises(ValueError, match="0x80 are no MK_MODE"):
        MegakernelBackend(CFG, weights, tiling=TILING, native_module=fake)
    monkeypatch.delenv("MKCODE_MK_PREFETCH")
    be = MegakernelBackend(CFG, weights, tiling=TILING, native_module=fake)
    fake.backend = be
    batch = _case([9, 64], seed=5)
    fake.registry[batch.kv_pool.data_ptr()] = batch.kv_pool
    be.decode(batch)
    be.prefetch_mode = 1  # an L2-prefetch bit removed long ago
    with pytest.raises(ValueError, match="no MK_MODE"):
        be.decode(batch)


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"head_dim": 48}, "head_dim 48"),
        ({"head_dim": 256}, "head_dim 256"),
        ({"num_attention_heads": 32, "num_key_value_heads": 2}, "32 query heads over 2 kv heads"),
    ],
    ids=["d48", "d256", "gqa16"],
)
def test_attention_geometries_the_kernel_does_not_run_are_refused(over, why):
    """The kernel's only attention is the tensor-core one (at most 8 query heads per kv head, head_dim
    32, 64 or 128): any other geometry is refused when the backend is built, before any weight, buffer
    or extension is touched (the weights here are not even looked at)."""
    cfg = tiny_config(**over)
    with pytest.raises(UnsupportedGeometry, match=why):
        MegakernelBackend(cfg, None, native_module=FakeNative())


@pytest.mark.parametrize(
    "over",
    [{"head_dim": 64}, {"head_dim": 128}, {"num_attention_heads": 16, "num_key_value_heads": 2}],
    ids=["d64", "d128", "gqa8"],
)
def test_attention_geometries_the_kernel_runs_are_accepted(over):
    """The refusal's edges: head_dim 64 and 128, 8 query heads per kv head build a backend."""
    cfg = tiny_config(**over)
    MegakernelBackend(cfg, random_weights(cfg, seed=1, dtype=torch.bfloat16), native_module=FakeNative())


# configs the norm inside the GEMVs does not run (tiling.norm_geometry_problem), one per limit, each
# with the message that names it; mk_abi.h MK_NORM_MAX_HIDDEN is the hidden size's
NORM_REFUSALS = [
    (
        {"hidden_size": abi.MK_NORM_MAX_HIDDEN + 32},
        f"hidden_size {abi.MK_NORM_MAX_HIDDEN + 32} is above MK_NORM_MAX_HIDDEN = {abi.MK_NORM_MAX_HIDDEN}",
    ),
    (
        {"mlp_layer_types": ["dense", "sparse", "dense", "sparse", "sparse", "dense"]},
        r"dense MLP layers \[2, 5\] after layer 0: only layer 0's sum has an initialiser",
    ),
    # 16 of 384 experts per router tile: 64 * 16 / 384 columns each, not whole
    ({"num_experts": 384}, "router tiles of 16 of 384 experts copy 2.66667 of the 64 residual columns"),
    # 16 of 256 experts over 32 columns: 2 whole columns each, half a float4
    (
        {"num_experts": 256, "hidden_size": 32},
        "router tiles of 16 of 256 experts copy 2 of the 32 residual columns each, not a whole number "
        "of float4s",
    ),
]


@pytest.mark.parametrize(
    ("over", "why"), NORM_REFUSALS, ids=["hidden", "dense-late", "router-frac", "router-odd"]
)
def test_norm_geometries_the_kernel_does_not_run_are_refused(over, why):
    """The kernel's only norm is the one inside the GEMVs: a hidden size above MK_NORM_MAX_HIDDEN
    (its staging's sweeps), a dense layer after layer 0 (no initialiser for its sum) and router tiles
    whose share of the residual is not whole float4 columns are refused when the backend is built,
    as the attention's limits are (before any weight, buffer or extension is touched), and a tiling
    with such router tiles by Tiling.validate."""
    from mkcode.backend.megakernel.tiling import TilingError, default_tiling

    cfg = tiny_config(**over)
    with pytest.raises(UnsupportedGeometry, match=why):
        MegakernelBackend(cfg, None, native_module=FakeNative())
    with pytest.raises(UnsupportedGeometry, match=why):
        check_geometry(cfg)
    with pytest.raises(TilingError, match=why):
        default_tiling(cfg).validate(cfg)


def test_norm_geometry_edges_are_accepted():
    """The refusal's edges: hidden size MK_NORM_MAX_HIDDEN, a dense layer 0 alone (tiny_config's),
    router tiles of 4 columns (16 of 256 experts over 64)."""
    for over in ({"hidden_size": abi.MK_NORM_MAX_HIDDEN}, {}, {"num_experts": 256}):
        check_geometry(tiny_config(**over))
    cfg = tiny_config(num_experts=256)
    MegakernelBackend(cfg, random_weights(cfg, seed=1, dtype=torch.bfloat16), native_module=FakeNative())


def test_small_batches_cap_attention_splits_but_keep_the_buffer_stride(weights):
    """The engine's tiling (tiling_for_batch) caps a small batch's attention splits at
    SMALL_MAX_SPLITS; the split policy must use it, while the kernel's max_splits stays the
    workspace's o_part / lse_part stride (the buffers are allocated for the base tiling)."""
    from mkcode.backend.megakernel.tiling import SMALL_MAX_SPLITS, default_tiling

    fake = FakeNative(n_sms=132)
    be = MegakernelBackend(CFG, weights, timeout_s=0.3, native_module=fake)  # auto tiling
    base = default_tiling(CFG).max_splits
    assert base > SMALL_MAX_SPLITS
    case = make_case(
        CFG, [4000], seed=2, dtype=torch.bfloat16
    )  # 63 full-layer pages on 132 SMs: 32 splits uncapped
    prep = be._prepare(case.batch.positions.tolist())
    (B, _, full, sliding) = next(iter(be._cache))
    assert B == 1 and max(full) == SMALL_MAX_SPLITS and max(sliding) <= SMALL_MAX_SPLITS
    assert prep.sched.tiling.max_splits == SMALL_MAX_SPLITS
    ints = dict(zip(abi.PARAM_INTS, be._params(prep, case.batch)[1], strict=True))
    assert ints["max_splits"] == base == be.ws["o_part"].shape[3]


def test_wide_batches_take_the_phased_tiling_below_the_long_context_bucket(weights):
    """From WIDE_LONG_FROM_BATCH rows the engine's tiling depends on the split bucket: below
    WIDE_PHASED_BELOW_POSITION the phased one (attention on every SM, at most WIDE_MAX_SPLITS
    splits), from it the wide tiling (attention drains on the QKV SMs, splits for one wave); fewer rows
    (from WIDE_MOE_FROM_BATCH) keep the phased one at every context. The two schedules are cached
    apart even where they plan the same splits."""
    from mkcode.backend.megakernel.tiling import (
        WIDE_LONG_FROM_BATCH,
        WIDE_MAX_SPLITS,
        WIDE_MOE_FROM_BATCH,
        WIDE_PHASED_BELOW_POSITION,
        tiling_for_batch,
    )

    fake = FakeNative(n_sms=132)
    be = MegakernelBackend(CFG, weights, timeout_s=0.3, native_module=fake)  # auto tiling
    B = WIDE_LONG_FROM_BATCH
    short = be._prepare([100] * B).sched.tiling
    long = be._prepare([WIDE_PHASED_BELOW_POSITION] * B).sched.tiling  # bucket 2 x the threshold - 1
    assert (short.attn_with_qkv, short.max_splits) == (0, min(be.tiling.max_splits, WIDE_MAX_SPLITS))
    assert (long.attn_with_qkv, long.max_splits, long.split_tokens) == (1, be.tiling.max_splits, 0)
    assert long == tiling_for_batch(CFG, be.tiling, B, 2 * WIDE_PHASED_BELOW_POSITION - 1)
    assert short == tiling_for_batch(CFG, be.tiling, B) == tiling_for_batch(CFG, be.tiling, B, 1023)
    assert short == tiling_for_batch(CFG, be.tiling, B, WIDE_PHASED_BELOW_POSITION - 1)
    assert len(be._cache) == 2 and {k[1] for k in be._cache} == {short, long}
    for rows in range(WIDE_MOE_FROM_BATCH, WIDE_LONG_FROM_BATCH):  # below 8 rows: phased at any context
        assert tiling_for_batch(CFG, be.tiling, rows, 1 << 20).attn_with_qkv == 0
    one = tiling_for_batch(CFG, be.tiling, 1, 1 << 20)  # below WIDE_MOE_FROM_BATCH: no context rule
    assert one == tiling_for_batch(CFG, be.tiling, 1)


def test_the_workspace_holds_a_tilings_long_context_splits(weights):
    """A tiling whose split cap rises with the context (split_tokens) sizes its workspace and the
    kernel's split stride by split_cap (Tiling.most_splits); a schedule whose splits would not fit
    the workspace is refused before anything is written past o_part / lse_part."""
    from dataclasses import replace

    from mkcode.backend.megakernel.tiling import TilingError

    fake = FakeNative(n_sms=132)
    t = replace(TILING, split_tokens=64, split_cap=12)
    assert t.most_splits() == 12 and TILING.most_splits() == TILING.max_splits == 4
    be = MegakernelBackend(CFG, weights, tiling=t, timeout_s=0.3, native_module=fake)
    assert be.ws["o_part"].shape[3] == be.ws["lse_part"].shape[3] == 12
    case = make_case(CFG, [700], seed=2, dtype=torch.bfloat16)
    prep = be._prepare(case.batch.positions.tolist())
    assert max(prep.sched.splits[False]) > t.max_splits  # the long-context cap is in use
    ints = dict(zip(abi.PARAM_INTS, be._params(prep, case.batch)[1], strict=True))
    assert ints["max_splits"] == 12
    be.ws.tiling = replace(t, split_tokens=0)  # a workspace sized for 4 splits: the same step is refused
    be._cache.clear()
    be._split_keys.clear()
    with pytest.raises(TilingError, match="workspace holds 4"):
        be._prepare(case.batch.positions.tolist())


def test_asynchronous_decode_defers_the_watchdog_and_errors_to_wait_step(weights):
    """asynchronous=True: decode() returns once the step is enqueued (like the graph backend); the
    host watchdog and the kernel's error word are checked by wait_step(), which a second call makes
    a no-op; steps queued before it are covered by it (the device error word persists)."""
    fake = FakeNative()
    be = MegakernelBackend(CFG, weights, tiling=TILING, timeout_s=0.3, native_module=fake, asynchronous=True)
    fake.backend = be
    batch = _case([5, 70], seed=6)
    fake.registry[batch.kv_pool.data_ptr()] = batch.kv_pool
    ref_batch = clone_batch(batch)
    logits = be.decode(batch)
    assert be._armed is not None
    be.wait_step()
    assert be._armed is None
    be.wait_step()  # nothing pending
    _check_logits(logits, weights, ref_batch)
    fake.mode = "error"
    be.decode(batch)  # no exception yet: the step is only enqueued
    fake.mode = "emulate"
    with pytest.raises(MegakernelError, match="MK_ERR_TIMEOUT: block 3"):
        be.wait_step()
    assert int(be.err.abs().sum()) == 0
    fake.mode = "hang"
    be.decode(batch)
    with pytest.raises(MegakernelTimeout, match="did not finish"):
        be.wait_step()
    fake.mode = "emulate"
    ref_batch = clone_batch(batch)
    logits = be.decode(batch)
    be.wait_step()
    _check_logits(logits, weights, ref_batch)  # bases and counters agree again


def test_positions_are_read_again_only_when_they_changed(be, monkeypatch):
    """_host_positions reuses its last read for the same tensor object at the same version (a device
    read would wait for the queued steps); an in-place change or another tensor is read again."""
    calls = []
    real = torch.Tensor.tolist

    def counting(t):
        calls.append(t.data_ptr())
        return real(t)

    pos = torch.tensor([5, 70])
    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    assert be._host_positions(pos) == [5, 70] and len(calls) == 1
    assert be._host_positions(pos) == [5, 70] and len(calls) == 1
    pos += 1
    assert be._host_positions(pos) == [6, 71] and len(calls) == 2
    pos[0] = 9
    assert be._host_positions(pos) == [9, 71] and len(calls) == 3
    other = pos.clone()
    assert be._host_positions(other) == [9, 71] and len(calls) == 4


def test_grouped_one_row_tilings_run_through_the_backend(weights):
    """Tiling.moe_group and attn_group through MegakernelBackend (the fake extension runs the
    emulator on the backend's own schedule, workspace and counters): the splits follow attn_group,
    the descriptors carry the group rows, and consecutive steps match the reference; on too few SMs
    the explicit tiling is refused, not silently replaced."""
    from dataclasses import replace

    tiling = replace(
        TILING,
        moe_up_cols=32,
        moe_fused=1,
        moe_local=1,
        moe_group=2,
        ctrl_sms=2,
        combine_ctrl=1,
        attn_group=4,
    )
    fake = FakeNative(n_sms=16)
    be = MegakernelBackend(CFG, weights, tiling=tiling, timeout_s=0.3, native_module=fake)
    fake.backend = be
    batch = _case([70], seed=5)
    fake.registry[batch.kv_pool.data_ptr()] = batch.kv_pool
    ref_batch = clone_batch(batch)
    for _ in range(2):
        got = be.decode(batch)
        ref = _check_logits(got, weights, ref_batch)
        for b in (batch, ref_batch):
            b.token_ids = ref.argmax(-1)
            b.positions = b.positions + 1
    prep = be._prepare(batch.positions.tolist())
    assert prep.sched.splits == {False: [4], True: [4]}
    rows = {int(t[abi.MK_F_LROW]) for t in prep.sched.tasks if int(t[abi.MK_F_OP]) == abi.MK_OP_ROUTER}
    assert rows == {0, 1}
    with pytest.raises(ValueError, match="SMs free"):
        MegakernelBackend(CFG, weights, tiling=tiling, native_module=FakeNative(n_sms=12)).decode(
            _case([70], 5)
        )
