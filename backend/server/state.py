"""What every endpoint needs: the engine, the tokenizer, the grammar factory and the options."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mkcode.backend.server.options import ServerOptions
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

    @classmethod
    def build(cls, engine: Any, tokenizer: Any, options: ServerOptions) -> ServerState:
        eos = tuple(sorted(set(tokenizer.eos_token_ids) | set(getattr(engine, "eos", ()))))
        grammars = GrammarConstraints(tokenizer, int(engine.cfg.vocab_size), eos)
        return cls(engine=engine, tokenizer=tokenizer, options=options, grammars=grammars)
