"""GPU: the graph backend (Triton kernels in CUDA graphs) runs verify rows as single rows would, and
the engine with speculation gives the plain run's greedy tokens, at BS 1 and beside other
sequences (reduced geometry, bf16)."""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def model():
    from mkcode.backend.bench.synthetic import reduced_config
    from tests.backend.gpu.parity import bf16_model_pair

    return bf16_model_pair(reduced_config(), "cuda")[0]


@pytest.mark.parametrize(
    ("contexts", "rows"),
    [([20], [8]), ([5, 61, 130], [1, 8, 4]), ([63, 100, 7, 300], [6, 1, 8, 8]), ([500], [2])],
)
def test_graph_rows_equal_single_steps(model, contexts, rows):
    from mkcode.backend.gpu.graph_backend import GraphDecodeBackend
    from tests.backend.spec.verify_harness import verify_vs_single_rows

    backend = GraphDecodeBackend(model, max_pages=16)
    res = verify_vs_single_rows(model, backend, contexts, rows)
    flips = sum(1 for _, a, m in res if not a)
    print(f"{contexts} x {rows}: min cos {min(c for c, _, _ in res):.6f}, argmax flips {flips}")
    assert min(c for c, _, _ in res) > 0.999
    assert all(a or m < 0.05 for _, a, m in res)


def _engine(model, speculative):
    from mkcode.backend.gpu.graph_backend import GraphDecodeBackend
    from tests.backend.spec.verify_harness import gpu_engine

    return gpu_engine(model, GraphDecodeBackend(model, max_pages=64), speculative)


@pytest.mark.parametrize("batch", [1, 5])
def test_engine_speculative_equals_plain(model, batch):
    from mkcode.backend.engine.request import GenerationRequest
    from mkcode.backend.sampling import SamplingParams

    rng = random.Random(batch)
    prompts = []
    for i in range(batch):
        motif = [rng.randrange(3, 1024) for _ in range(rng.randrange(3, 9))]
        body = [motif[j % len(motif)] for j in range(rng.choice((40, 63, 130)))]
        prompts.append(body if i % 2 == 0 else [rng.randrange(3, 1024) for _ in range(70)] + body[:20])
    out = {}
    for mode in ("off", "ngram"):
        engine = _engine(model, mode)
        sp = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
        streams = [engine.submit(GenerationRequest(list(p), sp)) for p in prompts]
        engine.run_until_idle()
        engine.check_accounting()
        out[mode] = [s.result(0).token_ids for s in streams]
        st = engine.stats
        print(
            f"BS {batch} {mode}: {st.spec_verify_steps} verify steps, {st.spec_accepted_tokens}/{st.spec_draft_tokens} accepted"
        )
    assert out["off"] == out["ngram"]
