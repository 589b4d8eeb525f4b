"""`mkcode doctor`: what this machine can run, and why not.

Each check prints its line as soon as it ends (flushed, also into a pipe); a slow one (importing
torch, asking nvidia-smi) first shows what it is doing on a terminal, so the command is never
silent. In order: the GPU and driver (nvidia-smi), torch and its CUDA, the megakernel toolchain,
build and load, what `--decode auto` will run, the shell sandbox and each of its layers
(namespaces, seccomp, Landlock), the shipped demo model (checksums), the configuration (config
file, environment) and the server the settings point at (or a local `mkcode serve`). Every
failure names its fix. A summary then says plainly which features work on this machine.

Exit code 0 when every check passes (the sandbox, the GPU and the megakernel can run), 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

LOCAL_SERVER = "http://127.0.0.1:8080/v1"  # where `mkcode serve` listens by default
SERVER_TIMEOUT_S = 3.0
DRIVER_FIX = "install the NVIDIA driver (nvidia-smi must list the GPU); without a GPU mkcode runs the demo model on the CPU"
TORCH_FIX = (
    "install a CUDA build of torch (https://pytorch.org/get-started/locally/), then pip install -e '.[gpu]'"
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the GPU, the megakernel, the sandbox, the demo model, the config and the server",
        description="Check what this machine can run (GPU, driver, torch CUDA, megakernel build, shell "
        "sandbox, demo model, configuration, server) with a fix for each failure.",
    )
    parser.add_argument("--build", action="store_true", help="build the extension if it is not built")
    parser.set_defaults(func=run)


def _line(name: str, ok: bool | None, detail: str, fix: str = "") -> None:
    mark = {True: "ok", False: "FAIL", None: "--"}[ok]
    text = f"[{mark:>4}] {name:<18} {detail}"
    if ok is False and fix:
        text += f"\n{'':<26}fix: {fix}"
    _clear_pending()
    print(text, flush=True)


_pending = False


def _doing(what: str) -> None:
    """On a terminal: say what a slow check is doing until its line replaces it."""
    global _pending
    if sys.stdout.isatty():
        sys.stdout.write(f"\r\033[2K       … {what}")
        sys.stdout.flush()
        _pending = True


def _clear_pending() -> None:
    global _pending
    if _pending:
        sys.stdout.write("\r\033[2K")
        _pending = False


@dataclass
class Findings:
    """What the checks found, for the summary and the exit code."""

    failed: list[str] = field(default_factory=list)
    gpu: bool = False
    cuda: bool = False
    torch: bool = False
    megakernel: bool = False
    sandbox: bool = False
    demo: bool = False
    config_ok: bool = True
    backend: str = "demo"
    endpoint: str | None = None
    server: bool | None = None  # None: no server configured or running

    def check(self, name: str, ok: bool) -> bool:
        if not ok:
            self.failed.append(name)
        return ok


# -- GPU, torch, megakernel ------------------------------------------------------------------------


def _gpu(f: Findings) -> None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        _line("GPU / driver", False, "nvidia-smi not found (no NVIDIA driver on this machine?)", DRIVER_FIX)
        f.check("GPU / driver", False)
        return
    _doing("asking nvidia-smi")
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        ok = out.returncode == 0
        _line("GPU / driver", ok, out.stdout.strip() or out.stderr.strip(), DRIVER_FIX)
    except (OSError, subprocess.SubprocessError) as e:
        ok = False
        _line("GPU / driver", False, f"nvidia-smi failed: {e}", DRIVER_FIX)
    f.gpu = f.check("GPU / driver", ok)


def _torch(f: Findings) -> None:
    _doing("importing torch (the first time after an install can take a while)")
    try:
        import torch
    except ImportError as e:
        _line("torch", False, str(e), "pip install -e . (torch is a dependency of mkcode)")
        f.check("torch", False)
        return
    f.torch = True
    cuda = torch.cuda.is_available()
    detail = f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (CPU build)'}"
    if cuda:
        cc = ".".join(map(str, torch.cuda.get_device_capability(0)))
        detail += f", {torch.cuda.get_device_name(0)} (cc {cc})"
    fix = TORCH_FIX if torch.version.cuda is None else "check the driver: torch's CUDA sees no GPU"
    _line("torch CUDA", cuda, detail, fix)
    f.cuda = f.check("torch CUDA", cuda)


def _megakernel(f: Findings, build: bool) -> None:
    from mkcode.backend.megakernel import build as b

    missing = b.missing_requirements()
    _line(
        "toolchain",
        not missing,
        "nvcc, pybind11, Python headers present" if not missing else "; ".join(missing),
        "install what is listed",
    )
    f.check("toolchain", not missing)
    art = b.cached_artifact()
    if art is None and build and not missing:
        _doing("building the megakernel extension (minutes)")
        try:
            art = b.build().path
        except b.BuildError as e:
            _line("build", False, str(e).splitlines()[0], "see the full error with `mkcode kernels build`")
    _line(
        "extension build",
        art is not None,
        str(art) if art else "not built",
        "mkcode kernels build (or mkcode doctor --build); needs nvcc and a CUDA GPU",
    )
    f.check("extension build", art is not None)
    if art is not None:
        from mkcode.backend.megakernel import native

        try:
            mod = native.load(build_if_missing=False)
            info = mod.device_info()
            loads = info.get("device_count", 0) > 0 and info.get("cc", 0) >= 90
            _line(
                "extension load", loads, f"ABI {mod.ABI_VERSION}; {info}", "the megakernel needs a cc 9.0 GPU"
            )
        except native.NativeUnavailable as e:
            loads = False
            _line("extension load", False, str(e), "rebuild it: mkcode kernels build")
        f.megakernel = f.check("extension load", loads)
    _line("decode auto", None, _auto_decode_plan(f.cuda, f.megakernel))


# -- sandbox, demo model, config, server ----------------------------------------------------------------


def _sandbox() -> bool:
    """The shell sandbox and each of its layers (docs/SECURITY.md); the fix when it cannot run."""
    import os

    from mkcode.tools.sandbox.probe import probe_sandbox

    _doing("probing the shell sandbox")
    status = probe_sandbox(None, [os.getcwd()])
    if not status.available:
        _line("sandbox", False, status.reason, status.fix)
        return False
    _line("sandbox", True, f"bubblewrap at {status.bwrap}")
    for layer in status.layers:
        name, _, detail = layer.partition(": ")
        _line(f"  {name}", None if detail.startswith("not offered") else True, detail)
    for note in status.notes:
        _line("  note", None, note)
    return True


def _demo(f: Findings) -> None:
    try:
        from mkcode.backend.demo.shipped import DemoModelError, demo_model_version, shipped_demo_model
    except ImportError as e:
        _line("demo model", False, f"not installed ({e})", "reinstall mkcode (pip install -e .)")
        f.check("demo model", False)
        return
    _doing("verifying the demo model's checksums")
    try:
        path = shipped_demo_model()
    except DemoModelError as e:
        message = str(e)
        what, _, fix = message.partition(". ")
        _line("demo model", False, what, fix or "reinstall mkcode")
        f.check("demo model", False)
        return
    size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    from mkcode.app.core.backend import format_size

    _line(
        "demo model",
        True,
        f"mkcode-demo v{demo_model_version(path)}, {format_size(size)}, checksums verified",
    )
    f.demo = True


def _config(f: Findings) -> None:
    from mkcode.app.settings import SettingsError, config_path, load_settings

    path = config_path()
    try:
        settings = load_settings()
    except SettingsError as e:
        _line("config", False, str(e), f"edit {path} (or unset the MKCODE_* variable it names)")
        f.config_ok = f.check("config", False)
        return
    where = str(path) if path.is_file() else f"{path} (absent: defaults)"
    chosen = {"openai": "endpoint", "local": "model", "demo": None}[settings.backend]
    if chosen is None:
        what = "no model configured: the demo model"
    else:
        what = f"{chosen} {getattr(settings, chosen)} (from {settings.source_of(chosen)})"
    _line("config", True, f"{where}; {what}; mode {settings.mode}")
    f.backend = settings.backend
    f.endpoint = settings.endpoint
    if settings.backend == "local":
        from pathlib import Path

        model = Path(settings.model or "")
        ok = (model / "config.json").is_file()
        _line("model", ok, str(model), "point `model` at a Hugging Face-format checkpoint directory")
        f.check("model", ok)


def _server(f: Findings) -> None:
    import httpx

    configured = f.endpoint is not None
    url = (f.endpoint or LOCAL_SERVER).rstrip("/")
    _doing(f"asking {url}/models")
    t0 = time.monotonic()
    try:
        r = httpx.get(f"{url}/models", timeout=SERVER_TIMEOUT_S if configured else 0.5)
        ms = (time.monotonic() - t0) * 1000
        ok = r.status_code == 200
        detail = f"{url}: /models answered {r.status_code} in {ms:.0f} ms"
        if r.status_code == 401:
            detail += " (needs the API key: api_key in config.toml or MKCODE_API_KEY)"
    except httpx.HTTPError as e:
        ok, detail = False, f"{url}: {type(e).__name__}: {e}"
    if not configured and not ok:
        _line("server", None, f"no endpoint configured; no local `mkcode serve` at {LOCAL_SERVER}")
        return
    fix = "start it (mkcode serve) or fix `endpoint` in config.toml / MKCODE_ENDPOINT"
    _line("server", ok, detail, fix)
    f.server = ok
    if configured:
        f.check("server", ok)


# -- the summary -------------------------------------------------------------------------------------


def features(f: Findings) -> list[tuple[str, str, str]]:
    """(yes / no / --, feature, why) for the summary."""
    rows = []
    if f.demo and f.torch:
        rows.append(("yes", "the assistant on the demo model (CPU, no setup)", "mkcode"))
    else:
        rows.append(("no", "the assistant on the demo model", "see the failures above"))
    if f.cuda:
        rows.append(("yes", "North Mini Code in process on this GPU", "mkcode --model DIR"))
    else:
        rows.append(("no", "North Mini Code in process on a GPU", "no CUDA GPU for torch"))
    if f.megakernel:
        rows.append(("yes", "the megakernel decode", "--decode auto picks it"))
    else:
        rows.append(("no", "the megakernel decode", "the extension is not built or does not load"))
    if f.sandbox:
        rows.append(("yes", "shell commands, in the sandbox", "run_shell"))
    else:
        rows.append(
            ("no", "sandboxed shell commands", "run_shell is refused unless --dangerously-no-sandbox")
        )
    rows.append(("yes", "file tools (read, list, grep, edit, write)", "always"))
    if f.server is None:
        rows.append(("--", "a model server", "none configured (mkcode --endpoint URL, or mkcode serve)"))
    elif f.server:
        rows.append(("yes", "the model server", f.endpoint or LOCAL_SERVER))
    else:
        rows.append(("no", "the model server", "not reachable"))
    return rows


def run(args: argparse.Namespace) -> int:
    print("mkcode doctor: each line appears as its check ends", flush=True)
    f = Findings()
    _gpu(f)
    _torch(f)
    _megakernel(f, bool(getattr(args, "build", False)))
    f.sandbox = f.check("sandbox", _sandbox())
    _demo(f)
    _config(f)
    _server(f)
    _clear_pending()
    print("\nOn this machine:", flush=True)
    for mark, what, how in features(f):
        print(f"  {mark:<3} {what:<48} {how}", flush=True)
    if f.failed:
        print(f"\n{len(f.failed)} check(s) failed: {', '.join(f.failed)}", flush=True)
    return 1 if f.failed else 0


def _auto_decode_plan(cuda: bool, megakernel_loads: bool) -> str:
    """What `--decode auto` will run on this machine (backend.runtime.choose_decode_backend), as far
    as the checks above tell: the graph backend also needs triton, which is checked here too."""
    from mkcode.backend.engine.hybrid_backend import (
        MEGAKERNEL_BELOW_POSITION,
        MEGAKERNEL_BELOW_ROWS,
        MEGAKERNEL_FROM_POSITION,
        auto_choice,
        positions_text,
    )
    from mkcode.backend.gpu.triton_support import HAVE_TRITON

    if not cuda:
        return "torch reference backend (no CUDA GPU)"
    n, at = MEGAKERNEL_BELOW_ROWS, positions_text(MEGAKERNEL_FROM_POSITION, MEGAKERNEL_BELOW_POSITION)
    return {
        "hybrid": f"hybrid: the megakernel below {n} rows{at}, the graph backend otherwise",
        "graph": "graph backend (the megakernel extension is not built or does not load)",
        "megakernel": "megakernel (triton is missing: no graph backend; pip install -e '.[gpu]')",
        "torch": "torch reference backend (neither the graph backend nor the megakernel is available)",
    }[auto_choice(HAVE_TRITON, megakernel_loads)]
