"""`mkcode bench decode`: ms/step, tok/s, bytes/step and % of speed-of-light per backend, batch
and context, at the full geometry with random weights and synthetic KV made on the GPU."""

from __future__ import annotations

import datetime
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mkcode.backend.bench.accounting import expected_distinct_uniform, speed_of_light, step_bytes
from mkcode.backend.bench.hbm import measure_copy_bandwidth
from mkcode.backend.bench.synthetic import bench_model, kv_pages_needed, synthetic_kv
from mkcode.backend.bench.timing import median, time_cuda
from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.kv.layout import pool_shape
from mkcode.backend.model.config import ModelConfig, north_mini_code_config
from mkcode.backend.model.reference import ReferenceModel

BACKENDS = ("torch", "graph", "megakernel")


@dataclass
class DecodeBenchOptions:
    backends: list[str]
    batches: list[int]
    contexts: list[int]
    routing: str = "uniform"
    steps: int = 50
    warmup: int = 5
    torch_max_ctx: int = 8192  # the torch backend gathers every key per step: slow beyond this
    torch_steps: int = 5
    hf_reference: bool = False
    out: Path | None = None
    config: ModelConfig | None = None
    seed: int = 0


@dataclass
class DecodeResult:
    backend: str
    batch: int
    context: int
    status: str  # "ok" or why not
    ms_per_step: float | None = None
    tok_per_s: float | None = None
    bytes_per_step: dict[str, int] = field(default_factory=dict)
    distinct_experts_mean: float | None = None
    distinct_source: str = ""
    sol_ms: float | None = None
    pct_sol: float | None = None
    steps: int = 0


def make_backend(name: str, model: ReferenceModel, max_pages: int):
    """(backend or None, note)."""
    try:
        if name == "torch":
            from mkcode.backend.engine.torch_backend import TorchDecodeBackend

            return TorchDecodeBackend(model), ""
        if name == "graph":
            from mkcode.backend.gpu.graph_backend import GraphDecodeBackend

            return GraphDecodeBackend(model, max_pages=max_pages), ""
        if name == "megakernel":
            from mkcode.backend.megakernel.backend import MegakernelBackend  # type: ignore

            # asynchronous like the graph backend's decode(): the events around each call then
            # measure GPU time for both (a synchronous decode() would add its host path and the
            # watchdog's poll to every step); wait_step() after the loop surfaces any kernel error
            return MegakernelBackend(model.cfg, model.w, asynchronous=True), ""
    except Exception as e:  # unavailable backends are reported, not fatal
        return None, f"unavailable: {type(e).__name__}: {e}"
    return None, f"unknown backend {name!r}"


