"""The comparison's progress bar: one tqdm bar over the plan's tokens that moves while runs train."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from angpt.study.plan import Plan
from angpt.study.store import RunSpec, load_record


def token_counts(plan: Plan, report_dir: Path) -> tuple[int, int]:
    """(total, done): the tokens of the whole plan, and of its runs finished in an earlier invocation.

    The total is the sweep grids plus every main run (a sweep's best run doubles as one) plus the LR checks; grid
    extensions are added as they happen (:meth:`Progress.add_total`).
    """
    total = 0
    for a in plan.arms:
        for b in plan.budgets:
            total += b * len(plan.seeds)
            if plan.tunes_at(a, b):
                total += b * (len(plan.initial_grid(a)) * len(a.settings()) - 1)
        if plan.checks_lr(a):
            total += 3 * plan.budgets[-1]  # the LR check at the largest budget (sweep.check_specs)
    done = 0
    for rec_path in (report_dir / "runs").glob("*/*/*/*/result.json"):
        budget = int(rec_path.parts[-4])
        if load_record(rec_path.parent, plan.steps(budget)) is not None:
            done += budget
    return total, done


class Progress:
    """One tqdm bar over the plan's tokens; a thread reads running runs' metrics.jsonl so it moves mid-run."""

    def __init__(self, enabled: bool, total: int, initial: int) -> None:
        self.bar = None
        self.done = initial
        self.running: dict[Path, int] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total, initial=initial, unit="tok", unit_scale=True, desc="compare", dynamic_ncols=True
            )
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()

    def add_total(self, tokens: int) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.total += tokens
                self.bar.refresh()

    def start(self, run_dir: Path, spec: RunSpec) -> None:
        with self.lock:
            self.running[run_dir] = spec.budget
            if self.bar is not None:
                self.bar.set_postfix_str(", ".join(sorted({p.parts[-4] for p in self.running})), refresh=False)

    def finish(self, run_dir: Path, tokens: int) -> None:
        with self.lock:
            self.running.pop(run_dir, None)
            self.done += tokens
        self._refresh()

    def _poll(self) -> None:
        while not self._stop.wait(2.0):
            self._refresh()

    def _refresh(self) -> None:
        with self.lock:
            if self.bar is None:
                return
            current = self.done + sum(min(_tokens_so_far(p), budget) for p, budget in self.running.items())
            if current > self.bar.n:
                self.bar.update(current - self.bar.n)

    def close(self) -> None:
        self._stop.set()
        self._refresh()
        with self.lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None  # closing twice (interrupt, then finally) is harmless


def _tokens_so_far(run_dir: Path) -> int:
    """Tokens of the last row of a run's metrics.jsonl, reading only the file's tail."""
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode("utf-8", "replace").splitlines()
        for line in reversed(lines):
            try:
                return int(json.loads(line).get("tokens", 0))
            except (json.JSONDecodeError, ValueError, AttributeError):
                continue
    except OSError:
        pass
    return 0
