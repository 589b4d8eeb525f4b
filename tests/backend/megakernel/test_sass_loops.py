"""`mkcode kernels loops`: the tensor-core loops of the compiled kernel and their local-memory traffic."""

from __future__ import annotations

import pytest

from mkcode.backend.megakernel import sass_loops
from mkcode.backend.megakernel.build import missing_requirements
from mkcode.backend.megakernel.code_size import find_cuobjdump

# `cuobjdump -elf` symtab rows (index, address, size, FUNC, binding, ..., name)
ELF = """
  0x11          0x100            0x100  FUNC          LOCAL   DEFAULT    -      0x11  $_ZN2mk14mk_step_kernelENS_6ParamsEi$_ZN2mk8gemv_mmaERKNS_6ParamsE
  0x12          0x200            0x100  FUNC          LOCAL   DEFAULT    -      0x11  $_ZN2mk14mk_step_kernelENS_6ParamsEi$_ZN2mk10attn_mma_tILi128EEEvRKNS_6ParamsE
  0x24                0          0x400  FUNC          GLOBAL  DEFAULT    ENTRY  0x17  _ZN2mk14mk_step_kernelENS_6ParamsEi
"""


def _sass(rows: list[tuple[int, str]]) -> str:
    return "\n".join(f"        /*{a:04x}*/                   {t} ;   /* 0x0 */" for a, t in rows)


def test_loops_are_found_counted_and_named():
    text = _sass(
        [
            (0x100, "LDG.E.128.CONSTANT R8, desc[UR4][R2.64]"),  # gemv loop 0x100..0x140
            (0x110, "LDS.128 R12, [R5]"),
            (0x120, "HMMA.16816.F32.BF16 R20, R8, R12, R20"),
            (0x130, "@P0 STL [R1+0x8], R20"),
            (0x140, "@P1 BRA 0x100"),
            (0x200, "LDL R3, [R1+0x10]"),  # attention loop 0x200..0x220, reloads from local memory
            (0x210, "HMMA.16816.F32.BF16 R4, R8, R12, R4"),
            (0x220, "BRA 0x200"),
            (0x300, "IADD3 R1, R1, 0x1, RZ"),  # a loop without HMMA: not reported
            (0x310, "BRA 0x300"),
            (0x320, "BRA 0x330"),  # forward branch: not a loop
            (0x330, "EXIT"),
        ]
    )
    loops = sass_loops.parse_loops(text, sass_loops.parse_functions(ELF))
    assert [(lp.start, lp.end, lp.function) for lp in loops] == [
        (0x100, 0x140, "gemv_mma"),
        (0x200, 0x220, "attn_mma_t<128>"),
    ]
    gemv, attn = loops
    assert (gemv.instructions, gemv.hmma, gemv.local, gemv.lds, gemv.ldg) == (5, 1, 1, 1, 1)
    assert gemv.weight_stream and not attn.weight_stream
    problems = sass_loops.weight_stream_problems(loops)
    assert len(problems) == 1 and "gemv_mma" in problems[0] and "1 local-memory" in problems[0]
    # the attention's reloads are shown, not failed; a GEMV core without loops is a problem
    assert sass_loops.weight_stream_problems([attn]) == [
        "no loop of the GEMV core (gemv_*) holds HMMA: was it inlined?"
    ]
    clean = sass_loops.parse_loops(
        text.replace("@P0 STL [R1+0x8], R20", "NOP"), sass_loops.parse_functions(ELF)
    )
    assert sass_loops.weight_stream_problems(clean) == []


def test_missing_tool_is_a_clear_error(monkeypatch, tmp_path):
    from mkcode.backend.megakernel import code_size

    monkeypatch.setattr(code_size, "find_cuobjdump", lambda: None)  # what require_cuobjdump asks
    with pytest.raises(sass_loops.CodeSizeError, match="cuobjdump not found"):
        sass_loops.mma_loops(tmp_path / "mk_kernel.o")


@pytest.mark.compile
@pytest.mark.skipif(bool(missing_requirements()), reason="needs nvcc, pybind11 and Python headers")
@pytest.mark.skipif(
    find_cuobjdump() is None, reason="needs cuobjdump + nvdisasm (pip: nvidia-cuda-cuobjdump)"
)
def test_compiled_gemv_loops_do_not_spill():
    """On the object CI compiles: the GEMV core's weight-stream loops exist and never touch local
    memory (a spill there halved every GEMV task's speed, 2026-11-29)."""
    from mkcode.app.cli import main
    from mkcode.backend.megakernel.build import build

    loops = sass_loops.mma_loops(build(compile_only=True).path)
    assert any(lp.weight_stream for lp in loops)
    assert sass_loops.weight_stream_problems(loops) == []
    assert main(["kernels", "loops"]) == 0


