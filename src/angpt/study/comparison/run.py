"""Running a comparison: one plan in its report folder, through the study driver, and its report.

>>> from angpt.study import make_plan, run_comparison
>>> plan = make_plan("data/", arms=["gpt+", "angpt"], budgets=["1Mi", "2Mi", "4Mi"], seeds=[0, 1, 2])
>>> report = run_comparison(plan, "reports/angpt-vs-gptplus", jobs=2)
>>> print("\\n".join(report.verdicts))

See docs/compare.md. Importing this module does not import matplotlib (plots import it when drawn).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from angpt.errors import UserError
from angpt.invocation import command_line
from angpt.study import execute
from angpt.study.comparison.report import plan_unit
from angpt.study.driver import Report, Unit, plain_jobs, run_study
from angpt.study.plan import Plan
from angpt.study.store import RunSpec
from angpt.study.sweep import Runs


class Comparison:
    """The comparison as a kind of study: one plan whose folder is the study's, its horizon, its report."""

    verb = "angpt compare"
    kind = "comparison"

    def __init__(
        self, plan: Plan, *, command: str, strict: bool, sample: str | None, sample_tokens: int, before_main=None
    ) -> None:
        from angpt.study.comparison.horizon import horizon

        self.plan, self.command, self.strict = plan, command, strict
        self.sample, self.sample_tokens, self.before_main = sample, sample_tokens, before_main
        self.horizon = horizon(plan)
        self.measured: dict[str, Any] | None = None  # what --jobs auto measured
        self.changes: list[str] | None = None
        self.result: Report | None = None

    def jobs(self, jobs: int | str, threads: int | None) -> tuple[int, int]:
        from angpt.study.jobs import choose_jobs, describe

        if jobs != "auto" and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
            raise UserError(f"jobs={jobs!r} must be a positive integer or 'auto'")
        if jobs == "auto" and threads is not None:
            raise UserError("--jobs auto chooses the threads per job too: drop --threads, or give --jobs N")
        if jobs == "auto":
            self.measured = choose_jobs(self.plan, execute.cpu_cores())
            self.auto_note = describe(self.measured)
            jobs, threads = self.measured["jobs"], self.measured["threads"]
        self._jobs, self._threads = plain_jobs(jobs, threads)  # the report records them
        return self._jobs, self._threads

    def check_horizon(self) -> None:
        if self.horizon.any_short and self.strict:
            raise UserError(f"--strict: {self.horizon.message}")

    def check(self, out: Path) -> None:
        from angpt.study.store import check_store

        self.changes = check_store(self.plan, out)
        self.check_horizon()

    def planned(self, out: Path) -> list[tuple[Plan, Path]]:
        return [(self.plan, out)]

    def dry_run(self, out: Path, jobs: int, threads: int, slurm_text: str | None = None) -> Report:
        from angpt.study.estimate import describe_dry_run

        est = describe_dry_run(self.plan, out, jobs=jobs, threads=threads, horizon_line=self.horizon.message,
                               measure=slurm_text is None)  # fmt: skip
        if self.measured is not None:
            est.text = self.auto_note + "\n" + est.text
        if self.changes:
            note = f"{out} holds this comparison with other {', '.join(self.changes)}: finished runs will be reused"
            est.text = note + "\n" + est.text
        elif self.changes is not None:
            est.text = f"{out} holds this plan already: finished runs will be skipped\n" + est.text
        est.text += f"\n\n{slurm_text}" if slurm_text else ""
        hz, measured = self.horizon.to_dict(), self.measured
        return Report(out, self.plan, True, estimate=est, horizon=hz, jobs_measurement=measured)

    def begin(self, out: Path) -> None:
        from angpt.study.estimate import long_plan_warning
        from angpt.study.store import JOBS_FILE, write_json

        if self.horizon.any_short:
            print(f"warning: {self.horizon.message}", file=sys.stderr)
        long = long_plan_warning(self.plan, out)
        if long:
            print(f"warning: {long}", file=sys.stderr)
        if self.measured is not None:
            print(self.auto_note, file=sys.stderr)
            write_json(out / JOBS_FILE, self.measured)

    def units(self, out: Path) -> Iterator[Unit]:
        yield plan_unit(
            self.plan,
            out,
            command=self.command,
            jobs=self._jobs,
            threads=self._threads,
            horizon=self.horizon.to_dict(),
            measured=self.measured,
            sample=self.sample,
            sample_tokens=self.sample_tokens,
            before_main=self.before_main,
            locked=True,
            done=lambda report: setattr(self, "result", report),
        )

    def finish(self, out: Path) -> Report:
        assert self.result is not None
        return self.result


