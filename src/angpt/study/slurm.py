"""A study's runs as Slurm jobs: one `sbatch` per run, the study folder on a filesystem every node sees (issue 47).

Each job runs the same worker a local study starts (`python -m angpt.study.worker`), reading the plan from a file
in the study folder instead of its stdin. The store stays the truth: a run is done when its result.json is there,
and each run folder keeps the id of the job that trains it (`slurm_job.json`), so a driver started again attaches to
the jobs still queued or running and submits nothing twice. A job that Slurm requeues (preemption, `scontrol
requeue`) starts the worker again, which resumes from the run's last checkpoint, as a local re-run does.

sbatch through this small wrapper, not submitit: the worker is already a command line, the store already records
what is done, and what must hold on a cluster (attach after a restart, resume after a requeue, a failure's log
tail) is the store's business; submitit would pickle a second record of each job beside ours and add a dependency.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from angpt.errors import UserError

JOB_FILE = "slurm_job.json"  # in a run's folder: the job that trains it
EXIT_MARK = "angpt-worker-exit"  # the job's last line: the worker's exit status
ALIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING", "SUSPENDED",
         "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD")  # fmt: skip


@dataclass
class SlurmOptions:
    """What each run's job asks of Slurm (`--slurm.KEY VALUE` on `angpt compare`)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None  # the job's time limit (sbatch --time: MM, HH:MM:SS, D-HH:MM:SS)
    gpus_per_run: int = 0  # --gpus per job; 0 on a CPU partition
    cpus_per_run: int = 1  # --cpus-per-task, and the worker's torch threads
    mem: str | None = None  # --mem per job (e.g. 16G)
    max_jobs: int | None = None  # at most this many of the study's jobs in Slurm at once (None: all at once)
    cancel_on_interrupt: bool = False  # Ctrl-C on the driver cancels its jobs (scancel) instead of leaving them
    poll_s: float = 5.0  # how often the driver asks squeue
    extra: list[str] = field(default_factory=list)  # more #SBATCH lines, as sbatch options ("--qos=high")

    def sbatch_options(self) -> list[str]:
        out = [f"--cpus-per-task={self.cpus_per_run}", "--ntasks=1", "--requeue", "--signal=B:TERM@60"]
        for flag, value in (("partition", self.partition), ("account", self.account), ("time", self.time),
                            ("mem", self.mem)):  # fmt: skip
            if value:
                out.append(f"--{flag}={value}")
        if self.gpus_per_run:
            out.append(f"--gpus={self.gpus_per_run}")
        return out + list(self.extra)


def script(worker: list[str], name: str, log: Path, options: SlurmOptions) -> str:
    """The batch script of one run: the `worker` command (study/execute.py's worker_command, its plan from a file),
    its output into `log` (appended: a requeued job keeps what its first start said), its exit status as the last
    line. `exec` is not used: the shell must outlive the worker to write that line, and it passes SIGTERM on
    (--signal=B:TERM) by `wait`."""
    log = Path(log).resolve()
    job = re.sub(r"[^A-Za-z0-9_.+-]+", "-", name)  # a directive ends at the first space
    lines = ["#!/bin/bash", f"#SBATCH --job-name=angpt-{job}", f"#SBATCH --output={log}", "#SBATCH --open-mode=append"]
    lines += [f"#SBATCH {o}" for o in options.sbatch_options()]
    lines += [
        f"cd {shlex.quote(os.getcwd())}",
        f"export OMP_NUM_THREADS={options.cpus_per_run} MKL_NUM_THREADS={options.cpus_per_run}",
        'echo "angpt: job $SLURM_JOB_ID on $(hostname), start ${SLURM_RESTART_COUNT:-0}"',
        "trap 'kill -TERM $child 2>/dev/null' TERM",
        f"{shlex.join(worker)} &",
        "child=$!",
        "wait $child; status=$?",
        "[ $status -gt 128 ] && kill -0 $child 2>/dev/null && { wait $child; status=$?; }",
        f'echo "{EXIT_MARK} $status"',
        "exit $status",
    ]
    return "\n".join(lines) + "\n"


def submit(text: str, name: str, options: SlurmOptions) -> str:
    """Submit a batch script; its job id. A refusal (a wrong partition, say) is one UserError line, naming the
    --slurm.* flags it may be about."""
    res = _slurm(["sbatch", "--parsable"], text)
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or ["no reason given"])[-1].removeprefix("sbatch: error: ")
        named = [f"--slurm.{k} {v}" for k, v in (("partition", options.partition), ("account", options.account),
                 ("time", options.time), ("mem", options.mem)) if v and k in why.lower()]  # fmt: skip
        raise UserError(f"Slurm refused run {name}: {why}" + (f" ({', '.join(named)})" if named else ""))
    return res.stdout.strip().split(";")[0]


def alive(job_ids: list[str]) -> dict[str, str]:
    """{job id: state} of those of `job_ids` still queued or running (a finished job leaves the queue)."""
    if not job_ids:
        return {}
    res = _slurm(["squeue", "-h", "-o", "%i %T", "--states=all"])
    if res.returncode != 0:
        raise UserError(f"squeue failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    wanted, out = set(job_ids), {}
    for line in res.stdout.splitlines():
        job, _, state = line.strip().partition(" ")
        if job in wanted and state in ALIVE:
            out[job] = state
    return out


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        _slurm(["scancel", *job_ids])


def record_job(run_dir: Path, job_id: str, name: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / JOB_FILE).write_text(json.dumps({"job_id": job_id, "name": name}) + "\n")


def recorded_job(run_dir: Path) -> str | None:
    try:
        return str(json.loads((run_dir / JOB_FILE).read_text())["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def worker_exit(log: Path) -> int | None:
    """The worker's exit status from its job's log (the last EXIT_MARK line), None if it never wrote one."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    marks = [x for x in lines if x.startswith(EXIT_MARK + " ")]
    return int(marks[-1].split()[1]) if marks else None


def log_tail(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").strip().splitlines() if not x.startswith(EXIT_MARK)]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(no output)"


def available() -> str | None:
    """None where this machine can submit to Slurm; else why not, in words."""
    try:
        res = _slurm(["sinfo", "-h", "-o", "%a"])
    except UserError as e:
        return str(e)
    if res.returncode != 0:
        return f"sinfo failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}"
    return None if "up" in res.stdout.split() else "no partition is up"


def _slurm(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UserError(f"{command[0]} not found: --executor slurm needs Slurm's commands on PATH") from None
