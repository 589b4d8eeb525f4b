"""The synthetic tokenizer: exact size, deterministic, special-token layout, loadable checkpoint files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from mkcode.backend.chat import special_tokens as st
from mkcode.backend.chat.template import chat_template
from mkcode.backend.chat.tokenizer_synth import MIN_VOCAB, train_synthetic_tokenizer

from .conftest import TEST_VOCAB


def test_deterministic(synth_tokenizer: Tokenizer) -> None:
    again = train_synthetic_tokenizer(TEST_VOCAB, seed=0)
    assert again.to_str() == synth_tokenizer.to_str()


def test_seed_changes_corpus(synth_tokenizer: Tokenizer) -> None:
    assert train_synthetic_tokenizer(TEST_VOCAB, seed=1).to_str() != synth_tokenizer.to_str()


def test_layout(synth_tokenizer: Tokenizer) -> None:
    assert synth_tokenizer.get_vocab_size() == TEST_VOCAB
    for i, token in enumerate(st.BASE_TOKENS):
        assert synth_tokenizer.token_to_id(token) == i
    first_chat = TEST_VOCAB - len(st.CHAT_TOKENS)
    for i, token in enumerate(st.CHAT_TOKENS):
        assert synth_tokenizer.token_to_id(token) == first_chat + i
    text = "def f(x):\n    return {'é': x}  # 😀\t\x00"
    assert synth_tokenizer.decode(synth_tokenizer.encode(text).ids) == text


def test_too_small_vocab_rejected() -> None:
    with pytest.raises(ValueError):
        train_synthetic_tokenizer(MIN_VOCAB - 1)


def test_saved_files(tokenizer_dir: Path) -> None:
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == chat_template()
    assert config["eos_token"] == st.END_OF_TURN
    assert config["bos_token"] == st.BOS
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["add_bos_token"] is False
    assert Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size() == TEST_VOCAB


def test_transformers_loads_special_ids(tokenizer_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert hf.eos_token == st.END_OF_TURN
    assert hf.convert_tokens_to_ids(st.END_OF_TURN) == TEST_VOCAB - len(st.CHAT_TOKENS) + 1
    ids = hf.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True
    )
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert ids[0] == hf.convert_tokens_to_ids(st.BOS)  # from the template, not added twice
    assert ids[1] != ids[0]
