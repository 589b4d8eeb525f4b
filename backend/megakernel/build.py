"""Building the megakernel extension (`mk_native`) with nvcc, cached by a hash of sources and flags.

The module is compiled for sm_90a (wgmma-capable Hopper) and links only the CUDA runtime: tensors
cross as data_ptr() integers, so a CPU-only torch is enough to build it. `compile_only=True` runs
the full nvcc front and back end to an object file, which is the CI check (nvcc, no GPU).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mkcode.backend.megakernel.abi import CSRC

MODULE = "mk_native"
KERNEL_SOURCE = "mk_kernel.cu"  # the kernel + launcher: no Python, cached independently of it
MODULE_SOURCE = "mk_module.cu"  # the pybind11 binding: host code only
ARCH_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a"]
NVCC_FLAGS = ["-O3", "-std=c++17", "-lineinfo", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr"]
KERNEL_FLAGS = ["-Xptxas", "-v"]


class BuildError(RuntimeError):
    """The extension cannot be built here; the message says exactly what is missing or failed."""


@dataclass
class BuildResult:
    path: Path
    cached: bool
    seconds: float
    log: str
    command: list[str]


def cache_root() -> Path:
    env = os.environ.get("MKCODE_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mkcode" / "kernels"


def find_nvcc() -> str | None:
    for cand in (
        os.environ.get("NVCC"),
        shutil.which("nvcc"),
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
    ):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def pybind11_include() -> str | None:
    try:
        import pybind11
    except ImportError:
        return None
    return pybind11.get_include()


def python_include() -> str | None:
    inc = sysconfig.get_paths().get("include")
    return inc if inc and os.path.isfile(os.path.join(inc, "Python.h")) else None


def missing_requirements() -> list[str]:
    """Human-readable list of what a build needs and this machine lacks (empty when it can build)."""
    out = []
    if find_nvcc() is None:
        out.append(
            "nvcc (the CUDA compiler): install the CUDA toolkit 12.4+ and put nvcc on PATH, or set NVCC"
        )
    if pybind11_include() is None:
        out.append(f"pybind11 headers: `{sys.executable} -m pip install pybind11`")
    if python_include() is None:
        out.append(
            f"Python development headers (Python.h not in {sysconfig.get_paths().get('include')}): "
            "install python3-dev / python3.X-dev"
        )
    if not (CSRC / KERNEL_SOURCE).is_file():
        out.append(f"kernel sources ({CSRC / KERNEL_SOURCE} not found: run from a source checkout)")
    return out


def nvcc_version(nvcc: str) -> str:
    try:
        return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"


def source_files() -> list[Path]:
    return sorted(p for p in CSRC.iterdir() if p.suffix in (".cu", ".cuh", ".h", ".hpp"))


def _key(parts: list[str], files: list[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update("\0".join(parts).encode())
    return h.hexdigest()[:20]


def _headers() -> list[Path]:
    return [p for p in source_files() if p.suffix != ".cu"]


def _compile_cmd(nvcc: str, source: str, out: Path, python: bool) -> list[str]:
    inc = [f"-I{CSRC}"] + ([f"-I{pybind11_include()}", f"-I{python_include()}"] if python else [])
    flags = NVCC_FLAGS + ([] if python else KERNEL_FLAGS)
    return [nvcc, *ARCH_FLAGS, *flags, *inc, str(CSRC / source), "-c", "-o", str(out)]


def _run(cmd: list[str], out: Path, verbose: bool) -> str:
    if verbose:
        print(" ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise BuildError(f"nvcc failed (exit {proc.returncode}) on {out.name}:\n{' '.join(cmd)}\n{log}")
    return log


def _cached_step(name: str, key: str, make, force: bool, verbose: bool) -> tuple[Path, bool, str]:
    """Produce cache_root()/key/name with make(tmp_path) -> cmd, atomically; (path, cached, log)."""
    target_dir = cache_root() / key
    target = target_dir / name
    if target.exists() and not force:
        return target, True, ""
    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target_dir) as tmp:
        out = Path(tmp) / name
        cmd = make(out)
        log = _run(cmd, out, verbose)
        os.replace(out, target)  # atomic: concurrent builders never see a partial file
    (target_dir / (name + ".log")).write_text(" ".join(cmd) + "\n" + log)
    return target, False, log


def _keys(nvcc: str) -> tuple[str, str, str]:
    ver = nvcc_version(nvcc)
    kfiles = [*_headers(), CSRC / KERNEL_SOURCE]
    kkey = _key([*ARCH_FLAGS, *NVCC_FLAGS, *KERNEL_FLAGS, ver], kfiles)
    mkey = _key(
        [*ARCH_FLAGS, *NVCC_FLAGS, ver, sys.version, str(pybind11_include())],
        [*_headers(), CSRC / MODULE_SOURCE],
    )
    return kkey, mkey, hashlib.sha256(f"{kkey}{mkey}".encode()).hexdigest()[:20]


def artifact_name() -> str:
    return MODULE + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def build(compile_only: bool = False, force: bool = False, verbose: bool = False) -> BuildResult:
    """Build (or find in the cache) the extension; raises BuildError with what is missing or the
    compiler's output. compile_only stops after the two objects (the CI check: no GPU, no link)."""
    missing = missing_requirements()
    if missing:
        raise BuildError("cannot build the megakernel extension; missing:\n  - " + "\n  - ".join(missing))
    nvcc = find_nvcc()
    assert nvcc is not None
    t0 = time.monotonic()
    kkey, mkey, skey = _keys(nvcc)
    kobj, kc, klog = _cached_step(
        "mk_kernel.o", kkey, lambda o: _compile_cmd(nvcc, KERNEL_SOURCE, o, False), force, verbose
    )
    mobj, mc, mlog = _cached_step(
        "mk_module.o", mkey, lambda o: _compile_cmd(nvcc, MODULE_SOURCE, o, True), force, verbose
    )
    if compile_only:
        return BuildResult(kobj, kc and mc, time.monotonic() - t0, klog + mlog, [])
    so, sc, slog = _cached_step(
        artifact_name(),
        skey,
        lambda o: [nvcc, *ARCH_FLAGS, "-shared", str(kobj), str(mobj), "-lcudart", "-o", str(o)],
        force,
        verbose,
    )
    return BuildResult(so, kc and mc and sc, time.monotonic() - t0, klog + mlog + slog, [])


def cached_artifact() -> Path | None:
    """The cached extension for the current sources, if built (no compiler run beyond `--version`)."""
    nvcc = find_nvcc()
    if nvcc is None or missing_requirements():
        return None
    p = cache_root() / _keys(nvcc)[2] / artifact_name()
    return p if p.exists() else None
