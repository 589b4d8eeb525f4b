"""Shared fixtures for megakernel tests and GPU checks: small geometries, ragged paged batches, and
the reference step over the same paged KV pool (ReferenceModel through a KVStore view of pages)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mkcode.backend.engine.decode_backend import DecodeBatch
from mkcode.backend.kv.layout import (
    NO_PAGE,
    PAGE_SIZE,
    append_and_gather,
    first_visible_position,
    pages_for,
    pool_shape,
)
from mkcode.backend.megakernel import abi
from mkcode.backend.model.config import ModelConfig, north_mini_code_config
from mkcode.backend.model.reference import ReferenceModel, Segment
from mkcode.backend.model.weights import LayerWeights, ModelWeights


def tiny_config(**overrides) -> ModelConfig:
    """6 layers, full attention at 0 and 4, window 64, dense layer 0, 8 experts top-2, hidden 64,
    4 heads / 2 kv heads of 32, vocab 512: every code path at a CPU-friendly size."""
    raw = dict(
        vocab_size=512,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=64,
        prefix_dense_intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=2,
        sliding_window=64,
        max_position_embeddings=4096,
    )
    raw.update(overrides)
    return north_mini_code_config(6, **raw)


def reduced_config(**overrides) -> ModelConfig:
    """A GPU-test geometry with the release head shapes (d=128, GQA 8:1) and kernel-sized tiles."""
    raw = dict(
        vocab_size=8192,
        hidden_size=512,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=128,
        intermediate_size=256,
        prefix_dense_intermediate_size=1024,
        num_experts=16,
        num_experts_per_tok=4,
        sliding_window=256,
    )
    raw.update(overrides)
    return north_mini_code_config(6, **raw)


class PagedKV:
    """ReferenceModel's KVStore over one sequence's block-table rows of the paged pool."""

    def __init__(self, cfg: ModelConfig, pool: torch.Tensor, tables: torch.Tensor, row: int):
        self.cfg, self.pool, self.tables, self.row = cfg, pool, tables, row

    def append(self, layer, k, v, positions):
        table = self.tables[layer, self.row]
        return append_and_gather(self.pool, table, self.cfg.window(layer), k, v, positions)


@dataclass
class PagedCase:
    batch: DecodeBatch
    contexts: list[int]


def make_case(
    cfg: ModelConfig,
    contexts: list[int],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_pages: int = 3,
    grow: int = 0,
    scatter: bool = True,
) -> PagedCase:
    """A decode batch whose row b already holds contexts[b] tokens (random K/V history, never zeros),
    pages scattered randomly over the pool (`scatter`; else each (layer, row)'s pages consecutive in
    the pool), sliding layers' pages outside the window released."""
    g = torch.Generator().manual_seed(seed)
    L, B = cfg.num_hidden_layers, len(contexts)
    P = max(pages_for(c + 1 + grow) for c in contexts)  # `grow`: room for later steps
    # the pages each (layer, row) holds: from its first visible one (a sliding layer's window only:
    # a 128K row of the release geometry needs ~3.7 GB of pool, not 12.8)
    spans = [
        (layer, b, first_visible_position(c, cfg.window(layer)) // PAGE_SIZE, pages_for(c + 1 + grow))
        for layer in range(L)
        for b, c in enumerate(contexts)
    ]
    need = sum(hi - lo for _, _, lo, hi in spans) + spare_pages
    perm = torch.randperm(need, generator=g) if scatter else torch.arange(need)
    tables = torch.full((L, B, P), NO_PAGE, dtype=torch.int32)
    k = 0
    for layer, b, lo, hi in spans:
        tables[layer, b, lo:hi] = perm[k : k + hi - lo].to(torch.int32)
        k += hi - lo
    gd = torch.Generator(device=device).manual_seed(seed)  # the pool is made where it lives (GBs at 30B)
    pool = torch.empty(pool_shape(need, cfg.num_key_value_heads, cfg.head_dim), device=device, dtype=dtype)
    pool.normal_(0.0, 0.5, generator=gd)
    tokens = torch.randint(0, cfg.vocab_size, (B,), generator=g)
    batch = DecodeBatch(
        token_ids=tokens.to(device),
        positions=torch.tensor(contexts, dtype=torch.int64, device=device),
        block_tables=tables.to(device),
        kv_pool=pool,
    )
    return PagedCase(batch, list(contexts))


class Fp32Weights:
    """An fp32 view of (bf16) weights for the reference: layers are upcast when touched, so the
    30B geometry's fp32 reference fits next to its bf16 weights."""

    def __init__(self, w: ModelWeights):
        self._w = w
        self.embed = w.embed.float()
        self.final_norm = w.final_norm.float()
        self.lm_head = self.embed if w.lm_head.data_ptr() == w.embed.data_ptr() else w.lm_head.float()
        self.layers = _LazyLayers(w.layers)
        self.device, self.dtype = w.embed.device, torch.float32


class _LazyLayers:
    def __init__(self, layers: list[LayerWeights]):
        self._layers = layers

    def __len__(self) -> int:
        return len(self._layers)

    def __getitem__(self, i: int) -> LayerWeights:
        lw = self._layers[i]
        up = {k: (None if v is None else v.float()) for k, v in vars(lw).items()}
        return LayerWeights(**up)


def kernel_routing(cfg: ModelConfig, ws, batch_size: int) -> dict[int, torch.Tensor]:
    """The expert ids [B, k] each MoE layer's ROUTE chose on the device, read off its expert table."""
    info, tab = ws["moe_info"].cpu(), ws["expert_tab"].cpu()
    K = cfg.num_experts_per_tok
    out = {}
    for layer in range(cfg.num_hidden_layers):
        if cfg.is_dense(layer):
            continue
        ids = torch.full((batch_size, K), -1, dtype=torch.long)
        for a in range(int(info[layer, 0])):
            e, n = int(tab[layer, a, 0]), int(tab[layer, a, 1])
            for j in range(n):
                slot = int(tab[layer, a, 2 + j])
                ids[slot // K, slot % K] = e
        out[layer] = ids
    return out


class ForcedRoutingModel(ReferenceModel):
    """The reference with each MoE layer's expert CHOICE taken from the kernel (weights still from
    the reference's own logits), so that a bf16 near-tie at the top-k boundary cannot flip an expert
    and hide every other error. `flips` records where the choices differ and by how much the forced
    set's worst logit trails the reference's own k-th best (relative to the logits' std)."""

    def __init__(self, cfg: ModelConfig, weights, forced: dict[int, torch.Tensor]):
        super().__init__(cfg, weights)
        self.forced = forced
        self.flips: list[tuple[int, int, float]] = []

    def mlp_block(self, i, h):
        cfg = self.cfg
        if cfg.is_dense(i) or i not in self.forced:
            return super().mlp_block(i, h)
        lw = self.w.layers[i]
        K = cfg.num_experts_per_tok
        logits = torch.nn.functional.linear(h, lw.router).float()
        ids = self.forced[i].to(h.device)
        own = torch.topk(logits, K, dim=-1)
        for b in range(h.shape[0]):
            if set(own.indices[b].tolist()) != set(ids[b].tolist()):
                lag = float(own.values[b, -1] - logits[b, ids[b]].min()) / float(logits[b].std())
                self.flips.append((i, b, lag))
        from mkcode.backend.model import ops

        w = ops.route_weights(logits.gather(1, ids), cfg.expert_selection_fn, cfg.norm_topk_prob)
        return ops.moe(h, w.to(h.dtype), ids, lw.experts_gate_up, lw.experts_down)


def reference_step(
    cfg: ModelConfig,
    weights,
    batch: DecodeBatch,
    forced: dict[int, torch.Tensor] | None = None,
    residuals: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """ReferenceModel's step over the batch's own pool (writes the new K/V there); fp32 logits.
    With `forced`, MoE expert choices are the given ones (see ForcedRoutingModel). `residuals`
    receives x(l + 1), each layer's output (fp32 [B, H]), in layer order."""
    ref = ForcedRoutingModel(cfg, weights, forced) if forced is not None else ReferenceModel(cfg, weights)
    if residuals is not None:
        layer = ref.layer

        def recording(i, x, *args):
            out = layer(i, x, *args)
            residuals.append(out.float())
            return out

        ref.layer = recording
    segs = [Segment(b, b + 1, PagedKV(cfg, batch.kv_pool, batch.block_tables, b)) for b in range(batch.size)]
    out = ref.forward(batch.token_ids, batch.positions, segs).float()
    reference_step.last_flips = getattr(ref, "flips", [])  # type: ignore[attr-defined]
    return out


def residual_cosines(ws, residuals: list[torch.Tensor], batch_size: int) -> torch.Tensor:
    """Per (layer, row) cosine of the kernel's x(l + 1) (the workspace's residual stream: its
    layer's sum) with the reference's (reference_step's `residuals`):
    [L, B], fp64."""
    got = ws["x"][1 : len(residuals) + 1, :batch_size].double()
    want = torch.stack(residuals).to(got.device).double()
    return torch.nn.functional.cosine_similarity(got, want, dim=-1)


def clone_batch(batch: DecodeBatch, share_pool: bool = False) -> DecodeBatch:
    """A copy of the batch; `share_pool`: the same KV pool tensor (the rest copied)."""
    pool = batch.kv_pool if share_pool else batch.kv_pool.clone()
    return DecodeBatch(batch.token_ids.clone(), batch.positions.clone(), batch.block_tables.clone(), pool)


def _step_slots(batch: DecodeBatch, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(page, slot) of each row's position on `layer`: where the step writes its K/V."""
    pos = batch.positions.long()
    rows = torch.arange(batch.size, device=pos.device)
    return batch.block_tables[layer, rows, pos // PAGE_SIZE].long(), pos % PAGE_SIZE


def written_kv(cfg: ModelConfig, batch: DecodeBatch) -> torch.Tensor:
    """The K/V slots the step writes (each row's position on each layer): [L, B, 2, Hkv, d], a new
    tensor."""
    out = []
    for layer in range(cfg.num_hidden_layers):
        pages, slots = _step_slots(batch, layer)
        out.append(batch.kv_pool[pages, :, :, slots])  # [B, 2, Hkv, d]
    return torch.stack(out)


def put_written_kv(cfg: ModelConfig, batch: DecodeBatch, values: torch.Tensor) -> None:
    """Stores `values` ([L, B, 2, Hkv, d], as written_kv returns) into the step's slots."""
    for layer in range(cfg.num_hidden_layers):
        pages, slots = _step_slots(batch, layer)
        batch.kv_pool[pages, :, :, slots] = values[layer]


def pool_digest(pool: torch.Tensor) -> torch.Tensor:
    """Each page's sum of its raw 16-bit words, weighted by their place ([P], int64): a write
    anywhere in the pool changes it (barring a collision)."""
    words = pool.reshape(pool.shape[0], -1).view(torch.int16)
    weight = torch.arange(1, words.shape[1] + 1, device=pool.device, dtype=torch.int64) % 65521
    return torch.cat([(c.long() * weight).sum(-1) for c in words.split(64)])


def standalone_desc(d: list[int]) -> list[int]:
    """A descriptor with no waits and no signals (in place; returned): one op run on its own by
    `MegakernelBackend.run_tasks`, in per-op tests and `gpu_check`'s SAMPLE_ROW timing."""
    for i in range(abi.MK_MAX_WAITS):
        d[abi.MK_F_WAIT0 + 2 * i] = abi.MK_NO_COUNTER
    d[abi.MK_F_NSIG] = 0
    for i in range(abi.MK_MAX_SIGNALS):
        d[abi.MK_F_SIG0 + i] = abi.MK_NO_COUNTER
    return d


def fill_lm_tiles(be, batch_size: int) -> None:
    """What the LM-head tiles write next to the logits, from the logits in `be.ws`: each tile's
    maximum and (vocabulary) argmax per row, the first one on ties (SAMPLE_ROW reads them)."""
    rows, V = be.tiling.lm_rows, be.cfg.vocab_size
    n = -(-V // rows)
    lg = torch.nn.functional.pad(be.ws["logits"][:batch_size], (0, n * rows - V), value=-float("inf"))
    best, arg = lg.view(batch_size, n, rows).max(-1)
    be.ws["lm_best"][:n, :batch_size] = best.t()
    be.ws["lm_arg"][:n, :batch_size] = (
        (arg + torch.arange(n, device=arg.device).unsqueeze(0) * rows).int().t()
    )
