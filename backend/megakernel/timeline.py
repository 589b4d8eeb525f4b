"""Per-SM timeline of one megakernel step (docs/MEGAKERNEL.md, Timeline): where the time goes.

With `backend.timeline` set to an int64 tensor [n_sms, cap, MK_TL_WORDS], the kernel's thread 0 of
each block writes one record per task (and per DRAIN): opcode | layer << 8 | queue-item << 16, then
the %globaltimer stamps at start, after the dependency waits, GEMV start and end (0 for ops
without one), when the op finished (before the release fence), and after the signals. `summarize`
turns them into per-opcode wait/run/signal totals (and staging/GEMV/epilogue for GEMV ops) and the
blocks' busy fraction; `layer_spans` into each op's first start and last end within
one layer (the critical path); `records` into a flat array (block, word 0, stamps) to save.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Iterator
from itertools import pairwise

import torch

from mkcode.backend.megakernel import abi


def allocate(n_sms: int, cap: int, device: torch.device | str) -> torch.Tensor:
    return torch.zeros((n_sms, cap, abi.MK_TL_WORDS), dtype=torch.int64, device=device)


def summarize(tl: torch.Tensor) -> dict:
    rec = tl.cpu()
    valid = rec[:, :, 1] != 0
    t_start = int(rec[:, :, 1][valid].min())
    t_end = int(rec[:, :, abi.MK_TL_WORDS - 1][valid].max())
    span = max(1, t_end - t_start)
    per_op: dict[str, dict[str, float]] = defaultdict(
        lambda: {
            "count": 0,
            "wait_us": 0.0,
            "run_us": 0.0,
            "signal_us": 0.0,
            "gemv_n": 0,
            "stage_us": 0.0,
            "gemv_us": 0.0,
            "epilogue_us": 0.0,
        }
    )
    fixed: dict[str, list[float]] = defaultdict(list)  # per op: each item's non-streaming time
    busy = []
    for sm in range(rec.shape[0]):
        r = rec[sm][valid[sm]]
        run_sm = 0.0
        for w0, t0, t1, g0, g1, t2, t3 in r.tolist():
            op = abi.OPNAMES.get(w0 & 0xFF, "?") + ("*" if (w0 >> 16) & 1 else "")
            d = per_op[op]
            d["count"] += 1
            d["wait_us"] += (t1 - t0) / 1e3
            d["run_us"] += (t3 - t1) / 1e3
            d["signal_us"] += (t3 - t2) / 1e3
            if g0 and g1:  # a GEMV op: staging before it, the weight stream, the epilogue after it
                d["gemv_n"] += 1
                d["stage_us"] += (g0 - t1) / 1e3
                d["gemv_us"] += (g1 - g0) / 1e3
                d["epilogue_us"] += (t2 - g1) / 1e3
            if (w0 & 0xFF) != abi.MK_OP_DRAIN:
                run_sm += (t3 - t1) / 1e3
                fixed[op].append(_fixed_us(w0 & 0xFF, t1, g0, g1, t2, t3))
        busy.append(run_sm / (span / 1e3))
    every = [v for vs in fixed.values() for v in vs]
    return {
        "span_us": span / 1e3,
        "records": int(valid.sum()),
        "mean_busy_fraction": sum(busy) / len(busy),
        "median_fixed_us": statistics.median(every) if every else 0.0,
        "per_op": {
            k: dict(
                v,
                median_fixed_us=statistics.median(fixed[k]) if fixed[k] else 0.0,
                mean_run_us=v["run_us"] / v["count"],
                mean_wait_us=v["wait_us"] / v["count"],
                mean_signal_us=v["signal_us"] / v["count"],
                mean_stage_us=v["stage_us"] / max(1, v["gemv_n"]),
                mean_gemv_us=v["gemv_us"] / max(1, v["gemv_n"]),
                mean_epilogue_us=v["epilogue_us"] / max(1, v["gemv_n"]),
            )
            for k, v in sorted(per_op.items())
        },
    }


def _fixed_us(op: int, t1: int, g0: int, g1: int, t2: int, t3: int) -> float:
    """An item's non-streaming time (issue 41's bar: a median <= 1 us): its run after the wait
    (to the end of its signals) less its streaming phase, the GEMV between its marks (the key loop
    for the attention); a fused MoE item's epilogue is its down slice's stream, so only its staging
    and signal count. An op without marks (combine, ROUTE, ...) is all fixed cost."""
    if not (g0 and g1):
        return (t3 - t1) / 1e3
    if op == abi.MK_OP_MOE_FUSED:
        return ((g0 - t1) + (t3 - t2)) / 1e3
    return ((t3 - t1) - (g1 - g0)) / 1e3


# SM-time categories of `breakdown`, in print order.
CATEGORIES = (
    "wait",  # a task's dependency wait (thread 0 spinning; the block has nothing else to do)
    "stage",  # a GEMV task's activation staging (after its wait, before the weight stream)
    "gemv",  # the weight stream and its mma (activations staged)
    "epilogue",  # after the GEMV: reduction, the op's own writes
    "op",  # the whole run of an op without a GEMV (attention, combine, route, ...)
    "signal",  # the release signals
    "gap",  # between one task's signals and the next task's start: descriptor advance, claims
    "drain_wait",  # a DRAIN waiting for its queue to open (MoE: ROUTE; attention items wait per item)
    "tail",  # after a block's last task until the step's last one
)


def breakdown(recs: torch.Tensor) -> dict:
    """Where the blocks' time goes (records as `records` returns them): SM-microseconds per
    CATEGORIES over the whole step, their share of blocks x span, and per opcode. Every block's time
    from the step's first stamp to its last is covered once (a block's gaps include its start)."""
    rows = recs.tolist()
    if not rows:
        return {"span_us": 0.0, "blocks": 0, "sm_us": {k: 0.0 for k in CATEGORIES}, "share": {}, "per_op": {}}
    t_start = min(r[2] for r in rows)
    t_end = max(r[7] for r in rows)
    by_block: dict[int, list[list[int]]] = defaultdict(list)
    for r in rows:
        by_block[r[0]].append(r[1:])
    cat = {k: 0.0 for k in CATEGORIES}
    per_op: dict[str, dict[str, float]] = defaultdict(lambda: {k: 0.0 for k in CATEGORIES})
    for rs in by_block.values():
        prev_end = t_start
        for w0, t0, t1, g0, g1, t2, t3 in sorted(rs, key=lambda r: r[1]):
            if (w0 & 0xFF) == abi.MK_OP_DRAIN:  # its wait; its items have their own records
                cat["gap"] += (t0 - prev_end) / 1e3
                cat["drain_wait"] += (t1 - t0) / 1e3
                per_op["DRAIN"]["drain_wait"] += (t1 - t0) / 1e3
                prev_end = max(prev_end, t1)
                continue
            op = per_op[abi.OPNAMES.get(w0 & 0xFF, "?")]
            parts = {"gap": t0 - prev_end, "wait": t1 - t0, "signal": t3 - t2}
            if g0 and g1:
                parts.update(stage=g0 - t1, gemv=g1 - g0, epilogue=t2 - g1)
            else:
                parts["op"] = t2 - t1
            for k, v in parts.items():
                cat[k] += v / 1e3
                op[k] += v / 1e3
            prev_end = max(prev_end, t3)
        cat["tail"] += (t_end - prev_end) / 1e3
    span = (t_end - t_start) / 1e3
    total = span * len(by_block)
    return {
        "span_us": span,
        "blocks": len(by_block),
        "sm_us": cat,
        "share": {k: v / total for k, v in cat.items()} if total else {},
        "per_op": {k: dict(v) for k, v in sorted(per_op.items())},
    }


def records(tl: torch.Tensor) -> torch.Tensor:
    """The valid records as int64 [n, 1 + MK_TL_WORDS]: block index, then the record's words."""
    rec = tl.cpu()
    valid = rec[:, :, 1] != 0
    blk = torch.arange(rec.shape[0]).unsqueeze(1).expand(rec.shape[0], rec.shape[1])
    return torch.cat([blk[valid].unsqueeze(1), rec[valid]], dim=1)


