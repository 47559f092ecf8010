"""The batch-size study as a kind of study for the driver: each batch size's plan; scaling/run.py runs it and
writes the scaling report of its folder.

Layout of OUT:

    OUT/batch.json, OUT/batch/<batch>/   the study, and one plan's folder per batch size
    OUT/report.md, report.json, *.png    the scaling report (angpt.study.scaling.report)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from angpt.study.batch.plan import BatchStudy, batch_dir
from angpt.study.comparison.report import plan_unit
from angpt.study.driver import ScalingKind, Unit
from angpt.study.plan import Plan
from angpt.study.store import BATCH_FILE, check_store, check_study_dir, write_json
from angpt.units import format_tokens


class BatchSizeStudy(ScalingKind):
    """The batch-size study as a kind of study: a plan per batch size, in OUT/batch/<batch>."""

    kind = "batch-size study"

    def __init__(self, study: BatchStudy, *, command: str) -> None:
        super().__init__(command)
        self.study = study

    def check(self, out: Path) -> None:
        self.exists = check_study_dir(out, BATCH_FILE, self.study.identity(), "batch-size study")
        for b in self.study.batch_sizes:  # every store before the first trains (each is checked again on reaching it)
            check_store(self.study.plan_for(b), batch_dir(out, b))

    def planned(self, out: Path) -> list[tuple[Plan, Path]]:
        return [(self.study.plan_for(b), batch_dir(out, b)) for b in self.study.batch_sizes]

    def dry_run(self, out: Path, jobs: int, threads: int, slurm_text: str | None = None) -> str:
        from angpt.study.batch.estimate import describe_batch

        text = describe_batch(self.study, out, jobs=jobs, threads=threads, measure=slurm_text is None)
        return text + (f"\n\n{slurm_text}" if slurm_text else "")

    def begin(self, out: Path) -> None:
        if not self.exists:
            write_json(out / BATCH_FILE, self.study.to_dict())

    def units(self, out: Path) -> Iterator[Unit]:
        for b in self.study.batch_sizes:
            command = f"{self.command}  # batch {format_tokens(b)}"
            yield plan_unit(self.study.plan_for(b), batch_dir(out, b), command=command, jobs=self._jobs,
                            threads=self._threads, done=self.count)  # fmt: skip
