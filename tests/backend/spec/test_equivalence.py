"""Greedy decoding gives the same completions with speculation on and off: token ids, text and
finish reason of 240 requests run together (continuous batching with and without drafts in one
step), over random, repetitive and rewrite-like prompts of lengths that cross pages and the
sliding window, with stop strings, stop tokens and EOS that land inside accepted runs and
max_tokens from 1 up. Page accounting is checked after every step (KVPool.check, no page past a
sequence's next position) and both runs end with the same prefix cache and an empty pool."""

from __future__ import annotations

import random

import pytest
import torch

from mkcode.backend.engine import engine as engine_mod
from mkcode.backend.engine.request import GenerationRequest
from mkcode.backend.sampling import SamplingParams
from tests.backend.engine.helpers import tiny_model
from tests.backend.spec.helpers import (
    CharDetok,
    edit_prompt,
    random_prompt,
    repetitive_prompt,
    run_checked,
    spec_engine,
)

LENGTHS = (1, 3, 20, 63, 64, 65, 100, 129, 200)  # pages of 64; the tiny model's window is 64


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _requests(rng: random.Random, count: int) -> list[tuple[list[int], dict]]:
    families = (random_prompt, repetitive_prompt, edit_prompt)
    out = []
    for i in range(count):
        prompt = families[i % 3](rng, rng.choice(LENGTHS))
        out.append((prompt, {"max_tokens": rng.choice((1, 2, 7, 8, 9, 16, 40)), "ignore_eos": i % 5 != 0}))
    return out


def _run(model, speculative, reqs, record=None, **kw):
    engine = spec_engine(model, speculative, **kw)
    streams = [
        engine.submit(GenerationRequest(list(p), SamplingParams(temperature=0.0, **sp))) for p, sp in reqs
    ]
    run_checked(engine)
    results = [s.result(0) for s in streams]
    assert engine.pool.num_free + engine.pool.num_cached_only == engine.pool.num_pages
    return engine, results


def _stops_from(rng: random.Random, reqs, results) -> list[tuple[list[int], dict]]:
    """Requests whose prompt ends with the plain run's own output (so drafting starts at the first
    step, as in an agent re-emitting text) and that stop part-way: on a stop token, on a stop string
    (its text may span tokens) or on EOS (ids 2 and 17 are EOS in these runs)."""
    out = []
    for (prompt, sp), r in zip(reqs, results):
        ids = r.token_ids
        if len(ids) < 6:
            continue
        seen = (prompt + ids)[-150:]
        j = rng.randrange(1, len(ids) - 1)
        kind = len(out) % 3
        if kind == 0:
            out.append((seen, {**sp, "stop_token_ids": (ids[j],)}))
        elif kind == 1:
            text = "".join(CharDetok().push(t) for t in ids[j : j + 2])
            if text.strip():
                out.append((seen, {**sp, "stop": (text,)}))
        else:
            out.append((seen, {**sp, "ignore_eos": False, "max_tokens": 40}))
    return out


def test_greedy_identical_with_and_without_speculation(monkeypatch):
    model = tiny_model()
    rng = random.Random(42)
    reqs = _requests(rng, 150)
    _, plain = _run(model, "off", reqs)
    reqs += _stops_from(rng, reqs, plain)
    assert len(reqs) >= 200

    inside = []  # verify steps that stopped a sequence before their last row
    real = engine_mod.accept_drafts

    def spy(drafts, token_of_row, emit):
        out = real(drafts, token_of_row, emit)
        if out.finished and len(out.emitted) < len(drafts) + 1 and out.accepted:
            inside.append(out)
        return out

    eos = (2, 17)  # 17: an extra EOS id for these runs (the tiny model emits it now and then)
    _, plain = _run(model, "off", reqs, eos=eos)
    monkeypatch.setattr(engine_mod, "accept_drafts", spy)
    engine, spec = _run(model, "ngram", reqs, eos=eos)
    for i, (a, b) in enumerate(zip(plain, spec)):
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason), i
        assert b.usage.completion_tokens == len(b.token_ids)
    st = engine.stats
    print(
        f"{len(reqs)} requests: {st.spec_verify_steps} verify steps, {st.spec_draft_tokens} drafts, "
        f"{st.spec_accepted_tokens} accepted, {st.spec_tokens_per_verify:.2f} tokens/verify; "
        f"{len(inside)} stops inside accepted runs"
    )
    assert st.spec_accepted_tokens > 0 and len(inside) >= 3
    assert sum(r.finish_reason == "stop" for r in spec) >= 30
    calls = engine.backend.calls
    assert any(1 in c and max(c) > 1 for c in calls), "no step mixed drafted and plain sequences"


def test_prefix_cache_and_pool_same_after_both_runs():
    """Rejected drafts never reach the prefix cache: both runs end with the same cached blocks."""
    model = tiny_model()
    rng = random.Random(5)
    reqs = [(edit_prompt(rng, 200), {"max_tokens": 70, "ignore_eos": True}) for _ in range(6)]
    reqs += [(repetitive_prompt(rng, 130), {"max_tokens": 70, "ignore_eos": True}) for _ in range(4)]
    e_off, r_off = _run(model, "off", reqs)
    e_on, r_on = _run(model, "ngram", reqs)
    assert [r.token_ids for r in r_off] == [r.token_ids for r in r_on]
    assert e_on.stats.spec_accepted_tokens > 0
    assert set(e_off.pool.prefix) == set(e_on.pool.prefix)  # (LRU order follows the step timing)
    assert e_off.pool.num_free == e_on.pool.num_free
    for key, entry in e_on.pool.prefix.items():  # the cached K/V itself agrees
        other = e_off.pool.prefix[key]
        torch.testing.assert_close(
            e_on.pool.tensor[entry.pages], e_off.pool.tensor[other.pages], rtol=1e-4, atol=1e-5
        )


def test_row_limit_and_one_call_per_step():
    """With an 8-row backend, four looping sequences share each step's 8 rows (drafts trimmed),
    and nine sequences (more than one call holds) decode without drafts."""
    model = tiny_model()
    rng = random.Random(9)
    reqs = [(repetitive_prompt(rng, 40), {"max_tokens": 30, "ignore_eos": True}) for _ in range(4)]
    _, plain = _run(model, "off", reqs, max_batch=8)
    engine, spec = _run(model, "ngram", reqs, max_batch=8)
    assert [r.token_ids for r in plain] == [r.token_ids for r in spec]
    calls = engine.backend.calls
    assert all(sum(c) <= 8 for c in calls) and any(sum(c) == 8 and len(c) == 4 for c in calls)
    reqs = [(repetitive_prompt(rng, 40), {"max_tokens": 10, "ignore_eos": True}) for _ in range(9)]
    engine, _ = _run(model, "ngram", reqs, max_batch=8)
    assert all(max(c) == 1 for c in engine.backend.calls if len(c) > 1 or sum(c) == 1)
