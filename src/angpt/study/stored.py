"""Reading a report directory without training anything: its plan, the runs on disk and the sweeps they settle.

The partial report of an interrupted comparison, `angpt compare --report-only` and `angpt scaling`'s report read a
store through here. Sweeps are settled by compare's own rule (sweep.run_sweeps) over the stored records, so they
pick exactly the (LR, setting) the runs used, or will use once the comparison resumes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.errors import UserError
from angpt.study.plan import Plan
from angpt.study.store import PLAN_FILE, RunSpec, load_failure, load_record
from angpt.study.sweep import Sweeps, check_specs, main_specs, run_sweeps


class Unfinished(UserError):
    """Some runs a sweep needs have no result yet."""


class StoredRuns:
    """A read-only stand-in for compare's Runner: the records on disk; asking for a missing run raises Unfinished.

    A record that cannot be read (a half-written result.json or metrics.jsonl) counts as not finished.
    """

    def __init__(self, plan: Plan, report_dir: Path) -> None:
        self.plan, self.report_dir = plan, report_dir
        self.asked: dict[RunSpec, None] = {}  # every run a sweep asked for, in order (finished or not)
        self._cache: dict[RunSpec, dict[str, Any] | None] = {}

    def known(self, spec: RunSpec) -> dict[str, Any] | None:
        if spec not in self._cache:
            try:  # a finished record's metrics are read too: a torn last line makes it unreadable, not finished
                rec = load_record(spec.run_dir(self.plan, self.report_dir), self.plan.steps(spec.budget))
            except (OSError, ValueError):
                rec = None
            self._cache[spec] = rec
        return self._cache[spec]

    def run(self, specs: list[RunSpec]) -> None:
        self.asked.update(dict.fromkeys(specs))
        missing = [s for s in specs if self.known(s) is None]
        if missing:
            raise Unfinished(f"{len(missing)} run(s) not finished in {self.report_dir}, e.g. {missing[0].name()}")


def load_plan(report_dir: str | Path) -> Plan:
    """The plan in a report directory's plan.json; a one-line UserError when there is none or it is unreadable."""
    path = Path(report_dir) / PLAN_FILE
    if not path.is_file():
        raise UserError(f"{report_dir} holds no angpt compare report (no {PLAN_FILE}); check --out")
    try:
        return Plan.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise UserError(f"{path} is unreadable ({type(e).__name__}: {e}); was it written by another angpt?") from e


def settle_sweeps(plan_dir: Path, plan: Plan | None = None) -> tuple[Plan, Sweeps, StoredRuns]:
    """The compare plan in `plan_dir`, its arms' sweeps at every budget they are due (compare's run_plan order)
    settled from the stored runs, and those runs (Unfinished when a run a sweep needs has no result yet).

    `plan`, if given, is settled instead of the stored one: the plan a re-run would run there (one the store's
    check_report_dir accepts), which may extend it. Only the sweeps are settled (not run_plan itself): a main run
    not finished yet leaves the sweeps readable."""
    if not (plan_dir / PLAN_FILE).is_file():
        raise Unfinished(f"{plan_dir} has not started")
    plan = plan or load_plan(plan_dir)
    runs = StoredRuns(plan, plan_dir)
    sweeps: Sweeps = {a.label: {} for a in plan.arms}
    for b in plan.budgets:
        due = [a for a in plan.arms if plan.tunes_at(a, b)]
        if due:
            for label, sw in run_sweeps(plan, runs, b, due).items():
                sweeps[label][b] = sw
    return plan, sweeps, runs


@dataclass
class Stored:
    """What a report directory holds, settled as far as it goes: the sweeps whose runs all finished, the records
    of the finished main runs, and every planned run with its state (the report's list of runs)."""

    plan: Plan
    sweeps: Sweeps  # arm label -> budget -> its settled sweep (a sweep still waiting for runs is absent)
    records: dict[tuple, dict[str, Any]]  # RunSpec.key() -> record of each main run done (finished or diverged)
    runs: list[dict[str, Any]] = field(default_factory=list)  # every planned run known so far (see read_store)
    unsettled: dict[str, list[int]] = field(default_factory=dict)  # arm label -> budgets whose sweep is waiting

    @property
    def finished(self) -> int:
        return sum(r["status"] not in ("missing", "failed") for r in self.runs)

    @property
    def complete(self) -> bool:
        return self.finished == len(self.runs)


