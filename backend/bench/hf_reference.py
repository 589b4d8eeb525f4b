"""The off-the-shelf reference: transformers' `Cohere2MoeForCausalLM` at BS=1 over an 8K cache,
with its eager experts and (when transformers offers it) its grouped_mm experts. The HF model
shares the bench model's weight storage (no second copy)."""

from __future__ import annotations

import torch

from mkcode.backend.bench.accounting import speed_of_light, step_bytes
from mkcode.backend.bench.timing import median, time_cuda
from mkcode.backend.model.reference import ReferenceModel


def time_hf_reference(model: ReferenceModel, *, ctx: int, steps: int, bandwidth: float, log=print) -> dict:
    try:
        import transformers
        from transformers import Cohere2MoeConfig, Cohere2MoeForCausalLM
    except ImportError as e:
        return {"status": f"unavailable: {e}"}
    cfg = model.cfg
    hf_cfg = Cohere2MoeConfig(**cfg.to_hf_dict())
    with torch.device("meta"):
        hf = Cohere2MoeForCausalLM(hf_cfg)
    sd = {k: v for k, v in model.w.state_dict(cfg).items()}
    if cfg.tie_word_embeddings:
        sd["lm_head.weight"] = model.w.embed
    hf.load_state_dict(sd, assign=True, strict=False)
    # buffers made on meta (the rotary inv_freq) are rebuilt on the GPU
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf_cfg, device="cuda")
    hf.eval()
    meta = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
    if meta:
        return {"status": f"unavailable: tensors left on meta: {meta[:3]}"}
    out: dict = {"transformers": transformers.__version__, "context": ctx, "batch": 1}
    prompt = torch.randint(0, cfg.vocab_size, (1, ctx), device="cuda")
    sol_ms, _ = speed_of_light(step_bytes(cfg, [ctx]).total, bandwidth, 1)
    impls = ["eager"]
    if hasattr(hf, "set_experts_implementation"):
        impls.append("grouped_mm")
    for impl in impls:
        try:
            if impl != "eager":
                hf.set_experts_implementation(impl)
            with torch.inference_mode():
                res = hf(prompt, use_cache=True)
                cache = res.past_key_values
                tok = res.logits[:, -1:].argmax(-1)

                def step():
                    nonlocal cache
                    r = hf(tok, past_key_values=cache, use_cache=True)  # noqa: B023
                    cache = r.past_key_values

                times = time_cuda(step, steps, 2)
            ms = median(times)
            out[impl] = {"ms_per_step": ms, "tok_per_s": 1e3 / ms, "pct_sol": 100 * sol_ms / ms}
            log(
                f"transformers ({impl} experts) BS=1 ctx={ctx}: {ms:.2f} ms  {1e3 / ms:.1f} tok/s  {100 * sol_ms / ms:.1f}% SOL"
            )
        except Exception as e:
            out[impl] = {"status": f"failed: {type(e).__name__}: {e}"}
            log(f"transformers ({impl}) failed: {e}")
    hf = None
    torch.cuda.empty_cache()
    return out
