"""Studies on Slurm (issue 47), against a real scheduler: `make slurm-up` starts a one-node Slurm here
(scripts/slurm.sh), `make test-slurm` runs these. Without Slurm they are skipped, saying why; `make test` leaves
them out (marker `slurm`)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from angpt.cli import main
from angpt.study import slurm

WHY = slurm.available()


def needs_slurm(test):
    """Marked `slurm` (make test-slurm; make test leaves them out), and skipped, saying why, without a Slurm."""
    reason = f"no Slurm here ({WHY}): `make slurm-up` starts one"
    return pytest.mark.slurm(pytest.mark.skipif(WHY is not None, reason=reason)(test))


def compare_args(data_dir, out, *extra):
    return ["compare", "--data", str(data_dir), "--out", str(out), "--arms", "gpt+,angpt", "--budgets", "4Ki",
            "--seeds", "0,1", "--preset", "tiny", "--batch-tokens", "256", "--seq-len", "32", "--micro-batch", "8",
            "--lr-grid", "1", "--quiet", *map(str, extra)]  # fmt: skip


def losses(folder: Path) -> dict[str, float]:
    return {
        str(p.parent.relative_to(folder)): json.loads(p.read_text())["val_loss"]
        for p in sorted(folder.glob("runs/**/result.json"))
    }


def job_starts(folder: Path) -> dict[str, int]:
    """{log: how many times a job started the worker in it} (a requeued job starts again: "start 1")."""
    return {p.name: p.read_text().count("angpt: job ") for p in (folder / "logs").glob("*.log")}


@needs_slurm
def test_a_comparison_through_slurm_equals_the_same_plan_run_here(data_dir, tmp_path):
    """2 arms x 2 seeds plus the tuning seed, one Slurm job each: the same losses, bit for bit, as worker processes
    here with one thread each; each run folder names its job, and the report says the same."""
    here, there = tmp_path / "here", tmp_path / "slurm"
    assert main(compare_args(data_dir, here, "--jobs", "2", "--threads", "1")) == 0
    assert main(compare_args(data_dir, there, "--executor", "slurm", "--slurm.poll-s", "0.5")) == 0
    assert losses(there) == losses(here) and len(losses(here)) == 6
    assert all((p.parent / slurm.JOB_FILE).is_file() for p in there.glob("runs/**/result.json"))
    assert set(job_starts(there).values()) == {1}
    reports = [json.loads((f / "report.json").read_text()) for f in (here, there)]
    for key in ("verdicts", "multiple_comparisons"):  # (arms also hold step times, which differ)
        assert reports[0][key] == reports[1][key], key


@needs_slurm
def test_a_driver_killed_and_started_again_attaches_and_submits_nothing_twice(data_dir, tmp_path):
    """SIGKILL the driver once its jobs are in Slurm; the same command again attaches to the jobs still queued or
    running, skips the finished runs and submits only what was never submitted: every run trained once."""
    out = tmp_path / "study"
    extra = ["--executor", "slurm", "--slurm.poll-s", "0.5", "--slurm.max-jobs", "2"]
    command = [sys.executable, "-m", "angpt", *compare_args(data_dir, out, *extra)]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while len(list(out.glob("runs/**/" + slurm.JOB_FILE))) < 2 and time.time() < deadline:
        time.sleep(0.2)
    driver.kill()
    driver.wait()
    first = {p.parent: json.loads(p.read_text())["job_id"] for p in out.glob("runs/**/" + slurm.JOB_FILE)}
    assert len(first) == 2, first
    res = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    after = {p.parent: json.loads(p.read_text())["job_id"] for p in out.glob("runs/**/" + slurm.JOB_FILE)}
    assert all(after[d] == j for d, j in first.items())  # attached (or finished), never submitted again
    assert len(after) == len(set(after.values())) == 6 and set(job_starts(out).values()) == {1}


@needs_slurm
def test_scontrol_requeue_resumes_the_run_and_it_ends_as_it_would_have(data_dir, tmp_path):
    """A running job requeued (as preemption does): the worker saves on SIGTERM, the job starts again, the run
    resumes from its checkpoint and ends at the loss of a run never stopped."""
    here, out = tmp_path / "here", tmp_path / "slurm"
    args = ["--arms", "angpt", "--tuning-seed", "none", "--budgets", "64Ki", "--seeds", "0"]

    def study(folder, *extra):
        base = compare_args(data_dir, folder, *extra)
        return base[:5] + args + [a for a in base[5:] if a not in ("gpt+,angpt", "--arms", "--budgets", "4Ki",
                                                                    "--seeds", "0,1")]  # fmt: skip

    assert main(study(here, "--jobs", "1", "--threads", "1")) == 0
    command = [sys.executable, "-m", "angpt", *study(out, "--executor", "slurm", "--slurm.poll-s", "0.5")]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    ckpt = None
    while ckpt is None and time.time() < deadline:
        ckpt = next(out.glob("runs/**/checkpoints/step_*"), None)
        time.sleep(0.2)
    assert ckpt is not None, "no checkpoint appeared"
    (job,) = [json.loads(p.read_text())["job_id"] for p in out.glob("runs/**/" + slurm.JOB_FILE)]
    subprocess.run(["scontrol", "requeue", job], check=True)
    time.sleep(1)
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False)  # Slurm holds it a while
    _, err = driver.communicate(timeout=600)
    assert driver.returncode == 0, err[-2000:]
    assert losses(out) == losses(here)
    (log,) = (out / "logs").glob("*.log")
    text = log.read_text()
    assert "start 1" in text and "resuming from step" in text, text[-3000:]


@needs_slurm
def test_a_wrong_partition_is_one_line_and_loses_nothing(data_dir, tmp_path, capsys):
    out = tmp_path / "study"
    assert main(compare_args(data_dir, out, "--jobs", "2", "--threads", "1")) == 0
    before = {p: p.read_bytes() for p in out.glob("runs/**/result.json")}
    capsys.readouterr()
    extended = compare_args(data_dir, out, "--executor", "slurm", "--slurm.partition", "nowhere")
    extended[extended.index("0,1")] = "0,1,2"
    assert main(extended) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("angpt compare: error: Slurm refused run ") and "nowhere" in err[-1].lower(), err
    assert {p: p.read_bytes() for p in out.glob("runs/**/result.json")} == before


@needs_slurm
def test_ctrl_c_leaves_the_jobs_tracked_or_with_the_flag_cancels_them(data_dir, tmp_path):
    """SIGINT on the driver: its jobs stay in Slurm and it says so (a re-run attaches); with --slurm.cancel they are
    cancelled. Either way no job is left that no run folder names (jobs of earlier tests still leaving the queue
    set aside)."""

    def queued() -> list[list[str]]:
        out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True).stdout
        return [line.split() for line in out.splitlines() if "angpt-" in line]

    earlier = {job for job, _ in queued()}
    for cancel in (False, True):
        out = tmp_path / f"study-{cancel}"
        extra = ["--executor", "slurm", "--slurm.poll-s", "0.5", *(["--slurm.cancel"] if cancel else [])]
        command = [sys.executable, "-m", "angpt", *compare_args(data_dir, out, *extra)]
        driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while not list(out.glob("runs/**/" + slurm.JOB_FILE)) and time.time() < deadline:
            time.sleep(0.1)
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=120)
        named = {json.loads(p.read_text())["job_id"] for p in out.glob("runs/**/" + slurm.JOB_FILE)}
        alive = slurm.alive(sorted(named))
        if cancel:
            assert "cancelled Slurm job(s)" in err and not alive, err
        else:
            assert "re-run the same command to attach" in err, err
            slurm.cancel(sorted(alive))
        assert not [job for job, _ in queued() if job not in named | earlier]


def test_without_slurm_the_slurm_flags_say_what_they_need(data_dir, tmp_path, capsys, monkeypatch):
    """A --slurm.* flag without --executor slurm is one line; so is --executor slurm where sbatch is not found."""
    assert main(compare_args(data_dir, tmp_path / "a", "--slurm.partition", "gpu")) == 2
    assert capsys.readouterr().err.strip().endswith("--slurm.partition needs --executor slurm")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(compare_args(data_dir, tmp_path / "b", "--executor", "slurm")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("not found: --executor slurm needs Slurm's commands on PATH"), err
    assert not list((tmp_path / "b").glob("runs/**/result.json"))
