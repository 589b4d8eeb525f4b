"""mkcode.backend.demo: a tiny North Mini Code checkpoint that speaks cmd4 tool calls, shipped with the package.

`ensure_demo_model()` returns the shipped checkpoint directory (`checkpoint/`) after verifying its
checksums; nothing is trained at run time. `train_demo_model(out_dir)` (or `python -m
mkcode.backend.demo.trainer --out DIR`) retrains one. The dialogues it learns from come from
`dialogues.py`, the differentiable forward is in `forward.py`, the held-out measure in `evaluate.py`.
"""

from mkcode.backend.demo.shipped import DemoModelError, shipped_demo_model, verify_checkpoint
from mkcode.backend.demo.trainer import DemoTrainConfig, ensure_demo_model, train_demo_model

__all__ = [
    "DemoModelError",
    "DemoTrainConfig",
    "ensure_demo_model",
    "shipped_demo_model",
    "train_demo_model",
    "verify_checkpoint",
]
