"""The built wheel holds what the product reads at run time (kernel sources, chat template, demo
checkpoint) and none of the lab tooling; installed into a fresh venv, it compiles the megakernel and
loads the demo model from its own files."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.packaging.wheel_build import REPO, build_wheel, clean_env, install_wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def test_wheel_ships_the_kernel_sources_template_and_demo_checkpoint(wheel):
    names = _names(wheel)
    kernel_sources = [p.name for p in (REPO / "csrc").iterdir() if p.suffix in (".cu", ".cuh", ".h", ".hpp")]
    assert "mk_kernel.cu" in kernel_sources and "mk_module.cu" in kernel_sources
    for name in kernel_sources:
        assert f"mkcode/csrc/{name}" in names, name
    assert "mkcode/backend/chat/cmd4_template.jinja" in names
    checkpoint = REPO / "backend" / "demo" / "checkpoint"
    shipped = sorted(p.name for p in checkpoint.iterdir() if p.is_file())
    assert "model.safetensors" in shipped and "SHA256SUMS" in shipped
    for name in shipped:
        assert f"mkcode/backend/demo/checkpoint/{name}" in names, name


def test_wheel_leaves_out_lab_tooling(wheel):
    names = _names(wheel)
    assert not [n for n in names if n.endswith(".sh")]
    assert not [n for n in names if n.startswith("mkcode/csrc/probes/")]
    assert not [n for n in names if n.startswith(("devtools/", "tests/", "mkcode/devtools/"))]
    # Every top-level entry is the package or its metadata.
    top = {n.split("/")[0] for n in names}
    assert len(top) == 2 and "mkcode" in top
    assert next(t for t in top if t != "mkcode").endswith(".dist-info")


def test_every_import_in_the_wheel_resolves_inside_it(wheel):
    """No shipped module imports a module the wheel leaves out (the megakernel's lab modules,
    devtools, tests), at the top or inside a function."""
    with zipfile.ZipFile(wheel) as z:
        sources = {n: z.read(n).decode() for n in z.namelist() if n.endswith(".py")}
    modules = {n[: -len(".py")].replace("/", ".").removesuffix(".__init__") for n in sources}
    assert "mkcode.backend.megakernel.backend" in modules and "mkcode.backend.megakernel.build" in modules
    for lab in ("emulator", "emulator_ops", "gpu_check", "timeline", "sass_issue"):
        assert f"mkcode.backend.megakernel.{lab}" not in modules, lab
    unresolved = []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] if node.module != "mkcode" else []
                # `from pkg import name`: name is a submodule or an attribute of pkg.
                targets += [
                    f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                top = target.split(".")[0]
                if top in ("tests", "devtools") or (top == "mkcode" and target not in modules):
                    unresolved.append(f"{name}: {target}")
    assert not unresolved, unresolved


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to compile the kernel for sm_90a")
def test_installed_wheel_builds_the_kernel_and_loads_the_demo_model(wheel, tmp_path):
    python = install_wheel(wheel, tmp_path / "venv")
    mkcode = python.parent / "mkcode"
    env = clean_env(tmp_path / "home")
    site = python.parents[1]

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)

    # The package, its kernel sources and the demo checkpoint all come from the venv, not this checkout.
    probe = run(
        str(python),
        "-c",
        "import json, mkcode.app.cli as c, mkcode.backend.megakernel.abi as a, mkcode.backend.demo.shipped as d;"
        "print(json.dumps([c.__file__, str(a.CSRC), str(d.SHIPPED_DIR)]))",
    )
    assert probe.returncode == 0, probe.stderr
    for path in json.loads(probe.stdout):
        assert Path(path).is_relative_to(site), path
    assert run(str(python), "-c", "import devtools").returncode != 0

    build = run(str(mkcode), "kernels", "build", "--compile-only", timeout=500)
    assert build.returncode == 0, build.stdout + build.stderr
    objects = list((tmp_path / "home" / ".cache" / "mkcode" / "kernels").glob("*/mk_kernel.o"))
    assert len(objects) == 1 and objects[0].stat().st_size > 0
    assert str(objects[0]) in build.stdout

    where = run(str(mkcode), "demo-model")
    assert where.returncode == 0, where.stderr
    checkpoint = Path(where.stdout.strip())
    assert checkpoint.is_relative_to(site) and (checkpoint / "model.safetensors").is_file()
    gen = run(
        str(mkcode),
        "generate",
        "--model",
        str(checkpoint),
        "--chat",
        "list the files",
        "--max-tokens",
        "4",
        "--device",
        "cpu",
        "--json",
    )
    assert gen.returncode == 0, gen.stderr
    out = json.loads(gen.stdout)
    assert out["usage"]["completion_tokens"] == 4 and len(out["token_ids"]) == 4
