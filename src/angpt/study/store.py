"""The run store: where a study keeps its runs on disk, how a folder says which study it holds, its lock, and the
records and JSON it writes.

A plan's folder holds plan.json and REPORT/runs/<arm>/<budget>/seed<seed>/lr<lr>, one `train()` run each. A study
of several plans (a scaling ladder, a batch-size study) holds its own study file (scaling.json, batch.json) beside
their folders."""

# Each run is an ordinary `train()` run in REPORT/runs/<arm>/<budget>/seed<seed>/lr<lr>. When it finishes, its
# summary is written to result.json there; a run with that file (and metrics reaching the planned step) is done
# and never trained again. A run directory without it is resumed from its last checkpoint (resume="auto").

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from angpt.errors import UserError
from angpt.lock import DirLock
from angpt.stats import loss_spikes, median
from angpt.study.arms import Setting, format_setting
from angpt.study.plan import EXTENDABLE, Plan
from angpt.units import format_lr, format_tokens

RESULT_FILE = "result.json"
FAILED_FILE = "failed.json"  # a run whose worker or Slurm job failed: its exit and log's tail, until it runs again
TAIL_LINES = 20  # of a failed run's log, kept in failed.json and shown in the report
PLAN_FILE = "plan.json"
JOBS_FILE = "jobs.json"  # what --jobs auto measured, beside plan.json


@dataclass(frozen=True)
class RunSpec:
    """One training run of the plan."""

    arm: str  # arm label
    budget: int
    seed: int
    lr: float
    setting: Setting = ()  # the tuned train settings of a tuned arm's run

    def key(self) -> tuple[str, int, int, float, Setting]:
        return (self.arm, self.budget, self.seed, self.lr, self.setting)

    def name(self) -> str:
        extra = f" {format_setting(self.setting)}" if self.setting else ""
        return f"{self.arm} {format_tokens(self.budget)} seed{self.seed} lr{format_lr(self.lr)}{extra}"

    def run_dir(self, plan: Plan, report_dir: Path) -> Path:
        return plan.run_dir(report_dir, plan.arm(self.arm), self.budget, self.seed, self.lr, self.setting)


# ------------------------------------------------------------------------------------------ run records
def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl rows, one per step: a resumed run may have logged a step twice; the last one counts."""
    from angpt.train.metrics import read_metrics

    by_step: dict[int, dict[str, Any]] = {}
    for row in read_metrics(run_dir):
        if "step" in row:
            by_step[int(row["step"])] = row
    return [by_step[k] for k in sorted(by_step)]


def load_record(run_dir: Path, steps: int) -> dict[str, Any] | None:
    """The recorded result of a finished (or diverged) run of `steps` steps; None if it is not done."""
    path = run_dir / RESULT_FILE
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(rec, dict):  # valid JSON, but not a record (a stray write): not finished
        return None
    if rec.get("steps") != steps or rec.get("status") not in ("finished", "diverged"):
        return None
    if rec["status"] == "finished":
        rows = read_rows(run_dir)
        if not rows or rows[-1]["step"] != steps or "val_loss" not in rows[-1]:
            return None
    return rec


# A loss above this multiple of its running mean is a spike (the trainer's rule, train.spike_factor). Losses of
# a healthy run fluctuate by a few per cent from batch to batch; 1.5x is a jump no batch explains.
SPIKE_FACTOR = 1.5


def run_health(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's stability from its metrics rows: the largest pre-clip gradient norm (and its step), the median
    one, and the steps whose training loss spiked (above SPIKE_FACTOR x the running mean of the losses before)."""
    norms = [(r["grad_norm"], r["step"]) for r in rows if isinstance(r.get("grad_norm"), (int, float))]
    losses = [(r["loss"], r["step"]) for r in rows if isinstance(r.get("loss"), (int, float))]
    top = max(norms, default=None)
    spikes = [losses[i][1] for i in loss_spikes([x for x, _ in losses], SPIKE_FACTOR)]
    return {
        "max_grad_norm": top[0] if top else None,
        "max_grad_norm_step": top[1] if top else None,
        "median_grad_norm": median([x for x, _ in norms]),
        "loss_spikes": len(spikes),
        "loss_spike_steps": spikes[:20],
    }


