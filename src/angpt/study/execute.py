"""Executing a plan's runs: one `train()` per RunSpec, in this process or in parallel worker processes
(`python -m angpt.study.worker`), with resume."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from angpt.errors import DeadlineReached, UserError
from angpt.invocation import child_env
from angpt.stats import median
from angpt.study.plan import Plan
from angpt.study.progress import Progress
from angpt.study.store import (
    RESULT_FILE,
    RunSpec,
    clear_failure,
    load_record,
    read_rows,
    record_failure,
    run_health,
    write_json,
)

INTERRUPTED_EXIT = 130  # a worker's exit status after a signal (study/worker.py holds it before any import)


class StudyInterrupted(KeyboardInterrupt):
    """A study stopped by SIGINT or SIGTERM after its running jobs saved; re-running resumes it."""

    def __init__(self, signum: int = signal.SIGINT, what: str = "") -> None:
        super().__init__(what or signal.Signals(signum).name)
        self.signum = int(signum)


class RunFailed(UserError):
    """A run's worker process or Slurm job failed: the study stops, its report (PARTIAL) lists the run with its log's
    tail (store.record_failure), and re-running tries the run again."""


class TerminateAsInterrupt:
    """While active, SIGTERM stops the comparison as Ctrl-C does (a StudyInterrupted), not abruptly.

    A training run inside replaces the handler with its own (save, then stop) and restores it after.
    """

    def __enter__(self):
        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise StudyInterrupted(signum)

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def cpu_cores() -> int:
    """CPU cores this process may use (the affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def execute_run(plan: Plan, report_dir: Path, spec: RunSpec, models: Any = None) -> dict[str, Any]:
    """Train one run (or finish an interrupted one) and record its result; returns the record.

    A record with status "interrupted" (a signal arrived) is returned but not written. In a run of several ranks
    (torchrun, or srun in a Slurm job) every rank trains and rank 0 alone writes the record. `models` (the in-process
    executor's ModelCache) lends the run a model an earlier run of this process built and compiled.
    """
    from angpt.train.config import load_run_config
    from angpt.train.loop import TrainingError, train

    arm = plan.arm(spec.arm)
    out = spec.run_dir(plan, report_dir)
    steps = plan.steps(spec.budget)
    done = load_record(out, steps)
    if done is not None:
        return {**done, "skipped": True}
    cfg = load_run_config(None, plan.run_overrides(arm, spec.budget, spec.seed, spec.lr, out, spec.setting))
    t0 = time.time()
    record: dict[str, Any] = {
        "arm": spec.arm,
        "arch": arm.arch,
        "budget": spec.budget,
        "seed": spec.seed,
        "lr": spec.lr,
        "setting": dict(spec.setting),
        "steps": steps,
        "tokens": spec.budget,
    }
    main_rank = int(os.environ.get("RANK", "0")) == 0
    try:
        result = train(cfg, restart_unsaved=True, models=models)  # ours: one stopped before its first save restarts
    except TrainingError as e:
        # A diverging LR is a legitimate sweep result (its loss counts as infinite), not a crash of the plan.
        record.update(status="diverged", val_loss=None, val_bpb=None, error=str(e), wall_s=time.time() - t0)
        if main_rank:
            write_json(out / RESULT_FILE, record)
        return record
    if result.status != "finished":
        return {**record, "status": "interrupted", "signal": result.signal}
    if not main_rank:
        return {**record, "status": "finished"}
    rows = read_rows(out)
    last = rows[-1] if rows else {}
    if last.get("step") != steps or "val_loss" not in last:
        raise UserError(f"run {out} finished but its metrics.jsonl does not end with step {steps}'s val_loss")
    step_times = [r["step_time"] for r in rows if "step_time" in r and r["step"] > 1]
    first = next((r["step_time"] for r in rows if r["step"] == 1 and "step_time" in r), None)
    record.update(
        status="finished",
        val_loss=last["val_loss"],
        val_bpb=last.get("val_bpb"),
        test_loss=last.get("test_loss"),  # datasets with a test split: the number a report gives
        test_bpb=last.get("test_bpb"),
        train_loss=last.get("loss"),
        step_time_median=median(step_times),
        dtype=result.dtype,  # what `auto` resolved to in this run: the report checks that every run agrees
        compiled=result.compiled,  # train.compile as resolved (auto: on CUDA): its step times differ ~2x
        first_step_s=first,  # with the compiling, where this run built its model (not model_reused)
        model_reused=result.model_reused,
        wall_s=time.time() - t0,
        **run_health(rows),
    )
    write_json(out / RESULT_FILE, record)
    return record


def stop_signal(returncode: int) -> int | None:
    """The signal that interrupted a worker, from its exit status; None if none did. A worker that caught SIGINT
    or SIGTERM saved a checkpoint and exits INTERRUPTED_EXIT; one the signal reached before the trainer's handler
    was installed (or a second signal killed) dies of it (status -signum): interrupted too, not failed, since a
    run only ever resumes from a complete checkpoint."""
    if returncode == INTERRUPTED_EXIT:
        return signal.SIGINT
    if returncode in (-signal.SIGINT, -signal.SIGTERM):
        return -returncode
    return None


def worker_command(report_dir: Path, spec: RunSpec, threads: int, plan_file: Path | None = None) -> list[str]:
    """The command line of a worker process that runs `spec`: the plan comes on its stdin, or from `plan_file` (a
    Slurm job's, whose paths are absolute: it starts elsewhere)."""
    spec_json = json.dumps([spec.arm, spec.budget, spec.seed, spec.lr, [list(kv) for kv in spec.setting]])
    command = [sys.executable, "-m", "angpt.study.worker", str(report_dir), spec_json, str(threads)]
    if plan_file is None:
        return command
    command[3] = str(Path(report_dir).resolve())
    return [*command, "--plan", str(Path(plan_file).resolve())]


def run_log(plan: Plan, report_dir: Path, spec: RunSpec) -> Path:
    """The run's log: its worker's output (a Slurm job's too)."""
    name = "_".join(spec.run_dir(plan, report_dir).relative_to(Path(report_dir) / "runs").parts)
    return Path(report_dir) / "logs" / f"{name}.log"


def job_log(plan: Plan, report_dir: Path, spec: RunSpec, job: str = "%j") -> Path:
    """The log of one Slurm job of the run (`%j`: sbatch puts the job's id there). Each job has its own, so that what
    ended a job is read from that job alone, never from an earlier job of the same run."""
    log = run_log(plan, report_dir, spec)
    return log.with_name(f"{log.stem}.job{job}.log")


def job_script(plan: Plan, report_dir: Path, spec: RunSpec, options: Any) -> str:
    """The Slurm batch script of one run (study/slurm.py), as `--executor slurm` submits it and `--dry-run` shows it:
    the worker reads the plan from the study's logs/slurm-plan.json (PLAN_FOR_JOBS)."""
    from angpt.study import slurm

    worker = worker_command(report_dir, spec, options.threads, Path(report_dir) / PLAN_FOR_JOBS)
    return slurm.script(worker, spec.name(), job_log(plan, report_dir, spec), options)


PLAN_FOR_JOBS = "logs/slurm-plan.json"  # in a study's folder: the plan its Slurm jobs read


def _left_in_slurm(job_ids: list[str]) -> str:
    return (f"Slurm job(s) {', '.join(job_ids)} stay queued or running; re-run the same command to attach to them, "
            f"or scancel {' '.join(job_ids)}")  # fmt: skip


HELD = (signal.SIGINT, signal.SIGTERM)  # what held_signals holds


@contextlib.contextmanager
def held_signals():
    """SIGINT and SIGTERM wait (noted, not lost) until the block ends: what it does is done whole or not at all.

    Their handlers are swapped for a note, not the signals blocked: a mask holds only the thread that sets it, and a
    process-directed signal goes to any thread that does not block it (the driver has torch's and the progress
    bar's), after which Python runs the handler in the main thread at once. In the main thread only."""
    received: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in HELD}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for sig in received:  # now to the handler they were meant for
            signal.raise_signal(sig)


