"""The demo checkpoint's tokenizer (shipped with the package; no weights are loaded)."""

from __future__ import annotations

import pytest

from mkcode.backend.chat.tokenizer import ChatTokenizer


@pytest.fixture(scope="session")
def tok() -> ChatTokenizer:
    from mkcode.backend.demo import shipped_demo_model

    return ChatTokenizer(shipped_demo_model())
