"""The one driver of every kind of study: a comparison, a scaling ladder, a batch-size study.

A study is one or more plans, each with its run store in a folder of its own (a comparison's is the study's
folder; a ladder's are OUT/sizes/<size>). A kind of study (a :class:`Study`) supplies what differs: what its folder
must hold, its dry run, its plans in order (each a :class:`Unit` with its report: comparison/report.py's
plan_unit), and its report. The driver does the rest, the same for every kind:

1. the check of the study's folder and of every plan's store, before anything trains;
2. the jobs and threads (``--jobs auto`` measures them, where the kind allows it);
3. the dry run, which writes nothing; or
4. under the study folder's lock: each plan in turn (its sweeps and runs through one Runner and one progress bar,
   then its own report), then the study's report. An interruption stops after the running jobs save; the plan's
   partial report is written and the message says how to resume.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from angpt.errors import DeadlineReached, UserError
from angpt.study import execute
from angpt.study.execute import RunFailed, Runner, TerminateAsInterrupt
from angpt.study.plan import Plan
from angpt.study.progress import Progress, token_counts
from angpt.study.store import PLAN_FILE, RunSpec, check_store, folder_lock, write_json
from angpt.study.sweep import Runs, Sweeps, SweepUnfinished, run_plan


@dataclass
class Executed:
    """What one plan's execution left: its settled sweeps, the records of its runs, the runs this call trained."""

    sweeps: Sweeps
    records: dict[tuple, dict[str, Any]]
    trained: list[RunSpec] = field(default_factory=list)


@dataclass
class Unit:
    """One plan of a study, where it runs, and what follows it."""

    plan: Plan
    folder: Path
    command: str  # the command its report records
    report: Callable[[Executed], Any]  # its own report, once its runs are done
    partial: Callable[[], None]  # its report when interrupted (from what its store holds)
    before_main: Callable[[Runs, list[RunSpec]], None] | None = None  # a scaling ladder's WSD branches
    locked: bool = False  # its folder is the study's own, locked already


@dataclass
class Report:
    """What one plan of a study did (a comparison is one; a ladder has one a size): for a dry run the plan and
    estimate, else the measures and files of its report."""

    report_dir: Path
    plan: Plan
    dry_run: bool
    sweeps: Sweeps = field(default_factory=dict)  # arm label -> budget -> its sweep there
    data: dict[str, Any] = field(default_factory=dict)  # the content of report.json
    files: dict[str, Path] = field(default_factory=dict)
    trained: list[RunSpec] = field(default_factory=list)  # runs trained by this call (finished ones are skipped)
    estimate: Any = None  # a dry run's estimate (angpt.study.estimate.DryRun)
    horizon: dict[str, Any] | None = None  # horizon.Horizon.to_dict(): is this evidence or a smoke test?
    jobs_measurement: dict[str, Any] | None = None  # what --jobs auto measured

    @property
    def verdicts(self) -> list[str]:
        return list(self.data.get("verdicts", []))

    @property
    def arms(self) -> dict[str, Any]:
        """Per-arm measures (final losses, bpb, improvement, p-values, speedup, step time, sweep)."""
        return dict(self.data.get("arms", {}))


class Study(Protocol):
    """What a kind of study supplies to the driver."""

    verb: str  # the command that holds the folder's lock ("angpt compare", "angpt scaling")
    kind: str  # what it is, in the messages: "comparison", "scaling ladder", "batch-size study"

    def jobs(self, jobs: int | str, threads: int | None) -> tuple[int, int]:
        """The jobs and threads to run with (the kind may measure them: ``--jobs auto``)."""
        ...

    def check(self, out: Path) -> None:
        """A one-line UserError unless `out` and every plan's store may hold this study."""
        ...

    def dry_run(self, out: Path, jobs: int, threads: int, slurm_text: str | None = None) -> Any:
        """The study's plan and time estimate, writing nothing; with `slurm_text` (a Slurm dry run's scripts and
        GPU-hours) at its end, and no step measured here, where no run will train."""
        ...

    def planned(self, out: Path) -> list[tuple[Plan, Path]]:
        """Every plan known before any run, with its folder (a later plan may fix rates an earlier one chooses)."""
        ...

    def begin(self, out: Path) -> None:
        """Under the lock, before the first plan: the study's own files (scaling.json, jobs.json, ...)."""
        ...

    def units(self, out: Path) -> Iterator[Unit]:
        """The plans in the order they run; a later one may depend on an earlier one's results."""
        ...

    def finish(self, out: Path) -> Any:
        """What run_study returns once every plan has run: a comparison's Report (None for a ladder and a batch-size
        study, whose folder's report follows them: scaling/run.py)."""
        ...


