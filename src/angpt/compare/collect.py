"""Collecting a finished comparison's main runs from the report directory: final losses, step times, curves."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from angpt.compare.plan import Plan
from angpt.compare.store import RunSpec, read_rows
from angpt.compare.sweep import SweepResult


@dataclass
class ArmRuns:
    """The main runs of one arm at its chosen LR."""

    label: str
    lr: float | None
    final: dict[int, dict[int, float]] = field(default_factory=dict)  # budget -> seed -> val loss (inf: diverged)
    bpb: dict[int, dict[int, float | None]] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    curves: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # seed -> (tokens, val loss), largest


def collect(
    plan: Plan, report_dir: Path, sweeps: dict[str, SweepResult], records: dict[tuple, dict]
) -> dict[str, ArmRuns]:
    """Final losses, bits per byte, step times and the largest budget's validation curves of every arm."""
    out: dict[str, ArmRuns] = {}
    for arm in plan.arms:
        lr = sweeps[arm.label].best
        runs = ArmRuns(arm.label, lr)
        out[arm.label] = runs
        if lr is None:
            continue
        for b in plan.budgets:
            runs.final[b], runs.bpb[b] = {}, {}
            for s in plan.seeds:
                rec = records.get(RunSpec(arm.label, b, s, lr).key())
                if rec is None:
                    continue
                diverged = rec["status"] != "finished" or rec.get("val_loss") is None
                runs.final[b][s] = math.inf if diverged else float(rec["val_loss"])
                runs.bpb[b][s] = None if diverged else rec.get("val_bpb")
                rows = read_rows(plan.run_dir(report_dir, arm, b, s, lr))
                # The first step of a run pays one-off costs (allocation, kernel selection): leave it out.
                runs.step_times += [r["step_time"] for r in rows if "step_time" in r and r["step"] > 1]
                if b == plan.budgets[-1]:
                    runs.curves[s] = [(int(r["tokens"]), float(r["val_loss"])) for r in rows if "val_loss" in r]
    return out
