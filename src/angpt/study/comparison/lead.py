"""Where a lead comes from, what one seed of tuning already says, and what the seeds can detect.

- **Along the run**: each arm against the baseline at every evaluation point of the largest budget's runs, seed by
  seed (the same tokens in the same order), with the difference and, in words, where it is behind and where ahead.
  Normalised models are often behind early and ahead only once the rate has decayed (the GPU race's first loan:
  anGPT behind GPT+ until step 660 of 1,052, ahead from 792 on); a final number alone hides that.
- **The tuning seed at the chosen rates**: each arm's sweep run at the rate its validation loss chose. A one-seed
  screen, whose rates were chosen on these very runs: never a reported number, but the first answer a comparison
  has (its test loss beside it).
- **What the seeds detect**: the smallest true difference the reported seeds find with 80% power (paired t, alpha
  0.05), at the spread they show and at a planning spread of our own CPU reports' paired differences.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from angpt.stats import detectable_difference
from angpt.study.plan import Plan
from angpt.study.store import RunSpec, read_rows
from angpt.study.sweep import Sweeps

# The standard deviation of per-seed paired differences (arm - baseline, final loss) pooled over 43 comparisons of
# our committed CPU reports (0.013-0.030 each): what a plan assumes before its own seeds show theirs (issue 53).
PLANNING_SD = 0.0245


def curve(run_dir: Path) -> dict[int, float]:
    """{step: validation loss} of a run's evaluations (metrics.jsonl)."""
    return {int(r["step"]): float(r["val_loss"]) for r in read_rows(run_dir) if r.get("val_loss") is not None}


def along(base: dict[int, float], arm: dict[int, float], steps: int) -> list[dict[str, Any]]:
    """The two runs' validation losses at every step both evaluated, and the difference (arm - baseline)."""
    return [{"step": s, "fraction": s / steps, "base": base[s], "arm": arm[s], "diff": arm[s] - base[s]}
            for s in sorted(set(base) & set(arm))]  # fmt: skip


def words(label: str, baseline: str, points: list[dict[str, Any]], steps: int) -> str:
    """Where `label` is behind `baseline` and where ahead along the run, from the mean difference at each point:
    'angpt is behind gpt+ at steps 132-660 (13-63% of the run; +0.027 to +0.036), ahead from step 792 (75%) to the
    end (-0.030 to -0.079)'."""
    if not points:
        return f"{label} against {baseline}: no evaluation both runs made"
    spans: list[list[dict[str, Any]]] = []
    for p in points:
        side = p["diff"] > 0
        if spans and (spans[-1][0]["diff"] > 0) == side:
            spans[-1].append(p)
        else:
            spans.append([p])
    parts = []
    for span in spans:
        behind = span[0]["diff"] > 0
        a, b = span[0], span[-1]
        end = "the end" if b["step"] == steps else f"{b['step']:,}"
        where = (f"at step {a['step']:,} ({a['fraction']:.0%})" if a is b else
                 f"from step {a['step']:,} to {end} ({a['fraction']:.0%}-{b['fraction']:.0%} of the run)")  # fmt: skip
        lo, hi = min(p["diff"] for p in span), max(p["diff"] for p in span)
        size = f"{hi:+.3f}" if a is b else f"{lo:+.3f} to {hi:+.3f}"
        parts.append(f"{'behind' if behind else 'ahead'} {where}, {size}")
    return f"{label} against {baseline} (validation loss, {label} - {baseline}): " + "; ".join(parts)


