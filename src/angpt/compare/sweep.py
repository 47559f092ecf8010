"""The LR sweep rule: each arm's grid at the smallest budget, extended at an edge optimum, and the main runs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from angpt.compare.plan import Plan
from angpt.compare.store import RunSpec

if TYPE_CHECKING:
    from angpt.compare.runner import Runner


@dataclass
class SweepResult:
    """One arm's learning-rate sweep at the smallest budget and first seed."""

    arm: str
    grid: list[float]  # every LR tried, ascending
    losses: dict[float, float | None]  # final val loss per LR (None: diverged)
    best: float | None  # None: every run diverged
    extensions: int
    at_edge: bool  # the best LR still sits at an edge of the grid (sweep not finished)
    fixed: bool  # a single-point grid: the LR was given, not tuned

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "rows": [{"lr": lr, "val_loss": self.losses.get(lr)} for lr in self.grid],
            "best_lr": self.best,
            "extensions": self.extensions,
            "best_at_edge": self.at_edge,
            "fixed": self.fixed,
        }


def _loss(rec: dict[str, Any] | None) -> float:
    if rec is None or rec.get("status") != "finished" or rec.get("val_loss") is None:
        return math.inf
    v = float(rec["val_loss"])
    return v if math.isfinite(v) else math.inf


def run_sweeps(plan: Plan, runner: Runner, on_extension: Callable[[int], None] | None = None) -> dict[str, SweepResult]:
    """Every arm's LR sweep; the arms' grids run together (in parallel with jobs > 1), then any extensions."""
    grids = {a.label: plan.initial_grid(a) for a in plan.arms}
    extensions = {a.label: 0 for a in plan.arms}
    settled: dict[str, SweepResult] = {}
    b, s = plan.sweep_budget, plan.sweep_seed
    while len(settled) < len(plan.arms):
        pending = [a for a in plan.arms if a.label not in settled]
        runner.run([RunSpec(a.label, b, s, lr) for a in pending for lr in grids[a.label]])
        for a in pending:
            grid = grids[a.label]
            losses = {lr: _loss(runner.known(RunSpec(a.label, b, s, lr))) for lr in grid}
            finite = {lr: v for lr, v in losses.items() if math.isfinite(v)}
            best = min(finite, key=lambda lr: (finite[lr], lr)) if finite else None
            if best is None:
                edge = -1  # every LR diverged: the rates are too high, so the only sensible direction is down
            else:
                edge = -1 if best == grid[0] else (1 if best == grid[-1] else 0)
            at_edge = len(grid) > 1 and edge != 0
            if at_edge and extensions[a.label] < plan.max_extensions:
                new = Plan.extend(grid, edge)
                grids[a.label] = sorted(grid + [new])
                extensions[a.label] += 1
                if on_extension is not None:
                    on_extension(b)
                continue
            settled[a.label] = SweepResult(
                arm=a.label,
                grid=grid,
                losses={lr: (v if math.isfinite(v) else None) for lr, v in losses.items()},
                best=best,
                extensions=extensions[a.label],
                at_edge=at_edge,
                fixed=len(plan.initial_grid(a)) == 1,
            )
    return {a.label: settled[a.label] for a in plan.arms}


def main_specs(plan: Plan, sweeps: dict[str, SweepResult]) -> list[RunSpec]:
    """Every arm x budget x seed at the arm's best LR (the sweep's own run is one of them)."""
    return [
        RunSpec(a.label, b, s, sweeps[a.label].best)  # type: ignore[arg-type]
        for a in plan.arms
        if sweeps[a.label].best is not None
        for b in plan.budgets
        for s in plan.seeds
    ]
