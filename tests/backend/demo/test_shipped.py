"""The demo checkpoint ships with the package: it loads, it matches its checksums (an altered file is
refused), nothing trains at run time, its context holds long agent prompts, and the wheel carries it."""

from __future__ import annotations

import random
import re
import shutil
import time
import zipfile
from pathlib import Path

import pytest
import torch

from mkcode.backend.demo import DemoModelError, ensure_demo_model, shipped_demo_model, verify_checkpoint
from mkcode.backend.demo.shipped import CHECKSUMS, REQUIRED_FILES, SHIPPED_DIR, demo_model_version


def test_shipped_checkpoint_loads_and_matches_its_checksums(demo_model: Path) -> None:
    from mkcode.backend.chat.tokenizer import ChatTokenizer
    from mkcode.backend.checkpoint.loader import load_checkpoint

    assert demo_model == SHIPPED_DIR
    sums = verify_checkpoint(demo_model)
    assert set(REQUIRED_FILES) <= set(sums)
    assert demo_model_version() not in ("", "unversioned")
    t0 = time.monotonic()
    ck = load_checkpoint(demo_model, device="cpu", dtype=torch.float32, progress=False)
    ChatTokenizer(demo_model)
    assert time.monotonic() - t0 < 5  # ~0.2 s on an idle core; generous for a busy CI machine
    assert ck.config.max_position_embeddings >= 32768
    size = sum(f.stat().st_size for f in demo_model.iterdir())
    assert size < 25 << 20, f"the shipped checkpoint grew to {size} bytes"


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    shutil.copytree(SHIPPED_DIR, d)
    return d


def test_a_modified_weight_file_is_refused(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    verify_checkpoint(d)  # the copy itself is fine
    weights = d / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(DemoModelError, match=r"model\.safetensors does not match its checksum"):
        shipped_demo_model(d)


@pytest.mark.parametrize("name", ["tokenizer_config.json", "config.json"])
def test_a_modified_config_or_template_is_refused(tmp_path: Path, name: str) -> None:
    d = _copy(tmp_path)
    (d / name).write_text((d / name).read_text().replace("}", " }", 1))
    with pytest.raises(DemoModelError, match=re.escape(f"{name} does not match its checksum")):
        shipped_demo_model(d)


def test_missing_file_or_checksum_entry_is_refused(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    (d / "tokenizer.json").unlink()
    with pytest.raises(DemoModelError, match=r"tokenizer\.json is missing"):
        shipped_demo_model(d)
    d = _copy(tmp_path / "b")
    sums = (d / CHECKSUMS).read_text().splitlines()
    (d / CHECKSUMS).write_text(
        "\n".join(line for line in sums if not line.endswith("model.safetensors")) + "\n"
    )
    with pytest.raises(DemoModelError, match=r"does not cover model\.safetensors"):
        shipped_demo_model(d)
    (d / CHECKSUMS).unlink()
    with pytest.raises(DemoModelError, match="no SHA256SUMS"):
        shipped_demo_model(d)


def test_ensure_demo_model_returns_the_shipped_copy_and_never_trains(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import mkcode.backend.demo.trainer as trainer

    def no_training(*_a: object, **_k: object) -> None:
        raise AssertionError("ensure_demo_model trained")

    monkeypatch.setattr(trainer, "train_demo_model", no_training)
    monkeypatch.setattr(trainer, "_train", no_training)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    seen: list[str] = []
    t0 = time.monotonic()
    assert ensure_demo_model(progress=seen.append) == SHIPPED_DIR
    assert time.monotonic() - t0 < 2
    assert seen and "checksums verified" in seen[0]
    assert list(tmp_path.iterdir()) == []  # no cache written


def test_ensure_demo_model_refuses_a_damaged_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import mkcode.backend.demo.shipped as shipped

    d = _copy(tmp_path)
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    monkeypatch.setattr(shipped, "SHIPPED_DIR", d)
    with pytest.raises(DemoModelError, match=r"does not match its checksum.*Reinstall"):
        ensure_demo_model()


def test_the_template_renders_a_10k_token_system_prompt_within_the_context(demo_model: Path) -> None:
    from mkcode.backend.chat.tokenizer import ChatTokenizer
    from mkcode.backend.demo.evaluate import long_system_prompt
    from mkcode.backend.demo.trainer import _tool_schemas
    from mkcode.backend.model.config import ModelConfig

    tok = ChatTokenizer(demo_model)
    system = long_system_prompt(random.Random(0), tok, 10_400)
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "List the files."}]
    ids = tok.apply_chat_template(msgs, _tool_schemas(), add_generation_prompt=True)
    assert 12_000 < len(ids) < 32_768
    assert tok.decode(ids).count("## Section") == system.count("## Section")  # nothing cut
    assert ModelConfig.from_file(demo_model).max_position_embeddings >= len(ids)


def test_demo_model_command_prints_and_copies_the_shipped_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mkcode.app.cli import main

    assert main(["demo-model", "-q"]) == 0
    assert capsys.readouterr().out.strip() == str(SHIPPED_DIR)
    out = tmp_path / "demo"
    assert main(["demo-model", "--out", str(out), "-q"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    verify_checkpoint(out)
    assert main(["demo-model", "--out", str(out), "-q"]) == 2  # exists, no --force
    assert main(["demo-model", "--out", str(out), "-q", "--force"]) == 0
    assert main(["demo-model", "--train", "-q"]) == 2  # --train needs --out


def test_the_wheel_carries_the_checkpoint(tmp_path: Path) -> None:
    from tests.packaging.wheel_build import build_wheel

    wheel = build_wheel(tmp_path)  # from a copy of the tree: the build writes no build/ into it
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in (*REQUIRED_FILES, CHECKSUMS, "VERSION"):
        assert f"mkcode/backend/demo/checkpoint/{f}" in names, f