def ask_cancel(job_ids: list[str], stdin=None) -> bool:
    """At a terminal, whether to cancel the study's Slurm jobs after Ctrl-C (default: no, leave them for a re-run to
    attach to); never asks elsewhere (a script, a CI job: no)."""
    stdin = stdin or sys.stdin
    if not stdin.isatty():
        return False
    print(f"\n{len(job_ids)} Slurm job(s) of this study are queued or running. Cancel them? [y/N] ", end="",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        return stdin.readline().strip().lower() in ("y", "yes")
    except (KeyboardInterrupt, EOFError, OSError):  # a second Ctrl-C: leave them
        return False


class Runner:
    """Runs batches of RunSpecs where the `executor` says (driver.run_study): in `jobs` worker processes, one Slurm
    job each, or in this process (jobs=1, or study/inprocess.py's InProcess with its deadline)."""

    def __init__(
        self, plan: Plan, report_dir: Path, *, jobs: int, threads: int, progress: Progress, executor: Any = None
    ):
        from angpt.study.inprocess import InProcess
        from angpt.study.slurm import SlurmOptions

        self.plan, self.report_dir, self.jobs, self.threads, self.progress = plan, report_dir, jobs, threads, progress
        self.slurm = executor if isinstance(executor, SlurmOptions) else None
        self.inprocess = executor if isinstance(executor, InProcess) else (InProcess() if jobs == 1 else None)
        self.records: dict[tuple, dict[str, Any]] = {}
        self.trained: list[RunSpec] = []  # runs this invocation actually trained (not skipped)

    def _dir(self, spec: RunSpec) -> Path:
        return spec.run_dir(self.plan, self.report_dir)

    def known(self, spec: RunSpec) -> dict[str, Any] | None:
        if spec.key() not in self.records:
            rec = load_record(self._dir(spec), self.plan.steps(spec.budget))
            if rec is not None:
                self.records[spec.key()] = rec
        return self.records.get(spec.key())

    def run(self, specs: list[RunSpec]) -> None:
        """Run every spec not already done, in order; StudyInterrupted after saving if a run was interrupted."""
        todo = [s for s in dict.fromkeys(specs) if self.known(s) is None]
        if not todo:
            return
        if self.slurm is not None:
            self._run_slurm(todo)
            return
        from angpt.study.slurm import OPTIONS_FILE

        (self.report_dir / OPTIONS_FILE).unlink(missing_ok=True)  # the report says how the last runs were trained
        if self.inprocess is not None:
            self._run_inprocess(todo)
        else:
            self._run_pool(todo)

    def _run_inprocess(self, todo: list[RunSpec]) -> None:
        """Every run here, one at a time, each arm's model built once (study/inprocess.py); with a deadline, a run
        (or a seed's pair) that cannot end before it is left unstarted."""
        import torch

        from angpt.study.inprocess import run_groups, store_estimate

        ex = self.inprocess
        if ex.deadline is not None and ex.estimate is None:
            ex.estimate = store_estimate(self.plan, self.known, self._all_records)
        train = ex.train or execute_run

        def train_one(spec: RunSpec) -> None:
            old = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            self.progress.start(self._dir(spec), spec)
            try:
                rec = train(self.plan, self.report_dir, spec, ex.models)
            finally:
                torch.set_num_threads(old)
            self._record(spec, rec)
            if ex.after is not None:
                ex.after(spec, rec)

        run_groups(self.plan, todo, ex, train_one)

    def _all_records(self) -> list[dict[str, Any]]:
        """Every finished run's record in the store and this invocation's (the in-process estimate's step times)."""
        found = {}
        for path in (self.report_dir / "runs").glob("**/" + RESULT_FILE):
            with contextlib.suppress(OSError, ValueError):
                found[path] = json.loads(path.read_text())
        return [r for r in found.values() if isinstance(r, dict)] + list(self.records.values())

    def stop_at_deadline(self) -> None:
        """DeadlineReached when the in-process executor left runs unstarted (their ends would pass its deadline)."""
        left = self.inprocess.skipped if self.inprocess is not None else []
        if left:
            raise DeadlineReached(f"{len(left)} run(s) would have ended past it, e.g. {left[0].name()}")

    def _start_worker(self, spec: RunSpec, log: Path, plan_json: str, env: dict[str, str]):
        """A worker process for `spec`, its output into `log`, its own session, the plan written to its stdin."""
        import subprocess

        with open(log, "w") as fh:
            proc = subprocess.Popen(
                worker_command(self.report_dir, spec, self.threads),
                stdin=subprocess.PIPE,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
                start_new_session=True,
            )
        try:
            proc.stdin.write(plan_json)  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:  # the worker died before reading its plan: its exit status says how
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()  # type: ignore[union-attr]
        return proc

    def _run_pool(self, todo: list[RunSpec]) -> None:
        """Up to `jobs` worker processes at a time, each `python -m angpt.study.worker` for one run.

        Plain subprocesses rather than multiprocessing: no re-import of the caller's __main__ (spawn) and no fork
        of a process that has run torch. Each worker has its own session, so a terminal's Ctrl-C reaches only
        this process; SIGINT or SIGTERM here is passed on to every running worker (as SIGINT: its train() saves a
        checkpoint and exits), no new one starts, and once they have exited the comparison stops
        (StudyInterrupted); re-running resumes it.
        """
        import subprocess

        plan_json = json.dumps(self.plan.to_dict())
        logs = self.report_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = child_env(dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads)))
        queue = list(todo)
        running: dict[subprocess.Popen, tuple[RunSpec, Path]] = {}
        received: list[int] = []  # signals that arrived here
        told: set[subprocess.Popen] = set()  # workers sent SIGINT
        interrupted: int | None = None  # a worker stopped by a signal (not one sent from here)

        def note(signum, frame):  # never raises: the loop below reacts, between two polls
            received.append(signum)

        old = {}
        if threading.current_thread() is threading.main_thread():
            old = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while queue or running:
                while queue and len(running) < self.jobs and not received and interrupted is None:
                    spec = queue.pop(0)
                    log = self._log(spec)
                    clear_failure(self._dir(spec))
                    running[self._start_worker(spec, log, plan_json, env)] = (spec, log)
                    self.progress.start(self._dir(spec), spec)
                if received:
                    for proc in running:
                        if proc not in told and proc.poll() is None:
                            proc.send_signal(signal.SIGINT)
                            told.add(proc)
                time.sleep(0.1)
                for proc in [p for p in running if p.poll() is not None]:
                    spec, log = running.pop(proc)
                    stopped_by = stop_signal(proc.returncode)
                    if stopped_by is not None:  # the run keeps its last checkpoint; a re-run resumes it
                        interrupted = interrupted or stopped_by
                        self.progress.finish(self._dir(spec), 0)
                        continue
                    if proc.returncode != 0:
                        self._stop(running, told)
                        last = record_failure(self._dir(spec), exit_status=proc.returncode, log=log)
                        raise RunFailed(f"run {spec.name()} failed (exit {proc.returncode}): {last} (log: {log})")
                    rec = load_record(self._dir(spec), self.plan.steps(spec.budget))
                    if rec is None:
                        record_failure(self._dir(spec), exit_status=0, log=log)
                        raise RunFailed(f"run {spec.name()} exited without a result (log: {log})")
                    self._record(spec, rec)
                if (received or interrupted is not None) and not running:
                    break
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        if received or interrupted is not None:
            if received:
                name = signal.Signals(received[0]).name
                print(f"\n{name} received: the running jobs saved a checkpoint and stopped", file=sys.stderr)
            raise StudyInterrupted(received[0] if received else interrupted)  # type: ignore[arg-type]

    def _log(self, spec: RunSpec) -> Path:
        return run_log(self.plan, self.report_dir, spec)

    def _run_slurm(self, todo: list[RunSpec]) -> None:
        """Each run as one Slurm job (study/slurm.py), up to `max_jobs` in Slurm at once; a run whose recorded job
        is still queued or running is attached to, not submitted again. A job that leaves the queue without the
        run's result failed (_slurm_job_ended), unless its worker was interrupted, which is submitted again and
        resumes. A study that stops names the jobs it leaves in Slurm. Ctrl-C leaves the jobs to Slurm (a re-run
        attaches to them) or cancels them: --slurm.cancel, or the answer asked for at a terminal."""
        from angpt.study import slurm

        opts = self.slurm
        (self.report_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.report_dir / PLAN_FOR_JOBS).write_text(json.dumps(self.plan.to_dict()))
        slurm.record_options(self.report_dir, opts)
        recorded = {s: slurm.recorded_job(self._dir(s)) for s in todo}
        still = slurm.alive([j for j in recorded.values() if j])
        jobs = {s: j for s, j in recorded.items() if j in still}  # attached: queued or running already
        for spec in jobs:
            self.progress.start(self._dir(spec), spec)
        queue = [s for s in todo if s not in jobs]
        stopped: dict[RunSpec, str] = {}  # runs to submit again: the job a signal stopped (its checkpoint saved)
        old = None  # SIGINT stops this loop even where the driver started with it ignored (`cmd &` in a script)
        if threading.current_thread() is threading.main_thread():
            old = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            while queue or jobs:
                while queue and (opts.max_jobs is None or len(jobs) < opts.max_jobs):
                    spec = queue.pop(0)
                    clear_failure(self._dir(spec))
                    with held_signals():  # a job Slurm has is named by its run folder before Ctrl-C may stop us
                        jobs[spec] = slurm.submit(job_script(self.plan, self.report_dir, spec, opts), spec.name(), opts)
                        slurm.record_job(self._dir(spec), jobs[spec], spec.name())
                    if spec in stopped:
                        print(f"run {spec.name()}: Slurm job {stopped.pop(spec)} was stopped by a signal and saved; "
                              f"submitted again as job {jobs[spec]}", file=sys.stderr)  # fmt: skip
                    self.progress.start(self._dir(spec), spec)
                time.sleep(opts.poll_s)
                reasons: dict[str, str] = {}
                states = slurm.alive(list(jobs.values()), reasons)
                stuck = {s: j for s, j in jobs.items() if slurm.never_starts(states.get(j), reasons.get(j))}
                if stuck:  # waiting would be forever: cancel those, say why in one line; the others stay tracked
                    slurm.cancel(list(stuck.values()))
                    spec, job = next(iter(stuck.items()))
                    jobs = {s: j for s, j in jobs.items() if s not in stuck}
                    more = f" and {len(stuck) - 1} more" if len(stuck) > 1 else ""
                    why = slurm.NEVER_STARTS[reasons[job]]
                    raise UserError(f"Slurm will not start run {spec.name()}{more} (job {job}, {reasons[job]}): {why}")
                for spec, job in [(s, j) for s, j in jobs.items() if j not in states]:
                    del jobs[spec]
                    if self._slurm_job_ended(spec, job):
                        stopped[spec] = job
                        queue.insert(0, spec)
        except KeyboardInterrupt:
            left = slurm.in_order(jobs.values())
            if left and (opts.cancel or ask_cancel(left)):
                slurm.cancel(left)
                print(f"\ncancelled Slurm job(s) {', '.join(left)}; re-running resumes them", file=sys.stderr)
            elif left:
                print("\n" + _left_in_slurm(left), file=sys.stderr)
            raise
        except UserError:
            if jobs:
                print(_left_in_slurm(slurm.in_order(jobs.values())), file=sys.stderr)
            raise
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)

    def _slurm_job_ended(self, spec: RunSpec, job: str) -> bool:
        """`job`, of run `spec`, has left Slurm's queue: its result is recorded, or True where its worker was stopped
        by a signal after saving (exit 130: submit the run again, it resumes); otherwise RunFailed, saying how it
        ended, from that job's own log only."""
        from angpt.study import slurm

        rec = load_record(self._dir(spec), self.plan.steps(spec.budget))
        if rec is not None:
            self._record(spec, rec)
            return False
        log = job_log(self.plan, self.report_dir, spec, job)
        status = slurm.worker_exit(log)
        if status == INTERRUPTED_EXIT:
            return True
        last = record_failure(self._dir(spec), exit_status=status, log=log, job_id=job)
        if not slurm.started(log):
            raise RunFailed(f"run {spec.name()} never trained (Slurm job {job}, cancelled before it started)")
        ended = f"exit {status}" if status is not None else "no exit status: killed before its worker ended"
        raise RunFailed(f"run {spec.name()} failed (Slurm job {job}, {ended}): {last} (log: {log})")

    @staticmethod
    def _stop(running: dict, told: set, timeout: float = 120.0) -> None:
        """Stop our worker processes: SIGINT (they save a checkpoint), then wait; kill only the stragglers. A worker
        already sent one (`told`) is not sent a second: a second SIGINT stops a run without saving."""
        for proc in running:
            if proc.poll() is None and proc not in told:
                proc.send_signal(signal.SIGINT)
                told.add(proc)
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
            raise StudyInterrupted(rec.get("signal") or signal.SIGINT, f"{spec.name()} interrupted")
        if not rec.pop("skipped", False):
            self.trained.append(spec)
        self.records[spec.key()] = rec
