"""CPU emulator of the megakernel: runs a schedule's descriptors on many virtual SMs.

Each virtual SM walks its descriptor list exactly as a thread block of the kernel does: wait until
every (counter, target) holds, run the task, signal. DRAIN tasks claim items from work queues with
an atomic head (host queues of attention splits; MoE queues that ROUTE fills on the "device"). A
scheduling strategy picks which runnable SM advances next (random, or adversarial orders), so a
step is exercised under many interleavings.

Failures are loud:
- DeadlockError: no SM can advance and some have work left;
- CounterError: a counter signalled more than its step total (double signal), or ends the step
  off its total (missing signal);
- HazardError: happens-before checking. Every task's causal past is tracked (program order on its SM
  plus acquire of every release it waited on); each read of a region must have every write of that
  region in its past, and every region read must have been written. So a deleted dependency is
  caught in ANY interleaving, not only in an unlucky one. K/V are regions of the pool's physical
  slots, so verify rows (rows of one sequence over one block table) that read K/V other rows write
  in the step are checked too; reads the kernel issues before a task's waits (the ATTN prologue's
  page loads) are checked against what the task's SM saw before those waits.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.emulator_ops import OpSemantics, StepInputs, moe_item
from mkcode.backend.megakernel.schedule import Schedule, expert_counter, moe_head_counter
from mkcode.backend.megakernel.workspace import CounterBank, Workspace
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.weights import ModelWeights


class EmulatorError(RuntimeError):
    pass


class DeadlockError(EmulatorError):
    pass


class CounterError(EmulatorError):
    pass


class HazardError(EmulatorError):
    pass


class RoutingError(EmulatorError):
    """Self-routing items of one layer ranked different experts (Tiling.moe_group: groups whose
    logits differ), with no race to explain it."""


STRATEGIES = ("random", "in_order", "reverse", "starve_low", "lifo_random")

_U32 = 0xFFFFFFFF


def _reached(value: int, target: int) -> bool:
    diff = (value - target) & _U32
    return diff < 0x80000000  # (int32)(value - target) >= 0


@dataclass
class StepReport:
    events: int = 0  # tasks executed (static + queue items)
    switches: int = 0
    max_claims: dict[int, int] = field(default_factory=dict)


class _Wait:
    __slots__ = ("counter", "target")

    def __init__(self, counter: int, target: int):
        self.counter, self.target = counter, target


class Emulator:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights | None,
        schedule: Schedule,
        ws: Workspace,
        bank: CounterBank,
        math: bool = True,
        check_hazards: bool = True,
        prologue_reads: bool = True,
    ):
        """`prologue_reads`: check the reads an op issues before its waits (Access.early_reads: the
        ATTN prologue's K/V pages) against what its SM saw before the waits, as the kernel issues
        them; False checks them after the waits (a kernel that loaded nothing before its waits)."""
        self.cfg, self.w, self.sched, self.ws, self.bank = cfg, weights, schedule, ws, bank
        self.math, self.check_hazards, self.prologue_reads = math, check_hazards, prologue_reads
        t = schedule.tiling
        self.up_tiles, self.down_tiles = t.moe_tiles(cfg)

    # ---- counters -------------------------------------------------------------------------
    def _abs_target(self, c: int, rel: int) -> int:
        return (self.base[c] + rel) & _U32

    def _signal(self, c: int, amount: int, past: int) -> None:
        v = (self.vals[c] + amount) & _U32
        self.vals[c] = v
        if c >= self.n_dyn:
            done = (v - self.base[c]) & _U32
            if done > self.sched.counters.totals[c]:
                raise CounterError(
                    f"counter {self.sched.counters.names[c]} signalled {done} times this step, "
                    f"its step total is {self.sched.counters.totals[c]} (double signal?)"
                )
        self.release[c] |= past
        self._wake(c, v)

    def _wake(self, c: int, v: int) -> None:
        waiting = self.waiters.get(c)
        if waiting:
            still = []
            for sm, target in waiting:
                if _reached(v, target):
                    self.ready.add(sm)
                else:
                    still.append((sm, target))
            self.waiters[c] = still

    # ---- one SM ---------------------------------------------------------------------------
    def _waits(self, d) -> list[tuple[int, int]]:
        out = []
        for i in range(abi.MK_MAX_WAITS):
            c = int(d[abi.MK_F_WAIT0 + 2 * i])
            if c != abi.MK_NO_COUNTER:
                out.append((c, int(d[abi.MK_F_WAIT0 + 2 * i + 1])))
        return out

    def _run_task(self, sm: int, d) -> Generator[_Wait | None, None, None]:
        early = self.past[sm]  # what the task's SM saw before its waits (Access.early_reads)
        for c, rel in self._waits(d):
            target = rel if c < self.n_dyn else self._abs_target(c, rel)
            if not _reached(self.vals[c], target):
                yield _Wait(c, target)
            self.past[sm] |= self.release[c]  # acquire
        if int(d[abi.MK_F_OP]) == abi.MK_OP_DRAIN:
            yield from self._drain(sm, d)
            return
        ev = self.n_events
        self.n_events += 1
        self.event_descs.append(d)
        self.past[sm] |= 1 << ev
        acc = self.ops.run(d)
        if int(d[abi.MK_F_OP]) == abi.MK_OP_ROUTE:
            layer = int(d[abi.MK_F_LAYER])
            if int(d[abi.MK_F_A0]) != abi.MK_ROUTE_KEEP_HEAD:
                self._reset_head(moe_head_counter(self.cfg, layer), ev)
            for e in range(self.cfg.num_experts):
                self.vals[expert_counter(self.cfg, layer, e)] = 0
        if int(d[abi.MK_F_OP]) == abi.MK_OP_EMBED and int(d[abi.MK_F_A1]) == abi.MK_EMBED_RESET_HEADS:
            for layer in range(self.cfg.num_hidden_layers):  # Tiling.attn_in_moe = 3 (mk_abi.h)
                if not self.cfg.is_dense(layer):
                    self._reset_head(moe_head_counter(self.cfg, layer), ev)
        yield None  # written but not yet signalled: consumers must still wait
        past = self.past[sm]
        if self.check_hazards:
            for key, lo, hi in acc.reads:
                self.reads.append((key, lo, hi, ev, past))
            for key, lo, hi in acc.early_reads:  # issued before the waits (ATTN's prologue)
                self.reads.append((key, lo, hi, ev, early if self.prologue_reads else past))
            for key, lo, hi in acc.writes:
                self.writes[key].append((lo, hi, ev))
                self.plain[key].append((lo, hi, ev))
            for key, lo, hi in acc.accums:  # readers must see them; they must see the initialiser
                self.writes[key].append((lo, hi, ev))
                self.accums.append((key, lo, hi, ev, past))
        amount = int(d[abi.MK_F_SIG_AMOUNT]) or 1
        for i in range(abi.MK_MAX_SIGNALS):
            c = int(d[abi.MK_F_SIG0 + i])
            if c != abi.MK_NO_COUNTER:
                self._signal(c, amount, past)
        yield None

    def _reset_head(self, head_c: int, ev: int) -> None:
        """A MoE queue head's reset by task event `ev` (ROUTE, or the EMBED of row 0 with
        Tiling.attn_in_moe = 3): every claim on it this step must come after that event."""
        if head_c in self.head_reset:
            raise CounterError(f"{self._cname(head_c)} reset twice in one step")
        self.vals[head_c] = 0
        self.head_reset[head_c] = ev

    def _drain(self, sm: int, d) -> Generator[_Wait | None, None, None]:
        """Claims as in the kernel (lazy, mk_abi.h): while more than n_sms items remain between the
        next one and the queue's far end (a MoE queue: its last up tile), the claim after it is
        already in flight (an item claimed ahead waits for the running one); beyond that an item
        has no claim after it until it ran, so a drain claims when it is free. It stops at its
        first claim past the end and a host queue's drain then claims once more, so it over-claims
        exactly twice (the totals count it). A MoE queue's items: the head (the attention items with
        Tiling.attn_in_moe, before the tail's in the buffer; the tail queue's word 2), the up tiles,
        then the layer's attention tail (host items of queue A3), then the down tiles; with
        Tiling.moe_fused the up tiles are fused items (up tile + down slice) and there are no down
        tiles."""
        kind, arg, mlp_c = int(d[abi.MK_F_A0]), int(d[abi.MK_F_A1]), int(d[abi.MK_F_A2])
        if kind == abi.MK_QUEUE_HOST:
            first, length, head_c, _ = (int(v) for v in self.sched.queue_info[arg])
            far_end = length
        else:
            head_c = moe_head_counter(self.cfg, arg)
            tail_q = int(d[abi.MK_F_A3])
            t_first, t_len = (int(v) for v in self.sched.queue_info[tail_q][:2]) if tail_q >= 0 else (0, 0)
            # Tiling.attn_in_moe: the head items (mk_abi.h MK_MOE_HEAD; -1: none) come first,
            # stored right before the tail's
            h_len = max(0, int(self.sched.queue_info[tail_q][abi.MK_MOE_HEAD])) if tail_q >= 0 else 0
            h_first = t_first - h_len

            def shape() -> tuple:
                table = self.ops.moe_tables[arg]  # ROUTE published it: the drain waited on route[l]
                n_up = len(table) * self.up_tiles
                tail_at = h_len + n_up  # the tail right after the up tiles
                # far end: the kernel's s_far, the up tiles' count (the head not counted)
                return table, tail_at, n_up

            # Tiling.attn_in_moe = 3 (MK_DRAIN_LATE_ROUTE): the head is claimed before ROUTE, whose
            # wait (its pair in the slot words) comes at the first claim past it; until then the
            # claims are lazy (far end 0) and the queue's end unknown
            late = int(d[abi.MK_F_A4]) == abi.MK_DRAIN_LATE_ROUTE
            if late:
                table, tail_at, far_end = None, 0, 0
            else:
                table, tail_at, far_end = shape()

        def claim() -> int:
            raw = self.vals[head_c]
            self.vals[head_c] = (raw + 1) & _U32
            if kind == abi.MK_QUEUE_HOST:
                self._check_head(head_c)
                return (raw - self.base[head_c]) & _U32
            ev = self.head_reset.get(head_c)
            if ev is None or not (self.past[sm] >> ev) & 1:
                raise HazardError(f"SM {sm} claims from {self._cname(head_c)} before its reset this step")
            return raw

        window = self.sched.n_sms  # the kernel's claim window
        nxt = claim()
        far = nxt + window < far_end
        ahead = claim() if far else None
        while True:
            idx = nxt
            if kind == abi.MK_QUEUE_HOST:
                if idx >= length:
                    claim()  # the top-up: two claims past the end per drain
                    return
                item = self.sched.queue_desc[first + idx]
            elif idx < h_len:
                item = self.sched.queue_desc[h_first + idx]
            else:
                if table is None:  # a late-route drain's first claim past the head: ROUTE now
                    rc, rel = int(d[abi.MK_F_SLOT0]), int(d[abi.MK_F_SLOT0 + 1])
                    target = rel if rc < self.n_dyn else self._abs_target(rc, rel)
                    if not _reached(self.vals[rc], target):
                        yield _Wait(rc, target)
                    self.past[sm] |= self.release[rc]  # acquire
                    table, tail_at, far_end = shape()
                item = self._moe_queue_item(table, arg, idx, mlp_c, h_len, tail_at, t_first, t_len)
                if item is None:
                    return
            if idx + window >= far_end:  # lazy: `far` is False here, nothing is in flight
                yield None
                yield from self._run_task(sm, item)
                nxt = claim()
                continue
            nxt = ahead if far else claim()
            far = nxt + window < far_end
            ahead = claim() if far else None
            yield None  # a claimed item may sit unstarted while other SMs run on
            yield from self._run_task(sm, item)

    def _moe_queue_item(self, table, layer, idx, mlp_c, h_len, tail_at, t_first, t_len):
        """The item at MoE queue index idx past the head (None: past the end): a tail item or an
        up/down tile of the routed table."""
        t = self.sched.tiling
        if tail_at <= idx < tail_at + t_len:
            return self.sched.queue_desc[t_first + idx - tail_at]
        m = (idx if idx < tail_at else idx - t_len) - h_len  # the up/down tile index
        return moe_item(
            table,
            layer,
            m,
            mlp_c,
            self.up_tiles,
            t.moe_up_cols,
            self.down_tiles,
            t.moe_down_rows,
            lambda ly, e: expert_counter(self.cfg, ly, e),
            fused=bool(t.moe_fused),
        )

    def _cname(self, c: int) -> str:
        return self.sched.counters.names[c]

    def _check_head(self, head_c: int) -> None:
        done = (self.vals[head_c] - self.base[head_c]) & _U32
        if done > self.sched.counters.totals[head_c]:
            raise CounterError(f"queue head {self.sched.counters.names[head_c]} over-claimed")

    def _sm_program(self, sm: int) -> Generator[_Wait | None, None, None]:
        for tid in self.sched.sm_lists[sm]:
            yield from self._run_task(sm, self.sched.tasks[tid])

    # ---- one step --------------------------------------------------------------------------
    def step(self, inp: StepInputs, strategy: str = "random", seed: int = 0) -> StepReport:
        """Run one step; raises on deadlock, counter or hazard errors. Results are in the workspace
        (logits, tokens_out) and the KV pool; the bank's bases advance by the step's totals."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}")
        if inp.batch != self.sched.batch:
            raise ValueError("batch size differs from the schedule's")
        rng = random.Random(seed)
        self.bank.prepare(self.sched)
        self.ops = OpSemantics(
            self.cfg,
            self.w,
            self.ws,
            inp,
            math=self.math,
            rng=np.random.default_rng(seed),
            n_lm_tiles=self.sched.n_lm_tiles,
        )
        n = self.sched.n_sms
        self.release: dict[int, int] = defaultdict(int)
        self.past = [0] * n
        self.n_events = 0
        self.event_descs: list = []
        self.reads: list = []
        self.writes: dict = defaultdict(list)  # plain writes and accumulations
        self.plain: dict = defaultdict(list)  # plain writes only
        self.accums: list = []
        self.head_reset: dict[int, int] = {}  # MoE queue head -> the event that reset it this step
        self.vals = [int(v) for v in self.bank.values]
        self.base = [int(v) for v in self.bank.base]
        self.n_dyn = self.sched.counters.n_dynamic
        self.waiters: dict[int, list[tuple[int, int]]] = {}
        self.ready: set[int] = set(range(n))
        progs = [self._sm_program(sm) for sm in range(n)]
        alive = set(range(n))
        blocked: dict[int, _Wait] = {}
        report = StepReport()
        last = -1
        try:
            while alive:
                if not self.ready:
                    lines = [
                        f"SM {sm} waits {self._cname(w.counter)} = {self.vals[w.counter]} for {w.target}"
                        for sm, w in sorted(blocked.items())
                    ]
                    raise DeadlockError("deadlock: no SM can advance\n" + "\n".join(lines[:20]))
                if strategy == "random":
                    sm = rng.choice(sorted(self.ready))
                elif strategy == "in_order":
                    sm = min(self.ready)
                elif strategy == "reverse":
                    sm = max(self.ready)
                elif strategy == "starve_low":  # low SMs run only when no high SM can
                    high = [x for x in self.ready if x >= n // 2]
                    sm = rng.choice(high) if high else min(self.ready)
                else:  # lifo_random: keep running the last SM while it can, else random
                    sm = last if last in self.ready and rng.random() < 0.8 else rng.choice(sorted(self.ready))
                sm = int(sm)
                report.switches += sm != last
                last = sm
                blocked.pop(sm, None)
                try:
                    w = next(progs[sm])
                except StopIteration:
                    alive.discard(sm)
                    self.ready.discard(sm)
                    continue
                if w is not None:
                    self.ready.discard(sm)
                    blocked[sm] = w
                    self.waiters.setdefault(w.counter, []).append((sm, w.target))
        finally:
            self.bank.values[:] = np.array(self.vals, dtype=np.uint32)
        report.events = self.n_events
        self._check_counters()
        if self.check_hazards:
            self._check_hazards()
        if self.ops.route_mismatch:  # no race explains it: the groups' logits differ (moe_group)
            raise RoutingError("self-routing items disagree: " + "; ".join(self.ops.route_mismatch))
        self.bank.step_done(self.sched)
        return report

    def _name(self, ev: int) -> str:
        return self.sched.describe(np.asarray(self.event_descs[ev]))

    def _check_counters(self) -> None:
        cs = self.sched.counters
        for c in range(cs.n_dynamic, len(cs.names)):
            done = (self.vals[c] - self.base[c]) & _U32
            if done != cs.totals[c]:
                raise CounterError(f"counter {cs.names[c]} ended the step at {done}, expected {cs.totals[c]}")

    def _check_hazards(self) -> None:
        for key, lo, hi, ev, past in self.accums:  # an atomic sum needs its initialiser before it
            init = [w for w in self.plain.get(key, ()) if w[0] < hi and lo < w[1]]
            if not init:
                raise HazardError(f"{self._name(ev)} adds into {key}[{lo}:{hi}], which nothing initialises")
            for _, _, wev in init:
                if not (past >> wev) & 1:
                    raise HazardError(
                        f"race: {self._name(ev)} adds into {key}[{lo}:{hi}] initialised by "
                        f"{self._name(wev)} with no dependency ordering them"
                    )
        # per region read: the events of the writes that overlap it, and how far from lo they cover
        # it (computed once: many tasks read the same rows, e.g. every GEMV over h(l) all of x(l),
        # which every add into it wrote)
        regions: dict[tuple, tuple[int, int]] = {}
        for key, lo, hi, ev, past in self.reads:
            got = regions.get((key, lo, hi))
            if got is None:
                mask, covered = 0, []
                for wlo, whi, wev in self.writes.get(key, ()):
                    if wlo < hi and lo < whi:
                        mask |= 1 << wev
                        covered.append((max(wlo, lo), min(whi, hi)))
                covered.sort()
                at = lo
                for a, b in covered:
                    if a > at:
                        break
                    at = max(at, b)
                got = regions[(key, lo, hi)] = (mask, at)
            mask, at = got
            if mask & ~past:  # the first such write, in write order
                wev = next(
                    w for wlo, whi, w in self.writes[key] if wlo < hi and lo < whi and not (past >> w) & 1
                )
                raise HazardError(
                    f"race: {self._name(ev)} reads {key}[{lo}:{hi}] written by "
                    f"{self._name(wev)} with no dependency ordering them"
                )
            if at < hi:
                raise HazardError(f"{self._name(ev)} reads {key}[{lo}:{hi}] but [{at}:{hi}) is never written")
