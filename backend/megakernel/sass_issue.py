"""How many loads a device function issues before it first waits on one, read from SASS.

An op on the layer's chain whose loads are all independent should issue them all before its first
arithmetic on any: then they cost one L2 round trip together. On 2026-11-30 the add+norm op's loads
(its residual and every partial of its row; the op was removed in ABI 31) were each found in their
own branch, consumed before the next was issued (13 round trips in a row); later the compiler was
found starting its adds after 12 of 17 loads. Neither shows in a test's numbers, so this reads the
compiled object (`cuobjdump -sass` and `-elf`, as sass_loops does): in the function's code, in
address order, the loads of a kind that come before the first instruction of another kind.
`opcodes_in` counts a function's opcodes (the fused down slice's sums must be fire-and-forget REDG,
not generic ATOM plus compare-and-swap loops, which is what atomicAdd on a float pointer not known
to be global compiled to, 2026-11-30).
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


def loads_before_first(
    sass_text: str, functions: list[tuple[int, int, str]], function: str, load: str, use: str
) -> int:
    """Instructions whose opcode starts with `load` that lie before the first whose opcode starts
    with `use`, in `function`'s code (all of them when it has no `use`). A clear error when the
    function is not in the symbols or holds no such load."""
    n = 0
    for op in _function_ops(sass_text, functions, function):
        if op.startswith(use):
            break
        if op.startswith(load):
            n += 1
    if not n:
        raise CodeSizeError(f"{function}: no {load} before its first {use}")
    return n


def object_loads_before_first(
    obj: Path, function: str, load: str, use: str, cuobjdump: str | None = None
) -> int:
    """loads_before_first on a compiled kernel object."""
    return loads_before_first(*object_sass(obj, cuobjdump), function, load, use)


def opcodes_in(sass_text: str, functions: list[tuple[int, int, str]], function: str) -> dict[str, int]:
    """How often each opcode (with its modifiers, e.g. `REDG.E.ADD.F32.FTZ.RN.STRONG.GPU`) occurs in
    `function`'s code. A clear error when the function is not in the symbols."""
    return dict(Counter(_function_ops(sass_text, functions, function)))


def object_opcodes_in(obj: Path, function: str, cuobjdump: str | None = None) -> dict[str, int]:
    """opcodes_in on a compiled kernel object."""
    return opcodes_in(*object_sass(obj, cuobjdump), function)
