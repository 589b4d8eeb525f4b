"""Per-SM timeline of one megakernel step (DESIGN §6 step 4): where the time goes.

With `backend.timeline` set to an int64 tensor [n_sms, cap, 4], the kernel's thread 0 of each block
writes one record per task (and per DRAIN): opcode | layer << 8 | queue-item << 16, then the
%globaltimer stamps at start, after the dependency waits, and after the signals. `summarize` turns
them into per-opcode wait/run totals and the SMs' busy fraction.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from mkcode.backend.megakernel import abi


def allocate(n_sms: int, cap: int, device: torch.device | str) -> torch.Tensor:
    return torch.zeros((n_sms, cap, abi.MK_TL_WORDS), dtype=torch.int64, device=device)


def summarize(tl: torch.Tensor) -> dict:
    rec = tl.cpu()
    valid = rec[:, :, 1] != 0
    t_start = int(rec[:, :, 1][valid].min())
    t_end = int(rec[:, :, 3][valid].max())
    span = max(1, t_end - t_start)
    per_op: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "wait_us": 0.0, "run_us": 0.0})
    busy = []
    for sm in range(rec.shape[0]):
        r = rec[sm][valid[sm]]
        run_sm = 0.0
        for w0, t0, t1, t2 in r.tolist():
            op = abi.OPNAMES.get(w0 & 0xFF, "?") + ("*" if (w0 >> 16) & 1 else "")
            d = per_op[op]
            d["count"] += 1
            d["wait_us"] += (t1 - t0) / 1e3
            d["run_us"] += (t2 - t1) / 1e3
            if (w0 & 0xFF) != abi.MK_OP_DRAIN:
                run_sm += (t2 - t1) / 1e3
        busy.append(run_sm / (span / 1e3))
    return {
        "span_us": span / 1e3,
        "records": int(valid.sum()),
        "mean_busy_fraction": sum(busy) / len(busy),
        "per_op": {
            k: dict(v, mean_run_us=v["run_us"] / v["count"], mean_wait_us=v["wait_us"] / v["count"])
            for k, v in sorted(per_op.items())
        },
    }
