from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The cached demo checkpoint (trained on first use: 2-3.5 minutes on two cores)."""
    from mkcode.backend.demo import ensure_demo_model

    return ensure_demo_model()
