"""Accepting drafts: which of a verify step's tokens a sequence keeps.

A verify step feeds a sequence's last token and its drafts d_0..d_{k-1} as rows 0..k at positions
L..L+k; row i's logits are the target's distribution p_i for position L+i+1 given every token
before it, the drafts included. Rows are read in order: row i's token t_i is drawn from p_i with
the request's own sampler (greedy: the argmax); t_i is emitted; if t_i == d_i the draft is
accepted and row i+1 is read, otherwise the step ends (row i+1 was conditioned on a token that is
not the sequence's). So a step emits the accepted drafts and one more token (the correction, or the
bonus token after the last draft).

Exactness. Greedy: the emitted tokens are the argmax chain a plain decode would produce. Sampling
(temperature, top-k, top-p applied to p_i exactly as without speculation): the draft is a point
mass on d_i, for which the speculative-sampling rule is "accept d_i with probability p_i(d_i); on
rejection draw from p_i with d_i removed and renormalised". Drawing t ~ p_i and accepting iff
t == d_i is that rule: P(accept) = p_i(d_i), and given rejection t is distributed as
p_i(x) / (1 - p_i(d_i)) over x != d_i. The sampler draws t by an exponential race with one noise
vector per emitted token from the request's generator, the same draws in the same order as
without speculation, so a seeded request emits the same tokens with speculation on or off (as far
as the verify step's logits equal the plain step's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class VerifyOutcome:
    emitted: list[int]  # tokens the sequence keeps, in order
    accepted: int  # drafts among them
    finished: bool  # the sequence stopped inside the run (EOS, stop string, max_tokens)


def accept_drafts(
    drafts: Sequence[int],
    token_of_row: Callable[[int], int],
    emit: Callable[[int, int], bool],
) -> VerifyOutcome:
    """Read rows 0..len(drafts) in order. `token_of_row(i)` draws row i's token (called once per
    row read, in order: a sampler consumes its random stream exactly as plain decoding does);
    `emit(i, token)` hands the token to the sequence as soon as it is accepted and returns True when
    the sequence finished, which ends the step there (tokens after a stop are never drawn)."""
    emitted: list[int] = []
    accepted = 0
    for i in range(len(drafts) + 1):
        tok = token_of_row(i)
        emitted.append(tok)
        hit = i < len(drafts) and tok == drafts[i]
        accepted += hit
        if emit(i, tok):
            return VerifyOutcome(emitted, accepted, True)
        if not hit:
            break
    return VerifyOutcome(emitted, accepted, False)
