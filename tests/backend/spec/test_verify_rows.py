"""Each backend runs a verify step's rows as the same rows one at a time would (row i sees the K/V
rows < i wrote in the same step): the torch reference (fp32, exact to rounding) and the graph
backend's kernels through their torch twins on the CPU (bf16). The GPU variant (Triton kernels in
CUDA graphs) is in test_verify_rows_gpu.py."""

from __future__ import annotations

import pytest
import torch

from mkcode.backend.engine.torch_backend import TorchDecodeBackend
from mkcode.backend.gpu.graph_backend import GraphDecodeBackend
from tests.backend.engine.helpers import tiny_config, tiny_model
from tests.backend.gpu.parity import bf16_model_pair
from tests.backend.spec.verify_harness import verify_vs_single_rows

CASES = [  # (contexts, rows per sequence): one sequence; drafted beside plain rows; across a page / the window
    ([20], [8]),
    ([5, 61, 130], [1, 8, 4]),
    ([63, 100], [6, 1]),
]


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize(("contexts", "rows"), CASES)
def test_torch_backend_rows_equal_single_steps(contexts, rows):
    model = tiny_model()
    res = verify_vs_single_rows(model, TorchDecodeBackend(model), contexts, rows)
    assert len(res) == sum(rows)
    assert min(c for c, _, _ in res) > 0.99999 and all(a for _, a, _ in res)


@pytest.mark.parametrize(("contexts", "rows"), CASES)
def test_graph_twins_rows_equal_single_steps(contexts, rows):
    model, _ = bf16_model_pair(tiny_config(), "cpu")
    backend = GraphDecodeBackend(model, max_pages=8, use_triton=False)
    res = verify_vs_single_rows(model, backend, contexts, rows)
    assert min(c for c, _, _ in res) > 0.999
    assert all(a or m < 0.05 for _, a, m in res)


def test_harness_catches_a_row_that_misses_earlier_rows():
    """Power check: if rows were run as independent one-row steps over the pre-step pool (each row
    blind to the K/V the rows before it write), the harness would see it."""

    class Blind(TorchDecodeBackend):
        def decode(self, batch):
            out = []
            for b in range(batch.size):  # every row alone, with the pool as it was before the step
                saved = batch.kv_pool.clone()
                one = type(batch)(
                    batch.token_ids[b : b + 1],
                    batch.positions[b : b + 1],
                    batch.block_tables[:, b : b + 1],
                    batch.kv_pool,
                )
                out.append(super().decode(one))
                if b + 1 < batch.size:
                    batch.kv_pool.copy_(saved)
            return torch.cat(out)

    model = tiny_model()
    res = verify_vs_single_rows(model, Blind(model), [20], [8])
    assert min(c for c, _, _ in res[1:]) < 0.99
