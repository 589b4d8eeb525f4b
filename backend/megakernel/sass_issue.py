"""Which instructions a device function compiled to, read from SASS.

`opcodes_in` counts a function's opcodes in the compiled object (`cuobjdump -sass` and `-elf`, as
sass_loops does). What it guards does not show in a test's numbers: the fused down slice's sums
must be fire-and-forget REDG, not generic ATOM plus compare-and-swap loops, which is what atomicAdd
on a float pointer not known to be global compiled to (2026-11-30).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from mkcode.backend.megakernel.code_size import CodeSizeError
from mkcode.backend.megakernel.sass_loops import _INS, object_sass, opcode


def _function_ops(sass_text: str, functions: list[tuple[int, int, str]], function: str) -> Iterator[str]:
    """The opcodes of `function`'s instructions in address order. A clear error when the function
    is not in the symbols."""
    spans = [(lo, hi) for lo, hi, name in functions if name == function]
    if not spans:
        raise CodeSizeError(f"no device function {function!r} in the object's symbols")
    lo, hi = spans[0]
    for line in sass_text.splitlines():
        m = _INS.match(line)
        if m and lo <= int(m.group(1), 16) < hi:
            yield opcode(m.group(2))


def opcodes_in(sass_text: str, functions: list[tuple[int, int, str]], function: str) -> dict[str, int]:
    """How often each opcode (with its modifiers, e.g. `REDG.E.ADD.F32.FTZ.RN.STRONG.GPU`) occurs in
    `function`'s code. A clear error when the function is not in the symbols."""
    return dict(Counter(_function_ops(sass_text, functions, function)))


def object_opcodes_in(obj: Path, function: str, cuobjdump: str | None = None) -> dict[str, int]:
    """opcodes_in on a compiled kernel object."""
    return opcodes_in(*object_sass(obj, cuobjdump), function)
