"""The conventional GPU path: chunked prefill in PyTorch (SDPA + grouped GEMM) and the `graph`
decode backend (Triton per-op kernels captured in CUDA graphs per batch-size bucket).

Every Triton kernel here has a PyTorch twin with the same contract (`*_torch`): it is the CPU
fallback, the oracle the kernels are tested against, and the readable statement of what the
kernel computes.
"""
