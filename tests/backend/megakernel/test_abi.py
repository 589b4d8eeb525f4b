"""The ABI header is the one source of truth: Python parses it, and the parse must be coherent and
agree with what the emulator and the CUDA kernel implement."""

from __future__ import annotations

import pytest

from mkcode.backend.megakernel import abi
from mkcode.backend.megakernel.emulator_ops import OpSemantics


def test_header_parses_into_constants():
    a = abi.load()
    assert a.constants["MK_DESC_WORDS"] == 32
    assert a.constants["MK_DESC_WORDS"] == abi.MK_DESC_WORDS
    assert abi.OPCODES["QKV"] == a.enums["MkOpcode"]["MK_OP_QKV"]
    assert "desc" in abi.PARAM_PTRS and "batch" in abi.PARAM_INTS and "rms_eps" in abi.PARAM_FLOATS


# opcode numbers of removed ops: never reused (mk_abi.h)
RESERVED_OPCODES = {12: "ADD_NORM, removed in ABI 31", 14: "SAMPLE, removed in ABI 36"}


def test_opcodes_are_dense_and_unique():
    values = sorted(abi.OPCODES.values())
    assert len(set(values)) == len(values)
    assert sorted([*values, *RESERVED_OPCODES]) == list(range(abi.MK_OP_COUNT))
    assert "12 is reserved" in abi.HEADER.read_text() and "14 is reserved" in abi.HEADER.read_text()


def test_descriptor_fields_fit_and_do_not_overlap():
    f = {k: v for k, v in abi.load().enums["MkField"].items()}
    words: dict[int, str] = {}

    def claim(start: int, n: int, name: str) -> None:
        for w in range(start, start + n):
            assert w not in words, f"{name} overlaps {words[w]} at word {w}"
            words[w] = name

    for name in (
        "MK_F_OP",
        "MK_F_LAYER",
        "MK_F_A0",
        "MK_F_A1",
        "MK_F_A2",
        "MK_F_A3",
        "MK_F_A4",
        "MK_F_NWAIT",
        "MK_F_NSIG",
        "MK_F_SIG_AMOUNT",
        "MK_F_ID",
        "MK_F_NTOK",
    ):
        claim(f[name], 1, name)
    claim(f["MK_F_WAIT0"], 2 * abi.MK_MAX_WAITS, "waits")
    claim(f["MK_F_SIG0"], abi.MK_MAX_SIGNALS, "signals")
    claim(f["MK_F_SLOT0"], abi.MK_MAX_TOKENS, "slots")
    assert f["MK_F_SLOT0"] + abi.MK_MAX_TOKENS <= f["MK_F_END"] <= abi.MK_DESC_WORDS
    assert max(words) < abi.MK_DESC_WORDS


def test_parser_rejects_duplicates_and_missing_lists():
    text = abi.HEADER.read_text()
    with pytest.raises(ValueError, match="twice"):
        abi.parse_header(text + "\n#define MK_DESC_WORDS 32\n")
    with pytest.raises(ValueError, match="MK_PARAM_FLOATS"):
        abi.parse_header(text.replace("#define MK_PARAM_FLOATS(X)", "#define MK_PARAM_FLOATX(X)"))


def test_emulator_implements_every_opcode():
    for name in abi.OPCODES:
        assert hasattr(OpSemantics, "op_" + name.lower()), f"emulator lacks {name}"
