"""Decode speed of the tensor/expert-parallel model on N GPUs against one GPU, plus a check that
both give the same logits. Random bf16 weights at the full geometry (`north_mini_code_config()`),
made on each GPU from one seed and then sharded; synthetic KV (docs/PERF.md, Speed of light: the accounting's layout).

    torchrun --standalone --nproc-per-node 4 -m devtools.parallel.gpu_bench --tp 4 --ep 4

Phases: (1) rank 0 alone runs the single-GPU baseline (a world-of-one plan over the full weights,
the same code path) at each batch size and keeps its logits; (2) every rank shards, frees the full
weights, and rank 0 drives the same steps over N GPUs. Both phases start from the same KV contents
and tokens, so the logits must agree up to bf16 summation order.

What it measures is the eager PyTorch path (per-expert Python loop, gathered-KV attention): the
ratio N-GPU / 1-GPU and the collective count are the point, not absolute tok/s (docs/SCALING.md has
the speed-of-light bounds; the per-GPU fast path is the megakernel). `--tiny` runs a reduced
geometry (CPU + gloo works: `torchrun --nproc-per-node 2 -m ... --tiny`) to smoke-test the script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from mkcode.backend.bench.synthetic import reduced_config, synthetic_kv
from mkcode.backend.model.config import ModelConfig, north_mini_code_config
from mkcode.backend.model.weights import random_weights
from mkcode.backend.parallel.comm import Comm
from mkcode.backend.parallel.driver import ParallelModel
from mkcode.backend.parallel.launch import init_distributed
from mkcode.backend.parallel.plan import ShardPlan
from mkcode.backend.parallel.shard import shard_weights
from mkcode.backend.parallel.sharded_model import ShardedModel
from mkcode.backend.parallel.step import StepInputs


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel degree: 1 or world (default world)")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel degree: 1 or world (default world)")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--ctx", type=int, default=1024, help="tokens already in each row's KV")
    p.add_argument("--steps", type=int, default=10, help="timed decode steps per batch size")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="reduced geometry (smoke test; CPU ok)")
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder for bench_parallel.json")
    return p.parse_args()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Case:
    """One batch size's inputs: KV contents, block tables, the tokens fed at each step."""

    def __init__(self, cfg: ModelConfig, batch: int, ctx: int, steps: int, seed: int, device, dtype):
        total = steps + 1
        # pages for every position up to ctx + total; decoding starts at position ctx
        self.kv = synthetic_kv(cfg, [ctx + total] * batch, device=device, dtype=dtype, seed=seed)
        self.full_pool = self.kv.pool.clone()
        self.positions = torch.full((batch,), ctx, dtype=torch.long, device=device)
        g = torch.Generator(device="cpu").manual_seed(seed + batch)
        self.tokens = torch.randint(3, cfg.vocab_size, (total, batch), generator=g).to(device)

    def pool_for(self, kv_heads: range) -> torch.Tensor:
        """A fresh copy of the starting KV for these kv heads."""
        return self.full_pool[:, :, kv_heads.start : kv_heads.stop].clone()

    def step(self, s: int) -> StepInputs:
        return StepInputs.decode(self.tokens[s], self.positions + s, self.kv.block_tables)


def _time_steps(run, case: _Case, warmup: int, steps: int, device) -> tuple[list[float], list[torch.Tensor]]:
    """(ms per timed step, logits of every step). Steps advance positions, so warm-up steps are
    part of the sequence (both phases run the same sequence)."""
    times, logits = [], []
    for s in range(warmup + steps):
        _sync(device)
        t0 = time.perf_counter()
        out = run(case.step(s))
        _sync(device)
        if s >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        logits.append(out.float().cpu())
    return times, logits


def _compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict:
    x, y = torch.stack(a), torch.stack(b)
    cos = torch.nn.functional.cosine_similarity(x.flatten(1), y.flatten(1), dim=-1).min().item()
    top_a, top_b = x.argmax(-1), y.argmax(-1)
    return {
        "max_abs_diff": (x - y).abs().max().item(),
        "min_cosine": cos,
        "greedy_agree": float((top_a == top_b).float().mean()),
        "ok": cos > 0.999 and float((top_a == top_b).float().mean()) >= 0.95,
    }


