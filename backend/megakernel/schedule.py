"""The step's task graph and its schedule: per-SM descriptor lists, host work queues, counters.

A step is a DAG of tasks connected through counters (docs/MEGAKERNEL.md, Counters): a task waits until each of its
counters reaches a target, runs, then increments its signal counters. `build_schedule` emits, for a
batch (BS 1-8) and its attention split policy:

- `tasks`: every static task in one global topological order (its id is its index);
- `sm_lists`: that order dealt round-robin over the SMs, so each SM's list is topological and the
  step cannot deadlock while all SMs are resident (the globally earliest unfinished task is always at
  the head of its SM's list, and everything it waits on comes earlier);
- host work queues of attention splits (ragged lengths), claimed by DRAIN tasks; MoE tiles are
  claimed from per-layer device queues that ROUTE fills (routing is known only on the device);
- `totals`: each static counter's increment per step, which the host adds to the counter bases.

Dealing exceptions (each SM's list is still a subsequence of the global order): with
Tiling.ctrl_sms the last SMs hold only the ROUTE tasks (and, with Tiling.combine_ctrl, a MoE layer's
combines; the others are dealt over the rest) and the LM head's drain, which every SM holds, and
with Tiling.attn_with_qkv the attention drains go to the SMs holding the layer's QKV and router tiles
(with Tiling.attn_idle_first first to the SMs holding neither, then the router tiles', then the QKV
tiles').

Layer order (the parallel block: attention and MLP read the same h, so MoE/dense tiles backfill the
SMs that attention leaves idle): QKV, router/route (or dense up), attention drains, MoE drains,
combines, dense down, O-proj. The layer's outputs are added into x(l+1) (its router tiles, or EMBED
for a dense layer 0, copy the residual in first) and the next layer's GEMVs wait for its one end
counter and norm x(l+1) themselves. Then the LM head (one host queue) and sampling.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.tiling import Tiling, attention_splits, default_tiling
from mkcode.backend.model.config import ModelConfig

W = abi.MK_DESC_WORDS


@dataclass
class CounterSet:
    """Counter indices by name. The dynamic region [0, n_dynamic) is fixed by (L, E): per layer one
    MoE queue head and one up-tile count per expert, reset on the device by ROUTE."""

    names: list[str] = field(default_factory=list)
    totals: list[int] = field(default_factory=list)
    targets: dict[str, int] = field(default_factory=dict)  # the wait target each static counter serves
    n_dynamic: int = 0

    def add(self, name: str) -> int:
        self.names.append(name)
        self.totals.append(0)
        return len(self.names) - 1

    def index(self, name: str) -> int:
        return self.names.index(name)


def moe_head_counter(cfg: ModelConfig, layer: int) -> int:
    return layer * (cfg.num_experts + 1)


def expert_counter(cfg: ModelConfig, layer: int, expert: int) -> int:
    return layer * (cfg.num_experts + 1) + 1 + expert


@dataclass
class Schedule:
    cfg: ModelConfig
    tiling: Tiling
    batch: int
    n_sms: int
    splits: dict[bool, list[int]]  # per layer kind (sliding?), per row
    tasks: np.ndarray  # int32 [n_tasks, W], global order
    sm_lists: list[list[int]]  # task ids per SM, in order
    queue_desc: np.ndarray  # int32 [n_queue_desc, W]
    # int32 [n_queues, 4]: first, length, head counter (the attention tail of a MoE layer, claimed
    # through the layer's MoE queue head: its head items, MK_MOE_HEAD, or MK_NO_COUNTER), then 0
    queue_info: np.ndarray
    counters: CounterSet
    n_lm_tiles: int
    verify_rows: bool = False  # built for verify rows (build_schedule)

    @property
    def n_counters(self) -> int:
        return len(self.counters.names)

    @property
    def totals(self) -> np.ndarray:
        return np.array(self.counters.totals, dtype=np.int64)

    @cached_property
    def totals32(self) -> np.ndarray:
        """The per-step totals mod 2^32 as uint32: the counter bases' advance per step (computed
        once per schedule; the host adds them every step)."""
        return (self.totals & 0xFFFFFFFF).astype(np.uint32)

    def desc_array(self) -> tuple[np.ndarray, np.ndarray]:
        """(desc [n_sms, max_tasks, W], ntasks [n_sms]) as the kernel reads them."""
        max_tasks = max(1, max(len(s) for s in self.sm_lists))
        desc = np.zeros((self.n_sms, max_tasks, W), dtype=np.int32)
        ntasks = np.zeros(self.n_sms, dtype=np.int32)
        for sm, ids in enumerate(self.sm_lists):
            ntasks[sm] = len(ids)
            if ids:
                desc[sm, : len(ids)] = self.tasks[ids]
        return desc, ntasks

    def without_wait(self, task_id: int, slot: int) -> Schedule:
        """A copy with one wait of one task removed (tests prove the emulator catches it)."""
        tasks = self.tasks.copy()
        base = abi.MK_F_WAIT0 + 2 * slot
        tasks[task_id, base] = abi.MK_NO_COUNTER
        tasks[task_id, base + 1] = 0
        return replace(self, tasks=tasks)

    def without_queue_wait(self, qdesc: int, slot: int) -> Schedule:
        queue_desc = self.queue_desc.copy()
        base = abi.MK_F_WAIT0 + 2 * slot
        queue_desc[qdesc, base] = abi.MK_NO_COUNTER
        queue_desc[qdesc, base + 1] = 0
        return replace(self, queue_desc=queue_desc)

    def describe(self, words: np.ndarray) -> str:
        op = abi.OPNAMES.get(int(words[abi.MK_F_OP]), "?")
        args = ",".join(str(int(words[abi.MK_F_A0 + i])) for i in range(5))
        return f"{op}(layer={int(words[abi.MK_F_LAYER])}, args={args}, id={int(words[abi.MK_F_ID])})"

    def summary(self) -> dict[str, int]:
        ops: dict[str, int] = {}
        for op in self.tasks[:, abi.MK_F_OP]:
            name = abi.OPNAMES[int(op)]
            ops[name] = ops.get(name, 0) + 1
        for op in self.queue_desc[:, abi.MK_F_OP]:  # host queue items: attention, MoE layers' tails
            name = abi.OPNAMES[int(op)]
            if name != "ATTN":
                ops[name] = ops.get(name, 0) + 1
        ops["queued_attention"] = int((self.queue_desc[:, abi.MK_F_OP] == abi.MK_OP_ATTN).sum())
        ops["max_per_sm"] = max(len(s) for s in self.sm_lists)
        return ops


_F_OP, _F_LAYER, _F_A0, _F_NWAIT = abi.MK_F_OP, abi.MK_F_LAYER, abi.MK_F_A0, abi.MK_F_NWAIT
_F_WAIT0, _F_NSIG, _F_SIG0, _F_AMOUNT = abi.MK_F_WAIT0, abi.MK_F_NSIG, abi.MK_F_SIG0, abi.MK_F_SIG_AMOUNT
_MAX_WAITS, _MAX_SIGNALS = abi.MK_MAX_WAITS, abi.MK_MAX_SIGNALS
# an empty descriptor: no waits, no signals (the builder copies it ~30K times per schedule)
_TEMPLATE = [0] * W
for _i in range(_MAX_WAITS):
    _TEMPLATE[_F_WAIT0 + 2 * _i] = abi.MK_NO_COUNTER
for _i in range(_MAX_SIGNALS):
    _TEMPLATE[_F_SIG0 + _i] = abi.MK_NO_COUNTER


def make_desc(
    op: int,
    layer: int,
    args: tuple[int, ...] = (),
    waits: tuple[tuple[int, int], ...] = (),
    signals: tuple[int, ...] = (),
    amount: int = 1,
) -> list[int]:
    if len(args) > 5 or len(waits) > _MAX_WAITS or len(signals) > _MAX_SIGNALS:
        raise ValueError("descriptor overflow")
    d = _TEMPLATE.copy()
    d[_F_OP] = op
    d[_F_LAYER] = layer
    d[_F_A0 : _F_A0 + len(args)] = args
    d[_F_NWAIT] = len(waits)
    for i, (c, t) in enumerate(waits):
        d[_F_WAIT0 + 2 * i] = c
        d[_F_WAIT0 + 2 * i + 1] = t
    d[_F_NSIG] = len(signals)
    d[_F_SIG0 : _F_SIG0 + len(signals)] = signals
    d[_F_AMOUNT] = amount
    return d


def qkv_row_head(cfg: ModelConfig, row: int) -> int:
    """The kv head a row of [Wq; Wk; Wv] belongs to: Q rows by their query head's group, K and V rows
    by their head."""
    if row < cfg.q_width:
        return row // (cfg.gqa_group * cfg.head_dim)
    return ((row - cfg.q_width) % cfg.kv_width) // cfg.head_dim


def moe_local_fits(cfg: ModelConfig, tiling: Tiling, n_sms: int) -> bool:
    """Whether a one-row MoE layer's self-routing fused items (Tiling.moe_local) find as many SMs
    free of the layer's QKV and router tiles, dealt round-robin over the work SMs (build_schedule).
    With Tiling.moe_group the router tiles run on the items' own SMs."""
    n_ctrl = tiling.ctrl_sms if 2 * tiling.ctrl_sms <= n_sms else 0
    n_work = n_sms - n_ctrl
    n_qkv = tiling.moe_qkv_tiles(cfg)
    n_router = 0 if tiling.moe_group else max(cfg.num_experts, 1) // tiling.router_rows
    up_tiles, _ = tiling.moe_tiles(cfg)
    return n_work - min(n_work, n_qkv + n_router) >= cfg.num_experts_per_tok * up_tiles


