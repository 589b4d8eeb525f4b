"""Multi-GPU measurements (tensor/expert parallel against one GPU)."""
