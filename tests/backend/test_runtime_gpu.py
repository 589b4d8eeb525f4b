"""The product path on a GPU: checkpoint on disk -> runtime -> engine (GPU prefill, paged KV,
continuous batching) -> each decode backend, against the torch backend on the same weights.

Run on the GPU machine: `pytest tests/backend/test_runtime_gpu.py -m gpu -s`. Weights are the
`small` synthetic checkpoint in bf16, so backends may part ways at near-ties of random logits;
each backend must agree with torch on most greedy tokens and finish every request cleanly."""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

PROMPTS = [[5 + (i * 13) % 900 for i in range(n)] for n in (3, 100, 700)]
N_NEW = 32


@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory):
    from mkcode.backend.checkpoint.synth import synth_checkpoint

    return synth_checkpoint("small", tmp_path_factory.mktemp("ckpt") / "small", seed=0)


def _run(ckpt, decode: str, prompts=PROMPTS, lengths=None, **options) -> tuple[list[list[int]], float, str]:
    """`options`: further RuntimeOptions fields (the product's defaults otherwise)."""
    from mkcode.backend.engine.request import GenerationRequest
    from mkcode.backend.runtime import RuntimeOptions, build_runtime
    from mkcode.backend.sampling import SamplingParams

    rt = build_runtime(
        RuntimeOptions(model=ckpt, device="cuda", decode=decode, progress=False, kv_memory_gb=4.0, **options)
    )
    try:
        eng = rt.engine
        t0 = time.perf_counter()
        lengths = lengths or [N_NEW] * len(prompts)
        streams = [
            eng.submit(GenerationRequest(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)))
            for p, n in zip(prompts, lengths, strict=True)
        ]
        eng.run_until_idle()
        results = [s.result(0) for s in streams]
        dt = time.perf_counter() - t0
        assert all(
            r.finish_reason == "length" and len(r.token_ids) == n
            for r, n in zip(results, lengths, strict=True)
        ), [r.error for r in results]
        if decode in ("auto", "hybrid"):  # both backends ran steps: the batch shrank past the split
            steps = eng.backend.steps
            print(f"[{decode}] steps per backend {steps}")
            assert all(v > 0 for v in steps.values()), steps
        eng.check_accounting()
        print(
            f"\n[{decode}] backend={rt.decode_backend} ({rt.decode_note}); {dt:.2f}s; decode {eng.metrics().decode_tokens_per_s:.0f} tok/s"
        )
        return [r.token_ids for r in results], dt, rt.decode_backend
    finally:
        rt.close()
        del rt
        torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def torch_tokens(small_ckpt):
    return _run(small_ckpt, "torch")[0]


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    return same / sum(len(r) for r in a)


@pytest.mark.parametrize("decode", ["graph", "megakernel"])
def test_backend_matches_torch_through_engine(small_ckpt, torch_tokens, decode):
    tokens, _dt, used = _run(small_ckpt, decode)
    assert used == decode
    agree = _agreement(torch_tokens, tokens)
    first = [
        next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), N_NEW) for a, b in zip(torch_tokens, tokens)
    ]
    print(f"[{decode}] greedy agreement with torch {agree:.1%}; first divergence per request {first}")
    assert all(f >= 4 for f in first), first
    assert agree >= 0.6


# six requests that finish one after another: the batch shrinks from 6 rows to 1 (below the hybrid's
# split, MEGAKERNEL_BELOW_ROWS), so steps of the same sequences run on the graph backend, then on the
# megakernel. The last one runs alone from position 1016 on: below the hybrid's
# MEGAKERNEL_FROM_POSITION (1024) on the graph backend, from there on the megakernel.
SHRINKING = [[7 + (i * 29 + j) % 800 for i in range(n)] for j, n in enumerate((5, 60, 200, 9, 333, 990))]
SHRINK_LENGTHS = [6, 10, 14, 20, 26, 40]


@pytest.mark.parametrize("decode", ["auto", "hybrid"])
def test_hybrid_hands_steps_between_backends_through_engine(small_ckpt, decode):
    """`auto` (both backends load on an H200) and `hybrid`: the megakernel for the small batches, the
    graph backend for the others, over one KV pool; the tokens agree with torch's as each backend's do.
    Without speculation: SHRINKING's prompts repeat, so prompt-lookup drafts every step of the lone
    last request, and a verify step of 1 + k rows goes to the graph backend (the hybrid's split counts
    rows: docs/ENGINE.md), which would leave the megakernel no step."""
    from mkcode.backend.engine.hybrid_backend import MEGAKERNEL_FROM_POSITION

    assert MEGAKERNEL_FROM_POSITION == 1024, "SHRINKING's last request is sized for 1024"
    ref, _, _ = _run(small_ckpt, "torch", SHRINKING, SHRINK_LENGTHS)
    tokens, _dt, used = _run(small_ckpt, decode, SHRINKING, SHRINK_LENGTHS, speculative="off")
    assert used == "hybrid"
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(ref, tokens)]
    agree = _agreement(ref, tokens)
    print(f"[{decode}] greedy agreement with torch {agree:.1%}; first divergence per request {first}")
    assert all(f >= 4 for f in first), first
    assert agree >= 0.6
