"""Device sampling semantics (SAMPLE_ROW): greedy, temperature, top-k, top-p, counter-based noise.

The kernel and the emulator implement exactly this; the tests compare both with it.

Per row, with logits `l` (fp32, already scaled), `m = max(l)` and the row's `SamplingParams`:

- **greedy** when `temperature <= 0`, `top_k == 1` or `top_p <= 0`: the first maximal logit
  (the LM-head tiles' argmax merged: the first maximal tile's).
- otherwise every logit gets the order-preserving uint32 key `key(l)` and
  1. top-k (`0 < top_k < V`): `kth` = the largest key v with `#{key >= v} >= top_k` (the k-th
     largest key; ties at the boundary are kept, so the set can hold more than k tokens);
  2. top-p (`top_p < 1`): with weights `w = exp((l - m) / T)` over the tokens kept by (1) and their
     total `Z`, `pth` = the largest key v with `sum(w[key >= v]) >= top_p * Z` (the smallest
     prefix of the sorted distribution reaching `top_p`, ties kept); when rounding leaves no key
     reaching it, the smallest kept key;
  3. the draw is the Gumbel-max over the kept set `key >= max(kth, pth)`:
     `argmax((l - m) / T + g)`, ties to the lowest token id, with
     `g = -log(-log(u))`, `u = ((bits >> 9) + 0.5) * 2^-23` and `bits` a counter-based hash of
     (seed, step, token id). Same seed + step + logits -> same token, whatever the batch.

Gumbel-max draws token i with probability `w_i / sum(w)` over the kept set, so the draw follows
the filtered, temperature-scaled softmax exactly; each token's score depends only on its own logit
and hash, so kernel and emulator agree except for 1-ulp ties of `log`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mkcode.backend.megakernel import abi

_M1, _M2 = np.uint32(0x7FEB352D), np.uint32(0x846CA68B)
SEED_SALT = 0x9E3779B9
TOKEN_SALT = 0x632BE5AB


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # <= 0: greedy
    top_k: int = 0  # 0 or >= vocab: off
    top_p: float = 1.0  # >= 1: off
    seed: int = 0  # uint64
    step: int = 0  # uint32: e.g. the row's count of generated tokens

    @property
    def greedy(self) -> bool:
        return not self.temperature > 0 or self.top_k == 1 or not self.top_p > 0


def pack(params: Sequence[SamplingParams], rows: int = abi.MK_MAX_TOKENS) -> np.ndarray:
    """The kernel's `sample_params` block: int32 [rows][MK_SP_WORDS] (floats as their bits)."""
    out = np.zeros((rows, abi.MK_SP_WORDS), dtype=np.int32)
    for b, p in enumerate(params):
        seed = int(p.seed) & 0xFFFFFFFFFFFFFFFF
        out[b, abi.MK_SP_SEED_LO] = np.uint32(seed & 0xFFFFFFFF).view(np.int32)
        out[b, abi.MK_SP_SEED_HI] = np.uint32(seed >> 32).view(np.int32)
        out[b, abi.MK_SP_STEP] = np.uint32(int(p.step) & 0xFFFFFFFF).view(np.int32)
        out[b, abi.MK_SP_TOP_K] = max(0, min(int(p.top_k), 2**31 - 1))
        out[b, abi.MK_SP_TEMPERATURE] = np.float32(p.temperature).view(np.int32)
        out[b, abi.MK_SP_TOP_P] = np.float32(p.top_p).view(np.int32)
    return out


def unpack(words: np.ndarray) -> SamplingParams:
    w = np.asarray(words, dtype=np.int32)
    lo = int(w[abi.MK_SP_SEED_LO : abi.MK_SP_SEED_LO + 1].view(np.uint32)[0])
    hi = int(w[abi.MK_SP_SEED_HI : abi.MK_SP_SEED_HI + 1].view(np.uint32)[0])
    return SamplingParams(
        temperature=float(w[abi.MK_SP_TEMPERATURE : abi.MK_SP_TEMPERATURE + 1].view(np.float32)[0]),
        top_k=int(w[abi.MK_SP_TOP_K]),
        top_p=float(w[abi.MK_SP_TOP_P : abi.MK_SP_TOP_P + 1].view(np.float32)[0]),
        seed=lo | (hi << 32),
        step=int(w[abi.MK_SP_STEP : abi.MK_SP_STEP + 1].view(np.uint32)[0]),
    )


# ---- the counter-based hash (uint32 arithmetic wraps in numpy arrays, as in CUDA) ----------------


def mix32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.uint32).copy()
    x ^= x >> np.uint32(16)
    x *= _M1
    x ^= x >> np.uint32(15)
    x *= _M2
    x ^= x >> np.uint32(16)
    return x