def run_comparison(
    plan: Plan,
    report_dir: str | Path,
    *,
    jobs: int | str = 1,
    threads: int | None = None,
    dry_run: bool = False,
    progress: bool = True,
    command: str | None = None,
    strict: bool = False,
    sample: str | None = None,
    sample_tokens: int = 80,
    before_main: Callable[[Runs, list[RunSpec]], None] | None = None,
    executor: Any = None,
) -> Report:
    """Run (or resume, or extend) a comparison and write its report into `report_dir`.

    Budget by budget (smallest first): the sweeps due there (every arm's LR sweep at the smallest budget, a tuned
    arm's LR x settings sweep at each; a best LR at a grid edge extends the grid), then every arm x seed at its
    chosen LR; then report.md, report.json and the plots. Finished runs are skipped, interrupted ones resumed; a
    `report_dir` holding this plan with other arms, budgets or seeds is extended (finished runs reused), one
    holding any other plan is refused (UserError) untouched. `jobs` runs go in parallel processes, each with
    `threads` torch threads (default: cores // jobs); ``jobs="auto"`` measures the split (angpt.study.jobs).

    A largest budget below the horizon of docs/protocol.md#horizon is a warning (one line on stderr, and in the
    report, which is labelled a smoke test); with `strict` it is a UserError before anything runs. `dry_run`
    prints the planned runs and a measured time estimate and writes nothing. SIGINT or SIGTERM stops after the
    running jobs save a checkpoint (StudyInterrupted) and a PARTIAL report is written from the finished runs
    (rewrite_report does the same for a comparison that died); re-running resumes. `sample` (a prompt) ends the
    report with each arm's continuation of it (`sample_tokens` tokens at most). `before_main(runner, specs)` is
    called at each budget with its main runs about to run, after that budget's sweeps (a WSD ladder branches there).
    """
    study = Comparison(
        plan,
        command=command if command is not None else command_line(),
        strict=strict,
        sample=sample,
        sample_tokens=sample_tokens,
        before_main=before_main,
    )
    return run_study(
        study, report_dir, jobs=jobs, threads=threads, dry_run=dry_run, progress=progress, executor=executor
    )


def rewrite_report(
    report_dir: str | Path,
    *,
    plan: Plan | None = None,
    command: str | None = None,
    sample: str | None = None,
    sample_tokens: int = 80,
    machine: dict[str, Any] | None = None,
) -> Report:
    """Rewrite report.md, report.json and the plots of the comparison in `report_dir` from its run store, training
    nothing (``angpt compare --report-only``): complete, or PARTIAL while runs are missing (see
    angpt.study.comparison.report.write_stored_report). `machine` names where the runs ran when that is not this
    machine nor the one the earlier report names (a GPU kit's loans).

    The plan is the directory's plan.json; a `plan` given (the run's flags) must be that plan. The command, jobs,
    threads and machine the runs were recorded with come from the report there, if any; `command` (default: this
    process's) is recorded as the one that rewrote it. A directory without a readable plan.json, or held by a
    running comparison, is a UserError and nothing is written.
    """
    from angpt.errors import UserError
    from angpt.study.comparison.horizon import horizon as plan_horizon
    from angpt.study.comparison.report import write_stored_report
    from angpt.study.store import JOBS_FILE, check_report_dir, drifted_runs, folder_lock
    from angpt.study.stored import load_plan

    report_dir = Path(report_dir)
    stored_plan = load_plan(report_dir)
    if plan is not None:
        changes = check_report_dir(plan, report_dir)  # a different comparison: UserError
        if changes:
            raise UserError(
                f"{report_dir} holds this comparison with other {'; '.join(changes)}: --report-only rewrites the "
                "stored plan's report; drop the plan flags or repeat the stored ones"
            )
    earlier = _read_json(report_dir / "report.json") or {}
    measured = _read_json(report_dir / JOBS_FILE)
    try:
        hz: dict[str, Any] | None = plan_horizon(stored_plan).to_dict()
    except (UserError, OSError, ValueError, KeyError):  # the dataset has moved since the runs
        hz = earlier.get("horizon")
    moved = label_moved(earlier.get("horizon"), hz)
    with folder_lock(report_dir, "angpt compare"):
        data, files, stored = write_stored_report(
            report_dir,
            stored_plan,
            command=earlier.get("command") or "n/a (no earlier report)",
            jobs=earlier.get("jobs"),
            threads=earlier.get("threads"),
            horizon=hz,
            jobs_measurement=measured,
            machine=machine or earlier.get("machine"),
            rewritten_by=command if command is not None else command_line(),
            sample=sample,
            sample_tokens=sample_tokens,
        )
    try:
        drifted = drifted_runs(stored_plan, report_dir)
    except (UserError, OSError):  # the dataset has moved since the runs: nothing to compare against
        drifted = []
    if moved:
        print(f"warning: {moved}", file=sys.stderr)
    if drifted:
        print(
            f"warning: {len(drifted)} runs in {report_dir} were trained with {drifted[0][1]} (e.g. {drifted[0][0]}): "
            "the report describes those models, not what the same arms make today",
            file=sys.stderr,
        )
    return Report(
        report_dir=report_dir,
        plan=stored_plan,
        dry_run=False,
        sweeps=stored.sweeps,
        data=data,
        files=files,
        horizon=hz,
        jobs_measurement=measured,
    )


def label_moved(earlier: dict[str, Any] | None, now: dict[str, Any] | None) -> str | None:
    """What a rewritten report's horizon says that its earlier one did not (a report judged before 2026-11-28 by the
    largest arm's total parameters, now by each arm's non-embedding ones): None where no comparison's label moved."""
    from angpt.study.comparison.horizon import short_comparison

    if not earlier or not now or "short_comparisons" in earlier:
        return None
    moved = [(label, short_comparison(earlier, label)) for label in now["arms"] if label != now["baseline"]]
    moved = [(label, was) for label, was in moved if was != short_comparison(now, label)]
    if not moved:
        return None
    said = "; ".join(f"{label} against {now['baseline']}: {'smoke test' if was else 'evidence'} then, "
                     f"{'evidence' if was else 'smoke test'} now" for label, was in moved)  # fmt: skip
    return (
        "the horizon's label moved: this report was judged by its largest arm's total parameters, and is now "
        f"judged by each arm's own non-embedding parameters (docs/protocol.md#horizon): {said}"
    )


def _read_json(path: Path) -> dict[str, Any] | None:
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
