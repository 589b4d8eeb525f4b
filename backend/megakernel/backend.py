"""`MegakernelBackend`: the `megakernel` DecodeBackend (docs/ENGINE.md, docs/MEGAKERNEL.md).

One decode step = one launch of the persistent kernel over the step's schedule. Schedules are
cached by (batch size, attention split vector), which changes only every `split_bucket` tokens.
Counter bases advance on the host by each schedule's known totals, so counters are never reset.
A watchdog bounds every step: the kernel abandons a wait after `timeout_s / 2` and reports where
(MK_ERR_TIMEOUT), and the host gives up after `timeout_s` and raises; never a frozen process.
"""

from __future__ import annotations

import functools
import math
import operator
import os
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.sampling import SamplingParams, pack
from mkcode.backend.megakernel.schedule import Schedule, build_schedule, moe_local_fits
from mkcode.backend.megakernel.tiling import (
    Tiling,
    TilingError,
    attention_splits,
    default_tiling,
    norm_geometry_problem,
    split_bucket_position,
    tiling_for_batch,
)
from mkcode.backend.megakernel.workspace import CounterBank, Workspace
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.weights import ModelWeights

ERROR_NAMES = {v: k for k, v in abi.load().enums["MkError"].items()}


class MegakernelError(RuntimeError):
    """The kernel reported an error (a dependency wait timed out, a bad descriptor, ...)."""


class MegakernelTimeout(MegakernelError):
    """The step did not finish within the watchdog limit."""


class UnsupportedGeometry(ValueError):
    """The model is one the kernel does not run: its attention, or the norm inside the GEMVs
    (MegakernelBackend refuses it at construction; `--decode auto` then runs the graph backend)."""


# the attention's geometries (csrc/mk_abi.h MK_ATTN_*, the kernel's attn_supported)
ATTN_MAX_GROUP = abi.MK_ATTN_MAX_GROUP
ATTN_HEAD_DIMS = (abi.MK_ATTN_HEAD_DIM_32, abi.MK_ATTN_HEAD_DIM_64, abi.MK_ATTN_HEAD_DIM_128)


# every prefetch_mode bit the kernel reads (mk_abi.h MK_MODE_*)
MODE_BITS = functools.reduce(
    operator.or_, (v for k, v in abi.load().constants.items() if k.startswith("MK_MODE_")), 0
)


def check_prefetch_mode(mode: int) -> int:
    """`mode` if every bit set is an MK_MODE_* bit, else ValueError (a removed bit would otherwise
    run the default silently)."""
    if mode < 0 or mode & ~MODE_BITS:
        raise ValueError(
            f"prefetch_mode {mode}: bits {mode & ~MODE_BITS:#x} are no MK_MODE_* bit of mk_abi.h"
        )
    return mode


def check_geometry(cfg: ModelConfig) -> None:
    """Raise UnsupportedGeometry unless the kernel runs `cfg`: its attention (the heads) and the norm
    inside the GEMVs with the default tiling's router tiles (tiling.norm_geometry_problem: the hidden
    size, dense layers after layer 0, the router tiles' share of the residual)."""
    if cfg.gqa_group > ATTN_MAX_GROUP or cfg.head_dim not in ATTN_HEAD_DIMS:
        raise UnsupportedGeometry(
            f"the megakernel's attention runs at most {ATTN_MAX_GROUP} query heads per kv head and "
            f"head_dim {', '.join(map(str, ATTN_HEAD_DIMS[:-1]))} or {ATTN_HEAD_DIMS[-1]}; this model has {cfg.num_attention_heads} query heads over "
            f"{cfg.num_key_value_heads} kv heads and head_dim {cfg.head_dim}"
        )
    problem = norm_geometry_problem(cfg, default_tiling(cfg).router_rows)
    if problem is not None:
        raise UnsupportedGeometry(f"the megakernel's norm inside the GEMVs cannot run this model: {problem}")


@dataclass
class _Prepared:
    sched: Schedule
    desc: torch.Tensor
    ntasks: torch.Tensor
    queue: torch.Tensor
    queue_info: torch.Tensor
    max_tasks: int
    params: tuple | None = None  # (key, (ptrs, ints, floats)) of the last launch (see _params)


