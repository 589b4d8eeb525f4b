"""Megakernel tests: tiny torch ops run fastest single-threaded (and CI has 2 cores)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _single_thread_torch():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_configure(config):
    config.addinivalue_line("markers", "compile: compiles csrc/ with nvcc (the CI compile check; no GPU)")
