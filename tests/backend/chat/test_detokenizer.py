"""IncrementalDetokenizer: the streamed text always equals decode(all ids), never splitting a character."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from mkcode.backend.chat.tokenizer import ChatTokenizer

from .conftest import TEST_VOCAB

_settings = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_settings
@given(ids=hs.lists(hs.integers(0, TEST_VOCAB + 3), max_size=40), skip=hs.booleans())
def test_random_ids_concatenate_to_decode(chat_tok: ChatTokenizer, ids: list[int], skip: bool) -> None:
    """Random ids (often invalid UTF-8 and out-of-range ids) stream to exactly ``decode``'s text."""
    detok = chat_tok.detokenizer(skip_special_tokens=skip)
    pieces = [detok.push(i) for i in ids]
    streamed = "".join(pieces) + detok.flush()
    assert streamed == chat_tok.decode(ids, skip_special_tokens=skip)


@_settings
@given(text=hs.text(hs.characters(blacklist_categories=("Cs",)), max_size=60))
def test_valid_text_never_splits_a_character(chat_tok: ChatTokenizer, text: str) -> None:
    ids = chat_tok.encode(text)
    detok = chat_tok.detokenizer()
    pieces = [detok.push(i) for i in ids]
    assert detok.flush() == ""  # nothing held back at the end of valid text
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces) or "\ufffd" in text


def test_partial_bytes_are_held_back(chat_tok: ChatTokenizer) -> None:
    ids = chat_tok.encode("😀")
    assert len(ids) > 1  # byte-level pieces of a 4-byte character
    detok = chat_tok.detokenizer()
    assert [detok.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1]) == "😀"


def test_truncated_character_flushes_as_replacement(chat_tok: ChatTokenizer) -> None:
    ids = chat_tok.encode("a😀")[:-1]
    detok = chat_tok.detokenizer()
    assert detok.push_many(ids) == "a"
    assert detok.flush() == "\ufffd" == chat_tok.decode(ids)[1:]
