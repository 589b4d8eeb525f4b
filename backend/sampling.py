"""Sampling parameters and the token sampler (greedy, temperature, top-k, top-p, seed).

Each request owns a `torch.Generator` seeded from its `seed` (or from fresh entropy), so a seeded
request draws the same tokens whatever else is in its batch. Sampling is exact: top-k and top-p
filter the distribution, then one token is drawn by the exponential-race method (argmax of
p / Exp(1) noise), which needs one random vector per row and no sort for the draw itself.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, fields
from typing import Any

import torch


class SamplingError(ValueError):
    """Invalid sampling parameters, with the field and the allowed range."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # (0, 1]
    top_k: int = 0  # 0 = no limit
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> SamplingError:
            return SamplingError(f"invalid {name}={getattr(self, name)!r}: {why}")

        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", "must be an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature <= 100:
            raise bad("temperature", "must be a number in [0, 100]")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise bad("top_p", "must be a number in (0, 1]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", "must be an integer >= 0 (0 = no limit)")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise bad("seed", "must be an integer")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "must be non-empty strings")
        if len(self.stop) > 16:
            raise bad("stop", "at most 16 stop strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        """Build from a JSON-like dict; unknown keys are an error naming them."""
        names = {f.name for f in fields(cls)} - {"extra"}
        unknown = sorted(set(d) - names)
        if unknown:
            raise SamplingError(f"unknown sampling field(s) {unknown}; known: {sorted(names)}")
        kw = dict(d)
        if "stop" in kw:
            stop = kw["stop"]
            kw["stop"] = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if "stop_token_ids" in kw:
            kw["stop_token_ids"] = tuple(kw["stop_token_ids"] or ())
        return cls(**kw)

    def make_generator(self, device: torch.device | str) -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed(self.seed if self.seed is not None else secrets.randbits(63))
        return g


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Return probabilities [V] (fp32) after temperature, top-k and top-p (nucleus) filtering."""
    x = logits.float() / max(temperature, 1e-6)
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        drop_sorted = (cum - sorted_p) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum()
    return probs


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Draw one token id from logits [V] according to params."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = filter_logits(logits, params.temperature, params.top_k, params.top_p)
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return int(torch.argmax(probs / noise))
