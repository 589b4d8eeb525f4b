"""`mkcode doctor`: what this machine can run, and why not.

Reports the shell sandbox and its layers (bubblewrap, namespaces, seccomp, Landlock), the GPU and driver (nvidia-smi), torch and its CUDA, the megakernel toolchain, whether the
extension is built, whether it loads and sees the GPU, and what `--decode auto` will run. Exit code 0
when the sandbox and the megakernel can run.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the GPU, driver, torch CUDA and the megakernel build",
        description="Report the GPU, driver, torch CUDA, and the megakernel extension's build and load status.",
    )
    parser.add_argument("--build", action="store_true", help="build the extension if it is not built")
    parser.set_defaults(func=run)


def _line(name: str, ok: bool | None, detail: str) -> None:
    mark = {True: "ok", False: "FAIL", None: "--"}[ok]
    print(f"[{mark:>4}] {name:<18} {detail}")


def _sandbox() -> bool:
    """The shell sandbox and each of its layers (docs/SECURITY.md); the fix when it cannot run."""
    import os

    from mkcode.tools.sandbox.probe import probe_sandbox

    status = probe_sandbox(None, [os.getcwd()])
    if not status.available:
        _line("sandbox", False, f"{status.reason}; fix: {status.fix}")
        return False
    _line("sandbox", True, f"bubblewrap at {status.bwrap}")
    for layer in status.layers:
        name, _, detail = layer.partition(": ")
        _line(f"  {name}", None if detail.startswith("not offered") else True, detail)
    for note in status.notes:
        _line("  note", None, note)
    return True


def run(args: argparse.Namespace) -> int:
    healthy = _sandbox()
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            _line("GPU / driver", out.returncode == 0, out.stdout.strip() or out.stderr.strip())
            healthy &= out.returncode == 0
        except (OSError, subprocess.SubprocessError) as e:
            _line("GPU / driver", False, f"nvidia-smi failed: {e}")
            healthy = False
    else:
        _line("GPU / driver", False, "nvidia-smi not found (no NVIDIA driver on this machine?)")
        healthy = False

    try:
        import torch

        cuda = torch.cuda.is_available()
        detail = f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (CPU build)'}"
        if cuda:
            detail += f", {torch.cuda.get_device_name(0)} (cc {'.'.join(map(str, torch.cuda.get_device_capability(0)))})"
        _line("torch CUDA", cuda, detail)
        healthy &= cuda
    except ImportError as e:
        _line("torch", False, str(e))
        healthy = False

    from mkcode.backend.megakernel import build as b

    missing = b.missing_requirements()
    _line(
        "toolchain",
        not missing,
        "nvcc, pybind11, Python headers present" if not missing else "; ".join(missing),
    )
    art = b.cached_artifact()
    if art is None and args.build and not missing:
        try:
            art = b.build().path
        except b.BuildError as e:
            _line("build", False, str(e).splitlines()[0])
    _line("extension build", art is not None, str(art) if art else "not built (mkcode kernels build)")
    healthy &= art is not None
    loads = False
    if art is not None:
        from mkcode.backend.megakernel import native

        try:
            mod = native.load(build_if_missing=False)
            info = mod.device_info()
            loads = info.get("device_count", 0) > 0 and info.get("cc", 0) >= 90
            _line("extension load", loads, f"ABI {mod.ABI_VERSION}; {info}")
            healthy &= loads
        except native.NativeUnavailable as e:
            _line("extension load", False, str(e))
            healthy = False
    _line("decode auto", None, _auto_decode_plan(cuda, loads))
    return 0 if healthy else 1


def _auto_decode_plan(cuda: bool, megakernel_loads: bool) -> str:
    """What `--decode auto` will run on this machine (backend.runtime.choose_decode_backend), as far
    as the checks above tell: the graph backend also needs triton, which is checked here too."""
    from mkcode.backend.engine.hybrid_backend import (
        MEGAKERNEL_BELOW_POSITION,
        MEGAKERNEL_BELOW_ROWS,
        MEGAKERNEL_FROM_POSITION,
        auto_choice,
    )
    from mkcode.backend.gpu.triton_support import HAVE_TRITON

    if not cuda:
        return "torch reference backend (no CUDA GPU)"
    n, lo, hi = MEGAKERNEL_BELOW_ROWS, MEGAKERNEL_FROM_POSITION, MEGAKERNEL_BELOW_POSITION
    return {
        "hybrid": f"hybrid: the megakernel below {n} rows at positions {lo}-{hi - 1}, the graph backend otherwise",
        "graph": "graph backend (the megakernel extension is not built or does not load)",
        "megakernel": "megakernel (triton is missing: no graph backend; pip install -e '.[gpu]')",
        "torch": "torch reference backend (neither the graph backend nor the megakernel is available)",
    }[auto_choice(HAVE_TRITON, megakernel_loads)]
