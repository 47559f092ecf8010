"""The report's numbers and words: per-arm losses, paired and Welch tests, speedups, step times and stability;
verdicts and warnings."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from angpt.stats import (
    detectable_difference,
    holm,
    mean,
    mean_ci95,
    median,
    paired_ttest,
    speedups,
    std,
    usable,
    welch_ttest,
)
from angpt.study.arms import format_setting
from angpt.study.comparison.collect import ArmRuns
from angpt.study.comparison.selection import lr_source
from angpt.study.plan import Plan
from angpt.study.sweep import Sweeps
from angpt.units import format_lr, format_tokens

# A chosen LR is flagged unstable when a run's largest pre-clip gradient norm exceeds this multiple of its median
# (a gradient blow-up the clip hid), or when its training loss spiked (store.SPIKE_FACTOR).
GRAD_NORM_RATIO_LIMIT = 100.0
# Two arms are called level only when the 95% interval of their difference lies inside +-this many nats: an
# interval that merely contains 0 says the design could not tell, not that they are equal.
LEVEL_MARGIN = 0.02
ALPHA = 0.05  # the family-wise error rate the Holm-adjusted p-values are read against


def reported(row: dict[str, Any], what: str = "loss") -> Any:
    """A budget row's reported `what` ("loss": the per-seed losses, "loss_mean", "loss_std", "bpb_mean", "bpb_std"):
    under test_* in reports that measure on the test split, val_* in the others and in reports written before the
    keys said their split (their val_* held the test loss where the report's split was test)."""
    return row[f"test_{what}"] if f"test_{what}" in row else row[f"val_{what}"]


def _finite(xs) -> list[float]:
    return [x for x in xs if x is not None and math.isfinite(x)]


def _speedup_block(plan: Plan, base: ArmRuns, cand: ArmRuns, diff_at_largest: float | None) -> dict[str, Any]:
    """Per seed: speedup_i for every baseline budget, their mean over i; then mean +- std over seeds.

    The mean over the measured points is a speedup estimate ("established") only when no point was left out in
    the arm's favour: a point the arm never reaches (speedup < D_i / D_n) left out would inflate it, and an arm
    whose loss at the largest budget is higher than the baseline's has not reached the baseline's loss with fewer
    tokens, whatever its smaller budgets did. Points below range (speedup >= D_i / D_1) left out only understate.
    """
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
    # The same measure on the seed-averaged curves. A seed that diverged makes its budget's mean infinite, as it
    # is in its own seed's curve: that budget sets no target, and the arm's curve does not reach a loss there.
    bm = [mean(list(base.final.get(b, {}).values())) for b in plan.budgets]
    cm = [mean(list(cand.final.get(b, {}).values())) for b in plan.budgets]
    of_means = None
    if all(x is not None for x in bm + cm):
        rows = speedups(plan.budgets, bm, cm, extrapolate=ext)  # type: ignore[arg-type]
        vals = [r.speedup for r in rows if usable(r, ext)]
        of_means = {"per_budget": [r.to_dict() for r in rows], "mean": mean(vals), "n_used": len(vals)}
    why_not = []
    if not seed_means:
        why_not.append("no point lies inside the trained range")
    if bounds["not_reached"]:
        why_not.append(
            f"{len(bounds['not_reached'])} of {len(statuses)} points never reach {plan.baseline}'s loss "
            f"(speedup < {max(bounds['not_reached']):.2f}x there)"
        )
    if diff_at_largest is not None and diff_at_largest > 0:
        why_not.append(f"its loss at {format_tokens(plan.budgets[-1])} tokens is higher than {plan.baseline}'s")
    ci = mean_ci95(seed_means)
    return {
        "per_seed": per_seed,
        "mean": mean(seed_means),  # over the measured points only: read it with `established`
        "std": std(seed_means),
        "ci95": list(ci) if ci else None,
        "established": not why_not,
        "why_not": "; ".join(why_not) or None,
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


def _difference(plan: Plan, base: ArmRuns, cand: ArmRuns, b: int) -> dict[str, Any]:
    """The arm's final loss minus the baseline's at budget b: paired over the seeds both finished, Welch beside."""
    pairs = [
        (cand.final[b][s], base.final[b][s])
        for s in plan.seeds
        if s in cand.final.get(b, {}) and s in base.final.get(b, {})
    ]
    pairs = [(c, r) for c, r in pairs if math.isfinite(c) and math.isfinite(r)]
    paired = paired_ttest([c for c, _ in pairs], [r for _, r in pairs])
    welch = welch_ttest(_finite(cand.final.get(b, {}).values()), _finite(base.final.get(b, {}).values()))
    if not pairs:
        note = "n/a (no seed finished by both)"
    elif len(pairs) == 1:
        note = "n/a (one seed)"
    elif paired is None:
        note = "n/a (the differences do not vary)"
    else:
        note = None
    diffs = [c - r for c, r in pairs]
    return {
        "n_pairs": len(pairs),
        "mean_diff": mean(diffs),  # negative: the arm's loss is lower
        # the smallest difference this design detects (paired t, alpha 0.05 unadjusted, power 0.8)
        "detectable": detectable_difference(std(diffs) or 0.0, len(diffs)),
        "paired": None if paired is None else paired.to_dict(),
        "welch": None if welch is None else welch.to_dict(),
        "note": note,
    }


# A budget where a seed of the arm or of the baseline has not finished: no difference is computed there.
_MISSING_DIFFERENCE: dict[str, Any] = {
    "n_pairs": 0,
    "mean_diff": None,
    "paired": None,
    "welch": None,
    "note": "n/a (runs missing: partial report)",
}


def _stability(plan: Plan, r: ArmRuns) -> dict[str, Any]:
    """The largest pre-clip gradient norm of the arm's main runs against its run's median, and loss spikes."""
    worst: dict[str, Any] | None = None
    spikes, spiky = 0, []
    for b, by_seed in r.health.items():
        for s, h in by_seed.items():
            top, mid = h.get("max_grad_norm"), h.get("median_grad_norm")
            ratio = top / mid if top is not None and mid else None
            if ratio is not None and (worst is None or ratio > worst["ratio"]):
                where = f"{format_tokens(b)} seed {s} step {h.get('max_grad_norm_step')}"
                worst = {"max_grad_norm": top, "median_grad_norm": mid, "ratio": ratio, "where": where}
            n = int(h.get("loss_spikes") or 0)
            spikes += n
            if n:
                spiky.append(f"{format_tokens(b)} seed {s} step {(h.get('loss_spike_steps') or ['?'])[0]}")
    unstable = bool(spikes) or (worst is not None and worst["ratio"] > GRAD_NORM_RATIO_LIMIT)
    return {**(worst or {}), "loss_spikes": spikes, "spiky_runs": spiky, "unstable": unstable}


def _complete(r: ArmRuns) -> ArmRuns:
    """The arm's runs at the budgets where every seed has finished: what statistics may use in a partial report."""
    done = [b for b in r.final if not r.missing.get(b)]
    return replace(r, final={b: r.final[b] for b in done}, bpb={b: r.bpb.get(b, {}) for b in done})


def analyse(plan: Plan, runs: dict[str, ArmRuns], sweeps: Sweeps) -> dict[str, Any]:
    """Every number of the report, per arm: losses, bpb, improvement, paired and Welch tests, speedup, step time,
    stability, sweeps and the (LR, setting) chosen at each budget.

    An arm x budget with a seed missing (a partial report) lists the losses finished there but gets no mean, test
    or speedup: those need every seed of both arms (`compared` says whether a budget's difference was computed).
    """
    all_runs = runs
    runs = {label: _complete(r) for label, r in runs.items()}
    split = plan.report_split
    base = runs[plan.baseline]
    base_step = median(base.step_times)
    arms: dict[str, Any] = {}
    for arm in plan.arms:
        r = runs[arm.label]
        listed = all_runs[arm.label]
        arm_sweeps = [sweeps[arm.label][b] for b in sorted(sweeps.get(arm.label, {}))]
        entry: dict[str, Any] = {
            "arch": arm.arch,
            "base": arm.base,
            "model_overrides": arm.model,
            "train_overrides": arm.train,
            "tune": arm.tune,
            "lr": r.lr,
            "sweep": arm_sweeps[0].to_dict() if arm_sweeps else None,
            "sweeps": [sw.to_dict() for sw in arm_sweeps],
            "budgets": [],
        }
        for b in plan.budgets:
            losses = [listed.final.get(b, {}).get(s) for s in plan.seeds]
            losses = [x for x in losses if x is not None]
            fin = _finite(r.final.get(b, {}).values())  # empty where a seed is missing
            bpbs = _finite(r.bpb.get(b, {}).values())
            lr, setting = r.choice.get(b, (None, ()))
            row: dict[str, Any] = {
                "budget": b,
                "steps": plan.steps(b),
                "lr": lr,
                "setting": dict(setting),
                # named by the split they hold (test, or val for a dataset without one): selection read val
                f"{split}_loss": {str(s): listed.final.get(b, {}).get(s) for s in plan.seeds},
                "missing": list(listed.missing.get(b, [])),
                f"{split}_loss_mean": mean(fin),
                f"{split}_loss_std": std(fin),
                f"{split}_bpb_mean": mean(bpbs),
                f"{split}_bpb_std": std(bpbs),
                "n": len(fin),
                "diverged": len(losses) - len(_finite(losses)),
                # which seeds: the mean, the bits per byte and the paired test cover the others only
                "diverged_seeds": [s for s, x in listed.final.get(b, {}).items() if not math.isfinite(x)],
            }
            if arm.label != plan.baseline:
                bfin = _finite(base.final.get(b, {}).values())
                bm = mean(bfin)
                row["rel_improvement_pct"] = (bm - row[f"{split}_loss_mean"]) / bm * 100 if fin and bm else None
                row["compared"] = not listed.missing.get(b) and not all_runs[plan.baseline].missing.get(b)
                row["difference"] = _difference(plan, base, r, b) if row["compared"] else dict(_MISSING_DIFFERENCE)
                row["welch"] = row["difference"]["welch"]
                row["left_out"] = _left_out(arm.label, row, plan.baseline, base.final.get(b, {}))
            entry["budgets"].append(row)
        st = median(r.step_times)
        entry["step_time_median"] = st
        entry["step_time_ratio"] = st / base_step if st and base_step else None
        entry["stability"] = _stability(plan, r)
        complete = all(row.get("compared", True) for row in entry["budgets"])
        if arm.label != plan.baseline and r.lr is not None and base.lr is not None and complete:
            last = entry["budgets"][-1]
            diff = last["difference"]["mean_diff"]
            if diff is None and last[f"{split}_loss_mean"] is not None and base.final.get(plan.budgets[-1]):
                diff = last[f"{split}_loss_mean"] - (mean(_finite(base.final[plan.budgets[-1]].values())) or math.nan)
            entry["speedup"] = _speedup_block(plan, base, r, diff)
        arms[arm.label] = entry
    return arms


def correct_for_multiplicity(plan: Plan, arms: dict[str, Any]) -> dict[str, Any]:
    """Holm-adjust the paired p-values of every arm against the baseline at every budget, as one family, into
    each test's "p_holm"; an arm's speedup counts as established only if its difference at the largest budget
    survives the adjustment. Returns the family's description (also the report's "multiple_comparisons")."""
    family: dict[str, list[dict[str, Any]]] = {}  # one comparison -> its tests (one per arm that names it)
    for label, e in arms.items():
        for row in e["budgets"] if label != plan.baseline else []:
            if row.get("difference", {}).get("paired"):
                family.setdefault(_same_runs(e, row), []).append(row["difference"]["paired"])
    tests = [same[0] for same in family.values()]
    for same, adjusted in zip(family.values(), holm([t["p"] for t in tests])):
        for t in same:
            t["p_holm"] = adjusted
    shared = sum(len(same) - 1 for same in family.values())
    for label, e in arms.items():
        sp, last = e.get("speedup"), e["budgets"][-1]
        if label == plan.baseline or not sp or not sp["established"]:
            continue
        t = (last.get("difference") or {}).get("paired")
        if t is None or t["p_holm"] >= ALPHA:
            sp["established"] = False
            p = "no test (one seed)" if t is None else f"Holm-adjusted p={_p(t['p_holm'])}"
            sp["why_not"] = f"its difference at {format_tokens(plan.budgets[-1])} tokens is not significant ({p})"
    return {
        "method": "holm",
        "family": f"the paired tests of every arm against {plan.baseline} at every budget ({len(tests)} tests)"
        + (f"; {shared} of an arm whose runs are another arm's, counted once" if shared else ""),
        "n_tests": len(tests),
        "alpha": ALPHA,
    }


def _left_out(label: str, row: dict[str, Any], baseline: str, base_final: dict[int, float]) -> list[str]:
    """The runs a budget's difference leaves out because they diverged ("angpt seed 2"): named wherever the
    difference is shown, so that a mean over the seeds that finished never passes for the budget's."""
    base_seeds = sorted(s for s, x in base_final.items() if not math.isfinite(x))
    return [f"{label} seed {s}" for s in row["diverged_seeds"]] + [f"{baseline} seed {s}" for s in base_seeds]


def _same_runs(entry: dict[str, Any], row: dict[str, Any]) -> str:
    """What an arm's runs at a budget are: two arm names with the same architecture, overrides, rate and setting
    name the same runs (`--arms x=angpt --lr-values x=...` at the rate angpt's sweep chose), one comparison."""
    items = [sorted((x or {}).items()) for x in (entry.get("model_overrides"), entry.get("train_overrides"))]
    rate = None if row["lr"] is None else f"{row['lr']:.6g}"  # 2e-3 x 16 and a typed 0.032 are one rate
    return repr([entry.get("arch"), *items, row["budget"], rate, sorted((row.get("setting") or {}).items())])


# --------------------------------------------------------------------------------------------- verdicts
def _p(x: float) -> str:
    return f"{x:.2g}" if x >= 1e-4 else "<1e-4"


SMOKE_P = " (p-values of a smoke test: they describe these runs, not evidence; docs/protocol.md#horizon)"


def difference_text(plan: Plan, row: dict[str, Any], smoke: bool = False) -> str:
    """'loss 0.0520 lower (1.74%), 95% CI [-0.0810, -0.0230], paired p=0.012 over 3 seeds (Welch p=0.031)'. Runs
    that diverged are named ("diverged, left out: angpt seed 2"); below the horizon (`smoke`) the p-values are said
    to describe these runs only, never bare."""
    text = _difference_text(plan, row)
    if smoke and "p=" in text:
        text += SMOKE_P
    if row.get("left_out"):
        text += f"; diverged, left out of the pairs: {', '.join(row['left_out'])}"
    return text


def _difference_text(plan: Plan, row: dict[str, Any]) -> str:
    d = row.get("difference") or {}
    md = d.get("mean_diff")
    if md is None:
        return "no seed finished by both"
    rel = row.get("rel_improvement_pct")
    rel_txt = f" ({abs(rel):.2f}%)" if rel is not None else ""
    text = f"final loss {abs(md):.4f} {'lower' if md < 0 else 'higher'}{rel_txt}"
    if d.get("note"):
        return f"{text}; interval and p-value {d['note']}"
    lead, other = ("paired", "welch") if plan.stat == "paired" else ("welch", "paired")
    t = d.get(lead)
    if t is None:  # Welch undefined (no spread in both arms) while paired is: lead with what exists
        lead, other = other, lead
        t = d[lead]
    name = {"paired": "paired", "welch": "Welch"}
    lo, hi = t["ci95"]
    text += f", 95% CI [{lo:+.4f}, {hi:+.4f}], {name[lead]} p={_p(t['p'])}"
    if t.get("p_holm") is not None:
        text += f" (Holm-adjusted {_p(t['p_holm'])})"
    text += f" over {d['n_pairs']} seeds"
    if d.get(other):
        text += f" ({name[other]} p={_p(d[other]['p'])})"
    if -LEVEL_MARGIN < lo and hi < LEVEL_MARGIN:
        text += f"; level: the interval lies within +-{LEVEL_MARGIN} nats"
    elif d.get("detectable") is not None and lo <= 0 <= hi:
        text += f"; not distinguishable: this design detects differences of {d['detectable']:.3f} nats and more"
    return text


def one_budget_text(plan: Plan, label: str, row: dict[str, Any], smoke: bool = False) -> str:
    """A one-budget comparison in a plain sentence: how far apart the arms ended, and that it is not a speedup.
    'angpt ended 0.13 nats lower than gpt+ after 1,000 steps, one seed: a demonstration, not evidence.' A smoke
    test's report says "not evidence" once at its top, so its sentence leaves that out."""
    md = (row.get("difference") or {}).get("mean_diff")
    steps = row["budget"] // plan.batch_tokens
    if md is None:
        return f"{label} vs {plan.baseline} after {steps:,} steps: no seed finished by both."
    n = len(plan.seeds)
    head = (
        f"{label} ended {abs(md):.2f} nats {'lower' if md < 0 else 'higher'} than {plan.baseline} after {steps:,} steps"
    )
    if n == 1:
        kind = "a demonstration" if smoke else "a demonstration, not evidence"
        return f"{head}, one seed: {kind} (a speedup needs several budgets, a test several seeds)."
    return f"{head} ({difference_text(plan, row, smoke)}); one budget: a speedup needs several (docs/protocol.md)."


def bounds_text(sp: dict[str, Any]) -> str:
    """How many points were bounds, and which way."""
    out = []
    if sp["n_below_range"]:
        out.append(
            f"{sp['n_below_range']} below range (speedup >= {sp['lower_bound']:.2f}x there; left out, so the mean "
            "understates)"
        )
    if sp["n_not_reached"]:
        out.append(f"{sp['n_not_reached']} not reached (speedup < {sp['upper_bound']:.2f}x there)")
    if sp["n_extrapolated"]:
        out.append(f"{sp['n_extrapolated']} extrapolated")
    return "; ".join(out)


def verdict(plan: Plan, label: str, entry: dict[str, Any], smoke: bool = False) -> str:
    """One plain-language line on an arm against the baseline, led by the difference at the largest budget."""
    b = plan.baseline
    prefix = "smoke test: " if smoke else ""
    rows = entry["budgets"]
    if entry["lr"] is None and not rows[0].get("missing"):
        return f"{prefix}{label}: every LR of its sweep diverged; no comparison possible."
    waiting = [format_tokens(r["budget"]) for r in rows if not r.get("compared", True)]
    if waiting:  # a partial report: the largest budget every seed of both arms finished leads, nothing else is said
        done = [r for r in rows if r.get("compared", True)]
        if not done:
            return f"{prefix}{label} vs {b}: no budget has every seed of both arms finished yet; no verdict (partial)."
        last = done[-1]
        head = f"{prefix}partial: {label} vs {b} at {format_tokens(last['budget'])} tokens"
        parts = [
            f"{head}: {difference_text(plan, last, smoke)}",
            f"runs missing at {', '.join(waiting)}: no speedup yet",
        ]
        if entry.get("step_time_ratio") is not None:
            parts.append(f"steps take {entry['step_time_ratio']:.2f}x the baseline's time")
        return "; ".join(parts) + "."
    last = rows[-1]
    if len(plan.budgets) == 1:
        return prefix + one_budget_text(plan, label, last, smoke)
    parts = [f"{prefix}{label} vs {b} at {format_tokens(last['budget'])} tokens: {difference_text(plan, last, smoke)}"]
    sp = entry.get("speedup")
    if sp is None:
        parts.append("no speedup (the baseline has no usable runs)")
    elif sp["established"]:
        m = sp["mean"]
        spread = f"±{sp['std']:.2f} over {sp['n_seeds']} seeds" if sp["std"] is not None else "1 seed, no spread"
        if sp.get("ci95"):
            spread += f", 95% CI [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}]"
        used = sp["n_exact"] + (sp["n_extrapolated"] if plan.extrapolate else 0)
        head = (
            f"reaches {b}'s loss with {m:.2f}x fewer tokens"
            if m >= 1
            else f"needs {1 / m:.2f}x as many tokens as {b} to reach its loss (speedup {m:.2f}x"
        )
        inner = f"{spread}; {used} of {sp['n_comparisons']} points measured"
        bounds = bounds_text(sp)
        if bounds:
            inner += f", {bounds}"
        parts.append(f"{head} ({inner})" if m >= 1 else f"{head}, {inner})")
    else:
        parts.append(f"no speedup can be claimed: {sp['why_not']}")
        if sp["n_below_range"] and not sp["n_not_reached"] and not sp["n_exact"]:
            parts[-1] += f" (all points below range, speedup >= {sp['lower_bound']:.2f}x: add smaller budgets)"
    if entry.get("step_time_ratio") is not None:
        parts.append(f"steps take {entry['step_time_ratio']:.2f}x the baseline's time")
    return "; ".join(parts) + "."


def warnings(plan: Plan, arms: dict[str, Any], meta: dict | None, horizon: dict[str, Any] | None = None) -> list[str]:
    """Everything that weakens the comparison, said plainly."""
    out = []
    if horizon is not None and (horizon.get("short_comparisons") or horizon.get("short")):
        out.append(horizon["message"])
    for label, e in arms.items():
        for sw in e["sweeps"]:
            where = f" at {format_tokens(sw['budget'])}" if e["tune"] else ""
            if sw["fixed"] and sw is e["sweeps"][0]:
                lr = format_lr(sw["best_lr"] or 0)
                source = lr_source(plan, plan.arm(label))
                out.append(f"{label}: LR {lr} is {source}, not tuned by a sweep (docs/protocol.md).")
            elif sw["best_at_edge"] and not sw["fixed"]:
                out.append(
                    f"{label}: the best LR {format_lr(sw['best_lr'] or 0)}{where} is still at an edge of its grid "
                    f"after {sw['extensions']} extension(s): the sweep is not finished (raise --max-extensions)."
                )
            if sw["best_lr"] is None:
                out.append(f"{label}: every LR of its sweep{where} diverged.")
        chk = e.get("lr_check")
        if chk is not None and chk["status"] == "flagged":
            better = format_lr(chk["best_lr"]) if chk["best_lr"] is not None else "none (all diverged)"
            gap = f", {chk['gap']:.4f} nats lower" if chk["gap"] is not None else ""
            out.append(
                f"{label}: its LR {format_lr(chk['chosen_lr'])}, chosen at {format_tokens(plan.sweep_budget)}, is not "
                f"the best of its grid neighbours at {format_tokens(chk['budget'])} on tuning seed {chk['seed']} "
                f"(best: {better}{gap}): its numbers at the larger budgets may not be its best."
            )
        elif chk is not None and chk["status"] == "pending":
            out.append(f"{label}: the LR check at {format_tokens(chk['budget'])} has not finished.")
        div = [f"seed {s} at {format_tokens(r['budget'])}" for r in e["budgets"] for s in r.get("diverged_seeds", [])]
        if div:
            out.append(
                f"{label}: {len(div)} run(s) at its chosen LR diverged ({', '.join(div)}): each counts as not "
                "reaching any loss, and its budget's means and paired differences cover the other seeds only."
            )
        stab = e["stability"]
        if stab["unstable"]:
            why = []
            if stab.get("ratio") is not None and stab["ratio"] > GRAD_NORM_RATIO_LIMIT:
                why.append(
                    f"its largest pre-clip gradient norm {stab['max_grad_norm']:.3g} is {stab['ratio']:.0f}x its "
                    f"run's median ({stab['where']})"
                )
            if stab["loss_spikes"]:
                why.append(f"{stab['loss_spikes']} loss spike(s) (first: {stab['spiky_runs'][0]})")
            out.append(f"{label}: the chosen LR looks unstable: {'; '.join(why)}; its numbers may not be its best.")
    if len(plan.seeds) == 1:
        out.append("only 1 seed: no spread, interval or p-value (use >= 3).")
    elif len(plan.seeds) < 3:
        out.append(f"only {len(plan.seeds)} seeds: spreads, intervals and p-values are weak (use >= 3).")
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


def chosen_settings(plan: Plan, entry: dict[str, Any]) -> str:
    """'2Mi: lr 0.002, weight_decay=0.1, warmup=5%; 4Mi: ...' for a tuned arm."""
    parts = []
    for row in entry["budgets"]:
        if row["lr"] is None:
            continue
        setting = format_setting(tuple(row["setting"].items()))
        parts.append(f"{format_tokens(row['budget'])}: lr {format_lr(row['lr'])}" + (f", {setting}" if setting else ""))
    return "; ".join(parts)
