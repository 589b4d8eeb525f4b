"""Benchmarks (`mkcode bench ...`): synthetic inputs made on the GPU (no disk), bytes-per-step
accounting against speed-of-light, decode and prefill timing, and the report (JSON + PNG)."""
