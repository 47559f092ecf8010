"""Studies on Slurm (issue 47), against a real scheduler: `make slurm-up` starts a one-node Slurm here
(scripts/slurm.sh), `make test-slurm` runs these. Without Slurm they are skipped, saying why; `make test` leaves
them out (marker `slurm`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
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


def job_ids(folder: Path) -> dict[Path, str]:
    """{run folder: the job that trains it} (slurm_job.json)."""
    return {p.parent: json.loads(p.read_text())["job_id"] for p in folder.glob("runs/**/" + slurm.JOB_FILE)}


def wait_for(what, seconds: float = 120):
    """what(), once it is true; fails the test after `seconds`."""
    deadline = time.time() + seconds
    while not (found := what()):
        if time.time() > deadline:
            pytest.fail(f"waited {seconds} s in vain for {what.__doc__ or what}")
        time.sleep(0.2)
    return found


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
    deadline = time.time() + 90
    while slurm.alive([job]).get(job) != "PENDING" and time.time() < deadline:  # the worker saves, then it queues
        time.sleep(0.2)
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
def test_a_job_the_partition_cannot_hold_is_one_line_not_a_wait_forever(data_dir, tmp_path, capsys):
    """Four ranks of one CPU each on a two-CPU node: Slurm queues the job (PartitionConfig) but never starts it. The
    driver says so in one line and cancels that job, instead of waiting; the finished runs stay."""
    out = tmp_path / "study"
    args = compare_args(data_dir, out, "--executor", "slurm", "--slurm.poll-s", "0.5", "--slurm.ranks-per-run", "4")
    args[args.index("--micro-batch") + 1] = "2"  # 256 tokens a step = 4 ranks x 2 sequences x 32
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Slurm will not start run " in err[-1] and "PartitionConfig" in err[-1], err
    named = [json.loads(p.read_text())["job_id"] for p in out.glob("runs/**/" + slurm.JOB_FILE)]
    assert named and not slurm.alive(named)


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


@needs_slurm
def test_a_job_cancelled_before_it_started_stops_the_study_saying_so(data_dir, tmp_path):
    """scancel a running job: its worker saves and the run is submitted again, in one line; scancel that job while it
    waits (a job of another user holds the node): the first job's exit 130, in the same run's logs, does not count.
    The study stops saying it was cancelled before it started, never 'exit None' (report.md neither), and names the
    study's job it leaves running."""
    cpus = int(subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout.split()[0])
    hold = ["sbatch", "--parsable", "--job-name=blocker", f"--cpus-per-task={cpus - 1}", "--output=/dev/null",
            "--wrap=sleep 600"]  # fmt: skip
    blocker = subprocess.run(hold, capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    out = tmp_path / "study"
    args = compare_args(data_dir, out, "--executor", "slurm", "--slurm.poll-s", "0.5")
    args[args.index("4Ki")] = "256Ki"  # long enough to be cancelled while it trains
    driver = subprocess.Popen([sys.executable, "-m", "angpt", *args], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: slurm.alive([blocker]).get(blocker) == "RUNNING")
        ckpt = wait_for(lambda: next(out.glob("runs/**/checkpoints/step_*"), None))  # one CPU left: one runs
        run = ckpt.parents[1]
        first = job_ids(out)[run]
        (other,) = [j for d, j in job_ids(out).items() if d != run]
        subprocess.run(["scancel", first], check=True)
        again = wait_for(lambda: job_ids(out)[run] != first and job_ids(out)[run])
        assert slurm.alive([again]).get(again) == "PENDING"  # the other run's job took the CPU
        subprocess.run(["scancel", again], check=True)
        _, err = driver.communicate(timeout=60)
    finally:
        driver.kill()
        slurm.cancel([blocker, *job_ids(out).values()])
    lines = err.strip().splitlines()
    assert driver.returncode == 2, err[-3000:]
    assert [x for x in lines if "submitted again" in x and first in x and again in x], err
    assert lines[-1].endswith(f"(Slurm job {again}, cancelled before it started)") and "None" not in err, err
    assert [x for x in lines if "stay queued or running" in x and other in x], err
    failed = (out / "report.md").read_text().split("## Failed runs")[1]
    assert "cancelled before it started" in failed and "None" not in failed, failed


class FakeSlurm:
    """sbatch, squeue and scancel stood in for (study/slurm.py's submit, alive, cancel): job ids from `first` on, each
    job queued until the test ends it; one that ran writes what a real one would to the log its script names."""

    def __init__(self, monkeypatch, first: int, most: int = 10):
        self.next, self.most, self.scripts, self.gone = first, most, {}, set()
        self.on_poll = lambda: None
        monkeypatch.setattr(slurm, "submit", self.submit)
        monkeypatch.setattr(slurm, "alive", self.alive)
        monkeypatch.setattr(slurm, "cancel", self.gone.update)

    def submit(self, text: str, name: str, options) -> str:
        if len(self.scripts) == self.most:
            pytest.fail(f"more than {self.most} jobs submitted")
        job, self.next = str(self.next), self.next + 1
        self.scripts[job] = text
        return job

    def alive(self, job_ids, reasons=None):
        if not job_ids:  # the driver's first look, for jobs of an earlier driver
            return {}
        self.on_poll()
        return {j: "PENDING" for j in job_ids if j not in self.gone}

    def end(self, job: str, status: int | None = None) -> None:
        """`job` leaves the queue: after its worker exited with `status`, or (None) before it started."""
        if status is not None:
            (output,) = [x.split("=", 1)[1] for x in self.scripts[job].splitlines() if x.startswith("#SBATCH --output")]
            with open(output.replace("%j", job), "a") as log:
                log.write(f"angpt: job {job} on here, start 0\n{slurm.EXIT_MARK} {status}\n")
        self.gone.add(job)


def test_only_a_jobs_own_exit_decides_what_follows_it(data_dir, tmp_path, capsys, monkeypatch):
    """Jobs 9 and 10; 9's worker is stopped by a signal after saving (exit 130): its run goes to Slurm again as job
    11, said in one line. 11 leaves the queue before it starts: 9's 130 does not make it a third job; the study
    stops saying so (report.md too, never 'None') and names job 10, which it leaves queued. The report says what
    each Slurm job was given, not --jobs."""
    fake = FakeSlurm(monkeypatch, 9, most=3)
    fates = iter([lambda: fake.end("9", 130), lambda: fake.end("11")])
    fake.on_poll = lambda: next(fates, lambda: None)()
    out = tmp_path / "study"
    assert main(compare_args(data_dir, out, "--executor", "slurm", "--slurm.poll-s", "0.01", "--jobs", "2")) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len([x for x in lines if "submitted again" in x]) == 1 and "None" not in "\n".join(lines), lines
    assert lines[-1].endswith("(Slurm job 11, cancelled before it started)"), lines
    assert [x for x in lines if x.startswith("Slurm job(s) 10 stay queued or running")], lines
    report = (out / "report.md").read_text()
    assert "cancelled before it started" in report.split("## Failed runs")[1]
    machine = next(x for x in report.splitlines() if x.startswith("- machine:"))
    assert "job(s) x" not in machine and "Slurm: each run a job of 1 rank(s) x 1 thread(s)" in machine, machine
    # the same study finished here (in this process: no workers to start): its report says how these runs were
    # trained, not the Slurm jobs' options
    assert main(compare_args(data_dir, out, "--executor", "inprocess")) == 0
    machine = next(x for x in (out / "report.md").read_text().splitlines() if x.startswith("- machine:"))
    assert "1 job(s) x" in machine and "Slurm" not in machine, machine


def test_ctrl_c_names_the_jobs_left_in_numeric_order(data_dir, tmp_path, capsys, monkeypatch):
    fake = FakeSlurm(monkeypatch, 9)

    def ctrl_c():
        raise KeyboardInterrupt

    fake.on_poll = ctrl_c
    assert main(compare_args(data_dir, tmp_path / "s", "--executor", "slurm", "--slurm.poll-s", "0.01")) == 130
    assert "Slurm job(s) 9, 10 stay queued or running" in capsys.readouterr().err


def test_without_slurm_the_slurm_flags_say_what_they_need(data_dir, tmp_path, capsys, monkeypatch):
    """A --slurm.* flag without --executor slurm is one line; so is --executor slurm where sbatch is not found."""
    assert main(compare_args(data_dir, tmp_path / "a", "--slurm.partition", "gpu")) == 2
    assert capsys.readouterr().err.strip().endswith("--slurm.partition needs --executor slurm")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(compare_args(data_dir, tmp_path / "b", "--executor", "slurm")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("not found: --executor slurm needs Slurm's commands on PATH"), err
    assert not list((tmp_path / "b").glob("runs/**/result.json"))


def parse(*argv: str):
    import argparse

    from angpt.study.comparison.cli import add_compare_parser

    parser = argparse.ArgumentParser(prog="angpt", exit_on_error=False)
    add_compare_parser(parser.add_subparsers())
    return parser.parse_args(["compare", "--out", "o", *argv])


def test_the_slurm_options_come_from_a_yaml_file_with_the_flags_over_it(tmp_path):
    """--slurm.config FILE holds the same keys as the flags (either spelling); a flag beside it wins; an unknown key,
    a wrong type or a file that is not a mapping is one line naming the file."""
    from angpt.errors import UserError
    from angpt.study.flags import slurm_options

    conf = tmp_path / "slurm.yaml"
    conf.write_text("partition: gpu\ngpus-per-run: 8\nnodes: 2\ntime: '12:00:00'\nsbatch: [--qos=high]\ncancel: true\n")
    opts = slurm_options(parse("--executor", "slurm", "--slurm.config", str(conf), "--slurm.partition", "big"))
    assert (opts.partition, opts.gpus_per_run, opts.nodes, opts.ranks_per_run, opts.time) == (
        "big",
        8,
        2,
        8,
        "12:00:00",
    )
    assert opts.cancel and opts.sbatch == ["--qos=high"] and opts.cpus_per_run == 8 and opts.threads == 1
    for text, says in (("partitions: gpu\n", "unknown option 'partitions'"), ("nodes: two\n", "nodes: 'two' must be"),
                       ("- gpu\n", "a mapping"), ("cancel: 3\n", "must be true or false")):  # fmt: skip
        conf.write_text(text)
        with pytest.raises(UserError, match=says) as e:
            slurm_options(parse("--executor", "slurm", "--slurm.config", str(conf)))
        assert str(conf) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="needs --executor slurm"):
        slurm_options(parse("--slurm.config", str(conf)))


def test_a_run_of_several_ranks_asks_slurm_for_them_and_starts_them_with_srun():
    """8 GPUs on 2 nodes: 4 tasks and 4 GPUs (of the type named) a node, and srun starting the ranks, which read
    their place from Slurm's environment; one rank runs the worker itself. Shapes that cannot hold are one line."""
    from angpt.errors import UserError
    from angpt.study.slurm import SlurmOptions, rank_env, script

    opts = SlurmOptions(gpus_per_run=8, nodes=2, gpu_type="h100", cpus_per_run=32, sbatch=["--qos=high"])
    lines = script(["python", "-m", "angpt.study.worker", "R", "[]", "4"], "angpt 1Mi", Path("l.log"), opts)
    lines = lines.splitlines()
    for want in ("--nodes=2", "--ntasks-per-node=4", "--cpus-per-task=4", "--gpus-per-node=h100:4", "--qos=high"):
        assert f"#SBATCH {want}" in lines, want
    (launch,) = [x for x in lines if x.startswith("srun ")]
    assert "--ntasks=8" in launch and launch.endswith("--ranks-from-slurm &")
    assert any(x.startswith("export MASTER_ADDR=$(scontrol show hostnames") for x in lines)
    one = script(["python", "-m", "angpt.study.worker"], "x", Path("l.log"), SlurmOptions(cpus_per_run=2))
    assert "srun" not in one and "#SBATCH --ntasks-per-node=1" in one and "OMP_NUM_THREADS=2 " in one
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "2"}
    assert rank_env(env) == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    with pytest.raises(UserError, match="MASTER_ADDR not set"):
        rank_env({k: v for k, v in env.items() if k != "MASTER_ADDR"})
    for bad, says in ((dict(ranks_per_run=3, nodes=2), "multiple of --slurm.nodes"),
                      (dict(gpus_per_run=4, ranks_per_run=2), "one rank per GPU"),
                      (dict(ranks_per_run=4, cpus_per_run=6), "multiple of the run's 4 rank"),
                      (dict(time="soon"), "--slurm.time 'soon'"), (dict(nodes=0), "--slurm.nodes 0 must be"),
                      (dict(gpu_type="H100"), "needs --slurm.gpus-per-run")):  # fmt: skip
        with pytest.raises(UserError, match=says):
            SlurmOptions(**bad)


