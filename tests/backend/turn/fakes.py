"""Injected fakes for the turn pipeline: a scripted engine (no model at all) and a scripted pipeline
(a real engine forced to write a script, for end-to-end tests with a random-weight checkpoint).

`ScriptedEngine` has the engine's interface as the pipeline uses it (`submit`, `cancel`,
`max_model_len`, `cfg.vocab_size`, `start`): every request streams the next scripted text, one token
per event (tokenised and detokenised by the real tokenizer), then finishes with `stop` and the usage.
It records every request it got, so tests can check the prompt and the grammar constraint.

`ScriptedPipeline` is the real `TurnPipeline` whose prepared request is forced, token by token, to the
script's text for that request (`ScriptedConstraint`), optionally with the prompt cut to its last
tokens (the output does not depend on it and a CPU prefill of a long agent prompt is slow).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from mkcode.backend.engine.request import FinishEvent, TokenEvent
from mkcode.backend.turn.pipeline import TurnPipeline
from mkcode.backend.usage import Usage


class ScriptedStream:
    def __init__(self, request_id: str, events: list[Any], engine: ScriptedEngine) -> None:
        self.request_id = request_id
        self._events = events
        self._engine = engine
        self.finished = False

    async def __aiter__(self):
        for ev in self._events:
            await asyncio.sleep(0)
            if self.request_id in self._engine.cancelled:
                return
            if isinstance(ev, FinishEvent):
                self.finished = True
            yield ev


class ScriptedEngine:
    """Streams scripted texts, one per request, in order (the last one repeats)."""

    def __init__(self, tokenizer: Any, texts: list[str], max_model_len: int = 65536) -> None:
        self.tokenizer = tokenizer
        self.texts = list(texts)
        self.max_model_len = max_model_len
        self.cfg = SimpleNamespace(vocab_size=tokenizer.vocab_size)
        self.eos = tuple(tokenizer.eos_token_ids)
        self.requests: list[Any] = []
        self.cancelled: set[str] = set()

    def start(self) -> ScriptedEngine:
        return self

    def submit(self, request: Any) -> ScriptedStream:
        text = self.texts[min(len(self.requests), len(self.texts) - 1)]
        self.requests.append(request)
        ids = self.tokenizer.encode(text)[: request.sampling.max_tokens]
        detok = self.tokenizer.detokenizer()
        events: list[Any] = [TokenEvent([i], detok.push(i)) for i in ids]
        events.append(TokenEvent([], detok.flush()))
        reason = "length" if len(ids) < len(self.tokenizer.encode(text)) else "stop"
        events.append(FinishEvent(reason, Usage(len(request.prompt_ids), len(ids))))
        return ScriptedStream(request.request_id, events, self)

    def cancel(self, request_id: str) -> None:
        self.cancelled.add(request_id)


class ScriptedConstraint:
    """Forces one exact token sequence, then the end of the turn."""

    def __init__(self, token_ids: list[int], eos_ids: tuple[int, ...]) -> None:
        self._ids = list(token_ids)
        self._eos = eos_ids
        self._pos = 0

    def allowed_tokens(self, vocab_size: int) -> torch.Tensor | None:
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        if self._pos < len(self._ids):
            mask[self._ids[self._pos]] = True
        else:
            mask[list(self._eos)] = True
        return mask

    def advance(self, token_id: int) -> None:
        self._pos += 1

    def is_finished(self) -> bool:
        return self._pos >= len(self._ids)


Script = Callable[[dict[str, Any]], "str | None"]


class ScriptedPipeline(TurnPipeline):
    """A `TurnPipeline` whose requests the engine must answer with `script(request)`'s text (None:
    decode freely). `script` gets {"messages", "tools", "tool_choice"} of the request."""

    def __init__(self, *args: Any, script: Script, keep_prompt_tokens: int | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.script = script
        self.keep_prompt_tokens = keep_prompt_tokens

    def prepare(self, request):
        prepared = super().prepare(request)
        text = self.script(
            {"messages": request.messages, "tools": request.tools, "tool_choice": request.tool_choice}
        )
        if text is not None:
            req = prepared.request
            req.constraint = ScriptedConstraint(self.tokenizer.encode(text), self.grammars.eos_ids)
            if self.keep_prompt_tokens:
                req.prompt_ids = req.prompt_ids[-self.keep_prompt_tokens :]
        return prepared


def install_scripted(app: Any, script: Script, keep_prompt_tokens: int | None = None) -> None:
    """Make a server app (`create_app(...)`) answer through a `ScriptedPipeline`."""
    from mkcode.backend.server.turn import pipeline

    state = app.state.mkcode
    base = pipeline(state)
    state.turn_pipeline = ScriptedPipeline(
        state.engine,
        state.tokenizer,
        options=base.options,
        grammars=base.grammars,
        script=script,
        keep_prompt_tokens=keep_prompt_tokens,
    )
