"""Start-up of one rank: the process group from torchrun's environment, the device, NCCL safety.

NVLink multicast (NVLS) stays off: on the shared hosts this project runs on it can take the GPUs
out of service (see the device notes); set here as a default so any launcher inherits it.
"""

from __future__ import annotations

import ctypes
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from mkcode.backend.parallel.comm import Comm

PR_SET_PDEATHSIG = 1

NCCL_SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def init_distributed(backend: str | None = None, timeout_s: float = 600.0) -> tuple[Comm, torch.device]:
    """Join the process group described by RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (torchrun
    sets them); NCCL with one GPU per rank (LOCAL_RANK) when CUDA is present, else gloo on the CPU."""
    for k, v in NCCL_SAFE_ENV.items():
        os.environ.setdefault(k, v)
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    backend = backend or ("nccl" if use_cuda else "gloo")
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    return Comm(), device


def set_parent_death_signal(sig: int) -> bool:
    """Linux: have the kernel send `sig` to this process when its parent exits (so a killed
    launcher leaves no ranks behind). Returns whether it was set; a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