def layer_spans(recs: torch.Tensor, layer: int) -> list[dict]:
    """Per opcode of one layer (records as `records` returns them): count, first start, first
    end of wait, last end, mean run (us, relative to the layer's first task start), sorted by
    first end of wait: the layer's critical path reads top to bottom."""
    w0 = recs[:, 1]
    sel = recs[((w0 >> 8) & 0xFF) == layer]
    if len(sel) == 0:
        return []
    base = int(sel[:, 2].min())
    groups: dict[str, list[list[int]]] = defaultdict(list)
    for row in sel.tolist():
        op = abi.OPNAMES.get(row[1] & 0xFF, "?")
        if op == "DRAIN":
            continue
        groups[op].append(row[2:])
    out = []
    for op, rs in groups.items():
        out.append(
            {
                "op": op,
                "count": len(rs),
                "first_start_us": (min(r[0] for r in rs) - base) / 1e3,
                "first_ready_us": (min(r[1] for r in rs) - base) / 1e3,
                "last_ready_us": (max(r[1] for r in rs) - base) / 1e3,
                "last_end_us": (max(r[5] for r in rs) - base) / 1e3,
                "mean_run_us": sum(r[5] - r[1] for r in rs) / len(rs) / 1e3,
                "mean_signal_us": sum(r[5] - r[4] for r in rs) / len(rs) / 1e3,
            }
        )
    return sorted(out, key=lambda d: d["first_ready_us"])


# the ops whose last end `chain_ends` reports per layer: the two chains of a MoE layer (QKV ->
# attention -> combine -> O-proj, and ROUTE -> MoE items) and the dense layers' MLP
CHAIN_OPS = (
    "QKV",
    "ROUTE",
    "ATTN",
    "ATTN_COMBINE",
    "OPROJ",
    "MOE_FUSED",
    "MOE_DOWN",
    "DENSE_DOWN",
)


# The ops whose signals end a layer (its one end counter, which the next layer's GEMVs wait for)
END_OPS = ("OPROJ", "MOE_DOWN", "MOE_FUSED", "DENSE_DOWN")
# _last_ends' key for a layer's end: its last END_OPS signal
LAYER_END = "END"


def _last_ends(rows: list[list[int]], ops) -> dict[int, dict[str, int]]:
    """Per layer, per opcode name in `ops`: the last end of its records (after their signals); with
    LAYER_END among `ops`, the layer's last END_OPS signal under that key: where the next layer's
    GEMVs can start."""
    ends: dict[int, dict[str, int]] = defaultdict(dict)
    for row in rows:
        op = abi.OPNAMES.get(row[1] & 0xFF, "?")
        layer = (row[1] >> 8) & 0xFF
        keys = ([op] if op in ops else []) + ([LAYER_END] if op in END_OPS and LAYER_END in ops else [])
        for k in keys:
            ends[layer][k] = max(ends[layer].get(k, 0), row[7])
    return ends


