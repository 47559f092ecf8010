"""Running a batch-size study through the study driver: each batch size's plan, then the scaling report of its
folder.

Layout of OUT:

    OUT/batch.json, OUT/batch/<batch>/   the study, and one plan's folder per batch size
    OUT/report.md, report.json, *.png    the scaling report (angpt.study.scaling.report)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from angpt.invocation import command_line
from angpt.study.batch.plan import BatchStudy, batch_dir
from angpt.study.driver import Unit, plain_jobs, plan_unit, run_study
from angpt.study.plan import Plan
from angpt.study.scaling.folder import BATCH_FILE, check_study_dir
from angpt.study.store import check_store, write_json
from angpt.units import format_tokens


class BatchSizeStudy:
    """The batch-size study as a kind of study: a plan per batch size, in OUT/batch/<batch>."""

    verb = "angpt scaling"
    kind = "batch-size study"

    def __init__(self, study: BatchStudy, *, command: str) -> None:
        self.study, self.command = study, command

    def jobs(self, jobs: int | str, threads: int | None) -> tuple[int, int]:
        self._jobs, self._threads = plain_jobs(jobs, threads)
        return self._jobs, self._threads

    def check(self, out: Path) -> None:
        self.exists = check_study_dir(out, BATCH_FILE, self.study.identity(), "batch-size study")
        for b in self.study.batch_sizes:  # every store before the first trains (each is checked again on reaching it)
            check_store(self.study.plan_for(b), batch_dir(out, b))

    def planned(self, out: Path) -> list[tuple[Plan, Path]]:
        return [(self.study.plan_for(b), batch_dir(out, b)) for b in self.study.batch_sizes]

    def dry_run(self, out: Path, jobs: int, threads: int, slurm_text: str | None = None) -> tuple[str, dict, dict]:
        from angpt.study.batch.estimate import describe_batch

        text = describe_batch(self.study, out, jobs=jobs, threads=threads, measure=slurm_text is None)
        return text + (f"\n\n{slurm_text}" if slurm_text else ""), {}, {}

    def begin(self, out: Path) -> None:
        if not self.exists:
            write_json(out / BATCH_FILE, self.study.to_dict())

    def units(self, out: Path) -> Iterator[Unit]:
        for b in self.study.batch_sizes:
            command = f"{self.command}  # batch {format_tokens(b)}"
            yield plan_unit(self.study.plan_for(b), batch_dir(out, b), command=command, jobs=self._jobs,
                                  threads=self._threads)  # fmt: skip

    def finish(self, out: Path) -> tuple[str, dict[str, Any], dict[str, Path]]:
        from angpt.study.scaling.report import write_scaling_report

        report, files = write_scaling_report(out, command=self.command)
        return "", report, files


def run_batch_study(
    study: BatchStudy,
    out: str | Path,
    *,
    jobs: int = 1,
    threads: int | None = None,
    dry_run: bool = False,
    progress: bool = True,
    command: str | None = None,
    executor: Any = None,
) -> tuple[str, dict[str, Any], dict[str, Path]]:
    """Run (or resume) every batch size's plan, then rewrite the scaling report in `out`.

    Returns (dry-run text or "", the report, its files). `dry_run` writes nothing. `executor` is where the runs go
    (study/flags.py's executor_options: each a Slurm job, or all in this process; None: --jobs here)."""
    kind = BatchSizeStudy(study, command=command if command is not None else command_line())
    return run_study(kind, out, jobs=jobs, threads=threads, dry_run=dry_run, progress=progress, executor=executor)
