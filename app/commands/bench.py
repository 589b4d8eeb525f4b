"""`mkcode bench decode|prefill|spec`: speed figures at the full geometry with random weights made on
the GPU (no checkpoint needed). Writes JSON and a PNG (matplotlib, optional) under --out."""

from __future__ import annotations

import argparse
from pathlib import Path


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="decode / prefill benchmarks on the GPU (random weights, synthetic KV)")
    bsub = p.add_subparsers(dest="bench_command", metavar="WHAT", required=True)

    d = bsub.add_parser("decode", help="decode ms/step, tok/s, bytes/step and %% of speed-of-light")
    d.add_argument("--backend", default="torch,graph,megakernel", help="comma list of torch,graph,megakernel")
    d.add_argument("--batch", type=_ints, default=[1, 2, 4, 8])
    d.add_argument("--ctx", type=_ints, default=[1024, 8192, 32768, 131072, 262144])
    d.add_argument("--routing", choices=["uniform", "skewed"], default="uniform")
    d.add_argument("--steps", type=int, default=50, help="timed steps per point (median reported)")
    d.add_argument("--warmup", type=int, default=5)
    d.add_argument("--torch-max-ctx", type=int, default=8192, help="skip the slow torch backend beyond this")
    d.add_argument("--torch-steps", type=int, default=5)
    d.add_argument("--hf-reference", action="store_true", help="also time transformers at BS=1, 8K")
    d.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="folder for the JSON (and PNG) results"
    )
    d.set_defaults(func=run_decode)

    s = bsub.add_parser(
        "spec", help="speculative verify-step cost at k = 1..7 and effective tok/s per acceptance rate"
    )
    s.add_argument("--ctx", type=_ints, default=[8192, 32768])
    s.add_argument("--k", type=_ints, default=list(range(1, 8)), help="draft counts (1..7)")
    s.add_argument("--alpha", type=_floats, default=[0.5, 0.7, 0.9, 1.0], help="per-draft acceptance rates")
    s.add_argument("--batch", type=_ints, default=[1], help="sequences per step, each with k+1 rows")
    s.add_argument("--routing", choices=["uniform", "skewed"], default="uniform")
    s.add_argument(
        "--backend",
        default="graph",
        help="comma list of graph,megakernel (the megakernel: up to 8 rows a step)",
    )
    s.add_argument("--steps", type=int, default=50, help="timed steps per point (median reported)")
    s.add_argument("--warmup", type=int, default=5)
    s.add_argument("--drafter-only", action="store_true", help="only the drafter's CPU cost (no GPU)")
    s.add_argument(
        "--engine-tokens", type=int, default=0, help="also time the engine end to end at BS 1 for N tokens"
    )
    s.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="folder for the JSON (and PNG) results"
    )
    s.set_defaults(func=run_spec)

    f = bsub.add_parser("prefill", help="GPU prefill tok/s for 1K-32K prompts")
    f.add_argument("--lengths", type=_ints, default=[1024, 4096, 8192, 16384, 32768])
    f.add_argument("--chunk", type=int, default=8192, help="prefill chunk (tokens)")
    f.add_argument("--repeats", type=int, default=3)
    f.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="folder for the JSON (and PNG) results"
    )
    f.set_defaults(func=run_prefill)


def _need_cuda() -> bool:
    import torch

    if not torch.cuda.is_available():
        print("mkcode bench needs a CUDA GPU (torch.cuda.is_available() is False)")
        return False
    return True


def run_decode(args: argparse.Namespace) -> int:
    if not _need_cuda():
        return 2
    from mkcode.backend.bench.decode import DecodeBenchOptions, run_decode_bench

    opts = DecodeBenchOptions(
        backends=[b for b in args.backend.split(",") if b],
        batches=args.batch,
        contexts=args.ctx,
        routing=args.routing,
        steps=args.steps,
        warmup=args.warmup,
        torch_max_ctx=args.torch_max_ctx,
        torch_steps=args.torch_steps,
        hf_reference=args.hf_reference,
        out=args.out,
    )
    run_decode_bench(opts)
    return 0


def run_prefill(args: argparse.Namespace) -> int:
    if not _need_cuda():
        return 2
    from mkcode.backend.bench.prefill import PrefillBenchOptions, run_prefill_bench

    run_prefill_bench(
        PrefillBenchOptions(lengths=args.lengths, chunk_tokens=args.chunk, repeats=args.repeats, out=args.out)
    )
    return 0


def run_spec(args: argparse.Namespace) -> int:
    from mkcode.backend.bench.spec import SpecBenchOptions, run_drafter_only, run_spec_bench

    if any(not 1 <= k <= 7 for k in args.k):
        print("mkcode bench spec: --k values must be in 1..7")
        return 2
    if any(not 0 <= a <= 1 for a in args.alpha):
        print("mkcode bench spec: --alpha values must be in [0, 1]")
        return 2
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    if not backends or any(b not in ("graph", "megakernel") for b in backends):
        print(f"mkcode bench spec: --backend {args.backend!r}: a comma list of graph,megakernel")
        return 2
    if args.drafter_only:
        run_drafter_only()
        return 0
    if not _need_cuda():
        return 2
    opts = SpecBenchOptions(
        contexts=args.ctx,
        ks=args.k,
        alphas=args.alpha,
        batches=args.batch,
        routing=args.routing,
        steps=args.steps,
        warmup=args.warmup,
        out=args.out,
        engine_tokens=args.engine_tokens,
        backends=backends,
    )
    run_spec_bench(opts)
    return 0
