"""`mkcode checkpoint synth|inspect`, the light import of the command, the test helper, counts."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from mkcode.app.commands import checkpoint as command
from mkcode.backend.checkpoint import load_checkpoint
from mkcode.backend.checkpoint.stats import param_counts
from mkcode.backend.model.config import north_mini_code_config
from tests.backend.checkpoint.tiny import tiny_checkpoint


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="mkcode")
    command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_synth_then_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ck"
    assert (
        _run(
            "checkpoint",
            "synth",
            "--size",
            "tiny",
            "--out",
            str(out),
            "--seed",
            "3",
            "--experts",
            "per-expert",
        )
        == 0
    )
    assert load_checkpoint(out, progress=False).expert_layout == "per_expert"
    capsys.readouterr()
    assert _run("checkpoint", "inspect", str(out), "--tensors") == 0
    text = capsys.readouterr().out
    for needle in (
        "per_expert",
        "total",
        "active",
        "16 routed, top-4",
        "model.layers.1.mlp.experts.0.gate_proj.weight",
    ):
        assert needle in text, needle


def test_inspect_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("checkpoint", "inspect", str(tmp_path)) == 1
    assert "config.json" in capsys.readouterr().err


def test_command_module_does_not_import_torch() -> None:
    code = "import sys, mkcode.app.commands.checkpoint; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_tiny_checkpoint_helper_is_cached(ckpt_root: Path, tiny_dir: Path, tmp_path: Path) -> None:
    assert tiny_checkpoint(tmp_path, seed=0) == tiny_dir  # cached: not rewritten under tmp_path
    assert not any(tmp_path.iterdir())


def test_param_counts_match_the_release() -> None:
    counts = param_counts(north_mini_code_config())
    assert round(counts.total / 1e9, 1) == 30.5
    assert round(counts.active / 1e9, 1) == 3.3
