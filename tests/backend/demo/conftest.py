from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The demo checkpoint that ships with the package (verified; never trained here)."""
    from mkcode.backend.demo import shipped_demo_model

    return shipped_demo_model()
