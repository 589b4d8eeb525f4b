"""mkcode.backend.demo: a tiny North Mini Code checkpoint trained on the CPU to speak cmd4 tool calls.

`ensure_demo_model()` returns the cached checkpoint directory (training it the first time, a few
minutes on two cores); `train_demo_model(out_dir)` trains one into a chosen directory. The dialogues
it learns from come from `dialogues.py`; the differentiable forward is in `forward.py`.
"""

from mkcode.backend.demo.trainer import DemoTrainConfig, demo_cache_dir, ensure_demo_model, train_demo_model

__all__ = ["DemoTrainConfig", "demo_cache_dir", "ensure_demo_model", "train_demo_model"]
