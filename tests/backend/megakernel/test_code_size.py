"""`mkcode kernels sizes`: the SASS bytes per device function, parsed from `cuobjdump -elf`."""

from __future__ import annotations

import pytest

from mkcode.backend.megakernel import code_size

# an excerpt of `cuobjdump -elf` on the kernel object (symtab rows as the tool prints them)
SYMTAB = """
.section .symtab
   0xf          0x55c00           0x5c30  FUNC          LOCAL   DEFAULT    -                                   0x11  $_ZN2mk14mk_step_kernelENS_6ParamsEi$_ZN2mk8op_oprojERKNS_6ParamsEPKiRNS_4SmemE
  0x11          0x64450           0x1ee0  FUNC          LOCAL   DEFAULT    -                                   0x11  $_ZN2mk14mk_step_kernelENS_6ParamsEi$_ZN2mk15attn_prologue_tILi128EEEvRKNS_6ParamsEPKiRNS_4SmemE
  0x1b          0x87ef0            0x540  FUNC          WEAK    DEFAULT    -                                   0x17  $__internal_0_$__cuda_sm20_div_s64
   0x3                0                0  SECTION       LOCAL   DEFAULT    -                                   0x17  .text._ZN2mk14mk_step_kernelENS_6ParamsEi
  0x24                0          0x10000  FUNC          GLOBAL  DEFAULT    ENTRY                               0x17  _ZN2mk14mk_step_kernelENS_6ParamsEi
"""


def test_symtab_sizes_and_names():
    sizes = code_size.parse_symtab(SYMTAB)
    by = {f.name: f.size for f in sizes}
    assert by["op_oproj"] == 0x5C30
    assert by["attn_prologue_t<128>"] == 0x1EE0
    assert by["__cuda_sm20_div_s64"] == 0x540
    # the entry spans the section: its own code is the rest
    assert by["mk_step_kernel (dispatch + inlined ops)"] == 0x10000 - 0x5C30 - 0x1EE0 - 0x540
    assert [f.size for f in sizes] == sorted((f.size for f in sizes), reverse=True)
    assert sum(by.values()) == 0x10000


def test_template_instances_keep_every_integer_argument():
    """Two instances that differ in a second argument (gemv_down_acc<KP, GB>) get two names."""
    name = "$_ZN2mk14mk_step_kernelENS_6ParamsEi$_ZN2mk13gemv_down_accILi4ELi2EEEvPKS0_"
    assert code_size.short_name(name) == "gemv_down_acc<4, 2>"
    assert code_size.short_name(name.replace("ELi2EE", "ELi1EE")) == "gemv_down_acc<4, 1>"


def test_missing_cuobjdump_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(code_size, "find_cuobjdump", lambda: None)
    with pytest.raises(code_size.CodeSizeError, match="cuobjdump not found"):
        code_size.function_sizes(tmp_path / "mk_kernel.o")


def test_a_failing_tool_is_reported(tmp_path):
    tool = tmp_path / "cuobjdump"
    tool.write_text("#!/bin/sh\necho 'not an ELF file' >&2\nexit 1\n")
    tool.chmod(0o755)
    with pytest.raises(code_size.CodeSizeError, match="not an ELF"):
        code_size.function_sizes(tmp_path / "x.o", cuobjdump=str(tool))
    empty = tmp_path / "empty"
    empty.write_text("#!/bin/sh\necho nothing\n")
    empty.chmod(0o755)
    with pytest.raises(code_size.CodeSizeError, match="no function symbols"):
        code_size.function_sizes(tmp_path / "x.o", cuobjdump=str(empty))
