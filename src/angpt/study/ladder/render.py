"""The ladder's sections of the scaling report: the ladder, learning rates, the fit table, compute-optimal sizes, the
comparison with the baseline and every run."""

from __future__ import annotations

import math
from typing import Any

from angpt.study.ladder.plan import Ladder
from angpt.units import format_lr, format_tokens
from angpt.units import si as _si


def _g(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-" if x is None else str(x)
    return f"{x:.{digits}g}"


def _flops(x: float) -> str:
    return f"{x:.2e}"


def _with_interval(x: float | None, iv: list[float] | tuple[float, float] | None) -> str:
    if x is None:
        return "-"
    return f"{_g(x)} [{_g(iv[0])}, {_g(iv[1])}]" if iv else _g(x)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def render_fit_table(ladder: Ladder, a: dict[str, Any]) -> list[str]:
    """The "Fits" section: one row per arm, numbers with 95% intervals, or why the arm was not fitted."""
    labels = [arm.label for arm in ladder.arms]
    lines = ["## Fits", ""]
    lines.append(
        "L(N, D) = E + A / N^alpha + B / D^beta, fitted to each arm's final validation losses (nats per token) by the "
        "Huber loss (delta 1e-3) on log L with L-BFGS-B from a grid of starts (Hoffmann et al. 2022; Besiroglu et al. "
        "2024). Brackets: 95% bootstrap percentile intervals over runs. Compute-optimal N* ~ C^(beta/(alpha+beta)), "
        "D* ~ C^(alpha/(alpha+beta)) with C = 6 N D."
    )
    lines.append("")
    rows = []
    for label in labels:
        e = a["arms"].get(label, {})
        if not e.get("ok"):
            rows.append([label, f"**{e.get('message', 'not fitted')}**", *[""] * 6, _runs_cell(e)])
            continue
        p, iv = e["point"], e.get("intervals", {})
        keys = ("E", "A", "alpha", "B", "beta", "n_exponent", "d_exponent")
        rows.append([label, *(_with_interval(p[k], iv.get(k)) for k in keys), _runs_cell(e)])
    lines += _table(["arm", "E", "A", "alpha", "B", "beta", "N* exponent", "D* exponent", "runs"], rows)
    for label, where in a.get("diverged", {}).items():
        lines += ["", f"Diverged, left out of {label}'s fit: {', '.join(where)}."]
    boot = next((e["bootstrap"] for e in a["arms"].values() if e.get("bootstrap")), None)
    if boot:
        lines += ["", f"Bootstrap: {boot['n']} resamples of the runs (seed {boot['seed']})."]
    lines += _profile_table(labels, a["arms"])
    return lines + _without_e(ladder, a)


def _runs_cell(e: dict[str, Any]) -> str:
    """The runs an arm's fit used, and beside them the diverged ones it could not ('9 (+1 diverged, left out)')."""
    n = str(e.get("n_runs", 0))
    return f"{n} (+{e['n_diverged']} diverged, left out)" if e.get("n_diverged") else n


def profile_text(iv: dict[str, Any] | None) -> str:
    """'[0.21, 0.35]', with an end the data leave open shown as '<= 0' or '>= 3' ('–' when not computed)."""
    if not iv:
        return "–"
    lo = f"{iv['lo']:.3g}" if not iv["lo_open"] else f"<= {iv['lo']:.3g} (open)"
    hi = f"{iv['hi']:.3g}" if not iv["hi_open"] else f">= {iv['hi']:.3g} (open)"
    return f"[{lo}, {hi}]"


def _profile_table(labels: list[str], arms: dict[str, Any]) -> list[str]:
    rows = [
        [label, profile_text(e["profile"].get("alpha")), profile_text(e["profile"].get("beta"))]
        for label in labels
        if (e := arms.get(label, {})).get("ok") and e.get("profile")
    ]
    if not rows:
        return []
    return [
        "",
        "Profile intervals of the exponents (95%, likelihood ratio with Gaussian errors on log L: every value at which "
        "the law refitted with that exponent held fixed is not significantly worse). An end marked open reaches the "
        "search bound: the runs do not bound the exponent on that side.",
        "",
        *_table(["arm", "alpha", "beta"], rows),
    ]


def _versus_table(versus: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Exponent differences and the compute multiplier of each arm against the baseline, with their intervals."""
    rows = []
    for label, v in versus:
        di = v.get("difference_interval", {})
        rows.append(
            [
                label,
                *(_with_interval(v["difference"][k], di.get(k)) for k in ("alpha", "beta", "n_exponent")),
                _with_interval(v["multiplier"], v.get("multiplier_interval")),
            ]
        )
    return _table(["arm", "d alpha", "d beta", "d N* exponent", "compute multiplier"], rows)


def _without_e(ladder: Ladder, a: dict[str, Any]) -> list[str]:
    """The nested law without E, for arms whose full fit drove E to the bottom of its search."""
    reduced = [(arm.label, a["arms"].get(arm.label, {}).get("without_e")) for arm in ladder.arms]
    reduced = [(label, r) for label, r in reduced if r]
    if not reduced:
        return []
    lines = [
        "",
        "### Without E: L(N, D) = A / N^alpha + B / D^beta",
        "",
        "The full fit of at least one arm drove E to the bottom of its search: these runs do not determine the "
        "irreducible loss. Fixed at 0 (a lower bound on any real E) for every arm, so that they compare like for "
        "like, the law keeps only its two power terms; its exponents describe the runs' range and depend on that "
        "choice (a real E > 0 would make them larger).",
        "",
    ]
    rows = []
    for label, r in reduced:
        if not r.get("ok"):
            rows.append([label, f"**{r.get('message', 'not fitted')}**", *[""] * 5])
            continue
        p, iv = r["point"], r.get("intervals", {})
        keys = ("A", "alpha", "B", "beta", "n_exponent", "d_exponent")
        rows.append([label, *(_with_interval(p[k], iv.get(k)) for k in keys)])
    lines += _table(["arm", "A", "alpha", "B", "beta", "N* exponent", "D* exponent"], rows)
    versus = [(label, r["vs_baseline"]) for label, r in reduced if r.get("vs_baseline")]
    if versus:
        target = a["arms"][ladder.baseline]["without_e"].get("target_loss")
        lines += [
            "",
            f"Against {ladder.baseline} without E (arm minus {ladder.baseline}, paired bootstrap intervals; compute "
            f"multiplier at L = {_g(target, 4)}):",
            "",
        ]
        lines += _versus_table(versus)
    return lines


def render_ladder(ladder: Ladder, a: dict[str, Any]) -> list[str]:
    """The ladder sections of report.md (without the title and provenance), section by section."""
    lines = _sizes(ladder)
    lines += _rates(ladder, a)
    lines += ["", *render_fit_table(ladder, a)]
    lines += _optimal(a)
    lines += _versus(ladder, a)
    if a.get("verdicts"):
        lines += ["", "## Verdict", "", *(f"- {v}" for v in a["verdicts"])]
    lines += _runs(a)
    return lines


def _sizes(ladder: Ladder) -> list[str]:
    """Each size's shape, parameters, budgets and steps, with what N counts, the batch and the schedule."""
    labels = [arm.label for arm in ladder.arms]
    lines = ["## Ladder", ""]
    rows = []
    for size in ladder.sizes:
        s = size.shape
        n0 = size.params[ladder.baseline]
        rows.append(
            [
                size.name,
                str(s.depth),
                str(s.width),
                str(s.heads),
                str(s.head_dim),
                str(s.d_ff or 4 * s.width),
                *(_si(size.params[label]) for label in labels),
                ", ".join(format_tokens(b) for b in size.budgets),
                ", ".join(f"{b / n0:.3g}" for b in size.budgets),
                ", ".join(str(ladder.steps(b)) for b in size.budgets),
            ]
        )
    lines += _table(
        [
            "size",
            "depth",
            "width",
            "heads",
            "head dim",
            "d_ff",
            *(f"N {label}" for label in labels),
            "budgets (tokens)",
            f"tokens / N {ladder.baseline}",
            "steps",
        ],
        rows,
    )
    batch = ladder.compare["batch_tokens"]
    count = "all parameters" if ladder.param_count == "total" else "all but the input embedding (LM head included)"
    sched = (
        f"WSD: each size's budgets branch off its longest run at their decay start (last {ladder.decay_fraction:g} of "
        f"the run, {ladder.decay_shape} to {ladder.compare['settings'].get('train.min_lr_ratio', 0.1):g} x peak)"
        if ladder.schedule == "wsd"
        else "cosine: every budget is its own run"
    )
    lines += [
        "",
        f"N counts {count}. Batch {format_tokens(batch)} tokens per step; seeds {ladder.seeds}; preset "
        f"{ladder.compare['preset']}; schedule {sched}.",
        "",
        "## Learning rates",
        "",
    ]
    return lines


def _rates(ladder: Ladder, a: dict[str, Any]) -> list[str]:
    """Each arm's peak LR at each size, and the check of a transfer between sizes."""
    labels = [arm.label for arm in ladder.arms]
    lines: list[str] = []
    tuned = "tuned on the smallest size and reused (--lr-transfer)" if ladder.lr_transfer else "tuned per size"
    lines.append(
        f"Each arm's peak LR is {tuned} by compare's sweep (grid x{ladder.compare['lr_grid']} around its centre "
        "LR, extended at an edge). `*`: best at a grid edge; `>`: transferred, not swept."
    )
    lines.append("")
    by = {(r["size"], r["arm"]): r for r in a["lr"]}
    rows = []
    for size in ladder.sizes:
        cells = []
        for label in labels:
            r = by.get((size.name, label), {})
            lr = r.get("best_lr")
            mark = ">" if r.get("transferred") else ("*" if r.get("at_edge") else "")
            cells.append(f"{mark}{format_lr(lr)}" if lr is not None else "-")
        rows.append([size.name, *cells])
    lines += _table(["size", *labels], rows)
    t = a.get("transfer")
    if t:
        lines += ["", f"**LR transfer** ({t['sizes'][0]} -> {t['sizes'][1]}, within one grid step?):"]
        if t.get("note"):
            lines.append(f"- {t['note']}")
        for label, chk in t["arms"].items():
            if chk.get("holds") is None:
                lines.append(f"- {label}: open ({chk.get('note', '')})")
                continue
            word = "holds" if chk["holds"] else "FAILS"
            lines.append(
                f"- {label}: best LR {format_lr(chk['small_lr'])} -> {format_lr(chk['large_lr'])}, "
                f"{chk['steps_apart']:.2g} grid step(s) apart (step x{chk['grid_step']:.3g}): {word}"
                + (f" ({chk['note']})" if chk.get("note") else "")
            )

    return lines


def _optimal(a: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    optimal = [(label, e["optimal"]) for label, e in a["arms"].items() if e.get("optimal")]
    if optimal:
        lines += ["", "## Compute-optimal sizes", ""]
        rows = []
        for label, opts in optimal:
            for o in opts:
                ext = " (extrapolated)" if o["extrapolated"] else ""
                rows.append(
                    [label, _flops(o["C"]) + ext, _si(o["N"]), _si(o["D"]), f"{o['D'] / o['N']:.3g}", _g(o["loss"], 4)]
                )
        lines += _table(["arm", "C = 6ND (FLOPs)", "N*", "D*", "D*/N*", "L*"], rows)

    return lines


def _versus(ladder: Ladder, a: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    versus = [(label, e["vs_baseline"]) for label, e in a["arms"].items() if e.get("vs_baseline")]
    if versus:
        lines += ["", f"## Against {ladder.baseline}", ""]
        lines.append(
            f"Differences of exponents (arm minus {ladder.baseline}) with paired bootstrap intervals, and the compute "
            f"multiplier C_{ladder.baseline}(L) / C_arm(L) at both arms' optimal split, at "
            f"L = {_g(a['target_loss'], 4)} ({ladder.baseline}'s compute-optimal loss at the ladder's largest compute, "
            f"{_flops(a['max_compute'])} FLOPs)."
        )
        lines.append("")
        lines += _versus_table(versus)
    return lines


def _runs(a: dict[str, Any]) -> list[str]:
    lines = ["", "## Runs", ""]
    rows = [
        [
            r["arm"],
            r["size"],
            _si(r["N"]),
            format_tokens(r["D"]),
            f"{r['D'] / r['N']:.3g}",
            str(r["seed"]),
            format_lr(r["lr"]),
            "diverged" if r["loss"] is None or not math.isfinite(r["loss"]) else _g(r["loss"], 5),
        ]
        for r in a["runs"]
    ]
    lines += _table(["arm", "size", "N", "D", "D/N", "seed", "LR", "final val loss"], rows)
    return lines
