"""Says plainly when the server suite cannot run because its packages are not installed."""

from __future__ import annotations

import pytest

from tests.backend.server.conftest import MISSING


def test_server_dependencies_installed():
    if MISSING:
        pytest.skip(f"server tests skipped: missing {', '.join(MISSING)} (pip install -e '.[test]')")
