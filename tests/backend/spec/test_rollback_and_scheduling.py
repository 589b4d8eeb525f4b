"""Rejected drafts leave no trace: with drafts that are always wrong, every step's block tables,
free list and prefix cache equal a run without speculation, step for step (pages past the
sequence trimmed, sliding-window releases and prefix registrations unchanged). Streaming emits one
event per accepted token; cancellation and preemption with drafts; constrained requests and
backends without verify rows do not speculate; bad options are refused."""

from __future__ import annotations

import random

import pytest
import torch

from mkcode.backend.engine.engine import Engine, EngineOptions
from mkcode.backend.engine.request import FinishEvent, GenerationRequest, TokenEvent
from mkcode.backend.kv.layout import PAGE_SIZE
from mkcode.backend.sampling import SamplingParams
from tests.backend.engine.helpers import tiny_model
from tests.backend.spec.helpers import (
    CharDetok,
    RecordingBackend,
    edit_prompt,
    random_prompt,
    repetitive_prompt,
    run_checked,
    spec_engine,
)

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class WrongDrafter:
    """Always k drafts, none of which the model will pick (tokens it never emits here: 0 and 1)."""

    def propose(self, tokens, k):
        return [0 if i % 2 else 1 for i in range(k)]


def _snapshot(engine):
    """Everything but the physical page ids (which pages a step pops depends on the order pages
    went back to the free list): free count, cached blocks, references per page, and per sequence
    which blocks are mapped on which layer, its length and computed tokens."""
    pool = engine.pool
    return (
        pool.num_free,
        sorted(pool.prefix),
        sorted(pool.refcount),
        [
            (s.req.request_id, (s.kv.array >= 0).tolist(), len(s.tokens), s.num_computed)
            for s in engine._running
        ],
    )


def test_rejected_drafts_leave_the_pool_as_a_plain_run_does():
    model = tiny_model()
    rng = random.Random(11)
    prompts = [random_prompt(rng, n) for n in (60, 63, 64, 100, 127, 150)]  # pages and window crossed

    def engine_for(mode):
        e = spec_engine(model, mode, num_pages=300, drafter_factory=lambda _r: WrongDrafter())
        for i, p in enumerate(prompts):
            e.submit(GenerationRequest(p, SamplingParams(max_tokens=40, **GREEDY), request_id=f"r{i}"))
        return e

    plain, spec = engine_for("off"), engine_for("ngram")
    steps = 0
    while plain.has_work() or spec.has_work():
        plain.step()
        spec.step()
        spec.check_accounting()
        assert _snapshot(plain) == _snapshot(spec), f"step {steps}"
        steps += 1
    # (k adapts down to 1; the first verify steps of the 60- and 63-token prompts run 7 drafts across a page)
    assert spec.stats.spec_draft_tokens > 200 and spec.stats.spec_accepted_tokens == 0
    assert spec.pool.num_free + spec.pool.num_cached_only == spec.pool.num_pages


def test_streaming_one_event_per_accepted_token_and_same_text():
    model = tiny_model()
    p = repetitive_prompt(random.Random(1), 50)
    texts = {}
    for mode in ("off", "ngram"):
        engine = spec_engine(model, mode)
        s = engine.submit(GenerationRequest(p, SamplingParams(max_tokens=50, **GREEDY)))
        run_checked(engine)
        events = list(s)
        tokens = [e for e in events if isinstance(e, TokenEvent) and e.token_ids]
        assert all(len(e.token_ids) == 1 for e in tokens)
        assert isinstance(events[-1], FinishEvent)
        texts[mode] = ([e.token_ids[0] for e in tokens], "".join(e.text for e in events[:-1]))
        if mode == "ngram":
            assert engine.stats.spec_tokens_per_verify > 2
            u = events[-1].usage.speculative
            assert u is not None and u.accepted_tokens == engine.stats.spec_accepted_tokens
            assert u.as_dict()["tokens_per_verify"] > 2
    assert texts["off"] == texts["ngram"]


