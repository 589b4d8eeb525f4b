"""Token accounting, shared by the engine, the turn pipeline, the server and the agent.

One `Usage` per model call (the engine fills it when a request finishes); the agent sums them over a
turn or a session with `add`. `SpecUsage` is the speculative-decoding part, set only when the request
speculated. Plain dataclasses, no torch: the agent imports this at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SpecUsage:
    """One request's speculative decoding: its steps with drafts, drafts verified and accepted."""

    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_verify(self) -> float:
        """Tokens emitted per step with drafts (accepted drafts + the one the step always gives)."""
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "verify_steps": self.verify_steps,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_verify": round(self.tokens_per_verify, 4),
        }


@dataclass
class Usage:
    """Token counts: of one model call, or summed over a turn or a session."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from a prefix cache, when the backend says
    speculative: SpecUsage | None = None  # None: the request did not speculate

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_tokens += other.cached_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "total_tokens": self.total_tokens,
        }
