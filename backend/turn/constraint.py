"""The engine's `TokenConstraint`, implemented with llguidance, and the factory that builds them.

`GrammarConstraints` owns one `LLTokenizer` for the checkpoint's tokenizer (built lazily: about a
second for a 262k vocabulary) and a small cache of compiled matchers, copied per request
(`deep_copy` is much cheaper than compiling the tools' schemas again on every agent turn).
A constraint is driven by the engine thread only: `allowed_tokens` → sample → `advance`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Any

import torch

from mkcode.backend.turn.grammar import ANY_OBJECT, TurnSpec, turn_grammar, with_json_options

_BITS = torch.arange(32, dtype=torch.int32)


class GrammarError(ValueError):
    """The grammar (a tool's or response_format's JSON Schema) cannot be compiled."""


def _unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """llguidance's int32 bitmask [ceil(V/32)] → bool mask [V]."""
    return ((bitmask.unsqueeze(-1) >> _BITS) & 1).bool().flatten()[:vocab_size]


class LLGuidanceConstraint:
    """A TokenConstraint over one llguidance matcher."""

    def __init__(self, matcher: Any, vocab_size: int):
        self._matcher = matcher
        self._bitmask = torch.full(((vocab_size + 31) // 32,), -1, dtype=torch.int32)
        self.error: str | None = None

    def allowed_tokens(self, vocab_size: int) -> torch.Tensor | None:
        m = self._matcher
        if m.is_error():
            self.error = m.get_error()
        words = (vocab_size + 31) // 32
        if self._bitmask.numel() < words:
            self._bitmask = torch.zeros(words, dtype=torch.int32)
        view = self._bitmask[:words]
        view.zero_()
        m.unsafe_compute_mask_ptr(view.data_ptr(), words * 4)
        return _unpack(view, vocab_size)

    def advance(self, token_id: int) -> None:
        if not self._matcher.consume_token(token_id) and self.error is None:
            self.error = self._matcher.get_error() or f"token {token_id} rejected by the grammar"

    def is_finished(self) -> bool:
        return self._matcher.is_stopped()


class GrammarConstraints:
    """Builds constraints for one tokenizer (a `ChatTokenizer`) and model vocabulary."""

    def __init__(self, chat_tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], cache_size: int = 32):
        self._chat_tok = chat_tokenizer
        self.vocab_size = max(vocab_size, chat_tokenizer.vocab_size)
        self.eos_ids = eos_ids
        self._ll_tok: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._cache_size = cache_size

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._ll_tok is None:
                import llguidance

                self._ll_tok = llguidance.LLTokenizer(
                    self._chat_tok.tokenizer.to_str(), n_vocab=self.vocab_size, eos_token=list(self.eos_ids)
                )
            return self._ll_tok

    def schema_error(self, schema: dict[str, Any]) -> str:
        """'' when `schema` compiles, else llguidance's message."""
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(with_json_options(schema))
        return llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer())

    def _matcher(self, lark: str) -> Any:
        import llguidance

        with self._lock:
            proto = self._cache.get(lark)
            if proto is not None:
                self._cache.move_to_end(lark)
                return proto.deep_copy()
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        proto = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0)
        if proto.is_error():
            raise GrammarError(proto.get_error())
        with self._lock:
            self._cache[lark] = proto
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return proto.deep_copy()

    def for_turn(self, spec: TurnSpec, *, lenient_tools: bool) -> LLGuidanceConstraint:
        """A constraint for one chat turn. With `lenient_tools` (tool_choice auto), a tool whose
        schema llguidance cannot compile falls back to "any JSON object" instead of failing."""
        if lenient_tools:
            tools = tuple(
                t if not self.schema_error(t.parameters) else type(t)(t.name, ANY_OBJECT) for t in spec.tools
            )
            spec = dataclasses.replace(spec, tools=tools)
        return LLGuidanceConstraint(self._matcher(turn_grammar(spec)), self.vocab_size)
