"""Codebase health checks that run in CI: formatting and lint (ruff), the import boundaries of
docs/ENGINE.md, Layout (import-linter contracts in pyproject.toml), and `mkcode --help` without torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    if exe.exists():
        return str(exe)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed (it is in the [test] extra)")
    return found


def test_ruff_format_clean():
    r = subprocess.run([_tool("ruff"), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_lint_clean():
    r = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_contracts(tmp_path):
    """import-linter contracts (pyproject.toml) over a plain copy of the tree laid out as the
    installed `mkcode` package: grimp cannot see through the editable install's import hook."""
    pkg = tmp_path / "mkcode"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for folder in ("app", "backend", "tools"):
        shutil.copytree(ROOT / folder, pkg / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run(
        [_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BROKEN" not in r.stdout


def test_help_and_version_do_not_import_torch():
    code = (
        "import sys\n"
        "from mkcode.app.cli import main\n"
        "for argv in (['--help'], ['--version']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = [m for m in ('torch', 'textual', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "mkcode" in r.stdout


def test_console_script_version():
    exe = Path(sys.executable).parent / "mkcode"
    if not exe.exists():
        pytest.skip("console script not installed in this environment")
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("mkcode ")
