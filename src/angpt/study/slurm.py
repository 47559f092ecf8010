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
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from angpt.errors import UserError

JOB_FILE = "slurm_job.json"  # in a run's folder: the job that trains it
OPTIONS_FILE = "logs/slurm-options.json"  # in a study's folder: what its jobs asked of Slurm, for the report
START_MARK = "angpt: job "  # a job's first line, each time it starts
EXIT_MARK = "angpt-worker-exit"  # the job's last line: the worker's exit status
ALIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING", "SUSPENDED",
         "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD")  # fmt: skip


def _option(default, kind, text: str):
    """A SlurmOptions field that is also a flag, `--slurm.NAME` (NAME: the field's, '_' as '-') and a key of
    `--slurm.config FILE`: its type and help live here, once."""
    return field(default=default, metadata={"kind": kind, "help": text})


@dataclass
class SlurmOptions:
    """What each run's job asks of Slurm: `--slurm.KEY VALUE` on `angpt compare` and `angpt scaling`, or the same
    keys in a YAML file (`--slurm.config FILE`; flags given beside it win)."""

    partition: str | None = _option(None, str, "the partition each run's job goes to")
    account: str | None = _option(None, str, "the account charged")
    time: str | None = _option(None, str, "each job's time limit (HH:MM:SS); a job stopped by it saves and is requeued")
    nodes: int = _option(1, int, "nodes per run (default 1); the ranks are spread evenly over them")
    ranks_per_run: int | None = _option(
        None, int, "processes per run, data-parallel ranks started by srun (default: --slurm.gpus-per-run, or 1)"
    )
    gpus_per_run: int = _option(0, int, "GPUs per run, one per rank (default 0: a CPU job)")
    gpu_type: str | None = _option(
        None, str, "the GPU asked for (--gpus=TYPE:N) and planned with in --dry-run (A100, H100, H200, B200)"
    )
    cpus_per_run: int | None = _option(
        None, int, "CPUs per run, shared out among its ranks as their torch threads (default: 1 per rank)"
    )
    mem: str | None = _option(None, str, "memory per node of a run's job (e.g. 16G)")
    max_jobs: int | None = _option(None, int, "at most this many of the study's jobs in Slurm at once (default: all)")
    poll_s: float = _option(5.0, float, "seconds between two looks at the queue (default 5)")
    sbatch: list[str] = _option(
        None, list, "one more sbatch option for every job, given with '=': --slurm.sbatch=--qos=high (repeatable)"
    )
    cancel: bool = _option(
        False, bool, "Ctrl-C cancels the study's jobs (scancel) without asking, instead of leaving them to a re-run"
    )

    def __post_init__(self) -> None:
        self.sbatch = list(self.sbatch or [])
        for name, kind, _ in option_fields():
            value = getattr(self, name)
            if kind in (int, float) and value is not None and (isinstance(value, bool) or not value > 0):
                if not (name == "gpus_per_run" and value == 0):
                    raise UserError(f"--slurm.{_flag(name)} {value!r} must be a positive number")
        if self.ranks_per_run is None:
            self.ranks_per_run = self.gpus_per_run or 1
        if self.cpus_per_run is None:
            self.cpus_per_run = self.ranks_per_run
        if self.ranks_per_run % self.nodes:
            raise UserError(f"--slurm.ranks-per-run {self.ranks_per_run} must be a multiple of --slurm.nodes "
                            f"{self.nodes}")  # fmt: skip
        if self.gpus_per_run and self.gpus_per_run != self.ranks_per_run:
            raise UserError(f"--slurm.gpus-per-run {self.gpus_per_run} and --slurm.ranks-per-run "
                            f"{self.ranks_per_run}: a run has one rank per GPU")  # fmt: skip
        if self.cpus_per_run % self.ranks_per_run:
            raise UserError(f"--slurm.cpus-per-run {self.cpus_per_run} must be a multiple of the run's "
                            f"{self.ranks_per_run} rank(s)")  # fmt: skip
        if self.time is not None:
            time_limit_seconds(self.time)  # a one-line UserError here, not sbatch's
        if self.gpu_type and not self.gpus_per_run:
            raise UserError(f"--slurm.gpu-type {self.gpu_type} needs --slurm.gpus-per-run")

    @property
    def threads(self) -> int:
        """Torch threads of each rank."""
        return self.cpus_per_run // self.ranks_per_run

    def sbatch_options(self) -> list[str]:
        per_node = self.ranks_per_run // self.nodes
        out = [f"--nodes={self.nodes}", f"--ntasks-per-node={per_node}", f"--cpus-per-task={self.threads}",
               "--requeue", "--signal=B:TERM@60"]  # fmt: skip
        for flag, value in (("partition", self.partition), ("account", self.account), ("time", self.time),
                            ("mem", self.mem)):  # fmt: skip
            if value:
                out.append(f"--{flag}={value}")
        if self.gpus_per_run:
            kind = f"{self.gpu_type}:" if self.gpu_type else ""
            out.append(f"--gpus-per-node={kind}{self.gpus_per_run // self.nodes}")
        return out + list(self.sbatch)