def test_cancel_mid_run_and_preemption_with_drafts():
    model = tiny_model()
    rng = random.Random(4)
    prompts = [edit_prompt(rng, n) for n in (100, 120, 90, 110)]
    engine = spec_engine(model, "ngram", num_pages=24, enable_prefix_cache=False)
    victim = engine.submit(
        GenerationRequest(repetitive_prompt(rng, 30), SamplingParams(max_tokens=200, **GREEDY))
    )
    streams = [engine.submit(GenerationRequest(p, SamplingParams(max_tokens=60, **GREEDY))) for p in prompts]
    for _ in range(6):
        engine.step()
        engine.check_accounting()
    victim.cancel()
    run_checked(engine)
    r = victim.result(0)
    assert r.finish_reason == "cancelled" and 0 < len(r.token_ids) < 200
    assert engine.stats.preemptions > 0 and engine.stats.spec_accepted_tokens > 0
    ref = spec_engine(model, "off", enable_prefix_cache=False)
    alone = [ref.submit(GenerationRequest(p, SamplingParams(max_tokens=60, **GREEDY))) for p in prompts]
    run_checked(ref)
    assert [s.result(0).token_ids for s in streams] == [s.result(0).token_ids for s in alone]
    assert engine.pool.num_free == engine.pool.num_pages


class _Constraint:
    def __init__(self):
        self.seen = []

    def allowed_tokens(self, vocab_size):
        return None

    def advance(self, token_id):
        self.seen.append(token_id)

    def is_finished(self):
        return len(self.seen) >= 20


def test_constrained_requests_and_backends_without_verify_rows_do_not_speculate():
    model = tiny_model()
    p = repetitive_prompt(random.Random(2), 40)
    engine = spec_engine(model, "ngram")
    s = engine.submit(GenerationRequest(p, SamplingParams(max_tokens=50, **GREEDY), constraint=_Constraint()))
    run_checked(engine)
    r = s.result(0)
    assert r.finish_reason == "stop" and r.usage.speculative is None and len(r.token_ids) == 20
    assert engine.stats.spec_draft_tokens == 0

    engine = spec_engine(model, "ngram")
    engine.backend.verify_rows = False  # e.g. the megakernel
    from mkcode.backend.engine.engine import Engine

    e2 = Engine(model, engine.pool, engine.backend, options=EngineOptions(speculative="ngram"))
    assert e2.speculative == "off" and "runs no verify rows" in e2.spec_note


def test_options_are_checked():
    with pytest.raises(ValueError, match="speculative"):
        EngineOptions(speculative="eagle")
    for k in (0, 8, True):
        with pytest.raises(ValueError, match="spec_k"):
            EngineOptions(spec_k=k)


def test_spec_k_caps_the_drafts():
    model = tiny_model()
    p = repetitive_prompt(random.Random(6), 40)
    engine = spec_engine(model, "ngram", spec_k=2)
    engine.submit(GenerationRequest(p, SamplingParams(max_tokens=40, **GREEDY)))
    run_checked(engine)
    assert max(max(c) for c in engine.backend.calls) == 3
    assert engine.stats.spec_accepted_tokens > 0


class _PageLimitedBackend(RecordingBackend):
    """A backend whose block tables hold `max_pages` pages per sequence (as the graph backend's),
    refusing any step past them."""

    def __init__(self, model, max_pages: int):
        super().__init__(model)
        self.max_pages = max_pages

    def decode(self, batch):
        assert batch.block_tables.shape[-1] <= self.max_pages, "step past the backend's pages"
        assert int(batch.positions.max()) < self.max_pages * PAGE_SIZE, "row past the backend's pages"
        return super().decode(batch)


def test_backend_page_limit_ends_sequences_at_length_with_and_without_drafts():
    """Near the decode backend's per-sequence page limit, verify rows must not ask for pages past
    it: the engine's context is the smaller of the model's and the backend's, so a sequence ends at
    "length" there, with the same tokens as without speculation (not an error one token short)."""
    model = tiny_model()
    prompt = repetitive_prompt(random.Random(3), 2 * PAGE_SIZE - 10)
    results = {}
    for mode in ("off", "ngram"):
        engine = spec_engine(model, mode)
        engine.backend = _PageLimitedBackend(model, max_pages=2)
        engine = Engine(
            model, engine.pool, engine.backend, options=engine.opts, detokenizer_factory=CharDetok
        )
        assert engine.max_model_len == 2 * PAGE_SIZE
        stream = engine.submit(
            GenerationRequest(list(prompt), SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
        )
        run_checked(engine)
        results[mode] = stream.result(0)
    assert results["off"].finish_reason == results["ngram"].finish_reason == "length"
    assert results["ngram"].error is None
    assert len(prompt) + len(results["off"].token_ids) == 2 * PAGE_SIZE
    assert results["ngram"].token_ids == results["off"].token_ids
