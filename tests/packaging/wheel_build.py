"""Building mkcode's wheel from this working tree, and installing it into a fresh venv that borrows
the test environment's dependencies (torch and the rest are not downloaded again)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the wheel is built from: the sdist's inputs (MANIFEST.in), copied so the build writes nothing
# (build/, *.egg-info) into the shared working tree.
SOURCE_ENTRIES = ("app", "backend", "tools", "csrc", "setup.py", "pyproject.toml", "README.md", "MANIFEST.in")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info", "build")


def build_wheel(work: Path) -> Path:
    """The wheel built (no isolation, no dependencies) from a copy of the source; its path."""
    src = work / "src"
    for entry in SOURCE_ENTRIES:
        path = REPO / entry
        if path.is_dir():
            shutil.copytree(path, src / entry, ignore=_IGNORE)
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / entry)
    dist = work / "dist"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(dist),
        ".",
    ]
    run = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = dist.glob("mkcode-*.whl")
    return wheel


def install_wheel(wheel: Path, venv: Path) -> Path:
    """A fresh venv with only this wheel installed in it (no pip of its own); the test environment's
    site-packages is appended to its path by a .pth file, for the dependencies. Returns its python."""
    run = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    python = venv / "bin" / "python"
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A plain path line: the .pth files in there (the editable install's finder) are not run, so
    # `mkcode` can only come from the wheel.
    (Path(purelib) / "mkcode_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def clean_env(home: Path) -> dict[str, str]:
    """The environment for commands run from the installed venv: an empty home and cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MKCODE_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), XDG_CONFIG_HOME=str(home / ".config"))
    return env
