"""For every suite that needs a real checkpoint on disk (loader, engine, server, agent): a cached
tiny synthetic one.

    from tests.backend.checkpoint.tiny import tiny_checkpoint
    path = tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0)

The first call for a given (seed, overrides) writes the checkpoint into a subdirectory of the
`tmp_dir` it is given; later calls in the same process return that directory, wherever they point
`tmp_dir`, as long as it still exists. Treat it as read-only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CACHE: dict[str, Path] = {}

# Keyword arguments of `synth_checkpoint` accepted as overrides; the rest are config.json fields.
_SYNTH_KWARGS = ("experts_layout", "shard_bytes")


def tiny_checkpoint(tmp_dir: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Path of a `tiny` synthetic checkpoint for `seed`; `overrides` are config.json fields, plus
    `experts_layout` ("fused" | "per_expert") and `shard_bytes`. Cached per process."""
    key = json.dumps({"seed": seed, **overrides}, sort_keys=True, default=str)
    cached = _CACHE.get(key)
    if cached is not None and (cached / "config.json").exists():
        return cached
    from mkcode.backend.checkpoint.synth import synth_checkpoint

    kwargs = {k: overrides.pop(k) for k in _SYNTH_KWARGS if k in overrides}
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    out = Path(tmp_dir) / f"tiny-{seed}-{digest}"
    synth_checkpoint("tiny", out, seed, config_overrides=overrides or None, **kwargs)
    _CACHE[key] = out
    return out
