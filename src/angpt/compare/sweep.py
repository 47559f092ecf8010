"""The sweep rule and the order of the runs: each arm's LR sweep (with its tuned settings, at every budget for a
tuned arm), extended at an edge optimum, and the main runs, budget by budget."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from angpt.compare.plan import Arm, Plan, Setting
from angpt.compare.store import RunSpec

if TYPE_CHECKING:
    from angpt.compare.runner import Runner

Point = tuple[float, Setting]  # (LR, tuned setting) of one sweep run


@dataclass
class SweepResult:
    """One arm's sweep at one budget with the first seed: every (LR, setting) tried and the best.

    An untuned arm is swept once, at the smallest budget, over LRs only (its setting is ``()``); a tuned arm at
    every budget over LR x settings. The LR grid is extended at an edge of the best setting's LRs.
    """

    arm: str
    budget: int
    grid: list[float]  # every LR tried, ascending
    losses: dict[Point, float | None]  # final val loss per (LR, setting) (None: diverged)
    best: Point | None  # None: every run diverged
    extensions: int
    at_edge: bool  # the best LR still sits at an edge of its grid (sweep not finished)
    fixed: bool  # a single-point LR grid: the LR was given, not tuned

    @property
    def best_lr(self) -> float | None:
        return None if self.best is None else self.best[0]

    @property
    def best_setting(self) -> Setting:
        return () if self.best is None else self.best[1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "budget": self.budget,
            "rows": [
                {"lr": lr, "setting": dict(setting), "val_loss": loss}
                for (lr, setting), loss in sorted(self.losses.items(), key=lambda kv: (kv[0][1], kv[0][0]))
            ],
            "best_lr": self.best_lr,
            "best_setting": dict(self.best_setting),
            "extensions": self.extensions,
            "best_at_edge": self.at_edge,
            "fixed": self.fixed,
        }


Sweeps = dict[str, dict[int, SweepResult]]  # arm label -> budget -> its sweep there


def _loss(rec: dict[str, Any] | None) -> float:
    if rec is None or rec.get("status") != "finished" or rec.get("val_loss") is None:
        return math.inf
    v = float(rec["val_loss"])
    return v if math.isfinite(v) else math.inf


def run_sweeps(
    plan: Plan,
    runner: Runner,
    budget: int | None = None,
    arms: list[Arm] | None = None,
    *,
    on_extension: Callable[[int], None] | None = None,
    also: list[RunSpec] | None = None,
) -> dict[str, SweepResult]:
    """The sweeps of `arms` (default: every arm) at `budget` (default: the smallest) with the first seed.

    The arms' grids run together (in parallel with jobs > 1, with the runs `also`), then any extensions: a best
    LR at an edge of its setting's LRs adds the next LR beyond it for that setting, up to `max_extensions` times.
    """
    b, s = budget or plan.sweep_budget, plan.sweep_seed
    arms = list(plan.arms if arms is None else arms)
    tried = {a.label: {st: plan.initial_grid(a) for st in a.settings()} for a in arms}
    extensions = {a.label: 0 for a in arms}
    settled: dict[str, SweepResult] = {}
    batch_extra = list(also or [])
    while len(settled) < len(arms):
        pending = [a for a in arms if a.label not in settled]
        specs = [RunSpec(a.label, b, s, lr, st) for a in pending for st, lrs in tried[a.label].items() for lr in lrs]
        runner.run(specs + batch_extra)
        batch_extra = []
        for a in pending:
            losses = {
                (lr, st): _loss(runner.known(RunSpec(a.label, b, s, lr, st)))
                for st, lrs in tried[a.label].items()
                for lr in lrs
            }
            finite = {p: v for p, v in losses.items() if math.isfinite(v)}
            best = min(finite, key=lambda p: (finite[p], p[0], p[1])) if finite else None
            if best is None:
                # Every run diverged: the rates are too high, so the only sensible direction is down.
                edge, grow = -1, list(tried[a.label])
            else:
                lrs = tried[a.label][best[1]]
                edge, grow = (-1 if best[0] == lrs[0] else (1 if best[0] == lrs[-1] else 0)), [best[1]]
            at_edge = len(plan.initial_grid(a)) > 1 and edge != 0
            if at_edge and extensions[a.label] < plan.max_extensions:
                for st in grow:
                    lrs = tried[a.label][st]
                    tried[a.label][st] = sorted(lrs + [Plan.extend(lrs, edge)])
                extensions[a.label] += 1
                if on_extension is not None:
                    on_extension(b * len(grow))
                continue
            settled[a.label] = SweepResult(
                arm=a.label,
                budget=b,
                grid=sorted({lr for lr, _ in losses}),
                losses={p: (v if math.isfinite(v) else None) for p, v in losses.items()},
                best=best,
                extensions=extensions[a.label],
                at_edge=at_edge,
                fixed=len(plan.initial_grid(a)) == 1,
            )
    return {a.label: settled[a.label] for a in arms}


def chosen(plan: Plan, sweeps: Sweeps, label: str, budget: int) -> Point | None:
    """The (LR, setting) an arm's runs at `budget` use: a tuned arm's own sweep there, another arm's sweep at the
    smallest budget; None when every run of that sweep diverged (or it has not settled: never another budget's)."""
    due = budget if plan.tunes_at(plan.arm(label), budget) else plan.sweep_budget
    sw = sweeps.get(label, {}).get(due)
    return None if sw is None else sw.best


def main_specs(plan: Plan, sweeps: Sweeps, budgets: list[int] | None = None, arms: list[Arm] | None = None):
    """Every arm x budget x seed at the arm's chosen (LR, setting), budget by budget and, within a budget, seed by
    seed (the sweep's own run is one of them)."""
    out = []
    for b in plan.budgets if budgets is None else budgets:
        for s in plan.seeds:
            for a in plan.arms if arms is None else arms:
                point = chosen(plan, sweeps, a.label, b)
                if point is not None:
                    out.append(RunSpec(a.label, b, s, point[0], point[1]))
    return out


def run_plan(
    plan: Plan,
    runner: Runner,
    on_extension: Callable[[int], None] | None = None,
    before_main: Callable[[Runner, list[RunSpec]], None] | None = None,
) -> Sweeps:
    """Every run of the plan, budget-major: at each budget (ascending) the sweeps due there, then every arm x seed
    (`before_main(runner, specs)` sees those main runs just before they run: angpt.scaling seeds WSD branches).

    So an interrupted comparison holds every arm at each budget it finished (and, within the budget it stopped
    in, at the seeds it finished): the budgets done can be compared. Arms already settled at a budget run their
    main runs beside that budget's sweeps (parallel jobs stay busy).
    """
    sweeps: Sweeps = {a.label: {} for a in plan.arms}
    for b in plan.budgets:
        due = [a for a in plan.arms if plan.tunes_at(a, b)]
        ready = main_specs(plan, sweeps, [b], [a for a in plan.arms if a not in due])
        if due:
            for label, sw in run_sweeps(plan, runner, b, due, on_extension=on_extension, also=ready).items():
                sweeps[label][b] = sw
        specs = main_specs(plan, sweeps, [b])
        if before_main is not None:
            before_main(runner, specs)
        runner.run(specs)
    return sweeps
