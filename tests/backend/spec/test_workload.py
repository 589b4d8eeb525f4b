"""The code-editing workload (read a file, write it back changed) through the engine: plain, n-gram
and oracle drafts emit the same tokens; the report gives tokens per verify step. With the tiny
random model whatever acceptance it gets is reported; the oracle (drafts = the model's own greedy
continuation) must reach nearly k+1 tokens per verify step. The demo checkpoint variant is `slow`
(it trains the demo model if it is not cached)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mkcode.backend.bench.spec_workload import byte_tokens, load_turns, run_workload
from tests.backend.engine.helpers import tiny_model
from tests.backend.spec.helpers import spec_engine

FIXTURE = Path(__file__).parent / "fixtures" / "edit_workload"


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_workload_tiny_model():
    model = tiny_model(max_position_embeddings=4096)
    turns = load_turns(FIXTURE)
    assert len(turns) == 4 and all("RateLimiter" in t.text() for t in turns)
    prompts = [byte_tokens(t.text(), model.cfg.vocab_size) for t in turns[:2]]  # (2K-token prompts)
    rep = run_workload(
        lambda mode, factory: spec_engine(model, mode, num_pages=800, drafter_factory=factory), prompts, 80
    )
    for line in rep.lines():
        print(line)
    oracle = rep.modes["oracle"]
    assert oracle.acceptance_rate == 1.0 and oracle.tokens_per_verify > 6
    assert rep.modes["off"].verify_steps == 0 and rep.modes["off"].tokens_per_step == 1.0
    assert rep.modes["ngram"].tokens_per_step >= 1.0


@pytest.mark.slow
def test_workload_demo_model():
    from mkcode.backend.demo import ensure_demo_model
    from mkcode.backend.runtime import RuntimeOptions, build_runtime

    path = ensure_demo_model()
    turns = load_turns(FIXTURE)
    runtimes = []

    def make(mode, factory):
        rt = build_runtime(
            RuntimeOptions(model=path, device="cpu", progress=False, speculative=mode, kv_memory_gb=0.25)
        )
        rt.engine.drafter_factory = factory or rt.engine.drafter_factory
        runtimes.append(rt)
        return rt.engine

    tok = make("off", None) and runtimes[0].tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": t.text()}], None, True) for t in turns]
    rep = run_workload(make, prompts, 128)
    for line in rep.lines():
        print(line)
    assert rep.modes["oracle"].acceptance_rate == 1.0
