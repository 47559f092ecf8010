"""`angpt compare`: fair, resumable comparisons of architectures at several token budgets (docs/protocol.md).

>>> from angpt.compare import make_plan, run_comparison
>>> plan = make_plan("data/", arms=["gpt+", "angpt"], budgets=["1Mi", "2Mi", "4Mi"], seeds=[0, 1, 2])
>>> report = run_comparison(plan, "reports/angpt-vs-gptplus", jobs=2)
>>> print("\\n".join(report.verdicts))

See docs/compare.md. Importing this package does not import matplotlib (plots import it when drawn).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.compare.estimate import DryRun
from angpt.compare.plan import (
    DEFAULT_ARMS,
    DEFAULT_LR_GRID,
    Arm,
    Plan,
    format_tokens,
    make_plan,
    parse_arm,
    parse_settings,
    parse_tokens,
    split_arms,
)
from angpt.compare.runner import ComparisonInterrupted
from angpt.compare.stats import (
    BudgetSpeedup,
    Reach,
    TTest,
    WelchResult,
    betainc,
    paired_ttest,
    speedups,
    t_quantile,
    tokens_to_reach,
    welch_ttest,
)
from angpt.compare.store import RunSpec
from angpt.compare.sweep import SweepResult, Sweeps
from angpt.invocation import command_line

__all__ = [
    "DEFAULT_ARMS",
    "DEFAULT_LR_GRID",
    "Arm",
    "BudgetSpeedup",
    "ComparisonInterrupted",
    "DryRun",
    "Plan",
    "Reach",
    "Report",
    "RunSpec",
    "SweepResult",
    "Sweeps",
    "TTest",
    "WelchResult",
    "betainc",
    "format_tokens",
    "make_plan",
    "parse_arm",
    "parse_settings",
    "paired_ttest",
    "parse_tokens",
    "rewrite_report",
    "run_comparison",
    "speedups",
    "split_arms",
    "t_quantile",
    "tokens_to_reach",
    "welch_ttest",
]


@dataclass
class Report:
    """What :func:`run_comparison` did: for a dry run the plan and estimate, else the measures and files."""

    report_dir: Path
    plan: Plan
    dry_run: bool
    sweeps: Sweeps = field(default_factory=dict)  # arm label -> budget -> its sweep there
    data: dict[str, Any] = field(default_factory=dict)  # the content of report.json
    files: dict[str, Path] = field(default_factory=dict)
    trained: list[RunSpec] = field(default_factory=list)  # runs trained by this call (finished ones are skipped)
    estimate: DryRun | None = None
    horizon: dict[str, Any] | None = None  # horizon.Horizon.to_dict(): is this evidence or a smoke test?
    jobs_measurement: dict[str, Any] | None = None  # what --jobs auto measured

    @property
    def verdicts(self) -> list[str]:
        return list(self.data.get("verdicts", []))

    @property
    def arms(self) -> dict[str, Any]:
        """Per-arm measures (final losses, bpb, improvement, p-values, speedup, step time, sweep)."""
        return dict(self.data.get("arms", {}))


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
    before_main: Callable[[Any, list[RunSpec]], None] | None = None,
) -> Report:
    """Run (or resume, or extend) a comparison and write its report into `report_dir`.

    Budget by budget (smallest first): the sweeps due there (every arm's LR sweep at the smallest budget, a tuned
    arm's LR x settings sweep at each; a best LR at a grid edge extends the grid), then every arm x seed at its
    chosen LR; then report.md, report.json and the plots. Finished runs are skipped, interrupted ones resumed; a
    `report_dir` holding this plan with other arms, budgets or seeds is extended (finished runs reused), one
    holding any other plan is refused (UserError) untouched. `jobs` runs go in parallel processes, each with
    `threads` torch threads (default: cores // jobs); ``jobs="auto"`` measures the split (angpt.compare.jobs).

    A largest budget below the horizon of docs/protocol.md#horizon is a warning (one line on stderr, and in the
    report, which is labelled a smoke test); with `strict` it is a UserError before anything runs. `dry_run`
    prints the planned runs and a measured time estimate and writes nothing. SIGINT or SIGTERM stops after the
    running jobs save a checkpoint (ComparisonInterrupted) and a PARTIAL report is written from the finished runs
    (rewrite_report does the same for a comparison that died); re-running resumes. `sample` (a prompt) ends the report
    with each arm's continuation of it (`sample_tokens` tokens at most). `before_main(runner, specs)` is
    called at each budget with its main runs about to run, after that budget's sweeps (angpt.scaling seeds WSD
    branches there).
    """
    from angpt.compare.estimate import describe_dry_run
    from angpt.compare.horizon import horizon as plan_horizon
    from angpt.compare.jobs import JOBS_FILE, choose_jobs, describe
    from angpt.compare.runner import cpu_cores
    from angpt.compare.store import PLAN_FILE, check_store, report_lock, write_json
    from angpt.errors import UserError

    if jobs != "auto" and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise UserError(f"jobs={jobs!r} must be a positive integer or 'auto'")
    if jobs == "auto" and threads is not None:
        raise UserError("--jobs auto chooses the threads per job too: drop --threads, or give --jobs N")
    report_dir = Path(report_dir)
    command = command if command is not None else command_line()
    changes = check_store(plan, report_dir)
    hz = plan_horizon(plan)
    if hz.short and strict:
        raise UserError(f"--strict: {hz.message}")
    if hz.short and not dry_run:
        print(f"warning: {hz.message}", file=sys.stderr)
    measured = None
    if jobs == "auto":
        measured = choose_jobs(plan, cpu_cores())
        jobs, threads = measured["jobs"], measured["threads"]
        if not dry_run:  # a dry run prints it with the plan
            print(describe(measured), file=sys.stderr)
    assert isinstance(jobs, int)
    threads = threads or max(1, cpu_cores() // jobs)
    if dry_run:
        est = describe_dry_run(plan, report_dir, jobs=jobs, threads=threads, horizon_line=hz.message)
        if measured is not None:
            est.text = describe(measured) + "\n" + est.text
        if changes:
            note = f"{report_dir} holds this comparison with other {', '.join(changes)}: finished runs will be reused"
            est.text = note + "\n" + est.text
        elif changes is not None:
            est.text = f"{report_dir} holds this plan already: finished runs will be skipped\n" + est.text
        return Report(
            report_dir=report_dir,
            plan=plan,
            dry_run=True,
            estimate=est,
            horizon=hz.to_dict(),
            jobs_measurement=measured,
        )

    report_dir.mkdir(parents=True, exist_ok=True)
    with report_lock(report_dir):
        if changes:
            print(f"extending {report_dir}: {'; '.join(changes)} (finished runs are reused)", file=sys.stderr)
        if changes is None or changes:
            write_json(report_dir / PLAN_FILE, plan.to_dict())
        if measured is not None:
            write_json(report_dir / JOBS_FILE, measured)
        return _run_locked(
            plan,
            report_dir,
            jobs=jobs,
            threads=threads,
            progress=progress,
            command=command,
            horizon=hz.to_dict(),
            measured=measured,
            sample=sample,
            sample_tokens=sample_tokens,
            before_main=before_main,
        )


def _run_locked(
    plan: Plan,
    report_dir: Path,
    *,
    jobs: int,
    threads: int,
    progress: bool,
    command: str,
    horizon: dict[str, Any],
    measured: dict[str, Any] | None,
    sample: str | None,
    sample_tokens: int,
    before_main: Callable[[Any, list[RunSpec]], None] | None = None,
) -> Report:
    from angpt.compare.progress import Progress, token_counts
    from angpt.compare.report import write_report
    from angpt.compare.runner import Runner, TerminateAsInterrupt
    from angpt.compare.sweep import run_plan

    # The bar counts tokens, with runs already finished in an earlier invocation counted as done.
    total, done = token_counts(plan, report_dir)
    bar = Progress(progress, max(total, done), min(done, max(total, done)))
    runner = Runner(plan, report_dir, jobs=jobs, threads=threads, progress=bar)
    report_kw: dict[str, Any] = {
        "command": command,
        "jobs": jobs,
        "threads": threads,
        "horizon": horizon,
        "jobs_measurement": measured,
        "sample": sample,
        "sample_tokens": sample_tokens,
    }
    try:
        with TerminateAsInterrupt():
            sweeps = run_plan(plan, runner, on_extension=bar.add_total, before_main=before_main)
    except KeyboardInterrupt:
        bar.close()
        print(f"comparison interrupted: re-run the same command to resume ({report_dir})", file=sys.stderr)
        _write_partial(plan, report_dir, **report_kw)
        raise
    finally:
        bar.close()
    data, files = write_report(plan, report_dir, sweeps, runner.records, **report_kw)
    return Report(
        report_dir=report_dir,
        plan=plan,
        dry_run=False,
        sweeps=sweeps,
        data=data,
        files=files,
        trained=list(runner.trained),
        horizon=horizon,
        jobs_measurement=measured,
    )


def _write_partial(plan: Plan, report_dir: Path, **kw: Any) -> None:
    """The report of an interrupted comparison, from what its store holds (PARTIAL unless every run finished).

    It only reads the runs and writes the report's own files; a failure costs one warning line and leaves the
    interruption (its exit code) to stand.
    """
    from angpt.compare.report import write_stored_report

    try:
        _, files, stored = write_stored_report(report_dir, plan, **kw)
    except Exception as e:  # noqa: BLE001 - the interruption, not its report, decides how the command ends
        print(f"warning: no partial report written ({type(e).__name__}: {e})", file=sys.stderr)
        return
    what = "report" if stored.complete else "partial report"
    print(
        f"{what} ({stored.finished} of {len(stored.runs)} planned runs finished): {files['report.md']}", file=sys.stderr
    )


def rewrite_report(
    report_dir: str | Path,
    *,
    plan: Plan | None = None,
    command: str | None = None,
    sample: str | None = None,
    sample_tokens: int = 80,
) -> Report:
    """Rewrite report.md, report.json and the plots of the comparison in `report_dir` from its run store, training
    nothing (``angpt compare --report-only``): complete, or PARTIAL while runs are missing (see
    angpt.compare.report.write_stored_report).

    The plan is the directory's plan.json; a `plan` given (the run's flags) must be that plan. The command, jobs,
    threads and machine the runs were recorded with come from the report there, if any; `command` (default: this
    process's) is recorded as the one that rewrote it. A directory without a readable plan.json, or held by a
    running comparison, is a UserError and nothing is written.
    """
    from angpt.compare.horizon import horizon as plan_horizon
    from angpt.compare.jobs import JOBS_FILE
    from angpt.compare.report import write_stored_report
    from angpt.compare.store import check_report_dir, drifted_runs, report_lock
    from angpt.compare.stored import load_plan
    from angpt.errors import UserError

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
    except (UserError, OSError, ValueError):  # the dataset has moved since the runs
        hz = earlier.get("horizon")
    with report_lock(report_dir):
        data, files, stored = write_stored_report(
            report_dir,
            stored_plan,
            command=earlier.get("command") or "n/a (no earlier report)",
            jobs=earlier.get("jobs"),
            threads=earlier.get("threads"),
            horizon=hz,
            jobs_measurement=measured,
            machine=earlier.get("machine"),
            rewritten_by=command if command is not None else command_line(),
            sample=sample,
            sample_tokens=sample_tokens,
        )
    try:
        drifted = drifted_runs(stored_plan, report_dir)
    except (UserError, OSError):  # the dataset has moved since the runs: nothing to compare against
        drifted = []
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


def _read_json(path: Path) -> dict[str, Any] | None:
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
