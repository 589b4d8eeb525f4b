"""graph_profile's bookkeeping on synthetic kernel records (the profiling itself needs a GPU)."""

from __future__ import annotations

from devtools.bench.graph_profile import layer_slice, per_kernel


def _step(t0: float) -> list[tuple[str, float, float]]:
    """One step: an embed kernel, then 3 layers of (norm, route, attn, moe), then the LM head."""
    recs, t = [("embed", t0, t0 + 2.0)], t0 + 2.0
    for _ in range(3):
        for name, dur, gap in (
            ("norm", 1.0, 0.5),
            ("route", 2.0, 1.0),
            ("attn", 5.0, 0.5),
            ("moe", 10.0, 0.0),
        ):
            recs.append((name, t + gap, t + gap + dur))
            t += gap + dur
    recs.append(("lm_head", t, t + 20.0))
    return recs


def test_per_kernel_totals_per_step():
    recs = _step(0.0) + _step(1000.0)
    rows = per_kernel(recs, 2)
    assert rows[0]["name"] == "moe" and rows[0]["per_step"] == 3 and rows[0]["us_per_step"] == 30.0
    lm = next(r for r in rows if r["name"] == "lm_head")
    assert lm["per_step"] == 1 and lm["mean_us"] == 20.0


def test_layer_slice_cuts_the_second_step_at_a_once_per_layer_kernel():
    recs = _step(0.0) + _step(1000.0)
    rows = layer_slice(recs, 2, 3, 1)  # every layer kernel occurs 3 times: cut at the first (norm)
    assert [r["name"] for r in rows] == ["norm", "route", "attn", "moe"]
    assert rows[0]["start_us"] == 0.0 and rows[0]["gap_us"] == 0.5
    assert rows[1]["start_us"] == 2.0 and rows[1]["dur_us"] == 2.0 and rows[1]["gap_us"] == 1.0
    assert layer_slice(recs, 2, 3, 2) == []  # the last layer has no next cut
    assert layer_slice(recs, 2, 5, 0) == []  # no kernel occurs 5 times
