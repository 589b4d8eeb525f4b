"""North Mini Code (HF `cohere2_moe`): config, weights layout and the plain-PyTorch reference."""
