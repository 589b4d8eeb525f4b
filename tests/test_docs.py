"""docs/ describes the system as it is: short design documents, no lab notebook in docs or code.

docs/ stays under 1,500 lines in total and each document under 400; no heading is a dated
experiment entry; neither the docs nor the code speak of work sessions ("session 12") or point to
a design map outside the repository ("DESIGN" followed by a section sign)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SELF = Path(__file__).resolve()  # its own examples of what it forbids
ROOT = SELF.parents[1]
DOCS = ROOT / "docs"
CODE_DIRS = ("app", "backend", "tools", "tests", "csrc", "devtools", ".ci")
CODE_SUFFIXES = {".py", ".cu", ".cuh", ".h", ".sh", ".toml", ".md", ".jinja", ""}
ROOT_FILES = ("pyproject.toml", "README.md", "setup.py")

MAX_TOTAL_LINES = 1500
MAX_DOC_LINES = 400

SESSION = re.compile(r"\bsessions?" + r"[ -]?\d", re.IGNORECASE)
DESIGN_REF = re.compile("DESIGN" + r"\s*" + "\u00a7")
DATED_HEADING = re.compile(r"^#{1,6} .*(\b20\d\d-\d\d-\d\d\b|\bsession\b)", re.IGNORECASE)


def doc_files() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if p.is_file())


def code_files() -> list[Path]:
    out = [ROOT / name for name in ROOT_FILES if (ROOT / name).is_file()]
    for d in CODE_DIRS:
        base = ROOT / d
        if not base.is_dir():
            continue
        for p in base.rglob("*"):
            if p.is_file() and p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts and p != SELF:
                out.append(p)
    return sorted(out)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def test_docs_exist() -> None:
    names = {p.name for p in doc_files()}
    for name in (
        "ENGINE.md",
        "MEGAKERNEL.md",
        "AGENT.md",
        "SERVER.md",
        "SCALING.md",
        "PERF.md",
        "SECURITY.md",
    ):
        assert name in names, f"docs/{name} is missing"


def test_docs_total_under_limit() -> None:
    total = sum(len(lines(p)) for p in doc_files())
    assert total < MAX_TOTAL_LINES, f"docs/ has {total} lines (limit {MAX_TOTAL_LINES})"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_each_doc_under_limit(path: Path) -> None:
    n = len(lines(path))
    assert n < MAX_DOC_LINES, f"{path.relative_to(ROOT)} has {n} lines (limit {MAX_DOC_LINES})"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_no_dated_experiment_headings(path: Path) -> None:
    bad = [f"{i}: {line}" for i, line in enumerate(lines(path), 1) if DATED_HEADING.search(line)]
    assert not bad, f"{path.relative_to(ROOT)}: dated or per-session headings:\n" + "\n".join(bad)


def test_no_session_references_in_docs_or_code() -> None:
    bad = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in doc_files() + code_files()
        for i, line in enumerate(lines(p), 1)
        if SESSION.search(line)
    ]
    assert not bad, "work-session references (say what is true now, with a date if it was measured):\n" + (
        "\n".join(bad[:50])
    )


def test_no_design_map_references_in_code() -> None:
    bad = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in code_files() + doc_files()
        for i, line in enumerate(lines(p), 1)
        if DESIGN_REF.search(line)
    ]
    assert not bad, "references to a design map outside the repository (point to docs/ instead):\n" + (
        "\n".join(bad[:50])
    )


def test_patterns_catch_what_they_are_for() -> None:
    assert SESSION.search("measured in " + "session 14") and SESSION.search("Sessions " + "3-6")
    assert SESSION.search("docs/perf/" + "session21-x.json")
    assert not SESSION.search("the session is saved") and not SESSION.search("PromptSession(")
    assert DESIGN_REF.search("(DESIGN " + "\u00a74)")
    assert DATED_HEADING.search("## Megakernel, 2026-11-29, H200")
    assert DATED_HEADING.search("## " + "Session" + " 3: v5")
    assert not DATED_HEADING.search("## Speed of light")
    assert not DATED_HEADING.search("| 2026-12-02 | H200 | 1 |")
