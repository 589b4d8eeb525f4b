"""The graph backend's MoE kernels alone, one layer at the release geometry: time per layer and the
HBM rate of the expert weights they read (`python -m devtools.bench.moe_phase --batch 8`).

What the megakernel's MoE phase is measured against (docs/MEGAKERNEL.md): if the graph's gate_up /
down kernels stream the routed experts at ~4.3 TB/s, the megakernel's MoE items must reach that rate
in their phase of the layer. Random bf16 weights (128 experts, one
layer: 1.2 GB, far beyond L2), random hidden states; the four kernels (router, top-k, gate_up, down)
captured in a CUDA graph as the graph backend runs them, CUDA events around its replays, the median
of `--reps`. A benchmark script, never a timed test.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from mkcode.backend.model.config import north_mini_code_config

LAYERS_PER_REPLAY = 8  # MoE layers per graph replay (the event overhead spread over them)


def run(batch: int, reps: int, seed: int = 0) -> dict:
    from mkcode.backend.gpu import moe_kernels as mk
    from mkcode.backend.gpu.triton_support import next_pow2

    cfg = north_mini_code_config()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    H, I, E, K = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.num_experts_per_tok
    bf = torch.bfloat16
    gate_up = (torch.randn(E, 2 * I, H, device=dev, generator=g) * 0.02).to(bf)
    down = (torch.randn(E, H, I, device=dev, generator=g) * 0.02).to(bf)
    router = (torch.randn(E, H, device=dev, generator=g) * 0.02).to(bf)
    B = next_pow2(batch)
    h = torch.randn(B, H, device=dev, generator=g).to(bf)
    h_lo = torch.zeros_like(h)
    n_real = torch.tensor([batch], device=dev, dtype=torch.int32)
    ws = mk.MoeWorkspace(B, H, I, E, K, dev)
    nuniq = torch.zeros(1, device=dev, dtype=torch.int32)
    softmax = cfg.expert_selection_fn != "sigmoid"

    def once() -> None:
        mk.moe_decode(h, h_lo, n_real, router, gate_up, down, K, softmax, cfg.norm_topk_prob, ws, nuniq, True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # compile and warm
            once()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    n_act = int(nuniq.item())
    # as the graph backend runs them: captured in a CUDA graph (launched one by one from Python,
    # the four kernels' launch costs exceed their GPU time at BS 1-8)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAYERS_PER_REPLAY):
            once()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # the same layer's experts each time: ~480 MB at BS 8, ~10x the L2, so little of one run
        # survives into the next
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3 / LAYERS_PER_REPLAY)
    t = statistics.median(times)
    expert_bytes = n_act * 3 * H * I * 2
    router_bytes = E * H * 2
    return {
        "batch": batch,
        "experts": n_act,
        "ms": t * 1e3,
        "expert_bytes": expert_bytes,
        "tb_s": (expert_bytes + router_bytes) / t / 1e12,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("moe_phase needs a CUDA GPU")
    res = []
    for b in args.batch:
        r = run(b, args.reps)
        res.append(r)
        print(
            f"graph MoE (router, top-k, gate_up, down) BS {b}: {r['ms']:.3f} ms for {r['experts']} experts "
            f"({r['expert_bytes'] / 1e6:.0f} MB): {r['tb_s']:.2f} TB/s",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
