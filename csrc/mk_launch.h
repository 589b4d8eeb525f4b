// mk_launch.h: the host API of the kernel translation unit (mk_kernel.cu), used by the binding.
// Kept free of device code so the binding compiles fast and the kernel object is Python-agnostic.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

#include "mk_params.h"

namespace mk {

constexpr int kThreads = 512;  // must equal NT in mk_device.cuh (checked there)

// Dynamic shared memory the kernel needs for these parameters.
size_t smem_bytes(const Params& p, int max_k);

// Launch one step (one block per SM, grid = p.n_sms). Checks residency; returns the CUDA error and
// writes a message into `msg` (capacity `cap`) when something is wrong.
cudaError_t launch_step(const Params& p, int max_k, cudaStream_t stream, char* msg, size_t cap);

}  // namespace mk
