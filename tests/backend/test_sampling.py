"""Sampling: greedy, temperature, top-k, top-p and seeds, checked against their definitions."""

from __future__ import annotations

import pytest
import torch

from mkcode.backend.sampling import SamplingError, SamplingParams, filter_logits, sample_token


def _draws(logits, params, n=4000, seed=0):
    g = params.make_generator("cpu") if params.seed is not None else torch.Generator().manual_seed(seed)
    return torch.tensor([sample_token(logits, params, g) for _ in range(n)])


def test_greedy_is_argmax():
    logits = torch.randn(100)
    assert sample_token(logits, SamplingParams(temperature=0), torch.Generator()) == int(logits.argmax())
    assert sample_token(logits, SamplingParams(top_k=1), torch.Generator()) == int(logits.argmax())


def test_temperature_matches_softmax_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    p = SamplingParams(temperature=0.7)
    counts = torch.bincount(_draws(logits, p), minlength=4).float() / 4000
    expect = torch.softmax(logits / 0.7, -1)
    assert torch.allclose(counts, expect, atol=0.03)


def test_top_k_only_keeps_k_best():
    logits = torch.randn(50)
    draws = _draws(logits, SamplingParams(temperature=1.0, top_k=3), n=500)
    assert set(draws.tolist()) <= set(torch.topk(logits, 3).indices.tolist())


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = filter_logits(logits, 1.0, 0, 0.8)
    assert torch.allclose(probs, torch.tensor([0.5, 0.3, 0, 0]) / 0.8)
    probs = filter_logits(logits, 1.0, 0, 0.81)
    assert probs[2] > 0 and probs[3] == 0
    probs = filter_logits(logits, 1.0, 0, 0.1)  # the top token is always kept
    assert probs[0] == 1


def test_same_seed_same_tokens_different_seed_differs():
    logits = torch.randn(1000)
    a = _draws(logits, SamplingParams(temperature=1.0, seed=7), n=50)
    b = _draws(logits, SamplingParams(temperature=1.0, seed=7), n=50)
    c = _draws(logits, SamplingParams(temperature=1.0, seed=8), n=50)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": -0.1},
        {"top_p": 1.5},
        {"top_k": -1},
        {"max_tokens": 0},
        {"seed": "x"},
        {"stop": ("",)},
        {"max_tokens": True},
    ],
)
def test_invalid_values_are_clear_errors(kw):
    with pytest.raises(SamplingError, match=next(iter(kw))):
        SamplingParams(**kw)


def test_from_dict_accepts_single_stop_string_and_rejects_unknown():
    assert SamplingParams.from_dict({"stop": "END"}).stop == ("END",)
    with pytest.raises(SamplingError, match="unknown"):
        SamplingParams.from_dict({"nucleus": 0.5})
