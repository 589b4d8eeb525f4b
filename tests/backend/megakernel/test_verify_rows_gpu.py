"""GPU: the megakernel runs verify rows (MegakernelBackend(verify_rows=True): the verify schedule, whose
attention drains wait for every QKV tile of their layer) as single rows would, and the engine on the
megakernel alone gives the plain run's greedy tokens with speculation on, at BS 1 and beside other
sequences (reduced geometry, bf16). The ordering is proven in the emulator
(test_verify_rows.py); this is the kernel's side of it (passed on an H100: docs/MEGAKERNEL.md)."""

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
    from mkcode.backend.model.reference import ReferenceModel
    from mkcode.backend.model.weights import random_weights
    from tests.backend.megakernel.cases import reduced_config

    cfg = reduced_config()  # window 256: the sliding layers' window is crossed below
    return ReferenceModel(cfg, random_weights(cfg, device="cuda", dtype=torch.bfloat16, seed=3, std=0.05))


def _backend(model):
    from mkcode.backend.megakernel.backend import MegakernelBackend

    return MegakernelBackend(model.cfg, model.w, verify_rows=True)


@pytest.mark.parametrize(
    ("contexts", "rows"),
    [
        ([20], [8]),  # one sequence, the whole batch
        ([5, 61, 130], [1, 4, 3]),  # beside a plain row, across a page boundary
        ([63, 100, 7], [2, 1, 5]),
        ([250, 4000], [4, 4]),  # across the window; a long context with several splits
        ([8000], [2]),
    ],
)
def test_megakernel_rows_equal_single_steps(model, contexts, rows):
    from tests.backend.spec.verify_harness import verify_vs_single_rows

    be = _backend(model)
    res = verify_vs_single_rows(model, be, contexts, rows)
    flips = sum(1 for _, a, _ in res if not a)
    print(f"{contexts} x {rows}: min cos {min(c for c, _, _ in res):.6f}, argmax flips {flips}")
    assert {p.sched.verify_rows for p in be._cache.values()} == {True, False}
    assert min(c for c, _, _ in res) > 0.999
    assert all(a or m < 0.05 for _, a, m in res)


def _engine(model, speculative):
    from tests.backend.spec.verify_harness import gpu_engine

    return gpu_engine(model, _backend(model), speculative)


@pytest.mark.parametrize("batch", [1, 3])
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
        assert engine.speculative == mode, engine.spec_note
        sp = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
        streams = [engine.submit(GenerationRequest(list(p), sp)) for p in prompts]
        engine.run_until_idle()
        engine.check_accounting()
        out[mode] = [s.result(0).token_ids for s in streams]
        st = engine.stats
        print(
            f"BS {batch} {mode}: {st.spec_verify_steps} verify steps, "
            f"{st.spec_accepted_tokens}/{st.spec_draft_tokens} accepted"
        )
        if mode == "ngram":
            assert st.spec_verify_steps > 0
    if out["off"] == out["ngram"]:
        return
    # bf16: the one-row and multi-row GEMV paths round differently, so greedy runs may part where
    # the top two logits (nearly) tie. Allowed only there: at each sequence's first differing
    # token, the reference's logits of the two tokens must be within NEAR_TIE.
    for prompt, plain, spec in zip(prompts, out["off"], out["ngram"]):
        if plain == spec:
            continue
        i = next(j for j, (a, b) in enumerate(zip(plain, spec)) if a != b)
        logits = _reference_logits(model, prompt + plain[:i])
        gap = abs(float(logits[plain[i]] - logits[spec[i]]))
        top = float(torch.topk(logits, 1).values[0])
        print(f"first difference at token {i}: {plain[i]} vs {spec[i]}, gap {gap:.4f} (top {top:.3f})")
        assert gap < NEAR_TIE, f"greedy runs part at token {i} where the logits differ by {gap:.4f}"


NEAR_TIE = 0.05  # absolute logits, as tests/backend/spec/verify_harness.py


def _reference_logits(model, tokens: list[int]) -> torch.Tensor:
    """The reference model's last-position logits over `tokens` (fp32 on the host)."""
    from mkcode.backend.kv.pool import KVPool
    from mkcode.backend.kv.sequence import SequenceKV
    from mkcode.backend.model.reference import Segment

    cfg, dev = model.cfg, model.device
    pool = KVPool(
        cfg.num_hidden_layers * (len(tokens) // 64 + 2),
        cfg.num_hidden_layers,
        cfg.num_key_value_heads,
        cfg.head_dim,
        device=dev,
        dtype=model.dtype,
    )
    seq = SequenceKV(cfg)
    seq.ensure_capacity(pool, len(tokens))
    out = model.forward(
        torch.tensor(tokens, device=dev),
        torch.arange(len(tokens), device=dev),
        [Segment(0, len(tokens), seq.view(pool))],
    )
    return out[-1].float().cpu()
