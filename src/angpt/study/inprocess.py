"""The in-process executor (`--executor inprocess`): every run of a plan in this one process, on its one device.

Each arm's model is built, and compiled where its runs compile, once: every later run of the same model sets its
weights in place to what a fresh run of its seed starts from (train/setup.py's build(model=...)), takes a new
optimizer and schedule, and reads its data in its seed's order, so it trains exactly as a separate `angpt train`
run would while the compiled graphs stay valid (tests/test_inprocess.py). A user with one GPU and many short runs
saves the compiling each run would pay afresh: 20 s (GPT+) to 80 s (anGPT) a run at the race's shape on an H200.

Runs go in the plan's order. With a deadline, a run that cannot end before it is not started, nor a reported
seed's runs at one budget (its pair of arms) unless all of them can; later runs that fit still go, and the study
stops, PARTIAL, once the plan has nothing left it may start (:class:`DeadlineReached`); the same command later
goes on. Each run's result is written as it ends.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from angpt.errors import UserError
from angpt.study.plan import Plan
from angpt.study.store import RunSpec


class ModelCache:
    """The models earlier runs of this process built, by what they are (model config, dtype, compiling): lent to a
    later run of the same model (train()'s `models`)."""

    def __init__(self) -> None:
        self.models: dict[str, tuple[Any, Any, bool]] = {}  # key -> (model, forward, compiled)

    @staticmethod
    def key(run: Any) -> str:
        """What a run's model must share with an earlier one's to be lent it (a ResolvedRun)."""
        t = run.train
        what = [run.model.to_dict(), t.dtype, t.compile, t.activation_checkpointing, t.fused_loss]
        return json.dumps(what, sort_keys=True)

    def lend(self, run: Any) -> dict[str, Any]:
        """build()'s keywords for `run`: an earlier run's model and forward, or, for a new model, whether its
        compiling resets Dynamo (only the process's first: a reset would drop the earlier models' graphs)."""
        got = self.models.get(self.key(run))
        if got is not None:
            return {"model": got[0], "forward": got[1]}
        return {"fresh_compile": not any(compiled for _, _, compiled in self.models.values())}

    def keep(self, run: Any, built: Any) -> None:
        self.models.setdefault(self.key(run), (built.model, built.forward, bool(run.train.compile)))


Estimate = Callable[[RunSpec, bool], float]  # (run, its arm's model built already in this process) -> seconds


@dataclass
class InProcess:
    """The in-process executor's settings: its `deadline` (a time.time(), None: none), how long a run takes
    (`estimate`; default :func:`store_estimate`), the clock, what trains a run (`train`: the study's execute_run; a
    stand-in in the tests and in the GPU kit's look-ahead, which runs the same rules on estimates) and what is done
    with each result as it is written (`after`: the GPU kit packs it to bring back)."""

    deadline: float | None = None
    estimate: Estimate | None = None
    clock: Callable[[], float] = time.time
    train: Callable[..., dict[str, Any]] | None = None
    after: Callable[[RunSpec, dict[str, Any]], None] | None = None  # called as each run's result is written
    models: ModelCache = field(default_factory=ModelCache)
    built: set[str] = field(default_factory=set)  # arms whose model this process has built
    started: list[RunSpec] = field(default_factory=list)  # runs started, in order
    skipped: list[RunSpec] = field(default_factory=list)  # runs left unstarted by the deadline


def groups(plan: Plan, specs: list[RunSpec]) -> list[list[RunSpec]]:
    """`specs` in order, as the units that start together: a reported seed's runs at one budget (a pair of arms,
    or as many as the plan has) stay together; any other run (a sweep's, an LR check's) goes alone."""
    out: list[list[RunSpec]] = []
    for spec in specs:
        last = out[-1] if out else None
        paired = plan.tuning_seed is not None and spec.seed in plan.seeds  # a reported seed's run
        same = last is not None and (last[0].budget, last[0].seed) == (spec.budget, spec.seed)
        if paired and same and spec.arm not in {s.arm for s in last}:
            last.append(spec)
        else:
            out.append([spec])
    return out


def run_groups(plan: Plan, specs: list[RunSpec], ex: InProcess, train_one: Callable[[RunSpec], None]) -> None:
    """Start each group of `specs` (:func:`groups`) that can end before the deadline, in order; one that cannot is
    recorded in `ex.skipped` and the next is tried. `train_one` trains a run and records it."""
    estimate = ex.estimate or (lambda spec, built: 0.0)
    for group in groups(plan, specs):
        if ex.deadline is not None:
            need, built = 0.0, set(ex.built)
            for spec in group:
                need += estimate(spec, spec.arm in built)
                built.add(spec.arm)
            if ex.clock() + need > ex.deadline:
                ex.skipped += group
                continue
        for spec in group:
            ex.started.append(spec)
            train_one(spec)
            ex.built.add(spec.arm)


def store_estimate(plan: Plan, known: Callable[[RunSpec], dict | None], records: Callable[[], list[dict]]) -> Estimate:
    """A run's seconds from what the store and this process measured: its arm's median step time over its finished
    runs (else the step `angpt train --dry-run` plans for it on this machine), times its steps and evaluations, plus,
    where its model is not built yet, what an earlier run's first step took beyond a step (the compiling)."""
    from angpt.study.estimate import estimate_run_seconds

    planned: dict[str, float] = {}

    def step_and_setup(arm: str) -> tuple[float, float]:
        mine = [r for r in records() if r.get("arm") == arm and r.get("step_time_median")]
        if mine:
            step = sorted(r["step_time_median"] for r in mine)[len(mine) // 2]
            setup = [r["first_step_s"] - r["step_time_median"] for r in mine
                     if r.get("first_step_s") and not r.get("model_reused")]  # fmt: skip
            return step, max(setup, default=0.0)
        if not planned:
            from angpt.study.estimate import planned_steps

            planned.update({k: r.step_time for k, r in planned_steps(plan, gpus=1, gpu=None).items()})
        return planned[arm], 0.0

    def estimate(spec: RunSpec, built: bool) -> float:
        step, setup = step_and_setup(spec.arm)
        return estimate_run_seconds(plan, step, spec.budget, 0.0 if built else setup)

    return estimate


def parse_deadline(text: str) -> float:
    """`--deadline`: seconds from now, as 570, 570s, 9.5m or 2h; a one-line UserError otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"--deadline {text!r}: give seconds from now, e.g. 570, 9.5m or 2h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
