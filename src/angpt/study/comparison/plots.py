"""The report's plots: loss curves, final loss against budget, and speedups, as PNGs (matplotlib when present)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from angpt.stats import std
from angpt.study.comparison.analyse import reported
from angpt.study.comparison.collect import ArmRuns
from angpt.study.plan import Plan
from angpt.units import format_lr, format_tokens

# A y range wider than this ratio (largest / smallest loss plotted) means an early spike or a diverging start
# would flatten every other curve: such a plot gets a log y axis.
LOG_Y_RATIO = 2.0

# The test split is measured only at a run's end, so the curves stay on validation and say which split the tables use.
CURVES_NOT_TEST = "the tables give the held-out test loss, measured once at the end"

NO_MATPLOTLIB = "matplotlib is not installed: no plots were drawn (pip install 'angpt[plot]')."


def wants_log_y(values: Sequence[float]) -> bool:
    """Whether losses spanning `values` need a log y axis (see LOG_Y_RATIO)."""
    vals = [v for v in values if v is not None and v > 0 and v < float("inf")]
    return bool(vals) and max(vals) > LOG_Y_RATIO * min(vals)


def spread_note(n_seeds: int, what: str = "band") -> str:
    """'band: ±1 std over 3 seeds', or 'one seed' when there is no spread to show."""
    return f"{what}: ±1 std over {n_seeds} seeds" if n_seeds > 1 else "one seed, no spread"


def curves_title(plan: Plan, n_seeds: int) -> str:
    """The loss curves' title: they are validation losses (evaluated during training), and where the tables report
    the test split (measured once, at the end) it says so, lest the two be read as one number."""
    title = f"validation loss during training, {format_tokens(plan.budgets[-1])}-token runs ({spread_note(n_seeds)})"
    return title + (f"\n{CURVES_NOT_TEST}" if plan.report_split == "test" else "")


def tokens_label(x: float, _pos: Any = None) -> str:
    """A short tick label for a token count (1.5M, 64K): never wider than a few characters."""
    for div, s in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{s}"
    return f"{x:.0f}"


def write_plots(
    plan: Plan, runs: dict[str, ArmRuns], arms: dict[str, Any], out: Path, report: dict[str, Any] | None = None
) -> tuple[dict[str, Path], list[str]]:
    """The PNGs, and warnings (matplotlib missing: no files and one warning line)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}, [NO_MATPLOTLIB]
    files = {"val_loss_vs_tokens": _curves(plt, plan, runs, arms, out / "val_loss_vs_tokens.png")}
    drawn = _lead(plt, plan, report or {}, out / "lead.png")
    if drawn is not None:
        files["lead"] = drawn
    if len(plan.budgets) == 1:  # one point per arm and no speedup to draw: the curves and the report say it all
        return files, []
    files["final_loss_vs_budget"] = _final_losses(plt, plan, arms, out / "final_loss_vs_budget.png")
    files["speedup"] = _speedup_bars(plt, plan, arms, out / "speedup.png")
    return files, []


