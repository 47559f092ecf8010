"""The training pipeline: recipes, exact resume, signals, NaN stops, bad input, DDP and FSDP2 on CPU."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from angpt.cli import main
from angpt.train.config import load_run_config
from angpt.train.loop import TrainingError, train

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--preset",
    "tiny",
    "--train.batch_tokens",
    "512",
    "--train.micro_batch",
    "4",
    "--train.eval_every",
    "0",
    "--train.log_every",
    "1",
    "--train.progress",
    "false",
    "--train.tensorboard",
    "false",
    "--train.dtype",  # forced: `auto` would pick bf16 on some machines and fp32 on others
    "fp32",
]


def run_cli(*args: str) -> int:
    return main(["train", *map(str, args)])


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    last = sorted((out / "checkpoints").glob("step_*"))[-1]
    return load_file(str(last / "model.safetensors"))


def test_every_shipped_recipe_loads():
    recipes = sorted((ROOT / "configs").glob("*.yaml"))
    paper = sorted((ROOT / "configs" / "paper").glob("*.yaml"))
    assert len(recipes) >= 4 and len(paper) == 6
    for path in recipes + paper:
        cfg = load_run_config(path)
        assert cfg.arch in ("gpt", "gpt+", "ngpt", "angpt") and cfg.train.max_steps > 0
    assert {load_run_config(p).arch for p in recipes} >= {"gpt+", "ngpt", "angpt"}
    assert {(load_run_config(p).arch, load_run_config(p).preset) for p in paper} == {
        (a, s) for a in ("gpt+", "ngpt", "angpt") for s in ("0.5B", "1B")
    }


@pytest.mark.parametrize("arch", ["angpt", "gpt+"])
def test_resumed_run_equals_uninterrupted_run(arch, data_dir, tmp_path):
    common = ["--arch", arch, "--data", data_dir, *TINY, "--train.max_steps", "6", "--train.deterministic", "true"]
    assert run_cli(*common, "--out", tmp_path / "straight", "--train.save_every", "0") == 0
    assert run_cli(*common, "--out", tmp_path / "split", "--train.save_every", "0", "--train.stop_at", "3") == 0
    assert len(metrics(tmp_path / "split")) == 3
    assert run_cli(*common, "--out", tmp_path / "split", "--train.save_every", "0", "--resume", "auto") == 0
    a, b = metrics(tmp_path / "straight"), metrics(tmp_path / "split")
    assert [r["step"] for r in b] == list(range(1, 7))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    wa, wb = final_weights(tmp_path / "straight"), final_weights(tmp_path / "split")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_run_directory_keeps_provenance_and_outputs(data_dir, tmp_path):
    out = tmp_path / "run"
    assert (
        run_cli(
            "--arch",
            "ngpt",
            "--data",
            data_dir,
            *TINY,
            "--train.max_steps",
            "4",
            "--out",
            out,
            "--train.eval_every",
            "2",
            "--train.eval_batches",
            "2",
        )
        == 0
    )
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["torch_version"] == torch.__version__ and prov["seed"] == 0 and "device" in prov
    run = json.loads((out / "config.json").read_text())["run"]  # the run's record, once (issue 54)
    assert run["arch"] == "ngpt" and run["model"]["vocab_size"] >= 257 and run["train"]["lr"] > 0
    rows = metrics(out)
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(r["val_bpb"] > 0 for r in evals)
    assert "health/alpha_A/0" in evals[0] and "health/max_logit" in evals[0]
    ck = sorted((out / "checkpoints").glob("step_*"))[-1]
    assert {p.name for p in ck.iterdir()} >= {"model.safetensors", "trainer.pt", "state.json", "tokenizer.json"}
    assert not any(k.startswith(("_orig_mod", "module.")) for k in load_file(str(ck / "model.safetensors")))
    assert (out / "loss_curve.png").stat().st_size > 1000


def test_nan_loss_stops_with_step_and_last_checkpoint(data_dir, tmp_path, monkeypatch):
    from angpt.models import gpt

    calls = {"n": 0}
    original = gpt.GPT.head  # what both the fused loss and the logits are computed from

    def poisoned(self, h):
        calls["n"] += 1
        x, w, scale = original(self, h)
        return (x * float("nan") if calls["n"] > 6 else x), w, scale  # 2 micro-batches per step: NaN from step 4

    monkeypatch.setattr(gpt.GPT, "head", poisoned)
    cfg = load_run_config(
        None,
        [
            ("arch", "gpt+"),
            ("data", str(data_dir)),
            ("out", str(tmp_path / "r")),
            ("preset", "tiny"),
            ("train.batch_tokens", 512),
            ("train.micro_batch", 4),
            ("train.max_steps", 10),
            ("train.save_every", 2),
            ("train.eval_every", 0),
            ("train.progress", False),
        ],
    )
    with pytest.raises(TrainingError, match=r"loss is nan at step 4.*step_000002"):
        train(cfg)


@pytest.mark.parametrize("failure", ["nan", "ctrl-c"])
def test_a_run_ended_by_an_error_closes_its_logs(failure, data_dir, tmp_path, monkeypatch):
    """A NaN stop (TrainingError) or a Ctrl-C (KeyboardInterrupt) at step 4 still closes the run's writers: every
    logged step is in metrics.jsonl as complete JSON, the TensorBoard writer is closed (it flushes its events on
    close, else every 2 minutes) and so is the progress bar."""
    from angpt.models import gpt
    from angpt.train import loop

    calls = {"n": 0}
    original = gpt.GPT.head  # what both the fused loss and the logits are computed from

    def poisoned(self, h):
        calls["n"] += 1
        x, w, scale = original(self, h)
        if calls["n"] > 6 and failure == "ctrl-c":  # 2 micro-batches per step: step 4
            raise KeyboardInterrupt
        return (x * float("nan") if calls["n"] > 6 else x), w, scale

    bars = []
    real_progress = loop._progress

    def spied_progress(*args):
        bar = real_progress(*args)
        bars.append(bar)
        return bar

    writers = []

    class SpiedLogger(loop.MetricsLogger):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            writers.append(self.tb)

    monkeypatch.setattr(gpt.GPT, "head", poisoned)
    monkeypatch.setattr(loop, "_progress", spied_progress)
    monkeypatch.setattr(loop, "MetricsLogger", SpiedLogger)
    monkeypatch.setattr(loop.Trainer, "_estimated_mfu", lambda self, peak: None)  # its probe's heads are not steps
    out = tmp_path / "r"
    cfg = load_run_config(
        None,
        [
            ("arch", "gpt+"),
            ("data", str(data_dir)),
            ("out", str(out)),
            ("preset", "tiny"),
            ("train.batch_tokens", 512),
            ("train.micro_batch", 4),
            ("train.max_steps", 10),
            ("train.save_every", 0),
            ("train.eval_every", 0),
            ("train.log_every", 1),
            ("train.dtype", "fp32"),
            ("train.tensorboard", True),
            ("train.progress", True),
        ],
    )
    with pytest.raises(TrainingError if failure == "nan" else KeyboardInterrupt):
        train(cfg)
    rows = metrics(out)  # every line whole JSON, the last step logged there
    if failure == "nan":  # the failing step is logged too: its loss and the error that stopped the run
        assert [r["step"] for r in rows] == [1, 2, 3, 4] and "error" not in rows[2]
        assert math.isnan(rows[3]["loss"]) and rows[3]["error"].startswith("loss is nan at step 4")
        # and says what to change, with the run's own values (GPT+'s recipe: lr 2e-3, 5% of 10 steps of warm-up)
        assert (
            "halve the learning rate (train.lr=0.001; this run's is 0.002) or lengthen the warm-up "
            "(train.warmup_steps=2; this run's is 1)" in rows[3]["error"]
        )
    else:
        assert [r["step"] for r in rows] == [1, 2, 3]
    assert len(writers) == 1 and writers[0].all_writers is None  # SummaryWriter.close() drops its file writers
    assert len(bars) == 1 and bars[0].disable  # tqdm.close() marks a bar disabled


def test_main_records_its_argv_not_sys_argv(data_dir, tmp_path, monkeypatch):
    """angpt.cli.main(argv) called from Python: the run's provenance.json records `angpt` + that argv, not the
    calling process's sys.argv; a library call outside main records sys.argv as it is."""
    from angpt.invocation import ENV, child_env, command_argv

    monkeypatch.setattr(sys, "argv", ["/somewhere/else.py", "--not-these"])
    monkeypatch.delenv(ENV, raising=False)
    argv = ["train", "--arch", "gpt+", "--data", str(data_dir), *TINY, "--train.max_steps", "1"]
    argv += ["--out", str(tmp_path / "r"), "--train.save_every", "0"]
    assert main(argv) == 0
    assert json.loads((tmp_path / "r" / "provenance.json").read_text())["command"] == ["angpt", *argv]
    assert command_argv() == ["/somewhere/else.py", "--not-these"]  # main's argv is gone once it returns
    # A comparison's worker process records the command of the comparison that started it.
    monkeypatch.setenv(ENV, child_env({})[ENV].replace("else.py", "parent.py"))
    assert command_argv() == ["/somewhere/parent.py", "--not-these"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--train.bogus", "1"], "unknown config key"),
        (["--model.bogus", "1"], "unknown model key"),
        (["--train.batch_tokens", "500"], "multiple of"),
        (["--resume", "/nonexistent/ckpt"], "does not exist"),
        (["--model.vocab_size", "128"], "larger than model.vocab_size"),
        (["--arch", "bert"], "unknown architecture"),
    ],
)
def test_bad_input_is_one_line_error(extra, message, data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc = run_cli("--arch", "angpt", "--data", data_dir, *TINY, "--train.max_steps", "2", "--out", out, *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert not (out / "checkpoints").exists()


def test_corrupt_or_missing_data_is_one_line_error(data_dir, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(data_dir, bad)
    shard = sorted(bad.glob("train_*.bin"))[0]
    shard.write_bytes(shard.read_bytes()[:-10])  # truncated
    assert run_cli("--arch", "gpt+", "--data", bad, *TINY, "--out", tmp_path / "o1") == 2
    assert run_cli("--arch", "gpt+", "--data", tmp_path / "none", *TINY, "--out", tmp_path / "o2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and shard.name in err[0] and "does not exist" in err[1]


def test_existing_run_is_not_overwritten(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--arch", "gpt+", "--data", data_dir, *TINY, "--train.max_steps", "2", "--out", out]
    assert run_cli(*args, "--train.save_every", "0") == 0
    shutil.rmtree(out / "checkpoints")
    before = (out / "metrics.jsonl").read_text()
    assert run_cli(*args) == 2
    assert "already holds a run" in capsys.readouterr().err  # and no checkpoint: nothing to resume, nothing lost
    assert (out / "metrics.jsonl").read_text() == before


def _env():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    return env


def test_sigterm_saves_checkpoint_and_exits_cleanly(data_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "angpt",
        "train",
        "--arch",
        "angpt",
        "--data",
        str(data_dir),
        *TINY,
        "--train.max_steps",
        "100000",
        "--train.save_every",
        "0",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(cmd, env=_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "metrics.jsonl").exists():
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err  # interrupted, not finished: `&& angpt export` must not run
    assert "SIGTERM" in err and "resume" in err
    ckpts = sorted((out / "checkpoints").glob("step_*"))
    assert len(ckpts) == 1 and not list((out / "checkpoints").glob(".tmp*"))
    state = json.loads((ckpts[0] / "state.json").read_text())
    assert state["step"] == metrics(out)[-1]["step"] >= 1


def torchrun(nproc: int, *args) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "angpt",
        "train",
        *map(str, args),
    ]
    if nproc == 1:
        cmd = [sys.executable, "-m", "angpt", "train", *map(str, args)]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)


def _why(proc: subprocess.CompletedProcess) -> str:
    """A failed torchrun's own lines (a rank's abort is printed long before the launcher's report) and its end."""
    own = [line for line in proc.stderr.splitlines() if "terminate called" in line or "Error" in line[:80]]
    return "\n".join(own[:20]) + "\n...\n" + proc.stderr[-1500:]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_match_one_process_and_resume(mode, data_dir, tmp_path):
    common = ["--arch", "angpt", "--data", data_dir, *TINY, "--train.micro_batch", "2", "--dist", mode]
    one = torchrun(1, *common, "--train.max_steps", "4", "--out", tmp_path / "one")
    assert one.returncode == 0, _why(one)
    # FSDP2 runs with activation checkpointing and torch.compile too: neither may change the numbers.
    common += ["--train.activation_checkpointing", "true", "--train.compile", "true"] if mode == "fsdp" else []
    two = torchrun(2, *common, "--train.max_steps", "4", "--train.stop_at", "2", "--out", tmp_path / "two")
    assert two.returncode == 0, _why(two)
    two = torchrun(2, *common, "--train.max_steps", "4", "--resume", "auto", "--out", tmp_path / "two")
    assert two.returncode == 0, _why(two)
    a, b = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-4, abs=1e-4)
    wa, wb = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-4), k


def test_train_leaves_the_process_group_closed(data_dir, tmp_path, monkeypatch):
    """Ranks that exit with gloo's connections open can abort each other at interpreter exit (SIGABRT, seen in CI):
    `angpt train` waits for every rank at a barrier, then closes the group, before it returns. A one-rank group
    started here stands in for torchrun's."""
    import torch.distributed as dist

    calls = []

    def recorded(name):
        real = getattr(dist, name)

        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        return call

    for name in ("barrier", "destroy_process_group"):
        monkeypatch.setattr(dist, name, recorded(name))
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert (
            run_cli(
                "--arch",
                "gpt+",
                "--data",
                str(data_dir),
                *TINY,
                "--train.max_steps",
                "1",
                "--out",
                str(tmp_path / "run"),
            )
            == 0
        )
        assert not dist.is_initialized()
        assert calls[-2:] == ["barrier", "destroy_process_group"], calls
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_calibrated_nu_att_is_measured_once_during_training_and_survives_resume(data_dir, tmp_path):
    from angpt.checkpoint import load_checkpoint_model
    from angpt.data import TokenLoader
    from angpt.models import model_from_config
    from angpt.models.angpt import calibrate_nu_att

    common = ["--arch", "angpt", "--data", data_dir, *TINY, "--train.max_steps", "4", "--train.deterministic", "true"]
    common += ["--model.nu_att", "calibrated", "--model.nu_att_calibrate_at", "0.5"]
    assert run_cli(*common, "--out", tmp_path / "straight", "--train.save_every", "1", "--train.keep_last", "3") == 0
    ckpts = sorted((tmp_path / "straight" / "checkpoints").glob("step_*"))
    nu = {int(c.name[5:]): load_file(str(c / "model.safetensors"))["nu_att"] for c in ckpts}
    model2, _ = load_checkpoint_model(ckpts[0])
    dense = model_from_config(model2.config).nu_att
    assert sorted(nu) == [2, 3, 4] and torch.equal(nu[2], dense)  # not before 0.5 x 4 = 2 steps
    assert not torch.allclose(nu[3], dense) and torch.equal(nu[3], nu[4])  # measured once, then frozen
    # Independently: the step-2 weights measured on the documented side batches give the step-3 buffer.
    side = TokenLoader(data_dir, "train", 4, 64, seed=0 + 1_000_003)
    expected = calibrate_nu_att(model2, [side.next_batch()[0] for _ in range(8)])
    assert torch.allclose(nu[3], expected, rtol=1e-6)
    # The training stream is untouched: the first two steps' losses equal a dense run's; the third differs.
    dense_run = list(common)
    dense_run[dense_run.index("calibrated")] = "dense"
    assert run_cli(*dense_run, "--out", tmp_path / "dense", "--train.save_every", "0") == 0
    dense_losses = [r["loss"] for r in metrics(tmp_path / "dense")]
    losses = [r["loss"] for r in metrics(tmp_path / "straight")]
    assert dense_losses[:2] == losses[:2] and dense_losses[2] != losses[2]
    # A run resumed from step 2 calibrates at the same point and ends in the same place.
    split = ["--out", tmp_path / "split", "--train.save_every", "0"]
    assert run_cli(*common, *split, "--train.stop_at", "2") == 0
    assert run_cli(*common, *split, "--resume", "auto") == 0
    assert [r["loss"] for r in metrics(tmp_path / "split")] == losses
    wa, wb = final_weights(tmp_path / "straight"), final_weights(tmp_path / "split")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_git_revision_marks_uncommitted_changes(tmp_path):
    from angpt.train.provenance import git_revision

    assert git_revision(tmp_path) is None  # not a checkout
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, env={**os.environ, **env})

    git("init", "-q")
    (tmp_path / "f.py").write_text("a = 1\n")
    git("add", "f.py")
    git("commit", "-qm", "x")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("ignored\n")
    assert git_revision(tmp_path) == sha  # untracked files do not make the tree dirty
    (tmp_path / "f.py").write_text("a = 2\n")
    assert git_revision(tmp_path) == sha + "+dirty"