def _bin_overlaps(a: float, b: float, bin_us: float, nbins: int) -> Iterator[tuple[int, float]]:
    """(bin, us of [a, b) inside it) for each of the first nbins bins that [a, b) overlaps (times
    in us from bin 0's start, a >= 0)."""
    for i in range(int(a // bin_us), min(nbins, int(b // bin_us) + 1)):
        lo, hi = max(a, i * bin_us), min(b, (i + 1) * bin_us)
        if hi > lo:
            yield i, hi - lo


def chain_ends(recs: torch.Tensor) -> list[dict]:
    """Per layer after the first: when each op of CHAIN_OPS last ended (after its signals), in us
    from the previous layer's end (its last END_OPS signal); `layer_us` is the layer's own end.
    Which chain ends last (O-proj or the MoE items) is the one a change must shorten (2026-11-30, BS
    1: 43 of 48 layers ended on the MoE items, by ~5 us; BS 8: all of them, by ~33 us)."""
    ends = _last_ends(recs.tolist(), (*CHAIN_OPS, LAYER_END))
    out = []
    for layer in sorted(ends):
        prev = ends.get(layer - 1, {}).get(LAYER_END)
        if prev is None or LAYER_END not in ends[layer]:
            continue
        rel = {op: (t - prev) / 1e3 for op, t in ends[layer].items() if op != LAYER_END}
        out.append({"layer": layer, "layer_us": (ends[layer][LAYER_END] - prev) / 1e3, "ends_us": rel})
    return out


def layer_lengths(recs: torch.Tensor, sliding: set[int], dense: set[int]) -> dict:
    """Every layer's length and head, and the mean length by kind (full / sliding attention, dense
    MLP), in us. A layer ends with its last END_OPS signal; layer 0 counts from the
    step's first record. `head_us` is the lag from the layer's last QKV tile's end to its median
    attention item's end of wait: at BS 8 layer 0's became ready 11.8 us after its QKV tiles, later
    layers' 2.6-6.4 us after (the first 0.2-0.4 us: the pre-claimed drains), at BS 1 7.7 vs 0.5
    (2026-12-02: cold code at the step's start). Measured 2026-12-02, BS 8 at 8K: sliding layers ~170 us, full ~184 (the extra KV at full speed)."""
    rows = recs.tolist()
    if not rows:
        return {"layers": [], "mean_us": {}}
    ends = _last_ends(rows, (LAYER_END, "QKV"))
    attn_ready: dict[int, list[int]] = defaultdict(list)
    for row in rows:
        if _op(row) == "ATTN":
            attn_ready[(row[1] >> 8) & 0xFF].append(row[3])
    start = min(r[2] for r in rows)
    out, by_kind = [], defaultdict(list)
    for layer in sorted(ends):
        if LAYER_END not in ends[layer]:
            continue
        prev = start if layer == 0 else ends.get(layer - 1, {}).get(LAYER_END)
        if prev is None:
            continue
        kind = "dense" if layer in dense else "sliding" if layer in sliding else "full"
        d = {"layer": layer, "kind": kind, "length_us": (ends[layer][LAYER_END] - prev) / 1e3}
        if "QKV" in ends[layer] and attn_ready.get(layer):
            d["head_us"] = (statistics.median(attn_ready[layer]) - ends[layer]["QKV"]) / 1e3
        out.append(d)
        by_kind[kind].append(d["length_us"])
    return {"layers": out, "mean_us": {k: statistics.mean(v) for k, v in by_kind.items()}}


def layer_chain(recs: torch.Tensor, layers: set[int]) -> list[dict]:
    """Each op's phases in `layers`, in us from the end of the previous layer (its last END_OPS
    signal), as medians over those layers: the first and the median end of wait, the median GEMV
    start and end (0 for ops without one), the median and the last end after signals; rows sorted by
    median end of wait, so the layer's chains read top to bottom. `layer_us`: the median layer."""
    rows = recs.tolist()
    layer_end: dict[int, int] = defaultdict(int)
    for row in rows:
        if _op(row) in END_OPS:
            layer = (row[1] >> 8) & 0xFF
            layer_end[layer] = max(layer_end[layer], row[7])
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    by_layer: dict[tuple[str, int], list[list[int]]] = defaultdict(list)
    for row in rows:
        layer = (row[1] >> 8) & 0xFF
        if layer in layers and layer - 1 in layer_end and _op(row) != "DRAIN":
            by_layer[(_op(row), layer)].append(row)
    lengths = [
        (layer_end[x] - layer_end[x - 1]) / 1e3 for x in layers if x in layer_end and x - 1 in layer_end
    ]
    for (op, layer), rs in by_layer.items():
        base = layer_end[layer - 1]

        def rel(t: int, base: int = base) -> float:
            return (t - base) / 1e3

        d = per[op]
        d["count"].append(len(rs))
        d["ready_first"].append(rel(min(r[3] for r in rs)))
        d["ready"].append(rel(statistics.median(r[3] for r in rs)))
        g = [r for r in rs if r[4] and r[5]]
        d["gemv0"].append(rel(statistics.median(r[4] for r in g)) if g else 0.0)
        d["gemv1"].append(rel(statistics.median(r[5] for r in g)) if g else 0.0)
        d["end"].append(rel(statistics.median(r[7] for r in rs)))
        d["end_last"].append(rel(max(r[7] for r in rs)))
    out = [{"op": op, **{k: statistics.median(v) for k, v in d.items()}} for op, d in per.items()]
    out.sort(key=lambda d: d["ready"])
    return [{"layer_us": statistics.median(lengths) if lengths else 0.0}, *out]


# the chains' hand-offs at one row: (producer ops, consumer op, the producers' layer offset: -1 for
# the previous layer's end)
HAND_OFFS = (
    (("QKV",), "ATTN", 0),
    (("ATTN",), "ATTN_COMBINE", 0),
    (("ATTN_COMBINE",), "OPROJ", 0),
    (("ROUTER",), "MOE_FUSED", 0),
    (("OPROJ", "MOE_FUSED"), "QKV", -1),
)


def hand_offs(recs: torch.Tensor, layers: set[int], min_wait_us: float = 1.0) -> list[dict]:
    """How long a flag hop takes: for each chain hand-off (HAND_OFFS) and each consumer item of
    `layers` that waited at least min_wait_us, its wait end less the last producer signal before it,
    in us; the median per hand-off (`hop_us`) and the count. Exact where the consumer waits for every
    producer (ROUTER -> MOE_FUSED, the layer's end -> QKV); a lower bound where it waits for some
    (a kv head's QKV tiles or combine), since another producer may have signalled after its trigger."""
    by: dict[tuple[str, int], list[list[int]]] = defaultdict(list)
    for row in recs.tolist():
        by[(_op(row), (row[1] >> 8) & 0xFF)].append(row)
    out = []
    for producers, consumer, off in HAND_OFFS:
        hops = []
        for layer in layers:
            sigs = sorted(r[7] for p in producers for r in by.get((p, layer + off), []))
            for r in by.get((consumer, layer), []):
                if not sigs or (r[3] - r[2]) / 1e3 < min_wait_us:
                    continue
                i = bisect.bisect_right(sigs, r[3])
                if i:
                    hops.append((r[3] - sigs[i - 1]) / 1e3)
        if hops:
            out.append(
                {
                    "hand_off": f"{'+'.join(producers)} -> {consumer}",
                    "count": len(hops),
                    "hop_us": statistics.median(hops),
                }
            )
    return out


def op_phases(recs: torch.Tensor, layers: set[int], op_bytes: dict[str, int] | None = None) -> list[dict]:
    """Per GEMV opcode (records as `records` returns them, items of `layers`): the medians of an
    item's wait (start -> waits satisfied), staging (-> GEMV start), GEMV, epilogue (-> op end; a
    fused item's down slice) and signal, in us, and with op_bytes (an item's weight bytes by opcode,
    as gpu_check.layer_profile gives them) the GEMV's stream rate per SM in GB/s (`gb_s_sm`;
    MOE_FUSED_DOWN: the fused items' down slices over their epilogue). An ATTN item's GEMV is its
    key loop. Sorted by the median staging, longest first: where each item's fixed cost goes."""
    per: dict[str, list[list[int]]] = defaultdict(list)
    for row in recs.tolist():
        if (row[1] >> 8) & 0xFF in layers and row[4] and row[5]:
            per[_op(row)].append(row)
    out = []
    for op, rs in per.items():

        def med(a: int, b: int, rs: list[list[int]] = rs) -> float:
            return statistics.median((r[b] - r[a]) / 1e3 for r in rs)

        d = {"op": op, "count": len(rs), "wait_us": med(2, 3), "stage_us": med(3, 4), "gemv_us": med(4, 5)}
        d |= {"epilogue_us": med(5, 6), "signal_us": med(6, 7)}
        if op_bytes and op in op_bytes and d["gemv_us"] > 0:
            d["gb_s_sm"] = op_bytes[op] / (d["gemv_us"] * 1e3)
        if op_bytes and op == "MOE_FUSED" and "MOE_FUSED_DOWN" in op_bytes and d["epilogue_us"] > 0:
            d["down_gb_s_sm"] = op_bytes["MOE_FUSED_DOWN"] / (d["epilogue_us"] * 1e3)
        out.append(d)
    out.sort(key=lambda d: -d["stage_us"])
    return out


def _op(row: list[int]) -> str:
    """The opcode name of a record row ([block, word 0, ...], as `records` returns them)."""
    return abi.OPNAMES.get(row[1] & 0xFF, "?")


def _block_rows(recs: torch.Tensor, drains: bool) -> list[list[list[int]]]:
    """Each block's record rows by start time (then end), with or without the DRAIN records (a
    drain's items are records of their own either way)."""
    by_block: dict[int, list[list[int]]] = defaultdict(list)
    for row in recs.tolist():
        if drains or _op(row) != "DRAIN":
            by_block[row[0]].append(row)
    for rows in by_block.values():
        rows.sort(key=lambda r: (r[2], r[7]))
    return list(by_block.values())


def _successive_tasks(recs: torch.Tensor) -> Iterator[tuple[list[int], list[int]]]:
    """(previous, next) record rows of the tasks each block ran one after the other, by start time
    (DRAIN records left out, their items kept): what gaps and transitions compare."""
    for rows in _block_rows(recs, drains=False):
        yield from pairwise(rows)


def gaps(recs: torch.Tensor) -> list[dict]:
    """The time a block spends between two tasks it runs (DRAIN records left out, their items kept):
    per (previous opcode, next opcode), the count, total and median / 90th percentile gap in us,
    largest total first. A gap is the next task's start minus the previous one's end (after its
    signals): claims, descriptor builds and the drains' own waits fall there."""
    pairs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for prev, row in _successive_tasks(recs):
        pairs[(_op(prev), _op(row))].append((row[2] - prev[7]) / 1e3)
    out = []
    for (op0, op1), g in pairs.items():
        g.sort()
        out.append(
            {
                "prev": op0,
                "next": op1,
                "count": len(g),
                "total_us": sum(g),
                "median_us": g[len(g) // 2],
                "p90_us": g[min(len(g) - 1, int(len(g) * 0.9))],
            }
        )
    return sorted(out, key=lambda d: -d["total_us"])


def stream_profile(
    recs: torch.Tensor,
    layer: int,
    op_bytes: dict[str, float],
    attn_bytes: float,
    bin_us: float = 2.0,
) -> list[dict]:
    """HBM traffic over one layer's time (records as `records` returns them): each GEMV record's
    weight bytes (op_bytes[opcode name], its tile) spread evenly over its GEMV interval, the layer's
    KV bytes (attn_bytes) split evenly over its ATTN records' run intervals. Per bin of bin_us from
    the layer's first task start: TB/s and how many blocks were in a GEMV (per opcode) or in attention
    during it (block-time / bin). An estimate (a GEMV does not stream evenly), to see where a layer
    streams below the copy bandwidth and which tasks run then. A fused MoE item streams its down
    slice after its up GEMV (in its epilogue): with op_bytes["MOE_FUSED_DOWN"] those bytes go over
    the epilogue (GEMV end to op end, counted as MOE_FUSED_DOWN), op_bytes["MOE_FUSED"] over the up
    GEMV (the 2026-11-30 profile put the whole item's bytes over the up GEMV, and the down slices'
    phase looked idle)."""
    w0 = recs[:, 1]
    sel = recs[((w0 >> 8) & 0xFF) == layer].tolist()
    if not sel:
        return []
    base = min(r[2] for r in sel)
    end = max(r[7] for r in sel)
    nbins = max(1, math.ceil((end - base) / 1e3 / bin_us))
    traffic = [0.0] * nbins
    busy: list[dict[str, float]] = [defaultdict(float) for _ in range(nbins)]
    n_attn = sum(1 for r in sel if (r[1] & 0xFF) == abi.MK_OP_ATTN)

    def spread(t0: int, t1: int, nbytes: float, op: str) -> None:
        a, b = (t0 - base) / 1e3, (t1 - base) / 1e3
        for i, us in _bin_overlaps(a, b, bin_us, nbins):
            traffic[i] += nbytes * us / (b - a)
            busy[i][op] += us / bin_us

    for r in sel:
        opc = r[1] & 0xFF
        op = abi.OPNAMES.get(opc, "?")
        _, _, t1, g0, g1, t2, _ = r[1:]
        if opc == abi.MK_OP_ATTN and n_attn:
            spread(t1, t2, attn_bytes / n_attn, op)
        elif g0 and g1:
            spread(g0, g1, op_bytes.get(op, 0.0), op)
            if opc == abi.MK_OP_MOE_FUSED and "MOE_FUSED_DOWN" in op_bytes:
                spread(g1, t2, op_bytes["MOE_FUSED_DOWN"], "MOE_FUSED_DOWN")
    return [
        {"t_us": i * bin_us, "tb_s": traffic[i] / (bin_us * 1e-6) / 1e12, "blocks": dict(busy[i])}
        for i in range(nbins)
    ]


def routing_gap(
    recs: torch.Tensor, layer: int, op_bytes: dict[str, float], attn_bytes: float, bin_us: float = 0.25
) -> dict:
    """The layer's routing gap (records as `records` returns them): from its first QKV / router tile's
    end of wait (the previous layer's end) to its first MoE GEMV start (the experts known), and the
    HBM rate in it, as stream_profile estimates it (issue 41's bar: >= 3 TB/s). {} without MoE items."""
    w0 = recs[:, 1]
    sel = recs[((w0 >> 8) & 0xFF) == layer].tolist()
    heads = [r[3] for r in sel if (r[1] & 0xFF) in (abi.MK_OP_QKV, abi.MK_OP_ROUTER)]
    moe = [r[4] for r in sel if (r[1] & 0xFF) in (abi.MK_OP_MOE_UP, abi.MK_OP_MOE_FUSED) and r[4]]
    if not heads or not moe:
        return {}
    base = min(r[2] for r in sel)  # stream_profile's bin 0
    lo, hi = (min(heads) - base) / 1e3, (min(moe) - base) / 1e3
    if hi <= lo:
        return {}
    prof = stream_profile(recs, layer, op_bytes, attn_bytes, bin_us)
    mb = sum(prof[i]["tb_s"] * us for i, us in _bin_overlaps(lo, hi, bin_us, len(prof)))  # TB/s x us = MB
    return {"start_us": lo, "length_us": hi - lo, "tb_s": mb / (hi - lo)}


def sm_states(recs: torch.Tensor, layer: int, bin_us: float = 8.0) -> list[dict]:
    """What the blocks do over one layer (records as `records` returns them), from the previous
    layer's end (its last END_OPS signal) to this layer's, in bins of bin_us: per bin, blocks
    (block-time / bin) streaming per opcode (a GEMV interval; an ATTN item's run), in fixed costs
    (`fixed`: staging, epilogue, signal, the run of other ops), waiting per opcode (a task's
    dependency wait), and `idle` (the rest: between tasks, a drain's own wait, nothing to do).
    The view of the BS 8 dips (2026-11-30): which op the idle SMs wait on, and when. Empty when the
    layer or the previous one has no end."""
    rows = recs.tolist()
    ends = _last_ends(rows, (LAYER_END,))
    if LAYER_END not in ends.get(layer, {}) or LAYER_END not in ends.get(layer - 1, {}):
        return []
    t0, t1 = ends[layer - 1][LAYER_END], ends[layer][LAYER_END]
    nbins = max(1, math.ceil((t1 - t0) / 1e3 / bin_us))
    bins: list[dict[str, float]] = [defaultdict(float) for _ in range(nbins)]

    def add(key: str, a: int, b: int) -> None:
        for i, us in _bin_overlaps((max(a, t0) - t0) / 1e3, (min(b, t1) - t0) / 1e3, bin_us, nbins):
            bins[i][key] += us / bin_us

    for _, w0, ts, tr, g0, g1, te, tsg in rows:
        op = abi.OPNAMES.get(w0 & 0xFF, "?")
        if op == "DRAIN" or tsg <= t0 or ts >= t1:
            continue
        add("wait:" + op, ts, tr)
        if g0 and g1:
            add("fixed", tr, g0)
            add("stream:" + op, g0, g1)
            add("fixed", g1, tsg)
        elif op == "ATTN":
            add("stream:" + op, tr, te)
            add("fixed", te, tsg)
        else:
            add("fixed", tr, tsg)
    n_blocks = int(recs[:, 0].max()) + 1 if len(rows) else 0
    out = []
    for i, b in enumerate(bins):
        stream = {k[7:]: v for k, v in b.items() if k.startswith("stream:")}
        wait = {k[5:]: v for k, v in b.items() if k.startswith("wait:")}
        busy = sum(b.values())
        out.append(
            {
                "t_us": i * bin_us,
                "stream": stream,
                "fixed": b.get("fixed", 0.0),
                "wait": wait,
                "idle": max(0.0, n_blocks - busy),
            }
        )
    return out


def sm_tasks(recs: torch.Tensor, layer: int, lo_us: float, hi_us: float) -> dict[int, list[dict]]:
    """Each block's tasks (DRAIN records left out) that overlap [lo_us, hi_us] of one layer, times
    in us from the previous layer's end (as sm_states): per task its op, layer, start, end of its
    dependency wait, end. The per-SM view that showed the 2026-11-30 O-proj items waiting on
    combines that busy SMs had claimed ahead. Empty without the previous layer's end."""
    rows = recs.tolist()
    ends = _last_ends(rows, (LAYER_END,))
    if LAYER_END not in ends.get(layer - 1, {}):
        return {}
    t0 = ends[layer - 1][LAYER_END]
    out: dict[int, list[dict]] = defaultdict(list)
    for blk, w0, ts, tr, _g0, _g1, _te, tsg in sorted(rows, key=lambda r: (r[0], r[2])):
        op = abi.OPNAMES.get(w0 & 0xFF, "?")
        start, ready, end = ((t - t0) / 1e3 for t in (ts, tr, tsg))
        if op == "DRAIN" or end < lo_us or start > hi_us:
            continue
        out[blk].append({"op": op, "layer": (w0 >> 8) & 0xFF, "start": start, "ready": ready, "end": end})
    return dict(out)


def transitions(recs: torch.Tensor) -> list[dict]:
    """Per (GEMV task's op, the op its block ran just before it), over the tasks with GEMV marks
    (records as `records` returns them; DRAIN records left out): count and medians in us of the gap
    (the previous task's end after its signals -> this task's start), pre (end of its dependency wait
    -> GEMV start: staging) and post (GEMV end -> end after its signals: epilogue, signal); most
    frequent first. Measured 2026-12-01: an item after one of its own op (code warm) pays about what one after
    another op does, so a GEMV item's fixed costs are not cold code; an ATTN -> MOE_UP gap is the
    attention SMs' switch to the MoE queue."""
    acc: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    for prev, row in _successive_tasks(recs):
        _blk, _w0, ts, tr, g0, g1, _te, tsg = row
        if g0 and g1:
            acc[(_op(row), _op(prev))].append(((ts - prev[7]) / 1e3, (g0 - tr) / 1e3, (tsg - g1) / 1e3))
    out = [
        {
            "op": op,
            "after": after,
            "count": len(v),
            "gap_us": statistics.median(x[0] for x in v),
            "pre_us": statistics.median(x[1] for x in v),
            "post_us": statistics.median(x[2] for x in v),
        }
        for (op, after), v in acc.items()
    ]
    return sorted(out, key=lambda d: (-d["count"], d["op"], d["after"]))


def attention_runs(recs: torch.Tensor, sliding: set[int]) -> dict[str, dict]:
    """The ATTN items' run (end of the dependency wait -> end of the op) and wait (start -> end of the
    wait), by layer kind: "full" and "sliding" (layers in `sliding`): count, median, p10 and p90 run,
    median wait, in us (records as `records` returns them). Measured 2026-12-01: a sliding layer's item at 8K
    (22 pages, 11 rounds) ran ~32-34 us at BS 8 and its BS 1 item (4 rounds) ~13 us: ~2.5-3 us per
    round whether or not HBM was saturated, and no memory-side change moved it."""
    runs: dict[str, list[tuple[float, float]]] = {"full": [], "sliding": []}
    for _blk, w0, ts, tr, _g0, _g1, te, _tsg in recs.tolist():
        if abi.OPNAMES.get(w0 & 0xFF) == "ATTN":
            kind = "sliding" if (w0 >> 8) & 0xFF in sliding else "full"
            runs[kind].append(((te - tr) / 1e3, (tr - ts) / 1e3))
    out = {}
    for kind, v in runs.items():
        if not v:
            continue
        run = sorted(x[0] for x in v)
        out[kind] = {
            "count": len(v),
            "run_median_us": statistics.median(run),
            "run_p10_us": run[len(run) // 10],
            "run_p90_us": run[(9 * len(run)) // 10],
            "wait_median_us": statistics.median(x[1] for x in v),
        }
    return out


SWITCH_SEGMENTS = ("signal", "to_drain", "drain_wait", "to_item", "item_wait", "to_gemv")


def switch_segments(recs: torch.Tensor) -> dict[str, dict[str, float]]:
    """An attention SM's switch to the MoE queue, per segment: over every block's ATTN item followed by
    a MOE_UP item with only DRAIN records between (records as `records` returns them), the medians
    and p90s in us of: the ATTN's end -> after its signal (signal), -> the MoE drain's start
    (to_drain: the claim that finds the attention queue empty, the drain's exit), -> that drain's end
    of wait (drain_wait: ROUTE's counter, its first claim, h staged), -> the up item's start
    (to_item: the expert table, item build, dispatch), -> its end of wait (item_wait), -> its GEMV
    start (to_gemv), and the total; "count" the switches. Measured 2026-12-01: 12.7 us median at BS 8.
    A switch inside one drain (Tiling.attn_in_moe = 3: the attention items head the MoE queue, and an
    up item of the same layer follows its block's ATTN item with no drain record started between)
    has no drain exit or wait: to_drain and drain_wait are 0 and to_item runs from the signal to the
    up item's start (its claim, ROUTE's wait, the table and h); "in_drain" counts those."""
    segs: dict[str, list[float]] = {k: [] for k in (*SWITCH_SEGMENTS, "total")}
    in_drain = 0
    for rows in _block_rows(recs, drains=True):
        for i, a in enumerate(rows):
            if _op(a) != "ATTN":
                continue
            j = i + 1
            while j < len(rows) and _op(rows[j]) == "DRAIN":
                j += 1
            drains = [r for r in rows[i + 1 : j] if r[2] >= a[7]]  # the MoE drain starts after the item
            if j == len(rows) or _op(rows[j]) != "MOE_UP":
                continue
            u = rows[j]
            if drains:
                d = drains[-1]
                stamps = (a[6], a[7], d[2], d[3], u[2], u[3], u[4])
            elif (u[1] >> 8) & 0xFF == (a[1] >> 8) & 0xFF:  # the same layer's drain ran both
                in_drain += 1
                stamps = (a[6], a[7], a[7], a[7], u[2], u[3], u[4])
            else:
                continue
            for k, (x, y) in zip(SWITCH_SEGMENTS, pairwise(stamps), strict=True):
                segs[k].append((y - x) / 1e3)
            segs["total"].append((u[4] - a[6]) / 1e3)
    if not segs["total"]:
        return {}
    out: dict[str, dict[str, float]] = {}
    for k, v in segs.items():
        v.sort()
        out[k] = {"median_us": statistics.median(v), "p90_us": v[(9 * len(v)) // 10]}
    out["count"] = {"n": float(len(segs["total"])), "in_drain": float(in_drain)}
    return out


def moe_phase(recs: torch.Tensor, layer: int, bin_us: float = 10.0) -> dict:
    """One layer's MoE items over time (records as `records` returns them), in us from the layer's
    first task's end of wait (not its start: a control SM's ROUTE starts waiting at the step's start,
    a drain's wait can end in the previous layer's tail): per bin of bin_us, how many up tiles became ready and ended, how many down
    tiles started, became ready (their expert's up tiles done) and ended; the down tiles' total wait
    (SM-us between a down's start and its ready: SMs that claimed a down before its expert's ups
    ended); and the layer's end (its last MoE / O-proj item) with each block's idle time before it
    (SM-us from the block's last record of the layer). Measured 2026-12-02: at BS 8 the up tiles claimed at
    the attention SMs' switch ended 60-90 us later, and their downs set the layer's end."""
    sel = [r for r in recs.tolist() if ((r[1] >> 8) & 0xFF) == layer]
    if not sel:
        return {}
    # the first end of wait of a task (a drain's can lie in the previous layer's tail)
    base = min((r[3] for r in sel if (r[1] & 0xFF) != abi.MK_OP_DRAIN), default=min(r[3] for r in sel))

    def us(t: int) -> float:
        return (t - base) / 1e3

    def hist(vals: list[float]) -> dict[float, int]:
        out: dict[float, int] = defaultdict(int)
        for v in vals:
            out[math.floor(v / bin_us) * bin_us] += 1
        return dict(sorted(out.items()))

    ups = [r for r in sel if (r[1] & 0xFF) == abi.MK_OP_MOE_UP]
    downs = [r for r in sel if (r[1] & 0xFF) == abi.MK_OP_MOE_DOWN]
    ends = [r for r in sel if (r[1] & 0xFF) in (abi.MK_OP_MOE_DOWN, abi.MK_OP_MOE_FUSED, abi.MK_OP_OPROJ)]
    if not ends:
        return {}
    end = max(r[7] for r in ends)
    last: dict[int, int] = {}
    for r in sel:
        last[r[0]] = max(last.get(r[0], 0), r[7])
    return {
        "up_ready": hist([us(r[3]) for r in ups]),
        "up_end": hist([us(r[7]) for r in ups]),
        "down_start": hist([us(r[2]) for r in downs]),
        "down_ready": hist([us(r[3]) for r in downs]),
        "down_end": hist([us(r[7]) for r in downs]),
        "down_wait_sm_us": sum(us(r[3]) - us(r[2]) for r in downs),
        "end_us": us(end),
        "idle_before_end_sm_us": sum(max(0.0, us(end) - us(t)) for t in last.values()),
    }


def _release_layer_kinds() -> tuple[set[int], set[int]]:
    """The release config's (sliding-window, dense) layers: what the CLI's saved steps ran."""
    from mkcode.backend.model.config import north_mini_code_config

    cfg = north_mini_code_config()
    n = cfg.num_hidden_layers
    return {i for i in range(n) if cfg.is_sliding(i)}, {i for i in range(n) if cfg.is_dense(i)}


def main(argv: list[str] | None = None) -> int:
    """`python -m mkcode.backend.megakernel.timeline timeline_bs8.pt [--layer 25]`: a saved step's
    chain ends, one layer's SM states by bin (sm_states) and the largest gaps, on any machine."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("path", help="timeline_bs{B}.pt as gpu_check bench saves it (records)")
    p.add_argument("--layer", type=int, default=25)
    p.add_argument("--bin", type=float, default=8.0, help="bin width, us")
    p.add_argument(
        "--sms",
        nargs=3,
        type=float,
        metavar=("FROM_US", "TO_US", "EVERY"),
        help="instead: every EVERY-th block's tasks between FROM_US and TO_US of the layer, as "
        "OP<layer>[start|wait end-end] (sm_tasks)",
    )
    p.add_argument(
        "--items",
        action="store_true",
        help="instead: the GEMV tasks' fixed costs by the op before them (transitions), the ATTN "
        "items' run times by layer kind (the release config's sliding layers) and the attention SMs' "
        "switch to the MoE queue by segment (switch_segments)",
    )
    p.add_argument(
        "--layers",
        action="store_true",
        help="instead: every layer's length and head (last QKV end -> median attention ready) and the "
        "mean length by kind, the release config's full / sliding / dense layers (layer_lengths)",
    )
    p.add_argument(
        "--chain",
        action="store_true",
        help="instead: each op's phases (ready, GEMV, end) in us from the previous layer's end, "
        "medians over the release config's MoE layers 3-46 (layer_chain)",
    )
    p.add_argument(
        "--phases",
        action="store_true",
        help="instead: each GEMV op's median wait, staging, GEMV, epilogue and signal over the release "
        "config's MoE layers 3-46 (op_phases; the GB/s per SM: gpu_check bench, which knows the tiles)",
    )
    p.add_argument(
        "--moe",
        action="store_true",
        help="instead: the layer's MoE up / down tiles by time (moe_phase: ready, end, the downs' "
        "waits for their experts' ups, the blocks' idle time before the layer's end)",
    )
    args = p.parse_args(argv)
    recs = torch.load(args.path)
    if recs.dim() == 3:  # a raw [n_sms, cap, words] timeline
        recs = records(recs)
    if args.layers:
        ll = layer_lengths(recs, *_release_layer_kinds())
        if not ll["layers"]:
            print("no layer ends in these records")
            return 1
        print("layer kind     length   head  (us; head: last QKV end -> median attention ready)")
        for d in ll["layers"]:
            head = f"{d['head_us']:6.1f}" if "head_us" in d else "     -"
            print(f"{d['layer']:5d} {d['kind']:8s} {d['length_us']:7.1f} {head}")
        print("mean " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(ll["mean_us"].items())))
        return 0
    if args.chain:
        dense = _release_layer_kinds()[1]
        head, *ops = layer_chain(recs, {x for x in range(3, 47) if x not in dense})
        print(f"median layer {head['layer_us']:.1f} us; per op, us from the previous layer's end (medians)")
        print(
            f"{'op':12s} {'n':>4s} {'ready0':>7s} {'ready':>7s} {'gemv0':>7s} {'gemv1':>7s} {'end':>7s} {'last':>7s}"
        )
        for d in ops:
            print(
                f"{d['op']:12s} {d['count']:4.0f} {d['ready_first']:7.1f} {d['ready']:7.1f} {d['gemv0']:7.1f} "
                f"{d['gemv1']:7.1f} {d['end']:7.1f} {d['end_last']:7.1f}"
            )
        print("hand-offs: a waiting consumer's wait end less the last producer signal before it (medians)")
        for d in hand_offs(recs, {x for x in range(3, 47) if x not in dense}):
            print(f"  {d['hand_off']:28s} n={d['count']:5d} {d['hop_us']:6.2f} us")
        return 0
    if args.phases:
        dense = _release_layer_kinds()[1]
        print("per GEMV op, median us of its items (layers 3-46 without dense ones)")
        print(f"    {'op':12s} {'n':>5s} {'wait':>6s} {'stage':>6s} {'gemv':>6s} {'epi':>6s} {'signal':>6s}")
        for d in op_phases(recs, {x for x in range(3, 47) if x not in dense}):
            print(
                f"    {d['op']:12s} {d['count']:5d} {d['wait_us']:6.2f} {d['stage_us']:6.2f} {d['gemv_us']:6.2f} "
                f"{d['epilogue_us']:6.2f} {d['signal_us']:6.2f}"
            )
        return 0
    if args.moe:
        ph = moe_phase(recs, args.layer, args.bin)
        if not ph:
            print(f"layer {args.layer}: no MoE or O-proj items")
            return 1
        print(
            f"layer {args.layer} MoE items per {args.bin:g} us from the layer's first ready task (bin: count)"
        )
        for k in ("up_ready", "up_end", "down_start", "down_ready", "down_end"):
            print(f"  {k:10s} " + " ".join(f"{t:.0f}:{n}" for t, n in ph[k].items()))
        print(
            f"  layer end {ph['end_us']:.1f} us; downs waited {ph['down_wait_sm_us']:.0f} SM-us for "
            f"their experts' ups; blocks idle before the end {ph['idle_before_end_sm_us']:.0f} SM-us"
        )
        return 0
    if args.items:
        print(f"{'op':12s} {'after':14s} {'n':>6s} {'gap':>6s} {'pre':>6s} {'post':>6s}  (median us)")
        for d in transitions(recs):
            print(
                f"{d['op']:12s} {d['after']:14s} {d['count']:6d} {d['gap_us']:6.2f} {d['pre_us']:6.2f} {d['post_us']:6.2f}"
            )
        for kind, a in attention_runs(recs, _release_layer_kinds()[0]).items():
            print(
                f"ATTN {kind}: {a['count']} items, run median {a['run_median_us']:.1f} us (p10 "
                f"{a['run_p10_us']:.1f}, p90 {a['run_p90_us']:.1f}), wait median {a['wait_median_us']:.1f} us"
            )
        sw = switch_segments(recs)
        if sw:
            print(
                f"switch ATTN -> MOE_UP GEMV ({sw['count']['n']:.0f}, {sw['count']['in_drain']:.0f} inside one "
                "drain; median / p90 us): "
                + ", ".join(
                    f"{k} {sw[k]['median_us']:.2f} / {sw[k]['p90_us']:.2f}"
                    for k in (*SWITCH_SEGMENTS, "total")
                )
            )
        return 0
    if args.sms:
        lo, hi, every = args.sms
        tasks = sm_tasks(recs, args.layer, lo, hi)
        if not tasks:
            print(f"layer {args.layer}: no end (its end counter's last signal) before it")
            return 1
        for blk in sorted(tasks)[:: max(1, int(every))]:
            print(
                blk,
                " ".join(
                    f"{t['op']}{t['layer']}[{t['start']:.0f}|{t['ready']:.0f}-{t['end']:.0f}]"
                    for t in tasks[blk]
                ),
            )
        return 0
    ch = chain_ends(recs)
    if ch:
        mean = sum(c["layer_us"] for c in ch) / len(ch)
        print(
            f"{len(ch)} layers, mean {mean:.1f} us from layer end to layer end (the end counter's last signal)"
        )
    states = sm_states(recs, args.layer, args.bin)
    if not states:
        print(f"layer {args.layer}: no layer ends around it")
        return 1
    print(
        f"layer {args.layer}, per {args.bin:g} us: blocks streaming (by op), in fixed costs, waiting (by op), idle"
    )
    for s in states:
        st = " ".join(f"{k}:{v:.0f}" for k, v in sorted(s["stream"].items()) if v >= 0.5)
        wt = " ".join(f"{k}:{v:.0f}" for k, v in sorted(s["wait"].items()) if v >= 0.5)
        total = sum(s["stream"].values())
        print(
            f"{s['t_us']:7.1f}  stream {total:5.1f} [{st}]  fixed {s['fixed']:5.1f}  wait [{wt}]  idle {s['idle']:5.1f}"
        )
    for g in gaps(recs)[:6]:
        print(
            f"gap {g['prev']} -> {g['next']}: n={g['count']} median {g['median_us']:.2f} us, total {g['total_us'] / 1e3:.2f} SM-ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
