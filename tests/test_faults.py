"""Faults the trainer must survive: each test reproduces a failure seen in the issue "a trainer you can leave alone".

Checkpoint, CLI and data faults live in test_faults_checkpoint.py, test_faults_cli.py and test_faults_data.py.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from angpt.models import registry
from angpt.train.config import load_run_config, parse_overrides
from angpt.train.loop import TrainingError, train

from .test_train import ROOT, TINY, metrics, run_cli


def two_tokenizers(tmp_path):
    """Two datasets of other text, each with its own 300-token BPE: same vocabulary size, other tokenizers."""
    from angpt.data import prepare_dataset

    datasets = []
    for name, words in (("a", "alpha beta gamma delta epsilon"), ("b", "one two three four five six")):
        docs = tmp_path / f"docs_{name}"
        docs.mkdir()
        for i in range(30):
            (docs / f"d{i}.txt").write_text(" ".join(words.split()[(i + j) % 5] for j in range(300)))
        datasets.append(tmp_path / f"data_{name}")
        prepare_dataset(docs, "bpe:300", datasets[-1], val_fraction=0.1, progress=False)
    return datasets


# ----------------------------------------------------------------------------------------- run folder lock
def test_a_run_folder_is_claimed_by_one_process(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text(f"{os.getpid()} {os.uname().nodename}")  # a live owner: this very process
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (out / ".lock").write_text(f"{other.pid} {os.uname().nodename}")
        rc = run_cli("--arch", "angpt", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "2")
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and f"pid {other.pid}" in err[0], err
        assert not (out / "metrics.jsonl").exists()
    finally:
        other.kill()
        other.wait()
    # The owner is gone now: its lock is stale, taken over with a warning, and released at the end.
    assert run_cli("--arch", "angpt", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "2") == 0
    assert "stale lock" in capsys.readouterr().err
    assert not (out / ".lock").exists()


# ------------------------------------------------------------------------------------------- resume checks
def test_resume_refuses_changed_hyperparameters_and_applies_a_longer_run(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--arch", "angpt", "--data", data_dir, *TINY, "--out", out, "--train.save_every", "0"]
    assert run_cli(*common, "--train.max_steps", "4", "--train.stop_at", "2") == 0
    capsys.readouterr()
    for field, value in (("lr", "0.01"), ("batch_tokens", "1024"), ("seed", "3"), ("warmup_steps", "2")):
        rc = run_cli(*common, "--train.max_steps", "4", "--resume", "auto", f"--train.{field}", value)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and f"train.{field}" in err[0], (field, err)
    # A longer max_steps applies: the schedule is recomputed for 8 steps, and the run goes on to step 8.
    assert run_cli(*common, "--train.max_steps", "8", "--resume", "auto") == 0
    err = capsys.readouterr().err
    assert "resuming from step 2" in err and "max_steps 4 -> 8" in err
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 9))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["run"]["train"]["max_steps"] == 8
    from angpt.train.optim import Schedule

    expect = Schedule(max_steps=8)  # anGPT: no warm-up
    lr0 = registry.get("angpt").recipe.lr
    # a row's lr is the one set for the next step: the 8-step cosine, where the 4-step one would be at its floor
    assert [r["lr"] for r in rows[2:]] == pytest.approx([lr0 * expect(s) for s in range(3, 9)], rel=1e-6)


def test_resumed_metrics_have_no_repeated_steps(data_dir, tmp_path):
    """Steps logged after the last checkpoint (a crash) are run again on resume: their rows are not duplicated."""
    out = tmp_path / "run"
    common = ["--arch", "angpt", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "6"]
    assert run_cli(*common, "--train.save_every", "0", "--train.stop_at", "2") == 0
    with open(out / "metrics.jsonl", "a") as f:  # rows of steps 3 and 4 that were never checkpointed
        for step in (3, 4):
            f.write(json.dumps({"step": step, "loss": 9.0}) + "\n")
    assert run_cli(*common, "--resume", "auto") == 0
    steps = [r["step"] for r in metrics(out)]
    assert steps == sorted(set(steps)) == list(range(1, 7))


# -------------------------------------------------------------------------------------------- exit codes
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signalled_run_exits_non_zero_after_saving(sig, code, data_dir, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    args = ["--arch", "angpt", "--data", str(data_dir), *TINY, "--out", str(out), "--train.max_steps", "100000"]
    proc = subprocess.Popen([sys.executable, "-m", "angpt", "train", *args], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (out / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-500:]
    assert list((out / "checkpoints").glob("step_*")), "the interruption saved a checkpoint"


# --------------------------------------------------------------------------------------------- NaN guard
def test_non_finite_gradient_stops_before_the_update(data_dir, tmp_path, monkeypatch):
    """A step whose gradient is NaN must not reach the weights: the last checkpoint stays the last good one."""
    from angpt.train import step as step_module

    out = tmp_path / "run"
    cfg_args = ["--arch", "angpt", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "6"]
    calls = {"n": 0}
    original = step_module.TrainStep.clip

    def clip(self):
        calls["n"] += 1
        norm = original(self)
        return norm * float("nan") if calls["n"] == 4 else norm

    monkeypatch.setattr(step_module.TrainStep, "clip", clip)
    cfg = load_run_config(None, parse_overrides([*map(str, cfg_args), "--train.save_every", "2"]))
    with pytest.raises(TrainingError, match=r"gradient norm is nan at step 4.*step_000002"):
        train(cfg)
    from safetensors.torch import load_file

    last = sorted((out / "checkpoints").glob("step_*"))[-1]
    assert last.name == "step_000002"
    assert all(torch.isfinite(t).all() for t in load_file(str(last / "model.safetensors")).values())
    failed = metrics(out)[-1]  # the failing step is logged with its gradient norm and the error
    assert failed["step"] == 4 and math.isnan(failed["grad_norm"]) and "gradient norm is nan" in failed["error"]


def test_resume_refuses_data_with_another_tokenizer(tmp_path, capsys):
    """Same vocabulary size, another tokenizer: the token ids would mean other text, so resume refuses."""
    datasets = two_tokenizers(tmp_path)
    out = tmp_path / "run"
    common = ["--arch", "angpt", *TINY, "--out", out, "--train.max_steps", "4", "--train.save_every", "0"]
    assert run_cli(*common, "--data", datasets[0], "--train.stop_at", "2") == 0
    capsys.readouterr()
    rc = run_cli(*common, "--data", datasets[1], "--resume", "auto")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "tokenizer" in err[0], err


def test_an_empty_validation_split_fails_before_step_one(tmp_path, capsys):
    from angpt.data import prepare_dataset

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(4):
        (docs / f"d{i}.txt").write_text("lorem ipsum dolor sit amet " * 40)
    data = tmp_path / "data"
    prepare_dataset(docs, "bytes", data, val_fraction=0.0, progress=False)
    out = tmp_path / "run"
    rc = run_cli("--arch", "angpt", "--data", data, *TINY, "--out", out, "--train.max_steps", "3")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "validation" in err[0], err
    assert not (out / "checkpoints").exists()


def test_init_from_onto_another_tokenizer_refuses_unless_forced(tmp_path, capsys):
    datasets = two_tokenizers(tmp_path)
    common = ["--arch", "angpt", *TINY, "--train.max_steps", "2"]
    assert run_cli(*common, "--data", datasets[0], "--out", tmp_path / "a") == 0
    init = sorted((tmp_path / "a" / "checkpoints").glob("step_*"))[-1]
    capsys.readouterr()
    rc = run_cli(*common, "--data", datasets[1], "--out", tmp_path / "b", "--init_from", init)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "tokenizer" in err[0], err
    forced = ["--train.init_any_tokenizer", "true"]
    assert run_cli(*common, "--data", datasets[1], "--out", tmp_path / "b", "--init_from", init, *forced) == 0
    assert run_cli(*common, "--data", datasets[0], "--out", tmp_path / "c", "--init_from", init) == 0  # same: fine


def test_a_loss_spike_stops_before_the_update_and_keeps_the_pre_spike_checkpoint(data_dir, tmp_path, monkeypatch):
    from angpt.train import step as step_module

    calls = {"n": 0}
    original = step_module.TrainStep.accumulate

    def accumulate(self, next_batch):
        calls["n"] += 1
        loss = original(self, next_batch)
        return loss * 50 if calls["n"] == 14 else loss

    monkeypatch.setattr(step_module.TrainStep, "accumulate", accumulate)
    out = tmp_path / "run"
    args = ["--arch", "angpt", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "20"]
    cfg = load_run_config(
        None, parse_overrides([*map(str, args), "--train.save_every", "4", "--train.spike_factor", "3"])
    )
    with pytest.raises(TrainingError, match=r"loss spiked .* at step 14.*step_000012"):
        train(cfg)
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*"))[-1] == "step_000012"


def test_spike_detector():
    from angpt.train.loop import SpikeDetector

    d = SpikeDetector(3.0, warmup=3)
    assert not any(d.check(x) for x in (10.0, 6.0, 5.0, 4.0, 4.5))  # a falling loss is no spike
    assert d.check(40.0) and d.ratio > 3
    assert not SpikeDetector(0.0).check(1e9)  # off


def test_resuming_an_older_checkpoint_moves_later_ones_aside(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--arch", "angpt", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "6"]
    assert run_cli(*common, "--train.save_every", "2", "--train.keep_last", "5") == 0
    older = out / "checkpoints" / "step_000002"
    assert run_cli(*common, "--train.save_every", "2", "--train.keep_last", "5", "--resume", older) == 0
    assert "later checkpoint(s) aside" in capsys.readouterr().err
    aside = list((out / "checkpoints").glob("superseded_*/step_*"))
    assert sorted(p.name for p in aside) == ["step_000004", "step_000006"]  # kept, not deleted
    assert [r["step"] for r in metrics(out)] == list(range(1, 7))  # one branch in the metrics
