"""A running tensor/expert-parallel backend on every rank of a torchrun world.

    rt = build_parallel_runtime(opts, tp=4, ep=4)   # every rank calls it
    # rank 0: rt is a Runtime (engine over the parallel model, tokenizer): serve it, then rt.close()
    # ranks 1..: it ran rank 0's steps until rt.close() on rank 0 released them, and returned None

Each rank loads only its slices of the checkpoint (`loading.load_shard`, safetensors slices: no
rank holds the full model), allocates a KV pool of its own kv heads with the page count every rank
can hold (`build_kv_pool`, from each rank's `kv_budget_bytes`), and rank 0 builds the unchanged
engine with `ParallelModel` as the model and prefill and `ParallelDecodeBackend` as the decode
backend. A keep-alive thread on rank 0 pings the other ranks while the server is idle, so their
pending receive never reaches the process-group timeout (NCCL's watchdog would abort it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from mkcode.backend.kv.layout import page_bytes
from mkcode.backend.kv.pool import KVPool
from mkcode.backend.parallel.driver import ParallelDecodeBackend, ParallelModel, build_kv_pool
from mkcode.backend.parallel.loading import LoadedShard, load_shard
from mkcode.backend.parallel.plan import PlanError, ShardPlan
from mkcode.backend.parallel.sharded_model import ShardedModel
from mkcode.backend.runtime import Runtime, RuntimeOptions, kv_budget_bytes, resolve_dtype

PARALLEL_DECODE = ("auto", "torch")  # the graph and megakernel backends are single-GPU today
KEEPALIVE_S = 30.0


def world_degrees(tp: int, ep: int, world: int | None = None) -> int:
    """The world size a (tp, ep) request needs, checked against `world` when given (torchrun's);
    raises PlanError with the reason for a layout that cannot run."""
    for name, deg in (("--tensor-parallel", tp), ("--expert-parallel", ep)):
        if deg < 1:
            raise PlanError(f"{name} {deg}: a degree is at least 1")
    n = max(tp, ep)
    for name, deg in (("--tensor-parallel", tp), ("--expert-parallel", ep)):
        if deg not in (1, n):
            raise PlanError(
                f"{name} {deg}: each degree must be 1 or the number of ranks ({n}); a partial degree "
                "would need a second collective per layer (docs/SCALING.md)"
            )
    if world is not None and world != n:
        if n == 1:
            raise PlanError(
                f"launched as {world} ranks, but --tensor-parallel and --expert-parallel are both 1: "
                f"pass --tensor-parallel {world} and/or --expert-parallel {world}"
            )
        raise PlanError(
            f"--tensor-parallel {tp} --expert-parallel {ep} need {n} ranks, launched with {world}"
        )
    return n


def check_devices(device: str | None, world: int) -> str:
    """'cuda' or 'cpu' for a world of `world` ranks on one host; raises for what cannot work."""
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind not in ("cuda", "cpu"):
        raise ValueError(
            f"--device {kind}: with tensor/expert parallelism pass --device cuda (rank r uses GPU r of "
            "CUDA_VISIBLE_DEVICES) or --device cpu"
        )
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda asked for, but torch sees no CUDA GPU")
        visible = torch.cuda.device_count()
        if world > visible:
            raise RuntimeError(
                f"{world} ranks need {world} GPUs, but {visible} are visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
            )
    return kind


class KeepAlive:
    """Rank 0: pings the other ranks after `interval` seconds without a message."""

    def __init__(self, model: ParallelModel, interval: float = KEEPALIVE_S):
        self.model, self.interval = model, interval
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="mkcode-tp-keepalive", daemon=True)

    def start(self) -> KeepAlive:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval / 2):
            try:
                self.model.ping(self.interval)
            except Exception:  # the group is gone: the next step reports it
                return

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5.0)


@dataclass
class ParallelRuntime(Runtime):
    plan: ShardPlan | None = None
    keepalive: KeepAlive | None = field(default=None, repr=False)

    def close(self) -> None:
        """Stop the engine, release the other ranks from serve(), leave the process group."""
        self.engine.shutdown()
        if self.keepalive is not None:
            self.keepalive.stop()
        model = self.model
        assert isinstance(model, ParallelModel)
        try:
            model.close()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def build_parallel_runtime(
    opts: RuntimeOptions,
    tp: int,
    ep: int,
    *,
    before_serve: Callable[[], None] | None = None,
    keepalive_s: float = KEEPALIVE_S,
) -> ParallelRuntime | None:
    """Every rank of a torchrun world (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) calls this.
    Rank 0 gets the Runtime; the others run steps until rank 0's `close()` and get None
    (`before_serve` runs on them just before, e.g. to hand signals to rank 0)."""
    from mkcode.backend.parallel.launch import init_distributed

    if "WORLD_SIZE" not in os.environ:
        raise RuntimeError(
            "build_parallel_runtime runs under torchrun (WORLD_SIZE unset); "
            "`mkcode serve --tensor-parallel N` launches it for you"
        )
    world = int(os.environ["WORLD_SIZE"])
    world_degrees(tp, ep, world)
    if opts.decode not in PARALLEL_DECODE:
        raise ValueError(
            f"--decode {opts.decode}: with tensor/expert parallelism the decode backend is the "
            "sharded torch path (choose auto or torch)"
        )
    kind = check_devices(opts.device, world)
    if kind == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local} has no GPU ({torch.cuda.device_count()} visible)")
    comm, device = init_distributed("nccl" if kind == "cuda" else "gloo")
    plan = ShardPlan(world, comm.rank, tp=tp, ep=ep)
    dtype = resolve_dtype(opts.dtype, device)
    shard = load_shard(
        opts.model, plan, device=device, dtype=dtype, progress=opts.progress if comm.rank == 0 else False
    )
    cfg = shard.config
    model = ParallelModel(ShardedModel(cfg, shard.weights, plan, comm))
    budget = kv_budget_bytes(opts, device)
    pool = build_kv_pool(model, int(budget // page_bytes(model.shard.kv_heads, cfg.head_dim, dtype)))
    if pool.num_pages == 0:  # the same minimum on every rank: all raise together
        raise RuntimeError(
            f"no room for a KV pool on at least one rank (this rank's budget: {budget / 2**30:.2f} GiB)"
        )
    if comm.rank != 0:
        if before_serve is not None:
            before_serve()
        try:
            model.serve()
        finally:
            dist.destroy_process_group()
        return None

    try:
        return _rank0_runtime(opts, model, pool, shard, plan, tp, ep, kind, keepalive_s)
    except BaseException:
        model.close()  # release the other ranks before failing
        dist.destroy_process_group()
        raise


def _rank0_runtime(
    opts: RuntimeOptions,
    model: ParallelModel,
    pool: KVPool,
    shard: LoadedShard,
    plan: ShardPlan,
    tp: int,
    ep: int,
    kind: str,
    keepalive_s: float,
) -> ParallelRuntime:
    """Rank 0's engine (the unchanged scheduler over the parallel model) and tokenizer."""
    from mkcode.backend.chat.tokenizer import ChatTokenizer
    from mkcode.backend.engine.engine import Engine, EngineOptions

    cfg, world, device, dtype = shard.config, plan.world, model.device, model.dtype
    tokenizer = ChatTokenizer(opts.model)
    eng_opts = EngineOptions(max_model_len=opts.max_model_len)
    if opts.max_prefill_tokens:
        eng_opts.max_prefill_tokens = opts.max_prefill_tokens
    eos = tuple(sorted(set(tokenizer.eos_token_ids) | set(cfg.eos_token_ids)))
    engine = Engine(
        model,  # type: ignore[arg-type]  # ReferenceModel's engine-facing surface
        pool,
        ParallelDecodeBackend(model, max_batch=256),
        options=eng_opts,
        eos_token_ids=eos,
        detokenizer_factory=lambda: tokenizer.detokenizer(skip_special_tokens=False),
        prefill_fn=model.forward,
    )
    backend = "nccl" if kind == "cuda" else "gloo"
    return ParallelRuntime(
        config=cfg,
        model=model,  # type: ignore[arg-type]
        tokenizer=tokenizer,
        engine=engine,
        device=device,
        dtype=dtype,
        decode_backend="parallel",
        decode_note=(
            f"tensor-parallel {tp}, expert-parallel {ep} over {world} ranks ({backend}); "
            f"this rank's slices: {shard.nbytes / 1e9:.2f} GB read in {shard.seconds:.1f} s"
        ),
        model_name=Path(opts.model).resolve().name,
        plan=plan,
        keepalive=KeepAlive(model, keepalive_s).start() if keepalive_s > 0 else None,
    )