def clean_json(x: Any) -> Any:
    """Non-finite floats -> None and keys -> strings, so that a report.json is strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean_json(v) for v in x]
    return x


def record_failure(run_dir: Path, *, exit_status: int | None, log: Path, job_id: str | None = None) -> str:
    """Keep a failed run's exit status and its log's last lines in its folder (failed.json), for the report; returns
    the log's last line (the error, as a traceback ends)."""
    try:
        lines = [x for x in Path(log).read_text(errors="replace").strip().splitlines() if x.strip()]
    except OSError:
        lines = []
    lines = [x for x in lines if not x.startswith("angpt-worker-exit ")][-TAIL_LINES:] or ["(no output)"]
    info = {"status": "failed", "exit": exit_status, "job_id": job_id, "log": str(log), "tail": lines}
    Path(run_dir).mkdir(parents=True, exist_ok=True)  # a worker may fail before it made the folder
    write_json(Path(run_dir) / FAILED_FILE, info)
    return lines[-1]


def load_failure(run_dir: Path) -> dict[str, Any] | None:
    """The failure a run's folder records (record_failure), or None."""
    try:
        data = json.loads((Path(run_dir) / FAILED_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def clear_failure(run_dir: Path) -> None:
    """A run starting again is no longer failed."""
    (Path(run_dir) / FAILED_FILE).unlink(missing_ok=True)


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON, atomically: a crash leaves the old file or the new one."""
    write_text(path, json.dumps(data, indent=2))


def write_text(path: Path, text: str) -> None:
    """Write `text` atomically: a crash (or a second Ctrl-C) leaves the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -------------------------------------------------------------------------------------- report dir check
def check_report_dir(plan: Plan, report_dir: Path) -> list[str] | None:
    """UserError unless `report_dir` is new, empty, or holds this plan or one it extends (Plan.shared_identity).

    Returns None for a new (or empty) directory, else how this plan changes the stored one: [] for the same.
    """
    not_ours = f"an angpt compare report (no {PLAN_FILE})"
    stored = read_study_file(report_dir, PLAN_FILE, belongs=lambda p: p.name in (".lock", JOBS_FILE), not_ours=not_ours)
    if stored is not None:
        mine = plan.identity()
        try:
            theirs = Plan.from_dict(stored).identity()
        except (TypeError, KeyError, AttributeError):  # written by another angpt version: compare the raw keys
            theirs = dict(stored)
        labels = {a.label for a in plan.arms} & {a.get("label") for a in theirs.get("arms", [])}
        shared_mine, shared_theirs = Plan.shared_identity(mine, labels), Plan.shared_identity(theirs, labels)
        if shared_mine != shared_theirs:
            raise UserError(
                f"{report_dir} holds a different comparison ({_difference(shared_theirs, shared_mine)}); "
                "use another --out, or repeat that comparison's options (arms, budgets and seeds may change)"
            )
        changes = []
        for key in ("arms", *EXTENDABLE):
            old, new = theirs.get(key), mine[key]
            if key == "arms":
                old, new = [a.get("label") for a in old or []], [a["label"] for a in new]
            if old != new:
                changes.append(f"{key} {short(old)} -> {short(new)}")
        return changes
    return None


def drifted_runs(plan: Plan, report_dir: Path) -> list[tuple[Path, str]]:
    """(run directory, how) for each stored run of the plan's arms trained with a model its recorded settings no
    longer make (angpt.train.resume.model_drift: a model default changed since)."""
    from angpt.data import load_meta
    from angpt.train.resume import model_drift

    runs = [p for arm in plan.arms for p in sorted((report_dir / "runs" / arm.slug).rglob("config.json"))]
    if not runs:
        return []
    meta = load_meta(plan.data)
    return [(p.parent, drift) for p in runs if (drift := model_drift(p.parent, meta)) is not None]


def check_store(plan: Plan, report_dir: Path) -> list[str] | None:
    """check_report_dir, then, where the directory holds runs, a UserError when a stored run of the plan's arms is
    another model today (drifted_runs): re-running would report it, or extend its arm with new runs, as today's arm.
    What a comparison checks before it trains anything; the scaling ladders and batch studies check every size's
    store with it up front."""
    changes = check_report_dir(plan, report_dir)
    drifted = drifted_runs(plan, report_dir) if changes is not None else []
    if drifted:
        run, drift = drifted[0]
        more = f" (and {len(drifted) - 1} more runs)" if len(drifted) > 1 else ""
        raise UserError(
            f"{run} was trained with {drift}{more}: a model default changed since this comparison was made, so its "
            "runs would be reported as today's; finish it with the angpt that made it, or use another --out"
        )
    return changes


def _difference(theirs: dict[str, Any], mine: dict[str, Any]) -> str:
    """The first differing plan key, said briefly ("eval_batches: 2 there, 3 here")."""
    key = next((k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)), "?")
    a, b = theirs.get(key), mine.get(key)
    if key == "arms" and isinstance(a, list) and isinstance(b, list):
        la, lb = [x.get("label") for x in a], [x.get("label") for x in b]
        if la != lb:
            a, b = la, lb
        else:
            i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            key, a, b = f"arm {la[i]!r}", a[i], b[i]
    return f"{key}: {short(a)} there, {short(b)} here"


def short(value: Any, width: int = 80) -> str:
    """A value as JSON, cut to `width` characters for a one-line message."""
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."


# ------------------------------------------------------------------------------------------ study folders
def read_study_file(folder: Path, name: str, *, belongs: Callable[[Path], bool], not_ours: str) -> dict | None:
    """The study file `name` in `folder` as a dict (None while it holds none). A one-line UserError when it is
    unreadable, or when `folder` exists without it and holds something that does not `belong` to such a study
    (`not_ours` says what the folder is not)."""
    path = folder / name
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{path} is unreadable ({e}); use another --out") from e
    if folder.exists() and (not folder.is_dir() or not all(belongs(p) for p in folder.iterdir())):
        raise UserError(f"{folder} exists and is not {not_ours}; use another --out")
    return None


# A scaling folder holds a ladder (its file, sizes/, lr_check/), a batch-size study (its file, batch/), or both,
# the scaling report over them (report.*, plots) and the lock.
LADDER_FILE = "scaling.json"
BATCH_FILE = "batch.json"
_SCALING = {".lock", LADDER_FILE, BATCH_FILE, "sizes", "lr_check", "batch", "report.md", "report.json"}


def stored_study(out: Path, study_file: str) -> dict[str, Any] | None:
    """The identity of the study `out` holds in `study_file` (None while it holds none); UserError unless `out` is
    new, empty, or a scaling directory."""
    stored = read_study_file(
        out,
        study_file,
        belongs=lambda p: p.name in _SCALING or p.name.endswith(".png"),
        not_ours="an angpt scaling directory",
    )
    return None if stored is None else {k: v for k, v in stored.items() if k not in ("data", "device")}


def check_study_dir(out: Path, study_file: str, identity: dict[str, Any], what: str) -> bool:
    """UserError unless `out` is new, empty, a scaling directory without this study, or one with this same study.

    True when `out` already holds it (a re-run resumes)."""
    theirs = stored_study(out, study_file)
    if theirs is None:
        return False
    if theirs != identity:
        raise refusal(out, what, theirs, identity, "use another --out, or repeat that study's options")
    return True


def refusal(folder: Path, what: str, theirs: Any, mine: Any, hint: str) -> UserError:
    """The one-line refusal of a folder holding another study, naming the first differing key (``dial.aspect``)."""
    key, a, b = "", theirs, mine
    while isinstance(a, dict) and isinstance(b, dict) and a != b:
        k = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
        key, a, b = f"{key}.{k}" if key else k, a.get(k), b.get(k)
    return UserError(f"{folder} holds a different {what} ({key}: {short(a, 60)} there, {short(b, 60)} here); {hint}")


def folder_lock(folder: Path, verb: str) -> DirLock:
    """FOLDER/.lock while `verb` (angpt compare, angpt scaling) writes there: two writers would corrupt it."""
    return DirLock(folder, verb)
