"""`angpt compare`: fair, resumable comparisons of architectures at several token budgets (docs/protocol.md).

>>> from angpt.compare import make_plan, run_comparison
>>> plan = make_plan("data/", arms=["gpt+", "angpt"], budgets=["1Mi", "2Mi", "4Mi"], seeds=[0, 1, 2])
>>> report = run_comparison(plan, "reports/angpt-vs-gptplus", jobs=2)
>>> print("\\n".join(report.verdicts))

See docs/compare.md. Importing this package does not import matplotlib (plots import it when drawn).
"""

from __future__ import annotations

import shlex
import sys
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
from angpt.compare.stats import BudgetSpeedup, Reach, WelchResult, betainc, speedups, tokens_to_reach, welch_ttest
from angpt.compare.store import RunSpec
from angpt.compare.sweep import SweepResult

__all__ = [
    "DEFAULT_ARMS",
    "DEFAULT_LR_GRID",
    "Arm",
    "BudgetSpeedup",
    "DryRun",
    "Plan",
    "Reach",
    "Report",
    "RunSpec",
    "SweepResult",
    "WelchResult",
    "betainc",
    "format_tokens",
    "make_plan",
    "parse_arm",
    "parse_settings",
    "parse_tokens",
    "run_comparison",
    "speedups",
    "split_arms",
    "tokens_to_reach",
    "welch_ttest",
]


@dataclass
class Report:
    """What :func:`run_comparison` did: for a dry run the plan and estimate, else the measures and files."""

    report_dir: Path
    plan: Plan
    dry_run: bool
    sweeps: dict[str, SweepResult] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # the content of report.json
    files: dict[str, Path] = field(default_factory=dict)
    trained: list[RunSpec] = field(default_factory=list)  # runs trained by this call (finished ones are skipped)
    estimate: DryRun | None = None

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
    jobs: int = 1,
    threads: int | None = None,
    dry_run: bool = False,
    progress: bool = True,
    command: str | None = None,
    sample: str | None = None,
    sample_tokens: int = 80,
) -> Report:
    """Run (or resume) a comparison and write its report into `report_dir`.

    First each arm's LR sweep (at the smallest budget, first seed; a best LR at a grid edge extends the grid),
    then every arm x budget x seed at the arm's best LR, then report.md, report.json and the plots. Finished
    runs are skipped, interrupted ones resumed. `jobs` runs go in parallel processes, each with `threads` torch
    threads (default: cores // jobs). A `report_dir` holding another plan is refused (UserError) untouched.
    `dry_run` prints the planned runs and a measured time estimate and writes nothing. `sample` (a prompt) ends
    the report with each arm's continuation of it (`sample_tokens` tokens at most).
    """
    from angpt.compare.estimate import describe_dry_run
    from angpt.compare.runner import cpu_cores
    from angpt.compare.store import PLAN_FILE, check_report_dir, report_lock, write_json
    from angpt.errors import UserError

    if not isinstance(jobs, int) or jobs < 1:
        raise UserError(f"jobs={jobs!r} must be a positive integer")
    threads = threads or max(1, cpu_cores() // jobs)
    report_dir = Path(report_dir)
    command = command if command is not None else shlex.join(["angpt", *sys.argv[1:]])
    exists = check_report_dir(plan, report_dir)
    if dry_run:
        est = describe_dry_run(plan, report_dir, jobs=jobs, threads=threads)
        if exists:
            est.text = f"{report_dir} holds this plan already: finished runs will be skipped\n" + est.text
        return Report(report_dir=report_dir, plan=plan, dry_run=True, estimate=est)

    report_dir.mkdir(parents=True, exist_ok=True)
    with report_lock(report_dir):
        if not exists:
            write_json(report_dir / PLAN_FILE, plan.to_dict())
        return _run_locked(
            plan,
            report_dir,
            jobs=jobs,
            threads=threads,
            progress=progress,
            command=command,
            sample=sample,
            sample_tokens=sample_tokens,
        )


def _run_locked(
    plan: Plan,
    report_dir: Path,
    *,
    jobs: int,
    threads: int,
    progress: bool,
    command: str,
    sample: str | None,
    sample_tokens: int,
) -> Report:
    from angpt.compare.progress import Progress, token_counts
    from angpt.compare.report import write_report
    from angpt.compare.runner import Runner
    from angpt.compare.sweep import main_specs, run_sweeps

    # The bar counts tokens, with runs already finished in an earlier invocation counted as done.
    total, done = token_counts(plan, report_dir)
    bar = Progress(progress, max(total, done), min(done, max(total, done)))
    runner = Runner(plan, report_dir, jobs=jobs, threads=threads, progress=bar)
    try:
        sweeps = run_sweeps(plan, runner, on_extension=bar.add_total)
        runner.run(main_specs(plan, sweeps))
    except KeyboardInterrupt:
        bar.close()
        print(f"comparison interrupted: re-run the same command to resume ({report_dir})", file=sys.stderr)
        raise
    finally:
        bar.close()
    data, files = write_report(
        plan,
        report_dir,
        sweeps,
        runner.records,
        command=command,
        jobs=jobs,
        threads=threads,
        sample=sample,
        sample_tokens=sample_tokens,
    )
    return Report(
        report_dir=report_dir,
        plan=plan,
        dry_run=False,
        sweeps=sweeps,
        data=data,
        files=files,
        trained=list(runner.trained),
    )
