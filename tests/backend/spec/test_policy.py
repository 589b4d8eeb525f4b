"""The cost policy: drafts are verified only where their expected tokens outweigh what their rows
add to the step; a bucketed cost makes rows up to the bucket's end free; the engine follows it and
verifies a declined sequence's draft now and then; outputs stay those of a plain run."""

from __future__ import annotations

import random

import torch

from mkcode.backend.engine.request import GenerationRequest
from mkcode.backend.sampling import SamplingParams
from mkcode.backend.spec.drafter import AdaptiveK
from mkcode.backend.spec.policy import choose_draft_counts
from tests.backend.engine.helpers import tiny_model
from tests.backend.spec.helpers import random_prompt, repetitive_prompt, run_checked, spec_engine


def linear(per_row: float):
    return lambda rows: 1.0 + per_row * (rows - 1)


def test_free_rows_take_every_draft_and_costly_rows_none():
    assert choose_draft_counts([0.5], [7], lambda rows: 1.0, 32) == [7]
    assert choose_draft_counts([0.9], [7], linear(10.0), 32) == [0]
    assert choose_draft_counts([0.0], [7], linear(0.01), 32) == [0]


def test_expected_tokens_per_time_decides():
    # a = 0.9, each row +50 %: E(k)/cost(k): k=0 1.0, k=1 1.9/1.5=1.27, k=2 2.71/2=1.36, k=3 3.44/2.5=1.38,
    # k=4 4.10/3=1.37 -> 3
    assert choose_draft_counts([0.9], [7], linear(0.5), 32) == [3]
    # two sequences: the likelier drafts first
    assert choose_draft_counts([0.9, 0.3], [7, 7], linear(0.05), 32) == [7, 1]


def test_bucketed_cost_fills_the_bucket():
    buckets = {1: 1.0, 2: 1.2, 4: 1.8, 8: 2.5}

    def cost(rows):
        return buckets[next(b for b in buckets if rows <= b)]

    # a = 0.8: k=1 1.8/1.2=1.5, k=3 2.95/1.8=1.64, k=7 4.16/2.5=1.66 -> 7
    assert choose_draft_counts([0.8], [7], cost, 32) == [7]
    assert choose_draft_counts([0.5], [7], cost, 32) == [1]  # 1.5/1.2 beats 1.875/1.8 and 1.99/2.5
    assert choose_draft_counts([0.9], [7], cost, 4) == [3]  # the row limit


def test_alpha_estimate():
    a = AdaptiveK(7)
    assert abs(a.alpha - 0.8) < 1e-9
    for _ in range(20):
        a.update(4, 0)
    assert a.alpha < 0.01
    for _ in range(20):
        a.update(4, 4)
    assert a.alpha > 0.99


def test_engine_follows_the_cost_and_probes():
    torch.set_num_threads(1)
    model = tiny_model()
    rng = random.Random(8)
    prompts = [repetitive_prompt(rng, 40), random_prompt(rng, 50)]
    sp = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    plain = spec_engine(model, "off")
    ref = [plain.submit(GenerationRequest(p, sp)) for p in prompts]
    run_checked(plain)
    ref = [r.result(0).token_ids for r in ref]
    for cost, check in (
        (linear(100.0), "probes"),  # drafts never pay: only the every-8th probe verifies one
        (lambda rows: 1.0, "all"),
    ):
        engine = spec_engine(model, "ngram")
        engine._row_cost = cost
        streams = [engine.submit(GenerationRequest(p, sp)) for p in prompts]
        run_checked(engine)
        assert [s.result(0).token_ids for s in streams] == ref
        rows = [max(c) for c in engine.backend.calls]
        if check == "probes":
            assert max(rows) == 2 and 0 < engine.stats.spec_verify_steps < 15
        else:
            assert max(rows) == 8
