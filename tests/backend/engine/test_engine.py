"""Engine behaviour on the CPU with a tiny fp32 model: batching, paging, preemption, prefix cache,
cancellation, bad input, and a soak. Every comparison is on greedy tokens against the reference
model run alone without paging."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from mkcode.backend.engine.request import FinishEvent, GenerationRequest, RequestError, TokenEvent
from mkcode.backend.sampling import SamplingError, SamplingParams
from tests.backend.engine.helpers import make_engine, reference_greedy, tiny_model

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _req(prompt, n, **kw):
    return GenerationRequest(list(prompt), SamplingParams(max_tokens=n, **{**GREEDY, **kw}))


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 512) for _ in range(n)]


def test_batch_invariance_mixed_lengths():
    """Concurrent requests (1 token, page-crossing, longer than the window) equal each run alone
    and the unpaged reference."""
    model = tiny_model()
    rng = random.Random(0)
    lengths = [1, 63, 64, 65, 130, 7, 200, 129]
    prompts = [_prompt(rng, n) for n in lengths]
    n_new = 24
    engine = make_engine(model, max_prefill_tokens=96)
    streams = [engine.submit(_req(p, n_new)) for p in prompts]
    engine.run_until_idle()
    together = [s.result(timeout=0).token_ids for s in streams]
    engine.check_accounting()
    assert engine.pool.num_free + engine.pool.num_cached_only == engine.pool.num_pages
    for p, got in zip(prompts, together):
        alone_engine = make_engine(model)
        alone = alone_engine.submit(_req(p, n_new))
        alone_engine.run_until_idle()
        assert alone.result(timeout=0).token_ids == got
        assert reference_greedy(model, p, n_new) == got


def test_join_mid_flight_and_cancel_mid_stream():
    model = tiny_model()
    rng = random.Random(1)
    engine = make_engine(model)
    p1, p2, p3 = _prompt(rng, 90), _prompt(rng, 40), _prompt(rng, 70)
    s1 = engine.submit(_req(p1, 30))
    for _ in range(5):
        engine.step()
    s2 = engine.submit(_req(p2, 20))  # joins while s1 decodes
    s3 = engine.submit(_req(p3, 50))
    for _ in range(4):
        engine.step()
    s3.cancel()
    engine.run_until_idle()
    r1, r2, r3 = s1.result(0), s2.result(0), s3.result(0)
    assert r1.token_ids == reference_greedy(model, p1, 30)
    assert r2.token_ids == reference_greedy(model, p2, 20)
    assert r3.finish_reason == "cancelled"
    assert r3.token_ids == reference_greedy(model, p3, 50)[: len(r3.token_ids)]
    engine.pool.clear_prefix_cache()
    engine.check_accounting()
    assert engine.pool.num_free == engine.pool.num_pages


@pytest.mark.parametrize(("speculative", "num_pages"), [("off", 40), ("ngram", 24)])
def test_preemption_and_resume_give_identical_tokens(speculative, num_pages):
    model = tiny_model()
    rng = random.Random(2)
    prompts = [_prompt(rng, n) for n in (100, 120, 90, 110)]
    # a small pool: the four cannot all hold their full length at once -> preemption (speculation
    # finishes sequences in fewer steps, so it needs a smaller pool to get there)
    engine = make_engine(model, num_pages=num_pages, enable_prefix_cache=False, speculative=speculative)
    streams = [engine.submit(_req(p, 60)) for p in prompts]
    engine.run_until_idle()
    assert engine.stats.preemptions > 0
    for p, s in zip(prompts, streams):
        assert s.result(0).token_ids == reference_greedy(model, p, 60)
    engine.check_accounting()
    assert engine.pool.num_free == engine.pool.num_pages


def test_prefix_cache_hits_identical_tokens():
    model = tiny_model()
    rng = random.Random(3)
    shared = _prompt(rng, 192)
    a, b = [*shared, *_prompt(rng, 10)], [*shared, *_prompt(rng, 30)]
    engine = make_engine(model)
    ra = engine.submit(_req(a, 16))
    engine.run_until_idle()
    rb = engine.submit(_req(b, 16))
    engine.run_until_idle()
    res_b = rb.result(0)
    assert res_b.usage.cached_tokens == 192
    assert engine.stats.prefix_hit_rate > 0
    assert ra.result(0).token_ids == reference_greedy(model, a, 16)
    assert res_b.token_ids == reference_greedy(model, b, 16)
    engine.check_accounting()
    engine.pool.clear_prefix_cache()
    assert engine.pool.num_free == engine.pool.num_pages


def test_bad_input_clear_errors():
    model = tiny_model()
    engine = make_engine(model)
    with pytest.raises(RequestError, match="empty prompt"):
        GenerationRequest([], SamplingParams())
    with pytest.raises(RequestError, match="does not fit the context"):
        engine.submit(GenerationRequest([5] * 1024))
    with pytest.raises(RequestError, match="token ids must be in"):
        engine.submit(GenerationRequest([5, 99999]))
    with pytest.raises(SamplingError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(SamplingError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(SamplingError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(SamplingError, match="unknown sampling field"):
        SamplingParams.from_dict({"temprature": 0.5})
    tiny_pool = make_engine(model, num_pages=12)
    with pytest.raises(RequestError, match="more KV pages than the pool holds"):
        tiny_pool.submit(GenerationRequest([5] * 600))


def test_max_tokens_clamped_to_context():
    model = tiny_model()
    engine = make_engine(model)
    s = engine.submit(_req([7] * 1000, 500))
    engine.run_until_idle()
    r = s.result(0)
    assert r.finish_reason == "length" and len(r.token_ids) == 24


def test_seeded_sampling_is_batch_invariant():
    model = tiny_model()
    rng = random.Random(4)
    p = _prompt(rng, 50)
    params = dict(temperature=0.9, top_p=0.9, top_k=50, seed=1234)
    e1 = make_engine(model)
    alone = e1.submit(_req(p, 20, **params))
    e1.run_until_idle()
    e2 = make_engine(model)
    others = [e2.submit(_req(_prompt(rng, 30), 20, temperature=1.0)) for _ in range(3)]
    together = e2.submit(_req(p, 20, **params))
    e2.run_until_idle()
    assert alone.result(0).token_ids == together.result(0).token_ids
    assert all(o.result(0).finish_reason == "length" for o in others)


def test_background_thread_and_asyncio_stream():
    model = tiny_model()
    engine = make_engine(model).start()
    try:
        rng = random.Random(5)
        p = _prompt(rng, 20)

        async def collect():
            events = []
            async for ev in engine.submit(_req(p, 12)):
                events.append(ev)
            return events

        events = asyncio.run(collect())
        assert isinstance(events[-1], FinishEvent) and events[-1].reason == "length"
        toks = [t for ev in events if isinstance(ev, TokenEvent) for t in ev.token_ids]
        assert toks == reference_greedy(model, p, 12)
        # plain threads, concurrently
        results = {}

        def worker(i):
            results[i] = engine.submit(_req(_prompt(random.Random(i), 10 + i), 8)).result(timeout=60)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(results[i].finish_reason == "length" for i in range(6))
    finally:
        engine.shutdown()


def test_soak_500_random_requests_with_cancellations():
    """500 random requests, random cancellations, a small pool: bounded time, no leak, no hang."""
    model = tiny_model()
    rng = random.Random(6)
    engine = make_engine(model, num_pages=120, max_prefill_tokens=128).start()
    t0 = time.monotonic()
    try:
        streams = []
        for _ in range(500):
            n = rng.choice([1, 2, 5, 30, 64, 65, 100])
            streams.append(
                engine.submit(_req(_prompt(rng, n), rng.randint(1, 12), temperature=rng.choice([0.0, 0.8])))
            )
            if rng.random() < 0.2:
                rng.choice(streams).cancel()
        reasons = [s.result(timeout=120).finish_reason for s in streams]
    finally:
        engine.shutdown()
    assert time.monotonic() - t0 < 150
    assert set(reasons) <= {"length", "stop", "cancelled"}
    assert "cancelled" in reasons and "length" in reasons
    engine.check_accounting()
    engine.pool.clear_prefix_cache()
    assert engine.pool.num_free == engine.pool.num_pages


class _OnlyTens:
    """Allows tokens 10..12 only; complete after three tokens."""

    def __init__(self):
        self.seen: list[int] = []

    def allowed_tokens(self, vocab_size):
        import torch

        m = torch.zeros(vocab_size, dtype=torch.bool)
        m[10:13] = True
        return m

    def advance(self, token_id):
        self.seen.append(token_id)

    def is_finished(self):
        return len(self.seen) >= 3


def test_token_constraint_masks_and_finishes():
    model = tiny_model()
    engine = make_engine(model)
    c = _OnlyTens()
    s = engine.submit(
        GenerationRequest([5, 6, 7], SamplingParams(max_tokens=50, temperature=1.0, seed=1), constraint=c)
    )
    engine.run_until_idle()
    r = s.result(0)
    assert r.finish_reason == "stop" and r.token_ids == c.seen and len(c.seen) == 3
    assert all(10 <= t <= 12 for t in r.token_ids)
