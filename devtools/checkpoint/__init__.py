"""Checkpoint tooling for measurements (load speed)."""
