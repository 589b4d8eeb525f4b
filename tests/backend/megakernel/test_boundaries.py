"""Import boundaries of the megakernel code (docs/ENGINE.md, Layout)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
LOADER = ROOT / "backend" / "megakernel" / "native.py"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _mentions_extension(path: Path) -> bool:
    """Imports `mk_native`, or loads an extension module by path (ExtensionFileLoader)."""
    tree = ast.parse(path.read_text(), str(path))
    loads = any(
        (isinstance(n, ast.Attribute) and n.attr == "ExtensionFileLoader")
        or (isinstance(n, ast.Name) and n.id == "ExtensionFileLoader")
        for n in ast.walk(tree)
    )
    return loads or any("mk_native" in n.split(".") for n in _imports(path))


def test_only_the_loader_imports_the_compiled_extension():
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("app", "backend", "tools", "tests")
        for p in (ROOT / folder).rglob("*.py")
        if p != LOADER and _mentions_extension(p)
    ]
    assert not offenders, f"only {LOADER.relative_to(ROOT)} may import the extension: {offenders}"
    assert _mentions_extension(LOADER)


def test_command_modules_do_not_import_torch_at_module_level():
    for name in ("kernels", "doctor"):
        path = ROOT / "app" / "commands" / f"{name}.py"
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        mods = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
        assert not any(m.startswith(("torch", "mkcode.backend")) for m in mods), f"{name}: {mods}"


def test_help_does_not_import_torch():
    code = (
        "import sys; from mkcode.app.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report of a machine without a GPU")
def test_kernels_info_and_doctor_run_without_a_gpu(capsys):
    from mkcode.app.cli import main
    from mkcode.backend.megakernel import build

    missing = build.missing_requirements()
    assert main(["kernels", "info"]) == (1 if missing else 0)  # the exit code says whether it can build
    out = capsys.readouterr().out
    assert "nvcc:" in out
    assert [
        line.removeprefix("missing:").strip() for line in out.splitlines() if line.startswith("missing:")
    ] == (missing)
    assert main(["doctor"]) == 1  # no GPU: not healthy
    out = capsys.readouterr().out
    assert "[FAIL] torch CUDA" in out and "extension build" in out
    assert "decode auto" in out and "torch reference backend (no CUDA GPU)" in out


def test_doctor_names_what_decode_auto_runs():
    from mkcode.app.commands.doctor import _auto_decode_plan
    from mkcode.backend.engine.hybrid_backend import MEGAKERNEL_BELOW_ROWS as N
    from mkcode.backend.gpu.triton_support import HAVE_TRITON

    assert _auto_decode_plan(False, False).startswith("torch")
    if HAVE_TRITON:  # the test extra installs no triton on the CPU machine; the GPU image has it
        assert _auto_decode_plan(True, True).startswith(f"hybrid: the megakernel below {N} rows ")
        assert _auto_decode_plan(True, False).startswith("graph backend")
    else:
        assert _auto_decode_plan(True, True).startswith("megakernel (triton is missing")
        assert _auto_decode_plan(True, False).startswith("torch reference backend (neither")