def time_limit_seconds(limit: str) -> float:
    """sbatch --time in seconds: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    days, _, rest = limit.rpartition("-")
    try:
        parts = [float(x) for x in rest.split(":")]
        if days:
            h, m, s = (parts + [0.0, 0.0])[:3] if len(parts) <= 3 else [float("nan")] * 3
            d = float(days)
        else:
            d, (h, m, s) = 0.0, {1: (0.0, parts[0], 0.0), 2: (0.0, *parts), 3: tuple(parts)}[len(parts)]
    except (ValueError, KeyError):
        raise UserError(f"--slurm.time {limit!r}: use MM, HH:MM:SS or D-HH:MM:SS") from None
    seconds = ((d * 24 + h) * 60 + m) * 60 + s
    if not seconds > 0:
        raise UserError(f"--slurm.time {limit!r}: use MM, HH:MM:SS or D-HH:MM:SS")
    return seconds


def option_fields() -> list[tuple[str, type, str]]:
    """(field name, type, help) of every SlurmOptions field that is a flag."""
    return [(f.name, f.metadata["kind"], f.metadata["help"]) for f in fields(SlurmOptions)]


def _flag(name: str) -> str:
    return name.replace("_", "-")


def script(worker: list[str], name: str, log: Path, options: SlurmOptions) -> str:
    """The batch script of one run: the `worker` command (study/execute.py's worker_command, its plan from a file),
    its output into `log` (a pattern with sbatch's %j: each job its own; appended, so a requeued job keeps what its
    first start said), its exit status as the last line. `exec` is not used: the shell must outlive the worker to
    write that line, and it passes SIGTERM on (--signal=B:TERM) by `wait`.

    A run of several ranks starts them with `srun`, one task each, told their place by Slurm's environment
    (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID: the worker's --ranks-from-slurm) and meeting at the job's first
    node, on a port taken from the job id."""
    log = Path(log).resolve()
    job = re.sub(r"[^A-Za-z0-9_.+-]+", "-", name)  # a directive ends at the first space
    lines = ["#!/bin/bash", f"#SBATCH --job-name=angpt-{job}", f"#SBATCH --output={log}", "#SBATCH --open-mode=append"]
    lines += [f"#SBATCH {o}" for o in options.sbatch_options()]
    lines += [
        f"cd {shlex.quote(os.getcwd())}",
        f"export OMP_NUM_THREADS={options.threads} MKL_NUM_THREADS={options.threads}",
        f'echo "{START_MARK}$SLURM_JOB_ID on $(hostname), start ${{SLURM_RESTART_COUNT:-0}}"',
    ]
    if options.ranks_per_run > 1:
        lines += [
            'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        ]
        worker = ["srun", "--kill-on-bad-exit=1", f"--ntasks={options.ranks_per_run}", *worker,
                  "--ranks-from-slurm"]  # fmt: skip
    lines += [
        "trap 'kill -TERM $child 2>/dev/null' TERM",
        f"{shlex.join(worker)} &",
        "child=$!",
        "wait $child; status=$?",
        "[ $status -gt 128 ] && kill -0 $child 2>/dev/null && { wait $child; status=$?; }",
        f'echo "{EXIT_MARK} $status"',
        "exit $status",
    ]
    return "\n".join(lines) + "\n"


def rank_env(environ: dict[str, str]) -> dict[str, str]:
    """torch.distributed's variables (RANK, WORLD_SIZE, LOCAL_RANK) from those srun gives each task; MASTER_ADDR and
    MASTER_PORT come from the batch script. A one-line UserError outside an srun step."""
    missing = [k for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "MASTER_ADDR", "MASTER_PORT")
               if k not in environ]  # fmt: skip
    if missing:
        raise UserError(f"--ranks-from-slurm outside an srun step of an angpt job: {', '.join(missing)} not set")
    return {"RANK": environ["SLURM_PROCID"], "WORLD_SIZE": environ["SLURM_NTASKS"],
            "LOCAL_RANK": environ["SLURM_LOCALID"]}  # fmt: skip


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


def alive(job_ids: list[str], reasons: dict[str, str] | None = None) -> dict[str, str]:
    """{job id: state} of those of `job_ids` still queued or running (a finished job leaves the queue); `reasons`,
    if given, receives each one's reason for pending (squeue's %r: "Priority", "Resources", "PartitionConfig")."""
    if not job_ids:
        return {}
    res = _slurm(["squeue", "-h", "-o", "%i %T %r", "--states=all"])
    if res.returncode != 0:
        raise UserError(f"squeue failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    wanted, out = set(job_ids), {}
    for line in res.stdout.splitlines():
        job, state, reason = (line.strip().split(None, 2) + ["", ""])[:3]
        if job in wanted and state in ALIVE:
            out[job] = state
            if reasons is not None:
                reasons[job] = reason
    return out


NEVER_STARTS = {  # a pending job's reason that waiting does not change, with what to look at
    "PartitionConfig": "it asks more than the partition has (--slurm.cpus-per-run, ranks, GPUs, nodes or --slurm.mem)",
    "PartitionNodeLimit": "it asks more nodes than the partition allows (--slurm.nodes)",
    "PartitionTimeLimit": "its time limit is over the partition's (--slurm.time)",
    "InvalidAccount": "the account is not valid (--slurm.account)",
    "InvalidQOS": "the QOS is not valid (--slurm.sbatch)",
    "BadConstraints": "its constraints cannot be met (--slurm.sbatch)",
}


def never_starts(state: str | None, reason: str | None) -> str | None:
    """Why a job in `state` for `reason` will wait forever (what to change), or None while it may yet start."""
    return NEVER_STARTS.get(reason or "") if state == "PENDING" else None


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        _slurm(["scancel", *job_ids])


def in_order(job_ids: Iterable[str]) -> list[str]:
    """Job ids in the order Slurm gave them: as numbers, not as text ("9, 10", not "10, 9")."""
    return sorted(job_ids, key=lambda j: (len(j), j))


def record_options(folder: Path, options: SlurmOptions) -> None:
    """Keep what the study's jobs ask of Slurm in its folder: its report says it where --jobs would be."""
    path = Path(folder) / OPTIONS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(options)) + "\n")


def recorded_options(folder: Path) -> dict | None:
    """What the study's jobs in `folder` asked of Slurm (record_options), or None: its runs never went to Slurm."""
    try:
        return json.loads((Path(folder) / OPTIONS_FILE).read_text())
    except (OSError, ValueError):
        return None


def record_job(run_dir: Path, job_id: str, name: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / JOB_FILE).write_text(json.dumps({"job_id": job_id, "name": name}) + "\n")


def recorded_job(run_dir: Path) -> str | None:
    try:
        return str(json.loads((run_dir / JOB_FILE).read_text())["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def worker_exit(log: Path) -> int | None:
    """The worker's exit status from its job's own log (the last EXIT_MARK line: a requeued job's last start's),
    None if the job never wrote one."""
    marks = [x for x in _lines(log) if x.startswith(EXIT_MARK + " ")]
    return int(marks[-1].split()[1]) if marks else None


def started(log: Path) -> bool:
    """Whether a job's own log says it started (START_MARK): one cancelled while it waited has none."""
    return any(x.startswith(START_MARK) for x in _lines(log))


def _lines(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()
    except OSError:
        return []


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
