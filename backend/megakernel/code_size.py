"""Code size of the megakernel: the SASS bytes of each device function in the compiled kernel object.

Measured 2026-11-29: an op a block runs rarely (route, combine, the add+norm of then: once per layer) pays
~5 us of cold instruction fetch (MK_MODE_TWICE: add+norm 8.4 us cold, 2.9 us warm) in a kernel of
~650 KB of SASS, so code size is a performance figure: `mkcode kernels sizes` prints it. Needs
`cuobjdump` (CUDA toolkit, or `pip install nvidia-cuda-cuobjdump`), no GPU.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mkcode.backend.megakernel.build import find_nvcc


class CodeSizeError(RuntimeError):
    """cuobjdump is missing or could not read the object."""


@dataclass(frozen=True)
class FunctionSize:
    name: str  # the demangled-ish short name (the device function inside the kernel)
    symbol: str  # the ELF symbol
    size: int  # bytes of SASS


def find_cuobjdump() -> str | None:
    """$CUOBJDUMP, PATH, next to the nvcc the build uses (the toolkit ships both), then the pip
    wheel's copy (nvidia/<pkg>/bin) in this interpreter's site-packages."""
    nvcc = find_nvcc()
    cands = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    cands.append(os.path.join(os.path.dirname(nvcc), "cuobjdump") if nvcc else None)
    for site in (p for p in sys.path if p.endswith("site-packages")):
        cands += glob.glob(os.path.join(site, "nvidia", "*", "bin", "cuobjdump"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


# a symtab row of `cuobjdump -elf`: index, value (address), size, FUNC, binding, visibility, section, ..., name
_ROW = re.compile(r"^\s*0x[0-9a-f]+\s+((?:0x)?[0-9a-f]+)\s+(0x[0-9a-f]+)\s+FUNC\s+(\S+)\s+\S+\s+.*?(\S+)\s*$")


def symtab_functions(text: str) -> list[tuple[int, int, str, str]]:
    """(address, size, binding, symbol) of every FUNC row of `cuobjdump -elf` output."""
    out = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            out.append((int(m.group(1), 16), int(m.group(2), 16), m.group(3), m.group(4)))
    return out


_MANGLED = re.compile(r"_ZN2mk(\d+)")
_INT_ARG = re.compile(r"Li(\d+)E")


def short_name(symbol: str) -> str:
    """`$_ZN2mk14mk_step_kernel...$_ZN2mk8op_oprojERK...` -> `op_oproj` (integer template arguments
    kept for instances: `attn_mma_t<128>`, `gemv_down_acc<4, 2>`)."""
    inner = symbol.rsplit("$", 1)[-1]
    m = _MANGLED.search(inner)
    if not m:
        return inner
    n = int(m.group(1))
    start = m.end()
    name = inner[start : start + n]
    tmpl = re.match(r"I((?:Li\d+E)+)E", inner[start + n :])
    if not tmpl:
        return name
    return f"{name}<{', '.join(_INT_ARG.findall(tmpl.group(1)))}>"


def parse_symtab(text: str) -> list[FunctionSize]:
    """The FUNC symbols of `cuobjdump -elf` output with their sizes, largest first. The kernel entry's
    symbol spans its whole text section, out-of-line functions included: its own size here is the
    rest (the dispatch loop and the ops inlined into it)."""
    funcs, entries = [], []
    for _, size, binding, sym in symtab_functions(text):
        (entries if binding == "GLOBAL" else funcs).append((sym, size))
    inner = sum(size for _, size in funcs)
    out = [FunctionSize(short_name(sym), sym, size) for sym, size in funcs]
    for sym, size in entries:  # one kernel per object here; several would share `inner` wrongly
        own = size - inner if len(entries) == 1 and size > inner else size
        out.append(FunctionSize(short_name(sym) + " (dispatch + inlined ops)", sym, own))
    return sorted(out, key=lambda f: -f.size)


def require_cuobjdump(cuobjdump: str | None = None) -> str:
    """The given tool, else find_cuobjdump()'s, else a CodeSizeError that says how to get one."""
    tool = cuobjdump or find_cuobjdump()
    if tool is None:
        raise CodeSizeError(
            "cuobjdump not found: install the CUDA toolkit or `pip install nvidia-cuda-cuobjdump "
            "nvidia-cuda-nvdisasm` (-sass needs nvdisasm next to it), or set CUOBJDUMP"
        )
    return tool


def run_cuobjdump(tool: str, flag: str, obj: Path) -> str:
    """`tool flag obj`'s standard output; a CodeSizeError when it cannot run or fails."""
    try:
        res = subprocess.run([tool, flag, str(obj)], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise CodeSizeError(f"{tool} {flag} {obj}: {e}") from e
    if res.returncode != 0:
        raise CodeSizeError(f"{tool} {flag} {obj} failed: {res.stderr.strip()[-500:]}")
    return res.stdout


def function_sizes(obj: Path, cuobjdump: str | None = None) -> list[FunctionSize]:
    sizes = parse_symtab(run_cuobjdump(require_cuobjdump(cuobjdump), "-elf", obj))
    if not sizes:
        raise CodeSizeError(f"no function symbols in {obj} (is it a CUDA object?)")
    return sizes
