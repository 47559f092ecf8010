"""Running a ladder: each size's comparison in turn (LR transfer between them), then the scaling report.

Layout of OUT:

    OUT/scaling.json           the ladder (what a re-run must match)
    OUT/sizes/<size>/          one `angpt compare` report directory per size: runs, plan.json, its own report
    OUT/lr_check/<size>/       --lr-transfer: the second size's LR sweep, to check the transfer
    OUT/batch.json, OUT/batch/ `angpt scaling batch` (see angpt.scaling.batch)
    OUT/report.md, report.json, *.png    the scaling report
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.compare.store import write_json
from angpt.errors import UserError
from angpt.scaling.collect import check_dir, size_dir
from angpt.scaling.plan import LADDER_FILE, Ladder

# What may sit in OUT beside a study's plan file: the other study, the report, the lock.
_KNOWN = {".lock", LADDER_FILE, "batch.json", "sizes", "lr_check", "batch", "report.md", "report.json"}


def check_out_dir(out: Path, plan_file: str, identity: dict[str, Any], what: str) -> bool:
    """UserError unless `out` is new, empty, a scaling directory without this study, or one with this same study.

    True when `out` already holds it (a re-run resumes)."""
    path = out / plan_file
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{path} is unreadable ({e}); use another --out") from e
        theirs = {k: v for k, v in stored.items() if k not in ("data", "device")}
        if theirs != identity:
            key = next(k for k in sorted(set(theirs) | set(identity)) if theirs.get(k) != identity.get(k))
            raise UserError(
                f"{out} holds a different {what} ({key}: {_short(theirs.get(key))} there, {_short(identity.get(key))} "
                "here); use another --out, or repeat that study's options"
            )
        return True
    if out.exists() and (
        not out.is_dir() or any(p.name not in _KNOWN and not p.name.endswith(".png") for p in out.iterdir())
    ):
        raise UserError(f"{out} exists and is not an angpt scaling directory; use another --out")
    return False


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def scaling_lock(out: Path):
    from angpt.lock import DirLock

    return DirLock(out, "angpt scaling")


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


def transferred_lrs(sweeps: dict) -> dict[str, float]:
    """Each arm's best LR at the smallest size, to reuse at every larger size."""
    from angpt.scaling.plan import chosen_lr

    out = {}
    for label, sw in sweeps.items():
        lr = chosen_lr(sw)
        if lr is None:
            raise UserError(
                f"arm {label!r} diverged at every LR of the smallest size's sweep: there is no LR to transfer; "
                "lower its --lr, or drop --lr-transfer"
            )
        out[label] = lr
    return out


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
) -> LadderRun:
    """Run (or resume) every size's comparison, then write the scaling report into `out`.

    Sizes run smallest first, each as angpt.compare.run_comparison in OUT/sizes/<size> (its sweep, its runs, its
    compare report). With lr_transfer the smallest size's best LRs are fixed for the larger sizes, and the second
    size is swept as well (OUT/lr_check) to test the transfer. With the WSD schedule the shorter budgets branch off
    the longest run (angpt.scaling.wsd). `dry_run` prints the plan and a measured time estimate, writing nothing.
    """
    from angpt.compare import run_comparison
    from angpt.compare.runner import cpu_cores
    from angpt.scaling.report import write_scaling_report
    from angpt.scaling.wsd import seed_branches

    if not isinstance(jobs, int) or jobs < 1:
        raise UserError(f"jobs={jobs!r} must be a positive integer")
    threads = threads or max(1, cpu_cores() // jobs)
    out = Path(out)
    command = command if command is not None else shlex.join(["angpt", *sys.argv[1:]])
    exists = check_out_dir(out, LADDER_FILE, ladder.identity(), "scaling ladder")
    if dry_run:
        from angpt.scaling.estimate import describe_ladder

        text = describe_ladder(ladder, out, jobs=jobs, threads=threads)
        if exists:
            text = f"{out} holds this ladder already: finished runs will be skipped\n" + text
        return LadderRun(out=out, ladder=ladder, dry_run=True, text=text)

    out.mkdir(parents=True, exist_ok=True)
    hook = seed_branches if ladder.schedule == "wsd" else None
    trained = 0
    with scaling_lock(out):
        if not exists:
            write_json(out / LADDER_FILE, ladder.to_dict())
        transferred = None
        try:
            for i, size in enumerate(ladder.sizes):
                rep = run_comparison(
                    ladder.size_plan(i, transferred),
                    size_dir(out, size.name),
                    jobs=jobs,
                    threads=threads,
                    progress=progress,
                    command=f"{command}  # size {size.name}",
                    before_main=hook,
                )
                trained += len(rep.trained)
                if i == 0 and ladder.lr_transfer:
                    transferred = transferred_lrs({label: by[min(by)] for label, by in rep.sweeps.items()})
                    check = run_comparison(
                        ladder.check_plan(),
                        check_dir(out, ladder.sizes[1].name),
                        jobs=jobs,
                        threads=threads,
                        progress=progress,
                        command=f"{command}  # LR-transfer check at {ladder.sizes[1].name}",
                    )
                    trained += len(check.trained)
        except KeyboardInterrupt:
            print(f"scaling ladder interrupted: re-run the same command to resume ({out})", file=sys.stderr)
            raise
        report, files = write_scaling_report(out, command=command, bootstrap=bootstrap, seed=fit_seed)
    return LadderRun(out=out, ladder=ladder, dry_run=False, report=report, files=files, trained=trained)
