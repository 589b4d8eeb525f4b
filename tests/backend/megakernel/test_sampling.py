"""Device sampling semantics (SAMPLE_ROW) on the CPU: the ABI block, the counter-based hash, the
filtered distribution the sampler draws from (chi-square over many seeds), greedy limits, and the
emulator's op inside a whole step (batch-composition independence)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mkcode.backend.megakernel import abi, sampling
from mkcode.backend.megakernel.emulator import Emulator
from mkcode.backend.megakernel.emulator_ops import StepInputs
from mkcode.backend.megakernel.sampling import SamplingParams, filtered_probs, sample_row
from mkcode.backend.megakernel.schedule import build_schedule
from mkcode.backend.megakernel.tiling import Tiling
from mkcode.backend.megakernel.workspace import CounterBank, Workspace
from mkcode.backend.model.weights import random_weights
from tests.backend.megakernel.cases import clone_batch, make_case, tiny_config


def test_abi_sampling_block():
    fields = {k: v for k, v in abi.load().enums["MkSampleField"].items()}
    assert sorted(fields.values()) == list(range(len(fields)))
    assert max(fields.values()) < abi.MK_SP_WORDS
    assert "sample_params" in abi.PARAM_PTRS
    assert abi.OPCODES["SAMPLE_ROW"] < abi.MK_OP_COUNT
    p = SamplingParams(temperature=0.7, top_k=40, top_p=0.9, seed=(7 << 32) | 0xDEADBEEF, step=12345)
    words = sampling.pack([SamplingParams(), p])
    assert words.shape == (abi.MK_MAX_TOKENS, abi.MK_SP_WORDS) and words.dtype == np.int32
    q = sampling.unpack(words[1])
    assert (q.top_k, q.seed, q.step) == (40, p.seed, 12345)
    assert q.temperature == pytest.approx(0.7) and q.top_p == pytest.approx(0.9)
    assert sampling.unpack(words[0]).greedy


def _mix32_py(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_hash_wraps_like_uint32_and_keys_preserve_order():
    xs = np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 123456789], dtype=np.uint32)
    assert sampling.mix32(xs).tolist() == [_mix32_py(int(x)) for x in xs]
    seed, step = (5 << 32) | 17, 99
    k = _mix32_py(_mix32_py(_mix32_py(17 ^ sampling.SEED_SALT) ^ 5) + step)
    assert int(sampling.row_key(seed, step)[0]) == k
    vals = np.array([-np.inf, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, 7.25, np.inf], dtype=np.float32)
    kk = sampling.keys(vals).astype(np.int64)
    assert (np.diff(kk) >= 0).all()
    g = sampling.gumbel(sampling.row_key(np.arange(2000), 0), np.arange(50))
    assert np.isfinite(g).all() and abs(float(g.mean()) - 0.5772) < 0.02  # Euler-Mascheroni


CASES = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.6, top_k=8),
    SamplingParams(temperature=1.4, top_p=0.8),
    SamplingParams(temperature=0.9, top_k=20, top_p=0.7),
    SamplingParams(temperature=2.0, top_k=3, top_p=0.999),
]


@pytest.mark.parametrize("p", CASES, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_draws_follow_the_filtered_distribution(p):
    rng = np.random.default_rng(4)
    V, S = 48, 24000
    logits = (rng.standard_normal(V) * 1.5).astype(np.float32)
    probs = filtered_probs(logits, p)
    mask = sampling.kept_mask(logits, p)
    assert np.array_equal(mask, probs > 0), "key-based filter differs from the sort-based one"
    toks = sample_row(logits, p, seeds=np.arange(S, dtype=np.uint64) * 7919 + 3, steps=11)
    counts = np.bincount(toks, minlength=V)
    assert counts[probs == 0].sum() == 0, "drew a token outside the filtered set"
    keep = probs > 0
    exp = probs[keep] * S
    chi2 = float((((counts[keep] - exp) ** 2) / exp).sum())
    df = int(keep.sum()) - 1
    if df == 0:
        return
    # about the 99.9th percentile of chi-square(df) (Wilson-Hilferty)
    z = 3.09
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < crit, f"chi2 {chi2:.1f} over {df} dof (critical {crit:.1f})"


def test_greedy_limits_and_determinism():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(300).astype(np.float32)
    logits[[17, 250]] = logits.max() + 1  # a tie: greedy takes the first
    for p in (
        SamplingParams(temperature=0.0, top_k=50, seed=3),
        SamplingParams(temperature=1.0, top_k=1, seed=3),
        SamplingParams(temperature=1.0, top_p=0.0, seed=3),
    ):
        assert p.greedy
        assert sample_row(logits, p, seeds=np.arange(20)).tolist() == [17] * 20
    p = SamplingParams(temperature=1.0, top_k=30, top_p=0.9, seed=42, step=7)
    a, b = sample_row(logits, p), sample_row(logits, p)
    assert a.tolist() == b.tolist()
    many = sample_row(logits, p, seeds=np.full(64, 42), steps=np.arange(64))
    assert len(set(many.tolist())) > 1  # the step changes the draw


def test_top_k_keeps_ties_at_the_boundary():
    logits = np.array([3.0, 2.0, 2.0, 1.0, 0.5], dtype=np.float32)
    p = SamplingParams(temperature=1.0, top_k=2)
    assert sampling.kept_mask(logits, p).tolist() == [True, True, True, False, False]


def test_emulator_step_samples_each_row_independently_of_the_batch():
    cfg = tiny_config()
    w = random_weights(cfg, seed=1, std=0.1)
    tiling = Tiling(
        qkv_rows=32, o_rows=32, router_rows=4, mlp_splits=2, moe_down_rows=32, lm_rows=96, max_splits=4
    )
    contexts = [5, 70, 130]
    case = make_case(cfg, contexts, seed=21)
    params = [
        SamplingParams(temperature=0.8, top_k=10, seed=1, step=4),
        SamplingParams(),  # greedy
        SamplingParams(temperature=1.2, top_p=0.9, seed=99, step=4),
    ]
    sched = build_schedule(cfg, 3, contexts, 4, tiling)
    assert sched.summary()["SAMPLE_ROW"] == 3
    ws = Workspace.allocate(cfg, tiling, "cpu")
    batch = clone_batch(case.batch)
    inp = StepInputs(
        batch.token_ids,
        batch.positions,
        batch.block_tables,
        batch.kv_pool,
        torch.from_numpy(sampling.pack(params)),
    )
    Emulator(cfg, w, sched, ws, CounterBank(sched.n_counters)).step(inp, "random", 3)
    logits = ws["logits"][:3].numpy()
    toks = ws["tokens_out"][:3].tolist()
    assert toks[1] == int(np.argmax(logits[1]))
    for b in (0, 2):
        assert toks[b] == int(sample_row(logits[b], params[b])[0])
        assert sampling.kept_mask(logits[b], params[b])[toks[b]]
    # the same row alone (batch of one, other seeds elsewhere) draws the same token from its logits
    assert int(sample_row(logits[2].copy(), params[2])[0]) == toks[2]


def _kernel_radix_select(k: np.ndarray, w: np.ndarray, floor: int, target: float) -> int:
    """A line-by-line model of the kernel's select_key (csrc/mk_kernel.cuh): four 8-bit passes,
    32 lanes owning 8 bins each from the top, a ballot for the first lane reaching the target, the
    lowest non-empty bin when rounding leaves none. fp32 sums, as on the device."""
    prefix = 0
    target = np.float32(target)
    for shift in (24, 16, 8, 0):
        hmask = 0 if shift == 24 else (0xFFFFFFFF << (shift + 8)) & 0xFFFFFFFF
        sel = (k >= floor) & ((k & np.uint32(hmask)) == np.uint32(prefix))
        tot = np.zeros(256, np.float32)
        np.add.at(
            tot, ((k[sel] >> np.uint32(shift)) & np.uint32(255)).astype(np.int64), w[sel].astype(np.float32)
        )
        part = np.array([np.float32(sum(tot[255 - 8 * lane - q] for q in range(8))) for lane in range(32)])
        incl = np.cumsum(part, dtype=np.float32)
        excl = incl - part
        hit = np.flatnonzero(incl >= target)
        nonempty = np.flatnonzero(part > 0)
        lane = int(hit[0]) if len(hit) else (int(nonempty[-1]) if len(nonempty) else 0)
        c, chosen, above, last, above_last = excl[lane], -1, excl[lane], -1, excl[lane]
        for q in range(8):
            j = 255 - 8 * lane - q
            if len(hit) and chosen < 0 and c + tot[j] >= target:
                chosen, above = j, c
            if tot[j] > 0:
                last, above_last = j, c
            c = np.float32(c + tot[j])
        if chosen < 0:
            chosen, above = (last if last >= 0 else 255 - 8 * lane - 7), above_last
        prefix |= chosen << shift
        target = np.float32(target - above)
    return prefix


@pytest.mark.parametrize("seed", range(6))
def test_kernel_radix_select_model_matches_the_definition(seed):
    rng = np.random.default_rng(seed)
    V = 3000
    lg = (rng.standard_normal(V) * 3).astype(np.float32)
    lg[rng.integers(0, V, 200)] = lg[rng.integers(0, V, 200)]  # ties
    lg = np.round(lg, 1 + seed % 3).astype(np.float32)  # more ties
    k = sampling.keys(lg)
    ones = np.ones(V, np.float32)
    for top_k in (2, 17, 500, V - 1):
        assert _kernel_radix_select(k, ones, 0, float(top_k)) == sampling.select_key(k, ones, float(top_k))
    kth = sampling.select_key(k, ones, 700.0)
    inside = k >= kth
    for T in (0.5, 1.0, 2.0):
        w = np.where(inside, np.exp((lg - lg.max()) / np.float32(T)), 0).astype(np.float32)
        Z = float(w.astype(np.float64).sum())
        for top_p in (0.1, 0.5, 0.9, 0.99):
            want = sampling.select_key(k[inside], w[inside], float(np.float32(top_p)) * Z)
            got = _kernel_radix_select(k, w, kth, float(np.float32(top_p)) * Z)
            if got != want:  # only a rounding boundary may differ: the tails on both sides ~ target
                lo, hi = sorted((got, want))
                between = w[(k >= lo) & (k < hi)].sum()
                assert between <= 1e-5 * Z, (top_p, T, got, want)
