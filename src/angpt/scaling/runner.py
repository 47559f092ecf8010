"""Running a ladder: each size's comparison in turn (LR transfer between them), then the scaling report.

Layout of OUT:

    OUT/scaling.json           the ladder (what a re-run must match, or extend by sizes)
    OUT/sizes/<size>/          one `angpt compare` report directory per size: runs, plan.json, its own report
    OUT/lr_check/<size>/       --lr-transfer: the second size's LR sweep, to check the transfer
    OUT/batch.json, OUT/batch/ `angpt scaling batch` (see angpt.scaling.batch)
    OUT/report.md, report.json, *.png    the scaling report
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.compare.plan import Plan
from angpt.compare.store import PLAN_FILE, write_json
from angpt.errors import UserError
from angpt.invocation import command_line
from angpt.scaling.collect import check_dir, size_dir
from angpt.scaling.plan import LADDER_FILE, Ladder, Size

# What may sit in OUT beside a study's plan file: the other study, the report, the lock.
_KNOWN = {".lock", LADDER_FILE, "batch.json", "sizes", "lr_check", "batch", "report.md", "report.json"}


def _stored_study(out: Path, plan_file: str) -> dict[str, Any] | None:
    """The identity of the study `out` holds in `plan_file` (None when it holds none); UserError unless `out` is new,
    empty, or a scaling directory."""
    path = out / plan_file
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{path} is unreadable ({e}); use another --out") from e
        return {k: v for k, v in stored.items() if k not in ("data", "device")}
    if out.exists() and (
        not out.is_dir() or any(p.name not in _KNOWN and not p.name.endswith(".png") for p in out.iterdir())
    ):
        raise UserError(f"{out} exists and is not an angpt scaling directory; use another --out")
    return None


def _different(out: Path, what: str, theirs: dict[str, Any], mine: dict[str, Any], hint: str) -> UserError:
    """The one-line refusal of another study, naming the first differing key (``dial.aspect``, not ``dial``)."""
    key, a, b = "", theirs, mine
    while isinstance(a, dict) and isinstance(b, dict) and a != b:
        k = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
        key, a, b = f"{key}.{k}" if key else k, a.get(k), b.get(k)
    return UserError(f"{out} holds a different {what} ({key}: {_short(a)} there, {_short(b)} here); {hint}")


def check_out_dir(out: Path, plan_file: str, identity: dict[str, Any], what: str) -> bool:
    """UserError unless `out` is new, empty, a scaling directory without this study, or one with this same study.

    True when `out` already holds it (a re-run resumes)."""
    theirs = _stored_study(out, plan_file)
    if theirs is None:
        return False
    if theirs != identity:
        raise _different(out, what, theirs, identity, "use another --out, or repeat that study's options")
    return True


def check_ladder_dir(out: Path, ladder: Ladder) -> list[str] | None:
    """As check_out_dir for a ladder, which may also extend the one `out` holds by sizes.

    Returns None for a new `out`, [] when it holds this ladder (a re-run resumes), else the names of the sizes this
    ladder adds (every stored size kept as it is: its store is reused). Anything else that differs, a stored size
    left out, or (with --lr-transfer) a size below the stored smallest, whose LRs every size reuses, is a one-line
    UserError.
    """
    theirs = _stored_study(out, LADDER_FILE)
    if theirs is None:
        return None
    mine = ladder.identity()
    if theirs == mine:
        return []
    hint = "use another --out, or repeat that ladder's options (sizes may be added)"
    if Ladder.shared_identity(theirs) != Ladder.shared_identity(mine):
        raise _different(out, "scaling ladder", Ladder.shared_identity(theirs), Ladder.shared_identity(mine), hint)
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
            raise _different(out, f"scaling ladder at size {name}", size, new[name], hint)
    if ladder.lr_transfer and stored and ladder.sizes[0].name not in stored:
        smallest = min(stored.values(), key=lambda s: s["shape"]["width"])
        raise UserError(
            f"size {ladder.sizes[0].name} is below {out}'s smallest size {Size.from_dict(smallest).name}, whose LRs "
            "--lr-transfer reuses at every size, so the finished runs would not be this ladder's; add only larger "
            "sizes, or use another --out"
        )
    return [name for name in new if name not in stored]


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


def size_plans(ladder: Ladder, out: Path) -> tuple[list[Plan], bool]:
    """Every size's compare plan, each store in `out` checked against it by compare's check_store (and the LR-transfer
    check's store against its plan), as each size's comparison checks it on reaching the size: a store holding another
    plan, runs a changed model default makes another model, or a directory that is no compare report, is that
    one-line UserError before anything runs.

    With --lr-transfer the larger sizes fix the LRs the smallest size's store settled (UserError, as the run would
    say, when an arm diverged at every LR there). Until its sweep has finished they are unknown: a larger size's
    plan fixes its store's own one-point LRs in their place (every other key checked as the run checks it), and the
    run checks the real ones on reaching the size. Returns the plans and whether their LRs are known (no stand-ins).
    """
    from angpt.compare.store import check_store
    from angpt.compare.stored import Unfinished, settle_sweeps
    from angpt.scaling.collect import at_smallest

    first = ladder.size_plan(0)
    check_store(first, size_dir(out, ladder.sizes[0].name))
    transferred = None
    if ladder.lr_transfer:
        check_store(ladder.check_plan(), check_dir(out, ladder.sizes[1].name))
        try:
            _, sweeps, _ = settle_sweeps(size_dir(out, ladder.sizes[0].name), first)
            transferred = transferred_lrs(at_smallest(first, sweeps))
        except Unfinished:
            pass
    plans = [first]
    for i, size in enumerate(ladder.sizes[1:], start=1):
        here = size_dir(out, size.name)
        lrs = (transferred or _stored_point_lrs(ladder, here)) if ladder.lr_transfer else None
        plans.append(ladder.size_plan(i, lrs))
        check_store(plans[-1], here)
    return plans, transferred is not None or not ladder.lr_transfer


def _stored_point_lrs(ladder: Ladder, here: Path) -> dict[str, float]:
    """Stand-ins for the transferred LRs before they are known: each arm's one-point --lr-values in the store at
    `here`, 1.0 where it holds none (that store holds no transferred plan for the arm, whatever LR is transferred)."""
    try:
        stored = json.loads((here / PLAN_FILE).read_text()).get("lr_values") or {}
    except (OSError, ValueError, AttributeError):  # none yet, or unreadable: check_report_dir says so
        stored = {}
    lrs = {}
    for a in ladder.arms:
        values = stored.get(a.label) if isinstance(stored, dict) else None
        one = isinstance(values, list) and len(values) == 1 and isinstance(values[0], (int, float))
        lrs[a.label] = float(values[0]) if one else 1.0
    return lrs


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
    """Run (or resume, or extend) every size's comparison, then write the scaling report into `out`.

    Sizes run smallest first, each as angpt.compare.run_comparison in OUT/sizes/<size> (its sweep, its runs, its
    compare report). With lr_transfer the smallest size's best LRs are fixed for the larger sizes, and the second
    size is swept as well (OUT/lr_check) to test the transfer. With the WSD schedule the shorter budgets branch off
    the longest run (angpt.scaling.wsd). An `out` holding this ladder with fewer sizes is extended: the new sizes
    run, the stored ones reuse their finished runs (check_ladder_dir says what may differ). `dry_run` prints the plan
    and a measured time estimate of the work left, writing nothing.
    """
    from angpt.compare import run_comparison
    from angpt.compare.runner import cpu_cores
    from angpt.scaling.report import write_scaling_report
    from angpt.scaling.wsd import seed_branches

    if not isinstance(jobs, int) or jobs < 1:
        raise UserError(f"jobs={jobs!r} must be a positive integer")
    threads = threads or max(1, cpu_cores() // jobs)
    out = Path(out)
    command = command if command is not None else command_line()
    added = check_ladder_dir(out, ladder)
    plans, known = size_plans(ladder, out)  # every size's store checked now, not after hours at the third size
    change = ""
    if added:
        dial = "depths" if "depths" in ladder.dial else "widths"
        old = [x for x, size in zip(ladder.dial[dial], ladder.sizes) if size.name not in added]
        change = f"{dial} {old} -> {ladder.dial[dial]}"
    if dry_run:
        from angpt.scaling.estimate import describe_ladder

        text = describe_ladder(ladder, out, jobs=jobs, threads=threads, plans=(plans, known))
        if added:
            text = f"{out} holds this ladder with other {change}: finished runs will be reused\n" + text
        elif added is not None:
            text = f"{out} holds this ladder already: finished runs will be skipped\n" + text
        return LadderRun(out=out, ladder=ladder, dry_run=True, text=text)

    out.mkdir(parents=True, exist_ok=True)
    hook = seed_branches if ladder.schedule == "wsd" else None
    trained = 0
    with scaling_lock(out):
        if added:
            print(f"extending {out}: {change} (finished runs are reused)", file=sys.stderr)
        write_json(out / LADDER_FILE, ladder.to_dict())  # this ladder, or one the stored one may become
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