def _layer_weight_ptrs(cfg: ModelConfig, w: ModelWeights, device: torch.device) -> list[list[int]]:
    rows = []
    for i, lw in enumerate(w.layers):
        slots = [0] * abi.MK_LW_COUNT
        for slot, t in (
            (abi.MK_LW_NORM, lw.norm),
            (abi.MK_LW_Q, lw.q),
            (abi.MK_LW_K, lw.k),
            (abi.MK_LW_V, lw.v),
            (abi.MK_LW_O, lw.o),
            (abi.MK_LW_GATE, lw.gate),
            (abi.MK_LW_UP, lw.up),
            (abi.MK_LW_DOWN, lw.down),
            (abi.MK_LW_ROUTER, lw.router),
            (abi.MK_LW_EXP_GATE_UP, lw.experts_gate_up),
            (abi.MK_LW_EXP_DOWN, lw.experts_down),
        ):
            if t is not None:
                if t.dtype != torch.bfloat16 or t.device != device or not t.is_contiguous():
                    raise ValueError(f"layer {i}: megakernel weights must be contiguous bf16 CUDA tensors")
                slots[slot] = t.data_ptr()
        rows.append(slots)
    return rows


class MegakernelBackend:
    name = "megakernel"
    max_batch = abi.MK_MAX_TOKENS

    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights,
        *,
        n_sms: int | None = None,
        tiling: Tiling | None = None,
        timeout_s: float = 10.0,
        prefetch_mode: int | None = None,
        native_module=None,
        asynchronous: bool = False,
        verify_rows: bool = True,
    ):
        """`native_module`: the extension (default: built/loaded by `native`). Tests pass a fake
        with the same `device_info()`/`launch()` and a `make_event()`, which lets the host logic
        run on the CPU. `asynchronous`: decode() returns once the step is enqueued (like the graph
        backend); the caller must call `wait_step()` before it reads results on the host, which is
        where the watchdog runs and a kernel error is raised. `verify_rows`: accept steps with several
        rows of one sequence (DecodeBatch.seq_rows), run on schedules whose attention drains wait
        for all of the layer's K/V (build_schedule's verify_rows; proven in the emulator, and on an
        H100 by tests/backend/megakernel/test_verify_rows_gpu.py). On by default; built with
        it off, the backend refuses such steps and the engine turns speculation off. A model whose
        geometry the kernel does not run raises UnsupportedGeometry (check_geometry)."""
        check_geometry(cfg)
        if native_module is None:
            from mkcode.backend.megakernel import native  # builds on first use if needed

            if not weights.embed.is_cuda:
                raise ValueError("MegakernelBackend needs the weights on a CUDA device")
            native_module = native.load()
        self.cfg, self.w = cfg, weights
        self.device = weights.embed.device
        self.tiling = tiling or default_tiling(cfg)
        self.tiling.validate(cfg)
        self.auto_tiling = tiling is None  # the default adapts its MoE tiles to the batch size
        self.mod = native_module
        self.asynchronous = asynchronous
        self.verify_rows = bool(verify_rows)
        # what Engine.spec_note says when the flag is off
        self.verify_rows_note = (
            None
            if self.verify_rows
            else "this megakernel backend was built with verify_rows=False, so it runs no verify rows"
        )
        self._pos_obj, self._pos_ver, self._pos_list = None, -1, []  # _host_positions' last read
        self._armed = None  # the event of the last step whose error word is on its way back
        self._make_event = getattr(native_module, "make_event", None) or torch.cuda.Event
        info = self.mod.device_info()
        self.n_sms = int(n_sms or info["sm_count"])  # one resident block per SM
        self.timeout_s = timeout_s
        # runtime variant flag: MK_PREFETCH_* bits; default MK_PREFETCH_DEFAULT (the measured
        # fastest); MKCODE_MK_PREFETCH overrides it for benches that build the backend
        if prefetch_mode is None:
            prefetch_mode = int(os.environ.get("MKCODE_MK_PREFETCH", abi.MK_PREFETCH_DEFAULT))
        self.prefetch_mode = check_prefetch_mode(prefetch_mode)
        # int64 [n_sms, cap, MK_TL_WORDS] when recording (timeline.py)
        self.timeline: torch.Tensor | None = None
        # per-row sampling block (MK_SP_*); passed to the kernel only by sample() (None: greedy)
        self.sample_params = torch.zeros(
            (abi.MK_MAX_TOKENS, abi.MK_SP_WORDS), dtype=torch.int32, device=weights.embed.device
        )
        self._sampling: torch.Tensor | None = None
        for name, t in (
            ("embed", weights.embed),
            ("final_norm", weights.final_norm),
            ("lm_head", weights.lm_head),
        ):
            if t.dtype != torch.bfloat16 or not t.is_contiguous():
                raise ValueError(f"{name}: megakernel weights must be contiguous bf16")
        # buffers for every tiling a step may use: with the per-batch default, its narrowest LM-head
        # tiles (the most lm_best rows); the other per-batch sizes never exceed the base's
        ws_tiling = self.tiling
        if self.auto_tiling:
            lm_rows = min(self._tiling_for(b).lm_rows for b in range(1, abi.MK_MAX_TOKENS + 1))
            ws_tiling = replace(self.tiling, lm_rows=min(lm_rows, self.tiling.lm_rows))
        self.ws = Workspace.allocate(cfg, ws_tiling, self.device)
        self.layer_w = torch.tensor(
            _layer_weight_ptrs(cfg, weights, self.device), dtype=torch.int64, device=self.device
        )
        flags = []
        for i in range(cfg.num_hidden_layers):
            f = (abi.MK_LAYER_ROPE if cfg.uses_rope(i) else 0) | (
                abi.MK_LAYER_SLIDING if cfg.is_sliding(i) else 0
            )
            flags.append(f | (abi.MK_LAYER_DENSE if cfg.is_dense(i) else 0))
        self.layer_flags = torch.tensor(flags, dtype=torch.int32, device=self.device)
        self.err = torch.zeros(abi.MK_ERR_WORDS, dtype=torch.int32, device=self.device)
        self._cache: dict[tuple, _Prepared] = {}  # schedules by (B, tiling, split vectors), bounded
        self._split_keys: dict[tuple[int, int], tuple] = {}  # (B, split bucket) -> its _cache key
        self._base_stage: list[torch.Tensor] | None = None  # pinned staging of the counter bases
        self._base_done: list = [None, None]
        self._err_host: torch.Tensor | None = None  # pinned copy of the error word
        self.max_cached_schedules = 64
        self.schedules_built = 0  # schedules built and uploaded so far (prewarm reports its share)
        self._alloc_counters(1024)
        G = cfg.gqa_group
        D = cfg.prefix_dense_intermediate_size
        self.max_k = max(
            cfg.hidden_size,
            G * cfg.head_dim,
            (D // self.tiling.mlp_splits) if D else 0,
            cfg.intermediate_size,
        )
        self.steps = 0

    # ---- counters ------------------------------------------------------------------------------
    def _alloc_counters(self, capacity: int) -> None:
        self.counters = torch.zeros(capacity, dtype=torch.int32, device=self.device)
        self.base_dev = torch.zeros(capacity, dtype=torch.int32, device=self.device)
        self.bank = CounterBank(capacity)

    def reset_counters(self) -> None:
        """After an error the device counters are unknown: start again from zero."""
        self.counters.zero_()
        self.bank = CounterBank(self.bank.capacity)

    # ---- schedules -----------------------------------------------------------------------------
    def _prepare(self, positions: list[int], verify: bool = False) -> _Prepared:
        """The schedule of a step at these positions; `verify`: it has verify rows."""
        B = len(positions)
        # the splits depend only on B and the bucket of the longest row (split_bucket_position)
        bucket = (B, split_bucket_position(positions, self.tiling), verify)
        key = self._split_keys.get(bucket)
        if key is not None and key in self._cache:
            return self._cache[key]
        tiling = self._tiling_for(B, bucket[1])
        splits = attention_splits(self.cfg, positions, tiling, self.n_sms)  # its split cap
        most, stride = max(splits[False] + splits[True]), self.ws.tiling.most_splits()
        if most > stride:  # would write past o_part / lse_part
            raise TilingError(f"{most} attention splits at B={B}, the workspace holds {stride}")
        # the tiling is part of the key: one batch size takes another tiling at long contexts
        # (tiling_for_batch's position), which may plan the same splits
        key = (B, tiling, tuple(splits[False]), tuple(splits[True])) + (("verify_rows",) if verify else ())
        self._split_keys[bucket] = key
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        sched = build_schedule(self.cfg, B, positions, self.n_sms, tiling, splits, verify_rows=verify)
        return self._upload(key, sched)

    def _tiling_for(self, B: int, position: int | None = None) -> Tiling:
        """The tiling of a B-row step whose split bucket is `position` (None: a short context)."""
        if not self.auto_tiling:
            return self.tiling
        t = tiling_for_batch(self.cfg, self.tiling, B, position)
        # the one-row self-routing items need SMs free of the QKV and router tiles: on a part with
        # too few SMs the engine keeps ROUTE (an explicit tiling is refused by build_schedule)
        fits = not t.moe_local or moe_local_fits(self.cfg, t, self.n_sms)
        return t if fits else replace(t, moe_local=0, moe_group=0, attn_group=0)

    def prewarm(self, batch_sizes: list[int] | range = range(1, 9), context: int = 0) -> int:
        """Build and upload the schedules for these batch sizes at this context (all rows at it), so
        no step pays the ~0.4 s build when a request joins or leaves. Returns how many were built."""
        before = self.schedules_built
        for B in batch_sizes:
            self._prepare([context] * B)
        return self.schedules_built - before

    def _upload(self, key, sched: Schedule) -> _Prepared:
        self.schedules_built += 1
        if sched.n_counters > self.bank.capacity:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self._alloc_counters(max(sched.n_counters, 2 * self.bank.capacity))
        desc, ntasks = sched.desc_array()
        qd = sched.queue_desc if len(sched.queue_desc) else np.zeros((1, abi.MK_DESC_WORDS), np.int32)
        qi = sched.queue_info if len(sched.queue_info) else np.zeros((1, 4), np.int32)
        dev = self.device
        prep = _Prepared(
            sched,
            torch.from_numpy(desc).to(dev),
            torch.from_numpy(ntasks).to(dev),
            torch.from_numpy(np.ascontiguousarray(qd)).to(dev),
            torch.from_numpy(np.ascontiguousarray(qi)).to(dev),
            int(desc.shape[1]),
        )
        if key is not None:
            if len(self._cache) >= self.max_cached_schedules:  # oldest first (dicts keep insertion order)
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = prep
        return prep

    # ---- launching -----------------------------------------------------------------------------
    def _params(self, prep: _Prepared, batch: DecodeBatch) -> tuple[list[int], list[int], list[float]]:
        """The launch's parameter lists; reused while nothing they are made of changed (the host
        path of a step is GPU idle time: ~0.1 ms of Python per step for these lists alone)."""
        key = (
            batch.token_ids.data_ptr(),
            batch.positions.data_ptr(),
            batch.block_tables.data_ptr(),
            tuple(batch.block_tables.shape),
            batch.kv_pool.data_ptr(),
            self.counters.data_ptr(),
            self.base_dev.data_ptr(),
            None if self.timeline is None else (self.timeline.data_ptr(), tuple(self.timeline.shape)),
            None if self._sampling is None else self._sampling.data_ptr(),
            self.n_sms,
            self.timeout_s,
            self.prefetch_mode,
        )
        if prep.params is not None and prep.params[0] == key:
            return prep.params[1]
        lists = self._build_params(prep, batch)
        prep.params = (key, lists)
        return lists

    def _build_params(self, prep: _Prepared, batch: DecodeBatch) -> tuple[list[int], list[int], list[float]]:
        cfg, t, ws = self.cfg, prep.sched.tiling, self.ws  # the schedule's tiling (MoE tiles per batch size)
        tensors = {
            "desc": prep.desc,
            "ntasks": prep.ntasks,
            "queue": prep.queue,
            "queue_info": prep.queue_info,
            "counters": self.counters,
            "base": self.base_dev,
            "err": self.err,
            "token_ids": batch.token_ids,
            "positions": batch.positions,
            "block_tables": batch.block_tables,
            "kv_pool": batch.kv_pool,
            "layer_w": self.layer_w,
            "layer_flags": self.layer_flags,
            "embed": self.w.embed,
            "final_norm": self.w.final_norm,
            "lm_head": self.w.lm_head,
            "timeline": self.timeline,  # None: off
            "sample_params": self._sampling,  # None: every row greedy
        }
        tensors.update(ws.bufs)
        ptrs = [0 if tensors[n] is None else int(tensors[n].data_ptr()) for n in abi.PARAM_PTRS]
        I, H = cfg.intermediate_size, cfg.hidden_size
        ints = {
            "n_sms": self.n_sms,
            "max_tasks": prep.max_tasks,
            "batch": batch.size,
            "num_layers": cfg.num_hidden_layers,
            "hidden": H,
            "num_heads": cfg.num_attention_heads,
            "num_kv_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "dense_inter": max(cfg.prefix_dense_intermediate_size, 1),
            "moe_inter": max(I, 1),
            "num_experts": max(cfg.num_experts, 1),
            "top_k": max(cfg.num_experts_per_tok, 1),
            "vocab": cfg.vocab_size,
            "max_pages": int(batch.block_tables.shape[2]),
            "max_splits": ws.tiling.most_splits(),  # the o_part / lse_part stride (a batch may use fewer)
            "n_lm_tiles": prep.sched.n_lm_tiles,
            "dyn_base": 0,
            "moe_up_tiles": t.moe_tiles(cfg)[0],
            "moe_up_cols": t.moe_up_cols,
            "moe_down_tiles": t.moe_tiles(cfg)[1],
            "moe_down_rows": t.moe_down_rows,
            "sliding_window": cfg.sliding_window,
            "selection_sigmoid": int(cfg.expert_selection_fn == "sigmoid"),
            "norm_topk": int(cfg.norm_topk_prob),
            "timeout_ms": max(1, int(self.timeout_s * 500)),
            "prefetch_mode": check_prefetch_mode(self.prefetch_mode),
            "timeline_cap": 0 if self.timeline is None else int(self.timeline.shape[1]),
            "moe_fused": t.moe_fused,
        }
        floats = {
            "rms_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_theta,
            "logit_scale": cfg.logit_scale,
            "attn_scale": 1.0 / math.sqrt(cfg.head_dim),
        }
        return ptrs, [int(ints[n]) for n in abi.PARAM_INTS], [float(floats[n]) for n in abi.PARAM_FLOATS]

    def _check_batch(self, batch: DecodeBatch) -> None:
        B = batch.size
        if not 1 <= B <= self.max_batch:
            raise ValueError(f"batch of {B}: the megakernel runs 1..{self.max_batch} rows")
        L, Hkv, d = self.cfg.num_hidden_layers, self.cfg.num_key_value_heads, self.cfg.head_dim
        for name, t, dtype in (
            ("token_ids", batch.token_ids, torch.int64),
            ("positions", batch.positions, torch.int64),
            ("block_tables", batch.block_tables, torch.int32),
            ("kv_pool", batch.kv_pool, torch.bfloat16),
        ):
            if t.device != self.device or t.dtype != dtype or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous {dtype} tensor on {self.device}")
        if tuple(batch.block_tables.shape[:2]) != (L, B):
            raise ValueError(f"block_tables must be [{L}, {B}, P], got {tuple(batch.block_tables.shape)}")
        if tuple(batch.kv_pool.shape[1:]) != (2, Hkv, 64, d):
            raise ValueError(f"kv_pool must be [pages, 2, {Hkv}, 64, {d}], got {tuple(batch.kv_pool.shape)}")

    def launch(
        self,
        batch: DecodeBatch,
        prep: _Prepared | None = None,
        positions: list[int] | None = None,
        verify: bool | None = None,
    ) -> _Prepared:
        """Enqueue one step on the current stream (no sync, no error check): for timing loops.
        `verify`: the step has verify rows (None: the batch says, `_verify_step`)."""
        if prep is None:
            if verify is None:
                verify = self._verify_step(batch)
            if positions is None:
                positions = (
                    batch.positions_on_host()  # the caller's copy: no read back from the device
                    if batch.host_positions is not None
                    else self._host_positions(batch.positions)
                )
            prep = self._prepare(positions, verify)
        self.bank.prepare(prep.sched)
        self._upload_bases()
        ptrs, ints, floats = self._params(prep, batch)
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        self.mod.launch(ptrs, ints, floats, self.max_k, stream)
        self.bank.step_done(prep.sched)
        self.steps += 1
        return prep

    def _host_positions(self, pos: torch.Tensor) -> list[int]:
        """The batch's positions on the host (the schedule depends on the longest row). Reading a
        device tensor waits for everything queued before it, so an unchanged tensor (the same
        object at the same version counter: in-place writes bump it) is not read again: an
        asynchronous caller that steps the same batch keeps the GPU busy."""
        if pos is self._pos_obj and pos._version == self._pos_ver:
            return self._pos_list
        host = pos.tolist()
        self._pos_obj, self._pos_ver, self._pos_list = pos, pos._version, host
        return host

    def _upload_bases(self) -> None:
        """Copy the step's counter bases to the device without a host sync: through one of two
        pinned staging buffers (a buffer is rewritten only after its previous copy ran)."""
        if self.device.type != "cuda":
            self.base_dev.copy_(torch.from_numpy(self.bank.base.view(np.int32)))
            return
        n = self.bank.capacity
        if self._base_stage is None or self._base_stage[0].shape[0] != n:
            self._base_stage = [torch.empty(n, dtype=torch.int32).pin_memory() for _ in range(2)]
            self._base_done = [None, None]
        i = self.steps % 2
        if self._base_done[i] is not None:
            self._base_done[i].synchronize()  # normally long finished
        self._base_stage[i].numpy()[:] = self.bank.base.view(np.int32)
        self.base_dev.copy_(self._base_stage[i], non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._base_done[i] = ev

    def wait(self) -> None:
        """Wait for the launched work with the watchdog, then check the kernel's error word."""
        self._arm()
        self.wait_step()

    def _arm(self) -> None:
        """Enqueue the error word's copy to the host and an event after everything launched so far.
        The device error word is only cleared after it was reported, so a failed step is still seen
        through the copy of any later step."""
        if self.device.type == "cuda":  # the error word comes back with the step (one sync, not two)
            if self._err_host is None:
                self._err_host = torch.empty(self.err.shape, dtype=self.err.dtype).pin_memory()
            self._err_host.copy_(self.err, non_blocking=True)
        ev = self._make_event()
        ev.record()
        self._armed = ev

    def wait_step(self) -> None:
        """Wait (host watchdog) for the work enqueued up to the last decode()/sample()/launch()+
        _arm(), then raise the kernel's error if any step reported one. No-op when nothing is
        pending (a synchronous decode() already waited)."""
        ev, self._armed = self._armed, None
        if ev is None:
            return
        start = time.monotonic()
        deadline = start + self.timeout_s
        while not ev.query():
            now = time.monotonic()
            if now > deadline:
                # stream-ordered after the stuck launch: the next step starts from clean counters
                self.err.zero_()
                self.reset_counters()
                raise MegakernelTimeout(
                    f"megakernel step did not finish in {self.timeout_s:.1f} s (the GPU is still busy; "
                    "the in-kernel watchdog should abort it shortly)"
                )
            # a step takes milliseconds: poll hot at first (no sleep granularity in the latency),
            # then back off so a stuck step does not burn a core for the whole watchdog period
            time.sleep(0 if now - start < 0.05 else 0.0005)
        err = self._err_host.tolist() if self.device.type == "cuda" else self.err.tolist()
        if err[0] != abi.MK_ERR_NONE:
            self.err.zero_()
            self.reset_counters()
            raise MegakernelError(
                f"megakernel {ERROR_NAMES.get(err[0], err[0])}: block {err[1]}, task {err[2]}, "
                f"counter {err[3]} value {err[4]} target {err[5]}"
            )

    def _verify_step(self, batch: DecodeBatch) -> bool:
        """Whether the step has verify rows; refused unless this backend was built for them."""
        if not batch.has_verify_rows:
            return False
        if not self.verify_rows:
            raise ValueError(
                "verify rows (DecodeBatch.seq_rows) on a megakernel backend built without verify_rows"
            )
        if sum(batch.seq_rows) != batch.size:
            raise ValueError(f"seq_rows {batch.seq_rows} do not cover the batch's {batch.size} rows")
        return True

    def _normalize(self, batch: DecodeBatch) -> DecodeBatch:
        """The small per-step tensors as the kernel reads them (contiguous, int64/int32); the pool
        is used in place (the step writes K/V into it)."""
        return DecodeBatch(
            token_ids=batch.token_ids.to(self.device, torch.int64).contiguous(),
            positions=batch.positions.to(self.device, torch.int64).contiguous(),
            block_tables=batch.block_tables.to(self.device, torch.int32).contiguous(),
            kv_pool=batch.kv_pool,
            seq_rows=batch.seq_rows,
        )

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        """Run one step; return fp32 logits [B, vocab]. New K/V land in batch.kv_pool. With
        `asynchronous`, the logits are a stream-ordered copy that is valid once `wait_step()`
        returned (device consumers on the same stream may use them at once)."""
        batch = self._normalize(batch)
        self._check_batch(batch)
        self.launch(batch)
        out = self.ws["logits"][: batch.size].clone()  # stream-ordered after the step
        self._arm()
        if not self.asynchronous:
            self.wait_step()
        return out

    def sample(self, batch: DecodeBatch, params: SamplingParams | list[SamplingParams]) -> torch.Tensor:
        """Run one step and draw one token per row on the device (int64 [B], on the GPU): greedy,
        temperature, top-k, top-p per row (`mkcode.backend.megakernel.sampling`). The same seed and
        step give the same token whatever the rest of the batch. The step's logits stay readable
        with `last_logits(B)`."""
        batch = self._normalize(batch)
        self._check_batch(batch)
        B = batch.size
        rows = [params] * B if isinstance(params, SamplingParams) else list(params)
        if len(rows) != B:
            raise ValueError(f"{len(rows)} sampling params for a batch of {B}")
        self.sample_params.copy_(torch.from_numpy(pack(rows)))
        self._sampling = self.sample_params
        try:
            self.launch(batch)
        finally:
            self._sampling = None
        self.wait()
        return self.ws["tokens_out"][:B].clone()

    def last_logits(self, batch_size: int) -> torch.Tensor:
        """The last step's fp32 logits [B, vocab] (a copy)."""
        return self.ws["logits"][:batch_size].clone()

    def greedy_tokens(self, batch_size: int) -> torch.Tensor:
        """The step's on-device greedy samples [B] (int64), valid after decode()."""
        return self.ws["tokens_out"][:batch_size].clone()

    def run_tasks(
        self,
        tasks: np.ndarray,
        batch: DecodeBatch,
        n_sms: int | None = None,
        sampling: list[SamplingParams] | None = None,
    ) -> None:
        """Run an arbitrary descriptor list (no queues) dealt over `n_sms` blocks: per-op tests."""
        n = n_sms or min(self.n_sms, len(tasks))
        from mkcode.backend.megakernel.schedule import CounterSet

        sm_lists = [list(range(i, len(tasks), n)) for i in range(n)]
        cs = CounterSet(names=[f"c{i}" for i in range(self.bank.capacity)], totals=[0] * self.bank.capacity)
        sched = Schedule(
            self.cfg,
            self.tiling,
            batch.size,
            n,
            {False: [], True: []},
            tasks.astype(np.int32),
            sm_lists,
            np.zeros((0, abi.MK_DESC_WORDS), np.int32),
            np.zeros((0, 4), np.int32),
            cs,
            -(-self.cfg.vocab_size // self.tiling.lm_rows),
        )
        saved = self.n_sms
        self.n_sms = n
        if sampling is not None:
            self.sample_params.copy_(torch.from_numpy(pack(sampling)))
            self._sampling = self.sample_params
        try:
            self.launch(batch, self._upload(None, sched))
            self.wait()
        finally:
            self.n_sms = saved
            self._sampling = None
            self.reset_counters()  # these tasks' signals are outside the bases' bookkeeping
