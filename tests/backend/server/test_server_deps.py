"""The server suite's packages are declared dependencies and installed: a missing one fails here,
by name (the other server test files are not even collected without them: conftest.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.backend.server.conftest import MISSING, REQUIRED

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def test_server_dependencies_are_declared_and_installed():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    declared = _names(project["dependencies"]) | _names(project["optional-dependencies"]["test"])
    assert not set(REQUIRED) - declared, (
        f"not in pyproject (dependencies or the test extra): {set(REQUIRED) - declared}"
    )
    assert not MISSING, f"server tests cannot run: missing {', '.join(MISSING)} (pip install -e '.[test]')"
