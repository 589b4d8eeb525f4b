"""Sampling with speculation: a seeded request draws the same tokens with speculation on and off
(one noise vector per emitted token, in the same order), and the sampled outputs follow the
target's exact distribution: a chi-square goodness-of-fit of the first three tokens (27 joint
outcomes under top-k 3) against probabilities computed from the reference model, for a run with
speculation and a run without (other seeds). Deterministic: fixed seeds throughout."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from mkcode.backend.engine.request import GenerationRequest
from mkcode.backend.sampling import SamplingParams, filter_logits
from mkcode.backend.spec.acceptance import accept_drafts
from tests.backend.engine.helpers import tiny_model
from tests.backend.spec.helpers import repetitive_prompt, run_checked, spec_engine

N = 600
LOGIT_SCALE = 8.0  # the tiny model's logits sharpened: sampled tokens follow its loops part of the time
SAMPLING = dict(temperature=1.5, top_k=3, top_p=1.0, max_tokens=3, ignore_eos=True)


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def chi_square_p(observed: list[int], expected: list[float]) -> float:
    """p-value of Pearson's chi-square goodness of fit (bins with expected count < 5 merged)."""
    obs, exp, o_rest, e_rest = [], [], 0, 0.0
    for o, e in zip(observed, expected):
        if e < 5:
            o_rest, e_rest = o_rest + o, e_rest + e
        else:
            obs.append(o)
            exp.append(e)
    if e_rest > 0:
        obs.append(o_rest)
        exp.append(e_rest)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    dof = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def _exact_joint(model, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """P(first three tokens) under temperature/top-k, from the reference model."""
    sp = SamplingParams(**SAMPLING)

    def probs(ctx: list[int]) -> torch.Tensor:
        logits = model.prefill(model.new_cache(len(ctx) + 1), ctx, chunk=1 << 20)
        return filter_logits(logits, sp.temperature, sp.top_k, sp.top_p).double()

    joint: dict[tuple[int, ...], float] = {}
    p0 = probs(prompt)
    for a in torch.nonzero(p0)[:, 0].tolist():
        p1 = probs([*prompt, a])
        for b in torch.nonzero(p1)[:, 0].tolist():
            p2 = probs([*prompt, a, b])
            for c in torch.nonzero(p2)[:, 0].tolist():
                joint[(a, b, c)] = float(p0[a] * p1[b] * p2[c])
    return joint


def _sample(model, speculative: str, prompt: list[int], seeds) -> tuple[list[tuple[int, ...]], object]:
    engine = spec_engine(model, speculative, max_running=128, num_pages=1200)
    streams = [
        engine.submit(GenerationRequest(list(prompt), SamplingParams(seed=s, **SAMPLING))) for s in seeds
    ]
    run_checked(engine)
    return [tuple(s.result(0).token_ids) for s in streams], engine.stats


@pytest.fixture(scope="module")
def looping_prompt():
    """A prompt that ends in the model's own greedy loop, so the drafter proposes from step one."""
    model = tiny_model(logit_scale=LOGIT_SCALE)
    p = repetitive_prompt(random.Random(3), 40)
    engine = spec_engine(model, "off")
    s = engine.submit(GenerationRequest(p, SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)))
    run_checked(engine)
    return (p + s.result(0).token_ids)[-90:]


def test_same_seed_same_tokens(looping_prompt):
    model = tiny_model(logit_scale=LOGIT_SCALE)
    for extra in (dict(temperature=0.7), dict(temperature=1.0, top_p=0.9), dict(temperature=1.2, top_k=5)):
        sp = SamplingParams(max_tokens=24, ignore_eos=True, **extra)
        out = {}
        for mode in ("off", "ngram"):
            engine = spec_engine(model, mode)
            streams = [
                engine.submit(
                    GenerationRequest(list(looping_prompt), SamplingParams(**{**sp.__dict__, "seed": s}))
                )
                for s in range(8)
            ]
            run_checked(engine)
            out[mode] = [x.result(0).token_ids for x in streams]
            if mode == "ngram":
                assert engine.stats.spec_accepted_tokens > 0, extra
        assert out["off"] == out["ngram"], extra


def test_sampled_distribution_matches_target_with_and_without_speculation(looping_prompt):
    model = tiny_model(logit_scale=LOGIT_SCALE)
    joint = _exact_joint(model, looping_prompt)
    keys = sorted(joint)
    assert abs(sum(joint.values()) - 1) < 1e-5 and len(keys) == 27
    on, st = _sample(model, "ngram", looping_prompt, range(N))
    off, _ = _sample(model, "off", looping_prompt, range(N, 2 * N))
    # the rule was exercised: drafts accepted and rejected
    assert st.spec_accepted_tokens > 50 and st.spec_draft_tokens - st.spec_accepted_tokens > 50
    for name, samples in (("speculative", on), ("plain", off)):
        counts = [samples.count(k) for k in keys]
        assert sum(counts) == N
        p = chi_square_p(counts, [N * joint[k] for k in keys])
        print(f"{name}: chi-square p = {p:.3f}")
        assert p > 1e-3, name


def test_chi_square_detects_a_biased_rule(looping_prompt):
    """The test above has power: 'always accept the draft' (no p(d) rule) is rejected by it."""
    model = tiny_model(logit_scale=LOGIT_SCALE)
    joint = _exact_joint(model, looping_prompt)
    keys = sorted(joint)

    def biased(drafts, token_of_row, emit):
        return accept_drafts(drafts, lambda i: drafts[i] if i < len(drafts) else token_of_row(i), emit)

    import mkcode.backend.engine.engine as engine_mod

    real = engine_mod.accept_drafts
    engine_mod.accept_drafts = biased
    try:
        samples, _ = _sample(model, "ngram", looping_prompt, range(N))
    finally:
        engine_mod.accept_drafts = real
    counts = [samples.count(k) for k in keys]
    assert chi_square_p(counts, [N * joint[k] for k in keys]) < 1e-6


def test_accept_drafts_rule():
    emitted = []

    def emit(i, t):
        emitted.append(t)
        return t == 99

    out = accept_drafts([5, 6, 7], lambda i: [5, 6, 8, 9][i], emit)
    assert (out.emitted, out.accepted, out.finished) == ([5, 6, 8], 2, False)
    out = accept_drafts([5, 6, 7], lambda i: [5, 6, 7, 9][i], emit)
    assert (out.emitted, out.accepted, out.finished) == ([5, 6, 7, 9], 3, False)  # the bonus token
    out = accept_drafts([5, 99, 7], lambda i: [5, 99, 7, 9][i], emit)
    assert (out.emitted, out.accepted, out.finished) == ([5, 99], 2, True)  # stopped inside the run
    drawn = []
    accept_drafts([], lambda i: drawn.append(i) or 3, emit)
    assert drawn == [0]
    assert list(itertools.chain(emitted)) == [5, 6, 8, 5, 6, 7, 9, 5, 99, 3]
