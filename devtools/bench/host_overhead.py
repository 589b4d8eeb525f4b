"""Engine host overhead per decode step, on the CPU, without a model.

The engine's own work per step (block tables, page accounting, sampling bookkeeping) must stay far
below a GPU step (~3 ms at BS=1, 8K). This drives the real Engine at the full North Mini Code
geometry with a backend that returns fixed logits, so what is timed is the engine alone plus one
argmax over the vocabulary per step.

    python -m devtools.bench.host_overhead [--batch 8] [--ctx 8000] [--steps 50]
"""

from __future__ import annotations

import argparse
import time

import torch

from mkcode.backend.engine.engine import Engine, EngineOptions
from mkcode.backend.engine.request import GenerationRequest
from mkcode.backend.kv.layout import pages_for
from mkcode.backend.kv.pool import KVPool
from mkcode.backend.model.config import north_mini_code_config
from mkcode.backend.sampling import SamplingParams


class _NoModel:
    """Stands in for the model: prefill returns fixed logits (the engine only needs cfg/device)."""

    def __init__(self, cfg, logits: torch.Tensor):
        self.cfg, self.device, self._logits = cfg, torch.device("cpu"), logits

    def forward(self, token_ids, positions, segments, logits_for=None):
        return self._logits[: len(segments)]


class _FixedBackend:
    name, max_batch = "fixed", 8

    def __init__(self, logits: torch.Tensor):
        self._logits = logits

    def decode(self, batch):
        return self._logits[: batch.size]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args(argv)
    cfg = north_mini_code_config()
    logits = torch.randn(max(args.batch, 1), cfg.vocab_size)
    pages = args.batch * (pages_for(args.ctx + args.steps + 64) + 1) * cfg.num_hidden_layers
    pool = KVPool(pages, cfg.num_hidden_layers, 1, 2)  # page contents are never touched here
    eng = Engine(
        _NoModel(cfg, logits), pool, _FixedBackend(logits), options=EngineOptions(max_prefill_tokens=8192)
    )
    for _ in range(args.batch):
        eng.submit(
            GenerationRequest(
                [5] * args.ctx, SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
            )
        )
    while eng.metrics().decode_tokens_total == 0 or any(not s.decode_ready for s in eng._running):
        eng.step()
    t_argmax = time.perf_counter()
    for _ in range(args.steps):
        logits[: args.batch].argmax(-1).tolist()
    t_argmax = (time.perf_counter() - t_argmax) / args.steps
    t0 = time.perf_counter()
    for _ in range(args.steps):
        eng.step()
    per_step = (time.perf_counter() - t0) / args.steps
    print(
        f"BS={args.batch} ctx={args.ctx} L={cfg.num_hidden_layers}: {per_step * 1e3:.2f} ms/step on the host, "
        f"of which {t_argmax * 1e3:.2f} ms is the CPU argmax a GPU does on the device "
        f"-> engine overhead {(per_step - t_argmax) * 1e3:.2f} ms/step"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
