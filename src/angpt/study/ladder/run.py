"""The scaling ladder as a kind of study for the driver: each size's plan in turn (LR transfer between them);
scaling/run.py runs it and writes the scaling report of its folder.

Layout of OUT:

    OUT/scaling.json           the ladder (what a re-run must match, or extend by sizes)
    OUT/sizes/<size>/          one plan's folder per size: runs, plan.json, its own report
    OUT/lr_check/<size>/       --lr-transfer: the second size's LR sweep, to check the transfer
    OUT/report.md, report.json, *.png    the scaling report (angpt.study.scaling.report)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from angpt.errors import UserError
from angpt.study.comparison.report import plan_unit
from angpt.study.driver import ScalingKind, Unit
from angpt.study.ladder.collect import check_dir, size_dir, size_plans, transferred_lrs
from angpt.study.ladder.plan import LADDER_FILE, Ladder, Size
from angpt.study.plan import Plan
from angpt.study.store import refusal, stored_study, write_json


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


class LadderStudy(ScalingKind):
    """The scaling ladder as a kind of study: a plan per size, smallest first, in OUT/sizes/<size>."""

    kind = "scaling ladder"

    def __init__(self, ladder: Ladder, *, command: str) -> None:
        super().__init__(command)
        self.ladder = ladder

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

    def dry_run(self, out: Path, jobs: int, threads: int, slurm_text: str | None = None) -> str:
        from angpt.study.ladder.estimate import describe_ladder

        text = describe_ladder(self.ladder, out, jobs=jobs, threads=threads, plans=(self.plans, self.known),
                               measure=slurm_text is None)  # fmt: skip
        if self.added:
            text = f"{out} holds this ladder with other {self.change}: finished runs will be reused\n" + text
        elif self.added is not None:
            text = f"{out} holds this ladder already: finished runs will be skipped\n" + text
        return text + (f"\n\n{slurm_text}" if slurm_text else "")

    def begin(self, out: Path) -> None:
        if self.added:
            print(f"extending {out}: {self.change} (finished runs are reused)", file=sys.stderr)
        write_json(out / LADDER_FILE, self.ladder.to_dict())  # this ladder, or one the stored one may become

    def _unit(self, plan: Plan, folder: Path, note: str, hook=None, done=None) -> Unit:
        def count(report) -> None:
            self.count(report)
            if done is not None:
                done(report)

        return plan_unit(plan, folder, command=f"{self.command}  # {note}", jobs=self._jobs, threads=self._threads,
                         before_main=hook, done=count)  # fmt: skip

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
