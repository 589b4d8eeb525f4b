"""Settings of one `mkcode serve` instance (everything the HTTP layer needs besides the runtime)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_BODY_BYTES = 32 << 20  # a long agent conversation with file contents fits easily
DEFAULT_MAX_OUTPUT_TOKENS = 16384  # the most a request that names no max_tokens may generate


def output_cap(context: int, cap: int = DEFAULT_MAX_OUTPUT_TOKENS) -> int:
    """The default output limit for a model of `context` tokens: at most `cap`, and at most a quarter
    of the context (an agent's prompt needs the rest). The server's default and the printed client
    configs use the same rule."""
    return max(1, min(cap, context // 4))


@dataclass
class ServerOptions:
    served_model_name: str = "mkcode"
    # Other names clients may use for the model (`--served-model-name` given several times); a request
    # naming any other model gets 404 model_not_found.
    model_aliases: tuple[str, ...] = ()
    api_key: str | None = None  # when set, every /v1 and /metrics request needs "Bearer <key>"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Sampling defaults for fields a request leaves out (e.g. from the checkpoint's generation_config).
    default_sampling: Mapping[str, Any] = field(default_factory=dict)
    # Output limit of a chat or Responses request that sends no max_tokens / max_output_tokens
    # (Codex sends none): `output_cap(context, default_max_tokens)`. None: up to the end of the context.
    default_max_tokens: int | None = DEFAULT_MAX_OUTPUT_TOKENS
    # Upper bound on the thinking block when a tool call is forced (tool_choice required/named) or
    # structured output is asked for: the answer must come, so the plan cannot run forever.
    forced_thinking_tokens: int = 1024

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.served_model_name, *(a for a in self.model_aliases if a != self.served_model_name))
