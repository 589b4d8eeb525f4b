"""`build_parallel_runtime` and `mkcode serve --tensor-parallel/--expert-parallel` on the CPU (gloo):
sliced checkpoint loading equals load-then-shard; two ranks through the real engine give the
single-process greedy tokens; the served HTTP API answers like single-process serving and shuts
down without leaving processes behind; bad degrees are refused with the reason."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mkcode.backend.checkpoint.loader import load_checkpoint
from mkcode.backend.parallel.loading import load_shard
from mkcode.backend.parallel.plan import PlanError, ShardPlan
from mkcode.backend.parallel.runtime import check_devices, world_degrees
from mkcode.backend.parallel.shard import shard_weights
from mkcode.backend.runtime import build_runtime
from tests.backend.checkpoint.tiny import tiny_checkpoint
from tests.backend.parallel import runtime_cases

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

SERVER_DEPS = ("fastapi", "uvicorn", "httpx")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0)


# ---- sliced loading ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [{}, {"experts_layout": "per_expert", "tie_word_embeddings": False}],
    ids=["fused", "per_expert"],
)
def test_sliced_load_equals_load_then_shard(
    tmp_path_factory: pytest.TempPathFactory, overrides: dict
) -> None:
    path = tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=1, **overrides)
    ck = load_checkpoint(path, progress=False, dtype=torch.float32)
    for world, tp, ep in [(1, 1, 1), (2, 2, 2), (2, 1, 2), (4, 4, 4), (4, 4, 1)]:
        for rank in range(world):
            plan = ShardPlan(world, rank, tp=tp, ep=ep)
            want = shard_weights(ck.config, ck.weights, plan)
            got = load_shard(path, plan, dtype=torch.float32)
            label = plan.describe()
            assert got.nbytes <= ck.nbytes, label
            for a, b in [(want.embed, got.weights.embed), (want.final_norm, got.weights.final_norm)]:
                assert torch.equal(a, b), label
            assert torch.equal(want.lm_head, got.weights.lm_head), label
            for i, (la, lb) in enumerate(zip(want.layers, got.weights.layers)):
                for key, va in vars(la).items():
                    vb = getattr(lb, key)
                    if isinstance(va, torch.Tensor):
                        assert torch.equal(va, vb), f"{label} layer {i} {key}"
                    else:
                        assert va == vb, f"{label} layer {i} {key}"


# ---- degrees and devices -------------------------------------------------------------------------


def test_degree_errors() -> None:
    assert world_degrees(2, 2) == 2
    assert world_degrees(1, 4) == 4
    assert world_degrees(4, 4, 4) == 4
    with pytest.raises(PlanError, match="must be 1 or the number of ranks"):
        world_degrees(2, 4)
    with pytest.raises(PlanError, match="launched with 4"):
        world_degrees(2, 2, 4)
    with pytest.raises(PlanError, match="both 1"):
        world_degrees(1, 1, 2)
    with pytest.raises(PlanError, match="at least 1"):
        world_degrees(0, 2)


def test_device_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_devices("cpu", 8) == "cpu"
    with pytest.raises(ValueError, match="--device cuda"):
        check_devices("cuda:1", 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_devices(None, 2) == "cuda"
    with pytest.raises(RuntimeError, match="4 ranks need 4 GPUs, but 2 are visible"):
        check_devices("cuda", 4)


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in SERVER_DEPS), reason="server deps")
def test_serve_refuses_bad_layouts(ckpt: Path, capsys: pytest.CaptureFixture) -> None:
    from mkcode.app.cli import main

    base = ["serve", "--model", str(ckpt), "--device", "cpu"]
    assert main([*base, "--tensor-parallel", "2", "--expert-parallel", "4"]) == 2
    assert "must be 1 or the number of ranks (4)" in capsys.readouterr().err
    assert main([*base, "--tensor-parallel", "3"]) == 2  # tiny: 4 q heads
    assert "not divisible by tensor-parallel 3" in capsys.readouterr().err
    assert main([*base, "--tensor-parallel", "2", "--decode", "graph"]) == 2
    assert "choose auto or torch" in capsys.readouterr().err


# ---- two ranks through the engine ----------------------------------------------------------------


def test_parallel_runtime_matches_single_process(ckpt: Path, tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rt = build_runtime(runtime_cases.options(ckpt))
        try:
            rt.engine.start()
            want = runtime_cases.generate(rt.engine)
        finally:
            rt.close()
    finally:
        torch.set_num_threads(threads)
    fork_ok = "fork" in mp.get_all_start_methods() and not torch.cuda.is_initialized()
    mp.start_processes(
        runtime_cases.run_rank,
        args=(2, _free_port(), str(ckpt), 2, 2, str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="fork" if fork_ok else "spawn",
    )
    got = torch.load(tmp_path / "parallel.pt")
    assert got["tokens"] == want + want
    assert got["steps"] > 0
    assert "tensor-parallel 2, expert-parallel 2 over 2 ranks (gloo)" in got["note"]


# ---- mkcode serve --tensor-parallel 2 --expert-parallel 2 ----------------------------------------


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[-1].split()[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - out
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


COMPLETION = {"prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0}


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in SERVER_DEPS), reason="server deps")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the ranks")
def test_serve_tensor_expert_parallel(ckpt: Path) -> None:
    from mkcode.backend.server import ServerOptions, create_app
    from mkcode.backend.server.runner import ServerThread

    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "mkcode.app.cli",
        "serve",
        "--tensor-parallel",
        "2",
        "--expert-parallel",
        "2",
    ]
    cmd += ["--device", "cpu", "--model", str(ckpt), "--port", str(port), "--served-model-name", "tiny"]
    cmd += ["--log-level", "warning"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    seen: set[int] = set()
    try:
        # while the ranks start: the single-process answer
        rt = build_runtime(runtime_cases.options(ckpt))
        try:
            with ServerThread(create_app(rt, options=ServerOptions(served_model_name="tiny"))) as s:
                want = _post(s.base_url + "/v1/completions", {"model": "tiny", **COMPLETION})
        finally:
            rt.close()
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"mkcode serve exited early:\n{proc.stdout.read()}"
            seen |= _descendants(proc.pid)
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    health = json.loads(r.read())
                break
            except OSError:
                assert time.monotonic() < deadline, "the parallel server did not come up in 90 s"
                time.sleep(0.3)
        assert health["status"] == "ok"
        got = _post(base + "/v1/completions", {"model": "tiny", **COMPLETION})
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        assert got["usage"] == want["usage"]
        assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
        seen |= _descendants(proc.pid)
        assert len(seen) >= 3, seen  # torchrun and two ranks
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C in the terminal
        rc = proc.wait(timeout=45)
        out = proc.stdout.read()
        assert rc == 0, out
        assert "stopping the ranks" in out
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in seen if _alive(p)], f"processes left behind:\n{out}"
    finally:
        for p in [proc.pid, *seen]:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        proc.wait(timeout=10)


def test_failed_step_stops_the_group() -> None:
    """A step that fails after its broadcast may leave the other ranks inside a collective: the
    model refuses later steps (and pings) instead of sending messages they would mismatch."""
    from mkcode.backend.model.weights import random_weights
    from mkcode.backend.parallel.comm import Comm
    from mkcode.backend.parallel.driver import build_parallel_model
    from mkcode.backend.parallel.step import StepInputs
    from tests.backend.engine.helpers import tiny_config

    cfg = tiny_config()
    model = build_parallel_model(cfg, random_weights(cfg, seed=0), ShardPlan(1, 0), Comm.local())
    step = StepInputs.decode(torch.tensor([3]), torch.tensor([0]), torch.zeros(cfg.num_hidden_layers, 1, 1))
    with pytest.raises(AssertionError, match="attach a KV pool"):
        model.run_step(step)  # no pool attached: fails inside the step
    with pytest.raises(RuntimeError, match="out of step"):
        model.run_step(step)
    assert model.ping() is False
