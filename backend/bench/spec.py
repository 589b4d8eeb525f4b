"""`mkcode bench spec`: what a speculative verify step costs and what it buys.

For each context and k = 1..7 the graph backend (and with `backends` the megakernel, up to its 8
rows) runs verify steps of `batch` sequences with k+1 rows each (positions ctx..ctx+k over one block table, random weights at the full geometry,
synthetic KV), CUDA-event timed like `mkcode bench decode`; k = 0 is the plain step at the same
context. For a per-draft acceptance probability a (draft i is accepted when drafts 1..i-1 were and
with probability a), a verify step emits E = 1 + a + ... + a^k tokens per sequence on average, so
the effective speed is E * batch / t(k), reported as % of the plain step's tok/s at the same
context. Each step's % of speed-of-light comes from `accounting.step_bytes` (its k+1 rows' KV
and the distinct experts they routed to, as the graph backend measured on the same inputs) over the measured HBM
bandwidth. The drafter's CPU cost per step (propose + index the accepted tokens) is measured at
1K, 32K and 128K tokens of context (this part runs without a GPU too: --drafter-only).
"""

from __future__ import annotations

import datetime
import json
import platform
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mkcode.backend.kv.layout import NO_PAGE, PAGE_SIZE, first_visible_position, pool_shape
from mkcode.backend.model.config import ModelConfig, north_mini_code_config
from mkcode.backend.spec.drafter import MAX_DRAFTS, NgramDrafter


