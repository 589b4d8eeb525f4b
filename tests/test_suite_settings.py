"""Suite settings: torch and OpenMP run one thread (tests/conftest.py), here and in subprocesses;
`slow` tests are deselected unless asked for (pyproject's addopts; CI runs `-m slow` as well)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_torch_runs_one_thread_here_and_in_subprocesses() -> None:
    import os

    import torch

    assert torch.get_num_threads() == 1
    assert os.environ["OMP_NUM_THREADS"] == "1"  # what a subprocess's torch starts with


def _collected(tmp: Path, *args: str) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp)]
    cmd += ["--collect-only", "-q", "-p", "no:cacheprovider", *args, str(tmp / "test_marks.py")]
    out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=120)
    return [line.split("::")[-1] for line in out.stdout.splitlines() if "::" in line]


def test_slow_tests_run_only_when_asked_for(tmp_path: Path) -> None:
    (tmp_path / "test_marks.py").write_text(
        "import pytest\n\n\ndef test_quick():\n    pass\n\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n"
    )
    assert _collected(tmp_path) == ["test_quick"]  # pyproject's addopts
    assert _collected(tmp_path, "-m", "slow") == ["test_slow"]