def test_the_slurm_dry_run_prints_each_jobs_script_and_the_gpu_hours(data_dir, tmp_path, capsys, monkeypatch):
    """--executor slurm --dry-run submits nothing and writes nothing: it prints the script of every run whose
    settings are known (the 5-point sweep of each arm), lists the runs whose rate the sweep will choose, and the
    GPU-hours: each run's steps x its arm's planned step x the GPUs, and the bound the time limit sets."""
    from angpt.study import slurm_plan

    monkeypatch.setattr(slurm, "submit", lambda *a: pytest.fail("a dry run submitted a job"))
    steps = {"gpt+": 0.5, "angpt": 0.25}  # seconds a step, planned (a stand-in for angpt train --dry-run's)
    monkeypatch.setattr(slurm_plan, "_step_seconds", lambda plan, options: steps)
    args = compare_args(data_dir, tmp_path / "s", "--executor", "slurm", "--slurm.gpus-per-run", "2", "--slurm.time",
                        "30", "--slurm.cpus-per-run", "8", "--dry-run")  # fmt: skip
    args[args.index("--lr-grid") + 1] = "0.5,1,2"
    args[args.index("--batch-tokens") + 1] = "512"
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("#!/bin/bash") == 6 and out.count("#SBATCH --gpus-per-node=2") == 6
    assert "4 run(s) submitted once their sweep has chosen" in out and not (tmp_path / "s").exists()
    runs = {"gpt+": 3 + 2, "angpt": 3 + 2}  # a 3-point sweep on the tuning seed and 2 seeds, each 8 steps
    hours = sum(n * 8 * steps[a] * 2 for a, n in runs.items()) / 3600
    assert f"estimate: ~{hours:.3g} GPU-hours" in out
    assert f"at most {10 * 0.5 * 2:.3g} GPU-hours at the --slurm.time limit 30 per job" in out


