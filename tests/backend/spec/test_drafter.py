"""The prompt-lookup drafter: its proposals equal a brute-force search over the whole sequence, it
prefers the longest and then the most recent match, copies periodically past the end, costs
nothing without a match, and indexes incrementally; AdaptiveK follows the accepted runs."""

from __future__ import annotations

import random

import pytest

from mkcode.backend.spec.drafter import AdaptiveK, DrafterConfig, NgramDrafter


def brute_force(tokens: list[int], k: int, cfg: DrafterConfig) -> list[int]:
    """The drafter's rule by rescanning everything: among the `max_candidates` most recent earlier
    positions j after the last min_ngram tokens, the longest backward match (<= max_ngram), the most
    recent on a tie; drafts copy tokens[j:], periodically past the end."""
    size, n = len(tokens), cfg.min_ngram
    if k <= 0 or size <= n:
        return []
    suffix = tokens[size - n :]
    cands = [j for j in range(size - 1, n - 1, -1) if tokens[j - n : j] == suffix][: cfg.max_candidates]
    best, best_len = -1, 0
    for j in cands:
        m = n
        while m < cfg.max_ngram and j - m - 1 >= 0 and tokens[j - m - 1] == tokens[size - m - 1]:
            m += 1
        if m > best_len:
            best, best_len = j, m
    if best < 0:
        return []
    out: list[int] = []
    for i in range(k):
        out.append(tokens[best + i] if best + i < size else out[best + i - size])
    return out


@pytest.mark.parametrize("cfg", [DrafterConfig(), DrafterConfig(2, 5, 3), DrafterConfig(1, 4, 1)])
def test_incremental_index_equals_brute_force(cfg):
    rng = random.Random(7)
    for trial in range(30):
        vocab = rng.choice([3, 5, 12])
        d = NgramDrafter(cfg)
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
        for _ in range(60):
            k = rng.randrange(0, 8)
            assert d.propose(tokens, k) == brute_force(tokens, k, cfg), (trial, tokens)
            tokens += [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]  # accepted tokens


def test_longest_then_most_recent_match():
    d = NgramDrafter(DrafterConfig(min_ngram=2, max_ngram=6))
    #        long match (5 tokens) then 40   short match (2 tokens) then 50   query suffix
    tokens = [1, 2, 3, 4, 5, 40, 41, 9, 4, 5, 50, 51, 8, 1, 2, 3, 4, 5]
    assert d.propose(tokens, 2) == [40, 41]
    d2 = NgramDrafter(DrafterConfig(min_ngram=2, max_ngram=6))
    tokens = [4, 5, 60, 4, 5, 70, 4, 5]  # equal matches: the most recent wins
    assert d2.propose(tokens, 1) == [70]


def test_no_match_no_drafts_and_periodic_copy():
    d = NgramDrafter(DrafterConfig(min_ngram=3))
    assert d.propose(list(range(100)), 7) == []
    assert d.propose([1, 2], 7) == []
    d = NgramDrafter(DrafterConfig(min_ngram=2))
    assert d.propose([7, 8, 9, 7, 8, 9, 7, 8], 7) == [9, 7, 8, 9, 7, 8, 9]


def test_index_is_incremental_and_never_shrinks():
    d = NgramDrafter()
    tokens = list(range(50)) * 3
    d.propose(tokens, 4)
    assert d._indexed == len(tokens)
    tokens.append(0)
    d.propose(tokens, 4)
    assert d._indexed == len(tokens)
    with pytest.raises(ValueError, match="indexed"):
        d.propose(tokens[:-5], 4)


def test_adaptive_k():
    a = AdaptiveK(7)
    assert a.k == 7
    for _ in range(3):
        a.update(a.k, 0)
    assert a.k == 1  # three rejections at the first draft: mean run 7 -> 0.875
    ks = []
    for _ in range(8):  # every draft accepted: k grows back
        a.update(a.k, a.k)
        ks.append(a.k)
    assert ks == sorted(ks) and ks[0] == 2 and ks[-1] == 7
    a.update(0, 0)  # a step without drafts changes nothing
    assert a.k == 7
    with pytest.raises(ValueError):
        AdaptiveK(8)
    with pytest.raises(ValueError):
        DrafterConfig(min_ngram=4, max_ngram=3)
