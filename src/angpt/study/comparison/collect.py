"""Collecting a comparison's main runs from the report directory: final losses, step times, curves, stability."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.study.arms import Setting
from angpt.study.plan import Plan
from angpt.study.store import RunSpec, read_rows, run_health
from angpt.study.sweep import Sweeps, chosen


@dataclass
class ArmRuns:
    """The main runs of one arm at its chosen LR (and, for a tuned arm, each budget's chosen setting)."""

    label: str
    lr: float | None  # the LR chosen at the smallest budget (None: every sweep run diverged)
    final: dict[int, dict[int, float]] = field(default_factory=dict)  # budget -> seed -> val loss (inf: diverged)
    bpb: dict[int, dict[int, float | None]] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    curves: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # seed -> (tokens, val loss), largest
    choice: dict[int, tuple[float, Setting]] = field(default_factory=dict)  # budget -> (LR, setting) used there
    health: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)  # budget -> seed -> run_health
    missing: dict[int, list[int]] = field(default_factory=dict)  # budget -> seeds with no record yet (partial)


def collect(plan: Plan, report_dir: Path, sweeps: Sweeps, records: dict[tuple, dict]) -> dict[str, ArmRuns]:
    """Final losses, bits per byte, step times, stability and the largest budget's validation curves of every arm.

    Only runs in `records` count: a budget or seed not reached yet (an interrupted comparison) is absent from
    `final` and listed in `missing`, as is every seed of a budget whose sweep has not settled. Curves are kept only
    where every seed finished (a mean over the seeds done so far would pass for the arm's curve).
    """
    out: dict[str, ArmRuns] = {}
    for arm in plan.arms:
        first = chosen(plan, sweeps, arm.label, plan.sweep_budget)
        runs = ArmRuns(arm.label, None if first is None else first[0])
        out[arm.label] = runs
        for b in plan.budgets:
            due = b if plan.tunes_at(arm, b) else plan.sweep_budget
            if due not in sweeps.get(arm.label, {}):
                runs.missing[b] = list(plan.seeds)
                continue
            point = chosen(plan, sweeps, arm.label, b)
            if point is None:
                continue
            runs.choice[b] = point
            runs.final[b], runs.bpb[b], runs.health[b] = {}, {}, {}
            for s in plan.seeds:
                spec = RunSpec(arm.label, b, s, point[0], point[1])
                rec = records.get(spec.key())
                if rec is None:
                    runs.missing.setdefault(b, []).append(s)
                    continue
                key = "test" if plan.report_split == "test" else "val"  # selection used val; reports use test
                loss = rec.get(f"{key}_loss") if rec["status"] == "finished" else None
                diverged = loss is None or not math.isfinite(float(loss))  # a NaN loss failed as a diverged run did
                runs.final[b][s] = math.inf if diverged else float(loss)
                runs.bpb[b][s] = None if diverged else rec.get(f"{key}_bpb")
                rows = read_rows(spec.run_dir(plan, report_dir))
                # Records written before runs carried their health get it from their metrics.
                runs.health[b][s] = rec if "max_grad_norm" in rec else {**rec, **run_health(rows)}
                # The first step of a run pays one-off costs (allocation, kernel selection): leave it out.
                runs.step_times += [r["step_time"] for r in rows if "step_time" in r and r["step"] > 1]
                if b == plan.budgets[-1]:
                    runs.curves[s] = [(int(r["tokens"]), float(r["val_loss"])) for r in rows if "val_loss" in r]
        if runs.missing.get(plan.budgets[-1]):
            runs.curves = {}
    return out
