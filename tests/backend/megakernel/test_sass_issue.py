"""sass_issue: the opcodes a device function compiled to, from SASS."""

from __future__ import annotations

import pytest

from mkcode.backend.megakernel import sass_issue
from mkcode.backend.megakernel.build import missing_requirements
from mkcode.backend.megakernel.code_size import CodeSizeError, find_cuobjdump

FUNCS = [(0x100, 0x200, "attn_combine_at"), (0x200, 0x300, "gemv_mma")]


def _sass(rows: list[tuple[int, str]]) -> str:
    return "\n".join(f"        /*{a:04x}*/                   {t} ;   /* 0x0 */" for a, t in rows)


TEXT = _sass(
    [
        (0x0F0, "LDG.E.128.STRONG.GPU R4, desc[UR4][R2.64]"),  # before the function: not counted
        (0x100, "@P0 LDG.E.128.STRONG.GPU R8, desc[UR4][R2.64]"),  # predicated: counted
        (0x110, "LDG.E.64.CONSTANT R12, desc[UR4][R2.64]"),  # another kind: not counted
        (0x120, "LDG.E.128.STRONG.GPU R16, desc[UR4][R6.64]"),
        (0x130, "@!P1 FADD R16, R16, R8"),  # the first use
        (0x140, "LDG.E.128.STRONG.GPU R20, desc[UR4][R6.64]"),  # after it: not counted
        (0x200, "LDG.E.128.STRONG.GPU R20, desc[UR4][R6.64]"),  # the next function
    ]
)


def test_opcodes_in_counts_one_function():
    counts = sass_issue.opcodes_in(TEXT, FUNCS, "attn_combine_at")
    assert counts == {"LDG.E.128.STRONG.GPU": 3, "LDG.E.64.CONSTANT": 1, "FADD": 1}
    with pytest.raises(CodeSizeError, match="no device function 'op_route'"):
        sass_issue.opcodes_in(TEXT, FUNCS, "op_route")


@pytest.mark.compile
@pytest.mark.skipif(bool(missing_requirements()), reason="needs nvcc, pybind11 and Python headers")
@pytest.mark.skipif(
    find_cuobjdump() is None, reason="needs cuobjdump + nvdisasm (pip: nvidia-cuda-cuobjdump)"
)
@pytest.mark.parametrize("kp", [1, 2, 4, 8])
def test_compiled_fused_down_slice_sums_by_global_reductions(kp):
    """On the object CI compiles: the fused MoE item's down slice (gemv_down_acc<KP>) adds into the
    row sums with REDG (global, no return value) and holds no ATOM / CAS loop: atomicAdd on a
    generic float pointer compiled to a generic ATOM plus compare-and-swap loops (2026-11-30)."""
    from mkcode.backend.megakernel.build import build

    counts = sass_issue.object_opcodes_in(build(compile_only=True).path, f"gemv_down_acc<{kp}>")
    assert sum(n for op, n in counts.items() if op.startswith("REDG.E.ADD.F32")) >= 4, counts
    assert not [op for op in counts if op.startswith("ATOM") or "CAS" in op], counts


@pytest.mark.compile
@pytest.mark.skipif(bool(missing_requirements()), reason="needs nvcc, pybind11 and Python headers")
@pytest.mark.skipif(
    find_cuobjdump() is None, reason="needs cuobjdump + nvdisasm (pip: nvidia-cuda-cuobjdump)"
)
@pytest.mark.parametrize("function,least", [("gemv_mma", 16), ("gemv_down_acc<4>", 8)])
def test_compiled_weight_loads_fetch_whole_lines(function, least):
    """On the object CI compiles: every weight load (the read-only path, LDG ... .CONSTANT) of the
    GEMVs carries the L2::128B prefetch-size hint (LTC128B in SASS): a GEMV warp load covers 64
    bytes of each of 8 rows, and without it L2 fetched half lines from HBM (2026-11-30: BS 1 -2.7 %,
    BS 8 -2.2 % with it)."""
    from mkcode.backend.megakernel.build import build

    counts = sass_issue.object_opcodes_in(build(compile_only=True).path, function)
    weights = {op: n for op, n in counts.items() if op.startswith("LDG") and op.endswith(".CONSTANT")}
    assert sum(weights.values()) >= least, counts
    assert all("LTC128B" in op for op in weights), weights
