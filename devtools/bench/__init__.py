"""Benchmark scripts that `mkcode bench` does not run (profiles, phase timings, host overhead)."""
