"""Running a study of a scaling folder (a ladder, a batch-size study) through the driver, then the scaling report
over everything the folder holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.invocation import command_line
from angpt.study.batch.plan import BatchStudy
from angpt.study.batch.run import BatchSizeStudy
from angpt.study.driver import run_study
from angpt.study.ladder.plan import Ladder
from angpt.study.ladder.run import LadderStudy


@dataclass
class ScalingRun:
    """What a ladder or a batch-size study did: the dry run's text, or the report it wrote and the runs it trained."""

    out: Path
    dry_run: bool
    text: str = ""  # the dry run's plan and estimate
    report: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    trained: int = 0


def run_scaling(
    study: LadderStudy | BatchSizeStudy,
    out: str | Path,
    *,
    jobs: int = 1,
    threads: int | None = None,
    dry_run: bool = False,
    progress: bool = True,
    executor: Any = None,
    bootstrap: int = 200,
    fit_seed: int = 0,
) -> ScalingRun:
    """Run (or resume) `study` in `out` through the driver, then rewrite the scaling report there (`bootstrap`
    resamples of each fit, seeded `fit_seed`). `dry_run` prints the plan and a measured time estimate of the work
    left, writing nothing. `executor` is where the runs go (study/flags.py's executor_options: each a Slurm job,
    or all in this process; None: --jobs here)."""
    from angpt.study.scaling import report

    out = Path(out)
    text = run_study(study, out, jobs=jobs, threads=threads, dry_run=dry_run, progress=progress, executor=executor)
    if dry_run:
        return ScalingRun(out, True, text=text)
    written, files = report.write_scaling_report(out, command=study.command, bootstrap=bootstrap, seed=fit_seed)
    return ScalingRun(out, False, report=written, files=files, trained=study.trained)


def run_ladder(ladder: Ladder, out: str | Path, *, command: str | None = None, **kw: Any) -> ScalingRun:
    """Every size's plan, smallest first, each in OUT/sizes/<size> (its sweep, its runs, its comparison report),
    then the scaling report (:func:`run_scaling`'s keywords). With lr_transfer the smallest size's best LRs are
    fixed for the larger sizes, and the second size is swept as well (OUT/lr_check) to test the transfer. With the
    WSD schedule the shorter budgets branch off the longest run (ladder/wsd.py). An `out` holding this ladder with
    fewer sizes is extended: the new sizes run, the stored ones reuse their finished runs (ladder/run.py's
    check_ladder_dir says what may differ)."""
    return run_scaling(LadderStudy(ladder, command=command or command_line()), out, **kw)


def run_batch_study(study: BatchStudy, out: str | Path, *, command: str | None = None, **kw: Any) -> ScalingRun:
    """Every batch size's plan, each in OUT/batch/<batch>, then the scaling report (:func:`run_scaling`'s
    keywords)."""
    return run_scaling(BatchSizeStudy(study, command=command or command_line()), out, **kw)