def main() -> None:
    args = _args()
    comm, device = init_distributed()
    world, rank = comm.world, comm.rank
    plan = ShardPlan(world, rank, tp=args.tp or world, ep=args.ep or world)
    cfg = reduced_config(num_layers=5) if args.tiny else north_mini_code_config()
    plan.validate(cfg)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    batches = [int(b) for b in args.batches.split(",")]
    log = print if rank == 0 else (lambda *a, **k: None)
    log(
        f"[parallel bench] {plan.describe()} on {device.type}; geometry "
        f"{'reduced' if args.tiny else 'full'}; batches {batches}, ctx {args.ctx}, {args.steps} steps"
    )

    t0 = time.perf_counter()
    full = random_weights(cfg, device=device, dtype=dtype, seed=args.seed)
    _sync(device)
    log(f"weights made in {time.perf_counter() - t0:.1f} s")
    cases = {b: _Case(cfg, b, args.ctx, args.warmup + args.steps, args.seed, device, dtype) for b in batches}

    # ---- phase 1: one GPU (rank 0), the same code path with a world-of-one plan ----------------
    base: dict[int, tuple[list[float], list[torch.Tensor]]] = {}
    if rank == 0:
        one = ShardedModel(cfg, shard_weights(cfg, full, ShardPlan(1, 0)), ShardPlan(1, 0), Comm.local())
        for b, case in cases.items():
            one.attach_pool(case.pool_for(range(cfg.num_key_value_heads)))
            base[b] = _time_steps(one.run, case, args.warmup, args.steps, device)
            log(f"  1 GPU  B={b}: {statistics.median(base[b][0]):.1f} ms/step")
        del one
    if world > 1:
        dist.barrier()

    # ---- phase 2: N GPUs --------------------------------------------------------------------
    model = ParallelModel(ShardedModel(cfg, shard_weights(cfg, full, plan), plan, comm))
    del full
    if device.type == "cuda":
        torch.cuda.empty_cache()
    rows = []
    for b, case in cases.items():
        model.shard.attach_pool(case.pool_for(plan.kv_heads(cfg)))
        if rank != 0:
            model.serve()
            continue
        before = comm.collectives
        times, logits = _time_steps(model.run_step, case, args.warmup, args.steps, device)
        per_step = (comm.collectives - before) / (args.warmup + args.steps)
        model.shutdown()  # the workers leave serve() and attach the next batch size's KV
        ms1, msn = statistics.median(base[b][0]), statistics.median(times)
        row = {
            "batch": b,
            "world": world,
            "tp": plan.tp,
            "ep": plan.ep,
            "ms_per_step_1gpu": ms1,
            "ms_per_step_ngpu": msn,
            "tok_s_1gpu": b * 1e3 / ms1,
            "tok_s_ngpu": b * 1e3 / msn,
            "speedup": ms1 / msn,
            "collectives_per_step": per_step,
            "rank0_weight_gb": model.shard.w.nbytes() / 1e9,
            **_compare(base[b][1], logits),
        }
        rows.append(row)
        log(
            f"  {world} GPU B={b}: {msn:.1f} ms/step ({row['tok_s_ngpu']:.1f} tok/s, x{row['speedup']:.2f} "
            f"vs 1 GPU), {per_step:.0f} collectives/step; logits vs 1 GPU: max|d| {row['max_abs_diff']:.3g}, "
            f"min cos {row['min_cosine']:.5f}, greedy agree {row['greedy_agree']:.2f} -> "
            f"{'OK' if row['ok'] else 'MISMATCH'}"
        )
    if rank == 0:
        log(json.dumps(rows, indent=1))
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "bench_parallel.json").write_text(json.dumps(rows, indent=1))
        if not all(r["ok"] for r in rows):
            raise SystemExit("parallel logits differ from the single-GPU run")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
