"""Shared fixtures: cached tiny synthetic checkpoints (helpers.py writes broken variants)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backend.checkpoint.tiny import tiny_checkpoint


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def tiny_dir(ckpt_root: Path) -> Path:
    """The tiny checkpoint, fused experts, seed 0 (read-only)."""
    return tiny_checkpoint(ckpt_root, seed=0)


@pytest.fixture(scope="session")
def tiny_per_expert_dir(ckpt_root: Path) -> Path:
    """The tiny checkpoint with experts stored per expert, seed 0 (read-only)."""
    return tiny_checkpoint(ckpt_root, seed=0, experts_layout="per_expert")