def _curves(plt, plan: Plan, runs: dict[str, ArmRuns], arms: dict[str, Any], path: Path) -> Path:
    """Validation loss against tokens: each arm's mean over seeds at the largest budget, its spread shaded."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    n_seeds = len(plan.seeds)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plotted: list[float] = []
    for label, r in runs.items():
        curves = [c for c in r.curves.values() if c]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        xs = [c[0] for c in curves[0][:n]]
        ys = [[c[i][1] for c in curves] for i in range(n)]
        m = [sum(v) / len(v) for v in ys]
        sd = [std(v) or 0.0 for v in ys]
        plotted += m
        lr = "lr per budget" if arms[label].get("tune") else f"lr {format_lr(r.lr or 0)}"
        (line,) = ax.plot(xs, m, marker="o", ms=3, label=f"{label} ({lr})")
        if len(curves) > 1:
            ax.fill_between(
                xs, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], alpha=0.2, color=line.get_color()
            )
    if wants_log_y(plotted):
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
    ax.xaxis.set_major_formatter(FuncFormatter(tokens_label))
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation loss (nats/token)" + (", log scale" if wants_log_y(plotted) else ""))
    ax.set_title(curves_title(plan, n_seeds), fontsize=10)
    ax.grid(alpha=0.3)
    if plotted:  # a partial report may have no finished curve at the largest budget yet
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _lead(plt, plan: Plan, report: dict[str, Any], path: Path) -> Path | None:
    """Each arm's validation loss minus the baseline's along the run: at the largest budget, every reported seed
    (thin) and their mean (thick); where no reported seed has both, the tuning seed's runs at the chosen rates
    (dashed: a screen). None when neither has a point."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    lines = []  # (label, [(tokens, diff)], style)
    for label, e in (report.get("lead") or {}).items():
        for points in e["seeds"].values():
            lines.append(
                (None, [(p["step"] * plan.batch_tokens, p["diff"]) for p in points], {"lw": 0.8, "alpha": 0.4})
            )
        if e["mean"]:
            mean = [(p["step"] * plan.batch_tokens, p["diff"]) for p in e["mean"]]
            lines.append((f"{label} ({len(e['seeds'])} seeds)", mean, {"lw": 2, "marker": "o", "ms": 3}))
    screen = report.get("tuning_screen") or {}
    if not any(label for label, _, _ in lines):
        for label, row in (screen.get("arms") or {}).items():
            if row.get("along"):
                pts = [(p["step"] * plan.budgets[0] // plan.steps(plan.budgets[0]), p["diff"]) for p in row["along"]]
                lines.append((f"{label}, tuning seed {screen['seed']} (a screen)", pts, {"ls": "--", "marker": "o",
                                                                                        "ms": 3}))  # fmt: skip
    if not any(pts for _, pts, _ in lines):
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, pts, style in lines:
        ax.plot(*zip(*pts), label=label, **style)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
    ax.xaxis.set_major_formatter(FuncFormatter(tokens_label))
    ax.set_xlabel("tokens")
    ax.set_ylabel(f"validation loss - {plan.baseline}'s (nats)")
    ax.set_title(f"Where the lead comes from: below 0 the arm is ahead of {plan.baseline}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _final_losses(plt, plan: Plan, arms: dict[str, Any], path: Path) -> Path:
    """The final reported loss against the budget, each arm's mean over seeds with its spread."""
    from matplotlib.ticker import NullLocator

    n_seeds = len(plan.seeds)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plotted: list[float] = []
    for label, e in arms.items():
        pts = [
            (r["budget"], reported(r, "loss_mean"), reported(r, "loss_std") or 0.0)
            for r in e["budgets"]
            if reported(r, "loss_mean") is not None
        ]
        plotted += [p[1] for p in pts]
        if pts:
            ax.errorbar(
                [p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3, label=label
            )
    ax.set_xscale("log")
    if wants_log_y(plotted):
        ax.set_yscale("log")
    # One tick per budget, labelled compactly and slanted, and no log-scale minor labels to collide with them.
    ax.set_xticks(plan.budgets)
    ax.set_xticklabels([format_tokens(b) for b in plan.budgets], rotation=30, ha="right", fontsize=8)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("token budget (each a full run with its own schedule)")
    split = "test" if plan.report_split == "test" else "validation"
    ax.set_ylabel(f"final {split} loss")
    what = "mean ± std over seeds" if n_seeds > 1 else "one seed"
    ax.set_title(f"final {split} loss vs budget ({what})")
    ax.grid(alpha=0.3, which="both")
    if plotted:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _speedup_bars(plt, plan: Plan, arms: dict[str, Any], path: Path) -> Path:
    """Each arm's convergence speedup over the baseline, hatched where it is not established or left bounds out."""
    n_seeds = len(plan.seeds)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [lab for lab in arms if lab != plan.baseline]
    for i, label in enumerate(labels):
        sp = arms[label].get("speedup") or {}
        if sp.get("mean") is not None:
            bounds = sp["n_below_range"] + sp["n_not_reached"]
            # A bar that is not an established speedup, or that left bounds out, is hatched and says so.
            hatch = None if sp["established"] and not bounds else "//"
            ax.bar(
                i,
                sp["mean"],
                yerr=sp.get("std") or 0.0,
                capsize=5,
                color="C0" if sp["established"] else "0.8",
                hatch=hatch,
                edgecolor="k" if hatch else None,
            )
            note = f"{sp['mean']:.2f}x"
            if not sp["established"]:
                note += "\nnot established"
            if bounds:
                parts = []
                if sp["n_below_range"]:
                    parts.append(f"{sp['n_below_range']} ≥{sp['lower_bound']:.2f}x")
                if sp["n_not_reached"]:
                    parts.append(f"{sp['n_not_reached']} <{sp['upper_bound']:.2f}x")
                note += f"\nbounds of {sp['n_comparisons']}: {', '.join(parts)}"
            ax.text(i, sp["mean"], note, ha="center", va="bottom", fontsize=7)
        else:
            why = "not reached" if sp.get("n_not_reached") else ("below range" if sp.get("n_below_range") else "n/a")
            ax.text(i, 1.0, why, ha="center", va="bottom", fontsize=8, color="C3")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_xlim(-0.8, max(len(labels), 1) - 0.2)
    ax.margins(y=0.25)
    ax.set_ylabel(f"speedup over {plan.baseline} (x fewer tokens)")
    what = "mean ± std over seeds" if n_seeds > 1 else "one seed"
    ax.set_title(f"tokens to reach the baseline's loss ({what}; hatched: bounds left out)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
