"""What every endpoint needs: the engine, the tokenizer, the grammar factory and the options."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mkcode.backend.server.errors import APIError
from mkcode.backend.server.options import ServerOptions, output_cap
from mkcode.backend.turn.constraint import GrammarConstraints


@dataclass
class ServerState:
    engine: Any  # mkcode.backend.engine.engine.Engine
    tokenizer: Any  # mkcode.backend.chat.tokenizer.ChatTokenizer
    options: ServerOptions
    grammars: GrammarConstraints
    created: int = field(default_factory=lambda: int(time.time()))
    requests_total: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return self.options.served_model_name

    @property
    def max_model_len(self) -> int:
        return int(self.engine.max_model_len)

    def resolve_model(self, requested: str | None) -> str:
        """The model name to echo for a request naming `requested` (None: the served name); a name
        this server does not serve is a 404 `model_not_found`, as OpenAI and vLLM answer."""
        if requested is None:
            return self.model_name
        if requested not in self.options.model_names:
            served = ", ".join(repr(n) for n in self.options.model_names)
            raise APIError(
                404,
                f"the model {requested!r} does not exist; this server serves {served}",
                param="model",
                code="model_not_found",
            )
        return requested

    def max_tokens(self, requested: int | None) -> int | None:
        """A request's output limit: what it asked for, else the server's default cap."""
        if requested is not None or self.options.default_max_tokens is None:
            return requested
        return output_cap(self.max_model_len, self.options.default_max_tokens)

    @classmethod
    def build(cls, engine: Any, tokenizer: Any, options: ServerOptions) -> ServerState:
        eos = tuple(sorted(set(tokenizer.eos_token_ids) | set(getattr(engine, "eos", ()))))
        grammars = GrammarConstraints(tokenizer, int(engine.cfg.vocab_size), eos)
        return cls(engine=engine, tokenizer=tokenizer, options=options, grammars=grammars)
