"""The graph backend (with the kernels' torch twins) and the prefill path on the CPU, against the
fp32 reference at a reduced geometry: logits cosine and greedy agreement (ragged contexts that
cross a page and the sliding window)."""

import torch

from mkcode.backend.bench.synthetic import reduced_config
from mkcode.backend.gpu.graph_backend import GraphDecodeBackend, bucket_for
from mkcode.backend.gpu.prefill import GpuPrefill
from tests.backend.gpu.parity import bf16_model_pair, run_parity


def test_buckets():
    assert [bucket_for(b) for b in (1, 2, 3, 5, 8, 9, 17, 32)] == [1, 2, 4, 8, 8, 16, 32, 32]


def test_graph_twins_and_prefill_match_reference():
    torch.manual_seed(0)
    cfg = reduced_config()
    model, ref = bf16_model_pair(cfg, "cpu")
    backend = GraphDecodeBackend(model, max_pages=8, use_triton=False)
    rep = run_parity(model, ref, GpuPrefill(model, chunk_tokens=100), backend, [5, 70, 130], 2)
    assert len(rep.cosines) == 9
    assert rep.min_cosine() >= 0.999
    assert rep.disagreements(margin=0.05) == 0
    routed = backend.routed_experts()
    assert routed[0] == 0 and all(0 < r <= 12 for r in routed[1:])
