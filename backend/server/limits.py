"""The prompt-size check that runs before any tokenising: a prompt whose text alone cannot fit the
context is refused at once, whatever its size.

Every byte of a message's text ends up in the rendered prompt, and no ordinary token of the
vocabulary spans more than `max_token_bytes(tokenizer)` bytes, so `text bytes // that` is a floor on
the prompt's token count. Refusing when the floor reaches the context is exact (never refuses a
prompt that fits) and costs one pass over the strings: a 5 MB body is answered in milliseconds
instead of after minutes of tokenising.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from mkcode.backend.server.errors import bad_request


@lru_cache(maxsize=8)
def _longest_token(tokenizer: Any) -> int | None:
    try:
        from mkcode.backend.chat.tokenizer import byte_level_table

        pieces, _ = byte_level_table(tokenizer.tokenizer)
    except (AttributeError, ValueError, ImportError):
        return None
    added = set(tokenizer.tokenizer.get_added_tokens_decoder())
    return max((len(p) for i, p in enumerate(pieces) if i not in added), default=0) or None


def max_token_bytes(tokenizer: Any) -> int | None:
    """The most bytes one ordinary (not added) token decodes to; None when unknown (not byte-level)."""
    return _longest_token(tokenizer)


def text_bytes(values: Iterable[Any]) -> int:
    """UTF-8 bytes of every string inside `values` (nested dicts and lists; keys not counted)."""
    total = 0
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v.encode("utf-8", "surrogatepass"))
        elif isinstance(v, Mapping):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return total


def check_prompt_fits(tokenizer: Any, max_model_len: int, texts: Iterable[Any], param: str) -> None:
    """400 context_length_exceeded when the strings in `texts` alone need at least the whole context."""
    longest = max_token_bytes(tokenizer)
    if not longest:
        return
    size = text_bytes(texts)
    floor = size // longest
    if floor >= max_model_len:
        raise bad_request(
            f"the prompt holds {size} bytes of text, at least {floor} tokens; the model's context is "
            f"{max_model_len} tokens",
            param=param,
            code="context_length_exceeded",
        )
