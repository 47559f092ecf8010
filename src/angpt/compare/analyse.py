"""The report's numbers and words: per-arm losses, Welch tests, speedups and step times; verdicts and warnings."""

from __future__ import annotations

import math
from typing import Any

from angpt.compare.collect import ArmRuns
from angpt.compare.plan import Plan, format_lr, format_tokens
from angpt.compare.stats import mean, median, speedups, std, usable, welch_ttest
from angpt.compare.sweep import SweepResult


def _finite(xs) -> list[float]:
    return [x for x in xs if x is not None and math.isfinite(x)]


def _speedup_block(plan: Plan, base: ArmRuns, cand: ArmRuns) -> dict[str, Any]:
    """Per seed: speedup_i for every baseline budget, their mean over i; then mean +- std over seeds."""
    ext = plan.extrapolate
    per_seed: dict[str, Any] = {}
    seed_means: list[float] = []
    statuses: list[str] = []
    bounds: dict[str, list[float]] = {"below_range": [], "not_reached": []}
    for s in plan.seeds:
        bl = [base.final.get(b, {}).get(s) for b in plan.budgets]
        cl = [cand.final.get(b, {}).get(s) for b in plan.budgets]
        if any(x is None for x in bl + cl):
            continue
        rows = speedups(plan.budgets, bl, cl, extrapolate=ext)  # type: ignore[arg-type]
        vals = [r.speedup for r in rows if usable(r, ext)]
        m = mean(vals)
        if m is not None:
            seed_means.append(m)
        for r in rows:
            statuses.append(r.reach.status)
            if r.reach.status in bounds:
                bounds[r.reach.status].append(r.speedup)
        per_seed[str(s)] = {"per_budget": [r.to_dict() for r in rows], "mean": m, "n_used": len(vals)}
    # The same measure on the seed-averaged curves (diverged runs make a mean infinite: left out).
    bm = [mean(_finite(base.final.get(b, {}).values())) for b in plan.budgets]
    cm = [mean(_finite(cand.final.get(b, {}).values())) for b in plan.budgets]
    of_means = None
    if all(x is not None for x in bm + cm):
        rows = speedups(plan.budgets, bm, cm, extrapolate=ext)  # type: ignore[arg-type]
        vals = [r.speedup for r in rows if usable(r, ext)]
        of_means = {"per_budget": [r.to_dict() for r in rows], "mean": mean(vals), "n_used": len(vals)}
    return {
        "per_seed": per_seed,
        "mean": mean(seed_means),
        "std": std(seed_means),
        "n_seeds": len(seed_means),
        "n_comparisons": len(statuses),
        "n_exact": statuses.count("exact"),
        "n_extrapolated": statuses.count("extrapolated"),
        "n_below_range": statuses.count("below_range"),
        "n_not_reached": statuses.count("not_reached"),
        # below range: speedup >= this (the smallest such bound is the safe statement); not reached: < this
        "lower_bound": min(bounds["below_range"]) if bounds["below_range"] else None,
        "upper_bound": max(bounds["not_reached"]) if bounds["not_reached"] else None,
        "extrapolate": ext,
        "of_seed_means": of_means,
    }


def analyse(plan: Plan, runs: dict[str, ArmRuns], sweeps: dict[str, SweepResult]) -> dict[str, Any]:
    """Every number of the report, per arm: losses, bpb, improvement, Welch p, speedup, step time, sweep."""
    base = runs[plan.baseline]
    base_step = median(base.step_times)
    arms: dict[str, Any] = {}
    for arm in plan.arms:
        r = runs[arm.label]
        entry: dict[str, Any] = {
            "arch": arm.arch,
            "base": arm.base,
            "model_overrides": arm.model,
            "train_overrides": arm.train,
            "lr": r.lr,
            "sweep": sweeps[arm.label].to_dict(),
            "budgets": [],
        }
        for b in plan.budgets:
            losses = [r.final.get(b, {}).get(s) for s in plan.seeds]
            losses = [x for x in losses if x is not None]
            fin = _finite(losses)
            bpbs = _finite(r.bpb.get(b, {}).values())
            row: dict[str, Any] = {
                "budget": b,
                "steps": plan.steps(b),
                "val_loss": {str(s): r.final.get(b, {}).get(s) for s in plan.seeds},
                "val_loss_mean": mean(fin),
                "val_loss_std": std(fin),
                "val_bpb_mean": mean(bpbs),
                "val_bpb_std": std(bpbs),
                "n": len(fin),
                "diverged": len(losses) - len(fin),
            }
            if arm.label != plan.baseline:
                bfin = _finite(base.final.get(b, {}).values())
                bm = mean(bfin)
                row["rel_improvement_pct"] = (bm - row["val_loss_mean"]) / bm * 100 if fin and bm else None
                w = welch_ttest(fin, bfin)
                row["welch"] = None if w is None else {"t": w.t, "df": w.df, "p": w.p}
            entry["budgets"].append(row)
        st = median(r.step_times)
        entry["step_time_median"] = st
        entry["step_time_ratio"] = st / base_step if st and base_step else None
        if arm.label != plan.baseline and r.lr is not None and base.lr is not None:
            entry["speedup"] = _speedup_block(plan, base, r)
        arms[arm.label] = entry
    return arms