def run_decode_bench(opts: DecodeBenchOptions, log=print) -> dict:
    cfg = opts.config or north_mini_code_config()
    dev = torch.device("cuda")
    bw = measure_copy_bandwidth()
    log(f"HBM copy bandwidth (read + write): {bw / 1e12:.3f} TB/s")
    model = bench_model(cfg, device=dev, routing=opts.routing, seed=opts.seed)
    need = max(kv_pages_needed(cfg, [c] * b) for b in opts.batches for c in opts.contexts)
    pool = torch.empty(
        pool_shape(need, cfg.num_key_value_heads, cfg.head_dim), device=dev, dtype=torch.bfloat16
    )
    pool.normal_(0.0, 0.01)
    max_pages = max(opts.contexts) // 64 + 2
    log(
        f"weights {sum(t.numel() for t in model.w.state_dict(cfg).values()) * 2 / 1e9:.1f} GB, KV pool {pool.numel() * 2 / 1e9:.1f} GB"
    )

    results: list[DecodeResult] = []
    measured_distinct: dict[tuple[int, int], list[int]] = {}
    order = sorted(opts.backends, key=lambda n: n != "graph")  # graph first: it measures routing
    for name in order:
        backend, note = make_backend(name, model, max_pages)
        for b in opts.batches:
            for ctx in opts.contexts:
                r = DecodeResult(name, b, ctx, status="ok")
                if backend is None:
                    r.status = note
                elif name == "torch" and ctx > opts.torch_max_ctx:
                    r.status = f"skipped: context > --torch-max-ctx {opts.torch_max_ctx}"
                if r.status != "ok":
                    results.append(r)
                    log(f"{name:>10} B={b:<3} ctx={ctx:<7} {r.status}")
                    continue
                kv = synthetic_kv(cfg, [ctx] * b, pool=pool, fill=False)
                gen = torch.Generator(device=dev).manual_seed(opts.seed + b)
                batch = DecodeBatch(
                    token_ids=torch.randint(0, cfg.vocab_size, (b,), device=dev, generator=gen),
                    positions=kv.positions,
                    block_tables=kv.block_tables,
                    kv_pool=pool,
                )
                steps = opts.torch_steps if name == "torch" else opts.steps
                warm = min(opts.warmup, 2) if name == "torch" else opts.warmup
                try:
                    times = time_cuda(lambda: backend.decode(batch), steps, warm)  # noqa: B023
                    settle = getattr(backend, "wait_step", None)  # asynchronous backends: errors
                    if settle is not None:
                        settle()
                except Exception as e:
                    r.status = f"failed: {type(e).__name__}: {e}"
                    results.append(r)
                    log(f"{name:>10} B={b:<3} ctx={ctx:<7} {r.status}")
                    continue
                if name == "graph":
                    measured_distinct[(b, ctx)] = backend.routed_experts()
                distinct = measured_distinct.get((b, ctx))
                if distinct is not None:
                    moe = [d for i, d in enumerate(distinct) if not cfg.is_dense(i)]
                    r.distinct_experts_mean = sum(moe) / len(moe)
                    r.distinct_source = "measured (graph backend, same inputs)"
                else:
                    r.distinct_experts_mean = expected_distinct_uniform(
                        cfg.num_experts, cfg.num_experts_per_tok, b
                    )
                    r.distinct_source = "uniform-routing expectation"
                sb = step_bytes(cfg, [ctx] * b, distinct if distinct is not None else None)
                r.ms_per_step = median(times)
                r.tok_per_s = b / (r.ms_per_step / 1e3)
                r.bytes_per_step = sb.as_dict()
                r.sol_ms, _ = speed_of_light(sb.total, bw, b)
                r.pct_sol = 100.0 * r.sol_ms / r.ms_per_step
                r.steps = steps
                results.append(r)
                log(
                    f"{name:>10} B={b:<3} ctx={ctx:<7} {r.ms_per_step:8.3f} ms {r.tok_per_s:9.1f} tok/s "
                    f"{sb.total / 1e9:6.2f} GB  SOL {r.sol_ms:6.3f} ms  {r.pct_sol:5.1f}% SOL  "
                    f"experts/layer {r.distinct_experts_mean:.1f}"
                )
        backend = None  # free its buffers and graphs before the next backend
        torch.cuda.empty_cache()

    report = {
        "kind": "decode",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "hbm_copy_bandwidth_Bps": bw,
        "routing": opts.routing,
        "config": cfg.to_dict(),
        "results": [vars(r) for r in results],
    }
    if opts.hf_reference:
        from mkcode.backend.bench.hf_reference import time_hf_reference

        del pool
        torch.cuda.empty_cache()
        report["hf_reference"] = time_hf_reference(model, ctx=8192, steps=5, bandwidth=bw, log=log)
    if opts.out:
        write_report(report, opts.out, "decode")
    return report


def write_report(report: dict, out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{stem}-{report.get('routing', 'na')}" if stem == "decode" else stem
    (out / f"{tag}.json").write_text(json.dumps(report, indent=1))
    try:
        from mkcode.backend.bench.plot import plot_report

        plot_report(report, out / f"{tag}.png")
    except ImportError as e:  # matplotlib is optional (extra "bench")
        print(f"no plot: {e}")
