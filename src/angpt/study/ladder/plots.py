"""The ladder's plots (matplotlib): loss against compute with the fitted law, iso-loss contours with the
compute-optimal frontier, the frontiers of all arms, and the exponents with intervals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from angpt.study.ladder.fit import Law
from angpt.study.ladder.plan import Ladder


def _law(entry: dict[str, Any]) -> Law | None:
    p = entry.get("point") if entry.get("ok") else None
    return Law(p["E"], p["A"], p["alpha"], p["B"], p["beta"]) if p else None


def _plain_log_y(ax) -> None:
    """Log-scaled loss axis labelled 2.5, 3, 4 rather than 2.5 x 10^0."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def ladder_plots(plt, out: Path, ladder: Ladder, a: dict[str, Any]) -> dict[str, Path]:
    """Loss against compute per arm; where laws were fitted, iso-loss contours, the frontiers and the exponents."""
    labels = [arm.label for arm in ladder.arms]
    runs = [r for r in a["runs"] if r["loss"] is not None and np.isfinite(r["loss"])]
    c_all = np.array([6.0 * r["N"] * r["D"] for r in runs])
    cs = np.geomspace(c_all.min() / 2, c_all.max() * 100, 200)
    files = {"loss_vs_compute": _loss_vs_compute(plt, out, ladder, a, labels, runs, cs)}
    laws = {label: _law(a["arms"].get(label, {})) for label in labels}
    laws = {k: v for k, v in laws.items() if v is not None}
    if not laws:
        return files
    files["isoloss"] = _isoloss(plt, out, laws, runs, cs)
    files["frontier"] = _frontier(plt, out, a, laws, runs, cs)
    files["exponents"] = _exponents(plt, out, a, laws)
    return files


def _loss_vs_compute(plt, out: Path, ladder: Ladder, a: dict[str, Any], labels, runs, cs) -> Path:
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(ladder.sizes)))
    # Loss against compute: runs coloured by size, the fitted law along each size, and the optimal frontier.
    fig, axes = plt.subplots(1, len(labels), figsize=(5.2 * len(labels), 4.2), squeeze=False, sharey=True)
    for ax, label in zip(axes[0], labels):
        law = _law(a["arms"].get(label, {}))
        for size, col in zip(ladder.sizes, colors):
            pts = [r for r in runs if r["arm"] == label and r["size"] == size.name]
            if pts:
                ax.scatter(
                    [6 * r["N"] * r["D"] for r in pts],
                    [r["loss"] for r in pts],
                    color=col,
                    s=18,
                    zorder=3,
                    label=f"{size.name} (N={size.params[label]:.3g})",
                )
            if law is not None and pts:
                n = size.params[label]
                d = np.geomspace(min(r["D"] for r in pts) / 2, max(r["D"] for r in pts) * 4, 100)
                ax.plot(6 * n * d, law.loss(n, d), color=col, lw=1)
        if law is not None:
            ax.plot(cs, [law.optimal_loss(c) for c in cs], "k--", lw=1.2, label="compute-optimal L*(C)")
        ax.set_xscale("log")
        _plain_log_y(ax)
        ax.set_xlabel("compute C = 6ND (FLOPs)")
        ax.set_title(label + ("" if law else " (not fitted)"))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("final validation loss (nats/token)")
    axes[0][-1].legend(fontsize=7)
    return _save(plt, fig, out / "loss_vs_compute.png")


def _isoloss(plt, out: Path, laws, runs, cs) -> Path:
    # Iso-loss contours over (C, N) with the compute-optimal N*(C) and the runs (Chinchilla's Figure 4, left).
    fig, axes = plt.subplots(1, len(laws), figsize=(5.2 * len(laws), 4.2), squeeze=False)
    n_all = np.array([r["N"] for r in runs])
    ns = np.geomspace(n_all.min() / 4, n_all.max() * 40, 160)
    for ax, (label, law) in zip(axes[0], laws.items()):
        C, N = np.meshgrid(cs, ns)
        Lgrid = law.loss(N, C / (6 * N))
        levels = np.quantile(Lgrid[np.isfinite(Lgrid)], np.linspace(0.02, 0.6, 10))
        cont = ax.contour(C, N, Lgrid, levels=np.unique(levels), cmap="viridis", linewidths=0.8)
        ax.clabel(cont, fontsize=6, fmt="%.3g")
        ax.plot(cs, [law.optimal(c)[0] for c in cs], "k--", lw=1.2, label="N*(C)")
        pts = [r for r in runs if r["arm"] == label]
        ax.scatter([6 * r["N"] * r["D"] for r in pts], [r["N"] for r in pts], c="r", s=10, zorder=3, label="runs")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("compute C (FLOPs)")
        ax.set_ylabel("parameters N")
        ax.set_title(f"{label}: iso-loss contours")
        ax.legend(fontsize=7)
    return _save(plt, fig, out / "isoloss.png")


def _frontier(plt, out: Path, a: dict[str, Any], laws, runs, cs) -> Path:
    # Frontiers of every arm together, with the target loss of the compute multiplier.
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, law in laws.items():
        (line,) = ax.plot(cs, [law.optimal_loss(c) for c in cs], lw=1.5, label=f"{label}: L*(C)")
        pts = [r for r in runs if r["arm"] == label]
        ax.scatter(
            [6 * r["N"] * r["D"] for r in pts], [r["loss"] for r in pts], s=10, color=line.get_color(), alpha=0.6
        )
    if a.get("target_loss"):
        ax.axhline(a["target_loss"], color="grey", ls=":", lw=1, label=f"target loss {a['target_loss']:.4g}")
    ax.set_xscale("log")
    _plain_log_y(ax)
    ax.set_xlabel("compute C = 6ND (FLOPs)")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("compute-optimal frontier per arm")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, out / "frontier.png")


def _exponents(plt, out: Path, a: dict[str, Any], laws) -> Path:
    # Exponents with their intervals, side by side.
    names = [("alpha", "alpha"), ("beta", "beta"), ("n_exponent", "N* exponent"), ("d_exponent", "D* exponent")]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(laws)
    for j, label in enumerate(laws):
        e = a["arms"][label]
        xs = np.arange(len(names)) + (j - (len(laws) - 1) / 2) * width
        ys = [e["point"][k] for k, _ in names]
        ivs = [e.get("intervals", {}).get(k) for k, _ in names]
        (dot,) = ax.plot(xs, ys, "o", label=label)
        # The interval as its own segment: a percentile bootstrap interval need not contain the point estimate
        # (a skewed refit distribution), which an error bar around the point cannot draw.
        for x, iv in zip(xs, ivs):
            if iv:
                ax.plot([x, x], iv, "-", color=dot.get_color())
                ax.plot([x - width / 4, x + width / 4], [iv[0], iv[0]], "-", color=dot.get_color())
                ax.plot([x - width / 4, x + width / 4], [iv[1], iv[1]], "-", color=dot.get_color())
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([n for _, n in names])
    ax.set_ylabel("value (95% bootstrap interval)")
    ax.set_title("fitted exponents")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, out / "exponents.png")
