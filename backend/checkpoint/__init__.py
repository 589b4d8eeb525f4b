"""Checkpoints: loading Hugging Face `cohere2_moe` directories, and writing synthetic ones.

- `load_checkpoint(path, device, dtype)` -> `LoadedCheckpoint` (config + canonical weights).
- `synth_checkpoint(size, out_dir, seed)` writes a complete synthetic HF directory.
- `synthetic_model_on_device(...)` gives config + weights + tokenizer without disk.
- `testing.tiny_checkpoint(tmp_dir)` is the cached tiny checkpoint other test suites use.
"""

from mkcode.backend.checkpoint.errors import CheckpointConfigError, CheckpointError
from mkcode.backend.checkpoint.loader import (
    LoadedCheckpoint,
    load_checkpoint,
    load_state_dict,
    plan_checkpoint,
    read_config,
)
from mkcode.backend.checkpoint.stats import ParamCounts, param_counts
from mkcode.backend.checkpoint.synth import (
    SyntheticModel,
    synth_checkpoint,
    synthetic_model_on_device,
    synthetic_weights,
)

__all__ = [
    "CheckpointConfigError",
    "CheckpointError",
    "LoadedCheckpoint",
    "ParamCounts",
    "SyntheticModel",
    "load_checkpoint",
    "load_state_dict",
    "param_counts",
    "plan_checkpoint",
    "read_config",
    "synth_checkpoint",
    "synthetic_model_on_device",
    "synthetic_weights",
]
