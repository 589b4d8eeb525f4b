"""Parameter counts of a config: total, and active per token (what a decode step must read).

Active counts every attention, norm, dense-MLP and router parameter, `num_experts_per_tok` of the
experts of each sparse layer, and the LM head (once, also when tied to the embedding); the
embedding lookup itself is not counted. North Mini Code: 30.5B total, 3.3B active (docs/ENGINE.md, Model).
"""

from __future__ import annotations

from dataclasses import dataclass

from mkcode.backend.model.config import ModelConfig


@dataclass(frozen=True)
class ParamCounts:
    total: int
    active: int
    embedding: int
    attention: int
    dense_mlp: int
    router: int
    experts: int  # all routed experts
    norms: int


def param_counts(cfg: ModelConfig) -> ParamCounts:
    H, V = cfg.hidden_size, cfg.vocab_size
    attn = cfg.num_hidden_layers * (2 * cfg.q_width * H + 2 * cfg.kv_width * H)
    n_dense = len(cfg.dense_layers)
    n_sparse = cfg.num_hidden_layers - n_dense
    dense = n_dense * 3 * cfg.prefix_dense_intermediate_size * H
    router = n_sparse * cfg.num_experts * H
    per_expert = 3 * cfg.intermediate_size * H
    experts = n_sparse * cfg.num_experts * per_expert
    norms = (cfg.num_hidden_layers + 1) * H
    embed = V * H
    head = 0 if cfg.tie_word_embeddings else V * H
    total = embed + head + attn + dense + router + experts + norms
    active = V * H + attn + dense + router + n_sparse * cfg.num_experts_per_tok * per_expert + norms
    return ParamCounts(
        total=total,
        active=active,
        embedding=embed,
        attention=attn,
        dense_mlp=dense,
        router=router,
        experts=experts,
        norms=norms,
    )
