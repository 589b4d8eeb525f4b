"""The one exception the checkpoint code raises for a checkpoint it cannot use.

Every message names the offending tensor and/or file, so a user with a broken download can see
which shard to fetch again.
"""

from __future__ import annotations

from mkcode.backend.model.config import ConfigError


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded, with the tensor and file at fault."""


class CheckpointConfigError(CheckpointError, ConfigError):
    """A missing or invalid config.json: both a `CheckpointError` and the model's `ConfigError`."""
