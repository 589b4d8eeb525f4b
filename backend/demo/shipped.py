"""The demo checkpoint that ships inside the package: where it is, which version, and its checksums.

`backend/demo/checkpoint/` holds a normal HF checkpoint directory (config, bf16 safetensors and
index, tokenizer files with the chat template) plus `VERSION` and `SHA256SUMS` (the format of
`sha256sum`, so `sha256sum -c SHA256SUMS` checks it too). `shipped_demo_model()` returns that
directory after checking every listed file against its checksum; nothing is trained or downloaded.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoint"
CHECKSUMS = "SHA256SUMS"
VERSION_FILE = "VERSION"
# What a checkpoint directory needs; SHA256SUMS must cover all of these.
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
RETRAIN_HINT = (
    "Reinstall mkcode to restore it, or train one with `mkcode demo-model --train --out DIR` "
    "and start with `--model DIR`."
)


class DemoModelError(RuntimeError):
    """The shipped demo checkpoint is missing, incomplete or does not match its checksums."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_checksums(directory: Path) -> dict[str, str]:
    """`SHA256SUMS` as {file name: hex digest}."""
    sums_file = directory / CHECKSUMS
    if not sums_file.is_file():
        raise DemoModelError(f"the demo model at {directory} has no {CHECKSUMS} file. {RETRAIN_HINT}")
    sums: dict[str, str] = {}
    for n, line in enumerate(sums_file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        name = name.removeprefix("*")
        if not sep or len(digest) != 64 or not name or "/" in name:
            raise DemoModelError(f"{sums_file}:{n}: not a `sha256sum` line: {line!r}. {RETRAIN_HINT}")
        sums[name] = digest.lower()
    return sums


def verify_checkpoint(directory: Path) -> dict[str, str]:
    """Check every file named in `SHA256SUMS` (which must name all of `REQUIRED_FILES`); returns the
    checksums. Raises `DemoModelError` naming the first file that is missing or altered."""
    sums = read_checksums(directory)
    unlisted = [f for f in REQUIRED_FILES if f not in sums]
    if unlisted:
        raise DemoModelError(f"{directory / CHECKSUMS} does not cover {', '.join(unlisted)}. {RETRAIN_HINT}")
    for name, want in sums.items():
        path = directory / name
        if not path.is_file():
            raise DemoModelError(f"the demo model file {path} is missing. {RETRAIN_HINT}")
        got = sha256_file(path)
        if got != want:
            raise DemoModelError(
                f"the demo model file {path} does not match its checksum (sha256 {got[:12]}…, expected "
                f"{want[:12]}…): it was modified or damaged. {RETRAIN_HINT}"
            )
    return sums


def demo_model_version(directory: Path | None = None) -> str:
    path = (directory or SHIPPED_DIR) / VERSION_FILE
    return path.read_text().strip() if path.is_file() else "unversioned"


def shipped_demo_model(directory: Path | None = None) -> Path:
    """The verified demo checkpoint directory that ships with the package."""
    directory = directory or SHIPPED_DIR
    if not (directory / "config.json").is_file():
        raise DemoModelError(
            f"the demo model is not installed (no {directory / 'config.json'}). {RETRAIN_HINT}"
        )
    verify_checkpoint(directory)
    return directory


def seal_checkpoint(directory: Path, version: str) -> None:
    """Write `VERSION` and `SHA256SUMS` (over `REQUIRED_FILES`) into a freshly written checkpoint."""
    missing = [f for f in REQUIRED_FILES if not (directory / f).is_file()]
    if missing:
        raise DemoModelError(f"cannot seal {directory}: missing {', '.join(missing)}")
    (directory / VERSION_FILE).write_text(version + "\n")
    lines = [f"{sha256_file(directory / f)}  {f}" for f in REQUIRED_FILES]
    (directory / CHECKSUMS).write_text("\n".join(lines) + "\n")
