"""The report's plots: loss curves, final loss against budget, and speedups, as PNGs (matplotlib when present)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from angpt.compare.collect import ArmRuns
from angpt.compare.plan import Plan, format_lr, format_tokens
from angpt.compare.stats import std


def write_plots(plan: Plan, runs: dict[str, ArmRuns], arms: dict[str, Any], out: Path) -> dict[str, Path]:
    """The three PNGs; empty when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    files: dict[str, Path] = {}

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, r in runs.items():
        curves = [c for c in r.curves.values() if c]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        xs = [c[0] for c in curves[0][:n]]
        ys = [[c[i][1] for c in curves] for i in range(n)]
        m = [sum(v) / len(v) for v in ys]
        sd = [std(v) or 0.0 for v in ys]
        (line,) = ax.plot(xs, m, marker="o", ms=3, label=f"{label} (lr {format_lr(r.lr or 0)})")
        if len(curves) > 1:
            ax.fill_between(
                xs, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], alpha=0.2, color=line.get_color()
            )
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"validation loss, {format_tokens(plan.budgets[-1])}-token runs (band: ±1 std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    files["val_loss_vs_tokens"] = out / "val_loss_vs_tokens.png"
    fig.savefig(files["val_loss_vs_tokens"], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, e in arms.items():
        pts = [
            (r["budget"], r["val_loss_mean"], r["val_loss_std"] or 0.0)
            for r in e["budgets"]
            if r["val_loss_mean"] is not None
        ]
        if pts:
            ax.errorbar(
                [p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3, label=label
            )
    ax.set_xscale("log")
    ax.set_xlabel("token budget (each a full run with its own schedule)")
    ax.set_ylabel("final validation loss")
    ax.set_title("final validation loss vs budget (mean ± std over seeds)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    files["final_loss_vs_budget"] = out / "final_loss_vs_budget.png"
    fig.savefig(files["final_loss_vs_budget"], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [lab for lab in arms if lab != plan.baseline]
    for i, label in enumerate(labels):
        sp = arms[label].get("speedup") or {}
        if sp.get("mean") is not None:
            ax.bar(i, sp["mean"], yerr=sp.get("std") or 0.0, capsize=5, color="C0")
            ax.text(i, sp["mean"], f"{sp['mean']:.2f}x", ha="center", va="bottom", fontsize=8)
        else:
            why = "not reached" if sp.get("n_not_reached") else ("below range" if sp.get("n_below_range") else "n/a")
            ax.text(i, 1.0, why, ha="center", va="bottom", fontsize=8, color="C3")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_xlim(-0.8, max(len(labels), 1) - 0.2)
    ax.set_ylabel(f"speedup over {plan.baseline} (x fewer tokens)")
    ax.set_title("tokens to reach the baseline's loss (mean ± std over seeds)")
    fig.tight_layout()
    files["speedup"] = out / "speedup.png"
    fig.savefig(files["speedup"], dpi=110)
    plt.close(fig)
    return files
