"""Settings of one `mkcode serve` instance (everything the HTTP layer needs besides the runtime)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_BODY_BYTES = 32 << 20  # a long agent conversation with file contents fits easily


@dataclass
class ServerOptions:
    served_model_name: str = "mkcode"
    api_key: str | None = None  # when set, every /v1 and /metrics request needs "Bearer <key>"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Sampling defaults for fields a request leaves out (e.g. from the checkpoint's generation_config).
    default_sampling: Mapping[str, Any] = field(default_factory=dict)
    # Upper bound on the thinking block when a tool call is forced (tool_choice required/named) or
    # structured output is asked for: the answer must come, so the plan cannot run forever.
    forced_thinking_tokens: int = 1024
    # Test-only hook: given the normalised chat request, return cmd4 text the model must emit
    # (decoding is then forced token by token through the real engine), or None to decode freely.
    # Lets end-to-end tests script a random-weight model; never set by `mkcode serve`.
    scripted_output: Callable[[dict[str, Any]], str | None] | None = None
    # Test-only, with scripted_output: keep only the prompt's last N tokens (the output is scripted,
    # so the prompt's content does not matter, and CPU tests are spared a 10k-token prefill).
    scripted_prompt_tokens: int | None = None
