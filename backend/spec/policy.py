"""How many of its drafts each sequence verifies, when the backend's step time depends on its rows.

Each sequence carries an estimate a of its per-draft acceptance (`AdaptiveK.alpha`); its j-th
draft adds a^j expected tokens (it counts only if drafts 1..j-1 were accepted). Every sequence's
marginal gains, sorted in descending order across the batch, give the most expected tokens for
n + t rows by taking the first t of them (a sequence's gains fall with j, so that is always a
prefix of each one's drafts); the step takes the t, 0 included, that maximises expected tokens per
unit of step time, `row_cost(n + t)`. Step time is not linear in rows on a GPU (the graph backend
pads to buckets of 1, 2, 4, 8, ... rows, and extra rows route to more experts), so a draft is worth
verifying only where its expected tokens outweigh what its rows add to the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def choose_draft_counts(
    alphas: Sequence[float],
    proposed: Sequence[int],
    row_cost: Callable[[int], float],
    max_rows: int,
) -> list[int]:
    """Drafts to verify per sequence (<= proposed[i]) for the most expected tokens per step time."""
    n = len(alphas)
    gains = sorted(
        ((alphas[i] ** j, i) for i in range(n) for j in range(1, proposed[i] + 1)),
        key=lambda g: -g[0],
    )
    gains = gains[: max(0, max_rows - n)]
    best_t, best_rate, expected = 0, n / row_cost(n), float(n)
    for t, (g, _) in enumerate(gains, start=1):
        expected += g
        rate = expected / row_cost(n + t)
        if rate > best_rate * (1 + 1e-9):
            best_t, best_rate = t, rate
    counts = [0] * n
    for _, i in gains[:best_t]:
        counts[i] += 1
    return counts