class ScalingKind:
    """What the scaling ladder and the batch-size study share as kinds of study: the verb, jobs as given (no
    measuring), the runs their plans trained (`count` each plan's Report), and no report of their own (their
    folder's follows them: scaling/run.py)."""

    verb = "angpt scaling"

    def __init__(self, command: str) -> None:
        self.command, self.trained = command, 0

    def jobs(self, jobs: int | str, threads: int | None) -> tuple[int, int]:
        self._jobs, self._threads = plain_jobs(jobs, threads)
        return self._jobs, self._threads

    def count(self, report: Report) -> None:
        self.trained += len(report.trained)

    def finish(self, out: Path) -> None:
        return None


def plain_jobs(jobs: int | str, threads: int | None) -> tuple[int, int]:
    """Jobs (a positive integer) and threads per job (default: the cores shared out), for kinds without auto."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise UserError(f"jobs={jobs!r} must be a positive integer")
    return jobs, threads or max(1, execute.cpu_cores() // jobs)


def run_study(study: Study, out: str | Path, *, jobs: int | str = 1, threads: int | None = None,
              dry_run: bool = False, progress: bool = True, executor: Any = None) -> Any:  # fmt: skip
    """Run (or resume, or extend) `study` in `out`; its dry run with `dry_run` (nothing is written). `executor` is
    where the runs go: None, `jobs` worker processes here (one: this process); study/slurm.py's SlurmOptions, each
    run a Slurm job (`jobs` and `threads` are then this machine's only); study/inprocess.py's InProcess, every run
    in this process with each arm's model built once, and its deadline. A deadline that leaves runs unstarted stops
    the study as an interruption does (inprocess.DeadlineReached): its report is PARTIAL, re-running goes on."""
    from angpt.study.slurm import SlurmOptions

    out = Path(out)
    study.check(out)
    jobs, threads = study.jobs(jobs, threads)
    slurm = executor if isinstance(executor, SlurmOptions) else None
    if slurm is not None:
        from angpt.study import slurm_plan

        slurm_plan.check(study.planned(out), slurm)
    if dry_run:
        text = slurm_plan.describe(study.planned(out), slurm) if slurm is not None else None
        return study.dry_run(out, jobs, threads, text)
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out, study.verb):
        study.begin(out)
        for unit in study.units(out):
            try:
                run_unit(unit, study.verb, jobs=jobs, threads=threads, progress=progress, executor=executor)
            except KeyboardInterrupt as e:
                where = f" at {unit.folder.relative_to(out)}" if unit.folder != out else ""
                deadline = isinstance(e, DeadlineReached)
                what, then = (f"stopped at its deadline ({e})", "go on") if deadline else ("interrupted", "resume")
                print(f"{study.kind} {what}{where}: re-run the same command to {then} ({out})", file=sys.stderr)
                raise
        return study.finish(out)


def run_unit(unit: Unit, verb: str, *, jobs: int, threads: int, progress: bool, executor: Any = None) -> Any:
    """One plan: its store checked and its plan.json written (a new or extended plan), its runs, its report."""
    folder, plan = unit.folder, unit.plan
    with nullcontext() if unit.locked else folder_lock(folder, verb):
        changes = check_store(plan, folder)
        if changes:
            print(f"extending {folder}: {'; '.join(changes)} (finished runs are reused)", file=sys.stderr)
        folder.mkdir(parents=True, exist_ok=True)
        if changes is None or changes:
            write_json(folder / PLAN_FILE, plan.to_dict())
        total, done = token_counts(plan, folder)  # the bar counts tokens, finished runs as done
        bar = Progress(progress, max(total, done), min(done, max(total, done)))
        runner = Runner(plan, folder, jobs=jobs, threads=threads, progress=bar, executor=executor)
        try:
            with TerminateAsInterrupt():
                try:
                    sweeps = run_plan(plan, runner, on_extension=bar.add_total, before_main=unit.before_main)
                except SweepUnfinished:
                    runner.stop_at_deadline()  # a sweep whose runs the deadline left unstarted
                    raise
                runner.stop_at_deadline()
        except (KeyboardInterrupt, RunFailed):
            bar.close()
            unit.partial()  # a failed run is listed there with its log's tail
            raise
        finally:
            bar.close()
        return unit.report(Executed(sweeps, runner.records, list(runner.trained)))
