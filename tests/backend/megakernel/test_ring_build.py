"""Engine v2's weight ring (csrc/mk_ring.cuh) as a build-time switch: MKCODE_MK_RING=1 compiles it
into the kernel object (its own cache key), unset the object has none of its code; the ring kernel
compiles for sm_90a with ptxas's figures for its functions (the CI compile check, no GPU)."""

from __future__ import annotations

import re

import pytest

from mkcode.backend.megakernel import abi, build

RING_FUNCS = ("gemv_ring", "ring_issue", "ring_arm", "gemv_ring_op", "ring_slice_op")


def test_kernel_flags_follow_the_environment(monkeypatch):
    monkeypatch.delenv(build.RING_ENV, raising=False)
    assert "-DMK_RING=1" not in build.kernel_flags()
    monkeypatch.setenv(build.RING_ENV, "0")
    assert "-DMK_RING=1" not in build.kernel_flags()
    monkeypatch.setenv(build.RING_ENV, "1")
    assert build.kernel_flags() == [*build.KERNEL_FLAGS, "-DMK_RING=1"]


@pytest.mark.skipif(bool(build.missing_requirements()), reason="needs nvcc")
def test_the_ring_kernel_has_its_own_cache_key(monkeypatch):
    nvcc = build.find_nvcc()
    monkeypatch.delenv(build.RING_ENV, raising=False)
    plain = build._keys(nvcc)
    monkeypatch.setenv(build.RING_ENV, "1")
    ring = build._keys(nvcc)
    assert ring[0] != plain[0] and ring[2] != plain[2]  # kernel object and extension differ
    assert ring[1] == plain[1]  # the binding is host code: one object for both


def test_ring_mode_is_a_free_prefetch_bit():
    bits = [
        v
        for k, v in vars(abi).items()
        if k.startswith(("MK_MODE_", "MK_PREFETCH_")) and k != "MK_PREFETCH_DEFAULT"
    ]
    assert abi.MK_MODE_RING == 8 and bits.count(abi.MK_MODE_RING) == 1
    # its variants, measured equal and removed: 4096 MK_MODE_RING_BULK_ACT, 8192 MK_MODE_RING_AHEAD
    for name, bit in (("MK_MODE_RING_BULK_ACT", 4096), ("MK_MODE_RING_AHEAD", 8192)):
        assert not hasattr(abi, name) and bit not in bits
    assert abi.MK_ERR_RING_STAGES < abi.MK_ERR_WORDS


def _ptxas_functions(log: str) -> dict[str, tuple[int, int, int]]:
    """ptxas -v: demangled-enough function name -> (stack frame, spill stores, spill loads) bytes."""
    rows = re.findall(
        r"Function properties for (\S+)\n\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
        log,
    )
    return {name: (int(a), int(b), int(c)) for name, a, b, c in rows}


def _named(funcs: dict, short: str) -> list[tuple[int, int, int]]:
    return [v for k, v in funcs.items() if re.search(rf"\d{short}E", k)]


@pytest.mark.compile
@pytest.mark.skipif(bool(build.missing_requirements()), reason="needs nvcc, pybind11 and Python headers")
def test_the_ring_kernel_compiles_and_the_default_has_none_of_it(monkeypatch, tmp_path):
    """Both objects compile; ptxas lists the ring's functions in the ring object only, without a stack
    frame (their loops keep the ring state and the accumulators in registers)."""
    monkeypatch.setenv("MKCODE_KERNEL_CACHE", str(tmp_path))
    logs = {}
    for env in ("0", "1"):
        monkeypatch.setenv(build.RING_ENV, env)
        logs[env] = _ptxas_functions(build.build(compile_only=True).log)
    for f in RING_FUNCS:
        assert not _named(logs["0"], f), f"{f} in the default kernel object"
        found = _named(logs["1"], f)
        assert found, f"{f} missing from the ring kernel object"
        assert all(frame == 0 for frame, _, _ in found), f"{f}: stack frame {found}"
