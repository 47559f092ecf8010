"""The sweep rule and the order of the runs: each arm's LR sweep (with its tuned settings, at every budget for a
tuned arm), extended at an edge optimum, and the main runs, budget by budget."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from angpt.study.arms import Arm, Setting
from angpt.study.plan import Plan
from angpt.study.store import RunSpec


class Runs(Protocol):
    """Where a sweep's runs come from: an execute.Runner that trains them, or stored.StoredRuns that reads them."""

    def run(self, specs: list[RunSpec]) -> None: ...

    def known(self, spec: RunSpec) -> dict[str, Any] | None: ...


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
    runner: Runs,
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
        specs.sort(key=lambda spec: _priority(plan, spec))
        runner.run(specs + batch_extra)
        batch_extra = []
        unfinished = [spec for spec in specs if runner.known(spec) is None]
        if unfinished:  # not started (an executor's deadline): a rate not run is not a rate that diverged
            raise SweepUnfinished(f"{len(unfinished)} sweep run(s) not run, e.g. {unfinished[0].name()}")
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


class SweepUnfinished(Exception):
    """A sweep's runs were not all run (an executor stopped at its deadline): it cannot settle yet."""


def _priority(plan: Plan, spec: RunSpec) -> tuple:
    """A sweep's runs in the order they go: every arm's centre rate first, then each arm's next nearest on either
    side (the lower first), and so on, so that a sweep cut short (a deadline) has tuned every arm as far."""
    grid = plan.initial_grid(plan.arm(spec.arm))
    centre = grid[len(grid) // 2]
    return (round(abs(math.log(spec.lr / centre)), 9), spec.lr > centre, [a.label for a in plan.arms].index(spec.arm))


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


def check_lrs(sweep: SweepResult) -> list[float]:
    """The chosen LR and its two neighbours in the sweep's grid (beyond an edge: the next grid step), ascending."""
    assert sweep.best is not None
    grid, lr = sweep.grid, sweep.best[0]
    i = grid.index(lr)
    lower = grid[i - 1] if i > 0 else Plan.extend(grid, -1)
    upper = grid[i + 1] if i + 1 < len(grid) else Plan.extend(grid, 1)
    return [lower, lr, upper]


def check_specs(plan: Plan, sweeps: Sweeps) -> list[RunSpec]:
    """The runs of the LR check: every checked arm with a settled sweep, on the tuning seed at the largest budget,
    at its chosen LR and the two neighbouring grid LRs."""
    out = []
    for a in plan.arms:
        sw = sweeps.get(a.label, {}).get(plan.sweep_budget)
        if plan.checks_lr(a) and sw is not None and sw.best is not None:
            out += [RunSpec(a.label, plan.budgets[-1], plan.sweep_seed, lr) for lr in check_lrs(sw)]
    return out


def lr_check(plan: Plan, sweeps: Sweeps, label: str, known: Callable[[RunSpec], dict | None]) -> dict | None:
    """Whether the LR chosen at the smallest budget is still the best of itself and its grid neighbours at the
    largest budget, on the tuning seed (None: the arm is not checked, or its sweep has not settled).

    status "confirmed": it is, so the best LR there lies within one grid step of it; "flagged": a neighbour is
    better (by `gap` nats), so the best may lie one step or more away; "pending": a check run has not finished.
    Final validation losses decide, as in the sweep; a diverged run counts as infinitely bad.
    """
    arm = plan.arm(label)
    sw = sweeps.get(label, {}).get(plan.sweep_budget)
    if not plan.checks_lr(arm) or sw is None or sw.best is None:
        return None
    b, chosen_lr = plan.budgets[-1], sw.best[0]
    losses: dict[float, float | None] = {}
    pending = False
    for lr in check_lrs(sw):
        rec = known(RunSpec(label, b, plan.sweep_seed, lr))
        pending |= rec is None
        v = _loss(rec)
        losses[lr] = v if math.isfinite(v) else None
    out: dict[str, Any] = {
        "budget": b,
        "seed": plan.sweep_seed,
        "chosen_lr": chosen_lr,
        "rows": [{"lr": lr, "val_loss": v} for lr, v in losses.items()],
        "best_lr": None,
        "gap": None,
        "status": "pending",
    }
    if pending:
        return out
    finite = {lr: v for lr, v in losses.items() if v is not None}
    best = min(finite, key=lambda lr: (finite[lr], lr)) if finite else None
    out["best_lr"] = best
    if best == chosen_lr:
        out["status"] = "confirmed"
    else:
        out["status"] = "flagged"
        c = losses[chosen_lr]
        out["gap"] = None if best is None or c is None else c - finite[best]
    return out


def budget_order(plan: Plan) -> list[int]:
    """The budgets in the order their runs go: the one every arm is swept at first (its rates decide the others'),
    then the rest ascending."""
    return [plan.sweep_budget] + [b for b in plan.budgets if b != plan.sweep_budget]


def run_plan(
    plan: Plan,
    runner: Runs,
    on_extension: Callable[[int], None] | None = None,
    before_main: Callable[[Runs, list[RunSpec]], None] | None = None,
) -> Sweeps:
    """Every run of the plan, budget-major (:func:`budget_order`): at each budget the sweeps due there, then every
    arm x seed (at the largest, with the LR check's runs: :func:`check_specs`)
    (`before_main(runner, specs)` sees those main runs just before they run: a scaling ladder seeds WSD branches).

    So an interrupted comparison holds every arm at each budget it finished (and, within the budget it stopped
    in, at the seeds it finished): the budgets done can be compared. Arms already settled at a budget run their
    main runs beside that budget's sweeps (parallel jobs stay busy).
    """
    sweeps: Sweeps = {a.label: {} for a in plan.arms}
    for b in budget_order(plan):
        due = [a for a in plan.arms if plan.tunes_at(a, b)]
        ready = main_specs(plan, sweeps, [b], [a for a in plan.arms if a not in due])
        if due:
            for label, sw in run_sweeps(plan, runner, b, due, on_extension=on_extension, also=ready).items():
                sweeps[label][b] = sw
        specs = main_specs(plan, sweeps, [b])
        if before_main is not None:
            before_main(runner, specs)
        # The LR check runs beside the largest budget's main runs (parallel jobs stay busy).
        runner.run(specs + (check_specs(plan, sweeps) if b == plan.budgets[-1] else []))
    return sweeps
