"""The graph backend's decode step kernel by kernel, on the GPU (`python -m
devtools.bench.graph_profile --batch 8 --ctx 8192 --out DIR`): what the megakernel's layer is
measured against, phase by phase (docs/MEGAKERNEL.md: the megakernel's own timeline splits its layer
the same way).

torch.profiler (CUPTI) records the kernels of a few CUDA-graph replays at the release geometry
(random weights and synthetic KV, as `mkcode bench decode` makes them). Printed: each kernel name's
launches and GPU time per step, and one middle layer's kernels in order with their start offsets,
durations and the idle gaps before them. A benchmark script, never a timed test; profiling adds
nothing between a graph's kernels, but the absolute step time is the harness's to report.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import torch


def kernel_records(prof) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every GPU kernel the profiler saw, in start order."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
            out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    out.sort(key=lambda r: r[1])
    return out


def per_kernel(recs: list[tuple[str, float, float]], steps: int) -> list[dict]:
    """Per kernel name: launches and GPU microseconds per step, mean duration; largest total first."""
    agg: dict[str, list[float]] = defaultdict(list)
    for name, t0, t1 in recs:
        agg[name].append(t1 - t0)
    rows = [
        {"name": n, "per_step": len(d) / steps, "us_per_step": sum(d) / steps, "mean_us": sum(d) / len(d)}
        for n, d in agg.items()
    ]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def layer_slice(recs: list[tuple[str, float, float]], steps: int, layers: int, layer: int) -> list[dict]:
    """One step's kernels (the second recorded step), cut at each launch of the first kernel that
    runs exactly `layers` times per step (once per layer), and run `layer` of those cuts: per kernel
    its name, start offset from the run's first kernel, duration and the gap since the previous
    kernel ended (any kernel of the step). [] when no kernel runs `layers` times or past the last."""
    per = len(recs) // steps
    step = recs[per : 2 * per] if steps > 1 else recs[:per]
    counts = Counter(name for name, _, _ in step)  # in order of first launch
    marker = next((n for n, c in counts.items() if c == layers), None)
    if marker is None:
        return []
    starts = [i for i, (n, _, _) in enumerate(step) if n == marker]
    if layer >= len(starts) - 1:
        return []
    lo, hi = starts[layer], starts[layer + 1]
    base = step[lo][1]
    rows = []
    for i in range(lo, hi):
        name, t0, t1 = step[i]
        prev_end = step[i - 1][2] if i > 0 else t0
        rows.append(
            {"name": name, "start_us": t0 - base, "dur_us": t1 - t0, "gap_us": max(0.0, t0 - prev_end)}
        )
    return rows


def run(batch: int, ctx: int, steps: int, layer: int, out: Path | None) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from mkcode.backend.bench.synthetic import bench_model, synthetic_kv
    from mkcode.backend.engine.decode_backend import DecodeBatch
    from mkcode.backend.gpu.graph_backend import GraphDecodeBackend
    from mkcode.backend.model.config import north_mini_code_config

    cfg = north_mini_code_config()
    dev = torch.device("cuda")
    model = bench_model(cfg, device=dev, routing="uniform", seed=0)
    kv = synthetic_kv(cfg, [ctx] * batch, device=dev)  # its own pool, filled N(0, 0.01)
    gen = torch.Generator(device=dev).manual_seed(batch)
    b = DecodeBatch(
        token_ids=torch.randint(0, cfg.vocab_size, (batch,), device=dev, generator=gen),
        positions=kv.positions,
        block_tables=kv.block_tables,
        kv_pool=kv.pool,
    )
    backend = GraphDecodeBackend(model, max_pages=ctx // 64 + 2)
    for _ in range(5):  # capture and warm up
        backend.decode(b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            backend.decode(b)
        torch.cuda.synchronize()
    recs = kernel_records(prof)
    if not recs:
        raise SystemExit("the profiler saw no GPU kernels (CUPTI unavailable?)")
    span = (recs[-1][2] - recs[0][1]) / steps
    report = {
        "batch": batch,
        "context": ctx,
        "steps": steps,
        "kernels_per_step": len(recs) / steps,
        "span_us_per_step": span,
        "per_kernel": per_kernel(recs, steps),
        "layer": layer,
        "layer_kernels": layer_slice(recs, steps, cfg.num_hidden_layers - 1, layer),
    }
    print(f"BS {batch} ctx {ctx}: {report['kernels_per_step']:.0f} kernels per step, {span:.1f} us per step")
    for r in report["per_kernel"][:25]:
        print(
            f"  {r['us_per_step']:9.1f} us/step {r['per_step']:6.1f} x {r['mean_us']:8.2f} us  {r['name'][:90]}"
        )
    lk = report["layer_kernels"]
    if lk:
        print(f"MoE layer {layer} of the step (offsets from its first kernel):")
        for r in lk:
            print(f"  +{r['start_us']:7.2f} {r['dur_us']:7.2f} us (gap {r['gap_us']:5.2f})  {r['name'][:80]}")
        print(f"  layer: {lk[-1]['start_us'] + lk[-1]['dur_us']:.1f} us")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"graph_profile_bs{batch}.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, nargs="+", default=[8])
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layer", type=int, default=24, help="which repeating kernel run (MoE layer) to list")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    for b in args.batch:
        run(b, args.ctx, args.steps, args.layer, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