@dataclass
class SpecBenchOptions:
    contexts: list[int]
    ks: list[int] = field(default_factory=lambda: list(range(1, MAX_DRAFTS + 1)))
    alphas: list[float] = field(default_factory=lambda: [0.5, 0.7, 0.9, 1.0])
    batches: list[int] = field(default_factory=lambda: [1])  # sequences per step, each with k+1 rows
    routing: str = "uniform"
    steps: int = 50
    warmup: int = 5
    out: Path | None = None
    config: ModelConfig | None = None
    seed: int = 0
    device: str = "cuda"  # "cpu": the graph backend's torch twins, timed on the host (tests only)
    engine_tokens: int = 0  # > 0: also time the engine end to end (BS 1, greedy) for this many tokens
    backends: list[str] = field(default_factory=lambda: ["graph"])  # graph, megakernel (a GPU only)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verify step of k drafts emits when each draft is accepted with probability alpha
    given the ones before it were (the step's own token included)."""
    return float(sum(alpha**i for i in range(k + 1)))


# ---- the drafter's CPU cost ---------------------------------------------------------------------


def code_like_tokens(n: int, seed: int = 0, vocab: int = 32_000) -> list[int]:
    """A token stream with the repetition of code: lines drawn from a pool of recent lines, edited
    a little, mixed with fresh ones (so the index holds many n-grams and proposals find matches)."""
    rng = random.Random(seed)
    lines: list[list[int]] = []
    out: list[int] = []
    while len(out) < n:
        if lines and rng.random() < 0.6:
            line = list(rng.choice(lines[-200:]))
            if line and rng.random() < 0.5:
                line[rng.randrange(len(line))] = rng.randrange(vocab)
        else:
            line = [rng.randrange(vocab) for _ in range(rng.randrange(4, 20))]
        lines.append(line)
        out += line
    return out[:n]


def drafter_cost(context: int, steps: int = 2000, seed: int = 0) -> dict[str, float]:
    """Index `context` tokens once, then `steps` decode steps of propose(k=7) + 1..8 accepted
    tokens appended; microseconds per step (median and p99) and the one-off indexing time."""
    tokens = code_like_tokens(context + steps * 8, seed)
    seq = tokens[:context]
    d = NgramDrafter()
    t0 = time.perf_counter()
    d.update(seq)
    index_ms = (time.perf_counter() - t0) * 1e3
    rng = random.Random(seed)
    per_step, hits, pos = [], 0, context
    for _ in range(steps):
        t = time.perf_counter()
        drafts = d.propose(seq, MAX_DRAFTS)
        per_step.append((time.perf_counter() - t) * 1e6)
        hits += bool(drafts)
        n = rng.randrange(1, 9)
        seq += tokens[pos : pos + n]
        pos += n
    per_step.sort()
    return {
        "context": context,
        "index_ms": index_ms,
        "us_per_step_median": per_step[len(per_step) // 2],
        "us_per_step_p99": per_step[int(len(per_step) * 0.99)],
        "steps_with_drafts": hits / steps,
    }


# ---- the verify step on the GPU ------------------------------------------------------------------


def verify_tables(
    cfg: ModelConfig, ctx: int, k: int, batch: int, device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Block tables [L, batch*(k+1), P] and positions for `batch` sequences whose rows sit at
    ctx..ctx+k (each sequence's pages: from the oldest key row 0 sees to the page of ctx+k; the
    rows of a sequence share them), and the number of pages used."""
    rows = k + 1
    width = (ctx + k) // PAGE_SIZE + 1
    tables = torch.full((cfg.num_hidden_layers, batch * rows, width), NO_PAGE, dtype=torch.int32)
    nxt = 0
    for b in range(batch):
        for layer in range(cfg.num_hidden_layers):
            first = first_visible_position(ctx, cfg.window(layer)) // PAGE_SIZE
            n = width - first
            tables[layer, b * rows : (b + 1) * rows, first:] = torch.arange(nxt, nxt + n, dtype=torch.int32)
            nxt += n
    positions = torch.tensor([ctx + i for _ in range(batch) for i in range(rows)], dtype=torch.long)
    return tables.to(device), positions.to(device), nxt


def run_spec_bench(opts: SpecBenchOptions, log=print) -> dict:
    from mkcode.backend.bench.accounting import speed_of_light, step_bytes
    from mkcode.backend.bench.hbm import measure_copy_bandwidth
    from mkcode.backend.bench.synthetic import bench_model
    from mkcode.backend.bench.timing import median, time_cuda
    from mkcode.backend.engine.decode_backend import DecodeBatch
    from mkcode.backend.gpu.graph_backend import GraphDecodeBackend

    cfg = opts.config or north_mini_code_config()
    dev = torch.device(opts.device)
    unknown = sorted(set(opts.backends) - {"graph", "megakernel"})
    if unknown or not opts.backends:
        raise ValueError(f"backends {opts.backends}: each must be graph or megakernel")
    if "megakernel" in opts.backends and dev.type != "cuda":
        raise ValueError("the megakernel backend needs a CUDA GPU (the CPU runs the graph backend's twins)")
    if max(opts.batches) * (max(opts.ks) + 1) > GraphDecodeBackend.max_batch:
        raise ValueError(
            f"batch {max(opts.batches)} x {max(opts.ks) + 1} rows exceeds the graph backend's 32 rows"
        )
    bw = measure_copy_bandwidth(device=opts.device) if dev.type == "cuda" else 1e12
    timer = time_cuda if dev.type == "cuda" else _time_host
    log(f"HBM copy bandwidth (read + write): {bw / 1e12:.3f} TB/s")
    model = bench_model(cfg, device=dev, routing=opts.routing, seed=opts.seed)
    need = max(verify_tables(cfg, c, max(opts.ks), max(opts.batches), "cpu")[2] for c in opts.contexts)
    pool = torch.empty(
        pool_shape(need, cfg.num_key_value_heads, cfg.head_dim), device=dev, dtype=torch.bfloat16
    )
    pool.normal_(0.0, 0.01)
    # room for the end-to-end engine run: its tokens and the last step's verify rows
    longest = max(opts.contexts) + opts.engine_tokens + MAX_DRAFTS + 1
    backend = GraphDecodeBackend(model, max_pages=longest // PAGE_SIZE + 2)
    results: list[dict] = []
    distinct_by_case: dict[tuple[int, int, int], list[int]] = {}  # (batch, ctx, k): the graph's routing
    for name in ["graph", *(["megakernel"] if "megakernel" in opts.backends else [])]:
        be = backend if name == "graph" else _megakernel(model)
        for nb, ctx in [(b, c) for b in opts.batches for c in opts.contexts]:
            plain_ms = None
            for k in [0, *opts.ks]:
                rows = k + 1
                if nb * rows > be.max_batch:
                    log(f"{name} B={nb} ctx={ctx} k={k}: {nb * rows} rows exceed its {be.max_batch}; skipped")
                    continue
                tables, positions, _ = verify_tables(cfg, ctx, k, nb, dev)
                gen = torch.Generator(device=dev).manual_seed(opts.seed + k)
                batch = DecodeBatch(
                    token_ids=torch.randint(0, cfg.vocab_size, (nb * rows,), device=dev, generator=gen),
                    positions=positions,
                    block_tables=tables,
                    kv_pool=pool,
                    seq_rows=(rows,) * nb if k else None,
                )
                ms = median(timer(lambda: be.decode(batch), opts.steps, opts.warmup))  # noqa: B023
                if name == "graph":
                    distinct_by_case[(nb, ctx, k)] = backend.routed_experts()
                else:
                    be.wait_step()  # asynchronous: a kernel error surfaces here
                distinct = distinct_by_case[(nb, ctx, k)]
                pos = [ctx + i for _ in range(nb) for i in range(rows)]
                sb = step_bytes(cfg, pos, distinct)
                sol_ms, _ = speed_of_light(sb.total, bw, len(pos))
                if k == 0:
                    plain_ms = ms
                r = _verify_result(
                    name, nb, ctx, k, ms, plain_ms, sb.total, sol_ms, distinct, cfg, opts.alphas
                )
                results.append(r)
                effs = "  ".join(
                    f"a={a}: {v['tok_per_s']:7.1f} tok/s ({v['pct_of_plain']:5.1f}%)"
                    for a, v in r["effective"].items()
                )
                log(
                    f"{name} B={nb} ctx={ctx:<6} k={k} rows={nb * rows:<2} {ms:7.3f} ms "
                    f"({r['cost_vs_plain']:.3f}x plain) {r['pct_sol']:5.1f}% SOL  {effs}"
                )
        if name == "megakernel":
            del be
            torch.cuda.empty_cache()
    engine_runs = []
    if opts.engine_tokens > 0:
        for ctx in opts.contexts:
            engine_runs.append(engine_speeds(model, backend, ctx, opts.engine_tokens, opts.seed, log))
    report = {
        "kind": "spec",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "none (cpu)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "hbm_copy_bandwidth_Bps": bw,
        "batches": opts.batches,
        "routing": opts.routing,
        "config": cfg.to_dict(),
        "results": results,
        "drafter": [drafter_cost(c) for c in (1024, 32768, 131072)],
        "engine": engine_runs,
    }
    for d in report["drafter"]:
        log(_drafter_line(d))
    if opts.out:
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / "spec.json").write_text(json.dumps(report, indent=1))
    return report


def _megakernel(model):
    """The megakernel on the bench model, asynchronous like the graph backend's decode (the CUDA
    events then time the GPU alone), with verify rows."""
    from mkcode.backend.megakernel.backend import MegakernelBackend

    return MegakernelBackend(model.cfg, model.w, asynchronous=True, verify_rows=True)


def _verify_result(name, nb, ctx, k, ms, plain_ms, total_bytes, sol_ms, distinct, cfg, alphas) -> dict:
    """One timed verify step (k = 0: the plain step) and what it buys at each acceptance rate."""
    eff = {
        str(a): {
            "tokens_per_step": expected_tokens(a, k),
            "tok_per_s": expected_tokens(a, k) * nb / (ms / 1e3),
            "pct_of_plain": 100.0 * expected_tokens(a, k) * plain_ms / ms,
        }
        for a in alphas
    }
    moe = [d for i, d in enumerate(distinct) if not cfg.is_dense(i)]
    return {
        "backend": name,
        "batch": nb,
        "context": ctx,
        "k": k,
        "rows": nb * (k + 1),
        "ms_per_step": ms,
        "cost_vs_plain": ms / plain_ms,
        "plain_tok_per_s": nb / (plain_ms / 1e3),
        "bytes_per_step": total_bytes,
        "sol_ms": sol_ms,
        "pct_sol": 100.0 * sol_ms / ms,
        "distinct_experts_mean": sum(moe) / max(1, len(moe)),
        "effective": eff,
    }


def engine_speeds(model, backend, ctx: int, new_tokens: int, seed: int, log=print) -> dict:
    """The engine end to end at BS 1 (greedy, random prompt of `ctx` tokens): decode tok/s without
    speculation, with the n-gram drafter, and with an oracle drafter (the plain run's own tokens:
    every draft accepted), timed from the first decode step to the last (host work included)."""
    from mkcode.backend.bench.spec_workload import OracleDrafter
    from mkcode.backend.engine.engine import Engine, EngineOptions
    from mkcode.backend.engine.request import GenerationRequest
    from mkcode.backend.kv.layout import pages_for
    from mkcode.backend.kv.pool import KVPool
    from mkcode.backend.sampling import SamplingParams

    cfg, dev = model.cfg, model.device
    prefill = None
    if dev.type == "cuda":
        from mkcode.backend.gpu.prefill import GpuPrefill

        prefill = GpuPrefill(model)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size, (ctx,), generator=g).tolist()
    pages = cfg.num_hidden_layers * (pages_for(ctx + new_tokens + MAX_DRAFTS) + 1)
    pool = KVPool(
        pages, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, device=dev, dtype=model.dtype
    )
    out: dict = {"context": ctx}
    plain: list[int] = []
    for mode in ("off", "ngram", "oracle"):
        factory = (lambda _r, p=plain: OracleDrafter(ctx, p)) if mode == "oracle" else None
        engine = Engine(
            model,
            pool,
            backend,
            options=EngineOptions(
                speculative="off" if mode == "off" else "ngram",
                max_prefill_tokens=ctx,
                enable_prefix_cache=False,
            ),
            prefill_fn=prefill,
            drafter_factory=factory,
        )
        sp = SamplingParams(temperature=0.0, max_tokens=new_tokens + 1, ignore_eos=True)
        stream = engine.submit(GenerationRequest(list(prompt), sp))
        while not (engine._running and engine._running[0].decode_ready):
            engine.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        while engine.has_work():
            engine.step()
        dt = time.perf_counter() - t0
        result = stream.result()
        if result.finish_reason != "length" or result.error:
            raise RuntimeError(f"engine run ({mode}) ended with {result.finish_reason}: {result.error}")
        toks = result.token_ids
        if mode == "off":
            plain = toks
        st = engine.stats
        out[mode] = {
            "tokens": len(toks) - 1,
            "seconds": dt,
            "tok_per_s": (len(toks) - 1) / dt,
            "same_tokens": toks == plain,
            "verify_steps": st.spec_verify_steps,
            "draft_tokens": st.spec_draft_tokens,
            "accepted_tokens": st.spec_accepted_tokens,
            "sequence_steps": st.decode_sequence_steps,
        }
        r = out[mode]
        log(
            f"engine ctx={ctx} {mode:>6}: {r['tok_per_s']:7.1f} tok/s ({r['tokens']} tokens in "
            f"{r['sequence_steps']} steps; {r['accepted_tokens']}/{r['draft_tokens']} drafts accepted; "
            f"same tokens as plain: {r['same_tokens']})"
        )
    return out


def _time_host(fn, steps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def _drafter_line(d: dict) -> str:
    return (
        f"drafter at {d['context']:>6} tokens: {d['us_per_step_median']:.1f} us/step median, "
        f"{d['us_per_step_p99']:.1f} us p99 (index built once in {d['index_ms']:.0f} ms; "
        f"{100 * d['steps_with_drafts']:.0f} % of steps drafted)"
    )


def run_drafter_only(log=print) -> list[dict]:
    out = [drafter_cost(c) for c in (1024, 32768, 131072)]
    for d in out:
        log(_drafter_line(d))
    return out
