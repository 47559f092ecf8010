"""Running a scaling ladder through the study driver: each size's plan in turn (LR transfer between them), then the
scaling report of its folder.

Layout of OUT:

    OUT/scaling.json           the ladder (what a re-run must match, or extend by sizes)
    OUT/sizes/<size>/          one plan's folder per size: runs, plan.json, its own report
    OUT/lr_check/<size>/       --lr-transfer: the second size's LR sweep, to check the transfer
    OUT/report.md, report.json, *.png    the scaling report (angpt.study.scaling.report)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.errors import UserError
from angpt.invocation import command_line
from angpt.study.driver import Unit, plain_jobs, plan_unit, run_study
from angpt.study.ladder.collect import check_dir, size_dir, size_plans, transferred_lrs
from angpt.study.ladder.plan import LADDER_FILE, Ladder, Size
from angpt.study.plan import Plan
from angpt.study.scaling.folder import stored_study
from angpt.study.store import refusal, write_json


def check_ladder_dir(out: Path, ladder: Ladder) -> list[str] | None:
    """As check_study_dir for a ladder, which may also extend the one `out` holds by sizes.

    Returns None for a new `out`, [] when it holds this ladder (a re-run resumes), else the names of the sizes this
    ladder adds (every stored size kept as it is: its store is reused). Anything else that differs, a stored size
    left out, or (with --lr-transfer) a size below the stored smallest, whose LRs every size reuses, is a one-line
    UserError.
    """
    theirs = stored_study(out, LADDER_FILE)
    if theirs is None:
        return None
    mine = ladder.identity()
    if theirs == mine:
        return []
    hint = "use another --out, or repeat that ladder's options (sizes may be added)"
    if Ladder.shared_identity(theirs) != Ladder.shared_identity(mine):
        raise refusal(out, "scaling ladder", Ladder.shared_identity(theirs), Ladder.shared_identity(mine), hint)
    stored = {Size.from_dict(s).name: s for s in theirs.get("sizes", [])}
    new = {s.name: s.to_dict() for s in ladder.sizes}
    for name, size in stored.items():
        if name not in new:
            dial = "depths" if "depths" in mine["dial"] else "widths"
            every = ",".join(map(str, sorted({*theirs["dial"].get(dial, []), *mine["dial"][dial]})))
            raise UserError(
                f"{out} holds a different scaling ladder (size {name} there, not here); use another --out, or give "
                f"every stored size to extend it (--{dial} {every})"
            )
        if new[name] != size:
            raise refusal(out, f"scaling ladder at size {name}", size, new[name], hint)
    if ladder.lr_transfer and stored and ladder.sizes[0].name not in stored:
        smallest = min(stored.values(), key=lambda s: s["shape"]["width"])
        raise UserError(
            f"size {ladder.sizes[0].name} is below {out}'s smallest size {Size.from_dict(smallest).name}, whose LRs "
            "--lr-transfer reuses at every size, so the finished runs would not be this ladder's; add only larger "
            "sizes, or use another --out"
        )
    return [name for name in new if name not in stored]


@dataclass
class LadderRun:
    """What :func:`run_ladder` did: the dry-run text, or the report it wrote and the runs it trained."""

    out: Path
    ladder: Ladder
    dry_run: bool
    text: str = ""  # the dry run's plan and estimate
    report: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    trained: int = 0


class LadderStudy:
    """The scaling ladder as a kind of study: a plan per size, smallest first, in OUT/sizes/<size>."""

    verb = "angpt scaling"
    kind = "scaling ladder"

    def __init__(self, ladder: Ladder, *, command: str, bootstrap: int, fit_seed: int) -> None:
        self.ladder, self.command, self.bootstrap, self.fit_seed = ladder, command, bootstrap, fit_seed
        self.trained = 0

    def jobs(self, jobs: int | str, threads: int | None) -> tuple[int, int]:
        self._jobs, self._threads = plain_jobs(jobs, threads)
        return self._jobs, self._threads

    def check(self, out: Path) -> None:
        ladder = self.ladder
        self.added = check_ladder_dir(out, ladder)
        self.plans, self.known = size_plans(ladder, out)  # every size's store now, not after hours at the third
        self.change = ""
        if self.added:
            dial = "depths" if "depths" in ladder.dial else "widths"
            old = [x for x, size in zip(ladder.dial[dial], ladder.sizes) if size.name not in self.added]
            self.change = f"{dial} {old} -> {ladder.dial[dial]}"

    def planned(self, out: Path) -> list[tuple[Plan, Path]]:
        return [(plan, size_dir(out, size.name)) for plan, size in zip(self.plans, self.ladder.sizes)]

    def dry_run(self, out: Path, jobs: int, threads: int, slurm_text: str | None = None) -> LadderRun:
        from angpt.study.ladder.estimate import describe_ladder

        text = describe_ladder(self.ladder, out, jobs=jobs, threads=threads, plans=(self.plans, self.known),
                               measure=slurm_text is None)  # fmt: skip
        if self.added:
            text = f"{out} holds this ladder with other {self.change}: finished runs will be reused\n" + text
        elif self.added is not None:
            text = f"{out} holds this ladder already: finished runs will be skipped\n" + text
        text += f"\n\n{slurm_text}" if slurm_text else ""
        return LadderRun(out=out, ladder=self.ladder, dry_run=True, text=text)

    def begin(self, out: Path) -> None:
        if self.added:
            print(f"extending {out}: {self.change} (finished runs are reused)", file=sys.stderr)
        write_json(out / LADDER_FILE, self.ladder.to_dict())  # this ladder, or one the stored one may become

    def _unit(self, plan: Plan, folder: Path, note: str, hook=None, done=None) -> Unit:
        def count(report) -> None:
            self.trained += len(report.trained)
            if done is not None:
                done(report)

        return plan_unit(plan, folder, command=f"{self.command}  # {note}", jobs=self._jobs,
                               threads=self._threads, before_main=hook, done=count)  # fmt: skip

    def units(self, out: Path) -> Iterator[Unit]:
        from angpt.study.ladder.wsd import seed_branches

        ladder = self.ladder
        hook = seed_branches if ladder.schedule == "wsd" else None
        transferred: dict[str, float] | None = None
        first: dict[str, Any] = {}
        for i, size in enumerate(ladder.sizes):
            yield self._unit(ladder.size_plan(i, transferred), size_dir(out, size.name), f"size {size.name}", hook,
                             done=(lambda report: first.update(report.sweeps)) if i == 0 else None)  # fmt: skip
            if i == 0 and ladder.lr_transfer:
                transferred = transferred_lrs({label: by[min(by)] for label, by in first.items()})
                check = ladder.sizes[1].name
                yield self._unit(ladder.check_plan(), check_dir(out, check), f"LR-transfer check at {check}")

    def finish(self, out: Path) -> LadderRun:
        from angpt.study.scaling.report import write_scaling_report

        report, files = write_scaling_report(out, command=self.command, bootstrap=self.bootstrap, seed=self.fit_seed)
        return LadderRun(out=out, ladder=self.ladder, dry_run=False, report=report, files=files, trained=self.trained)


def run_ladder(
    ladder: Ladder,
    out: str | Path,
    *,
    jobs: int = 1,
    threads: int | None = None,
    dry_run: bool = False,
    progress: bool = True,
    command: str | None = None,
    bootstrap: int = 200,
    fit_seed: int = 0,
    executor: Any = None,
) -> LadderRun:
    """Run (or resume, or extend) every size's plan, then write the scaling report into `out`.

    Sizes run smallest first, each a plan in OUT/sizes/<size> (its sweep, its runs, its comparison report). With
    lr_transfer the smallest size's best LRs are fixed for the larger sizes, and the second size is swept as well
    (OUT/lr_check) to test the transfer. With the WSD schedule the shorter budgets branch off the longest run
    (angpt.study.ladder.wsd). An `out` holding this ladder with fewer sizes is extended: the new sizes run, the
    stored ones reuse their finished runs (check_ladder_dir says what may differ). `dry_run` prints the plan and a
    measured time estimate of the work left, writing nothing. `executor` is where the runs go (study/flags.py's
    executor_options: each a Slurm job, or all in this process; None: --jobs here).
    """
    command = command if command is not None else command_line()
    study = LadderStudy(ladder, command=command, bootstrap=bootstrap, fit_seed=fit_seed)
    return run_study(study, out, jobs=jobs, threads=threads, dry_run=dry_run, progress=progress, executor=executor)
