"""Assemble a running backend from a checkpoint directory: weights, tokenizer, KV pool, decode
backend and engine. The one place the CLI, the TUI and the server get an engine from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mkcode.backend.engine.engine import Engine, EngineOptions
from mkcode.backend.engine.torch_backend import TorchDecodeBackend
from mkcode.backend.kv.layout import page_bytes
from mkcode.backend.kv.pool import KVPool
from mkcode.backend.model.config import ModelConfig
from mkcode.backend.model.reference import ReferenceModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DECODE_BACKENDS = ("auto", "torch", "graph", "megakernel", "hybrid")


@dataclass
class RuntimeOptions:
    model: Path
    device: str | None = None  # default: cuda when present, else cpu
    dtype: str | None = None  # default: bfloat16 on GPU, float32 on CPU
    decode: str = "auto"
    gpu_memory_utilization: float = 0.90
    kv_memory_gb: float | None = None  # KV pool size; default: 1 GB on CPU, from utilization on GPU
    max_model_len: int | None = None
    max_prefill_tokens: int | None = None
    speculative: str = "ngram"  # "off" | "ngram": prompt-lookup drafts verified in the decode step
    spec_k: int = 7  # most drafts per sequence and step (1..7)
    progress: bool | Callable[[int, int], None] = True  # or callback(done_bytes, total_bytes)


@dataclass
class Runtime:
    config: ModelConfig
    model: ReferenceModel
    tokenizer: object  # mkcode.backend.chat.tokenizer.ChatTokenizer
    engine: Engine
    device: torch.device
    dtype: torch.dtype
    decode_backend: str
    decode_note: str  # why this backend (one line)
    model_name: str

    def close(self) -> None:
        self.engine.shutdown()


def resolve_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "--device cuda asked for, but torch sees no CUDA GPU (torch.cuda.is_available() is False)"
        )
    return dev


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def kv_budget_bytes(opts: RuntimeOptions, device: torch.device) -> int:
    if opts.kv_memory_gb is not None:  # an explicit size wins on any device
        return int(opts.kv_memory_gb * (1 << 30))
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used_by_others = total - free
        reserve = 2 << 30  # activations, CUDA graphs, allocator slack
        return max(0, int(total * opts.gpu_memory_utilization) - used_by_others - reserve)
    return int((opts.kv_memory_gb or 1.0) * (1 << 30))


def _load_gpu_backend(candidate: str, model: ReferenceModel, build: bool) -> object:
    """`build`: the megakernel may compile its extension now (nvcc, about a minute) when it is not
    built yet; `auto` passes False, so a first start is not held up by a build nobody asked for
    (the reason then says to run `mkcode kernels build`)."""
    if candidate == "graph":
        from mkcode.backend.gpu.graph_backend import GraphDecodeBackend

        return GraphDecodeBackend(model)
    from mkcode.backend.megakernel import native
    from mkcode.backend.megakernel.backend import MegakernelBackend, check_geometry

    check_geometry(model.cfg)  # as the constructor does, but before a build it could not use
    return MegakernelBackend(model.cfg, model.w, native_module=native.load(build_if_missing=build))


def choose_decode_backend(name: str, model: ReferenceModel) -> tuple[object, str, str]:
    """(backend, its name, a one-line reason).

    `auto` on a GPU loads the graph backend and the megakernel and, when both load, runs them as one
    hybrid backend: the megakernel for batches below `MEGAKERNEL_BELOW_ROWS` rows whose longest row
    is at a position from `MEGAKERNEL_FROM_POSITION` on (below `MEGAKERNEL_BELOW_POSITION` where
    that is set; where it is the faster one: docs/PERF.md, hybrid table), the graph backend for the
    other steps (the megakernel is still slower from two rows on, and on the H200 below ~1K
    tokens). `auto` uses the megakernel's extension only when it is built (`mkcode kernels
    build`). Either alone when the other does not load (the reason says why), torch when neither
    does. `graph`, `megakernel` and `hybrid` ask for exactly that (building the extension if
    needed) and fail with the reason."""
    from mkcode.backend.engine.hybrid_backend import MEGAKERNEL_BELOW_ROWS, HybridDecodeBackend, auto_choice

    if name not in DECODE_BACKENDS:
        raise ValueError(f"unknown decode backend {name!r}; choose one of {list(DECODE_BACKENDS)}")
    dev = model.device
    if dev.type != "cuda":
        if name not in ("torch", "auto"):
            raise RuntimeError(f"decode backend {name!r} needs a CUDA GPU (device is {dev})")
        return TorchDecodeBackend(model), "torch", "no GPU: torch reference backend"
    if name == "torch":
        return TorchDecodeBackend(model), "torch", "torch reference backend (asked for)"
    wanted = {"auto": ("graph", "megakernel"), "hybrid": ("graph", "megakernel")}.get(name, (name,))
    loaded: dict[str, object] = {}
    reasons: list[str] = []
    for candidate in wanted:
        try:
            loaded[candidate] = _load_gpu_backend(candidate, model, build=name != "auto")
        except Exception as e:  # any load failure: fatal when asked for, else a reason to report
            if name != "auto":
                raise RuntimeError(f"{candidate} backend unavailable: {e}") from e
            reasons.append(f"{candidate} unavailable ({e})")
    choice = auto_choice("graph" in loaded, "megakernel" in loaded)
    if choice == "hybrid":
        hybrid = HybridDecodeBackend(loaded["megakernel"], loaded["graph"], MEGAKERNEL_BELOW_ROWS)
        return hybrid, "hybrid", f"hybrid: {hybrid.describe()} (CUDA graphs)"
    if choice == "graph":
        return loaded["graph"], "graph", "; ".join([*reasons, "graph backend (CUDA graphs)"])
    if choice == "megakernel":
        return loaded["megakernel"], "megakernel", "; ".join([*reasons, "megakernel loaded"])
    return TorchDecodeBackend(model), "torch", "; ".join([*reasons, "torch reference backend"])


def build_runtime(opts: RuntimeOptions) -> Runtime:
    from mkcode.backend.chat.tokenizer import ChatTokenizer
    from mkcode.backend.checkpoint.loader import load_checkpoint

    device = resolve_device(opts.device)
    dtype = resolve_dtype(opts.dtype, device)
    ck = load_checkpoint(opts.model, device=device, dtype=dtype, progress=opts.progress)
    cfg = ck.config
    tokenizer = ChatTokenizer(opts.model)
    model = ReferenceModel(cfg, ck.weights)
    backend, backend_name, note = choose_decode_backend(opts.decode, model)
    budget = kv_budget_bytes(opts, device)
    n_pages = budget // page_bytes(cfg.num_key_value_heads, cfg.head_dim, dtype)
    pool = KVPool(
        int(n_pages), cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, device=device, dtype=dtype
    )
    eng_opts = EngineOptions(
        max_model_len=opts.max_model_len, speculative=opts.speculative, spec_k=opts.spec_k
    )
    if opts.max_prefill_tokens:
        eng_opts.max_prefill_tokens = opts.max_prefill_tokens
    prefill_fn = None
    if device.type == "cuda":  # flash attention + grouped-GEMM MoE instead of the reference ops
        from mkcode.backend.gpu.prefill import GpuPrefill

        prefill_fn = GpuPrefill(model)
    eos = tuple(sorted(set(tokenizer.eos_token_ids) | set(cfg.eos_token_ids)))
    engine = Engine(
        model,
        pool,
        backend,
        options=eng_opts,
        eos_token_ids=eos,
        detokenizer_factory=lambda: tokenizer.detokenizer(skip_special_tokens=False),
        prefill_fn=prefill_fn,
    )
    return Runtime(
        config=cfg,
        model=model,
        tokenizer=tokenizer,
        engine=engine,
        device=device,
        dtype=dtype,
        decode_backend=backend_name,
        decode_note=note,
        model_name=Path(opts.model).resolve().name,
    )


def build_parallel_runtime(opts: RuntimeOptions, tp: int, ep: int, **kwargs: object) -> Runtime | None:
    """`build_runtime` over tensor/expert parallelism, on every rank of a torchrun world: rank 0 gets
    the Runtime (the engine over the sharded model); the other ranks run its steps until rank 0's
    `Runtime.close()`, then get None. See `mkcode.backend.parallel.runtime`."""
    from mkcode.backend.parallel.runtime import build_parallel_runtime as build

    return build(opts, tp, ep, **kwargs)  # type: ignore[arg-type]
