"""GPU measurements of the megakernel, for the device tool (one call does several things).

    python -m mkcode.backend.megakernel.gpu_check bench --out DIR [--contexts 8192] [--batches 1 8]
    python -m mkcode.backend.megakernel.gpu_check sanitize      # one reduced step (run under compute-sanitizer)

`bench` measures HBM bandwidth (device-to-device copy, bytes read + written), then times decode
steps at the release geometry (random bf16 weights made on the GPU) with CUDA events, median of
many, and reports tok/s and % of speed-of-light from the bytes the step really read (docs/PERF.md, Speed of light:
weights of attention, dense layer, routers, the distinct experts the batch routed to, LM head, and
every row's visible KV).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mkcode.backend.bench.accounting import step_bytes as account_step_bytes
from mkcode.backend.bench.hbm import measure_copy_bandwidth
from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.tiling import (
    SWITCH_FIELDS,
    Tiling,
    TilingError,
    default_tiling,
    split_bucket_position,
    tiling_for_batch,
)
from mkcode.backend.model.config import ModelConfig, north_mini_code_config
from mkcode.backend.model.weights import random_weights

# The megakernel tests' cases and reference step: this lab tool runs from a checkout's root, as they do.
from tests.backend.megakernel.cases import (
    Fp32Weights,
    clone_batch,
    fill_lm_tiles,
    kernel_routing,
    make_case,
    reduced_config,
    reference_step,
    standalone_desc,
)


def hbm_bandwidth() -> float:
    """Device-copy bandwidth (read + write), measured as the benchmarks measure it."""
    return measure_copy_bandwidth(nbytes=4 << 30, repeats=20)


def step_bytes(cfg: ModelConfig, contexts: list[int], active_experts: list[int]) -> dict[str, int]:
    """Bytes the step really read (docs/PERF.md, Speed of light), with the distinct experts the device routed to per
    layer; one accounting for every benchmark (`mkcode.backend.bench.accounting`)."""
    return account_step_bytes(cfg, contexts, active_experts).as_dict()


def time_steps(be, batch, reps: int) -> list[float]:
    prep = be.launch(batch)
    be.wait()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        be.launch(batch, prep)
        e.record()
        be.wait()
        times.append(s.elapsed_time(e) / 1e3)
    return times


def needs_check(mode: int, kw: dict) -> bool:
    """Whether bench checks a variant at the reduced geometry before timing it: tile overrides and
    modes other than the default."""
    return bool(kw or mode != abi.MK_PREFETCH_DEFAULT)


def bench(args: argparse.Namespace) -> int:
    from mkcode.backend.megakernel.backend import MegakernelBackend, MegakernelTimeout

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.cuda.get_device_name(0)
    bw = hbm_bandwidth()
    print(f"{dev}: device copy {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    cfg = north_mini_code_config()
    t0 = time.time()
    w = random_weights(cfg, device="cuda", dtype=torch.bfloat16, seed=0)
    torch.cuda.synchronize()
    print(f"release-geometry weights made in {time.time() - t0:.1f} s", flush=True)
    results = {
        "device": dev,
        "hbm_bytes_per_s": bw,
        "date": time.strftime("%Y-%m-%d"),
        "runs": [],
        "checks": [],
    }
    base_t = default_tiling(cfg)
    cases = {
        B: make_case(
            cfg,
            [args.context] * B,
            device="cuda",
            dtype=torch.bfloat16,
            seed=B,
            scatter=not args.kv_contiguous,
        )
        for B in args.batches
    }
    best: dict[int, tuple[float, str]] = {}

    def engine_tiling(B: int) -> Tiling:  # the engine's for this batch at this context (its split bucket)
        return tiling_for_batch(
            cfg, base_t, B, split_bucket_position(cases[B].batch.positions.tolist(), base_t)
        )

    def run(vname: str, mode: int, kw: dict[str, int]) -> None:
        # each batch size on the tiling the engine uses for it (tiling_for_batch), the variant's keys
        # on top: the figures are comparable with the engine harness (mkcode bench decode)
        for B in args.batches:
            tiling = replace(engine_tiling(B), **kw)
            be = MegakernelBackend(cfg, w, tiling=tiling, prefetch_mode=mode)
            contexts = [args.context] * B
            times = time_steps(be, cases[B].batch, args.reps)
            med = statistics.median(times)
            active = be.ws["moe_info"][:, 0].tolist()
            active = [a if not cfg.is_dense(i) else 0 for i, a in enumerate(active)]
            by = step_bytes(cfg, contexts, active)
            sol = by["total"] / bw
            r = {
                "batch": B,
                "context": args.context,
                "variant": vname,
                "tiling": {"moe_up_cols": tiling.moe_up_cols, "moe_down_rows": tiling.moe_down_rows},
                "median_s": med,
                "min_s": min(times),
                "tok_per_s": B / med,
                "bytes": by,
                "sol_s": sol,
                "pct_sol": 100 * sol / med,
                "mean_active_experts": sum(active) / max(1, cfg.num_hidden_layers - len(cfg.dense_layers)),
            }
            results["runs"].append(r)
            (out / "bench.json").write_text(
                json.dumps(results, indent=1)
            )  # partial results survive a timeout
            if B not in best or med < best[B][0]:
                best[B] = (med, vname)
            print(
                f"BS {B} ctx {args.context} [{vname}]: step {med * 1e3:.3f} ms (min {min(times) * 1e3:.3f}), "
                f"{B / med:.0f} tok/s, read {by['total'] / 1e9:.2f} GB, SOL {sol * 1e3:.3f} ms -> "
                f"{100 * sol / med:.1f}% of SOL, experts/layer {r['mean_active_experts']:.1f}",
                flush=True,
            )
            del be

    fastest_mode = abi.MK_PREFETCH_DEFAULT
    for spec in args.variants:  # e.g. "prefetch=3", "moe_up_cols=64,moe_down_rows=256"
        mode, kw = parse_variant(spec)
        mode = fastest_mode if mode is None else mode
        tiling = replace(base_t, **kw)
        vname = f"{spec} (prefetch={mode})"
        if needs_check(mode, kw):
            try:
                ok = reduced_check(tiling, mode)
            except MegakernelTimeout as e:  # a hung kernel keeps the GPU: nothing after it can run
                raise SystemExit(f"reduced-geometry check [{vname}] hung: {e}") from e
            except Exception as e:  # e.g. the kernel's error word: report, go on with the other variants
                print(f"reduced-geometry check [{vname}] raised {type(e).__name__}: {e}", flush=True)
                ok = False
            results["checks"].append({"variant": vname, "ok": ok})
            print(f"reduced-geometry check [{vname}]: {'ok' if ok else 'FAILED'}", flush=True)
            if not ok:
                continue
        try:
            run(vname, mode, kw)
        except MegakernelTimeout as e:
            raise SystemExit(f"variant [{vname}] hung: {e}") from e
        except Exception as e:
            print(f"variant [{vname}] raised {type(e).__name__}: {e}", flush=True)
            results["checks"].append({"variant": vname, "ok": False, "error": str(e)})
            continue
        b0 = args.batches[0]
        if best[b0][1] == vname and not kw:
            fastest_mode = mode
    results["best"] = {str(B): v for B, v in best.items()}
    results["sampling"] = sampling_cost(cfg, w, cases, args.batches)
    # one recorded step per batch size with the fastest prefetch mode: where the time goes
    from mkcode.backend.megakernel import timeline

    tl_mode = fastest_mode if args.timeline_mode is None else args.timeline_mode
    tl_kw = parse_variant(args.timeline_variant)[1] if args.timeline_variant else {}
    results["timeline"] = {}
    for B in args.batches:
        tl_tiling = replace(engine_tiling(B), **tl_kw)
        be = MegakernelBackend(cfg, w, tiling=tl_tiling, prefetch_mode=tl_mode)
        be.timeline = timeline.allocate(be.n_sms, 4096, "cuda")
        be.decode(cases[B].batch)
        summ = timeline.summarize(be.timeline)
        results["timeline"][str(B)] = summ
        recs = timeline.records(be.timeline)
        torch.save(recs, out / f"timeline_bs{B}.pt")  # the raw records, for offline analysis
        print(
            f"timeline BS {B} ({be.n_sms} blocks): span {summ['span_us']:.0f} us, "
            f"blocks busy {100 * summ['mean_busy_fraction']:.0f}%, non-streaming per item: median "
            f"{summ['median_fixed_us']:.2f} us ("
            + ", ".join(
                f"{op} {d['median_fixed_us']:.2f}" for op, d in summ["per_op"].items() if op != "DRAIN"
            )
            + ")"
        )
        for op, d in summ["per_op"].items():
            parts = (
                f" = stage {d['mean_stage_us']:5.2f} + gemv {d['mean_gemv_us']:6.2f} + epi {d['mean_epilogue_us']:5.2f}"
                if d["gemv_n"]
                else ""
            )
            print(
                f"  {op:<14} n={d['count']:>6}  run {d['mean_run_us']:7.2f} us{parts} + signal {d['mean_signal_us']:5.2f}"
                f"  wait {d['mean_wait_us']:7.2f} us  (total run {d['run_us'] / 1e3:8.2f} ms, wait {d['wait_us'] / 1e3:8.2f} ms)"
            )
        bd = timeline.breakdown(recs)
        results["timeline"][str(B)]["breakdown"] = bd
        print(
            "  SM time: "
            + ", ".join(f"{k} {100 * bd['share'][k]:.1f}%" for k in timeline.CATEGORIES if bd["share"].get(k))
        )
        gp = timeline.gaps(recs)
        results["timeline"][str(B)]["gaps"] = gp[:20]
        print("  largest gaps between a block's tasks (previous -> next):")
        for d in gp[:6]:
            print(
                f"    {d['prev']:>13} -> {d['next']:<13} n={d['count']:>5}  total {d['total_us'] / 1e3:6.2f} SM-ms"
                f"  median {d['median_us']:5.2f} us  p90 {d['p90_us']:5.2f} us"
            )
        del be
        chains = timeline.chain_ends(recs)
        results["timeline"][str(B)]["chain_ends"] = chains
        print_chain_summary(chains)
        mid = cfg.num_hidden_layers // 2 + 1  # a MoE layer in the middle (sliding unless l % 4 == 0)
        print(f"  layer {mid} critical path (us from the layer's first task start):")
        for d in timeline.layer_spans(recs, mid):
            print(
                f"    {d['op']:<13} n={d['count']:>4} ready {d['first_ready_us']:7.1f}..{d['last_ready_us']:7.1f}"
                f"  end {d['last_end_us']:7.1f}  run {d['mean_run_us']:6.2f} (signal {d['mean_signal_us']:5.2f})"
            )
        prof = layer_profile(cfg, tl_tiling, recs, mid, B, args.context, bin_us=2.0 if B < 4 else 4.0)
        results["timeline"][str(B)]["profile"] = prof
    (out / "bench.json").write_text(json.dumps(results, indent=1))
    return 0


def print_chain_summary(chains: list[dict]) -> None:
    """One line from timeline.chain_ends: the mean layer length (layer end to layer end) and, over the
    MoE layers, how many ended on the O-proj items and how many on the MoE items (the later of the
    two last ends), with the mean margin of each."""
    if not chains:
        return
    moe_ops = ("MOE_FUSED", "MOE_DOWN")
    last = {"OPROJ": [], "MOE": []}
    for c in chains:
        e = c["ends_us"]
        moe = max((e[op] for op in moe_ops if op in e), default=None)
        if moe is None or "OPROJ" not in e:
            continue  # dense layers
        key = "OPROJ" if e["OPROJ"] > moe else "MOE"
        last[key].append(abs(e["OPROJ"] - moe))
    n = sum(len(v) for v in last.values())
    lens = [c["layer_us"] for c in chains]
    print(
        f"  layers ({len(chains)}): mean {sum(lens) / len(lens):.1f} us from layer end to layer end; of {n} MoE layers "
        + ", ".join(
            f"{len(v)} ended on {k} (by {sum(v) / len(v):.1f} us)" if v else f"0 on {k}"
            for k, v in last.items()
        )
    )


def layer_profile(
    cfg: ModelConfig, tiling, recs, layer: int, B: int, context: int, bin_us: float
) -> list[dict]:
    """Print and return timeline.stream_profile of one layer: the bytes of each GEMV tile from the
    tiling, the layer's KV bytes from B rows of `context` tokens."""
    from mkcode.backend.megakernel import timeline

    H, ebytes = cfg.hidden_size, 2
    # a MoE layer's tiles (Tiling.attn_group: a QKV tile is a share of a head's Q, K and V rows;
    # Tiling.moe_group: a router tile is E / moe_group experts)
    qkv_rows = sum(tiling.attn_group_rows(cfg)) if tiling.attn_group else tiling.qkv_rows
    op_bytes = {
        "QKV": qkv_rows * H * ebytes,
        "ROUTER": tiling.moe_router_rows(cfg) * H * ebytes,
        "OPROJ": tiling.o_rows * (cfg.num_attention_heads // cfg.num_key_value_heads) * cfg.head_dim * ebytes,
        "MOE_UP": 2 * tiling.moe_up_cols * H * ebytes,
        "MOE_DOWN": tiling.moe_down_rows * cfg.intermediate_size * ebytes,
        # a fused item: its up tile over its up GEMV, its down slice (H rows of its columns) over the
        # epilogue that follows (timeline.stream_profile)
        "MOE_FUSED": 2 * tiling.moe_up_cols * H * ebytes,
        "MOE_FUSED_DOWN": tiling.moe_up_cols * H * ebytes,
        "DENSE_UP": 2 * tiling.dense_up_cols * H * ebytes,
        "DENSE_DOWN": tiling.dense_down_rows
        * (cfg.prefix_dense_intermediate_size // tiling.mlp_splits)
        * ebytes,
        "LM_HEAD": tiling.lm_rows * H * ebytes,
    }
    window = cfg.window(layer)
    kv_tokens = min(context + 1, window) if window else context + 1
    attn_bytes = B * kv_tokens * cfg.num_key_value_heads * cfg.head_dim * 2 * ebytes
    prof = timeline.stream_profile(recs, layer, op_bytes, attn_bytes, bin_us)
    # the phases' means are printed per op above (summarize); here what each GEMV streams per SM
    rates = timeline.op_phases(recs, set(range(max(0, layer - 20), layer + 21)), op_bytes)
    print(
        f"  GEMV stream per SM, layers {max(0, layer - 20)}-{layer + 20} (median item): "
        + ", ".join(f"{d['op']} {d['gb_s_sm']:.0f}" for d in rates if "gb_s_sm" in d)
        + "".join(f", fused down slice {d['down_gb_s_sm']:.0f}" for d in rates if "down_gb_s_sm" in d)
        + " GB/s"
    )
    gap = timeline.routing_gap(recs, layer, op_bytes, attn_bytes)
    if gap:  # issue 41's bar: >= 3 TB/s
        print(
            f"  layer {layer} routing gap (its first QKV / router tile ready -> its first MoE GEMV): "
            f"{gap['length_us']:.1f} us at {gap['tb_s']:.2f} TB/s"
        )
    total = sum(p["tb_s"] for p in prof) * bin_us * 1e-6 * 1e12
    print(
        f"  layer {layer} HBM profile ({bin_us:g} us bins; {total / 1e6:.1f} MB, mean "
        f"{total / (len(prof) * bin_us * 1e-6) / 1e12:.2f} TB/s over {len(prof) * bin_us:g} us): "
        "t us, TB/s, blocks in GEMV per op / in attention"
    )
    for p in prof:
        blocks = " ".join(
            f"{k}:{v:.0f}" for k, v in sorted(p["blocks"].items(), key=lambda kv: -kv[1]) if v >= 0.5
        )
        print(f"    {p['t_us']:6.1f} {p['tb_s']:5.2f} {'#' * int(p['tb_s'] * 10):<48} {blocks}")
    return prof


def sampling_cost(cfg, w, cases, batches) -> dict:
    """Wall time per step of decode() (greedy) vs sample() (temperature 0.8, top-k 50, top-p 0.95;
    and temperature only): the on-device sampler's cost, median of 15 synchronised steps."""
    from mkcode.backend.megakernel.backend import MegakernelBackend
    from mkcode.backend.megakernel.sampling import SamplingParams

    out = {}
    try:
        be = MegakernelBackend(cfg, w)
        for B in batches:
            batch = cases[B].batch
            row = {}
            for name, sp in (
                ("greedy", None),
                ("topk_topp", SamplingParams(0.8, 50, 0.95, seed=1, step=2)),
                ("temperature", SamplingParams(0.8, seed=1, step=2)),
                ("topp_only", SamplingParams(1.0, 0, 0.9, seed=1, step=2)),
            ):

                def fn(sp=sp, batch=batch):
                    return be.decode(batch) if sp is None else be.sample(batch, sp)

                fn()
                ts = []
                for _ in range(15):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    fn()
                    torch.cuda.synchronize()
                    ts.append(time.perf_counter() - t)
                row[name] = statistics.median(ts)
            out[str(B)] = row
            print(
                f"sampling BS {B}: "
                + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in row.items())
                + f" (top-k/top-p costs {(row['topk_topp'] - row['greedy']) * 1e6:.0f} us)",
                flush=True,
            )
        out["sample_row_1"] = sample_row_cost(be, cases[min(cases)].batch)  # row 0 of the smallest batch
    except Exception as e:  # a sampling failure must not lose the timings above
        out["error"] = f"{type(e).__name__}: {e}"
        print("sampling cost failed:", out["error"], flush=True)
    return out


def _lm_like_logits(V: int, peaked: bool, seed: int) -> torch.Tensor:
    """One row of synthetic logits: a N(0, 2.5) bulk and, when `peaked`, 24 tokens at N(14, 2) (a
    language model's next-token distribution has a few logits far above the rest; the random-weight
    model's are one flat bulk, where top-p keeps most of the vocabulary)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    row = torch.randn(V, device="cuda", generator=g) * 2.5
    if peaked:
        top = torch.randperm(V, device="cuda", generator=g)[:24]
        row[top] = 14.0 + 2.0 * torch.randn(24, device="cuda", generator=g)
    return row


def sample_row_cost(be, batch) -> dict:
    """SAMPLE_ROW alone on one row of the release vocabulary (`run_tasks`, one block), timed on the
    device by the timeline (the task's run, from the end of its wait to its end: the host path of
    `run_tasks` varies by ~0.1 ms between launches), median of 7, per sampling setting on peaked and
    flat synthetic logits (_lm_like_logits)."""
    from mkcode.backend.megakernel import timeline
    from mkcode.backend.megakernel.sampling import SamplingParams
    from mkcode.backend.megakernel.schedule import make_desc

    descs = np.array([standalone_desc(make_desc(abi.MK_OP_SAMPLE_ROW, 0, (0,)))], dtype=np.int32)
    V = be.cfg.vocab_size
    settings = (
        ("greedy", SamplingParams(0.0)),
        ("temperature", SamplingParams(0.8, seed=1, step=2)),
        ("topp", SamplingParams(0.8, 0, 0.95, seed=1, step=2)),
        ("topk_topp", SamplingParams(0.8, 50, 0.95, seed=1, step=2)),
        ("topk", SamplingParams(0.8, 50, seed=1, step=2)),
    )
    out: dict[str, float] = {}
    saved = be.timeline
    be.timeline = timeline.allocate(1, 16, "cuda")
    try:
        for shape in ("peaked", "flat"):
            row = _lm_like_logits(V, shape == "peaked", seed=7)
            be.ws["logits"][0] = row
            fill_lm_tiles(be, 1)
            for name, sp in settings:
                runs = []
                for _ in range(7):
                    be.timeline.zero_()
                    be.run_tasks(descs, batch, n_sms=1, sampling=[sp])
                    torch.cuda.synchronize()
                    rec = timeline.records(be.timeline)
                    sel = rec[(rec[:, 1] & 0xFF) == abi.MK_OP_SAMPLE_ROW]
                    runs.append(float(sel[0, 6] - sel[0, 3]) / 1e3)  # op end - end of wait, us
                out[f"{shape}_{name}_us"] = statistics.median(runs)
    finally:
        be.timeline = saved
    print(
        "SAMPLE_ROW alone, one row of the vocabulary, device us: "
        + ", ".join(f"{k[:-3]} {v:.0f}" for k, v in out.items()),
        flush=True,
    )
    return out


def reduced_tiling(tiling_release: Tiling, cfg: ModelConfig | None = None) -> tuple[Tiling, list[str]]:
    """The reduced geometry's tiling for a release-geometry variant, and what of it did not fit.

    Each field the variant changes from the release default is carried over: sizes at most twice
    the reduced default, switches (SWITCH_FIELDS: modes, placements) as given. They are applied in
    the fields' order, each kept only if the tiling so far still validates with it, so that options
    that need each other (moe_local needs moe_fused) are checked together, and a size
    that does not fit the reduced geometry (moe_up_cols=48 does not divide 256) keeps the default.
    Tiling.moe_local, moe_group and attn_group are not carried: one row only, the reduced check runs
    four."""
    cfg = cfg or reduced_config()
    t = default_tiling(cfg)
    release_default = default_tiling(north_mini_code_config())
    dropped = []
    for k in vars(release_default):
        v = getattr(tiling_release, k)
        if v == getattr(release_default, k):
            continue
        if k in ("moe_local", "moe_group", "attn_group"):  # build_schedule refuses them beyond one row
            dropped.append(f"{k}={v} runs one row only, the reduced check runs 4: kept {getattr(t, k)}")
            continue
        if k not in SWITCH_FIELDS:
            v = min(v, getattr(t, k) * 2)
        try:
            cand = replace(t, **{k: v})
            cand.validate(cfg)
            t = cand
        except TilingError:
            dropped.append(f"{k}={v} does not fit the reduced geometry, kept {getattr(t, k)}")
    return t, dropped


def reduced_check(tiling_release: Tiling, mode: int) -> bool:
    """One BS-4 step at the reduced geometry with the same tile overrides (where they fit,
    reduced_tiling), against the fp32 reference with the kernel's expert choices: cosine >= 0.999."""
    from mkcode.backend.megakernel.backend import MegakernelBackend

    cfg = reduced_config()
    t, dropped = reduced_tiling(tiling_release, cfg)
    for why in dropped:
        print(f"reduced-geometry check: {why}")
    w = random_weights(cfg, device="cuda", dtype=torch.bfloat16, seed=5, std=0.05)
    be = MegakernelBackend(cfg, w, tiling=t, prefetch_mode=mode)
    return _compare_step(cfg, w, be, [5, 300, 255, 256], seed=4)[0]


def _compare_step(cfg: ModelConfig, w, be, contexts: list[int], seed: int) -> tuple[bool, list[float]]:
    """One kernel step against the fp32 reference with the kernel's expert choices: (finite and
    cosine >= 0.999 for every row, the cosines)."""
    case = make_case(cfg, contexts, device="cuda", dtype=torch.bfloat16, seed=seed)
    ref_batch = clone_batch(case.batch)
    got = be.decode(case.batch)
    ref = reference_step(cfg, Fp32Weights(w), ref_batch, kernel_routing(cfg, be.ws, len(contexts)))
    cos = torch.nn.functional.cosine_similarity(got.double(), ref.double(), dim=-1)
    return bool(torch.isfinite(got).all()) and bool(cos.min() >= 0.999), cos.tolist()


def step_config(layers: int) -> ModelConfig:
    """The step harness's geometry: the GPU tests' 6 layers, or 2 (full + sliding, dense + MoE)."""
    if layers == 6:
        return reduced_config()
    return reduced_config(
        num_hidden_layers=2,
        layer_types=["full_attention", "sliding_attention"],
        mlp_layer_types=["dense", "sparse"],
        vocab_size=1024,
    )


def step_sms(cfg: ModelConfig, tiling: Tiling, floor: int = 16, most: int = 132) -> int:
    """The fewest SMs from `floor` on (at most `most`, the device's) that run `tiling` as given: a
    one-row tiling with self-routing items (Tiling.moe_local) needs as many SMs free of a layer's QKV
    and router tiles as it has items, else the backend falls back to ROUTE and the MoE queue, and the
    product's BS 1 path would go unchecked (the sanitizer's step at 16 SMs never ran it). ValueError
    when even `most` do not take it: no silent fallback."""
    from mkcode.backend.megakernel.schedule import moe_local_fits

    if not tiling.moe_local:
        return floor
    for n in range(floor, most + 1):
        if moe_local_fits(cfg, tiling, n):
            return n
    raise ValueError(f"the one-row tiling's self-routing items do not fit {most} SMs")


def step(args: argparse.Namespace) -> int:
    """One reduced-geometry step (step_config) in one variant, against
    the fp32 reference: the bisection and sanitizer harness (`gpu_run.sh san` runs it under
    compute-sanitizer). Exit status 1 when the logits disagree."""
    from mkcode.backend.megakernel.backend import MegakernelBackend

    cfg = step_config(args.layers)
    w = random_weights(cfg, device="cuda", dtype=torch.bfloat16, seed=1, std=0.05)
    kw = parse_variant(args.tiling)[1] if args.tiling else {}
    engine = tiling_for_batch(cfg, default_tiling(cfg), len(args.contexts))
    tiling = replace(engine, **kw) if kw else None
    most = torch.cuda.get_device_properties(0).multi_processor_count
    sms = args.sms if args.sms is not None else step_sms(cfg, tiling or engine, most=most)
    print(f"step on {sms or 'every'} SMs", flush=True)
    be = MegakernelBackend(
        cfg,
        w,
        n_sms=sms or None,
        timeout_s=args.timeout,
        prefetch_mode=args.mode,
        tiling=tiling,
    )
    ok, cos = _compare_step(cfg, w, be, args.contexts, seed=2)
    print(
        f"step mode={args.mode} tiling={args.tiling or 'default'} contexts={args.contexts}: "
        f"cosine {cos} ok={ok}",
        flush=True,
    )
    return 0 if ok else 1


def parse_variant(spec: str) -> tuple[int | None, dict[str, int]]:
    """'prefetch=3', 'moe_up_cols=64,moe_down_rows=256' -> (prefetch, tiling overrides)."""
    kw: dict[str, int] = {}
    for item in filter(None, spec.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"variant {spec!r}: expected key=value, got {item!r}")
        kw[key.strip()] = int(value)
    bad = set(kw) - {"prefetch"} - set(Tiling.__dataclass_fields__)
    if bad:
        raise ValueError(f"variant {spec!r}: unknown keys {sorted(bad)}")
    return kw.pop("prefetch", None), kw


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu_check")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--out", default="bench_out")
    b.add_argument("--context", type=int, default=8192)
    b.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    b.add_argument("--reps", type=int, default=30)
    b.add_argument(
        "--kv-contiguous",
        action="store_true",
        help="each (layer, row)'s KV pages consecutive in the pool (as the engine harness's synthetic KV) "
        "instead of scattered at random",
    )
    b.add_argument(
        "--timeline-mode",
        type=int,
        default=None,
        help="prefetch_mode of the recorded timeline step (default: the fastest variant's); e.g. 16 = "
        "MK_MODE_TWICE, each combine run twice to show what a cold op costs",
    )
    b.add_argument(
        "--timeline-variant",
        default=None,
        type=lambda v: (parse_variant(v), v)[1],
        help="Tiling keys (key=value,...) on top of each batch size's tiling for the recorded timeline step",
    )
    b.add_argument(
        "--variants",
        nargs="+",
        default=["prefetch=0"],
        type=lambda v: (parse_variant(v), v)[1],
        help="variants in order, each comma-separated key=value: prefetch (the prefetch_mode word: "
        "MK_MODE_* bits) or Tiling fields (moe_up_cols=64) on top of each batch size's "
        "engine default (tiling_for_batch); an unset prefetch takes the fastest so far",
    )
    b.set_defaults(func=bench)
    s = sub.add_parser("step", aliases=["sanitize"])
    s.add_argument(
        "--mode",
        type=int,
        default=abi.MK_PREFETCH_DEFAULT,
        help="prefetch_mode bits (MK_MODE_*)",
    )
    s.add_argument(
        "--sms",
        type=int,
        default=None,
        help="0: every SM; default: the fewest from 16 on that run the tiling as given (step_sms)",
    )
    s.add_argument("--layers", type=int, default=2, choices=[2, 6])
    s.add_argument("--timeout", type=float, default=120.0)
    s.add_argument("--contexts", type=int, nargs="+", default=[3, 64, 300])
    s.add_argument(
        "--tiling",
        default=None,
        type=lambda v: (parse_variant(v), v)[1],
        help="Tiling keys (key=value,...) on top of the batch size's default tiling, e.g. ctrl_sms=0",
    )
    s.set_defaults(func=step)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
