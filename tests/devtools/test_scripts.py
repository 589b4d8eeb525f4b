"""The devtools scripts that run without a GPU, run small; the GPU ones refuse clearly without one."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

DEVTOOLS = Path(__file__).resolve().parents[2] / "devtools"


def test_host_overhead_times_the_engine_step(capsys):
    from devtools.bench import host_overhead

    assert host_overhead.main(["--batch", "2", "--ctx", "64", "--steps", "3"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.match(
        r"BS=2 ctx=64 L=(\d+): ([\d.]+) ms/step on the host, of which ([\d.]+) ms is the CPU argmax", line
    )
    assert m, line
    from mkcode.backend.model.config import north_mini_code_config

    assert int(m.group(1)) == north_mini_code_config().num_hidden_layers
    assert float(m.group(2)) > 0 and float(m.group(3)) > 0


def test_bench_load_reports_every_variant(tmp_path, capsys):
    from devtools.checkpoint import bench_load

    out = tmp_path / "ckpt"
    args = ["--out", str(out), "--device", "cpu", "--hidden", "64", "--experts", "4", "--layers", "2"]
    assert bench_load.main([*args, "--repeat", "1", "--shard-mb", "1"]) == 0
    text = capsys.readouterr().out
    files = sorted(out.glob("*.safetensors"))
    assert len(files) > 1  # 1 MB shards: the checkpoint is sharded
    assert f"in {len(files)} files" in text
    for label in ("warm-up", "warm cache, staged #0", "warm cache, plain copy_", "to float32", "reference"):
        assert label in text, label
    # The script swaps the loader's staging and prefetch for its variants; it must put them back.
    from mkcode.backend.checkpoint import loader, transfer

    assert transfer.STAGED is True
    assert loader._prefetch.__name__ == "_prefetch"


def test_moe_phase_refuses_without_a_gpu():
    import torch

    from devtools.bench import moe_phase

    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without a GPU")

    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        moe_phase.main(["--batch", "1"])


@pytest.mark.parametrize("script", sorted(p.name for p in DEVTOOLS.rglob("*.sh")))
def test_shell_scripts_parse(script):
    path = next(DEVTOOLS.rglob(script))
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
