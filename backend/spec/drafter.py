"""Prompt-lookup drafts: the sequence's own tokens (prompt + generated) predict its continuation.

A coding agent re-emits text it has seen (an `old_string`, a function rewritten with two lines
changed, quoted command output). When the last `min_ngram` tokens occurred earlier in the sequence,
the tokens that followed that earlier occurrence are proposed as drafts; among the most recent
occurrences the one whose match extends furthest back (up to `max_ngram` tokens) wins, the most
recent on a tie.

The index is incremental, as LZ77 compressors keep theirs: a dict from each `min_ngram`-gram to
the latest position that followed it, and a chain array linking every position to the previous
one with the same n-gram. Each new token costs one dict update; a proposal walks at most
`max_candidates` chain links and compares at most `max_ngram` tokens at each, so its cost does not
grow with the context (a 100K-token prompt is indexed once, on the first proposal).

`AdaptiveK` sets how many drafts to ask for from the recent accepted run lengths.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

MAX_DRAFTS = 7  # a verify step has at most 8 rows: the fed token and 7 drafts


class Drafter(Protocol):
    """Proposes drafts for one sequence (the engine makes one per request)."""

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens predicted to follow `tokens` (the sequence's accepted tokens so far)."""
        ...


@dataclass(frozen=True)
class DrafterConfig:
    min_ngram: int = 3  # the shortest suffix that may match
    max_ngram: int = 8  # matches are compared this far back at most
    max_candidates: int = 8  # earlier occurrences examined per proposal (most recent first)

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram ({self.min_ngram}) <= max_ngram ({self.max_ngram})")
        if self.max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {self.max_candidates}")


class NgramDrafter:
    """The n-gram index of one token sequence that only grows (the engine's accepted tokens: drafts
    are never appended, so the index never has to forget anything)."""

    def __init__(self, config: DrafterConfig | None = None):
        self.config = config or DrafterConfig()
        self._head: dict[tuple[int, ...], int] = {}  # n-gram -> latest position that followed it
        self._prev = array("q")  # _prev[j]: the previous position after the same n-gram, or -1
        self._indexed = 0  # positions [0, _indexed) are in the index

    def update(self, tokens: Sequence[int]) -> None:
        """Index every position of `tokens` not yet indexed (a position j is indexed under the
        n-gram tokens[j-n:j], once tokens[j] exists)."""
        n = self.config.min_ngram
        head, prev = self._head, self._prev
        for j in range(self._indexed, len(tokens)):
            if j < n:
                prev.append(-1)
                continue
            key = tuple(tokens[j - n : j])
            prev.append(head.get(key, -1))
            head[key] = j
        self._indexed = max(self._indexed, len(tokens))

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to `k` draft tokens to follow `tokens` (empty when its suffix never occurred)."""
        cfg = self.config
        if k <= 0 or len(tokens) <= cfg.min_ngram:
            return []
        if len(tokens) < self._indexed:
            raise ValueError(f"the drafter indexed {self._indexed} tokens but got {len(tokens)}")
        self.update(tokens)
        N = len(tokens)
        j = self._head.get(tuple(tokens[N - cfg.min_ngram :]), -1)
        best, best_len, seen = -1, 0, 0
        # every indexed position is < N (the current suffix is indexed once its next token exists)
        while j >= 0 and seen < cfg.max_candidates:
            m = cfg.min_ngram
            while m < cfg.max_ngram and j - m - 1 >= 0 and tokens[j - m - 1] == tokens[N - m - 1]:
                m += 1
            if m > best_len:
                best, best_len = j, m
                if m == cfg.max_ngram:
                    break
            seen += 1
            j = self._prev[j]
        if best < 0:
            return []
        # copy what followed the match; past the end, the copy continues from itself (a period)
        drafts: list[int] = []
        for i in range(k):
            src = best + i
            drafts.append(tokens[src] if src < N else drafts[src - N])
        return drafts


class AdaptiveK:
    """A sequence's recent acceptance, two ways.

    `k`: drafts to ask for next where step time hardly depends on rows: one more than the recent
    mean accepted run (an exponential moving average over verify steps), between 1 and `k_max`. A
    step that accepted every draft counts as a run one longer than its drafts (it might have gone
    on), so full acceptance grows k by about one a step; a rejection at the first draft halves the
    average.

    `alpha`: the per-draft acceptance probability (accepted drafts over accepted drafts plus
    rejections, moving averages), for `policy.choose_draft_counts` where the backend's step time
    depends on its rows. Optimistic at the start (0.8). `skipped` counts steps whose drafts the
    policy declined, so the engine can verify one now and then and let alpha recover."""

    def __init__(self, k_max: int, decay: float = 0.5, alpha_decay: float = 0.7):
        if not 1 <= k_max <= MAX_DRAFTS:
            raise ValueError(f"k must be in [1, {MAX_DRAFTS}], got {k_max}")
        self.k_max = k_max
        self.decay = decay
        self.mean_run = float(k_max)  # optimistic start: the first match gets every draft
        self.alpha_decay = alpha_decay
        self._hits, self._trials = 4.0, 5.0
        self.skipped = 0

    @property
    def alpha(self) -> float:
        return self._hits / self._trials

    @property
    def k(self) -> int:
        return max(1, min(self.k_max, int(self.mean_run) + 1))

    def update(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        run = accepted + 1 if accepted == drafted else accepted
        self.mean_run = self.decay * self.mean_run + (1 - self.decay) * run
        self._hits = self.alpha_decay * self._hits + accepted
        self._trials = self.alpha_decay * self._trials + accepted + (accepted < drafted)
