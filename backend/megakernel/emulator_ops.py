"""What each opcode computes, in torch: the semantics the CUDA kernel implements, tile by tile.

Used by the CPU emulator (fp32, any interleaving) and by the GPU per-op tests as the reference for
one task. Each op also reports the buffer regions it read and wrote, which the emulator's
happens-before checker uses to prove every read was ordered after every write it depends on.
Regions are (key, lo, hi): a key names a buffer row, [lo, hi) a column range of it. K/V regions are
keyed by the pool's physical slot, ("kv", layer, page, slot) with columns [K | V] of every kv head,
so rows of one sequence (verify rows over one block table) that write and read the same pages meet
in the same regions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from mkcode.backend.kv.layout import NO_PAGE, PAGE_SIZE, first_visible_position
from mkcode.backend.megakernel import abi, sampling
from mkcode.backend.megakernel.workspace import Workspace
from mkcode.backend.model import ops
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.weights import ModelWeights

Region = tuple[tuple, int, int]


@dataclass
class StepInputs:
    token_ids: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64
    block_tables: torch.Tensor  # [L, B, P] int32
    kv_pool: torch.Tensor  # [pages, 2, Hkv, 64, d]
    sample_params: torch.Tensor | np.ndarray | None = None  # int32 [>= B, MK_SP_WORDS]; None: greedy

    @property
    def batch(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass
class Access:
    reads: list[Region] = field(default_factory=list)
    writes: list[Region] = field(default_factory=list)
    # commutative additions (fp32 atomics) into a region some plain write initialised: unordered
    # among themselves, but each must come after that write, and every read after all of them
    accums: list[Region] = field(default_factory=list)
    # reads the kernel may issue BEFORE the task's dependency waits (ATTN's prologue starts its K/V
    # pages while it waits, assuming every slot but its own row's was written by earlier steps):
    # they must be ordered by what the task's SM did (or acquired) before the task started
    early_reads: list[Region] = field(default_factory=list)


def attention_range(position: int, window: int | None, split: int, splits: int) -> tuple[int, int]:
    """Key positions [lo, hi) of one split: the visible pages are cut into `splits` runs of
    ceil(pages/splits) pages each (the kernel's rule); positions outside the window are dropped."""
    lo = first_visible_position(position, window)
    p_lo, p_hi = lo // PAGE_SIZE, position // PAGE_SIZE
    per = -(-(p_hi - p_lo + 1) // splits)
    a = (p_lo + split * per) * PAGE_SIZE
    b = (p_lo + (split + 1) * per) * PAGE_SIZE
    a, b = max(a, lo), min(b, position + 1)
    return (a, b) if a < b else (0, 0)


MoeTable = list[tuple[int, list[int]]]  # (expert, token slots) for each active expert, ascending


def moe_item(
    table: MoeTable,
    layer: int,
    item: int,
    mlp_counter: int,
    up_tiles: int,
    up_cols: int,
    down_tiles: int,
    down_rows: int,
    expert_counter,
    fused: bool = False,
) -> list[int] | None:
    """Expand MoE queue item `item` of a layer into a full descriptor (as the kernel's drain does):
    items [0, n*up_tiles) are up tiles of up_cols columns, then the down tiles (both expert-major).
    None past the end. `fused` (down_tiles = 0): the up items are MOE_FUSED and signal the MLP
    counter directly."""
    from mkcode.backend.megakernel.schedule import make_desc

    n_act = len(table)
    if item >= n_act * (up_tiles + down_tiles):
        return None
    if item < n_act * up_tiles:
        a, t = divmod(item, up_tiles)
        e, slots = table[a]
        args = (e, t * up_cols, up_cols)
        if fused:
            d = make_desc(abi.MK_OP_MOE_FUSED, layer, args, (), (mlp_counter,), amount=len(slots))
        else:
            d = make_desc(abi.MK_OP_MOE_UP, layer, args, (), (expert_counter(layer, e),))
    else:
        a, t = divmod(item - n_act * up_tiles, down_tiles)
        e, slots = table[a]
        d = make_desc(
            abi.MK_OP_MOE_DOWN,
            layer,
            (e, t * down_rows, down_rows),
            ((expert_counter(layer, e), up_tiles),),
            (mlp_counter,),
            amount=len(slots),
        )
    d[abi.MK_F_NTOK] = len(slots)
    for j, slot in enumerate(slots):
        d[abi.MK_F_SLOT0 + j] = slot
    d[abi.MK_F_ID] = -(1 << 20) - item
    return d


class OpSemantics:
    """Executes one descriptor on a workspace. `math=False` skips the arithmetic (full-geometry
    schedule checks) but still reports regions and still routes (randomly) so queues fill. The GEMVs
    over h(l) norm x(l) themselves; the layer's outputs are added into x(l+1), which its router tiles
    (EMBED for a dense layer 0) initialise with the residual x(l)."""

    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights | None,
        ws: Workspace,
        inp: StepInputs,
        math: bool = True,
        rng: np.random.Generator | None = None,
        n_lm_tiles: int | None = None,
    ):
        self.cfg, self.w, self.ws, self.inp, self.math = cfg, weights, ws, inp, math
        # the step's LM-head tiles (its schedule's; the buffer may hold more: a backend sizes it
        # for its widest per-batch tiling)
        self.n_lm = int(ws["lm_best"].shape[0] if n_lm_tiles is None else n_lm_tiles)
        self.rng = rng or np.random.default_rng(0)
        self.B = inp.batch
        self.pos = [int(p) for p in inp.positions.tolist()]
        self.moe_tables: dict[int, MoeTable] = {}  # what ROUTE wrote, per layer (host copy)
        # Tiling.moe_local: each layer's top-k of row 0 (_topk: experts by rank, weights), as its
        # items rank them
        self.local_routes: dict[int, tuple[list[list[int]], torch.Tensor | None]] = {}
        self.route_mismatch: list[str] = []  # items of one layer that ranked different top-k's
        self._tables: list | None = None  # the block tables as lists (read once, by _kv_page)
        self._fresh: dict[tuple[int, int], list[int]] | None = None  # see _fresh_positions

    # ---- K/V slots ---------------------------------------------------------------------------
    def _kv_page(self, layer: int, b: int, position: int):
        """The pool page that holds row b's `position` at this layer: the block table's entry, or
        without block tables (descriptor-only runs) a page of the row's own ("row", b, page index)."""
        bt = self.inp.block_tables
        if bt is None:
            return ("row", b, position // PAGE_SIZE)
        if self._tables is None:
            self._tables = bt.tolist()
        return int(self._tables[layer][b][position // PAGE_SIZE])

    def _kv_key(self, layer: int, b: int, position: int) -> tuple:
        return ("kv", layer, self._kv_page(layer, b, position), position % PAGE_SIZE)

    def _fresh_positions(self, layer: int, b: int) -> list[int]:
        """The positions <= row b's own whose slots this step writes: on every page that a row of the
        step writes into, the slots from the lowest one written on it (a sequence's rows write
        L..L+d, so on its pages every slot from L's on, up to the last row's, is this step's).
        Attention reads these slots as this step's K/V (which must be written and ordered before
        the read); every other visible slot holds K/V of earlier steps."""
        if self._fresh is None:
            self._fresh = {}
            L = self.cfg.num_hidden_layers
            for ly in range(L):
                first: dict = {}
                for r in self._rows():
                    pg = self._kv_page(ly, r, self.pos[r])
                    if pg == NO_PAGE:  # QKV refuses the step (no page for the row's position)
                        continue
                    first[pg] = min(first.get(pg, PAGE_SIZE), self.pos[r] % PAGE_SIZE)
                for r in self._rows():
                    p = self.pos[r]
                    own = [p // PAGE_SIZE] if self.inp.block_tables is None else range(p // PAGE_SIZE + 1)
                    out = []
                    for j in own:
                        pg = self._kv_page(ly, r, j * PAGE_SIZE)
                        if pg in first:
                            out += range(j * PAGE_SIZE + first[pg], min((j + 1) * PAGE_SIZE, p + 1))
                    self._fresh[(ly, r)] = out
        return self._fresh[(layer, b)]

    # ---- helpers ----------------------------------------------------------------------------
    def _f(self, t: torch.Tensor) -> torch.Tensor:
        return t.float()

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps) * w.float()

    def _norm_w(self, layer: int) -> torch.Tensor:
        assert self.w is not None
        return self.w.layers[layer].norm if layer < self.cfg.num_hidden_layers else self.w.final_norm

    def _rows(self) -> range:
        return range(self.B)

    def _h_reads(self, layer: int) -> list[Region]:
        """What a GEMV over h(layer) reads: x(layer)'s rows (it norms them)."""
        H = self.cfg.hidden_size
        return [(("x", layer, b), 0, H) for b in self._rows()]

    def _h(self, layer: int) -> torch.Tensor:
        """h(layer) = RMSNorm(x(layer)) [B, H] as the GEMVs over it see it."""
        return self._rms(self.ws["x"][layer, : self.B], self._norm_w(layer))

    def _add_out(self, layer: int, rows: list[int], r0: int, n: int) -> list[Region]:
        """An output added into x(layer + 1)'s rows (fp32 atomics in the kernel)."""
        return [(("x", layer + 1, b), r0, r0 + n) for b in rows]

    # ---- dispatch ---------------------------------------------------------------------------
    def run(self, d: np.ndarray | list[int]) -> Access:
        op = int(d[abi.MK_F_OP])
        fn = getattr(self, "op_" + abi.OPNAMES[op].lower(), None)
        if fn is None:
            raise ValueError(f"emulator has no semantics for opcode {op}")
        a = [int(d[abi.MK_F_A0 + i]) for i in range(5)]
        return fn(int(d[abi.MK_F_LAYER]), a, d)

    def op_nop(self, layer, a, d) -> Access:
        return Access()

    def op_embed(self, layer, a, d) -> Access:
        b = a[0]
        H = self.cfg.hidden_size
        first = [0, 1] if self.cfg.is_dense(0) else [0]  # x(0), and a dense layer 0's sum starts there
        if self.math:
            x = self._f(self.w.embed[int(self.inp.token_ids[b])])
            for lx in first:
                self.ws["x"][lx, b] = x
        return Access(writes=[(("x", lx, b), 0, H) for lx in first])

    def op_qkv(self, layer, a, d) -> Access:
        """Rows a0 .. a0 + a1 of [Wq; Wk; Wv], then (a3 > 0, Tiling.attn_group) rows a2 .. a2 + a3:
        RoPE, Q into q(l), K / V into the pool at each row's position."""
        acc = Access(reads=self._h_reads(layer))
        for r0, n in ((a[0], a[1]), (a[2], a[3])):
            if n > 0:
                self._qkv_rows(layer, r0, n, acc)
        return acc

    def _qkv_rows(self, layer: int, r0: int, n: int, acc: Access) -> None:
        cfg = self.cfg
        qw, kvw, dh = cfg.q_width, cfg.kv_width, cfg.head_dim
        if r0 < qw:
            kind, local = "q", r0
        elif r0 < qw + kvw:
            kind, local = "k", r0 - qw
        else:
            kind, local = "v", r0 - qw - kvw
        for b in self._rows():
            if kind == "q":
                acc.writes.append((("q", layer, b), local, local + n))
            else:
                off = (0 if kind == "k" else kvw) + local
                acc.writes.append((self._kv_key(layer, b, self.pos[b]), off, off + n))
        if not self.math:
            return
        lw = self.w.layers[layer]
        W = {"q": lw.q, "k": lw.k, "v": lw.v}[kind][local : local + n].float()
        h = self._h(layer)
        out = h @ W.T  # [B, n]
        if kind != "v" and cfg.uses_rope(layer):
            pos = self.inp.positions.to(out.device)
            cos, sin = ops.rope_cos_sin(pos, dh, cfg.rope_theta)  # [B, d/2]
            pair = (torch.arange(local, local + n, 2, device=out.device) % dh) // 2
            c, s = cos[:, pair], sin[:, pair]
            ev, od = out[:, 0::2], out[:, 1::2]
            out = torch.stack((ev * c - od * s, ev * s + od * c), dim=-1).flatten(1)
        if kind == "q":
            self.ws["q"][layer, : self.B, local : local + n] = out
        else:
            pool, bt = self.inp.kv_pool, self.inp.block_tables
            which = 0 if kind == "k" else 1
            for b in self._rows():
                p = self.pos[b]
                page = int(bt[layer, b, p // PAGE_SIZE])
                if page < 0:
                    raise RuntimeError(f"QKV layer {layer} row {b}: position {p} has no page")
                cols = torch.arange(local, local + n)
                heads, dims = cols // dh, cols % dh
                pool[page, which, heads, p % PAGE_SIZE, dims] = out[b].to(pool.dtype)

    def op_attn(self, layer, a, d) -> Access:
        cfg = self.cfg
        b, kvh, s, S = a[0], a[1], a[2], a[3]
        G, dh = cfg.gqa_group, cfg.head_dim
        p = self.pos[b]
        lo, hi = attention_range(p, cfg.window(layer), s, S)
        acc = Access(
            reads=[(("q", layer, b), kvh * G * dh, (kvh + 1) * G * dh)],
            writes=[(("att", layer, b, kvh), s, s + 1)],
        )
        # this step's K/V in the split's range: the row's own slot is read after the item's waits
        # (the kernel's prologue skips it), the slots of earlier rows of its sequence (verify rows)
        # possibly before them: the prologue's page loads cover every other visible slot
        kvw = cfg.kv_width
        for q in self._fresh_positions(layer, b):
            if lo <= q < hi:
                key = self._kv_key(layer, b, q)
                reads = acc.reads if q == p else acc.early_reads
                reads.append((key, kvh * dh, (kvh + 1) * dh))
                reads.append((key, kvw + kvh * dh, kvw + (kvh + 1) * dh))
        if not self.math:
            return acc
        heads = slice(kvh * G, (kvh + 1) * G)
        o = self.ws["o_part"][layer, b, heads, s]  # [G, d] view
        lse = self.ws["lse_part"][layer, b, heads, s]
        if hi <= lo:
            o.zero_()
            lse.fill_(float("-inf"))
            return acc
        positions = torch.arange(lo, hi)
        pages = self.inp.block_tables[layer, b].long()[positions // PAGE_SIZE]
        if bool((pages < 0).any()):
            raise RuntimeError(f"ATTN layer {layer} row {b}: released page in [{lo}, {hi})")
        slots = positions % PAGE_SIZE
        k = self.inp.kv_pool[pages, 0, kvh, slots].float()  # [n, d]
        v = self.inp.kv_pool[pages, 1, kvh, slots].float()
        q = self.ws["q"][layer, b].view(cfg.num_attention_heads, dh)[heads]  # [G, d]
        sc = (q @ k.T) / math.sqrt(dh)
        m = sc.max(-1).values
        pr = torch.exp(sc - m[:, None])
        l_ = pr.sum(-1)
        o.copy_((pr @ v) / l_[:, None])
        lse.copy_(m + torch.log(l_))
        return acc

    def op_attn_combine(self, layer, a, d) -> Access:
        cfg = self.cfg
        b, kvh, S = a[0], a[1], a[2]
        G, dh = cfg.gqa_group, cfg.head_dim
        acc = Access(
            reads=[(("att", layer, b, kvh), 0, S)],
            writes=[(("attn_out", layer, b), kvh * G * dh, (kvh + 1) * G * dh)],
        )
        if self.math:
            heads = slice(kvh * G, (kvh + 1) * G)
            lse = self.ws["lse_part"][layer, b, heads, :S]  # [G, S]
            o = self.ws["o_part"][layer, b, heads, :S]  # [G, S, d]
            m = lse.max(-1, keepdim=True).values
            w = torch.exp(lse - m)
            out = (w[..., None] * o).sum(1) / w.sum(-1, keepdim=True)
            self.ws["attn_out"][layer, b, kvh * G * dh : (kvh + 1) * G * dh] = out.reshape(-1)
        return acc

    def op_oproj(self, layer, a, d) -> Access:
        r0, n, k0, k1 = a[:4]
        reads = [(("attn_out", layer, b), k0, k1) for b in self._rows()]
        acc = Access(reads=reads, accums=self._add_out(layer, list(self._rows()), r0, n))
        if self.math:
            W = self.w.layers[layer].o[r0 : r0 + n, k0:k1].float()
            y = self.ws["attn_out"][layer, : self.B, k0:k1] @ W.T
            self.ws["x"][layer + 1, : self.B, r0 : r0 + n] += y
        return acc

    def op_dense_up(self, layer, a, d) -> Access:
        c0, n = a[0], a[1]
        acc = Access(
            reads=self._h_reads(layer),
            writes=[(("dense_act", layer, b), c0, c0 + n) for b in self._rows()],
        )
        if self.math:
            lw = self.w.layers[layer]
            h = self._h(layer)
            g = h @ lw.gate[c0 : c0 + n].float().T
            u = h @ lw.up[c0 : c0 + n].float().T
            self.ws["dense_act"][layer, : self.B, c0 : c0 + n] = F.silu(g) * u
        return acc

    def op_dense_down(self, layer, a, d) -> Access:
        r0, n, k0, k1 = a[:4]
        reads = [(("dense_act", layer, b), k0, k1) for b in self._rows()]
        acc = Access(reads=reads, accums=self._add_out(layer, list(self._rows()), r0, n))
        if self.math:
            W = self.w.layers[layer].down[r0 : r0 + n, k0:k1].float()
            y = self.ws["dense_act"][layer, : self.B, k0:k1] @ W.T
            self.ws["x"][layer + 1, : self.B, r0 : r0 + n] += y
        return acc

    def op_router(self, layer, a, d) -> Access:
        """Row b's logits of experts e0 .. e0+n into rlogits row b + LROW (Tiling.moe_group: the
        group's row); tiles with LROW 0 also copy their share of the residual into x(l+1)."""
        e0, n = a[0], a[1]
        H, E = self.cfg.hidden_size, self.cfg.num_experts
        row = int(d[abi.MK_F_LROW])
        acc = Access(
            reads=self._h_reads(layer),
            writes=[(("rlogits", layer, b + row), e0, e0 + n) for b in self._rows()],
        )
        # its share of the residual: the layer's sum x(l+1) starts there
        c0, c1 = e0 * H // E, (e0 + n) * H // E
        if row == 0:
            acc.writes += [(("x", layer + 1, b), c0, c1) for b in self._rows()]
        if self.math:
            if row == 0:
                self.ws["x"][layer + 1, : self.B, c0:c1] = self.ws["x"][layer, : self.B, c0:c1]
            W = self.w.layers[layer].router[e0 : e0 + n].float()
            self.ws["rlogits"][layer, row : row + self.B, e0 : e0 + n] = self._h(layer) @ W.T
        return acc

    def op_route(self, layer, a, d) -> Access:
        """Top-k per row, routing weights, and the layer's expert table (experts ascending, each
        with its token slots b*k + j ascending). The emulator resets the dynamic counters itself."""
        cfg, B = self.cfg, self.B
        E, K = cfg.num_experts, cfg.num_experts_per_tok
        acc = Access(
            reads=[(("rlogits", layer, b), 0, E) for b in self._rows()],
            writes=[(("moe_tab", layer), 0, 1), (("route_w", layer), 0, B * K)],
        )
        ids_l, w = self._topk(layer)
        if self.math:
            self.ws["route_w"][layer, : B * K] = w.reshape(-1)
        by_expert: dict[int, list[int]] = {}
        for b in range(B):
            for j in range(K):
                by_expert.setdefault(int(ids_l[b][j]), []).append(b * K + j)
        table = sorted(by_expert.items())
        self.moe_tables[layer] = table
        rows = torch.full((E, 2 + abi.MK_MAX_TOKENS), -1, dtype=torch.int32)
        for a, (e, slots) in enumerate(table):
            rows[a, 0], rows[a, 1] = e, len(slots)
            rows[a, 2 : 2 + len(slots)] = torch.tensor(slots, dtype=torch.int32)
        self.ws["expert_tab"][layer] = rows.to(self.ws["expert_tab"].device)
        self.ws["moe_info"][layer, 0] = len(table)
        return acc

    def _topk(self, layer, row: int = 0) -> tuple[list[list[int]], torch.Tensor | None]:
        """Each row's top-k experts by rank and their routing weights [B, K] (None without math:
        random experts), from the router's logits as ROUTE (and a self-routing item) ranks them;
        `row`: the first rlogits row (a Tiling.moe_group group's)."""
        cfg, B = self.cfg, self.B
        E, K = cfg.num_experts, cfg.num_experts_per_tok
        if not self.math:
            return [[int(e) for e in self.rng.choice(E, K, replace=False)] for _ in range(B)], None
        # NaN ranks as -inf (as in the kernel); equal logits in expert order (the kernel's tie rule:
        # the lower id first; torch.topk leaves the order of ties open)
        logits = torch.nan_to_num(self.ws["rlogits"][layer, row : row + B], nan=float("-inf"))
        top, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
        w = ops.route_weights(top[:, :K], cfg.expert_selection_fn, cfg.norm_topk_prob)
        return ids[:, :K].tolist(), w

    def _moe_slots(self, d) -> list[int]:
        return [int(d[abi.MK_F_SLOT0 + j]) for j in range(int(d[abi.MK_F_NTOK]))]

    def _up_reads(self, layer) -> list[Region]:
        """An up (or fused) item's reads: the table and every batch row of h(l) (the kernel stages
        them all: its mma computes 8 token columns anyway)."""
        return [(("moe_tab", layer), 0, 1), *self._h_reads(layer)]

    def _up_act(self, layer, e, c0, n, slots) -> torch.Tensor:
        """silu(gate) * up of expert e's columns c0 .. c0 + n for the slots' tokens: [tokens, n]."""
        K, I = self.cfg.num_experts_per_tok, self.cfg.intermediate_size
        gu = self.w.layers[layer].experts_gate_up[e]
        h = self._h(layer)[torch.tensor([s // K for s in slots])]
        return F.silu(h @ gu[c0 : c0 + n].float().T) * (h @ gu[I + c0 : I + c0 + n].float().T)

    def op_moe_up(self, layer, a, d) -> Access:
        e, c0, n = a[0], a[1], a[2]
        slots = self._moe_slots(d)
        acc = Access(reads=self._up_reads(layer), writes=[(("moe_act", layer, s), c0, c0 + n) for s in slots])
        if self.math:
            self.ws["moe_act"][layer, torch.tensor(slots), c0 : c0 + n] = self._up_act(layer, e, c0, n, slots)
        return acc

    def op_moe_down(self, layer, a, d) -> Access:
        e, r0, n = a[0], a[1], a[2]  # every column of the expert's intermediate
        k0, k1 = 0, self.cfg.intermediate_size
        slots = self._moe_slots(d)
        acc = Access(
            reads=[(("moe_tab", layer), 0, 1)]
            + [(("moe_act", layer, s), k0, k1) for s in slots]
            + [(("route_w", layer), s, s + 1) for s in slots],
        )
        K = self.cfg.num_experts_per_tok
        acc.accums = self._add_out(layer, [s // K for s in slots], r0, n)
        if self.math:
            W = self.w.layers[layer].experts_down[e][r0 : r0 + n, k0:k1].float()
            idx = torch.tensor(slots)
            y = (self.ws["moe_act"][layer, idx, k0:k1] @ W.T) * self.ws["route_w"][layer, idx][:, None]
            xl = self.ws["x"][layer + 1]  # index_add_: see op_moe_fused
            xl[:, r0 : r0 + n].index_add_(0, (idx // K).to(xl.device), y)
        return acc

    def op_moe_fused(self, layer, a, d) -> Access:
        """Up tile (columns c0 .. c0+n) then the down slice of those columns for every hidden row,
        weighted by each token's routing weight and added into its row of x(l+1). A self-routing
        item (A3 = MK_MOE_LOCAL, Tiling.moe_local) is rank A0 of row 0: it ranks the router's logits
        itself and takes that rank's expert and weight (no table, no route_w)."""
        e, c0, n = a[0], a[1], a[2]
        K, H, E = self.cfg.num_experts_per_tok, self.cfg.hidden_size, self.cfg.num_experts
        slots = self._moe_slots(d)
        local = a[3] == abi.MK_MOE_LOCAL
        if local:
            row = int(d[abi.MK_F_LROW])  # Tiling.moe_group: its group's row of logits
            if self.math:  # every group computes the same logits (the kernel: the same bits)
                got = self._topk(layer, row)
                first = self.local_routes.setdefault(layer, got)
                if first[0] != got[0] or not torch.equal(first[1], got[1]):  # reported after the hazards
                    self.route_mismatch.append(f"layer {layer}: rlogits row {row} ranks other experts")
            elif layer not in self.local_routes:  # random experts, one draw per layer
                self.local_routes[layer] = self._topk(layer)
            ids_l, w = self.local_routes[layer]
            experts, weights = ids_l[0], [] if w is None else w[0].tolist()
            rank = e
            e = experts[rank]
            reads = [*self._h_reads(layer), (("rlogits", layer, row), 0, E)]
        else:
            reads = self._up_reads(layer) + [(("route_w", layer), s, s + 1) for s in slots]
        acc = Access(reads=reads, accums=[(("x", layer + 1, s // K), 0, H) for s in slots])
        if local and c0 == 0:  # the rank's first tile records the routing for the host, as the kernel
            acc.writes = [(("route_w", layer), rank, rank + 1), (("moe_tab_local", layer), rank, rank + 1)]
            if self.math:
                at = sum(1 for x in experts if x < e)  # the table's experts ascending
                self.ws["expert_tab"][layer, at, :3] = torch.tensor([e, 1, rank], dtype=torch.int32)
                self.ws["route_w"][layer, rank] = weights[rank]
                self.ws["moe_info"][layer, 0] = K
        if self.math:
            rows = torch.tensor([s // K for s in slots])
            act = self._up_act(layer, e, c0, n, slots)
            y = act @ self.w.layers[layer].experts_down[e][:, c0 : c0 + n].float().T  # [tokens, H]
            if local:
                wts = torch.tensor([weights[rank]], dtype=y.dtype, device=y.device)
            else:
                wts = self.ws["route_w"][layer, torch.tensor(slots)]
            # index_add_: a row that holds two of the item's slots gets both terms (an indexed +=
            # keeps only one; real routing never picks an expert twice for a token, the op tests do)
            xl = self.ws["x"][layer + 1]
            xl.index_add_(0, rows.to(xl.device), y * wts[:, None])
        return acc

    def op_lm_head(self, layer, a, d) -> Access:
        r0, n, t = a[0], a[1], a[2]
        L = self.cfg.num_hidden_layers
        acc = Access(
            reads=self._h_reads(L),
            writes=[(("logits", b), r0, r0 + n) for b in self._rows()] + [(("lm_best",), t, t + 1)],
        )
        if self.math:
            W = self.w.lm_head[r0 : r0 + n].float()
            lg = (self._h(L) @ W.T) * self.cfg.logit_scale
            self.ws["logits"][: self.B, r0 : r0 + n] = lg
            best, arg = lg.max(-1)
            self.ws["lm_best"][t, : self.B] = best
            self.ws["lm_arg"][t, : self.B] = (arg + r0).to(torch.int32)
        return acc

    def op_sample_row(self, layer, a, d) -> Access:
        b = a[0]
        n_lm = self.n_lm
        V = self.cfg.vocab_size
        acc = Access(reads=[(("lm_best",), 0, n_lm), (("logits", b), 0, V)], writes=[(("tokens",), b, b + 1)])
        if self.math:
            sp = self.inp.sample_params
            p = sampling.SamplingParams() if sp is None else sampling.unpack(np.asarray(sp)[b])
            if p.greedy:  # the first maximal tile's argmax
                t = int(self.ws["lm_best"][:n_lm, b].argmax())
                tok = int(self.ws["lm_arg"][t, b])
            else:
                tok = int(sampling.sample_row(self.ws["logits"][b].detach().cpu().numpy(), p)[0])
            self.ws["tokens_out"][b] = tok
        return acc

    def op_drain(self, layer, a, d) -> Access:
        raise AssertionError("DRAIN is executed by the scheduler, not as an op")