def mean_points(per_seed: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The points every seed has, each with the mean over seeds of the two losses and the difference."""
    if not per_seed:
        return []
    common = set.intersection(*({p["step"] for p in pts} for pts in per_seed.values()))
    out = []
    for s in sorted(common):
        at = [next(p for p in pts if p["step"] == s) for pts in per_seed.values()]
        out.append({k: (sum(p[k] for p in at) / len(at) if k not in ("step", "fraction") else at[0][k])
                    for k in ("step", "fraction", "base", "arm", "diff")})  # fmt: skip
    return out


def lead(plan: Plan, report_dir: Path, sweeps: Sweeps, records: dict[tuple, dict]) -> dict[str, Any]:
    """Every arm against the baseline along its runs at the largest budget, per reported seed that both finished,
    with the mean over those seeds and its words."""
    from angpt.study.sweep import chosen

    b, steps, out = plan.budgets[-1], plan.steps(plan.budgets[-1]), {}
    base_point = chosen(plan, sweeps, plan.baseline, b)
    for arm in plan.arms:
        point = chosen(plan, sweeps, arm.label, b)
        if arm.label == plan.baseline or point is None or base_point is None:
            continue
        per_seed = {}
        for s in plan.seeds:
            specs = RunSpec(arm.label, b, s, *point), RunSpec(plan.baseline, b, s, *base_point)
            if all(records.get(x.key(), {}).get("status") == "finished" for x in specs):
                mine, theirs = (curve(x.run_dir(plan, report_dir)) for x in specs)
                per_seed[s] = along(theirs, mine, steps)
        mean = mean_points(per_seed)
        out[arm.label] = {"seeds": per_seed, "mean": mean, "words": words(arm.label, plan.baseline, mean, steps)}
    return out


def sweep_records(plan: Plan, report_dir: Path, label: str) -> list[dict[str, Any]]:
    """Every finished (or diverged) run of `label`'s sweep at the sweep budget on the sweep seed, from the store:
    what a sweep still waiting for a run has so far."""
    import json

    from angpt.study.store import RESULT_FILE, load_record

    arm, b = plan.arm(label), plan.sweep_budget
    folder = plan.run_dir(report_dir, arm, b, plan.sweep_seed, 1.0).parent
    out = []
    for path in sorted(folder.glob(f"*/{RESULT_FILE}")):
        rec = load_record(path.parent, plan.steps(b))
        if rec is not None:
            out.append({**rec, "setting": dict(json.loads(json.dumps(rec.get("setting") or {})))})
    return out


def tuning_screen(plan: Plan, report_dir: Path, sweeps: Sweeps) -> dict[str, Any] | None:
    """Each arm's sweep run at its chosen rate on the tuning seed (an arm whose sweep still waits for a run: its best
    so far): its final validation loss (what chose it) and test loss, the differences to the baseline's, and the
    difference along the run. None where the sweeps run on a reported seed (a plan without a tuning seed) or the
    baseline has no finished sweep run."""
    if plan.tuning_seed is None:
        return None
    b, steps = plan.sweep_budget, plan.steps(plan.sweep_budget)
    runs = {}
    for arm in plan.arms:
        done = [r for r in sweep_records(plan, report_dir, arm.label) if _finite(r.get("val_loss"))]
        if not done:
            continue
        best = min(done, key=lambda r: (r["val_loss"], r["lr"]))
        sw = sweeps.get(arm.label, {}).get(b)
        if sw is None:
            status = "waiting for a run"
        else:
            status = "at an edge (capped)" if sw.at_edge and not sw.fixed else "finished"
        spec = RunSpec(arm.label, b, plan.sweep_seed, best["lr"], tuple(sorted(best["setting"].items())))
        runs[arm.label] = (spec, best, status, _next_rates(plan, arm, done, best) if sw is None else [])
    if plan.baseline not in runs:
        return None
    base_spec, base_rec, _, _ = runs[plan.baseline]
    base_curve = curve(base_spec.run_dir(plan, report_dir))
    out: dict[str, Any] = {"seed": plan.sweep_seed, "budget": b, "steps": steps, "arms": {}}
    for label, (spec, rec, status, after) in runs.items():
        row: dict[str, Any] = {"lr": spec.lr, "setting": dict(spec.setting), "val_loss": rec.get("val_loss"),
                               "test_loss": rec.get("test_loss"), "sweep": status, "next": after}  # fmt: skip
        if label != plan.baseline:
            for key in ("val_loss", "test_loss"):
                mine, theirs = rec.get(key), base_rec.get(key)
                row[f"{key}_diff"] = mine - theirs if _finite(mine) and _finite(theirs) else None
            points = along(base_curve, curve(spec.run_dir(plan, report_dir)), steps)
            row["along"] = points
            row["words"] = words(label, plan.baseline, points, steps)
        out["arms"][label] = row
    return out


def _next_rates(plan: Plan, arm: Any, done: list[dict[str, Any]], best: dict[str, Any]) -> list[float]:
    """The rates a sweep still waiting runs next (its best setting's): its initial grid's not run yet, else the step
    beyond the edge its best sits at."""
    tried = sorted({r["lr"] for r in done if r["setting"] == best["setting"]})
    missing = [lr for lr in plan.initial_grid(arm) if lr not in tried]
    if missing:
        return missing
    if len(tried) > 1 and best["lr"] in (tried[0], tried[-1]):
        return [Plan.extend(tried, -1 if best["lr"] == tried[0] else 1)]
    return []


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


FIVE = 5  # the seeds evidence uses (docs/protocol.md#paired-statistics): what the report sizes a difference at


def power(plan: Plan, arms: dict[str, Any]) -> dict[str, Any]:
    """Per arm, at the largest budget: the reported seeds both arms finished, and the smallest true difference a
    paired t-test at alpha 0.05 (unadjusted) finds with 80% power: with those seeds at the spread they show (two or
    more) and at PLANNING_SD, and with five seeds at PLANNING_SD. Empty for a plan of one seed and no tuning seed
    (`make demo`'s: nothing is tested)."""
    if len(plan.seeds) < 2 and plan.tuning_seed is None:
        return {}
    out = {}
    for label, e in arms.items():
        if label == plan.baseline:
            continue
        d = e["budgets"][-1].get("difference") or {}
        n = d.get("n_pairs", 0)
        out[label] = {
            "n": n,
            "planning_sd": PLANNING_SD,
            "detectable_observed": d.get("detectable"),
            "detectable_planning_sd": detectable_difference(PLANNING_SD, n) if n >= 2 else None,
            "detectable_five": detectable_difference(PLANNING_SD, FIVE),
        }
    return out


def power_text(label: str, row: dict[str, Any]) -> str:
    """'angpt: 3 reported seeds, which detect 0.050 nats at the spread they show (0.076 at the planning spread);
    five seeds detect 0.041 at the planning spread (...)'."""
    n = row["n"]
    head = f"{label}: {n} reported seed{'s' if n != 1 else ''}"
    if row.get("detectable_observed") is not None:
        head += f", which detect {row['detectable_observed']:.3f} nats at the spread they show"
        if row.get("detectable_planning_sd") is not None:
            head += f" ({row['detectable_planning_sd']:.3f} at the planning spread)"
    elif row.get("detectable_planning_sd") is not None:
        head += f", which detect {row['detectable_planning_sd']:.3f} nats at the planning spread"
    else:
        head += ": no spread to test yet"
    return (f"{head}; five seeds detect {row['detectable_five']:.3f} nats at the planning spread (80% power, paired t "
            f"at alpha 0.05 unadjusted; planning spread {row['planning_sd']} nats, our CPU reports' paired "
            "differences)")  # fmt: skip
