"""PNG plots of bench reports (matplotlib, the optional `bench` extra)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_report(report: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    if report["kind"] == "decode":
        rows = [r for r in report["results"] if r["status"] == "ok"]
        for name in sorted({r["backend"] for r in rows}):
            for b in sorted({r["batch"] for r in rows if r["backend"] == name}):
                pts = sorted(
                    (r["context"], r["tok_per_s"], r["pct_sol"])
                    for r in rows
                    if r["backend"] == name and r["batch"] == b
                )
                xs = [p[0] for p in pts]
                axes[0].plot(xs, [p[1] for p in pts], marker="o", label=f"{name} B={b}")
                axes[1].plot(xs, [p[2] for p in pts], marker="o", label=f"{name} B={b}")
        for ax, yl in zip(axes, ("tokens/s", "% of speed-of-light"), strict=True):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel(yl)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"decode, {report['gpu']}, routing {report['routing']}, {report['date']}")
    else:
        rows = report["results"]
        axes[0].plot([r["tokens"] for r in rows], [r["tok_per_s"] for r in rows], marker="o")
        axes[0].set_xscale("log", base=2)
        axes[0].set_xlabel("prompt tokens")
        axes[0].set_ylabel("prefill tokens/s")
        axes[0].grid(alpha=0.3)
        axes[1].axis("off")
        fig.suptitle(f"prefill, {report['gpu']}, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