def row_key(seed: int | np.ndarray, step: int | np.ndarray) -> np.ndarray:
    seed = np.asarray(seed, dtype=np.uint64)
    lo = (seed & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    hi = (seed >> np.uint64(32)).astype(np.uint32)
    k = mix32(np.atleast_1d(lo ^ np.uint32(SEED_SALT)))
    k = mix32(k ^ np.atleast_1d(hi))
    return mix32(k + np.atleast_1d(np.asarray(step, dtype=np.uint64).astype(np.uint32)))


def gumbel(rk: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Gumbel noise [len(rk), len(tokens)] (float32) for row keys `rk` and token ids."""
    t = mix32(np.asarray(tokens, dtype=np.uint32) + np.uint32(TOKEN_SALT))
    bits = mix32(np.asarray(rk, dtype=np.uint32)[:, None] ^ t[None, :])
    u = ((bits >> np.uint32(9)).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / 8388608.0)
    return -np.log(-np.log(u))


def keys(logits: np.ndarray) -> np.ndarray:
    """Order-preserving uint32 keys of fp32 values."""
    u = np.ascontiguousarray(logits, dtype=np.float32).view(np.uint32)
    neg = (u >> np.uint32(31)).astype(bool)
    return np.where(neg, ~u, u | np.uint32(0x80000000)).astype(np.uint32)


def select_key(k: np.ndarray, w: np.ndarray, target: float) -> int:
    """Largest key v with sum(w[k >= v]) >= target (ties grouped); the smallest key when none."""
    order = np.argsort(-k.astype(np.int64), kind="stable")
    ks, cum = k[order], np.cumsum(w[order].astype(np.float64))
    ends = np.flatnonzero(np.append(ks[1:] != ks[:-1], True))  # last index of each tie group
    hit = ends[cum[ends] >= target]
    return int(ks[hit[0]]) if len(hit) else int(ks[-1])


def kept_mask(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The filtered set (bool [V]) of a non-greedy row."""
    lg = np.asarray(logits, dtype=np.float32)
    V = lg.shape[0]
    k = keys(lg)
    kth = 0
    if 0 < p.top_k < V:
        kth = select_key(k, np.ones(V, np.float32), float(p.top_k))
    if p.top_p < 1:
        m = lg.max()
        T = np.float32(p.temperature)
        inside = k >= kth
        w = np.where(inside, np.exp((lg - m) / T), np.float32(0)).astype(np.float32)
        Z = float(w.astype(np.float64).sum())
        pth = select_key(k[inside], w[inside], float(np.float32(p.top_p)) * Z)
        kth = max(kth, pth)
    return k >= kth


def sample_row(logits: np.ndarray, p: SamplingParams, seeds=None, steps=None) -> np.ndarray:
    """Tokens (int64 [S]) for one row's logits; `seeds`/`steps` override p.seed/p.step with arrays
    (many draws of one distribution, for the statistical tests)."""
    lg = np.asarray(logits, dtype=np.float32)
    seeds = np.atleast_1d(np.asarray(p.seed if seeds is None else seeds, dtype=np.uint64))
    steps = np.broadcast_to(np.asarray(p.step if steps is None else steps, dtype=np.uint64), seeds.shape)
    if p.greedy:
        return np.full(seeds.shape, int(np.argmax(lg)), dtype=np.int64)
    idx = np.flatnonzero(kept_mask(lg, p))
    m = lg.max()
    base = ((lg[idx] - m) / np.float32(p.temperature)).astype(np.float32)
    score = base[None, :] + gumbel(row_key(seeds, steps), idx)
    return idx[np.argmax(score, axis=1)].astype(np.int64)  # argmax: first of equal maxima


def filtered_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The distribution a non-greedy row is drawn from (float64 [V]), computed independently of
    the key machinery (sort + softmax), for the tests."""
    lg = np.asarray(logits, dtype=np.float64)
    V = lg.shape[0]
    keep = np.ones(V, bool)
    if 0 < p.top_k < V:
        keep &= lg >= np.sort(lg)[::-1][p.top_k - 1]
    w = np.where(keep, np.exp((lg - lg.max()) / p.temperature), 0.0)
    if p.top_p < 1:
        order = np.argsort(-lg, kind="stable")
        cum = np.cumsum(w[order]) / w.sum()
        n = int(np.searchsorted(cum, p.top_p - 1e-12)) + 1  # the smallest prefix reaching top_p
        thr = lg[order[n - 1]]
        keep &= lg >= thr
        w = np.where(keep, w, 0.0)
    return w / w.sum()
