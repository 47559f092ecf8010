"""Reading a ladder's store: each size's sweeps and final losses, without training anything.

Every size directory is a compare report directory; its plan.json says what ran there. The LR sweeps are settled by
compare's own rule over the stored records (angpt.compare.stored.settle_sweeps), so the report picks exactly the LRs
the runs used.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from angpt.compare.plan import Plan
from angpt.compare.stored import Unfinished, settle_sweeps
from angpt.compare.sweep import SweepResult, Sweeps, main_specs
from angpt.errors import UserError
from angpt.scaling.plan import LADDER_FILE, Ladder


@dataclass
class Point:
    """One finished main run: arm, size, its parameters N, tokens D and final validation loss."""

    arm: str
    size: str
    N: int
    D: int
    seed: int
    lr: float
    loss: float  # inf: diverged

    @property
    def compute(self) -> float:
        return 6.0 * self.N * self.D


@dataclass
class LadderData:
    """What the store holds: per size its plan and sweeps (None while unfinished), and the finished points."""

    ladder: Ladder
    plans: dict[str, Plan] = field(default_factory=dict)
    sweeps: dict[str, dict[str, SweepResult] | None] = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)
    unfinished: dict[str, str] = field(default_factory=dict)  # size -> why
    check: dict[str, SweepResult] | None = None  # the LR-transfer check's sweeps (lr_transfer ladders)


def size_dir(out: Path, name: str) -> Path:
    return out / "sizes" / name


def check_dir(out: Path, name: str) -> Path:
    return out / "lr_check" / name


def load_ladder(out: str | Path) -> Ladder:
    path = Path(out) / LADDER_FILE
    if not path.is_file():
        raise UserError(f"{out} holds no scaling ladder ({LADDER_FILE}); run `angpt scaling --out {out} ...` first")
    try:
        return Ladder.from_dict(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, TypeError, KeyError) as e:
        raise UserError(f"{path} is unreadable ({e})") from e


def at_smallest(plan: Plan, sweeps: Sweeps) -> dict[str, SweepResult]:
    """Each arm's sweep at the plan's smallest budget (the one every arm has; the LR a ladder reads)."""
    return {label: by_budget[plan.sweep_budget] for label, by_budget in sweeps.items()}


def collect_ladder(out: str | Path) -> LadderData:
    """Every finished main run of the ladder in `out`; sizes with unfinished sweeps are listed, not guessed."""
    out = Path(out)
    data = LadderData(ladder=load_ladder(out))
    for size in data.ladder.sizes:
        try:
            plan, sweeps, runs = settle_sweeps(size_dir(out, size.name))
        except Unfinished as e:
            data.sweeps[size.name] = None
            data.unfinished[size.name] = str(e)
            continue
        data.plans[size.name], data.sweeps[size.name] = plan, at_smallest(plan, sweeps)
        missing = 0
        for spec in main_specs(plan, sweeps):
            rec = runs.known(spec)
            if rec is None:
                missing += 1
                continue
            loss = (
                float(rec["val_loss"]) if rec["status"] == "finished" and rec.get("val_loss") is not None else math.inf
            )
            data.points.append(Point(spec.arm, size.name, size.params[spec.arm], spec.budget, spec.seed, spec.lr, loss))
        if missing:
            data.unfinished[size.name] = f"{missing} main run(s) not finished"
    if data.ladder.lr_transfer and len(data.ladder.sizes) > 1:
        try:
            check_plan, check, _ = settle_sweeps(check_dir(out, data.ladder.sizes[1].name))
            data.check = at_smallest(check_plan, check)
        except Unfinished:
            data.check = None
    return data
