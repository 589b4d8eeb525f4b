"""Multi-GPU decode and prefill: tensor parallelism (attention heads, dense MLP, LM head) and expert
parallelism (routed experts) over torch.distributed. See docs/SCALING.md for the design."""