@pytest.mark.skipif(bool(missing_requirements()), reason="needs nvcc, pybind11 and Python headers")
@pytest.mark.skipif(
    find_cuobjdump() is None, reason="needs cuobjdump + nvdisasm (pip: nvidia-cuda-cuobjdump)"
)
def test_own_code_of_the_compiled_kernel(capsys, tmp_path):
    """`mkcode kernels own-code OTHER.o` on the object CI compiles: against itself nothing differs;
    a missing object is a clear error."""
    from mkcode.app.cli import main
    from mkcode.backend.megakernel.build import build

    obj = build(compile_only=True).path
    assert main(["kernels", "own-code", str(obj)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("; 0 differ")
    assert main(["kernels", "own-code", str(tmp_path / "none.o")]) == 1
    assert "mkcode kernels own-code" in capsys.readouterr().err


# two instantiations of the step kernel (`template <bool>`: the default and a variant under
# measurement): each has its own copies of the device functions, in its own section, at overlapping
# addresses
ELF2 = """
  0x11          0x100            0x100  FUNC          LOCAL   DEFAULT    -      0x1b  $_ZN2mk14mk_step_kernelILb0EEEvNS_6ParamsEi$_ZN2mk8gemv_mmaERKNS_6ParamsE
  0x12          0x180            0x100  FUNC          LOCAL   DEFAULT    -      0x1c  $_ZN2mk14mk_step_kernelILb1EEEvNS_6ParamsEi$_ZN2mk8gemv_mmaERKNS_6ParamsE
  0x24                0          0x400  FUNC          GLOBAL  DEFAULT    ENTRY  0x1b  _ZN2mk14mk_step_kernelILb1EEEvNS_6ParamsEi
  0x25                0          0x400  FUNC          GLOBAL  DEFAULT    ENTRY  0x1c  _ZN2mk14mk_step_kernelILb0EEEvNS_6ParamsEi
"""


def test_the_default_kernel_is_picked_among_two_instantiations():
    k0 = "_ZN2mk14mk_step_kernelILb0EEEvNS_6ParamsEi"
    assert sass_loops.default_kernel(ELF2) == k0
    assert sass_loops.parse_functions(ELF2, k0) == [(0x100, 0x200, "gemv_mma")]
    assert len(sass_loops.parse_functions(ELF2)) == 2
    text = (
        "\n\tFunction : _ZN2mk14mk_step_kernelILb1EEEvNS_6ParamsEi\n"
        + _sass([(0x100, "HMMA.16816.F32.BF16 R1, R2, R3, R1")])
        + f"\n\tFunction : {k0}\n"
        + _sass([(0x100, "LDG.E.128.CONSTANT R8, desc[UR4][R2.64]")])
        + "\n"
    )
    own = sass_loops.kernel_sass(text, k0)
    assert "LDG.E.128" in own and "HMMA" not in own
    with pytest.raises(sass_loops.CodeSizeError, match="no SASS listing"):
        sass_loops.kernel_sass(text, "_ZN2mk5other")
    with pytest.raises(sass_loops.CodeSizeError, match="no default step kernel"):
        sass_loops.default_kernel(ELF2.replace("ILb0E", "ILb2E"))


def test_own_opcodes_skip_the_device_functions_and_changes_are_counted():
    text = _sass(
        [
            (0x000, "IADD3 R1, R1, 0x1, RZ"),  # the kernel's own code
            (0x010, "@P0 BRA 0x40"),
            (0x100, "HMMA.16816.F32.BF16 R20, R8, R12, R20"),  # gemv_mma (0x100-0x200): skipped
            (0x3F0, "EXIT"),
        ]
    )
    funcs = sass_loops.parse_functions(ELF)
    own = sass_loops.own_opcodes(text, funcs)
    assert own == ["IADD3", "BRA", "EXIT"]
    assert sass_loops.opcode_changes(own, own) == 0
    assert sass_loops.opcode_changes(own, ["IADD3", "STL", "BRA", "EXIT"]) == 1
    assert sass_loops.opcode_changes(own, ["IADD3", "MOV", "EXIT"]) == 1
