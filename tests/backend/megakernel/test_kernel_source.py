"""Static checks of the CUDA sources against the ABI, and the compile check (nvcc, no GPU)."""

from __future__ import annotations

import re

import pytest

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.build import missing_requirements


def _cuda_sources() -> str:
    return "\n".join(p.read_text() for p in abi.CSRC.iterdir() if p.suffix in (".cu", ".cuh", ".h"))


def test_kernel_dispatches_every_opcode():
    src = _cuda_sources()
    handled = set(re.findall(r"case\s+MK_OP_(\w+)\s*:", src))
    missing = set(abi.OPCODES) - handled
    assert not missing, f"kernel dispatch lacks {sorted(missing)}"


def test_kernel_param_struct_comes_from_the_xmacros():
    src = _cuda_sources()
    for macro in ("MK_PARAM_PTRS", "MK_PARAM_INTS", "MK_PARAM_FLOATS"):
        assert re.search(macro + r"\(\w+\)", src), f"kernel does not expand {macro}"


@pytest.mark.compile
@pytest.mark.skipif(bool(missing_requirements()), reason="needs nvcc, pybind11 and Python headers")
def test_kernels_compile_with_nvcc():
    """THE CI compile check: `mkcode kernels build --compile-only` must succeed (nvcc on both
    translation units; cached by a hash of sources and flags, so a CI machine compiles afresh)."""
    from mkcode.app.cli import main
    from mkcode.backend.megakernel.build import build

    assert main(["kernels", "build", "--compile-only"]) == 0
    assert build(compile_only=True).cached  # the artifact is now in the cache


@pytest.mark.compile
@pytest.mark.skipif(bool(missing_requirements()), reason="needs nvcc")
@pytest.mark.parametrize("probe", ["stream_probe", "moe_probe", "layer_probe", "gemv_cost_probe"])
def test_probes_compile(tmp_path, probe):
    """The stand-alone probes (csrc/probes: HBM streaming strategies, the MoE phase's schedules, a
    GEMV's fixed cost, a layer in groups of SMs) stay buildable for sm_90a."""
    import subprocess

    from mkcode.backend.megakernel.build import ARCH_FLAGS, find_nvcc

    src = abi.CSRC / "probes" / f"{probe}.cu"
    out = tmp_path / f"{probe}.o"
    proc = subprocess.run(
        [find_nvcc(), *ARCH_FLAGS, "-O3", "-std=c++17", str(src), "-c", "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out.stat().st_size > 0
