from __future__ import annotations

from pathlib import Path

import pytest

from mkcode.tools import ToolRegistry, Workspace


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "README.md").write_text("# Demo\n")
    (tmp_path / "notes.txt").write_text("remember the milk\n")
    return tmp_path


@pytest.fixture
def registry(workspace: Path) -> ToolRegistry:
    return ToolRegistry(Workspace(str(workspace)), mode="ask")


async def collect(agen) -> list:
    return [ev async for ev in agen]
