"""`mkcode bench spec` pieces on the CPU: expected tokens per verify step, the verify rows' block
tables, the drafter cost figures, the whole bench at a reduced geometry through the graph
backend's torch twins, and the command's argument checks."""

from __future__ import annotations

import pytest
import torch

from mkcode.app.cli import main
from mkcode.backend.bench.spec import (
    SpecBenchOptions,
    drafter_cost,
    expected_tokens,
    run_spec_bench,
    verify_tables,
)
from mkcode.backend.bench.synthetic import reduced_config
from mkcode.backend.kv.layout import NO_PAGE


def test_expected_tokens():
    assert expected_tokens(1.0, 7) == 8
    assert expected_tokens(0.0, 7) == 1
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-12


def test_verify_tables_share_pages_and_cover_the_window():
    cfg = reduced_config()  # sliding window 96
    tables, positions, used = verify_tables(cfg, 300, 7, 2, "cpu")
    assert positions.tolist() == [300 + i for i in range(8)] * 2
    assert tables.shape == (cfg.num_hidden_layers, 16, 307 // 64 + 1)
    assert (tables[:, :8] == tables[:, :1]).all() and (tables[:, 8:] == tables[:, 8:9]).all()
    for layer in range(cfg.num_hidden_layers):
        first = 0 if cfg.window(layer) is None else (300 - cfg.window(layer) + 1) // 64
        row = tables[layer, 0].tolist()
        assert all(p == NO_PAGE for p in row[:first]) and all(p >= 0 for p in row[first:])
    assert used == int((tables[:, [0, 8]] >= 0).sum())


def test_drafter_cost_figures():
    d = drafter_cost(4096, steps=200)
    assert d["context"] == 4096 and 0 < d["us_per_step_median"] <= d["us_per_step_p99"]
    assert 0.2 < d["steps_with_drafts"] <= 1.0


def test_bench_runs_on_the_graph_twins():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rep = run_spec_bench(
            SpecBenchOptions(
                contexts=[100],
                ks=[1, 3],
                alphas=[0.5, 1.0],
                batches=[1, 2],
                steps=1,
                warmup=0,
                config=reduced_config(2),
                device="cpu",
                engine_tokens=24,
            ),
            log=lambda _s: None,
        )
    finally:
        torch.set_num_threads(n)
    res = rep["results"]
    assert {r["backend"] for r in res} == {"graph"}
    assert [(r["batch"], r["k"], r["rows"]) for r in res] == [
        (1, 0, 1),
        (1, 1, 2),
        (1, 3, 4),
        (2, 0, 2),
        (2, 1, 4),
        (2, 3, 8),
    ]
    for r in res:
        assert r["ms_per_step"] > 0 and r["pct_sol"] > 0
        full = r["effective"]["1.0"]
        assert full["tokens_per_step"] == r["k"] + 1
        assert abs(full["pct_of_plain"] - 100 * (r["k"] + 1) / r["cost_vs_plain"]) < 1e-6
    assert [d["context"] for d in rep["drafter"]] == [1024, 32768, 131072]
    eng = rep["engine"][0]
    assert eng["off"]["tokens"] == 24 and eng["off"]["verify_steps"] == 0
    assert eng["oracle"]["same_tokens"] and eng["ngram"]["same_tokens"]
    assert eng["oracle"]["accepted_tokens"] == eng["oracle"]["draft_tokens"] > 0


def test_command_checks_and_drafter_only(capsys):
    assert main(["bench", "spec", "--k", "8"]) == 2
    assert main(["bench", "spec", "--alpha", "1.5"]) == 2
    assert main(["bench", "spec", "--backend", "graph,vllm"]) == 2
    assert main(["bench", "spec", "--drafter-only"]) == 0
    assert "us/step" in capsys.readouterr().out


def test_the_megakernel_is_timed_only_on_a_gpu():
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        run_spec_bench(SpecBenchOptions(contexts=[100], backends=["graph", "megakernel"], device="cpu"))
    with pytest.raises(ValueError, match="graph or megakernel"):
        run_spec_bench(SpecBenchOptions(contexts=[100], backends=["torch"], device="cpu"))
