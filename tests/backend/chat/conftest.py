"""Shared fixtures: one synthetic tokenizer (vocab 2048) trained per test session, saved as a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from mkcode.backend.chat.template import chat_template
from mkcode.backend.chat.tokenizer import ChatTokenizer
from mkcode.backend.chat.tokenizer_synth import save_tokenizer_files, train_synthetic_tokenizer

TEST_VOCAB = 2048


@pytest.fixture(scope="session")
def synth_tokenizer() -> Tokenizer:
    return train_synthetic_tokenizer(TEST_VOCAB, seed=0)


@pytest.fixture(scope="session")
def tokenizer_dir(synth_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer_files(synth_tokenizer, out, chat_template())
    return out


@pytest.fixture(scope="session")
def chat_tok(tokenizer_dir: Path) -> ChatTokenizer:
    return ChatTokenizer(tokenizer_dir)
