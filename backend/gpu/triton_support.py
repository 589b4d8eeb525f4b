"""Whether Triton kernels can run here, and the one switch the kernels need for the interpreter.

`TRITON_INTERPRET=1` runs kernels on the CPU (numpy); its bf16 `tl.dot` is wrong (numpy has no
bf16), so kernels upcast dot operands to fp32 when `DOT_F32` is set. On a GPU it is False and the
branch is compiled out.
"""

from __future__ import annotations

import importlib.util
import os

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DOT_F32 = INTERPRET
HAVE_TRITON = importlib.util.find_spec("triton") is not None


def triton_usable(device_type: str) -> bool:
    """Triton kernels run on CUDA tensors, or on CPU tensors under the interpreter."""
    return HAVE_TRITON and (device_type == "cuda" or INTERPRET)


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p
