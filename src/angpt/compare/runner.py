"""Running a comparison: the LR sweep, the runs of every arm x budget x seed, resume, parallel jobs, progress.

Each run is an ordinary `train()` run in ``REPORT/runs/<arm>/<budget>/seed<seed>/lr<lr>``. When it finishes, its
summary is written to ``result.json`` there; a run with that file (and metrics reaching the planned step) is
done and never trained again. A run directory without it is resumed from its last checkpoint (resume="auto").
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.compare.plan import Arm, Plan, format_lr, format_tokens
from angpt.errors import UserError

RESULT_FILE = "result.json"
PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class RunSpec:
    """One training run of the plan."""

    arm: str  # arm label
    budget: int
    seed: int
    lr: float

    def key(self) -> tuple[str, int, int, float]:
        return (self.arm, self.budget, self.seed, self.lr)

    def name(self) -> str:
        return f"{self.arm} {format_tokens(self.budget)} seed{self.seed} lr{format_lr(self.lr)}"


@dataclass
class SweepResult:
    """One arm's learning-rate sweep at the smallest budget and first seed."""

    arm: str
    grid: list[float]  # every LR tried, ascending
    losses: dict[float, float | None]  # final val loss per LR (None: diverged)
    best: float | None  # None: every run diverged
    extensions: int
    at_edge: bool  # the best LR still sits at an edge of the grid (sweep not finished)
    fixed: bool  # a single-point grid: the LR was given, not tuned

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "rows": [{"lr": lr, "val_loss": self.losses.get(lr)} for lr in self.grid],
            "best_lr": self.best,
            "extensions": self.extensions,
            "best_at_edge": self.at_edge,
            "fixed": self.fixed,
        }


