"""HybridDecodeBackend (each step to the faster backend for its batch size and context) and how
`choose_decode_backend` assembles it: CPU tests with stand-in backends (the GPU path is
tests/backend/test_runtime_gpu.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mkcode.backend import runtime
from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.engine.hybrid_backend import (
    MEGAKERNEL_BELOW_POSITION,
    MEGAKERNEL_BELOW_ROWS,
    MEGAKERNEL_FROM_POSITION,
    MEGAKERNEL_STEP_RATIO,
    HybridDecodeBackend,
)
from mkcode.backend.spec.policy import choose_draft_counts


class _Fake:
    def __init__(self, name: str, max_batch: int):
        self.name, self.max_batch = name, max_batch
        self.rows: list[int] = []

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        self.rows.append(batch.size)
        return torch.full((batch.size, 3), float(len(self.name)))


def _batch(rows: int, position: int = 5000, host: bool = True) -> DecodeBatch:
    positions = [position - 3 * b for b in range(rows)]  # row 0 the longest
    return DecodeBatch(
        torch.zeros(rows, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
        torch.zeros(1, rows, 1, dtype=torch.int32),
        torch.zeros(1),
        host_positions=tuple(positions) if host else None,
    )


def test_each_step_goes_to_the_backend_for_its_batch_size():
    small, large = _Fake("megakernel", 8), _Fake("graph", 32)
    h = HybridDecodeBackend(small, large, split=4)
    for rows in (1, 3, 4, 8, 2, 32):
        out = h.decode(_batch(rows))
        assert out.shape == (rows, 3)
    assert small.rows == [1, 3, 2] and large.rows == [4, 8, 32]
    assert h.steps == {"megakernel": 3, "graph": 3}
    assert h.max_batch == 32  # batches from the split on go to the large-batch backend
    lo, hi = MEGAKERNEL_FROM_POSITION, MEGAKERNEL_BELOW_POSITION
    at = f"at positions {lo}-{hi - 1}" if hi is not None else f"from position {lo}"
    assert h.describe() == f"megakernel below 4 rows {at}, graph otherwise"


@pytest.mark.parametrize("host", [True, False], ids=["host-positions", "device-positions"])
def test_short_and_long_contexts_go_to_the_large_batch_backend(host):
    """Outside [from_position, below_position) (the longest row's position) the graph backend is the
    faster one at BS 1 too (2026-11-30): such steps go to `large` whatever their row count; the
    positions come from the batch's host copy or, without one, from the device tensor."""
    small, large = _Fake("megakernel", 8), _Fake("graph", 32)
    h = HybridDecodeBackend(small, large, split=2, from_position=1024, below_position=20480)
    for rows, pos in ((1, 100), (1, 1023), (1, 1024), (1, 9000), (2, 9000), (1, 0), (1, 20479), (1, 20480)):
        h.decode(_batch(rows, pos, host))
    assert small.rows == [1, 1, 1] and large.rows == [1, 1, 2, 1, 1]
    assert h.describe() == "megakernel below 2 rows at positions 1024-20479, graph otherwise"
    # a batch whose longest row is not its first: the longest decides
    h.decode(
        DecodeBatch(
            torch.zeros(1, dtype=torch.long), torch.tensor([2000]), torch.zeros(1, 1, 1), torch.zeros(1)
        )
    )
    assert small.rows == [1, 1, 1, 1]
    plain = HybridDecodeBackend(
        _Fake("megakernel", 8), _Fake("graph", 32), split=2, from_position=0, below_position=None
    )
    plain.decode(_batch(1, 0))
    plain.decode(_batch(1, 10**6))
    assert plain.small.rows == [1, 1] and plain.describe() == "megakernel below 2 rows, graph otherwise"
    opened = HybridDecodeBackend(_Fake("megakernel", 8), _Fake("graph", 32), split=2, below_position=None)
    assert (
        opened.describe()
        == f"megakernel below 2 rows from position {MEGAKERNEL_FROM_POSITION}, graph otherwise"
    )


def test_bad_host_positions_and_windows_are_refused():
    bad = DecodeBatch(
        torch.zeros(2, dtype=torch.long),
        torch.zeros(2, dtype=torch.long),
        torch.zeros(1),
        torch.zeros(1),
        host_positions=(1,),
    )
    with pytest.raises(ValueError, match="1 entries for 2 rows"):
        HybridDecodeBackend(_Fake("megakernel", 8), _Fake("graph", 32), split=4).decode(bad)
    with pytest.raises(ValueError, match="from_position"):
        HybridDecodeBackend(_Fake("megakernel", 8), _Fake("graph", 32), from_position=-1)
    with pytest.raises(ValueError, match="below_position 512 must be above from_position 1024"):
        HybridDecodeBackend(
            _Fake("megakernel", 8), _Fake("graph", 32), from_position=1024, below_position=512
        )


def test_a_split_the_small_backend_cannot_cover_is_refused():
    with pytest.raises(ValueError, match="at most 8 rows"):
        HybridDecodeBackend(_Fake("megakernel", 8), _Fake("graph", 32), split=10)
    with pytest.raises(ValueError, match="at least one batch size"):
        HybridDecodeBackend(_Fake("megakernel", 8), _Fake("graph", 32), split=1)


def _gpu_model():
    return SimpleNamespace(device=torch.device("cuda"), cfg=None, w=None)


def _loader(fail: set[str], builds: list | None = None):
    def load(candidate: str, model, build: bool) -> _Fake:
        if builds is not None:
            builds.append((candidate, build))
        if candidate in fail:
            raise RuntimeError(f"no {candidate} here")
        return _Fake(candidate, 8 if candidate == "megakernel" else 32)

    return load


def test_auto_runs_both_as_one_hybrid_when_both_load(monkeypatch):
    builds: list = []
    monkeypatch.setattr(runtime, "_load_gpu_backend", _loader(set(), builds))
    backend, name, note = runtime.choose_decode_backend("auto", _gpu_model())
    assert name == "hybrid" and isinstance(backend, HybridDecodeBackend)
    assert backend.split == MEGAKERNEL_BELOW_ROWS and backend.from_position == MEGAKERNEL_FROM_POSITION
    assert backend.below_position == MEGAKERNEL_BELOW_POSITION
    assert backend.small.name == "megakernel" and backend.large.name == "graph"
    assert f"megakernel below {MEGAKERNEL_BELOW_ROWS} rows" in note
    assert builds == [("graph", False), ("megakernel", False)]  # auto never starts an nvcc build


@pytest.mark.parametrize("asked", ["hybrid", "megakernel"])
def test_an_explicit_choice_may_build_the_extension(monkeypatch, asked):
    builds: list = []
    monkeypatch.setattr(runtime, "_load_gpu_backend", _loader(set(), builds))
    _, name, _ = runtime.choose_decode_backend(asked, _gpu_model())
    assert name == asked and ("megakernel", True) in builds


@pytest.mark.parametrize(("missing", "left"), [("megakernel", "graph"), ("graph", "megakernel")])
def test_auto_falls_back_to_the_one_that_loads_and_says_why(monkeypatch, missing, left):
    monkeypatch.setattr(runtime, "_load_gpu_backend", _loader({missing}))
    backend, name, note = runtime.choose_decode_backend("auto", _gpu_model())
    assert name == left and backend.name == left
    assert f"{missing} unavailable (no {missing} here)" in note


def test_auto_without_either_gpu_backend_is_torch(monkeypatch):
    monkeypatch.setattr(runtime, "_load_gpu_backend", _loader({"graph", "megakernel"}))
    model = SimpleNamespace(device=torch.device("cuda"), cfg=None, w=None)
    monkeypatch.setattr(runtime, "TorchDecodeBackend", lambda m: _Fake("torch", 256))
    _, name, note = runtime.choose_decode_backend("auto", model)
    assert name == "torch" and "graph unavailable" in note and "megakernel unavailable" in note


def test_a_geometry_the_megakernel_cannot_run_falls_back_to_the_graph_backend(monkeypatch):
    """A model whose attention the megakernel does not run (here 16 query heads per kv head): the
    real loader refuses it with UnsupportedGeometry before loading or building the extension; `auto`
    runs the graph backend and says why, `--decode megakernel` fails with the reason."""
    from mkcode.backend.gpu import graph_backend
    from mkcode.backend.megakernel import native
    from mkcode.backend.megakernel.backend import UnsupportedGeometry
    from tests.backend.megakernel.cases import tiny_config

    loads: list[bool] = []
    monkeypatch.setattr(native, "load", lambda build_if_missing=True: loads.append(build_if_missing))
    monkeypatch.setattr(graph_backend, "GraphDecodeBackend", lambda model: _Fake("graph", 32))
    cfg = tiny_config(num_attention_heads=32, num_key_value_heads=2)
    model = SimpleNamespace(device=torch.device("cuda"), cfg=cfg, w=None)
    backend, name, note = runtime.choose_decode_backend("auto", model)
    assert name == "graph" and backend.name == "graph"
    assert "megakernel unavailable (the megakernel's attention runs at most 8 query heads" in note
    with pytest.raises(RuntimeError, match="megakernel backend unavailable") as e:
        runtime.choose_decode_backend("megakernel", model)
    assert isinstance(e.value.__cause__, UnsupportedGeometry)
    assert loads == []  # refused before the extension was loaded or built


def test_a_model_the_megakernels_norm_cannot_run_falls_back_to_the_graph_backend(monkeypatch):
    """The norm inside the GEMVs' limits are refused the same way (here a dense layer after layer 0,
    whose sum has no initialiser): before the extension is loaded, `auto` runs the graph backend."""
    from mkcode.backend.gpu import graph_backend
    from mkcode.backend.megakernel import native
    from tests.backend.megakernel.cases import tiny_config

    loads: list[bool] = []
    monkeypatch.setattr(native, "load", lambda build_if_missing=True: loads.append(build_if_missing))
    monkeypatch.setattr(graph_backend, "GraphDecodeBackend", lambda model: _Fake("graph", 32))
    cfg = tiny_config(mlp_layer_types=["dense", "dense"] + ["sparse"] * 4)
    model = SimpleNamespace(device=torch.device("cuda"), cfg=cfg, w=None)
    backend, name, note = runtime.choose_decode_backend("auto", model)
    assert name == "graph" and backend.name == "graph"
    assert "megakernel unavailable (the megakernel's norm inside the GEMVs cannot run this model: " in note
    assert "dense MLP layers [1] after layer 0" in note
    assert loads == []


@pytest.mark.parametrize("asked", ["hybrid", "megakernel", "graph"])
def test_an_explicit_backend_that_does_not_load_is_an_error(monkeypatch, asked):
    monkeypatch.setattr(
        runtime, "_load_gpu_backend", _loader({"megakernel" if asked != "graph" else "graph"})
    )
    with pytest.raises(RuntimeError, match="backend unavailable"):
        runtime.choose_decode_backend(asked, _gpu_model())


def test_gpu_backends_are_refused_on_the_cpu():
    cpu = SimpleNamespace(device=torch.device("cpu"))
    for asked in ("hybrid", "graph", "megakernel"):
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            runtime.choose_decode_backend(asked, cpu)


def test_the_cli_offers_exactly_the_runtime_backends():
    from mkcode.app.settings import DECODES

    assert DECODES == runtime.DECODE_BACKENDS


def test_metrics_count_the_steps_each_backend_ran():
    """/metrics: with a hybrid decode backend, decode steps by the backend that ran them."""
    from mkcode.backend.engine.engine import EngineMetrics
    from mkcode.backend.server.metrics import prometheus_text

    h = HybridDecodeBackend(_Fake("megakernel", 8), _Fake("graph", 32), split=2)
    for rows in (1, 1, 3):
        h.decode(_batch(rows))
    engine = SimpleNamespace(backend=h, metrics=lambda: EngineMetrics())
    text = prometheus_text(SimpleNamespace(engine=engine, requests_total={}))
    assert 'mkcode_engine_decode_steps_total{backend="megakernel"} 2' in text
    assert 'mkcode_engine_decode_steps_total{backend="graph"} 1' in text
    plain = prometheus_text(
        SimpleNamespace(engine=SimpleNamespace(metrics=lambda: EngineMetrics()), requests_total={})
    )
    assert "decode_steps_total" not in plain  # a single backend: nothing to split


class _Costed(_Fake):
    def row_cost(self, rows: int) -> float:
        return {1: 1.0, 2: 1.3, 3: 1.9, 4: 1.9}[rows]


def test_the_step_cost_by_rows_is_the_backend_that_runs_it():
    """The speculation policy's cost model: a plain step runs on the megakernel (cheaper by the
    measured ratio), verify steps of 2+ rows on graph, so a sequence drafts only where its drafts'
    expected tokens outweigh the graph's 2-row step against the megakernel's 1-row one."""
    h = HybridDecodeBackend(_Fake("megakernel", 8), _Costed("graph", 32), split=2)
    assert h.row_cost(1) == pytest.approx(MEGAKERNEL_STEP_RATIO) and h.row_cost(2) == 1.3
    assert h.row_cost(4) == 1.9 and h.small_step_ratio == MEGAKERNEL_STEP_RATIO
    wide = HybridDecodeBackend(_Fake("megakernel", 8), _Costed("graph", 32), split=4, small_step_ratio=0.5)
    assert [wide.row_cost(r) for r in (1, 2, 3, 4)] == [0.5, 0.65, 0.95, 1.9]
    # per-draft acceptance 0.4: one draft pays on graph alone (1.4 / 1.3 > 1), not against a
    # megakernel plain step (1.4 / 1.3 < 1 / 0.86); 0.6 pays on both
    assert choose_draft_counts([0.4], [1], _Costed("graph", 32).row_cost, 8) == [1]
    assert choose_draft_counts([0.4], [1], h.row_cost, 8) == [0]
    assert choose_draft_counts([0.6], [1], h.row_cost, 8) == [1]
    # no cost model when the large backend has none (the engine then uses its adaptive k)
    assert HybridDecodeBackend(_Fake("megakernel", 8), _Fake("graph", 32)).row_cost is None
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="small_step_ratio"):
            HybridDecodeBackend(_Fake("megakernel", 8), _Costed("graph", 32), small_step_ratio=bad)