# --------------------------------------------------------------------------------------------- verdicts
def _pct(x: float) -> str:
    return f"{abs(x):.1f}% {'lower' if x > 0 else 'higher'}"


def verdict(plan: Plan, label: str, entry: dict[str, Any]) -> str:
    """One plain-language line on an arm against the baseline."""
    b = plan.baseline
    if entry["lr"] is None:
        return f"{label}: every LR of its sweep diverged; no comparison possible."
    sp = entry.get("speedup")
    parts = []
    if sp is None:
        parts.append(f"{label}: no speedup (the baseline has no usable runs)")
    elif sp["mean"] is not None:
        m = sp["mean"]
        spread = f"±{sp['std']:.2f} over {sp['n_seeds']} seeds" if sp["std"] is not None else "1 seed, no spread"
        if m >= 1:
            parts.append(f"{label} reaches {b}'s loss with {m:.2f}x fewer tokens ({spread})")
        else:
            parts.append(
                f"{label} needs {1 / m:.2f}x as many tokens as {b} to reach its loss (speedup {m:.2f}x, {spread})"
            )
        n = sp["n_comparisons"]
        if sp["n_extrapolated"]:
            parts[-1] += f" [{sp['n_extrapolated']} of {n} points extrapolated]"
        left = []
        if sp["n_below_range"]:
            left.append(f"{sp['n_below_range']} below range, speedup >= {sp['lower_bound']:.2f}x")
        if sp["n_not_reached"]:
            left.append(f"{sp['n_not_reached']} not reached, speedup < {sp['upper_bound']:.2f}x")
        if left:
            parts[-1] += f" [left out of the mean, of {n} points: {'; '.join(left)}]"
    elif sp["n_not_reached"] and not sp["n_below_range"]:
        parts.append(f"{label} does not reach {b}'s loss within its budgets (speedup < {sp['upper_bound']:.2f}x)")
    elif sp["n_below_range"] and not sp["n_not_reached"]:
        parts.append(
            f"{label} is below {b}'s loss already at its smallest budget (speedup >= {sp['lower_bound']:.2f}x; "
            "add smaller budgets to measure it)"
        )
    else:
        parts.append(f"{label}: no speedup measurable within the budget range")
    last = entry["budgets"][-1]
    if last.get("rel_improvement_pct") is not None:
        w = last.get("welch")
        p = f"p={w['p']:.2g}" if w else "no p-value (needs >= 2 seeds with spread)"
        parts.append(f"at {format_tokens(last['budget'])} tokens its loss is {_pct(last['rel_improvement_pct'])}, {p}")
    if entry.get("step_time_ratio") is not None:
        parts.append(f"steps take {entry['step_time_ratio']:.2f}x the baseline's time")
    return "; ".join(parts) + "."


def warnings(plan: Plan, arms: dict[str, Any], meta: dict | None) -> list[str]:
    """Everything that weakens the comparison, said plainly."""
    out = []
    for label, e in arms.items():
        sw = e["sweep"]
        if sw["fixed"]:
            lr = format_lr(sw["best_lr"] or 0)
            out.append(f"{label}: LR {lr} was given, not tuned by a sweep (docs/protocol.md).")
        elif sw["best_at_edge"]:
            out.append(
                f"{label}: the best LR {format_lr(sw['best_lr'] or 0)} is still at an edge of its grid after "
                f"{sw['extensions']} extension(s): the sweep is not finished (raise --max-extensions)."
            )
        if sw["best_lr"] is None:
            out.append(f"{label}: every LR of its sweep diverged.")
        div = sum(r["diverged"] for r in e["budgets"])
        if div:
            out.append(f"{label}: {div} run(s) at its chosen LR diverged (counted as not reaching any loss).")
    if len(plan.seeds) < 3:
        out.append(f"only {len(plan.seeds)} seed(s): spreads and p-values are weak or missing (use >= 3).")
    if meta is not None:
        train_tokens = meta.get("splits", {}).get("train", {}).get("tokens")
        if train_tokens and plan.budgets[-1] > train_tokens:
            out.append(
                f"the largest budget is {plan.budgets[-1] / train_tokens:.1f} epochs over the training split "
                f"({format_tokens(train_tokens)} tokens): repeated data favours memorisation."
            )
    if plan.extrapolate:
        out.append("speedups outside the budget range are extrapolated log-linearly (--extrapolate).")
    return out