def test_a_batch_that_several_ranks_cannot_split_is_one_line_before_anything_runs(data_dir, tmp_path, capsys,
                                                                                   monkeypatch):  # fmt: skip
    monkeypatch.setattr(slurm, "submit", lambda *a: pytest.fail("a job was submitted"))
    args = compare_args(data_dir, tmp_path / "s", "--executor", "slurm", "--slurm.ranks-per-run", "4")
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("angpt compare: error: --slurm.ranks-per-run 4: a step of 256 tokens does not split")
    assert not (tmp_path / "s").exists()


def test_a_signal_held_around_sbatch_waits_whichever_thread_the_kernel_gives_it():
    """The driver has other threads (torch's, the progress bar's), and a process-directed SIGINT goes to any thread
    that does not block it; Python then raises KeyboardInterrupt in the main thread at once. Held around sbatch, it
    must still wait for the block's end, so that the job is named by its run folder first (CI's flaky Ctrl-C leg:
    a queued job that no folder named)."""
    import os
    import threading

    from angpt.study.execute import held_signals

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    finished = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with held_signals():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(200):  # many chances for the interpreter to run a pending handler
                    time.sleep(0.001)
                finished.append(True)
    finally:
        stop.set()
        signal.signal(signal.SIGINT, old)
    assert finished, "SIGINT stopped the held block"


