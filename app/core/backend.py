"""Choosing and starting the model backend a front end talks to.

`open_backend(settings, progress)` returns a `Backend`: an `EngineClient` plus what the status bar
shows about it (label, live metrics). Three cases, from the settings:

- `endpoint` set: the agent's `OpenAICompatClient` against that URL (nothing loads locally);
- `model` set: `build_runtime` on that checkpoint directory, then the `InProcessClient`;
- neither: the demo model that ships with the package (checksums verified, nothing trained), with
  `DEMO_NOTICE`.

Torch and the engine are imported inside `open_backend`, never at module import.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mkcode.app.agent.client import EngineClient
from mkcode.app.settings import Settings

# (stage text, fraction done or None when unknown): drives the start screen's progress bar.
ProgressFn = Callable[[str, float | None], None]

DEMO_NOTICE = (
    "No model configured: running the demo model (a tiny checkpoint shipped with mkcode; "
    "it calls tools but knows little)."
)
DEMO_HINT = (
    'Point mkcode at North Mini Code with `mkcode --model DIR`, or `model = "DIR"` in '
    "~/.config/mkcode/config.toml."
)


DEMO_MODEL_NAME = "mkcode-demo"


class BackendError(RuntimeError):
    """The backend could not start; the message says why and what to do."""


@dataclass
class BackendMetrics:
    """Live figures for the status bar (None: not known for this backend)."""

    decode_tokens_per_s: float | None = None
    kv_usage: float | None = None
    gpu_memory_used_gb: float | None = None
    gpu_memory_total_gb: float | None = None
    speculative: str | None = None  # "spec 812/1140": drafts accepted / verified (in-process engine)


@dataclass
class Backend:
    client: EngineClient
    kind: str  # "local" | "demo" | "openai" | "scripted"
    label: str  # one line for the status bar: "torch · cpu", "openai · http://host/v1"
    notice: str | None = None  # shown once at start (the demo model message)
    runtime: Any = None  # mkcode.backend.runtime.Runtime for in-process backends
    load_seconds: float = 0.0
    metrics_fn: Callable[[], BackendMetrics] | None = field(default=None, repr=False)

    @property
    def model_name(self) -> str:
        return self.client.model_name

    def metrics(self) -> BackendMetrics:
        if self.metrics_fn is not None:
            try:
                return self.metrics_fn()
            except Exception:  # metrics are decoration: never let them break the UI
                return BackendMetrics()
        if self.runtime is None:
            return BackendMetrics()
        return runtime_metrics(self.runtime)

    def close(self, timeout: float | None = None) -> None:
        """Stop the in-process engine; with `timeout`, wait at most that long for its thread (a
        front end on its way out passes a short one; `process_exit.leave` deals with the rest)."""
        if self.runtime is None:
            return
        if timeout is not None:
            self.runtime.engine.shutdown(timeout)
        self.runtime.close()


def runtime_metrics(runtime: Any) -> BackendMetrics:
    """Decode speed and KV use from the engine; GPU memory when the runtime is on CUDA."""
    m = runtime.engine.metrics()
    out = BackendMetrics(decode_tokens_per_s=m.decode_tokens_per_s, kv_usage=m.kv_usage)
    if getattr(runtime.engine, "speculative", "off") != "off":
        out.speculative = f"spec {m.spec_accepted_tokens}/{m.spec_draft_tokens}"
    device = getattr(runtime, "device", None)
    if device is not None and getattr(device, "type", "") == "cuda":
        import torch  # already imported by the runtime

        free, total = torch.cuda.mem_get_info(device)
        out.gpu_memory_used_gb = (total - free) / 1e9
        out.gpu_memory_total_gb = total / 1e9
    return out


def _remote(settings: Settings) -> Backend:
    from mkcode.app.agent.openai_compat import OpenAICompatClient

    assert settings.endpoint is not None
    client = OpenAICompatClient(
        settings.endpoint,
        settings.endpoint_model,
        api_key=settings.api_key,
        context_window=settings.context_window,
    )
    return Backend(client, "openai", f"openai · {settings.endpoint}")


def _demo_model_dir(progress: ProgressFn) -> tuple[Path, str]:
    """The shipped demo checkpoint (checksums verified) and the name to show for it."""
    try:
        from mkcode.backend.demo import DemoModelError, ensure_demo_model
        from mkcode.backend.demo.shipped import demo_model_version
    except ImportError as e:  # the demo package is optional in a slim install
        raise BackendError(f"no model configured and the demo model is unavailable ({e}). {DEMO_HINT}") from e
    progress("checking the demo model", 0.05)
    try:
        path = Path(ensure_demo_model(progress=lambda msg: progress(f"demo model: {msg}", 0.1)))
    except DemoModelError as e:
        raise BackendError(str(e)) from e
    return path, f"{DEMO_MODEL_NAME} v{demo_model_version(path)}"


def format_size(n_bytes: float) -> str:
    """Bytes for people: `812 KB`, `3.2 MB`, `61.4 GB` (decimal units, as disks are sold)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes:.0f} B"


def _local(settings: Settings, progress: ProgressFn, *, demo: bool) -> Backend:
    if demo:
        model_dir, name = _demo_model_dir(progress)
    else:
        model_dir = Path(settings.model or "")
        name = model_dir.name
    if not (model_dir / "config.json").exists():
        raise BackendError(
            f"{model_dir} is not a checkpoint directory (no config.json). "
            "Give a Hugging Face-format checkpoint with --model DIR or `model` in config.toml."
        )
    progress(f"loading {name}", 0.1)
    from mkcode.app.agent.inprocess import InProcessClient
    from mkcode.backend.runtime import RuntimeOptions, build_runtime

    progress(f"loading weights of {name}", 0.3)
    t0 = time.monotonic()

    def weights_progress(done: int, total: int) -> None:  # bytes done of total, and the rate
        rate = done / max(time.monotonic() - t0, 1e-6)
        progress(
            f"loading weights of {name}: {format_size(done)} / {format_size(total)} ({format_size(rate)}/s)",
            0.3 + 0.6 * done / max(total, 1),
        )

    try:
        runtime = build_runtime(
            RuntimeOptions(
                model=model_dir,
                device=settings.device,
                decode=settings.decode,
                progress=weights_progress,
                speculative=settings.speculative,
                spec_k=settings.spec_k,
            )
        )
    except (RuntimeError, ValueError, OSError) as e:
        raise BackendError(f"could not load {model_dir}: {e}") from e
    progress("starting the engine", 0.9)
    if demo:  # the shipped directory is just "checkpoint": name the model for what it is
        runtime.model_name = name
    runtime.engine.start()
    client = InProcessClient.from_runtime(runtime)
    label = f"{runtime.decode_backend} · {runtime.device}"
    notice = f"{DEMO_NOTICE} {DEMO_HINT}" if demo else None
    return Backend(client, "demo" if demo else "local", label, notice=notice, runtime=runtime)


def open_backend(settings: Settings, progress: ProgressFn | None = None) -> Backend:
    """Start the backend the settings ask for (blocking: run it off the UI thread)."""
    say: ProgressFn = progress or (lambda _stage, _fraction: None)
    t0 = time.monotonic()
    if settings.backend == "openai":
        backend = _remote(settings)
    else:
        backend = _local(settings, say, demo=settings.backend == "demo")
    backend.load_seconds = time.monotonic() - t0
    say("ready", 1.0)
    return backend
