"""The reference model in bf16 tracks fp32, and chunked prefill equals one-shot prefill."""

from __future__ import annotations

import torch

from mkcode.backend.model.reference import ReferenceModel
from mkcode.backend.model.weights import ModelWeights
from tests.backend.engine.helpers import tiny_model


def test_bf16_tracks_fp32():
    m32 = tiny_model()
    sd = {k: v.to(torch.bfloat16) for k, v in m32.w.state_dict(m32.cfg).items()}
    m16 = ReferenceModel(m32.cfg, ModelWeights.from_state_dict(m32.cfg, sd))
    prompt = list(range(3, 103))
    a = m32.prefill(m32.new_cache(128), prompt)
    b = m16.prefill(m16.new_cache(128), prompt)
    assert b.dtype == torch.float32  # logits are returned in fp32 whatever the weights
    cos = torch.nn.functional.cosine_similarity(a, b, dim=0)
    assert cos > 0.99, float(cos)


def test_chunked_prefill_equals_single_pass():
    m = tiny_model()
    prompt = [(i * 37) % 500 + 3 for i in range(150)]
    one = m.prefill(m.new_cache(160), prompt, chunk=1 << 20)
    chunked = m.prefill(m.new_cache(160), prompt, chunk=17)
    assert torch.allclose(one, chunked, rtol=1e-5, atol=1e-5)