def test_ctrl_c_at_a_terminal_asks_before_cancelling_and_elsewhere_leaves_the_jobs():
    import io

    from angpt.study.execute import ask_cancel

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert ask_cancel(["1", "2"], Terminal("y\n")) is True
    assert ask_cancel(["1"], Terminal("\n")) is False and ask_cancel(["1"], Terminal("")) is False
    assert ask_cancel(["1"], io.StringIO("y\n")) is False  # not a terminal: never asks, leaves them


def test_scaling_takes_the_executor_flags(data_dir, tmp_path, capsys):
    """`angpt scaling` (a ladder, and batch) takes the executor flags compare takes: its Slurm dry run prints each
    size's jobs, from each size's folder."""
    ladder = ["scaling", "--data", str(data_dir), "--out", str(tmp_path / "l"), "--depths", "1,2,3", "--preset",
              "tiny", "--budgets", "1Ki,2Ki,4Ki", "--batch-tokens", "256", "--seq-len", "32",
              "--lr-grid", "1"]  # fmt: skip
    assert main([*ladder, "--slurm.partition", "gpu"]) == 2
    assert capsys.readouterr().err.strip().endswith("--slurm.partition needs --executor slurm")
    assert main([*ladder, "--executor", "slurm", "--slurm.partition", "gpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    sizes = {line.split("(")[-1].rstrip(")") for line in out.splitlines() if line.startswith("# --- run ")}
    assert len(sizes) == 3 and all("/sizes/" in s for s in sizes) and out.count("#SBATCH --partition=gpu") == 18
    assert not (tmp_path / "l").exists()
    assert main(["scaling", "batch", "--data", str(data_dir), "--out", str(tmp_path / "b"), "--tokens", "4Ki",
                 "--batch-sizes", "256,512", "--jobs", "two"]) == 2  # fmt: skip
    assert capsys.readouterr().err.strip().endswith("--jobs 'two' must be a positive integer")


@needs_slurm
def test_a_two_rank_run_launched_by_slurm_matches_the_same_run_under_torchrun(data_dir, tmp_path):
    """--slurm.ranks-per-run 2: srun starts two CPU ranks (gloo), placed by Slurm's environment; the run equals,
    loss for loss, the same worker started by torchrun on this machine, and both trained as two ranks."""
    out, again = tmp_path / "slurm", tmp_path / "torchrun"
    base = compare_args(data_dir, out, "--executor", "slurm", "--slurm.poll-s", "0.5", "--slurm.ranks-per-run", "2")
    args = [a for a in base if a not in ("gpt+,angpt", "0,1")]
    args[args.index("--arms") + 1 : args.index("--arms") + 1] = ["angpt"]
    args[args.index("--seeds") + 1 : args.index("--seeds") + 1] = ["0"]
    args[args.index("--micro-batch") + 1] = "4"  # 256 tokens a step = 2 ranks x 4 sequences x 32
    assert main([*args, "--tuning-seed", "none"]) == 0
    (result,) = out.glob("runs/**/result.json")
    rec = json.loads(result.read_text())
    spec = json.dumps([rec["arm"], rec["budget"], rec["seed"], rec["lr"], []])
    plan = out / "logs" / "slurm-plan.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "angpt.study.worker", str(again), spec, "1", "--plan", str(plan)]  # fmt: skip
    res = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    twin = again / result.relative_to(out)
    assert json.loads(twin.read_text())["val_loss"] == rec["val_loss"]
    rows = [[json.loads(x) for x in (f.parent / "metrics.jsonl").read_text().splitlines()] for f in (result, twin)]
    assert [(r["step"], r.get("loss"), r.get("val_loss")) for r in rows[0]] == [
        (r["step"], r.get("loss"), r.get("val_loss")) for r in rows[1]
    ]
    for folder in (result.parent, twin.parent):
        states = [json.loads(p.read_text()) for p in folder.glob("checkpoints/step_*/state.json")]
        assert states and {s["world_size"] for s in states} == {2}, folder


def test_the_cluster_example_in_the_docs_plans_what_the_docs_say(data_dir, tmp_path, capsys, monkeypatch):
    """docs/compare.md's YAML file and command, run as written (on the test corpus): the options it names, its
    run count, its time-limit bound, and the script it shows, line for line but the paths."""
    import re as _re
    import shlex as _shlex

    text = (Path(__file__).parents[1] / "docs" / "compare.md").read_text()
    section = text[text.index("## On a cluster") : text.index("## What it writes")]
    yaml_text, command, shown = _re.findall(r"```(?:yaml|bash)\n(.*?)```", section, _re.S)[:3]
    (tmp_path / "cluster.yaml").write_text(yaml_text)
    monkeypatch.chdir(tmp_path)
    argv = _shlex.split(command.replace("\\\n", " "))[1:]
    argv[argv.index("--data") + 1], argv[argv.index("--out") + 1] = str(data_dir), str(tmp_path / "gpt2")
    assert main(argv) == 0
    out = capsys.readouterr().out
    said = " ".join(section.split())
    runs, bound = _re.search(r"For the plan above: (\d+) runs, .*?at most ([\d,]+) at", said).groups()
    assert f"Slurm: {runs} run(s) left" in out and f"at most {bound} GPU-hours" in out
    shown = shown.replace("\\\n    ", "").strip().splitlines()
    name = shown[1].split("=", 1)[1]  # the job the docs show: angpt-ARM-BUDGET-seedS-lrL
    block = out[out.index(f"#SBATCH --job-name={name}\n") :].split("\n# --- run")[0]
    first = ["#!/bin/bash", *block.strip().splitlines()]
    assert len(first) == len(shown)
    for mine, theirs in zip(first, shown):
        assert _re.sub(r"/[^\s'\"]*", "/P", mine) == _re.sub(r"/[^\s'\"]*", "/P", theirs), (mine, theirs)


@needs_slurm
def test_the_local_cluster_example_in_the_docs_runs_as_written(data_dir, tmp_path, monkeypatch):
    """docs/compare.md's example for the one-node Slurm of `make slurm-up`, run as written (its data: the test
    corpus): it finishes; its report says what each Slurm job got, not --jobs; every job it ran is in the job
    completion log the page points to."""
    text = (Path(__file__).parents[1] / "docs" / "compare.md").read_text()
    section = text[text.index("### Try it on this machine") : text.index("## What it writes")]
    block = re.findall(r"```bash\n(.*?)```", section, re.S)[0].replace("\\\n", " ")
    (command,) = [line for line in block.splitlines() if line.startswith("angpt compare")]
    argv = shlex.split(command, comments=True)[1:]
    argv[argv.index("--data") + 1] = str(data_dir)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    out = tmp_path / argv[argv.index("--out") + 1]
    machine = next(x for x in (out / "report.md").read_text().splitlines() if x.startswith("- machine:"))
    assert "job(s) x" not in machine and "Slurm: each run a job of 1 rank(s)" in machine, machine
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    settings = dict(re.findall(r"^(\w+)\s*=\s*(\S*)", config, re.M))
    assert settings["JobCompType"] == "jobcomp/filetxt" and settings["JobCompLoc"] in section
    ended = Path(settings["JobCompLoc"]).read_text()
    for job in job_ids(out).values():
        assert re.search(rf"^JobId={job} .*JobState=COMPLETED", ended, re.M), job


SCRIPT = Path(__file__).parents[1] / "scripts" / "slurm.sh"
PID_FILES = {"slurmctld": "slurmctld.pid", "slurmd": "slurmd.pid", "munged": "munge/munged.pid"}


def running(pid: int, name: str) -> bool:
    """Whether process `pid` is a `name` that runs (not a zombie left for its parent to reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return f"({name}) " in stat and f"({name}) Z" not in stat


def own_daemon(name: str) -> int | None:
    """The pid of scripts/slurm.sh's `name` (slurmctld, slurmd, munged) while it runs: its pid file names it."""
    try:
        pid = int((Path("/var/spool/angpt-slurm") / PID_FILES[name]).read_text())
    except (OSError, ValueError):
        return None
    return pid if running(pid, name) else None


@needs_slurm
def test_the_local_slurm_script_leaves_running_daemons_be_and_stops_only_its_own(tmp_path):
    """`slurm.sh up` with its daemons running leaves their config alone (a config that differs from its own it
    rewrites, restarting them); `slurm.sh down` stops the daemons whose pid files it wrote (munged too, if it started
    it) and no other process of those names. Last in this file: it restarts the Slurm the others use."""
    if os.geteuid() != 0 or own_daemon("slurmctld") is None:
        pytest.skip("needs root and a Slurm that scripts/slurm.sh started")

    def script(verb: str) -> None:
        res = subprocess.run(["bash", str(SCRIPT), verb], capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stderr

    conf = Path("/etc/slurm/slurm.conf")
    before = (conf.stat().st_mtime_ns, own_daemon("slurmctld"), own_daemon("slurmd"))
    script("up")
    assert (conf.stat().st_mtime_ns, own_daemon("slurmctld"), own_daemon("slurmd")) == before
    text = conf.read_text()
    conf.write_text(text + "# edited by hand\n")
    script("up")
    assert conf.read_text() == text and own_daemon("slurmctld") not in (None, before[1])
    shutil.copy("/bin/sleep", tmp_path / "slurmd")
    other = subprocess.Popen([str(tmp_path / "slurmd"), "600"])  # a slurmd this script did not start
    munged = own_daemon("munged")
    try:
        script("down")
        assert other.poll() is None, "slurm.sh down stopped a slurmd it did not start"
        assert own_daemon("slurmctld") is None and own_daemon("slurmd") is None
        assert munged is None or not running(munged, "munged")
    finally:
        other.kill()
        other.wait()
        script("up")