def read_store(report_dir: str | Path, plan: Plan | None = None) -> Stored:
    """Everything the store in `report_dir` holds for `plan` (default: its plan.json), never guessing.

    Sweeps are settled arm by arm (one arm's missing sweep run leaves the others' sweeps readable). `runs` lists
    every run of the plan known so far, sweeps first: each sweep's points (for a sweep still waiting, those it
    has asked for), then every arm x budget x seed main run, at its chosen (LR, setting) or, where the sweep
    deciding it is not settled, with lr None. Status is "finished", "diverged", "failed" (its worker or Slurm job
    failed: the row's "failure" holds the exit status and the log's tail) or "missing"; a sweep's best run
    doubles as the first seed's main run and is listed once (role "sweep, main"). The LR check's runs (on the
    tuning seed at the largest budget, sweep.check_specs) follow, role "lr check".
    """
    report_dir = Path(report_dir)
    plan = plan or load_plan(report_dir)
    stored_runs = StoredRuns(plan, report_dir)
    sweeps: Sweeps = {a.label: {} for a in plan.arms}
    unsettled: dict[str, list[int]] = {}
    swept: dict[RunSpec, None] = {}
    for b in plan.budgets:
        for a in plan.arms:
            if not plan.tunes_at(a, b):
                continue
            stored_runs.asked = {}
            try:
                sweeps[a.label][b] = run_sweeps(plan, stored_runs, b, [a])[a.label]
            except Unfinished:
                unsettled.setdefault(a.label, []).append(b)
            swept.update(stored_runs.asked)
    main = main_specs(plan, sweeps)
    checks = check_specs(plan, sweeps)
    rows: dict[RunSpec, dict[str, Any]] = {}
    for spec, role in [(s, "sweep") for s in swept] + [(s, "main") for s in main] + [(s, "lr check") for s in checks]:
        rec = stored_runs.known(spec)
        status = "missing" if rec is None else ("finished" if _finite_loss(rec) else "diverged")
        failure = load_failure(spec.run_dir(plan, report_dir)) if rec is None else None
        role = rows[spec]["role"] + ", " + role if spec in rows else role
        rows[spec] = {
            "arm": spec.arm,
            "budget": spec.budget,
            "seed": spec.seed,
            "lr": spec.lr,
            "setting": dict(spec.setting),
            "role": role,
            "status": status,
            "val_loss": float(rec["val_loss"]) if status == "finished" else None,  # type: ignore[index]
        }
        if failure is not None:  # its worker or job failed (store.record_failure): exit status and log tail
            rows[spec].update(status="failed", failure=failure)
    listed = list(rows.values())
    # Main runs whose (LR, setting) a sweep still waiting will choose: known to be planned, not which run.
    for label, budgets in unsettled.items():
        arm = plan.arm(label)
        waiting = [b for b in plan.budgets if b in budgets or (not arm.tune and plan.sweep_budget in budgets)]
        for b in waiting:
            for s in plan.seeds:
                if plan.tunes_at(arm, b) and s == plan.sweep_seed:
                    continue  # that run is one of the waiting sweep's points, listed above
                row = dict(arm=label, budget=b, seed=s, lr=None, setting={}, role="main", status="missing")
                listed.append({**row, "val_loss": None})
    records = {spec.key(): rec for spec in main + checks if (rec := stored_runs.known(spec)) is not None}
    return Stored(plan=plan, sweeps=sweeps, records=records, runs=listed, unsettled=unsettled)


def _finite_loss(rec: dict[str, Any]) -> bool:
    return rec.get("status") == "finished" and rec.get("val_loss") is not None
