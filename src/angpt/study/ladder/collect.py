"""Reading a ladder's store: each size's sweeps and final losses, without training anything.

Every size directory is a compare report directory; its plan.json says what ran there. The LR sweeps are settled by
compare's own rule over the stored records (angpt.study.stored.settle_sweeps), so the report picks exactly the LRs
the runs used.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from angpt.errors import UserError
from angpt.study.ladder.plan import LADDER_FILE, Ladder
from angpt.study.plan import Plan
from angpt.study.store import PLAN_FILE
from angpt.study.stored import Unfinished, settle_sweeps
from angpt.study.sweep import SweepResult, Sweeps, main_specs


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


def transferred_lrs(sweeps: dict) -> dict[str, float]:
    """Each arm's best LR at the smallest size, to reuse at every larger size."""
    out = {}
    for label, sw in sweeps.items():
        lr = sw.best_lr
        if lr is None:
            raise UserError(
                f"arm {label!r} diverged at every LR of the smallest size's sweep: there is no LR to transfer; "
                "lower its --lr, or drop --lr-transfer"
            )
        out[label] = lr
    return out


def size_plans(ladder: Ladder, out: Path) -> tuple[list[Plan], bool]:
    """Every size's compare plan, each store in `out` checked against it by compare's check_store (and the LR-transfer
    check's store against its plan), as each size's comparison checks it on reaching the size: a store holding another
    plan, runs a changed model default makes another model, or a directory that is no compare report, is that
    one-line UserError before anything runs.

    With --lr-transfer the larger sizes fix the LRs the smallest size's store settled (UserError, as the run would
    say, when an arm diverged at every LR there). Until its sweep has finished they are unknown: a larger size's
    plan fixes its store's own one-point LRs in their place (every other key checked as the run checks it), and the
    run checks the real ones on reaching the size. Returns the plans and whether their LRs are known (no stand-ins).
    """
    from angpt.study.ladder.collect import at_smallest
    from angpt.study.store import check_store
    from angpt.study.stored import Unfinished, settle_sweeps

    first = ladder.size_plan(0)
    check_store(first, size_dir(out, ladder.sizes[0].name))
    transferred = None
    if ladder.lr_transfer:
        check_store(ladder.check_plan(), check_dir(out, ladder.sizes[1].name))
        try:
            _, sweeps, _ = settle_sweeps(size_dir(out, ladder.sizes[0].name), first)
            transferred = transferred_lrs(at_smallest(first, sweeps))
        except Unfinished:
            pass
    plans = [first]
    for i, size in enumerate(ladder.sizes[1:], start=1):
        here = size_dir(out, size.name)
        lrs = (transferred or _stored_point_lrs(ladder, here)) if ladder.lr_transfer else None
        plans.append(ladder.size_plan(i, lrs))
        check_store(plans[-1], here)
    return plans, transferred is not None or not ladder.lr_transfer


def _stored_point_lrs(ladder: Ladder, here: Path) -> dict[str, float]:
    """Stand-ins for the transferred LRs before they are known: each arm's one-point --lr-values in the store at
    `here`, 1.0 where it holds none (that store holds no transferred plan for the arm, whatever LR is transferred)."""
    try:
        stored = json.loads((here / PLAN_FILE).read_text()).get("lr_values") or {}
    except (OSError, ValueError, AttributeError):  # none yet, or unreadable: check_report_dir says so
        stored = {}
    lrs = {}
    for a in ladder.arms:
        values = stored.get(a.label) if isinstance(stored, dict) else None
        one = isinstance(values, list) and len(values) == 1 and isinstance(values[0], (int, float))
        lrs[a.label] = float(values[0]) if one else 1.0
    return lrs