def build_schedule(
    cfg: ModelConfig,
    batch: int,
    positions: list[int],
    n_sms: int,
    tiling: Tiling | None = None,
    splits: dict[bool, list[int]] | None = None,
    verify_rows: bool = False,
) -> Schedule:
    """Build one step's schedule for `batch` rows at `positions` (the split policy's input).

    `verify_rows`: some rows are verify rows of one sequence (DecodeBatch.seq_rows: consecutive
    positions over one block table), so a row's attention reads K/V that other rows' QKV tiles write
    in this step. An ATTN item waits for its kv head's QKV tiles, but the kernel starts its first K/V
    pages before that wait (the prologue assumes every slot but the row's own holds earlier steps'
    K/V), so the item's wait does not order those loads. Here every attention item is a host-queue
    item (Tiling.attn_in_moe is set aside) and the drains that claim them wait for every QKV tile of
    the layer first: each item's prologue runs after all of the layer's K/V are written."""
    if not 1 <= batch <= abi.MK_MAX_TOKENS:
        raise ValueError(f"batch must be in 1..{abi.MK_MAX_TOKENS}, got {batch}")
    if len(positions) != batch:
        raise ValueError("one position per row")
    tiling = tiling or default_tiling(cfg)
    tiling.validate(cfg)
    splits = splits or attention_splits(cfg, positions, tiling, n_sms)
    L, B, E, K = cfg.num_hidden_layers, batch, cfg.num_experts, cfg.num_experts_per_tok
    Hkv, G, d, H = cfg.num_key_value_heads, cfg.gqa_group, cfg.head_dim, cfg.hidden_size
    has_moe = any(not cfg.is_dense(i) for i in range(L))

    cs = CounterSet()
    if has_moe:
        for layer in range(L):
            cs.add(f"moe_head[{layer}]")
            for e in range(E):
                cs.add(f"expert[{layer}][{e}]")
    cs.n_dynamic = len(cs.names)

    tasks: list[list[int]] = []
    # the SM of each task: round-robin over the work SMs, except control tasks (ROUTE) on the last
    # Tiling.ctrl_sms SMs and attention drains with Tiling.attn_with_qkv
    n_ctrl = tiling.ctrl_sms if 2 * tiling.ctrl_sms <= n_sms else 0
    n_work = n_sms - n_ctrl
    deal: list[int] = []
    rr = itertools.count()  # the round-robin cursor over the work SMs

    def ctrl_sm(k: int) -> int | None:
        return n_work + k % n_ctrl if n_ctrl else None

    qdescs: list[list[int]] = []
    qinfo: list[list[int]] = []

    def emit(d: list[int], sm: int | None = None) -> None:
        d[abi.MK_F_ID] = len(tasks)
        tasks.append(d)
        deal.append(next(rr) % n_work if sm is None else sm)
        for i in range(d[abi.MK_F_NSIG]):
            cs.totals[d[abi.MK_F_SIG0 + i]] += d[abi.MK_F_SIG_AMOUNT]

    def counter(name: str, target: int) -> int:
        c = cs.add(name)
        cs.targets[name] = target
        return c

    def enqueue(items: list[list[int]]) -> int:
        """Append host-queue items (negative ids) and count their signals; their first index."""
        first = len(qdescs)
        for qd in items:
            qd[abi.MK_F_ID] = -1 - len(qdescs)
            qdescs.append(qd)
            for i in range(qd[abi.MK_F_NSIG]):
                cs.totals[qd[abi.MK_F_SIG0 + i]] += qd[abi.MK_F_SIG_AMOUNT]
        return first

    def host_queue(name: str, items: list[list[int]], n_drains: int) -> int:
        """A host queue of `items` claimed by n_drains DRAIN tasks through a new head counter;
        its queue index. Every drain claims exactly twice past the end (the kernel's DRAIN)."""
        first = enqueue(items)
        head_c = counter(name, 0)
        cs.totals[head_c] += len(items) + 2 * n_drains
        qinfo.append([first, len(items), head_c, 0])
        return len(qinfo) - 1

    embed_c = counter("embed", B)  # x(0) (and a dense layer 0's x(1)) written
    # Tiling.attn_in_moe = 3: the MoE queue heads are claimed before ROUTE, so the EMBED of row 0
    # resets them (mk_abi.h MK_EMBED_RESET_HEADS) and ROUTE leaves them alone (MK_ROUTE_KEEP_HEAD)
    late_route = tiling.attn_in_moe == 3 and has_moe and not verify_rows
    for b in range(B):
        reset = abi.MK_EMBED_RESET_HEADS if late_route and b == 0 else 0
        emit(make_desc(abi.MK_OP_EMBED, 0, (b, reset), (), (embed_c,)))

    n_o = (H // tiling.o_rows) * Hkv
    # What the GEMVs over h(l) wait for, (counter, target): the EMBED tasks, then the previous
    # layer's end, its MLP counter (the O-proj tiles signal it too)
    prev_end: tuple[int, int] = (embed_c, B)
    # Tiling.moe_local: the fused items are static tasks that route themselves (one row only)
    local = bool(tiling.moe_local)
    if local and (B != 1 or verify_rows):
        raise ValueError("Tiling.moe_local routes one row: batch 1 without verify rows only")
    for layer in range(L):
        sliding = cfg.is_sliding(layer)
        dense = cfg.is_dense(layer)
        rows_splits = splits[sliding]
        # Tiling.attn_group (one row, MoE layers): each kv head's QKV tiles, attention splits and
        # O-proj tiles as static tasks on a group of attn_group SMs of its own (below)
        agroup = tiling.attn_group if not dense else 0
        n_qkv = tiling.qkv_tiles(cfg) if dense else tiling.moe_qkv_tiles(cfg)
        # Tiling.qkv_by_head: one counter per kv head (its Q group's, K and V tiles), else one
        # (kv head h's counter is qkv_cs[h % qkv_heads] either way)
        qkv_heads = Hkv if tiling.qkv_by_head or agroup else 1
        per_head = n_qkv // qkv_heads
        qkv_cs = [
            counter(f"qkv[{layer}]" if qkv_heads == 1 else f"qkv[{layer}][{h}]", per_head)
            for h in range(qkv_heads)
        ]
        # verify_rows: what the attention drains wait for, every QKV tile of the layer (the one QKV
        # counter, or with per-head counters one more that every tile signals: a drain has only
        # MK_MAX_WAITS waits, and one path at every head count is what the GPU tests cover)
        qkv_all = counter(f"qkv_all[{layer}]", n_qkv) if verify_rows and qkv_heads > 1 else None
        drain_waits: tuple[tuple[int, int], ...] = ()
        if verify_rows:
            drain_waits = ((qkv_cs[0], per_head),) if qkv_all is None else ((qkv_all, n_qkv),)
        comb_c = [counter(f"combine[{layer}][{h}]", B) for h in range(Hkv)]
        att_c = [[counter(f"attn[{layer}][{b}][{h}]", rows_splits[b]) for h in range(Hkv)] for b in range(B)]
        wait_h = (prev_end,)

        # 1. QKV tiles (the SMs that hold this layer's QKV and router tiles, for attn_with_qkv)
        first_qkv = len(tasks)
        group_sms = [list(range(h * agroup, (h + 1) * agroup)) for h in range(Hkv)] if agroup else []
        if agroup:  # two row ranges per tile: a share of the head's Q rows, then of its K or V rows
            qn, kvn = tiling.attn_group_rows(cfg)
            half = agroup // 2  # the first half's tiles take K rows, the second's V rows
            for h in range(Hkv):
                for r in range(agroup):
                    kv0 = cfg.q_width + (r >= half) * cfg.kv_width + h * d + (r % half) * kvn
                    qd = make_desc(
                        abi.MK_OP_QKV, layer, (h * G * d + r * qn, qn, kv0, kvn), wait_h, (qkv_cs[h],)
                    )
                    emit(qd, group_sms[h][r])
        for t in range(0 if agroup else n_qkv):
            r0 = t * tiling.qkv_rows
            sig = (qkv_cs[qkv_row_head(cfg, r0) % qkv_heads],) + ((qkv_all,) if qkv_all is not None else ())
            emit(make_desc(abi.MK_OP_QKV, layer, (r0, tiling.qkv_rows), wait_h, sig))

        qkv_sms = list(dict.fromkeys(deal[first_qkv:]))
        on_qkv_sms = set(qkv_sms)

        # 2. MLP front: dense up tiles, or router tiles + ROUTE
        if dense:
            D = cfg.prefix_dense_intermediate_size
            n_up = D // tiling.dense_up_cols
            up_c = counter(f"dense_up[{layer}]", n_up)
            n_down = (H // tiling.dense_down_rows) * tiling.mlp_splits
            mlp_c = counter(f"mlp[{layer}]", n_down + n_o)
            for t in range(n_up):
                c0 = t * tiling.dense_up_cols
                emit(make_desc(abi.MK_OP_DENSE_UP, layer, (c0, tiling.dense_up_cols), wait_h, (up_c,)))
        moe_sms: list[int] = []  # Tiling.moe_local: the SMs of the layer's fused items
        if not dense:
            grouped = bool(tiling.moe_group)  # the router tiles on the items' SMs, below
            n_router = E // tiling.router_rows
            router_c = counter(f"router[{layer}]", n_router) if not grouped else abi.MK_NO_COUNTER
            route_c = counter(f"route[{layer}]", 1) if not local else abi.MK_NO_COUNTER
            # signalled by the MoE items that end the MLP (amount: their tokens): the fused items
            # (every token slot is in one item per column tile), else the down tiles
            up_tiles, down_tiles = tiling.moe_tiles(cfg)
            mlp_items = up_tiles if tiling.moe_fused else down_tiles
            mlp_c = counter(f"mlp[{layer}]", B * K * mlp_items + n_o)
            if not local:  # device-made items (Tiling.moe_local: static tasks, counted by emit)
                cs.totals[mlp_c] += B * K * mlp_items
            for t in range(0 if grouped else n_router):
                r0 = t * tiling.router_rows
                on = (agroup * Hkv + t) % n_work if agroup else None  # off the attention groups' SMs
                emit(make_desc(abi.MK_OP_ROUTER, layer, (r0, tiling.router_rows), wait_h, (router_c,)), on)
            if not local:
                keep = (abi.MK_ROUTE_KEEP_HEAD,) if late_route else ()
                emit(
                    make_desc(abi.MK_OP_ROUTE, layer, keep, ((router_c, n_router),), (route_c,)),
                    ctrl_sm(layer),
                )
            else:  # the SMs without this layer's QKV or router tiles, from a point that turns per layer
                x_init = (router_c, n_router)  # x(l+1)'s initialiser: the router tiles (below: group 0's)
                n_items = K * up_tiles
                group = tiling.moe_group
                busy = set(deal[first_qkv:])
                free = [s for s in range(n_work) if s not in busy]
                turn = (layer * n_items) % max(1, len(free))
                moe_sms = (free[turn:] + free[:turn])[:n_items]
                if len(moe_sms) < n_items:
                    raise ValueError(
                        f"moe_local: {n_items} fused items need as many SMs free of the layer's "
                        f"QKV and router tiles, {len(free)} are"
                    )
                # what each item ranks (rlogits row, router counter, its target): Tiling.moe_group's
                # group g: E / group experts per SM into row g, its own SMs' tiles
                rows_of: list[tuple[int, int, int]] = []
                if grouped:
                    per = tiling.moe_router_rows(cfg)
                    for g in range(n_items // group):
                        gc = counter(f"router[{layer}][{g}]", group)
                        for r in range(group):
                            tile = make_desc(abi.MK_OP_ROUTER, layer, (r * per, per), wait_h, (gc,))
                            tile[abi.MK_F_LROW] = g
                            emit(tile, moe_sms[g * group + r])
                        rows_of += [(g, gc, group)] * group
                    # group 0's tiles initialise x(l+1) (LROW 0 copies the residual): what the
                    # items of other groups and the O-proj tiles below add onto
                    x_init = (rows_of[0][1], group)
                else:
                    rows_of = [(0, router_c, n_router)] * n_items
                for m in range(n_items):
                    j, t = divmod(m, up_tiles)
                    c0, cols = t * tiling.moe_up_cols, tiling.moe_up_cols
                    g, gc, target = rows_of[m]
                    # h(l) first: the item stages it meanwhile (a group's router tile has staged it)
                    waits = (*wait_h, (gc, target)) + ((x_init,) if g else ())
                    args = (j, c0, cols, abi.MK_MOE_LOCAL, rows_splits[0])  # A4: which KV pages to prefetch
                    item = make_desc(abi.MK_OP_MOE_FUSED, layer, args, waits, (mlp_c,))
                    item[abi.MK_F_NTOK] = 1
                    item[abi.MK_F_SLOT0] = j
                    item[abi.MK_F_LROW] = g
                    emit(item, moe_sms[m])

        # 3. attention splits into this layer's host queue, claimed by drains
        attn_items = []
        for b in range(B):
            for h in range(Hkv):
                s_n = rows_splits[b]
                attn_items += [
                    make_desc(
                        abi.MK_OP_ATTN,
                        layer,
                        (b, h, s, s_n),
                        ((qkv_cs[h % qkv_heads], per_head),),
                        (att_c[b][h],),
                    )
                    for s in range(s_n)
                ]
        # Tiling.attn_group: split r of kv head h a static task after the QKV tile on the group's
        # SM r (the splits: attention_splits gives attn_group)
        if agroup:
            if rows_splits[0] != agroup:
                raise ValueError(f"attn_group: {agroup} splits per kv head, the step has {rows_splits[0]}")
            for k, ad in enumerate(attn_items):
                emit(ad, group_sms[k // agroup][k % agroup])
            attn_items = []
        # Tiling.attn_in_moe: a MoE layer's attention items are its MoE queue's head, before its up
        # tiles, claimed before ROUTE (below); no attention drains
        in_moe = bool(tiling.attn_in_moe) and not dense and not verify_rows
        n_drains = 0 if in_moe or agroup else min(len(attn_items), n_work)
        # the SMs that hold this layer's QKV and router tiles, distinct, in order (attn_with_qkv)
        pool = list(dict.fromkeys(deal[first_qkv:])) if tiling.attn_with_qkv else []
        if tiling.attn_idle_first:  # idle SMs, then the router tiles' SMs, then the QKV tiles'
            head = deal[first_qkv:]  # QKV tiles, then router tiles (or dense ups) and ROUTE
            busy = set(head)
            later = [s for s in dict.fromkeys(head[n_qkv:]) if s < n_work and s not in on_qkv_sms]
            pool = [s for s in range(n_work) if s not in busy] + later + qkv_sms
        if moe_sms:  # not behind a fused item (~40 us) in its SM's list
            pool = [s for s in (pool or range(n_work)) if s not in set(moe_sms)]
        if pool:
            n_drains = min(n_drains, len(pool))
        qid = host_queue(f"attn_head[{layer}]", attn_items, n_drains) if not in_moe else -1
        for k in range(n_drains):
            emit(
                make_desc(abi.MK_OP_DRAIN, layer, (abi.MK_QUEUE_HOST, qid), drain_waits),
                pool[k] if pool else None,
            )
        # Tiling.combine_ctrl: a MoE layer's combines as static tasks on the control SMs (one per
        # control SM in turn), where they wait warm (dry run) for their attention items and start
        # without a claim; the O-proj items stay in the MoE queue
        combine_ctrl = bool(tiling.combine_ctrl) and not dense and n_ctrl > 0

        # 5. + 7. the attention tail: combines, then O-proj tiles, K split by kv head (split s reads
        # exactly kv head s's query heads). In MoE layers they are items of the layer's MoE queue,
        # between the up and the down tiles, so that an SM that drains MoE work runs them as soon as
        # they are claimable (as static tasks after the MoE drain they waited for the MoE queue to
        # empty: 15-20 us per layer at BS 1, measured); in dense layers they stay static.
        kspan = G * d
        combines = [
            make_desc(
                abi.MK_OP_ATTN_COMBINE,
                layer,
                (b, h, rows_splits[b]),
                ((att_c[b][h], rows_splits[b]),),
                (comb_c[h],),
            )
            for b in range(B)
            for h in range(Hkv)
        ]
        n_comb = len(combines)
        if combine_ctrl:
            for k, cd in enumerate(combines):
                emit(cd, ctrl_sm(k))
            combines = []
        # (Tiling.attn_group: static O-proj tiles wait for x(l+1)'s initialiser themselves)
        o_init = (x_init,) if agroup else ()
        tail = combines + [
            make_desc(
                abi.MK_OP_OPROJ,
                layer,
                (t * tiling.o_rows, tiling.o_rows, s * kspan, (s + 1) * kspan),
                ((comb_c[s], B), *o_init),
                (mlp_c,),  # the layer's one end counter
            )
            for s in range(Hkv)
            for t in range(H // tiling.o_rows)
        ]

        # 4. MoE drains (device queue filled by ROUTE; the attention tail is its host part). With
        # Tiling.moe_local the tail is a host queue of its own, drained by every work SM without a
        # fused item; its drains wait for the router tiles, which initialise the sum x(l+1) that
        # the O-proj tiles add into (the MoE drains' wait on ROUTE covered that)
        if agroup:  # the O-proj tiles of kv head h's K range on its group's SMs, after x(l+1)'s initialiser
            for k, od in enumerate(tail):
                s_h, t = divmod(k, H // tiling.o_rows)
                emit(od, group_sms[s_h][t % agroup])
        elif moe_sms:
            free = [s for s in range(n_work) if s not in set(moe_sms)]
            qid = host_queue(f"attn_tail[{layer}]", tail, len(free))
            for sm in free:
                emit(make_desc(abi.MK_OP_DRAIN, layer, (abi.MK_QUEUE_HOST, qid), (x_init,)), sm)
        elif not dense:
            tail_q = len(qinfo)
            # claimed through the MoE head, right after the up tiles. Tiling.attn_in_moe: the attention
            # items as the MoE queue's head, right before the tail's items in the buffer, their count
            # in the tail queue's word 2 (mk_abi.h MK_MOE_HEAD). Each attention item waits on the QKV
            # tiles (static tasks before every MoE drain), each tail item on items at lower queue
            # indices, so no claim order deadlocks
            head = attn_items if in_moe else []
            first = enqueue(head + tail) + len(head)
            qinfo.append([first, len(tail), len(head) if head else abi.MK_NO_COUNTER, 0])
            # waits: h(l) first (the previous layer's end: the kernel stages h's rows for the up items
            # after it, while ROUTE runs), then ROUTE
            drain_h = wait_h[0]
            late = abi.MK_DRAIN_LATE_ROUTE if late_route else 0
            for _ in range(n_work):  # one per work SM
                # the kernel's MoE drain reads wait 0 as "h is ready", wait 1 as ROUTE; a late-route
                # drain waits for h only and keeps ROUTE's pair in its slot words, for the first claim
                # past the head (mk_abi.h MK_DRAIN_LATE_ROUTE)
                drain = make_desc(
                    abi.MK_OP_DRAIN,
                    layer,
                    (abi.MK_QUEUE_MOE, layer, mlp_c, tail_q, late),
                    (drain_h,) if late else (drain_h, (route_c, 1)),
                )
                if late:
                    drain[abi.MK_F_SLOT0 : abi.MK_F_SLOT0 + 2] = [route_c, 1]
                emit(drain)
        else:
            for qd in tail[:n_comb]:
                emit(qd)

        # 6. dense down
        if dense:
            kspan = cfg.prefix_dense_intermediate_size // tiling.mlp_splits
            for s in range(tiling.mlp_splits):
                for t in range(H // tiling.dense_down_rows):
                    emit(
                        make_desc(
                            abi.MK_OP_DENSE_DOWN,
                            layer,
                            (t * tiling.dense_down_rows, tiling.dense_down_rows, s * kspan, (s + 1) * kspan),
                            ((up_c, n_up),),
                            (mlp_c,),
                        )
                    )

        # 7. O-proj (dense layers: static, after the dense down tiles)
        if dense:
            for qd in tail[n_comb:]:
                emit(qd)

        prev_end = (mlp_c, cs.targets[cs.names[mlp_c]])

    n_lm = -(-cfg.vocab_size // tiling.lm_rows)
    lm_c = counter("lm_head", n_lm)
    lm_wait = (prev_end,)
    lm_tiles = [
        make_desc(
            abi.MK_OP_LM_HEAD,
            0,
            (t * tiling.lm_rows, min(tiling.lm_rows, cfg.vocab_size - t * tiling.lm_rows), t),
            lm_wait,
            (lm_c,),
        )
        for t in range(n_lm)
    ]
    # one host queue, one drain per SM (the control SMs too): the tiles go to the SMs as they free
    # up, so the phase ends with its last tile, not with the SM dealt the most (H200, 2026-12-02,
    # against tiles dealt round-robin: BS 8 -0.5 %, BS 1 equal; docs/PERF.md)
    n_drains = min(n_lm, n_sms)
    qid = host_queue("lm_head_queue", lm_tiles, n_drains)
    for sm in range(n_drains):
        emit(make_desc(abi.MK_OP_DRAIN, 0, (abi.MK_QUEUE_HOST, qid)), sm)
    for b in range(B):  # one draw per row (greedy unless the row's sampling params say otherwise)
        emit(make_desc(abi.MK_OP_SAMPLE_ROW, 0, (b,), ((lm_c, n_lm),)))

    arr = np.array(tasks, dtype=np.int32)
    sm_lists: list[list[int]] = [[] for _ in range(n_sms)]
    for i, sm in enumerate(deal):  # each SM's list keeps the global order: still topological
        sm_lists[sm].append(i)
    return Schedule(
        cfg=cfg,
        tiling=tiling,
        batch=B,
        n_sms=n_sms,
        splits=splits,
        tasks=arr,
        sm_lists=sm_lists,
        queue_desc=np.array(qdescs, dtype=np.int32).reshape(-1, W),
        queue_info=np.array(qinfo, dtype=np.int32).reshape(-1, 4),
        counters=cs,
        n_lm_tiles=n_lm,
        verify_rows=verify_rows,
    )