# ------------------------------------------------------------------------------------------ run records
def cpu_cores() -> int:
    """CPU cores this process may use (the affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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
    if rec.get("steps") != steps or rec.get("status") not in ("finished", "diverged"):
        return None
    if rec["status"] == "finished":
        rows = read_rows(run_dir)
        if not rows or rows[-1]["step"] != steps or "val_loss" not in rows[-1]:
            return None
    return rec


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)  # atomic: a crash leaves the old file or the new one


def execute_run(plan: Plan, report_dir: Path, spec: RunSpec) -> dict[str, Any]:
    """Train one run (or finish an interrupted one) and record its result; returns the record.

    A record with status "interrupted" (a signal arrived) is returned but not written.
    """
    from angpt.train import checkpoint as ckpt
    from angpt.train.config import load_run_config
    from angpt.train.loop import TrainingError, train

    arm = plan.arm(spec.arm)
    out = plan.run_dir(report_dir, arm, spec.budget, spec.seed, spec.lr)
    steps = plan.steps(spec.budget)
    done = load_record(out, steps)
    if done is not None:
        return {**done, "skipped": True}
    if out.exists() and not ckpt.list_checkpoints(out):
        # Ours, crashed before its first checkpoint: nothing to resume, and train() refuses a directory that
        # holds metrics without a checkpoint. Start it afresh.
        shutil.rmtree(out)
    cfg = load_run_config(None, plan.run_overrides(arm, spec.budget, spec.seed, spec.lr, out))
    cfg.train.progress = False  # the comparison has one progress bar over the whole plan
    t0 = time.time()
    record: dict[str, Any] = {
        "arm": spec.arm,
        "arch": arm.arch,
        "budget": spec.budget,
        "seed": spec.seed,
        "lr": spec.lr,
        "steps": steps,
        "tokens": spec.budget,
    }
    try:
        result = train(cfg)
    except TrainingError as e:
        # A diverging LR is a legitimate sweep result (its loss counts as infinite), not a crash of the plan.
        record.update(status="diverged", val_loss=None, val_bpb=None, error=str(e), wall_s=time.time() - t0)
        _write_json(out / RESULT_FILE, record)
        return record
    if result.status != "finished":
        return {**record, "status": "interrupted"}
    rows = read_rows(out)
    last = rows[-1] if rows else {}
    if last.get("step") != steps or "val_loss" not in last:
        raise UserError(f"run {out} finished but its metrics.jsonl does not end with step {steps}'s val_loss")
    step_times = [r["step_time"] for r in rows if "step_time" in r and r["step"] > 1]
    from angpt.compare.stats import median

    record.update(
        status="finished",
        val_loss=last["val_loss"],
        val_bpb=last.get("val_bpb"),
        train_loss=last.get("loss"),
        step_time_median=median(step_times),
        wall_s=time.time() - t0,
    )
    _write_json(out / RESULT_FILE, record)
    return record


INTERRUPTED_EXIT = 130  # a worker whose run was interrupted by a signal (its checkpoint is saved)


def worker_command(report_dir: Path, spec: RunSpec, threads: int) -> list[str]:
    """The command line of a worker process that runs `spec` (the plan comes on its stdin)."""
    return [
        sys.executable,
        "-m",
        "angpt.compare._worker",
        str(report_dir),
        json.dumps([spec.arm, spec.budget, spec.seed, spec.lr]),
        str(threads),
    ]


# -------------------------------------------------------------------------------------------- progress
class _Progress:
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


# ---------------------------------------------------------------------------------------------- runner
class Runner:
    """Runs batches of RunSpecs: in this process (jobs=1) or in `jobs` worker processes."""

    def __init__(self, plan: Plan, report_dir: Path, *, jobs: int, threads: int, progress: _Progress):
        self.plan, self.report_dir, self.jobs, self.threads, self.progress = plan, report_dir, jobs, threads, progress
        self.records: dict[tuple, dict[str, Any]] = {}
        self.trained: list[RunSpec] = []  # runs this invocation actually trained (not skipped)

    def _dir(self, spec: RunSpec) -> Path:
        return self.plan.run_dir(self.report_dir, self.plan.arm(spec.arm), spec.budget, spec.seed, spec.lr)

    def known(self, spec: RunSpec) -> dict[str, Any] | None:
        if spec.key() not in self.records:
            rec = load_record(self._dir(spec), self.plan.steps(spec.budget))
            if rec is not None:
                self.records[spec.key()] = rec
        return self.records.get(spec.key())

    def run(self, specs: list[RunSpec]) -> None:
        """Run every spec not already done; KeyboardInterrupt after saving if a run was interrupted."""
        todo = [s for s in dict.fromkeys(specs) if self.known(s) is None]
        if not todo:
            return
        if self.jobs == 1:
            for spec in todo:
                self._record(spec, self._run_here(spec))
        else:
            self._run_pool(todo)

    def _run_here(self, spec: RunSpec) -> dict[str, Any]:
        import torch

        old = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        self.progress.start(self._dir(spec), spec)
        try:
            return execute_run(self.plan, self.report_dir, spec)
        finally:
            torch.set_num_threads(old)

    def _run_pool(self, todo: list[RunSpec]) -> None:
        """Up to `jobs` worker processes at a time, each `python -m angpt.compare._worker` for one run.

        Plain subprocesses rather than multiprocessing: no re-import of the caller's __main__ (spawn), no fork
        of a process that has run torch, and Ctrl-C reaches every worker, whose train() saves and exits.
        """
        import subprocess

        plan_json = json.dumps(self.plan.to_dict())
        logs = self.report_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        queue = list(todo)
        running: dict[subprocess.Popen, tuple[RunSpec, Path]] = {}
        interrupted = False
        try:
            while queue or running:
                while queue and len(running) < self.jobs and not interrupted:
                    spec = queue.pop(0)
                    log = logs / ("_".join(self._dir(spec).relative_to(self.report_dir / "runs").parts) + ".log")
                    with open(log, "w") as fh:
                        proc = subprocess.Popen(
                            worker_command(self.report_dir, spec, self.threads),
                            stdin=subprocess.PIPE,
                            stdout=fh,
                            stderr=subprocess.STDOUT,
                            env=env,
                            text=True,
                        )
                    proc.stdin.write(plan_json)  # type: ignore[union-attr]
                    proc.stdin.close()  # type: ignore[union-attr]
                    running[proc] = (spec, log)
                    self.progress.start(self._dir(spec), spec)
                if not queue and not running:
                    break
                time.sleep(0.2)
                for proc in [p for p in running if p.poll() is not None]:
                    spec, log = running.pop(proc)
                    if proc.returncode == INTERRUPTED_EXIT:
                        interrupted = True
                        self.progress.finish(self._dir(spec), 0)
                        continue
                    if proc.returncode != 0:
                        self._stop(running)
                        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                        raise UserError(f"run {spec.name()} failed (exit {proc.returncode}): {tail[0]} (log: {log})")
                    rec = load_record(self._dir(spec), self.plan.steps(spec.budget))
                    if rec is None:
                        raise UserError(f"run {spec.name()} exited without a result (log: {log})")
                    self._record(spec, rec)
                if interrupted and not running:
                    break
        except KeyboardInterrupt:
            # The workers got the same SIGINT: those training save a checkpoint and exit. Wait for them.
            print("\ninterrupted: letting running jobs save a checkpoint...", file=sys.stderr)
            self._stop(running, signal_them=False)
            raise
        if interrupted:
            raise KeyboardInterrupt("a run was interrupted")

    @staticmethod
    def _stop(running: dict, signal_them: bool = True, timeout: float = 120.0) -> None:
        """Stop our worker processes: SIGINT (they save a checkpoint), then wait; kill only the stragglers."""
        for proc in running:
            if signal_them and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.time() + timeout
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except Exception:  # noqa: BLE001 - still running after the grace period
                proc.kill()
                proc.wait()

    def _record(self, spec: RunSpec, rec: dict[str, Any]) -> None:
        self.progress.finish(self._dir(spec), spec.budget if rec.get("status") != "interrupted" else 0)
        if rec.get("status") == "interrupted":
            raise KeyboardInterrupt(f"{spec.name()} interrupted")
        if not rec.pop("skipped", False):
            self.trained.append(spec)
        self.records[spec.key()] = rec


# ----------------------------------------------------------------------------------------------- sweep
def _loss(rec: dict[str, Any] | None) -> float:
    if rec is None or rec.get("status") != "finished" or rec.get("val_loss") is None:
        return math.inf
    v = float(rec["val_loss"])
    return v if math.isfinite(v) else math.inf


def run_sweeps(plan: Plan, runner: Runner, on_extension: Callable[[int], None] | None = None) -> dict[str, SweepResult]:
    """Every arm's LR sweep; the arms' grids run together (in parallel with jobs > 1), then any extensions."""
    grids = {a.label: plan.initial_grid(a) for a in plan.arms}
    extensions = {a.label: 0 for a in plan.arms}
    settled: dict[str, SweepResult] = {}
    b, s = plan.sweep_budget, plan.sweep_seed
    while len(settled) < len(plan.arms):
        pending = [a for a in plan.arms if a.label not in settled]
        runner.run([RunSpec(a.label, b, s, lr) for a in pending for lr in grids[a.label]])
        for a in pending:
            grid = grids[a.label]
            losses = {lr: _loss(runner.known(RunSpec(a.label, b, s, lr))) for lr in grid}
            finite = {lr: v for lr, v in losses.items() if math.isfinite(v)}
            best = min(finite, key=lambda lr: (finite[lr], lr)) if finite else None
            if best is None:
                edge = -1  # every LR diverged: the rates are too high, so the only sensible direction is down
            else:
                edge = -1 if best == grid[0] else (1 if best == grid[-1] else 0)
            at_edge = len(grid) > 1 and edge != 0
            if at_edge and extensions[a.label] < plan.max_extensions:
                new = Plan.extend(grid, edge)
                grids[a.label] = sorted(grid + [new])
                extensions[a.label] += 1
                if on_extension is not None:
                    on_extension(b)
                continue
            settled[a.label] = SweepResult(
                arm=a.label,
                grid=grid,
                losses={lr: (v if math.isfinite(v) else None) for lr, v in losses.items()},
                best=best,
                extensions=extensions[a.label],
                at_edge=at_edge,
                fixed=len(plan.initial_grid(a)) == 1,
            )
    return {a.label: settled[a.label] for a in plan.arms}


def main_specs(plan: Plan, sweeps: dict[str, SweepResult]) -> list[RunSpec]:
    """Every arm x budget x seed at the arm's best LR (the sweep's own run is one of them)."""
    return [
        RunSpec(a.label, b, s, sweeps[a.label].best)  # type: ignore[arg-type]
        for a in plan.arms
        if sweeps[a.label].best is not None
        for b in plan.budgets
        for s in plan.seeds
    ]


# -------------------------------------------------------------------------------------- report dir check
def check_report_dir(plan: Plan, report_dir: Path) -> bool:
    """UserError unless `report_dir` is new, empty, or holds this same plan. True when it holds this plan."""
    path = report_dir / PLAN_FILE
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{path} is unreadable ({e}); use another --out") from e
        mine = plan.identity()
        try:
            theirs = Plan.from_dict(stored).identity()
        except (TypeError, KeyError, AttributeError):  # written by another angpt version: compare the raw keys
            theirs = {k: v for k, v in stored.items() if k not in ("data", "device", "extrapolate")}
        if theirs != mine:
            raise UserError(
                f"{report_dir} holds a different comparison ({_difference(theirs, mine)}); "
                "use another --out, or repeat that comparison's options"
            )
        return True
    if report_dir.exists() and (not report_dir.is_dir() or any(p.name != ".lock" for p in report_dir.iterdir())):
        raise UserError(f"{report_dir} exists and is not an angpt compare report (no {PLAN_FILE}); use another --out")
    return False


class ReportLock:
    """REPORT/.lock holding our pid while we run: two comparisons writing one report would corrupt it.

    A lock whose process is gone (a crash, a killed job) is taken over.
    """

    def __init__(self, report_dir: Path) -> None:
        self.path = report_dir / ".lock"
        self.held = False

    def __enter__(self) -> ReportLock:
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    pid = int(self.path.read_text().strip() or 0)
                except (OSError, ValueError):
                    pid = 0
                if pid and pid != os.getpid() and _alive(pid):
                    raise UserError(
                        f"another angpt compare (pid {pid}) is running in {self.path.parent}; wait for it or stop it"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self.held = True
            return self
        raise UserError(f"cannot take the lock {self.path}; remove it if no comparison is running")

    def __exit__(self, *exc) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _difference(theirs: dict[str, Any], mine: dict[str, Any]) -> str:
    """The first differing plan key, said briefly ("seeds: [0, 1] there, [0, 1, 2] here")."""
    key = next((k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)), "?")
    a, b = theirs.get(key), mine.get(key)
    if key == "arms" and isinstance(a, list) and isinstance(b, list):
        la, lb = [x.get("label") for x in a], [x.get("label") for x in b]
        if la != lb:
            a, b = la, lb
        else:
            i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            key, a, b = f"arm {la[i]!r}", a[i], b[i]
    return f"{key}: {_short(a)} there, {_short(b)} here"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------------------------------ estimation
def measure_step_times(plan: Plan, threads: int, steps: int = 3) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per training step of each arm, timed here: 1 warm-up step, then the median of `steps` steps.

    A step is the real thing (the plan's batch, micro-batches, optimizer, constraint) on the plan's data; the
    run configs are those of the smallest budget. Also returns each arm's set-up time (model and optimizer
    construction), a per-run cost that dominates short runs.
    """
    import torch

    from angpt.data import TokenLoader, load_meta
    from angpt.models import model_from_config
    from angpt.train.config import load_run_config
    from angpt.train.loop import resolve_model_config
    from angpt.train.optim import make_optimizer
    from angpt.train.step import TrainStep, resolve_dtype, synchronize

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    meta = load_meta(plan.data)
    out: dict[str, float] = {}
    setup: dict[str, float] = {}
    device = torch.device("cuda" if plan.device == "auto" and torch.cuda.is_available() else "cpu")
    if plan.device not in ("auto", "cpu"):
        device = torch.device(plan.device)
    try:
        # An untimed first build pays the process's one-off costs (lazy imports, optimizer set-up), which a
        # comparison pays once, not per run.
        cfg0 = load_run_config(None, plan.run_overrides(plan.arms[0], plan.budgets[0], plan.seeds[0], 1e-3, "-"))
        warm = model_from_config(resolve_model_config(cfg0, meta)).to(device)
        make_optimizer(warm, cfg0.arch, 1e-3, max_steps=100)
        del warm
        for arm in plan.arms:
            t_setup = time.perf_counter()
            cfg = load_run_config(None, plan.run_overrides(arm, plan.budgets[0], plan.seeds[0], 1e-3, "unused"))
            mcfg = resolve_model_config(cfg, meta)
            torch.manual_seed(0)
            model = model_from_config(mcfg).to(device)
            opt, sched = make_optimizer(model, cfg.arch, cfg.lr, max_steps=100, warmup_steps=0)
            loader = TokenLoader(plan.data, "train", plan.micro_batch, plan.seq_len, seed=0)
            accum = plan.batch_tokens // (plan.seq_len * plan.micro_batch)
            step = TrainStep(model, opt, sched, device=device, dtype=resolve_dtype(plan.dtype, device), accum=accum)
            setup[arm.label] = time.perf_counter() - t_setup
            times = []
            for i in range(steps + 1):
                t0 = time.perf_counter()
                step(loader.next_batch)
                synchronize(device)
                if i:  # the first step pays one-off costs (allocations, kernel selection)
                    times.append(time.perf_counter() - t0)
            out[arm.label] = sorted(times)[len(times) // 2]
    finally:
        torch.set_num_threads(old)
    return out, setup


def estimate_run_seconds(plan: Plan, step_time: float, budget: int, setup: float = 0.0) -> float:
    """Set-up, training steps and validation passes (a forward is ~1/3 of a micro-batch's forward+backward)."""
    steps = plan.steps(budget)
    accum = plan.batch_tokens // (plan.seq_len * plan.micro_batch)
    evals = math.ceil(steps / plan.eval_every(budget))
    return setup + steps * step_time + evals * plan.eval_batches * step_time / (3 * accum)


@dataclass
class DryRun:
    """What a dry run found: the planned runs, which are done, and the time estimate."""

    sweep: list[tuple[RunSpec, bool]] = field(default_factory=list)  # (run, done)
    main: list[tuple[str, int, int]] = field(default_factory=list)  # (arm, budget, seed); LR chosen later
    max_extensions: int = 0
    step_times: dict[str, float] = field(default_factory=dict)
    setup_times: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    seconds_max: float = 0.0
    jobs: int = 1
    threads: int = 1
    text: str = ""


def describe_dry_run(plan: Plan, report_dir: Path, *, jobs: int, threads: int, measure: bool = True) -> DryRun:
    """The planned runs with their status, and a time estimate from step times measured on this machine."""
    dr = DryRun(max_extensions=plan.max_extensions * sum(len(plan.initial_grid(a)) > 1 for a in plan.arms))
    dr.jobs, dr.threads = jobs, threads

    def done(arm: Arm, budget: int, seed: int, lr: float) -> bool:
        return load_record(plan.run_dir(report_dir, arm, budget, seed, lr), plan.steps(budget)) is not None

    lines = [
        f"plan: {len(plan.arms)} arms x {len(plan.budgets)} budgets x {len(plan.seeds)} seeds, baseline "
        f"{plan.baseline}; batch {plan.batch_tokens} tokens (seq_len {plan.seq_len}, micro-batch "
        f"{plan.micro_batch}); preset {plan.preset}; data {plan.data}"
    ]
    lines.append(f"LR sweep at {format_tokens(plan.sweep_budget)} tokens, seed {plan.sweep_seed}:")
    for a in plan.arms:
        grid = plan.initial_grid(a)
        flags = [done(a, plan.sweep_budget, plan.sweep_seed, lr) for lr in grid]
        dr.sweep += [(RunSpec(a.label, plan.sweep_budget, plan.sweep_seed, lr), f) for lr, f in zip(grid, flags)]
        fixed = " (fixed: not tuned)" if len(grid) == 1 else ""
        lines.append(
            f"  {a.label:<24} lr {', '.join(format_lr(x) for x in grid)}{fixed}  [{sum(flags)}/{len(grid)} done]"
        )
    if dr.max_extensions:
        lines.append(f"  + up to {dr.max_extensions} grid extension run(s) if a best LR sits at a grid edge")
    lines.append("runs at each arm's best LR (the sweep's own run counts for the smallest budget and first seed):")
    for a in plan.arms:
        for b in plan.budgets:
            shared = " (one is the sweep's run)" if b == plan.sweep_budget else ""
            lines.append(
                f"  {a.label:<24} {format_tokens(b):>8} tokens = {plan.steps(b):>6} steps x {len(plan.seeds)} "
                f"seed(s){shared}"
            )
            dr.main += [(a.label, b, s) for s in plan.seeds if not (b == plan.sweep_budget and s == plan.sweep_seed)]
    if measure:
        dr.step_times, dr.setup_times = measure_step_times(plan, threads)

        def est(label: str, budget: int) -> float:
            return estimate_run_seconds(plan, dr.step_times[label], budget, dr.setup_times[label])

        seq = sum(est(spec.arm, spec.budget) for spec, is_done in dr.sweep if not is_done)
        # Main runs are counted as not done: their LR is only known once the sweep has finished.
        seq += sum(est(label, b) for label, b, _s in dr.main)
        ext = sum(
            plan.max_extensions * est(a.label, plan.sweep_budget) for a in plan.arms if len(plan.initial_grid(a)) > 1
        )
        dr.seconds = seq / jobs
        dr.seconds_max = (seq + ext) / jobs
        lines.append(
            "step time (measured here: 1 warm-up step, then the median of 3 real training steps per arm, "
            f"{threads} thread(s) per job):"
        )
        for label, t in dr.step_times.items():
            lines.append(f"  {label:<24} {t:.3f} s/step, {dr.setup_times[label]:.2f} s set-up per run")
        lines.append(
            f"estimated time: {_hms(dr.seconds)} with {jobs} job(s), up to {_hms(dr.seconds_max)} if every sweep "
            "extension runs (set-up + steps x step time + validation passes per run; finished sweep runs excluded; "
            "parallel jobs assumed to scale perfectly)"
        )
    dr.text = "\n".join(lines)
    return dr


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
